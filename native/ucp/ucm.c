/*
 * ucm.c — libucm.so.0: UCX's memory-event hooks, as ucxpy needs them.
 *
 * Entry points: ucm_set_external_event, ucm_test_events,
 * ucm_test_external_events, ucm_vm_munmap.
 *
 * Theory of operation.  UCX's memory-event module exists for its
 * registration cache: a region UCX registered with a NIC must be dropped from
 * the cache when the application unmaps it, so UCM hooks munmap/brk (or, with
 * ucm_set_external_event, lets a caller such as Open MPI report unmaps through
 * ucm_vm_munmap).  ucxpy keeps no registration cache: ucp_mem_map registers
 * a region with the core for exactly as long as the caller keeps it mapped,
 * and nothing is looked up by address later.  So there is no event to
 * deliver: reports of unmapped memory are accepted and need no action, and
 * the tests of event delivery answer UCS_OK (the events ucxpy would need are
 * none, and those are all delivered).
 */
#include <stddef.h>
#include <ucm/api/ucm.h>

void ucm_set_external_event(int events)
{
    (void)events;                  /* nothing to hear of: no registration cache */
}

ucs_status_t ucm_test_events(int events)
{
    (void)events;
    return UCS_OK;
}

ucs_status_t ucm_test_external_events(int events)
{
    (void)events;
    return UCS_OK;
}

void ucm_vm_munmap(void *addr, size_t length)
{
    (void)addr;
    (void)length;
}
