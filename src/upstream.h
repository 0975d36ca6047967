/*
 * upstream: the per-upstream policy state shared by every worker (SPEC §1: one per process):
 * retry budget, in-flight and retries-in-flight counts, Retry-After holds per endpoint, the
 * runtime switch, and the counters. State is keyed by upstream name and endpoint string, so it
 * survives reloads while the name stays configured.
 *
 * struct runtime binds one loaded config to that state: new requests take the current runtime
 * (refcounted); requests in flight keep the one they started with. Lifetime: each runtime holds
 * a reference on every upstream and endpoint state it binds; when the last runtime naming one
 * is freed (on any thread), the state is forgotten: it leaves the registry and its endpoint
 * index and upstream id are free for a new name. So a state reached through a live runtime is
 * alive, and the registry holds only names that some live runtime configures.
 *
 * Per-worker caches keyed by (up->id, ep->index) (pool.c) must not dereference a state they
 * did not reach through a runtime: they compare ep->serial (never reused) and ask
 * upstream_ep_live() after upstream_forget_epoch() moved.
 */
#ifndef RG_UPSTREAM_H
#define RG_UPSTREAM_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "budget.h"
#include "config.h"
#include "stats.h"

#define MAX_ENDPOINTS 64

struct ep_state {
	char *name;                 /* "host:port" as configured */
	_Atomic int64_t hold_until_us;  /* Retry-After hold (monotonic), 0: none */
	struct upstream_state *up;
	int index;                  /* in up->eps, < MAX_ENDPOINTS; reused once forgotten */
	uint64_t serial;            /* unique for the process lifetime: identity for caches */
	int refs;                   /* bindings in live runtimes; under the registry lock */
};

struct upstream_state {
	char *name;
	struct budget budget;
	_Atomic int in_flight;
	_Atomic int retries_in_flight;
	_Atomic bool runtime_enabled;
	/* SPEC §11 fault switch, written only by upstream_faults_switch() (main thread): on since
	 * (monotonic, and wall clock for GET /faults), and why it last stopped by itself */
	_Atomic bool faults_on;
	_Atomic int64_t faults_since_us, faults_since_wall;    /* µs monotonic; s since the epoch */
	_Atomic int faults_stopped;     /* enum faults_stop (faults.h); 0: none */
	_Atomic uint64_t rr;
	struct ep_state *eps[MAX_ENDPOINTS];    /* NULL: free index */
	struct ustats *stats;       /* [g_nworkers] */
	int id;                     /* registry slot, lowest free; reused once forgotten */
	int refs;                   /* live runtimes binding it; under the registry lock */
	struct upstream_state *next;    /* registry order: first configured first */
};

struct upstream_binding {
	struct cfg_upstream *cfg;
	struct ssl_ctx_st *tls;         /* TLS to this upstream, or NULL */
	struct upstream_state *st;
	struct ep_state *ep[MAX_ENDPOINTS];   /* cfg->endpoints[i] */
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
 * upstream would have more than MAX_ENDPOINTS endpoint names alive at once (old runtimes still
 * serving requests keep theirs). runtime_unref() may free the runtime and forget the states
 * only it bound; it is safe on any thread. */
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

/* A stats_walk_fn (stats.h) over every state, for /metrics and /stats: calls FN once per
 * state, in the order they were first configured, under the registry lock. */
void upstream_stats_walk(stats_upstream_fn fn, void *arg);
/* At exit, once every runtime is gone: free what is left. */
void upstream_states_free(void);

/* For per-worker caches: moves whenever an endpoint state is forgotten; and whether the
 * endpoint state with SERIAL still holds index INDEX of the upstream state with id UP_ID. */
uint64_t upstream_forget_epoch(void);
bool upstream_ep_live(int up_id, int index, uint64_t serial);

/* in-flight gates: true if a slot was taken */
bool upstream_take_in_flight(struct upstream_state *st, int cap);
void upstream_release_in_flight(struct upstream_state *st);
bool upstream_take_retry_slot(struct upstream_state *st, int cap);
void upstream_release_retry_slot(struct upstream_state *st);

/* The fault switch: ON (since now), or off with STOPPED, the stop condition that fired (0: an
 * operator switched it off). */
void upstream_faults_switch(struct upstream_state *st, bool on, int stopped);

/* Retry-After hold: extend (never shorten) to UNTIL. */
void upstream_hold(struct ep_state *ep, int64_t until_us);

#endif
