"""Rank 1 exits with code 3 after the first barrier; the others wait for the
launcher's failure notice and report what they saw."""
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

from ucxpy import bootstrap  # noqa: E402
from ucxpy.errors import PeerFailure  # noqa: E402

boot = bootstrap.from_env()
boot.barrier(timeout=30)
if boot.rank == 1:
    sys.exit(3)
t0 = time.monotonic()
while time.monotonic() - t0 < 20:
    try:
        boot.check_failures()
    except PeerFailure as e:
        print(f"rank {boot.rank}: PeerFailure peer={e.peer} after "
              f"{time.monotonic() - t0:.2f}s: {e}", flush=True)
        break
    time.sleep(0.001)
else:
    print(f"rank {boot.rank}: no PeerFailure", flush=True)
    sys.exit(5)
# a collective that rank 1 can never join must fail, not hang
try:
    boot.barrier(timeout=20)
except PeerFailure as e:
    print(f"rank {boot.rank}: barrier PeerFailure peer={e.peer}: {e}", flush=True)
sys.exit(0)
