"""ucxpy-perf smoke tests: two (or four) ranks, tiny sizes, few iterations;
the output parses and every implementation runs every test it offers.
Never asserts on timing: figures come from ``make bench`` only."""
from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys

import pytest

from conftest import ROOT, run_job, transport_available

pytestmark = pytest.mark.timeout(150)

SIZES = (8, 65536)
RMA = ("put_lat", "get_lat", "put_bw", "get_bw", "amo_lat")
PERF = [sys.executable, "-m", "ucxpy.tools.perf"]
SMOKE = ["--sizes", ",".join(map(str, SIZES)), "--iters", "5", "--window", "4"]
#: the comparison drivers live outside the package (bench/perf_drivers.py)
DRIVERS = os.path.join(ROOT, "bench", "perf_drivers.py")


def impl(name):
    """ucxpy-perf's options for the comparison driver ``name``."""
    return ["--drivers", DRIVERS, "--impl", name]


def _check_tables(stdout, tests=("tag_lat", "tag_lat_nb", "tag_bw")):
    from ucxpy.tools.perf import parse_table
    tables = parse_table(stdout)
    assert set(tables) == set(tests), stdout
    for test, rows in tables.items():
        want = [8] if test == "amo_lat" else list(SIZES)
        assert [r["size"] for r in rows] == want, (test, stdout)
        for r in rows:
            assert r["iters"] == 5
            # bandwidth is size / latency (the table prints 6 decimals)
            assert r["latency_us"] > 0, (test, r)
            want_bw = r["size"] / (r["latency_us"] * 1e-6) / 1e9
            tol = 2e-6 + want_bw * 0.0006 / r["latency_us"]      # latency has 3 decimals
            assert abs(r["bandwidth_GBps"] - want_bw) <= tol, (test, r)
    return tables


def _need_mpiexec():
    pytest.importorskip("mpi4py")
    if shutil.which("mpiexec") is None:
        pytest.skip("no mpiexec")


@pytest.mark.parametrize("tl", ["tcp", "shm"])
def test_perf_two_ranks(tl, tmp_path):
    if not transport_available(tl):
        pytest.skip(f"transport {tl} unavailable")
    out = tmp_path / "perf.json"
    cp = run_job(PERF + ["-t", "tag_lat,tag_lat_nb,tag_bw"] + SMOKE + ["--json", str(out)], 2,
                 timeout=90, env={"UCXPY_TLS": tl})
    assert cp.returncode == 0, cp.stdout + cp.stderr
    assert f"lane={tl}" in cp.stdout
    tables = _check_tables(cp.stdout)
    data = json.loads(out.read_text())
    assert data["meta"]["impl"] == "ucxpy" and data["meta"]["lane"] == tl
    assert [r["size"] for r in data["tests"]["tag_lat"]] == [r["size"] for r in tables["tag_lat"]]


@pytest.mark.parametrize("tl,mode", [("tcp", "am"), ("shm", "mapped")])
def test_perf_rma_two_ranks(tl, mode, tmp_path):
    """put/get/amo from rank 0 into rank 1's mem_map region; over tcp the
    passive target progresses from its barrier (AM mode)."""
    if not transport_available(tl):
        pytest.skip(f"transport {tl} unavailable")
    out = tmp_path / "perf.json"
    cp = run_job(PERF + ["-t", ",".join(RMA)] + SMOKE + ["--json", str(out)], 2,
                 timeout=90, env={"UCXPY_TLS": tl})
    assert cp.returncode == 0, cp.stdout + cp.stderr
    _check_tables(cp.stdout, RMA)
    assert f"mode={mode}" in cp.stdout, cp.stdout
    data = json.loads(out.read_text())
    assert data["meta"]["rma_modes"]["put_lat"] == mode


def test_perf_rma_with_a_third_rank():
    """Window creation is collective; rank 2 only joins it and the barriers."""
    cp = run_job(PERF + ["-t", "put_lat,amo_lat"] + SMOKE, 3, timeout=90)
    assert cp.returncode == 0, cp.stdout + cp.stderr
    _check_tables(cp.stdout, ("put_lat", "amo_lat"))


def test_perf_mpi4py_reference():
    _need_mpiexec()
    cp = run_job(PERF + impl("mpi4py") + SMOKE, 2, timeout=90, launcher="mpiexec")
    assert cp.returncode == 0, cp.stdout + cp.stderr
    assert "impl=mpi4py" in cp.stdout
    _check_tables(cp.stdout)


def test_perf_mpi4py_rma_and_allreduce():
    _need_mpiexec()
    tests = RMA + ("allreduce",)
    cp = run_job(PERF + impl("mpi4py") + ["-t", ",".join(tests)] + SMOKE, 2, timeout=90,
                 launcher="mpiexec")
    assert cp.returncode == 0, cp.stdout + cp.stderr
    _check_tables(cp.stdout, tests)


@pytest.mark.parametrize("tl", ["shm", "tcp"])
def test_perf_mpi_shim(tl):
    """The mpi4py code path with ``from mpi_shim import MPI`` under ucxpy-run."""
    if not transport_available(tl):
        pytest.skip(f"transport {tl} unavailable")
    tests = ("tag_lat", "tag_bw") + RMA + ("allreduce",)
    cp = run_job(PERF + impl("mpi_shim") + ["-t", ",".join(tests)] + SMOKE, 2, timeout=120,
                 env={"UCXPY_TLS": tl})
    assert cp.returncode == 0, cp.stdout + cp.stderr
    assert "impl=mpi_shim" in cp.stdout and f"lane=ucxpy-{tl}" in cp.stdout
    _check_tables(cp.stdout, tests)


def test_perf_mpi_shim_allreduce_four_ranks():
    cp = run_job(PERF + impl("mpi_shim") + ["-t", "allreduce"] + SMOKE, 4, timeout=120)
    assert cp.returncode == 0, cp.stdout + cp.stderr
    assert "ranks=4" in cp.stdout
    _check_tables(cp.stdout, ("allreduce",))


@pytest.mark.parametrize("tl", ["shm", "tcp"])
def test_perf_shmem(tl):
    if not transport_available(tl):
        pytest.skip(f"transport {tl} unavailable")
    cp = run_job(PERF + impl("shmem") + ["-t", ",".join(RMA)] + SMOKE, 2, timeout=120,
                 env={"UCXPY_TLS": tl})
    assert cp.returncode == 0, cp.stdout + cp.stderr
    assert "impl=shmem " in cp.stdout
    _check_tables(cp.stdout, RMA)


def test_perf_shmem4py_on_oshmem():
    """shmem4py under Open MPI's oshrun, when installed.  OSHMEM may crash in
    shmem_finalize after the tables were printed: the output still counts."""
    if importlib.util.find_spec("shmem4py") is None:
        pytest.skip("shmem4py not installed (OSHCC=oshcc pip install shmem4py)")
    if shutil.which("oshrun") is None:
        pytest.skip("no oshrun")
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    import run_bench
    env = run_bench.shmem4py_env()
    cmd = run_bench.oshrun_cmd(impl("shmem4py") + ["-t", "put_lat,amo_lat"] + SMOKE)
    cp = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert "impl=shmem4py" in cp.stdout, cp.stdout + cp.stderr
    _check_tables(cp.stdout, ("put_lat", "amo_lat"))


def test_perf_needs_two_ranks():
    cp = run_job(PERF + ["--sizes", "8", "--iters", "2"], 1, timeout=60)
    assert cp.returncode != 0
    assert "at least 2 ranks" in cp.stderr


@pytest.mark.parametrize("args,msg", [
    (impl("shmem") + ["-t", "tag_lat"], "not available"),
    (["-t", "allreduce"], "not available"),
    (["-t", "nope"], "unknown test"),
    # the comparison drivers exist only once their file is loaded
    (["--impl", "mpi4py"], "unknown implementation 'mpi4py'; registered: ucxpy ("),
    (impl("nope"), "registered: ucxpy, mpi4py, mpi_shim, shmem, shmem4py"),
    (["--drivers", "no/such/file.py"], "no such file"),
    (["--drivers", "no_such_module_here"], "No module named")])
def test_perf_rejects_unsupported_tests(args, msg):
    cp = subprocess.run(PERF + args, capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert cp.returncode == 2 and msg in cp.stderr, cp.stderr


def test_perf_drivers_from_a_module(tmp_path):
    """``--drivers NAME`` imports a module by name; what it registers with
    ``register_driver`` is what ``--impl`` runs (here ucxpy's own comm under
    another name, with only ``tag_lat``)."""
    (tmp_path / "toy_perf_driver.py").write_text(
        "from ucxpy.tools.perf import register_driver\n"
        "from ucxpy.tools.perf_comms import UcxpyComm\n"
        "register_driver('toy', UcxpyComm, ['tag_lat'])\n")
    env = {"PYTHONPATH": str(tmp_path) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    args = ["--drivers", "toy_perf_driver", "--impl", "toy"]
    cp = subprocess.run(PERF + args + ["-t", "tag_bw"], capture_output=True, text=True,
                        timeout=60, cwd=ROOT, env=dict(os.environ, **env))
    assert cp.returncode == 2 and "not available with toy" in cp.stderr, cp.stderr
    cp = run_job(PERF + args + ["-t", "tag_lat"] + SMOKE, 2, timeout=90, env=env)
    assert cp.returncode == 0, cp.stdout + cp.stderr
    assert "impl=toy" in cp.stdout
    _check_tables(cp.stdout, ("tag_lat",))


def test_bench_tables_ratios_and_best_of():
    """The bench driver's merging and ratio columns (numbers made up)."""
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    import run_bench

    def run(lat, bw):
        return {"meta": {"lane": "x"}, "tests": {
            "put_lat": [{"size": 8, "iters": 1, "latency_us": lat, "bandwidth_GBps": 0}],
            "put_bw": [{"size": 8, "iters": 1, "latency_us": 0, "bandwidth_GBps": bw}]}}
    best = run_bench.best_of([run(4.0, 1.0), run(2.0, 0.5), {"error": "x"}])
    assert best["tests"]["put_lat"][0]["latency_us"] == 2.0
    assert best["tests"]["put_bw"][0]["bandwidth_GBps"] == 1.0
    impls = {"shmem": best, "mpi4py": run(1.0, 2.0)}
    text, rows = run_bench.combined_table("put_lat", impls, [("shmem", "mpi4py")])
    assert rows[0]["shmem/mpi4py"] == 2.0 and "shmem/mpi4py" in text
    _, rows = run_bench.combined_table("put_bw", impls, [("shmem", "mpi4py")])
    assert rows[0]["shmem/mpi4py"] == 0.5


def test_bench_trace_offcost_probe():
    """bench/trace_offcost.py counts the worker.tr guards a message passes
    (a real 2-rank ping-pong with tracing off) and prices them; the figures
    are reported, not asserted, except that the counting saw the guards."""
    if os.environ.get("UCXPY_TRACE") or os.environ.get("UCXPY_STATS"):
        pytest.skip("the probe measures tracing off; UCXPY_TRACE/UCXPY_STATS are set here")
    proc = run_job(["python", os.path.join(ROOT, "bench", "trace_offcost.py")], 2, timeout=120,
                   env={"UCXPY_TLS": "shm" if transport_available("shm") else "tcp",
                        "OFFCOST_ITERS": "500"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("TRACE-OFFCOST "))
    o = json.loads(line.split(" ", 1)[1])
    assert o["iters"] == 500 and o["reads_per_message"] >= 2, o   # a send and a receive at least
    assert o["guard_ns"] > 0 and o["half_rtt_us"] > 0
    assert abs(o["offcost_ns"] - o["reads_per_message"] * o["guard_ns"]) < 1.0, o
    print(f"tracing off: {o}")          # informative
    # the bench driver turns it into a target line
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    import run_bench
    run_bench.OFFCOST.clear()
    run_bench.OFFCOST.update(o)
    try:
        rows = [t for t in run_bench.check_targets({}) if t[0].startswith("tracing off")]
    finally:
        run_bench.OFFCOST.clear()
    assert len(rows) == 1 and rows[0][1] in ("PASS", "MISS") and "guards per message" in rows[0][2]
