"""The shmem layer's ``UCXPY_*`` variables, declared in ucxpy's registry
(``ucxpy-info -c`` finds them through the ``ucxpy.config`` entry point)."""
from __future__ import annotations

from ucxpy import config

DEFAULT_HEAP_SIZE = 64 << 20


def parse_heap_size(text: str) -> int:
    """'64M', '1g', '65536', '512KB' -> bytes (as SHMEM_SYMMETRIC_SIZE takes them);
    ucxpy's size parser, and the size must be positive."""
    n = config.parse_size(text)
    if n <= 0:
        raise ValueError(f"heap size must be positive, got {text!r}")
    return n


config.declare(
    "shmem",
    ("SHMEM_HEAP_SIZE", None, parse_heap_size,
     "bytes of symmetric heap per PE (default: SHMEM_SYMMETRIC_SIZE, else 64M)"),
    ("SHMEM_PROGRESS_THREAD", "auto", config.parse_tristate,
     "a background thread serves remote accesses that arrive as active messages while "
     "the PE computes (y: when some peer is reached that way; auto: the same, unless "
     "this host runs more PEs than it has CPUs; n: they are served only inside shmem "
     "calls)"),
)
