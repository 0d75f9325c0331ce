/*
 * rndv.c — the shm rendezvous, per message in C: the offer, its read by
 * CMA, and the answer.
 *
 * Theory of operation.  A tagged send of at least the endpoint's rendezvous
 * threshold is offered, not copied: the sender registers the send (Python's
 * RendezvousProtocol keeps it under its id, with the buffer, until the
 * answer) and pushes a TAG_RTS frame into the peer's inbox through the
 * connection's lane (lane.c): wire.RTS (tag, send id, size, address), then
 * the shm key of the buffer, shm_md.RKEY ("SHMK", our pid, base, length).
 * The receiver matches the offer like any message (tag.c); the receive that
 * takes it reads the bytes whole from the sender's memory with one
 * process_vm_readv (when the key names the peer of its lane, covers them,
 * and CMA to that peer works), then pushes the answer, an RNDV_ATS frame
 * (wire.ATS: send id, status OK), on its own lane back to the sender, whose
 * ATS handler completes the send.
 *
 *     sender                         receiver
 *     ucxdp_lane_rts ── TAG_RTS ──>  match ── ucxdp_lane_get (CMA read)
 *     send completes <── RNDV_ATS ── ucxdp_lane_ats
 *
 * Everything else is the caller's path, which these functions decline to
 * (UCXDP_ERR_NO_RESOURCE, nothing done): a lane that is not open (Python has
 * frames queued before), a full ring, a key of another kind or process, CMA
 * that does not work here, a short read (Python's path reads again and
 * reports the error), an offer the receiver splits.  The transport fills in
 * the lane's pids and whether CMA works; it never sees a tag.
 */
#include <string.h>

#include "dp.h"
#include "ucxpy_native.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "wire.RTS, wire.ATS and shm_md.RKEY are little-endian: they are written as is"
#endif

#define RTS_SIZE 32                        /* wire.RTS: tag, sreq id, size, address */
#define SHM_KEY_SIZE 24                    /* shm_md.RKEY: magic, pid, base, length */
#define ATS_SIZE 9                         /* wire.ATS: sreq id, status */

static const char shm_key_magic[4] = {'S', 'H', 'M', 'K'};

ucxdp_status_t ucxdp_lane_rts(ucxdp_worker_t *w, const ucxdp_lane_t *lane, uint64_t tag,
                              uint64_t sreq_id, const void *buffer, uint64_t length, int *wake)
{
    uint8_t hdr[RTS_SIZE + SHM_KEY_SIZE];
    uint64_t addr = (uint64_t)(uintptr_t)buffer;
    uint64_t rts[4] = {tag, sreq_id, length, addr};
    int rc;

    *wake = 0;
    if (!lane->open || lane->dead || lane->rts_am_id == 0 || lane->pid == 0)
        return UCXDP_ERR_NO_RESOURCE;
    memcpy(hdr, rts, RTS_SIZE);
    memcpy(hdr + RTS_SIZE, shm_key_magic, 4);
    memcpy(hdr + RTS_SIZE + 4, &lane->pid, 4);
    memcpy(hdr + RTS_SIZE + 8, &addr, 8);
    memcpy(hdr + RTS_SIZE + 16, &length, 8);
    rc = ucxpy_ring_push(lane->ring, lane->rts_am_id, hdr, sizeof hdr, NULL, 0);
    if (rc < 0)
        return UCXDP_ERR_NO_RESOURCE;
    *wake = rc == 1;
    UCXDP_COUNT(w, rndv_offer, 1);
    return UCXDP_OK;
}

ucxdp_status_t ucxdp_lane_get(ucxdp_worker_t *w, const ucxdp_lane_t *lane, const void *key,
                              size_t key_length, uint64_t remote_addr, void *buffer,
                              uint64_t length)
{
    const uint8_t *k = key;
    uint32_t pid;
    uint64_t base, extent;

    if (key_length != SHM_KEY_SIZE || memcmp(k, shm_key_magic, 4) != 0 || !lane->cma
            || lane->dead)
        return UCXDP_ERR_NO_RESOURCE;
    memcpy(&pid, k + 4, 4);
    memcpy(&base, k + 8, 8);
    memcpy(&extent, k + 16, 8);
    if (pid == 0 || pid != lane->peer_pid || remote_addr < base
            || remote_addr + length < remote_addr || remote_addr + length > base + extent)
        return UCXDP_ERR_NO_RESOURCE;
    if (length != 0 && ucxpy_cma_read((int)pid, buffer, remote_addr, (size_t)length)
                       != (int64_t)length)
        return UCXDP_ERR_NO_RESOURCE;
    UCXDP_COUNT(w, rndv_get, 1);
    UCXDP_COUNT(w, rndv_get_bytes, length);
    return UCXDP_OK;
}

ucxdp_status_t ucxdp_lane_ats(ucxdp_worker_t *w, const ucxdp_lane_t *lane, uint64_t sreq_id,
                              uint8_t status, int *wake)
{
    uint8_t hdr[ATS_SIZE];
    int rc;

    *wake = 0;
    if (!lane->open || lane->dead || lane->ats_am_id == 0)
        return UCXDP_ERR_NO_RESOURCE;
    memcpy(hdr, &sreq_id, 8);
    hdr[8] = status;
    rc = ucxpy_ring_push(lane->ring, lane->ats_am_id, hdr, sizeof hdr, NULL, 0);
    if (rc < 0)
        return UCXDP_ERR_NO_RESOURCE;
    *wake = rc == 1;
    UCXDP_COUNT(w, rndv_ats, 1);
    return UCXDP_OK;
}
