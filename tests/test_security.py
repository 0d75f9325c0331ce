"""Authentication (issue 16): what a process without the job key can do.

* configuration: the key is never shown (repr, ``ucxpy-info``), key files
  must be private, the launcher never puts it on a command line, every rank
  (and spawned process) gets the same key, under ucxpy-run and mpiexec;
* tcp and ofi: wrong or missing keys, forged tokens and replayed handshakes
  are refused and counted, the honest connection keeps working; TLS pins
  the acceptor's certificate through the proofs;
* the launcher's service: unsigned, wrongly signed and replayed requests get
  no answer, ranks ignore unsigned notices;
* shm: segments and control datagrams of other users are refused;
* whole jobs: a foreign process that knows the service address, the job id,
  the worker addresses and a remote key, but not the key, cannot deliver a
  message, an active message or an RMA operation, write the KV or abort the
  job, over tcp or ofi; the job finishes with verified data.

Every test has a hard timeout; jobs are real ``ucxpy-run`` jobs.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import socket
import ssl
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import ucxpy
from ucxpy import auth
from ucxpy.config import Config
from ucxpy.errors import BootstrapError, ConfigError, ConnectionLost, PeerFailure
from ucxpy.transports import tcp
from ucxpy.transports.tcp import TcpInterface

from conftest import ROOT, tcp_member_socket, transport_available

PROGS = Path(ROOT) / "tests" / "progs"

KEY = "security-test-job-key-0123456789"
OTHER = "some-other-job-key-9876543210xyz"
LAUNCHER = [sys.executable, "-m", "ucxpy.bootstrap.launcher"]
_RANK_VARS = ("UCXPY_RUN_ADDR", "UCXPY_RANK", "UCXPY_SIZE", "UCXPY_LOCAL_RANK",
              "UCXPY_LOCAL_SIZE", "UCXPY_JOB_ID", "UCXPY_BOOTSTRAP", "UCXPY_AUTH_KEY",
              "UCXPY_AUTH_KEY_FILE", "UCXPY_TLS", "UCXPY_TCP_IFACE", "PMI_FD", "PMI_RANK",
              "PMI_SIZE")


def clean_env(**extra):
    env = {k: v for k, v in os.environ.items() if k not in _RANK_VARS}
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    env.update({k: str(v) for k, v in extra.items()})
    return env


class Owner:
    """A transport owner that records frames and failures."""

    direct_am_ids = frozenset()

    def __init__(self):
        self.frames, self.failed = [], []

    def recv_dest(self, *a):
        return None

    def recv_frame(self, ep, am_id, header, payload):
        self.frames.append((ep, am_id, bytes(header), bytes(payload)))

    def conn_failed(self, ep, exc):
        self.failed.append((ep, exc))


def drive(ifaces, cond, timeout=15.0):
    deadline = time.monotonic() + timeout
    while not cond():
        for i in ifaces:
            i.progress()
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")


def spin(ifaces, seconds):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        for i in ifaces:
            i.progress()


def tcp_iface(key=KEY, **cfg):
    return TcpInterface(Owner(), Config(auth_key=key, tcp_iface=cfg.pop("tcp_iface",
                                                                        "127.0.0.1"), **cfg))


# ================================================================ configuration

@pytest.mark.timeout(30)
def test_key_is_never_shown(tmp_path):
    cfg = Config.from_env({"UCXPY_AUTH_KEY": KEY})
    assert KEY not in repr(cfg) and KEY not in str(list(cfg.items()))
    assert dict(cfg.items())["UCXPY_AUTH_KEY"] == auth.MASK
    env = clean_env(UCXPY_AUTH_KEY=KEY)
    for args in (["-c"], []):
        out = subprocess.run([sys.executable, "-m", "ucxpy.tools.info", *args], env=env,
                             capture_output=True, text=True, timeout=60, cwd=ROOT)
        assert out.returncode == 0, out.stderr
        assert KEY not in out.stdout + out.stderr
        assert ("UCXPY_AUTH_KEY=" + auth.MASK in out.stdout) if args else \
            "job key: set" in out.stdout


@pytest.mark.timeout(10)
def test_key_file_must_be_private_and_long_enough(tmp_path):
    path = tmp_path / "key"
    path.write_text(KEY + "\n")
    path.chmod(0o600)
    assert auth.read_key_file(str(path)) == KEY.encode()
    assert auth.job_key(Config.from_env({"UCXPY_AUTH_KEY_FILE": str(path)})) == KEY.encode()
    path.chmod(0o644)
    with pytest.raises(ConfigError, match="other users"):
        Config.from_env({"UCXPY_AUTH_KEY_FILE": str(path)})
    path.chmod(0o600)
    path.write_text("short")
    with pytest.raises(ConfigError, match="at least"):
        auth.read_key_file(str(path))
    with pytest.raises(ConfigError, match="at least"):
        Config.from_env({"UCXPY_AUTH_KEY": "short"})
    assert len(auth.generate_key()) >= 40 and auth.generate_key() != auth.generate_key()


@pytest.mark.timeout(10)
def test_launcher_never_puts_the_key_on_a_command_line():
    from ucxpy.bootstrap.launcher import rank_command
    env = {"UCXPY_SIZE": "2", "UCXPY_RANK": "0", auth.ENV_KEY: KEY}
    for agent in ("ip netns exec ns{rank}", "ssh {host}", ""):
        argv = rank_command(["prog.py"], 0, "h0", agent, env)
        assert not any(KEY in a for a in argv), argv
    ssh = " ".join(rank_command(["prog.py"], 0, "h0", "ssh {host}", env))
    assert f"IFS= read -r {auth.ENV_KEY} && export {auth.ENV_KEY}" in ssh


def _keys(stdout):
    return re.findall(r"KEY (\d+:\d+) ([0-9a-f]{16}) (\S+) (\S+)", stdout)


@pytest.mark.timeout(120)
def test_ucxpy_run_gives_every_rank_and_spawned_process_the_key():
    p = subprocess.run([*LAUNCHER, "-v", "-n", "2", "--timeout", "90",
                        str(PROGS / "sec_key.py"), "spawn"],
                       env=clean_env(), capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert p.returncode == 0, p.stdout + p.stderr
    keys = _keys(p.stdout)
    assert sorted(k[0] for k in keys) == ["0:0", "0:1", "1:0"], p.stdout
    assert len({k[1] for k in keys}) == 1 and keys[0][1] != hashlib.sha256(b"").hexdigest()[:16]
    assert all(k[2] == "127.0.0.1" and k[3] == "ok" for k in keys), keys
    # the verbose banner names the job, never its key
    assert "service at tcp://127.0.0.1:" in p.stderr
    # a key of the caller's own is used as it is (several jobs can share one)
    p = subprocess.run([*LAUNCHER, "-n", "2", "--timeout", "60", str(PROGS / "sec_key.py")],
                       env=clean_env(UCXPY_AUTH_KEY=KEY), capture_output=True, text=True,
                       timeout=90, cwd=ROOT)
    assert p.returncode == 0, p.stdout + p.stderr
    assert {k[1] for k in _keys(p.stdout)} == {hashlib.sha256(KEY.encode()).hexdigest()[:16]}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("boot", ["pmi", "mpi"], ids=["pmi-wire", "mpi4py"])
def test_mpiexec_rank0_makes_and_broadcasts_the_key(boot):
    import shutil
    if shutil.which("mpiexec") is None:
        pytest.skip("no mpiexec (pip install mpich)")
    if boot == "mpi":
        pytest.importorskip("mpi4py")
    p = subprocess.run(["mpiexec", "-n", "2", sys.executable, str(PROGS / "sec_key.py")],
                       env=clean_env(UCXPY_BOOTSTRAP=boot), capture_output=True, text=True,
                       timeout=110, cwd=ROOT)
    assert p.returncode == 0, p.stdout + p.stderr
    keys = _keys(p.stdout)
    assert len(keys) == 2 and len({k[1] for k in keys}) == 1, p.stdout
    assert keys[0][1] != hashlib.sha256(b"").hexdigest()[:16]
    assert all(k[2] == "127.0.0.1" for k in keys), keys


# ================================================================ tcp

@pytest.mark.timeout(20)
def test_tcp_listens_on_one_address():
    from ucxpy import netaddr
    keyless = TcpInterface(Owner(), Config())
    keyed = TcpInterface(Owner(), Config(auth_key=KEY))
    try:
        assert keyless._listener.getsockname()[0] == "127.0.0.1"
        assert tcp.unpack_address(keyless.address())[0] == ["127.0.0.1"]
        assert keyed._listener.getsockname()[0] == netaddr.outward_ipv4() != "0.0.0.0"
    finally:
        keyless.close()
        keyed.close()


@pytest.mark.timeout(30)
@pytest.mark.parametrize("tls", [False, True], ids=["plain", "tls"])
@pytest.mark.parametrize("keys", [(KEY, OTHER), (None, KEY), (KEY, None)],
                         ids=["wrong_key", "keyless_connector", "keyless_acceptor"])
def test_tcp_without_the_key_no_frame_gets_through(keys, tls):
    a = tcp_iface(keys[0], tcp_tls=tls)
    b = tcp_iface(keys[1], tcp_tls=tls)
    good = tcp_iface(keys[1], tcp_tls=tls)
    try:
        before = auth.failures["tcp"]
        ep = a.connect(b.address())
        ep.send(1, b"hdr", b"evil")
        drive([a, b], lambda: a.owner.failed)
        exc = a.owner.failed[0][1]
        assert isinstance(exc, ConnectionLost) and "authentication" in str(exc), exc
        spin([a, b], 0.2)
        assert not b.owner.frames and not b.owner.failed
        assert b.rejected == 1 and b.auth_failures + a.auth_failures >= 1
        assert auth.failures["tcp"] > before
        ok = good.connect(b.address())                    # the job is not disturbed
        ok.send(1, b"hdr", b"fine")
        drive([good, b], lambda: b.owner.frames)
        assert b.owner.frames[0][3] == b"fine"
    finally:
        for i in (a, b, good):
            i.close()


def _read(s, n, iface):
    """``n`` bytes from blocking socket ``s``, progressing ``iface`` meanwhile."""
    data = b""
    s.setblocking(False)
    deadline = time.monotonic() + 5
    while len(data) < n:
        iface.progress()
        try:
            chunk = s.recv(n - len(data))
        except BlockingIOError:
            assert time.monotonic() < deadline, "peer sent nothing"
            continue
        if not chunk:
            raise ConnectionError("EOF")
        data += chunk
    s.setblocking(True)
    return data


@pytest.mark.timeout(30)
def test_tcp_replayed_handshake_is_refused():
    b = tcp_iface()
    a = tcp_iface()
    fake = socket.socket()
    try:
        frame = tcp.PREFIX.pack(tcp.FRAME_MAGIC, 1, 0, 0, 4) + b"recd"
        # a member's connection, recorded on the wire
        challenge = os.urandom(16)
        s, theirs = tcp_member_socket(b, challenge=challenge)
        _ips, port, nonce = tcp.unpack_address(b.address())
        proof = tcp.handshake_proof(b.key, tcp.ROLE_CONNECTOR, challenge, theirs, nonce)
        acceptor_proof = _read(s, tcp.PROOF_LEN, b)
        acceptor_hello = tcp.pack_hello(tcp.ROLE_ACCEPTOR, nonce, theirs)
        s.sendall(frame)
        drive([b], lambda: b.owner.frames)
        s.close()
        # 1. the connector's bytes replayed: the acceptor's new challenge defeats them
        r = socket.create_connection(("127.0.0.1", port), timeout=5)
        r.sendall(tcp.pack_hello(tcp.ROLE_CONNECTOR, nonce, challenge) + proof + frame)
        before = b.auth_failures
        drive([b], lambda: b.auth_failures > before)
        spin([b], 0.2)
        assert len(b.owner.frames) == 1 and b.rejected == 1
        r.close()
        # 2. the acceptor's bytes replayed to a connector: its new challenge defeats them
        fake.bind(("127.0.0.1", 0))
        fake.listen(1)
        fake.setblocking(False)
        ep = a.connect(tcp.pack_address(["127.0.0.1"], fake.getsockname()[1], nonce))
        ep.send(1, b"", b"secret")
        conn = None
        deadline = time.monotonic() + 10
        while conn is None:
            a.progress()
            try:
                conn, _ = fake.accept()
            except BlockingIOError:
                assert time.monotonic() < deadline
        conn.setblocking(True)
        conn.sendall(acceptor_hello + acceptor_proof)
        drive([a], lambda: a.owner.failed)
        assert "authentication" in str(a.owner.failed[0][1]) and a.auth_failures == 1
        conn.settimeout(2)
        seen = b""
        try:
            while True:
                chunk = conn.recv(4096)
                if not chunk:
                    break
                seen += chunk
        except OSError:
            pass
        assert b"secret" not in seen                  # nothing left the connector
        conn.close()
    finally:
        fake.close()
        a.close()
        b.close()


@pytest.mark.timeout(60)
def test_tcp_tls_carries_data_and_pins_the_certificate():
    a, b = tcp_iface(tcp_tls=True), tcp_iface(tcp_tls=True)
    try:
        ep = a.connect(b.address())
        sizes = [0, 1, 300, 16 << 10, 1 << 20, (4 << 20) + 7]
        data = [np.random.default_rng(n).integers(0, 256, n, dtype=np.uint8) for n in sizes]
        for i, d in enumerate(data):
            ep.send(1, b"%d" % i, d)
        drive([a, b], lambda: len(b.owner.frames) == len(sizes), timeout=40)
        for i, (_, _, h, p) in enumerate(b.owner.frames):
            assert h == b"%d" % i and p == data[i].tobytes()
        # by hand: the proof must cover the acceptor's certificate
        _ips, port, nonce = tcp.unpack_address(b.address())
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
        results = {}
        for binding in ("none", "right"):
            raw = socket.create_connection(("127.0.0.1", port), timeout=5)
            raw.setblocking(False)
            s = ctx.wrap_socket(raw, do_handshake_on_connect=False)
            deadline = time.monotonic() + 10
            while True:
                b.progress()
                try:
                    s.do_handshake()
                    break
                except (ssl.SSLWantReadError, ssl.SSLWantWriteError):
                    assert time.monotonic() < deadline
            cert = hashlib.sha256(s.getpeercert(binary_form=True)).digest()
            nc = os.urandom(16)
            s.send(tcp.pack_hello(tcp.ROLE_CONNECTOR, nonce, nc))
            got = b""
            while len(got) < tcp._HELLO.size:
                b.progress()
                try:
                    got += s.recv(tcp._HELLO.size - len(got))
                except ssl.SSLWantReadError:
                    assert time.monotonic() < deadline
            na = tcp._HELLO.unpack(got)[5]
            s.send(tcp.handshake_proof(b.key, tcp.ROLE_CONNECTOR, nc, na, nonce,
                                       cert if binding == "right" else b""))
            s.send(tcp.PREFIX.pack(tcp.FRAME_MAGIC, 1, 0, 0, 2) + binding[:2].encode())
            spin([b], 0.5)
            results[binding] = [f[3] for f in b.owner.frames[len(sizes):]]
            s.close()
        assert results == {"none": [], "right": [b"ri"]}, results
        # a plaintext peer cannot talk to a TLS listener
        before = b.rejected
        plain = socket.create_connection(("127.0.0.1", port), timeout=5)
        plain.sendall(tcp.pack_hello(tcp.ROLE_CONNECTOR, nonce, os.urandom(16)))
        drive([b], lambda: b.rejected > before)
        plain.close()
    finally:
        a.close()
        b.close()


# ================================================================ ofi

@pytest.fixture
def ofi_tcp(monkeypatch):
    if not transport_available("ofi"):
        pytest.skip("ofi unavailable")
    monkeypatch.setenv("UCXPY_OFI_PROVIDER", "tcp;ofi_rxm")
    from ucxpy.transports import ofi
    made = []

    def make(key=KEY):
        i = ofi.OfiInterface(Owner(), Config(auth_key=key, tcp_iface="127.0.0.1"))
        made.append(i)
        return i
    yield make
    for i in made:
        i.close()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("keys", [(KEY, OTHER), (None, KEY)], ids=["wrong_key", "keyless"])
def test_ofi_without_the_key_no_frame_gets_through(ofi_tcp, keys):
    a, b, good = ofi_tcp(keys[0]), ofi_tcp(keys[1]), ofi_tcp(keys[1])
    ep = a.connect(b.address())
    ep.send(1, b"h", b"evil")
    drive([a, b], lambda: a.owner.failed)
    assert "authentication" in str(a.owner.failed[0][1])
    assert a.auth_failures == 1
    spin([a, b], 0.3)
    assert not b.owner.frames and not b.owner.failed
    ok = good.connect(b.address())
    ok.send(1, b"h", b"fine")
    drive([good, b], lambda: b.owner.frames)
    assert b.owner.frames[0][3] == b"fine"
    # the failed attempt stays pending (bounded by MAX_PENDING), never open
    assert len(b._pending_auth) <= 1 and not any(e.authed for e in b._pending_auth.values())


@pytest.mark.timeout(60)
def test_ofi_forged_tokens_and_replayed_handshakes_are_dropped(ofi_tcp):
    from ucxpy.transports import ofi
    a, b, attacker = ofi_tcp(), ofi_tcp(), ofi_tcp(OTHER)
    sent = []
    real_post = a._post_frame

    def record(ep, kind, am_id, header, payload):
        seq = ep._tx_seq
        posted = real_post(ep, kind, am_id, header, payload)
        if posted:
            sent.append((kind, ep.conn_id, seq, bytes(header), bytes(payload), ep.token))
        return posted
    a._post_frame = record
    ep = a.connect(b.address())
    ep.send(1, b"h", b"first")
    drive([a, b], lambda: b.owner.frames)
    a._post_frame = real_post
    assert [k for k, *_ in sent[:3]] == [ofi.KIND_HELLO, ofi.KIND_AUTH, ofi.KIND_DATA]

    def forge(kind, conn, seq, payload, token, uuid=a.uuid, header=b""):
        """Post a frame from the attacker that claims to come from ``a``."""
        aep = attacker.connect(b.address()) if not attacker._conns else \
            next(iter(attacker._conns.values()))
        slot = attacker._tx_free.pop()
        off = (slot - attacker._tx0) * attacker.slot_size
        ofi.PREFIX.pack_into(attacker._tx_view, off, ofi.FRAME_MAGIC, 1, kind, len(header),
                             seq, len(payload), conn, uuid, token)
        start = off + ofi._PSIZE
        attacker._tx_view[start:start + len(header)] = header
        attacker._tx_view[start + len(header):start + len(header) + len(payload)] = payload
        total = ofi._PSIZE + len(header) + len(payload)
        deadline = time.monotonic() + 10
        while True:
            rc = ofi.lib.uxofi_send(attacker._h, slot, attacker._tx_ptr + off, total,
                                    attacker._tx_desc, aep.fi_addr)
            if rc != -ofi.lib.FI_EAGAIN:
                break
            spin([a, b, attacker], 0.01)        # the provider is still connecting
            assert time.monotonic() < deadline
        assert rc == 0
        attacker._tx_owner[slot] = [aep, total, 0]
        aep._inflight += 1

    before = b.auth_failures
    hello, auth_frame = sent[0], sent[1]
    # replayed HELLO of the open connection; data with made-up tokens on it
    forge(ofi.KIND_HELLO, hello[1], 0, hello[4], 0)
    for token in (0, 1, 0xDEADBEEF, ep.token ^ 1):
        forge(ofi.KIND_DATA, ep.conn_id, ep._tx_seq, b"evil", token)
    # the whole handshake replayed on a new connection id: HELLO + the old AUTH
    forge(ofi.KIND_HELLO, 99, 0, hello[4], 0)
    forge(ofi.KIND_AUTH, 99, 1, auth_frame[4], auth_frame[5])
    forge(ofi.KIND_DATA, 99, 2, b"evil", auth_frame[5])
    spin([a, b, attacker], 1.0)
    assert [f[3] for f in b.owner.frames] == [b"first"] and not b.owner.failed
    assert b.auth_failures >= before + 6
    # besides a's connection, only pending (never opened) requests exist
    assert [k for k, e in b._accepted.items() if e.authed] == [(a.uuid, ep.conn_id)]
    ep.send(1, b"h", b"still fine")                 # the real connection is unharmed
    drive([a, b], lambda: len(b.owner.frames) == 2)
    assert b.owner.frames[1][3] == b"still fine"


@pytest.mark.timeout(30)
def test_ofi_memory_keys_are_random_and_bounce_buffers_local(ofi_tcp):
    a = ofi_tcp()
    keys = set(a.md._keys)
    assert len(keys) >= 2
    assert not any(0 < (k - a.uuid) & a.md.key_limit < 1000 for k in keys)
    reg_keys = {a.pack_local_key(memoryview(bytearray(64)))[1] for _ in range(4)}
    assert len(reg_keys) == 4


# ================================================================ the service

class ServiceHarness:
    """A RendezvousService driven in this thread while a client call runs in another."""

    def __init__(self, size=2, key=KEY):
        from ucxpy.bootstrap.rendezvous import RendezvousService
        self.svc = RendezvousService(size, "jobid-secret1", "127.0.0.1", key=key.encode())
        self.addr = f"tcp://127.0.0.1:{self.svc.port}"

    def run(self, fn, timeout=20.0):
        box = {}

        def target():
            try:
                box["value"] = fn()
            except BaseException as e:  # noqa: BLE001 - handed to the caller
                box["error"] = e
        t = threading.Thread(target=target, daemon=True)
        t.start()
        deadline = time.monotonic() + timeout
        while t.is_alive():
            self.svc.serve_pending()
            time.sleep(0.001)
            assert time.monotonic() < deadline, "client call did not finish"
        if "error" in box:
            raise box["error"]
        return box.get("value")

    def serve(self, seconds):
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            self.svc.serve_pending()
            time.sleep(0.001)

    def close(self):
        self.svc.close()


@pytest.fixture
def service():
    h = ServiceHarness()
    yield h
    h.close()


def _request(key, session, req_id, op, header, *payload, mac=None):
    from ucxpy.bootstrap import zmq_boot
    body = [req_id.to_bytes(8, "big"), op, json.dumps(header).encode(), *payload]
    if mac is None:
        mac = auth.sign_frames(key, zmq_boot.REQUEST_LABEL, body + [session])
    return body + [session, mac]


@pytest.mark.timeout(60)
def test_service_answers_only_signed_fresh_requests(service):
    import zmq
    from ucxpy.bootstrap import zmq_boot
    ctx = zmq.Context()
    d = ctx.socket(zmq.DEALER)
    d.setsockopt(zmq.LINGER, 0)
    d.connect(service.addr)
    key = KEY.encode()
    hello = {"rank": 0, "size": 2, "job_id": "jobid-secret1", "pid": 1, "host": "h",
             "version": zmq_boot.PROTOCOL_VERSION, "group": 0}

    def replies(seconds=0.5):
        out = []
        service.serve(seconds)
        while d.poll(50):
            out.append(d.recv_multipart())
        return out
    try:
        s = os.urandom(16)
        # unsigned (the old protocol), wrongly signed, truncated: no answer at all
        d.send_multipart([b"\0" * 8, b"HELLO", json.dumps(dict(hello, version=1)).encode()])
        d.send_multipart(_request(OTHER.encode(), s, 1, b"HELLO", hello))
        d.send_multipart(_request(key, s, 1, b"HELLO", hello, mac=b"\0" * 32))
        d.send_multipart(_request(key, s, 1, b"HELLO", hello)[:-2])
        d.send_multipart(_request(key, s, 1, b"PUT", {"key": "k"}, b"evil"))   # no HELLO yet
        assert replies() == [] and service.svc.rejected == 5
        # a member's HELLO is answered, signed for its session
        good = _request(key, s, 1, b"HELLO", hello)
        d.send_multipart(good)
        (rep,) = replies()
        assert rep[1] == b"OK" and auth.check(key, rep[-1], zmq_boot.REPLY_LABEL, s, *rep[:-1])
        d.send_multipart(good)                              # replayed: dropped
        first_put = _request(key, s, 2, b"PUT", {"key": "k"}, b"v1")
        d.send_multipart(first_put)
        d.send_multipart(_request(key, s, 3, b"PUT", {"key": "k"}, b"v2"))
        assert [r[1] for r in replies()] == [b"OK", b"OK"]
        d.send_multipart(first_put)                         # replayed: dropped
        d.send_multipart(_request(key, s, 3, b"ABORT", {"message": "x"}))   # stale id
        assert replies() == [] and service.svc.kv["k"] == b"v2"
        assert service.svc.abort_request is None and service.svc.rejected == 8
        # an error answer (to a signed request) never quotes the job id or the key
        s2 = os.urandom(16)
        d.send_multipart(_request(key, s2, 1, b"HELLO", dict(hello, job_id="guess")))
        (err,) = replies()
        assert err[1] == b"ERR" and b"jobid-secret1" not in b"".join(err) and \
            key not in b"".join(err)
    finally:
        d.close()
        ctx.term()


@pytest.mark.timeout(60)
def test_ranks_ignore_unsigned_notices_and_replies(service):
    from ucxpy.bootstrap.zmq_boot import ZmqBootstrap
    with pytest.raises(BootstrapError, match="no job key"):
        ZmqBootstrap(service.addr, 0, 2, job_id="jobid-secret1")
    wrong = service.run(lambda: pytest.raises(BootstrapError, ZmqBootstrap, service.addr, 0,
                                              2, job_id="jobid-secret1", key=OTHER.encode(),
                                              connect_timeout=1))
    assert "unreachable" in str(wrong.value)        # a wrong key gets no answer at all
    client = service.run(lambda: ZmqBootstrap(service.addr, 0, 2, job_id="jobid-secret1",
                                              key=KEY.encode(), check_interval=0))
    try:
        hdr = json.dumps({"rank": 1, "group": 0, "code": 9, "message": "fake"}).encode()
        deadline = time.monotonic() + 1.5
        while time.monotonic() < deadline:          # fakes, repeated (slow SUB joiner)
            service.svc.pub.send_multipart([b"FAIL", hdr])
            service.svc.pub.send_multipart([b"FAIL", hdr, b"\0" * 32])
            service.svc.pub.send_multipart([b"ABORT", hdr,
                                            auth.sign_frames(OTHER.encode(), b"x", [hdr])])
            client.check_failures()                 # never raises
            time.sleep(0.02)
        assert client.failed == {}
        service.svc.rank_gone(1, -9, "rank 1 exited with code -9", True)
        with pytest.raises(PeerFailure):
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                service.svc.republish()
                client.check_failures()
                time.sleep(0.02)
        assert client.failed == {1: "rank 1 exited with code -9"}
    finally:
        client.close()


# ================================================================ shm

def _as_other_user(fn):
    """Run ``fn`` in a forked child with uid/gid 65534; its exit status."""
    pid = os.fork()
    if pid == 0:
        try:
            os.setgid(65534)
            os.setuid(65534)
            fn()
            os._exit(0)
        except BaseException:
            os._exit(1)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


@pytest.mark.timeout(30)
def test_shm_refuses_other_users_segments_and_datagrams():
    if not transport_available("shm"):
        pytest.skip("shm unavailable")
    if os.geteuid() != 0:
        pytest.skip("needs root to act as another user")
    from ucxpy.transports import shm
    owner = Owner()
    iface = shm.ShmInterface(owner, Config())
    try:
        inbox = shm.Inbox.create(f"ucxpy-shm-{os.getpid()}-{'e' * 16}", 4096)
        path, inbox.owner = inbox.path, False    # keep the file, unmap it
        inbox.close()
        for mode, uid in ((0o644, 0), (0o600, 65534)):
            os.chmod(path, mode)
            os.chown(path, uid, -1)
            with pytest.raises(PermissionError):
                shm.Inbox.open(inbox.name, 4096)
            assert os.path.exists(path)             # not even unlinked
        os.unlink(path)
        # a CONNECT request and a refusal (NACK) sent by another user are dropped
        me = iface._sock_name

        def send_as_nobody():
            s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            req = shm._REQ.pack(shm._REQ_MAGIC, shm._VERSION, 0, os.getpid(), 4096, 0,
                                11, 22) + f"ucxpy-{os.getpid()}-{'0' * 16}".encode()
            s.sendto(req, b"\0" + me)
            s.sendto(shm._NACK + shm._SOURCE.pack(11), b"\0" + me)
        assert _as_other_user(send_as_nobody) == 0
        drive([iface], lambda: iface.rejected >= 2)
        assert not owner.frames and not owner.failed and not iface._eps
    finally:
        iface.close()


# ================================================================ whole jobs

def _start_job(prog, env, n=2, timeout=150):
    p = subprocess.Popen([*LAUNCHER, "-v", "-n", str(n), "--timeout", str(timeout),
                          str(PROGS / prog)], env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, cwd=ROOT, start_new_session=True)
    err_lines = []

    def pump():
        for line in p.stderr:
            err_lines.append(line)
    t = threading.Thread(target=pump, daemon=True)
    t.start()
    return p, err_lines, t


@pytest.mark.timeout(240)
@pytest.mark.parametrize("lane", ["tcp", "ofi"])
def test_foreign_process_cannot_get_into_a_running_job(tmp_path, lane):
    if not transport_available(lane):
        pytest.skip(f"transport {lane} unavailable")
    env = clean_env(SEC_DIR=tmp_path, UCXPY_TLS=lane, UCXPY_OFI_PROVIDER="tcp;ofi_rxm")
    job, err, pump = _start_job("sec_victim.py", env)
    try:
        deadline = time.monotonic() + 90
        banner = None
        while not (banner and all((tmp_path / f"addr-{r}.json").exists() for r in (0, 1))):
            banner = banner or next((re.search(r"job (\w+): .* service at (\S+)", line)
                                     for line in err if "service at" in line), None)
            assert job.poll() is None, "".join(err)
            assert time.monotonic() < deadline, "".join(err)
            time.sleep(0.05)
        job_id, service = banner.group(1), banner.group(2)
        attack = subprocess.run([sys.executable, str(PROGS / "sec_attacker.py"), str(tmp_path),
                                 lane, service, job_id], env=clean_env(), capture_output=True,
                                text=True, timeout=150, cwd=ROOT)
        out, _ = job.communicate(timeout=120)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, 9)
            job.wait()
        pump.join(5)
    stderr = "".join(err)
    assert attack.returncode == 0, attack.stdout + attack.stderr
    report = json.loads(attack.stdout.split("ATTACK ", 1)[1])
    assert job.returncode == 0, f"{out}\n{stderr}\n{report}"
    # split on the marker, not on lines: the ranks' prints may interleave
    ok = []
    for chunk in out.split("SEC OK ")[1:]:
        rank, lane_seen, rest = chunk.split(" ", 2)
        ok.append((rank, lane_seen, json.JSONDecoder().raw_decode(rest)[0]))
    assert sorted(r for r, _l, _c in ok) == ["0", "1"], out + stderr
    # the service answered nothing (so revealed nothing), the job was not aborted
    assert report["service_replies"] == [], report
    assert "pwned" not in stderr and "abort" not in stderr.lower()
    # every ucxpy-level attempt failed on authentication, none completed remotely
    for entry in report["ucxpy"]:
        assert entry[1] != "completed" or entry[0] in ("tag", "am"), report
    counters = [c for _r, _l, c in ok]
    print("attacker saw:", json.dumps(report), "\nvictims counted:", counters)
    if lane == "tcp":
        assert all(closed for _name, closed in report["tcp_raw"]), report
        assert sum(c["tcp_rejected"] for c in counters) >= 8, counters
        assert sum(c["tcp_auth_failures"] for c in counters) >= 2, counters
    else:
        rma = [n for what, n in report["ofi_raw"] if what == "rma_ok"]
        assert rma == [0, 0], report
        assert sum(c["ofi_auth_failures"] for c in counters) >= 8, counters
        assert report["ofi_frames_to_attacker"] == 0, report


@pytest.mark.timeout(180)
def test_tls_job_runs_the_tag_suite():
    p = subprocess.run([*LAUNCHER, "-n", "2", "--timeout", "150",
                        str(PROGS / "tag_suite.py")],
                       env=clean_env(UCXPY_TLS="tcp", UCXPY_TCP_TLS="y",
                                     TAG_SUITE_MAX=str(1 << 22)),
                       capture_output=True, text=True, timeout=170, cwd=ROOT)
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.count("TAG-SUITE OK") == 2 and p.stdout.count(" tcp") >= 2, p.stdout
