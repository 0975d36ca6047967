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

#include "clock.h"
#include "tls.h"
#include "upstream.h"
#include "util.h"

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

/* A reference on ST's endpoint state NAME, created at the lowest free index; NULL when all
 * MAX_ENDPOINTS indexes are taken. */
static struct ep_state *ep_bind(struct upstream_state *st, const char *name)
{
	int free_index = -1;
	for (int i = 0; i < MAX_ENDPOINTS; i++) {
		struct ep_state *ep = st->eps[i];
		if (ep && strcmp(ep->name, name) == 0) {
			ep->refs++;
			return ep;
		}
		if (!ep && free_index < 0)
			free_index = i;
	}
	if (free_index < 0)
		return NULL;
	struct ep_state *ep = xcalloc(1, sizeof(*ep));
	ep->name = xstrdup(name);
	ep->up = st;
	ep->index = free_index;
	ep->serial = ++ep_serial_last;
	ep->refs = 1;
	st->eps[free_index] = ep;
	return ep;
}

static void ep_unbind(struct ep_state *ep)
{
	if (--ep->refs > 0)
		return;
	ep->up->eps[ep->index] = NULL;
	atomic_fetch_add(&forget_epoch, 1);
	free(ep->name);
	free(ep);
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
	for (int i = 0; i < MAX_ENDPOINTS; i++)
		if (st->eps[i]) {
			free(st->eps[i]->name);
			free(st->eps[i]);
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
			if (b->ep[e])
				ep_unbind(b->ep[e]);
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
			if ((b->ep[e] = ep_bind(b->st, u->endpoints[e])))
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
		for (int i = 0; i < MAX_ENDPOINTS; i++)
			if (st->eps[i])
				eps[n++] = (struct stats_endpoint){ st->eps[i]->name,
				                                    atomic_load(&st->eps[i]->hold_until_us) };
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
	struct ep_state *ep = st && index >= 0 && index < MAX_ENDPOINTS ? st->eps[index] : NULL;
	bool live = ep && ep->serial == serial;
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
