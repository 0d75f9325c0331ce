"""A real Slurm cluster (Debian's slurmctld/slurmd 22.05 + munge) on the
network-namespace hosts of :mod:`tests.hosts.netns`.

Layout of one :class:`SlurmCluster` (everything under a private temp dir)::

    switch namespace  10.199.0.254  hostname "ctl"  slurmctld; srun/sbatch/scancel run here
    host namespace hK 10.199.0.K+1  hostname "hK"   slurmd -N hK (and its slurmstepds, ranks)
    root namespace                                  munged -F with its own key and socket

Every daemon gets its own UTS namespace (``unshare --uts`` + ``hostname``)
besides its network namespace, so ``gethostname()`` says ``ctl``/``hK`` as
on a real cluster; all share the mount namespace (one /dev/shm, one temp dir),
while shm never crosses hosts because the worker's host id includes the
network-namespace inode.  Each daemon also has a private mount namespace
(same files, same /dev/shm) only so that an empty cgroup mount can sit at
/sys/fs/cgroup: slurmd 22.05 will not start without one, even with
proctrack/linuxproc and task/none.  Authentication is ``auth/munge`` with a munged
private to the cluster (``--socket``/``--key-file`` in the temp dir, selected
by ``AuthInfo=socket=...``): the system's munge is neither used nor needed.

Configuration that matters for the tests: ``ProctrackType=proctrack/linuxproc``
and ``TaskPlugin=task/none`` (no cgroups), ``SlurmdTimeout`` low so a lost
node is declared DOWN within seconds, ``MpiDefault=pmi2``, CPUs=4 per node
with ``SlurmdParameters=config_overrides`` (the machine has 2 cores), and
``TmpFS`` per node (``tmp/%n``): the hosts share one file system, and the
PMIx plugin (``srun --mpi=pmix``) makes each step's client directory
``<TmpFS>/spmix_appdir_<uid>_<job>.<step>`` on every node, failing the
launch ("File exists") when two nodes' TmpFS is the same ``/tmp``.

:func:`skip_reason` says why a cluster cannot run here ('' when it can).
"""
from __future__ import annotations

import functools
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from tests.hosts import netns

BINARIES = ("slurmctld", "slurmd", "slurmstepd", "srun", "sbatch", "scancel", "sinfo",
            "squeue", "munged", "unshare")
CPUS_PER_NODE = 4
SLURMD_TIMEOUT = 6


@functools.lru_cache(maxsize=None)
def skip_reason() -> str:
    why = netns.skip_reason()
    if why:
        return f"network namespaces: {why}"
    missing = [b for b in BINARIES if shutil.which(b) is None
               and not os.path.exists(f"/usr/sbin/{b}")]
    if missing:
        return ("Slurm/munge binaries missing: " + ", ".join(missing)
                + " (apt-get install -y slurmctld slurmd slurm-client munge; `make deps`)")
    return ""


def _which(b):
    return shutil.which(b) or f"/usr/sbin/{b}"


class SlurmError(netns.HarnessError):
    pass


class SlurmCluster:
    """``n`` compute hosts h0..h{n-1} plus the controller; a context manager."""

    def __init__(self, n: int = 4, cpus: int = CPUS_PER_NODE):
        self.n, self.cpus = n, cpus
        self.dir = tempfile.mkdtemp(prefix="ucxpy-slurm-")
        os.chmod(self.dir, 0o755)
        self.conf = os.path.join(self.dir, "slurm.conf")
        self.munge_socket = os.path.join(self.dir, "munge", "munge.socket")
        self.net = None
        self._daemons: dict = {}        # name -> Popen (own session)
        self._clients: list = []
        try:
            self.net = netns.Cluster(n)
            self._write_config()
            self._start_munge()
            self._start_ctld()
            for i in range(n):
                self.start_slurmd(i)
            self.wait_nodes("idle", timeout=60)
        except BaseException:
            self.close()
            raise

    # -- configuration -------------------------------------------------------
    def _write_config(self) -> None:
        d = self.dir
        for sub in ["munge", "state", "log", "run"] + [f"{kind}/h{i}" for i in range(self.n)
                                                       for kind in ("spool", "tmp")]:
            os.makedirs(os.path.join(d, sub), exist_ok=True)
        os.chmod(os.path.join(d, "munge"), 0o700)
        nodes = ",".join(f"h{i}" for i in range(self.n))
        lines = [
            "ClusterName=ucxpytest",
            f"SlurmctldHost=ctl({netns.SWITCH_IP})",
            "SlurmUser=root", "SlurmdUser=root",
            "AuthType=auth/munge", "CredType=cred/munge",
            f"AuthInfo=socket={self.munge_socket}",
            f"StateSaveLocation={d}/state",
            f"SlurmdSpoolDir={d}/spool/%n",
            f"TmpFS={d}/tmp/%n",
            f"SlurmctldPidFile={d}/run/slurmctld.pid",
            f"SlurmdPidFile={d}/run/slurmd.%n.pid",
            f"SlurmctldLogFile={d}/log/slurmctld.log",
            f"SlurmdLogFile={d}/log/slurmd.%n.log",
            "SlurmctldDebug=info", "SlurmdDebug=info",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "SelectType=select/cons_tres", "SelectTypeParameters=CR_CPU",
            "SchedulerType=sched/backfill",
            "MpiDefault=pmi2",
            "ReturnToService=2",
            f"SlurmdTimeout={SLURMD_TIMEOUT}",
            "SlurmctldTimeout=10",
            "MessageTimeout=5",
            "InactiveLimit=0", "KillWait=3", "MinJobAge=30", "WaitTime=0",
            "SlurmdParameters=config_overrides",
            "LaunchParameters=send_gids_off",
        ]
        for i in range(self.n):
            lines.append(f"NodeName=h{i} NodeAddr={self.net.ip(i)} CPUs={self.cpus} "
                         f"RealMemory=100 State=UNKNOWN")
        lines.append(f"PartitionName=test Nodes={nodes} Default=YES MaxTime=10 State=UP")
        with open(self.conf, "w") as f:
            f.write("\n".join(l for l in lines if l) + "\n")

    def env(self, extra=None) -> dict:
        e = self.net.env(extra)
        e["SLURM_CONF"] = self.conf
        for k in list(e):           # an outer Slurm job's variables must not leak in
            if k.startswith(("SLURM_", "SBATCH_", "SRUN_", "SALLOC_", "PMI_")) \
                    and k != "SLURM_CONF":
                del e[k]
        return e

    # -- daemons -------------------------------------------------------------
    def _spawn(self, name, ns, hostname, argv):
        log = open(os.path.join(self.dir, "log", f"{name}.out"), "ab")
        # own hostname (UTS namespace); slurmd 22.05 insists on a cgroup file
        # system at /sys/fs/cgroup even with proctrack/linuxproc + task/none, so
        # the daemon's private mount namespace gets an empty tmpfs there (read
        # as cgroup v1 with only the named "systemd" hierarchy it checks for;
        # nothing is created in it); /dev/shm stays shared
        cmd = ["ip", "netns", "exec", ns, "unshare", "--uts", "--mount", "--propagation",
               "private", "sh", "-c",
               f"hostname {hostname} && mount -t tmpfs cgroup /sys/fs/cgroup"
               " && mkdir /sys/fs/cgroup/systemd"
               " && mount -t cgroup -o none,name=systemd cgroup /sys/fs/cgroup/systemd"
               ' && exec "$@"',
               "sh", *argv]
        p = subprocess.Popen(cmd, env=self.env(), stdin=subprocess.DEVNULL, stdout=log,
                             stderr=subprocess.STDOUT, start_new_session=True, cwd=self.dir)
        log.close()
        self._daemons[name] = p
        return p

    def _start_munge(self) -> None:
        md = os.path.join(self.dir, "munge")
        key = os.path.join(md, "munge.key")
        with open(key, "wb") as f:
            f.write(os.urandom(1024))
        os.chmod(key, 0o600)
        log = open(os.path.join(self.dir, "log", "munged.out"), "ab")
        p = subprocess.Popen(
            [_which("munged"), "-F", "--force", f"--socket={self.munge_socket}",
             f"--key-file={key}", f"--pid-file={md}/munged.pid",
             f"--log-file={md}/munged.log", f"--seed-file={md}/munged.seed"],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True)
        log.close()
        self._daemons["munged"] = p
        self._wait(lambda: os.path.exists(self.munge_socket), 10, "munged socket",
                   p, os.path.join(md, "munged.log"))

    def _start_ctld(self) -> None:
        p = self._spawn("slurmctld", self.net.switch, "ctl",
                        [_which("slurmctld"), "-D", "-i", "-f", self.conf])
        self._wait(lambda: self.ctl(["sinfo", "-h"], check=False, timeout=10).returncode == 0,
                   30, "slurmctld", p, os.path.join(self.dir, "log", "slurmctld.log"))

    def start_slurmd(self, i: int) -> None:
        self._spawn(f"slurmd-h{i}", self.net.hosts[i], f"h{i}",
                    [_which("slurmd"), "-D", "-N", f"h{i}", "-f", self.conf])

    def _wait(self, cond, timeout, what, proc=None, logfile=None) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if cond():
                return
            if proc is not None and proc.poll() is not None:
                break
            time.sleep(0.2)
        raise SlurmError(f"{what} not up within {timeout}s\n{self.logs(logfile)}")

    def logs(self, path=None, tail=3000) -> str:
        paths = [path] if path else sorted(
            os.path.join(self.dir, "log", f) for f in os.listdir(os.path.join(self.dir, "log")))
        out = []
        for p in paths:
            try:
                with open(p, errors="replace") as f:
                    out.append(f"--- {os.path.basename(p)}\n" + f.read()[-tail:])
            except OSError:
                pass
        return "\n".join(out)

    def node_states(self) -> dict:
        p = self.ctl(["sinfo", "-h", "-N", "-o", "%N %T"], check=False, timeout=10)
        return dict(l.split() for l in p.stdout.splitlines() if len(l.split()) == 2)

    def wait_nodes(self, state="idle", timeout=60, nodes=None) -> None:
        want = nodes or [f"h{i}" for i in range(self.n)]

        def ok():
            st = self.node_states()
            return all(st.get(h, "").rstrip("*~#").startswith(state) for h in want)
        self._wait(ok, timeout, f"nodes {want} {state} (now {self.node_states()})")

    # -- clients (in the switch namespace, hostname "ctl") ----------------------
    def ctl_argv(self, argv) -> list:
        return ["ip", "netns", "exec", self.net.switch, "unshare", "--uts", "sh", "-c",
                'hostname ctl && exec "$@"', "sh", *map(str, argv)]

    def ctl(self, argv, check=True, timeout=60, env=None, **kw):
        p = subprocess.run(self.ctl_argv(argv), env=self.env(env), capture_output=True,
                           text=True, timeout=timeout, cwd=self.dir, **kw)
        if check and p.returncode:
            raise SlurmError(f"{argv}: exit {p.returncode}: {p.stderr.strip()}")
        return p

    def start(self, argv, env=None):
        """Popen of a client command (own session; stdout line-buffered text,
        stderr merged); killed by :meth:`close`."""
        p = subprocess.Popen(self.ctl_argv(argv), env=self.env(dict(env or {},
                             PYTHONUNBUFFERED="1")), stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True, bufsize=1, cwd=self.dir,
                             start_new_session=True)
        self._clients.append(p)
        return p

    def run(self, argv, timeout=120, env=None):
        """Run a client command to completion; on timeout its process group is
        killed and SlurmError raised (never a hang)."""
        p = self.start(argv, env)
        try:
            out, _ = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            _killpg(p)
            out, _ = p.communicate(timeout=10)
            raise SlurmError(f"{argv} did not end within {timeout}s:\n{out[-4000:]}\n"
                             f"{self.logs()}")
        return subprocess.CompletedProcess(argv, p.returncode, out, "")

    def lose_node(self, i: int) -> None:
        """Host ``i`` "crashes": its slurmd, slurmstepds and ranks are SIGKILLed."""
        d = self._daemons.pop(f"slurmd-h{i}", None)
        netns._kill_netns_pids(self.net.hosts[i])
        if d is not None:
            d.wait(timeout=10)

    # -- teardown --------------------------------------------------------------
    def close(self) -> None:
        for p in self._clients:
            _killpg(p)
            try:
                p.communicate(timeout=5)
            except (subprocess.TimeoutExpired, ValueError, OSError):
                pass
        self._clients.clear()
        if self.net is not None:
            for ns in self.net.hosts + [self.net.switch]:
                netns._kill_netns_pids(ns)      # slurmd, slurmstepd (daemonized), ranks
        for p in self._daemons.values():
            _killpg(p)
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        self._daemons.clear()
        if self.net is not None:
            self.net.close()
        if os.environ.get("KEEP_SLURM_CLUSTER"):
            sys.stderr.write(f"slurm test cluster files kept in {self.dir}\n")
        else:
            shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _killpg(p) -> None:
    if p.poll() is None:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


if __name__ == "__main__":          # python -m tests.hosts.slurm: bring one up, sinfo, down
    t0 = time.monotonic()
    with SlurmCluster(int(sys.argv[1]) if len(sys.argv) > 1 else 4) as c:
        print(f"up in {time.monotonic() - t0:.1f}s")
        print(c.ctl(["sinfo", "-N"]).stdout)
        print(c.ctl(["srun", "--mpi=list"], check=False).stdout)
        print(c.run(["srun", "-N", "4", "-n", "8", "hostname"], timeout=60).stdout)
