"""run: ucxpy-run -n 2 python docs/examples/hello_shmem.py

The README's OpenSHMEM example: a put to the next PE's symmetric array.
"""
import numpy as np
import shmem

shmem.init()
me, n = shmem.my_pe(), shmem.n_pes()
dest = shmem.zeros(4, dtype=np.int64)          # symmetric: allocated on every PE
shmem.put(dest, np.full(4, me, dtype=np.int64), (me + 1) % n)
shmem.barrier_all()                            # completes the puts, then synchronizes
assert (dest == (me - 1) % n).all()
print(f"PE {me} of {n}: dest = {dest.tolist()}")
shmem.free(dest)
shmem.finalize()
