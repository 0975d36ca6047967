/*
 * store_redis: the "redis://" idempotency store — one async hiredis connection per
 * (URL, event_base), driven by libevent, shared by every replica that points at the server.
 *
 * Each operation is one script (EVALSHA), so it is atomic on the server: a claim is SET NX PX and, when
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
 * The connection is a redis_link (net/redis_link.h): resolving, connecting, AUTH, SELECT, the
 * scripts loaded, backoff 50 ms doubling to 2 s, the outage logged once. Each connection's
 * handshake also reads TIME. Claims are sent while the link is CONNECTING or UP (hiredis
 * buffers them until connected), wait in a queue while it is RESOLVING (or before the first
 * clock offset), and fail at once while it is DOWN: fail closed, fast. Every claim has a timer
 * (idem_redis_set_timeout, IDEM_REDIS_TIMEOUT_US by default, also the connect timeout); a
 * command without reply by then means a stuck server or network, so the connection is
 * dropped, which fails every command in flight.
 *
 * Ownership of an op: the user holds it until its callback runs or it is cancelled
 * (`user_done`); the link holds it while its callback is due (`in_redis`). It is freed when both
 * let go, so a cancelled or timed-out op whose reply is still due stays until the link calls
 * back (it calls back every command exactly once, with NULL when it fails).
 */
#include "idempotency/store.h"
#include "base/clock.h"
#include "base/log.h"
#include "base/util.h"
#include "net/redis_link.h"

#include <event2/event.h>
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

enum { SCRIPT_CLAIM, SCRIPT_PUT, SCRIPT_RELEASE };
static const char *const scripts[] = { claim_lua, put_lua, release_lua };

/* idem_redis_set_timeout(): read at each claim and each connect */
static _Atomic int64_t timeout_us = IDEM_REDIS_TIMEOUT_US;

struct redis_conn {
	struct idem_store s;
	struct redis_link *link;
	bool clock_known;           /* clock_offset_ms was measured (on this or an earlier link) */
	int64_t clock_offset_ms;    /* server TIME minus clock_now_us(), in ms */
	bool closing;               /* being freed: replies and timers deliver nothing */
	TAILQ_HEAD(, redis_op) ops;     /* every op not yet freed */
	TAILQ_HEAD(, redis_op) waiting; /* claims queued while resolving or before a clock offset */
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

static void claim_reply(void *owner, void *arg, redisReply *reply);

/* Sends the claim script; its callback settles the op. */
static void op_send(struct redis_op *o)
{
	struct redis_conn *c = o->c;
	char key[KEY_LEN], ms[24], dl[24];
	unsigned char rec[REC_HEAD_LEN];

	make_key(key, o->key.scope);
	rec_encode(rec, REC_CLAIMED, o->key.fp, NULL);
	int msn = ms_arg(ms, sizeof ms, o->lock_us);
	int dln = snprintf(dl, sizeof dl, "%lld",
	                   (long long)(o->deadline_us / 1000 + c->clock_offset_ms));
	const char *argv[] = { key, (const char *)rec, ms, dl };
	size_t lens[] = { KEY_LEN, sizeof rec, (size_t)msn, (size_t)dln };
	o->in_redis = true;
	redis_link_script(c->link, SCRIPT_CLAIM, 1, 4, argv, lens, claim_reply, o);
}

/* Queues O until the connection can send it (resolving, or no clock offset yet). */
static void op_wait(struct redis_op *o)
{
	TAILQ_INSERT_TAIL(&o->c->waiting, o, wlink);
	o->waiting = true;
}

static bool can_send(struct redis_conn *c)
{
	return redis_link_state(c->link) >= REDIS_LINK_CONNECTING;
}

/* Sends the waiting claims, once there is a connection and a clock offset. */
static void flush_waiting(struct redis_conn *c)
{
	while (can_send(c) && c->clock_known && !TAILQ_EMPTY(&c->waiting)) {
		struct redis_op *o = TAILQ_FIRST(&c->waiting);
		op_unwait(o);
		op_send(o);
	}
}

/* ------------------------------------------------------------------ the link's news */

/* The handshake's TIME: the server's clock against ours, read now, after the reply (the
 * server read its clock before: the offset errs low, deadlines early; our side is rounded up
 * for the same reason). */
static void time_reply(void *owner, void *arg, redisReply *reply)
{
	struct redis_conn *c = owner;

	if (!reply || c->closing)
		return;
	if (reply->type != REDIS_REPLY_ARRAY || reply->elements != 2 ||
	    reply->element[0]->type != REDIS_REPLY_STRING ||
	    reply->element[1]->type != REDIS_REPLY_STRING) {
		redis_link_drop(c->link, "TIME failed",
		                reply->type == REDIS_REPLY_ERROR ? reply->str : NULL);
		return;
	}
	int64_t server_ms = strtoll(reply->element[0]->str, NULL, 10) * 1000 +
	                    strtoll(reply->element[1]->str, NULL, 10) / 1000;
	c->clock_offset_ms = server_ms - (clock_now_us() + 999) / 1000;    /* rounded low */
	c->clock_known = true;
	flush_waiting(c);
}

/* A new connection: TIME joins its handshake; the claims waiting for a connection go now if
 * the clock offset is known, else after the TIME. */
static void link_open(void *owner, struct redis_link *l)
{
	struct redis_conn *c = owner;
	const char *argv[] = { "TIME" };
	size_t lens[] = { 4 };

	c->link = l;    /* the first connection opens inside redis_link_new */
	redis_link_command(l, 1, argv, lens, time_reply, NULL);
	flush_waiting(c);
}

/* Down: queued claims fail now, new ones fail until reconnected (fail closed, fast). */
static void link_down(void *owner, struct redis_link *l)
{
	struct redis_conn *c = owner;

	while (!TAILQ_EMPTY(&c->waiting))
		op_fail_soon(TAILQ_FIRST(&c->waiting));
}

static const struct redis_link_ops link_ops = {
	.open = link_open,
	.down = link_down,
};

/* ------------------------------------------------------------------ claim */

static void claim_reply(void *owner, void *arg, redisReply *reply)
{
	struct redis_op *o = arg;
	struct redis_conn *c = owner;
	struct rec rec;

	o->in_redis = false;
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
		         "is re-measured at the next connection", redis_link_label(c->link));
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
			log_warn("idempotency store %s: claim of %s: %s", redis_link_label(c->link), key,
			         reply->str);
		else
			log_warn("idempotency store %s: claim of %s: corrupt record (reply type %d, "
			         "%zu bytes)", redis_link_label(c->link), key, reply->type,
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
		redis_link_drop(c->link, "no reply in time", NULL);
		return;
	}
	if (o->waiting)
		redis_link_log_down(c->link, "no connection in time", NULL);
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
	redis_link_set_connect_timeout(c->link, wait);
	switch (redis_link_state(c->link)) {
	case REDIS_LINK_CONNECTING:
	case REDIS_LINK_UP:
		if (!c->clock_known)
			op_wait(o);
		else
			op_send(o);
		break;
	case REDIS_LINK_RESOLVING:
		op_wait(o);
		break;
	case REDIS_LINK_DOWN:
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

static void write_reply(void *owner, void *arg, redisReply *reply)
{
	struct redis_conn *c = owner;
	const char *label = redis_link_label(c->link);

	if (c->closing)
		return;
	if (!reply)
		log_warn("idempotency store %s: %s not recorded (connection lost): the claim "
		         "lapses at lock_timeout", label, (const char *)arg);
	else if (reply->type == REDIS_REPLY_ERROR)
		log_warn("idempotency store %s: %s not recorded: %s", label, (const char *)arg,
		         reply->str);
}

/* Runs SCRIPT with the key, this request's claim record, then EXTRA args; logs a failure. */
static void send_write(struct redis_conn *c, const struct idem_key *k, const char *what,
                       int script, int nextra, const char **extra, const size_t *extra_lens)
{
	char key[KEY_LEN];
	unsigned char claimed[REC_HEAD_LEN];
	const char *argv[4] = { key, (const char *)claimed };
	size_t lens[4] = { KEY_LEN, sizeof claimed };
	int n = 2;

	if (!can_send(c)) {
		log_warn("idempotency store %s: %s not recorded (store unavailable): the claim "
		         "lapses at lock_timeout", redis_link_label(c->link), what);
		return;
	}
	make_key(key, k->scope);
	rec_encode(claimed, REC_CLAIMED, k->fp, NULL);
	for (int i = 0; i < nextra && n < 4; i++)
		argv[n] = extra[i], lens[n++] = extra_lens[i];
	redis_link_script(c->link, script, 1, n, argv, lens, write_reply, (void *)what);
	/* SPEC §6: a caller that repeats the key at another replica once it has the answer is
	 * served the outcome, not 409. The outcome is settled before the answer's last bytes
	 * are flushed (later in this loop turn), so it must be on the wire before them. */
	redis_link_flush(c->link);
}

static void redis_put(struct idem_store *s, const struct idem_key *k, enum rec_state st,
                      const struct idem_response *resp, int64_t ttl_us)
{
	struct redis_conn *c = (struct redis_conn *)s;
	size_t n = rec_size(st, resp);
	char ms[24];

	if (n == 0) {
		log_warn("idempotency store %s: response too large to encode, not recorded",
		         redis_link_label(c->link));
		return;
	}
	unsigned char *rec = xmalloc(n);
	rec_encode(rec, st, k->fp, resp);
	int msn = ms_arg(ms, sizeof ms, ttl_us);
	const char *extra[] = { (const char *)rec, ms };
	size_t lens[] = { n, (size_t)msn };
	send_write(c, k, st == REC_DONE ? "response" : "keep-claimed", SCRIPT_PUT, 2, extra, lens);
	free(rec);      /* hiredis copied the command into its output buffer */
}

static void redis_release(struct idem_store *s, const struct idem_key *k)
{
	send_write((struct redis_conn *)s, k, "release", SCRIPT_RELEASE, 0, NULL, NULL);
}

/* ------------------------------------------------------------------ life */

static void redis_free(struct idem_store *s)
{
	struct redis_conn *c = (struct redis_conn *)s;

	c->closing = true;
	redis_link_free(c->link);   /* NULL replies: the ops in flight are freed undelivered */
	while (!TAILQ_EMPTY(&c->ops)) {
		struct redis_op *o = TAILQ_FIRST(&c->ops);
		o->user_done = true;
		o->in_redis = false;
		op_unwait(o);
		op_free_if_done(o);
	}
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
	struct redis_conn *c = xcalloc(1, sizeof *c);
	const struct redis_link_cfg lc = {
		.host = cfg->store_host,
		.port = cfg->store_port,
		.db = cfg->store_db,
		.user = cfg->store_user,
		.password = cfg->store_password,
		.scripts = scripts,
		.nscripts = sizeof scripts / sizeof *scripts,
		.who = "idempotency store",
		.down_note = "failing closed, reconnecting",
		.connect_timeout_us = atomic_load(&timeout_us),
		.backoff_min_us = BACKOFF_MIN_US,
		.backoff_max_us = BACKOFF_MAX_US,
	};

	c->s.ops = &redis_ops;
	c->s.base = base;
	TAILQ_INIT(&c->ops);
	TAILQ_INIT(&c->waiting);
	c->link = redis_link_new(base, dns, &lc, &link_ops, c, err);
	if (!c->link) {
		free(c);
		return NULL;
	}
	return &c->s;
}
