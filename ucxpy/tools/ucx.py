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

NIXL: with the ``nixl-cu12`` wheel installed, ``ucxpy-ucx --check python
prog.py`` runs a NIXL program's UCX backend on ucxpy: its plugin needs UCX
under the wheel's renamed names (``libucp-<hash>.so.0.0.0``, read from the
plugin's ``DT_NEEDED``), which a directory of links to ours, first on
``LD_LIBRARY_PATH``, provides, and ``NIXL_PLUGIN_DIR`` names the wheel's
plugins that find UCX through RUNPATH.  Processes started separately that
connect to each other (prefill and decode servers) share a job key:
``--key-file F`` (made, mode 600, by the first, read by the others).

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
import hashlib
import json
import os
import re
import shutil
import struct
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


def environment(reference: bool = False, base=None, key_file: str = "") -> dict:
    """The environment of a run on ucxpy (or on the real UCX: ``reference``):
    MPICH's variables and Open MPI's, whichever launcher the command uses,
    and NIXL's UCX plugin pointed at ucxpy's libraries (:func:`nixl_setup`).
    ``key_file``: the job key is the one in that file (made if missing:
    :func:`shared_key_file`), for processes started separately."""
    env = dict(os.environ if base is None else base)
    env.setdefault("MPIR_CVAR_CH4_NETMOD", "ucx")
    env.setdefault("MPIR_CVAR_NOLOCAL", "1")
    for name, value in OPENMPI.items():
        env.setdefault("OMPI_MCA_" + name, value)
    if not reference:
        # the job key every rank proves on connecting (ucxpy.auth), as ucxpy-run
        # hands its ranks: the launcher passes our environment on to them
        if key_file:
            env.pop(auth.ENV_KEY, None)
            env[auth.ENV_KEY_FILE] = shared_key_file(key_file)
        elif not env.get(auth.ENV_KEY_FILE):
            env.setdefault(auth.ENV_KEY, auth.generate_key())
        old = env.get("LD_LIBRARY_PATH")
        path = [LIB_DIR] + nixl_setup(env) + ([old] if old else [])
        env["LD_LIBRARY_PATH"] = ":".join(path)
    return env


def shared_key_file(path: str) -> str:
    """``path`` (absolute), holding a job key: made, readable by this user
    alone, with a fresh key unless it exists (the first of the processes
    started separately makes it, the others read it); raises ConfigError
    (what is wrong with it) when it exists and is not a key file of ours."""
    path = os.path.abspath(path)
    if not os.path.exists(path):
        # written whole under another name, then linked into place: a process
        # started at the same moment reads the first one's key, never an
        # empty file (link fails when another made it first)
        tmp = f"{path}.{os.getpid()}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            with os.fdopen(fd, "w") as f:
                f.write(auth.generate_key() + "\n")
            os.link(tmp, path)
        except FileExistsError:
            pass
        finally:
            os.unlink(tmp)
    auth.read_key_file(path)
    return path


# -- NIXL ------------------------------------------------------------------------------
#: the packages of NIXL's wheels (the CUDA 12 and 13 builds, a source build)
NIXL_PACKAGES = ("nixl_cu12", "nixl_cu13", "nixl")
#: the renamed UCX libraries of a wheel (auditwheel: ``libucp-b39b3ed9.so.0.0.0``)
_RENAMED = re.compile(r"^lib(ucp|ucs|uct|ucm)-[0-9a-f]+\.so(\.\d+)*$")


def nixl_plugin_dir() -> str:
    """The plugin directory of the installed NIXL wheel whose UCX plugin
    finds its UCX through RUNPATH (``<package>.libs/nixl``), or ''.  (The
    wheel's other copy, in ``.<package>.mesonpy.libs/plugins``, has an RPATH,
    which LD_LIBRARY_PATH cannot override: NIXL's default.)"""
    import importlib.util       # deferred: only for a run under ucxpy-ucx
    for name in NIXL_PACKAGES:
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            continue
        if spec is None or not spec.origin:
            continue
        d = os.path.join(os.path.dirname(os.path.dirname(spec.origin)), name + ".libs", "nixl")
        if os.path.exists(os.path.join(d, "libplugin_UCX.so")):
            return d
    return ""


def needed(path: str) -> list:
    """The ``DT_NEEDED`` names of ELF64 little-endian shared object ``path``
    (read from its dynamic segment: no binutils needed)."""
    with open(path, "rb") as f:
        data = f.read()
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise ValueError(f"{path}: not a 64-bit little-endian ELF file")
    phoff, = struct.unpack_from("<Q", data, 0x20)
    phentsize, phnum = struct.unpack_from("<HH", data, 0x36)
    loads, dynamic = [], None
    for i in range(phnum):
        p_type, _flags, offset, vaddr, _paddr, filesz, _memsz = struct.unpack_from(
            "<IIQQQQQ", data, phoff + i * phentsize)
        if p_type == 1:                                 # PT_LOAD
            loads.append((vaddr, offset, filesz))
        elif p_type == 2:                               # PT_DYNAMIC
            dynamic = (offset, filesz)
    if dynamic is None:
        return []
    names, strtab = [], None
    for at in range(dynamic[0], dynamic[0] + dynamic[1], 16):
        tag, val = struct.unpack_from("<qQ", data, at)
        if tag == 0:                                    # DT_NULL
            break
        if tag == 1:                                    # DT_NEEDED
            names.append(val)
        elif tag == 5:                                  # DT_STRTAB (an address)
            strtab = next((val - v + o for v, o, n in loads if v <= val < v + n), None)
    if strtab is None:
        return []
    return [data[strtab + n:data.index(b"\0", strtab + n)].decode() for n in names]


def ucx_aliases(library: str) -> str:
    """A directory of links named as the renamed UCX libraries ``library``
    needs (a wheel's ``libucp-<hash>.so.0.0.0`` ...) to ucxpy's, to put
    first on LD_LIBRARY_PATH (made once, in the user's cache); '' when it
    needs none."""
    names = [n for n in needed(library) if _RENAMED.match(n)]
    if not names:
        return ""
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    d = os.path.join(cache, "ucxpy", "ucx-aliases",
                     hashlib.sha256(LIB_DIR.encode()).hexdigest()[:12])
    os.makedirs(d, exist_ok=True)
    for n in names:
        target = os.path.join(LIB_DIR, f"lib{_RENAMED.match(n).group(1)}.so.0")
        link = os.path.join(d, n)
        if os.path.islink(link) and os.readlink(link) == target:
            continue
        tmp = f"{link}.{os.getpid()}"
        os.symlink(target, tmp)
        os.replace(tmp, link)             # (atomic: another process may be reading it)
    return d


def nixl_setup(env: dict) -> list:
    """Point NIXL's UCX plugin at ucxpy's libraries, when NIXL is installed:
    ``NIXL_PLUGIN_DIR`` at the plugins that find UCX through RUNPATH (unless
    set), and the directories to put first on LD_LIBRARY_PATH (the links
    named as the plugin's renamed UCX libraries: :func:`ucx_aliases`)."""
    plugins = env.get("NIXL_PLUGIN_DIR") or nixl_plugin_dir()
    plugin = os.path.join(plugins, "libplugin_UCX.so") if plugins else ""
    if not plugin or not os.path.exists(plugin):
        return []
    env["NIXL_PLUGIN_DIR"] = plugins
    try:
        aliases = ucx_aliases(plugin)
    except (OSError, ValueError) as e:
        print(f"ucxpy-ucx: NIXL's UCX plugin {plugin}: {e}; NIXL stays on its own UCX",
              file=sys.stderr)
        return []
    return [aliases] if aliases else []


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
    (0: a command of no launcher's, whose processes are counted as they
    report) (empty: ucxpy carried every rank).  ``require_ops``: some rank counted
    an operation (a job that failed or was killed, as tests that expect a
    fatal error are, proves itself by the library its ranks mapped)."""
    reports = []
    for path in sorted(glob.glob(os.path.join(folder, "*.json"))):
        with open(path) as f:
            reports.append(json.load(f))
    problems = []
    pids = {r["pid"] for r in reports}
    if ranks == 0:
        # processes no launcher counts (a NIXL program, servers started one
        # by one): as many as reported, at least one, each of which carried
        # operations through ours
        if not pids:
            problems.append("no process reported a ucxpy libucp worker")
        for pid in sorted(pids) if require_ops else ():
            # (what its libucp was asked for, or what ucxpy's data plane
            # executed for it: a target's notifications arrive there)
            if not any(sum(r["ops"].values()) + sum(r.get("dp", {}).values())
                       for r in reports if r["pid"] == pid):
                problems.append(f"pid {pid} loaded ucxpy's libucp but carried no operation "
                                f"through it")
    elif len(pids) < ranks:
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
    """The ranks a launcher's command starts (its ``-n``), or 0 for a
    command of no launcher's (a NIXL program: its processes are counted)."""
    for i, a in enumerate(cmd[:-1]):
        if a in ("-n", "-np") and cmd[i + 1].isdigit():
            return int(cmd[i + 1])
    return 0


# -- which UCX symbols a library needs that ours lack -------------------------------------

#: what ``native/ucp/unimplemented.c`` writes before its list of the names it
#: exports that abort when called
UNIMPLEMENTED_MARK = b"ucxpy-unimplemented-entry-points:\n"
#: the prefixes of UCX's libraries' symbols (libucp, libucs, libuct, libucm)
UCX_PREFIXES = ("ucp_", "ucs_", "uct_", "ucm_")
OUR_LIBS = ("libucp.so.0", "libucs.so.0", "libuct.so.0", "libucm.so.0")


def dynamic_symbols(path: str, defined: bool) -> dict:
    """The dynamic symbols ``path`` defines (``defined``) or needs: name
    (without its version) -> ``nm``'s type letter (``w``/``v``: weak, the
    library loads without it)."""
    which = "--defined-only" if defined else "--undefined-only"
    try:
        r = subprocess.run(["nm", "-D", which, path], capture_output=True, text=True,
                           timeout=60)
    except FileNotFoundError:
        raise RuntimeError("nm not found (apt-get install binutils)") from None
    if r.returncode:
        raise RuntimeError(f"nm -D {path}: {r.stderr.strip() or 'failed'}")
    out = {}
    for line in r.stdout.splitlines():
        parts = line.split()
        if len(parts) >= 2:
            out[parts[-1].split("@")[0]] = parts[-2]
    return out


def unimplemented(lib_dir: str = LIB_DIR) -> set:
    """The entry points our libucp exports that abort naming themselves
    (read from the file, which is not loaded)."""
    with open(os.path.join(lib_dir, "libucp.so.0"), "rb") as f:
        data = f.read()
    at = data.find(UNIMPLEMENTED_MARK)
    if at < 0:
        return set()
    at += len(UNIMPLEMENTED_MARK)
    return set(data[at:data.index(b"\0", at)].decode().split())


def abi_check(library: str, lib_dir: str = LIB_DIR) -> dict:
    """What ``library`` needs of UCX's libraries against what ucxpy's
    provide: ``needs`` (every UCX symbol it needs), ``missing`` (not defined
    by any of ours: the dynamic linker refuses to load ``library``, or, for
    a weak one, its first call fails) and ``aborting`` (ours exports them,
    but they abort naming themselves when called)."""
    needs = {n: t for n, t in dynamic_symbols(library, defined=False).items()
             if n.startswith(UCX_PREFIXES)}
    have = set()
    for name in OUR_LIBS:
        path = os.path.join(lib_dir, name)
        if os.path.exists(path):
            have |= set(dynamic_symbols(path, defined=True))
    stubs = unimplemented(lib_dir)
    return {"needs": sorted(needs),
            "missing": sorted(n for n in needs if n not in have),
            "weak": sorted(n for n in needs if n not in have and needs[n] in "wv"),
            "aborting": sorted(n for n in needs if n in stubs)}


def print_abi_check(library: str, out=sys.stdout, lib_dir: str = LIB_DIR) -> int:
    """``ucxpy-info --abi-check LIB``: 0 when ``library`` finds every UCX
    symbol it needs in ucxpy's libraries (some may abort when called: listed),
    1 when some are missing, 2 when it cannot be read."""
    try:
        r = abi_check(library, lib_dir)
    except (OSError, RuntimeError) as e:
        print(f"{library}: {e}", file=out)
        return 2
    by = {}
    for n in r["needs"]:
        by[n.split("_", 1)[0]] = by.get(n.split("_", 1)[0], 0) + 1
    print(f"{library}: needs {len(r['needs'])} UCX symbols ("
          + (", ".join(f"{k}_: {v}" for k, v in sorted(by.items())) or "none")
          + f"); ucxpy's libraries in {lib_dir}:", file=out)
    if r["missing"]:
        print(f"  missing ({len(r['missing'])}): the dynamic linker refuses to load it "
              f"with ours (weak ones: the first call fails instead)", file=out)
        for n in r["missing"]:
            print(f"    {n}{'  (weak)' if n in r['weak'] else ''}", file=out)
    if r["aborting"]:
        print(f"  present but not implemented ({len(r['aborting'])}): a call aborts, "
              f"naming the entry point", file=out)
        for n in r["aborting"]:
            print(f"    {n}", file=out)
    if not r["missing"] and not r["aborting"]:
        print("  every one is implemented", file=out)
    return 1 if r["missing"] else 0


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
                   help="ranks --check expects (default: the command's -n; a command "
                        "without one, such as a NIXL program, is counted by the processes "
                        "that report, each of which must have carried operations: a "
                        "singleton MPI program that talks only to itself takes --ranks 1)")
    p.add_argument("--key-file", metavar="F", default="",
                   help="the job key in file F (made, mode 600, if missing): for processes "
                        "started separately that connect to each other (NIXL's prefill and "
                        "decode servers); also UCXPY_AUTH_KEY_FILE")
    p.add_argument("--which", action="store_true",
                   help="print the libucp.so.0 MPICH's libmpi would load, and exit")
    p.add_argument("command", nargs=argparse.REMAINDER)
    args = p.parse_args(argv)
    try:
        env = environment(args.reference, key_file=args.key_file)
    except config.ConfigError as e:
        print(f"ucxpy-ucx: --key-file: {e}", file=sys.stderr)
        return 2
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
