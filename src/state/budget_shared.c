/*
 * budget_shared: the fleet's retry bucket in Redis (see budget_shared.h) — the links, the one
 * script, and the calls of the request path: a batch of credits, a retry's token.
 *
 * One link per (Redis, worker loop), like the idempotency store's, not one per process on
 * the main loop: a retry's question is asked from the worker whose exchange waits for it, so
 * the answer comes back on that loop with no cross-thread hand-off (a queue, a wakeup and a
 * lock on every retry) and a stuck main loop (a reload, a scrape) never delays a retry. The
 * cost is one connection per worker, and workers are few (one per core). What the workers
 * share is the upstream's state (struct budget_fleet): the batch is per process, claimed by
 * whichever worker's first attempt finds it due.
 *
 * An op (a batch or a take) holds a runtime reference while its call is in Redis, so the
 * upstream state it reports to outlives a reload that drops the upstream. A take's user holds
 * it until its callback ran or it was cancelled (`user_done`); the link holds it until its
 * reply came (`in_redis`, the link calls back exactly once); it is freed when both let go.
 */
#include "state/budget_shared.h"
#include "base/clock.h"
#include "base/log.h"
#include "base/loop.h"
#include "base/util.h"
#include "net/redis_link.h"
#include "obs/stats.h"
#include "state/runtime.h"
#include "state/upstream.h"

#include <event2/event.h>
#include <hiredis/hiredis.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define OP_MAGIC        0xb0d6e75au
#define KEY_PREFIX      "retrygate:budget:"
#define LINK_TIMEOUT_US 1000000         /* connect, and a stuck server's silence */

/* KEYS[1] the bucket; ARGV[1] first attempts to credit, [2] ratio, [3] min_per_second,
 * [4] max_tokens, [5] "1": take a token. Refill by the server's clock (one clock for the
 * fleet), credit, cap, take: atomic. Returns {1 taken / 0, the level in millionths}. A
 * missing bucket starts full, as a local one does. */
static const char take_lua[] =
	"local t = redis.call('TIME')\n"
	"local now = tonumber(t[1]) * 1000000 + tonumber(t[2])\n"
	"local cap = tonumber(ARGV[4])\n"
	"local v = redis.call('HMGET', KEYS[1], 'tokens', 'ts')\n"
	"local tok, ts = tonumber(v[1]), tonumber(v[2])\n"
	"if not tok or not ts then tok = cap; ts = now end\n"
	"if now > ts then\n"
	"  tok = tok + (now - ts) * tonumber(ARGV[3]) / 1000000\n"
	"  ts = now\n"
	"end\n"
	"tok = tok + tonumber(ARGV[1]) * tonumber(ARGV[2])\n"
	"if tok > cap then tok = cap end\n"
	"local got = 0\n"
	"if ARGV[5] == '1' and tok >= 1 then tok = tok - 1; got = 1 end\n"
	"redis.call('HSET', KEYS[1], 'tokens', string.format('%.6f', tok),\n"
	"           'ts', string.format('%.0f', ts))\n"
	"return {got, string.format('%.0f', math.floor(tok * 1000000))}\n";
static const char *const scripts[] = { take_lua };

/* ------------------------------------------------------------------ links */

struct bs_link {
	struct redis_link *link;
	struct event_base *base;
	char *spec;                 /* host port db user password: what makes it the same Redis */
	struct bs_link *next;
};

static pthread_mutex_t links_mu = PTHREAD_MUTEX_INITIALIZER;
static struct bs_link *links;

static const struct redis_link_ops link_ops = { 0 };

static struct redis_link *link_get(struct loop *loop, const struct cfg_retry *r)
{
	char spec[1024];
	snprintf(spec, sizeof spec, "%s %d %d %s %s", r->budget_shared_host, r->budget_shared_port,
	         r->budget_shared_db, r->budget_shared_user ? r->budget_shared_user : "",
	         r->budget_shared_password ? r->budget_shared_password : "");
	pthread_mutex_lock(&links_mu);
	struct bs_link *b;
	for (b = links; b; b = b->next)
		if (b->base == loop->base && !strcmp(b->spec, spec))
			break;
	if (!b) {
		struct redis_link_cfg lc = {
			.host = r->budget_shared_host,
			.port = r->budget_shared_port,
			.db = r->budget_shared_db,
			.user = r->budget_shared_user,
			.password = r->budget_shared_password,
			.scripts = scripts,
			.nscripts = 1,
			.who = "retry budget",
			.down_note = "retries take from each process's own bucket until it answers",
			.up_note = "retries take from the shared bucket again",
			.connect_timeout_us = LINK_TIMEOUT_US,
			.reply_timeout_us = LINK_TIMEOUT_US,
			.backoff_min_us = 50000,
			.backoff_max_us = BUDGET_PROBE_US,
		};
		const char *err = NULL;
		struct redis_link *l = redis_link_new(loop->base, loop->dns, &lc, &link_ops, NULL, &err);
		if (l) {
			b = xcalloc(1, sizeof *b);
			b->link = l;
			b->base = loop->base;
			b->spec = xstrdup(spec);
			b->next = links;
			links = b;
		} else {
			log_warn("retry budget: redis %s: %s", r->budget_shared_host, err ? err : "?");
		}
	}
	pthread_mutex_unlock(&links_mu);
	return b ? b->link : NULL;
}

void budget_shared_release_base(struct event_base *base)
{
	pthread_mutex_lock(&links_mu);
	struct bs_link **pp = &links;
	while (*pp) {
		struct bs_link *b = *pp;
		if (b->base != base) {
			pp = &b->next;
			continue;
		}
		*pp = b->next;
		redis_link_free(b->link);   /* the calls in flight get their NULL replies */
		free(b->spec);
		free(b);
	}
	pthread_mutex_unlock(&links_mu);
}

/* ------------------------------------------------------------------ calls */

struct budget_shared_op {
	uint32_t magic;
	struct budget_shared_ctx c; /* c.rt referenced while in_redis */
	int64_t credits;            /* first attempts this call carries (owed again if it fails) */
	int64_t t0_us, timeout_us;  /* an answer later than this is a failure too */
	budget_shared_fn fn;        /* NULL: a batch */
	void *arg;
	struct event *timer;        /* a take's bound */
	bool in_redis, user_done, settled;
};

static void op_free_if_done(struct budget_shared_op *o)
{
	if (!o->user_done || o->in_redis)
		return;
	if (o->timer)
		event_free(o->timer);
	o->magic = 0;
	free(o);
}

/* The call failed: count it, fall back (the outage logged once), owe its credits again. */
static void op_failed(struct budget_shared_op *o, const char *why)
{
	STAT_INC(o->c.us->budget_shared_errors);
	budget_fleet_return_pending(&o->c.st->fleet, o->credits);
	o->credits = 0;
	if (budget_fleet_failed(&o->c.st->fleet, clock_now_us()))
		log_warn("upstream %s: retry budget: the shared bucket in redis %s:%d does not "
		         "answer (%s); retries take from this process's own bucket until it does",
		         o->c.upstream, o->c.r->budget_shared_host, o->c.r->budget_shared_port, why);
}

/* A take's answer to its user, once: from Redis, or from the local bucket. */
static void op_settle(struct budget_shared_op *o, bool granted)
{
	if (o->settled)
		return;
	o->settled = true;
	if (o->timer)
		evtimer_del(o->timer);
	budget_shared_fn fn = o->fn;
	void *arg = o->arg;
	bool cancelled = o->user_done;
	o->user_done = true;
	if (!cancelled)
		fn(arg, granted);
}

static bool local_take(struct budget_shared_op *o)
{
	return budget_take(&o->c.st->budget, o->c.r, clock_now_us());
}

static void reply_cb(void *owner, void *arg, redisReply *reply)
{
	struct budget_shared_op *o = arg;
	MAGIC_CHECK(o, OP_MAGIC);
	o->in_redis = false;
	bool late = clock_now_us() - o->t0_us > o->timeout_us;
	bool ok = reply && reply->type == REDIS_REPLY_ARRAY && reply->elements == 2 &&
	          reply->element[0]->type == REDIS_REPLY_INTEGER &&
	          reply->element[1]->type == REDIS_REPLY_STRING;
	if (ok && !late) {
		if (budget_fleet_answered(&o->c.st->fleet, strtoll(reply->element[1]->str, NULL, 10)))
			log_info("upstream %s: retry budget: the shared bucket answers again; retries "
			         "take from it", o->c.upstream);
		if (o->fn)
			op_settle(o, reply->element[0]->integer == 1);
	} else if (!o->settled || !o->fn) {
		/* a late answer to a take that timed out was counted then */
		op_failed(o, !reply ? "no connection" : late ? "no answer in time" :
		          reply->type == REDIS_REPLY_ERROR ? reply->str : "unexpected reply");
		if (o->fn)
			op_settle(o, local_take(o));
	}
	runtime_unref(o->c.rt);
	o->c.rt = NULL;
	op_free_if_done(o);
}

static void timer_cb(evutil_socket_t fd, short what, void *arg)
{
	struct budget_shared_op *o = arg;
	MAGIC_CHECK(o, OP_MAGIC);
	if (o->settled)
		return;
	op_failed(o, "no answer within connect_timeout");
	op_settle(o, local_take(o));
	op_free_if_done(o);
}

/* Sends the script for O: its credits, and a take when it has a user. False when there is
 * no link to send it on (a failure, counted; the caller answers). */
static bool op_send(struct budget_shared_op *o, bool take)
{
	char key[sizeof(KEY_PREFIX) + 256], n[24], ratio[32], mps[32], max[24];
	const struct cfg_retry *r = o->c.r;
	int kl = snprintf(key, sizeof key, KEY_PREFIX "%s", o->c.upstream);
	const char *argv[] = { key, n, ratio, mps, max, take ? "1" : "0" };
	size_t lens[] = {
		(size_t)(kl < (int)sizeof key ? kl : (int)sizeof key - 1),
		(size_t)snprintf(n, sizeof n, "%lld", (long long)o->credits),
		(size_t)snprintf(ratio, sizeof ratio, "%.17g", r->budget_ratio),
		(size_t)snprintf(mps, sizeof mps, "%.17g", r->budget_min_per_second),
		(size_t)snprintf(max, sizeof max, "%lld", (long long)r->budget_max_tokens),
		1,
	};
	struct redis_link *l = link_get(o->c.loop, r);
	if (!l) {
		op_failed(o, "no link");
		return false;
	}
	o->c.rt = runtime_ref(o->c.rt);
	o->in_redis = true;
	redis_link_script(l, 0, 1, 6, argv, lens, reply_cb, o);
	return true;
}

static struct budget_shared_op *op_new(const struct budget_shared_ctx *c, int64_t timeout_us)
{
	struct budget_shared_op *o = xcalloc(1, sizeof *o);
	o->magic = OP_MAGIC;
	o->c = *c;
	o->t0_us = clock_now_us();
	o->timeout_us = timeout_us;
	o->credits = budget_fleet_take_pending(&c->st->fleet);
	return o;
}

void budget_shared_credit(const struct budget_shared_ctx *c, int64_t now_us)
{
	if (!budget_fleet_credit(&c->st->fleet, now_us))
		return;
	struct budget_shared_op *o = op_new(c, LINK_TIMEOUT_US);
	o->user_done = true;    /* nobody waits for a batch */
	if (!op_send(o, false))
		op_free_if_done(o);
}

struct budget_shared_op *budget_shared_take(const struct budget_shared_ctx *c, int64_t timeout_us,
                                            budget_shared_fn fn, void *arg, bool *granted)
{
	if (!budget_fleet_use_shared(&c->st->fleet)) {
		*granted = budget_take(&c->st->budget, c->r, clock_now_us());
		return NULL;
	}
	struct budget_shared_op *o = op_new(c, timeout_us);
	o->fn = fn;
	o->arg = arg;
	if (!op_send(o, true)) {
		o->user_done = true;
		op_free_if_done(o);
		*granted = budget_take(&c->st->budget, c->r, clock_now_us());
		return NULL;
	}
	o->timer = evtimer_new(c->loop->base, timer_cb, o);
	if (!o->timer)
		abort();    /* only on out-of-memory */
	struct timeval tv = clock_tv(timeout_us);
	evtimer_add(o->timer, &tv);
	return o;
}

void budget_shared_cancel(struct budget_shared_op *op)
{
	if (!op)
		return;
	MAGIC_CHECK(op, OP_MAGIC);
	op->settled = true;
	op->user_done = true;
	evtimer_del(op->timer);
	op_free_if_done(op);
}
