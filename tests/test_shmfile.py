"""ucxpy.shmfile: the one creator/opener of /dev/shm segments."""
from __future__ import annotations

import errno
import os

import pytest

from ucxpy import shmfile

pytestmark = pytest.mark.skipif(not os.access(shmfile.SHM_DIR, os.W_OK),
                                reason="/dev/shm not writable")


@pytest.fixture
def name(request):
    n = f"ucxpy-test-{os.getpid()}-{request.node.name[:20]}"
    yield n
    shmfile.unlink_quiet(os.path.join(shmfile.SHM_DIR, n))


@pytest.mark.parametrize("allocate", [False, True])
def test_create_then_open_shares_the_bytes(name, allocate):
    a = shmfile.create(name, 8192, allocate=allocate)
    path = os.path.join(shmfile.SHM_DIR, name)
    assert os.stat(path).st_mode & 0o777 == 0o600 and os.stat(path).st_size == 8192
    a[100:104] = b"ucxp"
    b = shmfile.open_private(name, 8192, exact=True)
    assert b[100:104] == b"ucxp"
    b[0:2] = b"ok"
    assert a[0:2] == b"ok"
    c = shmfile.open_private(name, 4096)          # a prefix of a longer file is fine
    assert len(c) == 4096
    with pytest.raises(FileExistsError):
        shmfile.create(name, 10)                   # O_EXCL: never reuse a name


def test_sizes_are_checked(name):
    shmfile.create(name, 4096)
    with pytest.raises(OSError) as ei:
        shmfile.open_private(name, 8192)
    assert ei.value.errno == errno.EINVAL and "at least 8192" in str(ei.value)
    with pytest.raises(OSError, match="expected 2048"):
        shmfile.open_private(name, 2048, exact=True)


def test_foreign_or_shared_files_are_refused(name, tmp_path):
    path = os.path.join(shmfile.SHM_DIR, name)
    with open(path, "wb") as f:
        f.write(bytes(4096))
    os.chmod(path, 0o644)                          # readable by others: not a private segment
    with pytest.raises(PermissionError, match="not owned by us alone"):
        shmfile.open_private(name, 4096)
    assert os.path.exists(path)                     # refused files are left alone
    os.unlink(path)
    target = tmp_path / "elsewhere"
    target.write_bytes(bytes(4096))
    os.symlink(target, path)                        # a planted symlink is not followed
    with pytest.raises(OSError) as ei:
        shmfile.open_private(name, 4096)
    assert ei.value.errno == errno.ELOOP


def test_open_unlinks_when_asked(name):
    shmfile.create(name, 4096)
    m = shmfile.open_private(name, 4096, unlink=True)
    assert not os.path.exists(os.path.join(shmfile.SHM_DIR, name)) and len(m) == 4096
