"""ucxpy-ucx: run a program built for UCX (MPICH's ch4:ucx, mpi4py's wheel) on ucxpy.

    ucxpy-ucx mpiexec -n 4 ./a.out
    ucxpy-ucx --check mpiexec -n 4 python -m mpi4py prog.py
    ucxpy-ucx --reference mpiexec -n 4 ./a.out     # the same, on the real UCX

It puts ucxpy's ``libucp.so.0`` (and libucs/libuct/libucm) first on
``LD_LIBRARY_PATH``, so MPICH's ``libmpi.so.12`` loads them instead of the UCX
its RUNPATH names, and selects MPICH's UCX netmod for all traffic, on-node
included (``MPIR_CVAR_CH4_NETMOD=ucx``, ``MPIR_CVAR_NOLOCAL=1``; set either to
override), and gives the job its key (``UCXPY_AUTH_KEY``, unless set), which
the ranks' tcp and ofi connections prove, as under ``ucxpy-run``.  ``--reference`` sets the same MPICH variables and leaves the
library path alone: the real UCX, for side-by-side runs.

Without ``--check`` a job that succeeded with no process on ucxpy's
libucp.so.0 gets a warning.  ``--check`` proves that ucxpy carried the job: every rank's libucp worker
writes a report (``UCXPY_UCP_REPORT``, ucxpy/capi.py; when made, and again
with its counts at the end), and the run fails unless there is one per rank (``--ranks``, default: mpiexec's ``-n``) naming
this libucp.so.0, with operations counted (in a job of more than one rank
that succeeded: MPICH sends a rank's messages to itself without its netmod,
and a job killed on purpose proves itself by the library its ranks mapped).  A rank that silently loaded
another UCX writes none.  ``--check --report`` also prints, per rank, the
operations its libucp was asked for, what ucxpy's native data plane executed
(without Python) and how many times libucp entered Python.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile

from .. import auth, config

LIB_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "lib")
LIBUCP = os.path.join(LIB_DIR, "libucp.so.0")


#: Open MPI's selection (``OMPI_MCA_<name>``): its UCX components forced, so
#: that a job whose UCX component cannot run fails instead of passing on ob1,
#: its shared memory or OSHMEM's other components.  ``pml_ucx_tls`` /
#: ``pml_ucx_devices`` = ``any``: Open MPI's defaults keep only the UCX
#: transports and devices they name (rc, ud, dc, ...), and ucxpy's libucp
#: lists none of those (ucp_context_print_info prints ucxpy's own).  OSHMEM's
#: symmetric heap comes from ``sshmem ucx``: ucp_mem_map allocates it at the
#: fixed address OSHMEM asks for (same-host PEs then map each other's heap:
#: puts, gets and atomics are loads and stores, and shmem_ptr works);
#: ``OMPI_MCA_sshmem=mmap`` in the environment registers an mmap'ed heap
#: instead (peers reach it by CMA or active messages).
OPENMPI = {
    "pml": "ucx", "osc": "ucx", "spml": "ucx", "atomic": "ucx", "sshmem": "ucx",
    "pml_ucx_tls": "any", "pml_ucx_devices": "any",
}
#: Variables Open MPI's launcher hands to ranks on other hosts (its local
#: ranks inherit its environment): ``-x NAME`` for each one set, added to the
#: command by :func:`command` (Open MPI refuses ``-x`` together with
#: ``mca_base_env_list``, so the user's own ``-x`` keeps working).
FORWARD = ("LD_LIBRARY_PATH", auth.ENV_KEY, "UCXPY_UCP_REPORT", "UCXPY_TLS",
           "UCXPY_PYTHONPATH")


def environment(reference: bool = False, base=None) -> dict:
    """The environment of a run on ucxpy (or on the real UCX: ``reference``):
    MPICH's variables and Open MPI's, whichever launcher the command uses."""
    env = dict(os.environ if base is None else base)
    env.setdefault("MPIR_CVAR_CH4_NETMOD", "ucx")
    env.setdefault("MPIR_CVAR_NOLOCAL", "1")
    for name, value in OPENMPI.items():
        env.setdefault("OMPI_MCA_" + name, value)
    if not reference:
        # the job key every rank proves on connecting (ucxpy.auth), as ucxpy-run
        # hands its ranks: the launcher passes our environment on to them
        env.setdefault(auth.ENV_KEY, auth.generate_key())
        old = env.get("LD_LIBRARY_PATH")
        env["LD_LIBRARY_PATH"] = LIB_DIR + (":" + old if old else "")
    return env


def is_openmpi_launcher(program: str) -> bool:
    """Whether ``program`` (a command's first word) is Open MPI's launcher
    (``mpirun``/``mpiexec``/``oshrun`` are links to its ``orterun``)."""
    path = shutil.which(program)
    return path is not None and os.path.basename(os.path.realpath(path)) in ("orterun", "prterun")


def command(argv: list, env: dict) -> list:
    """``argv`` with what its launcher needs to carry ``env`` to every rank:
    for Open MPI's, ``-x NAME`` for the :data:`FORWARD` variables set."""
    if not argv or not is_openmpi_launcher(argv[0]):
        return list(argv)
    extra = []
    for name in FORWARD:
        if name in env:
            extra += ["-x", name]
    return [argv[0], *extra, *argv[1:]]


def libmpi() -> str:
    """MPICH's libmpi.so.12 of this environment's ``mpiexec``/``mpicc`` (the
    mpich wheel), or ''."""
    prefixes = [sys.prefix]
    exe = shutil.which("mpiexec") or shutil.which("mpicc")
    if exe:
        prefixes.append(os.path.dirname(os.path.dirname(os.path.realpath(exe))))
    for prefix in prefixes:
        path = os.path.join(prefix, "lib", "libmpi.so.12")
        if os.path.exists(path):
            return path
    return ""


def resolved_libucp(env=None, library: str = "") -> str:
    """The libucp.so.0 the dynamic loader gives ``library`` (MPICH's libmpi)
    under ``env`` (ldd's answer), or ''."""
    library = library or libmpi()
    if not library:
        return ""
    try:
        out = subprocess.run(["ldd", library], env=env, capture_output=True, text=True,
                             timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return ""
    for line in out.splitlines():
        if line.strip().startswith("libucp.so.0") and "=>" in line:
            return os.path.realpath(line.split("=>")[1].split("(")[0].strip())
    return ""


def check_reports(folder: str, ranks: int, require_ops: bool = True) -> list:
    """Problems with the reports in ``folder`` for a job of ``ranks`` ranks
    (empty: ucxpy carried every rank).  ``require_ops``: some rank counted
    an operation (a job that failed or was killed, as tests that expect a
    fatal error are, proves itself by the library its ranks mapped)."""
    reports = []
    for path in sorted(glob.glob(os.path.join(folder, "*.json"))):
        with open(path) as f:
            reports.append(json.load(f))
    problems = []
    pids = {r["pid"] for r in reports}
    if len(pids) < ranks:
        problems.append(f"{len(pids)} of {ranks} ranks reported a ucxpy libucp worker")
    ours = os.path.realpath(LIBUCP)
    for r in reports:
        if r["libucp"] != ours:
            problems.append(f"pid {r['pid']} mapped {r['libucp'] or 'no libucp'}, not {ours}")
    # one rank sends to itself inside MPICH (its self path), not through the
    # netmod: a single-rank job proves itself by the library it mapped alone
    if require_ops and ranks > 1 and reports and \
            not any(sum(r["ops"].values()) for r in reports):
        problems.append("no rank counted an operation")
    return problems


def carried(folder: str) -> list:
    """One line per rank's final report: what its libucp was asked for
    (operations), what ucxpy's data plane executed without Python, and how
    many times libucp entered Python (the proof of who carried the traffic)."""
    lines = []
    for path in sorted(glob.glob(os.path.join(folder, "*.json"))):
        with open(path) as f:
            r = json.load(f)
        ops = " ".join(f"{k}={v}" for k, v in r["ops"].items() if v) or "none"
        dp = " ".join(f"{k}={v}" for k, v in r.get("dp", {}).items() if v) or "none"
        pr = r.get("progress", {})
        why = " ".join(f"{k[3:]}={v}" for k, v in pr.items()
                       if k.startswith("py_") and k != "py_ns" and v) or "none"
        lines.append(f"pid {r['pid']} on {r['host']}: operations {ops}; data plane {dp}; "
                     f"progress calls {pr.get('progress_c', 0)} in C alone, "
                     f"{pr.get('progress_py', 0)} with Python's (why: {why}; "
                     f"{pr.get('py_ns', 0) / 1e6:.1f} ms in them); "
                     f"entries into Python {r.get('py_entries', '?')}")
    return lines


def _ranks_of(cmd) -> int:
    for i, a in enumerate(cmd[:-1]):
        if a in ("-n", "-np") and cmd[i + 1].isdigit():
            return int(cmd[i + 1])
    return 1


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="ucxpy-ucx", description=__doc__.split("\n\n")[0])
    p.add_argument("--reference", action="store_true",
                   help="run on the real UCX (MPICH's variables only)")
    p.add_argument("--check", action="store_true",
                   help="fail unless every rank ran on this libucp.so.0 (reports)")
    p.add_argument("--report", action="store_true",
                   help="with --check: print, per rank, its operations, what ucxpy's data "
                        "plane executed and how often libucp entered Python")
    p.add_argument("--ranks", type=int, default=0,
                   help="ranks --check expects (default: the command's -n)")
    p.add_argument("--which", action="store_true",
                   help="print the libucp.so.0 MPICH's libmpi would load, and exit")
    p.add_argument("command", nargs=argparse.REMAINDER)
    args = p.parse_args(argv)
    env = environment(args.reference)
    if args.which:
        print(resolved_libucp(env) or "(no MPICH libmpi.so.12 found)")
        return 0
    if not args.command:
        p.error("no command")
    if not args.reference and not os.path.exists(LIBUCP):
        print(f"ucxpy-ucx: {LIBUCP} is not built (needs libucx-dev at install)", file=sys.stderr)
        return 2
    folder = None
    if not args.reference and (args.check or not config.setting("UCXPY_UCP_REPORT", env)):
        # the ranks' reports: checked with --check; without, a job none of
        # whose processes loaded our library is still named (a warning)
        folder = tempfile.mkdtemp(prefix="ucxpy-ucp-")
        env["UCXPY_UCP_REPORT"] = folder
    try:
        rc = subprocess.call(command(args.command, env), env=env)
        if folder is not None and not args.check:
            if rc == 0 and not glob.glob(os.path.join(folder, "*.json")):
                print(f"ucxpy-ucx: warning: no process of this job loaded ucxpy's "
                      f"libucp.so.0 ({LIBUCP}): its MPI is not built for UCX, links a UCX "
                      f"statically, or was told to use another path; --check makes this "
                      f"an error", file=sys.stderr)
        elif folder is not None:
            problems = check_reports(folder, args.ranks or _ranks_of(args.command),
                                     require_ops=rc == 0)
            for line in carried(folder) if args.report else ():
                print(f"ucxpy-ucx --report: {line}", file=sys.stderr)
            for msg in problems:
                print(f"ucxpy-ucx --check: {msg}", file=sys.stderr)
            if problems and any(" ranks reported" in m for m in problems):
                print("ucxpy-ucx --check: those ranks did not load ucxpy's libucp.so.0 "
                      f"({LIBUCP}): their MPI is not built for UCX, links a UCX statically, "
                      "or was told to use another path (an OMPI_MCA_pml / MPIR_CVAR_* of "
                      "the environment overrides ucxpy-ucx's)", file=sys.stderr)
            if problems and rc == 0:
                rc = 3
    finally:
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)
    return rc


if __name__ == "__main__":
    sys.exit(main())
