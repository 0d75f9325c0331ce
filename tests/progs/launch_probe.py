"""Run a test program and report how its job was wired up.

Usage: launch_probe.py PROG [ARGS...]   (PROG relative to tests/progs or absolute)

Runs PROG as ``__main__`` (runpy), then prints ``LAUNCH-PROBE <rank>
bootstrap=<kind> mpi4py=<imported?>``: the kind of every bootstrap
:func:`ucxpy.bootstrap.from_env` made in this process, and whether any
``mpi4py`` module was imported.  The launcher tests use it to prove that a
job wired up through the bootstrap they expect, without an MPI library."""
import os
import runpy
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))

from ucxpy import bootstrap  # noqa: E402

made = []
_from_env = bootstrap.from_env


def _recording_from_env(*args, **kwargs):
    boot = _from_env(*args, **kwargs)
    made.append(boot)
    return boot


bootstrap.from_env = _recording_from_env
prog = sys.argv[1] if os.path.isabs(sys.argv[1]) else os.path.join(HERE, sys.argv[1])
sys.argv = [prog] + sys.argv[2:]
sys.path.insert(0, os.path.dirname(prog))
try:
    runpy.run_path(prog, run_name="__main__")
finally:
    rank = made[0].rank if made else "?"
    kinds = ",".join(b.kind for b in made) or "none"
    mpi4py = any(m == "mpi4py" or m.startswith("mpi4py.") for m in sys.modules)
    sys.stdout.write(f"LAUNCH-PROBE {rank} bootstrap={kinds} mpi4py={mpi4py}\n")
    if kinds != "pmix":            # why not, for the test's failure message
        from ucxpy.bootstrap import pmix_boot
        sys.stdout.write(f"LAUNCH-PROBE {rank} no pmix: server present "
                         f"{pmix_boot.pmix_server_present(os.environ)}, unavailable "
                         f"{pmix_boot.unavailable_reason()!r}\n")
    sys.stdout.flush()
