/*
 * redis_link: one connection to one Redis server, kept up on an event loop, for any number of
 * commands from one owner (the idempotency store, the reconciliation publisher, ...).
 *
 * The link resolves the host (evdns, addresses in turn across reconnects), connects with a
 * timeout, sends AUTH, SELECT, SCRIPT LOAD of the owner's scripts and a PING on every
 * connection, and is "up" once the PING has answered. Any failure sends it down: one warning
 * when an outage starts, one line when it ends, debug lines in between; reconnects follow an
 * exponential backoff with jitter. News goes to the owner through struct redis_link_ops.
 *
 * Every command's callback runs exactly once: with the reply, or with NULL when the link was
 * down at the call (from the loop, soon, never inside redis_link_command), when the connection
 * is lost or dropped before the reply, or when the link is freed.
 */
#ifndef RG_REDIS_LINK_H
#define RG_REDIS_LINK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct event_base;
struct evdns_base;
struct redisReply;
struct redis_link;

struct redis_link_cfg {
	const char *host;           /* an IP literal, or a name (then a DNS base is needed) */
	int port, db;               /* db 0: no SELECT */
	const char *user;           /* NULL: AUTH with the password alone */
	const char *password;       /* NULL: no AUTH */
	/* Lua scripts (static storage: kept by pointer) loaded on every connection, before the
	 * link is up, and run by index with redis_link_script() */
	const char *const *scripts;
	int nscripts;
	const char *who;            /* log prefix, e.g. "idempotency store" */
	const char *down_note;      /* ends the outage warning: what the owner does meanwhile */
	const char *up_note;        /* ends the recovery line; NULL: nothing */
	int64_t connect_timeout_us; /* the TCP connect; redis_link_set_connect_timeout() */
	int64_t reply_timeout_us;   /* no reply for this long while some are due: the server is
	                             * stuck, drop. 0: none (the owner times its commands) */
	int64_t backoff_min_us, backoff_max_us;
};

/* News for the owner, with the link (also from inside redis_link_new, before it returns). */
struct redis_link_ops {
	/* A connection was opened: what is sent now goes out after the handshake (so the owner
	 * may add its own to it, e.g. a TIME, and flush what it kept waiting). NULL: none. */
	void (*open)(void *owner, struct redis_link *l);
	/* The handshake was answered. NULL: none. */
	void (*up)(void *owner, struct redis_link *l);
	/* The link went down (a connect, resolve or handshake failed, or the connection was lost
	 * or dropped); called before the callbacks of the commands lost with it. NULL: none. */
	void (*down)(void *owner, struct redis_link *l);
};

enum redis_link_state {
	REDIS_LINK_DOWN,            /* waiting out the backoff: commands fail */
	REDIS_LINK_RESOLVING,       /* commands fail: there is nothing to buffer them in yet */
	REDIS_LINK_CONNECTING,      /* connect and handshake under way: commands are buffered */
	REDIS_LINK_UP,
};

/* OWNER and ARG as given; REPLY NULL when there is none (see above), valid only during the
 * call. */
typedef void (*redis_reply_fn)(void *owner, void *arg, struct redisReply *reply);

/* A link on BASE, connecting at once. DNS (borrowed) resolves a host name. NULL with *ERR
 * when the host is a name and DNS is NULL. */
struct redis_link *redis_link_new(struct event_base *base, struct evdns_base *dns,
                                  const struct redis_link_cfg *cfg,
                                  const struct redis_link_ops *ops, void *owner,
                                  const char **err);
/* Callbacks of the commands still due run now, with NULL. Never from inside a callback of L. */
void redis_link_free(struct redis_link *l);

/* Sends ARGV; FN(owner, ARG, reply) runs exactly once. */
void redis_link_command(struct redis_link *l, int argc, const char **argv, const size_t *lens,
                        redis_reply_fn fn, void *arg);
/* EVALSHA of cfg->scripts[SCRIPT] with NKEYS keys among ARGV. A NOSCRIPT answer (the
 * server's script cache was flushed) drops the connection, so the next one loads it again. */
void redis_link_script(struct redis_link *l, int script, int nkeys, int argc, const char **argv,
                       const size_t *lens, redis_reply_fn fn, void *arg);
/* Puts the commands queued so far on the wire now, not at the loop's next write event: for
 * a write that must reach Redis before what the caller sends next reaches its peer. A
 * failure is left to that write event, where the link handles it. */
void redis_link_flush(struct redis_link *l);

enum redis_link_state redis_link_state(const struct redis_link *l);
/* "redis host:port/db", for the owner's log lines: never the password. */
const char *redis_link_label(const struct redis_link *l);
/* The owner gives up on the connection (WHAT[: DETAIL] is logged as the outage's cause): the
 * commands in flight fail, and the link reconnects after the backoff. */
void redis_link_drop(struct redis_link *l, const char *what, const char *detail);
/* The owner saw the link fail it (e.g. no connection in time): logged as an outage, once. */
void redis_link_log_down(struct redis_link *l, const char *what, const char *detail);
/* For the connections opened from now on. */
void redis_link_set_connect_timeout(struct redis_link *l, int64_t us);
/* HOST is an IPv4 or IPv6 literal: no DNS base needed. */
bool redis_link_host_is_ip(const char *host);

#endif
