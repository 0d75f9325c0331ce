"""The last rank never reaches the barrier; the others must time out naming it."""
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

from ucxpy import bootstrap  # noqa: E402

boot = bootstrap.from_env()
if boot.rank == boot.size - 1:
    time.sleep(float(os.environ.get("STRAGGLER_SLEEP", "15")))
    sys.exit(0)
try:
    boot.barrier(timeout=2)
except bootstrap.BootstrapTimeout as e:
    assert isinstance(e, bootstrap.BootstrapError) and isinstance(e, TimeoutError)
    print(f"rank {boot.rank}: timeout missing={e.missing}: {e}", flush=True)
    sys.exit(7)
print(f"rank {boot.rank}: barrier completed?!", flush=True)
sys.exit(0)
