/*
 * resolve: endpoint names to address sets (see resolve.h). A tick walks the registry's names
 * and starts the lookups that are due; a lookup carries (upstream id, name serial), never a
 * pointer, so a name forgotten meanwhile (reload, any thread) only makes its answer unused.
 * Only this file's thread calls upstream_name_set, always under the registry lock.
 */
#include <arpa/inet.h>
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <event2/dns.h>
#include <event2/event.h>

#include "base/clock.h"
#include "config/config.h"
#include "base/log.h"
#include "state/resolve.h"
#include "state/upstream.h"
#include "base/util.h"

#define TICK_US       (250 * 1000LL)
#define MAX_DUE       256
#define LOOKUP_MAGIC  0x1e50171eu
#define HOSTS_PATH    "/etc/hosts"

struct lookup {
	uint32_t magic;
	int up_id;
	uint64_t serial;
	int port;
	int pending;                    /* answers still to come: A and AAAA */
	bool ok;                        /* some family answered with records */
	int min_ttl;
	int n;
	struct sockaddr_storage addrs[MAX_ENDPOINTS];
	char host[256];
};

static struct event_base *r_base;
static struct evdns_base *r_dns;
static struct event *r_tick;
static char r_servers[8][64];
static int r_nservers = -1;

int64_t resolve_ttl_us(int ttl_s)
{
	int64_t us = (int64_t)ttl_s * 1000000;
	return us < RESOLVE_TTL_MIN_US ? RESOLVE_TTL_MIN_US
	       : us > RESOLVE_TTL_MAX_US ? RESOLVE_TTL_MAX_US : us;
}

static void add_addr(struct lookup *lk, int family, const void *in)
{
	if (lk->n >= MAX_ENDPOINTS)
		return;
	struct sockaddr_storage *ss = &lk->addrs[lk->n++];
	memset(ss, 0, sizeof(*ss));
	if (family == AF_INET) {
		struct sockaddr_in *s4 = (struct sockaddr_in *)ss;
		s4->sin_family = AF_INET;
		s4->sin_port = htons((uint16_t)lk->port);
		memcpy(&s4->sin_addr, in, 4);
	} else {
		struct sockaddr_in6 *s6 = (struct sockaddr_in6 *)ss;
		s6->sin6_family = AF_INET6;
		s6->sin6_port = htons((uint16_t)lk->port);
		memcpy(&s6->sin6_addr, in, 16);
	}
}

/* HOST's addresses from /etc/hosts into LK; whether it is listed there. */
static bool hosts_lookup(struct lookup *lk)
{
	FILE *f = fopen(HOSTS_PATH, "r");
	if (!f)
		return false;
	char line[1024];
	bool found = false;
	while (fgets(line, sizeof(line), f)) {
		char *hash = strchr(line, '#');
		if (hash)
			*hash = '\0';
		char *save = NULL, *addr = strtok_r(line, " \t\r\n", &save), *nm;
		unsigned char bin[16];
		int family = addr && strchr(addr, ':') ? AF_INET6 : AF_INET;
		if (!addr || inet_pton(family, addr, bin) != 1)
			continue;
		while ((nm = strtok_r(NULL, " \t\r\n", &save)))
			if (strcasecmp(nm, lk->host) == 0) {
				add_addr(lk, family, bin);
				found = true;
				break;
			}
	}
	fclose(f);
	return found;
}

/* A lookup ended (LK->ok: with LK's addresses): into the registry, and when to ask again. */
static void lookup_done(struct lookup *lk)
{
	int64_t now = clock_now_us();
	upstream_lock();
	struct ep_name *nm = upstream_name_find(lk->up_id, lk->serial);
	if (nm) {
		nm->looking = false;
		nm->answered = true;
		if (lk->ok && lk->n > 0) {
			int dropped = upstream_name_set(nm, lk->addrs, lk->n);
			if (dropped)
				log_warn("upstream %s: endpoint %s: %d addresses left out (at most %d per "
				         "upstream)", nm->up->name, nm->name, dropped, MAX_ENDPOINTS);
			nm->last_error[0] = '\0';
			nm->next_lookup_us = now + resolve_ttl_us(lk->min_ttl);
		} else {
			/* keep the last good addresses; ask again soon */
			if (!nm->last_error[0])
				log_warn("upstream %s: endpoint %s: lookup failed; keeping %d addresses",
				         nm->up->name, nm->name, __builtin_popcountll(atomic_load(&nm->addrs)));
			snprintf(nm->last_error, sizeof(nm->last_error), "lookup failed");
			nm->next_lookup_us = now + RESOLVE_TTL_MIN_US;
		}
	}
	upstream_unlock();
	lk->magic = 0;
	free(lk);
}

static void dns_cb(int result, char type, int count, int ttl, void *addresses, void *arg)
{
	struct lookup *lk = arg;
	MAGIC_CHECK(lk, LOOKUP_MAGIC);
	if (result == DNS_ERR_NONE && count > 0 && (type == DNS_IPv4_A || type == DNS_IPv6_AAAA)) {
		for (int i = 0; i < count; i++)
			add_addr(lk, type == DNS_IPv4_A ? AF_INET : AF_INET6,
			         (const char *)addresses + (size_t)i * (type == DNS_IPv4_A ? 4 : 16));
		if (!lk->ok || ttl < lk->min_ttl)
			lk->min_ttl = ttl;
		lk->ok = true;
	}
	if (--lk->pending == 0)
		lookup_done(lk);
}

struct due {
	struct lookup *lk[MAX_DUE];
	int n;
	int64_t now;
	bool unanswered;
};

static void due_cb(void *arg, struct ep_name *nm, int up_id)
{
	struct due *d = arg;
	if (!nm->answered)
		d->unanswered = true;
	if (nm->looking || nm->next_lookup_us > d->now || d->n >= MAX_DUE)
		return;
	struct lookup *lk = xcalloc(1, sizeof(*lk));
	lk->magic = LOOKUP_MAGIC;
	lk->up_id = up_id;
	lk->serial = nm->serial;
	if (split_host_port(nm->name, lk->host, sizeof(lk->host), &lk->port) != 0) {
		nm->answered = true;
		nm->next_lookup_us = INT64_MAX;
		free(lk);
		return;
	}
	nm->looking = true;
	d->lk[d->n++] = lk;
}

/* Start the lookups that are due (outside the registry lock: evdns may answer at once). */
static bool resolve_due(void)
{
	struct due d = { .n = 0, .now = clock_now_us(), .unanswered = false };
	upstream_names_walk(due_cb, &d);
	for (int i = 0; i < d.n; i++) {
		struct lookup *lk = d.lk[i];
		if (hosts_lookup(lk)) {
			lk->ok = true;
			lk->min_ttl = (int)(RESOLVE_HOSTS_TTL_US / 1000000);
			lookup_done(lk);
			continue;
		}
		/* A, AAAA, and one for us: an answer given at once cannot end it under our feet */
		lk->pending = 3;
		if (!evdns_base_resolve_ipv4(r_dns, lk->host, 0, dns_cb, lk))
			lk->pending--;
		if (!evdns_base_resolve_ipv6(r_dns, lk->host, 0, dns_cb, lk))
			lk->pending--;
		if (--lk->pending == 0)
			lookup_done(lk);
	}
	return d.unanswered;
}

static void tick_cb(evutil_socket_t fd, short what, void *arg)
{
	resolve_due();
	upstream_sweep(clock_now_us());
	struct timeval tv = clock_tv(TICK_US);
	evtimer_add(r_tick, &tv);
}

static void set_servers(const struct config *cfg)
{
	bool same = r_nservers == cfg->nresolvers;
	for (int i = 0; same && i < cfg->nresolvers; i++)
		same = strcmp(r_servers[i], cfg->resolvers[i]) == 0;
	if (same)
		return;
	evdns_base_clear_nameservers_and_suspend(r_dns);
	if (cfg->nresolvers == 0)
		evdns_base_resolv_conf_parse(r_dns, DNS_OPTIONS_ALL, "/etc/resolv.conf");
	r_nservers = 0;
	for (int i = 0; i < cfg->nresolvers && i < 8; i++) {
		if (evdns_base_nameserver_ip_add(r_dns, cfg->resolvers[i]) != 0)
			log_warn("resolvers: %s cannot be used", cfg->resolvers[i]);
		snprintf(r_servers[r_nservers++], sizeof(r_servers[0]), "%s", cfg->resolvers[i]);
	}
	r_nservers = cfg->nresolvers;
	evdns_base_resume(r_dns);
}

int resolve_start(struct event_base *base, const struct config *cfg)
{
	r_base = base;
	r_dns = evdns_base_new(base, 0);
	if (!r_dns)
		return -1;
	/* a server that does not answer: ask again within the minimum TTL */
	evdns_base_set_option(r_dns, "timeout:", "1");
	evdns_base_set_option(r_dns, "attempts:", "2");
	set_servers(cfg);
	r_tick = evtimer_new(base, tick_cb, NULL);
	tick_cb(-1, 0, NULL);
	return 0;
}

void resolve_reconfigure(const struct config *cfg)
{
	if (!r_dns)
		return;
	set_servers(cfg);
	resolve_due();
}

void resolve_settle(struct event_base *base, int64_t timeout_us)
{
	int64_t end = clock_now_us() + timeout_us;
	while (resolve_due() && clock_now_us() < end)
		event_base_loop(base, EVLOOP_ONCE);
}

void resolve_stop(void)
{
	if (r_tick)
		event_free(r_tick);
	r_tick = NULL;
	if (r_dns)
		evdns_base_free(r_dns, 1);  /* pending lookups are answered (cancelled) now */
	r_dns = NULL;
}
