"""Prints what a rank knows of the job key, without the key:
``KEY <group>:<rank> <sha256 of the key, 16 hex> <tcp listen address> <key on cmdline?>``.
With argument ``spawn`` rank 0 also starts one process of this program
through the launcher (MPI-spawn style) and waits for it."""
import hashlib
import os
import sys

import ucxpy
from ucxpy import auth

world = ucxpy.init()
key = auth.job_key(world.context.config) or b""
with open("/proc/self/cmdline", "rb") as f:
    on_cmdline = key and key in f.read()
tcp = [i for i in world.worker.ifaces if i.name == "tcp"]
listen = tcp[0]._listener.getsockname()[0] if tcp else "-"
group = os.environ.get("UCXPY_GROUP", "0")
# one write per line: the ranks share the launcher's stdout
sys.stdout.write(f"KEY {group}:{world.rank} {hashlib.sha256(key).hexdigest()[:16]} {listen} "
                 f"{'LEAKED' if on_cmdline else 'ok'}\n")
sys.stdout.flush()
if len(sys.argv) > 1 and sys.argv[1] == "spawn" and world.rank == 0:
    world.bootstrap.spawn([{"argv": [sys.executable, os.path.abspath(__file__)],
                            "maxprocs": 1}])
world.finalize()
