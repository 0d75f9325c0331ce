"""A cluster of "hosts" made of Linux network namespaces, for multi-host tests.

Topology (one :class:`Cluster`; every name carries a unique prefix
``ucxpyh-<pid>-<random>`` so parallel runs never clash)::

    <prefix>-h0  eth0 10.199.0.1/24 --+
    <prefix>-h1  eth0 10.199.0.2/24 --+-- br0 10.199.0.254/24  in <prefix>-sw
    ...                               |   (the "head node": launchers run here)

Each host namespace is linked to the switch namespace either by a veth pair
(``link="veth"``) or, when the test wants delay and loss and the kernel has
no ``sch_netem``, by two TAP devices joined by :mod:`tests.hosts.linkemu`
(``link="emulated"``), a userspace cable that delays and drops frames.
Nothing is created in the caller's namespace: the 10.199.0.0/24 addresses
exist only inside the cluster, and all traffic stays there.

Ranks run inside the hosts through ucxpy-run's ``--host-agent 'ip netns exec
<prefix>-{host}'``, the launcher itself runs in the switch namespace and
advertises 10.199.0.254.  Shared memory cannot reach across hosts (the
worker's host id contains the network-namespace inode), so traffic between
hosts takes tcp (or ofi), traffic inside one host shm.

:func:`skip_reason` says why namespaces cannot be used here (not root, no
``ip``, no CAP_SYS_ADMIN/CAP_NET_ADMIN); the tests skip with that message.
"""
from __future__ import annotations

import functools
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import time

from ucxpy.transports.liveness import pid_alive

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PROGS = os.path.join(ROOT, "tests", "progs")
NETNS_DIR = "/var/run/netns"
PREFIX = "ucxpyh-"
SUBNET = "10.199.0"
SWITCH_IP = f"{SUBNET}.254"
MTU = 9000
_NAME_RE = re.compile(r"^ucxpyh-(\d+)-[0-9a-f]+-(sw|h\d+)$")


class HarnessError(RuntimeError):
    """The cluster could not be set up or controlled."""


def sh(*argv, check=True, timeout=30, **kw):
    """Run a command, return CompletedProcess; raise HarnessError on failure."""
    p = subprocess.run([str(a) for a in argv], capture_output=True, text=True,
                       timeout=timeout, **kw)
    if check and p.returncode != 0:
        raise HarnessError(f"{' '.join(map(str, argv))}: exit {p.returncode}: "
                           f"{(p.stderr or p.stdout).strip()}")
    return p


@functools.lru_cache(maxsize=None)
def skip_reason() -> str:
    """'' when namespaces with veth links can be created here, else why not."""
    if not sys.platform.startswith("linux"):
        return "network namespaces need Linux"
    if os.geteuid() != 0:
        return "network namespaces need root (CAP_SYS_ADMIN + CAP_NET_ADMIN); run as root"
    if shutil.which("ip") is None:
        return "iproute2 is missing (apt-get install -y iproute2)"
    reap_stale()
    name = f"{PREFIX}{os.getpid()}-{secrets.token_hex(3)}-probe"
    try:
        p = sh("ip", "netns", "add", name, check=False)
        if p.returncode != 0:
            return f"cannot create a network namespace: {p.stderr.strip()}"
        p = sh("ip", "-n", name, "link", "add", "a0", "type", "veth", "peer", "name", "b0",
               check=False)
        if p.returncode != 0:
            return f"cannot create a veth pair (CAP_NET_ADMIN?): {p.stderr.strip()}"
        p = sh("ip", "-n", name, "link", "add", "br0", "type", "bridge", check=False)
        if p.returncode != 0:
            return f"cannot create a bridge: {p.stderr.strip()}"
    except (OSError, subprocess.SubprocessError) as e:
        return f"cannot run ip: {e}"
    finally:
        sh("ip", "netns", "del", name, check=False)
    return ""


@functools.lru_cache(maxsize=None)
def netem_available() -> bool:
    """Does ``tc qdisc ... netem`` work (kernel sch_netem)?"""
    if skip_reason() or shutil.which("tc") is None:
        return False
    name = f"{PREFIX}{os.getpid()}-{secrets.token_hex(3)}-probe"
    try:
        sh("ip", "netns", "add", name)
        sh("ip", "-n", name, "link", "add", "a0", "type", "veth", "peer", "name", "b0")
        return sh("ip", "netns", "exec", name, "tc", "qdisc", "add", "dev", "a0", "root",
                  "netem", "delay", "1ms", check=False).returncode == 0
    except HarnessError:
        return False
    finally:
        sh("ip", "netns", "del", name, check=False)


@functools.lru_cache(maxsize=None)
def tap_available() -> bool:
    return os.path.exists("/dev/net/tun") and not skip_reason()


def _kill_netns_pids(name: str) -> None:
    p = sh("ip", "netns", "pids", name, check=False)
    for tok in p.stdout.split():
        try:
            os.kill(int(tok), signal.SIGKILL)
        except (ValueError, ProcessLookupError, PermissionError):
            pass


def reap_stale() -> int:
    """Delete namespaces left by harness runs whose process is gone."""
    n = 0
    try:
        names = os.listdir(NETNS_DIR)
    except OSError:
        return 0
    for name in names:
        m = _NAME_RE.match(name) or re.match(r"^ucxpyh-(\d+)-[0-9a-f]+-probe$", name)
        if m and not pid_alive(int(m.group(1))):
            _kill_netns_pids(name)
            sh("ip", "netns", "del", name, check=False)
            n += 1
    return n


class Cluster:
    """``n`` hosts on one switch.  Use as a context manager (or call
    :meth:`close`): namespaces, links and emulators are removed even when a
    test fails half-way."""

    def __init__(self, n: int, link: str = "veth"):
        if link not in ("veth", "emulated"):
            raise ValueError(link)
        self.n = n
        self.link = link
        self.prefix = f"{PREFIX}{os.getpid()}-{secrets.token_hex(3)}"
        self.switch = f"{self.prefix}-sw"
        self.hosts = [f"{self.prefix}-h{i}" for i in range(n)]
        self._created: list = []
        self._emus: dict = {}
        self._procs: list = []
        try:
            self._build()
        except BaseException:
            self.close()
            raise

    # -- topology ------------------------------------------------------------
    def ip(self, host: int) -> str:
        return f"{SUBNET}.{host + 1}"

    def _build(self) -> None:
        for ns in [self.switch] + self.hosts:
            sh("ip", "netns", "add", ns)
            self._created.append(ns)
            sh("ip", "-n", ns, "link", "set", "lo", "up")
        sw = self.switch
        sh("ip", "-n", sw, "link", "add", "br0", "type", "bridge")
        sh("ip", "-n", sw, "addr", "add", f"{SWITCH_IP}/24", "dev", "br0")
        for i, ns in enumerate(self.hosts):
            port = f"h{i}"
            if self.link == "veth":
                sh("ip", "-n", ns, "link", "add", "eth0", "mtu", MTU, "type", "veth",
                   "peer", "name", port, "mtu", MTU, "netns", sw)
            else:
                self._start_emulator(i)
            sh("ip", "-n", sw, "link", "set", port, "mtu", MTU, "master", "br0", "up")
            sh("ip", "-n", ns, "link", "set", "eth0", "mtu", MTU, "up")
            sh("ip", "-n", ns, "addr", "add", f"{self.ip(i)}/24", "dev", "eth0")
        sh("ip", "-n", sw, "link", "set", "br0", "up")
        self._wait_reachable()

    def _start_emulator(self, i: int) -> None:
        p = subprocess.Popen(
            [sys.executable, os.path.join(os.path.dirname(__file__), "linkemu.py"),
             self.hosts[i], "eth0", self.switch, f"h{i}", str(MTU)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            bufsize=1)
        self._emus[i] = p
        line = self._readline(p, 10)
        if line.strip() != "READY":
            raise HarnessError(f"link emulator for host {i} did not start: {line!r} "
                               f"{p.stderr.read() if p.poll() is not None else ''}")

    @staticmethod
    def _readline(p, timeout: float) -> str:
        import select
        r, _, _ = select.select([p.stdout], [], [], timeout)
        return p.stdout.readline() if r else ""

    def _wait_reachable(self, timeout: float = 10.0) -> None:
        """Every host reaches the switch (ARP + a TCP connect through the bridge;
        the bridge port goes forwarding right away without STP)."""
        probe = ("import socket,sys,time\n"
                 "d=time.monotonic()+%r\n"
                 "while True:\n"
                 "  s=socket.socket(); s.settimeout(1)\n"
                 "  r=s.connect_ex((%r, 9)); s.close()\n"
                 "  if r in (0, 111): sys.exit(0)\n"       # refused = reached the host
                 "  if time.monotonic()>d: sys.exit('unreachable: %%d' %% r)\n"
                 "  time.sleep(0.05)\n") % (timeout, SWITCH_IP)
        for ns in self.hosts:
            sh("ip", "netns", "exec", ns, sys.executable, "-c", probe, timeout=timeout + 5)

    # -- impairments -----------------------------------------------------------
    def impair(self, host: int, delay: float = 0.0, loss: float = 0.0) -> None:
        """Delay (seconds, each direction) and drop a fraction of the frames on
        ``host``'s link.  ``loss=1`` cuts the link silently."""
        if self.link == "emulated":
            self._emu_cmd(host, f"set delay={delay} loss={loss}")
            return
        args = ["netem", "delay", f"{delay * 1000:.3f}ms", "loss", f"{loss * 100:.3f}%"]
        sh("ip", "netns", "exec", self.hosts[host], "tc", "qdisc", "replace", "dev", "eth0",
           "root", *args)
        sh("ip", "netns", "exec", self.switch, "tc", "qdisc", "replace", "dev", f"h{host}",
           "root", *args)

    def _emu_cmd(self, host: int, cmd: str) -> str:
        p = self._emus[host]
        p.stdin.write(cmd + "\n")
        p.stdin.flush()
        line = self._readline(p, 5)
        if not line.startswith("OK"):
            raise HarnessError(f"link emulator {host}: {cmd!r} -> {line!r}")
        return line.strip()

    def link_stats(self, host: int) -> str:
        return self._emu_cmd(host, "stats") if self.link == "emulated" else ""

    def cut(self, host: int) -> None:
        """Silently disconnect ``host`` (no FIN/RST reaches anyone): the switch
        port goes down (veth) or the cable drops everything (emulated)."""
        if self.link == "emulated":
            self.impair(host, loss=1.0)
        else:
            sh("ip", "-n", self.switch, "link", "set", f"h{host}", "down")

    def heal(self, host: int) -> None:
        if self.link == "emulated":
            self.impair(host)
        else:
            sh("ip", "-n", self.switch, "link", "set", f"h{host}", "up")

    # -- running things --------------------------------------------------------
    def env(self, extra=None) -> dict:
        e = dict(os.environ)
        e["PYTHONPATH"] = ROOT + os.pathsep + e.get("PYTHONPATH", "")
        e["FI_TCP_IFACE"] = "eth0"          # libfabric's tcp provider: not lo
        e.pop("UCXPY_RUN_ADDR", None)
        e.update(extra or {})
        return e

    def launcher_argv(self, prog, args=(), per_host=1, n=None, timeout=120, grace=5.0,
                      agent_prefix="") -> list:
        """ucxpy-run argv (to run in the switch namespace) for ``per_host``
        ranks on each host: ranks [k*per_host, (k+1)*per_host) on host k."""
        n = n if n is not None else per_host * self.n
        hosts = ",".join(f"h{i}:{per_host}" for i in range(self.n))
        prog = prog if os.path.isabs(prog) else os.path.join(PROGS, prog)
        return ["ip", "netns", "exec", self.switch,
                sys.executable, "-m", "ucxpy.bootstrap.launcher", "-n", str(n),
                "--timeout", str(timeout), "--grace", str(grace), "--tag-output",
                "--hosts", hosts, "--advertise", SWITCH_IP,
                "--host-agent", f"{agent_prefix}ip netns exec {self.prefix}-{{host}}",
                sys.executable, prog, *map(str, args)]

    def run_job(self, prog, args=(), per_host=1, timeout=120, env=None, **kw):
        """Run an SPMD job across the hosts; CompletedProcess (killed on timeout)."""
        argv = self.launcher_argv(prog, args, per_host, timeout=timeout, **kw)
        return subprocess.run(argv, env=self.env(env), capture_output=True, text=True,
                              timeout=timeout + 30, cwd=ROOT)

    def start_job(self, prog, args=(), per_host=1, timeout=120, env=None, **kw):
        """Like :meth:`run_job` but returns the Popen (stdout line-buffered text,
        stderr merged), for tests that act while the job runs."""
        argv = self.launcher_argv(prog, args, per_host, timeout=timeout, **kw)
        p = subprocess.Popen(argv, env=self.env(dict(env or {}, PYTHONUNBUFFERED="1")),
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             bufsize=1, cwd=ROOT)
        self._procs.append(p)
        return p

    def exec(self, host, argv, timeout=60, env=None):
        """Run ``argv`` inside host ``host`` (index) or namespace name."""
        ns = self.hosts[host] if isinstance(host, int) else host
        return subprocess.run(["ip", "netns", "exec", ns, *map(str, argv)], env=self.env(env),
                              capture_output=True, text=True, timeout=timeout, cwd=ROOT)

    # -- teardown ----------------------------------------------------------------
    def close(self) -> None:
        """Kill everything running in the cluster, stop the emulators and delete
        the namespaces (idempotent, never raises)."""
        for p in self._procs:
            if p.poll() is None:
                try:
                    os.kill(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
            for s in (p.stdout, p.stdin):
                if s:
                    s.close()
        self._procs.clear()
        for ns in reversed(self._created):
            _kill_netns_pids(ns)
        for p in self._emus.values():
            try:
                p.kill()
                p.wait(timeout=5)
            except (OSError, subprocess.TimeoutExpired):
                pass
            for s in (p.stdin, p.stdout, p.stderr):
                try:
                    s.close()
                except OSError:
                    pass
        self._emus.clear()
        for ns in reversed(self._created):
            for _ in range(3):
                if sh("ip", "netns", "del", ns, check=False).returncode == 0:
                    break
                time.sleep(0.2)
        self._created.clear()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def lines_until(proc, pattern: str, timeout: float) -> list:
    """Read ``proc``'s stdout lines until one contains ``pattern``; returns the
    lines read (raises HarnessError on timeout or EOF).  Reads the pipe's file
    descriptor itself: select() on a buffered file object misses lines that
    already sit in its buffer."""
    import select
    fd = proc.stdout.fileno()
    buf = getattr(proc, "_ucxpyh_buf", b"")
    out = []
    deadline = time.monotonic() + timeout
    while True:
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            out.append(line.decode(errors="replace") + "\n")
            if pattern in out[-1]:
                proc._ucxpyh_buf = buf
                return out
        left = deadline - time.monotonic()
        if left <= 0:
            proc._ucxpyh_buf = buf
            raise HarnessError(f"{pattern!r} not seen within {timeout} s; got:\n" + "".join(out))
        r, _, _ = select.select([fd], [], [], left)
        if not r:
            continue
        chunk = os.read(fd, 65536)
        if not chunk:
            proc._ucxpyh_buf = buf
            raise HarnessError(f"job ended before {pattern!r}; got:\n" + "".join(out)
                               + buf.decode(errors="replace"))
        buf += chunk


def finish(proc, timeout: float) -> str:
    """The rest of ``proc``'s output (after :func:`lines_until`) once it exits."""
    rest, _ = proc.communicate(timeout=timeout)
    return getattr(proc, "_ucxpyh_buf", b"").decode(errors="replace") + (rest or "")


AGENT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "netns_agent.sh")


def mpiexec_argv(cluster: Cluster, prog, args=(), per_host=1) -> list:
    """mpiexec (MPICH hydra) argv, to run in the switch namespace: hydra's ssh
    launcher with :data:`AGENT` as "ssh" starts one proxy per host namespace;
    ``-iface br0`` makes the proxies call back to 10.199.0.254."""
    prog = prog if os.path.isabs(prog) else os.path.join(PROGS, prog)
    hosts = ",".join(f"h{i}:{per_host}" for i in range(cluster.n))
    return ["ip", "netns", "exec", cluster.switch, "mpiexec", "-launcher", "ssh",
            "-launcher-exec", AGENT, "-iface", "br0", "-hosts", hosts,
            "-n", str(per_host * cluster.n), "-genvall", sys.executable, prog, *map(str, args)]


def dump_stacks(cluster: Cluster) -> None:
    """SIGUSR1 every process in the cluster's hosts: programs that registered
    faulthandler on it print their Python stacks (for hang diagnosis)."""
    for ns in cluster.hosts:
        for tok in sh("ip", "netns", "pids", ns, check=False).stdout.split():
            try:
                os.kill(int(tok), signal.SIGUSR1)
            except (ValueError, ProcessLookupError, PermissionError):
                pass
