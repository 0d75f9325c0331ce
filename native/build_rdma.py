"""cffi (out-of-line, API mode) builders of the RDMA modules.

* ``ofi_ffibuilder``   -> ``ucxpy._ofi``   (libfabric, native/ofi_shim.c)
* ``verbs_ffibuilder`` -> ``ucxpy._verbs`` (libibverbs, native/verbs_shim.c)

Each is built only where its headers exist (``rdma/fabric.h``,
``infiniband/verbs.h``); :func:`cffi_modules` lists the ones that can be
built here, for setup.py::

    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "native"))
    from build_rdma import cffi_modules as rdma_cffi_modules
    setup(cffi_modules=["native/build_native.py:ffibuilder"] + rdma_cffi_modules())

``UCXPY_NO_RDMA=1`` skips both; ``UCXPY_OFI_PREFIX`` / ``UCXPY_VERBS_PREFIX``
name non-system installs (``<prefix>/include``, ``<prefix>/lib``).
Running this file builds the available modules in place:
``python native/build_rdma.py [ofi|verbs]``.
"""
import os
import sys

from cffi import FFI

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

# ----------------------------------------------------------------- libfabric

OFI_CDEF = """
#define UXOFI_NO_SLOT ...
#define UXOFI_ERRLEN ...

#define FI_MSG ...
#define FI_RMA ...
#define FI_TAGGED ...
#define FI_ATOMIC ...
#define FI_SEND ...
#define FI_RECV ...
#define FI_READ ...
#define FI_WRITE ...
#define FI_REMOTE_READ ...
#define FI_REMOTE_WRITE ...
#define FI_ORDER_SAS ...
#define FI_CONTEXT ...
#define FI_CONTEXT2 ...

#define FI_MR_LOCAL ...
#define FI_MR_VIRT_ADDR ...
#define FI_MR_ALLOCATED ...
#define FI_MR_PROV_KEY ...
#define FI_MR_ENDPOINT ...
#define FI_MR_RAW ...

#define FI_EAGAIN ...
#define FI_EAVAIL ...
#define FI_ENODATA ...
#define FI_EIO ...
#define FI_ENOKEY ...
#define FI_ECANCELED ...
#define FI_EHOSTUNREACH ...
#define FI_ECONNREFUSED ...
#define FI_ECONNRESET ...
#define FI_ETRUNC ...
#define FI_EACCES ...
#define FI_ENOTCONN ...

typedef struct uxofi_attrs {
    char     provider[64];
    char     fabric[128];
    char     domain[128];
    uint64_t caps;
    uint64_t mode;
    uint64_t mr_mode;
    uint64_t mr_key_size;
    uint64_t max_msg_size;
    uint64_t inject_size;
    uint64_t tx_size;
    uint64_t rx_size;
    uint64_t msg_order;
    uint32_t api_version;
    int      wait_fd;
} uxofi_attrs_t;

typedef struct uxofi_comp {
    uint32_t slot;
    int32_t  err;
    int32_t  prov_errno;
    uint32_t pad;
    uint64_t flags;
    uint64_t len;
} uxofi_comp_t;

typedef struct uxofi uxofi_t;
struct fid_mr;

const char *uxofi_strerror(int err);
uint32_t    uxofi_version(void);
int  uxofi_probe(const char *provider, char *out, size_t outlen);
int  uxofi_open(const char *provider, const char *domain, uint32_t nslots,
                uxofi_t **out, uxofi_attrs_t *attrs, char *err, size_t errlen);
void uxofi_close_ep(uxofi_t *h);
void uxofi_close(uxofi_t *h);
int  uxofi_getname(uxofi_t *h, void *addr, size_t *addrlen);
int  uxofi_av_insert(uxofi_t *h, const void *addr, uint64_t *fi_addr);
int  uxofi_av_remove(uxofi_t *h, uint64_t fi_addr);
int  uxofi_mr_reg(uxofi_t *h, void *buf, size_t len, uint64_t access,
                  uint64_t requested_key, struct fid_mr **mr, uint64_t *key,
                  void **desc);
int  uxofi_mr_close(struct fid_mr *mr);
ssize_t uxofi_send(uxofi_t *h, uint32_t slot, const void *buf, size_t len,
                   void *desc, uint64_t dest);
ssize_t uxofi_inject(uxofi_t *h, const void *buf, size_t len, uint64_t dest);
ssize_t uxofi_recv(uxofi_t *h, uint32_t slot, void *buf, size_t len, void *desc);
ssize_t uxofi_read(uxofi_t *h, uint32_t slot, void *buf, size_t len, void *desc,
                   uint64_t src, uint64_t addr, uint64_t key);
ssize_t uxofi_write(uxofi_t *h, uint32_t slot, const void *buf, size_t len,
                    void *desc, uint64_t dest, uint64_t addr, uint64_t key);
int  uxofi_poll(uxofi_t *h, uxofi_comp_t *out, int n);
const char *uxofi_last_error(uxofi_t *h);
int  uxofi_trywait(uxofi_t *h);

/* the real library, bound directly (non-inline entry points) */
uint32_t fi_version(void);
const char *fi_strerror(int errnum);
"""

# ----------------------------------------------------------------- libibverbs

VERBS_CDEF = """
#define UXV_ERRLEN ...

enum ibv_qp_state { IBV_QPS_RESET, IBV_QPS_INIT, IBV_QPS_RTR, IBV_QPS_RTS,
                    IBV_QPS_SQD, IBV_QPS_SQE, IBV_QPS_ERR, ... };
enum ibv_qp_attr_mask {
    IBV_QP_STATE, IBV_QP_CUR_STATE, IBV_QP_EN_SQD_ASYNC_NOTIFY, IBV_QP_ACCESS_FLAGS,
    IBV_QP_PKEY_INDEX, IBV_QP_PORT, IBV_QP_QKEY, IBV_QP_AV, IBV_QP_PATH_MTU,
    IBV_QP_TIMEOUT, IBV_QP_RETRY_CNT, IBV_QP_RNR_RETRY, IBV_QP_RQ_PSN,
    IBV_QP_MAX_QP_RD_ATOMIC, IBV_QP_ALT_PATH, IBV_QP_MIN_RNR_TIMER, IBV_QP_SQ_PSN,
    IBV_QP_MAX_DEST_RD_ATOMIC, IBV_QP_PATH_MIG_STATE, IBV_QP_CAP, IBV_QP_DEST_QPN, ... };
enum ibv_access_flags { IBV_ACCESS_LOCAL_WRITE, IBV_ACCESS_REMOTE_WRITE,
                        IBV_ACCESS_REMOTE_READ, IBV_ACCESS_REMOTE_ATOMIC, ... };
enum ibv_wr_opcode { IBV_WR_RDMA_WRITE, IBV_WR_RDMA_WRITE_WITH_IMM, IBV_WR_SEND,
                     IBV_WR_SEND_WITH_IMM, IBV_WR_RDMA_READ, IBV_WR_ATOMIC_CMP_AND_SWP,
                     IBV_WR_ATOMIC_FETCH_AND_ADD, ... };
enum ibv_send_flags { IBV_SEND_FENCE, IBV_SEND_SIGNALED, IBV_SEND_SOLICITED,
                      IBV_SEND_INLINE, ... };
enum ibv_wc_status { IBV_WC_SUCCESS, IBV_WC_LOC_LEN_ERR, IBV_WC_WR_FLUSH_ERR,
                     IBV_WC_REM_ACCESS_ERR, IBV_WC_RETRY_EXC_ERR, IBV_WC_RNR_RETRY_EXC_ERR, ... };
enum ibv_wc_opcode { IBV_WC_SEND, IBV_WC_RDMA_WRITE, IBV_WC_RDMA_READ, IBV_WC_COMP_SWAP,
                     IBV_WC_FETCH_ADD, IBV_WC_RECV, ... };
enum ibv_mtu { IBV_MTU_256, IBV_MTU_512, IBV_MTU_1024, IBV_MTU_2048, IBV_MTU_4096, ... };
enum ibv_atomic_cap { IBV_ATOMIC_NONE, IBV_ATOMIC_HCA, IBV_ATOMIC_GLOB, ... };
enum ibv_port_state { IBV_PORT_NOP, IBV_PORT_DOWN, IBV_PORT_INIT, IBV_PORT_ARMED,
                      IBV_PORT_ACTIVE, ... };
#define IBV_LINK_LAYER_UNSPECIFIED ...
#define IBV_LINK_LAYER_INFINIBAND ...
#define IBV_LINK_LAYER_ETHERNET ...

typedef struct uxv_attrs {
    char     device[64];
    uint64_t node_guid;
    uint8_t  port;
    uint8_t  port_state;
    uint8_t  link_layer;
    uint8_t  gid_index;
    uint16_t lid;
    uint16_t pad;
    uint32_t active_mtu;
    uint32_t max_msg_sz;
    uint8_t  gid[16];
    int      atomic_cap;
    int      max_qp_wr;
    int      max_qp_rd_atom;
    int      max_qp_init_rd_atom;
    int      comp_fd;
} uxv_attrs_t;

typedef struct uxv_qp_params {
    int      qp_state;
    int      access;
    uint16_t pkey_index;
    uint8_t  port;
    uint8_t  is_global;
    int      path_mtu;
    uint32_t dest_qpn;
    uint32_t rq_psn;
    uint32_t sq_psn;
    uint16_t dlid;
    uint8_t  sl;
    uint8_t  sgid_index;
    uint8_t  hop_limit;
    uint8_t  max_dest_rd_atomic;
    uint8_t  max_rd_atomic;
    uint8_t  min_rnr_timer;
    uint8_t  timeout;
    uint8_t  retry_cnt;
    uint8_t  rnr_retry;
    uint8_t  dgid[16];
} uxv_qp_params_t;

typedef struct uxv_wc {
    uint64_t wr_id;
    int      status;
    int      opcode;
    uint32_t byte_len;
    uint32_t qp_num;
    uint32_t vendor_err;
} uxv_wc_t;

typedef struct uxv uxv_t;
struct ibv_qp;
struct ibv_mr;
struct ibv_device;

int  uxv_device_count(char *names, size_t len);
int  uxv_open(const char *device, int port, int gid_index, int cq_size,
              uxv_t **out, uxv_attrs_t *attrs, char *err, size_t errlen);
void uxv_close(uxv_t *h);
struct ibv_qp *uxv_qp_create(uxv_t *h, uint32_t max_send_wr, uint32_t max_recv_wr,
                             uint32_t max_inline, uint32_t *qp_num);
int  uxv_qp_modify(struct ibv_qp *qp, const uxv_qp_params_t *p, int mask);
int  uxv_qp_destroy(struct ibv_qp *qp);
struct ibv_mr *uxv_reg_mr(uxv_t *h, void *addr, size_t len, int access,
                          uint32_t *lkey, uint32_t *rkey);
int  uxv_dereg_mr(struct ibv_mr *mr);
int  uxv_post_send(struct ibv_qp *qp, uint64_t wr_id, int opcode, uint64_t laddr,
                   uint32_t len, uint32_t lkey, uint64_t raddr, uint32_t rkey,
                   uint64_t compare_add, uint64_t swap, int send_flags);
int  uxv_post_recv(struct ibv_qp *qp, uint64_t wr_id, uint64_t addr, uint32_t len,
                   uint32_t lkey);
int  uxv_poll(uxv_t *h, uxv_wc_t *out, int n);
int  uxv_arm(uxv_t *h);
int  uxv_drain_events(uxv_t *h);
const char *uxv_wc_status_str(int status);

/* the real library, bound directly */
struct ibv_device **ibv_get_device_list(int *num_devices);
void ibv_free_device_list(struct ibv_device **list);
const char *ibv_get_device_name(struct ibv_device *device);
"""


def _prefix_dirs(env: str):
    prefix = os.environ.get(env, "")
    if not prefix:
        return [], []
    return [os.path.join(prefix, "include")], [os.path.join(prefix, "lib"),
                                               os.path.join(prefix, "lib64")]


def _include_dirs(env: str):
    extra, _ = _prefix_dirs(env)
    dirs = extra + [d for var in ("CPATH", "C_INCLUDE_PATH")
                    for d in os.environ.get(var, "").split(os.pathsep) if d]
    return dirs + ["/usr/local/include", "/usr/include"]


def _has_header(header: str, env: str) -> bool:
    if os.environ.get("UCXPY_NO_RDMA", "") not in ("", "0"):
        return False
    return any(os.path.exists(os.path.join(d, header)) for d in _include_dirs(env))


def have_libfabric() -> bool:
    return _has_header("rdma/fabric.h", "UCXPY_OFI_PREFIX")


def have_verbs() -> bool:
    return _has_header("infiniband/verbs.h", "UCXPY_VERBS_PREFIX")


def _sources(*names):
    # setuptools wants paths relative to setup.py's directory (the cwd of a build)
    if os.path.abspath(os.getcwd()) == ROOT:
        return [os.path.join("native", n) for n in names], "native"
    return [os.path.join(HERE, n) for n in names], HERE


def _builder(module, cdef, header, source, library, env) -> FFI:
    sources, include = _sources(source)
    inc, libdirs = _prefix_dirs(env)
    b = FFI()
    b.cdef(cdef)
    b.set_source(
        module, f'#include "{header}"',
        sources=sources, include_dirs=[include] + inc, library_dirs=libdirs,
        runtime_library_dirs=[d for d in libdirs if os.path.isdir(d)],
        libraries=[library],
        extra_compile_args=["-O2", "-std=gnu11", "-Wall", "-Wextra", "-Werror",
                            "-Wno-unused-parameter", "-Wno-missing-field-initializers"],
    )
    return b


def make_ofi_builder() -> FFI:
    return _builder("ucxpy._ofi", OFI_CDEF, "ofi_shim.h", "ofi_shim.c", "fabric",
                    "UCXPY_OFI_PREFIX")


def make_verbs_builder() -> FFI:
    return _builder("ucxpy._verbs", VERBS_CDEF, "verbs_shim.h", "verbs_shim.c", "ibverbs",
                    "UCXPY_VERBS_PREFIX")


ofi_ffibuilder = make_ofi_builder()
verbs_ffibuilder = make_verbs_builder()


def cffi_modules() -> list:
    """``cffi_modules`` entries for setup.py: only what can be built here."""
    mods = []
    if have_libfabric():
        mods.append("native/build_rdma.py:ofi_ffibuilder")
    if have_verbs():
        mods.append("native/build_rdma.py:verbs_ffibuilder")
    return mods


if __name__ == "__main__":
    # In-place build: leaves ucxpy/_ofi*.so and ucxpy/_verbs*.so next to the package.
    want = set(sys.argv[1:]) or {"ofi", "verbs"}
    os.chdir(ROOT)
    built = []
    for name, have, make in (("ofi", have_libfabric, make_ofi_builder),
                             ("verbs", have_verbs, make_verbs_builder)):
        if name not in want:
            continue
        if not have():
            print(f"build_rdma: skipping {name}: headers not found", file=sys.stderr)
            continue
        make().compile(tmpdir=".", verbose=False)
        built.append(name)
    print("build_rdma: built", ", ".join(built) or "nothing")
