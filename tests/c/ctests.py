"""Builds and runs the data plane's C tests (tests/c/test_*.c), plain C
programs linked with native/dp's files and no Python, in one or more
variants: plain, ``san`` (AddressSanitizer + UndefinedBehaviorSanitizer)
and ``tsan`` (ThreadSanitizer).  ``make test-c`` / ``test-c-san`` /
``test-c-tsan`` run it; tests/test_dp_c.py calls :func:`run`.

    python tests/c/ctests.py [--variant plain,san,tsan] [--out DIR] [test_x.c ...]
"""
from __future__ import annotations

import argparse
import glob
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
NATIVE = os.path.join(ROOT, "native")
DP = os.path.join(NATIVE, "dp")
#: the data plane's files a C test links (binding.c is Python's), and the
#: ring (native/ring.c) its inbox reads
DP_SOURCES = [os.path.join(DP, s) for s in ("worker.c", "rma.c", "match.c", "tag.c", "inbox.c", "lane.c",
                                            "rndv.c", "tcp.c", "am.c", "stream.c", "proto.c")] \
    + [os.path.join(NATIVE, "ring.c"), os.path.join(NATIVE, "cma.c"),
       os.path.join(NATIVE, "proto", "pipelined_copy.c")]    # (a plug-in's C half)
CFLAGS = ["-O1", "-g", "-std=gnu11", "-Wall", "-Wextra", "-Werror", "-pthread"]
VARIANTS = {
    "plain": [],
    "san": ["-fsanitize=address,undefined", "-fno-sanitize-recover=all",
            "-fno-omit-frame-pointer"],
    "tsan": ["-fsanitize=thread"],
}


def tests() -> list:
    return sorted(glob.glob(os.path.join(HERE, "test_*.c")))


_LIBRARIES: dict = {}


def library(variant: str, out: str) -> str:
    """The data plane's files compiled in ``variant`` into an archive in
    ``out``, once per process and folder: the tests link it instead of
    compiling the same files each."""
    lib = _LIBRARIES.get((variant, out))
    if lib is None:
        objs = os.path.join(out, f"dp-{variant}")
        os.makedirs(objs, exist_ok=True)
        subprocess.run(["gcc", "-c", *CFLAGS, *VARIANTS[variant], "-I", DP, "-I", NATIVE,
                        *DP_SOURCES], cwd=objs, check=True, capture_output=True, text=True)
        lib = os.path.join(out, f"libdp-{variant}.a")
        subprocess.run(["ar", "rcs", lib, *sorted(glob.glob(os.path.join(objs, "*.o")))],
                       check=True, capture_output=True, text=True)
        _LIBRARIES[(variant, out)] = lib
    return lib


def run(test: str, variant: str, out: str, timeout: float = 120,
        lib_dir: str | None = None) -> subprocess.CompletedProcess:
    """Build ``test`` in ``variant`` into ``out`` (linked with the
    :func:`library` built in ``lib_dir``, default ``out``) and run it; the
    run's CompletedProcess (a failed build raises CalledProcessError)."""
    exe = os.path.join(out, f"{os.path.basename(test)[:-2]}-{variant}")
    lib = library(variant, lib_dir or out)
    subprocess.run(["gcc", *CFLAGS, *VARIANTS[variant], "-I", DP, "-I", NATIVE, "-I", HERE,
                    test, lib, "-o", exe],
                   check=True, capture_output=True, text=True)
    env = dict(os.environ, ASAN_OPTIONS="detect_leaks=1", UBSAN_OPTIONS="print_stacktrace=1",
               TSAN_OPTIONS="halt_on_error=1")
    return subprocess.run([exe], capture_output=True, text=True, timeout=timeout, env=env)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--variant", default="plain", help="plain, san, tsan (comma-separated)")
    p.add_argument("--out", help="where the programs go (default: a temporary folder)")
    p.add_argument("tests", nargs="*", help="test sources (default: every tests/c/test_*.c)")
    args = p.parse_args()
    out = args.out or tempfile.mkdtemp(prefix="ucxpy-ctest-")
    os.makedirs(out, exist_ok=True)
    failed = 0
    for variant in args.variant.split(","):
        for test in args.tests or tests():
            try:
                r = run(test, variant, out)
            except subprocess.CalledProcessError as e:
                print(f"{os.path.basename(test)} [{variant}]: build failed\n{e.stderr}")
                failed += 1
                continue
            ok = r.returncode == 0
            failed += not ok
            print(f"{os.path.basename(test)} [{variant}]: {'OK' if ok else 'FAILED'}")
            if not ok:
                print(r.stdout + r.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
