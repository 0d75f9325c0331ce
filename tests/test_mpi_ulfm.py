"""ULFM on mpi_shim with real failures: a killed rank leaves the survivors
able to revoke, shrink, agree and finish a collective (ucxpy-run
--fault-tolerant keeps the job going)."""
from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from conftest import ROOT

pytestmark = pytest.mark.timeout(180)


def _ft_job(n, script, extra_env=None):
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
               **(extra_env or {}))
    return subprocess.run([sys.executable, "-m", "ucxpy.bootstrap.launcher", "-n", str(n),
                           "--fault-tolerant", "--timeout", "150", sys.executable, script],
                          env=env, capture_output=True, text=True, timeout=170, cwd=ROOT)


@pytest.mark.parametrize("n,victim", [(3, 1), (4, 0), (4, 3)])
def test_survivors_shrink_and_finish_an_allreduce(n, victim):
    r = _ft_job(n, os.path.join(ROOT, "examples", "ulfm_shrink.py"),
                {"ULFM_VICTIM": str(victim)})
    assert r.returncode == 0, (r.stdout, r.stderr)
    want = sum(k + 1 for k in range(n) if k != victim)
    ok = re.findall(rf"rank (\d+): survivors={n - 1} sum={want} OK", r.stdout)
    assert sorted(map(int, ok)) == [k for k in range(n) if k != victim], r.stdout
    assert "fault-tolerant job" in r.stderr


def test_revoke_reaches_every_member_and_fails_pending_receives(tmp_path):
    prog = tmp_path / "revoke.py"
    prog.write_text(r'''
import sys, time
sys.path.insert(0, %r)
import numpy as np
from mpi_shim import MPI
comm = MPI.COMM_WORLD.Dup()
rank = comm.Get_rank()
if rank == 0:
    time.sleep(0.3)
    comm.Revoke()
else:
    buf = np.zeros(1)
    try:
        comm.Recv(buf, source=0, tag=5)      # never sent: only the revoke ends it
        raise SystemExit("receive completed?!")
    except MPI.Exception as e:
        assert e.Get_error_class() == MPI.ERR_REVOKED, e
assert comm.Is_revoked()
for call in (lambda: comm.Barrier(), lambda: comm.Send([None, 0, MPI.BYTE], MPI.PROC_NULL)):
    try:
        call()
        raise SystemExit("call on a revoked communicator succeeded")
    except MPI.Exception as e:
        assert e.Get_error_class() == MPI.ERR_REVOKED
new = comm.Shrink()
assert new.Get_size() == comm.Get_size() and new.allreduce(1) == comm.Get_size()
print("rank", rank, "revoked OK", flush=True)
''' % ROOT)
    r = subprocess.run([sys.executable, "-m", "ucxpy.bootstrap.launcher", "-n", "3",
                        "--timeout", "60", sys.executable, str(prog)], capture_output=True,
                       text=True, timeout=90, cwd=ROOT,
                       env=dict(os.environ, PYTHONPATH=ROOT))
    assert r.returncode == 0, (r.stdout, r.stderr)
    assert r.stdout.count("revoked OK") == 3, r.stdout
