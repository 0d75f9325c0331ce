"""A local process without the job key attacking a running job (see
tests/progs/sec_victim.py and tests/test_security.py).

    python sec_attacker.py SEC_DIR LANE SERVICE_ADDR JOB_ID

It knows everything but the key: the launcher's service address and the
job id (both from ``ucxpy-run -v``), and the ranks' worker addresses and a
remote key (from SEC_DIR, as if leaked).  It tries, in turn:

1. the launcher's service: the old unsigned HELLO with the real and a
   guessed job id, then HELLO / PUT / ABORT signed with a wrong key and
   unsigned ones; counts the replies it gets (it should get none);
2. ucxpy itself with a wrong key (``UCXPY_AUTH_KEY``): tagged send, active
   message and put to every rank;
3. the lane by hand, skipping the handshake: tcp -- a hello with a made-up
   proof, the old (version 1) hello, no proof at all, each followed by a
   WIREUP and a tagged message; ofi -- frames with guessed tokens on a
   connection it never authenticated, and fi_write with guessed memory keys
   (the old predictable ones) into the ranks' memory.

Prints one JSON line ``ATTACK {...}`` describing what it saw, then creates
SEC_DIR/attacked.
"""
import json
import os
import socket
import struct
import sys
import time

import zmq

SEC, LANE, SERVICE, JOB_ID = sys.argv[1:5]
WRONG_KEY = "not-the-job-key-at-all-0123456789"
os.environ.update(UCXPY_AUTH_KEY=WRONG_KEY, UCXPY_TLS=LANE, UCXPY_TCP_IFACE="127.0.0.1",
                  UCXPY_PEER_TIMEOUT="3")
for var in ("UCXPY_RUN_ADDR", "UCXPY_RANK", "UCXPY_SIZE", "UCXPY_JOB_ID"):
    os.environ.pop(var, None)

import numpy as np  # noqa: E402

import ucxpy  # noqa: E402
from ucxpy import auth, wire  # noqa: E402
from ucxpy.address import WorkerAddress  # noqa: E402
from ucxpy.bootstrap import zmq_boot  # noqa: E402

TAG, AM_ID = 0x5EC0, 40
report = {"lane": LANE}


def victims():
    out = []
    for r in (0, 1):
        with open(os.path.join(SEC, f"addr-{r}.json")) as f:
            out.append(json.load(f))
    return out


# -- 1. the rendezvous service ------------------------------------------------
def attack_service():
    ctx = zmq.Context()
    d = ctx.socket(zmq.DEALER)
    d.setsockopt(zmq.LINGER, 0)
    d.connect(SERVICE)

    def hdr(o):
        return json.dumps(o).encode()
    hello = {"rank": 0, "size": 2, "pid": os.getpid(), "host": "x", "group": 0}
    for jid in (JOB_ID, "0123456789ab"):           # the old protocol: no key at all
        d.send_multipart([(1).to_bytes(8, "big"), b"HELLO",
                          hdr(dict(hello, job_id=jid, version=1))])
    session = os.urandom(zmq_boot.SESSION_LEN)
    wrong = WRONG_KEY.encode()
    reqs = [(b"HELLO", dict(hello, job_id=JOB_ID, version=zmq_boot.PROTOCOL_VERSION), []),
            (b"PUT", {"key": "victim"}, [b"evil"]),
            (b"ABORT", {"message": "pwned", "errorcode": 7}, []),
            (b"COLL", {"seq": 0, "kind": "barrier", "root": -1}, [])]
    for i, (op, h, payload) in enumerate(reqs, start=2):
        body = [i.to_bytes(8, "big"), op, hdr(h), *payload]
        d.send_multipart(body + [session, auth.sign_frames(wrong, zmq_boot.REQUEST_LABEL,
                                                            body + [session])])
        d.send_multipart(body + [session, b"\0" * 32])                  # unsigned
        d.send_multipart(body)                                         # no mac at all
    replies = []
    deadline = time.monotonic() + 1.5
    while time.monotonic() < deadline:
        if d.poll(100):
            replies.append([bytes(f)[:200].decode("latin-1") for f in d.recv_multipart()])
    report["service_replies"] = replies
    d.close()
    ctx.term()


# -- 2. ucxpy with the wrong key -------------------------------------------------
def attack_with_ucxpy(vs):
    w = ucxpy.Context().create_worker()
    outcome = []
    for v in vs:
        ep = w.connect(bytes.fromhex(v["address"]))
        reqs = []
        for what, post in (("tag", lambda: ep.tag_send_nb(b"evil" * 16, TAG)),
                           ("am", lambda: ep.am_send_nb(AM_ID, b"h", b"evil")),
                           ("put", lambda: ep.put_nb(np.full(64, 0xEE, np.uint8), v["mem"],
                                                     ep.unpack_rkey(bytes.fromhex(v["rkey"]))))):
            try:
                reqs.append((what, post()))
            except ucxpy.UcxpyError as e:
                outcome.append([what, "raised", type(e).__name__])
        for what, r in reqs:
            try:
                r.wait(timeout=8)
                outcome.append([what, "completed"])
            except ucxpy.UcxpyError as e:
                outcome.append([what, "failed", type(e).__name__, str(e)[:120]])
    report["ucxpy"] = outcome
    for ep in list(w.endpoints.values()):
        ep.abort()
    w.close()


# -- 3a. tcp by hand ------------------------------------------------------------------
def tcp_frame(am_id, header, payload=b""):
    from ucxpy.transports import tcp
    return tcp.PREFIX.pack(tcp.FRAME_MAGIC, am_id, 0, len(header), len(payload)) + header + payload


def closed_by_peer(s, timeout=5.0) -> bool:
    s.settimeout(0.2)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if not s.recv(65536):
                return True
        except socket.timeout:
            continue
        except OSError:
            return True
    return False


def attack_tcp_raw(vs):
    from ucxpy.transports import tcp
    fake = WorkerAddress(7, 4242, os.getpid(), b"attacker", ()).pack()
    inject = tcp_frame(wire.AmId.WIREUP, b"", fake) + \
        tcp_frame(wire.AmId.TAG_EAGER, wire.EAGER.pack(TAG), b"evil" * 16)
    results = []
    for v in vs:
        ips, port, nonce = tcp.unpack_address(WorkerAddress.unpack(
            bytes.fromhex(v["address"])).transport("tcp"))
        attempts = {
            "made_up_proof": tcp.pack_hello(tcp.ROLE_CONNECTOR, nonce, os.urandom(16))
            + os.urandom(tcp.PROOF_LEN),
            "old_hello": struct.pack("<4sHHI", b"UXTC", 1, 0, nonce),
            "no_proof": tcp.pack_hello(tcp.ROLE_CONNECTOR, nonce, os.urandom(16)),
        }
        for name, prefix in attempts.items():
            s = socket.create_connection((ips[0], port), timeout=5)
            try:
                s.sendall(prefix + inject)
            except OSError:
                pass
            results.append([name, closed_by_peer(s, 4.0 if name != "no_proof" else 1.0)])
            s.close()
    report["tcp_raw"] = results


# -- 3b. ofi by hand -------------------------------------------------------------------
def attack_ofi_raw(vs):
    from ucxpy.config import Config
    from ucxpy.transports import ofi
    from ucxpy.transports.base import ChunkedOp

    class Owner:
        direct_am_ids = frozenset()

        def __init__(self):
            self.frames, self.failed = [], []

        def recv_frame(self, ep, am_id, header, payload):
            self.frames.append(am_id)

        def recv_dest(self, *a):
            return None

        def conn_failed(self, ep, exc):
            self.failed.append(str(exc))

    owner = Owner()
    a = ofi.OfiInterface(owner, Config.from_env())
    fake = WorkerAddress(7, 4242, os.getpid(), b"attacker", (("ofi", a.address()),)).pack()
    results = []
    for v in vs:
        peer = ofi.unpack_address(WorkerAddress.unpack(bytes.fromhex(v["address"]))
                                  .transport("ofi"))
        # a connection that skips the handshake, with made-up tokens
        ep = a.connect(WorkerAddress.unpack(bytes.fromhex(v["address"])).transport("ofi"))
        ep.authed = True
        for token in (0, 1, int.from_bytes(os.urandom(8), "little")):
            ep.token = token
            for am_id, h, p in ((wire.AmId.WIREUP, b"", fake),
                                (wire.AmId.TAG_EAGER, wire.EAGER.pack(TAG), b"evil" * 16)):
                try:
                    ep.send(am_id, h, p)
                except ucxpy.UcxpyError as e:
                    results.append(["send", type(e).__name__])
        # frames naming connection ids of the ranks' own connections (1, 2, ...)
        for conn in (1, 2, 3):
            ep.conn_id = conn
            ep.token = int.from_bytes(os.urandom(8), "little")
            ep.send(wire.AmId.TAG_EAGER, wire.EAGER.pack(TAG), b"evil" * 16)
        # one-sided writes with guessed keys: the old scheme was uuid + n
        done = []
        target = np.full(64, 0xEE, np.uint8)
        with ofi.ffi.from_buffer(target) as p:
            ptr = int(ofi.ffi.cast("uintptr_t", p))
        for key in [(peer["uuid"] + n) & a.md.key_limit for n in range(1, 12)] + list(range(8)):
            for raddr in (0, v["mem"]):
                op = ChunkedOp(done.append, 1, "put")
                if not a._post_rma(ep, op, False, ptr, 64, ofi.ffi.NULL, raddr, key):
                    a.progress()
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            a.progress()
        results.append(["rma_ok", sum(1 for d in done if d is None)])
    report["ofi_raw"] = results
    report["ofi_frames_to_attacker"] = len(owner.frames)
    a.close()


try:
    vs = victims()
    attack_service()
    attack_with_ucxpy(vs)
    if LANE == "tcp":
        attack_tcp_raw(vs)
    else:
        attack_ofi_raw(vs)
finally:
    print("ATTACK " + json.dumps(report), flush=True)
    open(os.path.join(SEC, "attacked"), "w").close()
