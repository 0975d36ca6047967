/*
 * runtime: one loaded config bound to the shared upstream state (upstream.h), with its TLS
 * contexts, and the current one that new requests take.
 *
 * Invariants: a runtime is immutable once built and refcounted: new requests take the current
 * one (runtime_current, a reference), requests in flight keep the one they started with, and
 * the last runtime_unref() frees it on whatever thread that is. Each runtime holds a reference
 * on every upstream state and endpoint name it binds, so what is reached through a live
 * runtime is valid memory. The current pointer changes only by runtime_publish (reload, main
 * thread); workers notice a new generation with one relaxed load per request.
 */
#ifndef RG_RUNTIME_H
#define RG_RUNTIME_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "config/config.h"
#include "obs/stats.h"

struct ep_name;
struct ep_state;
struct upstream_state;

struct upstream_binding {
	struct cfg_upstream *cfg;
	struct ssl_ctx_st *tls;         /* TLS to this upstream, or NULL */
	struct upstream_state *st;
	struct ep_name *names[CFG_MAX_ENDPOINTS];   /* cfg->endpoints[i] */
};

struct runtime {
	atomic_int refs;
	struct config *cfg;
	struct upstream_binding *ups; /* cfg->nupstreams, same order */
	struct ssl_ctx_st **ltls;       /* per cfg->listeners: TLS termination, or NULL */
	uint64_t gen;
};

/* Build the runtime for CFG (takes its own reference), creating state for new names and the
 * TLS contexts. NULL with ERR set when a certificate or key cannot be loaded, or when an
 * upstream would have more endpoint names alive at once than its table holds (old runtimes
 * still serving requests keep theirs). runtime_unref() may free the runtime and forget the
 * states only it bound; it is safe on any thread. */
struct runtime *runtime_new(struct config *cfg, char *err, size_t errlen);
struct runtime *runtime_ref(struct runtime *rt);
void runtime_unref(struct runtime *rt);
/* The current one, with a reference taken; and the swap done by reload. */
struct runtime *runtime_current(void);
void runtime_publish(struct runtime *rt);
uint64_t runtime_generation(void);
/* At exit: drop the current runtime. */
void runtime_publish_none(void);

static inline struct upstream_binding *runtime_upstream(struct runtime *rt,
                                                        const struct cfg_upstream *u)
{
	return &rt->ups[u - rt->cfg->upstreams];
}

/* The current addresses of B's endpoints (LIVE slots of its names) into EPS[MAX_ENDPOINTS];
 * their count. */
int runtime_endpoints(const struct upstream_binding *b, struct ep_state **eps);

/* A stats_walk_fn (stats.h) over every upstream state, for /metrics and /stats: calls FN once
 * per state, in the order they were first configured, under the registry lock; the budget
 * refills by the current runtime's policy. */
void runtime_stats_walk(stats_upstream_fn fn, void *arg);

/* For the prober (main thread): FN for every LIVE slot of RT's upstreams, with that upstream's
 * config, under the registry lock. */
typedef void (*runtime_ep_fn)(void *arg, const struct cfg_upstream *u, struct ep_state *ep);
void runtime_eps_walk(struct runtime *rt, runtime_ep_fn fn, void *arg);

#endif
