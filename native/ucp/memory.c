/*
 * memory.c — memory handles and remote keys.
 *
 * Entry points: ucp_mem_map, ucp_mem_unmap, ucp_mem_query, ucp_mem_advise,
 * ucp_rkey_pack, ucp_rkey_buffer_release, ucp_ep_rkey_unpack, ucp_rkey_ptr,
 * ucp_rkey_destroy.
 *
 * Theory of operation.  A handle is the core's MemHandle, registered with the
 * context's first worker (the core registers per worker, UCP per context):
 * the caller's memory, or with UCP_MEM_MAP_ALLOCATE and no address, memory
 * the core allocates where its same-host peers can map it (the shm memory
 * domain), so their puts and gets are plain copies; with UCP_MEM_MAP_FIXED
 * too, that allocation is mapped again at exactly the caller's address (a
 * free range: the core refuses one in use), the region's address for peers
 * (OpenSHMEM's symmetric heap, Open MPI's sshmem/ucx).  A packed key is the
 * core's packed remote key, in a malloc'd copy.  A region of length 0 (MPICH
 * maps one for a window of size 0) has no core handle; its key, of length 0,
 * reaches nothing: an access of more than 0 bytes through it is an error.
 * ucp_rkey_ptr maps a same-host peer's region into this process once per key
 * (RemoteKey.map: the shm memory domain's mapping of memory the core
 * allocated), kept until ucp_rkey_destroy; a region no memory domain here can
 * map (another host, memory the peer registered rather than allocated) gives
 * UCS_ERR_UNREACHABLE, and callers then use put and get.
 */
#include <stdlib.h>
#include <string.h>

#include "shim.h"

ucs_status_t ucp_mem_map(ucp_context_h context, const ucp_mem_map_params_t *params,
                         ucp_mem_h *memh_p)
{
    uint64_t m = params->field_mask;
    void *address = (m & UCP_MEM_MAP_PARAM_FIELD_ADDRESS) ? params->address : NULL;
    unsigned flags = (m & UCP_MEM_MAP_PARAM_FIELD_FLAGS) ? params->flags : 0;
    ucs_status_t status;
    ucp_mem_h mh;

    if (!(m & UCP_MEM_MAP_PARAM_FIELD_LENGTH)) {
        ucxs_error("ucp_mem_map", "no length (UCP_MEM_MAP_PARAM_FIELD_LENGTH)");
        return UCS_ERR_INVALID_PARAM;
    }
    if (params->length == 0) {             /* an empty region (MPICH: a window of size 0) */
        mh = calloc(1, sizeof(*mh));
        if (mh == NULL)
            return UCS_ERR_NO_MEMORY;
        mh->context = context;
        mh->address = address;
        *memh_p = mh;
        return UCS_OK;
    }
    if (address == NULL && !(flags & UCP_MEM_MAP_ALLOCATE)) {
        ucxs_error("ucp_mem_map", "no address and no UCP_MEM_MAP_ALLOCATE");
        return UCS_ERR_INVALID_PARAM;
    }
    if ((flags & UCP_MEM_MAP_FIXED) && (!(flags & UCP_MEM_MAP_ALLOCATE) || address == NULL)) {
        ucxs_error("ucp_mem_map", "UCP_MEM_MAP_FIXED places memory it allocates "
                   "(UCP_MEM_MAP_ALLOCATE) at an address");
        return UCS_ERR_INVALID_PARAM;
    }
    mh = calloc(1, sizeof(*mh));
    if (mh == NULL)
        return UCS_ERR_NO_MEMORY;
    mh->context = context;
    mh->length = params->length;
    /* with ALLOCATE an address is only a hint (UCP), unless FIXED: the core's
     * allocation is then mapped again at exactly that address */
    status = ucxs_py->mem_map(context->py, (flags & UCP_MEM_MAP_ALLOCATE) ? NULL : address,
                              params->length, (flags & UCP_MEM_MAP_FIXED) ? address : NULL,
                              &mh->py, &mh->address);
    if (status != UCS_OK) {
        free(mh);
        return status;
    }
    *memh_p = mh;
    return UCS_OK;
}

ucs_status_t ucp_mem_unmap(ucp_context_h context, ucp_mem_h memh)
{
    ucs_status_t status = UCS_OK;
    if (memh->py != NULL) {
        status = ucxs_py->mem_unmap(context->py, memh->py);
        ucxs_py->release(memh->py);
    }
    free(memh);
    return status;
}

ucs_status_t ucp_mem_query(const ucp_mem_h memh, ucp_mem_attr_t *attr)
{
    if (attr->field_mask & UCP_MEM_ATTR_FIELD_ADDRESS)
        attr->address = memh->address;
    if (attr->field_mask & UCP_MEM_ATTR_FIELD_LENGTH)
        attr->length = memh->length;
    if (attr->field_mask & UCP_MEM_ATTR_FIELD_MEM_TYPE)
        attr->mem_type = UCS_MEMORY_TYPE_HOST;
    return UCS_OK;
}

ucs_status_t ucp_mem_advise(ucp_context_h context, ucp_mem_h memh, ucp_mem_advise_params_t *params)
{
    (void)context;
    (void)memh;
    (void)params;
    return UCS_OK;                         /* advice: nothing to prefetch here */
}

ucs_status_t ucp_rkey_pack(ucp_context_h context, ucp_mem_h memh, void **rkey_buffer_p,
                           size_t *size_p)
{
    (void)context;
    if (memh->py == NULL) {                /* an empty region: a key of length 0 */
        *rkey_buffer_p = calloc(1, sizeof(uint32_t));
        *size_p = sizeof(uint32_t);
        return *rkey_buffer_p != NULL ? UCS_OK : UCS_ERR_NO_MEMORY;
    }
    return ucxs_py->rkey_pack(memh->py, rkey_buffer_p, size_p);
}

void ucp_rkey_buffer_release(void *rkey_buffer)
{
    free(rkey_buffer);
}

ucs_status_t ucp_ep_rkey_unpack(ucp_ep_h ep, const void *rkey_buffer, ucp_rkey_h *rkey_p)
{
    ucs_status_t status;
    ucp_rkey_h rkey = calloc(1, sizeof(*rkey));
    if (rkey == NULL)
        return UCS_ERR_NO_MEMORY;
    /* a packed key starts with its own length (rkey_pack, bridge.c) */
    uint32_t n;
    memcpy(&n, rkey_buffer, sizeof(n));
    if (n == 0) {                          /* an empty region's: reaches nothing */
        *rkey_p = rkey;
        return UCS_OK;
    }
    status = ucxs_py->rkey_unpack(ep->py, (const char *)rkey_buffer + sizeof(n), n, &rkey->py,
                                  &rkey->dp);
    if (status != UCS_OK) {
        free(rkey);
        return status;
    }
    *rkey_p = rkey;
    return UCS_OK;
}

static pthread_mutex_t rkey_map_lock = PTHREAD_MUTEX_INITIALIZER;

ucs_status_t ucp_rkey_ptr(ucp_rkey_h rkey, uint64_t raddr, void **addr_p)
{
    if (rkey->py == NULL)
        return UCS_ERR_UNREACHABLE;        /* an empty region */
    if (__atomic_load_n(&rkey->map, __ATOMIC_ACQUIRE) == NULL) {
        /* mapped once, whichever thread asks first (UCS_THREAD_MODE_MULTI) */
        ucs_status_t status = UCS_OK;
        pthread_mutex_lock(&rkey_map_lock);
        if (rkey->map == NULL) {
            void *map, *address;
            status = ucxs_py->rkey_map(rkey->py, &map, &address, &rkey->base, &rkey->length);
            if (status == UCS_OK) {
                rkey->mapped = address;
                __atomic_store_n(&rkey->map, map, __ATOMIC_RELEASE);
            }
        }
        pthread_mutex_unlock(&rkey_map_lock);
        if (status != UCS_OK)
            return status;
    }
    if (raddr < rkey->base || raddr - rkey->base >= rkey->length) {
        ucxs_error("ucp_rkey_ptr", "address %#llx is outside the key's region [%#llx+%zu]",
                   (unsigned long long)raddr, (unsigned long long)rkey->base, rkey->length);
        return UCS_ERR_INVALID_PARAM;
    }
    *addr_p = rkey->mapped + (raddr - rkey->base);
    return UCS_OK;
}

void ucp_rkey_destroy(ucp_rkey_h rkey)
{
    if (rkey->map != NULL)
        ucxs_py->release(rkey->map);
    if (rkey->py != NULL)
        ucxs_py->release(rkey->py);
    free(rkey);
}
