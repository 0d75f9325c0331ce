"""NIXL (the KV-cache transfer library of vLLM, SGLang and Dynamo) on
ucxpy's libucp: its UCX backend, loaded from the ``nixl-cu12`` wheel, runs
on ucxpy under ``ucxpy-ucx`` (the plugin's renamed UCX libraries linked to
ours, ``NIXL_PLUGIN_DIR`` at the plugins that find UCX through RUNPATH),
beside the same program on NIXL's bundled UCX (``--reference``) in the same
run.  ``--check`` proves each process ran on ours and carried operations.
And ``ucxpy-info --abi-check``: what a library needs of UCX that ours lacks
or only stubs, for MPICH's, Open MPI's, OSHMEM's and NIXL's libraries."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from conftest import ROOT, run_session
from ucxpy.tools import ucx

BIN = os.path.dirname(sys.executable)
UCXPY_UCX = os.path.join(BIN, "ucxpy-ucx")
UCXPY_INFO = os.path.join(BIN, "ucxpy-info")
PROG = os.path.join(ROOT, "tests", "progs", "nixl_xfer.py")
OPENMPI_MCA = "/usr/lib/x86_64-linux-gnu/openmpi/lib/openmpi3"

pytestmark = [
    pytest.mark.skipif(not os.path.exists(ucx.LIBUCP), reason="libucp.so.0 not built"),
    pytest.mark.timeout(300),
]
needs_nixl = pytest.mark.skipif(not ucx.nixl_plugin_dir(),
                                reason="no NIXL wheel (pip install '.[nixl]')")


def _ok_lines(out: str) -> list:
    return [line for line in out.splitlines() if line.startswith("OK ")]


def _pair(first: list, second: list, timeout=120) -> tuple:
    """Start ``first`` (a server: target, decode), run ``second`` to its end
    beside it, then wait for ``first``: both ``(rc, stdout, stderr)``; the
    job key comes from their own ``--key-file``, not the environment."""
    env = dict(os.environ)
    env.pop("UCXPY_AUTH_KEY", None)
    p = subprocess.Popen(first, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=env, start_new_session=True)
    try:
        second_res = run_session(second, timeout=timeout, env=env)
        out, err = p.communicate(timeout=timeout)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, 9)
            p.wait()
    return (p.returncode, out, err), second_res


@needs_nixl
def test_nixl_in_one_process_on_ours_and_on_its_own_ucx():
    """Two agents in one process: a 1 MiB WRITE with a notification, a 64
    KiB READ, 64 blocks of 16 KiB with one notification, every byte checked;
    on ucxpy's libucp (the process proves it, with puts and gets counted)
    and on NIXL's bundled UCX, the same lines."""
    rc, out, err = run_session([UCXPY_UCX, "--check", "--report", sys.executable, PROG,
                                "local"], timeout=180)
    assert rc == 0, out + err
    ours = _ok_lines(out)
    assert len(ours) == 3, out + err
    assert "put=" in err and "ucxpy-ucx --check:" not in err, err
    # the reference: every check passes on it too (its exit is its own: NIXL
    # on its bundled UCX sometimes dies of SIGSEGV in its teardown, after them)
    rc, out, err = run_session([UCXPY_UCX, "--reference", sys.executable, PROG, "local"],
                               timeout=180)
    assert _ok_lines(out) == ours, out + err
    print(f"reference: exit {rc}, {len(_ok_lines(out))} checks passed")


@needs_nixl
def test_nixl_two_processes_started_separately_share_a_key_file(tmp_path):
    """A target and an initiator started by two ucxpy-ucx commands (as
    prefill and decode servers are), their metadata through files: the
    first makes the key file, the second reads it; 3 MiB WRITE with a
    notification and a 1 MiB READ, checked on both sides, each process on
    ucxpy's libucp with operations counted."""
    key = tmp_path / "job.key"
    cmd = [UCXPY_UCX, "--check", "--key-file", str(key), sys.executable, PROG]
    (trc, tout, terr), (rc, out, err) = _pair(cmd + ["target", str(tmp_path)],
                                              cmd + ["initiator", str(tmp_path)])
    assert rc == 0 and len(_ok_lines(out)) == 2, out + err
    assert trc == 0 and len(_ok_lines(tout)) == 2, tout + terr
    assert oct(key.stat().st_mode & 0o777) == "0o600"


@needs_nixl
def test_nixl_bad_descriptors_get_its_error_on_both():
    """A transfer from unregistered memory and one past the remote
    registration: NIXL's error on ours as on its bundled UCX, nothing
    crashes, and a good transfer works after them."""
    outs = []
    for mode in ("--check", "--reference"):
        rc, out, err = run_session([UCXPY_UCX, mode, sys.executable, PROG, "errors"],
                                   timeout=120)
        assert (rc == 0 or mode == "--reference") and len(_ok_lines(out)) == 3, out + err
        outs.append(_ok_lines(out))
    assert outs[0] == outs[1]


@needs_nixl
def test_nixl_write_to_a_killed_target_fails_not_hangs(tmp_path):
    """The target is killed after a first WRITE: the next WRITEs end in
    NIXL's error state within seconds (the initiator's own limit is 60 s)."""
    cmd = [UCXPY_UCX, "--key-file", str(tmp_path / "job.key"), sys.executable, PROG]
    _, (rc, out, err) = _pair(cmd + ["target", str(tmp_path)],
                              cmd + ["dead-target", str(tmp_path)])
    assert rc == 0 and "OK a WRITE to a killed target fails" in out, out + err


@needs_nixl
def test_kv_disaggregation_example_matches_one_process_bitwise(tmp_path):
    """examples/nixl_kv_disagg.py: the decode process, fed the prefill
    process's KV cache by NIXL WRITEs of its blocks over ucxpy, generates the
    tokens one process does, with every step's logits equal bitwise."""
    example = os.path.join(ROOT, "examples", "nixl_kv_disagg.py")
    rc, single, err = run_session([sys.executable, example, "single"], timeout=120)
    assert rc == 0 and single.startswith("tokens "), single + err
    cmd = [UCXPY_UCX, "--check", "--key-file", str(tmp_path / "kv.key"), sys.executable,
           example]
    (drc, dout, derr), (rc, out, err) = _pair(cmd + ["decode", str(tmp_path)],
                                              cmd + ["prefill", str(tmp_path)])
    assert rc == 0 and "blocks of" in out, out + err
    assert drc == 0, dout + derr
    lines = [ln for ln in dout.splitlines() if ln.startswith(("tokens ", "logits sha256 "))]
    assert lines == single.splitlines(), (dout, single)


def test_abi_check_of_the_ucp_clients(tmp_path):
    """``ucxpy-info --abi-check``: MPICH's libmpi, Open MPI's and OSHMEM's
    UCX components and NIXL's UCX plugin find every UCX symbol they need in
    ours (NIXL's GPU device calls are there, as stubs that abort, and are
    listed so); a library needing one we lack is named with it, exit 1."""
    libs = []
    mpi = ucx.libmpi()
    if mpi:
        libs.append(mpi)
    libs += [os.path.join(OPENMPI_MCA, f"mca_{c}_ucx.so")
             for c in ("pml", "osc", "spml", "atomic", "sshmem")
             if os.path.exists(os.path.join(OPENMPI_MCA, f"mca_{c}_ucx.so"))]
    plugins = ucx.nixl_plugin_dir()
    if plugins:
        libs.append(os.path.join(plugins, "libplugin_UCX.so"))
    if not libs:
        pytest.skip("no UCP client library here")
    r = subprocess.run([UCXPY_INFO] + [a for lib in libs for a in ("--abi-check", lib)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.count("needs ") == len(libs) and "missing" not in r.stdout, r.stdout
    if plugins:
        nixl = r.stdout.split(os.path.join(plugins, "libplugin_UCX.so"))[1]
        assert "ucp_device_remote_mem_list_create" in nixl, r.stdout
    if shutil.which("cc") is None:
        return
    c = tmp_path / "needs.c"
    c.write_text("void ucp_no_such_call(void);\nvoid ucp_stream_send_nbx(void);\n"
                 "void f(void) { ucp_no_such_call(); ucp_stream_send_nbx(); }\n")
    so = str(tmp_path / "libneeds.so")
    subprocess.run(["cc", "-shared", "-fPIC", "-o", so, str(c)], check=True, timeout=60)
    r = subprocess.run([UCXPY_INFO, "--abi-check", so], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 1, r.stdout
    missing, stubs = r.stdout.split("present but not implemented")
    assert "ucp_no_such_call" in missing and "ucp_stream_send_nbx" in stubs, r.stdout
