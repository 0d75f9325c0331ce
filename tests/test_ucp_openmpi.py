"""libucp.so.0 under Debian's Open MPI 4.1: its pml/osc/spml/atomic UCX
components on ucxpy (native/ucp/, ucxpy/capi.py), through ``ucxpy-ucx``.

* a C MPI program (tests/ucp/mpi_basics.c: p2p of every protocol, probe,
  cancel, datatypes, collectives, RMA windows) and a C OpenSHMEM program
  (tests/ucp/shmem_basics.c: puts/gets small and large, strided, fence, quiet,
  atomics, locks, reductions) at 2 and 4 ranks, under ``--check``: every rank
  proves it ran on our libucp with operations counted; OSHMEM's symmetric
  heap allocated at its fixed address (shmem_ptr maps peers'), or mmap'ed;
* the selection is forced: with ucxpy unable to start, the job fails instead
  of passing on Open MPI's ob1 or its shared memory;
* Open MPI forced off UCX passes its MPI but fails ``--check``, with a clear
  message;
* a PE killed mid-job ends the job with an error, never a hang.
Open MPI's own examples, shmem4py's suite and mpi4py's suite on Open MPI are
conformance/openmpi and conformance/mpi (ompi-ucp).
"""
import os
import re
import shutil
import subprocess
import sys

import pytest

from conftest import run_session
from ucxpy.tools import ucx

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
UCXPY_UCX = os.path.join(os.path.dirname(sys.executable), "ucxpy-ucx")
MPIRUN, OSHRUN = "/usr/bin/mpirun", "/usr/bin/oshrun"
MPICC, OSHCC = shutil.which("mpicc.openmpi"), shutil.which("oshcc")

pytestmark = [
    pytest.mark.skipif(not os.path.exists(ucx.LIBUCP),
                       reason="libucp.so.0 not built (UCX headers: libucx-dev)"),
    pytest.mark.skipif(not (MPICC and OSHCC and ucx.is_openmpi_launcher(MPIRUN)),
                       reason="Open MPI (openmpi-bin, libopenmpi-dev) is not installed"),
    pytest.mark.timeout(400),
]


def _env(**extra):
    env = dict(os.environ, **extra)
    if os.geteuid() == 0:
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    return env


def _run(cmd, timeout=150, env=None):
    return run_session(cmd, timeout, env or _env(), tail=3000)


def _build(tmp_path_factory, cc, source):
    exe = str(tmp_path_factory.mktemp("ompi") / source[:-2])
    subprocess.run([cc, "-O1", "-g", "-o", exe, os.path.join(ROOT, "tests", "ucp", source)],
                   check=True, capture_output=True, text=True, timeout=120)
    return exe


@pytest.fixture(scope="module")
def mpi_prog(tmp_path_factory):
    return _build(tmp_path_factory, MPICC, "mpi_basics.c")


@pytest.fixture(scope="module")
def shmem_prog(tmp_path_factory):
    return _build(tmp_path_factory, OSHCC, "shmem_basics.c")


@pytest.mark.parametrize("n", [2, 4])
def test_openmpi_c_program(mpi_prog, n):
    rc, out, err = _run([UCXPY_UCX, "--check", MPIRUN, "--oversubscribe", "-n", str(n), mpi_prog])
    assert rc == 0, out + err
    assert sorted(out.split("\n"))[-n:] == [f"rank {r}: OK" for r in range(n)]


@pytest.mark.parametrize("n", [2, 4])
def test_oshmem_c_program(shmem_prog, n):
    rc, out, err = _run([UCXPY_UCX, "--check", "--report", OSHRUN, "--oversubscribe", "-n",
                         str(n), shmem_prog])
    assert rc == 0, out + err
    assert sorted(line.split(" (")[0] for line in out.split("\n") if ": OK" in line) == \
        [f"PE {p} of {n}: OK" for p in range(n)]
    # sshmem/ucx: the heap at OSHMEM's fixed address, mapped by same-host PEs
    assert out.count(": mapped)") == n, out
    # ... whose puts ucxpy's data plane did, in every PE (the program's atomics
    # and gets are on static data: registered, not shared, so not mapped);
    # each PE has two workers (OSHMEM's pml and spml), one report each
    reports = re.findall(r"ucxpy-ucx --report: pid (\d+) on \S+: operations (.*); "
                         r"data plane (.*); entries into Python (\d+)", err)
    assert len({pid for pid, *_ in reports}) == n, err
    rma = [(ops, dp) for _pid, ops, dp, _entries in reports if "put=" in ops]
    assert len(rma) == n and all("put=" in dp for _ops, dp in rma), err


def test_oshmem_with_an_mmap_heap(shmem_prog):
    """The alternative heap (``sshmem mmap``): registered, not shared, so
    peers reach it by CMA or active messages, and shmem_ptr gives NULL."""
    rc, out, err = _run([UCXPY_UCX, "--check", OSHRUN, "-n", "2", shmem_prog],
                        env=_env(OMPI_MCA_sshmem="mmap"))
    assert rc == 0, out + err
    assert out.count(": NULL)") == 2, out


def test_oshmem_over_tcp_alone(shmem_prog):
    """OSHMEM's traffic over ucxpy's tcp transport (no shm, no mapped memory:
    RMA and atomics served by the target's progress)."""
    rc, out, err = _run([UCXPY_UCX, "--check", "--report", OSHRUN, "-n", "2", shmem_prog],
                        env=_env(UCXPY_TLS="tcp"))
    assert rc == 0, out + err
    assert out.count(": OK") == 2
    planes = re.findall(r"--report: pid \d+ on \S+: operations .*?; data plane (.*?);", err)
    assert len(planes) == err.count("--report: pid"), err
    for plane in planes:                # nothing mapped (the tcp eager path may send)
        assert not re.search(r"\b(put|get|atomic)=", plane), err


def test_killed_pe_ends_the_job(shmem_prog):
    rc, out, err = _run([UCXPY_UCX, OSHRUN, "--oversubscribe", "-n", "4", shmem_prog, "die"],
                        timeout=120)
    assert rc != 0
    assert ": OK" not in out


def test_no_fallback_when_ucxpy_cannot_start(mpi_prog):
    """The UCX components are forced: libucp failing to start (here: no
    transport it knows) fails the job loudly, never a run on ob1."""
    rc, out, err = _run([UCXPY_UCX, MPIRUN, "-n", "2", mpi_prog], env=_env(UCXPY_TLS="bogus"))
    assert rc != 0
    assert ": OK" not in out
    assert "ucx" in (out + err).lower()


def test_check_refuses_a_job_off_ucx(mpi_prog):
    """Open MPI told to use its own ob1 runs the program, but --check fails it
    and says why."""
    rc, out, err = _run([UCXPY_UCX, "--check", MPIRUN, "-n", "2", mpi_prog],
                        env=_env(OMPI_MCA_pml="ob1", OMPI_MCA_osc="^ucx", OMPI_MCA_btl="self,vader"))
    assert out.count(": OK") == 2                    # the program itself worked
    assert rc == 3 and "0 of 2 ranks" in err and "did not load" in err, err
    rc, out, err = _run([UCXPY_UCX, MPIRUN, "-n", "2", mpi_prog],   # without --check: a warning
                        env=_env(OMPI_MCA_pml="ob1", OMPI_MCA_osc="^ucx", OMPI_MCA_btl="self,vader"))
    assert rc == 0 and "no process of this job loaded" in err, err


def test_print_info_names_only_ucxpy_transports(mpi_prog):
    """Open MPI's default transport list (UCX's names: rc, ud, dc, ...) finds
    none of ucxpy's: with pml_ucx_tls left at its default the UCX pml is not
    selected, and the forced selection fails the job."""
    rc, out, err = _run([UCXPY_UCX, MPIRUN, "-n", "2", mpi_prog],
                        env=_env(OMPI_MCA_pml_ucx_tls="rc_verbs,ud_verbs,rc_mlx5,dc_mlx5",
                                 OMPI_MCA_pml_ucx_devices="mlx*"))
    assert rc != 0 and ": OK" not in out
    rc, out, err = _run([UCXPY_UCX, "--check", MPIRUN, "-n", "2", mpi_prog],
                        env=_env(OMPI_MCA_pml_ucx_tls="shm,tcp", OMPI_MCA_pml_ucx_devices="any"))
    assert rc == 0 and out.count(": OK") == 2, out + err


def test_shmem4py_finalized_at_python_exit(tmp_path):
    """The real shmem4py (built against OSHMEM) finalizes OSHMEM from C's exit,
    after Python's own finalization; libucp's adapter finalizes it while
    Python still runs instead (capi._finalize_bindings): OSHMEM's finalize
    barrier then works and the job exits 0."""
    import importlib.util
    if importlib.util.find_spec("shmem4py") is None:
        pytest.skip("shmem4py is not installed (OSHCC=oshcc pip install shmem4py)")
    prog = tmp_path / "hello.py"
    prog.write_text("from shmem4py import shmem\n"
                    "import numpy as np\n"
                    "me, n = shmem.my_pe(), shmem.n_pes()\n"
                    "dst = shmem.zeros(4, dtype='i')\n"
                    # zeros() fills after the collective allocation: a peer's
                    # put may land before our zeroing without this barrier
                    "shmem.barrier_all()\n"
                    "shmem.put(dst, np.full(4, me, dtype='i'), (me + 1) % n)\n"
                    "shmem.barrier_all()\n"
                    "assert (dst == (me - 1) % n).all(), dst\n"
                    # one write per PE: oshrun forwards each write as it
                    # comes, and with PYTHONUNBUFFERED print writes per item
                    "import os; os.write(1, f'PE {me} OK\\n'.encode())\n")   # no shmem.finalize()
    rc, out, err = _run([UCXPY_UCX, "--check", OSHRUN, "-n", "2", sys.executable, str(prog)])
    assert rc == 0, out + err
    assert out.count(" OK") == 2
