/*
 * stats: the figures declared in stats.h rendered as Prometheus text and as JSON. Both
 * renderings walk one table of families generated from those declarations: a family knows its
 * kind, names, help, where its value sits in the summed figures, and its label values. A scrape
 * sums the per-worker counters (no lock a worker takes); the upstreams come from the walker the
 * caller hands in, one callback per upstream.
 */
#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <sys/time.h>

#include <event2/buffer.h>

#include "base/clock.h"
#include "base/procstat.h"
#include "obs/stats.h"

struct gstats g_gstats[MAX_WORKERS];
int g_nworkers = 1;
struct pstats g_pstats;

static int64_t wall_us(void)
{
	struct timeval tv;
	gettimeofday(&tv, NULL);
	return (int64_t)tv.tv_sec * 1000000 + tv.tv_usec;
}

void stats_config_loaded(bool reloaded)
{
	if (reloaded)
		STAT_INC(g_pstats.config_reloads[RELOAD_OK]);
	atomic_store_explicit(&g_pstats.last_load_ok_us, wall_us(), memory_order_relaxed);
}

void stats_config_reload_failed(void)
{
	STAT_INC(g_pstats.config_reloads[RELOAD_FAILED]);
}

static const double bucket_le[NBUCKETS] = {
#define X_LE(b) b,
	DURATION_BUCKETS(X_LE)
#undef X_LE
};

void stats_observe_duration(struct ustats *s, int64_t us)
{
	double sec = (double)us / 1e6;
	for (int i = 0; i < NBUCKETS; i++)
		if (sec <= bucket_le[i]) {
			STAT_INC(s->duration_bucket[i]);
			break;
		}
	STAT_INC(s->duration_count);
	STAT_ADD(s->duration_sum_us, (uint64_t)(us > 0 ? us : 0));
}

/* The ring slot of NOW's second, emptied when it last held an older second. */
static int window_slot(struct ustats *s, int64_t now_us)
{
	int64_t sec = now_us / 1000000;
	int i = (int)(sec % 60);
	if (atomic_load_explicit(&s->win_sec[i], memory_order_relaxed) != sec) {
		atomic_store_explicit(&s->win_req[i], 0, memory_order_relaxed);
		atomic_store_explicit(&s->win_att[i], 0, memory_order_relaxed);
		atomic_store_explicit(&s->win_resp[i], 0, memory_order_relaxed);
		atomic_store_explicit(&s->win_fail[i], 0, memory_order_relaxed);
		atomic_store_explicit(&s->win_sec[i], sec, memory_order_relaxed);
	}
	return i;
}

void stats_window_add(struct ustats *s, int64_t now_us, int req, int att)
{
	int i = window_slot(s, now_us);
	STAT_ADD(s->win_req[i], (uint64_t)req);
	STAT_ADD(s->win_att[i], (uint64_t)att);
}

void stats_window_response(struct ustats *s, int64_t now_us, bool failed)
{
	int i = window_slot(s, now_us);
	STAT_INC(s->win_resp[i]);
	if (failed)
		STAT_INC(s->win_fail[i]);
}

void stats_window_sum(const struct ustats *per_worker, int64_t now_us, int64_t from_us,
                      struct stats_window *out)
{
	int64_t now_sec = now_us / 1000000, from_sec = from_us / 1000000;
	memset(out, 0, sizeof(*out));
	for (int w = 0; w < g_nworkers; w++) {
		const struct ustats *p = &per_worker[w];
		for (int i = 0; i < 60; i++) {
			int64_t sec = atomic_load_explicit(&p->win_sec[i], memory_order_relaxed);
			if (sec <= now_sec - 60 || sec > now_sec || sec < from_sec)
				continue;
			out->req += atomic_load_explicit(&p->win_req[i], memory_order_relaxed);
			out->att += atomic_load_explicit(&p->win_att[i], memory_order_relaxed);
			out->resp += atomic_load_explicit(&p->win_resp[i], memory_order_relaxed);
			out->fail += atomic_load_explicit(&p->win_fail[i], memory_order_relaxed);
		}
	}
}

/* ------------------------------------------------------------------ summed figures */

#define LOAD(x) atomic_load_explicit(&(x), memory_order_relaxed)

struct hsum {
	uint64_t bucket[NBUCKETS];      /* per bucket, not cumulative */
	uint64_t count, sum_us;
};

/* one upstream: its counters summed over workers, and the registry's view of it */
struct usum {
	const struct stats_upstream *up;
#define X_FIELD(f, m, h) uint64_t f;
	UPSTREAM_COUNTERS(X_FIELD)
#undef X_FIELD
#define X_LFIELD(f, m, h, label, values) uint64_t f[LABELS_LEN(values)];
	UPSTREAM_LABELLED(X_LFIELD)
#undef X_LFIELD
#define X_HFIELD(f, m, h) struct hsum f;
	UPSTREAM_HISTOGRAMS(X_HFIELD)
#undef X_HFIELD
	uint64_t win_req, win_att;      /* over the last minute */
};

/* the process-wide downstream figures summed over workers */
struct dsum {
#define X_GFIELD(f, key, m, h) int64_t f;
	DOWNSTREAM_GAUGES(X_GFIELD)
#undef X_GFIELD
#define X_GFIELD(f, key, m, h) uint64_t f;
	DOWNSTREAM_COUNTERS(X_GFIELD)
#undef X_GFIELD
#define X_LFIELD(f, m, h, label, values) uint64_t f[LABELS_LEN(values)];
	DOWNSTREAM_LABELLED(X_LFIELD)
#undef X_LFIELD
};

/* s->f += the worker's p->f, for the fields of a declaration list: plain, or label-valued */
#define X_SUM(f, ...) s->f += LOAD(p->f);
#define X_SUM_VALUES(f, m, h, label, values) \
	for (size_t i = 0; i < LABELS_LEN(values); i++) \
		s->f[i] += LOAD(p->f[i]);

static void sum_upstream(const struct stats_upstream *up, int64_t now_us, struct usum *s)
{
	memset(s, 0, sizeof(*s));
	s->up = up;
	int64_t now_sec = now_us / 1000000;
	for (int w = 0; w < g_nworkers; w++) {
		const struct ustats *p = &up->per_worker[w];
		UPSTREAM_COUNTERS(X_SUM)
		UPSTREAM_LABELLED(X_SUM_VALUES)
#define X_HFIELD(f, m, h) \
		for (int i = 0; i < NBUCKETS; i++) \
			s->f.bucket[i] += LOAD(p->f##_bucket[i]); \
		s->f.count += LOAD(p->f##_count); \
		s->f.sum_us += LOAD(p->f##_sum_us);
		UPSTREAM_HISTOGRAMS(X_HFIELD)
#undef X_HFIELD
		for (int i = 0; i < 60; i++) {
			int64_t sec = LOAD(p->win_sec[i]);
			if (sec > now_sec - 60 && sec <= now_sec) {
				s->win_req += LOAD(p->win_req[i]);
				s->win_att += LOAD(p->win_att[i]);
			}
		}
	}
}

static void sum_downstream(struct dsum *s)
{
	memset(s, 0, sizeof(*s));
	for (int w = 0; w < g_nworkers; w++) {
		const struct gstats *p = &g_gstats[w];
		DOWNSTREAM_GAUGES(X_SUM)
		DOWNSTREAM_COUNTERS(X_SUM)
		DOWNSTREAM_LABELLED(X_SUM_VALUES)
	}
}
/* the process-wide figures: /proc/self now, and what the main thread recorded */
struct psum {
	struct proc_figures proc;
#define X_LFIELD(f, m, h, label, values) uint64_t f[LABELS_LEN(values)];
	PROCESS_LABELLED(X_LFIELD)
#undef X_LFIELD
	double last_load_ok_s;
	uint64_t access_log_dropped;
};

static void sum_process(struct psum *s)
{
	const struct pstats *p = &g_pstats;
	memset(s, 0, sizeof(*s));
	procstat_read(&s->proc);
	PROCESS_LABELLED(X_SUM_VALUES)
	s->last_load_ok_s = (double)LOAD(g_pstats.last_load_ok_us) / 1e6;
	s->access_log_dropped = LOAD(g_pstats.access_log_dropped);
}
#undef X_SUM
#undef X_SUM_VALUES

/* ------------------------------------------------------------------ the families */

enum fam_kind { FK_COUNTER, FK_LABELLED, FK_GAUGE, FK_HISTOGRAM, FK_INFO };

struct label_value {
	int index;                      /* in the counter array */
	const char *value;
};

struct family {
	enum fam_kind kind;
	const char *name;               /* Prometheus; NULL: /stats only */
	const char *key;                /* JSON */
	const char *help;
	size_t off;                     /* COUNTER, LABELLED, HISTOGRAM: the field in its sums */
	const char *type;               /* Prometheus type when not the kind's */
	const char *label;              /* LABELLED, INFO: the label name and its values */
	const char *info;               /* INFO: the label's one value */
	const struct label_value *values;
	int nvalues;
	enum stats_fmt fmt;             /* GAUGE: the format and how to read the value */
	double (*read)(const void *sums);
};

#define X_VALUE(i, v) { i, v },
#define X_VALUES(f, m, h, label, values) static const struct label_value values_##f[] = { values(X_VALUE) };
UPSTREAM_LABELLED(X_VALUES)
DOWNSTREAM_LABELLED(X_VALUES)
PROCESS_LABELLED(X_VALUES)
#undef X_VALUES
#undef X_VALUE

#define X_READ(key, m, h, fmt, expr) \
	static double read_##key(const void *sums) { const struct usum *s = sums; return (double)(expr); }
UPSTREAM_GAUGES(X_READ)
#undef X_READ
#define X_READ(f, key, m, h) \
	static double read_##f(const void *sums) { return (double)((const struct dsum *)sums)->f; }
DOWNSTREAM_GAUGES(X_READ)
#undef X_READ
#define X_READ(f, m, h, t, fmt, expr) \
	static double read_##f(const void *sums) { const struct psum *s = sums; return (double)(expr); }
PROCESS_FIGURES(X_READ)
#undef X_READ

#define X_COUNTER(f, m, h) { .kind = FK_COUNTER, .name = m, .key = #f, .help = h, \
                             .off = offsetof(SUMS, f) },
#define X_LABELLED(f, m, h, lname, vals) { .kind = FK_LABELLED, .name = m, .key = #f, .help = h, \
                             .off = offsetof(SUMS, f), .label = lname, .values = values_##f, \
                             .nvalues = LABELS_COUNT(vals) },
#define X_GAUGE(k, m, h, format, expr) { .kind = FK_GAUGE, .name = m, .key = #k, .help = h, \
                             .fmt = format, .read = read_##k },
#define X_HISTOGRAM(f, m, h) { .kind = FK_HISTOGRAM, .name = m, .key = #f, .help = h, \
                             .off = offsetof(SUMS, f) },
#define X_DGAUGE(f, jkey, m, h) { .kind = FK_GAUGE, .name = m, .key = jkey, .help = h, \
                             .fmt = SF_COUNT, .read = read_##f },
#define X_DCOUNTER(f, jkey, m, h) { .kind = FK_COUNTER, .name = m, .key = jkey, .help = h, \
                             .off = offsetof(SUMS, f) },

#define SUMS struct usum
static const struct family up_families[] = {
	UPSTREAM_COUNTERS(X_COUNTER)
	UPSTREAM_LABELLED(X_LABELLED)
	UPSTREAM_GAUGES(X_GAUGE)
	UPSTREAM_HISTOGRAMS(X_HISTOGRAM)
};
#undef SUMS
#define SUMS struct dsum
static const struct family down_families[] = {
	DOWNSTREAM_GAUGES(X_DGAUGE)
	DOWNSTREAM_COUNTERS(X_DCOUNTER)
	DOWNSTREAM_LABELLED(X_LABELLED)
};
#undef SUMS
#define X_INFO(f, m, h, lname, value) { .kind = FK_INFO, .name = m, .key = #f, .help = h, \
                             .label = lname, .info = value },
#define X_PFIGURE(f, m, h, ptype, format, expr) { .kind = FK_GAUGE, .name = m, .key = #f, \
                             .help = h, .type = ptype, .fmt = format, .read = read_##f },
#define SUMS struct psum
static const struct family proc_families[] = {
	PROCESS_INFO(X_INFO)
	PROCESS_LABELLED(X_LABELLED)
	PROCESS_FIGURES(X_PFIGURE)
};
#undef SUMS

enum { NUP_FAMILIES = sizeof(up_families) / sizeof(up_families[0]) };
enum { NDOWN_FAMILIES = sizeof(down_families) / sizeof(down_families[0]) };
enum { NPROC_FAMILIES = sizeof(proc_families) / sizeof(proc_families[0]) };

static const char *const kind_type[] = {
	[FK_COUNTER] = "counter", [FK_LABELLED] = "counter", [FK_GAUGE] = "gauge",
	[FK_HISTOGRAM] = "histogram", [FK_INFO] = "gauge",
};

static void put_value(struct evbuffer *o, enum stats_fmt fmt, double v, bool json)
{
	switch (fmt) {
	case SF_COUNT:  evbuffer_add_printf(o, "%" PRId64, (int64_t)v); break;
	case SF_TOKENS: evbuffer_add_printf(o, "%.3f", v); break;
	case SF_RATIO:  evbuffer_add_printf(o, "%.4f", v); break;
	case SF_SECONDS: evbuffer_add_printf(o, "%.3f", v); break;
	case SF_SWITCH:
		if (json)
			evbuffer_add_printf(o, "%s", v != 0 ? "true" : "false");
		else
			evbuffer_add_printf(o, "%d", v != 0);
		break;
	}
}

/* ------------------------------------------------------------------ Prometheus */

/* NAME{upstream="UP",LABEL="VALUE"} with the parts that are there */
static void prom_series(struct evbuffer *o, const char *name, const char *suffix, const char *up,
                        const char *label, const char *value)
{
	evbuffer_add_printf(o, "%s%s", name, suffix);
	if (!up && !label)
		return;
	evbuffer_add(o, "{", 1);
	if (up)
		evbuffer_add_printf(o, "upstream=\"%s\"%s", up, label ? "," : "");
	if (label)
		evbuffer_add_printf(o, "%s=\"%s\"", label, value);
	evbuffer_add(o, "}", 1);
}

static void prom_samples(struct evbuffer *o, const struct family *f, const void *sums,
                         const char *up)
{
	const void *p = (const char *)sums + f->off;
	switch (f->kind) {
	case FK_COUNTER:
		prom_series(o, f->name, "", up, NULL, NULL);
		evbuffer_add_printf(o, " %" PRIu64 "\n", *(const uint64_t *)p);
		break;
	case FK_LABELLED:
		for (int i = 0; i < f->nvalues; i++) {
			prom_series(o, f->name, "", up, f->label, f->values[i].value);
			evbuffer_add_printf(o, " %" PRIu64 "\n", ((const uint64_t *)p)[f->values[i].index]);
		}
		break;
	case FK_GAUGE:
		prom_series(o, f->name, "", up, NULL, NULL);
		evbuffer_add(o, " ", 1);
		put_value(o, f->fmt, f->read(sums), false);
		evbuffer_add(o, "\n", 1);
		break;
	case FK_INFO:
		prom_series(o, f->name, "", up, f->label, f->info);
		evbuffer_add(o, " 1\n", 3);
		break;
	case FK_HISTOGRAM: {
		const struct hsum *h = p;
		uint64_t cum = 0;
		char le[32];
		for (int i = 0; i < NBUCKETS; i++) {
			cum += h->bucket[i];
			snprintf(le, sizeof(le), "%g", bucket_le[i]);
			prom_series(o, f->name, "_bucket", up, "le", le);
			evbuffer_add_printf(o, " %" PRIu64 "\n", cum);
		}
		prom_series(o, f->name, "_bucket", up, "le", "+Inf");
		evbuffer_add_printf(o, " %" PRIu64 "\n", h->count);
		prom_series(o, f->name, "_sum", up, NULL, NULL);
		evbuffer_add_printf(o, " %.6f\n", (double)h->sum_us / 1e6);
		prom_series(o, f->name, "_count", up, NULL, NULL);
		evbuffer_add_printf(o, " %" PRIu64 "\n", h->count);
		break;
	}
	}
}

static void prom_head(struct evbuffer *o, const struct family *f)
{
	evbuffer_add_printf(o, "# HELP %s %s\n# TYPE %s %s\n", f->name, f->help, f->name,
	                    f->type ? f->type : kind_type[f->kind]);
}

#define X_EP_COUNT(key, name, help, type, value) +1
enum { NEP_FIGURES = 0 ENDPOINT_FIGURES(X_EP_COUNT) };
#undef X_EP_COUNT

struct prom_walk {
	struct evbuffer *fam[NUP_FAMILIES];
	struct evbuffer *ep[NEP_FIGURES];
};

/* one upstream's samples, each appended to its family's buffer */
static void prom_upstream_cb(void *arg, const struct stats_upstream *up)
{
	struct prom_walk *pw = arg;
	struct usum s;
	int64_t now = clock_now_us();
	sum_upstream(up, now, &s);
	for (int i = 0; i < NUP_FAMILIES; i++)
		if (up_families[i].name)
			prom_samples(pw->fam[i], &up_families[i], &s, up->name);
	for (int k = 0; k < up->nendpoints; k++) {
		const struct stats_endpoint *e = &up->endpoints[k];
		int f = 0;
#define X_EP_SAMPLE(key, metric, help, type, value) \
		evbuffer_add_printf(pw->ep[f++], metric "{upstream=\"%s\",endpoint=\"%s\"} %" PRId64 "\n", \
		                    up->name, e->name, (int64_t)(value));
		ENDPOINT_FIGURES(X_EP_SAMPLE)
#undef X_EP_SAMPLE
	}
}

void stats_render_prometheus(struct evbuffer *o, stats_walk_fn walk)
{
	struct dsum d;
	sum_downstream(&d);
	for (int i = 0; i < NDOWN_FAMILIES; i++) {
		prom_head(o, &down_families[i]);
		prom_samples(o, &down_families[i], &d, NULL);
	}
	/* one walk of the registry; the samples are grouped by family afterwards */
	struct prom_walk pw;
	for (int i = 0; i < NUP_FAMILIES; i++)
		pw.fam[i] = evbuffer_new();
	for (int i = 0; i < NEP_FIGURES; i++)
		pw.ep[i] = evbuffer_new();
	walk(prom_upstream_cb, &pw);
	for (int i = 0; i < NUP_FAMILIES; i++) {
		if (up_families[i].name) {
			prom_head(o, &up_families[i]);
			evbuffer_add_buffer(o, pw.fam[i]);
		}
		evbuffer_free(pw.fam[i]);
	}
	int f = 0;
#define X_EP_FAMILY(key, name, help, type, value) \
	evbuffer_add_printf(o, "# HELP " name " " help "\n# TYPE " name " " type "\n"); \
	evbuffer_add_buffer(o, pw.ep[f]); \
	evbuffer_free(pw.ep[f++]);
	ENDPOINT_FIGURES(X_EP_FAMILY)
#undef X_EP_FAMILY
	struct psum ps;
	sum_process(&ps);
	for (int i = 0; i < NPROC_FAMILIES; i++) {
		prom_head(o, &proc_families[i]);
		prom_samples(o, &proc_families[i], &ps, NULL);
	}
}

/* ------------------------------------------------------------------ JSON */

static void json_figures(struct evbuffer *o, const struct family *fams, int n, const void *sums)
{
	for (int k = 0; k < n; k++) {
		const struct family *f = &fams[k];
		const void *p = (const char *)sums + f->off;
		evbuffer_add_printf(o, "%s\"%s", k ? "," : "", f->key);
		switch (f->kind) {
		case FK_COUNTER:
			evbuffer_add_printf(o, "\":%" PRIu64, *(const uint64_t *)p);
			break;
		case FK_LABELLED:
			evbuffer_add(o, "\":{", 3);
			for (int i = 0; i < f->nvalues; i++)
				evbuffer_add_printf(o, "%s\"%s\":%" PRIu64, i ? "," : "", f->values[i].value,
				                    ((const uint64_t *)p)[f->values[i].index]);
			evbuffer_add(o, "}", 1);
			break;
		case FK_GAUGE:
			evbuffer_add(o, "\":", 2);
			put_value(o, f->fmt, f->read(sums), true);
			break;
		case FK_INFO:
			evbuffer_add_printf(o, "\":{\"%s\":\"%s\"}", f->label, f->info);
			break;
		case FK_HISTOGRAM: {
			const struct hsum *h = p;
			evbuffer_add_printf(o, "_count\":%" PRIu64 ",\"%s_sum_seconds\":%.6f", h->count,
			                    f->key, (double)h->sum_us / 1e6);
			break;
		}
		}
	}
}

struct json_walk {
	struct evbuffer *o;
	int64_t now_us;
	bool first;
};

/* SPEC §13: "endpoints": each configured endpoint with its addresses, their state (up,
 * ejected or held, with the time left), figures and last failure. */
static void json_endpoints(struct evbuffer *o, const struct stats_upstream *up, int64_t now)
{
	evbuffer_add_printf(o, ",\"endpoints\":{");
	bool done[MAX_STATS_ENDPOINTS] = { false };
	int n = up->nendpoints < MAX_STATS_ENDPOINTS ? up->nendpoints : MAX_STATS_ENDPOINTS;
	bool first_name = true;
	for (int i = 0; i < n; i++) {
		if (done[i])
			continue;
		evbuffer_add_printf(o, "%s\"%s\":{\"addresses\":[", first_name ? "" : ",",
		                    up->endpoints[i].configured);
		first_name = false;
		bool first = true;
		for (int j = i; j < n; j++) {
			const struct stats_endpoint *e = &up->endpoints[j];
			if (done[j] || strcmp(e->configured, up->endpoints[i].configured) != 0)
				continue;
			done[j] = true;
			const char *state = "up";
			int64_t until = 0;
			if (e->probe_down) {
				state = "ejected";
			} else if (e->eject_until_us > now) {
				state = "ejected";
				until = e->eject_until_us;
			} else if (e->hold_until_us > now) {
				state = "held";
				until = e->hold_until_us;
			}
			evbuffer_add_printf(o, "%s{\"endpoint\":\"%s\",\"state\":\"%s\"", first ? "" : ",",
			                    e->name, e->retired ? "draining" : state);
			first = false;
			if (until)
				evbuffer_add_printf(o, ",\"until_ms_left\":%" PRId64, (until - now) / 1000);
			if (e->probe_down)
				evbuffer_add_printf(o, ",\"probes\":\"failing\"");
#define X_EP_JSON(key, metric, help, type, value) \
			evbuffer_add_printf(o, ",\"" #key "\":%" PRId64, (int64_t)(value));
			ENDPOINT_FIGURES(X_EP_JSON)
#undef X_EP_JSON
			if (e->last_failure) {
				char what[16];
				if (e->last_failure < OUT_STATUS)
					snprintf(what, sizeof(what), "%s", outcome_name((enum outcome)e->last_failure));
				else if (e->last_failure >= STATS_FAILURE_GRPC)
					snprintf(what, sizeof(what), "%s",
					         grpc_status_name(e->last_failure - STATS_FAILURE_GRPC));
				else
					snprintf(what, sizeof(what), "%d", e->last_failure);
				evbuffer_add_printf(o, ",\"last_failure\":{\"what\":\"%s\",\"at_unix_ms\":%" PRId64
				                    "}", what, e->last_failure_wall_us / 1000);
			} else {
				evbuffer_add_printf(o, ",\"last_failure\":null");
			}
			evbuffer_add(o, "}", 1);
		}
		evbuffer_add(o, "]}", 2);
	}
	evbuffer_add(o, "}", 1);
}

static void json_upstream_cb(void *arg, const struct stats_upstream *up)
{
	struct json_walk *jw = arg;
	struct usum s;
	sum_upstream(up, jw->now_us, &s);
	evbuffer_add_printf(jw->o, "%s\"%s\":{", jw->first ? "" : ",", up->name);
	jw->first = false;
	json_figures(jw->o, up_families, NUP_FAMILIES, &s);
	/* the endpoints under a Retry-After or pushback hold, with the time it has left and the
	 * retries it refused so far (their responses show no reason to wait) */
	evbuffer_add_printf(jw->o, ",\"held_endpoints\":{");
	bool first = true;
	for (int i = 0; i < up->nendpoints; i++) {
		int64_t h = up->endpoints[i].hold_until_us;
		if (h <= jw->now_us)
			continue;
		evbuffer_add_printf(jw->o, "%s\"%s\":{\"hold_ms_left\":%" PRId64
		                    ",\"retries_refused\":%" PRIu64 "}", first ? "" : ",",
		                    up->endpoints[i].name, (h - jw->now_us) / 1000,
		                    up->endpoints[i].hold_refusals);
		first = false;
	}
	evbuffer_add(jw->o, "}", 1);
	json_endpoints(jw->o, up, jw->now_us);
	evbuffer_add(jw->o, "}", 1);
}

void stats_render_json(struct evbuffer *o, stats_walk_fn walk)
{
	struct dsum d;
	sum_downstream(&d);
	evbuffer_add_printf(o, "{\"downstream\":{");
	json_figures(o, down_families, NDOWN_FAMILIES, &d);
	evbuffer_add_printf(o, "},\"upstreams\":{");
	struct json_walk jw = { .o = o, .now_us = clock_now_us(), .first = true };
	walk(json_upstream_cb, &jw);
	struct psum ps;
	sum_process(&ps);
	evbuffer_add_printf(o, "},\"process\":{");
	json_figures(o, proc_families, NPROC_FAMILIES, &ps);
	evbuffer_add(o, "}}\n", 3);
}
