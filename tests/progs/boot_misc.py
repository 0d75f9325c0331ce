"""Small behaviours selected by argv[1]: sigkill, sleep, abort, agent,
exit0early, bench, watch."""
import os
import signal
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

from ucxpy import bootstrap  # noqa: E402
from ucxpy.errors import BootstrapError, PeerFailure  # noqa: E402

mode = sys.argv[1]
boot = bootstrap.from_env()
if mode == "sigkill":
    boot.barrier(timeout=30)
    if boot.rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(30)
elif mode == "sleep":
    print(f"rank {boot.rank} sleeping", flush=True)
    time.sleep(60)
elif mode == "abort":
    boot.barrier(timeout=30)
    if boot.rank == 0:
        boot.abort("giving up", 4)
        print("rank 0: abort returned", flush=True)
        time.sleep(0.5)     # the others are killed meanwhile
        sys.exit(4)
    time.sleep(30)
elif mode == "agent":
    print(f"rank {boot.rank} agent={os.environ.get('AGENT_TAG')} "
          f"local={boot.local_rank}/{boot.local_size}", flush=True)
    boot.barrier(timeout=30)
elif mode == "exit0early":
    if boot.rank == 1:
        sys.exit(0)
    try:
        boot.barrier(timeout=20)
    except PeerFailure as e:
        print(f"rank {boot.rank}: PeerFailure peer={e.peer}: {e}", flush=True)
        sys.exit(6)
elif mode == "bench":
    class CountingSub:
        """The failure-notice connection, counting real checks (reads that
        find nothing: each check reads until the connection has nothing)."""
        def __init__(self, sub):
            self.sub, self.polls = sub, 0

        def recv_multipart(self, *a, **k):
            frames = self.sub.recv_multipart(*a, **k)
            self.polls += frames is None
            return frames

        def __getattr__(self, name):
            return getattr(self.sub, name)

    boot.barrier(timeout=30)
    real = boot._sub
    boot._sub = counting = CountingSub(real)
    n = 200_000
    t0 = time.perf_counter()
    for _ in range(n):
        boot.check_failures()
    dt = time.perf_counter() - t0
    boot._sub = real
    print(f"rank {boot.rank} check_failures_ns={dt / n * 1e9:.0f} polls={counting.polls} "
          f"allowed={int(dt / boot.check_interval) + 2}", flush=True)
    boot.barrier(timeout=30)
elif mode == "watch":
    # the first failure check_failures reports within 30 s, then whether a
    # bootstrap collective still completes; written to $WATCH_OUT.<rank>
    # (the launcher, which relays stdout, may be what died)
    boot.barrier(timeout=30)
    print(f"rank {boot.rank} watching", flush=True)
    seen, deadline = "no failure reported", time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            boot.check_failures()
        except PeerFailure as e:
            seen = f"PeerFailure peer={e.peer}: {e}"
            break
        time.sleep(0.01)
    try:
        boot.barrier(timeout=5)
        seen += "; then barrier completed"
    except (BootstrapError, PeerFailure) as e:
        seen += f"; then barrier {type(e).__name__}: {e}"
    out = f"{os.environ['WATCH_OUT']}.{boot.rank}"
    with open(out + ".tmp", "w") as f:     # (renamed whole: the test reads it once it exists)
        f.write(seen + "\n")
    os.replace(out + ".tmp", out)
    os._exit(0)
boot.close()
