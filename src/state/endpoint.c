/*
 * endpoint: the address slots of one upstream and the per-slot operations (see endpoint.h).
 *
 * Everything that changes a table (bind, unbind, set, sweep) runs under the registry lock, so
 * plain fields and the serial counter need no atomics; what workers read concurrently (life,
 * serial, a name's address set, the slot pointers) is stored atomically, the address set last.
 */
#include <stdio.h>
#include <sys/time.h>
#include <stdlib.h>
#include <string.h>

#include <event2/util.h>

#include "base/clock.h"
#include "base/util.h"
#include "policy/outlier.h"
#include "state/endpoint.h"

static uint64_t ep_serial_last;     /* names and slots alike; under the registry lock */

void ep_table_init(struct ep_table *t, struct upstream_state *up)
{
	memset(t, 0, sizeof(*t));
	t->up = up;
}

void ep_table_free(struct ep_table *t)
{
	while (t->unindexed) {
		struct ep_state *ep = t->unindexed;
		t->unindexed = ep->next_unindexed;
		free(ep);
	}
	for (int i = 0; i < MAX_ENDPOINTS; i++) {
		free(atomic_load(&t->eps[i]));
		if (t->names[i]) {
			free(t->names[i]->name);
			free(t->names[i]);
		}
	}
}

static bool slot_unreferenced(struct ep_state *ep, int64_t now_us)
{
	return atomic_load(&ep->life) == EPL_RETIRED && atomic_load(&ep->in_flight) == 0 &&
	       atomic_load(&ep->refs) == 0 && now_us - ep->retired_us >= EP_GRACE_US;
}

/* The slot for a new address at index *INDEX, not yet in the table: a FREE one (its memory
 * nobody references), or new memory at an unused index or at the index of the oldest retired
 * slot, which gives it up. NULL when all MAX_ENDPOINTS indexes hold LIVE addresses. */
static struct ep_state *slot_take(struct ep_table *t, int *index)
{
	int oldest = -1;
	for (int i = 0; i < MAX_ENDPOINTS; i++) {
		struct ep_state *ep = atomic_load(&t->eps[i]);
		int life = ep ? atomic_load(&ep->life) : EPL_FREE;
		if (!ep || life == EPL_FREE) {
			*index = i;
			return ep ? ep : xcalloc(1, sizeof(*ep));
		}
		if (life == EPL_RETIRED &&
		    (oldest < 0 || ep->retired_us < atomic_load(&t->eps[oldest])->retired_us))
			oldest = i;
	}
	if (oldest < 0)
		return NULL;
	/* it may still be read or have attempts in flight: kept, unindexed, until the sweep */
	struct ep_state *old = atomic_load(&t->eps[oldest]);
	old->next_unindexed = t->unindexed;
	t->unindexed = old;
	*index = oldest;
	return xcalloc(1, sizeof(*old));
}

/* Make slot EP the LIVE address SA of name NM at INDEX: a fresh identity, no history. Nobody
 * references EP (slot_take), and it is published at INDEX only once filled in. */
static void slot_init(struct ep_table *t, struct ep_state *ep, int index, struct ep_name *nm,
                      const struct sockaddr_storage *sa)
{
	memset(ep, 0, sizeof(*ep));
	ep->index = index;
	ep->up = t->up;
	ep->name_index = nm->index;
	memcpy(&ep->addr, sa, sizeof(*sa));
	ep->addrlen = sa->ss_family == AF_INET6 ? (int)sizeof(struct sockaddr_in6)
	                                        : (int)sizeof(struct sockaddr_in);
	snprintf(ep->host, sizeof(ep->host), "%s", nm->name);
	if (nm->literal) {
		snprintf(ep->name, sizeof(ep->name), "%s", nm->name);
	} else {
		char ip[64] = "";
		const void *in = sa->ss_family == AF_INET6
		                 ? (const void *)&((const struct sockaddr_in6 *)sa)->sin6_addr
		                 : (const void *)&((const struct sockaddr_in *)sa)->sin_addr;
		evutil_inet_ntop(sa->ss_family, in, ip, sizeof(ip));
		snprintf(ep->name, sizeof(ep->name), "%s/%s", nm->name, ip);
	}
	atomic_store(&ep->serial, ++ep_serial_last);
	atomic_store(&ep->life, EPL_LIVE);
	atomic_store_explicit(&t->eps[index], ep, memory_order_release);
}

static void slot_retire(struct ep_state *ep, int64_t now)
{
	ep->retired_us = now;
	atomic_store(&ep->life, EPL_RETIRED);
}

static bool same_addr(const struct sockaddr_storage *a, const struct sockaddr_storage *b)
{
	if (a->ss_family != b->ss_family)
		return false;
	if (a->ss_family == AF_INET6)
		return !memcmp(&((const struct sockaddr_in6 *)a)->sin6_addr,
		               &((const struct sockaddr_in6 *)b)->sin6_addr, 16) &&
		       ((const struct sockaddr_in6 *)a)->sin6_port ==
		       ((const struct sockaddr_in6 *)b)->sin6_port;
	return ((const struct sockaddr_in *)a)->sin_addr.s_addr ==
	       ((const struct sockaddr_in *)b)->sin_addr.s_addr &&
	       ((const struct sockaddr_in *)a)->sin_port == ((const struct sockaddr_in *)b)->sin_port;
}

/* Whether ADDR is the address of one of the slots in MASK. */
static bool in_slots(struct ep_table *t, uint64_t mask, const struct sockaddr_storage *addr)
{
	for (; mask; mask &= mask - 1)
		if (same_addr(&t->eps[__builtin_ctzll(mask)]->addr, addr))
			return true;
	return false;
}

int upstream_name_set(struct ep_name *nm, const struct sockaddr_storage *addrs, int n)
{
	struct ep_table *t = nm->tab;
	uint64_t old = atomic_load(&nm->addrs), keep = 0, add = 0;
	int64_t now = clock_now_us();
	int dropped = 0;
	for (int i = 0; i < MAX_ENDPOINTS; i++)
		for (int j = 0; j < n && ((old >> i) & 1) && !((keep >> i) & 1); j++)
			if (same_addr(&t->eps[i]->addr, &addrs[j]))
				keep |= 1ull << i;
	/* the gone ones first, so that their indexes can go to the new ones */
	for (int i = 0; i < MAX_ENDPOINTS; i++)
		if (((old & ~keep) >> i) & 1)
			slot_retire(t->eps[i], now);
	for (int j = 0; j < n; j++) {
		if (in_slots(t, keep | add, &addrs[j]))
			continue;
		int index;
		struct ep_state *ep = slot_take(t, &index);
		if (!ep) {
			dropped++;
			continue;
		}
		slot_init(t, ep, index, nm, &addrs[j]);
		add |= 1ull << index;
	}
	atomic_store(&nm->addrs, keep | add);
	return dropped;
}

struct ep_name *ep_name_bind(struct ep_table *t, const char *name)
{
	int free_index = -1;
	for (int i = 0; i < MAX_ENDPOINTS; i++) {
		struct ep_name *nm = t->names[i];
		if (nm && strcmp(nm->name, name) == 0) {
			nm->refs++;
			return nm;
		}
		if (!nm && free_index < 0)
			free_index = i;
	}
	if (free_index < 0)
		return NULL;
	struct ep_name *nm = xcalloc(1, sizeof(*nm));
	nm->name = xstrdup(name);
	nm->up = t->up;
	nm->tab = t;
	nm->index = free_index;
	nm->serial = ++ep_serial_last;
	nm->refs = 1;
	struct sockaddr_storage sa;
	int len = sizeof(sa);
	memset(&sa, 0, sizeof(sa));
	if (evutil_parse_sockaddr_port(name, (struct sockaddr *)&sa, &len) == 0) {
		nm->literal = true;
		nm->answered = true;
		if (upstream_name_set(nm, &sa, 1) > 0) {
			free(nm->name);
			free(nm);
			return NULL;
		}
	}
	t->names[free_index] = nm;
	return nm;
}

void ep_name_unbind(struct ep_name *nm)
{
	if (--nm->refs > 0)
		return;
	upstream_name_set(nm, NULL, 0);
	nm->tab->names[nm->index] = NULL;
	free(nm->name);
	free(nm);
}

struct ep_state *ep_table_find(struct ep_table *t, int index, uint64_t serial)
{
	struct ep_state *ep = index >= 0 && index < MAX_ENDPOINTS ? atomic_load(&t->eps[index]) : NULL;
	return ep && atomic_load(&ep->serial) == serial && atomic_load(&ep->life) != EPL_FREE ? ep
	                                                                                   : NULL;
}

bool ep_table_sweep(struct ep_table *t, int64_t now_us)
{
	bool forgot = false;
	for (int i = 0; i < MAX_ENDPOINTS; i++) {
		struct ep_state *ep = atomic_load(&t->eps[i]);
		if (ep && slot_unreferenced(ep, now_us)) {
			atomic_store(&ep->life, EPL_FREE);
			forgot = true;
		}
	}
	for (struct ep_state **pp = &t->unindexed; *pp;) {
		struct ep_state *ep = *pp;
		if (slot_unreferenced(ep, now_us)) {
			*pp = ep->next_unindexed;
			free(ep);
			forgot = true;
		} else {
			pp = &ep->next_unindexed;
		}
	}
	return forgot;
}

int ep_table_stats(struct ep_table *t, struct stats_endpoint *eps)
{
	int n = 0;
	for (int i = 0; i < MAX_ENDPOINTS; i++) {
		struct ep_state *ep = atomic_load(&t->eps[i]);
		int life = ep ? atomic_load(&ep->life) : EPL_FREE;
		if (life == EPL_FREE)
			continue;
		struct ep_name *nm = life == EPL_LIVE ? t->names[ep->name_index] : NULL;
		eps[n++] = (struct stats_endpoint){
			.name = ep->name,
			.configured = nm ? nm->name : ep->host,
			.hold_until_us = atomic_load(&ep->hold_until_us),
			.eject_until_us = atomic_load(&ep->eject_until_us),
			.probe_down = atomic_load(&ep->probe_down),
			.retired = life == EPL_RETIRED,
			.attempts = atomic_load(&ep->attempts),
			.ejections = atomic_load(&ep->ejections),
			.in_flight = atomic_load(&ep->in_flight),
			.last_failure = atomic_load(&ep->last_failure),
			.last_failure_wall_us = atomic_load(&ep->last_failure_wall_us),
			.hold_refusals = atomic_load(&ep->hold_refusals),
		};
	}
	return n;
}

int ep_table_slots(struct ep_table *t, uint64_t mask, struct ep_state **eps)
{
	int n = 0;
	for (; mask; mask &= mask - 1)      /* the set bits only: asked twice per request */
		eps[n++] = atomic_load_explicit(&t->eps[__builtin_ctzll(mask)], memory_order_acquire);
	return n;
}

void upstream_ep_keep(struct ep_state **slot, struct ep_state *ep)
{
	if (ep)
		atomic_fetch_add_explicit(&ep->refs, 1, memory_order_relaxed);
	if (*slot)
		atomic_fetch_sub_explicit(&(*slot)->refs, 1, memory_order_release);
	*slot = ep;
}

void upstream_hold(struct ep_state *ep, int64_t until_us)
{
	int64_t cur = atomic_load(&ep->hold_until_us);
	while (cur < until_us && !atomic_compare_exchange_weak(&ep->hold_until_us, &cur, until_us))
		;
}

void upstream_ep_failure_grpc(struct ep_state *ep, int code)
{
	atomic_store(&ep->last_failure, STATS_FAILURE_GRPC + code);
}

void upstream_ep_hold_refused(struct ep_state *ep)
{
	atomic_fetch_add_explicit(&ep->hold_refusals, 1, memory_order_relaxed);
}

bool upstream_ep_usable(struct ep_state *ep, uint64_t serial)
{
	return atomic_load(&ep->life) == EPL_LIVE && atomic_load(&ep->serial) == serial;
}

void upstream_ep_attempt_begin(struct ep_state *ep)
{
	atomic_fetch_add_explicit(&ep->in_flight, 1, memory_order_relaxed);
	atomic_fetch_add_explicit(&ep->attempts, 1, memory_order_relaxed);
}

void upstream_ep_attempt_end(struct ep_state *ep)
{
	atomic_fetch_sub_explicit(&ep->in_flight, 1, memory_order_relaxed);
}

struct ep_state *upstream_ep_pick(struct ep_state *const *eps, int n, enum balance_mode mode,
                                  bool retry, uint64_t rr, uint64_t rnd, uint64_t tried,
                                  int64_t now_us)
{
	struct balance_view v[MAX_ENDPOINTS];
	for (int i = 0; i < n && i < MAX_ENDPOINTS; i++) {
		const struct ep_state *ep = eps[i];
		v[i].eject_until_us = atomic_load_explicit(&ep->probe_down, memory_order_relaxed)
		                      ? INT64_MAX
		                      : atomic_load_explicit(&ep->eject_until_us, memory_order_relaxed);
		v[i].hold_until_us = atomic_load_explicit(&ep->hold_until_us, memory_order_relaxed);
		v[i].in_flight = atomic_load_explicit(&ep->in_flight, memory_order_relaxed);
		v[i].tried = (tried >> ep->index) & 1;
	}
	return eps[balance_choose(v, n, mode, retry, rr, rnd, now_us)];
}

static bool is_ejected(const struct ep_state *ep, int64_t now_us)
{
	return atomic_load(&ep->eject_until_us) > now_us || atomic_load(&ep->probe_down);
}

bool upstream_ep_report(const struct cfg_health *h, struct ep_state *const *eps, int n,
                        struct ep_state *ep, enum outcome out, int status, bool hinted,
                        int64_t now_us)
{
	if (!outlier_is_failure(out, status, hinted)) {
		if (out == OUT_STATUS)
			atomic_store_explicit(&ep->consecutive_failures, 0, memory_order_relaxed);
		return false;
	}
	atomic_store(&ep->last_failure, out == OUT_STATUS ? status : (int)out);
	struct timeval tv;
	gettimeofday(&tv, NULL);
	atomic_store(&ep->last_failure_wall_us, (int64_t)tv.tv_sec * 1000000 + tv.tv_usec);
	int fails = atomic_fetch_add(&ep->consecutive_failures, 1) + 1;
	if (h->consecutive_failures <= 0 || fails < h->consecutive_failures)
		return false;
	int64_t until = atomic_load(&ep->eject_until_us);
	if (until > now_us)
		return false;   /* already ejected: an attempt that was in flight */
	int ejected = 0;
	for (int i = 0; i < n; i++)
		if (eps[i] != ep && is_ejected(eps[i], now_us))
			ejected++;
	if (!outlier_may_eject(h, n, ejected))
		return false;   /* the count stays: it ejects once another one comes back */
	int nth = atomic_load(&ep->nejections) + 1;
	if (!atomic_compare_exchange_strong(&ep->eject_until_us, &until,
	                                    now_us + outlier_ejection_us(h, nth)))
		return false;   /* another worker ejected it just now */
	atomic_store(&ep->nejections, nth);
	atomic_store(&ep->consecutive_failures, 0);
	atomic_fetch_add(&ep->ejections, 1);
	return true;
}
