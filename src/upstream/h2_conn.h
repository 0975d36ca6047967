/*
 * h2_conn: the HTTP/2 transport under the attempt (transport.h; SPEC §9 upstream side). Per
 * worker loop and endpoint, multiplexed connections (prior knowledge, or TLS with ALPN h2): a
 * stream goes on the first one with room under the server's SETTINGS_MAX_CONCURRENT_STREAMS,
 * another is opened when all are full; after a GOAWAY a connection takes no new stream.
 *
 * A stream's HEADERS count as sent only once the frame was serialized and a byte of it left
 * our output buffer: a stream closed before that (queued behind the server's limit, refused,
 * above a GOAWAY's last-stream-id) was not processed and ends as OUT_CONNECT_FAILURE.
 * Every stream ends exactly once through on_close, unless its owner cancelled it first.
 * A cancelled stream that was sent is reset with CANCEL.
 */
#ifndef RG_H2_CONN_H
#define RG_H2_CONN_H

#include "upstream/transport.h"

struct loop;

/* The stream transport: open puts the request on the first connection to the endpoint with
 * room, or on a new one (it never calls back before returning). Response DATA is appended to
 * body_out; the windows open only by what the owner consumes. */
extern const struct transport_ops h2_transport;

/* Worker exit, called down: GOAWAY on every connection and take no new stream; then free. */
void h2_drain(struct loop *l);
void h2_free_all(struct loop *l);

#endif
