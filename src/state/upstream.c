/*
 * upstream: shared per-upstream state and the runtime that binds a config to it.
 *
 * The registry of states is only changed under reg_lock: at startup and reload (runtime_new,
 * main thread) and when a runtime is freed (any thread, once its last request ended) — never
 * on the request path. Reference counts of states count the runtimes binding them and are only
 * touched under reg_lock; a state whose count drops to 0 is unlinked and freed at once. The
 * current runtime pointer is swapped under rt_lock; workers notice a new generation with one
 * relaxed load per request and only then take the lock. The two locks are never held together
 * (a runtime is unreferenced, and may be freed, only with neither held).
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/util.h>

#include "base/clock.h"
#include "net/tls.h"
#include "state/upstream.h"
#include "base/util.h"

static pthread_mutex_t reg_lock = PTHREAD_MUTEX_INITIALIZER;
static struct upstream_state *reg_head;     /* first configured first */
static struct upstream_state **reg_by_id;   /* [reg_cap]; NULL: a free id */
static int reg_cap;
static uint64_t ep_serial_last;
static _Atomic uint64_t forget_epoch;

static pthread_mutex_t rt_lock = PTHREAD_MUTEX_INITIALIZER;
static struct runtime *rt_current;
static _Atomic uint64_t rt_gen;

static struct upstream_state *upstream_state_find(const char *name)
{
	for (struct upstream_state *s = reg_head; s; s = s->next)
		if (strcmp(s->name, name) == 0)
			return s;
	return NULL;
}

/* A free slot of ST (allocated on first use), or NULL when all MAX_ENDPOINTS are taken. */
static struct ep_state *slot_take(struct upstream_state *st)
{
	for (int i = 0; i < MAX_ENDPOINTS; i++) {
		struct ep_state *ep = atomic_load(&st->eps[i]);
		if (!ep) {
			ep = xcalloc(1, sizeof(*ep));
			ep->up = st;
			ep->index = i;
			atomic_store(&st->eps[i], ep);
			return ep;
		}
		if (atomic_load(&ep->life) == EPL_FREE)
			return ep;
	}
	return NULL;
}

/* Make slot EP the LIVE address SA of name NM: a fresh identity, no history. */
static void slot_init(struct ep_state *ep, struct ep_name *nm, const struct sockaddr_storage *sa)
{
	int index = ep->index;
	struct upstream_state *up = ep->up;
	memset(ep, 0, sizeof(*ep));
	ep->index = index;
	ep->up = up;
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

int upstream_name_set(struct ep_name *nm, const struct sockaddr_storage *addrs, int n)
{
	struct upstream_state *st = nm->up;
	uint64_t old = atomic_load(&nm->addrs), keep = 0, add = 0;
	int64_t now = clock_now_us();
	int dropped = 0;
	for (int j = 0; j < n; j++) {
		bool have = false;
		for (int i = 0; i < MAX_ENDPOINTS && !have; i++)
			if ((((old | add) >> i) & 1) && same_addr(&st->eps[i]->addr, &addrs[j])) {
				keep |= (old >> i) & 1 ? 1ull << i : 0;
				have = true;
			}
		if (have)
			continue;
		struct ep_state *ep = slot_take(st);
		if (!ep) {
			dropped++;
			continue;
		}
		slot_init(ep, nm, &addrs[j]);
		add |= 1ull << ep->index;
	}
	for (int i = 0; i < MAX_ENDPOINTS; i++)
		if (((old & ~keep) >> i) & 1)
			slot_retire(st->eps[i], now);
	atomic_store(&nm->addrs, keep | add);
	return dropped;
}

/* A reference on ST's endpoint name NAME, created at the lowest free index (a literal address
 * gets its slot at once); NULL when no index or no slot is free. */
static struct ep_name *name_bind(struct upstream_state *st, const char *name)
{
	int free_index = -1;
	for (int i = 0; i < MAX_ENDPOINTS; i++) {
		struct ep_name *nm = st->names[i];
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
	nm->up = st;
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
	st->names[free_index] = nm;
	return nm;
}

/* The last runtime naming NM is gone: its addresses retire, the name is forgotten. */
static void name_unbind(struct ep_name *nm)
{
	if (--nm->refs > 0)
		return;
	upstream_name_set(nm, NULL, 0);
	nm->up->names[nm->index] = NULL;
	free(nm->name);
	free(nm);
}

void upstream_faults_switch(struct upstream_state *st, bool on, int stopped)
{
	atomic_store(&st->faults_stopped, on ? 0 : stopped);
	atomic_store(&st->faults_since_us, on ? clock_now_us() : 0);
	atomic_store(&st->faults_since_wall, on ? (int64_t)clock_wall() : 0);
	atomic_store(&st->faults_on, on);
}

/* A reference on the state of upstream U, created (fresh budget, retries enabled) at the
 * lowest free id when no live runtime names it. */
static struct upstream_state *state_bind(const struct cfg_upstream *u)
{
	struct upstream_state *st = upstream_state_find(u->name);
	if (st) {
		st->refs++;
		return st;
	}
	st = xcalloc(1, sizeof(*st));
	st->name = xstrdup(u->name);
	st->refs = 1;
	budget_init(&st->budget, &u->retry, clock_now_us());
	atomic_store(&st->runtime_enabled, true);
	/* faults.enabled applies when the name first appears; a reload keeps the switch */
	upstream_faults_switch(st, u->faults.enabled && u->faults.nrules > 0, 0);
	st->stats = aligned_alloc(64, sizeof(struct ustats) * (size_t)g_nworkers);
	if (!st->stats)
		abort();
	memset(st->stats, 0, sizeof(struct ustats) * (size_t)g_nworkers);
	int id = 0;
	while (id < reg_cap && reg_by_id[id])
		id++;
	if (id == reg_cap) {
		reg_by_id = xrealloc(reg_by_id, sizeof(*reg_by_id) * (size_t)(reg_cap + 8));
		memset(reg_by_id + reg_cap, 0, sizeof(*reg_by_id) * 8);
		reg_cap += 8;
	}
	st->id = id;
	reg_by_id[id] = st;
	/* append, so /metrics lists upstreams in the order they were first configured */
	struct upstream_state **pp = &reg_head;
	while (*pp)
		pp = &(*pp)->next;
	*pp = st;
	return st;
}

static void state_free(struct upstream_state *st)
{
	for (int i = 0; i < MAX_ENDPOINTS; i++) {
		free(atomic_load(&st->eps[i]));
		if (st->names[i]) {
			free(st->names[i]->name);
			free(st->names[i]);
		}
	}
	free(st->stats);
	free(st->name);
	free(st);
}

static void state_unbind(struct upstream_state *st)
{
	if (--st->refs > 0)
		return;
	struct upstream_state **pp = &reg_head;
	while (*pp != st)
		pp = &(*pp)->next;
	*pp = st->next;
	reg_by_id[st->id] = NULL;
	atomic_fetch_add(&forget_epoch, 1);
	state_free(st);
}

/* Drop RT's references on its states (a partly bound runtime included). */
static void runtime_unbind(struct runtime *rt)
{
	pthread_mutex_lock(&reg_lock);
	for (int i = 0; i < rt->cfg->nupstreams; i++) {
		struct upstream_binding *b = &rt->ups[i];
		for (int e = 0; e < MAX_ENDPOINTS; e++)
			if (b->names[e])
				name_unbind(b->names[e]);
		if (b->st)
			state_unbind(b->st);
	}
	pthread_mutex_unlock(&reg_lock);
}

static void runtime_free(struct runtime *rt)
{
	runtime_unbind(rt);
	for (int i = 0; i < rt->cfg->nupstreams; i++)
		if (rt->ups[i].tls)
			SSL_CTX_free(rt->ups[i].tls);
	for (int i = 0; i < rt->cfg->nlisteners; i++)
		if (rt->ltls[i])
			SSL_CTX_free(rt->ltls[i]);
	config_unref(rt->cfg);
	free(rt->ups);
	free(rt->ltls);
	free(rt);
}

struct runtime *runtime_new(struct config *cfg, char *err, size_t errlen)
{
	struct runtime *rt = xcalloc(1, sizeof(*rt));
	atomic_init(&rt->refs, 1);
	rt->cfg = config_ref(cfg);
	rt->ups = xcalloc((size_t)cfg->nupstreams, sizeof(*rt->ups));
	rt->ltls = xcalloc((size_t)cfg->nlisteners + 1, sizeof(*rt->ltls));
	for (int i = 0; i < cfg->nlisteners; i++) {
		struct cfg_listener *l = &cfg->listeners[i];
		if (l->tls && (!(rt->ltls[i] = tls_server_ctx(l->tls_cert, l->tls_key, err, errlen)) ||
		               (l->tls_client_ca &&
		                tls_server_verify_clients(rt->ltls[i], l->tls_client_ca,
		                                          l->tls_require_client_cert, err, errlen) != 0))) {
			runtime_free(rt);
			return NULL;
		}
		if (rt->ltls[i])
			tls_server_alpn(rt->ltls[i], l->http2);
	}
	for (int i = 0; i < cfg->nupstreams; i++) {
		struct cfg_upstream *u = &cfg->upstreams[i];
		if (u->tls && (!(rt->ups[i].tls = tls_client_ctx(u->tls_ca, u->tls_verify, err, errlen)) ||
		               (u->tls_cert && tls_client_use_cert(rt->ups[i].tls, u->tls_cert, u->tls_key,
		                                                   err, errlen) != 0))) {
			runtime_free(rt);
			return NULL;
		}
	}
	pthread_mutex_lock(&reg_lock);
	for (int i = 0; i < cfg->nupstreams; i++) {
		struct cfg_upstream *u = &cfg->upstreams[i];
		struct upstream_binding *b = &rt->ups[i];
		b->cfg = u;
		b->st = state_bind(u);
		for (int e = 0; e < u->nendpoints && e < MAX_ENDPOINTS; e++) {
			if ((b->names[e] = name_bind(b->st, u->endpoints[e])))
				continue;
			snprintf(err, errlen, "upstream %s: more than %d endpoints in use at once (older "
			         "configs still serve requests); try again later", u->name, MAX_ENDPOINTS);
			pthread_mutex_unlock(&reg_lock);
			runtime_free(rt);
			return NULL;
		}
	}
	pthread_mutex_unlock(&reg_lock);
	return rt;
}

struct runtime *runtime_ref(struct runtime *rt)
{
	atomic_fetch_add(&rt->refs, 1);
	return rt;
}

void runtime_unref(struct runtime *rt)
{
	if (!rt || atomic_fetch_sub(&rt->refs, 1) != 1)
		return;
	runtime_free(rt);
}

struct runtime *runtime_current(void)
{
	pthread_mutex_lock(&rt_lock);
	struct runtime *rt = rt_current ? runtime_ref(rt_current) : NULL;
	pthread_mutex_unlock(&rt_lock);
	return rt;
}

void runtime_publish(struct runtime *rt)
{
	pthread_mutex_lock(&rt_lock);
	struct runtime *old = rt_current;
	rt->gen = atomic_load(&rt_gen) + 1;
	rt_current = rt;
	atomic_store(&rt_gen, rt->gen);
	pthread_mutex_unlock(&rt_lock);
	runtime_unref(old);
}

uint64_t runtime_generation(void)
{
	return atomic_load_explicit(&rt_gen, memory_order_acquire);
}

/* The scrape holds reg_lock while it renders: a worker freeing a runtime meanwhile (only ever
 * after a reload) waits for it, and no state it shows can be freed under it. */
void upstream_stats_walk(stats_upstream_fn fn, void *arg)
{
	/* budget tokens refill lazily, by the policy of the current config */
	struct runtime *rt = runtime_current();
	int64_t now = clock_now_us();
	pthread_mutex_lock(&reg_lock);
	for (struct upstream_state *st = reg_head; st; st = st->next) {
		struct stats_endpoint eps[MAX_ENDPOINTS];
		int n = 0;
		for (int i = 0; i < MAX_ENDPOINTS; i++) {
			struct ep_state *ep = atomic_load(&st->eps[i]);
			int life = ep ? atomic_load(&ep->life) : EPL_FREE;
			if (life == EPL_FREE)
				continue;
			struct ep_name *nm = life == EPL_LIVE ? st->names[ep->name_index] : NULL;
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
			};
		}
		const struct cfg_upstream *u = rt ? config_upstream(rt->cfg, st->name) : NULL;
		struct stats_upstream v = {
			.name = st->name,
			.per_worker = st->stats,
			.in_flight = atomic_load(&st->in_flight),
			.retries_in_flight = atomic_load(&st->retries_in_flight),
			.budget_tokens = u ? budget_tokens(&st->budget, &u->retry, now)
			                   : (double)atomic_load(&st->budget.tokens) / BUDGET_ONE,
			.retries_enabled = atomic_load(&st->runtime_enabled),
			.endpoints = eps,
			.nendpoints = n,
		};
		fn(arg, &v);
	}
	pthread_mutex_unlock(&reg_lock);
	runtime_unref(rt);
}

void upstream_states_free(void)
{
	pthread_mutex_lock(&reg_lock);
	while (reg_head) {
		struct upstream_state *st = reg_head;
		reg_head = st->next;
		state_free(st);
	}
	free(reg_by_id);
	reg_by_id = NULL;
	reg_cap = 0;
	pthread_mutex_unlock(&reg_lock);
}

uint64_t upstream_forget_epoch(void)
{
	return atomic_load_explicit(&forget_epoch, memory_order_acquire);
}

bool upstream_ep_live(int up_id, int index, uint64_t serial)
{
	pthread_mutex_lock(&reg_lock);
	struct upstream_state *st = up_id >= 0 && up_id < reg_cap ? reg_by_id[up_id] : NULL;
	struct ep_state *ep = st && index >= 0 && index < MAX_ENDPOINTS ? atomic_load(&st->eps[index])
	                                                                : NULL;
	bool live = ep && atomic_load(&ep->serial) == serial && atomic_load(&ep->life) != EPL_FREE;
	pthread_mutex_unlock(&reg_lock);
	return live;
}

bool upstream_take_in_flight(struct upstream_state *st, int cap)
{
	int n = atomic_load_explicit(&st->in_flight, memory_order_relaxed);
	do {
		if (n >= cap)
			return false;
	} while (!atomic_compare_exchange_weak(&st->in_flight, &n, n + 1));
	return true;
}

void upstream_release_in_flight(struct upstream_state *st)
{
	atomic_fetch_sub(&st->in_flight, 1);
}

bool upstream_take_retry_slot(struct upstream_state *st, int cap)
{
	int n = atomic_load_explicit(&st->retries_in_flight, memory_order_relaxed);
	do {
		if (n >= cap)
			return false;
	} while (!atomic_compare_exchange_weak(&st->retries_in_flight, &n, n + 1));
	return true;
}

void upstream_release_retry_slot(struct upstream_state *st)
{
	atomic_fetch_sub(&st->retries_in_flight, 1);
}

void upstream_hold(struct ep_state *ep, int64_t until_us)
{
	int64_t cur = atomic_load(&ep->hold_until_us);
	while (cur < until_us && !atomic_compare_exchange_weak(&ep->hold_until_us, &cur, until_us))
		;
}

void runtime_publish_none(void)
{
	pthread_mutex_lock(&rt_lock);
	struct runtime *old = rt_current;
	rt_current = NULL;
	pthread_mutex_unlock(&rt_lock);
	runtime_unref(old);
}

int upstream_endpoints(const struct upstream_binding *b, struct ep_state **eps)
{
	uint64_t mask = 0;
	for (int e = 0; e < b->cfg->nendpoints && e < MAX_ENDPOINTS; e++)
		mask |= atomic_load_explicit(&b->names[e]->addrs, memory_order_acquire);
	int n = 0;
	for (; mask; mask &= mask - 1)      /* the set bits only: asked twice per request */
		eps[n++] = atomic_load_explicit(&b->st->eps[__builtin_ctzll(mask)],
		                                memory_order_acquire);
	return n;
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

void upstream_lock(void)
{
	pthread_mutex_lock(&reg_lock);
}

void upstream_unlock(void)
{
	pthread_mutex_unlock(&reg_lock);
}

void upstream_names_walk(upstream_name_fn fn, void *arg)
{
	pthread_mutex_lock(&reg_lock);
	for (struct upstream_state *st = reg_head; st; st = st->next)
		for (int i = 0; i < MAX_ENDPOINTS; i++)
			if (st->names[i] && !st->names[i]->literal)
				fn(arg, st->names[i], st->id);
	pthread_mutex_unlock(&reg_lock);
}

struct ep_name *upstream_name_find(int up_id, uint64_t serial)
{
	struct upstream_state *st = up_id >= 0 && up_id < reg_cap ? reg_by_id[up_id] : NULL;
	for (int i = 0; st && i < MAX_ENDPOINTS; i++)
		if (st->names[i] && st->names[i]->serial == serial)
			return st->names[i];
	return NULL;
}

void upstream_sweep(int64_t now_us)
{
	bool forgot = false;
	pthread_mutex_lock(&reg_lock);
	for (struct upstream_state *st = reg_head; st; st = st->next)
		for (int i = 0; i < MAX_ENDPOINTS; i++) {
			struct ep_state *ep = atomic_load(&st->eps[i]);
			if (ep && atomic_load(&ep->life) == EPL_RETIRED && atomic_load(&ep->in_flight) == 0 &&
			    now_us - ep->retired_us >= EP_GRACE_US) {
				atomic_store(&ep->life, EPL_FREE);
				forgot = true;
			}
		}
	if (forgot)
		atomic_fetch_add(&forget_epoch, 1);
	pthread_mutex_unlock(&reg_lock);
}

void upstream_eps_walk(struct runtime *rt, upstream_ep_fn fn, void *arg)
{
	pthread_mutex_lock(&reg_lock);
	for (int u = 0; u < rt->cfg->nupstreams; u++) {
		struct ep_state *eps[MAX_ENDPOINTS];
		int n = upstream_endpoints(&rt->ups[u], eps);
		for (int i = 0; i < n; i++)
			fn(arg, &rt->cfg->upstreams[u], eps[i]);
	}
	pthread_mutex_unlock(&reg_lock);
}

struct ep_state *upstream_ep_find(int up_id, int index, uint64_t serial)
{
	struct upstream_state *st = up_id >= 0 && up_id < reg_cap ? reg_by_id[up_id] : NULL;
	struct ep_state *ep = st && index >= 0 && index < MAX_ENDPOINTS ? atomic_load(&st->eps[index])
	                                                                : NULL;
	return ep && atomic_load(&ep->serial) == serial && atomic_load(&ep->life) != EPL_FREE ? ep
	                                                                                   : NULL;
}
