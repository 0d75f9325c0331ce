"""``ucxpy-info``: what ucxpy can use on this host, like ``ucx_info``.

Usage::

    ucxpy-info        version and a table of every known transport
    ucxpy-info -c     the effective configuration (``UCXPY_*``)
    ucxpy-info -e     lane and protocol per message size, for a peer in this
                      process, on this host and on another host
    ucxpy-info -d     devices: IPv4 network interfaces, /dev/shm, CMA permission

Nothing here raises on an unavailable or unknown transport: the reason is
printed instead.  Interfaces are only instantiated where their attributes are
needed (a throwaway worker per transport), and closed at once.
"""
from __future__ import annotations

import argparse
import ctypes
import errno
import fcntl
import os
import socket
import struct
import sys
TYPE_CHECKING = False      # (typing is imported for type checkers only: issue 44)
if TYPE_CHECKING:
    from typing import Optional

from .. import __version__, record
from ..auth import MASK, job_key
from ..config import Config, setting, unknown_variables, variables
from ..context import LOOPBACK, TRANSPORTS, Context, load_transport
from ..endpoint import protocol_thresholds, select_lane
from ..errors import ConfigError, UcxpyError
from ..protocols import parse_spec, plugin_class
from ..rndv import rndv_variant
from ..transports.base import Caps

#: protocol names printed by ``-e`` (and used by tests)
EAGER_SHORT = "eager short"
EAGER_COPY = "eager copy"
RNDV_GET = "rendezvous get-zcopy"
RNDV_SPLIT = "rendezvous split (put + get)"
RNDV_DATA = "rendezvous data frames"
#: ucxpy.rndv.rndv_variant's names -> the names printed
RNDV_NAMES = {"get": RNDV_GET, "split": RNDV_SPLIT, "rtr": RNDV_DATA}

_INF = 1 << 62


# --------------------------------------------------------------- formatting

def fmt_size(n: int) -> str:
    """65536 -> '64K', 1<<62 -> 'inf', 1000 -> '1000'."""
    if n >= _INF:
        return "inf"
    for shift, unit in ((40, "T"), (30, "G"), (20, "M"), (10, "K")):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift}{unit}"
    return str(n)


def fmt_caps(caps) -> str:
    return "|".join(f.name.lower() for f in type(caps) if f and f in caps) or "-"


def _table(rows, headers) -> str:
    cols = list(zip(*([headers] + rows))) if rows else [[h] for h in headers]
    widths = [max(len(str(c)) for c in col) for col in cols]
    out = ["  ".join(str(h).ljust(w) for h, w in zip(headers, widths)).rstrip(),
           "  ".join("-" * w for w in widths)]
    for r in rows:
        out.append("  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip())
    return "\n".join(out)


# --------------------------------------------------------------- config / transports

def load_config():
    """``(Config, error or None)``: a broken environment falls back to defaults."""
    try:
        return Config.from_env(), None
    except ConfigError as e:
        cfg = Config()
        return cfg, str(e)


def interface_attrs(name: str, config):
    """Attributes of transport ``name`` from a throwaway worker, or
    ``(None, reason)`` if the interface cannot be created here."""
    try:
        cfg = record.replace(config, tls=(name,))
        worker = Context(cfg).create_worker()
    except Exception as e:     # report, never crash ucxpy-info
        return None, f"{type(e).__name__}: {e}"
    try:
        for iface in worker.ifaces:
            if iface.name == name:
                return iface.attrs, ""
        return None, "interface not created"
    finally:
        try:
            worker.close()
        except Exception:
            pass


def protocol_ranges(attrs, config) -> list:
    """``[(first byte count, last byte count, protocol)]`` covering 0 .. inf,
    from the functions the endpoint (eager/rendezvous thresholds) and the
    rendezvous receiver (its variant) call themselves."""
    short, rndv = protocol_thresholds(attrs, config)
    ranges = []
    short_end = min(short, rndv - 1)
    if short_end >= 0:
        ranges.append((0, short_end, EAGER_SHORT))
    if rndv - 1 > short_end:
        ranges.append((short_end + 1, rndv - 1, EAGER_COPY))
    first = max(rndv, 0)
    split = config.rndv_split_thresh

    def name(size):
        return RNDV_NAMES[rndv_variant(attrs.caps, max(size, 1), split)[0]]
    # the variant is monotone in the size (get, then split from the split
    # threshold on): find where it becomes the one of the largest sizes
    lo, hi = first, _INF
    if name(lo) == name(hi):
        ranges.append((first, _INF, name(first)))
        return ranges
    while hi - lo > 1:                  # name(lo) != name(_INF) == name(hi)
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if name(mid) == name(_INF) else (mid, hi)
    ranges.append((first, hi - 1, name(first)))
    ranges.append((hi, _INF, name(hi)))
    return ranges


# --------------------------------------------------------------- default listing

def describe_auth(config) -> str:
    """One line on the job key (never the key itself)."""
    try:
        key = job_key(config)
    except ConfigError as e:
        return f"job key: unusable: {e}"
    if key is None:
        return ("job key: none (this process uses a random key of its own: "
                "it talks only to itself; tcp listens on loopback)")
    where = "UCXPY_AUTH_KEY" if config.auth_key else "UCXPY_AUTH_KEY_FILE"
    tls = ", tcp encrypted with TLS" if config.tcp_tls else ""
    return f"job key: set ({where}); tcp, ofi and the launcher's service authenticate peers{tls}"


def print_transports(config, out) -> None:
    print(f"# ucxpy version {__version__}  (python {sys.version.split()[0]}, "
          f"{os.uname().sysname} {os.uname().release}, host {socket.gethostname()})", file=out)
    print(f"# UCXPY_TLS={','.join(config.tls)}", file=out)
    print(f"# {describe_auth(config)}", file=out)
    rows, notes = [], []
    for name in TRANSPORTS:
        cls, avail = load_transport(name, config)
        selected = "yes" if (name in config.tls or "all" in config.tls or name == "self") else "no"
        attrs, why = (None, avail.reason)
        if cls is not None and avail.available:
            attrs, why = interface_attrs(name, config)
        if attrs is None:
            ok = "no"
            rows.append([name, ok, selected, "-", "-", "-", "-", "-", "-"])
            notes.append(f"#   {name}: not available: {why or 'unknown reason'}")
        else:
            rows.append([name, "yes", selected, fmt_size(attrs.max_short), fmt_size(attrs.max_bcopy),
                         fmt_size(attrs.max_frame), f"{attrs.latency * 1e6:.2f}",
                         f"{attrs.bandwidth / 1e9:.2f}", fmt_caps(attrs.caps)])
            devs = ", ".join(map(str, avail.devices)) or "-"
            notes.append(f"#   {name}: devices: {devs}")
    print(_table(rows, ["transport", "available", "selected", "max_short", "max_bcopy",
                        "max_frame", "latency_us", "bw_GB/s", "caps"]), file=out)
    print("#", file=out)
    for n in notes:
        print(n, file=out)


# --------------------------------------------------------------- -c

def _shown(name: str, value) -> str:
    if value is None:
        return ""
    if isinstance(value, tuple):
        return ",".join(value)
    if isinstance(value, bool):
        return "y" if value else "n"
    if isinstance(value, int) and name.endswith(("THRESH", "SIZE", "BOUNCE")):
        return "auto" if value == -1 else fmt_size(value)
    return str(value)


def print_config(config, out, full: bool = False) -> None:
    """Every declared ``UCXPY_*`` variable (the core's, each transport's and
    launcher's, and the layers' above that declare theirs), grouped by
    component, with its documentation when ``full``; environment values that
    differ from the default are marked ``*``; undeclared ``UCXPY_*`` names in
    the environment are listed (a typo is otherwise silently ignored)."""
    import textwrap     # deferred: only -c wraps text
    core = dict(config.items())
    groups = {}
    for var in variables().values():
        groups.setdefault(var.component, []).append(var)
    print("# effective configuration (environment overrides marked *)", file=out)
    for comp in sorted(groups, key=lambda c: (c != "core", c)):
        print(f"# --- {comp}", file=out)
        for var in groups[comp]:
            if full:
                for line in textwrap.wrap(var.doc, 76):
                    print(f"#   {line}", file=out)
            try:
                value = core[var.name] if var.name in core else setting(var.name, config)
            except ConfigError as e:
                print(f"{var.name}=<invalid: {e}>", file=out)
                continue
            changed = value != var.default
            if var.secret:            # items() has masked it already; never print it
                value = MASK if value else ""
            print(f"{var.name}={_shown(var.name, value)}{'  *' if changed else ''}", file=out)
    unknown = unknown_variables(config._env)
    if unknown:
        print("# not declared by any component (misspelt?): " + ", ".join(unknown), file=out)


def self_test(config) -> dict:
    """Statistics of a loopback exchange (one message per protocol) on a
    fresh worker with counting on (``-s``)."""
    from ..trace import Recorder, discard   # deferred: ucxpy.trace only for -s
    cfg = record.replace(config, stats=False, trace="", tls=(LOOPBACK,))
    w = Context(cfg).create_worker()
    w.tr = Recorder(w, cfg)
    try:
        ep = w.connect(w.address_bytes)
        ep.transport_endpoint()
        sizes = [0, ep.short_thresh + 1, ep.rndv_thresh]
        buf = bytearray(max(sizes))
        for i, n in enumerate(sizes):
            r = w.tag_recv_nb(buf, tag=i)
            ep.tag_send_nb(bytes(n), i).wait(10)
            r.wait(10)
        return w.stats()
    finally:
        discard(w.tr)
        w.close()


# --------------------------------------------------------------- -e

def print_protocols(config, out) -> int:
    """Chosen lane and protocol per size range; returns an exit status."""
    try:
        worker = Context(config).create_worker()
    except UcxpyError as e:
        print(f"# no usable transport for UCXPY_TLS={','.join(config.tls)}: {e}", file=out)
        return 1
    try:
        if worker.context.unavailable:
            for n, r in worker.context.unavailable.items():
                print(f"# {n}: not available: {r}", file=out)
        me = worker.address
        other_uuid = (me.uuid + 1) & ((1 << 63) - 1)
        peers = [
            ("this process (same worker)", me),
            ("this host", record.replace(me, worker_id=me.worker_id + 1, uuid=other_uuid,
                                              pid=me.pid + 1)),
            ("another host", record.replace(me, worker_id=me.worker_id + 2, uuid=other_uuid,
                                                 pid=me.pid + 2,
                                                 host_id=b"ucxpy-info:another-host")),
        ]
        for where, remote in peers:
            try:
                iface, _ = select_lane(worker, remote)
            except UcxpyError as e:
                print(f"\n# peer on {where}: unreachable: {e}", file=out)
                continue
            usable = [i.name for i in worker.ifaces if _reaches(worker, i, remote)]
            print(f"\n# peer on {where}: lane {iface.name}  "
                  f"(usable: {', '.join(usable)})", file=out)
            _print_ranges(iface, config, out)
        print("\n# per transport (forced with UCXPY_TLS=<name>):", file=out)
        for iface in worker.ifaces:
            if iface.name == "self":
                continue
            print(f"\n# transport {iface.name}", file=out)
            _print_ranges(iface, config, out)
    finally:
        worker.close()
    return 0


def print_collectives(n: int, out) -> None:
    """Collective algorithm per operation and size (ucxpy.schedules decides)."""
    from ..schedules import collective_table, team_table    # deferred: the schedules only for -e
    print(f"\n# collective algorithms for a group of {n} ranks "
          "(mpi_shim, shmem; ucxpy.schedules):", file=out)
    print(_table(collective_table(n), ("collective", "payload", "algorithm")), file=out)
    print(f"\n# blocking collectives of a same-host group of {n} with a shared-memory team "
          "(mpi_shim; ucxpy.shmteam, UCXPY_SHM_COLL=y; ucxpy.schedules), larger ones as above:", file=out)
    print(_table(team_table(n), ("collective", "payload", "algorithm")), file=out)


def _reaches(worker, iface, remote) -> bool:
    raddr = remote.transport(iface.name)
    if raddr is None:
        return False
    if iface.attrs.caps & Caps.LOOPBACK:
        return remote.uuid == worker.uuid
    try:
        return bool(iface.is_reachable(raddr, remote.host_id))
    except Exception:
        return False


#: who runs a protocol on the receiving side (the protocol table's entries)
NATIVE = "native (native/dp)"
PYTHON = "Python"
#: a protocol plug-in with a C half, on an interface the data plane reads
PLUGIN_C = "Python; C half for libucp's"


def execution_ranges(iface, config) -> list:
    """``[(first, last, protocol, executor)]``: :func:`protocol_ranges` with
    who runs each range on the receiving side.  The eager messages of an
    interface whose inbox the data plane reads (``native_ring``) run in C,
    and so do its rendezvous read whole (get-zcopy: the offer, the read by
    CMA and the answer, native/dp/rndv.c; a receive of Python's own is
    matched in Python's path first, one of libucp's in C), except the sizes
    ``UCXPY_PROTO_PYTHON`` hands to the Python reference protocol;
    everything else (a split rendezvous, other interfaces, the data plane
    off) runs in Python, after matching in the same queues."""
    native = bool(config.fastpath and getattr(iface, "native_ring", 0))
    handed = config.proto_python
    out = []
    for lo, hi, proto in protocol_ranges(iface.attrs, config):
        if not native or proto not in (EAGER_SHORT, EAGER_COPY, RNDV_GET):
            out.append((lo, hi, proto, PYTHON))
            continue
        cur = lo
        for hlo, hhi in handed:            # (sorted) cut the Python ranges out
            if hhi < cur or hlo > hi:
                continue
            if hlo > cur:
                out.append((cur, hlo - 1, proto, NATIVE))
            out.append((max(hlo, cur), min(hhi, hi), proto, PYTHON))
            cur = min(hhi, hi) + 1
            if cur > hi:
                break
        if cur <= hi:
            out.append((cur, hi, proto, NATIVE))
    return _plugin_cut(out, config, native)


def _plugin_cut(rows: list, config, native: bool = False) -> list:
    """``rows`` with the sizes of the protocol plug-in (UCXPY_PROTO_PLUGIN)
    given to it: it runs them in Python, whatever the stock table said, and
    in its C half too (``native``: the data plane reads the interface's
    inbox) for the messages C callers send and receive."""
    name, ranges = parse_spec(config.proto_plugin)
    if not name:
        return rows
    who_plugin = PLUGIN_C if native and config.proto_native \
        and getattr(plugin_class(name), "native", None) else PYTHON
    out = []
    for lo, hi, proto, who in rows:
        cur = lo
        for plo, phi in ranges:
            if phi < cur or plo > hi:
                continue
            if plo > cur:
                out.append((cur, plo - 1, proto, who))
            out.append((max(plo, cur), min(phi, hi), f"plug-in {name}", who_plugin))
            cur = min(phi, hi) + 1
            if cur > hi:
                break
        if cur <= hi:
            out.append((cur, hi, proto, who))
    merged = []                          # (the plug-in's range is one row)
    for row in out:
        if merged and merged[-1][2:] == row[2:] and merged[-1][1] + 1 == row[0]:
            merged[-1] = (merged[-1][0], row[1], *row[2:])
        else:
            merged.append(row)
    return merged


def _print_ranges(iface, config, out) -> None:
    short, rndv = protocol_thresholds(iface.attrs, config)
    print(f"#   short_thresh={fmt_size(short)}  rndv_thresh={fmt_size(rndv)}  "
          f"max_frame={fmt_size(iface.attrs.max_frame)}", file=out)
    for lo, hi, proto, who in execution_ranges(iface, config):
        span = f"{fmt_size(lo)} .. {fmt_size(hi)}" if hi < _INF else f"{fmt_size(lo)} .. inf"
        print(f"#   {span:<22} {iface.name:<6} {proto:<30} {who}", file=out)


# --------------------------------------------------------------- -d

def _ipv4_of(dev: str) -> Optional[str]:
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            res = fcntl.ioctl(s.fileno(), 0x8915,  # SIOCGIFADDR
                              struct.pack("256s", dev.encode()[:15]))
        return socket.inet_ntoa(res[20:24])
    except OSError:
        return None


def _read(path: str) -> Optional[str]:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def cma_check() -> tuple:
    """``(allowed, detail)``: can a process read a sibling's memory with
    process_vm_readv?  A forked child reads its parent, which is what two
    ranks started by one launcher need (Yama ptrace_scope 1 forbids it)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        vm_readv = libc.process_vm_readv
    except (OSError, AttributeError) as e:
        return False, f"process_vm_readv not found: {e}"

    class IoVec(ctypes.Structure):
        _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]

    vm_readv.restype = ctypes.c_ssize_t
    vm_readv.argtypes = [ctypes.c_int, ctypes.POINTER(IoVec), ctypes.c_ulong,
                         ctypes.POINTER(IoVec), ctypes.c_ulong, ctypes.c_ulong]
    probe = ctypes.create_string_buffer(b"ucxpy-cma-probe", 16)
    parent = os.getpid()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:   # child: only async-signal-safe-ish work, then _exit
        code = 0
        try:
            dst = ctypes.create_string_buffer(16)
            local = IoVec(ctypes.cast(dst, ctypes.c_void_p), 16)
            remote = IoVec(ctypes.cast(probe, ctypes.c_void_p), 16)
            n = vm_readv(parent, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)
            if n < 0:
                code = min(ctypes.get_errno(), 200) or 201
            elif dst.raw != probe.raw:
                code = 202
        except BaseException:
            code = 203
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    if code == 0:
        return True, "process_vm_readv between sibling processes works"
    if 0 < code < 200:
        return False, f"process_vm_readv failed: {errno.errorcode.get(code, code)} ({os.strerror(code)})"
    return False, f"process_vm_readv probe failed (code {code})"


def print_devices(config, out) -> None:
    print("# tcp: network interfaces", file=out)
    rows = []
    try:
        names = [n for _, n in socket.if_nameindex()]
    except OSError:
        names = []
    _, tcp_avail = load_transport("tcp", config)
    advertised = set(map(str, tcp_avail.devices)) if tcp_avail.available else set()
    for dev in names:
        ip = _ipv4_of(dev)
        state = _read(f"/sys/class/net/{dev}/operstate") or "?"
        mtu = _read(f"/sys/class/net/{dev}/mtu") or "?"
        rows.append([dev, ip or "-", state, mtu, "yes" if ip and ip in advertised else "no"])
    print(_table(rows, ["device", "ipv4", "state", "mtu", "advertised"]), file=out)
    if not tcp_avail.available:
        print(f"#   tcp not available: {tcp_avail.reason}", file=out)
    if config.tcp_iface:
        print(f"#   UCXPY_TCP_IFACE={config.tcp_iface}", file=out)

    print("\n# shm: shared memory", file=out)
    if os.path.isdir("/dev/shm"):
        st = os.statvfs("/dev/shm")
        free = st.f_bavail * st.f_frsize
        writable = os.access("/dev/shm", os.W_OK)
        print(f"#   /dev/shm  free {free / (1 << 20):.0f} MiB  writable {'yes' if writable else 'no'}",
              file=out)
    else:
        print("#   /dev/shm  missing", file=out)
    _, shm_avail = load_transport("shm", config)
    if shm_avail.available:
        print(f"#   shm available; devices: {', '.join(map(str, shm_avail.devices)) or '-'}",
              file=out)
    else:
        print(f"#   shm not available: {shm_avail.reason}", file=out)

    print("\n# CMA (single-copy cross-process reads)", file=out)
    scope = _read("/proc/sys/kernel/yama/ptrace_scope")
    print(f"#   yama ptrace_scope: {scope if scope is not None else 'n/a (Yama not enabled)'}",
          file=out)
    print(f"#   UCXPY_SHM_CMA={'y' if config.shm_cma else 'n'}", file=out)
    try:
        ok, detail = cma_check()
    except OSError as e:
        ok, detail = False, f"probe could not run: {e}"
    print(f"#   CMA permission: {'yes' if ok else 'no'} ({detail})", file=out)

    for name in ("verbs", "ofi"):
        _, avail = load_transport(name, config)
        state = ("available; devices: " + (", ".join(map(str, avail.devices)) or "-")
                 if avail.available else f"not available: {avail.reason}")
        print(f"\n# {name}: {state}", file=out)
    print_memory_domains(config, out)


def print_memory_domains(config, out) -> None:
    """The memory domain of every selected transport, from a worker's
    interfaces (what ``ucxpy.rma`` chooses by), and the atomic mode."""
    try:
        worker = Context(config).create_worker()
    except UcxpyError as e:
        print(f"\n# memory domains: no usable transport: {e}", file=out)
        return
    try:
        rows = []
        for iface in worker.ifaces:
            md = iface.md
            if md is None:
                rows.append([iface.name, "-", "active messages", "-"])
                continue
            caps = "|".join(c.name for c in type(md.caps) if c and md.caps & c) or "-"
            ways = ["load/store"] if md.caps & md.caps.RKEY_PTR else []
            if md.caps & md.caps.PUT and md.caps & md.caps.GET:
                ways.append(md.access)
            rows.append([iface.name, caps, ", ".join(ways) or "active messages",
                         ",".join(sorted(md.device_atomic_ops)) or "-"])
        print(f"\n# memory domains (UCXPY_ATOMIC_MODE={config.atomic_mode}: "
              f"{worker.rma.atomic_mode()} atomics)", file=out)
        print(_table(rows, ["transport", "caps", "peers reach memory by", "device atomics"]),
              file=out)
    finally:
        worker.close()


def print_stats(config, out) -> int:
    """What the statistics count, and those of a loopback self-test."""
    from ..trace import COUNTERS     # deferred: ucxpy.trace only for -s
    print("# Statistics (Worker.stats(); UCXPY_STATS=y prints them at exit, "
          "UCXPY_TRACE=DIR records them in each trace header)", file=out)
    print(_table(list(COUNTERS), ("counter", "meaning")), file=out)
    try:
        st = self_test(config)
    except Exception as e:
        print(f"# loopback self-test failed: {type(e).__name__}: {e}", file=out)
        return 1
    print("\n# loopback self-test on 'self' (one message each: eager short, eager copy, "
          "rendezvous)", file=out)
    print(_table(sorted(st["worker"].items()), ("counter", "value")), file=out)
    return 0


# --------------------------------------------------------------- entry point

def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="ucxpy-info", description=__doc__.split("\n\n")[0])
    p.add_argument("-c", action="store_true", help="print the effective configuration")
    p.add_argument("-f", action="store_true",
                   help="with -c: each variable's documentation too")
    p.add_argument("-e", action="store_true",
                   help="print lane and protocol per message size for local and remote peers")
    p.add_argument("-d", action="store_true", help="list devices")
    p.add_argument("-t", action="store_true", help="list transports (the default)")
    p.add_argument("-s", "--stats", action="store_true",
                   help="describe the statistics counters and show those of a loopback test")
    p.add_argument("--libucp", action="store_true",
                   help="which libucp.so.0 MPICH's libmpi loads, plain and under ucxpy-ucx")
    p.add_argument("--abi-check", metavar="LIB", action="append", default=[],
                   help="the UCX symbols shared library LIB needs that ucxpy's libucp "
                        "(and libucs, libuct, libucm) lack, and those it has that abort "
                        "when called (repeatable; exit 1 when any is missing)")
    p.add_argument("-n", type=int, default=4, metavar="RANKS",
                   help="group size for the collective table of -e (default 4)")
    args = p.parse_args(argv)
    out = sys.stdout
    if args.abi_check:
        from .ucx import print_abi_check        # deferred: only --abi-check
        return max(print_abi_check(lib, out) for lib in args.abi_check)
    config, err = load_config()
    if err:
        print(f"# configuration error: {err}; showing defaults instead", file=out)
    status = 0
    if args.c:
        print_config(config, out, full=args.f)
    if args.d:
        print_devices(config, out)
    if args.e:
        status = 1 if err else print_protocols(config, out)
        print_collectives(args.n, out)
    if args.stats:
        status = print_stats(config, out) or status
    if args.libucp:
        from .ucx import environment, resolved_libucp     # deferred: only --libucp
        print(f"libucp.so.0 as built:        {resolved_libucp() or '(no MPICH libmpi found)'}",
              file=out)
        print(f"libucp.so.0 under ucxpy-ucx: {resolved_libucp(environment())}", file=out)
    if args.t or not (args.c or args.d or args.e or args.stats or args.libucp):
        print_transports(config, out)
    out.flush()
    return status


if __name__ == "__main__":
    sys.exit(main())
