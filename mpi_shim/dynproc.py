"""Dynamic processes: ports (``Open_port``/``Accept``/``Connect``), name
publishing, ``Join`` over a socket, and ``Spawn`` through ``ucxpy-run``.

Theory of operation
-------------------
A *port name* is ``ucxpy-port:<port id>:<hex worker address of its owner>``,
so any process that can reach the owner's worker (this job or another one)
can connect to it.  ``Connect`` is collective over the connecting
communicator: its members agree on the largest free context id, then the
root sends the owner an active message (``AM_PORT``) naming the port, that
maximum and every member's worker address.  ``Accept`` is collective over
the accepting communicator: the members agree on their own maximum, the root
waits for a request on the port, takes the larger of the two maxima as the
new communicator's context and replies with it and its members' addresses.
Each root broadcasts what it learned to its group; every member then
connects to the other group's workers (ucxpy gives workers whose ids collide
with known peers a local alias) and both groups form one intercommunicator.

``Spawn``: the root opens a port, asks the launcher to start the processes
(``Bootstrap.spawn``) with the port in ``UCXPY_PARENT_PORT``, and the parents
``Accept`` on it while the children, at their MPI initialization, ``Connect``
to it from their own ``COMM_WORLD``: that intercommunicator is
``Comm.Get_parent()`` in the children and what ``Spawn`` returns in the
parents.  Under MPICH's ``mpiexec`` the PMI bootstrap asks Hydra to start
them (PMI-1 ``spawn``, the port and the job key pre-put in the children's
key-value space).  Launchers that cannot start processes (Open MPI's
``mpirun`` through mpi4py, Slurm's PMI-2, a single process) make ``Spawn``
raise ``ERR_SPAWN`` at the call.

Names (``Publish_name``/``Lookup_name``) live in the launcher's key-value
store: visible to every process of the job, including spawned ones.
"""
from __future__ import annotations

import collections
import itertools
import os
import pickle
import secrets
import struct

import ucxpy
from ucxpy import coll as engine
from ucxpy.coll import bcast_obj

from .coll import _MAX, run
from .comm import provide as _provide
from .comm import COMM_SELF, COMM_WORLD, CommImpl, claim_ctx, next_ctx_value
from .engine import ENGINE
from .exceptions import (ERR_ARG, ERR_NAME, ERR_PORT, ERR_ROOT, ERR_SERVICE, ERR_SPAWN,
                         ERR_UNSUPPORTED_OPERATION, Exception, SUCCESS)
from .info import Info
from .intercomm import Intercomm

MAX_PORT_NAME = 1024
AM_PORT, AM_PORT_REPLY = 0x4D60, 0x4D61
_PREFIX = "ucxpy-port:"
_state = {"setup": False, "parent": None}
_ports = {}                          # port id -> deque of (source id, request)
_replies = {}                        # request id -> reply dict (once arrived)
_rids = itertools.count(1)


def _setup():
    if not _state["setup"]:
        _state["setup"] = True
        ENGINE.worker.set_am_handler(AM_PORT, _on_request)
        ENGINE.worker.set_am_handler(AM_PORT_REPLY, _on_reply)


def _payload(msg, then):
    """``then(bytes)`` with the message's data, now or once a rendezvous
    payload arrived; returns the handler's keep flag."""
    if not msg.is_rndv:
        then(bytes(msg.data) if msg.data is not None else b"")
        return False
    buf = bytearray(msg.length)
    msg.receive(buf).add_done_callback(lambda r: then(bytes(buf)))
    return True


def _on_request(msg):
    src = msg.source

    def queue(data):
        req = pickle.loads(data)
        q = _ports.get(req["port"])
        if q is None:
            _send(src, AM_PORT_REPLY, {"rid": req["rid"], "error": "the port is not open"})
        else:
            q.append((src, req))
    return _payload(msg, queue)


def _on_reply(msg):
    def store(data):
        rep = pickle.loads(data)
        _replies[rep["rid"]] = rep
    return _payload(msg, store)


def _send(wid, am_id, obj):
    ENGINE.worker.endpoints[wid].am_send_nb(am_id, b"", pickle.dumps(obj))


def connect_address(addr: bytes) -> int:
    """Endpoint to the worker at ``addr``; returns its local id."""
    ep = ENGINE.worker.connect(addr)
    ENGINE.eps[ep.remote_id] = ep
    return ep.remote_id


def address_of(wid) -> bytes:
    if wid == ENGINE.me:
        return ENGINE.worker.address_bytes
    return ENGINE.eps[wid].remote.pack()


def _next_ctx_max(c) -> int:
    return int(run(engine.allreduce(c, next_ctx_value(), _MAX, codec=engine.Codec())))


def _share(c, root, value):
    return run(bcast_obj(c, value, root))


def _intercomm(comm, c, ctx, remote_addrs):
    remote = [connect_address(a) for a in remote_addrs]
    new = CommImpl(claim_ctx(ctx), c.group, remote)
    new.errhandler = c.errhandler
    return Intercomm._wrap(new)


def _parse_port(port_name):
    if not isinstance(port_name, str) or not port_name.startswith(_PREFIX):
        raise Exception(ERR_PORT, f"invalid port name {port_name!r}")
    try:
        _, pid, addr = port_name.split(":", 2)
        return pid, bytes.fromhex(addr)
    except ValueError:
        raise Exception(ERR_PORT, f"invalid port name {port_name!r}") from None


def _check_root(c, root):
    if not (0 <= root < c.size):
        raise Exception(ERR_ROOT, f"invalid root {root}")


# -- ports -------------------------------------------------------------------------
def open_port(info=None) -> str:
    """Return an address that ``Connect`` can reach (see the module docstring)."""
    _setup()
    pid = secrets.token_hex(8)
    _ports[pid] = collections.deque()
    return f"{_PREFIX}{pid}:{ENGINE.worker.address_bytes.hex()}"


def close_port(port_name) -> None:
    """Close a port; connections still waiting on it are refused."""
    pid, _ = _parse_port(port_name)
    q = _ports.pop(pid, None)
    if q is None:
        raise Exception(ERR_PORT, f"port {port_name[:40]}... is not open")
    for src, req in q:
        _send(src, AM_PORT_REPLY, {"rid": req["rid"], "error": "the port was closed"})


def accept(comm, port_name, root):
    c = comm._impl()
    _check_root(c, root)
    _setup()
    mx = _next_ctx_max(c)
    info = None
    if c.rank == root:
        try:
            pid, _ = _parse_port(port_name)
            q = _ports.get(pid)
            if q is None:
                raise Exception(ERR_PORT, "Accept on a port that is not open")
            ENGINE.wait_until(lambda: bool(q))
            src, req = q.popleft()
            ctx = max(mx, req["ctx"])
            _send(src, AM_PORT_REPLY, {"rid": req["rid"], "ctx": ctx,
                                       "group": [address_of(w) for w in c.group]})
            info = (ctx, req["group"], None)
        except Exception as e:                   # tell the group, then raise everywhere
            info = (None, None, e.Get_error_class())
    ctx, remote, err = _share(c, root, info)
    if err is not None:
        raise Exception(err, "Accept failed at the root")
    return _intercomm(comm, c, ctx, remote)


def connect(comm, port_name, root):
    c = comm._impl()
    _check_root(c, root)
    _setup()
    mx = _next_ctx_max(c)
    info = None
    if c.rank == root:
        try:
            pid, addr = _parse_port(port_name)
            owner = connect_address(addr)
            rid = next(_rids)
            _send(owner, AM_PORT, {"port": pid, "rid": rid, "ctx": mx,
                                   "group": [address_of(w) for w in c.group]})
            ENGINE.wait_until(lambda: rid in _replies)
            rep = _replies.pop(rid)
            if "error" in rep:
                raise Exception(ERR_PORT, f"Connect refused: {rep['error']}")
            info = (rep["ctx"], rep["group"], None)
        except ucxpy.UcxpyError as e:
            info = (None, None, ERR_PORT)
            del e
        except Exception as e:
            info = (None, None, e.Get_error_class())
    ctx, remote, err = _share(c, root, info)
    if err is not None:
        raise Exception(err, "Connect failed at the root")
    return _intercomm(comm, c, ctx, remote)


# -- names ---------------------------------------------------------------------------
def _boot():
    return ENGINE.world.bootstrap


def _name_key(service):
    if not isinstance(service, str) or not service:
        raise Exception(ERR_ARG, "invalid service name")
    return f"mpi-name:{service}"


def publish_name(service_name, port_name, info=None) -> None:
    """Publish a service name (visible to the whole job)."""
    try:
        _boot().put(_name_key(service_name), str(port_name).encode())
    except NotImplementedError:
        raise Exception(ERR_UNSUPPORTED_OPERATION, "this launcher has no name service") \
            from None


def unpublish_name(service_name, port_name, info=None) -> None:
    """Unpublish a service name."""
    key = _name_key(service_name)
    if not lookup(key):
        raise Exception(ERR_SERVICE, f"service {service_name!r} is not published")
    _boot().put(key, b"")


def lookup(key):
    try:
        v = _boot().lookup(key)
    except NotImplementedError:
        raise Exception(ERR_UNSUPPORTED_OPERATION, "this launcher has no name service") \
            from None
    return bytes(v).decode() if v else None


def lookup_name(service_name, info=None) -> str:
    """Lookup a port name given a service name."""
    v = lookup(_name_key(service_name))
    if not v:
        raise Exception(ERR_NAME, f"service {service_name!r} is not published")
    return v


# -- Join ----------------------------------------------------------------------------
def _sock_send(fd, data):
    view = memoryview(struct.pack("<Q", len(data)) + data)
    while view:
        view = view[os.write(fd, view):]


def _sock_recv(fd):
    def exact(n):
        out = bytearray()
        while len(out) < n:
            chunk = os.read(fd, n - len(out))
            if not chunk:
                raise Exception(ERR_ARG, "Join: the socket closed")
            out += chunk
        return bytes(out)
    (n,) = struct.unpack("<Q", exact(8))
    return exact(n)


def join(fd):
    """Intercommunicator of this process and the one at the other end of ``fd``."""
    c = COMM_SELF._impl()
    _sock_send(fd, pickle.dumps((ENGINE.worker.address_bytes, next_ctx_value())))
    addr, theirs = pickle.loads(_sock_recv(fd))
    return _intercomm(COMM_SELF, c, max(next_ctx_value(), theirs), [addr])


# -- spawn ----------------------------------------------------------------------------
def universe_size():
    return _boot().universe_size()


def appnum():
    return _boot().appnum()


def get_parent():
    return Intercomm._wrap(_state["parent"])


def forget_parent(impl) -> None:
    if _state["parent"] is impl:
        _state["parent"] = None


def connect_parent() -> None:
    """Children of a spawn: connect to the parents (at MPI initialization)."""
    port = _boot().parent_port()
    if port:
        _state["parent"] = connect(COMM_WORLD, port, 0)._h


def _argv(command, args):
    if args is None:
        args = []
    elif isinstance(args, str):
        args = [args]
    return [os.fspath(command)] + [os.fspath(a) for a in args]


def _apps(commands, args, maxprocs, infos):
    apps = []
    for cmd, arg, n, info in zip(commands, args, maxprocs, infos):
        if n is None or int(n) < 0:
            raise ValueError(f"invalid maxprocs {n}")
        app = {"argv": _argv(cmd, arg), "maxprocs": int(n), "env": {}}
        if info is not None and info:
            if info.Get("wdir"):
                app["wdir"] = info.Get("wdir")
            if info.Get("env"):
                for line in info.Get("env").splitlines():
                    k, _, v = line.partition("=")
                    app["env"][k] = v
        apps.append(app)
    return apps


def spawn(comm, commands, args, maxprocs, infos, root, errcodes):
    return _spawn(comm, commands, args, maxprocs, infos, root, errcodes, single=True)


def spawn_multiple(comm, command, args, maxprocs, info, root, errcodes):
    c = comm._impl()
    _check_root(c, root)
    if c.rank == root:
        if isinstance(command, (str, bytes, os.PathLike)):
            raise ValueError("Spawn_multiple needs a sequence of commands")
        command = list(command)
        n = len(command)
        args = [None] * n if args is None else list(args)
        if len(args) != n:
            raise ValueError(f"expected {n} argument lists, got {len(args)}")
        if maxprocs is None:
            maxprocs = [1] * n
        elif isinstance(maxprocs, int):
            maxprocs = [maxprocs] * n
        maxprocs = list(maxprocs)
        if len(maxprocs) != n:
            raise ValueError(f"expected {n} maxprocs, got {len(maxprocs)}")
        if info is None or isinstance(info, Info):
            info = [info] * n
        info = list(info)
        if len(info) != n:
            raise ValueError(f"expected {n} info objects, got {len(info)}")
        for a in args:
            if a is not None and not isinstance(a, (list, tuple)):
                raise ValueError("each argument list must be a sequence")
    return _spawn(comm, command, args, maxprocs, info, root, errcodes, single=False)


def _spawn(comm, commands, args, maxprocs, infos, root, errcodes, single):
    c = comm._impl()
    _check_root(c, root)
    status = None
    port = None
    if c.rank == root:
        try:
            apps = _apps(commands, args, maxprocs, infos)
            port = open_port()
            _, codes = _boot().spawn(apps, port=port)
            status = (SUCCESS, codes, "")
        except ucxpy.errors.BootstrapError as e:
            status = (ERR_SPAWN, None, str(e))
        except (ValueError, TypeError) as e:
            status = (ERR_ARG, None, str(e))
    err, codes, msg = _share(c, root, status)
    if err != SUCCESS:
        if port is not None:
            close_port(port)
        raise Exception(err, msg)
    inter = accept(comm, port, root)
    if c.rank == root:
        close_port(port)
    if errcodes is not None:
        flat = [x for app in codes for x in app]
        errcodes[:] = flat if single else codes
    return inter


# the communicator's methods that make these (.comm does not import this module)
_provide(accept=accept, appnum=appnum, connect=connect, forget_parent=forget_parent,
         get_parent=get_parent, join=join, spawn=spawn, spawn_multiple=spawn_multiple,
         universe_size=universe_size)
