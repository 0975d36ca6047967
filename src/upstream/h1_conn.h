/*
 * h1_conn: the HTTP/1.1 transport under the attempt (transport.h). One request at a time on a
 * connection of its own: an idle one from the pool (pool.c) or a fresh one, the request head
 * and body written (the streamed body chunked when asked), the response parsed (h1_parser),
 * and the connection parked again after a complete keep-alive response.
 *
 * A pooled connection found closed before a byte of ours left is replaced with a fresh one,
 * silently (SPEC §4: not provably processed, not an outcome). A fresh connection keeps its own
 * connect timer (connect_timeout_us), as an HTTP/2 connection does.
 */
#ifndef RG_H1_CONN_H
#define RG_H1_CONN_H

#include "upstream/transport.h"

extern const struct transport_ops h1_transport;

#endif
