"""Fixtures for multi-host tests on network namespaces (see netns.py).

Every test skips, with the reason, where namespaces cannot be created (not
root, no CAP_NET_ADMIN/CAP_SYS_ADMIN, no iproute2).  Clusters are torn down
by the fixture finalizer, also when the test fails or times out."""
from __future__ import annotations

import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
for p in (ROOT, os.path.dirname(HERE)):
    if p not in sys.path:
        sys.path.insert(0, p)

from tests.hosts import netns  # noqa: E402


@pytest.fixture(scope="session")
def netns_ok():
    why = netns.skip_reason()
    if why:
        pytest.skip(f"multi-host tests need network namespaces: {why}")


@pytest.fixture
def make_cluster(netns_ok):
    """``make_cluster(n, link="veth"|"emulated"|"impairable")``; "impairable"
    is veth with tc netem where the kernel has it, else the userspace link
    emulator (skips if neither works)."""
    made = []

    def make(n, link="veth"):
        if link == "impairable":
            if netns.netem_available():
                link = "veth"
            elif netns.tap_available():
                link = "emulated"
            else:
                pytest.skip("no tc netem in this kernel and no /dev/net/tun for the link emulator")
        c = netns.Cluster(n, link=link)
        made.append(c)
        return c

    yield make
    for c in made:
        c.close()
