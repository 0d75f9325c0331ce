/*
 * stub.c — libuct.so.0.
 *
 * Callers built against UCX (MPICH's libmpi, Open MPI's UCX components) name
 * this library as NEEDED but take no symbol from it: ucxpy's transports are
 * its own (UCT's place).  It exists so the loader takes the whole set from
 * ucxpy's directory, never a mix with another UCX.  (libucm.so.0 is ucm.c.)
 */
int ucxs_stub_library;
