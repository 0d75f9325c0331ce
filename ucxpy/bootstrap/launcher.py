"""``ucxpy-run``: start an SPMD job and serve its bootstrap.

Usage::

    ucxpy-run -n N [--timeout S] [--grace S] [--tag-output] [--universe-size U]
              [--hosts h1,h2:4,...] [--host-agent 'ssh {host}'] [--advertise IP]
              prog.py args...        # run with this Python
    ucxpy-run -n N python prog.py    # or any command

Theory of operation
-------------------
The launcher binds a zmq ROUTER (requests from ranks) and a PUB socket
(failure notices) on random ports, spawns N ranks with ``UCXPY_RUN_ADDR``,
``UCXPY_RANK``, ``UCXPY_SIZE``, ``UCXPY_LOCAL_RANK``, ``UCXPY_LOCAL_SIZE`` and
``UCXPY_JOB_ID`` and ``UCXPY_AUTH_KEY`` in their environment, then runs one loop that blocks in
``zmq.Poller.poll`` (woken early by SIGCHLD/SIGINT/SIGTERM through a wakeup
pipe) and, each time it wakes, serves requests (see
:mod:`ucxpy.bootstrap.zmq_boot` for the protocol), reaps children and checks
deadlines.

Job states::

    state      event                              next state / action
    RUNNING    every rank exited 0                DONE, exit 0
    RUNNING    rank exits != 0                    FAILING: publish FAIL, fail its
                                                  collectives, grace timer starts
    RUNNING    rank calls abort()                 FAILING: publish ABORT, kill the other
                                                  ranks now, grace timer for the caller
    RUNNING    SIGINT/SIGTERM                     FAILING: forward signal, grace timer
    RUNNING    --timeout expires                  KILLING
    FAILING    every rank exited                  DONE, exit != 0
    FAILING    grace timer expires                KILLING
    any        second SIGINT/SIGTERM              KILLING (SIGKILL at once)
    KILLING    SIGTERM to each rank's process group, SIGKILL 1 s later, then DONE

Security: the job key (``UCXPY_AUTH_KEY``, 256 random bits from
:mod:`secrets`, or the caller's own ``UCXPY_AUTH_KEY`` / ``UCXPY_AUTH_KEY_FILE``
so that several jobs can talk) reaches the ranks only through their
environment: never on a command line, in a log line or in ``-v`` output.
With a host agent it rides in the agent's environment (``ip netns exec``,
``sudo -E``, ``srun`` pass it on); ``ssh``/``rsh`` agents get it on the
rank's stdin instead (their remote shell reads one line before starting
the program).  The service binds loopback for a single-host job, otherwise
the one address it advertises, and answers only requests signed with the
key (see :mod:`ucxpy.bootstrap.rendezvous`).

A rank that exits 0 before joining a collective fails that collective for the
others too (after 1 s, in case its last message is still in flight), so an
early ``return`` shows up as an error instead of a hang.

MPI spawn: a rank's SPAWN request (see :mod:`ucxpy.bootstrap.zmq_boot`)
starts the requested processes on this host as a new group (their own
``UCXPY_RANK``/``UCXPY_SIZE``, ``UCXPY_GROUP``, ``UCXPY_APPNUM`` and the
parents' ``UCXPY_PARENT_PORT``); they are part of the job from then on: the
job ends when every process of every group has exited, and a failing
child fails the job like any rank.
"""
from __future__ import annotations

import argparse
import ctypes
import math
import os
import queue
import resource
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

import zmq

try:    # keep `python ucxpy/bootstrap/launcher.py` usable, not only `-m`
    from .. import auth, config
    from ..errors import ConfigError
    from ..netaddr import outward_ipv4
    from .rendezvous import RendezvousService, describe_exit
except ImportError:     # pragma: no cover
    import ucxpy.bootstrap     # noqa: F401  (declares the launch variables)
    from ucxpy import auth, config
    from ucxpy.errors import ConfigError
    from ucxpy.netaddr import outward_ipv4
    from ucxpy.bootstrap.rendezvous import RendezvousService, describe_exit

PROG = "ucxpy-run"
#: between SIGTERM and SIGKILL when killing ranks
KILL_ESCALATE = 1.0
#: how often failure notices are re-published (for late subscribers)
REPUBLISH_INTERVAL = 0.5
#: longest the loop sleeps when nothing is due (SIGCHLD wakes it earlier)
IDLE_WAKEUP = 1.0


def dropin_pythonpath(name: str) -> list:
    """``PYTHONPATH`` entries for ``--as-<name>``, from the installed package
    that provides the drop-in (``ucxpy.dropins`` entry point: a function of
    the name returning the entries; mpi_shim provides mpi4py and shmem4py):
    the launcher does not import the layers built on ucxpy."""
    from importlib import metadata      # deferred: importlib.metadata only for --as-<name>
    for ep in metadata.entry_points(group="ucxpy.dropins"):
        if ep.name == name:
            return list(ep.load()(name))
    raise SystemExit(f"ucxpy-run: --as-{name}: no installed package provides a {name} "
                     f"drop-in (entry point group ucxpy.dropins)")


def _say(msg: str) -> None:
    sys.stderr.write(f"{PROG}: {msg}\n")
    sys.stderr.flush()


def exit_status(code: int) -> int:
    """A shell-style status for a child's return code."""
    if code < 0:
        return 128 + (-code)
    return min(code, 255) or 1


# ---------------------------------------------------------------------------
# ranks
# ---------------------------------------------------------------------------
class RankProcess:
    """One spawned rank (``group`` 0: the job's own; others: MPI spawns)."""

    def __init__(self, rank, host, local_rank, local_size, argv, env, group=0, cwd=None):
        self.rank, self.host = rank, host
        self.group, self.cwd = group, cwd
        self.label = str(rank) if group == 0 else f"{group}:{rank}"
        self.local_rank, self.local_size = local_rank, local_size
        self.argv, self.env = argv, env
        self.key_on_stdin = None        # ssh agents: the job key, written to stdin
        self.proc = None
        self.returncode = None
        self.killed_by_us = False
        self.readers: list = []

    def signal(self, sig) -> None:
        if self.proc is None or self.returncode is not None:
            return
        try:
            os.killpg(self.proc.pid, sig)   # the rank and anything it started
        except (ProcessLookupError, PermissionError):
            try:
                self.proc.send_signal(sig)
            except ProcessLookupError:
                pass


try:
    _prctl = ctypes.CDLL(None, use_errno=True).prctl
except (OSError, AttributeError):     # not Linux
    _prctl = None


def _set_pdeathsig():
    """Child side of fork: die with the launcher (Linux only).  All ranks are
    spawned before any output thread starts, so this runs single-threaded."""
    if _prctl is not None:
        _prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG


#: util-linux's setpriv sets the parent-death signal and execs the rank: the
#: launcher then needs no code in the forked child (``preexec_fn``), so
#: ``subprocess`` starts ranks with vfork, and from several threads at once
SETPRIV = shutil.which("setpriv") if _prctl is not None else None
#: threads starting ranks at once.  Every start waits until the child has
#: exec'd; with more ranks than cores the ranks already running delay each
#: exec by a time slice, so one at a time 64 ranks took 2-3 s here to start
#: (8 threads: 0.5 s)
SPAWN_THREADS = 8


class Spawner:
    """Runs ``Popen`` calls on a few threads that live as long as the job:
    Linux sends a child's parent-death signal when the *thread* that started
    it ends, not the process."""

    def __init__(self, nthreads: int):
        self._work: queue.SimpleQueue = queue.SimpleQueue()
        self._threads = [threading.Thread(target=self._loop, daemon=True,
                                          name=f"{PROG}-spawn-{i}") for i in range(nthreads)]
        for t in self._threads:
            t.start()

    def _loop(self) -> None:
        while True:
            item = self._work.get()
            if item is None:
                return
            fn, arg, i, results, done = item
            try:
                results[i] = fn(arg)
            except BaseException as e:     # noqa: BLE001 - handed to the caller
                results[i] = e
            done.release()

    def map(self, fn, args) -> list:
        """``[fn(a) for a in args]`` run on the threads (an exception a call
        raised is returned in its place)."""
        args = list(args)
        results: dict = {}
        done = threading.Semaphore(0)
        for i, a in enumerate(args):
            self._work.put((fn, a, i, results, done))
        for _ in args:
            done.acquire()
        return [results[i] for i in range(len(args))]

    def close(self) -> None:
        """End the threads (after the ranks they started have exited)."""
        for _ in self._threads:
            self._work.put(None)


def _pump_output(stream, tag: bytes, sink, lock):
    """Copy ``stream`` to ``sink`` line by line, each line prefixed by ``tag``."""
    try:
        for line in iter(stream.readline, b""):
            with lock:
                sink.write(tag + line if line.endswith(b"\n") else tag + line + b"\n")
                sink.flush()
    except (OSError, ValueError):
        pass
    finally:
        stream.close()


def parse_hosts(spec: str):
    """'a,b:4' -> [('a', None), ('b', 4)]."""
    out = []
    for item in spec.replace(" ", ",").split(","):
        if not item:
            continue
        name, _, slots = item.partition(":")
        out.append((name, int(slots) if slots else None))
    return out


def place_ranks(n: int, hosts):
    """Map ranks to hosts: explicit slots are filled in order, cycling if
    needed; without slots ranks are spread in equal blocks.
    Returns [(host, local_rank, local_size)] indexed by rank."""
    if not hosts:
        hosts = [(socket.gethostname(), None)]
    if any(s is not None for _, s in hosts):
        slots = [h for h, s in hosts for _ in range(s if s is not None else 1)]
    else:
        per = math.ceil(n / len(hosts))
        slots = [h for h, _ in hosts for _ in range(per)]
    if not slots:
        raise ValueError("--hosts gives no slots")
    assigned = [slots[i % len(slots)] for i in range(n)]
    counts: dict = {}
    placement = []
    for host in assigned:
        placement.append([host, counts.get(host, 0)])
        counts[host] = counts.get(host, 0) + 1
    return [(h, lr, counts[h]) for h, lr in placement]


def _is_local(host: str) -> bool:
    return host in ("localhost", "127.0.0.1", "::1", socket.gethostname(), socket.getfqdn())


def _outward_ip(towards=None) -> str:
    """The local IP the kernel would use to reach ``towards`` (or, failing
    that, the default route)."""
    return outward_ipv4(towards)


def _is_ssh(agent_argv) -> bool:
    return bool(agent_argv) and os.path.basename(agent_argv[0]) in ("ssh", "rsh")


def rank_command(command, rank, host, agent, env_vars):
    """The argv that starts ``rank``: optional host agent + program."""
    prog, args = command[0], command[1:]
    argv = ([sys.executable, prog] if prog.endswith(".py") else [prog]) + list(args)
    if not agent:
        return argv
    fields = {"{rank}": str(rank), "{host}": host, "{size}": str(config.setting("UCXPY_SIZE", env_vars))}
    agent_argv = []
    for part in shlex.split(agent):
        for key, value in fields.items():   # plain replace: other braces stay as given
            part = part.replace(key, value)
        agent_argv.append(part)
    # The agent may not carry our environment (ssh does not): pass it
    # explicitly -- all but the job key, which never goes on a command line
    # (the agent's environment carries it, see Job._spawn).
    tail = ["env", *(f"{k}={v}" for k, v in env_vars.items() if k != auth.ENV_KEY), *argv]
    if _is_ssh(agent_argv):
        # ssh hands its arguments to a remote shell: quote them; the shell
        # reads the key from the first line of stdin
        tail = [shlex.quote(t) for t in ["cd", os.getcwd()]] + \
               ["&&", "IFS=", "read", "-r", auth.ENV_KEY, "&&", "export", auth.ENV_KEY, "&&"] + \
               [shlex.quote(t) for t in tail]
    return agent_argv + tail


# ---------------------------------------------------------------------------
# the job
# ---------------------------------------------------------------------------
class Job:
    def __init__(self, opts):
        self.opts = opts
        self.n = opts.np
        self.job_id = os.urandom(6).hex()       # a label, not a secret
        try:
            key = config.auth_key_from_env()
        except ConfigError as e:
            raise SystemExit(f"{PROG}: {e}") from None
        self.key = key or auth.generate_key().encode()
        self.ranks: list = []
        self.first_failure = None       # (rank, code) of the failure that ends the job
        self.tolerated: list = []       # --fault-tolerant: (rank, code) of the failed ranks
        self.status = 0
        self.grace_deadline = None      # when the survivors of a failure get killed
        self.killing = False            # the whole job is being killed
        self.terminating: dict = {}     # rank -> when SIGTERM escalates to SIGKILL
        self.abort_handled = False
        self.signals: list = []
        self.out_lock = threading.Lock()
        self.spawner = None             # the threads that started the ranks
        self.last_republish = 0.0

    # -- setup -------------------------------------------------------------
    def _advertise(self, hosts):
        """(address ranks dial, address the service binds): the same one --
        loopback when nothing outside this host needs to reach us."""
        opts = self.opts
        if opts.advertise:
            adv = opts.advertise
            try:
                return adv, socket.gethostbyname(adv)
            except OSError:
                return adv, adv
        remote = [h for h, _ in hosts if not _is_local(h)]
        if not remote and not opts.host_agent:
            return "127.0.0.1", "127.0.0.1"     # nothing outside needs to reach us
        adv = _outward_ip(remote[0] if remote else None)
        return adv, adv

    def start(self):
        opts = self.opts
        hosts = parse_hosts(opts.hosts) if opts.hosts else []
        if hosts and not opts.host_agent:
            remote = sorted({h for h, _ in hosts if not _is_local(h)})
            if remote:
                raise SystemExit(f"{PROG}: host(s) {', '.join(remote)} are not this machine; "
                                 "give --host-agent (e.g. --host-agent 'ssh {host}')")
        placement = place_ranks(self.n, hosts)
        self.universe = opts.universe_size or max(self.n, os.cpu_count() or 1)
        adv, bind = self._advertise(hosts)
        try:
            self.service = RendezvousService(self.n, self.job_id, bind, key=self.key)
        except zmq.ZMQError as e:
            # an --advertise address that is not ours (NAT, a proxy): listen on
            # every interface; the service still answers members only
            _say(f"cannot bind {bind} ({e}); listening on all interfaces")
            self.service = RendezvousService(self.n, self.job_id, "*", key=self.key)
        host_part = f"[{adv}]" if ":" in adv else adv
        self.addr = f"tcp://{host_part}:{self.service.port}"

        base_env = self._secret_env(os.environ)
        dropins = [n for n, on in (("mpi4py", opts.as_mpi4py), ("shmem4py", opts.as_shmem4py))
                   if on]
        if dropins:
            parts = list(dict.fromkeys(p for n in dropins for p in dropin_pythonpath(n)))
            base_env["PYTHONPATH"] = os.pathsep.join(
                parts + ([base_env["PYTHONPATH"]] if base_env.get("PYTHONPATH") else []))
            os.environ["PYTHONPATH"] = base_env["PYTHONPATH"]    # spawned processes too
        if opts.tag_output:
            base_env.setdefault("PYTHONUNBUFFERED", "1")    # lines arrive as written
        if opts.stacks_on_timeout:
            base_env.setdefault("PYTHONFAULTHANDLER", "1")  # stacks on SIGABRT
        for rank, (host, lrank, lsize) in enumerate(placement):
            vars_ = {
                "UCXPY_RUN_ADDR": self.addr, "UCXPY_RANK": str(rank),
                "UCXPY_SIZE": str(self.n), "UCXPY_LOCAL_RANK": str(lrank),
                "UCXPY_LOCAL_SIZE": str(lsize), "UCXPY_JOB_ID": self.job_id,
                "UCXPY_UNIVERSE_SIZE": str(self.universe),
            }
            argv = rank_command(opts.command, rank, host, opts.host_agent, vars_)
            env = dict(base_env, **vars_)
            r = RankProcess(rank, host, lrank, lsize, argv, env)
            if opts.host_agent and _is_ssh(shlex.split(opts.host_agent)):
                r.key_on_stdin = self.key
            self.ranks.append(r)
        if opts.verbose:
            _say(f"job {self.job_id}: {self.n} rank(s), service at {self.addr}")
        if SETPRIV is not None and len(self.ranks) > 1:
            self.spawner = Spawner(min(SPAWN_THREADS, len(self.ranks)))
            errors = self.spawner.map(self._popen, self.ranks)
        else:
            errors = [self._popen(r) for r in self.ranks]
        for r, e in zip(self.ranks, errors):
            if not isinstance(e, (OSError, type(None))):
                raise e
            self._spawn(r, started=True, error=e)
        for r in self.ranks:
            for t in r.readers:
                t.start()

    def _secret_env(self, env) -> dict:
        """``env`` with the job key (and without a key file: ranks get the key)."""
        env = dict(env)
        env.pop(auth.ENV_KEY_FILE, None)
        env[auth.ENV_KEY] = self.key.decode("utf-8", "surrogateescape")
        return env

    def _popen(self, r: RankProcess):
        """Start ``r``'s process (any thread; touches nothing shared): returns
        None, or the OSError that kept it from starting."""
        tag = self.opts.tag_output
        if r.key_on_stdin is not None:
            stdin = subprocess.PIPE
        else:
            stdin = None if r.rank == 0 and r.group == 0 else subprocess.DEVNULL
        argv, pre = r.argv, _set_pdeathsig
        if SETPRIV is not None and shutil.which(argv[0]) is not None:
            # (a program that is not there keeps the plain path and its error)
            argv, pre = [SETPRIV, "--pdeathsig", "KILL", "--", *argv], None
        try:
            r.proc = subprocess.Popen(
                argv, env=r.env, cwd=r.cwd, stdin=stdin,
                stdout=subprocess.PIPE if tag else None,
                stderr=subprocess.PIPE if tag else None,
                start_new_session=True, preexec_fn=pre)
        except OSError as e:
            return e
        return None

    def _spawn(self, r: RankProcess, started=False, error=None):
        """Start ``r`` (``started``: :meth:`_popen` did, with ``error``);
        False if it could not start."""
        tag = self.opts.tag_output
        e = error if started else self._popen(r)
        if e is not None:
            _say(f"cannot start rank {r.label} ({shlex.join(r.argv)}): {e}")
            r.returncode = 127
            self._on_exit(r)
            return False
        if r.key_on_stdin is not None:
            try:
                r.proc.stdin.write(r.key_on_stdin + b"\n")
                r.proc.stdin.close()
            except OSError:
                pass        # the agent died at once: its exit is reported
        if self.opts.verbose:
            _say(f"rank {r.label} pid {r.proc.pid}: {shlex.join(r.argv)}")
        if tag:
            prefix = f"[{r.label}] ".encode()
            for stream, sink in ((r.proc.stdout, sys.stdout.buffer),
                                 (r.proc.stderr, sys.stderr.buffer)):
                t = threading.Thread(target=_pump_output, args=(stream, prefix, sink,
                                                                self.out_lock), daemon=True)
                r.readers.append(t)     # started once every rank is spawned
        return True

    def _serve_spawns(self):
        """Start the processes of the SPAWN requests the service queued: one
        new group per request, wired to the parents through the port the
        request names (see mpi_shim.dynproc)."""
        while self.service.spawn_requests:
            req = self.service.spawn_requests.pop(0)
            _, _, gid, apps, hdr = req
            if self.killing or self.grace_deadline is not None:
                self.service.spawn_done(req, None, "the job is shutting down")
                continue
            total = sum(int(a["maxprocs"]) for a in apps)
            base_env = dict(os.environ)
            base_env.pop(auth.ENV_KEY_FILE, None)
            new, errcodes, rank = [], [], 0
            for appnum, app in enumerate(apps):
                codes = []
                for _ in range(int(app["maxprocs"])):
                    vars_ = {
                        "UCXPY_RUN_ADDR": self.addr, "UCXPY_RANK": str(rank),
                        "UCXPY_SIZE": str(total), "UCXPY_LOCAL_RANK": str(rank),
                        "UCXPY_LOCAL_SIZE": str(total), "UCXPY_JOB_ID": self.job_id,
                        "UCXPY_GROUP": str(gid), "UCXPY_APPNUM": str(appnum),
                        "UCXPY_UNIVERSE_SIZE": str(self.universe),
                    }
                    if hdr.get("port"):
                        vars_["UCXPY_PARENT_PORT"] = str(hdr["port"])
                    env = dict(base_env, **{str(k): str(v) for k, v in
                                            (app.get("env") or {}).items()}, **vars_)
                    env[auth.ENV_KEY] = self.key.decode("utf-8", "surrogateescape")
                    r = RankProcess(rank, "localhost", rank, total, [str(a) for a in app["argv"]],
                                    env, group=gid, cwd=app.get("wdir") or None)
                    self.ranks.append(r)
                    new.append(r)
                    codes.append(0 if self._spawn(r) else 42)
                    rank += 1
                errcodes.append(codes)
            for r in new:
                for t in r.readers:
                    t.start()
            if self.opts.verbose:
                _say(f"spawned group {gid}: {total} process(es)")
            self.service.spawn_done(req, errcodes)

    # -- events ------------------------------------------------------------
    def _on_exit(self, r: RankProcess):
        code = r.returncode
        fatal = code != 0
        message = f"rank {r.label} exited with {describe_exit(code)}"
        if fatal and not r.killed_by_us and not self.killing:
            _say(message)
        elif self.opts.verbose:
            _say(message)
        self.service.rank_gone(r.rank, code, message, fatal, group=r.group)
        if fatal and self.opts.fault_tolerant and not self.killing:
            # ULFM: the survivors are told (the notice above) and carry on
            self.tolerated.append((r.label, code))
            return
        if fatal and self.first_failure is None and not r.killed_by_us:
            self.first_failure = (r.label, code)
            self.status = exit_status(code)
            if self.grace_deadline is None and not self.killing:
                self.grace_deadline = time.monotonic() + self.opts.grace

    def _reap(self):
        for r in self.ranks:
            if r.returncode is None and r.proc is not None:
                code = r.proc.poll()
                if code is not None:
                    r.returncode = code
                    self._on_exit(r)

    def running(self):
        return [r for r in self.ranks if r.returncode is None]

    def _terminate(self, ranks, reason: str, sig=signal.SIGTERM):
        """Send ``sig`` to ``ranks`` (their process groups); SIGKILL follows
        after :data:`KILL_ESCALATE` seconds for any still alive.  SIGTERM,
        or SIGABRT for --stacks-on-timeout: faulthandler, which the ranks'
        PYTHONFAULTHANDLER turned on, prints each thread's stack first."""
        alive = [r for r in ranks if r.returncode is None and r.label not in self.terminating]
        if not alive:
            return
        labels = ", ".join(r.label for r in alive)
        _say(f"{reason}; the stacks of rank(s) {labels} follow" if sig == signal.SIGABRT
             else f"{reason}; killing rank(s) {labels}")
        deadline = time.monotonic() + KILL_ESCALATE
        for r in alive:
            r.killed_by_us = True
            if sig == signal.SIGABRT:
                try:            # our abort, not a crash: no core file
                    resource.prlimit(r.proc.pid, resource.RLIMIT_CORE, (0, 0))
                except (OSError, ValueError, AttributeError):
                    pass
            r.signal(sig)
            self.terminating[r.label] = deadline

    def _kill_job(self, reason: str, sig=signal.SIGTERM):
        self.killing = True
        self._terminate(self.running(), reason, sig)

    def _handle_signals(self):
        while self.signals:
            sig = self.signals.pop(0)
            name = signal.Signals(sig).name
            if self.status == 0:
                self.status = 128 + sig
            if self.grace_deadline is None and not self.killing:
                _say(f"got {name}, forwarding it to the ranks")
                for r in self.running():
                    r.killed_by_us = True
                    r.signal(sig)
                self.grace_deadline = time.monotonic() + self.opts.grace
            else:
                _say(f"got {name} again, killing the ranks")
                self.killing = True
                for r in self.running():
                    r.killed_by_us = True
                    r.signal(signal.SIGKILL)
                    self.terminating[r.label] = math.inf

    def _handle_abort(self):
        """A rank called abort(): kill the others now; the caller gets the
        grace period to exit by itself (and print its traceback)."""
        req = self.service.abort_request
        if req is None or self.abort_handled:
            return
        self.abort_handled = True
        rank, message, errorcode = req
        _say(f"rank {rank} called abort({errorcode}): {message}")
        if self.first_failure is None:
            self.first_failure = (rank, errorcode)
            self.status = exit_status(errorcode)
        self.service.publish(b"ABORT", {"rank": rank, "code": errorcode,
                                        "message": f"rank {rank} aborted: {message}"})
        self._terminate([r for r in self.ranks if not (r.rank == rank and r.group == 0)],
                        f"rank {rank} aborted")
        if self.grace_deadline is None:
            self.grace_deadline = time.monotonic() + self.opts.grace

    def _check_deadlines(self, now):
        if self.opts.timeout and now >= self.started + self.opts.timeout \
                and not self.killing and self.running():
            if self.status == 0:
                self.status = 124
            self._kill_job(f"job timed out after {self.opts.timeout:g} s",
                           signal.SIGABRT if self.opts.stacks_on_timeout else signal.SIGTERM)
        if self.grace_deadline is not None and now >= self.grace_deadline \
                and not self.killing and self.running():
            self._kill_job(f"grace period of {self.opts.grace:g} s is over")
        for r in self.running():
            if now >= self.terminating.get(r.label, math.inf):
                r.signal(signal.SIGKILL)
                self.terminating[r.label] = math.inf
        if self.service.notices and now - self.last_republish >= REPUBLISH_INTERVAL:
            self.last_republish = now
            self.service.republish()

    def _next_wakeup(self, now) -> float:
        due = [now + IDLE_WAKEUP]
        if self.opts.timeout:
            due.append(self.started + self.opts.timeout)
        if self.grace_deadline is not None and not self.killing:
            due.append(self.grace_deadline)
        due.extend(self.terminating[r.label] for r in self.running()
                   if r.label in self.terminating)
        if self.service.notices:
            due.append(self.last_republish + REPUBLISH_INTERVAL)
        settle = self.service.next_settle_deadline()
        if settle is not None:
            due.append(settle)
        return max(0.0, min(due) - now)

    # -- main loop ---------------------------------------------------------
    def run(self) -> int:
        wake_r, wake_w = os.pipe()
        os.set_blocking(wake_r, False)
        os.set_blocking(wake_w, False)
        old_wakeup = signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
        old_handlers = {}

        def on_signal(sig, _frame):
            self.signals.append(sig)

        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            old_handlers[sig] = signal.signal(sig, on_signal)
        old_handlers[signal.SIGCHLD] = signal.signal(signal.SIGCHLD, lambda *_: None)
        try:
            self.started = time.monotonic()
            self.start()
            poller = zmq.Poller()
            poller.register(self.service.router, zmq.POLLIN)
            poller.register(wake_r, zmq.POLLIN)
            while True:
                self._reap()
                if not self.running():
                    break
                self._handle_signals()
                self._handle_abort()
                now = time.monotonic()
                self._check_deadlines(now)
                self.service.expire()
                timeout_ms = int(self._next_wakeup(time.monotonic()) * 1000) + 1
                events = dict(poller.poll(timeout_ms))
                if wake_r in events:
                    try:
                        while os.read(wake_r, 512):
                            pass
                    except BlockingIOError:
                        pass
                self.service.serve_pending()
                self._serve_spawns()
            self._reap()
        finally:
            signal.set_wakeup_fd(old_wakeup)
            for sig, h in old_handlers.items():
                if sig == signal.SIGCHLD and h in (signal.SIG_DFL, None):
                    # Keep the no-op handler: a SIGCHLD (a reader's or a
                    # spawner's child) caught by the C handler but not yet
                    # run would otherwise find SIG_DFL and be reported as
                    # "Signal 17 ignored due to race condition" from
                    # whatever Python code runs next.  The no-op is what
                    # SIG_DFL does for SIGCHLD.
                    continue
                signal.signal(sig, h)
            os.close(wake_r)
            os.close(wake_w)
            for r in self.running():    # only on an internal error
                r.signal(signal.SIGKILL)
            for r in self.ranks:
                for t in r.readers:
                    if t.is_alive():
                        t.join(timeout=2.0)
            if hasattr(self, "service"):
                self.service.close()
            if self.spawner is not None:
                self.spawner.close()
        return self._final_status()

    def _final_status(self) -> int:
        if self.tolerated:
            _say("fault-tolerant job: rank(s) " +
                 ", ".join(f"{label} ({describe_exit(code)})" for label, code in self.tolerated) +
                 " failed; the others carried on")
        if self.first_failure is not None:
            rank, code = self.first_failure
            killed = [r.label for r in self.ranks if r.killed_by_us]
            if killed:
                _say(f"job failed: rank {rank} exited with {describe_exit(code)}; "
                     f"rank(s) {', '.join(killed)} were killed")
            return self.status or 1
        if self.status:
            return self.status
        failed = {label for label, _ in self.tolerated}
        bad = [r for r in self.ranks if r.returncode != 0 and r.label not in failed]
        if bad:     # e.g. killed after a timeout or a forwarded signal
            return exit_status(bad[0].returncode)
        return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=PROG, description="Launch an SPMD ucxpy job and serve its bootstrap.",
        usage=f"{PROG} -n N [options] prog.py|command [args...]")
    p.add_argument("-n", "--np", type=int, required=True, help="number of ranks")
    p.add_argument("--timeout", type=float, default=0.0,
                   help="kill the whole job after this many seconds (0 = never)")
    p.add_argument("--stacks-on-timeout", action="store_true",
                   default=config.setting("UCXPY_RUN_STACKS_ON_TIMEOUT"),
                   help="at --timeout, have every rank print each of its threads' stack "
                        "(Python's faulthandler, on SIGABRT) before the job is killed")
    p.add_argument("--grace", type=float, default=5.0,
                   help="after a rank fails, seconds before the others are killed")
    p.add_argument("--tag-output", action="store_true",
                   help="prefix each output line with [rank]")
    p.add_argument("--hosts", default="",
                   help="comma-separated hosts, optionally host:slots")
    p.add_argument("--host-agent", default="",
                   help="command prefixed to each rank's command; {rank}, {host} and {size} "
                        "are substituted (e.g. 'ip netns exec ns{rank}' or 'ssh {host}'); "
                        "the UCXPY_* variables are passed through 'env'")
    p.add_argument("--advertise", default=config.setting("UCXPY_RUN_ADVERTISE"),
                   help="address ranks use to reach the launcher (default: 127.0.0.1 "
                        "for local jobs, else the outward IP)")
    p.add_argument("--as-mpi4py", action="store_true",
                   help="run programs written for mpi4py on mpi_shim (the drop-in mpi4py "
                        "package comes first on the ranks' PYTHONPATH)")
    p.add_argument("--as-shmem4py", action="store_true",
                   help="run programs written for shmem4py on ucxpy's shmem (drop-in)")
    p.add_argument("--fault-tolerant", action="store_true",
                   help="a rank that fails does not end the job: the others are told "
                        "(ULFM: Comm.Revoke/Shrink/Agree) and the job's status is theirs")
    p.add_argument("--universe-size", type=int, default=0,
                   help="the MPI universe size ranks see (UNIVERSE_SIZE: how many processes "
                        "the job may grow to with MPI spawn; default max(N, CPUs))")
    p.add_argument("--trace", default="", metavar="DIR",
                   help="record protocol event traces of every rank in DIR "
                        "(sets UCXPY_TRACE; merge them with ucxpy-trace)")
    p.add_argument("--stats", action="store_true",
                   help="print every rank's statistics at exit (sets UCXPY_STATS=y)")
    p.add_argument("-v", "--verbose", action="store_true")
    p.add_argument("command", nargs=argparse.REMAINDER, help="program and its arguments")
    return p


def main(argv=None) -> int:
    opts = build_parser().parse_args(argv)
    if opts.command and opts.command[0] == "--":
        opts.command = opts.command[1:]
    if not opts.command:
        build_parser().error("no program given")
    if opts.np < 1:
        build_parser().error("-n must be at least 1")
    if opts.trace:                       # the ranks inherit the environment
        os.makedirs(opts.trace, exist_ok=True)
        os.environ["UCXPY_TRACE"] = os.path.abspath(opts.trace)
    if opts.stats:
        os.environ["UCXPY_STATS"] = "y"
    status = Job(opts).run()
    sys.stdout.flush()
    return status


if __name__ == "__main__":
    sys.exit(main())
