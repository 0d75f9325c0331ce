"""NIXL transfers through its UCX backend (run under ``ucxpy-ucx``: ucxpy's
libucp; under ``ucxpy-ucx --reference``: NIXL's bundled UCX).

    python nixl_xfer.py local            two agents in this process
    python nixl_xfer.py target DIR       one side of a two-process run; the
    python nixl_xfer.py initiator DIR    metadata go through files in DIR
    python nixl_xfer.py errors           bad descriptors: NIXL's error
    python nixl_xfer.py dead-target DIR  an initiator whose target is killed

``local``: a 1 MiB WRITE with a notification, a 64 KiB READ, then a WRITE
of 64 descriptors of 16 KiB (a KV cache's blocks) with one notification;
every byte checked.  ``target``/``initiator``: the same between two
processes (the initiator WRITEs and READs the target's buffer); the target
waits for the notifications and checks what arrived.  Each check prints an
``OK`` line; a failure raises (exit 1).  Buffers are numpy arrays
registered by address (DRAM)."""
from __future__ import annotations

import os
import sys
import time

import numpy as np
from nixl_cu12._api import nixl_agent, nixl_agent_config

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))), "examples"))
from nixl_kv_disagg import get_file, put_file  # noqa: E402  (the metadata through files)

TIMEOUT = float(os.environ.get("NIXL_XFER_TIMEOUT", "60"))
MIB = 1 << 20
BLOCKS, BLOCK = 64, 16 << 10


def agent(name: str):
    return nixl_agent(name, nixl_agent_config(backends=["UCX"]))


def descs(a: np.ndarray, pieces: int = 1) -> list:
    step = a.nbytes // pieces
    return [(a.ctypes.data + i * step, step, 0) for i in range(pieces)]


def register(ag, a: np.ndarray):
    return ag.register_memory([(a.ctypes.data, a.nbytes, 0, "")], "DRAM")


def wait(ag, handle, what: str) -> None:
    deadline = time.monotonic() + TIMEOUT
    while True:
        state = ag.check_xfer_state(handle)
        if state == "DONE":
            return
        if state == "ERR":
            raise RuntimeError(f"{what}: the transfer ended in an error state")
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not done after {TIMEOUT} s")
        time.sleep(0.0002)


_backlog = {}        # (agent, peer) -> notifications taken but not yet waited for


def notified(ag, peer: str, msg: bytes) -> None:
    """Wait for notification ``msg`` from ``peer``.  get_new_notifs hands
    over everything that arrived: a later one taken along (a READ needs no
    target, so "written" and "done" may come in one batch) is kept for the
    wait that wants it."""
    backlog = _backlog.setdefault((id(ag), peer), [])
    deadline = time.monotonic() + TIMEOUT
    while msg not in backlog:
        backlog += ag.get_new_notifs().get(peer, [])
        if msg in backlog:
            break
        if time.monotonic() > deadline:
            raise TimeoutError(f"no notification {msg!r} from {peer} after {TIMEOUT} s")
        time.sleep(0.0002)
    backlog.remove(msg)


def xfer(ag, op, local, remote, peer, notif=b""):
    h = ag.initialize_xfer(op, ag.get_xfer_descs(local, "DRAM"),
                           ag.get_xfer_descs(remote, "DRAM"), peer, notif)
    state = ag.transfer(h)
    if state == "ERR":
        raise RuntimeError(f"{op}: transfer() returned ERR")
    wait(ag, h, op)
    ag.release_xfer_handle(h)


def local() -> None:
    a, b = agent("A"), agent("B")
    src = np.arange(MIB, dtype=np.uint8) * 7 + 3
    dst = np.zeros(MIB, np.uint8)
    kv = np.random.default_rng(1).integers(0, 255, BLOCKS * BLOCK, dtype=np.uint8)
    cache = np.zeros_like(kv)
    # (registered before the metadata are exchanged: they carry the keys)
    regs = [(a, register(a, src)), (b, register(b, dst)), (a, register(a, kv)),
            (b, register(b, cache))]
    a.add_remote_agent(b.get_agent_metadata())
    b.add_remote_agent(a.get_agent_metadata())

    xfer(a, "WRITE", descs(src), descs(dst), "B", b"write-1MiB")
    notified(b, "A", b"write-1MiB")
    assert np.array_equal(src, dst), "WRITE: the bytes differ"
    print("OK write 1 MiB with a notification", flush=True)

    dst[:64 << 10] = 0
    src[:64 << 10] = 0xA5
    xfer(b, "READ", descs(dst[:64 << 10]), descs(src[:64 << 10]), "A")
    assert (dst[:64 << 10] == 0xA5).all(), "READ: the bytes differ"
    print("OK read 64 KiB", flush=True)

    xfer(a, "WRITE", descs(kv, BLOCKS), descs(cache, BLOCKS), "B", b"kv")
    notified(b, "A", b"kv")
    assert np.array_equal(kv, cache), "the KV blocks differ"
    print(f"OK write {BLOCKS} blocks of {BLOCK >> 10} KiB with one notification", flush=True)
    for ag, r in regs:
        ag.deregister_memory(r)


def target(d: str) -> None:
    ag = agent("target")
    buf = np.zeros(4 * MIB, np.uint8)
    buf[3 * MIB:] = 0x5A                        # what the initiator READs
    register(ag, buf)
    put_file(os.path.join(d, "target.pid"), str(os.getpid()).encode())
    put_file(os.path.join(d, "target.meta"), ag.get_agent_metadata())
    put_file(os.path.join(d, "target.descs"),
         ag.get_serialized_descs(ag.get_xfer_descs(descs(buf), "DRAM")))
    ag.add_remote_agent(get_file(os.path.join(d, "initiator.meta")))
    put_file(os.path.join(d, "target.ready"), b"")   # (both know each other)
    notified(ag, "initiator", b"written")
    want = (np.arange(3 * MIB, dtype=np.uint64) % 251).astype(np.uint8)
    assert np.array_equal(buf[:3 * MIB], want), "the WRITE's bytes differ"
    print("OK target: 3 MiB written, notified", flush=True)
    notified(ag, "initiator", b"done")
    put_file(os.path.join(d, "target.done"), b"")
    print("OK target: the initiator is done", flush=True)


def initiator(d: str) -> None:
    ag = agent("initiator")
    src = (np.arange(3 * MIB, dtype=np.uint64) % 251).astype(np.uint8)
    back = np.zeros(MIB, np.uint8)
    register(ag, src)
    register(ag, back)
    put_file(os.path.join(d, "initiator.meta"), ag.get_agent_metadata())
    ag.add_remote_agent(get_file(os.path.join(d, "target.meta")))
    remote = ag.deserialize_descs(get_file(os.path.join(d, "target.descs")))
    get_file(os.path.join(d, "target.ready"))
    addr, length, dev = remote[0] if hasattr(remote, "__getitem__") else (None, None, None)
    assert length == 4 * MIB, f"remote descriptor {remote!r}"
    xfer(ag, "WRITE", descs(src), [(addr, 3 * MIB, dev)], "target", b"written")
    print("OK initiator: 3 MiB written", flush=True)
    xfer(ag, "READ", descs(back), [(addr + 3 * MIB, MIB, dev)], "target")
    assert (back == 0x5A).all(), "the READ's bytes differ"
    print("OK initiator: 1 MiB read", flush=True)
    ag.send_notif("target", b"done")
    # (a notification still in flight when its process ends is lost, on
    # NIXL's bundled UCX too, which cancels it: the target says it arrived)
    get_file(os.path.join(d, "target.done"))


def errors_() -> None:
    """Bad input gets NIXL's error, never a crash: a transfer from memory no
    agent registered, and one past the end of the remote registration."""
    a, b = agent("A"), agent("B")
    src, dst = np.ones(64 << 10, np.uint8), np.zeros(64 << 10, np.uint8)
    stray = np.ones(4096, np.uint8)
    register(a, src)
    register(b, dst)
    a.add_remote_agent(b.get_agent_metadata())
    for what, local, remote in (
            ("unregistered local memory", descs(stray), descs(dst[:4096])),
            ("past the remote registration", descs(src), [(dst.ctypes.data + 4096,
                                                           dst.nbytes, 0)])):
        try:
            xfer(a, "WRITE", local, remote, "B")
        except (RuntimeError, Exception) as e:   # noqa: BLE001 - NIXL's own error types
            if isinstance(e, TimeoutError):
                raise
            print(f"OK {what}: {type(e).__name__}", flush=True)
        else:
            raise AssertionError(f"{what}: the transfer succeeded")
    xfer(a, "WRITE", descs(src), descs(dst), "B")         # (and the agents still work)
    assert (dst == 1).all()
    print("OK a good transfer after them", flush=True)


def dead_target(d: str) -> None:
    """The initiator of a two-process run whose target was killed after the
    metadata exchange: the WRITE ends in NIXL's error state, never a hang."""
    import signal
    ag = agent("initiator")
    src = np.ones(MIB, np.uint8)
    register(ag, src)
    put_file(os.path.join(d, "initiator.meta"), ag.get_agent_metadata())
    ag.add_remote_agent(get_file(os.path.join(d, "target.meta")))
    remote = ag.deserialize_descs(get_file(os.path.join(d, "target.descs")))
    get_file(os.path.join(d, "target.ready"))
    addr, _length, dev = remote[0]
    xfer(ag, "WRITE", descs(src), [(addr, MIB, dev)], "target")   # (connected, working)
    pid = int(get_file(os.path.join(d, "target.pid")))
    os.kill(pid, signal.SIGKILL)
    time.sleep(0.5)
    try:
        for _ in range(20):                                      # until the loss shows
            xfer(ag, "WRITE", descs(src), [(addr, MIB, dev)], "target")
            time.sleep(0.1)
    except TimeoutError:
        raise
    except Exception as e:                                       # noqa: BLE001 - NIXL's
        print(f"OK a WRITE to a killed target fails: {type(e).__name__}: {e}", flush=True)
        return
    raise AssertionError("WRITEs to a killed target kept succeeding")


if __name__ == "__main__":
    mode = sys.argv[1]
    if mode == "local":
        local()
    elif mode == "target":
        target(sys.argv[2])
    elif mode == "initiator":
        initiator(sys.argv[2])
    elif mode == "errors":
        errors_()
    elif mode == "dead-target":
        dead_target(sys.argv[2])
    else:
        sys.exit(f"unknown mode {mode}")
