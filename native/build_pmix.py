"""cffi (out-of-line, API mode) builder of ``ucxpy._pmix``: the PMIx client
calls the PMIx bootstrap uses (ucxpy/bootstrap/pmix_boot.py), compiled
against the real ``pmix.h`` so every signature and layout is checked.

Built only where the header exists: ``UCXPY_PMIX_PREFIX`` (``<prefix>/include``,
``<prefix>/lib``), ``pkg-config pmix``, the standard include directories, or
Debian's ``/usr/lib/<multiarch>/pmix2/include`` (``libpmix-dev``).
``UCXPY_NO_PMIX=1`` skips it.  Without the module the PMIx bootstrap reports
itself unavailable, with the reason, and is never chosen.  Running this file
builds it in place: ``python native/build_pmix.py``.

The binding is the few entry points used (init/finalize, put/commit, the
non-blocking fence and get, abort, event handlers) with partial structs; the
payload of ``pmix_value_t`` is an anonymous union, which cffi cannot declare
in part, so three small accessors in the source read the members used.
"""
import os
import shutil
import subprocess
import sys
import sysconfig

from cffi import FFI

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

CDEF = """
typedef int... pmix_status_t;
typedef int... pmix_rank_t;
typedef int... pmix_data_type_t;
typedef int... pmix_scope_t;

#define PMIX_SUCCESS ...
#define PMIX_OPERATION_SUCCEEDED ...
#define PMIX_ERR_TIMEOUT ...
#define PMIX_ERR_NOT_FOUND ...
#define PMIX_ERR_UNREACH ...
#define PMIX_ERR_LOST_CONNECTION ...
#define PMIX_ERR_PROC_ABORTED ...
#define PMIX_ERR_PROC_REQUESTED_ABORT ...
#define PMIX_ERR_PROC_ABORTED_BY_SIG ...
#define PMIX_ERR_EXIT_NONZERO_TERM ...
#define PMIX_ERR_PROC_TERM_WO_SYNC ...
#define PMIX_PROC_TERMINATED ...
#define PMIX_EVENT_PROC_TERMINATED ...
#define PMIX_EVENT_NODE_DOWN ...
#define PMIX_EVENT_JOB_END ...

#define PMIX_RANK_WILDCARD ...
#define PMIX_RANK_UNDEF ...
#define PMIX_GLOBAL ...
#define PMIX_BOOL ...
#define PMIX_INT ...
#define PMIX_BYTE_OBJECT ...

static char *const PMIX_TIMEOUT;
static char *const PMIX_COLLECT_DATA;
static char *const PMIX_OPTIONAL;
static char *const PMIX_JOB_SIZE;
static char *const PMIX_LOCAL_RANK;
static char *const PMIX_LOCAL_SIZE;
static char *const PMIX_UNIV_SIZE;
static char *const PMIX_APPNUM;
static char *const PMIX_EVENT_AFFECTED_PROC;

typedef struct { char nspace[...]; pmix_rank_t rank; ...; } pmix_proc_t;
typedef struct { char *bytes; size_t size; } pmix_byte_object_t;
typedef struct { pmix_data_type_t type; ...; } pmix_value_t;
typedef struct { char key[...]; pmix_value_t value; ...; } pmix_info_t;

typedef void (*pmix_op_cbfunc_t)(pmix_status_t status, void *cbdata);
typedef void (*pmix_value_cbfunc_t)(pmix_status_t status, pmix_value_t *kv, void *cbdata);
typedef void (*pmix_event_notification_cbfunc_fn_t)(
    pmix_status_t status, pmix_info_t *results, size_t nresults,
    pmix_op_cbfunc_t cbfunc, void *thiscbdata, void *notification_cbdata);
typedef void (*pmix_notification_fn_t)(
    size_t evhdlr_registration_id, pmix_status_t status, const pmix_proc_t *source,
    pmix_info_t info[], size_t ninfo, pmix_info_t *results, size_t nresults,
    pmix_event_notification_cbfunc_fn_t cbfunc, void *cbdata);
typedef void (*pmix_hdlr_reg_cbfunc_t)(pmix_status_t status, size_t refid, void *cbdata);

pmix_status_t PMIx_Init(pmix_proc_t *proc, pmix_info_t info[], size_t ninfo);
pmix_status_t PMIx_Finalize(const pmix_info_t info[], size_t ninfo);
pmix_status_t PMIx_Abort(int status, const char msg[], pmix_proc_t procs[], size_t nprocs);
pmix_status_t PMIx_Put(pmix_scope_t scope, const char key[], pmix_value_t *val);
pmix_status_t PMIx_Commit(void);
pmix_status_t PMIx_Fence_nb(const pmix_proc_t procs[], size_t nprocs,
                            const pmix_info_t info[], size_t ninfo,
                            pmix_op_cbfunc_t cbfunc, void *cbdata);
pmix_status_t PMIx_Get_nb(const pmix_proc_t *proc, const char key[],
                          const pmix_info_t info[], size_t ninfo,
                          pmix_value_cbfunc_t cbfunc, void *cbdata);
pmix_status_t PMIx_Register_event_handler(pmix_status_t codes[], size_t ncodes,
                                          pmix_info_t info[], size_t ninfo,
                                          pmix_notification_fn_t evhdlr,
                                          pmix_hdlr_reg_cbfunc_t cbfunc, void *cbdata);
pmix_status_t PMIx_Deregister_event_handler(size_t evhdlr_ref, pmix_op_cbfunc_t cbfunc,
                                            void *cbdata);
const char *PMIx_Error_string(pmix_status_t status);
const char *PMIx_Get_version(void);
pmix_status_t PMIx_Info_load(pmix_info_t *info, const char *key, const void *data,
                             pmix_data_type_t type);
pmix_status_t PMIx_Value_load(pmix_value_t *val, const void *data, pmix_data_type_t type);
void PMIx_Value_destruct(pmix_value_t *val);

int ucxpy_pmix_value_bytes(const pmix_value_t *v, const char **data, size_t *size);
int ucxpy_pmix_value_uint(const pmix_value_t *v, uint64_t *out);
const pmix_proc_t *ucxpy_pmix_value_proc(const pmix_value_t *v);

extern "Python" void ucxpy_pmix_op_done(pmix_status_t, void *);
extern "Python" void ucxpy_pmix_value_done(pmix_status_t, pmix_value_t *, void *);
extern "Python" void ucxpy_pmix_event(size_t, pmix_status_t, const pmix_proc_t *,
                                      pmix_info_t *, size_t, pmix_info_t *, size_t,
                                      pmix_event_notification_cbfunc_fn_t, void *);
"""

SOURCE = r"""
#include <string.h>
#include <pmix.h>

/* The members of pmix_value_t's union that ucxpy reads. */

/* a byte object's or a string's bytes (borrowed from v); -1 for other types */
static int ucxpy_pmix_value_bytes(const pmix_value_t *v, const char **data, size_t *size)
{
    if (v->type == PMIX_BYTE_OBJECT) {
        *data = v->data.bo.bytes;
        *size = v->data.bo.bytes ? v->data.bo.size : 0;
        return 0;
    }
    if (v->type == PMIX_STRING) {
        *data = v->data.string;
        *size = v->data.string ? strlen(v->data.string) : 0;
        return 0;
    }
    return -1;
}

/* an unsigned integer of any width (or a bool, a rank); -1 for other types */
static int ucxpy_pmix_value_uint(const pmix_value_t *v, uint64_t *out)
{
    switch (v->type) {
    case PMIX_BOOL:      *out = v->data.flag;    return 0;
    case PMIX_UINT8:     *out = v->data.uint8;   return 0;
    case PMIX_UINT16:    *out = v->data.uint16;  return 0;
    case PMIX_UINT32:    *out = v->data.uint32;  return 0;
    case PMIX_UINT64:    *out = v->data.uint64;  return 0;
    case PMIX_UINT:      *out = v->data.uint;    return 0;
    case PMIX_SIZE:      *out = v->data.size;    return 0;
    case PMIX_PROC_RANK: *out = v->data.rank;    return 0;
    case PMIX_INT:
        if (v->data.integer < 0)
            return -1;
        *out = (uint64_t)v->data.integer;
        return 0;
    default:
        return -1;
    }
}

/* the process a PMIX_PROC value names (borrowed from v), or NULL */
static const pmix_proc_t *ucxpy_pmix_value_proc(const pmix_value_t *v)
{
    return v->type == PMIX_PROC ? v->data.proc : NULL;
}
"""


def _pkg_config():
    """(include dirs, library dirs) from ``pkg-config pmix``, or empty lists."""
    if shutil.which("pkg-config") is None:
        return [], []
    try:
        out = subprocess.run(["pkg-config", "--cflags-only-I", "--libs-only-L", "pmix"],
                             capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return [], []
    if out.returncode:
        return [], []
    words = out.stdout.split()
    return [w[2:] for w in words if w.startswith("-I")], [w[2:] for w in words
                                                         if w.startswith("-L")]


def _search_dirs():
    """(include dirs, library dirs) where pmix.h and libpmix may be."""
    inc, lib = [], []
    prefix = os.environ.get("UCXPY_PMIX_PREFIX", "")
    if prefix:
        inc.append(os.path.join(prefix, "include"))
        lib += [os.path.join(prefix, "lib"), os.path.join(prefix, "lib64")]
    pinc, plib = _pkg_config()
    inc += pinc
    lib += plib
    inc += [d for var in ("CPATH", "C_INCLUDE_PATH")
            for d in os.environ.get(var, "").split(os.pathsep) if d]
    inc += ["/usr/local/include", "/usr/include"]
    multiarch = sysconfig.get_config_var("MULTIARCH") or ""
    if multiarch:                      # Debian's libpmix-dev
        inc.append(f"/usr/lib/{multiarch}/pmix2/include")
        lib.append(f"/usr/lib/{multiarch}/pmix2/lib")
    return inc, lib


def pmix_include_dir():
    """The directory holding pmix.h, or None (also when UCXPY_NO_PMIX is set)."""
    if os.environ.get("UCXPY_NO_PMIX", "") not in ("", "0"):
        return None
    for d in _search_dirs()[0]:
        if os.path.exists(os.path.join(d, "pmix.h")):
            return d
    return None


def make_builder() -> FFI:
    inc = pmix_include_dir()
    libdirs = [d for d in _search_dirs()[1] if os.path.isdir(d)]
    b = FFI()
    b.cdef(CDEF)
    b.set_source(
        "ucxpy._pmix", SOURCE,
        include_dirs=[inc] if inc else [], library_dirs=libdirs,
        runtime_library_dirs=[d for d in libdirs if not d.startswith("/usr/lib")],
        libraries=["pmix"],
        extra_compile_args=["-O2", "-std=gnu11", "-Wall", "-Wextra", "-Werror",
                            "-Wno-unused-parameter"],
    )
    return b


ffibuilder = make_builder()


def cffi_modules() -> list:
    """``cffi_modules`` entries for setup.py: empty where pmix.h is missing."""
    return ["native/build_pmix.py:ffibuilder"] if pmix_include_dir() else []


if __name__ == "__main__":
    # In-place build: leaves ucxpy/_pmix*.so next to the package.
    if not pmix_include_dir():
        print("build_pmix: pmix.h not found (apt-get install libpmix-dev)", file=sys.stderr)
        sys.exit(1)
    os.chdir(ROOT)
    make_builder().compile(tmpdir=".", verbose=False)
    print("build_pmix: built ucxpy._pmix")
