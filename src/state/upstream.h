/*
 * upstream: the registry of per-upstream state shared by every worker (SPEC §1: one per
 * process), kept across reloads: retry budget, in-flight and retries-in-flight gates, the
 * runtime switch, the fault switch, the counters and the endpoint table (endpoint.h). A state
 * is keyed by upstream name, so it survives reloads while the name stays configured.
 *
 * Invariants: the registry (the list, the ids, each state's references and endpoint table)
 * only changes under its lock (upstream_lock); each runtime (runtime.h) holds a reference on
 * every state it binds, and when the last one goes (on any thread) the state is forgotten at
 * once: it leaves the registry, its id is free for the next new name, its endpoint table goes.
 * So a state reached through a live runtime is valid memory, and nothing grows with the names
 * ever configured.
 *
 * Per-worker caches keyed by (up->id, ep->index) (pool.c) must not trust a slot they did not
 * reach through a runtime: they compare ep->serial (never reused) and ask upstream_ep_live()
 * after upstream_forget_epoch() moved.
 */
#ifndef RG_UPSTREAM_H
#define RG_UPSTREAM_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "policy/budget.h"
#include "policy/latency_hist.h"
#include "config/config.h"
#include "obs/outage_log.h"
#include "obs/stats.h"
#include "state/endpoint.h"
#include "state/gate.h"

struct upstream_state {
	char *name;
	struct budget budget;
	struct budget_fleet fleet;      /* budget.shared: what is known of the fleet's bucket */
	struct latency_hist head_lat;   /* first-attempt head latency, for a p95/p99 hedge */
	_Atomic int in_flight;          /* gate.h */
	_Atomic int retries_in_flight;  /* gate.h */
	_Atomic bool runtime_enabled;
	/* SPEC §11 fault switch, written only by upstream_faults_switch() (main thread): on since
	 * (monotonic, and wall clock for GET /faults), and why it last stopped by itself */
	_Atomic bool faults_on;
	_Atomic int64_t faults_since_us, faults_since_wall;    /* µs monotonic; s since the epoch */
	_Atomic int faults_stopped;     /* enum faults_stop (faults.h); 0: none */
	_Atomic uint64_t rr;
	struct ep_table slots;          /* its endpoint names and addresses */
	struct ustats *stats;           /* [g_nworkers] */
	struct outage_log outage;       /* its WARN lines in an outage */
	int id;                         /* registry slot, lowest free; reused once forgotten */
	int refs;                       /* live runtimes binding it; under the registry lock */
	struct upstream_state *next;    /* registry order: first configured first */
};

void upstream_lock(void);
void upstream_unlock(void);

/* With the lock held: a reference on the state of upstream U, created (fresh budget, retries
 * enabled, faults as configured) at the lowest free id when no live runtime names it; and
 * dropping one, which forgets the state when it was the last. */
struct upstream_state *upstream_state_bind(const struct cfg_upstream *u);
void upstream_state_unbind(struct upstream_state *st);

/* FN for every state, in the order they were first configured, under the lock. */
typedef void (*upstream_state_fn)(void *arg, struct upstream_state *st);
void upstream_states_walk(upstream_state_fn fn, void *arg);
/* At exit, once every runtime is gone: free what is left. */
void upstream_states_free(void);

/* For per-worker caches: moves whenever an endpoint state is forgotten; and whether the
 * endpoint state with SERIAL still holds index INDEX of the upstream state with id UP_ID. */
uint64_t upstream_forget_epoch(void);
bool upstream_ep_live(int up_id, int index, uint64_t serial);

/* in-flight gates: true if a slot was taken */
static inline bool upstream_take_in_flight(struct upstream_state *st, int cap)
{
	return gate_take(&st->in_flight, cap);
}

static inline void upstream_release_in_flight(struct upstream_state *st)
{
	gate_release(&st->in_flight);
}

static inline bool upstream_take_retry_slot(struct upstream_state *st, int cap)
{
	return gate_take(&st->retries_in_flight, cap);
}

static inline void upstream_release_retry_slot(struct upstream_state *st)
{
	gate_release(&st->retries_in_flight);
}

/* The fault switch: ON (since now), or off with STOPPED, the stop condition that fired (0: an
 * operator switched it off). */
void upstream_faults_switch(struct upstream_state *st, bool on, int stopped);

/* For the resolver (main thread): call FN for every name that is not a literal address, under
 * the registry lock (FN may change the name's lookup fields and call upstream_name_set). */
typedef void (*upstream_name_fn)(void *arg, struct ep_name *nm, int up_id);
void upstream_names_walk(upstream_name_fn fn, void *arg);
/* The name with SERIAL of upstream UP_ID, or NULL once forgotten; call with the lock held
 * (upstream_lock / upstream_unlock around it and what is done with the name). */
struct ep_name *upstream_name_find(int up_id, uint64_t serial);
/* The slot INDEX of upstream UP_ID if it still is the address with SERIAL (lock held). */
struct ep_state *upstream_ep_find(int up_id, int index, uint64_t serial);
/* Free the retired slots with nothing in flight for EP_GRACE_US (lock taken here). */
void upstream_sweep(int64_t now_us);

#endif
