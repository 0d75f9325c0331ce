"""The receive paths of the core, per 8 B message, in one process: two shm
workers of a ``Pair`` (tests/conftest.py), sender and receiver in turn, so
that scheduling between ranks does not blur it.  Three paths:

* post + cancel of a receive;
* a receive posted after its message arrived (post + completion from the
  unexpected queue);
* a window of 64 receives posted first, then the 64 messages, then one
  wait (post + send + delivery).

Best of 5.  For an A/B, run it with ``PYTHONPATH`` naming each tree::

    PYTHONPATH=<tree> python bench/recv_paths.py [--root <tree>]

(docs/notes/performance-history.md, "The native data plane, step 2").
"""
from __future__ import annotations

import argparse
import os
import sys
import time
import timeit


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--root", default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                   help="the tree whose tests/conftest.py makes the pair")
    p.add_argument("--size", type=int, default=8)
    args = p.parse_args()
    sys.path.insert(0, os.path.join(args.root, "tests"))
    from conftest import Pair
    pair = Pair("shm")
    a, b = pair.workers
    ep = pair.eps[0][1]
    ep.tag_send(b"w", 9)                              # a's wire-up
    b.tag_recv(bytearray(1), 9, source=0, timeout=10)
    x = bytearray(args.size)
    n = 20000

    def post_cancel():
        b.tag_recv_nb(x, 5, source=0).cancel()

    t = min(timeit.repeat(post_cancel, number=n, repeat=5)) / n
    print(f"post + cancel:                     {t * 1e9:6.0f} ns")
    best = 1e9
    for _ in range(5):
        for _ in range(1000):
            ep.tag_send_nb(x, 6)
        t0 = time.perf_counter()
        for _ in range(1000):
            b.tag_recv_nb(x, 6, source=0).wait()
        best = min(best, (time.perf_counter() - t0) / 1000)
    print(f"receive of an arrived message:     {best * 1e9:6.0f} ns")

    def window():
        rs = [b.tag_recv_nb(x, 7, source=0) for _ in range(64)]
        for _ in range(64):
            ep.tag_send_nb(x, 7)
        b.wait_all(rs)

    best = 1e9
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(30):
            window()
        best = min(best, (time.perf_counter() - t0) / (30 * 64))
    print(f"window of 64 posted receives:      {best * 1e9:6.0f} ns per message "
          "(post + send + delivery)")
    pair.close()


if __name__ == "__main__":
    main()
