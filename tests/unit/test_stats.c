/*
 * test_stats: the declarations of stats.h against retry.h's names, and both renderings from a
 * walker that shows two made-up upstreams (no registry, no sockets): every family once, each
 * label value once per upstream, the counters summed over workers, and the same figures in JSON.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <event2/buffer.h>

#include "obs/stats.h"

static void test_refusal_values_spelled_as_retry_names(void **state)
{
	int n = 0;
#define X_CHECK(i, v) assert_string_equal(v, refusal_name(i)); n++;
	REFUSED_VALUES(X_CHECK)
#undef X_CHECK
	assert_int_equal(n, RR_NREASONS - RR_DISABLED);
}

static void test_outcome_values_spelled_as_retry_names(void **state)
{
#define X_CHECK(i, v) assert_string_equal(v, outcome_name(i));
	OUTCOME_VALUES(X_CHECK)
#undef X_CHECK
}

static void test_grpc_values_spelled_as_grpc_names(void **state)
{
	int n = 0;
#define X_CHECK(i, v) assert_string_equal(v, grpc_status_name(i)); n++;
	GRPC_VALUES(X_CHECK)
#undef X_CHECK
	assert_int_equal(n, GRPC_NCODES);
}

static void test_value_lists_size_the_arrays(void **state)
{
	struct ustats u;
	assert_int_equal(sizeof(u.grpc_responses) / sizeof(u.grpc_responses[0]), GRPC_NCODES);
	assert_int_equal(sizeof(u.refused) / sizeof(u.refused[0]), RR_NREASONS);
	assert_int_equal(sizeof(u.outcomes) / sizeof(u.outcomes[0]), OUT_STATUS);
	assert_int_equal(sizeof(u.responses) / sizeof(u.responses[0]), 6);
	assert_int_equal(sizeof(u.rejected) / sizeof(u.rejected[0]), NREJ);
	assert_int_equal(sizeof(u.idem) / sizeof(u.idem[0]), NIDEM);
	assert_int_equal(LABELS_COUNT(CODE_VALUES), 5);
}

/* ------------------------------------------------------------------ renderings */

static struct ustats per_worker[2][2];     /* [upstream][worker] */
static const struct stats_endpoint eps[] = {
	{ .name = "10.0.0.1:80", .configured = "10.0.0.1:80", .attempts = 7, .in_flight = 1 },
	{ .name = "10.0.0.2:80", .configured = "10.0.0.2:80", .eject_until_us = INT64_MAX,
	  .ejections = 2, .last_failure = OUT_RESET },
};

static void walk(stats_upstream_fn fn, void *arg)
{
	static const char *const names[2] = { "api", "db" };
	for (int i = 0; i < 2; i++) {
		struct stats_upstream v = {
			.name = names[i], .per_worker = per_worker[i], .in_flight = 3 + i,
			.retries_in_flight = 1, .budget_tokens = 7.5, .retries_enabled = i == 0,
			.endpoints = eps, .nendpoints = 2,
		};
		fn(arg, &v);
	}
}

static char *render(void (*r)(struct evbuffer *, stats_walk_fn))
{
	struct evbuffer *b = evbuffer_new();
	r(b, walk);
	size_t n = evbuffer_get_length(b);
	char *s = malloc(n + 1);
	evbuffer_remove(b, s, n);
	s[n] = 0;
	evbuffer_free(b);
	return s;
}

static int count(const char *hay, const char *needle)
{
	int n = 0;
	for (const char *p = hay; (p = strstr(p, needle)); p += strlen(needle))
		n++;
	return n;
}

static void setup_figures(void)
{
	memset(per_worker, 0, sizeof(per_worker));
	memset(g_gstats, 0, sizeof(g_gstats));
	g_nworkers = 2;
	for (int w = 0; w < 2; w++) {
		STAT_ADD(per_worker[0][w].requests, 10);
		STAT_ADD(per_worker[0][w].refused[RR_BUDGET], 2);
		STAT_ADD(per_worker[0][w].responses[5], 1);
		STAT_INC(per_worker[1][w].idem[IS_REPLAYED]);
		STAT_ADD(per_worker[0][w].grpc_responses[GRPC_UNAVAILABLE], 3);
		STAT_INC(per_worker[1][w].grpc_responses[GRPC_OK]);
		stats_observe_duration(&per_worker[0][w], 3000);
		STAT_INC(g_gstats[w].requests[2]);
		STAT_INC(g_gstats[w].conns_active);
		STAT_ADD(g_gstats[w].grpc_status[GRPC_UNAVAILABLE], 3);
	}
}

static void test_prometheus_every_family_once(void **state)
{
	setup_figures();
	char *t = render(stats_render_prometheus);
#define X_ONCE(f, m, ...) assert_int_equal(count(t, "# TYPE " m " "), 1);
	UPSTREAM_COUNTERS(X_ONCE)
	UPSTREAM_LABELLED(X_ONCE)
	UPSTREAM_HISTOGRAMS(X_ONCE)
#undef X_ONCE
#define X_ONCE(f, k, m, ...) assert_int_equal(count(t, "# TYPE " m " gauge\n"), 1);
	DOWNSTREAM_GAUGES(X_ONCE)
#undef X_ONCE
	/* one sample per upstream and label value */
	assert_int_equal(count(t, "retrygate_upstream_retries_refused_total{upstream=\"api\""),
	                 LABELS_COUNT(REFUSED_VALUES));
	assert_int_equal(count(t, "retrygate_upstream_outcomes_total{upstream=\"db\""), 3);
	assert_non_null(strstr(t, "retrygate_upstream_requests_total{upstream=\"api\"} 20\n"));
	assert_non_null(strstr(t, "retrygate_upstream_retries_refused_total{upstream=\"api\",reason=\"budget\"} 4\n"));
	assert_non_null(strstr(t, "retrygate_upstream_responses_total{upstream=\"api\",code=\"5xx\"} 2\n"));
	assert_non_null(strstr(t, "retrygate_idempotency_total{upstream=\"db\",result=\"replayed\"} 2\n"));
	/* SPEC §10: every grpc-status by name, per upstream, summed over workers */
	assert_int_equal(count(t, "retrygate_upstream_grpc_responses_total{upstream=\"api\""),
	                 GRPC_NCODES);
	assert_non_null(strstr(t, "# HELP retrygate_upstream_grpc_responses_total gRPC attempts"));
	assert_non_null(strstr(t, "# TYPE retrygate_upstream_grpc_responses_total counter\n"));
	assert_non_null(strstr(t, "retrygate_upstream_grpc_responses_total{upstream=\"api\",status=\"unavailable\"} 6\n"));
	assert_non_null(strstr(t, "retrygate_upstream_grpc_responses_total{upstream=\"api\",status=\"ok\"} 0\n"));
	assert_non_null(strstr(t, "retrygate_upstream_grpc_responses_total{upstream=\"db\",status=\"ok\"} 2\n"));
	assert_non_null(strstr(t, "retrygate_upstream_grpc_responses_total{upstream=\"db\",status=\"unauthenticated\"} 0\n"));
	assert_non_null(strstr(t, "retrygate_upstream_in_flight{upstream=\"db\"} 4\n"));
	/* SPEC §13: one series per endpoint address */
	assert_non_null(strstr(t, "# TYPE retrygate_endpoint_up gauge\n"
	                          "retrygate_endpoint_up{upstream=\"api\",endpoint=\"10.0.0.1:80\"} 1\n"
	                          "retrygate_endpoint_up{upstream=\"api\",endpoint=\"10.0.0.2:80\"} 0\n"));
	assert_non_null(strstr(t, "retrygate_endpoint_ejections_total{upstream=\"db\",endpoint=\"10.0.0.2:80\"} 2\n"));
	assert_non_null(strstr(t, "retrygate_endpoint_attempts_total{upstream=\"api\",endpoint=\"10.0.0.1:80\"} 7\n"));
	assert_non_null(strstr(t, "retrygate_endpoint_in_flight{upstream=\"api\",endpoint=\"10.0.0.1:80\"} 1\n"));
	assert_non_null(strstr(t, "retrygate_upstream_retry_budget_tokens{upstream=\"api\"} 7.500\n"));
	assert_non_null(strstr(t, "retrygate_upstream_request_duration_seconds_bucket{upstream=\"api\",le=\"0.005\"} 2\n"));
	assert_non_null(strstr(t, "retrygate_upstream_request_duration_seconds_bucket{upstream=\"api\",le=\"+Inf\"} 2\n"));
	assert_non_null(strstr(t, "retrygate_upstream_request_duration_seconds_sum{upstream=\"api\"} 0.006000\n"));
	assert_non_null(strstr(t, "retrygate_downstream_requests_total{code=\"2xx\"} 2\n"));
	assert_non_null(strstr(t, "retrygate_downstream_connections_active 2\n"));
	/* SPEC §10: what gRPC clients received, no upstream label, every code by name */
	assert_int_equal(count(t, "retrygate_downstream_grpc_responses_total{status="), GRPC_NCODES);
	assert_non_null(strstr(t, "retrygate_downstream_grpc_responses_total{status=\"unavailable\"} 6\n"));
	assert_non_null(strstr(t, "retrygate_downstream_grpc_responses_total{status=\"ok\"} 0\n"));
	/* /stats-only figures have no series */
	assert_null(strstr(t, "amplification"));
	assert_null(strstr(t, "retries_enabled"));
	/* the families of one upstream come after the other's, grouped by family */
	char *a = strstr(t, "retrygate_upstream_attempts_total{upstream=\"api\"}");
	char *d = strstr(t, "retrygate_upstream_attempts_total{upstream=\"db\"}");
	char *r = strstr(t, "# TYPE retrygate_upstream_retries_total");
	assert_true(a && d && r && a < d && d < r);
	free(t);
}

static void test_json_same_figures(void **state)
{
	setup_figures();
	char *j = render(stats_render_json);
	assert_non_null(strstr(j, "{\"downstream\":{\"connections_active\":2,\"exchanges_active\":0,"
	                          "\"reconcile_pending\":0,\"reconcile_publish_errors\":0,"
	                          "\"requests\":{\"1xx\":0,\"2xx\":2,\"3xx\":0,\"4xx\":0,\"5xx\":0},"
	                          "\"h2_errors\":{\"malformed\":0,\"refused-stream\":0,\"rapid-reset\":0,"
	                          "\"header-block\":0,\"flood\":0,\"stalled\":0,\"idle\":0},"
	                          "\"grpc_status\":{\"ok\":0,\"cancelled\":0,\"unknown\":0,"
	                          "\"invalid-argument\":0,\"deadline-exceeded\":0,\"not-found\":0,"
	                          "\"already-exists\":0,\"permission-denied\":0,"
	                          "\"resource-exhausted\":0,\"failed-precondition\":0,\"aborted\":0,"
	                          "\"out-of-range\":0,\"unimplemented\":0,\"internal\":0,"
	                          "\"unavailable\":6,\"data-loss\":0,\"unauthenticated\":0}},"
	                          "\"upstreams\":{\"api\":{\"requests\":20,"));
	assert_non_null(strstr(j, "\"refused\":{\"disabled\":0,\"nested\":0,"));
	assert_non_null(strstr(j, "\"budget\":4,\"retries-in-flight\":0}"));
	assert_non_null(strstr(j, "\"in_flight\":3,\"retries_in_flight\":1,\"retry_budget_tokens\":7.500,"
	                          "\"retries_enabled\":true,\"amplification_1m\":0.0000,"));
	assert_non_null(strstr(j, "\"duration_count\":2,\"duration_sum_seconds\":0.006000,"
	                          "\"held_endpoints\":{},\"endpoints\":{\"10.0.0.1:80\":{\"addresses\":["
	                          "{\"endpoint\":\"10.0.0.1:80\",\"state\":\"up\",\"up\":1,\"ejections\":0,"
	                          "\"attempts\":7,\"in_flight\":1,\"last_failure\":null}]},"));
	assert_non_null(strstr(j, "{\"endpoint\":\"10.0.0.2:80\",\"state\":\"ejected\","));
	assert_non_null(strstr(j, "\"last_failure\":{\"what\":\"reset\","));
	assert_non_null(strstr(j, ",\"db\":{\"requests\":0,"));
	assert_non_null(strstr(j, "\"retries_enabled\":false"));
	/* the process figures close the object */
	assert_non_null(strstr(j, "}}},\"process\":{\"build_info\":{\"version\":\"" RETRYGATE_VERSION
	                          "\"},\"config_reloads\":{\"ok\":0,\"failed\":0},"
	                          "\"resident_memory_bytes\":"));
	assert_int_equal(strcmp(j + strlen(j) - 3, "}}\n"), 0);
	free(j);
}

/* the value of the unlabelled series NAME in the text T */
static double sample(const char *t, const char *name)
{
	char key[128];
	snprintf(key, sizeof key, "\n%s ", name);
	const char *p = strstr(t, key);
	assert_non_null(p);
	return atof(p + strlen(key));
}

static void test_process_figures(void **state)
{
	setup_figures();
	stats_config_loaded(false);
	stats_config_reload_failed();
	stats_config_loaded(true);
	char *t = render(stats_render_prometheus);
	assert_non_null(strstr(t, "# TYPE retrygate_build_info gauge\n"
	                          "retrygate_build_info{version=\"" RETRYGATE_VERSION "\"} 1\n"));
	assert_non_null(strstr(t, "retrygate_config_reloads_total{result=\"ok\"} 1\n"));
	assert_non_null(strstr(t, "retrygate_config_reloads_total{result=\"failed\"} 1\n"));
	assert_non_null(strstr(t, "# TYPE process_cpu_seconds_total counter\n"));
#define X_ONCE(f, m, h, type, ...) assert_int_equal(count(t, "# TYPE " m " " type "\n"), 1);
	PROCESS_FIGURES(X_ONCE)
#undef X_ONCE
	/* read from /proc/self: this test process has memory, descriptors, a start time */
	double rss = sample(t, "process_resident_memory_bytes"), fds = sample(t, "process_open_fds");
	double st = sample(t, "process_start_time_seconds");
	double ld = sample(t, "retrygate_config_last_reload_success_timestamp_seconds");
	assert_true(rss > 1e5 && fds >= 3);
	assert_true(st > 1.6e9 && ld >= st - 1 && ld < st + 3600);
	free(t);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_refusal_values_spelled_as_retry_names),
		cmocka_unit_test(test_outcome_values_spelled_as_retry_names),
		cmocka_unit_test(test_grpc_values_spelled_as_grpc_names),
		cmocka_unit_test(test_value_lists_size_the_arrays),
		cmocka_unit_test(test_prometheus_every_family_once),
		cmocka_unit_test(test_json_same_figures),
		cmocka_unit_test(test_process_figures),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
