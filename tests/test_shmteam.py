"""ucxpy.shmteam: collectives of same-host processes through shared segments,
as real multi-process jobs (tests/progs/shmteam_ops.py), and its use by
mpi_shim's blocking collectives (tests/progs/mpi_shmcoll.py)."""
import os

import pytest

from conftest import run_job

PROGS = os.path.join(os.path.dirname(__file__), "progs")
OPS = ["python", os.path.join(PROGS, "shmteam_ops.py")]


def _ok(proc, n, word="SHMTEAM OK"):
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert out.count(word) == n, out[-3000:]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("n,slot", [(2, "4096"), (2, "1M"), (3, "4096"), (3, "1M"),
                                    (4, "4096"), (4, "1M"), (7, "4096")])
def test_every_operation_against_numpy(n, slot):
    """Pieces (a 4 KiB slot), the whole/reduce-scatter switch, every root,
    in place, and a mixed loop with ranks out of step (more ranks than the
    2 CPUs here: the yielding wait; 7 members: uneven reduce-scatter blocks)."""
    _ok(run_job(OPS, n, timeout=240, env={"UCXPY_SHM_COLL_SLOT": slot}), n)


@pytest.mark.timeout(200)
@pytest.mark.parametrize("n,mode,env", [
    (1, "refused", {}),                                  # a group of one needs no team
    (2, "refused", {"UCXPY_SHM_COLL": "n"}),
    (2, "refused", {"UCXPY_TLS": "tcp"}),                # no shm transport selected
    (3, "one-refuses", {}),                              # all or nobody
])
def test_team_not_formed(n, mode, env):
    _ok(run_job(OPS + [mode], n, timeout=120, env=env), n, "SHMTEAM NONE")


@pytest.mark.timeout(120)
def test_sleeping_members_are_rung_awake():
    """With more ranks than cores waiters sleep for long: members asleep in a
    barrier wake when the last member arrives (ucxpy.doorbell), a receive
    asleep on shm when its message comes, not when a nap ends."""
    _ok(run_job(OPS + ["sleepers"], 3, timeout=90, env={"UCXPY_OVERSUBSCRIBED": "y"}), 3)


@pytest.mark.timeout(200)
def test_team_limit_per_process():
    _ok(run_job(OPS + ["limit"], 2, timeout=120, env={"UCXPY_SHM_COLL_TEAMS": "1"}), 2)


@pytest.mark.timeout(200)
def test_dead_member_raises_instead_of_hanging():
    proc = run_job(["--fault-tolerant"] + OPS + ["dead"], 3, timeout=60)
    out = proc.stdout + proc.stderr
    assert out.count("SHMTEAM DETECTED") == 2, out[-3000:]
    assert "member 2 failed" in out


SHMCOLL = ["python", os.path.join(PROGS, "mpi_shmcoll.py")]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("n,slot", [(1, "1M"), (2, "1M"), (3, "64K"), (4, "1M")])
def test_mpi_blocking_collectives_on_a_team(n, slot):
    proc = run_job(SHMCOLL, n, timeout=250, env={"UCXPY_SHM_COLL_SLOT": slot})
    _ok(proc, n, "MPI-SHMCOLL OK")
    assert proc.stdout.count("ShmTeam") == (n if n > 1 else 0)


@pytest.mark.timeout(300)
def test_mpi_collectives_under_mpiexec_use_the_team():
    proc = run_job(SHMCOLL, 3, timeout=250, launcher="mpiexec")
    _ok(proc, 3, "MPI-SHMCOLL OK")
    assert proc.stdout.count("ShmTeam") == 3


@pytest.mark.timeout(300)
def test_mpi_collectives_without_shm_stay_on_messages():
    proc = run_job(SHMCOLL + ["messages"], 2, timeout=250, env={"UCXPY_TLS": "tcp"})
    _ok(proc, 2, "MPI-SHMCOLL OK")
    assert proc.stdout.count("OK 0 bool") == 1


@pytest.mark.timeout(200)
def test_revoke_ends_a_wait_in_a_team_barrier(tmp_path):
    """Rank 0 waits in a team Barrier for a rank that revokes the
    communicator instead: the wait ends with ERR_REVOKED, not a hang."""
    prog = tmp_path / "revoke_team.py"
    prog.write_text(r'''
import time
from mpi_shim import MPI
comm = MPI.COMM_WORLD.Dup()
comm.Barrier(); comm.Barrier()                   # the team forms at the second
assert comm._h.shm, "no team"
if comm.rank == 1:
    time.sleep(0.3)
    comm.Revoke()
    print("REVOKED", flush=True)
else:
    try:
        comm.Barrier()
        raise SystemExit("barrier completed?!")
    except MPI.Exception as e:
        assert e.Get_error_class() == MPI.ERR_REVOKED, e
        print("WAIT ENDED", flush=True)
''')
    proc = run_job(["--fault-tolerant", "python", str(prog)], 2, timeout=120)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    assert "WAIT ENDED" in proc.stdout and "REVOKED" in proc.stdout


def test_ucxpy_info_prints_the_team_table():
    import subprocess
    import sys
    out = subprocess.run([sys.executable, "-m", "ucxpy.tools.info", "-e", "-n", "4"],
                         capture_output=True, text=True, timeout=60).stdout
    assert "shared-memory team" in out and "reduce-scatter in the slots" in out
