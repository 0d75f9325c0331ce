"""The native paths of tagged messages (``UCXPY_FASTPATH``): the data
plane's matcher and shm inbox consumer (native/dp: ``Worker.recv_poller``,
``Worker.tag_try_recv``), tcp's socket fast path, the native sends and
rendezvous offers, and mpi_shim's calls in C: real two-rank jobs, with them
and without them (the Python reference path), the same data checked both
ways and the path taken counted (``Worker.fast_recvs``, the data plane's
counters)."""
from __future__ import annotations

import os
import re

import pytest

import ucxpy
from conftest import PROGS, run_job, transport_available

pytestmark = pytest.mark.timeout(300)


def _job(prog, fastpath, tls="shm", **env):
    if not transport_available("shm"):
        pytest.skip("shm unavailable")
    return run_job(["python", os.path.join(PROGS, prog)], 2, timeout=200,
                   env={"UCXPY_TLS": tls, "UCXPY_FASTPATH": fastpath, **env})


@pytest.mark.parametrize("fastpath", ["y", "n"])
def test_fast_and_python_paths_give_the_same_results(fastpath):
    proc = _job("fastpath.py", fastpath)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = re.findall(r"FASTPATH OK (\d) (\d+) (\d+)", proc.stdout)
    assert len(rows) == 2, proc.stdout
    for rank, pingpong, total in rows:
        if fastpath == "n":
            assert int(total) == 0
        else:
            # ping-pong receives take it (how many arrive within the C
            # call's spin depends on timing); the cases after them are
            # right whichever path they take (their data is checked)
            assert int(pingpong) > 0, rows


@pytest.mark.parametrize("fastpath", ["y", "n"])
def test_mpi_shim_blocking_receives(fastpath):
    """mpi_shim's Recv (masked tags, Ssend acknowledgements, ANY_TAG,
    status) on the fast path and off it."""
    proc = _job("mpi_fastpath.py", fastpath)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = re.findall(r"MPI-FASTPATH OK \d (\d+) (\d+)", proc.stdout)
    assert len(rows) == 2, proc.stdout
    counts = [int(r[0]) for r in rows]
    # how many arrive within the C call's spin depends on timing: some must
    assert all(c > 0 for c in counts) if fastpath == "y" else counts == [0, 0], counts
    # every eager send takes the native push when it is on (1000 + 5 of rank 0's)
    sends = [int(r[1]) for r in rows]
    assert min(sends) >= 1000 if fastpath == "y" else sends == [0, 0], sends


@pytest.mark.parametrize("fastpath", ["y", "n"])
def test_mpi_windows_on_both_paths(fastpath):
    """mpi_shim's windows over shm: Put/Get and the word atomics on mapped
    memory by the native calls (y) and by Python (n); the program checks
    every value, signs and result shapes included."""
    proc = _job("mpi_rma.py", fastpath)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert len(re.findall(r"MPI-RMA OK \d+ ok", proc.stdout)) == 2, proc.stdout


KINDS = ("SEND", "RECV", "PUT", "GET", "FLUSH", "FETCH_AND_OP", "COMPARE_AND_SWAP", "ISEND",
         "IRECV", "WAITALL")


@pytest.mark.parametrize("fastpath,tls,level", [("y", "shm", "multiple"), ("n", "shm", "multiple"),
                                                ("y", "shm", "single"), ("y", "tcp", "multiple")])
def test_mpi_shim_calls_in_c_and_in_python(fastpath, tls, level):
    """mpi_shim.accel: Send, Recv, Isend, Irecv, Waitall, Put, Get, Flush,
    Fetch_and_op and Compare_and_swap take their common case in C, the rest
    (and everything with the fast path off) in the Python methods; the
    program checks values and error classes either way, with the library
    lock (THREAD_MULTIPLE, ucxpy's ApiLock) and without it."""
    proc = _job("mpi_accel.py", fastpath, tls=tls, MPI4PY_RC_THREAD_LEVEL=level)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = re.findall(r"MPI-ACCEL OK (\d) ((?:[A-Z_]+=\d+ ?)+)", proc.stdout)
    assert len(rows) == 2, proc.stdout
    counts = {int(r): dict(kv.split("=") for kv in rest.split()) for r, rest in rows}
    mapped = {c.pop("MAPPED") for c in counts.values()}
    assert all(set(c) == set(KINDS) for c in counts.values()), counts
    # the window's targets the C calls reach: mapped shm memory, with the fast path
    assert mapped == ({"1"} if fastpath == "y" and tls == "shm" else {"0"}), mapped
    done = {k: int(counts[0][k]) for k in KINDS}      # rank 0 runs every kind
    if fastpath == "n":
        assert set(done.values()) == {0}, done
    elif tls == "tcp":                      # no mapped memory: RMA data by Python
        assert done["PUT"] == done["GET"] == done["FETCH_AND_OP"] == 0, done
        assert all(done[k] > 0 for k in ("SEND", "RECV", "ISEND", "IRECV", "WAITALL")), done
    else:
        assert all(v > 0 for v in done.values()), done


@pytest.mark.parametrize("fastpath", ["y", "n"])
def test_tcp_lanes_take_the_fast_path_too(fastpath):
    """The same program over tcp (native/tcp_recv.c): same data, and the
    receives that find a whole frame in the socket take it there."""
    if not transport_available("tcp"):
        pytest.skip("tcp unavailable")
    proc = _job("fastpath.py", fastpath, tls="tcp")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    totals = [int(r[2]) for r in re.findall(r"FASTPATH OK (\d) (\d+) (\d+)", proc.stdout)]
    assert len(totals) == 2, proc.stdout
    assert all(t > 0 for t in totals) if fastpath == "y" else totals == [0, 0], totals


@pytest.mark.parametrize("prog,marker", [("tag_suite.py", "TAG-SUITE OK"),
                                         ("mpi_p2p.py", "MPI-P2P OK")])
def test_suites_with_the_python_protocol_at_every_size(prog, marker):
    """The protocol table's "Python" entry at every size
    (``UCXPY_PROTO_PYTHON=all``): the data plane matches nothing itself and
    hands every eager message to the Python reference protocol, which
    matches in the same (C) queues; the suites pass."""
    proc = _job(prog, "y", TAG_SUITE_MAX=str(1 << 20), UCXPY_PROTO_PYTHON="all")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.stdout.count(marker) == 2, proc.stdout[-3000:]


@pytest.mark.parametrize("prog,marker", [("tag_suite.py", "TAG-SUITE OK"),
                                         ("mpi_p2p.py", "MPI-P2P OK")])
def test_suites_with_ranks_mixing_both_implementations(prog, marker):
    """One job, rank 0 on the native data plane and rank 1 on the Python
    reference (tests/progs/mixed_native.py): the tag and MPI point-to-point
    suites pass, every message crossing between the two."""
    if not transport_available("shm"):
        pytest.skip("shm unavailable")
    proc = run_job(["python", os.path.join(PROGS, "mixed_native.py"),
                    os.path.join(PROGS, prog)], 2, timeout=200,
                   env={"UCXPY_TLS": "shm", "TAG_SUITE_MAX": str(1 << 20)})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert sorted(re.findall(r"MIXED-NATIVE (\d) ([yn])", proc.stdout)) == \
        [("0", "y"), ("1", "n")], proc.stdout[-3000:]
    assert proc.stdout.count(marker) == 2, proc.stdout[-3000:]


@pytest.mark.parametrize("prog,marker", [("tag_suite.py", "TAG-SUITE OK"),
                                         ("mpi_p2p.py", "MPI-P2P OK")])
def test_suites_on_the_python_reference_path(prog, marker):
    """The tag and MPI point-to-point suites, which run on the fast path in
    the rest of the tests, also pass with it off."""
    proc = _job(prog, "n", TAG_SUITE_MAX=str(1 << 20))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.stdout.count(marker) == 2, proc.stdout[-3000:]


# -- in one process: two workers over shm, every branch of the decision ----------

@pytest.fixture
def shm_pair():
    if not transport_available("shm"):
        pytest.skip("shm unavailable")
    from conftest import Pair
    p = Pair("shm")
    a, b = p.workers
    p.eps[0][1].tag_send(b"wire", 99)            # a -> b carries a's wire-up
    assert b.tag_recv(bytearray(4), 99, source=0, timeout=10).length == 4
    yield p, a, b, p.eps[0][1]
    p.close()


def test_an_exact_eager_receive_takes_the_fast_path(shm_pair):
    p, a, b, ep = shm_pair
    before = b.fast_recvs
    ep.tag_send(b"fast!", 1)
    buf = bytearray(8)
    info = b.tag_recv(buf, 1, source=0, timeout=10)
    assert (info.source, info.tag, info.length, bytes(buf[:5])) == (0, 1, 5, b"fast!")
    assert b.fast_recvs == before + 1


def test_another_frame_first_goes_the_python_way_in_order(shm_pair):
    p, a, b, ep = shm_pair
    before = b.fast_recvs
    ep.tag_send(b"one", 1)
    ep.tag_send(b"two", 2)
    x, y = bytearray(3), bytearray(3)
    assert b.tag_recv(y, 2, source=0, timeout=10).length == 3 and bytes(y) == b"two"
    assert b.fast_recvs == before                 # "one" was at the head of the ring
    assert b.matcher.unexpected_depth() == 1
    assert b.tag_recv(x, 1, source=0, timeout=10).length == 3 and bytes(x) == b"one"
    assert b.fast_recvs == before                 # from the unexpected queue


def test_a_posted_wildcard_keeps_the_python_path(shm_pair):
    p, a, b, ep = shm_pair
    before = b.fast_recvs
    wild = b.tag_recv_nb(bytearray(8), 7, 0xFF)    # a masked receive matches tag 7 too
    ep.tag_send(b"to the wildcard", 7)
    with pytest.raises(ucxpy.TruncationError):
        wild.wait(10)
    ep.tag_send(b"first", 7)
    any_tag = bytearray(8)
    wild2 = b.tag_recv_nb(any_tag, 0, 0)           # any tag, posted first: it must win
    ep.tag_send(b"x", 7)
    got = bytearray(5)
    assert b.tag_recv(got, 7, source=0, timeout=10).length == 1 and got[:1] == b"x"
    assert wild2.wait(10).length == 5 and any_tag[:5] == b"first"
    assert b.fast_recvs == before


def test_truncation_raises_on_the_python_path(shm_pair):
    p, a, b, ep = shm_pair
    ep.tag_send(bytes(16), 3)
    with pytest.raises(ucxpy.TruncationError):
        b.tag_recv(bytearray(8), 3, source=0, timeout=10)


def test_rendezvous_and_empty_messages(shm_pair):
    p, a, b, ep = shm_pair
    before = b.fast_recvs
    ep.tag_send(b"", 4)
    assert b.tag_recv(bytearray(4), 4, source=0, timeout=10).length == 0
    assert b.fast_recvs == before + 1
    import numpy as np
    big = np.arange(1 << 18, dtype=np.uint32)
    req = ep.tag_send_nb(big, 5)
    out = np.zeros_like(big)
    # the sender serves the rendezvous from its progress: both workers are
    # driven here (tests/progs/fastpath.py does a blocking one, 2 processes)
    recv = b.tag_recv_nb(out, 5, source=0)
    assert b.recv_poller(recv)() is False                # the RTS is no eager frame
    p.wait(req, recv)
    assert recv.result.length == big.nbytes
    assert np.array_equal(out, big) and b.fast_recvs == before + 1


def test_no_fast_path_with_a_progress_thread_or_when_off(shm_pair):
    p, a, b, ep = shm_pair
    before = b.fast_recvs
    b.config.fastpath = False
    ep.tag_send(b"off", 6)
    assert b.tag_recv(bytearray(3), 6, source=0, timeout=10).length == 3
    b.config.fastpath = True
    b.start_progress_thread()
    try:
        ep.tag_send(b"thread", 6)
        assert b.tag_recv(bytearray(6), 6, source=0, timeout=10).length == 6
    finally:
        b.stop_progress_thread()
    assert b.fast_recvs == before


# -- the send side: Endpoint.tag_send_nb through the lane's send_eager ------------

def test_an_eager_send_takes_the_native_push(shm_pair):
    p, a, b, ep = shm_pair
    before = a.fast_sends
    import numpy as np
    for i, msg in enumerate([b"bytes", bytearray(b"bytearray"), memoryview(b"view"),
                             np.arange(3, dtype=np.float64)]):
        assert ep.tag_send_nb(msg, 20 + i).done
        want = bytes(memoryview(msg).cast("B"))
        got = bytearray(len(want))
        b.config.fastpath = False               # the Python path decodes the same frame
        try:
            assert b.tag_recv(got, 20 + i, source=0, timeout=10).length == len(want)
        finally:
            b.config.fastpath = True
        assert bytes(got) == want
    assert a.fast_sends == before + 4


def test_what_the_native_push_refuses_goes_the_python_way(shm_pair):
    p, a, b, ep = shm_pair
    import numpy as np
    before = a.fast_sends
    with pytest.raises(ucxpy.InvalidBuffer):
        ep.tag_send_nb(np.arange(8)[::2], 1)     # not contiguous: as the Python path says
    with pytest.raises(ucxpy.InvalidBuffer):
        ep.tag_send_nb("text", 1)
    big = np.arange(ep.rndv_thresh, dtype=np.uint8)   # rendezvous: not eager
    req = ep.tag_send_nb(big, 2)
    out = np.zeros_like(big)
    recv = b.tag_recv_nb(out, 2, source=0)
    p.wait(req, recv)
    assert np.array_equal(out, big)
    assert a.fast_sends == before


def test_a_full_ring_queues_in_order(shm_pair):
    """Once the ring is full the Python path queues; later sends must not
    overtake the queue through the native push."""
    p, a, b, ep = shm_pair
    import numpy as np
    chunk = np.zeros(ep.short_thresh or 64, np.uint8)
    n = 0
    tep = ep.transport_endpoint()
    while not tep.pending and n < 100000:        # fill the peer's ring
        chunk[:8] = np.frombuffer(n.to_bytes(8, "little"), np.uint8)
        ep.tag_send_nb(chunk, 9)
        n += 1
    assert tep.pending
    queued_before = a.fast_sends
    for _ in range(3):
        chunk[:8] = np.frombuffer(n.to_bytes(8, "little"), np.uint8)
        ep.tag_send_nb(chunk, 9)
        n += 1
    assert a.fast_sends == queued_before          # behind the queue, not into the ring
    got = np.zeros_like(chunk)
    for i in range(n):
        recv = b.tag_recv_nb(got, 9, source=0)
        p.wait(recv)
        assert int.from_bytes(got[:8].tobytes(), "little") == i


def test_tracing_or_a_progress_thread_keeps_the_python_send(shm_pair):
    p, a, b, ep = shm_pair
    before = a.fast_sends
    a.start_progress_thread()
    try:
        ep.tag_send(b"thread", 6)
    finally:
        a.stop_progress_thread()
    assert b.tag_recv(bytearray(6), 6, source=0, timeout=10).length == 6
    assert a.fast_sends == before


def test_a_non_contiguous_receive_buffer_is_reported_as_on_the_python_path(shm_pair):
    p, a, b, ep = shm_pair
    import numpy as np
    ep.tag_send(b"12345678", 8)
    with pytest.raises(ucxpy.InvalidBuffer):
        b.tag_recv(np.zeros(16, np.uint8)[::2], 8, source=0, timeout=10)


# -- mpi_shim's blocking small collectives, run straight ----------------------------

@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_straight_collectives_interoperate_with_the_generators(n):
    """Even ranks take coll.*_now (plain arrays), odd ranks the generator
    schedules (buffer specs): same rounds, tags and bytes, results checked
    (Bcast from every root, Allreduce of several types, IN_PLACE, a
    non-commutative op, rendezvous-sized vectors, Alltoall)."""
    if not transport_available("shm"):
        pytest.skip("shm unavailable")
    proc = run_job(["python", os.path.join(PROGS, "mpi_coll_direct.py")], n, timeout=200)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = {int(r): int(k) for r, k in re.findall(r"COLL-DIRECT OK (\d+) (\d+)", proc.stdout)}
    assert sorted(rows) == list(range(n)), proc.stdout
    for r, k in rows.items():
        assert (k > 0) if r % 2 == 0 else (k == 0), rows


def test_straight_collectives_with_the_fast_path_off():
    if not transport_available("shm"):
        pytest.skip("shm unavailable")
    proc = run_job(["python", os.path.join(PROGS, "mpi_coll_direct.py")], 3, timeout=200,
                   env={"UCXPY_FASTPATH": "n"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.stdout.count("COLL-DIRECT OK") == 3


def test_a_window_of_receives_completes_in_one_wait(shm_pair):
    """One wait's native poll gives the frames waiting in the inbox to the
    receives posted for them (the data plane matches and copies them in C);
    a frame that does not fit its receive is handed to the Python path,
    which reports the truncation, and the frames behind it still go to
    theirs, in order."""
    p, a, b, ep = shm_pair
    before = _dp_counts(b)
    bufs = [bytearray(4) for _ in range(5)]
    reqs = [b.tag_recv_nb(x, 11, source=0) for x in bufs]
    for i in range(3):
        ep.tag_send(b"w%03d" % i, 11)
    ep.tag_send(b"too long", 11)                 # does not fit reqs[3]
    ep.tag_send(b"last", 11)
    reqs[0].wait(10)
    p.drive(lambda: all(r.done for r in reqs), 10)
    assert [bytes(x) for x in bufs[:3]] == [b"w000", b"w001", b"w002"]
    with pytest.raises(ucxpy.TruncationError):
        reqs[3].wait(10)
    assert reqs[4].wait(10).length == 4 and bytes(bufs[4]) == b"last"
    after = _dp_counts(b)
    assert after["tag_expected"] - before["tag_expected"] == 4
    assert after["tag_handoff"] - before["tag_handoff"] == 1


def test_sizes_the_python_protocol_runs_are_handed_to_it():
    """UCXPY_PROTO_PYTHON (the protocol table's "Python" entries): eager
    messages of those sizes go to the Python protocol, in order with the
    others, which the data plane takes; each receive gets its own message
    whichever side delivered it."""
    if not transport_available("shm"):
        pytest.skip("shm unavailable")
    from conftest import Pair
    p = Pair("shm", proto_python=((100, 199), (1000, 1000)))
    try:
        a, b = p.workers
        ep = p.eps[0][1]
        ep.tag_send(b"wire", 99)                   # a -> b carries a's wire-up
        assert b.tag_recv(bytearray(4), 99, source=0, timeout=10).length == 4
        sizes = [10, 150, 1000, 999, 199, 200, 0]
        bufs = [bytearray(1024) for _ in sizes]
        before = _dp_counts(b)["tag_eager"]
        reqs = [b.tag_recv_nb(x, 7, source=0) for x in bufs]
        for i, n in enumerate(sizes):
            ep.tag_send(bytes([i]) * n, 7)
        p.wait(*reqs)
        assert [r.result.length for r in reqs] == sizes
        assert all(bytes(x[:n]) == bytes([i]) * n for i, (x, n) in enumerate(zip(bufs, sizes)))
        assert _dp_counts(b)["tag_eager"] - before == 4            # 10, 999, 200, 0
        got = bytearray(200)
        ep.tag_send(b"x" * 150, 8)
        assert b.tag_recv(got, 8, source=0, timeout=10).length == 150   # (not try_recv's)
        assert _dp_counts(b)["tag_eager"] - before == 4
    finally:
        p.close()


def test_a_wait_takes_its_message_in_the_data_plane(shm_pair):
    """A wait on a posted receive polls the inbox natively (recv_poller):
    the message is matched and copied in C, whatever else is posted (here
    a masked receive the message does not match), and the receive leaves
    the matcher."""
    p, a, b, ep = shm_pair
    masked = b.tag_recv_nb(bytearray(3), 0x100, tag_mask=0xFF00, source=0)   # not for 21
    r = b.tag_recv_nb(bytearray(3), 21, source=0)
    assert r.handle and b.matcher.posted_count() == 2
    ep.tag_send(b"one", 21)
    before = _dp_counts(b)["tag_expected"]
    assert b.recv_poller(r) is not None
    assert r.wait(10).length == 3 and bytes(r.buf) == b"one"
    assert _dp_counts(b)["tag_expected"] == before + 1 and not r.handle
    assert masked.cancel() and b.matcher.posted_count() == 0


def test_the_data_plane_completes_a_window_and_a_callback_runs_once(shm_pair):
    """The receives of a window complete as the Python path would complete
    them (result, state, matcher), a completion callback included; another
    tag's frame in between waits as an unexpected message, in C."""
    p, a, b, ep = shm_pair
    before = _dp_counts(b)
    bufs = [bytearray(4) for _ in range(6)]
    reqs = [b.tag_recv_nb(x, 21, source=0) for x in bufs]
    seen = []
    reqs[3].add_done_callback(lambda r: seen.append(r.result.length))
    for i in range(4):
        ep.tag_send(b"d%03d" % i, 21)
    ep.tag_send(b"tag!", 22)                     # another tag before the rest
    ep.tag_send(b"d004", 21)
    ep.tag_send(b"d005", 21)
    reqs[0].wait(10)
    p.drive(lambda: all(r.done for r in reqs), 10)
    assert seen == [4]
    for i, r in enumerate(reqs):
        info = r.result
        assert (info.source, info.tag, info.length, r.exc) == (0, 21, 4, None)
        assert bytes(bufs[i]) == b"d%03d" % i and r.wait(10) is info
    after = _dp_counts(b)
    assert after["tag_expected"] - before["tag_expected"] == 6
    assert after["tag_unexpected"] - before["tag_unexpected"] == 1
    assert b.matcher.counts() == (0, 1)
    other = bytearray(4)
    assert b.tag_recv(other, 22, source=0, timeout=10).length == 4 and bytes(other) == b"tag!"
    assert b.matcher.counts() == (0, 0)
    assert not reqs[0].cancel()                    # completed: nothing to cancel


def test_a_posted_receive_is_named_by_its_handle_until_it_matches(shm_pair):
    """tag_recv_nb posts into the data plane's matcher: the request's handle
    names its C receive while it is posted; cancel withdraws it (once); an
    unexpected message already there completes the receive at once."""
    from ucxpy.tag import FULL_MASK, RecvRequest
    p, a, b, ep = shm_pair
    m = b.matcher
    r = b.tag_recv_nb(bytearray(8), 31, FULL_MASK, 0)
    assert type(r) is RecvRequest and r.handle and not r.done
    masked = b.tag_recv_nb(bytearray(8), 32, 0xFF, 0)
    import numpy as np
    wide = b.tag_recv_nb(np.zeros(2, np.int64), 33, FULL_MASK, 0)
    assert wide.buf.format == "B" and wide.capacity == 16
    anywhere = b.tag_recv_nb(bytearray(8), 34, FULL_MASK, ucxpy.ANY_SOURCE)
    with pytest.raises(ucxpy.InvalidBuffer):
        b.tag_recv_nb(b"read-only", 35, FULL_MASK, 0)
    assert m.posted_count() == 4
    for x in (r, masked, wide, anywhere):
        assert x.cancel() and not x.handle and not x.cancel()
    assert m.posted_count() == 0
    ep.tag_send(b"early", 36)
    p.drive(lambda: m.unexpected_depth() == 1, 10)
    got = bytearray(5)
    r = b.tag_recv_nb(got, 36, FULL_MASK, 0)
    assert r.done and r.result.length == 5 and bytes(got) == b"early" and not r.handle


def test_the_native_frame_calls_check_their_arguments(shm_pair):
    """The data plane's per-message calls (a Lane's eager, rts and get_ack;
    the tcp eager path's send and receive; Inbox.try_recv) take their
    arguments without an argument tuple (METH_FASTCALL) and refuse a wrong
    count, a wrong type, an int out of range, a read-only or non-contiguous
    buffer, before touching a ring or a socket (fd -1 here)."""
    from ucxpy import _dp
    p, a, b, ep = shm_pair
    inbox = _shm_iface(b).native
    with pytest.raises(TypeError):
        inbox.try_recv(1, 0, 0, bytearray(8))                   # 4 of 5
    with pytest.raises(BufferError):
        inbox.try_recv(1, 0, 0, b"read-only", 0)
    with pytest.raises(BufferError):
        inbox.try_recv(1, 0, 0, memoryview(bytearray(8))[::2], 0)
    assert inbox.try_recv(1, 0, 0, bytearray(8), 0) == (-1, 0)   # (an empty inbox)
    ep.tag_send(b"x", 1)                                         # (the lane exists)
    lane, w = ep._fast_lane, a.dp
    assert lane is not None
    with pytest.raises(TypeError):
        lane.eager("worker", 0, b"x")
    with pytest.raises(TypeError):
        lane.eager(w, 0)                                         # 2 of 3
    with pytest.raises(BufferError):
        lane.eager(w, 0, memoryview(bytearray(8))[::2])
    with pytest.raises(TypeError):
        lane.rts(w, 1, 2)                                        # 3 of 4
    with pytest.raises(BufferError):
        lane.rts(w, 1, 2, memoryview(bytearray(8))[::2])
    with pytest.raises(TypeError):
        lane.get_ack(w, b"k", 0, bytearray(8), 8)                # 5 of 6
    with pytest.raises(BufferError):
        lane.get_ack(w, b"k", 0, b"read-only", 8, 1)
    assert lane.get_ack(w, b"not a key", 0, bytearray(8), 8, 1) == -1
    assert lane.eager(w, 0, b"x" * 9, 8) == -1                   # over the limit
    assert lane.eager(w, 0, b"", -1) == -1                       # (rndv_thresh 0: none)
    with pytest.raises(OverflowError):
        _dp.tcp_eager_send(w, 1 << 40, 1, 0, b"x", 8)
    with pytest.raises(ValueError):
        _dp.tcp_eager_send(w, -1, 256, 0, b"x", 8)               # not an am id
    assert _dp.tcp_eager_send(w, -1, 1, 0, b"x" * 9, 8) == -100
    assert _dp.tcp_eager_send(w, -1, 1, 0, b"", -1) == -100
    assert _dp.tcp_eager_send(w, -1, 1, 0, b"x", 8) == -1        # (a bad descriptor)
    with pytest.raises(BufferError):
        _dp.tcp_eager_recv(w, -1, 1, 0, 0, memoryview(bytearray(8))[::2], 0)
    with pytest.raises(TypeError):
        _dp.tcp_eager_recv(w, -1, 1, 0, 0, bytearray(8), 0, 0)  # 8 of 7
    assert _dp.tcp_eager_recv(w, -1, 1, 0, 0, bytearray(8), 0) == (-1, 0, None)
    assert len(_dp.tcp_eager_head(2, 7, 5)) == 24


def test_bucketed_receives_are_matched_in_c_and_notified(shm_pair):
    """A bucketed receive (mpi_shim's) is matched in C like an exact one: a
    window of messages with exactly its tag, and a message whose tag
    differs in the masked-off bits (a synchronous send's sequence), which
    the matcher's notify then hears of, once, after completion."""
    from ucxpy.tag import FULL_MASK
    p, a, b, ep = shm_pair
    m = b.matcher
    saved = (m.bucket_mask, m.notify_mask, m.notify)
    seen = []
    mask = FULL_MASK ^ 0xFF00
    m.bucket_mask, m.notify_mask, m.notify = mask, 0xFF00, lambda r: seen.append((r, r.done))
    try:
        before = _dp_counts(b)["tag_expected"]
        bufs = [bytearray(4) for _ in range(3)]
        reqs = [b.tag_recv_nb(x, 0x71, mask, 0) for x in bufs]
        for i in range(3):
            ep.tag_send(b"b%03d" % i, 0x71)
        reqs[0].wait(10)
        p.drive(lambda: all(r.done for r in reqs), 10)
        assert not seen and [bytes(x) for x in bufs] == [b"b000", b"b001", b"b002"]
        r = b.tag_recv_nb(bytearray(4), 0x72, mask, 0)
        ep.tag_send(b"sync", 0x72 | 0x0300)
        assert r.wait(10).tag == 0x0372 and seen == [(r, True)]
        assert _dp_counts(b)["tag_expected"] == before + 4 and m.posted_count() == 0
    finally:
        m.bucket_mask, m.notify_mask, m.notify = saved


def test_tag_info_in_c_is_its_python_reference():
    """ucxpy.TagInfo (the data plane's C type, which its completions make
    without a Python frame) behaves as PyTagInfo, its reference: fields,
    iteration, equality with tuples and with each other, repr, keywords."""
    from ucxpy.request import PyTagInfo, TagInfo
    for args in ((3, 1 << 63, 8), (0, 0, 0), (-1, 0x2A, 5)):
        c, py = TagInfo(*args), PyTagInfo(*args)
        assert (c.source, c.tag, c.length) == (py.source, py.tag, py.length) == args
        assert tuple(c) == tuple(py) == args and c == py and py == c and c == args
        assert repr(c) == repr(py)
        assert not (c != args) and c != (9, 9, 9) and c != 5
    assert TagInfo(source=1, tag=2, length=3) == (1, 2, 3)
    with pytest.raises(TypeError):
        TagInfo(1, 2)
    with pytest.raises(TypeError):
        hash(TagInfo(1, 2, 3))
    info = TagInfo(1, 2, 3)
    info.length = 4                                     # (as the Python class allows)
    assert info.length == 4


def test_a_request_class_keeps_a_layer_s_fields_in_the_request(shm_pair):
    """``tag_recv_nb(..., request_class=C)`` (mpi_shim's PostedRecv, UCP's
    request_size) posts a C, which the data plane completes as a
    RecvRequest; a class that is not a RecvRequest is refused."""
    from ucxpy.tag import FULL_MASK, RecvRequest

    class Mine(RecvRequest):
        __slots__ = ("mine",)

    p, a, b, ep = shm_pair
    before = _dp_counts(b)["tag_expected"]
    bufs = [bytearray(4) for _ in range(4)]
    reqs = [b.tag_recv_nb(x, 41, FULL_MASK, 0, Mine) for x in bufs]
    assert all(type(r) is Mine for r in reqs)
    for k, r in enumerate(reqs):
        r.mine = k
    for i in range(4):
        ep.tag_send(b"m%03d" % i, 41)
    p.wait(*reqs)
    assert _dp_counts(b)["tag_expected"] == before + 4
    assert [r.mine for r in reqs] == [0, 1, 2, 3]
    assert [bytes(x) for x in bufs] == [b"m000", b"m001", b"m002", b"m003"]
    ep.tag_send(b"late", 42)                       # an unexpected message first
    p.drive(lambda: b.matcher.unexpected_depth() == 1, 10)
    r = b.tag_recv_nb(bytearray(4), 42, FULL_MASK, 0, Mine)
    assert type(r) is Mine and r.done and r.result.length == 4
    for cls in (dict, ucxpy.Request):
        with pytest.raises(TypeError):
            b.tag_recv_nb(bytearray(4), 43, FULL_MASK, 0, cls)
    assert b.matcher.posted_count() == 0


# -- tcp: the frame is read from the socket itself (native/tcp_recv.c) ------------

@pytest.fixture
def tcp_pair():
    if not transport_available("tcp"):
        pytest.skip("tcp unavailable")
    from conftest import Pair
    p = Pair("tcp")
    a, b = p.workers
    r = b.tag_recv_nb(bytearray(4), 99, source=0)
    p.wait(p.eps[0][1].tag_send_nb(b"wire", 99), r)       # connected both ways
    yield p, a, b, p.eps[0][1]
    p.close()


def _arrived(p, b, ep_tcp, nbytes):
    """Wait until ``nbytes`` are readable on b's socket from a."""
    import fcntl
    import struct
    import termios
    tep = next(iter(b.endpoints[0].incoming))
    deadline = __import__("time").monotonic() + 10
    while True:
        p.workers[0].progress()
        n = struct.unpack("i", fcntl.ioctl(tep.fd, termios.FIONREAD, b"\0" * 4))[0]
        if n >= nbytes or __import__("time").monotonic() > deadline:
            return tep, n


def test_tcp_an_exact_eager_receive_is_read_from_the_socket(tcp_pair):
    p, a, b, ep = tcp_pair
    before = b.fast_recvs
    ep.tag_send(b"fast!", 1)
    _arrived(p, b, ep, 24 + 5)
    buf = bytearray(8)
    info = b.tag_recv(buf, 1, source=0, timeout=10)
    assert (info.source, info.tag, info.length, bytes(buf[:5])) == (0, 1, 5, b"fast!")
    assert b.fast_recvs == before + 1
    assert buf[5:] == bytes(3)                      # nothing past the message written


def test_tcp_another_frame_first_is_delivered_in_order(tcp_pair):
    """A small receive reads the socket with one plain recv: a frame for
    another receive read first goes to the Python path (the spill, parsed at
    once), and the receives still match in order."""
    p, a, b, ep = tcp_pair
    before = b.fast_recvs
    ep.tag_send(b"one", 1)
    ep.tag_send(b"two", 2)
    _arrived(p, b, ep, 2 * (24 + 3))
    y = bytearray(3)
    assert b.tag_recv(y, 2, source=0, timeout=10).length == 3 and bytes(y) == b"two"
    assert b.matcher.unexpected_depth() == 1        # "one", read first, spilled
    x = bytearray(3)
    assert b.tag_recv(x, 1, source=0, timeout=10).length == 3 and bytes(x) == b"one"
    assert b.fast_recvs == before + 1               # "two", read from the socket


def test_tcp_bytes_read_behind_a_message_wait_for_the_next_progress(tcp_pair):
    """A receive whose buffer is larger than its message reads the frames
    behind it too: they wait in the connection's reader (not matched to the
    receive that is finishing) and the next progress pass delivers them, in
    order; a sleep in between ends at once (wait_fds)."""
    import select
    p, a, b, ep = tcp_pair
    for i in range(3):
        ep.tag_send(bytes([65 + i]) * 4, 7)
    _arrived(p, b, ep, 3 * (24 + 4))
    tep_b = next(iter(b.endpoints[0].incoming))
    buf = bytearray(100)
    n, got = b._stream_recv(tep_b, 7, (1 << 64) - 1, buf, 0)
    assert (n, got, bytes(buf[:4])) == (4, 7, b"AAAA")
    assert b.matcher.unexpected_depth() == 0        # the rest waits, unparsed
    iface = tep_b.iface
    assert tep_b in iface._spilled
    assert select.select(iface.wait_fds(), (), (), 0)[0], "a sleep must end at once"
    assert b._stream_recv(tep_b, 7, (1 << 64) - 1, buf, 0) == (-1, 0)
    rest = []
    for _ in range(2):
        r = bytearray(4)
        b.tag_recv(r, 7, source=0, timeout=10)
        rest.append(bytes(r))
    assert rest == [b"BBBB", b"CCCC"] and not iface._spilled


@pytest.mark.parametrize("size,cut", [(200, 24), (200, 100), (3000, 24), (3000, 1500),
                                      (40000, 24), (40000, 1500)])
def test_tcp_a_frame_half_arrived_is_left_for_later(tcp_pair, size, cut):
    """Only part of a frame is in the socket: the fast path completes
    nothing and writes nothing into the buffer past what is the message's
    own; once the rest arrives the receive completes with every byte.  A
    frame of up to 32 KiB is read as soon as its head is there and, the rest
    being late, what was read goes to the connection's reader (the spill),
    so the Python path finishes it; a larger one is left in the socket until
    FIONREAD says it is whole (native/dp/tcp.c)."""
    import struct
    p, a, b, ep = tcp_pair
    tep_a = ep.transport_endpoint()
    payload = bytes(i % 251 for i in range(size))
    from ucxpy.wire import AmId
    am = int(AmId.TAG_EAGER)
    frame = struct.pack("<HBBHxxQQ", 0xC5A7, am, 0, 8, len(payload), 6) + payload
    assert tep_a.sock.send(frame[:cut]) == cut
    tep_b, n = _arrived(p, b, ep, cut)
    assert n == cut
    buf = bytearray(size + 56)
    read_early = 24 + size <= 32 * 1024 + 24
    assert b._stream_recv(tep_b, 6, (1 << 64) - 1, buf, 100) == \
        ((-2, 0) if read_early else (-1, 0))
    assert all(x in (0, payload[i]) for i, x in enumerate(buf[:size])) and buf[size:] == bytes(56)
    sent = cut
    while sent < len(frame):
        sent += tep_a.sock.send(frame[sent:])
    if read_early:
        assert b.tag_recv(buf, 6, source=0, timeout=10).length == size
    else:
        _arrived(p, b, ep, len(frame))
        assert b._stream_recv(tep_b, 6, (1 << 64) - 1, buf, 0) == (size, 6)
    assert bytes(buf[:size]) == payload and buf[size:] == bytes(56)


def test_tcp_with_tls_takes_the_python_path():
    if not transport_available("tcp"):
        pytest.skip("tcp unavailable")
    from conftest import Pair
    try:
        p = Pair("tcp", tcp_tls=True)
    except Exception as e:          # no openssl here
        pytest.skip(f"TLS unavailable: {e}")
    try:
        a, b = p.workers
        ep = p.eps[0][1]
        r = b.tag_recv_nb(bytearray(6), 1, source=0)
        p.wait(ep.tag_send_nb(b"sealed", 1), r)        # the handshakes are done
        p.wait(ep.tag_send_nb(b"sealed", 2))
        tep = next(iter(b.endpoints[0].incoming))
        assert tep.stream_in is None and tep.stream_out is None    # not lent
        assert p.eps[0][1]._fast_stream is None
        buf = bytearray(6)
        assert b.tag_recv(buf, 2, source=0, timeout=10).length == 6 and buf == b"sealed"
        assert b.fast_recvs == 0
    finally:
        p.close()


def test_tcp_eager_sends_take_the_native_send_and_partial_frames_queue(tcp_pair):
    """Eager sends go out by one sendmsg from C (native/dp/tcp.c) while
    the socket takes them; once it is full, the rest of a frame it took only
    part of, and everything after, queue in order: every byte arrives."""
    import numpy as np
    p, a, b, ep = tcp_pair
    before = a.fast_sends
    msgs = [np.full(16000, i % 251, dtype=np.uint8) for i in range(400)]
    sends = [ep.tag_send_nb(m, 7) for m in msgs]          # b does not read meanwhile
    assert a.fast_sends > before
    out = [np.zeros(16000, dtype=np.uint8) for _ in msgs]
    recvs = [b.tag_recv_nb(o, 7, source=0) for o in out]
    p.wait(*sends, *recvs)
    for i, o in enumerate(out):
        assert (o == i % 251).all(), i


def _mixed(fastpaths):
    """A conftest.Pair of shm workers whose data plane is on or off each
    (``fastpaths``): one Context per setting."""
    from conftest import Pair
    p = Pair.__new__(Pair)
    ctxs = {fp: ucxpy.Context(ucxpy.Config.from_env({}, tls="shm", fastpath=fp))
            for fp in set(fastpaths)}
    p.workers = [ctxs[fp].create_worker(worker_id=i) for i, fp in enumerate(fastpaths)]
    assert [w.dp is not None for w in p.workers] == list(fastpaths)
    p.eps = [[w.connect(o.address_bytes) for o in p.workers] for w in p.workers]
    return p


def _shm_iface(w):
    return next(i for i in w.ifaces if i.name == "shm")


def _dp_counts(w):
    """What the worker's data plane executed (native/dp: tag.c's counters)."""
    return w.dp.counters()


def test_the_native_dispatch_takes_eager_messages_for_posted_receives(shm_pair):
    """The data plane's inbox consumer (native/dp/inbox.c), called by shm's
    progress, gives each eager message at the front of the inbox to the
    receive ``TagMatcher.match_posted`` would give it (exact or bucketed,
    the earlier posted first, a wildcard in posting order) and completes it
    as the Python path would; a receive with a callback too, and what it
    does not deliver itself (truncation) is handed to the Python path."""
    p, a, b, ep = shm_pair
    iface = _shm_iface(b)
    m = b.matcher
    m.bucket_mask, saved = 0xFFFF_0000, m.bucket_mask
    try:
        # exact and bucketed receives, posted before the messages
        bufs = [bytearray(8) for _ in range(4)]
        exact = b.tag_recv_nb(bufs[0], 0x10001, source=0)
        bucket = b.tag_recv_nb(bufs[1], 0x10000, 0xFFFF_0000, source=0)
        exact2 = b.tag_recv_nb(bufs[2], 0x10001, source=0)
        other = b.tag_recv_nb(bufs[3], 0x20005, source=0)
        before = iface.native_rx
        for data, tag in ((b"e1", 0x10001), (b"b", 0x10007), (b"e2", 0x10001), (b"o", 0x20005)):
            ep.tag_send(data, tag)
        # e1: the exact receive (posted before the bucket); 0x10007: the
        # bucket; e2: exact2 (the bucket is gone); o: the other tag
        p.wait(exact, bucket, exact2, other)
        assert iface.native_rx - before == 4
        got = [(r.result.source, r.result.tag, r.result.length) for r in
               (exact, bucket, exact2, other)]
        assert got == [(0, 0x10001, 2), (0, 0x10007, 1), (0, 0x10001, 2), (0, 0x20005, 1)]
        assert [bytes(x[:n]) for x, (_, _, n) in zip(bufs, got)] == [b"e1", b"b", b"e2", b"o"]
        assert m.counts() == (0, 0) and all(r.exc is None for r in (exact, bucket))

        # a bucket posted before the exact one takes a message of the exact tag
        bk = b.tag_recv_nb(bytearray(4), 0x30000, 0xFFFF_0000, source=0)
        ex = b.tag_recv_nb(bytearray(4), 0x30003, source=0)
        ep.tag_send(b"1st", 0x30003)
        ep.tag_send(b"2nd", 0x30003)
        p.wait(bk, ex)
        assert (bytes(bk.buf[:3]), bytes(ex.buf[:3])) == (b"1st", b"2nd")

        # a wildcard, a callback: matched and delivered in C too; truncation:
        # handed to the Python path, which reports it
        before = iface.native_rx
        wild = b.tag_recv_nb(bytearray(8), 0, 0)
        ep.tag_send(b"w", 50)
        p.wait(wild)
        seen = []
        cb = b.tag_recv_nb(bytearray(8), 51, source=0)
        cb.add_done_callback(lambda r: seen.append(r.result.length))
        ep.tag_send(b"cb", 51)
        p.wait(cb)
        short = b.tag_recv_nb(bytearray(2), 52, source=0)
        ep.tag_send(b"too long", 52)
        with pytest.raises(ucxpy.TruncationError):
            p.wait(short)
        assert seen == [2] and wild.result.tag == 50 and iface.native_rx == before + 3
    finally:
        m.bucket_mask = saved


def test_unexpected_messages_are_queued_and_received_natively(shm_pair):
    """An eager message no receive is posted for waits in the data plane's
    unexpected queue (its payload copied in C), and a receive posted later
    that one matches takes it: the oldest match from its source, under its
    mask, wildcard sources and notifications included, the request complete
    when posted; truncation reported.  A rendezvous offer no receive is
    posted for is queued by the Python path in the same queue, in order."""
    p, a, b, ep = shm_pair
    iface = _shm_iface(b)
    m = b.matcher
    big = bytes(range(256)) * 20
    before = iface.native_rx
    for data, tag in ((b"one", 41), (big, 42), (b"two", 41), (b"x7", 0x107)):
        ep.tag_send(data, tag)
    p.drive(lambda: m.unexpected_depth() == 4, 10)
    assert iface.native_rx - before == 4
    probe = m.find_unexpected(0, 42, ucxpy.tag.FULL_MASK, False)
    assert (probe.source, probe.tag, probe.length, probe.rts) == (0, 42, 5120, None)
    bufs = [bytearray(8), bytearray(8000), bytearray(8), bytearray(8)]
    got = [b.tag_recv_nb(bufs[1], 42, source=0),            # behind an older message
           b.tag_recv_nb(bufs[0], 41, source=0),            # the oldest of two
           b.tag_recv_nb(bufs[2], 41, source=0),
           b.tag_recv_nb(bufs[3], 0x100, 0xF00, source=0)]  # masked: 0x107
    assert all(r.done and r.exc is None for r in got)
    assert [(r.result.source, r.result.tag, r.result.length) for r in got] == \
        [(0, 42, 5120), (0, 41, 3), (0, 41, 3), (0, 0x107, 2)]
    assert (bytes(bufs[1][:5120]), bytes(bufs[0][:3]), bytes(bufs[2][:3]),
            bytes(bufs[3][:2])) == (big, b"one", b"two", b"x7")
    assert m.counts() == (0, 0)

    # truncation, a wildcard source, a notification
    ep.tag_send(b"other", 43)
    p.drive(lambda: m.unexpected_depth() == 1, 10)
    with pytest.raises(ucxpy.TruncationError):
        b.tag_recv_nb(bytearray(2), 43, source=0).wait(10)
    ep.tag_send(b"w", 45)
    p.drive(lambda: m.unexpected_depth() == 1, 10)
    assert b.tag_recv_nb(bytearray(4), 45).wait(10).length == 1     # ANY_SOURCE
    seen = []
    m.notify_mask, m.notify = 0xF000, seen.append
    try:
        ep.tag_send(b"n", 0x1046)
        p.drive(lambda: m.unexpected_depth() == 1, 10)
        r = b.tag_recv_nb(bytearray(4), 0x46, 0xFFF, source=0)
        assert r.wait(10).tag == 0x1046 and seen == [r]
    finally:
        m.notify_mask, m.notify = 0, None
    # a rendezvous offer (b's own connection to a made first, for its ATS)
    # behind an eager message of the same tag: both queued, in order
    p.eps[1][0].tag_send(b"back", 46)
    assert a.tag_recv(bytearray(4), 46, source=1, timeout=10).length == 4
    payload = bytes(range(256)) * (ep.rndv_thresh // 256 + 1)
    ep.tag_send(b"first", 47)
    s = ep.tag_send_nb(payload, 47)
    p.drive(lambda: m.unexpected_depth() == 2, 10)
    first = bytearray(8)
    assert b.tag_recv(first, 47, source=0, timeout=10).length == 5
    out = bytearray(len(payload))
    r = b.tag_recv_nb(out, 47, source=0)
    p.wait(s, r)
    assert bytes(out) == payload and r.result.length == len(payload)
    s = ep.tag_send_nb(payload, 48)
    p.drive(lambda: m.unexpected_depth() == 1, 10)
    short = b.tag_recv_nb(bytearray(16), 48, source=0)
    with pytest.raises(ucxpy.TruncationError):
        p.wait(short)
    p.wait(s)
    assert m.counts() == (0, 0)


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
@pytest.mark.parametrize("fastpath", [True, False, (False, False, True), (True, True, False)])
def test_receives_get_their_messages_in_order_whatever_arrived_first(seed, fastpath):
    """Two sources send 14 messages each (eager of 0, 7 and 5000 bytes, and
    rendezvous) with a few tags; the receiver posts one receive per message,
    the sources interleaved at random, with progress passes at random
    between them, so that some messages arrive before their receive (the
    unexpected queue, native or not) and some after.  Receive i of a source
    names message i's tag exactly, or under a mask that also matches others
    (MPI's order: it must still get message i).  The native paths (fastpath
    on) and the pure-Python path both give every receive its message, and
    so do workers mixing them (a tuple: each worker's setting)."""
    import random
    from conftest import Pair
    from ucxpy.tag import FULL_MASK
    if not transport_available("shm"):
        pytest.skip("shm unavailable")
    rng = random.Random(seed)
    p = Pair("shm", n=3, fastpath=fastpath) if type(fastpath) is bool else _mixed(fastpath)
    try:
        c = p.workers[2]
        big = p.eps[0][2].rndv_thresh
        sends, msgs = [], {0: [], 1: []}
        for src in (0, 1):
            ep = p.eps[src][2]
            for i in range(14):
                tag, n = rng.choice([1, 2, 0x101, 0x102]), rng.choice([0, 7, 5000, big])
                payload = bytes([src * 64 + i]) * n
                sends.append(ep.tag_send_nb(payload, tag))
                msgs[src].append((tag, payload))
        order = [0] * 14 + [1] * 14
        rng.shuffle(order)
        posted, nxt = [], {0: 0, 1: 0}
        for src in order:
            for _ in range(rng.choice([0, 0, 1, 3])):
                c.progress()
            if rng.random() < 0.3:
                p.workers[src].progress()
            i = nxt[src]
            nxt[src] += 1
            tag, payload = msgs[src][i]
            mask = rng.choice([FULL_MASK, FULL_MASK ^ 0x100, FULL_MASK ^ 0x103, 0])
            buf = bytearray(len(payload) + rng.choice([0, 16]))
            posted.append((src, i, buf, c.tag_recv_nb(buf, tag, mask, source=src)))
        p.wait(*sends, *(r for *_, r in posted))
        for src, i, buf, r in posted:
            tag, payload = msgs[src][i]
            assert (r.result.source, r.result.tag, r.result.length) == \
                (src, tag, len(payload)), (src, i)
            assert bytes(buf[:len(payload)]) == payload, (src, i)
        assert c.matcher.counts() == (0, 0)
    finally:
        p.close()


def test_no_native_dispatch_while_tracing(shm_pair):
    p, a, b, ep = shm_pair
    from ucxpy.trace import Recorder
    iface = _shm_iface(b)
    b.tr = Recorder(b, b.config)
    try:
        before = iface.native_rx
        r = b.tag_recv_nb(bytearray(4), 61, source=0)
        ep.tag_send(b"t", 61)
        p.wait(r)
        assert iface.native_rx == before and r.result.length == 1
    finally:
        b.tr = None


def test_the_native_rendezvous_offers_reads_and_acknowledges(shm_pair):
    """A tagged send of ``rndv_thresh`` bytes or more goes out by the
    data plane's shm rendezvous (``Lane.rts`` packs the RTS and the shm key
    in C); the receiver matches it in the data plane's matcher, reads the
    sender's buffer by CMA and answers ATS in one C call (``Lane.get_ack``),
    posted first or unexpected.  What that must not take (a split-sized offer, truncation)
    goes the Python protocol's way."""
    import numpy as np
    p, a, b, ep = shm_pair
    size = ep.rndv_thresh
    assert size < a.config.rndv_split_thresh

    def exchange(tag, nbytes=size, post_first=True, out=None):
        data = np.arange(nbytes, dtype=np.uint8) ^ tag
        out = np.zeros(nbytes, np.uint8) if out is None else out
        recv = b.tag_recv_nb(out, tag, source=0) if post_first else None
        send = ep.tag_send_nb(data, tag)
        if recv is None:
            b.progress()
            recv = b.tag_recv_nb(out, tag, source=0)
        p.wait(send, recv)
        assert recv.result.length == nbytes and np.array_equal(out[:nbytes], data)
        return send, recv

    exchange(1)                                # the first one probes CMA (Python)
    offers = a.fast_offers
    started = []
    start_recv = b.rndv.start_recv
    b.rndv.start_recv = lambda *args: started.append(args[0].size) or start_recv(*args)
    exchange(2)
    exchange(3, post_first=False)
    assert a.fast_offers == offers + 2 and started == []
    assert not a.rndv.sends and not b.rndv.recvs

    # truncation: the Python path reports it, and the sender completes
    data = np.ones(size, np.uint8)
    short = b.tag_recv_nb(np.zeros(size // 2, np.uint8), 4, source=0)
    send = ep.tag_send_nb(data, 4)
    with pytest.raises(ucxpy.TruncationError):
        p.wait(short)
    p.wait(send)
    assert not a.rndv.sends

    # an offer of the split size goes the Python way (split or get), from
    # the inbox and from the unexpected queue
    big = a.config.rndv_split_thresh
    exchange(5, nbytes=big)
    exchange(6, nbytes=big, post_first=False)
    if _shm_iface(b).split_floor <= big:       # (an interface that splits)
        assert started == [big, big]
    assert not a.rndv.sends and not b.rndv.recvs


def test_the_native_offer_registers_only_what_it_sends(shm_pair):
    """``RendezvousProtocol.offer`` registers a send under the next id with a
    plain Request and has the data plane push its offer (``Lane.rts``,
    native/dp/rndv.c); a lane that cannot take a frame now (closed while
    Python has frames queued, or still connecting) declines it and nothing
    stays registered (the caller then takes the Python path)."""
    import numpy as np
    from ucxpy.rndv import SendState
    p, a, b, ep = shm_pair
    ep.tag_send(b"x", 1)                                         # (the lanes exist)
    p.eps[1][0].tag_send(b"y", 2)
    assert a.tag_recv(bytearray(1), 2).length == 1
    lane, rndv = ep._fast_lane, a.rndv
    before = dict(rndv.sends)
    lane.open = False
    try:
        assert rndv.offer(ep, memoryview(bytearray(64)), 5, lane) is None
    finally:
        ep._tep._lane_sync()
    assert lane.open and rndv.sends == before
    data = np.arange(4096, dtype=np.uint8)
    offers = a.dp.counters()["rndv_offer"]
    req = rndv.offer(ep, memoryview(data), 77, lane)
    assert type(req) is ucxpy.Request and not req.done
    assert a.dp.counters()["rndv_offer"] == offers + 1
    (sid, s), = [(k, v) for k, v in rndv.sends.items() if k not in before]
    assert type(s) is SendState and s.req is req and s.ep is ep and s.busy == 0
    assert s.reading and s.mv.nbytes == 4096 and sid == max(rndv.sends)
    out = np.zeros_like(data)
    r = b.tag_recv_nb(out, 77, source=0)
    p.wait(req, r)
    assert np.array_equal(out, data) and sid not in rndv.sends and req.exc is None
    assert b.dp.counters()["rndv_get"] >= 1 and b.dp.counters()["rndv_ats"] >= 1


def test_native_rendezvous_with_cma_refused_falls_back_to_frames(shm_pair):
    """A peer CMA cannot reach (``cma_ok`` False) gets data frames: the
    native get declines that offer and the Python protocol moves it."""
    import numpy as np
    p, a, b, ep = shm_pair
    iface = _shm_iface(b)
    p.eps[1][0].tag_send(b"x", 1)               # (b's lane back to a exists)
    assert p.workers[0].tag_recv(bytearray(1), 1).length == 1
    for tep in iface._eps:
        tep._cma_ok = False
        if tep.native_lane is not None:
            tep.native_lane.cma = False
    data = np.arange(ep.rndv_thresh, dtype=np.uint8)
    out = np.zeros_like(data)
    recv = b.tag_recv_nb(out, 9, source=0)
    send = ep.tag_send_nb(data, 9)
    p.wait(send, recv)
    assert np.array_equal(out, data)
    send = ep.tag_send_nb(data[::-1].copy(), 10)          # unexpected, then matched
    for _ in range(20):
        b.progress()
    assert b.matcher.find_unexpected(0, 10, ucxpy.tag.FULL_MASK, False).rts.size == len(data)
    recv = b.tag_recv_nb(out, 10, source=0)
    assert not recv.done                                  # (not read by the native get)
    p.wait(send, recv)
    assert np.array_equal(out, data[::-1])


def test_a_rendezvous_threshold_of_0_sends_nothing_eagerly():
    """UCXPY_RNDV_THRESH=0: every message goes by rendezvous, the data
    plane's too (the lane's eager limit is then below any size)."""
    if not transport_available("shm"):
        pytest.skip("shm unavailable")
    from conftest import Pair
    p = Pair("shm", rndv_thresh=0)
    try:
        a, b = p.workers
        ep = p.eps[0][1]
        out = bytearray(8)
        p.wait(ep.tag_send_nb(b"wire-up!", 3), b.tag_recv_nb(out, 3))   # (the lane exists)
        p.wait(ep.tag_send_nb(b"12345678", 3), b.tag_recv_nb(out, 3))
        assert out == b"12345678" and a.fast_sends == 0 and a.fast_offers == 1
    finally:
        p.close()
