/*
 * pool: per worker, per endpoint address: idle keep-alive upstream connections. The address
 * itself is the endpoint state's (names are resolved once per process: resolve.c).
 *
 * A connection goes back to the pool only after a complete response on a keep-alive
 * connection. While idle it is watched: any byte or EOF from the peer closes it (SPEC §8), and
 * it is closed after POOL_IDLE_US. pool_get() skips connections idle for longer than
 * POOL_REUSE_MAX_US: servers commonly close keep-alive connections after 5 s, and a request
 * written into a connection the server is closing is a `reset` (not provably unsent).
 *
 * An endpoint's pool is keyed by its slot (upstream id, endpoint index) and identified by the
 * endpoint state's serial: the registry forgets endpoints no live runtime names and reuses
 * their slots, possibly from another thread, so the pool never dereferences an ep_state it was
 * not handed by a caller that holds a runtime. A pool whose endpoint was forgotten is found
 * lazily by the worker itself (its slot asked for by a new serial, or a sweep once the
 * registry's forget epoch moved): its idle connections are closed and it is freed.
 */
#ifndef RG_POOL_H
#define RG_POOL_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/queue.h>
#include <sys/socket.h>

struct loop;
struct ep_state;
struct stream;
struct http_msg;

#define POOL_IDLE_US        (30 * 1000000LL)
#define POOL_REUSE_MAX_US   (4 * 1000000LL)
#define POOL_MAX_IDLE       256
#define POOL_PEEK_AFTER_US  (20 * 1000LL)

struct pool_ep;

#define UPCONN_MAGIC 0x0bc0e11au

struct upconn {
	uint32_t magic;
	bool closed;                    /* upconn_close ran (it is idempotent) */
	struct loop *loop;
	struct ep_state *ep;            /* valid only while an attempt holds the connection */
	struct pool_ep *pe;             /* while idle: the pool it is parked in */
	struct stream *strm;
	struct http_msg *parser;
	int64_t idle_since_us;
	struct event *idle_ev;
	TAILQ_ENTRY(upconn) link;
	bool idle;
	int uses;
};

struct pool_ep {
	TAILQ_HEAD(, upconn) idle;
	int nidle;
	struct sockaddr_storage addr;   /* the endpoint's, copied when the pool is made: what
	                                 * the transports connect to */
	int addrlen;
	char *name;                     /* the endpoint's label */
	uint64_t serial;                /* of the ep_state it caches */
	int up_id, index;               /* its slot */
	struct loop *loop;
};

/* The pool of EP (alive: the caller holds a runtime binding it), made on first use. */
struct pool_ep *pool_ep_get(struct loop *l, struct ep_state *ep);

/* An idle connection that still looks alive, or NULL. */
struct upconn *pool_get(struct pool_ep *pe);
/* Park C as idle (after a complete keep-alive response). */
void pool_put(struct upconn *c);
/* Close and free C (deferred). Idempotent. */
void upconn_close(struct upconn *c);

/* Drain: close every idle connection and park no more (called down by the worker). */
void pool_drain(struct loop *l);
void pool_free_all(struct loop *l);

#endif
