/*
 * reconcile_publish: appends the reconciliation records to a Redis stream (SPEC §12) with one
 * XADD each (MAXLEN ~ 100000), from the main thread's loop, through a redis_link
 * (net/redis_link.h: reconnects with backoff, drops a connection that stops replying):
 * never blocking, and never on a worker. A tick sends what waits while the link is up.
 * Records reach the stream at least once: a record whose XADD failed or was lost with the
 * connection waits in memory and goes again once Redis is back (the record's id lets a reader
 * drop a repeat). Every XADD lost counts as a publish error; so does an outage that finds
 * records waiting and none in flight.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/dns.h>
#include <event2/event.h>
#include <hiredis/hiredis.h>

#include "base/clock.h"
#include "base/log.h"
#include "base/util.h"
#include "net/redis_link.h"
#include "obs/reconcile.h"
#include "obs/reconcile_publish.h"

#define PUB_MAGIC 0x9b1c5e27u
#define PUB_TICK_US (100 * 1000)
#define PUB_MAX_IN_FLIGHT 64
#define PUB_BACKOFF_MIN_US (200 * 1000)
#define PUB_BACKOFF_MAX_US (5 * 1000 * 1000)
#define PUB_REPLY_TIMEOUT_US (5 * 1000 * 1000)

struct publisher {
	uint32_t magic;
	struct redis_link *link;
	struct evdns_base *dns;         /* for a host name */
	char *host, *user, *pass, *stream;
	int port, db;
	struct event *tick;
	int64_t paused_until_us;
	uint64_t fly[PUB_MAX_IN_FLIGHT];    /* seqs of the XADDs in flight, in reply order */
	int fly_head, fly_n;
};

static struct publisher *pub;

/* one reply per XADD, in the order they were sent (hiredis keeps it) */
static void xadd_reply(void *owner, void *arg, redisReply *reply)
{
	struct publisher *p = owner;
	MAGIC_CHECK(p, PUB_MAGIC);
	if (p->fly_n == 0)
		return;
	uint64_t seq = p->fly[p->fly_head];
	p->fly_head = (p->fly_head + 1) % PUB_MAX_IN_FLIGHT;
	p->fly_n--;
	bool ok = reply && reply->type != REDIS_REPLY_ERROR;
	reconcile_publish_done(seq, ok);
	if (!ok) {
		reconcile_count_error();
		if (reply) {
			log_warn("reconcile: %s: XADD to %s refused: %s", redis_link_label(p->link),
			         p->stream, reply->str ? reply->str : "error");
			p->paused_until_us = clock_now_us() + PUB_BACKOFF_MAX_US;
		}
	}
}

/* Before the XADDs lost with the connection come back (each counts then): an outage while
 * records wait and none is in flight counts once. */
static void link_down(void *owner, struct redis_link *l)
{
	struct publisher *p = owner;
	MAGIC_CHECK(p, PUB_MAGIC);
	if (p->fly_n == 0 && reconcile_have_unpublished())
		reconcile_count_error();
}

static const struct redis_link_ops link_ops = { .down = link_down };

static void send_one(void *arg, const struct reconcile_fields *f)
{
	struct publisher *p = arg;
	enum { XADD_HEAD = 6 };        /* XADD stream MAXLEN ~ 100000 * */
	const char *argv[XADD_HEAD + RECONCILE_FIELDS * 2];
	size_t lens[XADD_HEAD + RECONCILE_FIELDS * 2];
	int n = 0;
	argv[n] = "XADD"; lens[n++] = 4;
	argv[n] = p->stream; lens[n++] = strlen(p->stream);
	argv[n] = "MAXLEN"; lens[n++] = 6;
	argv[n] = "~"; lens[n++] = 1;
	argv[n] = "100000"; lens[n++] = 6;
	argv[n] = "*"; lens[n++] = 1;
	for (int i = 0; i < f->n; i++) {
		argv[n] = f->argv[i];
		lens[n++] = f->lens[i];
	}
	int tail = (p->fly_head + p->fly_n) % PUB_MAX_IN_FLIGHT;
	p->fly[tail] = f->seq;
	p->fly_n++;
	redis_link_command(p->link, n, argv, lens, xadd_reply, NULL);
}

static void tick_cb(evutil_socket_t fd, short what, void *arg)
{
	struct publisher *p = arg;
	MAGIC_CHECK(p, PUB_MAGIC);
	if (redis_link_state(p->link) == REDIS_LINK_UP && clock_now_us() >= p->paused_until_us &&
	    p->fly_n < PUB_MAX_IN_FLIGHT)
		reconcile_take_unpublished(PUB_MAX_IN_FLIGHT - p->fly_n, send_one, p);
}

static void publisher_free(struct publisher *p)
{
	if (!p)
		return;
	event_free(p->tick);
	/* the replies still due come back NULL inside the free: nothing is in flight for them
	 * to settle or count (unflight_all below puts the records back) */
	p->fly_n = 0;
	redis_link_free(p->link);
	if (p->dns)
		evdns_base_free(p->dns, 1);
	reconcile_unflight_all();
	free(p->host);
	free(p->user);
	free(p->pass);
	free(p->stream);
	p->magic = 0;
	free(p);
}

static bool same(const char *a, const char *b)
{
	return (!a && !b) || (a && b && strcmp(a, b) == 0);
}

void reconcile_publish_configure(struct event_base *base, const struct cfg_reconcile *c)
{
	if (pub && c->redis_host && same(pub->host, c->redis_host) && pub->port == c->redis_port &&
	    pub->db == c->redis_db && same(pub->user, c->redis_user) &&
	    same(pub->pass, c->redis_password) && same(pub->stream, c->stream))
		return;
	publisher_free(pub);
	pub = NULL;
	if (!c->redis_host)
		return;
	struct publisher *p = xcalloc(1, sizeof(*p));
	p->magic = PUB_MAGIC;
	if (!redis_link_host_is_ip(c->redis_host) &&
	    !(p->dns = evdns_base_new(base, EVDNS_BASE_INITIALIZE_NAMESERVERS))) {
		log_warn("reconcile: cannot resolve redis %s: no DNS; records stay in memory",
		         c->redis_host);
		free(p);
		return;
	}
	const struct redis_link_cfg lc = {
		.host = c->redis_host,
		.port = c->redis_port,
		.db = c->redis_db,
		.user = c->redis_user,
		.password = c->redis_password,
		.who = "reconcile:",
		.down_note = "records stay in memory and are published when it is back",
		.up_note = "publishing the waiting records",
		.connect_timeout_us = PUB_REPLY_TIMEOUT_US,
		.reply_timeout_us = PUB_REPLY_TIMEOUT_US,
		.backoff_min_us = PUB_BACKOFF_MIN_US,
		.backoff_max_us = PUB_BACKOFF_MAX_US,
	};
	p->host = xstrdup(c->redis_host);
	p->port = c->redis_port;
	p->db = c->redis_db;
	p->user = c->redis_user ? xstrdup(c->redis_user) : NULL;
	p->pass = c->redis_password ? xstrdup(c->redis_password) : NULL;
	p->stream = xstrdup(c->stream);
	p->link = redis_link_new(base, p->dns, &lc, &link_ops, p, NULL);
	p->tick = event_new(base, -1, EV_PERSIST, tick_cb, p);
	struct timeval tv = clock_tv(PUB_TICK_US);
	event_add(p->tick, &tv);
	pub = p;
	log_info("reconcile: publishing unknown outcomes to %s, stream %s", redis_link_label(p->link),
	         p->stream);
}

void reconcile_publish_stop(void)
{
	publisher_free(pub);
	pub = NULL;
}
