/*
 * unimplemented.c — every other entry point of UCP's API: a clear abort.
 *
 * A caller reaching one of these gets "ucxpy libucp: <name> is not
 * implemented" on stderr and an abort, never a wrong result or a
 * dynamic-linker error in the middle of a job.  This is the one table of
 * what is not implemented: the names of ucp.h (API 1.13) and of the later
 * APIs callers use that no other file of native/ucp defines.  Moving a name
 * out of this list is how an entry point gets implemented.
 *
 * The one file of the library that does not include <ucp/api/ucp.h>: these
 * definitions take no arguments (they never return), which would clash with
 * the real prototypes.  UCX 1.20's `ucp_device_*` (the GPU device API: memory
 * lists a CUDA kernel posts transfers on) are here too: NIXL's UCX plugin
 * needs them to load, and calls them only to prepare GPU-initiated
 * transfers, which a CPU run never asks for.  The build's exported-symbol check
 * (tests/test_ucp_capi.py) keeps this list and the header in step.
 */
#include <stdio.h>
#include <stdlib.h>

#define UCXS_UNIMPLEMENTED(X) \
    X(ucp_config_print) \
    X(ucp_conn_request_query) \
    X(ucp_ep_modify_nb) \
    X(ucp_ep_print_info) \
    X(ucp_ep_query) \
    X(ucp_listener_create) \
    X(ucp_listener_destroy) \
    X(ucp_listener_query) \
    X(ucp_listener_reject) \
    X(ucp_mem_print_info) \
    X(ucp_request_alloc) \
    X(ucp_request_query) \
    X(ucp_stream_data_release) \
    X(ucp_stream_recv_data_nb) \
    X(ucp_stream_recv_nb) \
    X(ucp_stream_recv_nbx) \
    X(ucp_stream_recv_request_test) \
    X(ucp_stream_send_nb) \
    X(ucp_stream_send_nbx) \
    X(ucp_stream_worker_poll) \
    X(ucp_tag_recv_nbr) \
    X(ucp_tag_send_nbr) \
    X(ucp_worker_address_query) \
    X(ucp_worker_flush) \
    X(ucp_worker_print_info) \
    X(ucp_worker_wait) \
    X(ucp_worker_wait_mem) \
    X(ucp_memh_pack) \
    X(ucp_memh_buffer_release) \
    X(ucp_rkey_compare) \
    X(ucp_device_local_mem_list_create) \
    X(ucp_device_remote_mem_list_create) \
    X(ucp_device_mem_list_release) \

_Noreturn static void unimplemented(const char *name)
{
    fprintf(stderr, "ucxpy libucp: %s is not implemented (aborting); see docs/guide/c-programs.md\n", name);
    abort();
}

/* The same list as text in the library's file, for `ucxpy-info --abi-check`
 * (ucxpy/tools/ucx.py reads it from the file, without loading it): the
 * names a caller finds exported that abort. */
#define NAME(name) #name "\n"
__attribute__((used)) static const char unimplemented_names[] =
    "ucxpy-unimplemented-entry-points:\n" UCXS_UNIMPLEMENTED(NAME);

#define STUB(name)                                                                       \
    void name(void);                                                                     \
    void name(void)                                                                      \
    {                                                                                    \
        unimplemented(#name);                                                            \
    }
UCXS_UNIMPLEMENTED(STUB)
