"""A conformance job's processes: what the runners kill when a job outlives
its time (conformance/mpich/run.py, conformance/openmpi/run.py)."""
from __future__ import annotations

import contextlib
import glob
import os
import signal
import time


def descendants(pid: int) -> list:
    """Every process below ``pid`` (children first), read from /proc."""
    children = {}
    for stat in glob.glob("/proc/[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            with open(stat) as f:
                fields = f.read().rsplit(")", 1)[1].split()
            children.setdefault(int(fields[1]), []).append(int(stat.split("/")[2]))
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def kill_tree(proc) -> None:
    """SIGKILL the job: the launcher, its process group and every process
    under it (hydra's proxies and the ranks start sessions or groups of their
    own), twice, for what was being started the first time."""
    for _ in range(2):
        for pid in [proc.pid, *descendants(proc.pid)]:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(OSError):
            os.killpg(proc.pid, signal.SIGKILL)
        time.sleep(0.2)
