"""The example programs the documentation includes (docs/examples/*.py): each
one runs, as a real process, by the command its module docstring names on
its first line (``run: <command>``, the command a reader would type from the
checkout), and exits 0 within a hard timeout; the programs assert their own
results.  A program without a ``run:`` line fails.  (Programs under
examples/ that the pages include are run by the tests of what they show,
e.g. tests/test_transport_contract.py runs examples/toy_transport.py.)
"""
from __future__ import annotations

import ast
import glob
import os
import re
import shlex
import sys

import pytest

from conftest import ROOT, run_session

pytestmark = pytest.mark.timeout(90)

EXAMPLES = os.path.join(ROOT, "docs", "examples")
#: seconds one program may take, launcher and every rank included
HARD_TIMEOUT = 60


def programs() -> list:
    return sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(EXAMPLES, "*.py")))


def run_line(path: str) -> str:
    """The command of the docstring's first line, ``run: <command>``."""
    with open(os.path.join(ROOT, path)) as f:
        doc = ast.get_docstring(ast.parse(f.read())) or ""
    first = doc.splitlines()[0] if doc else ""
    m = re.fullmatch(r"run:\s*(\S.*)", first.strip())
    if not m:
        pytest.fail(f"{path}: the module docstring's first line is not 'run: <command>' "
                    f"(it is {first!r})")
    return m.group(1)


def command(line: str, path: str):
    """``(argv, environment additions)`` of a run line: leading ``VAR=value``
    words go to the environment; ``python`` is this interpreter and the
    ucxpy tools are the ones installed beside it."""
    words = shlex.split(line)
    env = {}
    while words and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", words[0]):
        name, _, value = words.pop(0).partition("=")
        env[name] = value
    assert words, f"{path}: 'run:' names no command"
    bindir = os.path.dirname(sys.executable)
    if words[0] in ("python", "python3"):
        words[0] = sys.executable
    elif os.path.exists(os.path.join(bindir, words[0])):
        words[0] = os.path.join(bindir, words[0])
    assert path in words, f"{path}: its 'run:' command does not run it: {line}"
    return words, env


def test_every_example_is_found():
    assert len(programs()) >= 4, programs()


@pytest.mark.parametrize("path", programs())
def test_example_runs(path, monkeypatch):
    argv, extra = command(run_line(path), path)
    bindir = os.path.dirname(sys.executable)
    # a reader's environment: no UCXPY_* settings of this run (a launcher's
    # stack dump on timeout is kept), the venv's tools and interpreter first
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("UCXPY_") or k == "UCXPY_RUN_STACKS_ON_TIMEOUT"}
    env["PATH"] = bindir + os.pathsep + env.get("PATH", "")
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env.update(extra)
    if os.path.basename(argv[0]) == "ucxpy-run" and "--timeout" not in argv:
        argv[1:1] = ["--timeout", str(HARD_TIMEOUT - 5)]    # the launcher stops its ranks
    monkeypatch.chdir(ROOT)             # the run lines name files from the checkout
    rc, out, err = run_session(argv, timeout=HARD_TIMEOUT, env=env, tail=3000)
    assert rc == 0, f"{' '.join(argv)} exited {rc}\n{out[-3000:]}\n{err[-3000:]}"
