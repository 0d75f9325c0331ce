"""torch.distributed backend "ucxpy" (ucxpy.torch): real jobs under torchrun,
ucxpy-run and mpiexec (tests/progs/torch_ops.py, tests/progs/torch_train.py).

Every operation against its expected result; DDP, FSDP2 and a GPipe
pipeline trained on ucxpy and on gloo, parameters (losses) compared; an MoE
dispatch/combine round trip with uneven and empty splits; a dead rank and a
stalled one failing the survivors' next collective.  Every process of a job
imports torch (1.5 s of CPU), so tests share jobs where they are
independent: the three trainings run in one job per backend, and the MoE
round trip runs in the operations job of its size."""
import functools
import os
import socket
import subprocess
import sys

import pytest
import torch

from conftest import run_job

PROGS = os.path.join(os.path.dirname(__file__), "progs")
OPS = os.path.join(PROGS, "torch_ops.py")
TRAIN = os.path.join(PROGS, "torch_train.py")
BIN = os.path.dirname(sys.executable)


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(n, *args, timeout=240):
    cmd = [os.path.join(BIN, "torchrun"), f"--nproc_per_node={n}", "--master_addr=127.0.0.1",
           f"--master_port={_port()}", *args]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                       env=dict(os.environ, OMP_NUM_THREADS="1"))
    return p.returncode, p.stdout + p.stderr


def _ok(rc, out, word, n):
    assert rc == 0, out[-4000:]
    assert out.count(word) == n, out[-4000:]


@functools.lru_cache(maxsize=None)
def _ops_and_moe(n):
    """One torchrun job of n ranks for two tests (every process imports
    torch, 1.5 s of CPU each): torch_ops.py, then the MoE round trip."""
    return torchrun(n, OPS, "ucxpy", "moe")


@pytest.mark.timeout(300)
@pytest.mark.parametrize("n", [2, 3, 4])
def test_every_operation_under_torchrun(n):
    """all_reduce (every op and dtype, async, AVG, PREMUL_SUM), broadcast,
    reduce, all_gather (list, single), reduce_scatter (list, single),
    gather, scatter, all_to_all(_single) with uneven and empty splits,
    barrier, send/recv with tags, batch_isend_irecv, object collectives,
    subgroups and (4 ranks) a 2 x 2 DeviceMesh."""
    rc, out = _ops_and_moe(n)
    assert out.count("TORCH OK") == n, out[-4000:]


@pytest.mark.timeout(300)
def test_under_ucxpy_run_without_master_addr():
    proc = run_job(["python", OPS], 3, timeout=240)
    _ok(proc.returncode, proc.stdout + proc.stderr, "TORCH OK", 3)


@pytest.mark.timeout(300)
def test_under_mpiexec_without_master_addr():
    p = subprocess.run([os.path.join(BIN, "mpiexec"), "-n", "2", sys.executable, OPS],
                       capture_output=True, text=True, timeout=240)
    _ok(p.returncode, p.stdout + p.stderr, "TORCH OK", 2)


#: what torch prints when a gloo rank aborts at exit (a joinable C++ thread
#: destroyed): the reference's own defect, after its training is done
GLOO_EXIT_ABORT = "terminate called without an active exception"


#: the training tests' modes, run one after the other in one job per
#: backend (torch_train.py's comma-separated modes)
TRAINED = ("ddp", "fsdp", "pipe")


@functools.lru_cache(maxsize=None)
def _training_job(backend, out, n=2):
    """(rc, output) of one torchrun job training every mode of TRAINED on
    ``backend``, each saving ``out``/<mode>.pt."""
    return torchrun(n, TRAIN, backend, ",".join(TRAINED), out)


def _trained(tmp_path_factory, mode, backend, n=2):
    out = str(tmp_path_factory.getbasetemp() / f"trained-{backend}")
    os.makedirs(out, exist_ok=True)
    rc, text = _training_job(backend, out, n)
    saved = os.path.join(out, f"{mode}.pt")
    if backend == "gloo" and rc != 0 and GLOO_EXIT_ABORT in text \
            and text.count("TRAIN OK") == n and os.path.exists(saved):
        # gloo, the reference, aborted at exit (about 1 run in 20 here) after
        # every rank finished and its parameters were saved: they count, as
        # shmem4py's figures do when OSHMEM crashes in shmem_finalize
        print(f"note: gloo aborted at exit after training:\n{text[-2000:]}")
        rc = 0
    assert text.count(f"TRAIN {mode} OK") == n and os.path.exists(saved), text[-4000:]
    return torch.load(saved)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("mode", ["ddp", "fsdp"])
def test_training_matches_gloo(tmp_path_factory, mode):
    """20 steps of the same model and seed on ucxpy and on gloo (DDP with
    several buckets; FSDP2 fully_shard per layer): the same parameters."""
    ours, ref = _trained(tmp_path_factory, mode, "ucxpy"), \
        _trained(tmp_path_factory, mode, "gloo")
    assert ours.keys() == ref.keys()
    for k in ours:
        assert torch.allclose(ours[k], ref[k], rtol=1e-6, atol=1e-7), k


@pytest.mark.timeout(300)
def test_pipelining_matches_gloo(tmp_path_factory):
    """torch.distributed.pipelining, GPipe over 2 stages, 4 microbatches:
    the last stage's losses equal gloo's."""
    ours, ref = _trained(tmp_path_factory, "pipe", "ucxpy"), \
        _trained(tmp_path_factory, "pipe", "gloo")
    assert len(ours) == 5 and ours == pytest.approx(ref, rel=1e-6)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("n", [2, 3, 4])
def test_moe_dispatch_and_combine_round_trip(n):
    """(In the job of test_every_operation_under_torchrun[n], after it.)"""
    _ok(*_ops_and_moe(n), "MOE OK", n)


@pytest.mark.timeout(120)
def test_dead_rank_fails_every_survivor_under_a_store(tmp_path):
    """Three ranks started by hand (a Store at rank 0, as torchrun's workers
    see it, without its agent, which would kill the job): rank 1 exits and
    ranks 0 and 2 get DistBackendError from their next collective."""
    port = _port()
    procs = [subprocess.Popen([sys.executable, TRAIN, "ucxpy", "die", "-"],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              env=dict(os.environ, MASTER_ADDR="127.0.0.1",
                                       MASTER_PORT=str(port), RANK=str(r), WORLD_SIZE="3"))
             for r in range(3)]
    outs = [p.communicate(timeout=90)[0] for p in procs]
    assert procs[1].returncode == 3, outs[1][-2000:]
    for r in (0, 2):
        assert procs[r].returncode == 0 and "FAILED AS EXPECTED" in outs[r], outs[r][-3000:]
        assert "DistBackendError" in outs[r]


@pytest.mark.timeout(120)
def test_dead_rank_fails_every_survivor_under_ucxpy_run():
    proc = run_job(["--fault-tolerant", "python", TRAIN, "ucxpy", "die", "-"], 3, timeout=90)
    out = proc.stdout + proc.stderr
    assert out.count("FAILED AS EXPECTED") == 2 and "DistBackendError" in out, out[-3000:]


@pytest.mark.timeout(120)
def test_stalled_rank_times_out():
    """A rank that never joins the collective: the others fail after the
    group's timeout (init_process_group(timeout=...)), not hang."""
    rc, out = torchrun(2, TRAIN, "ucxpy", "stall", "-", timeout=100)
    assert "TIMED OUT AS EXPECTED" in out, out[-3000:]


@pytest.mark.timeout(120)
def test_mismatched_sizes_fail_every_member():
    """Two ranks all_reduce tensors of different sizes (eager and
    rendezvous): both raise DistBackendError, neither gets a result with the
    other's short message in it."""
    rc, out = torchrun(2, TRAIN, "ucxpy", "mismatch", "-", timeout=100)
    assert out.count("MISMATCH FAILED AS EXPECTED") == 4, out[-3000:]
    assert "DistBackendError" in out and "returned" not in out, out[-3000:]
