"""cffi (out-of-line, API mode) builder of ``ucxpy._proto_pipelined``: the C
half of the shipped protocol plug-in "pipelined-copy"
(native/proto/pipelined_copy.c; its Python half is ucxpy.protocols.PipelinedCopy).

A plug-in of one's own builds the same way: a C file that includes
native/dp/proto.h and returns the address of its ``ucxdp_proto_ops_t`` from
one function, compiled with cffi like this; its Python half (a
``ucxpy.protocols.Protocol`` subclass) names it in ``native``.  Used by
setup.py; ``python native/build_proto.py`` builds it in place.
"""
import os

from cffi import FFI

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def make_builder() -> FFI:
    rel = os.path.abspath(os.getcwd()) == ROOT      # (setuptools wants relative paths)
    base = "native" if rel else HERE
    builder = FFI()
    builder.cdef("uintptr_t ucxpy_pipelined_copy_ops(void);")
    builder.set_source(
        "ucxpy._proto_pipelined",
        '#include "proto.h"\nuintptr_t ucxpy_pipelined_copy_ops(void);',
        sources=[os.path.join(base, "proto", "pipelined_copy.c")],
        include_dirs=[os.path.join(base, "dp"), base],
        extra_compile_args=["-O2", "-std=gnu11", "-Wall", "-Wextra", "-Werror",
                            "-Wno-unused-parameter"],
    )
    return builder


ffibuilder = make_builder()

if __name__ == "__main__":
    os.chdir(ROOT)
    make_builder().compile(tmpdir=".", verbose=True)
