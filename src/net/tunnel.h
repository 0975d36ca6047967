/*
 * tunnel: after an Upgrade (101 Switching Protocols), bytes flow both ways unchanged between
 * the client and the upstream connection, with backpressure on each direction. No retries,
 * no parsing. When either side ends, what it sent is flushed to the other, then both close.
 * No byte in either direction for the idle timeout (the listener's idle_timeout) closes both:
 * an idle or half-dead peer does not hold two descriptors and a connection place forever.
 */
#ifndef RG_TUNNEL_H
#define RG_TUNNEL_H

#include <stdint.h>

struct stream;
struct loop;
struct tunnel;

/* CLIENT stays owned by the caller (freed by it after ON_CLOSE); UPSTREAM is taken. IDLE_US:
 * the idle timeout (> 0). */
struct tunnel *tunnel_new(struct loop *loop, struct stream *client, struct stream *upstream,
                          int64_t idle_us, void (*on_close)(void *arg), void *arg);
/* Free the tunnel and the upstream connection (deferred). Safe inside on_close. */
void tunnel_free(struct tunnel *t);

#endif
