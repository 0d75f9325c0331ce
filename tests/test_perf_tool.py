"""ucxpy-perf smoke test: two ranks, two sizes, few iterations; output parses.
Never asserts on timing."""
from __future__ import annotations

import json
import shutil
import sys

import pytest

from conftest import run_job, transport_available

pytestmark = pytest.mark.timeout(120)

SIZES = (8, 65536)


def _check_tables(stdout):
    from ucxpy.tools.perf import parse_table
    tables = parse_table(stdout)
    assert set(tables) == {"tag_lat", "tag_bw"}, stdout
    for rows in tables.values():
        assert [r["size"] for r in rows] == list(SIZES)
        for r in rows:
            assert r["iters"] == 5
            assert r["latency_us"] > 0 and r["bandwidth_GBps"] >= 0
    return tables


@pytest.mark.parametrize("tl", ["tcp", "shm"])
def test_perf_two_ranks(tl, tmp_path):
    if not transport_available(tl):
        pytest.skip(f"transport {tl} unavailable")
    out = tmp_path / "perf.json"
    cp = run_job([sys.executable, "-m", "ucxpy.tools.perf", "-t", "tag_lat,tag_bw",
                  "--sizes", ",".join(map(str, SIZES)), "--iters", "5", "--window", "4",
                  "--json", str(out)], 2, timeout=90, env={"UCXPY_TLS": tl})
    assert cp.returncode == 0, cp.stdout + cp.stderr
    assert f"lane={tl}" in cp.stdout
    tables = _check_tables(cp.stdout)
    data = json.loads(out.read_text())
    assert data["meta"]["impl"] == "ucxpy" and data["meta"]["lane"] == tl
    assert [r["size"] for r in data["tests"]["tag_lat"]] == [r["size"] for r in tables["tag_lat"]]


def test_perf_mpi4py_reference():
    pytest.importorskip("mpi4py")
    if shutil.which("mpiexec") is None:
        pytest.skip("no mpiexec")
    cp = run_job([sys.executable, "-m", "ucxpy.tools.perf", "--mpi4py",
                  "--sizes", ",".join(map(str, SIZES)), "--iters", "5", "--window", "4"],
                 2, timeout=90, launcher="mpiexec")
    assert cp.returncode == 0, cp.stdout + cp.stderr
    assert "impl=mpi4py" in cp.stdout
    _check_tables(cp.stdout)


def test_perf_needs_two_ranks():
    cp = run_job([sys.executable, "-m", "ucxpy.tools.perf", "--sizes", "8", "--iters", "2"],
                 1, timeout=60)
    assert cp.returncode != 0
    assert "at least 2 ranks" in cp.stderr
