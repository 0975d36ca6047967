/*
 * endpoint: the address slots of one upstream (SPEC §13) and what workers do to one slot.
 *
 * An ep_table belongs to one upstream state and holds its configured endpoint strings (struct
 * ep_name, a literal address or a name the resolver turns into addresses) and their addresses
 * (struct ep_state), at most MAX_ENDPOINTS of each at an index. Invariants:
 *  - the table (names, slot lives, serials) only changes under the registry lock
 *    (upstream_lock), on the main thread or where a runtime is freed; workers only read slots
 *    they reached through a live runtime, and only touch their atomics;
 *  - a slot is referenced while an attempt is in flight there (in_flight) or an exchange keeps
 *    it (refs, upstream_ep_keep); its memory is reused or freed only once it is unreferenced
 *    and EP_GRACE_US after it retired (a worker reads a slot within microseconds of finding it
 *    in a name's address set, and keeps it from then on). Its identity is its serial, never
 *    reused in the process lifetime;
 *  - a name's address set (a bitmask of indexes) names LIVE slots only, so a retired slot needs
 *    no index: when a new address finds every index taken, the oldest retired slot gives its
 *    index up and waits, unindexed, until it is unreferenced. So a valid config always fits
 *    (at most MAX_ENDPOINTS live addresses), and what is kept is what is referenced or retired
 *    within the last EP_GRACE_US: nothing grows with the addresses ever seen.
 */
#ifndef RG_ENDPOINT_H
#define RG_ENDPOINT_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/socket.h>

#include "config/config.h"
#include "obs/stats.h"
#include "policy/balance.h"
#include "policy/retry.h"

#define MAX_ENDPOINTS 64
#define EP_LABEL_MAX 320

struct upstream_state;

/* An address slot's life (SPEC §13): LIVE while its name resolves to it (a literal address is
 * its own name); RETIRED once gone (no new attempt; those in flight finish); FREE once nothing
 * references it and EP_GRACE_US passed, when its index and memory go to the next new address
 * (or, when it gave its index up, its memory is freed). */
enum ep_life { EPL_FREE, EPL_LIVE, EPL_RETIRED };
#define EP_GRACE_US (2 * 1000000LL)

/* One endpoint address: what an attempt goes to, what balancing, holds, health, pools and the
 * endpoint metrics are about. Owned by its table; identity is the serial. */
struct ep_state {
	char name[EP_LABEL_MAX];    /* label: "host:port/address", or the literal "ip:port" */
	char host[EP_LABEL_MAX];    /* the configured "host:port" (Host, SNI) */
	struct sockaddr_storage addr;
	int addrlen;
	_Atomic int life;           /* enum ep_life */
	int64_t retired_us;         /* when it left LIVE; under the registry lock */
	int name_index;             /* the ep_name it belongs to (while LIVE) */
	_Atomic int64_t hold_until_us;  /* Retry-After hold (monotonic), 0: none */
	struct upstream_state *up;  /* the table's owner */
	int index;                  /* in the table, < MAX_ENDPOINTS; reused once FREE or given up */
	_Atomic uint64_t serial;    /* unique for the process lifetime: identity for caches */
	_Atomic int refs;           /* exchanges keeping it (upstream_ep_keep) */
	struct ep_state *next_unindexed;    /* in the table's unindexed list */
	/* health (endpoint.c, probe.c) and figures; reset when the slot is reused */
	_Atomic int in_flight;
	_Atomic uint64_t attempts, ejections;
	_Atomic int consecutive_failures;
	_Atomic int nejections;     /* passive ejections so far: the n of base_ejection x n */
	_Atomic int64_t eject_until_us;   /* passive ejection (monotonic), 0: none */
	_Atomic bool probe_down;    /* active health: down until healthy_after successes */
	_Atomic int last_failure;   /* enum outcome, a 5xx status, STATS_FAILURE_GRPC + code; 0: none */
	_Atomic int64_t last_failure_wall_us;
	_Atomic uint64_t hold_refusals;     /* retries refused because of its hold */
	int probe_fails, probe_oks; /* the prober's own (main thread) */
	int64_t probe_next_us;
	bool probing;
};

/* A configured endpoint string: a literal address or a name resolved to a set of addresses.
 * Referenced by the runtimes configuring it (under the registry lock). */
struct ep_name {
	char *name;                 /* "host:port" as configured */
	struct upstream_state *up;  /* the table's owner */
	struct ep_table *tab;
	int index;                  /* in tab->names */
	uint64_t serial;
	int refs;
	bool literal;
	_Atomic uint64_t addrs;     /* bit i: tab->eps[i] is one of its current addresses */
	/* the resolver's (main thread, under the registry lock) */
	int64_t next_lookup_us;     /* 0: never looked up */
	bool looking;
	bool answered;              /* some lookup finished (good or not) */
	char last_error[64];
};

struct ep_table {
	struct upstream_state *up;  /* the owner */
	struct ep_state *_Atomic eps[MAX_ENDPOINTS];   /* address slots, made on first use */
	struct ep_name *names[MAX_ENDPOINTS];   /* NULL: free index */
	struct ep_state *unindexed; /* retired slots that gave their index up, still referenced */
};

/* -- the table (registry lock held) */

void ep_table_init(struct ep_table *t, struct upstream_state *up);
/* Everything, at once: only when no runtime binds the owner any more. */
void ep_table_free(struct ep_table *t);
/* A reference on T's endpoint string NAME, created at the lowest free index (a literal address
 * gets its slot at once); NULL when no index or no slot is free. */
struct ep_name *ep_name_bind(struct ep_table *t, const char *name);
/* Drop one: when it was the last, the name's addresses retire and the name is forgotten. */
void ep_name_unbind(struct ep_name *nm);
/* Replace NM's addresses by ADDRS[0..N): new ones take free slots (as many as there are), gone
 * ones are retired. Returns how many could not be given a slot. */
int upstream_name_set(struct ep_name *nm, const struct sockaddr_storage *addrs, int n);
/* The slot INDEX if it still is the address with SERIAL, or NULL. */
struct ep_state *ep_table_find(struct ep_table *t, int index, uint64_t serial);
/* Forget the retired slots unreferenced EP_GRACE_US after they retired; whether any was. */
bool ep_table_sweep(struct ep_table *t, int64_t now_us);
/* The slots not FREE as the metrics show them, into EPS[MAX_ENDPOINTS]; their count. */
int ep_table_stats(struct ep_table *t, struct stats_endpoint *eps);
/* The slots of the addresses in MASK (bit i: slot i) into EPS; their count. */
int ep_table_slots(struct ep_table *t, uint64_t mask, struct ep_state **eps);

/* -- one slot (any worker) */

/* An exchange keeps EP (KEEP) or lets it go: while kept, its memory is not reused. Replaces
 * *SLOT with EP (either may be NULL). */
void upstream_ep_keep(struct ep_state **slot, struct ep_state *ep);
/* Retry-After hold: extend (never shorten) to UNTIL. */
void upstream_hold(struct ep_state *ep, int64_t until_us);
/* The failure upstream_ep_report() just counted was gRPC status CODE: /stats names it so
 * ("unavailable"), not as the 5xx it counts as. */
void upstream_ep_failure_grpc(struct ep_state *ep, int code);
/* A retry was refused because of EP's hold (not its own response's hint): for /stats. */
void upstream_ep_hold_refused(struct ep_state *ep);
/* Whether EP is still the LIVE address with SERIAL (an exchange waiting to retry there). */
bool upstream_ep_usable(struct ep_state *ep, uint64_t serial);
/* An attempt to EP begins or ends (the in-flight count least-request and the metrics read). */
void upstream_ep_attempt_begin(struct ep_state *ep);
void upstream_ep_attempt_end(struct ep_state *ep);

/* The endpoint for an attempt among EPS[0..N) (N >= 1), as read now, by balance_choose
 * (policy/balance.h); TRIED: bit i set when the endpoint of index i (ep_state.index) was tried
 * by this request. */
struct ep_state *upstream_ep_pick(struct ep_state *const *eps, int n, enum balance_mode mode,
                                  bool retry, uint64_t rr, uint64_t rnd, uint64_t tried,
                                  int64_t now_us);
/* Passive health (policy/outlier.h): report an attempt to EP (one of EPS[0..N), the upstream's
 * current addresses) that ended in OUT / STATUS (see outlier_is_failure). Returns true when it
 * ejected EP. EPS, N and NOW_US are read only when the outcome is a failure: a success may pass
 * NULL, 0, 0. Workers race on one endpoint's counters; the worst a race does is one ejection
 * more or less, never a wrong state: an ejection is a compare-and-swap on eject_until_us from a
 * time already past. */
bool upstream_ep_report(const struct cfg_health *h, struct ep_state *const *eps, int n,
                        struct ep_state *ep, enum outcome out, int status, bool hinted,
                        int64_t now_us);

#endif
