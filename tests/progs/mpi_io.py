"""mpi_shim MPI-IO spec: non-contiguous views written by several ranks and
checked byte for byte, shared and ordered pointers, split collectives,
data representations, atomic mode, access modes and error cases.

Every rank prints 'MPI-IO OK <rank> ok' on success.  MPI_IO_BIG=1 adds a
64 MiB collective write whose memory use is checked.
"""
import os
import resource
import shutil
import sys
import tempfile
import traceback

import numpy as np

from mpi_shim import MPI

comm = MPI.COMM_WORLD
rank, size = comm.rank, comm.size
DIR = comm.bcast(tempfile.mkdtemp(prefix="mpi-io-") if rank == 0 else None)
_names = iter(range(10 ** 6))


def fresh(tag):
    """A file name nobody has used yet (the same at every rank)."""
    return os.path.join(DIR, f"{tag}-{next(_names)}")


def raw(path):
    """The file's bytes, read without MPI (rank 0's check)."""
    with open(path, "rb") as f:
        return np.frombuffer(f.read(), np.uint8)


def expect_error(error_class, fn, *args):
    try:
        fn(*args)
    except MPI.Exception as e:
        assert e.Get_error_class() == error_class, (fn, MPI.Get_error_string(e.Get_error_class()),
                                                    str(e))
        return e
    raise AssertionError(f"{fn} did not raise {MPI.Get_error_string(error_class)}")


RW = MPI.MODE_RDWR | MPI.MODE_CREATE


# -- non-contiguous views, byte for byte -----------------------------------------------------
def check_vector_interleave():
    """Rank r owns blocks r, r + size, ... of B ints; every int holds its index."""
    B, nblocks = 5, 7
    path = fresh("vector")
    fh = MPI.File.Open(comm, path, RW)
    ftype = MPI.INT.Create_vector(nblocks, B, size * B).Commit()
    fh.Set_view(rank * B * 4, MPI.INT, ftype)
    mine = (rank + size * np.arange(nblocks))[:, None] * B + np.arange(B)[None, :]
    fh.Write_all(mine.astype(np.int32).ravel())
    fh.Sync()
    comm.Barrier()
    fh.Sync()
    if rank == 0:
        data = raw(path).view(np.int32)
        assert np.array_equal(data, np.arange(size * nblocks * B)), data
    back = np.full(nblocks * B, -1, np.int32)
    fh.Seek(0)
    fh.Read_all(back)
    assert np.array_equal(back, mine.ravel())
    assert fh.Get_position() == nblocks * B
    assert fh.Get_byte_offset(B) == (rank * B + size * B) * 4
    fh.Close()
    ftype.Free()
    comm.Barrier()


def check_subarray_and_holes():
    """A 2-D subarray filetype per rank over a file pre-filled with 0xEE: the
    holes between the ranks' parts keep their bytes."""
    rows, cols = 6, 4 * size + 1            # the last column belongs to nobody
    path = fresh("subarray")
    fh = MPI.File.Open(comm, path, RW)
    if rank == 0:
        fh.Write_at(0, np.full(rows * cols * 8, 0xEE, np.uint8))
    comm.Barrier()
    ftype = MPI.DOUBLE.Create_subarray([rows, cols], [rows, 4], [0, 4 * rank]).Commit()
    fh.Set_view(0, MPI.DOUBLE, ftype)
    mine = np.arange(rows * 4, dtype=np.float64) + 1000 * rank
    fh.Write_at_all(0, mine)
    fh.Sync()
    comm.Barrier()
    if rank == 0:
        data = raw(path)
        grid = data.view(np.float64).reshape(rows, cols)
        for r in range(size):
            assert np.array_equal(grid[:, 4 * r:4 * r + 4].ravel(),
                                  np.arange(rows * 4) + 1000.0 * r)
        last = data.reshape(rows, cols * 8)[:, -8:]
        assert (last == 0xEE).all()
    got = np.zeros(rows * 4)
    fh.Read_at_all(0, got)
    assert np.array_equal(got, mine)
    fh.Close()
    ftype.Free()
    comm.Barrier()


def check_noncontiguous_memory_and_struct():
    """Strided memory (every other int) into an indexed filetype with gaps, and
    a struct filetype mixing INT and DOUBLE."""
    path = fresh("mixed")
    fh = MPI.File.Open(comm, path, RW)
    # indexed: 2 ints, gap of 1, 3 ints, gap of 2; extent 8 ints; rank r has tile r of each pair
    base = MPI.INT.Create_indexed([2, 3], [0, 3])
    one = base.Create_resized(0, 8 * 4)
    ftype = one.Create_resized(0, 8 * 4 * size).Commit()
    mem = np.arange(40, dtype=np.int32) * (rank + 1)
    memtype = MPI.INT.Create_vector(20, 1, 2).Commit()       # 20 ints: mem[0::2]
    fh.Set_size(4 * size * 8 * 4)                             # 4 tiles per rank, holes are 0
    fh.Set_view(rank * 8 * 4, MPI.INT, ftype)
    fh.Write_all([mem, 1, memtype])
    fh.Sync()
    comm.Barrier()
    if rank == 0:
        data = raw(path).view(np.int32).reshape(-1, 8)     # one row per 8-int tile
        for r in range(size):
            vals = (np.arange(40, dtype=np.int32) * (r + 1))[0::2].reshape(4, 5)
            rowsof = data[r::size]
            assert np.array_equal(rowsof[:, [0, 1, 3, 4, 5]], vals), (r, rowsof)
            assert (rowsof[:, [2, 6, 7]] == 0).all()
    back = np.zeros(40, np.int32)
    fh.Seek(0)
    fh.Read_all([back, 1, memtype])
    assert np.array_equal(back[0::2], mem[0::2]) and (back[1::2] == 0).all(), (back, mem, fh.Get_view(), fh.Get_position())
    for t in (base, one, ftype, memtype):
        t.Free()
    # struct: an INT at 0 and a DOUBLE at 8, extent 16, one tile per rank round robin
    st = MPI.Datatype.Create_struct([1, 1], [0, 8], [MPI.INT, MPI.DOUBLE])
    tile = st.Create_resized(0, 16 * size).Commit()
    rec = np.zeros(3, dtype=[("i", "<i4"), ("pad", "<i4"), ("d", "<f8")])
    rec["i"] = rank * 10 + np.arange(3)
    rec["d"] = rank + 0.5 + np.arange(3)
    recs = st.Create_resized(0, 16).Commit()
    fh.Set_size(0)
    fh.Set_view(rank * 16, MPI.BYTE, tile)
    fh.Write_at_all(0, [rec, 3, recs])
    fh.Sync()
    comm.Barrier()
    if rank == 0:
        data = raw(path)
        for r in range(size):
            for k in range(3):
                at = (k * size + r) * 16
                assert data[at:at + 4].view(np.int32)[0] == r * 10 + k
                assert data[at + 8:at + 16].view(np.float64)[0] == r + 0.5 + k
    fh.Close()
    for t in (st, tile, recs):
        t.Free()
    comm.Barrier()


def check_many_runs_and_chunks():
    """Accesses that take many run batches (1-int blocks) and several chunks
    (more than 4 MiB), read back through sieving and through single runs."""
    path = fresh("runs")
    fh = MPI.File.Open(comm, path, RW)
    n = 300_000                                  # > one batch of runs per rank
    ftype = MPI.INT.Create_resized(0, 4 * size).Commit()
    fh.Set_view(rank * 4, MPI.INT, ftype)
    mine = np.arange(n, dtype=np.int32) * size + rank
    fh.Write_at_all(0, mine)
    fh.Sync()
    comm.Barrier()
    back = np.zeros(n, np.int32)
    fh.Read_at_all(0, back)
    assert np.array_equal(back, mine)
    if rank == 0:
        assert np.array_equal(raw(path).view(np.int32), np.arange(n * size))
    fh.Close()
    ftype.Free()
    comm.Barrier()
    # big blocks: 5 MiB per rank in 64 KiB blocks (chunking, one run per block)
    path = fresh("chunks")
    fh = MPI.File.Open(comm, path, RW | MPI.MODE_DELETE_ON_CLOSE)
    blk = 16384
    count = (5 << 20) // (4 * blk)
    ftype = MPI.INT.Create_vector(count, blk, blk * size).Commit()
    fh.Set_view(rank * blk * 4, MPI.INT, ftype)
    mine = np.arange(count * blk, dtype=np.int32) + rank * 10 ** 8
    fh.Write_all(mine)
    comm.Barrier()
    back = np.zeros_like(mine)
    fh.Seek(0)
    fh.Read_all(back)
    assert np.array_equal(back, mine)
    fh.Close()
    ftype.Free()
    assert not os.path.exists(path)


# -- shared and ordered file pointers ---------------------------------------------------------
def check_shared_pointer():
    """Concurrent Write_shared records land disjoint and whole."""
    path = fresh("shared")
    fh = MPI.File.Open(comm, path, RW)
    reps = 20
    for k in range(reps):
        length = 3 + (rank + k) % 5
        rec = np.full(length, 0, np.int32)
        rec[0], rec[1], rec[2:] = rank, length, k
        if k % 2:
            fh.Iwrite_shared(rec).Wait()
        else:
            fh.Write_shared(rec)
    fh.Sync()
    comm.Barrier()
    total = sum(3 + (r + k) % 5 for r in range(size) for k in range(reps))
    assert fh.Get_position_shared() == total * 4
    if rank == 0:
        data = raw(path).view(np.int32)
        assert len(data) == total
        seen, at = {}, 0
        while at < len(data):
            r, length = int(data[at]), int(data[at + 1])
            k = int(data[at + 2]) if length > 2 else None
            assert 0 <= r < size and length == 3 + (r + k) % 5, (at, data[at:at + 8])
            assert (data[at + 2:at + length] == k).all()
            seen[(r, k)] = seen.get((r, k), 0) + 1
            at += length
        assert seen == {(r, k): 1 for r in range(size) for k in range(reps)}
    # Read_shared: every rank reads records of 4 ints until the end; all are read once
    fh.Seek_shared(0, MPI.SEEK_SET)
    fh.Set_view(0, MPI.INT)
    assert fh.Get_position_shared() == 0
    comm.Barrier()                  # before anybody moves the pointer again
    got, status = [], MPI.Status()
    while True:
        buf = np.zeros(4, np.int32)
        fh.Read_shared(buf, status)
        n = status.Get_count(MPI.INT)
        if n == 0:
            break
        got.append(buf[:n].copy())
    allgot = comm.gather(np.concatenate(got) if got else np.zeros(0, np.int32), 0)
    if rank == 0:
        assert sorted(np.concatenate(allgot).tolist()) == sorted(raw(path).view(np.int32)
                                                                 .tolist())
    comm.Barrier()
    fh.Seek_shared(0, MPI.SEEK_END)
    assert fh.Get_position_shared() == total
    fh.Seek_shared(-total, MPI.SEEK_CUR)
    assert fh.Get_position_shared() == 0
    expect_error(MPI.ERR_ARG, fh.Seek_shared, -1, MPI.SEEK_SET)
    fh.Close()
    comm.Barrier()


def check_ordered():
    """Ordered writes of different sizes are in rank order; the split form too."""
    path = fresh("ordered")
    fh = MPI.File.Open(comm, path, RW)
    fh.Set_view(0, MPI.SHORT)
    for k in range(3):
        mine = np.full(rank + 1 + k, rank * 100 + k, np.int16)
        if k == 1:
            fh.Write_ordered_begin(mine)
            st = MPI.Status()
            fh.Write_ordered_end(mine, st)
            assert st.Get_count(MPI.SHORT) == len(mine)
        else:
            fh.Write_ordered(mine)
    fh.Sync()
    comm.Barrier()
    expected = np.concatenate([np.full(r + 1 + k, r * 100 + k, np.int16)
                               for k in range(3) for r in range(size)])
    assert fh.Get_position_shared() == len(expected)
    if rank == 0:
        assert np.array_equal(raw(path).view(np.int16), expected)
    fh.Seek_shared(0)
    for k in range(3):
        back = np.zeros(rank + 1 + k, np.int16)
        fh.Read_ordered(back)
        assert (back == rank * 100 + k).all()
    fh.Close()
    comm.Barrier()


# -- data representations ----------------------------------------------------------------------
def check_datareps():
    path = fresh("reps")
    fh = MPI.File.Open(comm, path, RW)
    fh.Set_view(0, MPI.INT, MPI.INT, "external32")
    vals = np.arange(4, dtype=np.int32) + 256 * rank
    fh.Write_at_all(4 * rank, vals)
    fh.Sync()
    comm.Barrier()
    if rank == 0:
        assert np.array_equal(raw(path).view(">i4"), np.concatenate(
            [np.arange(4) + 256 * r for r in range(size)]))
    back = np.zeros(4, np.int32)
    fh.Read_at_all(4 * rank, back)
    assert np.array_equal(back, vals)
    assert fh.Get_view()[3] == "external32"
    assert fh.Get_type_extent(MPI.LONG) == 4 and fh.Get_type_extent(MPI.INT) == 4
    expect_error(MPI.ERR_UNSUPPORTED_DATAREP, fh.Set_view, 0, MPI.LONG, MPI.LONG, "external32")
    expect_error(MPI.ERR_UNSUPPORTED_DATAREP, fh.Set_view, 0, MPI.INT, MPI.INT, "no-such-rep")
    # the end of the file cuts a strided external32 read: the whole doubles arrive
    own = MPI.File.Open(MPI.COMM_SELF, f"{fresh('ext32')}-{rank}", RW | MPI.MODE_DELETE_ON_CLOSE)
    own.Set_view(0, MPI.DOUBLE, MPI.DOUBLE, "external32")
    strided = MPI.DOUBLE.Create_vector(5, 1, 2).Commit()
    own.Write_at(0, [np.arange(10.0), 1, strided])
    own.Set_size(3 * 8 + 5)
    got, status = np.zeros(10), MPI.Status()
    own.Read_at(0, [got, 1, strided], status)
    assert status.Get_count(MPI.DOUBLE) == 3 and np.array_equal(got, [0, 0, 2, 0, 4] + [0] * 5)
    own.Close()
    strided.Free()
    # a user representation: each element's bytes reversed in the file
    name = f"reversed-{size}"

    def write_fn(userbuf, datatype, count, filebuf, position):
        n = datatype.Get_size()
        src = np.frombuffer(userbuf, np.uint8)[position * datatype.extent:][:count * n]
        np.frombuffer(filebuf, np.uint8)[:count * n] = src.reshape(-1, 4)[:, ::-1].ravel()

    def read_fn(userbuf, datatype, count, filebuf, position):
        n = datatype.Get_size()
        src = np.frombuffer(filebuf, np.uint8)[:count * n]
        np.frombuffer(userbuf, np.uint8)[position * datatype.extent:][:count * n] = \
            src.reshape(-1, 4)[:, ::-1].ravel()

    MPI.Register_datarep(name, read_fn, write_fn, lambda dt: dt.Get_size())
    expect_error(MPI.ERR_DUP_DATAREP, MPI.Register_datarep, name, None, None, lambda dt: 4)
    fh.Set_view(0, MPI.INT, MPI.INT, name)
    fh.Write_at_all(4 * rank, vals)
    fh.Sync()
    comm.Barrier()
    if rank == 0:
        assert np.array_equal(raw(path).view(">i4"), np.concatenate(
            [np.arange(4) + 256 * r for r in range(size)]))
    back[:] = 0
    fh.Read_at_all(4 * rank, back)
    assert np.array_equal(back, vals)
    fh.Close()
    comm.Barrier()


# -- atomic mode, access modes -------------------------------------------------------------------
def check_atomic_mode():
    """Everybody writes the same 2000 ints (1000 runs) at once: in atomic mode
    the result is one writer's data, never a mix."""
    path = fresh("atomic")
    fh = MPI.File.Open(comm, path, RW)
    fh.Set_atomicity(True)
    assert fh.atomicity
    ftype = MPI.INT.Create_vector(1000, 2, 3).Commit()
    fh.Set_view(0, MPI.INT, ftype)
    comm.Barrier()
    for _ in range(5):
        fh.Write_at(0, np.full(2000, rank + 1, np.int32))
    fh.Sync()
    comm.Barrier()
    back = np.zeros(2000, np.int32)
    fh.Read_at(0, back)
    assert (back == back[0]).all() and 1 <= back[0] <= size, np.unique(back)
    fh.Close()
    ftype.Free()
    comm.Barrier()


def check_modes():
    path = fresh("modes")
    fh = MPI.File.Open(comm, path, MPI.MODE_WRONLY | MPI.MODE_CREATE | MPI.MODE_EXCL)
    assert fh.amode == MPI.MODE_WRONLY | MPI.MODE_CREATE | MPI.MODE_EXCL
    fh.Write_ordered(np.full(10, rank, np.uint8))
    expect_error(MPI.ERR_ACCESS, fh.Read_at, 0, bytearray(1))
    fh.Preallocate(1000)
    assert fh.Get_size() == 1000
    fh.Set_size(10 * size)
    assert fh.Get_size() == 10 * size
    fh.Close()
    # the file exists now: MODE_EXCL fails at every rank, the same way
    expect_error(MPI.ERR_FILE_EXISTS, MPI.File.Open, comm, path,
                 MPI.MODE_WRONLY | MPI.MODE_CREATE | MPI.MODE_EXCL)
    fh = MPI.File.Open(comm, path, MPI.MODE_RDWR | MPI.MODE_APPEND)
    assert fh.Get_position() == 10 * size and fh.Get_position_shared() == 10 * size
    fh.Close()
    fh = MPI.File.Open(comm, path, MPI.MODE_RDONLY)
    expect_error(MPI.ERR_READ_ONLY, fh.Write_at, 0, b"x")
    expect_error(MPI.ERR_READ_ONLY, fh.Set_size, 0)
    buf = bytearray(10)
    fh.Read_at(10 * rank, buf)
    assert buf == bytes([rank]) * 10
    fh.Close()
    fh = MPI.File.Open(comm, path, MPI.MODE_WRONLY | MPI.MODE_SEQUENTIAL)
    for call, args in ((fh.Seek, (0,)), (fh.Get_position, ()), (fh.Write_at, (0, b"x")),
                       (fh.Write, (b"x",)), (fh.Get_position_shared, ()),
                       (fh.Seek_shared, (0,)), (fh.Set_size, (0,)), (fh.Get_byte_offset, (0,))):
        expect_error(MPI.ERR_UNSUPPORTED_OPERATION, call, *args)
    fh.Write_ordered(b"ab")
    fh.Set_view(MPI.DISPLACEMENT_CURRENT, MPI.BYTE, MPI.BYTE)
    assert fh.Get_view()[0] == 2 * size
    fh.Close()
    comm.Barrier()
    if rank == 0:
        MPI.File.Delete(path)
    comm.Barrier()
    expect_error(MPI.ERR_NO_SUCH_FILE, MPI.File.Open, comm, path, MPI.MODE_RDONLY)


def check_errors():
    path = fresh("errors")
    for amode in (MPI.MODE_RDONLY | MPI.MODE_CREATE, MPI.MODE_RDONLY | MPI.MODE_EXCL,
                  MPI.MODE_CREATE, MPI.MODE_RDWR | MPI.MODE_WRONLY,
                  MPI.MODE_RDWR | MPI.MODE_SEQUENTIAL | MPI.MODE_CREATE, MPI.MODE_RDWR | 1 << 20):
        expect_error(MPI.ERR_AMODE, MPI.File.Open, comm, path, amode)
    # different access modes at different ranks
    if size > 1:
        expect_error(MPI.ERR_NOT_SAME, MPI.File.Open, comm, path,
                     RW if rank else MPI.MODE_WRONLY | MPI.MODE_CREATE)
    expect_error(MPI.ERR_BAD_FILE, MPI.File.Open, comm, DIR, MPI.MODE_RDWR)
    fh = MPI.File.Open(comm, path, RW | MPI.MODE_DELETE_ON_CLOSE)
    expect_error(MPI.ERR_ARG, fh.Write_at, -1, b"x")
    expect_error(MPI.ERR_ARG, fh.Seek, -1)
    expect_error(MPI.ERR_ARG, fh.Seek, 0, 12345)
    expect_error(MPI.ERR_ARG, fh.Set_size, -1)
    expect_error(MPI.ERR_ARG, fh.Set_view, -3, MPI.INT)
    expect_error(MPI.ERR_ARG, fh.Set_view, MPI.DISPLACEMENT_CURRENT, MPI.INT)
    expect_error(MPI.ERR_ARG, fh.Set_view, 0, MPI.INT, MPI.SHORT)
    uncommitted = MPI.INT.Create_vector(2, 1, 2)
    expect_error(MPI.ERR_TYPE, fh.Set_view, 0, MPI.INT, uncommitted)
    uncommitted.Free()
    backwards = MPI.INT.Create_indexed([1, 1], [4, 0]).Commit()
    expect_error(MPI.ERR_ARG, fh.Set_view, 0, MPI.INT, backwards)
    backwards.Free()
    # one rank's bad view fails the collective call at every rank
    bad = MPI.SHORT if rank == size - 1 else MPI.INT
    expect_error(MPI.ERR_ARG, fh.Set_view, 0, MPI.INT, bad)
    fh.Set_view(0, MPI.INT)
    expect_error(MPI.ERR_ARG, fh.Write_at, 0, b"abcdef")        # 1.5 etypes
    fh.Write_at_all_begin(0, np.zeros(2, np.int32))
    expect_error(MPI.ERR_IO, fh.Write_all_begin, np.zeros(2, np.int32))
    expect_error(MPI.ERR_IO, fh.Write_all_end, None)
    fh.Write_at_all_end(None)
    expect_error(MPI.ERR_IO, fh.Write_at_all_end, None)
    try:
        fh.Read_at(0, b"read-only memory")
    except BufferError:
        pass
    else:
        raise AssertionError("reading into bytes did not raise BufferError")
    # a user error handler sees the file and the error code, then the call raises
    calls = []
    eh = MPI.File.Create_errhandler(lambda f, code: calls.append((f, code)))
    fh.Set_errhandler(eh)
    expect_error(MPI.ERR_ARG, fh.Seek, -1)
    assert len(calls) == 1 and calls[0][0] == fh and \
        MPI.Get_error_class(calls[0][1]) == MPI.ERR_ARG
    fh.Call_errhandler(MPI.ERR_OTHER)
    assert len(calls) == 2
    fh.Set_errhandler(MPI.ERRORS_RETURN)
    # FILE_NULL's handler runs for failed opens
    MPI.FILE_NULL.Set_errhandler(eh)
    expect_error(MPI.ERR_NO_SUCH_FILE, MPI.File.Open, comm, path + "-nothere", MPI.MODE_RDONLY)
    assert calls[-1][0] == MPI.FILE_NULL
    MPI.FILE_NULL.Set_errhandler(MPI.ERRORS_RETURN)
    eh.Free()
    other = MPI.File(fh)
    fh.Close()
    assert fh == MPI.FILE_NULL and not fh
    expect_error(MPI.ERR_FILE, other.Get_size)
    expect_error(MPI.ERR_FILE, MPI.FILE_NULL.Get_size)
    comm.Barrier()
    if rank == 0:
        expect_error(MPI.ERR_NO_SUCH_FILE, MPI.File.Delete, path)
        expect_error(MPI.ERR_BAD_FILE, MPI.File.Delete, DIR)
    comm.Barrier()


def check_big_collective_write():
    """64 MiB written by all ranks together: memory grows by far less than the file."""
    total, blk = 64 << 20, 1 << 16
    per = total // size // blk * blk
    path = fresh("big")
    data = np.full(per // 4, rank + 1, np.int32)
    fh = MPI.File.Open(comm, path, RW | MPI.MODE_DELETE_ON_CLOSE)
    block = MPI.BYTE.Create_contiguous(blk)
    ftype = block.Create_resized(0, blk * size).Commit()      # my block of every row
    block.Free()
    fh.Set_view(rank * blk, MPI.BYTE, ftype)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    fh.Write_all(data)
    fh.Seek(0)
    fh.Read_all(data)
    grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) * 1024
    assert grown < 16 << 20, f"memory grew by {grown >> 20} MiB"
    assert (data == rank + 1).all()
    comm.Barrier()
    assert fh.Get_size() == per * size
    fh.Close()
    ftype.Free()


CHECKS = [check_vector_interleave, check_subarray_and_holes,
          check_noncontiguous_memory_and_struct, check_many_runs_and_chunks,
          check_shared_pointer, check_ordered, check_datareps, check_atomic_mode, check_modes,
          check_errors]
if os.environ.get("MPI_IO_BIG"):
    CHECKS.append(check_big_collective_write)

ONLY = os.environ.get("MPI_IO_ONLY")          # debugging: run the checks named so
try:
    for check in CHECKS:
        if ONLY and check.__name__ not in ONLY.split(","):
            continue
        if os.environ.get("MPI_IO_TRACE"):
            print(f"[{rank}] {check.__name__}", file=sys.stderr, flush=True)
        check()
        comm.Barrier()
except BaseException:
    # a failed check must not leave the other ranks waiting in a collective
    traceback.print_exc()
    sys.stderr.flush()
    comm.Abort(1)
comm.Barrier()
if rank == 0:
    shutil.rmtree(DIR, ignore_errors=True)
print(f"MPI-IO OK {rank} ok", flush=True)
sys.stdout.flush()
