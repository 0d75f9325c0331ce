"""Build shim: compiles the cffi modules; metadata lives in setup.cfg.

``ucxpy._native`` (shm rings, atomics, CMA) is always built, and so are
``ucxpy._proto_pipelined`` (the C half of the shipped protocol plug-in,
native/build_proto.py),
``ucxpy._pybuffer`` (a base class that lets Python handle objects export the
buffer protocol, native/pybuffer.c), ``ucxpy._apilock`` (the API lock,
native/apilock.c), ``ucxpy._dp`` (the native data plane, native/dp/) and
``mpi_shim._accel`` (mpi_shim's hottest calls in C, native/mpi_accel.c).  The RDMA
modules (``ucxpy._ofi``, ``ucxpy._verbs``) are added when their headers exist
(see native/build_rdma.py; ``UCXPY_NO_RDMA=1`` skips them), and so is the
PMIx client binding (``ucxpy._pmix``, native/build_pmix.py, where libpmix-dev's
``pmix.h`` is; ``UCXPY_NO_PMIX=1`` skips it).
"""
import os
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

CFFI_MODULES = ["native/build_native.py:ffibuilder", "native/build_proto.py:ffibuilder"]

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "native"))
try:
    from build_rdma import cffi_modules as rdma_cffi_modules
except ImportError:      # RDMA builders absent: the core and shm still work
    rdma_cffi_modules = list
from build_pmix import cffi_modules as pmix_cffi_modules  # noqa: E402
import build_ucp  # noqa: E402  (native/build_ucp.py: the drop-in libucp.so.0)
sys.path.pop(0)

#: every C file of native/ builds with these (warnings are errors)
STRICT = ["-O2", "-std=gnu11", "-Wall", "-Wextra", "-Werror", "-Wno-unused-parameter"]

# A plain C extension: the buffer-protocol base class (native/pybuffer.c).
PYBUFFER = Extension("ucxpy._pybuffer", ["native/pybuffer.c"], extra_compile_args=STRICT)
# The API lock of a worker serving threads (native/apilock.c).
APILOCK = Extension("ucxpy._apilock", ["native/apilock.c"], extra_compile_args=STRICT)

# The native data plane (native/dp/): its C files and the one Python binding.
DP_SOURCES = ["native/dp/worker.c", "native/dp/rma.c", "native/dp/match.c", "native/dp/tag.c",
              "native/dp/inbox.c", "native/dp/lane.c", "native/dp/rndv.c", "native/dp/tcp.c",
              "native/dp/am.c", "native/dp/stream.c", "native/dp/proto.c", "native/ring.c",
              "native/cma.c"]
DP_HEADERS = ["native/dp/dp.h", "native/dp/match.h", "native/dp/proto.h", "native/ucxpy_native.h"]
DP = Extension("ucxpy._dp", ["native/dp/binding.c"] + DP_SOURCES,
               include_dirs=["native/dp", "native"], depends=DP_HEADERS,
               extra_compile_args=STRICT)

# mpi_shim's hottest entry points in C (native/mpi_accel.c): Send, Recv, Put,
# Get, Flush, Fetch_and_op and Compare_and_swap take their common case there.
def numpy_include() -> str:
    """numpy's C headers (mpi_accel.c reads arrays through their accessors;
    numpy is a build requirement, pyproject.toml)."""
    import numpy
    return numpy.get_include()


MPI_ACCEL = Extension("mpi_shim._accel", ["native/mpi_accel.c"],
                      include_dirs=["native", numpy_include()], depends=DP_HEADERS,
                      extra_compile_args=STRICT)



class BuildExt(build_ext):
    """Also builds libucp.so.0 and its siblings into ucxpy/lib
    (native/build_ucp.py), where UCX's headers are."""

    def run(self):
        super().run()
        if not build_ucp.available():
            print("note: no UCX headers (libucx-dev): libucp.so.0 not built")
            return
        root = os.path.dirname(os.path.abspath(__file__))
        out = os.path.join(root if self.inplace else self.build_lib, "ucxpy", "lib")
        build_ucp.build(out)


EXTENSIONS = [PYBUFFER, APILOCK, DP, MPI_ACCEL] + ([build_ucp.BRIDGE] if build_ucp.available() else [])

setup(cffi_modules=CFFI_MODULES + rdma_cffi_modules() + pmix_cffi_modules(),
      ext_modules=EXTENSIONS, cmdclass={"build_ext": BuildExt})
