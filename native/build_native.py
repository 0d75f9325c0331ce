"""cffi (out-of-line, API mode) builder of ``ucxpy._native``.

Used by setup.py (``cffi_modules=["native/build_native.py:ffibuilder"]``) so a
plain ``pip install -e .`` compiles the module.  Running this file directly
builds it in place as well: ``python native/build_native.py``.
"""
import os

from cffi import FFI

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCES = ["ring.c", "atomics.c", "cma.c"]

CDEF = """
#define UCXPY_RING_HDR_SIZE ...
#define UCXPY_RING_PREFIX ...
#define UCXPY_RING_WAITERS ...
#define UCXPY_RING_WAITERS_LOST ...
#define UCXPY_RING_PEEK_OUT ...
#define UCXPY_RING_OK ...
#define UCXPY_RING_NOTIFY ...
#define UCXPY_RING_FULL ...
#define UCXPY_RING_TOOBIG ...
#define UCXPY_RING_CORRUPT ...
#define UCXPY_RING_CLOSED ...
#define UCXPY_RING_BUSY ...
#define UCXPY_RING_LOST ...

typedef struct ucxpy_ring {
    void     *shared;
    uint8_t  *data;
    uint64_t  capacity;
    uint64_t  mask;
    uint64_t  head;
    uint64_t  tail;
    uint64_t  peeked;
    uint64_t  source;
    uint32_t  token;
    uint32_t  lost;
    uint64_t  epoch;
} ucxpy_ring_t;

size_t  ucxpy_ring_mem_size(size_t capacity);
int     ucxpy_ring_init(void *mem, size_t memsize);
int     ucxpy_ring_attach(ucxpy_ring_t *r, void *mem, size_t memsize);
int     ucxpy_ring_attach_producer(ucxpy_ring_t *r, void *mem, size_t memsize,
                                   uint64_t source, uint32_t token);
size_t  ucxpy_ring_max_payload(const ucxpy_ring_t *r, size_t hdrlen);
int     ucxpy_ring_push(ucxpy_ring_t *r, unsigned am_id,
                        const char *hdr, size_t hdrlen,
                        const char *payload, size_t paylen);
int     ucxpy_ring_push_close(ucxpy_ring_t *r);
int     ucxpy_ring_peek(ucxpy_ring_t *r, uint64_t *out);
int     ucxpy_ring_release(ucxpy_ring_t *r);
int     ucxpy_ring_arm_consumer(ucxpy_ring_t *r);
void    ucxpy_ring_disarm_consumer(ucxpy_ring_t *r);
void    ucxpy_ring_disarm_producer(ucxpy_ring_t *r);
int64_t ucxpy_ring_arm_producer(ucxpy_ring_t *r);
int     ucxpy_ring_take_waiters(ucxpy_ring_t *r, uint64_t *out, int n);
uint32_t ucxpy_ring_lock_owner(const ucxpy_ring_t *r);
int     ucxpy_ring_break_lock(ucxpy_ring_t *r, uint32_t token);
int     ucxpy_ring_check_lost(ucxpy_ring_t *r);
int     ucxpy_ring_check_header(ucxpy_ring_t *r);
int     ucxpy_ring_reset(ucxpy_ring_t *r, uint32_t token);
void    ucxpy_ring_close_consumer(ucxpy_ring_t *r);
int     ucxpy_ring_is_closed(const ucxpy_ring_t *r);
uint64_t ucxpy_ring_used(ucxpy_ring_t *r);
"""

for _bits in (32, 64):
    _t = f"uint{_bits}_t"
    CDEF += f"""
{_t} ucxpy_atomic_load{_bits}(void *addr);
void ucxpy_atomic_store{_bits}(void *addr, {_t} v);
{_t} ucxpy_atomic_swap{_bits}(void *addr, {_t} v);
{_t} ucxpy_atomic_cswap{_bits}(void *addr, {_t} expected, {_t} desired);
"""
    for _op in ("add", "and", "or", "xor"):
        CDEF += f"""
void ucxpy_atomic_{_op}{_bits}(void *addr, {_t} v);
{_t} ucxpy_atomic_fetch_{_op}{_bits}(void *addr, {_t} v);
"""

CDEF += """
void ucxpy_fence_acquire(void);
void ucxpy_fence_release(void);
void ucxpy_fence_seq_cst(void);

int64_t  ucxpy_cma_read(int pid, void *local, uint64_t remote_addr, size_t len);
int64_t  ucxpy_cma_write(int pid, const void *local, uint64_t remote_addr, size_t len);
uint64_t ucxpy_cma_probe_addr(void);
int      ucxpy_cma_probe(int pid, uint64_t remote_probe_addr);
int      ucxpy_cma_allow_any_peer(void);
"""


def _source_paths():
    # setuptools wants paths relative to setup.py's directory (the cwd of a
    # build); fall back to absolute paths when built from elsewhere.
    root = os.path.dirname(HERE)
    if os.path.abspath(os.getcwd()) == root:
        return [os.path.join("native", s) for s in SOURCES], "native"
    return [os.path.join(HERE, s) for s in SOURCES], HERE


def make_builder() -> FFI:
    sources, include = _source_paths()
    builder = FFI()
    builder.cdef(CDEF)
    builder.set_source(
        "ucxpy._native",
        '#include "ucxpy_native.h"',
        sources=sources,
        include_dirs=[include],
        extra_compile_args=["-O2", "-std=gnu11", "-Wall", "-Wextra", "-Werror",
                            "-Wno-unused-parameter"],
    )
    return builder


ffibuilder = make_builder()

if __name__ == "__main__":
    # In-place build: leaves ucxpy/_native*.so next to the package.
    os.chdir(os.path.dirname(HERE))
    make_builder().compile(tmpdir=".", verbose=True)
