"""UCX's configuration names on ucxpy (ucxpy/tools/ucxvars.py): what libucp makes
of ``UCX_*`` variables, ``ucp_config_read``'s prefix and
``ucp_config_modify``.  The end-to-end run (MPICH on libucp with only
``UCX_TLS=tcp`` set, its ranks' reports naming tcp) is in
tests/test_ucp_capi.py."""
from __future__ import annotations

import pytest

from ucxpy.tools import ucxvars


def test_gather_environment_prefix_and_modify_in_that_order():
    env = {"UCX_TLS": "sm", "UCX_MPICH_TLS": "tcp", "UCX_RNDV_THRESH": "8k", "PATH": "/bin"}
    assert ucxvars.gather("", (), env) == {"TLS": "sm", "MPICH_TLS": "tcp", "RNDV_THRESH": "8k"}
    assert ucxvars.gather("MPICH", (), env) == {"TLS": "tcp", "RNDV_THRESH": "8k"}
    names = ucxvars.gather("MPICH", [("RNDV_THRESH", "inf"), ("ADDRESS_VERSION", "v2")], env)
    assert names == {"TLS": "tcp", "RNDV_THRESH": "inf", "ADDRESS_VERSION": "v2"}


@pytest.mark.parametrize("value,want", [
    ("tcp", "self,tcp"), ("sm,self", "shm,self"), ("posix,cma,tcp", "self,shm,tcp"),
    ("rc,ud,sm,self", "verbs,shm,self"), ("all", "all"), ("^tcp", "self,shm,ofi,verbs"),
    ("cuda_copy,sm,tcp", "self,shm,tcp"),
])
def test_tls_names(value, want):
    env, ignored, errors = ucxvars.settings({"TLS": value}, environ={})
    assert env == {"UCXPY_TLS": want} and not ignored and not errors


def test_thresholds_devices_and_what_is_ignored():
    names = {"RNDV_THRESH": "inf", "NET_DEVICES": "eth0,mlx5_0:1", "ADDRESS_VERSION": "v2",
             "MAX_RMA_RAILS": "2", "TLS": "nosuch"}
    env, ignored, errors = ucxvars.settings(names, environ={})
    assert env == {"UCXPY_RNDV_THRESH": str(ucxvars.INF), "UCXPY_TCP_IFACE": "eth0",
                   "UCXPY_VERBS_DEVICE": "mlx5_0"}
    assert ignored == ["ADDRESS_VERSION", "MAX_RMA_RAILS"]
    assert "nosuch" in errors["TLS"]
    assert ucxvars.settings({"RNDV_THRESH": "64k"}, {})[0] == {"UCXPY_RNDV_THRESH": "64k"}
    assert ucxvars.settings({"NET_DEVICES": "all"}, {})[0] == {}


def test_a_ucxpy_variable_set_wins():
    env, _, _ = ucxvars.settings({"TLS": "tcp", "RNDV_THRESH": "1k"},
                                 environ={"UCXPY_TLS": "shm"})
    assert env == {"UCXPY_RNDV_THRESH": "1k"}
