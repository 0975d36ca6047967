/*
 * reconcile_publish: appends the reconciliation records to a Redis stream (SPEC §12) with one
 * XADD each (MAXLEN ~ 100000), from the main thread's loop, through an async hiredis
 * connection: never blocking, and never on a worker. States: P_IDLE (no connection; a timer
 * reconnects with backoff), P_RESOLVING, P_CONNECTING, P_UP. Records reach the stream at
 * least once: a record whose XADD failed or was lost with the connection waits in memory and
 * goes again once Redis is back (the record's id lets a reader drop a repeat).
 */
#include <arpa/inet.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/dns.h>
#include <event2/event.h>
#include <event2/util.h>
#include <hiredis/adapters/libevent.h>
#include <hiredis/async.h>
#include <hiredis/hiredis.h>

#include "base/clock.h"
#include "base/log.h"
#include "obs/reconcile.h"
#include "obs/reconcile_publish.h"
#include "base/util.h"

#define PUB_MAGIC 0x9b1c5e27u
#define PUB_TICK_US (100 * 1000)
#define PUB_MAX_IN_FLIGHT 64
#define PUB_BACKOFF_MIN_US (200 * 1000)
#define PUB_BACKOFF_MAX_US (5 * 1000 * 1000)
#define PUB_REPLY_TIMEOUT_US (5 * 1000 * 1000)

enum pstate { P_IDLE, P_RESOLVING, P_CONNECTING, P_UP };

struct publisher {
	uint32_t magic;
	enum pstate state;
	struct event_base *base;
	struct evdns_base *dns;         /* for a host name; created on first need */
	struct evdns_getaddrinfo_request *dns_req;
	char *host, *user, *pass, *stream;
	int port, db;
	char label[300];                /* "host:port/db" for logs: never the password */
	redisAsyncContext *ac;
	struct event *tick;
	int64_t next_connect_us, backoff_us, paused_until_us;
	uint64_t fly[PUB_MAX_IN_FLIGHT];    /* seqs of the XADDs in flight, in reply order */
	int fly_head, fly_n;
	int setup_pending;              /* AUTH / SELECT replies still to come */
	int64_t oldest_sent_us;         /* when the oldest reply we wait for was asked */
	bool down;                      /* an outage was logged: log the recovery once */
};

static struct publisher *pub;

static void drop_conn(struct publisher *p, const char *why);

static void backoff(struct publisher *p)
{
	int64_t now = clock_now_us();
	p->backoff_us = p->backoff_us ? p->backoff_us * 2 : PUB_BACKOFF_MIN_US;
	if (p->backoff_us > PUB_BACKOFF_MAX_US)
		p->backoff_us = PUB_BACKOFF_MAX_US;
	p->next_connect_us = now + p->backoff_us;
}

static void log_down(struct publisher *p, const char *what, const char *detail)
{
	if (!p->down)
		log_warn("reconcile: redis %s: %s%s%s; records stay in memory and are published when "
		         "it is back", p->label, what, detail ? ": " : "", detail ? detail : "");
	p->down = true;
}

/* one reply per XADD, in the order they were sent (hiredis keeps it) */
static void xadd_reply_cb(redisAsyncContext *ac, void *r, void *priv)
{
	struct publisher *p = priv;
	MAGIC_CHECK(p, PUB_MAGIC);
	redisReply *reply = r;
	if (p->fly_n == 0)
		return;
	uint64_t seq = p->fly[p->fly_head];
	p->fly_head = (p->fly_head + 1) % PUB_MAX_IN_FLIGHT;
	p->fly_n--;
	p->oldest_sent_us = p->fly_n ? clock_now_us() : 0;
	bool ok = reply && reply->type != REDIS_REPLY_ERROR;
	reconcile_publish_done(seq, ok);
	if (!ok) {
		reconcile_count_error();
		if (reply) {
			log_warn("reconcile: redis %s: XADD to %s refused: %s", p->label, p->stream,
			         reply->str ? reply->str : "error");
			p->paused_until_us = clock_now_us() + PUB_BACKOFF_MAX_US;
		}
	}
}

static void setup_reply_cb(redisAsyncContext *ac, void *r, void *priv)
{
	struct publisher *p = priv;
	MAGIC_CHECK(p, PUB_MAGIC);
	redisReply *reply = r;
	p->setup_pending--;
	if (reply && reply->type == REDIS_REPLY_ERROR) {
		log_down(p, "AUTH or SELECT refused", reply->str);
		drop_conn(p, NULL);
	}
}

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
	if (redisAsyncCommandArgv(p->ac, xadd_reply_cb, p, n, argv, lens) != REDIS_OK) {
		/* the connection is going away: the record waits for the next one */
		reconcile_publish_done(f->seq, false);
		return;
	}
	int tail = (p->fly_head + p->fly_n) % PUB_MAX_IN_FLIGHT;
	p->fly[tail] = f->seq;
	if (p->fly_n++ == 0)
		p->oldest_sent_us = clock_now_us();
}

static void connect_cb(const redisAsyncContext *ac, int status)
{
	struct publisher *p = ac->data;
	MAGIC_CHECK(p, PUB_MAGIC);
	if (status != REDIS_OK) {
		/* hiredis frees the context after this callback */
		p->ac = NULL;
		p->state = P_IDLE;
		log_down(p, "cannot connect", ac->errstr);
		if (reconcile_have_unpublished())
			reconcile_count_error();
		backoff(p);
		return;
	}
	p->state = P_UP;
	p->backoff_us = 0;
	if (p->down)
		log_info("reconcile: redis %s is back; publishing the waiting records", p->label);
	p->down = false;
}

static void disconnect_cb(const redisAsyncContext *ac, int status)
{
	struct publisher *p = ac->data;
	MAGIC_CHECK(p, PUB_MAGIC);
	/* hiredis already failed every reply we waited for (NULL replies): nothing in flight */
	p->ac = NULL;
	p->fly_n = 0;
	p->setup_pending = 0;
	if (p->state == P_UP || p->state == P_CONNECTING)
		log_down(p, "connection lost", ac->errstr[0] ? ac->errstr : NULL);
	p->state = P_IDLE;
	backoff(p);
}

static void connect_ip(struct publisher *p, const char *ip)
{
	redisAsyncContext *ac = redisAsyncConnect(ip, p->port);
	if (!ac || ac->err) {
		log_down(p, "cannot connect", ac ? ac->errstr : "out of memory");
		if (ac)
			redisAsyncFree(ac);
		p->state = P_IDLE;
		backoff(p);
		return;
	}
	ac->data = p;
	if (redisLibeventAttach(ac, p->base) != REDIS_OK) {
		redisAsyncFree(ac);
		p->state = P_IDLE;
		backoff(p);
		return;
	}
	redisAsyncSetConnectCallback(ac, connect_cb);
	redisAsyncSetDisconnectCallback(ac, disconnect_cb);
	p->ac = ac;
	p->state = P_CONNECTING;
	p->oldest_sent_us = clock_now_us();
	if (p->pass) {
		const char *argv[] = { "AUTH", p->user ? p->user : p->pass, p->pass };
		size_t lens[] = { 4, strlen(argv[1]), strlen(p->pass) };
		p->setup_pending++;
		redisAsyncCommandArgv(ac, setup_reply_cb, p, p->user ? 3 : 2, argv, lens);
	}
	if (p->db) {
		char db[16];
		snprintf(db, sizeof(db), "%d", p->db);
		const char *argv[] = { "SELECT", db };
		size_t lens[] = { 6, strlen(db) };
		p->setup_pending++;
		redisAsyncCommandArgv(ac, setup_reply_cb, p, 2, argv, lens);
	}
}

static void dns_cb(int result, struct evutil_addrinfo *res, void *arg)
{
	if (result == EVUTIL_EAI_CANCEL)
		return;     /* only from publisher_free, after which ARG is gone */
	struct publisher *p = arg;
	MAGIC_CHECK(p, PUB_MAGIC);
	p->dns_req = NULL;
	if (result != 0 || !res) {
		log_down(p, "cannot resolve", evutil_gai_strerror(result));
		if (res)
			evutil_freeaddrinfo(res);
		p->state = P_IDLE;
		backoff(p);
		return;
	}
	char ip[INET6_ADDRSTRLEN] = "";
	const void *sa = res->ai_family == AF_INET6 ?
	        (const void *)&((const struct sockaddr_in6 *)res->ai_addr)->sin6_addr :
	        (const void *)&((const struct sockaddr_in *)res->ai_addr)->sin_addr;
	evutil_inet_ntop(res->ai_family, sa, ip, sizeof(ip));
	evutil_freeaddrinfo(res);
	connect_ip(p, ip);
}

static void start_connect(struct publisher *p)
{
	unsigned char buf[16];
	if (inet_pton(AF_INET, p->host, buf) == 1 || inet_pton(AF_INET6, p->host, buf) == 1) {
		connect_ip(p, p->host);
		return;
	}
	if (!p->dns)
		p->dns = evdns_base_new(p->base, EVDNS_BASE_INITIALIZE_NAMESERVERS);
	if (!p->dns) {
		log_down(p, "cannot resolve", "no DNS");
		backoff(p);
		return;
	}
	struct evutil_addrinfo hints;
	char port[8];
	memset(&hints, 0, sizeof(hints));
	hints.ai_family = AF_UNSPEC;
	hints.ai_socktype = SOCK_STREAM;
	hints.ai_protocol = IPPROTO_TCP;
	snprintf(port, sizeof(port), "%d", p->port);
	p->state = P_RESOLVING;
	struct evdns_getaddrinfo_request *req = evdns_getaddrinfo(p->dns, p->host, port, &hints,
	                                                          dns_cb, p);
	if (req && p->state == P_RESOLVING)
		p->dns_req = req;
}

/* Give up the connection (a timeout, a refused AUTH): every XADD in flight counts as failed
 * and its record waits again; the context is freed by hiredis (after the callback we may be
 * in), with our callbacks detached, so nothing of it comes back. WHY: logged. */
static void drop_conn(struct publisher *p, const char *why)
{
	redisAsyncContext *ac = p->ac;
	if (why)
		log_down(p, why, NULL);
	if (!ac)
		return;
	p->ac = NULL;
	/* each XADD lost counts; with none in flight, a connection given up while records wait */
	if (p->fly_n == 0 && reconcile_have_unpublished())
		reconcile_count_error();
	for (; p->fly_n > 0; p->fly_n--)
		reconcile_count_error();
	reconcile_unflight_all();
	p->setup_pending = 0;
	p->oldest_sent_us = 0;
	p->state = P_IDLE;
	backoff(p);
	/* redisAsyncSet*Callback() will not replace a set callback: clear them here */
	ac->onConnect = NULL;
	ac->onDisconnect = NULL;
	redisAsyncFree(ac);
}

static void tick_cb(evutil_socket_t fd, short what, void *arg)
{
	struct publisher *p = arg;
	MAGIC_CHECK(p, PUB_MAGIC);
	int64_t now = clock_now_us();
	switch (p->state) {
	case P_IDLE:
		if (now >= p->next_connect_us)
			start_connect(p);
		break;
	case P_RESOLVING:
		break;
	case P_CONNECTING:
	case P_UP:
		/* a Redis that takes no more replies is as good as down */
		if (p->oldest_sent_us && (p->fly_n > 0 || p->state == P_CONNECTING) &&
		    now - p->oldest_sent_us > PUB_REPLY_TIMEOUT_US) {
			drop_conn(p, p->state == P_CONNECTING ? "connect timed out" : "no reply in time");
			break;
		}
		if (p->state == P_UP && p->setup_pending == 0 && now >= p->paused_until_us &&
		    p->fly_n < PUB_MAX_IN_FLIGHT)
			reconcile_take_unpublished(PUB_MAX_IN_FLIGHT - p->fly_n, send_one, p);
		break;
	}
}

static void publisher_free(struct publisher *p)
{
	if (!p)
		return;
	event_free(p->tick);
	if (p->ac) {
		redisAsyncContext *ac = p->ac;
		p->ac = NULL;
		/* the replies still due come back NULL inside the free: nothing is in flight for
		 * them to settle or count (unflight_all below puts the records back) */
		p->fly_n = 0;
		ac->onConnect = NULL;
		ac->onDisconnect = NULL;
		p->state = P_IDLE;
		redisAsyncFree(ac);
	}
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
	p->base = base;
	p->host = xstrdup(c->redis_host);
	p->port = c->redis_port;
	p->db = c->redis_db;
	p->user = c->redis_user ? xstrdup(c->redis_user) : NULL;
	p->pass = c->redis_password ? xstrdup(c->redis_password) : NULL;
	p->stream = xstrdup(c->stream);
	snprintf(p->label, sizeof(p->label), "%s:%d/%d", p->host, p->port, p->db);
	p->tick = event_new(base, -1, EV_PERSIST, tick_cb, p);
	struct timeval tv = clock_tv(PUB_TICK_US);
	event_add(p->tick, &tv);
	pub = p;
	log_info("reconcile: publishing unknown outcomes to redis %s, stream %s", p->label, p->stream);
}

void reconcile_publish_stop(void)
{
	publisher_free(pub);
	pub = NULL;
}
