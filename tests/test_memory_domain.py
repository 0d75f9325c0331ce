"""Memory domains in the transport contract (``MemoryDomain`` in
ucxpy/transports/base.py) and RMA's choice by their capabilities only:

* what every built-in transport's domain declares and does (self, shm, tcp
  without one, ofi; verbs where a device exists);
* a test transport ("devtoy": the toy transport of examples/ plus a memory
  domain with one-sided put/get and device atomics, all in this process)
  that RMA drives through the contract alone: put/get go through the lane,
  atomics through the device or the target's CPU as ``UCXPY_ATOMIC_MODE``
  says, and a mode that cannot be honoured raises.
"""
from __future__ import annotations

import os
import sys

import numpy as np
import pytest

import ucxpy
from ucxpy import atomics, context
from ucxpy.config import Config
from ucxpy.errors import ConfigError, RemoteAccessError
from ucxpy.transports.base import MdCaps, MdRemoteKey, MemoryDomain

from conftest import transport_available

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "examples"))
from toy_transport import ToyEndpoint, ToyInterface  # noqa: E402

pytestmark = pytest.mark.timeout(60)


# -- a transport with a memory domain of its own ----------------------------------

class DevMd(MemoryDomain):
    """Registers by address; peers (in this process) write it directly."""

    caps = MdCaps.REG | MdCaps.PUT | MdCaps.GET | MdCaps.ATOMIC32 | MdCaps.ATOMIC64
    device_atomic_ops = frozenset({"add", "swap", "cswap"})

    def __init__(self):
        self.name = "devtoy"
        self.live = set()

    def mem_reg(self, view, alloc=None):
        reg = atomics.address_of(view)
        self.live.add(reg)
        return reg

    def mem_dereg(self, reg):
        self.live.discard(reg)

    def rkey_pack(self, reg):
        return reg.to_bytes(8, "little")

    def rkey_unpack(self, packed, base, length):
        return MdRemoteKey(transport_key=bytes(packed))


class DevEndpoint(ToyEndpoint):
    def put(self, local, remote_addr, rkey, on_complete):
        self.iface.ops.append("put")
        atomics.memmove(atomics.pointer(remote_addr), bytes(local), len(local))
        return True

    def get(self, local, remote_addr, rkey, on_complete):
        self.iface.ops.append("get")
        n = len(local)
        local[:] = atomics.buffer(atomics.pointer(remote_addr), n)[:]
        self.iface.later.append(lambda: on_complete(None))     # completes from progress
        return False

    def atomic(self, op, size, remote_addr, rkey, value, compare, on_complete):
        self.iface.ops.append(f"atomic_{op}")
        old = atomics.apply(remote_addr, atomics.OPS[op], size, value, compare)
        self.iface.later.append(lambda: on_complete(None, old))


class DevInterface(ToyInterface):
    name = "devtoy"

    def __init__(self, owner, config):
        super().__init__(owner, config)
        self.md = DevMd()
        self.ops = []
        self.later = []

    def _ep(self, peer_id):
        if peer_id not in self.eps:
            self.eps[peer_id] = DevEndpoint(self, peer_id)
        return self.eps[peer_id]

    def progress(self):
        done, self.later = self.later, []
        for fn in done:
            fn()
        return len(done) + super().progress()


@pytest.fixture(autouse=True, scope="module")
def devtoy():
    """Registered for this module's tests only (other files list transports)."""
    context.register_transport("devtoy", f"{__name__}:DevInterface")
    yield
    context.TRANSPORTS.pop("devtoy", None)


def pair(tls, **cfg):
    ctx = ucxpy.Context(Config.from_env({}, tls=tls, **cfg))
    a, b = ctx.create_worker(0), ctx.create_worker(1)
    ep = a.connect(b.address)
    b.connect(a.address)
    return a, b, ep


def wait(workers, req):
    for _ in range(100000):
        if req.test():
            return req.wait(0)
        for w in workers:
            w.progress()
    raise AssertionError("RMA did not complete")


def lane_ops(worker):
    return next(i for i in worker.ifaces if i.name == "devtoy").ops


@pytest.mark.parametrize("mode", ["cpu", "device", "auto"])
def test_rma_uses_the_lane_through_the_contract(mode):
    """put/get: the lane's one-sided ops whatever the mode; atomics: the
    device's in device mode, else the target's CPU (active messages); auto
    is cpu here since the self lane has no device atomics."""
    a, b, ep = pair("devtoy", atomic_mode=mode)
    try:
        mh = b.mem_map(np.zeros(8, np.uint64))
        key = ep.unpack_rkey(mh.pack_rkey())
        assert key.mode == "rdma" and key.md_key.transport_key is not None
        assert a.rma.atomic_mode() == ("device" if mode == "device" else "cpu")
        wait((a, b), ep.put_nb(np.uint64(5).tobytes(), mh.address, key))
        back = bytearray(8)
        wait((a, b), ep.get_nb(back, mh.address, key))
        assert int.from_bytes(back, "little") == 5
        old = wait((a, b), ep.atomic_fetch_nb("add", 3, mh.address, key, size=8))
        old32 = wait((a, b), ep.atomic_fetch_nb("cswap", 9, mh.address + 8, key, size=4,
                                                compare=0))
        assert (old, old32) == (5, 0)
        words = np.frombuffer(mh.buf, np.uint64)
        assert words[0] == 8 and np.frombuffer(mh.buf, np.uint32)[2] == 9
        device = ["atomic_add", "atomic_cswap"] if mode == "device" else []
        assert lane_ops(a) == ["put", "get"] + device
        assert not a.rma.outstanding()
        mh.unmap()
    finally:
        a.close()
        b.close()


def test_device_mode_refuses_what_the_device_cannot_do():
    a, b, ep = pair("devtoy", atomic_mode="device")
    try:
        mh = b.mem_map(np.zeros(2, np.uint64))
        key = ep.unpack_rkey(mh.pack_rkey())
        with pytest.raises(RemoteAccessError, match="no 64-bit device atomic 'xor'"):
            ep.atomic_fetch_nb("xor", 1, mh.address, key)
        assert lane_ops(a) == []
    finally:
        a.close()
        b.close()


@pytest.mark.skipif(not transport_available("shm"), reason="shm unavailable")
def test_device_mode_on_a_lane_without_device_atomics_raises():
    """shm maps the memory (CPU atomics): device mode must not mix them in."""
    a, b, ep = pair("shm", atomic_mode="device")
    try:
        mh = b.mem_map(length=64)
        key = ep.unpack_rkey(mh.pack_rkey())
        assert key.mode == "mapped"
        with pytest.raises(RemoteAccessError, match="UCXPY_ATOMIC_MODE=device"):
            ep.atomic_fetch_nb("add", 1, mh.address, key)
        wait((a, b), ep.put_nb(b"fine", mh.address, key))     # put/get unaffected
        assert bytes(mh.buf[:4]) == b"fine"
    finally:
        a.close()
        b.close()


def test_atomic_mode_is_a_declared_setting():
    assert Config.from_env({"UCXPY_ATOMIC_MODE": "Device"}).atomic_mode == "device"
    assert Config.from_env({}).atomic_mode == "auto"
    with pytest.raises(ConfigError, match="not one of auto, cpu, device"):
        Config.from_env({"UCXPY_ATOMIC_MODE": "gpu"})


# -- every built-in transport's memory domain -------------------------------------

BUILTIN = ["self", "shm", "tcp", "ofi"]


@pytest.mark.parametrize("tl", BUILTIN)
def test_builtin_memory_domains(tl):
    """Each domain does what its caps say: ALLOC gives mappable memory,
    REG + rkey_pack give bytes its own rkey_unpack accepts, RKEY_PTR keys
    map; tcp has no domain (RMA over it is active messages)."""
    if tl != "self" and not transport_available(tl):
        pytest.skip(f"{tl} unavailable")
    ctx = ucxpy.Context(Config.from_env({}, tls=tl))
    w = ctx.create_worker(0)
    try:
        iface = next(i for i in w.ifaces if i.name == tl)
        md = iface.md
        if tl == "tcp":
            assert md is None
            return
        assert md.name == tl and isinstance(md.caps, MdCaps) and md.access in ("rdma", "cma")
        assert md.caps & MdCaps.REG
        view = memoryview(bytearray(4096))
        alloc = None
        if md.caps & MdCaps.ALLOC:
            alloc = md.mem_alloc(8192)
            assert alloc.view.nbytes == 8192 and not alloc.view.readonly and alloc.address
            view = alloc.view
        reg = md.mem_reg(view, alloc)
        packed = md.rkey_pack(reg)
        assert isinstance(packed, bytes)
        base = atomics.address_of(view)
        rk = md.rkey_unpack(packed, base, view.nbytes)
        if tl == "self" or alloc is not None:       # in this process / a shared segment
            assert rk.address and rk.valid()
            mapped = atomics.buffer(atomics.pointer(rk.address), 4)
            view[:4] = b"md!!"
            assert bytes(mapped) == b"md!!"
        elif rk is not None:
            assert rk.transport_key and md.caps & (MdCaps.PUT | MdCaps.GET)
        md.mem_dereg(reg)
        if rk is not None and rk.address:
            assert not rk.valid()                    # a stale key is detected
        if alloc is not None:
            md.mem_free(alloc)
    finally:
        w.close()


def test_rma_names_no_transport_and_owns_no_memory():
    """The core's RMA chooses by memory-domain capabilities: no /dev/shm
    segments, no cross-memory attach, no transport module in ucxpy/rma.py."""
    import ast
    import inspect
    from ucxpy import rma
    src = inspect.getsource(rma)
    tree = ast.parse(src)
    imported = {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    imported |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert imported <= {"__future__", "itertools", "typing", "", "wire", "atomics", "buffers",
                        "errors", "request", "rkey", "transports.base", "_native",
                        "_dp"}, imported
    for word in ("shmfile", "cma_", "process_vm", "/dev/shm", "pack_local_key"):
        assert word not in src.replace("cross-memory", ""), word


@pytest.mark.parametrize("tls", ["self,shm", "self,tcp"])
def test_mem_map_at_a_fixed_address(tls):
    """``mem_map(length, address=)`` (UCP_MEM_MAP_FIXED, OpenSHMEM's symmetric
    heap): the allocation is also mapped at exactly that address, which is
    the region's address for peers; a range in use is refused, not replaced;
    unmapping releases the range."""
    import ctypes
    import mmap
    a, b, ep = pair(tls)
    try:
        probe = mmap.mmap(-1, 1 << 20)              # find a free, aligned range
        free = ctypes.addressof(ctypes.c_char.from_buffer(probe))
        probe.close()
        mh = b.mem_map(length=10000, address=free)
        assert mh.address == free and mh.length >= 10000
        at = (ctypes.c_char * 16).from_address(free + 4096)
        at[:5] = b"fixed"                          # a store at the fixed address ...
        assert bytes(mh.buf[4096:4101]) == b"fixed"  # ... is the region's memory
        rkey = ep.unpack_rkey(mh.pack_rkey())
        wait([a, b], ep.put_nb(b"remote", free + 100, rkey))
        assert bytes(at.__class__.from_address(free + 100)[:6]) == b"remote"
        got = bytearray(5)
        wait([a, b], ep.get_nb(got, free + 4096, rkey))
        assert got == b"fixed"
        with pytest.raises(OSError):               # in use: never replaced
            b.mem_map(length=4096, address=free)
        mh.unmap()
        again = b.mem_map(length=4096, address=free)  # released
        again.unmap()
        with pytest.raises(OSError):
            b.mem_map(length=4096, address=free + 1)  # not page-aligned
    finally:
        a.close()
        b.close()
