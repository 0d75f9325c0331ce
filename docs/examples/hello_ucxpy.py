"""run: ucxpy-run -n 2 python docs/examples/hello_ucxpy.py

The README's first example: a ring over ucxpy's own tagged API.
"""
import numpy as np
import ucxpy

world = ucxpy.init()                    # the job ucxpy-run, mpiexec or srun started
left, right = (world.rank - 1) % world.size, (world.rank + 1) % world.size
inp = np.empty(4, dtype=np.int64)
req = world.irecv(inp, source=left, tag=7)
world.send(np.full(4, world.rank, dtype=np.int64), dest=right, tag=7)
req.wait()
assert (inp == left).all()
print(f"rank {world.rank} of {world.size}: got {inp[0]} from rank {left}")
world.finalize()
