/*
 * pool: per worker, per endpoint address: idle keep-alive upstream connections. The address
 * itself is the endpoint state's (names are resolved once per process: resolve.c).
 *
 * The pool knows a connection only as its struct pool_conn, embedded in the transport's own
 * object (h1_conn.c), which gives the pool its close function: the pool never parses a byte.
 * A connection goes back to the pool only after a complete response on a keep-alive
 * connection. While idle it is watched: any byte or EOF from the peer closes it (SPEC §8), and
 * it is closed after POOL_IDLE_US, by a sweep every POOL_SWEEP_US (so at the latest after
 * POOL_CLOSE_MAX_US; no timer per connection). pool_get() skips connections idle for longer than
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
struct pool_conn;

#define POOL_IDLE_US        (30 * 1000000LL)
#define POOL_SWEEP_US       (1000000LL)
#define POOL_CLOSE_MAX_US   (POOL_IDLE_US + POOL_SWEEP_US)
#define POOL_REUSE_MAX_US   (4 * 1000000LL)
#define POOL_MAX_IDLE       256
#define POOL_PEEK_AFTER_US  (20 * 1000LL)

struct pool_ep;

#define POOL_CONN_MAGIC 0x0bc0e11au

struct pool_conn {
	uint32_t magic;
	struct loop *loop;
	struct ep_state *ep;            /* valid only while a request holds the connection */
	struct stream *strm;
	/* The owner's close (idempotent): frees the stream and the object it is embedded in,
	 * deferred (DESIGN rule 1). The pool calls it once it unlinked the connection. */
	void (*close)(struct pool_conn *pc);
	/* the pool's */
	struct pool_ep *pe;             /* while idle: the pool it is parked in */
	int64_t idle_since_us;
	TAILQ_ENTRY(pool_conn) link;
	bool idle;
	int uses;
};

struct pool_ep {
	TAILQ_HEAD(pool_idle, pool_conn) idle;  /* most recently parked first */
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

/* An idle connection that still looks alive (its callbacks cleared, reads off), or NULL. */
struct pool_conn *pool_get(struct pool_ep *pe);
/* Park PC as idle (after a complete keep-alive response), or close it if it may not be. */
void pool_put(struct pool_conn *pc);

/* A TLS handshake with EP (alive: the caller holds a request to it) failed for F (net/tls.h,
 * not TLSF_NONE) on worker L: counted for EP's upstream (SPEC §7), and logged once a minute per
 * endpoint address, with DETAIL. */
void pool_tls_failed(struct loop *l, struct ep_state *ep, int f, const char *detail);

/* Drain: close every idle connection and park no more (called down by the worker). */
void pool_drain(struct loop *l);
void pool_free_all(struct loop *l);

#endif
