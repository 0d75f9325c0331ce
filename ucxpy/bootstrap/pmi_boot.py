"""Bootstrap over the PMI wire protocol, for jobs started by MPICH's
``mpiexec`` (Hydra) or Slurm's ``srun --mpi=pmi2`` - no MPI library needed.

The launcher gives each rank a connected socket (``PMI_FD``) to its process
manager and ``PMI_RANK``/``PMI_SIZE``.  Two wire formats exist and both are
spoken here (``UCXPY_PMI_VERSION=1|2``, default 1 under Hydra and 2 when
``PMI_JOBID`` is set, as Slurm does):

* PMI-1: newline-terminated ``cmd=<name> key=value ...`` lines;
  ``put``/``barrier_in``/``get`` on the job's key-value space.
* PMI-2: each message is a 6-character decimal length followed by
  ``cmd=<name>;key=value;...``; ``kvs-put``/``kvs-fence``/``kvs-get``.

Values travel hex-encoded in chunks below the server's value limit, so
worker addresses of any size fit.  An allgather is: every rank puts its
value under a key naming the collective and itself, a fence (PMI barrier),
then every rank gets every key.  Reads wait on the socket with the caller's
timeout, so a rank that never arrives yields
:class:`~ucxpy.bootstrap.BootstrapTimeout` instead of a hang.  Failure
detection is the launcher's: Hydra and Slurm kill the job when a rank dies.

MPI spawn (PMI-1 only, which Hydra implements): the spawning rank sends one
``mcmd=spawn`` segment per application with the parents' port, the job key
and each app's environment as *pre-put* keys of the new job's key-value
space; the children (``PMI_SPAWNED=1``) read them at start-up.
"""
from __future__ import annotations

import os
import select
import socket
import time

from .. import config
from ..errors import BootstrapError
from .base import Bootstrap, BootstrapTimeout, resolve_timeout

__all__ = ["PmiBootstrap", "pmi_available"]


def pmi_available(env) -> bool:
    """Whether this process was given a PMI connection."""
    return bool(env.get("PMI_FD")) and "PMI_RANK" in env and "PMI_SIZE" in env


def _parse1(line: str) -> dict:
    out = {}
    for item in line.split():
        k, _, v = item.partition("=")
        out[k] = v
    return out


def _parse2(msg: str) -> dict:
    out = {}
    for item in msg.split(";"):
        if item:
            k, _, v = item.partition("=")
            out[k] = v.replace(";;", ";")
    return out


class PmiBootstrap(Bootstrap):
    """Bootstrap speaking PMI-1 or PMI-2 to the launcher's process manager."""

    kind = "pmi"

    def __init__(self, env=None, version=None, timeout=None):
        env = os.environ if env is None else env
        if not pmi_available(env):
            raise BootstrapError("PMI bootstrap needs PMI_FD, PMI_RANK and PMI_SIZE")
        self.fd = int(env["PMI_FD"])
        self.rank, self.size = int(env["PMI_RANK"]), int(env["PMI_SIZE"])
        self.hostname = socket.gethostname()
        if version is None:
            try:
                version = config.setting("UCXPY_PMI_VERSION", env)
            except config.ConfigError as e:
                raise BootstrapError(str(e)) from None
            if version is None:
                version = 2 if env.get("PMI_JOBID") else 1
        if version not in (1, 2):
            raise BootstrapError(f"UCXPY_PMI_VERSION={version}: expected 1 or 2")
        self.version = version
        self._buf = b""
        self._seq = 0
        self._closed = False
        self._timeout = resolve_timeout(timeout)
        self._handshake(env)
        self.spawned = bool(env.get("PMI_SPAWNED"))
        self.local_rank, self.local_size = self._placement(env)
        if self.spawned:
            self._apply_spawn_env()

    # -- wire ----------------------------------------------------------------
    def _send(self, text: str) -> None:
        data = text.encode()
        if self.version == 2 and not text.startswith("cmd=init "):
            data = b"%-6d" % len(data) + data
        view = memoryview(data)
        while view:
            n = os.write(self.fd, view)
            view = view[n:]

    def _fill(self, deadline, what):
        while True:
            wait = None if deadline is None else max(0.0, deadline - time.monotonic())
            r, _, _ = select.select([self.fd], [], [], wait)
            if r:
                chunk = os.read(self.fd, 65536)
                if not chunk:
                    raise BootstrapError(f"rank {self.rank}: PMI server closed the "
                                         f"connection during {what}")
                self._buf += chunk
                return
            if deadline is not None and time.monotonic() >= deadline:
                raise BootstrapTimeout(f"rank {self.rank}: PMI {what} timed out "
                                       "(some rank did not join; PMI cannot say which)")

    def _recv(self, what, timeout=None, v1=None) -> dict:
        """Next reply; ``v1`` forces the line format (the PMI-2 init reply)."""
        timeout = self._timeout if timeout is None else timeout
        deadline = None if timeout is None else time.monotonic() + timeout
        if self.version == 1 or v1:
            while b"\n" not in self._buf:
                self._fill(deadline, what)
            line, _, self._buf = self._buf.partition(b"\n")
            return _parse1(line.decode())
        while len(self._buf) < 6:
            self._fill(deadline, what)
        n = int(self._buf[:6])
        while len(self._buf) < 6 + n:
            self._fill(deadline, what)
        msg, self._buf = self._buf[6:6 + n], self._buf[6 + n:]
        return _parse2(msg.decode())

    def _call(self, cmd, expect, timeout=None, **kv) -> dict:
        if self.version == 1:
            self._send(" ".join([f"cmd={cmd}"] + [f"{k}={v}" for k, v in kv.items()]) + "\n")
        else:
            self._send(";".join([f"cmd={cmd}"] + [f"{k}={v}" for k, v in kv.items()]) + ";")
        reply = self._recv(cmd, timeout)
        if reply.get("cmd") != expect:
            raise BootstrapError(f"PMI {cmd}: unexpected reply {reply}")
        rc = reply.get("rc", "0")
        if rc not in ("0", "") and expect not in ("get_result", "kvs-get-response"):
            raise BootstrapError(f"PMI {cmd} failed: {reply}")
        return reply

    def _handshake(self, env) -> None:
        if self.version == 1:
            self._call("init", "response_to_init", pmi_version=1, pmi_subversion=1)
            maxes = self._call("get_maxes", "maxes")
            self.vallen = int(maxes.get("vallen_max", 1024))
            self.kvs = self._call("get_my_kvsname", "my_kvsname")["kvsname"]
        else:
            self._send("cmd=init pmi_version=2 pmi_subversion=0\n")
            reply = self._recv("init", v1=True)
            if reply.get("rc", "0") != "0":
                raise BootstrapError(f"PMI-2 init refused: {reply}")
            # Slurm's pmi2 server refuses a fullinit without pmijobid or
            # threaded (rc=3); Hydra sets no PMI_JOBID and cannot parse an
            # empty value
            ids = {"pmijobid": env["PMI_JOBID"]} if env.get("PMI_JOBID") else {}
            full = self._call("fullinit", "fullinit-response", **ids, pmirank=self.rank,
                              threaded="FALSE")
            self.size = int(full.get("size", self.size))
            self.rank = int(full.get("rank", self.rank))
            self.vallen = 1024
            self.kvs = full.get("jobid") or env.get("PMI_JOBID") or \
                self._call("job-getid", "job-getid-response").get("jobid", "")
        # hex doubles the bytes; keep room for the value's own framing
        self.chunk = max(16, (self.vallen - 32) // 2)

    def _placement(self, env):
        if "MPI_LOCALRANKID" in env and "MPI_LOCALNRANKS" in env:
            return int(env["MPI_LOCALRANKID"]), int(env["MPI_LOCALNRANKS"])
        if "SLURM_LOCALID" in env and "SLURM_STEP_TASKS_PER_NODE" in env:
            try:
                return int(env["SLURM_LOCALID"]), int(env["SLURM_STEP_TASKS_PER_NODE"]
                                                     .split("(")[0].split(",")[0])
            except ValueError:
                pass
        return self._placement_from_hostnames()

    # -- key-value space ---------------------------------------------------------
    def _put1(self, key, value: str) -> None:
        if self.version == 1:
            self._call("put", "put_result", kvsname=self.kvs, key=key, value=value)
        else:
            self._call("kvs-put", "kvs-put-response", key=key, value=value)

    def _get1(self, key, timeout=None):
        if self.version == 1:
            r = self._call("get", "get_result", timeout, kvsname=self.kvs, key=key)
            return r.get("value") if r.get("rc", "0") == "0" else None
        r = self._call("kvs-get", "kvs-get-response", timeout, jobid=self.kvs, key=key)
        return r.get("value") if r.get("found", "TRUE").upper() == "TRUE" and \
            r.get("rc", "0") == "0" else None

    def put(self, key: str, value: bytes) -> None:
        """Publish ``value`` (any bytes) under ``key``; visible after the next fence."""
        for k, v in self._chunks(key, value):
            self._put1(k, v)

    def get(self, key: str, timeout=None) -> bytes:
        """The value put under ``key`` (waits, re-asking, until ``timeout``)."""
        timeout = resolve_timeout(timeout)
        deadline = None if timeout is None else time.monotonic() + timeout
        nap = 0.001
        while True:
            n = self._get1(f"{key}#n")
            if n is not None:
                parts = [self._get1(f"{key}#{i}") for i in range(int(n))]
                return bytes.fromhex("".join("" if p in (None, "-") else p for p in parts))
            if deadline is not None and time.monotonic() >= deadline:
                raise BootstrapTimeout(f"rank {self.rank}: PMI key {key!r} never appeared")
            time.sleep(nap)
            nap = min(nap * 2, 0.05)

    def lookup(self, key: str):
        """The value put under ``key`` (visible after a fence), or None."""
        n = self._get1(f"{key}#n")
        if n is None:
            return None
        parts = [self._get1(f"{key}#{i}") for i in range(int(n))]
        return bytes.fromhex("".join("" if p in (None, "-") else p for p in parts))

    def _fence(self, timeout) -> None:
        if self.version == 1:
            self._call("barrier_in", "barrier_out", timeout)
        else:
            self._call("kvs-fence", "kvs-fence-response", timeout)

    # -- dynamic processes -------------------------------------------------------
    def _chunks(self, key, value: bytes) -> list:
        """The ``(key, value)`` pairs that store ``value`` so that :meth:`get`
        reads it back: a count, then hex chunks below the server's value limit
        (what :meth:`put` writes, and :meth:`spawn` pre-puts for children)."""
        hexed = bytes(value).hex()
        parts = [hexed[i:i + 2 * self.chunk] for i in range(0, len(hexed), 2 * self.chunk)] \
            or [""]
        return [(f"{key}#n", str(len(parts)))] + \
            [(f"{key}#{i}", p or "-") for i, p in enumerate(parts)]

    def spawn(self, apps, port=None, **extra) -> tuple:
        """Ask the process manager to start ``apps`` as a new job (PMI-1
        ``mcmd=spawn``, one segment per app, as Hydra's PMI_Spawn_multiple
        takes them).  The children find ``port``, this job's key and their
        app's environment pre-put in their key-value space (see
        :meth:`parent_port`).  Hydra reports success for the whole spawn
        only, so every started process gets error code 0."""
        if self.version != 1:
            raise BootstrapError("spawn needs the PMI-1 wire protocol (Hydra's mpiexec); "
                                 "PMI-2 process managers such as Slurm's do not spawn")
        pre = []
        if port:
            pre += self._chunks("ucxpy-parent-port", str(port).encode())
        key = getattr(self, "_job_key", None)
        if key:
            pre += self._chunks("ucxpy-parent-key", key)
        for appnum, app in enumerate(apps):
            if app.get("env"):
                env = "\0".join(f"{k}={v}" for k, v in app["env"].items())
                pre += self._chunks(f"ucxpy-env-{appnum}", env.encode())
        segments = []
        for i, app in enumerate(apps, 1):
            argv = [str(a) for a in app["argv"]]
            for a in argv + [str(app.get("wdir") or "")]:
                if "\n" in a:
                    raise BootstrapError(f"spawn: PMI cannot pass {a!r} (it holds a newline)")
            lines = ["mcmd=spawn", f"nprocs={int(app['maxprocs'])}", f"execname={argv[0]}",
                     f"totspawns={len(apps)}", f"spawnssofar={i}", f"argcnt={len(argv) - 1}"]
            lines += [f"arg{j}={a}" for j, a in enumerate(argv[1:], 1)]
            lines.append(f"preput_num={len(pre)}")
            for j, (k, v) in enumerate(pre):
                lines += [f"preput_key_{j}={k}", f"preput_val_{j}={v}"]
            info = [("wdir", str(app["wdir"]))] if app.get("wdir") else []
            lines.append(f"info_num={len(info)}")
            for j, (k, v) in enumerate(info):
                lines += [f"info_key_{j}={k}", f"info_val_{j}={v}"]
            segments.append("\n".join(lines + ["endcmd"]) + "\n")
        for seg in segments:           # Hydra answers once, after the last one
            self._send(seg)
        reply = self._recv("spawn")
        if reply.get("cmd") != "spawn_result" or reply.get("rc", "0") != "0":
            raise BootstrapError(f"PMI spawn failed: {reply}")
        self._spawns = getattr(self, "_spawns", 0) + 1
        return self._spawns, [[0] * int(app["maxprocs"]) for app in apps]

    def parent_port(self):
        """A spawned job's parent port (pre-put by the parents' :meth:`spawn`)."""
        if not self.spawned:
            return super().parent_port()
        v = self.lookup("ucxpy-parent-port")
        return v.decode() if v else None

    def universe_size(self):
        """PMI's universe size (Hydra answers -1 unless told: then None, as MPICH)."""
        if self.version != 1:
            return super().universe_size()
        if not hasattr(self, "_universe"):
            n = int(self._call("get_universe_size", "universe_size").get("size", "-1"))
            self._universe = n if n > 0 else None
        return self._universe

    def appnum(self):
        if self.version != 1:
            return super().appnum()
        if not hasattr(self, "_appnum"):
            self._appnum = int(self._call("get_appnum", "appnum").get("appnum", "0"))
        return self._appnum

    def _apply_spawn_env(self) -> None:
        """The environment the parents asked for this app (``info`` "env"):
        Hydra starts children with its own, so it is applied here, before
        anything reads configuration."""
        v = self.lookup(f"ucxpy-env-{self.appnum()}") if self.version == 1 else None
        if v:
            for item in v.decode().split("\0"):
                k, _, val = item.partition("=")
                if k:
                    os.environ[k] = val

    def job_key(self, timeout=None) -> bytes:
        """Rank 0 makes the job key (or takes ``UCXPY_AUTH_KEY``) and
        broadcasts it through the launcher (collective); spawned jobs use
        their parents' key, so that the two can connect."""
        if self.spawned and getattr(self, "_job_key", None) is None:
            key = self.lookup("ucxpy-parent-key")
            if key:
                self._job_key = bytes(key)
        return self._broadcast_job_key(timeout)

    # -- collectives -----------------------------------------------------------
    def allgather(self, data: bytes, timeout=None) -> list:
        timeout = resolve_timeout(timeout)
        seq = self._seq
        self._seq += 1
        self.put(f"ucxpy-ag{seq}-{self.rank}", data)
        self._fence(timeout)
        return [bytes(data) if r == self.rank else self.get(f"ucxpy-ag{seq}-{r}", timeout)
                for r in range(self.size)]

    def barrier(self, timeout=None) -> None:
        self._seq += 1
        self._fence(resolve_timeout(timeout))

    def bcast(self, data, root: int = 0, timeout=None) -> bytes:
        self._check_root(root)
        timeout = resolve_timeout(timeout)
        seq = self._seq
        self._seq += 1
        if self.rank == root:
            if data is None:
                raise BootstrapError("bcast: the root must supply data")
            self.put(f"ucxpy-bc{seq}", data)
        self._fence(timeout)
        return bytes(data) if self.rank == root else self.get(f"ucxpy-bc{seq}", timeout)


    def listen_address(self):
        return self._placement_listen_address()

    def check_failures(self) -> None:
        """No-op: the launcher kills every rank when one fails."""

    def abort(self, message: str = "", errorcode: int = 1):
        """Ask the process manager to kill the job; does not return."""
        def kill(code):
            try:
                if self.version == 1:
                    self._send(f"cmd=abort exitcode={code}\n")
                else:
                    self._send(f"cmd=abort;isworld=TRUE;msg={message or 'abort'};")
            except OSError:
                pass
        self._abort_and_exit(message, errorcode, kill)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            if self.version == 1:
                self._call("finalize", "finalize_ack", 10.0)
            else:
                self._call("finalize", "finalize-response", 10.0)
        except (BootstrapError, OSError):
            pass
