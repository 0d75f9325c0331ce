"""The native data plane's C tests (tests/c/), plain C programs without
Python, built with -Wall -Wextra -Werror and run plain, under ASan/UBSan and
under ThreadSanitizer (``make test-c``, ``test-c-san`` and ``test-c-tsan``;
each takes about a second, so ``make test`` runs all of them)."""
from __future__ import annotations

import os
import shutil
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "c"))
import ctests  # noqa: E402  (tests/c/ctests.py)

pytestmark = [pytest.mark.timeout(300),
              pytest.mark.skipif(shutil.which("gcc") is None, reason="no C compiler")]


@pytest.fixture(scope="module")
def lib_dir(tmp_path_factory):
    """Where each variant's build of the data plane's files goes, once for
    the module (ctests.library)."""
    return str(tmp_path_factory.mktemp("dp-lib"))


@pytest.mark.parametrize("variant", ["plain", "san", "tsan"])
@pytest.mark.parametrize("test", [os.path.basename(t) for t in ctests.tests()])
def test_c(tmp_path, lib_dir, test, variant):
    r = ctests.run(os.path.join(ctests.HERE, test), variant, str(tmp_path), lib_dir=lib_dir)
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"{test[:-2]}: OK" in r.stdout
