"""The documentation: the Sphinx site builds with warnings as errors and every
reference resolved (``make docs``), the README stays short, every figure on
the site comes from a committed result snapshot, and every command a page
shows is a real one.

The commands of ```` ```console ```` blocks (lines starting ``$ ``) are
checked, not run: the program exists (a ucxpy tool, a ``make`` target of the
Makefile, a launcher or compiler named in :data:`PROGRAMS`), every path
argument inside the checkout exists, and every ``--option`` given to a
ucxpy tool is one its ``--help`` lists.  The example programs the pages
include are run by tests/test_docs_examples.py.
"""
from __future__ import annotations

import functools
import glob
import json
import os
import re
import shlex
import subprocess
import sys

import pytest

from conftest import ROOT

pytestmark = pytest.mark.timeout(240)

DOCS = os.path.join(ROOT, "docs")
README = os.path.join(ROOT, "README.md")
#: programs a page may name besides the ucxpy tools, python and make
PROGRAMS = {"mpiexec", "mpirun", "mpirun.openmpi", "mpicc.openmpi", "mpiexec.hydra", "srun", "sbatch", "salloc", "torchrun",
            "oshrun", "oshcc", "mpicc", "gcc", "cc", "git", "pip", "export", "cd", "env",
            "cat", "ls", "ldd", "perfetto", "bash", "sh", "timeout", "taskset", "apt-get",
            "ucx_perftest", "ucx_info", "fi_info", "sudo", "echo", "nm", "./a.out"}
TOOLS = ("ucxpy-run", "ucxpy-info", "ucxpy-perf", "ucxpy-trace", "ucxpy-ucx")


def pages() -> list:
    return sorted(p for p in glob.glob(os.path.join(DOCS, "**", "*.md"), recursive=True)
                  if "/_build/" not in p and "/_generated/" not in p)


def test_docs_build(tmp_path):
    """``make docs``' build: warnings are errors, references must resolve."""
    cp = subprocess.run([sys.executable, "-m", "sphinx", "-q", "-W", "--keep-going", "-n",
                         "-b", "html", "-d", str(tmp_path / "doctrees"), DOCS,
                         str(tmp_path / "html")],
                        capture_output=True, text=True, timeout=220, cwd=ROOT)
    assert cp.returncode == 0, cp.stdout[-4000:] + cp.stderr[-6000:]
    assert os.path.exists(tmp_path / "html" / "index.html")
    # the configuration page is generated from the registry: every variable is there
    from ucxpy.config import variables
    with open(tmp_path / "html" / "guide" / "configuration.html") as f:
        html = f.read()
    missing = [name for name in variables() if name not in html]
    assert not missing, missing


def test_readme_is_short():
    with open(README, "rb") as f:
        raw = f.read()
    text = raw.decode()
    assert len(raw) <= 25_000, f"README.md is {len(raw)} bytes (at most 25 KB)"
    lines = text.splitlines()
    assert len(lines) <= 350, f"README.md has {len(lines)} lines (at most 350)"
    long_lines, fenced = [], False
    for n, line in enumerate(lines, 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if not fenced and len(line) > 200:
            long_lines.append(n)
    assert not long_lines, f"README.md lines over 200 characters: {long_lines}"


def test_snapshots_are_dated():
    """Every committed result snapshot says when, at which commit and by which
    command it was made (ucxpy.tools.snapshot), and a page uses each one."""
    from ucxpy.tools import snapshot
    used = "".join(open(p).read() for p in pages())
    for name in snapshot.names():
        snap = snapshot.load(name)
        assert re.match(r"\d{4}-\d\d-\d\dT\d\d:\d\d", snap["date"]), name
        assert snap["commit"] and snap["command"] and "data" in snap, name
        assert re.search(rf"results-(table|plot)\}}\s+{re.escape(name)}\b", used), \
            f"docs/results/{name}.json is shown by no page"


def console_commands():
    """(page, line number, command) of every ``$ `` line in console blocks."""
    out = []
    for path in pages() + [README]:
        block = None
        with open(path) as f:
            for n, line in enumerate(f, 1):
                s = line.strip()
                if s.startswith("```"):
                    block = s[3:].strip() if block is None else None
                    continue
                if block in ("console", "{code-block} console") and s.startswith("$ "):
                    out.append((os.path.relpath(path, ROOT), n, s[2:]))
    return out


@functools.lru_cache(maxsize=None)
def make_targets() -> frozenset:
    with open(os.path.join(ROOT, "Makefile")) as f:
        return frozenset(m.group(1) for m in re.finditer(r"^([A-Za-z][\w.-]*):", f.read(), re.M))


#: tools with subcommands, each with its own --help
SUBCOMMANDS = ("ucxpy-trace",)


@functools.lru_cache(maxsize=None)
def tool_help(tool: str, sub: str = "") -> str:
    exe = os.path.join(os.path.dirname(sys.executable), tool)
    cp = subprocess.run([exe, *([sub] if sub else []), "--help"], capture_output=True,
                        text=True, timeout=60, cwd=ROOT)
    return cp.stdout + cp.stderr


def _simple_commands(cmd: str):
    """The simple commands of a shell line (split at |, &&, ||, ;), each without
    its leading VAR=value assignments."""
    try:
        words = shlex.split(cmd, comments=True)
    except ValueError as e:
        raise AssertionError(f"not a shell command ({e}): {cmd}")
    part: list = []
    for w in words + ["|"]:
        if w in ("|", "&&", "||", ";", "&"):
            while part and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", part[0]):
                part.pop(0)
            if part:
                yield part
            part = []
        else:
            part.append(w)


#: tools whose first positional argument starts the command they run
WRAPPERS = ("ucxpy-run", "ucxpy-ucx")


def _tool_options(prog: str, args: list) -> list:
    """The options given to the ucxpy tool itself (a wrapper's ends at the
    command it runs), each without its value."""
    sub = args[0] if prog in SUBCOMMANDS and args and not args[0].startswith("-") else ""
    helptext = tool_help(prog, sub)
    takes_value = set(re.findall(r"(--?[\w-]+)[ =][A-Z][A-Z_]*\b", helptext))
    out, skip = [], False
    for a in args:
        if skip:
            skip = False
            continue
        if a == "--":
            break
        if not a.startswith("-"):
            if prog in WRAPPERS:
                break
            continue
        opt = a.split("=", 1)[0]
        out.append(opt)
        skip = opt in takes_value and "=" not in a
    return out


def test_console_commands_are_real():
    cmds = console_commands()
    assert len(cmds) >= 10, "the pages show fewer commands than expected: is the parser broken?"
    bad = []
    for page, n, cmd in cmds:
        for words in _simple_commands(cmd):
            prog, args = words[0], words[1:]
            where = f"{page}:{n}: {cmd}"
            if prog in TOOLS:
                sub = args[0] if prog in SUBCOMMANDS and args and \
                    not args[0].startswith("-") else ""
                for opt in _tool_options(prog, args):
                    if opt.startswith("--") and not re.search(rf"{re.escape(opt)}\b",
                                                              tool_help(prog, sub)):
                        bad.append(f"{where}: {prog} {sub} has no {opt}".replace("  ", " "))
            elif prog == "make":
                for t in args:
                    if "=" not in t and not t.startswith("-") and t not in make_targets():
                        bad.append(f"{where}: the Makefile has no target {t!r}")
            elif prog in ("python", "python3") or prog in PROGRAMS:
                pass
            elif prog.startswith("/tmp/") or os.path.exists(os.path.join(ROOT, prog)):
                pass
            else:
                bad.append(f"{where}: unknown program {prog!r}")
            for a in args:
                rel = a.split("=", 1)[-1]
                if re.match(r"^(examples|bench|docs|tests|conformance|native|ucxpy|shmem|"
                            r"mpi_shim)/[\w./-]*\.\w+$", rel) and \
                        not os.path.exists(os.path.join(ROOT, rel)):
                    bad.append(f"{where}: no file {rel}")
    assert not bad, "\n".join(bad)


def test_readme_code_is_run():
    """Every Python block of the README is part of a program that runs in
    ``make test`` (docs/examples/, run by tests/test_docs_examples.py)."""
    with open(README) as f:
        text = f.read()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    assert blocks, "the README shows no Python example"
    progs = {}
    for path in glob.glob(os.path.join(DOCS, "examples", "*.py")):
        with open(path) as f:
            progs[path] = f.read()
    for block in blocks:
        assert any(block.strip() in src for src in progs.values()), \
            f"this README block is in no docs/examples program:\n{block}"


@pytest.mark.timeout(180)
def test_readme_c_example(tmp_path):
    """The README's C example, as it says: built with the mpich wheel's mpicc,
    run by ucxpy-ucx --check (every rank on ucxpy's libucp)."""
    from ucxpy.tools import ucx
    if not os.path.exists(ucx.LIBUCP):
        pytest.skip("libucp.so.0 is not built (UCX's headers, libucx-dev, are missing)")
    bindir = os.path.dirname(sys.executable)
    exe = str(tmp_path / "hello_mpi")
    cp = subprocess.run([os.path.join(bindir, "mpicc"), "-o", exe,
                         os.path.join(DOCS, "examples", "hello_mpi.c")],
                        capture_output=True, text=True, timeout=120)
    assert cp.returncode == 0, cp.stderr
    env = dict(os.environ, PATH=bindir + os.pathsep + os.environ.get("PATH", ""))
    cp = subprocess.run([os.path.join(bindir, "ucxpy-ucx"), "--check", "mpiexec", "-n", "2",
                         exe], capture_output=True, text=True, timeout=150, env=env)
    assert cp.returncode == 0, cp.stdout + cp.stderr
    assert "rank 1 of 2: sum 3, left neighbour 0" in cp.stdout, cp.stdout


def test_no_figures_outside_snapshots():
    """Figures live in result snapshots: the user and researcher guides and the
    API pages state none by hand (a number with a unit of time or rate)."""
    figure = re.compile(r"\b\d+(\.\d+)?\s?(µs|us|ms|GB/s|MB/s|M/s|msg/s)\b")
    found = []
    for path in pages():
        rel = os.path.relpath(path, DOCS)
        if rel.split("/")[0] not in ("guide", "research", "api"):
            continue
        fenced = False
        with open(path) as f:
            for n, line in enumerate(f, 1):
                if line.lstrip().startswith("```"):
                    fenced = not fenced
                    continue
                if not fenced and figure.search(line):
                    found.append(f"docs/{rel}:{n}: {line.strip()[:120]}")
    assert not found, "\n".join(found)


def test_snapshot_writer_roundtrip(tmp_path, monkeypatch):
    from ucxpy.tools import snapshot
    monkeypatch.setattr(snapshot, "DIR", str(tmp_path))
    path = snapshot.write("probe", {"rows": [{"a": 1}]}, argv=["bench/x.py", "--y"])
    assert os.path.dirname(path) == str(tmp_path)
    with open(path) as f:
        snap = json.load(f)
    assert snap["name"] == "probe" and snap["command"] == "bench/x.py --y"
    assert snap["data"] == {"rows": [{"a": 1}]} and snapshot.names() == ["probe"]
