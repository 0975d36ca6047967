/*
 * stats: rendering of the declared figures (stats.h) as Prometheus text and as JSON.
 * Scrapes sum the per-worker counters; nothing here blocks a worker.
 */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include <event2/buffer.h>

#include "clock.h"
#include "stats.h"
#include "upstream.h"

struct gstats g_gstats[MAX_WORKERS];
int g_nworkers = 1;

static const double bucket_le[NBUCKETS] = {
#define X_LE(b) b,
	DURATION_BUCKETS(X_LE)
#undef X_LE
};

static const char *const code_label[6] = { "", "1xx", "2xx", "3xx", "4xx", "5xx" };
static const char *const rejected_label[NREJ] = { "overloaded", "deadline-exceeded" };
static const char *const idem_label[NIDEM] = { "stored", "replayed", "conflict", "mismatch" };

/* label value for index I of a labelled family, or NULL to skip that index */
static const char *label_of(const char *family, int i)
{
	if (strcmp(family, "refused") == 0)
		return (i == RR_NONE || i == RR_NOT_LISTED) ? NULL : refusal_name((enum refusal)i);
	if (strcmp(family, "rejected") == 0)
		return rejected_label[i];
	if (strcmp(family, "responses") == 0)
		return i == 0 ? NULL : code_label[i];
	if (strcmp(family, "outcomes") == 0)
		return (i == OUT_NONE) ? NULL : outcome_name((enum outcome)i);
	if (strcmp(family, "idem") == 0)
		return idem_label[i];
	return NULL;
}

void stats_observe_duration(struct ustats *s, int64_t us)
{
	double sec = (double)us / 1e6;
	for (int i = 0; i < NBUCKETS; i++)
		if (sec <= bucket_le[i]) {
			STAT_INC(s->dur_bucket[i]);
			break;
		}
	STAT_INC(s->dur_count);
	STAT_ADD(s->dur_sum_us, (uint64_t)(us > 0 ? us : 0));
}

void stats_window_add(struct ustats *s, int64_t now_us, int req, int att)
{
	int64_t sec = now_us / 1000000;
	int i = (int)(sec % 60);
	if (atomic_load_explicit(&s->win_sec[i], memory_order_relaxed) != sec) {
		atomic_store_explicit(&s->win_req[i], 0, memory_order_relaxed);
		atomic_store_explicit(&s->win_att[i], 0, memory_order_relaxed);
		atomic_store_explicit(&s->win_sec[i], sec, memory_order_relaxed);
	}
	STAT_ADD(s->win_req[i], (uint64_t)req);
	STAT_ADD(s->win_att[i], (uint64_t)att);
}

#define LOAD(x) atomic_load_explicit(&(x), memory_order_relaxed)

/* one upstream's counters summed over workers */
struct usum {
#define X_FIELD(f, name, help) uint64_t f;
	UPSTREAM_COUNTERS(X_FIELD)
#undef X_FIELD
#define X_LFIELD(f, name, help, label, n) uint64_t f[n];
	UPSTREAM_LABELLED(X_LFIELD)
#undef X_LFIELD
	uint64_t dur_bucket[NBUCKETS], dur_count, dur_sum_us;
	uint64_t win_req, win_att;
};

static void sum_upstream(const struct upstream_state *st, struct usum *u)
{
	memset(u, 0, sizeof(*u));
	int64_t now_sec = clock_now_us() / 1000000;
	for (int w = 0; w < g_nworkers; w++) {
		struct ustats *s = &st->stats[w];
#define X_FIELD(f, name, help) u->f += LOAD(s->f);
		UPSTREAM_COUNTERS(X_FIELD)
#undef X_FIELD
#define X_LFIELD(f, name, help, label, n) for (int i = 0; i < n; i++) u->f[i] += LOAD(s->f[i]);
		UPSTREAM_LABELLED(X_LFIELD)
#undef X_LFIELD
		for (int i = 0; i < NBUCKETS; i++)
			u->dur_bucket[i] += LOAD(s->dur_bucket[i]);
		u->dur_count += LOAD(s->dur_count);
		u->dur_sum_us += LOAD(s->dur_sum_us);
		for (int i = 0; i < 60; i++) {
			int64_t sec = LOAD(s->win_sec[i]);
			if (sec > now_sec - 60 && sec <= now_sec) {
				u->win_req += LOAD(s->win_req[i]);
				u->win_att += LOAD(s->win_att[i]);
			}
		}
	}
}

/* the process-wide downstream figures summed over workers */
static void sum_downstream(int64_t *conns, uint64_t req[6])
{
	*conns = 0;
	memset(req, 0, sizeof(uint64_t) * 6);
	for (int w = 0; w < g_nworkers; w++) {
		*conns += LOAD(g_gstats[w].conns_active);
		for (int i = 1; i < 6; i++)
			req[i] += LOAD(g_gstats[w].requests[i]);
	}
}

static void prom_family(struct evbuffer *o, const char *name, const char *type, const char *help)
{
	evbuffer_add_printf(o, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

void stats_render_prometheus(struct evbuffer *o)
{
	int64_t conns;
	uint64_t req[6];
	sum_downstream(&conns, req);
	prom_family(o, "retrygate_downstream_connections_active", "gauge",
	            "Client connections open on the proxy listeners.");
	evbuffer_add_printf(o, "retrygate_downstream_connections_active %" PRId64 "\n", conns);
	prom_family(o, "retrygate_downstream_requests_total", "counter",
	            "Responses sent to clients, by status class.");
	for (int i = 1; i < 6; i++)
		evbuffer_add_printf(o, "retrygate_downstream_requests_total{code=\"%s\"} %" PRIu64 "\n",
		                    code_label[i], req[i]);

	int n = 0;
	for (struct upstream_state *st = upstream_state_first(); st; st = st->next)
		n++;
	struct usum sums[n > 0 ? n : 1];
	int k = 0;
	for (struct upstream_state *st = upstream_state_first(); st; st = st->next)
		sum_upstream(st, &sums[k++]);

#define X_FIELD(f, mname, mhelp) \
	prom_family(o, mname, "counter", mhelp); \
	k = 0; \
	for (struct upstream_state *st = upstream_state_first(); st; st = st->next, k++) \
		evbuffer_add_printf(o, mname "{upstream=\"%s\"} %" PRIu64 "\n", st->name, sums[k].f);
	UPSTREAM_COUNTERS(X_FIELD)
#undef X_FIELD
#define X_LFIELD(f, mname, mhelp, label, cnt) \
	prom_family(o, mname, "counter", mhelp); \
	k = 0; \
	for (struct upstream_state *st = upstream_state_first(); st; st = st->next, k++) \
		for (int i = 0; i < cnt; i++) { \
			const char *lv = label_of(#f, i); \
			if (lv) \
				evbuffer_add_printf(o, mname "{upstream=\"%s\"," label "=\"%s\"} %" PRIu64 "\n", \
				                    st->name, lv, sums[k].f[i]); \
		}
	UPSTREAM_LABELLED(X_LFIELD)
#undef X_LFIELD

	int64_t now = clock_now_us();
	prom_family(o, "retrygate_upstream_in_flight", "gauge", "Attempts in flight, retries included.");
	for (struct upstream_state *st = upstream_state_first(); st; st = st->next)
		evbuffer_add_printf(o, "retrygate_upstream_in_flight{upstream=\"%s\"} %d\n", st->name,
		                    atomic_load(&st->in_flight));
	prom_family(o, "retrygate_upstream_retries_in_flight", "gauge",
	            "Retries holding a max_retries_in_flight slot (waiting or sent).");
	for (struct upstream_state *st = upstream_state_first(); st; st = st->next)
		evbuffer_add_printf(o, "retrygate_upstream_retries_in_flight{upstream=\"%s\"} %d\n", st->name,
		                    atomic_load(&st->retries_in_flight));
	prom_family(o, "retrygate_upstream_retry_budget_tokens", "gauge", "Retry budget tokens available.");
	struct runtime *rt = runtime_current();
	for (struct upstream_state *st = upstream_state_first(); st; st = st->next) {
		const struct cfg_upstream *u = rt ? config_upstream(rt->cfg, st->name) : NULL;
		double t = u ? budget_tokens(&st->budget, &u->retry, now)
		             : (double)atomic_load(&st->budget.tokens) / BUDGET_ONE;
		evbuffer_add_printf(o, "retrygate_upstream_retry_budget_tokens{upstream=\"%s\"} %.3f\n", st->name, t);
	}
	if (rt)
		runtime_unref(rt);

	prom_family(o, "retrygate_upstream_request_duration_seconds", "histogram",
	            "Client-visible request duration, all attempts and waits included.");
	k = 0;
	for (struct upstream_state *st = upstream_state_first(); st; st = st->next, k++) {
		uint64_t cum = 0;
		for (int i = 0; i < NBUCKETS; i++) {
			cum += sums[k].dur_bucket[i];
			evbuffer_add_printf(o, "retrygate_upstream_request_duration_seconds_bucket{upstream=\"%s\",le=\"%g\"} %" PRIu64 "\n",
			                    st->name, bucket_le[i], cum);
		}
		evbuffer_add_printf(o, "retrygate_upstream_request_duration_seconds_bucket{upstream=\"%s\",le=\"+Inf\"} %" PRIu64 "\n",
		                    st->name, sums[k].dur_count);
		evbuffer_add_printf(o, "retrygate_upstream_request_duration_seconds_sum{upstream=\"%s\"} %.6f\n",
		                    st->name, (double)sums[k].dur_sum_us / 1e6);
		evbuffer_add_printf(o, "retrygate_upstream_request_duration_seconds_count{upstream=\"%s\"} %" PRIu64 "\n",
		                    st->name, sums[k].dur_count);
	}
}

void stats_render_json(struct evbuffer *o)
{
	int64_t conns;
	uint64_t req[6];
	sum_downstream(&conns, req);
	evbuffer_add_printf(o, "{\"downstream\":{\"connections_active\":%" PRId64 ",\"requests\":{", conns);
	for (int i = 1; i < 6; i++)
		evbuffer_add_printf(o, "%s\"%s\":%" PRIu64, i > 1 ? "," : "", code_label[i], req[i]);
	evbuffer_add_printf(o, "}},\"upstreams\":{");
	int64_t now = clock_now_us();
	struct runtime *rt = runtime_current();
	bool first = true;
	for (struct upstream_state *st = upstream_state_first(); st; st = st->next) {
		struct usum u;
		sum_upstream(st, &u);
		const struct cfg_upstream *cu = rt ? config_upstream(rt->cfg, st->name) : NULL;
		evbuffer_add_printf(o, "%s\"%s\":{", first ? "" : ",", st->name);
		first = false;
#define X_FIELD(f, name, help) evbuffer_add_printf(o, "\"%s\":%" PRIu64 ",", #f, u.f);
		UPSTREAM_COUNTERS(X_FIELD)
#undef X_FIELD
#define X_LFIELD(f, name, help, label, cnt) \
		{ \
			evbuffer_add_printf(o, "\"%s\":{", #f); \
			bool lf = true; \
			for (int i = 0; i < cnt; i++) { \
				const char *lv = label_of(#f, i); \
				if (!lv) \
					continue; \
				evbuffer_add_printf(o, "%s\"%s\":%" PRIu64, lf ? "" : ",", lv, u.f[i]); \
				lf = false; \
			} \
			evbuffer_add(o, "},", 2); \
		}
		UPSTREAM_LABELLED(X_LFIELD)
#undef X_LFIELD
		double tokens = cu ? budget_tokens(&st->budget, &cu->retry, now)
		                   : (double)atomic_load(&st->budget.tokens) / BUDGET_ONE;
		evbuffer_add_printf(o, "\"in_flight\":%d,\"retries_in_flight\":%d,\"retry_budget_tokens\":%.3f,"
		                    "\"retries_enabled\":%s,",
		                    atomic_load(&st->in_flight), atomic_load(&st->retries_in_flight), tokens,
		                    atomic_load(&st->runtime_enabled) ? "true" : "false");
		evbuffer_add_printf(o, "\"amplification_1m\":%.4f,\"requests_1m\":%" PRIu64 ",\"attempts_1m\":%" PRIu64 ",",
		                    u.win_req ? (double)u.win_att / (double)u.win_req : 0.0, u.win_req, u.win_att);
		evbuffer_add_printf(o, "\"duration_count\":%" PRIu64 ",\"duration_sum_seconds\":%.6f,\"held_endpoints\":{",
		                    u.dur_count, (double)u.dur_sum_us / 1e6);
		bool hf = true;
		for (int i = 0; i < atomic_load(&st->neps); i++) {
			int64_t h = atomic_load(&st->eps[i]->hold_until_us);
			if (h <= now)
				continue;
			evbuffer_add_printf(o, "%s\"%s\":{\"hold_ms_left\":%" PRId64 "}", hf ? "" : ",",
			                    st->eps[i]->name, (h - now) / 1000);
			hf = false;
		}
		evbuffer_add(o, "}}", 2);
	}
	if (rt)
		runtime_unref(rt);
	evbuffer_add(o, "}}\n", 3);
}
