/*
 * upstream: the per-upstream policy state shared by every worker (SPEC §1: one per process):
 * retry budget, in-flight and retries-in-flight counts, the runtime switch, the counters, and
 * per endpoint address (SPEC §13) its Retry-After hold, health and figures. State is keyed by
 * upstream name, endpoint string (struct ep_name) and address, so it survives reloads while the
 * name stays configured and resolves to the address.
 *
 * struct runtime binds one loaded config to that state: new requests take the current runtime
 * (refcounted); requests in flight keep the one they started with. Lifetime: each runtime holds
 * a reference on every upstream state and endpoint name it binds; when the last runtime naming
 * one is freed (on any thread), it is forgotten: the name leaves the registry and its addresses
 * retire, the upstream state and its id go. Address slots (struct ep_state, at most
 * MAX_ENDPOINTS per upstream) belong to the upstream state and are freed only with it: a
 * retired address takes no new attempt, and once nothing was in flight there for EP_GRACE_US
 * the resolver's sweep frees its slot for the next new address (a new serial). So nothing grows
 * with the addresses ever seen, and an ep_state reached through a live runtime is valid memory.
 *
 * Per-worker caches keyed by (up->id, ep->index) (pool.c) must not trust a slot they did not
 * reach through a runtime: they compare ep->serial (never reused) and ask upstream_ep_live()
 * after upstream_forget_epoch() moved.
 */
#ifndef RG_UPSTREAM_H
#define RG_UPSTREAM_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#include "policy/budget.h"
#include "config/config.h"
#include "obs/stats.h"

#define MAX_ENDPOINTS 64
#define EP_LABEL_MAX 320

/* An address slot's life (SPEC §13): LIVE while its name resolves to it (a literal address is
 * its own name); RETIRED once gone (no new attempt; those in flight finish); FREE once nothing
 * is in flight for EP_GRACE_US, when its index and memory go to the next new address. */
enum ep_life { EPL_FREE, EPL_LIVE, EPL_RETIRED };
#define EP_GRACE_US (2 * 1000000LL)

/* One endpoint address: what an attempt goes to, what balancing, holds, health, pools and the
 * endpoint metrics are about. Owned by its upstream state (freed with it, never before), so a
 * pointer reached through a live runtime stays valid memory; identity is the serial. */
struct ep_state {
	char name[EP_LABEL_MAX];    /* label: "host:port/address", or the literal "ip:port" */
	char host[EP_LABEL_MAX];    /* the configured "host:port" (Host, SNI) */
	struct sockaddr_storage addr;
	int addrlen;
	_Atomic int life;           /* enum ep_life */
	int64_t retired_us;         /* when it left LIVE; under the registry lock */
	int name_index;             /* the ep_name it belongs to (while LIVE) */
	_Atomic int64_t hold_until_us;  /* Retry-After hold (monotonic), 0: none */
	struct upstream_state *up;
	int index;                  /* in up->eps, < MAX_ENDPOINTS; reused once FREE */
	_Atomic uint64_t serial;    /* unique for the process lifetime: identity for caches */
	/* health (outlier.c, probe.c) and figures; reset when the slot is reused */
	_Atomic int in_flight;
	_Atomic uint64_t attempts, ejections;
	_Atomic int consecutive_failures;
	_Atomic int nejections;     /* passive ejections so far: the n of base_ejection x n */
	_Atomic int64_t eject_until_us;   /* passive ejection (monotonic), 0: none */
	_Atomic bool probe_down;    /* active health: down until healthy_after successes */
	_Atomic int last_failure;   /* enum outcome, or a 5xx status; 0: none */
	_Atomic int64_t last_failure_wall_us;
	int probe_fails, probe_oks; /* the prober's own (main thread) */
	int64_t probe_next_us;
	bool probing;
};

/* A configured endpoint string: a literal address or a name resolved to a set of addresses.
 * Referenced by the runtimes configuring it (under the registry lock), like the upstream. */
struct ep_name {
	char *name;                 /* "host:port" as configured */
	struct upstream_state *up;
	int index;                  /* in up->names */
	uint64_t serial;
	int refs;
	bool literal;
	_Atomic uint64_t addrs;     /* bit i: up->eps[i] is one of its current addresses */
	/* the resolver's (main thread, under the registry lock) */
	int64_t next_lookup_us;     /* 0: never looked up */
	bool looking;
	bool answered;              /* some lookup finished (good or not) */
	char last_error[64];
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
	struct ep_state *_Atomic eps[MAX_ENDPOINTS];   /* address slots, made on first use */
	struct ep_name *names[MAX_ENDPOINTS];   /* NULL: free index */
	struct ustats *stats;       /* [g_nworkers] */
	int id;                     /* registry slot, lowest free; reused once forgotten */
	int refs;                   /* live runtimes binding it; under the registry lock */
	struct upstream_state *next;    /* registry order: first configured first */
};

struct upstream_binding {
	struct cfg_upstream *cfg;
	struct ssl_ctx_st *tls;         /* TLS to this upstream, or NULL */
	struct upstream_state *st;
	struct ep_name *names[MAX_ENDPOINTS];   /* cfg->endpoints[i] */
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

/* The current addresses of B's endpoints (LIVE slots of its names) into EPS; their count. */
int upstream_endpoints(const struct upstream_binding *b, struct ep_state **eps);
/* Whether EP is still the LIVE address with SERIAL (an exchange waiting to retry there). */
bool upstream_ep_usable(struct ep_state *ep, uint64_t serial);
/* An attempt to EP begins or ends (the in-flight count least-request and the metrics read). */
void upstream_ep_attempt_begin(struct ep_state *ep);
void upstream_ep_attempt_end(struct ep_state *ep);

/* For the resolver (main thread): call FN for every name that is not a literal address, under
 * the registry lock (FN may change the name's lookup fields and call upstream_name_set). */
typedef void (*upstream_name_fn)(void *arg, struct ep_name *nm, int up_id);
void upstream_names_walk(upstream_name_fn fn, void *arg);
/* The name with SERIAL of upstream UP_ID, or NULL once forgotten; call with the lock held
 * (upstream_lock / upstream_unlock around it and what is done with the name). */
struct ep_name *upstream_name_find(int up_id, uint64_t serial);
void upstream_lock(void);
void upstream_unlock(void);
/* Replace NM's addresses by ADDRS[0..N) (lock held): new ones take free slots (as many as
 * there are), gone ones are retired. Returns how many could not be given a slot. */
int upstream_name_set(struct ep_name *nm, const struct sockaddr_storage *addrs, int n);
/* The slot INDEX of upstream UP_ID if it still is the address with SERIAL (lock held). */
struct ep_state *upstream_ep_find(int up_id, int index, uint64_t serial);
/* Free the retired slots with nothing in flight for EP_GRACE_US (lock taken here). */
void upstream_sweep(int64_t now_us);
/* For the prober (main thread): FN for every LIVE slot of the current runtime's upstreams, with
 * that upstream's config, under the registry lock. */
typedef void (*upstream_ep_fn)(void *arg, const struct cfg_upstream *u, struct ep_state *ep);
void upstream_eps_walk(struct runtime *rt, upstream_ep_fn fn, void *arg);

#endif
