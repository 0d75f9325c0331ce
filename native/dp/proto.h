/*
 * proto.h — a protocol plug-in's C half: the interface between the data
 * plane and a plug-in compiled on its own (with cffi, or any C compiler).
 *
 * Theory of operation.  A protocol plug-in (ucxpy/protocols.py,
 * UCXPY_PROTO_PLUGIN=name:sizes) is written in Python, and that half is its
 * reference: it runs every message Python sends or receives, and everything
 * the C half leaves.  A plug-in may also have a C half, which the data plane
 * (proto.c) calls for the messages of its sizes that C callers (libucp) send
 * and receive, so that those run without the interpreter, per message, as
 * the stock protocols do.  The two halves speak the same frames (the core's
 * AmId.PLUGIN: the plug-in's one-byte kind, then its own header; a payload)
 * and share the work by ids:
 *
 *  - a C caller's send of the plug-in's sizes on a shm lane is the C half's
 *    (`send`); its id has UCXDP_RNDV_EXT_ID set, and it waits in the
 *    worker's list of sends until the C half ends it (`send_done`) or its
 *    peer fails (the data plane fails it);
 *  - every plug-in frame that arrives in the shm inbox from a registered
 *    connection is offered to the C half first (`frame`): it takes those
 *    of its own sends and receives (by the ids it gave), and an offer whose
 *    earliest matching receive is a C caller's with room (`match`); it
 *    returns 0 for anything else, which stays in the inbox, in order, for the
 *    Python half (a receive of Python's, an unexpected offer, truncation);
 *  - ids the Python half gives never have UCXDP_RNDV_EXT_ID, so each side
 *    knows its own, and a message can start on one side and end on the
 *    other (a C send whose offer a Python receive takes).
 *
 * Everything is called with the worker's lock held: the C half keeps no lock
 * of its own and never calls back into the data plane other than through
 * `ucxdp_proto_api_t`.  It pushes frames with `push`, which declines (NO_RESOURCE,
 * nothing sent) when the lane is not open or its ring is full: the C half
 * keeps what it owes and pushes it from `progress`, which the data plane
 * calls on every inbox pass while `progress` last said work was left.
 */
#ifndef UCXDP_PROTO_H
#define UCXDP_PROTO_H

#include "dp.h"

#define UCXDP_PROTO_ABI 1

typedef struct ucxdp_proto_ctx ucxdp_proto_ctx_t;  /* the data plane's: the worker, its inbox */

/* What the data plane gives a C half. */
typedef struct ucxdp_proto_api {
    int abi;
    /* Push one frame of the plug-in (`kind`, its header, a payload) to the
     * peer behind inbox connection `conn` (by our lane back to it), or on
     * `lane` when not NULL (a send's first frame).  OK, or NO_RESOURCE with
     * nothing sent (the lane is not open or gone, the ring full or busy, the
     * frame too large: see max_payload). */
    ucxdp_status_t (*push)(ucxdp_proto_ctx_t *ctx, const ucxdp_lane_t *lane, uint64_t conn,
                           uint8_t kind, const void *header, size_t header_length,
                           const void *payload, size_t length);
    /* the largest payload a frame pushed to `conn`'s peer (or on `lane`)
     * carries; 0 when there is no lane */
    uint64_t (*max_payload)(ucxdp_proto_ctx_t *ctx, const ucxdp_lane_t *lane, uint64_t conn);
    /* the C half's send `id`, still waiting, or NULL (failed meanwhile) */
    ucxdp_rndv_send_t *(*find_send)(ucxdp_proto_ctx_t *ctx, uint64_t id);
    /* end send `s` with OK or an error: its caller completes it */
    void (*send_done)(ucxdp_proto_ctx_t *ctx, ucxdp_rndv_send_t *s, ucxdp_status_t status);
    /* the earliest posted receive matching a message of `length` bytes with
     * `tag` from `source`, when it is a C caller's with room for it: taken
     * out of the matcher and the C half's until recv_done; else NULL (the
     * offer is the Python half's) */
    ucxdp_tag_recv_t *(*match)(ucxdp_proto_ctx_t *ctx, int64_t source, uint64_t tag,
                               uint64_t length);
    /* end receive `r` (OK: its data is in r->buffer; or CONNECTION_RESET)
     * with the message's source, tag and length */
    void (*recv_done)(ucxdp_proto_ctx_t *ctx, ucxdp_tag_recv_t *r, ucxdp_status_t status,
                      int64_t source, uint64_t tag, uint64_t length);
} ucxdp_proto_api_t;

/* What a C half gives the data plane: a table of functions, found by the
 * Python half (Protocol.native names a cffi module's function returning its
 * address).  Each takes the instance `create` made. */
typedef struct ucxdp_proto_ops {
    int abi;                               /* UCXDP_PROTO_ABI */
    const char *name;                      /* the plug-in's UCXPY_PROTO_PLUGIN name */
    /* an instance for one worker (`param`: the Python half's, e.g. a
     * fragment size), or NULL (no memory) */
    void *(*create)(const ucxdp_proto_api_t *api, uint64_t param);
    void (*destroy)(void *self);
    /* Send `s` (buffer, length, peer set; its id given) with `tag` on
     * `lane`: OK (it now waits for send_done), or NO_RESOURCE with nothing
     * sent (the caller's Python path sends it). */
    ucxdp_status_t (*send)(void *self, ucxdp_proto_ctx_t *ctx, const ucxdp_lane_t *lane,
                           ucxdp_rndv_send_t *s, uint64_t tag);
    /* A plug-in frame of connection `c` (its source; our lane back to it):
     * 1 taken (consumed), 0 left for the Python half. */
    int (*frame)(void *self, ucxdp_proto_ctx_t *ctx, const ucxdp_conn_t *c, uint8_t kind,
                 const uint8_t *header, size_t header_length, const uint8_t *payload,
                 size_t length);
    /* Push what is owed; 1 while anything is still owed. */
    int (*progress)(void *self, ucxdp_proto_ctx_t *ctx);
    /* `peer` failed: forget what waits for it (the data plane fails its sends
     * right after; receives are the C half's to end, with recv_done). */
    void (*fail_peer)(void *self, ucxdp_proto_ctx_t *ctx, int64_t peer);
} ucxdp_proto_ops_t;

#endif
