"""Shared fixtures: in-process worker pairs driven together, and job launching."""
from __future__ import annotations

import collections
import os
import re
import shutil
import subprocess
import sys
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROGS = os.path.join(ROOT, "tests", "progs")
# A job of the suite that ucxpy-run kills at its --timeout prints every
# rank's stacks first: a hang seen once in a CI run is then diagnosable.
os.environ.setdefault("UCXPY_RUN_STACKS_ON_TIMEOUT", "1")


# ------------------------------------------------- full-size jobs (make test-scale)
def pytest_addoption(parser):
    parser.addoption("--scale", action="store_true",
                     help="also run the full-size jobs marked 'scale' (make test-scale)")


def pytest_configure(config):
    config.addinivalue_line("markers", "scale: a full-size job (64 ranks over 16 hosts, 128 "
                                       "ranks on one host); only with --scale")


#: the files that take longest (seconds in 2-worker runs of 2026-12-07),
#: longest first: ``make test`` runs files on 2 pytest workers (xdist's
#: loadfile), and a long file started last would leave one worker alone
#: at the end.  The rest follow in their usual order.
LONGEST_FIRST = (
    "test_conformance.py",           # 270-375: mpi4py's whole suite on mpi_shim
    "test_conformance_ucp.py",       # 208-288: the mpi4py wheel on libucp
    "hosts/test_slurm.py",           # 103-120
    "test_torch_backend.py",         # 85-101
    "test_conformance_mpich.py",     # 35-190: allredmany's 4 ranks spin, on both sides
    "test_load.py",                  # 52-58: the 30 s soak
    "hosts/test_link_faults.py",     # 40-46
    "test_fuzz_wire.py",             # 40
)


def _longest_first(item) -> int:
    path = item.nodeid.split("::", 1)[0]
    for i, name in enumerate(LONGEST_FIRST):
        if path.endswith("/" + name):
            return i
    return len(LONGEST_FIRST)


def pytest_collection_modifyitems(config, items):
    """Leave the 'scale' jobs out unless --scale (``make test`` runs their
    smaller versions); put the longest files first (stable: the rest keep
    their order)."""
    items.sort(key=_longest_first)
    if config.getoption("--scale"):
        return
    drop = [it for it in items if it.get_closest_marker("scale")]
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = [it for it in items if not it.get_closest_marker("scale")]


def shared_cpus(config) -> bool:
    """Whether this run's pytest workers (xdist, ``make test``'s
    PYTEST_WORKERS) share the CPUs: a job of one then competes with the
    other's, which its own count of ranks per host does not show."""
    return getattr(config, "workerinput", {}).get("workercount", 1) > 1


def transport_available(name: str) -> bool:
    from ucxpy.config import Config
    from ucxpy.context import load_transport
    cls, avail = load_transport(name, Config.from_env({}))
    return cls is not None and avail.available


def tcp_member_socket(iface, progress=None, key=None, hello=True, challenge=None,
                      timeout=5.0):
    """A blocking socket to tcp interface ``iface``; with ``hello`` the whole
    handshake is done by hand, proving with ``key`` (default: the
    interface's own key, i.e. as a member of the job), calling ``progress``
    (default ``iface.progress``) while the interface answers.  Returns
    ``(socket, acceptor challenge)`` (None without hello)."""
    import socket
    from ucxpy.transports import tcp
    ips, port, nonce = tcp.unpack_address(iface.address())
    s = socket.create_connection((ips[0], port), timeout=timeout)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if not hello:
        return s, None
    challenge = challenge or os.urandom(16)
    s.sendall(tcp.pack_hello(tcp.ROLE_CONNECTOR, nonce, challenge))
    s.setblocking(False)
    got = b""
    deadline = time.monotonic() + timeout
    while len(got) < tcp._HELLO.size:
        (progress or iface.progress)()
        try:
            chunk = s.recv(tcp._HELLO.size - len(got))
        except BlockingIOError:
            if time.monotonic() > deadline:
                raise AssertionError("no hello from the tcp interface")
            continue
        if not chunk:
            raise ConnectionError("the tcp interface closed during the handshake")
        got += chunk
    s.setblocking(True)
    s.settimeout(timeout)
    theirs = tcp._HELLO.unpack(got)[5]
    s.sendall(tcp.handshake_proof(key or iface.key, tcp.ROLE_CONNECTOR, challenge, theirs,
                                  nonce))
    return s, theirs


def drive(workers, cond, timeout=30.0):
    """Progress every worker in this process until ``cond()``; fail on timeout."""
    deadline = time.monotonic() + timeout
    while not cond():
        for w in workers:
            w.progress()
        if time.monotonic() > deadline:
            raise AssertionError("drive(): condition not reached in time")


def wait_all(workers, reqs, timeout=30.0):
    drive(workers, lambda: all(r.done for r in reqs), timeout)
    return [r.wait() for r in reqs]


class Pair:
    """Two workers in one process, each with an endpoint to the other."""

    def __init__(self, tls, n=2, **cfg):
        import ucxpy
        self.ctx = ucxpy.Context(ucxpy.Config.from_env({}, tls=tls, **cfg))
        self.workers = [self.ctx.create_worker(worker_id=i) for i in range(n)]
        self.eps = [[w.connect(o.address_bytes) for o in self.workers] for w in self.workers]

    def drive(self, cond, timeout=30.0):
        drive(self.workers, cond, timeout)

    def wait(self, *reqs, timeout=30.0):
        return wait_all(self.workers, reqs, timeout)

    def close(self):
        for w in self.workers:
            for ep in list(w.endpoints.values()):
                ep.abort()
            w.close()


@pytest.fixture
def pair(tl):
    """A :class:`Pair` on each transport (files that force protocol
    thresholds define their own)."""
    p = Pair(tl)
    yield p
    p.close()


@pytest.fixture(params=["tcp", "shm", "ofi", "verbs"])
def tl(request):
    if request.param == "verbs":
        why = rdma_device()
        if why:
            pytest.skip(f"transport verbs unavailable: {why}")
    if not transport_available(request.param):
        pytest.skip(f"transport {request.param} unavailable")
    return request.param


#: Soft-RoCE device this run created (deleted at exit), and why verbs cannot run
_RXE = {"why": None, "created": []}
RXE_NAME = "ucxpyrxe0"


def rdma_device() -> str:
    """'' when an RDMA device is usable; else why not.  Without one, as root,
    tries to create a Soft-RoCE device (``modprobe rdma_rxe``, ``rdma link
    add ucxpyrxe0 type rxe netdev <default-route interface>``) so that the
    whole tag/AM/RMA suite runs over verbs (``make test-verbs``; see
    docs/guide/rdma.md); the device is deleted when the run ends."""
    if _RXE["why"] is not None:
        return _RXE["why"]
    import atexit

    def run(*cmd):
        try:
            return subprocess.run(cmd, capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.SubprocessError) as e:
            return subprocess.CompletedProcess(cmd, 127, "", str(e))

    why = ""
    if not transport_available("verbs"):
        if os.environ.get("UCXPY_TEST_SOFT_ROCE", "y").lower() in ("0", "n", "no"):
            why = "no RDMA device (UCXPY_TEST_SOFT_ROCE=n: no Soft-RoCE attempt)"
        elif not hasattr(os, "geteuid") or os.geteuid() != 0:
            why = "no RDMA device, and creating a Soft-RoCE one needs root"
        elif shutil.which("rdma") is None:
            why = "no RDMA device, and iproute2's rdma tool is missing"
        else:
            loaded = os.path.isdir("/sys/module/rdma_rxe")
            p = subprocess.CompletedProcess((), 0) if loaded else run("modprobe", "rdma_rxe")
            if p.returncode != 0 and shutil.which("modprobe") is None:
                why = ("no RDMA device, and no rdma_rxe module loaded (modprobe is missing: "
                       "apt-get install kmod)")
            elif p.returncode != 0:
                why = ("no RDMA device, and this kernel cannot load Soft-RoCE "
                       f"(modprobe rdma_rxe: {(p.stderr or p.stdout).strip() or p.returncode})")
            else:
                route = run("ip", "-o", "route", "show", "default").stdout.split()
                netdev = route[route.index("dev") + 1] if "dev" in route else "lo"
                p = run("rdma", "link", "add", RXE_NAME, "type", "rxe", "netdev", netdev)
                if p.returncode != 0:
                    why = f"rdma link add {RXE_NAME} failed: {(p.stderr or p.stdout).strip()}"
                else:
                    _RXE["created"].append(RXE_NAME)
                    atexit.register(run, "rdma", "link", "delete", RXE_NAME)
                    if not transport_available("verbs"):
                        why = f"created {RXE_NAME} over {netdev}, yet verbs is unavailable"
    _RXE["why"] = why
    return why


#: Debian's Open MPI, used beside the mpich wheel's mpiexec (see README)
OPENMPI_MPIRUN = "/usr/bin/mpirun.openmpi"
OPENMPI_LIB = "/usr/lib/x86_64-linux-gnu/libmpi.so.40"
OPENMPI_ENV = {"MPI4PY_LIBMPI": OPENMPI_LIB, "OMPI_ALLOW_RUN_AS_ROOT": "1",
               "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1", "OMPI_MCA_rmaps_base_oversubscribe": "1"}


def have_openmpi() -> bool:
    return os.path.exists(OPENMPI_MPIRUN) and os.path.exists(OPENMPI_LIB)


def run_session(cmd, timeout=120, env=None, tail=None):
    """Run ``cmd`` in its own session: ``(returncode, stdout, stderr)``; on
    timeout the whole group is killed and the test fails as a hang (with the
    last ``tail`` characters of each stream, or all of them)."""
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=env, start_new_session=True)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, 9)
        out, err = p.communicate()
        cut = slice(-tail if tail else None, None)
        pytest.fail(f"hang: {cmd} did not end within {timeout} s\n{out[cut]}\n{err[cut]}")
    return p.returncode, out, err


def run_job(args, n, timeout=120, env=None, launcher="ucxpy-run"):
    """Run ``args`` as an n-rank job; returns CompletedProcess (kills on timeout)."""
    e = dict(os.environ)
    e.update(env or {})
    e["PYTHONPATH"] = ROOT + os.pathsep + e.get("PYTHONPATH", "")
    if launcher == "ucxpy-run":
        cmd = [sys.executable, "-m", "ucxpy.bootstrap.launcher", "-n", str(n),
               "--timeout", str(timeout)] + args
    elif launcher == "openmpi":
        e.update(OPENMPI_ENV)
        cmd = [OPENMPI_MPIRUN, "--oversubscribe", "-n", str(n)] + args
    else:
        cmd = ["mpiexec", "-n", str(n)] + args
    return subprocess.run(cmd, env=e, capture_output=True, text=True, timeout=timeout + 30,
                          cwd=ROOT)


# ------------------------------------------------- coverage of environments
#: the components a run may or may not exercise, and how to tell from the
#: test ids which tests exercised them
ENV_COMPONENTS = {
    "tcp": "tcp", "shm": "shm", "ofi": "ofi", "verbs": "verbs",
    "mpiexec (MPICH)": "mpiexec", "Open MPI": "openmpi", "PMIx": "pmix",
    "host tests (netns)": "tests/hosts/", "shmem4py comparison": "shmem4py",
}


def _environment(session):
    """{component: (tests run, tests skipped, available here, why not)}."""
    import importlib.util
    import shutil as _sh
    tr = session.config.pluginmanager.get_plugin("terminalreporter")
    if tr is None:
        return {}
    avail = {t: transport_available(t) for t in ("tcp", "shm", "ofi")}
    avail["verbs"] = not rdma_device()
    avail["mpiexec (MPICH)"] = bool(_sh.which("mpiexec")) and \
        importlib.util.find_spec("mpi4py") is not None
    avail["Open MPI"] = have_openmpi()
    from ucxpy.bootstrap.pmix_boot import unavailable_reason as pmix_unavailable
    why_pmix = pmix_unavailable()
    avail["PMIx"] = not why_pmix
    avail["shmem4py comparison"] = _sh.which("oshcc") is not None
    try:
        from hosts.netns import skip_reason
        why_hosts = skip_reason()
    except Exception as e:             # noqa: BLE001 - reported, not raised
        why_hosts = f"cannot probe: {e}"
    avail["host tests (netns)"] = not why_hosts
    out = {}
    for name, needle in ENV_COMPONENTS.items():
        ran = skipped = 0
        reasons = collections.Counter()
        for state in ("passed", "failed", "skipped"):
            for rep in tr.stats.get(state, []):
                nodeid = getattr(rep, "nodeid", "").lower()
                if "/" in needle:
                    if needle not in nodeid:
                        continue
                elif not re.search(rf"(?<![a-z]){needle}(?![a-z0-9])", nodeid):
                    continue      # "shm" in test_transport_shm.py or [shm], not in shmem4py
                if getattr(rep, "when", "call") != "call" and state != "skipped":
                    continue
                if state == "skipped":
                    skipped += 1
                    reasons[str(rep.longrepr[-1] if isinstance(rep.longrepr, tuple)
                                else rep.longrepr)[:90]] += 1
                else:
                    ran += 1
        why = why_hosts if name.startswith("host") else rdma_device() if name == "verbs" \
            else why_pmix if name == "PMIx" else ""
        out[name] = (ran, skipped, avail[name], why, reasons.most_common(1))
    return out


def _could_run_but_skipped(env):
    """Components this machine could have run (with what `make deps` installs)
    that a run skipped entirely: the CI run fails on them."""
    bad = []
    root = hasattr(os, "geteuid") and os.geteuid() == 0
    apt = shutil.which("apt-get") is not None
    for name, (ran, skipped, available, why, _) in env.items():
        if ran or not skipped:
            continue
        if name == "ofi" and not available and root and apt:
            bad.append("ofi: root and apt-get are here, but libfabric is missing "
                       "(`make deps` installs it)")
        elif name == "PMIx" and not available and root and apt:
            bad.append("PMIx: root and apt-get are here, but ucxpy._pmix is not built "
                       "(`make deps` installs libpmix-dev; then reinstall)")
        elif name == "host tests (netns)" and available:
            bad.append("host tests: network namespaces work here, yet every host test skipped")
        elif name in ("tcp", "shm"):
            bad.append(f"{name}: every {name} test skipped")
    return bad


def pytest_sessionfinish(session, exitstatus):
    if getattr(session.config.option, "collectonly", False):
        return
    env = _environment(session)
    if not env:
        return
    lines = ["", "environments covered by this run (tests run / skipped; available here):"]
    for name, (ran, skipped, available, why, reason) in env.items():
        note = "" if available else "  [not available here" + (f": {why}" if why else "") + "]"
        if skipped and reason and available:
            note += f"  e.g. skipped: {reason[0][0]}"
        lines.append(f"  {name:22s} {ran:5d} run {skipped:5d} skipped{note}")
    bad = _could_run_but_skipped(env)
    strict = os.environ.get("CI", "").lower() in ("1", "true", "yes")
    if bad:
        lines.append(("FAIL (CI=true)" if strict else "note") +
                     ": components this machine could run were skipped:")
        lines += [f"  - {b}" for b in bad]
    session.config._ucxpy_env_summary = lines
    if bad and strict and session.exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    for line in getattr(config, "_ucxpy_env_summary", []):
        terminalreporter.write_line(line)


def raises_remote_access(msg, fn, *args):
    """``fn(*args)`` raises RemoteAccessError with exactly ``msg``, not
    chained to another exception; returns it (the key-format tests)."""
    from ucxpy.errors import RemoteAccessError
    with pytest.raises(RemoteAccessError) as ei:
        fn(*args)
    assert str(ei.value) == msg
    assert ei.value.__suppress_context__ or ei.value.__context__ is None
    return ei.value
