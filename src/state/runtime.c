/*
 * runtime: a config bound to the shared state, and its publication (see runtime.h).
 *
 * Binding takes the registry lock (upstream.h); the current runtime pointer is swapped under
 * rt_lock. The two locks are never held together (a runtime is unreferenced, and may be freed,
 * only with neither held).
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "base/clock.h"
#include "base/util.h"
#include "net/tls.h"
#include "state/runtime.h"
#include "state/upstream.h"

static pthread_mutex_t rt_lock = PTHREAD_MUTEX_INITIALIZER;
static struct runtime *rt_current;
static _Atomic uint64_t rt_gen;

/* Drop RT's references on its states (a partly bound runtime included). */
static void runtime_unbind(struct runtime *rt)
{
	upstream_lock();
	for (int i = 0; i < rt->cfg->nupstreams; i++) {
		struct upstream_binding *b = &rt->ups[i];
		for (int e = 0; e < CFG_MAX_ENDPOINTS; e++)
			if (b->names[e])
				ep_name_unbind(b->names[e]);
		if (b->st)
			upstream_state_unbind(b->st);
	}
	upstream_unlock();
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
	upstream_lock();
	for (int i = 0; i < cfg->nupstreams; i++) {
		struct cfg_upstream *u = &cfg->upstreams[i];
		struct upstream_binding *b = &rt->ups[i];
		b->cfg = u;
		b->st = upstream_state_bind(u);
		for (int e = 0; e < u->nendpoints && e < CFG_MAX_ENDPOINTS; e++) {
			if ((b->names[e] = ep_name_bind(&b->st->slots, u->endpoints[e])))
				continue;
			snprintf(err, errlen, "upstream %s: more than %d endpoints in use at once (older "
			         "configs still serve requests); try again later", u->name, MAX_ENDPOINTS);
			upstream_unlock();
			runtime_free(rt);
			return NULL;
		}
	}
	upstream_unlock();
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

void runtime_publish_none(void)
{
	pthread_mutex_lock(&rt_lock);
	struct runtime *old = rt_current;
	rt_current = NULL;
	pthread_mutex_unlock(&rt_lock);
	runtime_unref(old);
}

int runtime_endpoints(const struct upstream_binding *b, struct ep_state **eps)
{
	uint64_t mask = 0;
	for (int e = 0; e < b->cfg->nendpoints && e < CFG_MAX_ENDPOINTS; e++)
		mask |= atomic_load_explicit(&b->names[e]->addrs, memory_order_acquire);
	return ep_table_slots(&b->st->slots, mask, eps);
}

struct stats_walk {
	stats_upstream_fn fn;
	void *arg;
	struct runtime *rt;
	int64_t now;
};

static void stats_state_cb(void *arg, struct upstream_state *st)
{
	struct stats_walk *w = arg;
	struct stats_endpoint eps[MAX_ENDPOINTS];
	const struct cfg_upstream *u = w->rt ? config_upstream(w->rt->cfg, st->name) : NULL;
	bool shared = u && u->retry.budget_shared_host;
	bool in_use = shared && budget_fleet_use_shared(&st->fleet);
	int64_t level = atomic_load(&st->fleet.level);
	struct stats_upstream v = {
		.name = st->name,
		.per_worker = st->stats,
		.in_flight = atomic_load(&st->in_flight),
		.retries_in_flight = atomic_load(&st->retries_in_flight),
		.budget_tokens = in_use && level >= 0 ? (double)level / BUDGET_ONE
		                 : u ? budget_tokens(&st->budget, &u->retry, w->now)
		                 : (double)atomic_load(&st->budget.tokens) / BUDGET_ONE,
		.budget_shared = shared,
		.budget_shared_in_use = in_use,
		.retries_enabled = atomic_load(&st->runtime_enabled) && (!u || u->retry.enabled),
		.faults_active = atomic_load(&st->faults_on),
		.budget_ratio = u ? u->retry.budget_ratio : 0,
		.budget_min_per_second = u ? u->retry.budget_min_per_second : 0,
		.budget_max_tokens = u ? (double)u->retry.budget_max_tokens : 0,
		.endpoints = eps,
		.nendpoints = ep_table_stats(&st->slots, eps),
	};
	w->fn(w->arg, &v);
}

/* The scrape holds the registry lock while it renders: a worker freeing a runtime meanwhile
 * (only ever after a reload) waits for it, and no state it shows can be freed under it. */
void runtime_stats_walk(stats_upstream_fn fn, void *arg)
{
	/* budget tokens refill lazily, by the policy of the current config */
	struct stats_walk w = { fn, arg, runtime_current(), clock_now_us() };
	upstream_states_walk(stats_state_cb, &w);
	runtime_unref(w.rt);
}

void runtime_eps_walk(struct runtime *rt, runtime_ep_fn fn, void *arg)
{
	upstream_lock();
	for (int u = 0; u < rt->cfg->nupstreams; u++) {
		struct ep_state *eps[MAX_ENDPOINTS];
		int n = runtime_endpoints(&rt->ups[u], eps);
		for (int i = 0; i < n; i++)
			fn(arg, &rt->cfg->upstreams[u], eps[i]);
	}
	upstream_unlock();
}
