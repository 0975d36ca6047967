/*
 * stats: every figure /metrics and /stats show, declared once (the X-macro lists below give
 * the counter fields, the Prometheus names and help, and the JSON keys).
 *
 * Counters are per worker (one writer each, relaxed atomics, no lock on the request path) and
 * summed at scrape. Gauges that are per upstream (in flight, budget tokens) live in the shared
 * upstream state.
 */
#ifndef RG_STATS_H
#define RG_STATS_H

#include <stdatomic.h>
#include <stdint.h>

#include "retry.h"

#define MAX_WORKERS 64

/* request duration histogram buckets, seconds: a sidecar sees 1 ms .. 30 s */
#define DURATION_BUCKETS(X) \
	X(0.001) X(0.0025) X(0.005) X(0.01) X(0.025) X(0.05) X(0.1) X(0.25) X(0.5) \
	X(1) X(2.5) X(5) X(10) X(30)
#define X_COUNT(b) +1
enum { NBUCKETS = 0 DURATION_BUCKETS(X_COUNT) };

/* plain per-upstream counters: field, metric name, help */
#define UPSTREAM_COUNTERS(X) \
	X(requests, "retrygate_upstream_requests_total", "Requests that made a first attempt.") \
	X(attempts, "retrygate_upstream_attempts_total", "Attempts sent, first and retries.") \
	X(retries,  "retrygate_upstream_retries_total",  "Retries sent.") \
	X(client_aborts, "retrygate_upstream_client_aborts_total", \
	  "Requests cancelled because the client disconnected while an attempt was in flight.") \
	X(unknown_outcomes, "retrygate_upstream_unknown_outcomes_total", \
	  "Non-idempotent requests whose last attempt ended in reset or timeout (may have executed).")

/* labelled per-upstream counters: field, metric, help, label, number of values */
enum { REJ_OVERLOADED, REJ_DEADLINE, NREJ };
enum { IS_STORED, IS_REPLAYED, IS_CONFLICT, IS_MISMATCH, NIDEM };   /* idempotency results */
#define UPSTREAM_LABELLED(X) \
	X(refused,   "retrygate_upstream_retries_refused_total", "Retries not made, by the rule that refused them.", "reason", RR_NREASONS) \
	X(rejected,  "retrygate_upstream_rejected_total", "Requests refused before any attempt.", "reason", NREJ) \
	X(responses, "retrygate_upstream_responses_total", "Upstream responses per attempt, by status class.", "code", 6) \
	X(outcomes,  "retrygate_upstream_outcomes_total", "Attempts that ended without a response, by outcome.", "outcome", 4) \
	X(idem,      "retrygate_idempotency_total", "Idempotency enforcement results.", "result", NIDEM)

struct ustats {
#define X_FIELD(f, name, help) _Atomic uint64_t f;
	UPSTREAM_COUNTERS(X_FIELD)
#undef X_FIELD
#define X_LFIELD(f, name, help, label, n) _Atomic uint64_t f[n];
	UPSTREAM_LABELLED(X_LFIELD)
#undef X_LFIELD
	_Atomic uint64_t dur_bucket[NBUCKETS];
	_Atomic uint64_t dur_count;
	_Atomic uint64_t dur_sum_us;
	/* amplification over the last minute: per-second ring of first attempts and attempts */
	_Atomic uint64_t win_req[60], win_att[60];
	_Atomic int64_t win_sec[60];
} __attribute__((aligned(64)));

/* process-wide downstream figures, one per worker */
struct gstats {
	_Atomic int64_t conns_active;
	_Atomic int64_t exchanges_active; /* requests being served (tunnels included): the drain waits for 0 */
	_Atomic uint64_t requests[6];   /* by status class */
} __attribute__((aligned(64)));

extern struct gstats g_gstats[MAX_WORKERS];
extern int g_nworkers;

/* single-writer increment: no lock prefix needed */
#define STAT_ADD(field, n) \
	atomic_store_explicit(&(field), atomic_load_explicit(&(field), memory_order_relaxed) + (n), \
	                      memory_order_relaxed)
#define STAT_INC(field) STAT_ADD(field, 1)

void stats_observe_duration(struct ustats *s, int64_t us);
void stats_window_add(struct ustats *s, int64_t now_us, int req, int att);

struct evbuffer;
/* Render all figures: Prometheus text format 0.0.4, or JSON. */
void stats_render_prometheus(struct evbuffer *out);
void stats_render_json(struct evbuffer *out);

#endif
