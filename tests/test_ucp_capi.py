"""libucp.so.0: UCP's C API on ucxpy (native/ucp/, ucxpy/capi.py).

* the request contract, driven by a C harness with no MPI (tests/ucp/requests.c),
  in a C program that has no Python: the library starts one;
* the real MPICH (the mpich wheel, ch4:ucx) on it: a C program and the real
  mpi4py wheel, under ``ucxpy-ucx --check`` (every rank proves it ran on our
  libucp, with operations counted), over shm+tcp and over tcp alone;
* a rank killed mid-job ends the job with an error, never a hang.
"""
import os
import re
import shutil
import subprocess
import sys
import textwrap

import pytest

from conftest import run_session
from ucxpy.tools import ucx

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.dirname(sys.executable)
MPICC = os.path.join(BIN, "mpicc")
MPIEXEC = os.path.join(BIN, "mpiexec")
UCXPY_UCX = os.path.join(BIN, "ucxpy-ucx")

pytestmark = [
    pytest.mark.skipif(not os.path.exists(ucx.LIBUCP),
                       reason="libucp.so.0 not built (UCX headers: libucx-dev)"),
    pytest.mark.timeout(300),
]
needs_mpich = pytest.mark.skipif(not (os.path.exists(MPICC) and os.path.exists(MPIEXEC)),
                                 reason="the mpich wheel (mpicc, mpiexec) is not installed")


def _compile(tmp_path, source, name, cc, extra=()):
    exe = str(tmp_path / name)
    subprocess.run([cc, "-Wall", "-O1", "-g", "-o", exe, os.path.join(ROOT, "tests", "ucp", source),
                    *extra], check=True, capture_output=True, text=True, timeout=120)
    return exe


def _run(cmd, timeout=120, env=None):
    return run_session(cmd, timeout, env)


def test_request_contract_c_harness(tmp_path):
    """tests/ucp/requests.c: UCP's request rules, with no MPI and no Python in
    the process until libucp starts one."""
    if shutil.which("cc") is None:
        pytest.skip("no C compiler")
    lib = os.path.dirname(ucx.LIBUCP)
    exe = _compile(tmp_path, "requests.c", "requests", "cc",
                   ["-L" + lib, "-lucp", "-lucs", "-Wl,-rpath," + lib])
    rc, out, err = _run([exe])
    assert rc == 0 and "\n0 failed" in out, out + err
    assert out.count("ok - ") >= 25


@pytest.mark.parametrize("tls", ["shm", "tcp"])
def test_worker_wakeup_two_processes(tmp_path, tls):
    """tests/ucp/wakeup.c: a worker asleep in poll() on its event
    descriptor (ucp_worker_get_efd, after ucp_worker_arm) wakes for an 8 B
    message, a 1 MiB rendezvous and an active message, each received whole;
    arm is busy while a message waits; no descriptor without
    UCP_FEATURE_WAKEUP, none of its own with the caller's epoll set."""
    if shutil.which("cc") is None:
        pytest.skip("no C compiler")
    import secrets
    lib = os.path.dirname(ucx.LIBUCP)
    exe = _compile(tmp_path, "wakeup.c", "wakeup", "cc",
                   ["-L" + lib, "-lucp", "-lucs", "-Wl,-rpath," + lib])
    env = dict(os.environ, UCXPY_TLS=tls, UCXPY_AUTH_KEY=secrets.token_hex(32))
    rc, out, err = _run([exe], timeout=120, env=env)
    assert rc == 0 and "\n0 failed" in out and "not ok" not in out, out + err
    assert out.count("ok - ") >= 10, out


def _dataplane(tmp_path, *args, tls="shm", env=None):
    """Build and run tests/ucp/dataplane.c (two processes over ``tls``, with
    ``env`` added): its output and both workers' final reports."""
    import glob
    import json
    lib = os.path.dirname(ucx.LIBUCP)
    exe = tmp_path / "dataplane"
    if not exe.exists():
        _compile(tmp_path, "dataplane.c", "dataplane", "cc",
                 ["-L" + lib, "-lucp", "-lucs", "-Wl,-rpath," + lib])
    reports = tmp_path / ("reports" + "-".join(args) + tls)
    reports.mkdir()
    env = dict(os.environ, UCXPY_TLS=tls, UCXPY_UCP_REPORT=str(reports), UCXPY_TCP_NATIVE="y",
               **(env or {}))
    if tls != "shm":                  # (two plain C processes: a job key for the network)
        import secrets
        env["UCXPY_AUTH_KEY"] = secrets.token_hex(32)
    rc, out, err = _run([str(exe), *args], timeout=240, env=env)
    assert rc == 0 and "\n0 failed" in out, out + err
    assert "not ok" not in out, out
    final = [json.load(open(p)) for p in glob.glob(str(reports / "*.json"))]
    assert len(final) == 2, final
    return out, final


def test_tag_path_on_the_data_plane_two_processes(tmp_path):
    """tests/ucp/dataplane.c: two processes of plain C on libucp over shm.
    Every check of the harness passes: a ping-pong, unexpected messages in
    order, masks, truncation of posted and unexpected receives, cancel,
    rendezvous into receives posted before and after the offer, a
    synchronous send, a window of 384 KiB rendezvous, active messages (held
    before their handler, then 2000 eager ones with a rendezvous one among
    them, in order).  Each worker's data plane sent and matched the
    ping-pong's messages, offered, read and answered the 384 KiB ones, and
    pushed and took the eager active messages (the reports: who carried
    it)."""
    if shutil.which("cc") is None:
        pytest.skip("no C compiler")
    out, final = _dataplane(tmp_path)
    assert out.count("ok - ") >= 11, out
    for r in final:
        assert r["dp"]["tag_send"] >= 19990 and r["dp"]["tag_expected"] >= 19990, r
    sender, receiver = sorted(final, key=lambda r: r["dp"]["rndv_offer"], reverse=True)
    assert sender["dp"]["rndv_offer"] >= 8 and sender["dp"]["rndv_answered"] >= 8, sender
    assert receiver["dp"]["rndv_expected"] >= 8 and receiver["dp"]["rndv_ats"] >= 8, receiver
    # the 2000 eager active messages: pushed and taken by the data plane
    # (native/dp/am.c), a full ring's few excepted
    assert sender["dp"]["am_send"] >= 1900, sender
    assert receiver["dp"]["am_recv"] >= 1900, receiver


def test_steady_eager_exchange_enters_python_by_timer_only(tmp_path):
    """The same harness's 8 B ping-pong alone (20000 round trips): libucp's
    progress enters Python for its timer pass (once per ms of calls) and
    wire-up, never per message; the bound, a quarter of the round trips,
    holds unless a round trip takes 200 us (a loaded machine's worst)."""
    if shutil.which("cc") is None:
        pytest.skip("no C compiler")
    out, final = _dataplane(tmp_path, "pingpong")
    for r in final:
        assert r["dp"]["tag_send"] >= 19990 and r["dp"]["tag_expected"] >= 19990, r
        assert r["py_entries"] < 20000 // 4, r


def test_steady_eager_exchange_over_tcp_is_read_and_written_in_c(tmp_path):
    """The same ping-pong over tcp alone: libucp writes each message on the
    socket in C and its progress reads the other side's in C (the tcp
    connection's reading lent to the data plane: native/dp/stream.c), so it
    enters Python for its timer pass and wire-up only, as over shm."""
    if shutil.which("cc") is None:
        pytest.skip("no C compiler")
    out, final = _dataplane(tmp_path, "pingpong", tls="tcp")
    for r in final:
        assert r["dp"]["tcp_send"] >= 19990 and r["dp"]["tcp_recv"] >= 19990, r
        assert r["dp"]["tag_expected"] >= 19990, r
        assert r["py_entries"] < 20000 // 4, r


def test_the_harness_over_tcp_active_messages_in_c(tmp_path):
    """The whole harness over tcp alone: every check passes, and the eager
    active messages (2000, in order with a rendezvous one among them) are
    written on the socket and read from it in C (native/dp/stream.c's
    reader hands a claimed id's frames to libucp's hook) when it has the reading."""
    if shutil.which("cc") is None:
        pytest.skip("no C compiler")
    out, final = _dataplane(tmp_path, tls="tcp")
    sender, receiver = sorted(final, key=lambda r: r["dp"]["am_send"], reverse=True)
    assert sender["dp"]["am_send"] >= 1900, sender
    # (frames that arrive while a pass of Python's has the reading back are
    # read by the transport in Python: 1000-1999 of 2000 were C's here,
    # under load)
    assert receiver["dp"]["am_recv"] >= 200, receiver


@pytest.fixture(scope="module")
def basics(tmp_path_factory):
    return _compile(tmp_path_factory.mktemp("mpi"), "mpi_basics.c", "mpi_basics", MPICC)


@needs_mpich
@pytest.mark.parametrize("n", [2, 3])
def test_mpich_c_program(basics, n):
    rc, out, err = _run([UCXPY_UCX, "--check", MPIEXEC, "-n", str(n), basics])
    assert rc == 0, out + err
    assert sorted(out.split("\n"))[-n:] == [f"rank {r}: OK" for r in range(n)]


def _reported(err: str, name: str) -> list:
    """Each rank's data-plane counter ``name`` (0 when not printed) from
    ucxpy-ucx --report's lines."""
    out = []
    for ln in err.splitlines():
        if ln.startswith("ucxpy-ucx --report:"):
            dp = ln.split("; data plane ", 1)[1].split(";", 1)[0] if "; data plane " in ln else ""
            m = re.search(rf"\b{name}=(\d+)", dp)
            out.append(int(m.group(1)) if m else 0)
    return out


def test_a_plug_ins_c_half_under_libucp_two_processes(tmp_path):
    """tests/ucp/dataplane.c with UCXPY_PROTO_PLUGIN=pipelined-copy:64K-inf:
    every check passes (rendezvous into receives posted before and after
    the offer, a synchronous send, a window of 384 KiB ones), the plug-in's
    C half (native/proto/pipelined_copy.c) sending the messages of its sizes
    (offers, fragments) and filling the receives that were posted before
    their offer, in C; an offer that came first goes to the Python half,
    which ends the C half's send (the reports: who carried what)."""
    if shutil.which("cc") is None:
        pytest.skip("no C compiler")
    out, final = _dataplane(tmp_path, env={"UCXPY_PROTO_PLUGIN": "pipelined-copy:64K-inf"})
    sender, receiver = sorted(final, key=lambda r: r["dp"]["proto_send"], reverse=True)
    assert sender["dp"]["proto_send"] >= 8 and sender["dp"]["rndv_offer"] <= 1, sender
    assert receiver["dp"]["proto_recv"] >= 8, receiver
    assert receiver["dp"]["proto_frame"] >= 8 * 24, receiver     # (fragments, in C)


@needs_mpich
@pytest.mark.parametrize("mode", ["c-half", "python-half", "traced"])
def test_a_protocol_plug_in_under_mpich(basics, tmp_path, mode):
    """UCXPY_PROTO_PLUGIN=pipelined-copy:64K-inf under MPICH's C program
    through libucp (issue 43, step 5): mpi_basics.c checks its data (ring
    exchanges up to 4 MiB, a 2 MiB Bcast), every message of 64 KiB and more
    moving by the plug-in: by its C half where both sides are libucp's
    (the reports' proto_send, proto_frame), or, with UCXPY_PROTO_NATIVE=n,
    all by its Python half (receives the data plane posted are adopted when
    the plug-in's offer matches them); traced, ucxpy-trace merges the
    plug-in's events, an offer, a clear-to-send, the fragments' send and the
    receive per message (tracing keeps libucp off the data plane)."""
    import json
    trace = tmp_path / "trace"
    trace.mkdir()
    env = dict(os.environ, UCXPY_PROTO_PLUGIN="pipelined-copy:64K-inf",
               UCXPY_PIPELINED_FRAG="32K")
    if mode == "traced":
        env["UCXPY_TRACE"] = str(trace)
    if mode == "python-half":
        env["UCXPY_PROTO_NATIVE"] = "n"
    rc, out, err = _run([UCXPY_UCX, "--check", "--report", MPIEXEC, "-n", "2", basics], env=env)
    assert rc == 0, out + err
    assert sorted(out.split("\n"))[-2:] == ["rank 0: OK", "rank 1: OK"], out + err
    sends, frames = _reported(err, "proto_send"), _reported(err, "proto_frame")
    assert len(sends) == 2, err
    if mode == "c-half":
        # every send of 64 KiB and more once the endpoint has its lane, and
        # each one's clear-to-send; which receives the C half fills depends
        # on whether they were posted before the offer came (the two-process
        # harness above pins that down)
        assert sum(sends) >= 4 and sum(frames) >= sum(sends), err
    else:
        assert sum(sends) == 0 and sum(frames) == 0, err
    if mode != "traced":
        return
    merged = tmp_path / "job.json"
    subprocess.run([os.path.join(BIN, "ucxpy-trace"), "merge", str(trace), "-o", str(merged)],
                   check=True, capture_output=True, timeout=120)
    events = json.loads(merged.read_text())
    events = events["traceEvents"] if isinstance(events, dict) else events
    names = {}
    for e in events:
        if e.get("cat") == "plugin":
            names[e["name"]] = names.get(e["name"], 0) + 1
    offers = names.get("pipelined-copy:offer", 0)
    assert offers >= 4, names
    assert names.get("pipelined-copy:received") == offers == names.get("pipelined-copy:cts")


@needs_mpich
def test_mpich_thread_multiple(tmp_path):
    """MPI_THREAD_MULTIPLE: four threads per rank exchange eager and
    rendezvous messages at once through libucp (tests/ucp/mpi_threads.c)."""
    exe = _compile(tmp_path, "mpi_threads.c", "mpi_threads", MPICC, ["-lpthread"])
    rc, out, err = _run([UCXPY_UCX, "--check", MPIEXEC, "-n", "2", exe])
    assert rc == 0, out + err
    assert sorted(out.split("\n"))[-2:] == ["rank 0: OK", "rank 1: OK"], out + err


@needs_mpich
@pytest.mark.parametrize("var", ["UCXPY_TLS", "UCX_TLS"])
def test_mpich_c_program_tcp_only(basics, var):
    """MPICH's traffic over ucxpy's tcp transport alone: its eager messages
    read and written in C (the reports' tcp_recv, tcp_send), the rest by
    Python's path on the same connections, in order (the program checks
    every datum, RMA included).  Selected by ucxpy's variable, and by UCX's
    own (``UCX_TLS=tcp``, which libucp maps: ucxpy/tools/ucxvars.py)."""
    import re
    env = dict(os.environ, UCXPY_TCP_NATIVE="y", **{var: "tcp"})
    env.pop("UCXPY_TLS" if var == "UCX_TLS" else "UCX_TLS", None)
    rc, out, err = _run([UCXPY_UCX, "--check", "--report", MPIEXEC, "-n", "2", basics], env=env)
    assert rc == 0, out + err
    assert out.count(": OK") == 2
    reads = [int(m) for m in re.findall(r"tcp_recv=(\d+)", out + err)]
    assert len(reads) == 2 and min(reads) >= 10, out + err


@needs_mpich
def test_reference_run_is_refused_by_check(basics, tmp_path):
    """--check fails a job that ran on another UCX (here: the bundled one,
    LD_LIBRARY_PATH lost): a fallback is never a pass."""
    folder = str(tmp_path)
    env = ucx.environment(reference=True)
    env["UCXPY_UCP_REPORT"] = folder
    rc, out, err = _run([MPIEXEC, "-n", "2", basics], env=env)
    assert rc == 0, out + err                      # the reference itself works
    problems = ucx.check_reports(folder, 2)
    assert problems and "0 of 2 ranks" in problems[0]


MPI4PY_PROG = textwrap.dedent("""
    from mpi4py import MPI
    import numpy as np
    c = MPI.COMM_WORLD
    r, n = c.rank, c.size
    a = np.arange(200000, dtype='d') + r
    b = np.empty_like(a)
    c.Allreduce(a, b)
    assert b[7] == n * 7 + n * (n - 1) / 2, b[7]
    assert c.allgather(r) == list(range(n))
    req = c.isend({'from': r}, dest=(r + 1) % n, tag=3)
    got = c.recv(source=(r - 1) % n, tag=3)
    req.wait()
    assert got == {'from': (r - 1) % n}
    w = MPI.Win.Allocate(64, 1, comm=c)
    w.Fence()
    w.Put(np.full(8, r, dtype='b'), (r + 1) % n)
    w.Fence()
    mem = np.frombuffer(w.tomemory(), dtype='b')
    assert (mem[:8] == (r - 1) % n).all(), mem[:8]
    w.Free()
    print('OK', r, MPI.Get_library_version().split()[2])
""")


@needs_mpich
def test_mpi4py_wheel_on_ucxpy(tmp_path):
    """The real mpi4py (its compiled MPI module) on MPICH over ucxpy."""
    pytest.importorskip("mpi4py")
    prog = tmp_path / "prog.py"
    prog.write_text(MPI4PY_PROG)
    rc, out, err = _run([UCXPY_UCX, "--check", MPIEXEC, "-n", "2", sys.executable, str(prog)])
    assert rc == 0, out + err
    assert out.count("OK") == 2


GIL_HOLDER_PROG = textwrap.dedent("""
    import ctypes, sys, threading
    from mpi4py import MPI
    lib = ctypes.CDLL(sys.argv[1])
    lib.ucxpy_pingpong.restype = ctypes.c_double
    lib.ucxpy_pingpong.argtypes = [ctypes.c_int]
    comm = MPI.COMM_WORLD
    stop = False
    def hold():                       # the GIL, kept while it sleeps in C
        usleep = ctypes.PyDLL(None).usleep
        while not stop:
            usleep(1000)
    t = threading.Thread(target=hold)
    if comm.rank == 0:
        t.start()
    half = [lib.ucxpy_pingpong(20000) for _ in range(3)]   # C, the GIL dropped
    stop = True
    if t.is_alive():
        t.join()
    assert min(half) > 0, half        # -1: a message lost its count
    assert comm.allreduce(comm.rank + 1) == 3
    print("OK", comm.rank)
""")


@needs_mpich
def test_timer_passes_leave_a_gil_holder_to_their_thread(tmp_path):
    """A Python thread holding the GIL (sleeping in C 1 ms at a time, as a
    compute call does) beside MPICH's C ping-pong through libucp: libucp's
    timer pass waits for the GIL once, then runs on the worker's timer
    thread (native/ucp/worker.c), so the caller's progress goes on in C.
    Every message carries its count, the job goes on from Python after it,
    and MPI_Finalize stops the thread (the reports count its passes)."""
    import re
    pytest.importorskip("mpi4py")
    lib = tmp_path / "libpingpong.so"
    subprocess.run([MPICC, "-O2", "-shared", "-fPIC", "-o", str(lib),
                    os.path.join(ROOT, "bench", "c", "pingpong_lib.c")],
                   check=True, capture_output=True, timeout=120)
    prog = tmp_path / "holder.py"
    prog.write_text(GIL_HOLDER_PROG)
    rc, out, err = _run([UCXPY_UCX, "--check", "--report", MPIEXEC, "-n", "2", sys.executable,
                         str(prog), str(lib)], timeout=180)
    assert rc == 0 and out.count("OK") == 2, out + err
    threads = [int(m) for m in re.findall(r"thread=(\d+)", out + err)]
    assert threads and max(threads) >= 1, out + err


@needs_mpich
@pytest.mark.parametrize("tls", ["shm,tcp", "tcp"])
def test_killed_rank_ends_the_job(tmp_path, tls):
    """A rank killed while the others wait on it: the job ends with an error,
    never a hang (over tcp alone too, where the survivors' progress reads
    their connections in C: the end of the stream goes back to Python)."""
    pytest.importorskip("mpi4py")
    prog = tmp_path / "die.py"
    prog.write_text(textwrap.dedent("""
        import os, signal
        from mpi4py import MPI
        c = MPI.COMM_WORLD
        c.Barrier()
        if c.rank == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        c.recv(source=1)
    """))
    rc, out, err = _run([UCXPY_UCX, MPIEXEC, "-n", "3", sys.executable, str(prog)], timeout=90,
                        env=dict(os.environ, UCXPY_TLS=tls, UCXPY_TCP_NATIVE="y"))
    assert rc != 0


@needs_mpich
def test_killed_receiver_of_an_offer_ends_the_job(tmp_path):
    """A rendezvous send libucp offered through the data plane (384 KiB over
    shm: native/dp/rndv.c) whose receiver is killed before it answers: the
    sender's request fails (the peer's failure answers the data plane's
    sends) and the job ends with an error, never a hang."""
    pytest.importorskip("mpi4py")
    prog = tmp_path / "die_offer.py"
    prog.write_text(textwrap.dedent("""
        import os, signal
        import numpy as np
        from mpi4py import MPI
        c = MPI.COMM_WORLD
        big = np.ones(384 * 1024, np.uint8)
        c.Barrier()
        if c.rank == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        req = c.Isend(big, dest=1, tag=5)
        req.Wait()
    """))
    env = dict(os.environ, UCXPY_TLS="shm")
    rc, out, err = _run([UCXPY_UCX, MPIEXEC, "-n", "2", sys.executable, str(prog)], timeout=90,
                        env=env)
    assert rc != 0


def test_info_names_the_libucp():
    out = subprocess.run([os.path.join(BIN, "ucxpy-info"), "--libucp"], capture_output=True,
                         text=True, timeout=60).stdout
    assert f"under ucxpy-ucx: {os.path.realpath(ucx.LIBUCP)}" in out


def test_every_api_entry_point_is_exported():
    """Each function of UCP's API (the 1.13 headers) is exported by our
    libucp: implemented, or in unimplemented.c's abort table."""
    import re
    text = ""
    for h in ("ucp.h", "ucp_compat.h"):
        path = os.path.join("/usr/include/ucp/api", h)
        if not os.path.exists(path):
            pytest.skip("no UCX headers")
        text += open(path).read()
    inline = {"ucp_init", "ucp_dt_make_contig", "ucp_dt_make_iov", "ucp_dt_make_config"}
    api = set(re.findall(r"\b(ucp_[a-z0-9_]+)\s*\(", text)) - inline
    api = {n for n in api if not n.endswith("_t")}
    nm = subprocess.run(["nm", "-D", "--defined-only", ucx.LIBUCP], capture_output=True,
                        text=True, check=True).stdout
    exported = {line.split()[-1] for line in nm.splitlines()}
    assert api - exported == set()
    assert all(n.startswith(("ucp_", "ucs_")) for n in exported)


def test_unimplemented_entry_point_aborts_naming_itself(tmp_path):
    if shutil.which("cc") is None:
        pytest.skip("no C compiler")
    src = tmp_path / "stream.c"
    src.write_text("#include <ucp/api/ucp.h>\n"
                   "int main(void) { ucp_stream_worker_poll(NULL, NULL, 0, 0); return 0; }\n")
    lib = os.path.dirname(ucx.LIBUCP)
    subprocess.run(["cc", "-o", str(tmp_path / "stream"), str(src), "-L" + lib, "-lucp",
                    "-Wl,-rpath," + lib], check=True, timeout=60)
    rc, out, err = _run([str(tmp_path / "stream")], timeout=60)
    assert rc != 0 and "ucp_stream_worker_poll is not implemented" in err
