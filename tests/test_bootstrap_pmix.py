"""The PMIx bootstrap (ucxpy/bootstrap/pmix_boot.py) under Debian's Open MPI
4.1 launcher, ``mpirun.openmpi``, whose PMIx server is the system's libpmix
4.2 (Open MPI's ext3x component), the same library ucxpy's client binds.

Selection is tested in process (stand-ins for the bootstraps); everything
else launches real jobs with mpi4py made unimportable (a stand-in package
that raises ImportError comes first on the path), and tests/progs/
launch_probe.py reports which bootstrap each rank used and that no mpi4py
module was loaded.  Every job has mpirun's own ``--timeout``, a subprocess
timeout that kills its session's process group, and a pytest timeout.
Slurm's ``srun --mpi=pmix`` is tested in tests/hosts/test_slurm.py.
"""
import os
import re
import signal
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest

from conftest import OPENMPI_ENV, OPENMPI_MPIRUN, PROGS, ROOT, have_openmpi, run_session
from ucxpy import bootstrap
from ucxpy.bootstrap import mpi_boot, pmi_boot, pmix_boot
from ucxpy.errors import BootstrapError
from ucxpy.transports.liveness import pid_alive

PMIX_ENV = {"PMIX_NAMESPACE": "job.1", "PMIX_RANK": "0",
            "PMIX_SERVER_URI41": "srv;tcp4://127.0.0.1:1"}


def _env(**extra):
    """This process's environment minus anything that says 'you are a rank'."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PMIX_", "PMI_", "OMPI_", "UCXPY_"))}
    env.update({k: str(v) for k, v in extra.items()})
    return env


# ---------------------------------------------------------------------------
# selection (in process: the bootstraps are stand-ins that record their env)
# ---------------------------------------------------------------------------
@pytest.fixture
def stand_ins(monkeypatch):
    made = []
    for mod, name in ((pmix_boot, "PmixBootstrap"), (pmi_boot, "PmiBootstrap"),
                      (mpi_boot, "MpiBootstrap")):
        kind = name[:-len("Bootstrap")].lower()
        monkeypatch.setattr(mod, name, lambda *a, _k=kind, **k: made.append(_k) or _k)
    return made


@pytest.mark.timeout(10)
def test_a_pmix_server_selects_pmix(stand_ins):
    assert pmix_boot.pmix_server_present(_env(**PMIX_ENV))
    for var in PMIX_ENV:           # all three are needed
        env = _env(**PMIX_ENV)
        del env[var]
        assert not pmix_boot.pmix_server_present(env), var
    # before mpi4py (Open MPI's mpirun sets OMPI_* too), after PMI and ucxpy-run
    assert bootstrap.from_env(_env(OMPI_COMM_WORLD_SIZE=2, **PMIX_ENV)) == "pmix"
    assert bootstrap.from_env(_env(PMI_FD=3, PMI_RANK=0, PMI_SIZE=2, **PMIX_ENV)) == "pmi"
    assert bootstrap.from_env(_env(UCXPY_BOOTSTRAP="PMIx")) == "pmix"   # forced
    assert stand_ins == ["pmix", "pmi", "pmix"]


@pytest.mark.timeout(10)
def test_without_the_binding_pmix_is_never_chosen(stand_ins, monkeypatch):
    why = "ucxpy._pmix is not built (test)"
    monkeypatch.setattr(pmix_boot, "unavailable_reason", lambda: why)
    assert bootstrap.from_env(_env(OMPI_COMM_WORLD_SIZE=2, **PMIX_ENV)) == "mpi"
    no_mpi4py = SimpleNamespace(util=SimpleNamespace(find_spec=lambda name: None))
    monkeypatch.setattr(bootstrap, "importlib", no_mpi4py)
    with pytest.raises(BootstrapError, match=re.escape(f"the PMIx bootstrap cannot run ({why})")):
        bootstrap.from_env(_env(OMPI_COMM_WORLD_SIZE=2, **PMIX_ENV))
    assert stand_ins == ["mpi"]


@pytest.mark.timeout(10)
def test_forced_pmix_says_why_it_cannot_run(monkeypatch):
    with pytest.raises(BootstrapError, match="needs a PMIx server"):
        bootstrap.from_env(_env(UCXPY_BOOTSTRAP="pmix"))
    monkeypatch.setattr(pmix_boot, "lib", None)
    with pytest.raises(BootstrapError, match="PMIx bootstrap unavailable: ucxpy._pmix is not "
                                             "built .*libpmix-dev"):
        bootstrap.from_env(_env(UCXPY_BOOTSTRAP="pmix", **PMIX_ENV))


# ---------------------------------------------------------------------------
# jobs under mpirun.openmpi
# ---------------------------------------------------------------------------
def _need_openmpi_and_pmix():
    if not have_openmpi():
        pytest.skip("Debian's Open MPI is not installed (apt-get install openmpi-bin "
                    "libopenmpi-dev; make deps)")
    why = pmix_boot.unavailable_reason()
    if why:
        pytest.skip(f"the PMIx bootstrap is unavailable: {why}")


@pytest.fixture
def hidden_mpi4py(tmp_path):
    """A directory to put first on PYTHONPATH: its mpi4py raises ImportError."""
    d = tmp_path / "hide" / "mpi4py"
    d.mkdir(parents=True)
    (d / "__init__.py").write_text('raise ImportError("mpi4py is hidden by the test")\n')
    return str(d.parent)


def mpirun(n, argv, timeout=90, env=None, path=()):
    """``mpirun.openmpi -n N`` of ``argv`` (python scripts run by this
    interpreter) with ``env`` forwarded by ``-x``; (returncode, stdout, stderr)."""
    extra = dict(env or {}, PYTHONPATH=os.pathsep.join([*path, ROOT]))
    cmd = [OPENMPI_MPIRUN, "--timeout", str(timeout), "-n", str(n)]
    if n > 2:
        cmd.append("--oversubscribe")
    for k in extra:
        cmd += ["-x", k]
    full = _env(**OPENMPI_ENV, **extra)
    return run_session(cmd + [sys.executable, *map(str, argv)], timeout=timeout + 30,
                       env=full, tail=5000)


def probe(out, n):
    """Every rank's LAUNCH-PROBE line says pmix and no mpi4py."""
    got = sorted(re.findall(r"LAUNCH-PROBE (\d+) bootstrap=([a-z,]+) mpi4py=(True|False)", out))
    assert got == sorted((str(r), "pmix", "False") for r in range(n)), out[-3000:]


@pytest.mark.timeout(150)
@pytest.mark.parametrize("n", [2, 4])
def test_openmpi_ucxpy_core_without_mpi4py(n, hidden_mpi4py):
    """rel_xhost.py: tagged messages of every protocol size, AM, RMA and
    atomics between every pair, every byte checked; all ranks share this
    host, so every pair is on shm."""
    _need_openmpi_and_pmix()
    rc, out, err = mpirun(n, [f"{PROGS}/launch_probe.py", "rel_xhost.py", n],
                          path=[hidden_mpi4py])
    assert rc == 0, out[-3000:] + err[-3000:]
    probe(out, n)
    oks = re.findall(r"XHOST OK (\d+) lanes=(\S+)", out)
    assert sorted(int(r) for r, _ in oks) == list(range(n)), out[-3000:]
    for _, lanes in oks:
        assert {kv.split(":")[1] for kv in lanes.split(",")} == {"shm"}, lanes


@pytest.mark.timeout(150)
@pytest.mark.parametrize("n", [2, 4])
def test_openmpi_mpi_shim_without_mpi4py(n, hidden_mpi4py):
    """mpi_smoke.py (from mpi_shim import MPI): p2p, every collective,
    Allreduce with data checked."""
    _need_openmpi_and_pmix()
    rc, out, err = mpirun(n, [f"{PROGS}/launch_probe.py", "mpi_smoke.py"],
                          path=[hidden_mpi4py])
    assert rc == 0, out[-3000:] + err[-3000:]
    probe(out, n)
    assert sorted(int(r) for r in re.findall(r"MPI-SMOKE OK (\d+)", out)) == list(range(n))


@pytest.mark.timeout(150)
@pytest.mark.parametrize("n", [2, 4])
def test_openmpi_shmem_without_mpi4py(n, hidden_mpi4py):
    """shmem_spec.py: every section of the OpenSHMEM checks, data checked."""
    _need_openmpi_and_pmix()
    rc, out, err = mpirun(n, [f"{PROGS}/launch_probe.py", "shmem_spec.py"],
                          env={"EXPECT_NPES": n}, path=[hidden_mpi4py])
    assert rc == 0, out[-3000:] + err[-3000:]
    probe(out, n)
    passed = {}        # ranks share mpirun's stdout: lines may interleave
    for section, pe in re.findall(r"SHMEM-SPEC OK ([a-z]+) (\d+)", out):
        passed.setdefault(int(pe), set()).add(section)
    assert sorted(passed) == list(range(n)) and len(passed[0]) >= 10, out[-3000:]
    assert all(sections == passed[0] for sections in passed.values()), passed


@pytest.mark.timeout(90)
@pytest.mark.parametrize("n", [2, 4])
def test_openmpi_bootstrap_collectives(n):
    """allgather (sizes 0 to 3 kB), bcast from two roots, barrier, and
    put/lookup visible after the next collective."""
    _need_openmpi_and_pmix()
    rc, out, err = mpirun(n, [f"{PROGS}/boot_allgather.py"], env={"EXPECT_BOOTSTRAP": "pmix"})
    assert rc == 0, out + err
    assert sorted(re.findall(rf"OK rank (\d+)/{n} pmix", out)) == [str(r) for r in range(n)]


@pytest.mark.timeout(90)
def test_openmpi_barrier_timeout():
    """A rank that never joins: the others' fence ends at their timeout."""
    _need_openmpi_and_pmix()
    t0 = time.monotonic()
    rc, out, err = mpirun(2, [f"{PROGS}/boot_straggler.py"], env={"STRAGGLER_SLEEP": 6})
    assert "rank 0: timeout missing=[]: rank 0: PMIx barrier #0 timed out after 2 s" \
        in out, out + err
    assert rc == 7, out + err
    assert time.monotonic() - t0 < 20


@pytest.mark.timeout(90)
def test_openmpi_abort():
    """PMIx_Abort: mpirun kills the others and exits with the code."""
    _need_openmpi_and_pmix()
    t0 = time.monotonic()
    rc, out, err = mpirun(3, [f"{PROGS}/boot_misc.py", "abort"])
    assert rc == 4, out + err
    assert "rank 0: abort: giving up" in err
    assert time.monotonic() - t0 < 20


@pytest.mark.timeout(90)
def test_openmpi_rank_killed_ends_the_job():
    """Rank 1 is SIGKILLed mid-job: mpirun ends the job at once and no
    survivor is left running; those whose last words mpirun still relays
    ended with a ucxpy error (ConnectionLost: their shm peer died) or
    mpirun's SIGTERM, never a hang (mpirun may stop relaying output before
    the SIGTERM handler of a rank it kills has printed)."""
    _need_openmpi_and_pmix()
    job = os.path.join(ROOT, "tests", "hosts", "slurm_job.py")
    cmd = [OPENMPI_MPIRUN, "--timeout", "60", "--oversubscribe", "-n", "4",
           "-x", "PYTHONPATH", sys.executable, job, "60"]
    p = subprocess.Popen(cmd, env=_env(**OPENMPI_ENV, PYTHONPATH=ROOT), text=True,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         start_new_session=True)
    try:
        ready, out = {}, ""
        while len(ready) < 4:          # ranks share mpirun's stdout: lines may interleave
            line = p.stdout.readline()
            assert line, out
            out += line
            ready = {int(r): int(pid) for r, pid in
                     re.findall(r"SLURM-JOB READY (\d+) \S+ (\d+)", out)}
        t0 = time.monotonic()
        os.kill(ready[1], signal.SIGKILL)
        out += p.communicate(timeout=40)[0]
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.communicate()
    ended = dict((int(r), kind) for kind, r in re.findall(r"SLURM-JOB (ERROR|TERM) (\d+)", out))
    assert p.returncode != 0 and "SLURM-JOB DONE" not in out, out
    assert ended and set(ended) <= {0, 2, 3}, out
    assert "exited on signal 9" in out, out
    assert time.monotonic() - t0 < 20, out
    assert not [r for r, pid in ready.items() if pid_alive(pid)], out


@pytest.mark.timeout(90)
def test_openmpi_lost_launcher_is_reported(tmp_path):
    """mpirun itself is SIGKILLed: each rank's PMIx client loses its server,
    check_failures raises PeerFailure(peer=None) at once and every later
    bootstrap collective fails the same way instead of waiting."""
    _need_openmpi_and_pmix()
    out_base = str(tmp_path / "watch")
    cmd = [OPENMPI_MPIRUN, "--oversubscribe", "-n", "3", "-x", "PYTHONPATH", "-x",
           "WATCH_OUT", sys.executable, f"{PROGS}/boot_misc.py", "watch"]
    p = subprocess.Popen(cmd, env=_env(**OPENMPI_ENV, PYTHONPATH=ROOT, WATCH_OUT=out_base),
                         text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         start_new_session=True)
    try:
        seen = ""
        while seen.count("watching") < 3:
            line = p.stdout.readline()
            assert line, seen
            seen += line
        t0 = time.monotonic()
        p.kill()                        # mpirun only: its ranks keep running
        p.communicate(timeout=10)
        files = [f"{out_base}.{r}" for r in range(3)]
        while not all(os.path.exists(f) for f in files) and time.monotonic() - t0 < 30:
            time.sleep(0.1)
        elapsed = time.monotonic() - t0
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.communicate()
    for r, f in enumerate(files):
        with open(f) as fh:
            text = fh.read()
        assert text.startswith("PeerFailure peer=None: lost the connection to the PMIx "
                               "server"), text
        assert f"then barrier PeerFailure: rank {r}: PMIx barrier #1: lost the connection" \
            in text, text
    assert elapsed < 10, elapsed
