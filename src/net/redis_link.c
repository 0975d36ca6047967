/*
 * redis_link: the life cycle of one async hiredis connection on a libevent loop, for one owner
 * (see redis_link.h for what it offers).
 *
 * States:  DOWN (backoff timer) -> [RESOLVING ->] CONNECTING -> UP
 *          any error -> DOWN, backoff from backoff_min doubling to backoff_max, with jitter in
 *          [backoff/2, backoff] (owners and replicas do not reconnect in lockstep), reset
 *          only once a handshake has been answered: a server that accepts TCP and refuses
 *          AUTH is retried with a growing backoff and logged once.
 * The one timer is, by state: DOWN the backoff; CONNECTING before the TCP connect answered
 * the connect timeout; after it, the reply watchdog (reply_timeout_us, when set).
 *
 * Invariants:
 *  - `ac` is non-NULL exactly in CONNECTING and UP. The first sign of a dead connection (a NULL
 *    reply, a failed connect, a disconnect) or a drop clears it before hiredis frees the
 *    context, so nothing is sent to a dying context and its later signs are ignored.
 *  - Every command is a struct cmd from redis_link_command() until its callback has run, which
 *    happens once: from hiredis (a reply, or NULL when its context goes), or from the `failed`
 *    list, drained by an event on the loop (a command the link could not send).
 *  - ops->down runs before the callbacks of the commands lost with the connection, once per
 *    failure; the outage is logged once (`down`), its end once.
 *  - While `closing` (redis_link_free), nothing is logged and the owner hears no news but the
 *    commands' NULL replies.
 */
#include "net/redis_link.h"
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
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/queue.h>

#define LINK_MAGIC      0x4ed15c0bu
#define SHA_HEX         40
#define ARGV_ON_STACK   32

struct cmd {
	struct redis_link *l;
	redis_reply_fn fn;          /* NULL: a handshake command of the link's own */
	void *arg;
	bool script;                /* an EVALSHA: NOSCRIPT means the cache was flushed */
	TAILQ_ENTRY(cmd) link;      /* in l->failed */
};

struct redis_link {
	uint32_t magic;
	enum redis_link_state state;
	struct redis_link_cfg cfg;  /* strings below are our copies */
	const struct redis_link_ops *ops;
	void *owner;
	struct event_base *base;
	struct evdns_base *dns;     /* borrowed */
	struct evdns_getaddrinfo_request *dns_req;
	unsigned addr_turn;         /* which resolved address the next connect uses */
	char label[300];
	char (*sha)[SHA_HEX + 1];   /* of each script */
	redisAsyncContext *ac;      /* non-NULL in CONNECTING and UP */
	bool connected;             /* the TCP connect of `ac` answered */
	struct event *timer;
	struct event *fail_ev;      /* drains `failed` */
	TAILQ_HEAD(, cmd) failed;
	int64_t backoff_us;
	uint64_t rng;               /* backoff jitter */
	int due;                    /* replies `ac` owes us */
	int64_t progress_us;        /* the last reply, or when `due` left 0 */
	bool down;                  /* an outage was logged: log the recovery, not each failure */
	bool closing;
};

/* what each handshake command's failure is called; the PING's is also its identity */
static const char auth_failed[] = "AUTH failed";
static const char select_failed[] = "SELECT failed";
static const char load_failed[] = "SCRIPT LOAD failed";
static const char ping_failed[] = "PING failed";

static void set_timer(struct event *ev, int64_t us)
{
	struct timeval tv = clock_tv(us);
	evtimer_add(ev, &tv);
}

bool redis_link_host_is_ip(const char *host)
{
	unsigned char a[sizeof(struct in6_addr)];
	return inet_pton(AF_INET, host, a) == 1 || inet_pton(AF_INET6, host, a) == 1;
}

/* ------------------------------------------------------------------ going down */

void redis_link_log_down(struct redis_link *l, const char *what, const char *detail)
{
	if (l->closing)
		return;
	if (!l->down)
		log_warn("%s %s: %s%s%s; %s", l->cfg.who, l->label, what, detail ? ": " : "",
		         detail ? detail : "", l->cfg.down_note);
	else
		log_debug("%s %s: %s%s%s", l->cfg.who, l->label, what, detail ? ": " : "",
		          detail ? detail : "");
	l->down = true;
}

/* DOWN with the backoff running; then the owner hears of it. */
static void backoff(struct redis_link *l)
{
	l->state = REDIS_LINK_DOWN;
	l->connected = false;
	l->due = 0;
	int64_t wait = l->backoff_us / 2 +
	               (int64_t)(rand_next(&l->rng) % (uint64_t)(l->backoff_us / 2 + 1));
	set_timer(l->timer, wait);
	l->backoff_us = l->backoff_us * 2 > l->cfg.backoff_max_us ? l->cfg.backoff_max_us :
	                                                            l->backoff_us * 2;
	if (!l->closing && l->ops->down)
		l->ops->down(l->owner, l);
}

/* AC showed it is dead (hiredis frees it itself): forget it, once. */
static void lost(struct redis_link *l, const redisAsyncContext *ac, const char *what)
{
	if (l->ac != ac || !ac)
		return;
	redis_link_log_down(l, what, ac->c.errstr[0] ? ac->c.errstr : NULL);
	l->ac = NULL;
	backoff(l);
}

void redis_link_drop(struct redis_link *l, const char *what, const char *detail)
{
	redisAsyncContext *ac = l->ac;
	redis_link_log_down(l, what, detail);
	if (!ac)
		return;     /* already down, or resolving: nothing to give up */
	l->ac = NULL;
	backoff(l);
	redisAsyncFree(ac);     /* now, or when the hiredis callback we are in returns */
}

/* ------------------------------------------------------------------ commands */

static void fail_cb(evutil_socket_t fd, short what, void *arg)
{
	struct redis_link *l = arg;
	MAGIC_CHECK(l, LINK_MAGIC);
	while (!TAILQ_EMPTY(&l->failed)) {
		struct cmd *c = TAILQ_FIRST(&l->failed);
		TAILQ_REMOVE(&l->failed, c, link);
		c->fn(l->owner, c->arg, NULL);
		free(c);
	}
}

static void watch(struct redis_link *l)
{
	if (l->cfg.reply_timeout_us && l->connected && l->due > 0 && !evtimer_pending(l->timer, NULL))
		set_timer(l->timer, l->progress_us + l->cfg.reply_timeout_us - clock_now_us());
}

static void setup_reply(struct redis_link *l, const char *what, redisReply *reply);

static void reply_cb(redisAsyncContext *ac, void *r, void *priv)
{
	struct cmd *c = priv;
	struct redis_link *l = c->l;
	redisReply *reply = r;

	MAGIC_CHECK(l, LINK_MAGIC);
	if (!reply) {
		lost(l, ac, "connection lost");
	} else if (ac == l->ac) {
		l->due--;
		l->progress_us = clock_now_us();
	}
	if (!c->fn) {
		if (reply && ac == l->ac)
			setup_reply(l, c->arg, reply);
	} else {
		if (c->script && reply && ac == l->ac && reply->type == REDIS_REPLY_ERROR &&
		    strncmp(reply->str, "NOSCRIPT", 8) == 0)
			redis_link_drop(l, "script cache flushed", NULL);
		c->fn(l->owner, c->arg, reply);
	}
	free(c);
}

static void send_cmd(struct redis_link *l, int argc, const char **argv, const size_t *lens,
                     redis_reply_fn fn, void *arg, bool script)
{
	struct cmd *c = xmalloc(sizeof *c);

	c->l = l;
	c->fn = fn;
	c->arg = arg;
	c->script = script;
	if (!l->ac || redisAsyncCommandArgv(l->ac, reply_cb, c, argc, argv, lens) != REDIS_OK) {
		TAILQ_INSERT_TAIL(&l->failed, c, link);
		event_active(l->fail_ev, 0, 0);
		return;
	}
	if (l->due++ == 0)
		l->progress_us = clock_now_us();
	watch(l);
}

void redis_link_command(struct redis_link *l, int argc, const char **argv, const size_t *lens,
                        redis_reply_fn fn, void *arg)
{
	send_cmd(l, argc, argv, lens, fn, arg, false);
}

void redis_link_flush(struct redis_link *l)
{
	int done;

	/* redisBufferWrite, not redisAsyncHandleWrite: an error here runs no callback (the
	 * caller may be in the middle of its own work); the armed write event meets it */
	if (l->ac && l->connected)
		(void)redisBufferWrite(&l->ac->c, &done);
}

void redis_link_script(struct redis_link *l, int script, int nkeys, int argc, const char **argv,
                       const size_t *lens, redis_reply_fn fn, void *arg)
{
	const char *sv[ARGV_ON_STACK];
	size_t sl[ARGV_ON_STACK];
	int n = argc + 3;
	const char **av = n <= ARGV_ON_STACK ? sv : xmalloc((size_t)n * sizeof *av);
	size_t *al = n <= ARGV_ON_STACK ? sl : xmalloc((size_t)n * sizeof *al);
	char keys[16];

	av[0] = "EVALSHA", al[0] = 7;
	av[1] = l->sha[script], al[1] = SHA_HEX;
	al[2] = (size_t)snprintf(keys, sizeof keys, "%d", nkeys), av[2] = keys;
	memcpy(av + 3, argv, (size_t)argc * sizeof *av);
	memcpy(al + 3, lens, (size_t)argc * sizeof *al);
	send_cmd(l, n, av, al, fn, arg, true);
	if (av != sv) {
		free(av);
		free(al);
	}
}

/* ------------------------------------------------------------------ connecting */

/* The replies to AUTH, SELECT, SCRIPT LOAD and the closing PING, on the live connection: an
 * error makes it useless; the PING's answer proves the whole handshake worked. */
static void setup_reply(struct redis_link *l, const char *what, redisReply *reply)
{
	if (reply->type == REDIS_REPLY_ERROR) {
		redis_link_drop(l, what, reply->str);
		return;
	}
	if (what == ping_failed) {
		l->state = REDIS_LINK_UP;
		l->backoff_us = l->cfg.backoff_min_us;
		if (l->down)
			log_info("%s %s: connected%s%s", l->cfg.who, l->label,
			         l->cfg.up_note ? "; " : "", l->cfg.up_note ? l->cfg.up_note : "");
		l->down = false;
		if (l->ops->up)
			l->ops->up(l->owner, l);
	}
}

static void send_setup(struct redis_link *l, int argc, const char **argv, const size_t *lens,
                       const char *what)
{
	send_cmd(l, argc, argv, lens, NULL, (void *)what, false);
}

static void handshake(struct redis_link *l)
{
	const char *pass = l->cfg.password, *user = l->cfg.user;

	if (pass) {
		const char *argv[] = { "AUTH", user ? user : pass, pass };
		size_t lens[] = { 4, strlen(argv[1]), strlen(pass) };
		send_setup(l, user ? 3 : 2, argv, lens, auth_failed);
	}
	if (l->cfg.db) {
		char db[16];
		int n = snprintf(db, sizeof db, "%d", l->cfg.db);
		const char *argv[] = { "SELECT", db };
		size_t lens[] = { 6, (size_t)n };
		send_setup(l, 2, argv, lens, select_failed);
	}
	for (int i = 0; i < l->cfg.nscripts; i++) {
		const char *argv[] = { "SCRIPT", "LOAD", l->cfg.scripts[i] };
		size_t lens[] = { 6, 4, strlen(l->cfg.scripts[i]) };
		send_setup(l, 3, argv, lens, load_failed);
	}
	const char *argv[] = { "PING" };
	size_t lens[] = { 4 };
	send_setup(l, 1, argv, lens, ping_failed);
}

static void connect_cb(const redisAsyncContext *ac, int status)
{
	struct redis_link *l = ac->data;

	MAGIC_CHECK(l, LINK_MAGIC);
	if (l->ac != ac)
		return;
	if (status != REDIS_OK) {
		lost(l, ac, "connect failed");
		return;
	}
	l->connected = true;
	evtimer_del(l->timer);
	l->progress_us = clock_now_us();
	watch(l);
	redisEnableKeepAlive((redisContext *)&ac->c);
}

static void disconnect_cb(const redisAsyncContext *ac, int status)
{
	struct redis_link *l = ac->data;

	MAGIC_CHECK(l, LINK_MAGIC);
	lost(l, ac, "connection lost");
}

/* Opens the connection to IP (a literal), queues the handshake, and lets the owner add to it. */
static void connect_ip(struct redis_link *l, const char *ip)
{
	redisAsyncContext *ac = redisAsyncConnect(ip, l->cfg.port);

	if (!ac || ac->err) {
		redis_link_log_down(l, "connect failed", ac ? ac->c.errstr : "out of memory");
		if (ac)
			redisAsyncFree(ac);
		backoff(l);
		return;
	}
	ac->data = l;
	if (redisLibeventAttach(ac, l->base) != REDIS_OK) {
		redisAsyncFree(ac);
		redis_link_log_down(l, "connect failed", "cannot attach to the event loop");
		backoff(l);
		return;
	}
	redisAsyncSetConnectCallback(ac, connect_cb);
	redisAsyncSetDisconnectCallback(ac, disconnect_cb);
	l->ac = ac;
	l->state = REDIS_LINK_CONNECTING;
	l->connected = false;
	l->due = 0;
	set_timer(l->timer, l->cfg.connect_timeout_us);
	handshake(l);
	if (l->ops->open)
		l->ops->open(l->owner, l);
}

static void dns_cb(int result, struct evutil_addrinfo *res, void *arg)
{
	/* a cancel comes only from redis_link_free, after which ARG is gone: do not touch it */
	if (result == EVUTIL_EAI_CANCEL)
		return;
	struct redis_link *l = arg;
	MAGIC_CHECK(l, LINK_MAGIC);
	l->dns_req = NULL;
	if (l->state != REDIS_LINK_RESOLVING) {
		evutil_freeaddrinfo(res);
		return;
	}
	if (result != 0 || !res) {
		redis_link_log_down(l, "cannot resolve", evutil_gai_strerror(result));
		if (res)
			evutil_freeaddrinfo(res);
		backoff(l);
		return;
	}
	/* take the addresses in turn across reconnects, so a dead one is not retried forever */
	unsigned n = 0;
	for (struct evutil_addrinfo *a = res; a; a = a->ai_next)
		n++;
	struct evutil_addrinfo *a = res;
	for (unsigned i = l->addr_turn++ % n; i; i--)
		a = a->ai_next;
	char ip[INET6_ADDRSTRLEN] = "";
	const void *sa = a->ai_family == AF_INET6 ?
	        (const void *)&((const struct sockaddr_in6 *)a->ai_addr)->sin6_addr :
	        (const void *)&((const struct sockaddr_in *)a->ai_addr)->sin_addr;
	evutil_inet_ntop(a->ai_family, sa, ip, sizeof ip);
	evutil_freeaddrinfo(res);
	connect_ip(l, ip);
}

static void start(struct redis_link *l)
{
	if (!l->dns) {
		connect_ip(l, l->cfg.host);
		return;
	}
	struct evutil_addrinfo hints;
	char port[8];
	memset(&hints, 0, sizeof hints);
	hints.ai_family = AF_UNSPEC;
	hints.ai_socktype = SOCK_STREAM;
	hints.ai_protocol = IPPROTO_TCP;
	hints.ai_flags = EVUTIL_AI_ADDRCONFIG;
	snprintf(port, sizeof port, "%d", l->cfg.port);
	l->state = REDIS_LINK_RESOLVING;
	/* the answer may come before this returns (hosts file), then NULL comes back */
	struct evdns_getaddrinfo_request *req =
	        evdns_getaddrinfo(l->dns, l->cfg.host, port, &hints, dns_cb, l);
	if (req)
		l->dns_req = req;
}

static void timer_cb(evutil_socket_t fd, short what, void *arg)
{
	struct redis_link *l = arg;

	MAGIC_CHECK(l, LINK_MAGIC);
	if (l->state == REDIS_LINK_DOWN)
		start(l);
	else if (l->ac && !l->connected)
		redis_link_drop(l, "connect timed out", NULL);
	else if (l->ac && l->cfg.reply_timeout_us && l->due > 0 &&
	         clock_now_us() - l->progress_us >= l->cfg.reply_timeout_us)
		redis_link_drop(l, "no reply in time", NULL);
	else
		watch(l);
}

/* ------------------------------------------------------------------ life */

static void sha1_hex(char out[SHA_HEX + 1], const char *s)
{
	static const char hex[] = "0123456789abcdef";
	unsigned char md[EVP_MAX_MD_SIZE];
	unsigned n = 0;

	if (EVP_Digest(s, strlen(s), md, &n, EVP_sha1(), NULL) != 1 || n * 2 != SHA_HEX)
		abort();    /* only on out-of-memory */
	for (unsigned i = 0; i < n; i++) {
		out[2 * i] = hex[md[i] >> 4];
		out[2 * i + 1] = hex[md[i] & 15];
	}
	out[SHA_HEX] = '\0';
}

struct redis_link *redis_link_new(struct event_base *base, struct evdns_base *dns,
                                  const struct redis_link_cfg *cfg,
                                  const struct redis_link_ops *ops, void *owner,
                                  const char **err)
{
	bool ip = redis_link_host_is_ip(cfg->host);

	if (!ip && !dns) {
		if (err)
			*err = "the redis host is a name and no DNS base was given";
		return NULL;
	}
	struct redis_link *l = xcalloc(1, sizeof *l);
	l->magic = LINK_MAGIC;
	l->cfg = *cfg;
	l->cfg.host = xstrdup(cfg->host);
	l->cfg.user = cfg->user ? xstrdup(cfg->user) : NULL;
	l->cfg.password = cfg->password ? xstrdup(cfg->password) : NULL;
	l->ops = ops;
	l->owner = owner;
	l->base = base;
	l->dns = ip ? NULL : dns;
	snprintf(l->label, sizeof l->label, strchr(cfg->host, ':') ? "redis [%s]:%d/%d" :
	         "redis %s:%d/%d", cfg->host, cfg->port, cfg->db);
	if (cfg->nscripts > 0) {
		l->sha = xmalloc((size_t)cfg->nscripts * sizeof *l->sha);
		for (int i = 0; i < cfg->nscripts; i++)
			sha1_hex(l->sha[i], cfg->scripts[i]);
	}
	l->backoff_us = cfg->backoff_min_us;
	l->rng = (uint64_t)clock_now_us() * 0x9e3779b97f4a7c15ull | 1;
	l->timer = evtimer_new(base, timer_cb, l);
	l->fail_ev = event_new(base, -1, 0, fail_cb, l);
	if (!l->timer || !l->fail_ev)
		abort();    /* only on out-of-memory */
	TAILQ_INIT(&l->failed);
	start(l);
	return l;
}

void redis_link_free(struct redis_link *l)
{
	if (!l)
		return;
	l->closing = true;
	if (l->dns_req)
		evdns_getaddrinfo_cancel(l->dns_req);   /* its callback returns untouched */
	if (l->ac) {
		redisAsyncContext *ac = l->ac;
		l->ac = NULL;
		redisAsyncFree(ac);     /* the commands in flight get their NULL replies */
	}
	fail_cb(-1, 0, l);
	event_free(l->fail_ev);
	event_free(l->timer);
	free((char *)l->cfg.host);
	free((char *)l->cfg.user);
	free((char *)l->cfg.password);
	free(l->sha);
	l->magic = 0;
	free(l);
}

enum redis_link_state redis_link_state(const struct redis_link *l)
{
	return l->state;
}

const char *redis_link_label(const struct redis_link *l)
{
	return l->label;
}

void redis_link_set_connect_timeout(struct redis_link *l, int64_t us)
{
	l->cfg.connect_timeout_us = us;
}
