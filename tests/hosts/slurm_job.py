"""A long-running ucxpy job for the Slurm failure tests (tests/hosts/test_slurm.py;
tests/test_bootstrap_pmix.py runs it under mpirun.openmpi too).

Every rank prints ``SLURM-JOB READY <rank> <hostname> <pid>`` after wire-up,
then loops on barriers with a timeout.  A failure anywhere ends it with an
error on every surviving rank, never a hang:

* a ucxpy error (``ConnectionLost``/``PeerFailure`` when a peer dies, or
  ``TimeoutError`` when a barrier cannot complete) -> ``SLURM-JOB ERROR
  <rank> <type>: <message>``, exit 1;
* SIGTERM (``scancel``, or Slurm ending the step) -> ``SLURM-JOB TERM <rank>``,
  exit 143.

Usage: slurm_job.py [SECONDS]  (default 120: the loop ends by itself after that,
printing ``SLURM-JOB DONE <rank>``)."""
import os
import signal
import socket
import sys
import time

import ucxpy

rank = int(os.environ.get("SLURM_PROCID", os.environ.get("PMI_RANK",
                                                        os.environ.get("PMIX_RANK", -1))))


def on_term(signum, frame):
    os.write(1, f"SLURM-JOB TERM {rank} signal={signum}\n".encode())
    os._exit(143)


signal.signal(signal.SIGTERM, on_term)
world = ucxpy.init()
rank = world.rank
print(f"SLURM-JOB READY {rank} {socket.gethostname()} {os.getpid()}", flush=True)
end = time.monotonic() + float(sys.argv[1] if len(sys.argv) > 1 else 120)
try:
    while time.monotonic() < end:
        world.barrier(timeout=20)
        time.sleep(0.05)
except ucxpy.UcxpyError as e:
    msg = str(e).replace("\n", " ")[:300]
    print(f"SLURM-JOB ERROR {rank} {type(e).__name__}: {msg}", flush=True)
    os._exit(1)
print(f"SLURM-JOB DONE {rank}", flush=True)
os._exit(0)
