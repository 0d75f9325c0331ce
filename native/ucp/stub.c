/*
 * stub.c — libuct.so.0 and libucm.so.0.
 *
 * Callers built against UCX (MPICH's libmpi) name these libraries as NEEDED
 * but take no symbol from them: ucxpy's transports are its own (UCT's place)
 * and it intercepts no memory events (UCM's).  They exist so the loader
 * takes the whole set from ucxpy's directory, never a mix with another UCX.
 */
int ucxs_stub_library;
