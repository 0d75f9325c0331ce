"""Run a rank program with the native data plane on for even ranks and off
(the Python reference, ``UCXPY_FASTPATH=n``) for odd ranks: one job whose
ranks mix both implementations (they are wire-compatible).

    ucxpy-run -n 2 python tests/progs/mixed_native.py PROG [ARGS...]

Prints 'MIXED-NATIVE <rank> <y|n>' before the program's own output."""
import os
import runpy
import sys

rank = int(os.environ.get("UCXPY_RANK", "0"))
os.environ["UCXPY_FASTPATH"] = "y" if rank % 2 == 0 else "n"
print(f"MIXED-NATIVE {rank} {os.environ['UCXPY_FASTPATH']}", flush=True)
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
