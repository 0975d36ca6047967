/*
 * stats: every figure /metrics and /stats show, declared once. The lists below give, per
 * figure, its field, its Prometheus name and help (the type follows from the list it is in),
 * its JSON key, and for a labelled counter the label name and the list of its values, which
 * also sizes the counter array and, where stats owns the values, defines their index constants.
 * stats.c renders both formats by walking these declarations: no figure has code of its own.
 *
 * Counters are per worker (one writer each, relaxed atomics, no lock on the request path) and
 * summed at scrape. Per-upstream gauges live in the shared upstream state, which stats does not
 * know: a scrape is handed a walker that shows each upstream as a struct stats_upstream, so the
 * upstream registry depends on stats and never the other way round.
 */
#ifndef RG_STATS_H
#define RG_STATS_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "http/grpc.h"
#include "net/tls.h"
#include "policy/retry.h"

#define MAX_WORKERS 64

/* request duration histogram buckets, seconds: a sidecar sees 1 ms .. 30 s */
#define DURATION_BUCKETS(X) \
	X(0.001) X(0.0025) X(0.005) X(0.01) X(0.025) X(0.05) X(0.1) X(0.25) X(0.5) \
	X(1) X(2.5) X(5) X(10) X(30)
#define X_COUNT(b) +1
enum { NBUCKETS = 0 DURATION_BUCKETS(X_COUNT) };

/*
 * Label values: V(index in the counter array, value). A counter array is as long as the
 * largest index + 1; an index not listed (status class 0, RR_NONE, RR_NOT_LISTED, OUT_NONE)
 * is neither counted nor shown.
 */
#define CODE_VALUES(V)      /* index: status / 100 */ \
	V(1, "1xx") V(2, "2xx") V(3, "3xx") V(4, "4xx") V(5, "5xx")
#define REFUSED_VALUES(V)   /* enum refusal (retry.h): SPEC §4 reasons */ \
	V(RR_DISABLED, "disabled") V(RR_NESTED, "nested") V(RR_MAX_ATTEMPTS, "max-attempts") \
	V(RR_NON_IDEMPOTENT, "non-idempotent") V(RR_BODY_TOO_LARGE, "body-too-large") \
	V(RR_RETRY_AFTER, "retry-after") V(RR_DEADLINE, "deadline") V(RR_BUDGET, "budget") \
	V(RR_RETRIES_IN_FLIGHT, "retries-in-flight")
#define OUTCOME_VALUES(V)   /* enum outcome (retry.h): attempts that got no response */ \
	V(OUT_CONNECT_FAILURE, "connect-failure") V(OUT_RESET, "reset") V(OUT_TIMEOUT, "timeout")
#define REJECTED_VALUES(V)  /* requests refused before any attempt */ \
	V(REJ_OVERLOADED, "overloaded") V(REJ_DEADLINE, "deadline-exceeded")
#define IDEM_VALUES(V)      /* idempotency enforcement results */ \
	V(IS_STORED, "stored") V(IS_REPLAYED, "replayed") V(IS_CONFLICT, "conflict") \
	V(IS_MISMATCH, "mismatch")

#define H2ERR_VALUES(V)     /* SPEC §9 client connection defences */ \
	V(H2E_MALFORMED, "malformed") V(H2E_REFUSED, "refused-stream") \
	V(H2E_RAPID_RESET, "rapid-reset") V(H2E_HEADER_BLOCK, "header-block") V(H2E_FLOOD, "flood") \
	V(H2E_STALLED, "stalled") V(H2E_IDLE, "idle")
#define FAULT_VALUES(V)     /* enum fault_kind (config.h): SPEC §11 */ \
	V(FAULT_CONNECT_FAILURE, "connect-failure") V(FAULT_ABORT, "abort") V(FAULT_DELAY, "delay") \
	V(FAULT_LOST_RESPONSE, "lost-response")

#define GRPC_VALUES(V)      /* grpc-status codes (grpc.h): SPEC §10's names */ \
	V(0, "ok") V(1, "cancelled") V(2, "unknown") V(3, "invalid-argument") \
	V(4, "deadline-exceeded") V(5, "not-found") V(6, "already-exists") \
	V(7, "permission-denied") V(8, "resource-exhausted") V(9, "failed-precondition") \
	V(10, "aborted") V(11, "out-of-range") V(12, "unimplemented") V(13, "internal") \
	V(14, "unavailable") V(15, "data-loss") V(16, "unauthenticated")

#define X_VALUE_ENUM(id, value) id,
enum { H2ERR_VALUES(X_VALUE_ENUM) NH2ERR };
enum { REJECTED_VALUES(X_VALUE_ENUM) NREJ };
enum { IDEM_VALUES(X_VALUE_ENUM) NIDEM };
#undef X_VALUE_ENUM

/* the array length a value list needs (largest index + 1), and how many values it has */
#define X_VALUE_LEN(i, value) char len_##i[(i) + 1];
#define LABELS_LEN(values) sizeof(union { values(X_VALUE_LEN) })
#define X_VALUE_ONE(i, value) +1
#define LABELS_COUNT(values) (0 values(X_VALUE_ONE))

/* the lists over retry.h's enums must name every value (tests/unit/test_stats.c checks that
 * they are spelled as refusal_name() and outcome_name() spell them) */
_Static_assert(LABELS_LEN(REFUSED_VALUES) == RR_NREASONS &&
               LABELS_COUNT(REFUSED_VALUES) == RR_NREASONS - RR_DISABLED,
               "REFUSED_VALUES must list every refusal reason of enum refusal");
_Static_assert(LABELS_LEN(FAULT_VALUES) == FAULT_NKINDS, "FAULT_VALUES must list every fault kind");
_Static_assert(LABELS_LEN(GRPC_VALUES) == GRPC_NCODES && LABELS_COUNT(GRPC_VALUES) == GRPC_NCODES,
               "GRPC_VALUES must list every grpc-status code, as grpc_status_name() spells it");
_Static_assert(LABELS_LEN(OUTCOME_VALUES) == OUT_STATUS &&
               LABELS_COUNT(OUTCOME_VALUES) == OUT_STATUS - OUT_CONNECT_FAILURE,
               "OUTCOME_VALUES must list every outcome without a response");

/* per-upstream counters: field (and JSON key), metric name, help */
#define UPSTREAM_COUNTERS(X) \
	X(requests, "retrygate_upstream_requests_total", "Requests that made a first attempt.") \
	X(attempts, "retrygate_upstream_attempts_total", "Attempts sent, first and retries.") \
	X(retries,  "retrygate_upstream_retries_total",  "Retries sent.") \
	X(hedges, "retrygate_upstream_hedges_total", "Hedged attempts sent (retry.hedge).") \
	X(hedges_won, "retrygate_upstream_hedges_won_total", \
	  "Hedged attempts whose response was relayed to the client.") \
	X(client_aborts, "retrygate_upstream_client_aborts_total", \
	  "Requests cancelled because the client disconnected while an attempt was in flight.") \
	X(unknown_outcomes, "retrygate_upstream_unknown_outcomes_total", \
	  "Non-idempotent requests whose outcome is unknown: the last attempt reset or timed out, " \
	  "or a gRPC call got a code that is no definite answer (it may have executed).") \
	X(reconcile_recorded, "retrygate_reconcile_recorded_total", \
	  "Unknown outcomes recorded in the reconciliation queue.") \
	X(budget_shared_errors, "retrygate_upstream_budget_shared_errors_total", \
	  "Calls to the shared retry budget's Redis that failed or timed out (the local bucket " \
	  "stood in).")

/* per-upstream labelled counters: field (and JSON key), metric, help, label, its values */
#define UPSTREAM_LABELLED(X) \
	X(refused, "retrygate_upstream_retries_refused_total", \
	  "Retries not made, by the rule that refused them.", "reason", REFUSED_VALUES) \
	X(rejected, "retrygate_upstream_rejected_total", \
	  "Requests refused before any attempt.", "reason", REJECTED_VALUES) \
	X(responses, "retrygate_upstream_responses_total", \
	  "Upstream responses per attempt, by status class.", "code", CODE_VALUES) \
	X(outcomes, "retrygate_upstream_outcomes_total", \
	  "Attempts that ended without a response, by outcome.", "outcome", OUTCOME_VALUES) \
	X(idem, "retrygate_idempotency_total", \
	  "Idempotency enforcement results.", "result", IDEM_VALUES) \
	X(faults_injected, "retrygate_upstream_faults_injected_total", \
	  "Attempts given a fault by the faults rules, by kind.", "kind", FAULT_VALUES) \
	X(grpc_responses, "retrygate_upstream_grpc_responses_total", \
	  "gRPC attempts by the final grpc-status of their Trailers-Only response or trailers.", \
	  "status", GRPC_VALUES) \
	X(tls_errors, "retrygate_upstream_tls_handshake_errors_total", \
	  "TLS handshakes with the upstream's endpoints that failed, by reason.", "reason", \
	  TLS_FAILURE_VALUES)

/* per-upstream histograms: field (JSON keys FIELD_count, FIELD_sum_seconds), metric, help;
 * buckets DURATION_BUCKETS */
#define UPSTREAM_HISTOGRAMS(X) \
	X(duration, "retrygate_upstream_request_duration_seconds", \
	  "Client-visible request duration, all attempts and waits included.")

/* Value formats of gauges: a count, budget tokens (3 decimals), a ratio (4), a switch,
 * seconds (3 decimals). */
enum stats_fmt { SF_COUNT, SF_TOKENS, SF_RATIO, SF_SWITCH, SF_SECONDS };

/* per-upstream gauges: JSON key, metric name (NULL: /stats only), help, format, value. The
 * value is an expression over S, a struct usum (stats.c): S->up is the upstream as the registry
 * shows it (struct stats_upstream below), the other fields its counters summed over workers,
 * win_req / win_att the first attempts and attempts of the last minute. */
#define UPSTREAM_GAUGES(X) \
	X(in_flight, "retrygate_upstream_in_flight", \
	  "Attempts in flight, retries included.", SF_COUNT, s->up->in_flight) \
	X(retries_in_flight, "retrygate_upstream_retries_in_flight", \
	  "Retries holding a max_retries_in_flight slot (waiting or sent).", SF_COUNT, \
	  s->up->retries_in_flight) \
	X(retry_budget_tokens, "retrygate_upstream_retry_budget_tokens", \
	  "Retry budget tokens available.", SF_TOKENS, s->up->budget_tokens) \
	X(retries_enabled, "retrygate_upstream_retries_enabled", "1 when retries happen: retry.enabled " \
	  "and the runtime switch of POST /retries are both on.", SF_SWITCH, s->up->retries_enabled) \
	X(amplification_1m, NULL, "Attempts per first attempt over the last minute.", SF_RATIO, \
	  s->win_req ? (double)s->win_att / (double)s->win_req : 0.0) \
	X(requests_1m, NULL, "First attempts over the last minute.", SF_COUNT, s->win_req) \
	X(attempts_1m, NULL, "Attempts over the last minute.", SF_COUNT, s->win_att) \
	X(faults_active, "retrygate_upstream_faults_active", \
	  "1 while fault injection is switched on (POST /faults).", SF_SWITCH, s->up->faults_active) \
	X(retry_budget_ratio, "retrygate_upstream_retry_budget_ratio", \
	  "retry.budget.ratio: tokens each first attempt adds.", SF_RATIO, s->up->budget_ratio) \
	X(retry_budget_min_per_second, "retrygate_upstream_retry_budget_min_per_second", \
	  "retry.budget.min_per_second: tokens time adds per second.", SF_RATIO, \
	  s->up->budget_min_per_second) \
	X(retry_budget_max_tokens, "retrygate_upstream_retry_budget_max_tokens", \
	  "retry.budget.max_tokens: the most the bucket holds.", SF_COUNT, s->up->budget_max_tokens) \
	X(budget_shared, NULL, "The retry budget is configured shared (budget.shared).", \
	  SF_SWITCH, s->up->budget_shared) \
	X(budget_shared_in_use, NULL, "The shared bucket in Redis is in use (false: this " \
	  "process's own: unshared, or Redis unreachable).", SF_SWITCH, s->up->budget_shared_in_use)

/* process-wide downstream gauges (no upstream label), summed over workers: field, JSON key,
 * metric, help */
#define DOWNSTREAM_GAUGES(X) \
	X(conns_active, "connections_active", "retrygate_downstream_connections_active", \
	  "Client connections open on the proxy listeners.") \
	X(exchanges_active, "exchanges_active", "retrygate_downstream_exchanges_active", \
	  "Requests being served, tunnels included (a drain waits for none).") \
	X(reconcile_pending, "reconcile_pending", "retrygate_reconcile_pending", \
	  "Unknown outcomes in the reconciliation queue (kept in worker slot 0).")

/* process-wide counters (no upstream label), summed over workers: field, JSON key, metric, help */
#define DOWNSTREAM_COUNTERS(X) \
	X(reconcile_publish_errors, "reconcile_publish_errors", \
	  "retrygate_reconcile_publish_errors_total", \
	  "Reconciliation records that failed to reach the Redis stream (they stay in memory).")

/* process-wide downstream labelled counters: field (and JSON key), metric, help, label, values */
#define DOWNSTREAM_LABELLED(X) \
	X(requests, "retrygate_downstream_requests_total", \
	  "Responses sent to clients, by status class.", "code", CODE_VALUES) \
	X(h2_errors, "retrygate_downstream_h2_protocol_errors_total", \
	  "HTTP/2 client protocol errors and connection defences, per event.", "error", \
	  H2ERR_VALUES) \
	X(grpc_status, "retrygate_downstream_grpc_responses_total", \
	  "gRPC calls by the grpc-status their client received, relayed or made by retrygate.", \
	  "status", GRPC_VALUES) \
	X(tls_handshake_errors, "retrygate_downstream_tls_handshake_errors_total", \
	  "TLS handshakes on the proxy listeners that failed, by reason.", "reason", \
	  TLS_FAILURE_VALUES)

/* process-wide figures (no upstream label), rendered after the upstreams. */
#define RELOAD_VALUES(V)    /* SIGHUP reload results */ \
	V(RELOAD_OK, "ok") V(RELOAD_FAILED, "failed")
#define X_VALUE_ENUM(id, value) id,
enum { RELOAD_VALUES(X_VALUE_ENUM) NRELOAD };
#undef X_VALUE_ENUM

/* an info metric: field (and JSON key), metric, help, label, its one value; the sample is 1 */
#define PROCESS_INFO(X) \
	X(build_info, "retrygate_build_info", "The version built; always 1.", "version", \
	  RETRYGATE_VERSION)

/* labelled counters the main thread writes (struct pstats): field, metric, help, label, values */
#define PROCESS_LABELLED(X) \
	X(config_reloads, "retrygate_config_reloads_total", \
	  "Config reloads (SIGHUP), by result: a failed one leaves the old config serving.", \
	  "result", RELOAD_VALUES)

/* figures read at scrape: field (and JSON key), metric, help, Prometheus type, format, value.
 * The value is an expression over S, a struct psum (stats.c): S->proc from /proc/self
 * (procstat.h), S->last_load_ok_s and S->access_log_dropped from struct pstats. */
#define PROCESS_FIGURES(X) \
	X(resident_memory_bytes, "process_resident_memory_bytes", "Resident memory size in bytes.", \
	  "gauge", SF_COUNT, s->proc.rss_bytes) \
	X(open_fds, "process_open_fds", "Number of open file descriptors.", "gauge", SF_COUNT, \
	  s->proc.open_fds) \
	X(cpu_seconds, "process_cpu_seconds_total", "Total user and system CPU time spent in " \
	  "seconds.", "counter", SF_SECONDS, s->proc.cpu_seconds) \
	X(start_time_seconds, "process_start_time_seconds", "Start time of the process since unix " \
	  "epoch in seconds.", "gauge", SF_SECONDS, s->proc.start_time_s) \
	X(config_last_reload_success_seconds, \
	  "retrygate_config_last_reload_success_timestamp_seconds", \
	  "When the config in use was loaded (startup or a successful SIGHUP reload), unix seconds.", \
	  "gauge", SF_SECONDS, s->last_load_ok_s) \
	X(access_log_dropped_lines, "retrygate_access_log_dropped_lines_total", \
	  "Access log lines dropped because its output did not take them in time.", "counter", \
	  SF_COUNT, s->access_log_dropped)

struct ustats {
#define X_FIELD(f, name, help) _Atomic uint64_t f;
	UPSTREAM_COUNTERS(X_FIELD)
#undef X_FIELD
#define X_LFIELD(f, name, help, label, values) _Atomic uint64_t f[LABELS_LEN(values)];
	UPSTREAM_LABELLED(X_LFIELD)
#undef X_LFIELD
#define X_HFIELD(f, name, help) \
	_Atomic uint64_t f##_bucket[NBUCKETS]; _Atomic uint64_t f##_count; _Atomic uint64_t f##_sum_us;
	UPSTREAM_HISTOGRAMS(X_HFIELD)
#undef X_HFIELD
	/* amplification over the last minute: per-second ring of first attempts and attempts; and
	 * of client-visible responses and the 5xx among them (SPEC §11 stop conditions) */
	_Atomic uint64_t win_req[60], win_att[60], win_resp[60], win_fail[60];
	_Atomic int64_t win_sec[60];
} __attribute__((aligned(64)));

/* process-wide downstream figures, one per worker */
struct gstats {
#define X_GFIELD(f, key, name, help) _Atomic int64_t f;
	DOWNSTREAM_GAUGES(X_GFIELD)
#undef X_GFIELD
#define X_GFIELD(f, key, name, help) _Atomic uint64_t f;
	DOWNSTREAM_COUNTERS(X_GFIELD)
#undef X_GFIELD
#define X_LFIELD(f, name, help, label, values) _Atomic uint64_t f[LABELS_LEN(values)];
	DOWNSTREAM_LABELLED(X_LFIELD)
#undef X_LFIELD
} __attribute__((aligned(64)));

/* process-wide figures of the main thread (its only writer) */
struct pstats {
#define X_LFIELD(f, name, help, label, values) _Atomic uint64_t f[LABELS_LEN(values)];
	PROCESS_LABELLED(X_LFIELD)
#undef X_LFIELD
	_Atomic int64_t last_load_ok_us;    /* wall clock, microseconds since the epoch */
	_Atomic uint64_t access_log_dropped;    /* written by workers, under the access log's lock */
};
extern struct pstats g_pstats;

/* The config in use was loaded: at startup (RELOADED false) or by a SIGHUP (counted ok). */
void stats_config_loaded(bool reloaded);
/* A SIGHUP reload failed: counted, the old config keeps serving. */
void stats_config_reload_failed(void);

/* g_nworkers: 1..MAX_WORKERS, set once before the first runtime and worker exist; every
 * per-worker array (g_gstats, each upstream's ustats) has that many slots. A larger worker
 * count must be refused by config validation, not cut down here. */
extern struct gstats g_gstats[MAX_WORKERS];
extern int g_nworkers;

/* single-writer increment: no lock prefix needed */
#define STAT_ADD(field, n) \
	atomic_store_explicit(&(field), atomic_load_explicit(&(field), memory_order_relaxed) + (n), \
	                      memory_order_relaxed)
#define STAT_INC(field) STAT_ADD(field, 1)

void stats_observe_duration(struct ustats *s, int64_t us);
void stats_window_add(struct ustats *s, int64_t now_us, int req, int att);
/* A client-visible response of this upstream's request; FAILED: a 5xx. */
void stats_window_response(struct ustats *s, int64_t now_us, bool failed);

/* The window rings of PER_WORKER[g_nworkers] summed over the seconds of the last minute that
 * are not before FROM_US (monotonic; 0: the whole minute). */
struct stats_window {
	uint64_t req, att, resp, fail;
};
void stats_window_sum(const struct ustats *per_worker, int64_t now_us, int64_t from_us,
                      struct stats_window *out);

#define MAX_STATS_ENDPOINTS 64    /* endpoint.h's MAX_ENDPOINTS */

/* One upstream as the registry shows it to a scrape; valid during the walker's call only. */
struct stats_endpoint {
	const char *name;               /* the address label (SPEC §13) */
	const char *configured;         /* the configured endpoint it is an address of */
	int64_t hold_until_us;          /* Retry-After hold (monotonic clock), 0: none */
	int64_t eject_until_us;         /* passive ejection (monotonic clock), 0: none */
	bool probe_down;                /* active health says down */
	bool retired;                   /* its name no longer resolves to it: draining */
	uint64_t attempts, ejections;
	int64_t in_flight;
	int last_failure;               /* enum outcome, a 5xx status, or STATS_FAILURE_GRPC + a
	                                 * grpc-status; 0: none */
	int64_t last_failure_wall_us;
	uint64_t hold_refusals;         /* retries refused because of its hold (/stats only) */
};
#define STATS_FAILURE_GRPC 1000
struct stats_upstream {
	const char *name;
	const struct ustats *per_worker;    /* [g_nworkers] */
	int64_t in_flight, retries_in_flight;
	double budget_tokens;           /* shared and in use: the level Redis last answered */
	bool budget_shared, budget_shared_in_use;
	bool retries_enabled;           /* retry.enabled and the runtime switch */
	bool faults_active;
	double budget_ratio, budget_min_per_second, budget_max_tokens;
	const struct stats_endpoint *endpoints;
	int nendpoints;
};
typedef void (*stats_upstream_fn)(void *arg, const struct stats_upstream *u);

/* SPEC §13: one series per endpoint address (labels upstream, endpoint): JSON key, metric,
 * help, Prometheus type, value (an int64_t expression over E, a struct stats_endpoint, at
 * monotonic time NOW). */
static inline bool stats_endpoint_up(const struct stats_endpoint *e, int64_t now)
{
	return !e->probe_down && e->eject_until_us <= now;
}
#define ENDPOINT_FIGURES(X) \
	X(up, "retrygate_endpoint_up", "1 when the endpoint address is not ejected.", "gauge", \
	  (int64_t)stats_endpoint_up(e, now)) \
	X(ejections, "retrygate_endpoint_ejections_total", \
	  "Ejections of the endpoint address, passive and active.", "counter", \
	  (int64_t)e->ejections) \
	X(attempts, "retrygate_endpoint_attempts_total", \
	  "Attempts sent to the endpoint address, first and retries.", "counter", \
	  (int64_t)e->attempts) \
	X(in_flight, "retrygate_endpoint_in_flight", "Attempts in flight to the endpoint address.", \
	  "gauge", e->in_flight)
/* Calls FN once per upstream, in the order they were first configured. */
typedef void (*stats_walk_fn)(stats_upstream_fn fn, void *arg);

struct evbuffer;
/* Render all figures: Prometheus text format 0.0.4, or JSON. */
void stats_render_prometheus(struct evbuffer *out, stats_walk_fn walk);
void stats_render_json(struct evbuffer *out, stats_walk_fn walk);

#endif
