"""``oshrun``-style launcher: ``python -m shmem -n N prog.py args...``.

The same as ``ucxpy-run`` (every option of it applies); a program ending in
``.py`` runs with this Python.  ``mpiexec -n N python prog.py`` works too:
``shmem.init()`` joins whichever launcher started the process.
"""
import sys

from ucxpy.bootstrap.launcher import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
