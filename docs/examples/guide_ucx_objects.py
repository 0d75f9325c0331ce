"""run: python docs/examples/guide_ucx_objects.py

The user guide's tour of ucxpy's UCX-like objects: a context, two workers
that connect by address (here in one process; across processes the address
bytes and the key travel out of band), tagged messages with a mask, a
matched probe, an active message and one-sided RMA with atomics.
"""
import time

import numpy as np

import ucxpy

# one job key for both sides (peers in other processes share it out of band,
# or through UCXPY_AUTH_KEY / UCXPY_AUTH_KEY_FILE)
key = ucxpy.auth.generate_key()
ctx = ucxpy.Context(ucxpy.Config.from_env(auth_key=key))
server, client = ctx.create_worker(), ctx.create_worker()
ep = client.connect(server.address_bytes)   # lazy: the lane is chosen on first use


def drive(done, timeout=5.0):
    """Nothing moves without progress; this process plays both sides, so it
    progresses both workers until ``done()``."""
    deadline = time.monotonic() + timeout
    while not done():
        client.progress()
        server.progress()
        if time.monotonic() > deadline:
            raise ucxpy.TimeoutError("the example did not complete")


def wait(req):
    drive(lambda: req.done)
    return req.wait()                       # the result, or the request's error


# tagged messages: a receive matches (source, tag & tag_mask)
buf = np.empty(4, np.int64)
req = server.tag_recv_nb(buf, tag=0x1200, tag_mask=0xFF00, source=ucxpy.ANY_SOURCE)
wait(ep.tag_send_nb(np.arange(4), tag=0x1234))
info = wait(req)                            # a TagInfo(source, tag, length)
assert (info.tag, info.length) == (0x1234, 32) and (buf == np.arange(4)).all()

# a matched probe takes the message off the unexpected queue (MPI's Mprobe)
wait(ep.tag_send_nb(b"probed", tag=7))
msg = None
while msg is None:                          # tag_probe_nb progresses the server once
    client.progress()
    msg = server.tag_probe_nb(7, remove=True)
out = bytearray(6)
wait(server.tag_recv_message_nb(out, msg))
assert out == b"probed"

# active messages: the handler runs from the target's progress
got = []
server.set_am_handler(5, lambda m: got.append((bytes(m.header), bytes(m.data))))
wait(ep.am_send_nb(5, b"hdr", b"payload"))
drive(lambda: got)
assert got == [(b"hdr", b"payload")]

# RMA: the server maps memory and gives its remote key to the client
mh = server.mem_map(length=1 << 20)         # registered (shared) memory
rkey = ep.unpack_rkey(mh.pack_rkey())
wait(ep.put_nb(b"abcdefgh", mh.address + 64, rkey))
wait(ep.flush_nb())
assert bytes(mh.buf[64:72]) == b"abcdefgh"
peek = bytearray(8)
wait(ep.get_nb(peek, mh.address + 64, rkey))
assert peek == b"abcdefgh"
old = wait(ep.atomic_fetch_nb("add", 5, mh.address, rkey, size=8))
old2 = wait(ep.atomic_fetch_nb("cswap", 9, mh.address, rkey, size=8, compare=5))
assert (old, old2) == (0, 5) and int.from_bytes(mh.buf[:8], "little") == 9

mh.unmap()
for w in (client, server):
    w.close()
print("guide_ucx_objects OK")
