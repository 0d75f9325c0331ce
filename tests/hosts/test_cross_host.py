"""Ranks on different "hosts" (network namespaces): traffic crosses over tcp
(and ofi's tcp;ofi_rxm), shm stays inside a host, data verified byte for byte.
Launchers: ucxpy-run with --host-agent 'ip netns exec ...', and mpiexec
(MPICH hydra) with an ssh stand-in that enters the namespace."""
from __future__ import annotations

import os
import shutil

import pytest

from tests.hosts import netns

pytestmark = pytest.mark.timeout(240)


def ok_lines(proc, marker, n):
    # split on the marker, not on newlines: mpiexec may interleave ranks' lines
    lines = [(marker + chunk).split("\n")[0].strip() for chunk in proc.stdout.split(marker)[1:]]
    assert proc.returncode == 0 and len(lines) == n, \
        f"exit {proc.returncode}\n--- stdout\n{proc.stdout[-4000:]}\n--- stderr\n{proc.stderr[-4000:]}"
    return lines


def transport_ok(name):
    from conftest import transport_available
    return transport_available(name)


# tcp;ofi_rxm sometimes cancels a cross-host fi_read ('Operation canceled
# (Transport endpoint is not connected)'); the rendezvous then falls back to
# data frames.  This test failed about 1 run in 10 before that fallback and
# has passed every run since (40+ local runs, every CI run), so it is strict.


@pytest.mark.parametrize("tls,lane", [("shm,tcp", "tcp"),
                                      ("shm,ofi", "ofi")])
def test_tag_am_rma_cross_host_lanes(make_cluster, tls, lane):
    """2 hosts x 2 ranks: same-host pairs on shm (mapped RMA), cross-host
    pairs on tcp (AM-mode RMA) or ofi (RDMA-mode RMA); tag, AM (eager +
    rendezvous), put/get,
    atomics with every peer."""
    if not transport_ok(lane):
        pytest.skip(f"transport {lane} unavailable")
    c = make_cluster(2)
    p = c.run_job("rel_xhost.py", [2, lane], per_host=2, timeout=120,
                  env={"UCXPY_TLS": tls, "UCXPY_OFI_PROVIDER": "tcp;ofi_rxm"})
    for line in ok_lines(p, "XHOST OK", 4):
        rank = int(line.split("XHOST OK ")[1].split()[0])
        lanes = dict(kv.split(":") for kv in line.split("lanes=")[1].split()[0].split(","))
        modes = dict(kv.split(":") for kv in line.split("modes=")[1].split(","))
        for peer, l in lanes.items():
            same = int(peer) // 2 == rank // 2
            assert l == ("shm" if same else lane), line
            # RDMA lanes put/get one-sidedly; tcp is served by the target
            assert modes[peer] == ("mapped" if same else
                                   "rdma" if lane == "ofi" else "am"), line


def test_tag_suite_cross_host(make_cluster):
    """The SPMD tag suite (every size class to 4 MiB, wildcards, ordering) on
    3 hosts, tcp pinned to the namespace's device with UCXPY_TCP_IFACE."""
    c = make_cluster(3)
    p = c.run_job("tag_suite.py", per_host=1, timeout=150,
                  env={"TAG_SUITE_MAX": str(1 << 22), "UCXPY_TCP_IFACE": "eth0"})
    for line in ok_lines(p, "TAG-SUITE OK", 3):
        assert line.endswith(" tcp"), line


def test_rma_suite_cross_host(make_cluster):
    """RMA ring, fence ordering and atomic contention with exact results,
    every access in AM mode across hosts."""
    c = make_cluster(3)
    p = c.run_job("rma_suite.py", per_host=1, timeout=150, env={"RMA_ITERS": "50"})
    for line in ok_lines(p, "RMA-SUITE OK", 3):
        assert line.endswith(" am"), line


def test_no_shm_across_hosts_even_when_forced(make_cluster, tmp_path):
    """UCXPY_TLS=shm alone: ranks on one host connect, ranks on different
    hosts get TransportUnavailable (shm never pretends to reach another
    network namespace)."""
    c = make_cluster(2)
    prog = ("import ucxpy\n"
            "w = ucxpy.init()\n"
            "other = (w.rank + 1) % w.size\n"
            "try:\n"
            "    w.ep(other).transport_endpoint()\n"
            "    print('REACHED', w.rank, other, flush=True)\n"
            "except ucxpy.TransportUnavailable as e:\n"
            "    print('UNREACHABLE', w.rank, other, e, flush=True)\n"
            "import os; os._exit(0)\n")
    path = str(tmp_path / "shm_only.py")
    with open(path, "w") as f:
        f.write(prog)
    p = c.run_job(path, per_host=1, timeout=60, env={"UCXPY_TLS": "shm"})
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.count("UNREACHABLE") == 2 and "REACHED" not in p.stdout.replace(
        "UNREACHABLE", ""), p.stdout


@pytest.mark.skipif(shutil.which("mpiexec") is None, reason="no mpiexec (pip install mpich)")
def test_mpiexec_cross_host(make_cluster):
    """mpiexec (hydra) starts one proxy per host namespace through
    netns_agent.sh; ucxpy wires up through mpi4py; lanes as with ucxpy-run."""
    c = make_cluster(2)
    env = c.env({"UCXPY_BOOTSTRAP": "mpi", "UCXPY_NETNS_PREFIX": c.prefix,
                 "FI_PROVIDER": "tcp", "FI_TCP_IFACE": "eth0"})
    import subprocess
    p = subprocess.run(netns.mpiexec_argv(c, "rel_xhost.py", [2], per_host=2), env=env,
                       capture_output=True, text=True, timeout=120, cwd=netns.ROOT)
    ok_lines(p, "XHOST OK", 4)


# ids are pytest keywords: "mpi" alone would make pytest-mpi want --with-mpi
API_PROGS = [("mpi_smoke.py", [], "mpi_shim"), ("shmem_spec.py", [], "shmem")]


@pytest.mark.parametrize("prog,args,layer", API_PROGS, ids=[p[2] for p in API_PROGS])
def test_api_layer_smoke_cross_host(make_cluster, prog, args, layer):
    """The MPI and SHMEM layers' own smoke programs, 2 hosts x 2 ranks."""
    path = os.path.join(netns.PROGS, prog)
    if not os.path.exists(path):
        pytest.skip(f"{prog} does not exist (yet)")
    c = make_cluster(2)
    p = c.run_job(prog, args, per_host=2, timeout=180, env={"EXPECT_NPES": "4"})
    assert p.returncode == 0, f"exit {p.returncode}\n{p.stdout[-4000:]}\n{p.stderr[-4000:]}"


def test_job_key_and_bound_addresses_cross_host(make_cluster):
    """Every rank on every host gets the same job key (through the host
    agent's environment, not its command line) and binds its tcp listener
    to its host's own address, not to all interfaces; the service listens on
    the advertised switch address only."""
    import re
    c = make_cluster(2)
    p = c.run_job("sec_key.py", per_host=2, timeout=90)
    keys = re.findall(r"KEY 0:(\d+) ([0-9a-f]{16}) (\S+) (\S+)", p.stdout)
    assert p.returncode == 0 and len(keys) == 4, p.stdout + p.stderr
    assert len({k[1] for k in keys}) == 1 and all(k[3] == "ok" for k in keys), keys
    for rank, _h, listen, _ok in keys:
        assert listen == c.ip(int(rank) // 2), keys


@pytest.mark.skipif(shutil.which("mpiexec") is None or shutil.which("mpicc") is None,
                    reason="no mpiexec/mpicc (pip install mpich)")
def test_mpich_on_libucp_cross_host(make_cluster, tmp_path):
    """The real MPICH on ucxpy's libucp.so.0 across 2 hosts x 2 ranks (a C
    program, tests/ucp/mpi_basics.c): every rank reports our libucp, and the
    endpoints between hosts use ucxpy's tcp while those within a host use shm."""
    import json
    import subprocess
    import sys

    from ucxpy.tools import ucx
    if not os.path.exists(ucx.LIBUCP):
        pytest.skip("libucp.so.0 not built")
    exe = str(tmp_path / "mpi_basics")
    subprocess.run(["mpicc", "-O1", "-o", exe, os.path.join(netns.ROOT, "tests", "ucp",
                                                            "mpi_basics.c")], check=True)
    c = make_cluster(2)
    reports = tmp_path / "reports"
    env = ucx.environment(base=c.env({"UCXPY_NETNS_PREFIX": c.prefix, "UCXPY_TLS": "shm,tcp",
                                      "UCXPY_UCP_REPORT": str(reports)}))
    argv = netns.mpiexec_argv(c, exe, per_host=2)
    argv.remove(sys.executable)                    # a C program, not a Python one
    p = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120, cwd=netns.ROOT)
    ok_lines(p, ": OK", 4)
    assert ucx.check_reports(str(reports), 4) == []
    lanes = {}
    for f in reports.glob("*.json"):
        for name, count in json.loads(f.read_text())["lanes"].items():
            lanes[name] = lanes.get(name, 0) + count
    assert lanes.get("tcp") and lanes.get("shm"), lanes


def test_nixl_kv_example_across_two_hosts_over_tcp(make_cluster, tmp_path):
    """examples/nixl_kv_disagg.py with its decode process on one host and its
    prefill process on another (NIXL's UCX backend on ucxpy's libucp, tcp
    between them, one key file): the tokens and logits of one process."""
    import subprocess
    import sys
    from ucxpy.tools import ucx
    if not ucx.nixl_plugin_dir() or not os.path.exists(ucx.LIBUCP):
        pytest.skip("no NIXL wheel or no libucp.so.0")
    example = os.path.join(netns.ROOT, "examples", "nixl_kv_disagg.py")
    single = subprocess.run([sys.executable, example, "single"], capture_output=True,
                            text=True, timeout=120)
    assert single.returncode == 0, single.stderr
    c = make_cluster(2)
    bindir = os.path.dirname(sys.executable)
    cmd = [os.path.join(bindir, "ucxpy-ucx"), "--check", "--key-file", str(tmp_path / "kv.key"),
           sys.executable, example]
    env = c.env({"PATH": bindir + os.pathsep + os.environ.get("PATH", ""),
                 "UCXPY_TLS": "self,tcp"})
    env.pop("UCXPY_AUTH_KEY", None)
    dec = subprocess.Popen(["ip", "netns", "exec", c.hosts[0], *cmd, "decode", str(tmp_path)],
                           env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        pre = subprocess.run(["ip", "netns", "exec", c.hosts[1], *cmd, "prefill",
                              str(tmp_path)], env=env, capture_output=True, text=True,
                             timeout=120)
        dout, derr = dec.communicate(timeout=120)
    finally:
        if dec.poll() is None:
            dec.kill()
    assert pre.returncode == 0 and "blocks of" in pre.stdout, pre.stdout + pre.stderr
    assert dec.returncode == 0, dout + derr
    lines = [ln for ln in dout.splitlines() if ln.startswith(("tokens ", "logits sha256 "))]
    assert lines == single.stdout.splitlines(), (dout, single.stdout)
