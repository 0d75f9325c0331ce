"""ucxpy, mpi_shim and shmem under a real Slurm (Debian's slurmctld/slurmd
22.05 + munge) on namespace hosts: one controller, 4 compute hosts h0..h3
(see slurm.py).  ``srun --mpi=pmi2 -N 4 -n 16 --ntasks-per-node=4``: ranks
wire up through Slurm's PMI-2 server; ``srun --mpi=pmix`` (Slurm's
mpi/pmix_v4 plugin, libpmix 4.2): through the PMIx server in each node's
slurmstepd (ucxpy's PMIx bootstrap, tests/progs/launch_probe.py proves which
bootstrap each rank used); tcp between hosts, shm within one.
Failures (scancel, a rank killed, a node lost) end the job with an error on
every surviving rank, never a hang: every wait has a hard timeout and kills
the client's process group; the fixture removes daemons and namespaces."""
from __future__ import annotations

import os
import re
import signal
import sys
import time

import pytest

from tests.hosts import netns
from tests.hosts import slurm as slurm_mod

#: each test starts its own cluster (munge, slurmctld, 4 slurmd) before its
#: jobs, whose own timeouts (at most 420 s) end them with SlurmError and the
#: logs: the alarm must not fire while pytest still formats that report (it
#: aborted the whole session then, 2026-12-06)
pytestmark = pytest.mark.timeout(510)

HERE = os.path.dirname(os.path.abspath(__file__))
JOB = os.path.join(HERE, "slurm_job.py")
OPENMPI_MPIRUN = "/usr/bin/mpirun.openmpi"
#: the bootstrap each of Slurm's MPI plugins selects
BOOTSTRAP = {"pmi2": "pmi", "pmix": "pmix"}


def srun(mpi="pmi2"):
    return ["srun", f"--mpi={mpi}", "-N", "4", "-n", "16", "--ntasks-per-node=4"]


SRUN = srun()


@pytest.fixture
def slurm(netns_ok):
    why = slurm_mod.skip_reason()
    if why:
        pytest.skip(f"Slurm test cluster: {why}")
    c = slurm_mod.SlurmCluster(4)
    try:
        yield c
    finally:
        c.close()


def prog(name):
    return [sys.executable, os.path.join(netns.PROGS, name)]


def ok(p, c, marker, n):
    lines = [l for l in p.stdout.splitlines() if l.startswith(marker)]
    assert p.returncode == 0 and len(lines) == n, \
        f"exit {p.returncode}\n{p.stdout[-5000:]}\n{c.logs()}"
    return lines


def probed(name):
    """``name`` run by launch_probe.py, which reports each rank's bootstrap."""
    return prog("launch_probe.py") + [name]


def bootstrap_ok(p, kind, n=16):
    """Every rank's launch_probe line names bootstrap ``kind`` and no mpi4py."""
    got = sorted(re.findall(r"LAUNCH-PROBE (\d+) bootstrap=([a-z,]+) mpi4py=(True|False)",
                            p.stdout), key=lambda t: int(t[0]))
    assert got == [(str(r), kind, "False") for r in range(n)], p.stdout[-5000:]


def xhost_ok(p, c, per_host, n=16):
    """rel_xhost.py passed on every rank, same-host pairs on shm, others on tcp
    (found anywhere in the output: mpirun's relay may join two ranks' lines)."""
    found = re.findall(r"XHOST OK (\d+) lanes=(\S+)", p.stdout)
    assert p.returncode == 0 and sorted(int(r) for r, _ in found) == list(range(n)), \
        f"exit {p.returncode}\n{p.stdout[-5000:]}\n{c.logs()}"
    for rank, lanes in found:
        for peer, lane in (kv.split(":") for kv in lanes.split(",")):
            assert lane == ("shm" if int(peer) // per_host == int(rank) // per_host
                            else "tcp"), (rank, lanes)


@pytest.mark.parametrize("mpi", ["pmi2", "pmix"])
def test_srun_ucxpy_tcp_between_hosts_shm_within(slurm, mpi):
    """rel_xhost.py: tag, AM, RMA, atomics between every pair of 16 ranks, data
    checked; same-host pairs on shm (mapped RMA), other pairs on tcp."""
    p = slurm.run(srun(mpi) + probed("rel_xhost.py") + ["4", "tcp"], timeout=120)
    bootstrap_ok(p, BOOTSTRAP[mpi])
    xhost_ok(p, slurm, 4)


def test_mpirun_openmpi_pmix_in_an_allocation(slurm):
    """Open MPI's mpirun inside ``salloc``: it starts its orted daemons on the
    hosts through srun, and each rank's PMIx client (ucxpy's PMIx bootstrap)
    talks to its own node's orted, whose PMIx server is the system's libpmix
    4.2 as ucxpy's client is.  rel_xhost.py, 4 hosts x 2 ranks, data checked."""
    if not os.path.exists(OPENMPI_MPIRUN):
        pytest.skip("Debian's Open MPI is not installed (openmpi-bin; make deps)")
    p = slurm.run(["salloc", "-N", "4", "-n", "8", OPENMPI_MPIRUN, "--timeout", "100",
                   "--oversubscribe", "--npernode", "2", "-n", "8", "-x", "PYTHONPATH",
                   *probed("rel_xhost.py"), "2", "tcp"], timeout=130,
                  env={"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"})
    bootstrap_ok(p, "pmix", 8)
    xhost_ok(p, slurm, 2, 8)


def test_srun_ranks_see_their_hosts(slurm):
    """Each rank's hostname is its node's (own UTS namespace): h0..h3, 4 each."""
    p = slurm.run(SRUN + ["sh", "-c", 'echo "RANK $SLURM_PROCID $(hostname)"'], timeout=60)
    got = sorted((int(r), h) for r, h in re.findall(r"RANK (\d+) (\S+)", p.stdout))
    assert got == [(r, f"h{r // 4}") for r in range(16)], p.stdout


@pytest.mark.parametrize("mpi", ["pmi2", "pmix"])
def test_srun_mpi_shim(slurm, mpi):
    """mpi_smoke.py (from mpi_shim import MPI): p2p, collectives, Allreduce."""
    p = slurm.run(srun(mpi) + probed("mpi_smoke.py"), timeout=120)
    bootstrap_ok(p, BOOTSTRAP[mpi])
    ok(p, slurm, "MPI-SMOKE OK", 16)


def test_srun_shmem(slurm):
    """shmem_spec.py (every section, data checked) on 16 PEs: same-host PEs
    reached in mapped mode (shm), the others in AM mode (tcp)."""
    # (12-24 s here; it took 68-240 s while every PE reaching others in AM
    # mode started a progress thread on this 2-CPU host, a9bc822)
    p = slurm.run(SRUN + prog("shmem_spec.py"), timeout=420, env={"EXPECT_NPES": "16"})
    assert p.returncode == 0, f"exit {p.returncode}\n{p.stdout[-5000:]}\n{slurm.logs()}"
    for pe in range(16):
        assert f"SHMEM-SPEC OK errors {pe}\n" in p.stdout, p.stdout[-3000:]
    for m in re.finditer(r"SHMEM-SPEC MODES rma (\d+) peers=(\S+)", p.stdout):
        me, peers = int(m.group(1)), m.group(2).split(",")
        others = [q for q in range(16) if q != me]
        for q, mode in zip(others, peers):
            assert mode == ("mapped" if q // 4 == me // 4 else "am"), m.group(0)


def test_sbatch_script(slurm):
    """A batch script through sbatch --wait; its output file is checked."""
    out = os.path.join(slurm.dir, "batch-%j.out")
    script = os.path.join(slurm.dir, "job.sh")
    with open(script, "w") as f:
        f.write("#!/bin/sh\n"
                "#SBATCH -N 4\n#SBATCH -n 16\n#SBATCH --ntasks-per-node=4\n"
                f"#SBATCH -o {out}\n"
                'echo "BATCH on $(hostname) nodes=$SLURM_JOB_NODELIST"\n'
                f"srun --mpi=pmi2 {' '.join(prog('mpi_smoke.py'))}\n")
    p = slurm.run(["sbatch", "--wait", script], timeout=120)
    m = re.search(r"Submitted batch job (\d+)", p.stdout)
    assert p.returncode == 0 and m, p.stdout + slurm.logs()
    with open(out.replace("%j", m.group(1))) as f:
        text = f.read()
    assert "BATCH on h0 nodes=h[0-3]" in text, text
    assert sorted(int(x) for x in re.findall(r"MPI-SMOKE OK (\d+)", text)) == list(range(16)), text


def start_job(slurm, extra=(), mpi="pmi2"):
    p = slurm.start(srun(mpi) + ["--kill-on-bad-exit=0", "-J", "ucxpyfail", *extra,
                                 sys.executable, JOB, "100"])
    lines = []
    for _ in range(16):
        lines += netns.lines_until(p, "SLURM-JOB READY", 60)
    ready = {}
    for l in lines:
        m = re.search(r"SLURM-JOB READY (\d+) (\S+) (\d+)", l)
        if m:
            ready[int(m.group(1))] = (m.group(2), int(m.group(3)))
    assert sorted(ready) == list(range(16)), "".join(lines)
    return p, ready


def finish(slurm, p, timeout):
    try:
        return netns.finish(p, timeout)
    except Exception:
        slurm_mod._killpg(p)
        raise AssertionError(f"srun did not end within {timeout}s (hang)\n{slurm.logs()}")


def errors_by_rank(out):
    return {int(m.group(2)): m.group(1)
            for m in re.finditer(r"SLURM-JOB (ERROR|TERM) (\d+)", out)}


def test_scancel_ends_every_rank(slurm):
    p, _ = start_job(slurm)
    jobid = slurm.ctl(["squeue", "-h", "-n", "ucxpyfail", "-o", "%i"]).stdout.split()
    assert len(jobid) == 1, jobid
    t0 = time.monotonic()
    slurm.ctl(["scancel", jobid[0]])
    out = finish(slurm, p, 60)
    errs = errors_by_rank(out)
    assert p.returncode != 0 and sorted(errs) == list(range(16)), out
    # Slurm's SIGTERM, or a ucxpy error when a peer that got it first is gone
    assert "TERM" in errs.values(), out
    assert time.monotonic() - t0 < 30, out


@pytest.mark.parametrize("mpi", ["pmi2", "pmix"])
def test_rank_killed_mid_job(slurm, mpi):
    """Rank 5 (on h1) is SIGKILLed (srun --kill-on-bad-exit=0: Slurm leaves the
    others running): every one of the 15 others ends with a ucxpy error
    (ConnectionLost: shm peer died / tcp peer closed, cascading through the
    barriers), srun exits non-zero."""
    p, ready = start_job(slurm, mpi=mpi)
    time.sleep(0.5)
    os.kill(ready[5][1], signal.SIGKILL)
    out = finish(slurm, p, 60)
    errs = errors_by_rank(out)
    assert p.returncode != 0 and sorted(errs) == [r for r in range(16) if r != 5], out
    assert set(errs.values()) == {"ERROR"}, out
    assert "SLURM-JOB DONE" not in out, out


def test_node_lost_mid_job(slurm):
    """h3 "crashes": its slurmd, slurmstepd and ranks 12-15 are SIGKILLed.
    Ranks 0-11 end with a ucxpy error (ConnectionLost) at once; srun ends
    when slurmctld declares the node lost (SlurmdTimeout=6 s: "Node failure
    on h3"), and h3 is DOWN."""
    p, ready = start_job(slurm)
    time.sleep(0.5)
    slurm.lose_node(3)
    out = finish(slurm, p, 90)
    errs = errors_by_rank(out)
    assert p.returncode != 0 and sorted(errs) == list(range(12)), out
    assert set(errs.values()) == {"ERROR"}, out
    assert "Node failure on h3" in out, out
    slurm.wait_nodes("down", timeout=slurm_mod.SLURMD_TIMEOUT * 5, nodes=["h3"])
