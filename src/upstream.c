/*
 * upstream: shared per-upstream state and the runtime that binds a config to it.
 *
 * The registry of states is only changed under reg_lock, at startup and reload (never on the
 * request path). The current runtime pointer is swapped under rt_lock; workers notice a new
 * generation with one relaxed load per request and only then take the lock.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "tls.h"
#include "upstream.h"
#include "util.h"

static pthread_mutex_t reg_lock = PTHREAD_MUTEX_INITIALIZER;
static struct upstream_state *reg_head;
static int reg_count;

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

static struct ep_state *ep_find_or_add(struct upstream_state *st, const char *name)
{
	int n = atomic_load(&st->neps);
	for (int i = 0; i < n; i++)
		if (strcmp(st->eps[i]->name, name) == 0)
			return st->eps[i];
	if (n >= MAX_ENDPOINTS)
		return NULL;
	struct ep_state *ep = xcalloc(1, sizeof(*ep));
	ep->name = xstrdup(name);
	ep->up = st;
	ep->index = n;
	st->eps[n] = ep;
	atomic_store(&st->neps, n + 1);
	return ep;
}

static struct upstream_state *state_find_or_add(const struct cfg_upstream *u)
{
	struct upstream_state *st = upstream_state_find(u->name);
	if (st)
		return st;
	st = xcalloc(1, sizeof(*st));
	st->name = xstrdup(u->name);
	budget_init(&st->budget, &u->retry, clock_now_us());
	atomic_store(&st->runtime_enabled, true);
	st->stats = aligned_alloc(64, sizeof(struct ustats) * (size_t)g_nworkers);
	if (!st->stats)
		abort();
	memset(st->stats, 0, sizeof(struct ustats) * (size_t)g_nworkers);
	st->id = reg_count++;
	/* append, so /metrics lists upstreams in the order they were first configured */
	struct upstream_state **pp = &reg_head;
	while (*pp)
		pp = &(*pp)->next;
	*pp = st;
	return st;
}

static void runtime_free(struct runtime *rt)
{
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
		if (l->tls && !(rt->ltls[i] = tls_server_ctx(l->tls_cert, l->tls_key, err, errlen))) {
			runtime_free(rt);
			return NULL;
		}
	}
	for (int i = 0; i < cfg->nupstreams; i++) {
		struct cfg_upstream *u = &cfg->upstreams[i];
		if (u->tls && !(rt->ups[i].tls = tls_client_ctx(u->tls_ca, u->tls_verify, err, errlen))) {
			runtime_free(rt);
			return NULL;
		}
	}
	pthread_mutex_lock(&reg_lock);
	for (int i = 0; i < cfg->nupstreams; i++) {
		struct cfg_upstream *u = &cfg->upstreams[i];
		struct upstream_binding *b = &rt->ups[i];
		b->cfg = u;
		b->st = state_find_or_add(u);
		for (int e = 0; e < u->nendpoints && e < MAX_ENDPOINTS; e++)
			b->ep[e] = ep_find_or_add(b->st, u->endpoints[e]);
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

void upstream_stats_walk(stats_upstream_fn fn, void *arg)
{
	/* budget tokens refill lazily, by the policy of the current config */
	struct runtime *rt = runtime_current();
	int64_t now = clock_now_us();
	pthread_mutex_lock(&reg_lock);
	for (struct upstream_state *st = reg_head; st; st = st->next) {
		struct stats_endpoint eps[MAX_ENDPOINTS];
		int n = 0;
		for (int i = 0; i < atomic_load(&st->neps); i++)
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
		for (int i = 0; i < atomic_load(&st->neps); i++) {
			free(st->eps[i]->name);
			free(st->eps[i]);
		}
		free(st->stats);
		free(st->name);
		free(st);
	}
	pthread_mutex_unlock(&reg_lock);
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
