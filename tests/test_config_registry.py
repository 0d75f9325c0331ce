"""The configuration registry: every ``UCXPY_*`` variable is declared once
(name, default, parser, doc) by the component that owns it, read only
through :func:`ucxpy.config.setting`, and printed by ``ucxpy-info -c``."""
from __future__ import annotations

import ast
import os
import pathlib
import re
import subprocess
import sys

import pytest

from ucxpy import config
from ucxpy.config import Config, ConfigError, setting, variables

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGES = ("ucxpy", "mpi_shim", "shmem")


def sources():
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            yield path, path.read_text()


def test_every_component_declares_its_variables():
    names = variables()
    comps = {v.component for v in names.values()}
    assert {"core", "launch", "ofi", "verbs", "shmem"} <= comps
    for var in names.values():
        assert var.name.startswith("UCXPY_") and var.doc.strip(), var
    # the core's are exactly the Config fields
    assert {k for k, _ in Config().items()} == {n for n, v in names.items()
                                                if v.component == "core"}


def test_every_variable_named_in_code_is_declared():
    declared = variables()
    used = set()
    for path, text in sources():
        used |= {m for m in re.findall(r"[\"'](UCXPY_[A-Z0-9_]+)[\"']", text)}
    missing = sorted(used - set(declared))
    assert not missing, f"used but not declared: {missing}"


def _reads(tree):
    """String constants UCXPY_* used as a key to read a mapping or getenv."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and node.args and isinstance(node.func, ast.Attribute) \
                and node.func.attr in ("get", "getenv", "setdefault"):
            arg = node.args[0]
            if isinstance(arg, ast.Constant) and str(arg.value).startswith("UCXPY_"):
                yield node.lineno, arg.value
        elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load):
            key = node.slice
            if isinstance(key, ast.Constant) and str(key.value).startswith("UCXPY_"):
                yield node.lineno, key.value
        elif isinstance(node, ast.Compare) and isinstance(node.left, ast.Constant) \
                and str(node.left.value).startswith("UCXPY_"):
            yield node.lineno, node.left.value


def test_nothing_but_the_registry_reads_ucxpy_variables():
    bad = []
    for path, text in sources():
        if path == ROOT / "ucxpy" / "config.py":
            continue
        bad += [f"{path.relative_to(ROOT)}:{line}: {name}" for line, name in _reads(ast.parse(text))]
    assert not bad, "read outside ucxpy.config.setting:\n" + "\n".join(bad)


def test_the_scan_finds_reads():
    tree = ast.parse('os.environ.get("UCXPY_X")\nenv["UCXPY_Y"]\n"UCXPY_Z" in env\n'
                     'env["UCXPY_W"] = 1\n{"UCXPY_V": 1}\n')
    assert [n for _, n in _reads(tree)] == ["UCXPY_X", "UCXPY_Y", "UCXPY_Z"]


def test_setting_defaults_parses_and_names_the_variable():
    assert setting("UCXPY_OFI_BOUNCE", {}) == 64 << 10
    assert setting("UCXPY_OFI_BOUNCE", {"UCXPY_OFI_BOUNCE": "  "}) == 64 << 10   # empty = unset
    assert setting("UCXPY_OFI_BOUNCE", {"UCXPY_OFI_BOUNCE": "8k"}) == 8 << 10
    assert setting("UCXPY_OFI_PROVIDER", {"UCXPY_OFI_PROVIDER": "tcp;ofi_rxm, shm"}) == \
        ("tcp;ofi_rxm", "shm")
    assert setting("UCXPY_RANK", {}) is None and setting("UCXPY_RANK", {"UCXPY_RANK": "3"}) == 3
    with pytest.raises(ConfigError, match="UCXPY_VERBS_PORT='x'"):
        setting("UCXPY_VERBS_PORT", {"UCXPY_VERBS_PORT": "x"})
    with pytest.raises(ConfigError, match="UCXPY_OFI_BOUNCE='lots'"):
        setting("UCXPY_OFI_BOUNCE", {"UCXPY_OFI_BOUNCE": "lots"})
    with pytest.raises(ConfigError, match="not a declared"):
        setting("UCXPY_NO_SUCH_THING", {})


def test_config_reads_once(monkeypatch):
    monkeypatch.setenv("UCXPY_OFI_TX_DEPTH", "7")
    cfg = Config.from_env()
    monkeypatch.setenv("UCXPY_OFI_TX_DEPTH", "9")
    assert cfg.setting("UCXPY_OFI_TX_DEPTH") == 7              # the snapshot
    assert setting("UCXPY_OFI_TX_DEPTH", cfg) == 7
    assert setting("UCXPY_OFI_TX_DEPTH") == 9                  # the live environment
    assert Config.from_env({}).setting("UCXPY_OFI_TX_DEPTH") == 64
    assert Config.from_env({"UCXPY_TLS": "tcp"}).tls == ("tcp",)


def test_declare_twice():
    config.declare("ofi", ("OFI_PINNED", 64, config.parse_size, "same again"))   # same: fine
    with pytest.raises(ConfigError, match="declared by both"):
        config.declare("other", ("OFI_PINNED", 64, config.parse_size, "taken"))
    assert variables()["UCXPY_OFI_PINNED"].component == "ofi"


def test_one_size_parser():
    from shmem.runtime import parse_size as shmem_size
    for text, n in (("64M", 64 << 20), ("512KB", 512 << 10), ("1.5m", 3 << 19), ("7", 7)):
        assert config.parse_size(text) == shmem_size(text) == n
    with pytest.raises(ValueError):
        shmem_size("0")


def test_docs_name_only_declared_variables():
    """Every ``UCXPY_*`` variable the README and the documentation pages name
    is a declared one (the configuration page itself is generated from the
    registry: tests/test_docs.py)."""
    declared = variables()
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    named = set()
    for page in pages:
        if "_build" in page.parts or "notes" in page.parts:   # dated notes keep old names
            continue
        named |= set(re.findall(r"\b(UCXPY_[A-Z0-9_]*[A-Z0-9])\b", page.read_text()))
    assert len(named) >= 15
    # build-time switches (native/build_*.py, setup.py) and the suite's own
    # (tests/conftest.py) are read there, not declared
    elsewhere = "".join(p.read_text() for p in [*sorted((ROOT / "native").glob("build_*.py")),
                                                 ROOT / "setup.py", ROOT / "tests" / "conftest.py"])
    assert not sorted(n for n in named - set(declared) if n not in elsewhere)


def info(*args, **env):
    e = {k: v for k, v in os.environ.items() if not k.startswith("UCXPY_")}
    e.update(env)
    return subprocess.run([sys.executable, "-m", "ucxpy.tools.info", *args], env=e,
                          capture_output=True, text=True, timeout=120, cwd=ROOT)


def test_info_prints_every_variable_and_flags_unknown_ones():
    cp = info("-c", UCXPY_OFI_BOUNCE="8K", UCXPY_TLSS="tcp")
    assert cp.returncode == 0, cp.stderr
    lines = cp.stdout.splitlines()
    for name in variables():
        assert any(line.startswith(name + "=") for line in lines), name
    assert "UCXPY_OFI_BOUNCE=8K  *" in lines
    assert "UCXPY_OFI_RX_DEPTH=64" in lines
    assert "# --- shmem" in lines                        # found through the entry point
    assert any("misspelt" in line and "UCXPY_TLSS" in line for line in lines)
    full = info("-c", "-f").stdout
    assert "#   libfabric providers to try" in full


def test_info_shows_a_malformed_value():
    cp = info("-c", UCXPY_VERBS_PORT="one")
    assert cp.returncode == 0, cp.stderr
    assert "UCXPY_VERBS_PORT=<invalid:" in cp.stdout


def test_overrides_are_fields_only():
    for bad in ("setting", "items", "validate", "_env", "nope"):
        with pytest.raises(ConfigError, match="unknown config option"):
            Config.from_env({}, **{bad: "x"})
    assert Config.from_env({}, rndv_thresh="8K").rndv_thresh == 8192
    with pytest.raises(ConfigError, match="UCXPY_RNDV_THRESH='lots'"):
        Config.from_env({}, rndv_thresh="lots")
