/*
 * store_redis: the "redis://" idempotency store — one async hiredis connection per
 * (URL, event_base), driven by libevent, shared by every replica that points at the server.
 *
 * Each operation is one EVAL, so it is atomic on the server: a claim is SET NX PX and, when
 * the key exists, GET in the same script (no window in which the record could expire between
 * the two); complete/keep/release compare the current value with this request's claim record
 * before writing. Records are the byte encoding of store.h under "retrygate:idem:<scope hex>"
 * (a response with trailers in its version-2 form; every other record in the form older
 * versions read, as replicas of two versions share the server during a rolling deploy).
 *
 * A claim carries the moment its requester gives up, on the server's clock: the script
 * refuses to claim once Redis TIME has reached it. A stalled server (SIGSTOP, a long fork)
 * runs the commands it buffered when it resumes, after the request was answered 503; without
 * the deadline such a claim would block the key for lock_timeout although nothing ran. Nor is
 * the claim answered before that moment: libevent's timers count from the loop's cached time
 * and may fire early, so the op's timer waits out what is left. The offset between our
 * monotonic clock and the server's is taken from a TIME in each handshake, measured at the
 * reply (so a slow reply makes deadlines early, never late); until one connection has
 * answered it, claims wait as they do while resolving.
 *
 * Connection states:  IDLE (backoff timer) -> [RESOLVING ->] CONNECTING -> UP
 *                     any error -> IDLE, backoff 50 ms doubling to 2 s, reset once the
 *                     handshake ([AUTH] [SELECT] PING) has been answered.
 * Claims are sent while CONNECTING or UP (hiredis buffers them until connected), wait in a
 * queue while RESOLVING (or before the first clock offset), and fail at once while IDLE: fail closed, fast. Every claim has a
 * timer (idem_redis_set_timeout, IDEM_REDIS_TIMEOUT_US by default); a command without reply
 * by then means a stuck server or network, so the connection is dropped, which fails every
 * command in flight.
 *
 * Ownership of an op: the user holds it until its callback runs or it is cancelled
 * (`user_done`); hiredis holds it while a reply is pending (`in_redis`). It is freed when both
 * let go, so a cancelled or timed-out op whose reply is still due stays until hiredis calls
 * back. The first sign of a dead connection (a NULL reply, a failed connect, a disconnect)
 * moves the state to IDLE; `ac` is cleared before hiredis frees the context, so nothing sends
 * to a dying context and later signs from it are ignored.
 */
#include "idempotency/store.h"
#include "base/clock.h"
#include "base/log.h"
#include "base/util.h"

#include <arpa/inet.h>
#include <event2/dns.h>
#include <event2/event.h>
#include <event2/util.h>
#include <hiredis/adapters/libevent.h>
#include <hiredis/async.h>
#include <hiredis/hiredis.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/queue.h>

#define BACKOFF_MIN_US      50000
#define BACKOFF_MAX_US      2000000
#define KEY_PREFIX          "retrygate:idem:"
#define KEY_LEN             (sizeof(KEY_PREFIX) - 1 + 64)

/* KEYS[1] key; ARGV[1] the CLAIMED record; ARGV[2] lock_timeout ms; ARGV[3] the deadline,
 * server time in ms, rounded down. 1: claimed; 2: too late, nothing written; else the existing
 * record. Too late already in the deadline's own millisecond: TIME rounds down as well. */
static const char claim_lua[] =
	"local t = redis.call('TIME')\n"
	"if tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) >= tonumber(ARGV[3]) then\n"
	"  return 2\n"
	"end\n"
	"if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return 1 end\n"
	"return redis.call('GET', KEYS[1])\n";
#define CLAIM_TOO_LATE 2
/* KEYS[1] key; ARGV[1] this request's CLAIMED record; ARGV[2] the new record; ARGV[3] ttl ms.
 * Writes only over that claim or over nothing. */
static const char put_lua[] =
	"local v = redis.call('GET', KEYS[1])\n"
	"if v == false or v == ARGV[1] then\n"
	"  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])\n"
	"  return 1\n"
	"end\n"
	"return 0\n";
/* KEYS[1] key; ARGV[1] this request's CLAIMED record. */
static const char release_lua[] =
	"if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end\n"
	"return 0\n";

enum rc_state { RC_IDLE, RC_RESOLVING, RC_CONNECTING, RC_UP };

/* idem_redis_set_timeout(): read at each claim and each connect */
static _Atomic int64_t timeout_us = IDEM_REDIS_TIMEOUT_US;

struct redis_conn {
	struct idem_store s;
	char *host;                 /* an IP literal, or a name resolved on `dns` */
	bool literal;
	int port, db;
	char *user, *pass;          /* NULL: no AUTH; user NULL: AUTH with the password alone */
	char label[300];            /* "redis host:port/db" for logs: never the password */
	struct evdns_base *dns;     /* borrowed */
	struct evdns_getaddrinfo_request *dns_req;
	unsigned addr_turn;         /* which resolved address the next connect uses */
	enum rc_state state;
	redisAsyncContext *ac;      /* NULL unless CONNECTING or UP */
	struct event *timer;        /* IDLE: the backoff; CONNECTING: the connect timeout */
	int64_t backoff_us;
	uint64_t rng;               /* backoff jitter */
	bool down;                  /* an outage was logged: log the recovery, not each failure */
	bool clock_known;           /* clock_offset_ms was measured (on this or an earlier link) */
	int64_t clock_offset_ms;    /* server TIME minus clock_now_us(), in ms */
	bool closing;               /* being freed: replies and timers deliver nothing */
	TAILQ_HEAD(, redis_op) ops;     /* every op not yet freed */
	TAILQ_HEAD(, redis_op) waiting; /* claims queued while RESOLVING */
};

struct redis_op {
	struct idem_op op;
	struct redis_conn *c;
	TAILQ_ENTRY(redis_op) link;     /* in c->ops */
	TAILQ_ENTRY(redis_op) wlink;    /* in c->waiting while `waiting` */
	struct event *timer;            /* the reply timeout, or "fail now" */
	bool waiting, in_redis, user_done;
	struct idem_key key;
	int64_t lock_us;
	int64_t deadline_us;            /* clock_now_us() when the requester gives up */
};

/* ------------------------------------------------------------------ helpers */

static void make_key(char out[KEY_LEN], const unsigned char scope[32])
{
	static const char hex[] = "0123456789abcdef";
	memcpy(out, KEY_PREFIX, sizeof(KEY_PREFIX) - 1);
	char *p = out + sizeof(KEY_PREFIX) - 1;
	for (int i = 0; i < 32; i++) {
		*p++ = hex[scope[i] >> 4];
		*p++ = hex[scope[i] & 15];
	}
}

/* milliseconds for PX: rounded up, at least 1 (PX 0 is an error) */
static int ms_arg(char *buf, size_t cap, int64_t us)
{
	int64_t ms = us > 0 ? (us + 999) / 1000 : 1;
	return snprintf(buf, cap, "%lld", (long long)ms);
}

static void set_timer(struct event *ev, int64_t us)
{
	struct timeval tv = clock_tv(us);
	evtimer_add(ev, &tv);
}

/* ------------------------------------------------------------------ ops */

static void op_free_if_done(struct redis_op *o)
{
	if (!o->user_done || o->in_redis)
		return;
	TAILQ_REMOVE(&o->c->ops, o, link);
	event_free(o->timer);
	free(o);
}

static void op_unwait(struct redis_op *o)
{
	if (o->waiting) {
		TAILQ_REMOVE(&o->c->waiting, o, wlink);
		o->waiting = false;
	}
}

/* Hands R to the user; the op may be freed before FN runs (FN may claim again). */
static void op_deliver(struct redis_op *o, enum idem_result r, const struct idem_response *resp)
{
	idem_claim_fn fn = o->op.fn;
	void *arg = o->op.arg;

	o->user_done = true;
	evtimer_del(o->timer);
	op_unwait(o);
	op_free_if_done(o);
	fn(arg, r, resp);
}

/* UNAVAILABLE from the loop, soon: never from inside idem_claim. */
static void op_fail_soon(struct redis_op *o)
{
	op_unwait(o);
	o->deadline_us = clock_now_us();
	set_timer(o->timer, 0);
}

static void claim_reply_cb(redisAsyncContext *ac, void *r, void *priv);

/* Sends the claim script; false when the context refuses it (it is going down). */
static bool op_send(struct redis_op *o)
{
	struct redis_conn *c = o->c;
	char key[KEY_LEN], ms[24], dl[24];
	unsigned char rec[REC_HEAD_LEN];

	if (!c->ac)
		return false;
	make_key(key, o->key.scope);
	rec_encode(rec, REC_CLAIMED, o->key.fp, NULL);
	int msn = ms_arg(ms, sizeof ms, o->lock_us);
	int dln = snprintf(dl, sizeof dl, "%lld",
	                   (long long)(o->deadline_us / 1000 + c->clock_offset_ms));
	const char *argv[] = { "EVAL", claim_lua, "1", key, (const char *)rec, ms, dl };
	size_t lens[] = { 4, sizeof(claim_lua) - 1, 1, KEY_LEN, sizeof rec, (size_t)msn,
	                  (size_t)dln };
	if (redisAsyncCommandArgv(c->ac, claim_reply_cb, o, 7, argv, lens) != REDIS_OK)
		return false;
	o->in_redis = true;
	return true;
}

/* Queues O until the connection can send it (resolving, or no clock offset yet). */
static void op_wait(struct redis_op *o)
{
	TAILQ_INSERT_TAIL(&o->c->waiting, o, wlink);
	o->waiting = true;
}

/* Sends the waiting claims, once there is a context and a clock offset. */
static void flush_waiting(struct redis_conn *c)
{
	while (c->ac && c->clock_known && !TAILQ_EMPTY(&c->waiting)) {
		struct redis_op *o = TAILQ_FIRST(&c->waiting);
		op_unwait(o);
		if (!op_send(o))
			op_fail_soon(o);
	}
}

/* ------------------------------------------------------------------ connection state */

/* IDLE with the backoff running; queued claims fail now, new ones fail until reconnected. */
static void conn_backoff(struct redis_conn *c)
{
	c->state = RC_IDLE;
	/* jitter in [backoff/2, backoff]: workers and replicas do not reconnect in lockstep */
	int64_t wait = c->backoff_us / 2 +
	               (int64_t)(rand_next(&c->rng) % (uint64_t)(c->backoff_us / 2 + 1));
	set_timer(c->timer, wait);
	c->backoff_us = c->backoff_us * 2 > BACKOFF_MAX_US ? BACKOFF_MAX_US : c->backoff_us * 2;
	while (!TAILQ_EMPTY(&c->waiting))
		op_fail_soon(TAILQ_FIRST(&c->waiting));
}

static void conn_log_down(struct redis_conn *c, const char *what, const char *detail)
{
	if (c->closing)
		return;
	if (!c->down)
		log_warn("idempotency store %s: %s%s%s; failing closed, reconnecting", c->label, what,
		         detail ? ": " : "", detail ? detail : "");
	else
		log_debug("idempotency store %s: %s%s%s", c->label, what, detail ? ": " : "",
		          detail ? detail : "");
	c->down = true;
}

/* AC showed it is dead (hiredis frees it itself): forget it, once. */
static void conn_lost(struct redis_conn *c, const redisAsyncContext *ac, const char *what)
{
	if (c->ac != ac || !ac)
		return;
	conn_log_down(c, what, ac->c.errstr[0] ? ac->c.errstr : NULL);
	c->ac = NULL;
	conn_backoff(c);
}

/* We give up on the connection: free it, which fails every command in flight (now, or when
 * the hiredis callback we are in returns). */
static void conn_drop(struct redis_conn *c, const char *what, const char *detail)
{
	redisAsyncContext *ac = c->ac;
	conn_log_down(c, what, detail);
	c->ac = NULL;
	conn_backoff(c);
	if (ac)
		redisAsyncFree(ac);
}

static void connect_cb(const redisAsyncContext *ac, int status)
{
	struct redis_conn *c = ac->data;

	if (c->ac != ac)
		return;
	if (status != REDIS_OK) {
		conn_lost(c, ac, "connect failed");
		return;
	}
	c->state = RC_UP;
	evtimer_del(c->timer);
	redisEnableKeepAlive((redisContext *)&ac->c);
}

static void disconnect_cb(const redisAsyncContext *ac, int status)
{
	conn_lost(ac->data, ac, "connection lost");
}

/* what each handshake command's failure is called; the PING's is also its identity */
static const char auth_failed[] = "AUTH failed";
static const char select_failed[] = "SELECT failed";
static const char ping_failed[] = "PING failed";

/* The replies to AUTH, SELECT and the closing PING: an error makes the connection useless;
 * the PING's answer proves the whole handshake worked, and only that ends an outage (so a
 * server that accepts TCP but refuses AUTH is retried with a growing backoff, not every
 * 50 ms, and logged once). */
static void setup_reply_cb(redisAsyncContext *ac, void *r, void *priv)
{
	struct redis_conn *c = ac->data;
	redisReply *reply = r;
	const char *what = priv;

	if (!reply) {
		conn_lost(c, ac, "connection lost");
		return;
	}
	if (c->ac != ac)
		return;
	if (reply->type == REDIS_REPLY_ERROR) {
		conn_drop(c, what, reply->str);
		return;
	}
	if (what == ping_failed) {
		c->backoff_us = BACKOFF_MIN_US;
		if (c->down)
			log_info("idempotency store %s: connected", c->label);
		c->down = false;
	}
}

/* The handshake's TIME: the server's clock against ours, read now, after the reply (the
 * server read its clock before: the offset errs low, deadlines early; our side is rounded up
 * for the same reason). */
static void time_reply_cb(redisAsyncContext *ac, void *r, void *priv)
{
	struct redis_conn *c = ac->data;
	redisReply *reply = r;

	if (!reply) {
		conn_lost(c, ac, "connection lost");
		return;
	}
	if (c->ac != ac)
		return;
	if (reply->type != REDIS_REPLY_ARRAY || reply->elements != 2 ||
	    reply->element[0]->type != REDIS_REPLY_STRING ||
	    reply->element[1]->type != REDIS_REPLY_STRING) {
		conn_drop(c, "TIME failed", reply->type == REDIS_REPLY_ERROR ? reply->str : NULL);
		return;
	}
	int64_t server_ms = strtoll(reply->element[0]->str, NULL, 10) * 1000 +
	                    strtoll(reply->element[1]->str, NULL, 10) / 1000;
	c->clock_offset_ms = server_ms - (clock_now_us() + 999) / 1000;    /* rounded low */
	c->clock_known = true;
	flush_waiting(c);
}

static void send_setup(struct redis_conn *c)
{
	if (c->pass) {
		const char *argv[] = { "AUTH", c->user ? c->user : c->pass, c->pass };
		size_t lens[] = { 4, strlen(argv[1]), strlen(c->pass) };
		redisAsyncCommandArgv(c->ac, setup_reply_cb, (void *)auth_failed, c->user ? 3 : 2,
		                      argv, lens);
	}
	if (c->db) {
		char db[16];
		int n = snprintf(db, sizeof db, "%d", c->db);
		const char *argv[] = { "SELECT", db };
		size_t lens[] = { 6, (size_t)n };
		redisAsyncCommandArgv(c->ac, setup_reply_cb, (void *)select_failed, 2, argv, lens);
	}
	const char *argv[] = { "PING" };
	size_t lens[] = { 4 };
	redisAsyncCommandArgv(c->ac, setup_reply_cb, (void *)ping_failed, 1, argv, lens);
	const char *targv[] = { "TIME" };
	size_t tlens[] = { 4 };
	redisAsyncCommandArgv(c->ac, time_reply_cb, NULL, 1, targv, tlens);
}

/* Opens the connection to IP (a literal) and queues the handshake and the waiting claims. */
static void connect_ip(struct redis_conn *c, const char *ip)
{
	redisAsyncContext *ac = redisAsyncConnect(ip, c->port);

	if (!ac || ac->err) {
		conn_log_down(c, "connect failed", ac ? ac->c.errstr : "out of memory");
		if (ac)
			redisAsyncFree(ac);
		conn_backoff(c);
		return;
	}
	ac->data = c;
	if (redisLibeventAttach(ac, c->s.base) != REDIS_OK) {
		redisAsyncFree(ac);
		conn_log_down(c, "connect failed", "cannot attach to the event loop");
		conn_backoff(c);
		return;
	}
	redisAsyncSetConnectCallback(ac, connect_cb);
	redisAsyncSetDisconnectCallback(ac, disconnect_cb);
	c->ac = ac;
	c->state = RC_CONNECTING;
	set_timer(c->timer, atomic_load(&timeout_us));
	send_setup(c);
	flush_waiting(c);
}

static void dns_cb(int result, struct evutil_addrinfo *res, void *arg)
{
	/* a cancel comes only from redis_free, after which ARG is gone: do not touch it */
	if (result == EVUTIL_EAI_CANCEL)
		return;
	struct redis_conn *c = arg;
	c->dns_req = NULL;
	if (c->state != RC_RESOLVING) {
		evutil_freeaddrinfo(res);
		return;
	}
	if (result != 0 || !res) {
		conn_log_down(c, "cannot resolve", evutil_gai_strerror(result));
		if (res)
			evutil_freeaddrinfo(res);
		conn_backoff(c);
		return;
	}
	/* take the addresses in turn across reconnects, so a dead one is not retried forever */
	unsigned n = 0;
	for (struct evutil_addrinfo *a = res; a; a = a->ai_next)
		n++;
	struct evutil_addrinfo *a = res;
	for (unsigned i = c->addr_turn++ % n; i; i--)
		a = a->ai_next;
	char ip[INET6_ADDRSTRLEN] = "";
	const void *sa = a->ai_family == AF_INET6 ?
	        (const void *)&((const struct sockaddr_in6 *)a->ai_addr)->sin6_addr :
	        (const void *)&((const struct sockaddr_in *)a->ai_addr)->sin_addr;
	evutil_inet_ntop(a->ai_family, sa, ip, sizeof ip);
	evutil_freeaddrinfo(res);
	connect_ip(c, ip);
}

static void conn_connect(struct redis_conn *c)
{
	if (c->literal) {
		connect_ip(c, c->host);
		return;
	}
	struct evutil_addrinfo hints;
	char port[8];
	memset(&hints, 0, sizeof hints);
	hints.ai_family = AF_UNSPEC;
	hints.ai_socktype = SOCK_STREAM;
	hints.ai_protocol = IPPROTO_TCP;
	hints.ai_flags = EVUTIL_AI_ADDRCONFIG;
	snprintf(port, sizeof port, "%d", c->port);
	c->state = RC_RESOLVING;
	/* the answer may come before this returns (hosts file), then NULL comes back */
	struct evdns_getaddrinfo_request *req =
	        evdns_getaddrinfo(c->dns, c->host, port, &hints, dns_cb, c);
	if (req)
		c->dns_req = req;
}

static void conn_timer_cb(evutil_socket_t fd, short what, void *arg)
{
	struct redis_conn *c = arg;

	if (c->state == RC_IDLE)
		conn_connect(c);
	else if (c->state == RC_CONNECTING)
		conn_drop(c, "connect timed out", NULL);
}

/* ------------------------------------------------------------------ claim */

static void claim_reply_cb(redisAsyncContext *ac, void *r, void *priv)
{
	struct redis_op *o = priv;
	struct redis_conn *c = o->c;
	redisReply *reply = r;
	struct rec rec;

	o->in_redis = false;
	if (!reply)
		conn_lost(c, ac, "connection lost");
	if (o->user_done || c->closing) {
		o->user_done = true;
		op_free_if_done(o);
		return;
	}
	if (!reply) {
		op_deliver(o, IDEM_UNAVAILABLE, NULL);
	} else if (reply->type == REDIS_REPLY_INTEGER && reply->integer == 1) {
		op_deliver(o, IDEM_CLAIMED, NULL);
	} else if (reply->type == REDIS_REPLY_INTEGER && reply->integer == CLAIM_TOO_LATE) {
		/* the server's clock says we gave up already, though our timer has not fired */
		log_warn("idempotency store %s: claim arrived after its deadline; the clock offset "
		         "is re-measured at the next connection", c->label);
		op_deliver(o, IDEM_UNAVAILABLE, NULL);
	} else if (reply->type == REDIS_REPLY_STRING &&
	           rec_decode((const unsigned char *)reply->str, (size_t)reply->len, &rec)) {
		enum idem_result res = rec_judge(rec.state, rec.fp, o->key.fp);
		op_deliver(o, res, res == IDEM_REPLAY ? &rec.resp : NULL);
	} else {
		char key[KEY_LEN + 1];
		make_key(key, o->key.scope);
		key[KEY_LEN] = '\0';
		if (reply->type == REDIS_REPLY_ERROR)
			log_warn("idempotency store %s: claim of %s: %s", c->label, key, reply->str);
		else
			log_warn("idempotency store %s: claim of %s: corrupt record (reply type %d, "
			         "%zu bytes)", c->label, key, reply->type,
			         reply->type == REDIS_REPLY_STRING ? (size_t)reply->len : (size_t)0);
		op_deliver(o, IDEM_UNAVAILABLE, NULL);
	}
}

static void op_timer_cb(evutil_socket_t fd, short what, void *arg)
{
	struct redis_op *o = arg;
	struct redis_conn *c = o->c;

	/* libevent's timers run on the loop's cached, coarse clock and may fire a few ms before
	 * deadline_us: the server must never run a claim we answered, so wait the rest */
	int64_t left = o->deadline_us - clock_now_us();
	if (left > 0) {
		set_timer(o->timer, left);
		return;
	}
	if (o->in_redis) {
		/* no reply in time: the server or the path is stuck. Dropping the connection
		 * fails this command (via its NULL reply) and every other one in flight. */
		conn_drop(c, "no reply in time", NULL);
		return;
	}
	if (o->waiting)
		conn_log_down(c, "no connection in time", NULL);
	op_deliver(o, IDEM_UNAVAILABLE, NULL);
}

static struct idem_op *redis_claim(struct idem_store *s, const struct idem_key *k,
                                   int64_t lock_us, idem_claim_fn fn, void *arg)
{
	struct redis_conn *c = (struct redis_conn *)s;
	struct redis_op *o = xcalloc(1, sizeof *o);

	o->op.s = s;
	o->op.fn = fn;
	o->op.arg = arg;
	o->c = c;
	o->key = *k;
	o->lock_us = lock_us;
	o->timer = evtimer_new(s->base, op_timer_cb, o);
	if (!o->timer)
		abort();    /* only on out-of-memory */
	TAILQ_INSERT_TAIL(&c->ops, o, link);
	int64_t wait = atomic_load(&timeout_us);
	o->deadline_us = clock_now_us() + wait;
	set_timer(o->timer, wait);
	switch (c->state) {
	case RC_CONNECTING:
	case RC_UP:
		if (!c->clock_known)
			op_wait(o);
		else if (!op_send(o))
			op_fail_soon(o);
		break;
	case RC_RESOLVING:
		op_wait(o);
		break;
	case RC_IDLE:
		op_fail_soon(o);
		break;
	}
	return &o->op;
}

static void redis_cancel(struct idem_op *op)
{
	struct redis_op *o = (struct redis_op *)op;

	o->user_done = true;
	evtimer_del(o->timer);
	op_unwait(o);
	op_free_if_done(o);
}

/* ------------------------------------------------------------------ complete, keep, release */

static void write_reply_cb(redisAsyncContext *ac, void *r, void *priv)
{
	struct redis_conn *c = ac->data;
	redisReply *reply = r;

	if (!reply) {
		conn_lost(c, ac, "connection lost");
		if (!c->closing)
			log_warn("idempotency store %s: %s not recorded (connection lost): the claim "
			         "lapses at lock_timeout", c->label, (const char *)priv);
	} else if (reply->type == REDIS_REPLY_ERROR) {
		log_warn("idempotency store %s: %s not recorded: %s", c->label, (const char *)priv,
		         reply->str);
	}
}

/* Runs SCRIPT with the key, this request's claim record, then EXTRA args; logs a failure. */
static void send_write(struct redis_conn *c, const struct idem_key *k, const char *what,
                       const char *script, size_t script_len,
                       int nextra, const char **extra, const size_t *extra_lens)
{
	char key[KEY_LEN];
	unsigned char claimed[REC_HEAD_LEN];
	const char *argv[8];
	size_t lens[8];
	int n = 0;

	make_key(key, k->scope);
	rec_encode(claimed, REC_CLAIMED, k->fp, NULL);
	argv[n] = "EVAL", lens[n++] = 4;
	argv[n] = script, lens[n++] = script_len;
	argv[n] = "1", lens[n++] = 1;
	argv[n] = key, lens[n++] = KEY_LEN;
	argv[n] = (const char *)claimed, lens[n++] = sizeof claimed;
	for (int i = 0; i < nextra && n < 8; i++)
		argv[n] = extra[i], lens[n++] = extra_lens[i];
	if (!c->ac || redisAsyncCommandArgv(c->ac, write_reply_cb, (void *)what, n, argv, lens)
	              != REDIS_OK)
		log_warn("idempotency store %s: %s not recorded (store unavailable): the claim "
		         "lapses at lock_timeout", c->label, what);
}

static void redis_put(struct idem_store *s, const struct idem_key *k, enum rec_state st,
                      const struct idem_response *resp, int64_t ttl_us)
{
	struct redis_conn *c = (struct redis_conn *)s;
	size_t n = rec_size(st, resp);
	char ms[24];

	if (n == 0) {
		log_warn("idempotency store %s: response too large to encode, not recorded",
		         c->label);
		return;
	}
	unsigned char *rec = xmalloc(n);
	rec_encode(rec, st, k->fp, resp);
	int msn = ms_arg(ms, sizeof ms, ttl_us);
	const char *extra[] = { (const char *)rec, ms };
	size_t lens[] = { n, (size_t)msn };
	send_write(c, k, st == REC_DONE ? "response" : "keep-claimed", put_lua,
	           sizeof(put_lua) - 1, 2, extra, lens);
	free(rec);      /* hiredis copied the command into its output buffer */
}

static void redis_release(struct idem_store *s, const struct idem_key *k)
{
	send_write((struct redis_conn *)s, k, "release", release_lua, sizeof(release_lua) - 1, 0,
	           NULL, NULL);
}

/* ------------------------------------------------------------------ life */

static void redis_free(struct idem_store *s)
{
	struct redis_conn *c = (struct redis_conn *)s;

	c->closing = true;
	if (c->dns_req)
		evdns_getaddrinfo_cancel(c->dns_req);   /* its callback returns untouched */
	if (c->ac) {
		redisAsyncContext *ac = c->ac;
		c->ac = NULL;
		redisAsyncFree(ac);     /* NULL replies: the ops in flight are freed undelivered */
	}
	while (!TAILQ_EMPTY(&c->ops)) {
		struct redis_op *o = TAILQ_FIRST(&c->ops);
		o->user_done = true;
		o->in_redis = false;
		op_unwait(o);
		op_free_if_done(o);
	}
	event_free(c->timer);
	free(c->host);
	free(c->user);
	free(c->pass);
	free(c);
}

static const struct idem_store_ops redis_ops = {
	.claim = redis_claim,
	.cancel = redis_cancel,
	.put = redis_put,
	.release = redis_release,
	.free = redis_free,
};

void store_redis_set_timeout(int64_t us)
{
	atomic_store(&timeout_us, us > 0 ? us : IDEM_REDIS_TIMEOUT_US);
}

struct idem_store *store_redis_new(const struct cfg_idempotency *cfg, struct event_base *base,
                                   struct evdns_base *dns, const char **err)
{
	struct in6_addr a6;
	struct in_addr a4;
	bool literal = inet_pton(AF_INET, cfg->store_host, &a4) == 1 ||
	               inet_pton(AF_INET6, cfg->store_host, &a6) == 1;

	if (!literal && !dns) {
		if (err)
			*err = "the redis host is a name and no DNS base was given";
		return NULL;
	}
	struct redis_conn *c = xcalloc(1, sizeof *c);
	c->s.ops = &redis_ops;
	c->s.base = base;
	c->host = xstrdup(cfg->store_host);
	c->literal = literal;
	c->port = cfg->store_port;
	c->db = cfg->store_db;
	c->user = cfg->store_user ? xstrdup(cfg->store_user) : NULL;
	c->pass = cfg->store_password ? xstrdup(cfg->store_password) : NULL;
	if (strchr(c->host, ':'))
		snprintf(c->label, sizeof c->label, "redis [%s]:%d/%d", c->host, c->port, c->db);
	else
		snprintf(c->label, sizeof c->label, "redis %s:%d/%d", c->host, c->port, c->db);
	c->dns = dns;
	c->backoff_us = BACKOFF_MIN_US;
	c->rng = (uint64_t)clock_now_us() * 0x9e3779b97f4a7c15ull | 1;
	c->timer = evtimer_new(base, conn_timer_cb, c);
	if (!c->timer)
		abort();
	TAILQ_INIT(&c->ops);
	TAILQ_INIT(&c->waiting);
	conn_connect(c);
	return &c->s;
}
