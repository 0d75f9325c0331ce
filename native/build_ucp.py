"""Builds ucxpy's drop-in UCX libraries (native/ucp/, see docs/guide/c-programs.md).

* ``ucxpy/lib/libucp.so.0``  UCP's C API on the core (pure C: no Python symbols)
* ``ucxpy/lib/libucs.so.0``  the UCS entry points callers use (ucs_status_string)
* ``ucxpy/lib/libucm.so.0``  the memory-event entry points Open MPI calls (no
  events: ucxpy keeps no registration cache)
* ``ucxpy/lib/libuct.so.0``  empty: named NEEDED by callers
* the extension ``ucxpy._ucp_bridge`` (native/ucp/bridge.c), libucp's one
  way into Python, is an ordinary setuptools Extension (:data:`BRIDGE`).

Built where UCX's public headers are (Debian's libucx-dev, ``ucp/api/ucp.h``),
skipped with a note otherwise; ``UCXPY_NO_UCP=1`` skips it.  The build records
the libpython and site-packages of the interpreter that builds it: a C program
that loads libucp.so.0 starts that Python with this project's packages.
"""
import os
import site
import subprocess
import sys
import sysconfig

from setuptools import Extension

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.join(HERE, "ucp")
UCP_SOURCES = ["attach.c", "context.c", "worker.c", "endpoint.c", "request.c", "tag.c",
               "am.c", "rma.c", "atomic.c", "memory.c", "datatype.c", "unimplemented.c"]
CFLAGS = ["-O2", "-g", "-fPIC", "-std=gnu11", "-Wall", "-Wextra",
          "-Werror", "-Wno-unused-parameter"]
HEADER = "/usr/include/ucp/api/ucp.h"


def available() -> bool:
    return os.path.exists(HEADER) and os.environ.get("UCXPY_NO_UCP") != "1"


BRIDGE = Extension("ucxpy._ucp_bridge", [os.path.join("native", "ucp", "bridge.c")],
                   include_dirs=[os.path.join("native", "ucp")],
                   # (its view of the data plane's API: rebuilt when that changes)
                   depends=[os.path.join("native", "ucp", n) for n in ("bridge.h", "shim.h")]
                   + [os.path.join("native", "dp", n) for n in ("dp.h", "match.h")],
                   extra_compile_args=["-O2", "-std=gnu11", "-Wall", "-Wextra", "-Werror",
                                       "-Wno-unused-parameter"])


def libpython() -> str:
    """The libpython to open in a process without Python."""
    name = sysconfig.get_config_var("INSTSONAME") or "libpython3.so"
    for folder in (sysconfig.get_config_var("LIBDIR"), "/usr/lib/x86_64-linux-gnu"):
        if folder and os.path.exists(os.path.join(folder, name)):
            return os.path.join(folder, name)
    return name


def build(out_dir: str, cc: str = "cc") -> list:
    """Compile the four libraries into ``out_dir``; returns their paths."""
    os.makedirs(out_dir, exist_ok=True)
    sites = ":".join(p for p in site.getsitepackages() if os.path.isdir(p))
    defines = [f'-DUCXS_LIBPYTHON="{libpython()}"', f'-DUCXS_SITE="{sites}"',
               f'-DUCXS_PYHOME="{sys.base_prefix}"']
    lib = lambda name: os.path.join(out_dir, name)  # noqa: E731
    jobs = [
        ("libucp.so.0", UCP_SOURCES, ["-Wl,--version-script=" + os.path.join(SRC, "libucp.map"),
                                     "-ldl", "-lpthread"]),
        ("libucs.so.0", ["ucs.c"], []),
        ("libuct.so.0", ["stub.c"], []),
        ("libucm.so.0", ["ucm.c"], []),
    ]
    built = []
    for name, sources, extra in jobs:
        # into a new file, then renamed: processes that map the old one keep it
        tmp = lib(name) + ".new"
        cmd = [cc, *CFLAGS, *defines, "-I", SRC, "-shared", "-Wl,-soname," + name,
               "-o", tmp, *(os.path.join(SRC, s) for s in sources), *extra]
        subprocess.run(cmd, check=True)
        os.replace(tmp, lib(name))
        built.append(lib(name))
    for name in ("libucp.so", "libucs.so"):        # for linking C tests with -lucp
        link = lib(name)
        if os.path.lexists(link):
            os.unlink(link)
        os.symlink(name + ".0", link)
    return built


if __name__ == "__main__":
    for path in build(os.path.join(os.path.dirname(HERE), "ucxpy", "lib")):
        print(path)
