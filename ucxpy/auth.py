"""Job authentication: the per-job key and the proofs built on it.

Theory of operation
-------------------
Every process of a job holds the same secret, the *job key*: ``ucxpy-run``
generates one per job (:func:`generate_key`) and hands it to its ranks in
``UCXPY_AUTH_KEY``; under ``mpiexec`` rank 0 generates it and broadcasts it
through the MPI launcher's own channel; client/server programs pass it in
``Config(auth_key=...)``, ``UCXPY_AUTH_KEY`` or a file named by
``UCXPY_AUTH_KEY_FILE``.  A process without one (a plain ``python
prog.py``) gets a random key of its own (:func:`process_key`): its workers
reach each other, nobody outside the process can connect to them, and its
listeners bind loopback only.

Whoever proves knowledge of the key is a member of the job.  Proofs are
HMAC-SHA256 tags over a *transcript*: a domain label (which protocol and
which role), both sides' fresh random nonces and whatever else the
protocol binds (:func:`tag`, length-prefixed so fields cannot be shifted
between each other).  Checking uses :func:`hmac.compare_digest`.  Because
each side contributes a nonce it just drew, a recorded exchange replayed
later proves nothing; because the role is in the label, a side cannot be
tricked into proving for the other role (reflection).

Connection-time handshakes (tcp, ofi, the verbs out-of-band socket) use
:func:`tag` directly; the launcher's rendezvous service signs whole zmq
messages with :func:`sign_frames`.  Peers that fail a proof are dropped by
the transport and counted here (:data:`failures`, per transport name), with
a debug-level log line.
"""
from __future__ import annotations

import collections
import functools
import hashlib
import hmac
import os
import secrets
import stat
import struct
TYPE_CHECKING = False      # (typing is imported for type checkers only: issue 44)
if TYPE_CHECKING:
    from typing import Optional

from .lazy import logger
from .errors import ConfigError

log = logger("ucxpy.auth")

ENV_KEY = "UCXPY_AUTH_KEY"
ENV_KEY_FILE = "UCXPY_AUTH_KEY_FILE"
#: shortest key accepted from a user (``ucxpy-run`` generates 43 characters)
KEY_MIN = 16
NONCE_LEN = 16
TAG_LEN = 32
#: what ``ucxpy-info -c`` shows instead of a key
MASK = "<set, hidden>"

#: proofs that failed, per transport / service name ("tcp", "ofi", "verbs",
#: "shm", "rendezvous", ...): readable from Python, e.g. by a test
failures: collections.Counter = collections.Counter()
_U32 = struct.Struct("<I")


def generate_key() -> str:
    """A fresh job key: 256 random bits, URL-safe text (fits an environment)."""
    return secrets.token_urlsafe(32)


def new_nonce() -> bytes:
    return secrets.token_bytes(NONCE_LEN)


@functools.lru_cache(maxsize=None)
def _process_key(pid: int) -> bytes:
    return secrets.token_bytes(32)


def process_key() -> bytes:
    """The key of a process that was given none: random, never leaves it.
    (Keyed by pid so that a forked child draws its own.)"""
    return _process_key(os.getpid())


def read_key_file(path: str) -> bytes:
    """The key stored in ``path`` (surrounding whitespace stripped).

    Raises :class:`ConfigError` if it cannot be read, is empty or shorter
    than :data:`KEY_MIN`, or if other users may read or write it (like ssh,
    a key that others can read is no secret)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as e:
        raise ConfigError(f"{ENV_KEY_FILE}={path!r}: {e.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ConfigError(f"{ENV_KEY_FILE}={path!r} is not a regular file")
        if st.st_mode & 0o077:
            raise ConfigError(f"{ENV_KEY_FILE}={path!r} is accessible by other users "
                              f"(mode {stat.S_IMODE(st.st_mode):o}); chmod 600 it")
        if st.st_uid != os.geteuid():
            raise ConfigError(f"{ENV_KEY_FILE}={path!r} belongs to another user")
        data = os.read(fd, 1 << 16)
    finally:
        os.close(fd)
    key = data.strip()
    check_key(key, ENV_KEY_FILE)
    return key


def check_key(key: bytes, where: str = ENV_KEY) -> None:
    if len(key) < KEY_MIN:
        raise ConfigError(f"{where}: a job key needs at least {KEY_MIN} bytes "
                          f"(ucxpy.auth.generate_key() makes one)")


def job_key(config) -> Optional[bytes]:
    """The job key ``config`` carries (``auth_key``, else the file named by
    ``auth_key_file``), or None."""
    key = getattr(config, "auth_key", "") or ""
    if key:
        return key.encode("utf-8", "surrogateescape") if isinstance(key, str) else bytes(key)
    path = getattr(config, "auth_key_file", "") or ""
    if path:
        return read_key_file(path)
    return None


def interface_key(config) -> bytes:
    """The key a transport proves with: the job key, else :func:`process_key`."""
    return job_key(config) or process_key()


def tag(key: bytes, label: bytes, *fields) -> bytes:
    """HMAC-SHA256 over ``label`` and length-prefixed ``fields`` (bytes-like)."""
    h = hmac.new(key, label, hashlib.sha256)
    for f in fields:
        f = bytes(f)
        h.update(_U32.pack(len(f)))
        h.update(f)
    return h.digest()


def check(key: bytes, mac, label: bytes, *fields) -> bool:
    """Does ``mac`` equal :func:`tag` of the rest?  Constant time."""
    return hmac.compare_digest(bytes(mac), tag(key, label, *fields))


def sign_frames(key: bytes, label: bytes, frames) -> bytes:
    """The tag of a multipart message (each frame length-prefixed)."""
    return tag(key, label, *frames)


def refused(transport: str, why: str, peer="?") -> None:
    """Count and log (debug) a peer that failed to prove membership."""
    failures[transport] += 1
    log.debug("%s: refused %s: %s", transport, peer, why)
