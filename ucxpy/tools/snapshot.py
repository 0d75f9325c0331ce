"""Dated result snapshots: the only source of the figures in the docs.

A benchmark or conformance runner given ``--snapshot`` writes its results
once more, as ``docs/results/<name>.json`` in the checkout, wrapped with the
date, the commit and the command that produced them::

    {"name": "bench", "date": "2026-12-08T02:10:00", "commit": "6308696",
     "dirty": false, "command": "bench/run_bench.py --suites tag ...",
     "data": {...the runner's own results...}}

The snapshots are committed; the docs build (``docs/_ext/ucxpy_docs.py``)
renders its tables and plots from them and prints each one's date and commit
beside it.  Running ``make bench`` (or a conformance target) and committing
the snapshots it wrote is how a figure in the docs changes.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

#: the checkout this module lives in (snapshots belong to a checkout, not to
#: an installed package)
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DIR = os.path.join(ROOT, "docs", "results")


def _git(*args: str) -> str:
    try:
        cp = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True,
                            timeout=10)
    except (OSError, subprocess.SubprocessError):
        return ""
    return cp.stdout.strip() if cp.returncode == 0 else ""


def path(name: str) -> str:
    return os.path.join(DIR, f"{name}.json")


def write(name: str, data, argv=None) -> str:
    """Write ``data`` as snapshot ``name`` (atomically); returns its path."""
    argv = sys.argv if argv is None else argv
    cmd = " ".join([os.path.relpath(argv[0], ROOT) if os.path.isabs(argv[0]) else argv[0],
                    *argv[1:]])
    snap = {"name": name, "date": time.strftime("%Y-%m-%dT%H:%M:%S"),
            "commit": _git("rev-parse", "--short", "HEAD") or "unknown",
            "dirty": bool(_git("status", "--porcelain", "--untracked-files=no", "--",
                               ".", ":!docs")),
            "command": cmd, "data": data}
    os.makedirs(DIR, exist_ok=True)
    out = path(name)
    tmp = out + f".tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(snap, f, indent=1, sort_keys=False)
        f.write("\n")
    os.replace(tmp, out)
    return out


def load(name: str) -> dict:
    """Snapshot ``name``; FileNotFoundError when none was committed."""
    with open(path(name)) as f:
        return json.load(f)


def names() -> list:
    """Every snapshot in the checkout."""
    if not os.path.isdir(DIR):
        return []
    return sorted(f[:-5] for f in os.listdir(DIR) if f.endswith(".json"))


def add_option(parser, name: str) -> None:
    """A runner's ``--snapshot [NAME]`` option (``NAME`` defaults to ``name``)."""
    parser.add_argument("--snapshot", nargs="?", const=name, default=None, metavar="NAME",
                        help=f"also write the dated snapshot docs/results/NAME.json "
                             f"(default NAME: {name}) that the docs show")


def save(args, data) -> None:
    """Write ``data`` as the snapshot ``args.snapshot`` names, if any."""
    name = getattr(args, "snapshot", None)
    if name:
        print(f"# snapshot {os.path.relpath(write(name, data), ROOT)}", flush=True)
