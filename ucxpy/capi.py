"""The Python side of ucxpy's ``libucp.so.0`` (native/ucp/): UCP's C API on the core.

Theory of operation
-------------------
A C program, or a C library such as MPICH, calls ``ucp_*`` in libucp.so.0.
That library owns what C must own (the API's structs, request memory in the
caller's layout, the completion queue that ``ucp_worker_progress`` drains)
and reaches Python only through the bridge extension ``ucxpy._ucp_bridge``
(native/ucp/bridge.c), which calls the functions below with the GIL held.
Everything here uses the core's public API only, like mpi_shim and shmem.

Handles: the bridge keeps a strong reference to what these functions return
(a :class:`CContext`, a :class:`CWorker`, a :class:`ucxpy.Endpoint`, a
:class:`ucxpy.rma.MemHandle`, a :class:`ucxpy.rma.RemoteKey`, a
:class:`ucxpy.TagMessage`, an :class:`ucxpy.am.AmMessage`) and drops it when
the C handle is destroyed.

The hot operations do not pass through this module: the bridge calls the
core's public API directly (``Endpoint.tag_send_nb`` / ``tag_send_sync_nb``
/ ``am_send_nb`` / ``put_nb`` / ``get_nb``, ``Worker.tag_recv_nb`` /
``tag_recv_message_nb`` / ``progress``, ``AmMessage.receive``) and reads
the core Request each returns: a done one at once (the C side decides
whether the caller sees it now or from the next progress); a pending one
goes into ``CWorker.pending`` (C request address -> Request, for cancel)
with a completion callback of the bridge's own (``bridge.Completion``),
which queues the outcome for the next ``ucp_worker_progress`` (UCP:
callbacks run only from progress).  libucp counts the operations
(``bridge.ops``).

Active messages arrive in a core handler that hands them to
``bridge.am_event`` (queued the same way, in arrival order with the
completions); a rendezvous one is kept as its :class:`ucxpy.am.AmMessage`,
the ``data_desc`` of ``ucp_am_recv_data_nbx``.

Errors: an exception raised here becomes a ``ucs_status_t`` in the bridge
(:func:`status_of`), with its message on stderr.

Exit: a Python binding that finalizes its C library from C's exit (after
Python's own finalization: shmem4py) has it finalized by this module's
atexit handler instead (:func:`_finalize_bindings`); teardown calls that
still arrive after finalization are answered without Python (bridge.c).

Proof of use: with ``UCXPY_UCP_REPORT=DIR`` each worker writes
``DIR/<host>-<pid>-<n>.json`` when made, and again when destroyed, or at the
interpreter's exit if
it is still alive then (mpi4py finalizes MPI after Python's own
finalization, when no Python can run): the operations it carried and
the path of the libucp.so.0 this process mapped, which the tests and
conformance runners check on every rank.
"""
from __future__ import annotations

import atexit
import json
import os
import socket
import sys
import weakref

from . import __version__, auth, config, errors
from .config import Config
from .context import Context, load_transport
from .tools import ucxvars
from .request import TagInfo
from .transports.base import Caps
from .tag import RecvRequest
from .worker import usable_cpus

config.declare(
    "libucp",
    ("UCP_REPORT", None, str,
     "directory where each libucp.so.0 worker writes its proof-of-use report (the libucp "
     "this process mapped, the operations it carried, its endpoints' transports); "
     "ucxpy-ucx --check sets and reads it"),
    ("PYTHONPATH", None, str,
     "more site directories for the Python that libucp.so.0 starts in a C program "
     "(':'-separated, after the build's own site-packages)"),
)

#: set by :func:`attach`: the bridge module and the status codes it exports
bridge = None
OK = INPROGRESS = 0
_STATUS = ()
_reports = 0
_live = weakref.WeakSet()       # workers to report at exit (mpi4py finalizes MPI after Python)


def attach(module) -> None:
    """Called once by the bridge: its module, whose ``complete`` and
    ``am_event`` the completions call, and whose ``UCS_*`` constants are the
    real header's status codes."""
    global bridge, OK, INPROGRESS, _STATUS
    bridge = module
    OK, INPROGRESS = module.UCS_OK, module.UCS_INPROGRESS
    s = module
    _STATUS = ((errors.TruncationError, s.UCS_ERR_MESSAGE_TRUNCATED),
               (errors.Canceled, s.UCS_ERR_CANCELED),
               (errors.TimeoutError, s.UCS_ERR_TIMED_OUT),
               (errors.ConnectionLost, s.UCS_ERR_CONNECTION_RESET),
               (errors.MessageTooLarge, s.UCS_ERR_EXCEEDS_LIMIT),
               (errors.RemoteAccessError, s.UCS_ERR_INVALID_ADDR),
               (errors.TransportUnavailable, s.UCS_ERR_NO_DEVICE),
               (errors.InvalidBuffer, s.UCS_ERR_INVALID_PARAM),
               (MemoryError, s.UCS_ERR_NO_MEMORY),
               (NotImplementedError, s.UCS_ERR_NOT_IMPLEMENTED),
               (ValueError, s.UCS_ERR_INVALID_PARAM),
               (TypeError, s.UCS_ERR_INVALID_PARAM),
               (BaseException, s.UCS_ERR_IO_ERROR))


def status_of(exc) -> int:
    """The ``ucs_status_t`` for an exception (None: ``UCS_OK``)."""
    if exc is None:
        return OK
    for cls, status in _STATUS:
        if isinstance(exc, cls):
            return status
    return _STATUS[-1][1]


# -- context and worker -------------------------------------------------------
class CContext:
    """A ``ucp_context_h``: the core's :class:`ucxpy.Context` and its workers
    (memory is registered with the first one, UCP maps per context)."""

    def __init__(self, prefix: str = "", modified: str = ""):
        names = ucxvars.gather(prefix, [tuple(line.split("=", 1)) for line in
                                        modified.splitlines() if "=" in line])
        env, ignored, errors = ucxvars.settings(names)
        _say_ignored(ignored, errors)
        self.context = Context(Config.from_env(dict(os.environ, **env)) if env else None)
        self.workers = []
        if config.auth_key_from_env() is None:
            print("ucxpy libucp: no job key (UCXPY_AUTH_KEY): peers in other processes "
                  "cannot authenticate to this one over the network transports; start the "
                  "job under ucxpy-ucx", file=sys.stderr)

    def memory_worker(self):
        for w in self.workers:
            if not w.worker.closed:
                return w.worker
        raise errors.InvalidBuffer("ucp_mem_map needs a worker of this context first")


class CWorker:
    """A ``ucp_worker_h``: a core worker, the requests still pending
    (C request address -> core Request) and the operation counts."""

    def __init__(self, ctx: CContext, cworker: int, ops: int):
        self.reported = False
        self.report_name = None
        self.ctx = ctx
        self.cworker = cworker
        self.worker = ctx.context.create_worker()
        w = self.worker
        # libucp's progress reads tcp connections in C (native/dp/stream.c;
        # UCXPY_TCP_NATIVE), where it runs the data plane at all (no tracing,
        # no progress thread) and the stock protocols run every size
        # (UCXPY_PROTO_PYTHON and a plug-in take theirs through Python)
        w.lend_streams = w.config.tcp_native and w.dp is not None and w.tr is None \
            and w.lock is None and w.protocol is None and not w.config.proto_python
        # its receives that fell back to the core's path (ucp_tag_recv_nbx
        # while another thread is in Python) live in the data plane's
        # matcher, where libucp's C progress may match them: the core's
        # progress delivers those
        w.c_matches = w.dp is not None
        self.pending = {}
        self.lanes = {}                  # transport name -> endpoints it carried
        self.counted = set()
        self.ops = ops                   # address of the C worker's counts (bridge.ops)
        ctx.workers.append(self)
        _live.add(self)


def failure(exc) -> tuple:
    """``(status, length)`` of a request that failed with ``exc`` (the bridge
    reads successful ones itself): a truncated receive reports the length
    that arrived."""
    length = exc.args[1] if isinstance(exc, errors.TruncationError) and len(exc.args) > 1 else 0
    return status_of(exc), length


_said = set()


def _say_ignored(ignored: list, errors: dict) -> None:
    """Report, once per process, UCX names that have no meaning in ucxpy and
    values that could not be translated (ucxvars)."""
    new = [n for n in ignored if n not in _said]
    if new:
        _said.update(new)
        print(f"ucxpy libucp: ignored (no meaning in ucxpy): "
              f"{', '.join('UCX_' + n for n in new)}", file=sys.stderr)
    for name, why in errors.items():
        if ("!" + name) not in _said:
            _said.add("!" + name)
            print(f"ucxpy libucp: UCX_{name} ignored: {why}", file=sys.stderr)


def context_create(prefix: str = "", modified: str = "") -> CContext:
    """``ucp_init``: ``prefix`` is ``ucp_config_read``'s, ``modified`` the
    ``NAME=VALUE`` lines of ``ucp_config_modify`` (ucxvars maps them)."""
    return CContext(prefix, modified)


def worker_create(ctx: CContext, cworker: int, ops: int):
    """Returns ``(CWorker, packed worker address, oversubscribed)``."""
    w = CWorker(ctx, cworker, ops)
    _report(w, final=False)
    return w, w.worker.address_bytes, oversubscribed(w.worker.config)


#: the launchers' count of a job's ranks on this host (Hydra, Open MPI, Slurm)
LOCAL_SIZE_VARS = ("MPI_LOCALNRANKS", "OMPI_COMM_WORLD_LOCAL_SIZE", "SLURM_NTASKS_PER_NODE")


def oversubscribed(config) -> bool:
    """More of the job's ranks on this host than CPUs (``UCXPY_OVERSUBSCRIBED``,
    "auto": the launcher's local rank count against the usable CPUs).  The
    caller's progress loop (MPICH's) then gets the CPU given away after a
    run of idle ``ucp_worker_progress`` calls, as the core's own waits do."""
    if config.oversubscribed in ("y", "n"):
        return config.oversubscribed == "y"
    for var in LOCAL_SIZE_VARS:
        v = os.environ.get(var, "")
        if v.isdigit():
            return int(v) > usable_cpus()
    return False


def worker_destroy(w: CWorker) -> None:
    _report(w)
    if w in w.ctx.workers:
        w.ctx.workers.remove(w)
    w.worker.close()


def ep_create(w: CWorker, address: bytes):
    return w.worker.connect(bytes(address))


def ep_close(w: CWorker, ep) -> None:
    _count_lane(w, ep)
    ep.close()


def _count_lane(w: CWorker, ep) -> None:
    """Count the transport that carried ``ep`` (once per endpoint), for the report."""
    tep = getattr(ep, "_tep", None)
    if tep is not None and id(ep) not in w.counted:
        w.counted.add(id(ep))
        w.lanes[tep.iface.name] = w.lanes.get(tep.iface.name, 0) + 1


def ep_lane(ep):
    """``(lane, eager_max, rndv_max, peer)``: the data plane's view of the
    connection Endpoint ``ep`` sends on (a ``ucxpy._dp.Lane``), the largest
    message its protocol sends eagerly and the largest it offers by
    rendezvous (0: none; a rendezvous, and a synchronous send, offered by
    the data plane, native/dp/rndv.c), which libucp then sends in C, and the
    peer's worker id; None where there is none (not connected yet, another
    transport, tracing)."""
    tep = ep._tep
    lane = tep.native_lane if tep is not None else None
    if lane is None and tep is not None:    # (a tcp connection written in C: its stream)
        lane = ep.worker._streams.get(tep)
    if lane is None or lane.dead or ep.failed is not None or ep.worker.tr is not None:
        return None
    limit = ep.rndv_thresh - 1
    rndv = (1 << 62) if tep.iface.attrs.caps & Caps.GET_ZCOPY else 0
    if tep.native_lane is None:         # (a stream: eager only, up to its frame)
        limit, rndv = min(limit, tep.native_max_frame), 0
    plugin = ep.worker.protocol
    if plugin is not None:              # (the sizes of a protocol plug-in are its own:
        limit = min(limit, plugin.low - 1)  # its C half's offers go as rendezvous do)
        rndv = rndv if ep.worker.proto_c and tep.native_lane is not None else 0
    python = ep.worker.config.proto_python
    if python:                          # (so are UCXPY_PROTO_PYTHON's: the core's path)
        limit = min(limit, min(lo for lo, _hi in python) - 1)
        rndv = 0
    if limit < 0:
        return None
    return lane, limit, rndv, ep.remote_id


def stream_tail(ep, data: bytes) -> None:
    """The rest of a frame libucp wrote on ``ep``'s tcp connection, which the
    socket took only part of: queued before anything else."""
    ep._tep.stream_tail(data)


def wake_peer(ep) -> None:
    """libucp's push into ``ep``'s peer inbox found the peer asleep."""
    tep = ep._tep
    if tep is not None:
        tep.wake_peer()


def flush(w: CWorker, ep) -> None:
    (ep if ep is not None else w.worker).flush()


def flush_nb(w: CWorker, ep):
    """``ucp_ep_flush_nbx`` / ``ucp_worker_flush_nbx``: a core Request done
    once ``ep`` (None: every endpoint of the worker) is flushed; the caller
    progresses meanwhile (its peer may be another worker of this process,
    which another thread progresses: a flush that waited inside the call,
    holding libucp's lock, would wait for it forever)."""
    return (ep if ep is not None else w.worker).flush_nb()


def arm(w: CWorker):
    """``ucp_worker_arm``: the descriptors the worker's event descriptor
    (libucp's epoll set) then holds, armed, or None when it has work now."""
    return w.worker.arm()


def ep_perf(ep, size: int) -> float:
    """``ucp_ep_evaluate_perf``: the seconds the lane ``ep`` sends on takes
    to move ``size`` bytes, by the core's cost model (its transport's
    ``TransportAttrs.estimate``: overhead + latency + size / bandwidth), plus
    a round trip (2 x latency) for the handshake where the message would go
    by rendezvous."""
    if ep.failed is not None:
        raise ep.failed
    attrs = (ep._tep or ep.transport_endpoint()).iface.attrs
    seconds = attrs.estimate(size)
    if size >= ep.rndv_thresh:
        seconds += 2 * attrs.latency
    return seconds


# -- tagged messages -------------------------------------------------------------
def tag_probe(w: CWorker, tag: int, mask: int, remove: int):
    """None, or ``(tag, length, message or None)``: what has arrived, not
    progressing (UCP's probe looks; ``ucp_worker_progress`` moves)."""
    found = w.worker.tag_peek(tag, mask, remove=bool(remove))
    if found is None:
        return None
    info = found.info if remove else found
    return info.tag, info.length, (found if remove else None)


# -- active messages ---------------------------------------------------------------
def am_handler(w: CWorker, am_id: int, on: int) -> None:
    """Route active message ``am_id`` to the C worker's handler (or stop)."""
    if not on:
        w.worker.set_am_handler(am_id, None)
        return
    cworker, event = w.cworker, bridge.am_event

    def handler(msg):
        if msg.is_rndv:
            event(cworker, msg.am_id, msg.header, None, msg.length, msg)
            return True                   # kept: the C handler receives or drops it
        event(cworker, msg.am_id, msg.header, msg.data, msg.length, None)
        return False
    w.worker.set_am_handler(am_id, handler)


def am_drop(msg) -> None:
    msg.drop()


# -- memory and RMA ------------------------------------------------------------------
def mem_map(ctx: CContext, buf, length: int, fixed: int = 0):
    """Register ``buf``, or allocate ``length`` bytes (buf None) that
    same-host peers map, at address ``fixed`` if not 0 (UCP_MEM_MAP_FIXED);
    returns ``(MemHandle, address)``."""
    worker = ctx.memory_worker()
    if buf is not None:
        mh = worker.mem_map(buf)
    else:
        mh = worker.mem_map(length=length, address=fixed)
    return mh, mh.address


def mem_unmap(ctx: CContext, mh) -> None:
    mh.unmap()


def rkey_pack(mh) -> bytes:
    return mh.pack_rkey()


def rkey_unpack(ep, packed):
    return ep.unpack_rkey(bytes(packed))


def rkey_map(rkey):
    """``ucp_rkey_ptr``: ``(view, base)``, the region of ``rkey`` mapped into
    this process (the view keeps the mapping; ``base`` the region's remote
    address), or None where no memory domain maps it (another host, or the
    caller's own memory registered on the peer: only regions the core
    allocated, ``ucp_mem_map`` with ALLOCATE, are shared)."""
    view = rkey.map()
    return None if view is None else (view, rkey.base)


def context_info(ctx: CContext) -> str:
    """What ``ucp_context_print_info`` prints: ucxpy's own transports and
    their devices, one ``# resource`` line each in the layout UCX prints
    (Open MPI reads the ``transport/device`` pairs to match its
    ``pml_ucx_tls`` / ``pml_ucx_devices`` lists).  Never another UCX's names:
    a list naming only UCX transports (rc, ud, dc, ...) matches none of these."""
    cfg = ctx.context.config
    lines = ["#", f"# UCP context: ucxpy {__version__} (libucp.so.0 on ucxpy's core)",
             f"#     UCXPY_TLS={','.join(cfg.tls)}", "#"]
    n = 0
    for md, cls in enumerate(ctx.context.transports):   # selected and available, in order
        name = cls.name
        _, avail = load_transport(name, cfg)
        lines.append(f"#            md {md:<2} :  {name}")
        for dev, device in enumerate(avail.devices or [name]):
            device = str(device).replace("/", "_").replace(" ", "_")
            lines.append(f"#      resource {n:<2} :  md {md:<2} dev {dev:<2} flags -- "
                         f"{name}/{device}")
            n += 1
    return "\n".join(lines) + "\n"


# -- proof of use ---------------------------------------------------------------------
def loaded_libucp() -> str:
    """Path of the libucp.so.0 mapped into this process ('' if none)."""
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                path = line.rstrip("\n").split(None, 5)[-1]
                path = path[:-len(" (deleted)")] if path.endswith(" (deleted)") else path
                if path.endswith("/libucp.so.0"):      # (rebuilt since: still this one)
                    return os.path.realpath(path)
    except OSError:
        pass
    return ""


@atexit.register
def _report_live() -> None:
    for w in list(_live):
        _report(w)


@atexit.register                 # (atexit runs the last registered first: before the reports)
def _finalize_bindings() -> None:
    """Finalize, while Python still runs, a C library whose Python binding
    would finalize it from C's exit, after Python's own finalization, when
    libucp can no longer reach the core: shmem4py calls ``shmem_finalize``
    from a C atexit handler, and OSHMEM's finalize communicates (a barrier
    over the pml).  Nothing to do when no libucp worker is alive here (the
    program finalized itself) or the binding was told not to finalize."""
    if not _live:
        return
    shmem = sys.modules.get("shmem4py.shmem")
    lib = getattr(shmem, "lib", None)
    if lib is not None and getattr(lib, "_shmem_atexit_finalize", 0):
        lib._shmem_atexit_finalize = 0      # done here, not again at C's exit
        shmem.finalize()


def _report(w: CWorker, final: bool = True) -> None:
    """Write ``w``'s report: once when it is made (so a rank that dies or is
    killed still shows which libucp it ran on), then, ``final``, with what it
    carried, over the first."""
    folder = config.setting("UCXPY_UCP_REPORT")
    if not folder or w.reported:
        return
    w.reported = final
    if w.report_name is None:
        global _reports
        _reports += 1
        w.report_name = f"{socket.gethostname()}-{os.getpid()}-{_reports}.json"
    for ep in list(w.worker.endpoints.values()):
        _count_lane(w, ep)
    ops = bridge.ops(w.ops)
    progress = {k: ops.pop(k) for k in list(ops) if k.startswith(("progress_", "py_"))}
    record = {"pid": os.getpid(), "host": socket.gethostname(), "libucp": loaded_libucp(),
              "ops": ops, "progress": progress, "py_entries": bridge.entries(),
              "dp": w.worker.dp.counters() if w.worker.dp is not None else {},
              "tls": [i.name for i in w.worker.ifaces],
              "lanes": w.lanes, "final": final}
    try:
        os.makedirs(folder, exist_ok=True)
        tmp = os.path.join(folder, "." + w.report_name)
        with open(tmp, "w") as f:
            json.dump(record, f)
        os.replace(tmp, os.path.join(folder, w.report_name))
    except OSError:
        pass
