"""The download caches of the conformance runners: one runner at a time
fetches, extracts and builds into a cache, so that two runners started
together (``make test`` runs two pytest workers) never read a half-written
suite."""
from __future__ import annotations

import contextlib
import fcntl
import os


@contextlib.contextmanager
def locked(cache: str):
    """Hold ``cache``'s lock (an flock on ``cache/.lock``, created if needed)."""
    os.makedirs(cache, exist_ok=True)
    with open(os.path.join(cache, ".lock"), "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
