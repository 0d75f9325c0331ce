"""Mutation testing of ucxpy's pure-logic modules (``make mutation``).

Runs mutmut (configured in setup.cfg's ``[mutmut]`` section: which modules,
and the fast unit tests that are their mutation suite), then prints per
module how many mutants the tests killed and compares the kill rate with
the committed baseline, tests/mutation-baseline.json.  Mutants judged
*equivalent* (no test can tell them apart from the original: they change
nothing observable) are listed there by name with the reason; they are left
out of the rate.  A mutant mutmut ran no test against ("no tests") counts as
a survivor.

Usage: python tests/mutation_run.py [--no-run] [--update] [--jobs N] [--only MODULE ...]
``--only`` mutates and reports just the named modules (CI's ratchet runs the
two fastest this way, ``make mutation-ratchet``).
Exit status 1 when a module is below 90 % or below its baseline.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import re
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BASELINE = os.path.join(ROOT, "tests", "mutation-baseline.json")
TARGET = 0.90
KILLED = ("killed", "timeout", "segfault")   # a crashed test run caught the mutant
LINE = re.compile(r"^\s*([\w.]+)\.x?\w*?__mutmut_\d+: (.+)$")


def mutmut(*args, log=None):
    exe = os.path.join(os.path.dirname(sys.executable), "mutmut")
    return subprocess.run([exe, *args], cwd=ROOT, text=True,
                          stdout=log or subprocess.PIPE, stderr=subprocess.STDOUT)


def results() -> dict:
    """{mutant name: status} of the last run."""
    out = mutmut("results", "--all", "true").stdout
    found = {}
    for line in out.splitlines():
        line = line.strip()
        if "__mutmut_" in line and ": " in line:
            name, status = line.rsplit(": ", 1)
            found[name] = status
    return found


def module_of(name: str) -> str:
    """``ucxpy.tag.x_TagMatcher__...`` / ``ucxpy.tag.xǁTagMatcherǁpost__...`` -> ucxpy.tag"""
    parts = name.split(".")
    for i, p in enumerate(parts):
        if p.startswith("x") and "__mutmut_" in ".".join(parts[i:]):
            return ".".join(parts[:i])
    return ".".join(parts[:-1])


def report(found: dict, baseline: dict):
    mods = collections.defaultdict(collections.Counter)
    survivors = collections.defaultdict(list)
    for name, status in sorted(found.items()):
        mod = module_of(name)
        equivalent = baseline.get(mod, {}).get("equivalent", {})
        if name in equivalent:
            mods[mod]["equivalent"] += 1
            continue
        mods[mod][status] += 1
        if status not in KILLED and status != "skipped":
            survivors[mod].append((name, status))
    rows, ok = [], True
    print(f"{'module':30s} {'mutants':>7s} {'killed':>7s} {'survived':>8s} {'no test':>7s} "
          f"{'equiv.':>6s} {'rate':>7s} {'baseline':>8s}")
    for mod, c in sorted(mods.items()):
        killed = sum(c[s] for s in KILLED)
        counted = sum(v for k, v in c.items() if k not in ("equivalent", "skipped"))
        rate = killed / counted if counted else 1.0
        base = baseline.get(mod, {}).get("rate")
        verdict = "OK"
        if rate < TARGET:
            verdict, ok = f"below {TARGET:.0%}", False
        elif base is not None and rate < base - 0.005:
            verdict, ok = f"below baseline", False
        print(f"{mod:30s} {counted + c['equivalent']:7d} {killed:7d} {c['survived']:8d} "
              f"{c['no tests']:7d} {c['equivalent']:6d} {rate:7.1%} "
              f"{'' if base is None else f'{base:.1%}':>8s}  {verdict}")
        rows.append((mod, rate))
    for mod, items in sorted(survivors.items()):
        print(f"\nsurvivors in {mod} (mutmut show NAME):")
        for name, status in items:
            print(f"  {name}: {status}")
    return rows, ok


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--no-run", action="store_true", help="report the last run only")
    ap.add_argument("--update", action="store_true",
                    help="write the measured rates into the baseline (keeps its equivalents)")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--only", nargs="+", metavar="MODULE",
                    help="dotted module names (e.g. ucxpy.tag): mutate and report only these")
    args = ap.parse_args(argv)
    if shutil.which("mutmut", path=os.path.dirname(sys.executable)) is None:
        print("mutmut is not installed (pip install mutmut)", file=sys.stderr)
        return 2
    baseline = {}
    if os.path.exists(BASELINE):
        with open(BASELINE) as f:
            baseline = json.load(f)
    if not args.no_run:
        shutil.rmtree(os.path.join(ROOT, "mutants"), ignore_errors=True)
        log_path = os.path.join(ROOT, "mutants.log")
        with open(log_path, "w") as log:
            patterns = [f"{m}.*" for m in args.only or ()]
            r = mutmut("run", "--max-children", str(args.jobs), *patterns, log=log)
        if r.returncode != 0:
            print(f"mutmut run failed (exit {r.returncode}); see {log_path}", file=sys.stderr)
            return 2
    found = results()
    if args.only:
        found = {k: v for k, v in found.items() if module_of(k) in args.only}
    if not found:
        print("no mutants found (did mutmut run?)", file=sys.stderr)
        return 2
    rows, ok = report(found, baseline)
    if args.update:
        for mod, rate in rows:
            baseline.setdefault(mod, {})["rate"] = round(rate, 4)
            baseline[mod].setdefault("equivalent", {})
        with open(BASELINE, "w") as f:
            json.dump(baseline, f, indent=1, sort_keys=True)
            f.write("\n")
        print(f"\nbaseline written: {BASELINE}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
