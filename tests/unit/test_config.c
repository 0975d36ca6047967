/*
 * config: the defaults of SPEC §2, every file in tests/conf/bad against the message on its
 * first line, several errors from one file, the shipped configs, the documentation of every
 * schema key in conf/retrygate.yaml, the --check report and the redaction of /config.
 * Runs from the repository root.
 */
#include <glob.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "config/config.h"
#include "obs/stats.h"
#include "state/upstream.h"
#include "base/util.h"

/* the schema's bounds are the sizes of the arrays that hold what they bound */
_Static_assert(CFG_MAX_WORKERS == MAX_WORKERS, "config.h and stats.h disagree on workers");
_Static_assert(CFG_MAX_ENDPOINTS == MAX_ENDPOINTS, "config.h and upstream.h disagree on endpoints");

#define MS 1000LL
#define S  1000000LL

static const char minimal_yaml[] =
	"listeners:\n"
	"  - listen: \"127.0.0.1:15001\"\n"
	"    routes: [{ upstream: a }]\n"
	"upstreams:\n"
	"  a:\n"
	"    endpoints: [\"127.0.0.1:9001\"]\n";

/* Loads TEXT; *ERRS receives everything printed on the error stream (caller frees). */
static struct config *load_text(const char *text, char **errs)
{
	size_t len = 0;
	FILE *f = open_memstream(errs, &len);
	struct config *c;

	assert_non_null(f);
	c = config_load_buffer("t.yaml", text, strlen(text), f);
	fclose(f);
	return c;
}

static struct config *load_ok(const char *text)
{
	char *errs = NULL;
	struct config *c = load_text(text, &errs);
	if (!c)
		fail_msg("config did not load:\n%s", errs);
	assert_string_equal(errs, "");
	free(errs);
	return c;
}

static char *slurp(const char *path)
{
	FILE *f = fopen(path, "rb");
	char *buf;
	long n;

	if (!f)
		fail_msg("cannot open %s (tests run from the repository root)", path);
	fseek(f, 0, SEEK_END);
	n = ftell(f);
	rewind(f);
	buf = malloc((size_t)n + 1);
	assert_non_null(buf);
	assert_int_equal(fread(buf, 1, (size_t)n, f), (size_t)n);
	buf[n] = '\0';
	fclose(f);
	return buf;
}

static void test_defaults(void **state)
{
	struct config *c = load_ok(minimal_yaml);
	const struct cfg_upstream *u;
	const struct cfg_listener *l;

	assert_string_equal(c->path, "t.yaml");
	assert_string_equal(c->admin_listen, "127.0.0.1:9901");
	assert_string_equal(c->admin_token, "");
	assert_int_equal(c->workers, 1);
	assert_int_equal(c->drain_timeout_us, 15 * S);
	assert_string_equal(c->access_log, "off");
	assert_int_equal(c->nwarnings, 0);

	assert_int_equal(c->nlisteners, 1);
	l = &c->listeners[0];
	assert_string_equal(l->name, "127.0.0.1:15001");   /* default: the address */
	assert_string_equal(l->listen, "127.0.0.1:15001");
	assert_false(l->tls);
	assert_null(l->tls_cert);
	assert_null(l->tls_key);
	assert_int_equal(l->limits.max_header_bytes, 32 * 1024);
	assert_int_equal(l->limits.header_timeout_us, 10 * S);
	assert_int_equal(l->limits.max_uri_bytes, 8 * 1024);
	assert_int_equal(l->limits.idle_timeout_us, 60 * S);
	assert_int_equal(l->limits.max_body, 0);
	assert_int_equal(l->limits.max_connections, 10000);
	assert_int_equal(l->nroutes, 1);
	assert_null(l->routes[0].host);
	assert_string_equal(l->routes[0].path_prefix, "/");
	assert_string_equal(l->routes[0].upstream_name, "a");

	assert_int_equal(c->nupstreams, 1);
	u = &c->upstreams[0];
	assert_ptr_equal(l->routes[0].upstream, u);
	assert_ptr_equal(config_upstream(c, "a"), u);
	assert_null(config_upstream(c, "b"));
	assert_string_equal(u->name, "a");
	assert_int_equal(u->nendpoints, 1);
	assert_string_equal(u->endpoints[0], "127.0.0.1:9001");
	assert_false(u->tls);
	assert_null(u->tls_sni);
	assert_null(u->tls_ca);
	assert_true(u->tls_verify);
	assert_string_equal(u->host_rewrite, "");
	assert_int_equal(u->connect_timeout_us, 250 * MS);
	assert_int_equal(u->deadline.default_us, 5 * S);
	assert_int_equal(u->deadline.max_us, 30 * S);
	assert_int_equal(u->deadline.min_us, 5 * MS);
	assert_int_equal(u->line, 6);

	const struct cfg_retry *r = &u->retry;
	assert_true(r->enabled);
	assert_int_equal(r->max_attempts, 3);
	assert_int_equal(r->per_try_timeout_us, 1 * S);
	assert_int_equal(r->on_flags, RETRY_ON_CONNECT_FAILURE | RETRY_ON_RESET | RETRY_ON_TIMEOUT);
	for (int s = 400; s <= 599; s++)
		assert_int_equal(cfg_retry_on_status(r, s), s == 502 || s == 503 || s == 504);
	assert_false(cfg_retry_on_status(r, 399));
	assert_false(cfg_retry_on_status(r, 600));
	/* SPEC §10: the default also retries gRPC UNAVAILABLE, and no other code */
	for (int g = 0; g < 17; g++)
		assert_int_equal(cfg_retry_on_grpc(r, g), g == 14);
	assert_false(cfg_retry_on_grpc(r, -1));
	assert_false(cfg_retry_on_grpc(r, 17));
	assert_int_equal(r->nidempotent_paths, 0);
	assert_int_equal(r->non_idempotent_line, 0);
	assert_int_equal(r->backoff_base_us, 25 * MS);
	assert_int_equal(r->backoff_max_us, 250 * MS);
	assert_true(r->retry_after_honor);
	assert_int_equal(r->retry_after_max_us, 10 * S);
	assert_true(r->budget_ratio == 0.2);
	assert_true(r->budget_min_per_second == 10);
	assert_int_equal(r->budget_max_tokens, 100);
	assert_int_equal(r->non_idempotent, NI_REQUIRE_KEY);
	assert_int_equal(r->max_body, 64 * 1024);
	assert_int_equal(u->max_in_flight, 256);
	assert_int_equal(u->max_retries_in_flight, 32);

	const struct cfg_idempotency *id = &u->idem;
	assert_false(id->enabled);
	assert_string_equal(id->header, "Idempotency-Key");
	assert_int_equal(id->nmethods, 2);
	assert_string_equal(id->methods[0], "POST");
	assert_string_equal(id->methods[1], "PATCH");
	assert_false(id->require_key);
	assert_int_equal(id->nscope_headers, 1);
	assert_string_equal(id->scope_headers[0], "Authorization");
	assert_int_equal(id->ttl_us, 24 * 3600 * S);
	assert_int_equal(id->lock_timeout_us, 30 * S);
	assert_int_equal(id->max_body, 1 << 20);
	assert_int_equal(id->max_response, 1 << 20);
	/* release_on: 429, 503 and resource-exhausted (a gRPC code under :status 200 only) */
	for (int s = 399; s <= 600; s++)
		assert_int_equal(cfg_idem_release_on(id, s, -1), s == 429 || s == 503);
	for (int g = -1; g < 17; g++)
		assert_int_equal(cfg_idem_release_on(id, 200, g), g == 8);
	assert_true(cfg_idem_release_on(id, 503, 0));       /* another :status is HTTP's */
	assert_false(cfg_idem_release_on(id, 500, 8));
	assert_string_equal(id->store, "memory");
	assert_null(id->store_host);
	config_unref(c);
}

static void test_values(void **state)
{
	struct config *c = load_ok(
		"admin: { listen: \"[::1]:9000\", token: \"t0k\" }\n"
		"workers: auto\n"
		"drain_timeout: 0\n"
		"access_log: stdout\n"
		"listeners:\n"
		"  - name: in\n"
		"    listen: \"[::1]:15001\"\n"
		"    tls: { cert: c.pem, key: k.pem }\n"
		"    limits: { max_header_bytes: 4KiB, max_uri_bytes: 16KiB, max_body: 1GiB }\n"
		"    routes:\n"
		"      - { host: \"API.Example.COM\", path_prefix: /v1/, upstream: b }\n"
		"      - { host: \"*.Example.com\", upstream: b }\n"
		"      - { host: \"*\", upstream: a }\n"
		"upstreams:\n"
		"  a: { endpoints: [\"a.internal:80\"] }\n"
		"  b:\n"
		"    endpoints: [\"[2001:db8::1]:443\", \"10.0.0.1:8443\"]\n"
		"    tls: { sni: b.internal }\n"
		"    retry:\n"
		"      on: [503, reset, 503, 429, reset, 400, 599, aborted, unauthenticated, aborted]\n"
		"      non_idempotent: never\n"
		"      idempotent_paths: [/shop.Catalog/, \"/v1/search\"]\n"
		"      backoff: { base: 0, max: 0 }\n"
		"      retry_after: { honor: false, max: 0s }\n"
		"    concurrency: { max_in_flight: 8, max_retries_in_flight: 100 }\n"
		"    idempotency:\n"
		"      enabled: true\n"
		"      methods: []\n"
		"      release_on: [unavailable, 503, unavailable, 599]\n"
		"      store: \"redis://user:p%40ss%3Aword@[::1]:6380/3\"\n");
	long cpus = sysconf(_SC_NPROCESSORS_ONLN);
	const struct cfg_upstream *b = config_upstream(c, "b");

	assert_int_equal(c->workers, cpus < 1 ? 1 : cpus > CFG_MAX_WORKERS ? CFG_MAX_WORKERS : cpus);
	assert_int_equal(c->drain_timeout_us, 0);
	assert_string_equal(c->admin_token, "t0k");
	assert_true(c->listeners[0].tls);
	assert_string_equal(c->listeners[0].tls_key, "k.pem");
	/* the smaller limit governs, and the loader says so */
	assert_int_equal(c->listeners[0].limits.max_uri_bytes, 4096);
	assert_int_equal(b->max_retries_in_flight, 8);
	assert_int_equal(c->nwarnings, 2);
	assert_non_null(strstr(c->warnings[0], "max_uri_bytes"));
	assert_non_null(strstr(c->warnings[1], "upstreams.b.concurrency.max_retries_in_flight"));
	/* host patterns lower-cased; "*" means any */
	assert_string_equal(c->listeners[0].routes[0].host, "api.example.com");
	assert_string_equal(c->listeners[0].routes[1].host, "*.example.com");
	assert_null(c->listeners[0].routes[2].host);
	assert_ptr_equal(c->listeners[0].routes[2].upstream, config_upstream(c, "a"));
	/* retry.on replaces the default, duplicates merged */
	assert_int_equal(b->retry.on_flags, RETRY_ON_RESET);
	for (int s = 400; s <= 599; s++)
		assert_int_equal(cfg_retry_on_status(&b->retry, s),
		                 s == 400 || s == 429 || s == 503 || s == 599);
	/* gRPC names replace the default's unavailable too */
	for (int g = 0; g < 17; g++)
		assert_int_equal(cfg_retry_on_grpc(&b->retry, g), g == 10 || g == 16);
	assert_int_equal(b->retry.nidempotent_paths, 2);
	assert_string_equal(b->retry.idempotent_paths[0], "/shop.Catalog/");
	assert_string_equal(b->retry.idempotent_paths[1], "/v1/search");
	assert_int_equal(b->retry.non_idempotent, NI_NEVER);
	assert_int_equal(b->retry.non_idempotent_line, 21);
	assert_false(b->retry.retry_after_honor);
	assert_true(b->tls);
	assert_true(b->tls_verify);
	assert_string_equal(b->tls_sni, "b.internal");
	assert_int_equal(b->idem.nmethods, 0);
	/* release_on replaces the default */
	for (int s = 400; s <= 599; s++)
		assert_int_equal(cfg_idem_release_on(&b->idem, s, -1), s == 503 || s == 599);
	for (int g = 0; g < 17; g++)
		assert_int_equal(cfg_idem_release_on(&b->idem, 200, g), g == 14);
	assert_string_equal(b->idem.store_host, "::1");
	assert_int_equal(b->idem.store_port, 6380);
	assert_int_equal(b->idem.store_db, 3);
	assert_string_equal(b->idem.store_user, "user");
	assert_string_equal(b->idem.store_password, "p@ss:word");
	config_unref(c);

	/* redis URL without port, db or user */
	c = load_ok("listeners: [{ listen: \"127.0.0.1:1\", routes: [{ upstream: a }] }]\n"
	            "upstreams:\n"
	            "  a:\n"
	            "    endpoints: [\"a:1\"]\n"
	            "    idempotency: { store: \"redis://cache.local\" }\n");
	assert_string_equal(c->upstreams[0].idem.store_host, "cache.local");
	assert_int_equal(c->upstreams[0].idem.store_port, 6379);
	assert_int_equal(c->upstreams[0].idem.store_db, 0);
	assert_null(c->upstreams[0].idem.store_user);
	assert_null(c->upstreams[0].idem.store_password);
	config_unref(c);
}

static void test_aliases_shared(void **state)
{
	struct config *c = load_ok(
		"listeners: [{ listen: \"127.0.0.1:1\", routes: [{ upstream: a }, { upstream: b }] }]\n"
		"upstreams:\n"
		"  a:\n"
		"    endpoints: [\"a:1\"]\n"
		"    retry: &fast { max_attempts: 2, per_try_timeout: 100ms }\n"
		"  b: { endpoints: [\"b:1\"], retry: *fast }\n");
	assert_int_equal(config_upstream(c, "b")->retry.max_attempts, 2);
	assert_int_equal(config_upstream(c, "b")->retry.per_try_timeout_us, 100 * MS);
	config_unref(c);
}

static void test_unknown_top_key(void **state)
{
	char *errs = NULL;
	struct config *c = load_text("x-policy: 1\n", &errs);
	assert_null(c);
	assert_non_null(strstr(errs, "t.yaml:1:1: x-policy: unknown key"));
	free(errs);
}

/* ------------------------------------------------------------------ the bad corpus */

static int check_bad_file(const char *path)
{
	char *text = slurp(path), *errs = NULL, *nl, want_prefix[512], *want_sub;
	size_t len = 0;
	int line, col, consumed = 0, ok = 1, nlines = 0;
	FILE *f;
	struct config *c;

	if (strncmp(text, "# expect: :", 11) != 0 ||
	    sscanf(text + 11, "%d:%d:%n", &line, &col, &consumed) != 2 || !consumed) {
		print_error("%s: first line must be \"# expect: :LINE:COL: message\"\n", path);
		free(text);
		return 0;
	}
	want_sub = text + 11 + consumed;
	while (*want_sub == ' ')
		want_sub++;
	if ((nl = strchr(want_sub, '\n')))
		*nl = '\0';
	snprintf(want_prefix, sizeof want_prefix, "%s:%d:%d: ", path, line, col);

	f = open_memstream(&errs, &len);
	c = config_load(path, f);
	fclose(f);
	for (const char *p = errs; *p; p++)
		nlines += *p == '\n';
	if (c) {
		print_error("%s: loaded, but should fail with %s%s\n", path, want_prefix, want_sub);
		config_unref(c);
		ok = 0;
	} else if (nlines != 1 || strncmp(errs, want_prefix, strlen(want_prefix)) != 0 ||
	           !strstr(errs, want_sub)) {
		print_error("%s: want exactly one error\n  %s...%s...\ngot:\n%s", path, want_prefix,
		            want_sub, errs);
		ok = 0;
	}
	free(errs);
	free(text);
	return ok;
}

static void test_bad_files(void **state)
{
	glob_t g;
	int failed = 0;

	assert_int_equal(glob("tests/conf/bad/*.yaml", 0, NULL, &g), 0);
	assert_true(g.gl_pathc >= 25);
	for (size_t i = 0; i < g.gl_pathc; i++)
		failed += !check_bad_file(g.gl_pathv[i]);
	globfree(&g);
	if (failed)
		fail_msg("%d bad config file(s) did not give their expected message", failed);
}

static void test_all_errors_reported(void **state)
{
	char *errs = NULL;
	struct config *c = load_text(
		"workers: 0\n"                                                  /* 1 */
		"bogus: 1\n"                                                    /* 2 */
		"listeners:\n"                                                  /* 3 */
		"  - listen: \"127.0.0.1:99999\"\n"                             /* 4 */
		"    routes: [{ upstream: nope }]\n"                            /* 5 */
		"  - listen: \"127.0.0.1:15002\"\n"                             /* 6 */
		"    routes: []\n"                                              /* 7 */
		"upstreams:\n"                                                  /* 8 */
		"  a:\n"                                                        /* 9 */
		"    endpoints: [\"x\"]\n"                                      /* 10 */
		"    deadline: { default: 1m, max: 30s }\n"                     /* 11 */
		"    retry: { max_attempts: 0, on: [5xx], enabled: maybe }\n",  /* 12 */
		&errs);
	static const char *const want[] = {
		"t.yaml:1:10: workers: ",
		"t.yaml:2:1: bogus: unknown key",
		"t.yaml:4:13: listeners[0].listen: bad address",
		("t.yaml:5:26: listeners[0].routes[0].upstream: upstream \"nope\" is not defined "
		 "(defined: a)"),
		"t.yaml:7:13: listeners[1].routes: empty",
		"t.yaml:10:17: upstreams.a.endpoints: bad endpoint \"x\"",
		"t.yaml:11:26: upstreams.a.deadline.default: deadline.default 1m is above deadline.max 30s",
		"t.yaml:12:28: upstreams.a.retry.max_attempts: ",
		"t.yaml:12:36: upstreams.a.retry.on: unknown condition \"5xx\"",
		"t.yaml:12:51: upstreams.a.retry.enabled: expected true or false",
	};
	const char *p = errs;

	assert_null(c);
	/* every error, one per line, in the order of the file */
	for (size_t i = 0; i < sizeof want / sizeof *want; i++) {
		if (strncmp(p, want[i], strlen(want[i])) != 0)
			fail_msg("error %zu: want \"%s...\", got:\n%s", i, want[i], p);
		p = strchr(p, '\n');
		assert_non_null(p);
		p++;
	}
	assert_string_equal(p, "");
	free(errs);
}

static void test_structure_limits(void **state)
{
	char *errs = NULL, *deep;
	size_t n = 0;
	/* "billion laughs": aliases that expand exponentially are refused, not expanded */
	char laughs[4096];
	int o = snprintf(laughs, sizeof laughs, "a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n");
	for (int i = 1; i < 9; i++)
		o += snprintf(laughs + o, sizeof laughs - (size_t)o,
		              "a%d: &a%d [*a%d, *a%d, *a%d, *a%d, *a%d, *a%d, *a%d, *a%d, *a%d, *a%d]\n",
		              i, i, i - 1, i - 1, i - 1, i - 1, i - 1, i - 1, i - 1, i - 1, i - 1, i - 1);
	assert_null(load_text(laughs, &errs));
	assert_non_null(strstr(errs, "expands to more than"));
	free(errs);

	/* deep nesting is refused before it can exhaust a stack */
	deep = malloc(20001);
	for (int i = 0; i < 10000; i++)
		deep[i] = '[';
	for (int i = 0; i < 10000; i++)
		deep[10000 + i] = ']';
	deep[20000] = '\0';
	assert_null(load_text(deep, &errs));
	assert_non_null(strstr(errs, "t.yaml:1:65: nested deeper than 64 levels"));
	free(errs);
	free(deep);

	/* a missing file */
	FILE *f = open_memstream(&errs, &n);
	assert_null(config_load("tests/conf/does-not-exist.yaml", f));
	fclose(f);
	assert_non_null(strstr(errs, "tests/conf/does-not-exist.yaml: cannot open"));
	free(errs);

	/* the error stream is optional */
	assert_null(config_load_buffer("x", "workers: [", 10, NULL));
}

/* ------------------------------------------------------------------ bounds */

/* minimal_yaml with WORKERS workers and N endpoints, one a line from line 7 on */
static char *bounds_yaml(const char *workers, int n)
{
	struct strbuf b = { 0 };

	sb_printf(&b, "workers: %s\nlisteners:\n  - listen: \"127.0.0.1:15001\"\n"
	          "    routes: [{ upstream: a }]\nupstreams:\n  a:\n    endpoints:\n", workers);
	for (int i = 0; i < n; i++)
		sb_printf(&b, "      - \"10.0.%d.%d:80\"\n", i / 250, i % 250 + 1);
	return b.s;
}

/* Workers and endpoints live in fixed arrays: the schema refuses what they cannot hold, with
 * the maximum in the message, instead of a silent clamp at startup. */
static void test_bounds(void **state)
{
	static const struct {
		const char *workers;
		int endpoints;
		const char *err;        /* NULL: loads */
	} rows[] = {
		{ "1", 1, NULL },
		{ "64", 1, NULL },
		{ "auto", 1, NULL },
		{ "65", 1, "t.yaml:1:10: workers: \"65\" is too large (expected at most 64)\n" },
		{ "1024", 1, "t.yaml:1:10: workers: \"1024\" is too large (expected at most 64)\n" },
		{ "1", 64, NULL },
		/* endpoint i is on line 8 + i: the error is at the 65th (i = 64) */
		{ "1", 65, "t.yaml:72:9: upstreams.a.endpoints: 65 entries are too many "
		           "(expected at most 64)\n" },
		{ "1", 200, "t.yaml:72:9: upstreams.a.endpoints: 200 entries are too many "
		            "(expected at most 64)\n" },
	};

	for (size_t i = 0; i < sizeof rows / sizeof *rows; i++) {
		char *text = bounds_yaml(rows[i].workers, rows[i].endpoints), *errs = NULL;
		struct config *c = load_text(text, &errs);

		if (!rows[i].err) {
			if (!c)
				fail_msg("row %zu: did not load:\n%s", i, errs);
			assert_string_equal(errs, "");
			assert_true(c->workers >= 1 && c->workers <= CFG_MAX_WORKERS);
			assert_int_equal(c->upstreams[0].nendpoints, rows[i].endpoints);
			config_unref(c);
		} else {
			assert_null(c);
			assert_string_equal(errs, rows[i].err);
		}
		free(errs);
		free(text);
	}
}

/* ------------------------------------------------------------------ shipped configs */

static void test_shipped_configs(void **state)
{
	glob_t g;
	const char *fixed[] = { "conf/retrygate.yaml", "conf/demo.yaml" };
	char *errs = NULL;
	size_t len;

	assert_int_equal(glob("conf/examples/*.yaml", 0, NULL, &g), 0);
	assert_true(g.gl_pathc >= 2);
	for (size_t i = 0; i < 2 + g.gl_pathc; i++) {
		const char *path = i < 2 ? fixed[i] : g.gl_pathv[i - 2];
		FILE *f = open_memstream(&errs, &len);
		struct config *c = config_load(path, f);
		fclose(f);
		if (!c)
			fail_msg("%s does not load:\n%s", path, errs);
		assert_string_equal(errs, "");
		free(errs);
		config_unref(c);
	}
	globfree(&g);
}

/* conf/retrygate.yaml is the reference: the make-run config the SPEC describes */
static void test_reference_config(void **state)
{
	char *errs = NULL;
	size_t len;
	FILE *f = open_memstream(&errs, &len);
	struct config *c = config_load("conf/retrygate.yaml", f);
	fclose(f);
	free(errs);
	assert_non_null(c);
	assert_string_equal(c->admin_listen, "127.0.0.1:9901");
	assert_int_equal(c->nlisteners, 1);
	assert_string_equal(c->listeners[0].name, "egress");
	assert_string_equal(c->listeners[0].listen, "127.0.0.1:15001");
	assert_null(c->listeners[0].routes[0].host);
	assert_string_equal(c->listeners[0].routes[0].path_prefix, "/");
	assert_string_equal(c->listeners[0].routes[0].upstream->name, "demo");
	assert_int_equal(c->upstreams[0].nendpoints, 1);
	assert_string_equal(c->upstreams[0].endpoints[0], "127.0.0.1:9001");
	config_unref(c);
}

struct doc_check {
	const char *text;
	int missing;
};

/* Is "NAME:" written as a key at or after FROM: at a line start, after indentation, "- ",
 * "# ", "{" or ","? Returns where, or NULL. */
static const char *find_key(const char *from, const char *name)
{
	size_t n = strlen(name);
	for (const char *p = strstr(from, name); p; p = strstr(p + 1, name)) {
		char before = p == from ? '\n' : p[-1];
		if (p[n] == ':' && (before == '\n' || before == ' ' || before == '{' ||
		                    before == ',' || before == '#'))
			return p;
	}
	return NULL;
}

static void doc_check_cb(const char *dotted, void *arg)
{
	struct doc_check *d = arg;
	char path[256], *save = NULL;
	const char *at = d->text;

	/* each component appears after its parent's: "upstreams" ... "retry" ... "backoff" ... */
	snprintf(path, sizeof path, "%s", dotted);
	for (char *part = strtok_r(path, ".", &save); part; part = strtok_r(NULL, ".", &save)) {
		if (!(at = find_key(at, part))) {
			print_error("conf/retrygate.yaml does not document %s\n", dotted);
			d->missing++;
			return;
		}
	}
}

static void count_cb(const char *dotted, void *arg)
{
	(*(int *)arg)++;
	assert_null(strstr(dotted, ".."));
}

static void test_every_key_documented(void **state)
{
	struct doc_check d = { slurp("conf/retrygate.yaml"), 0 };
	int n = 0;

	config_schema_keys(count_cb, &n);
	/* SPEC §2 has 66 keys, blocks included; fewer means the walk lost some */
	assert_true(n >= 66);
	config_schema_keys(doc_check_cb, &d);
	free((char *)d.text);
	if (d.missing)
		fail_msg("%d schema key(s) missing from conf/retrygate.yaml", d.missing);
}

/* ------------------------------------------------------------------ report and JSON */

static char *report_of(const struct config *c)
{
	char *out = NULL;
	size_t len;
	FILE *f = open_memstream(&out, &len);
	config_report(c, f);
	fclose(f);
	return out;
}

static bool ends_with(const char *s, const char *suffix)
{
	size_t n = strlen(s), m = strlen(suffix);
	return n >= m && !strcmp(s + (n - m), suffix);
}

static void assert_contains(const char *hay, const char *needle)
{
	if (!strstr(hay, needle))
		fail_msg("missing \"%s\" in:\n%s", needle, hay);
}

static void assert_lacks(const char *hay, const char *needle)
{
	if (strstr(hay, needle))
		fail_msg("unexpected \"%s\" in:\n%s", needle, hay);
}

static void test_report(void **state)
{
	struct config *c = load_ok(minimal_yaml);
	char *r = report_of(c);

	assert_contains(r, "upstream a: 1 endpoint (127.0.0.1:9001)");
	assert_contains(r, "up to 3 per request, on connect-failure, reset, timeout, 502, 503, 504, "
	                   "unavailable;");
	assert_lacks(r, "idempotent     ");
	assert_contains(r, "retries <= 100 + 0.2 x requests + 10/s: a burst of 100 retries (max_tokens), "
	                   "never above 3x per request (max_attempts)\n");
	/* 1 + ratio + min_per_second / rate: the time term dominates at low traffic */
	assert_contains(r, "  sustained      3.00x at 1 first attempt/s (max_attempts), 2.20x at 10/s, "
	                   "1.30x at 100/s, 1.21x at 1000/s\n");
	assert_contains(r, "worst case 3 x 1s + 75ms backoff = 3.075s; fits deadline.default 5s and "
	                   "deadline.max 30s");
	assert_contains(r, "hints up to 10s are waited for");
	assert_lacks(r, "warning:");
	assert_true(ends_with(r, "\nt.yaml: ok\n"));
	free(r);
	config_unref(c);

	c = load_ok(
		"listeners:\n"
		"  - listen: \"127.0.0.1:15001\"\n"
		"    limits: { max_header_bytes: 4KiB, max_uri_bytes: 8KiB }\n"
		"    routes: [{ upstream: a }, { upstream: off }]\n"
		"upstreams:\n"
		"  a:\n"
		"    endpoints: [\"a:1\"]\n"
		"    deadline: { default: 2s, max: 3s }\n"
		"    retry:\n"
		"      max_attempts: 4\n"
		"      per_try_timeout: 800ms\n"
		"      on: [reset, 404, 408, 425, 429, 503]\n"
		"      non_idempotent: always\n"
		"      budget: { ratio: 0.7, max_tokens: 5000 }\n"
		"    concurrency: { max_in_flight: 10, max_retries_in_flight: 50 }\n"
		"  off:\n"
		"    endpoints: [\"b:1\"]\n"
		"    retry: { enabled: false, per_try_timeout: 40s }\n"
		"  lonely:\n"
		"    endpoints: [\"c:1\"]\n"
		"    idempotency: { enabled: true, release_on: [503, unavailable] }\n");
	r = report_of(c);
	assert_contains(r, "retries <= 5000 + 0.7 x requests + 10/s: a burst of 5000 retries");
	assert_contains(r, "4.00x at 1 first attempt/s (max_attempts), 2.70x at 10/s, 1.80x at 100/s, "
	                   "1.71x at 1000/s\n");
	/* 0, 825ms, 1.675s, 2.575s: the third starts, is cut at 2s; the fourth never starts */
	assert_contains(r, "worst case 4 x 800ms + 175ms backoff = 3.375s; deadline.default 2s cuts "
	                   "attempt 3 of 4 short; deadline.max 3s cuts attempt 4 of 4 short");
	assert_contains(r, "only up to 1.995s fit deadline.default");
	assert_contains(r, "1 per request (retries disabled)");
	assert_contains(r, "none: 1.00x");
	assert_contains(r, "warning: listeners[0].limits.max_uri_bytes: 8KiB is above max_header_bytes "
	                   "4KiB; 4KiB governs");
	assert_contains(r, "warning: upstreams.a.concurrency.max_retries_in_flight: 50 is above "
	                   "max_in_flight 10; 10 governs");
	assert_contains(r, "warning: upstreams.a.retry.non_idempotent: always");
	assert_contains(r, "warning: upstreams.a.retry: max_attempts 4 x per_try_timeout 800ms cannot "
	                   "fit deadline.default 2s");
	assert_contains(r, "warning: upstreams.a.retry.budget.ratio: 0.7");
	assert_contains(r, "warning: upstreams.a.retry.budget.max_tokens: 5000");
	assert_contains(r, "warning: upstreams.a.retry.on: 404 is a client error");
	assert_contains(r, "warning: upstreams.lonely.idempotency.release_on: unavailable releases "
	                   "the key of a call the service may have run");
	assert_lacks(r, "upstreams.a.idempotency.release_on");
	assert_lacks(r, "on: 408 is");
	assert_lacks(r, "on: 425 is");
	assert_lacks(r, "on: 429 is");
	assert_contains(r, "warning: upstreams.off.retry.per_try_timeout: 40s is above deadline.max");
	assert_contains(r, "warning: upstreams.lonely: no route uses it");
	/* disabled retries are not unsafe: no budget or fit warnings for them */
	assert_lacks(r, "upstreams.off.retry:");
	assert_contains(r, "t.yaml: ok\n");
	free(r);
	config_unref(c);

	/* SPEC §10: an h2 upstream replaying every gRPC call is named with the key's line; the
	 * idempotent paths are listed per upstream */
	c = load_ok("listeners: [{ listen: \"127.0.0.1:1\", routes: [{ upstream: g }, "
	            "{ path_prefix: /h, upstream: h }] }]\n"
	            "upstreams:\n"
	            "  g:\n"
	            "    endpoints: [\"a:1\"]\n"
	            "    protocol: h2\n"
	            "    retry:\n"
	            "      on: [unavailable, resource-exhausted]\n"
	            "      idempotent_paths: [/shop.Catalog/, /shop.Search/]\n"
	            "      non_idempotent: always\n"
	            "  h:\n"
	            "    endpoints: [\"b:1\"]\n"
	            "    retry: { non_idempotent: always }\n");
	r = report_of(c);
	assert_contains(r, "up to 3 per request, on resource-exhausted, unavailable;");
	assert_contains(r, "  idempotent     any method under /shop.Catalog/, /shop.Search/ "
	                   "(retry.idempotent_paths)\n");
	assert_contains(r, "warning: upstreams.g.retry.non_idempotent: t.yaml:9: always with "
	                   "protocol: h2 re-sends every gRPC call");
	/* an HTTP/1 upstream gets the general warning only */
	assert_contains(r, "warning: upstreams.h.retry.non_idempotent: always re-sends");
	assert_lacks(r, "upstreams.h.retry.non_idempotent: t.yaml");
	free(r);
	config_unref(c);

	/* a catch-all route shadows later ones */
	c = load_ok("listeners: [{ listen: \"127.0.0.1:1\", routes: [{ upstream: a },\n"
	            "  { host: x.example.com, path_prefix: /api, upstream: a },\n"
	            "  { host: \"*.example.com\", upstream: a }] }]\n"
	            "upstreams: { a: { endpoints: [\"a:1\"] } }\n");
	r = report_of(c);
	assert_contains(r, "warning: listeners[0].routes[1]: never used: routes[0]");
	free(r);
	config_unref(c);
}

static void test_json(void **state)
{
	struct config *c = load_ok(
		"admin: { token: \"s3cr3t-token\" }\n"
		"access_log: \"/tmp/a \\\"b\\\" \\\\ c\\tz\"\n"
		"listeners: [{ listen: \"127.0.0.1:1\", routes: [{ upstream: a }] }]\n"
		"upstreams:\n"
		"  a:\n"
		"    endpoints: [\"a:1\"]\n"
		"    deadline: { default: 90s, max: 2h, min: 1500 }\n"
		"    idempotency: { store: \"redis://app:hunter2@db:6379/1\" }\n");
	char *j = config_to_json(c);

	assert_contains(j, "\"token\": \"<redacted>\"");
	assert_lacks(j, "s3cr3t");
	assert_contains(j, "\"store\": \"redis://app:<redacted>@db:6379/1\"");
	assert_lacks(j, "hunter2");
	assert_contains(j, "\"access_log\": \"/tmp/a \\\"b\\\" \\\\ c\\tz\"");
	/* durations in the largest exact unit, sizes in bytes */
	assert_contains(j, "\"default\": \"90s\"");
	assert_contains(j, "\"max\": \"2h\"");
	assert_contains(j, "\"min\": \"1500ms\"");
	assert_contains(j, "\"max_header_bytes\": 32768");
	assert_contains(j, "\"on\": [\"connect-failure\", \"reset\", \"timeout\", 502, 503, 504, "
	                   "\"unavailable\"]");
	assert_contains(j, "\"idempotent_paths\": []");
	assert_contains(j, "\"release_on\": [429, 503, \"resource-exhausted\"]");
	assert_contains(j, "\"tls\": null");
	assert_contains(j, "\"ratio\": 0.2,");
	free(j);
	config_unref(c);

	/* an empty token stays visibly empty */
	c = load_ok(minimal_yaml);
	j = config_to_json(c);
	assert_contains(j, "\"token\": \"\"");
	assert_contains(j, "\"store\": \"memory\"");
	free(j);
	config_unref(c);
}

/* SPEC §2: a route's retry and deadline are its upstream's with the route's keys written over
 * them, key by key (nested blocks too); a route that writes none shares the upstream's. */
static void test_route_policy_merge(void **state)
{
	struct config *c = load_ok(
		"listeners:\n"
		"  - listen: \"127.0.0.1:15001\"\n"
		"    routes:\n"
		"      - { path_prefix: /read/, upstream: a, retry: { max_attempts: 5, backoff: { max: 1s } } }\n"
		"      - path_prefix: /stream/\n"
		"        upstream: a\n"
		"        deadline: { default: 20s }\n"
		"        retry: { enabled: false, idempotent_paths: [/s/] }\n"
		"      - { upstream: a }\n"
		"upstreams:\n"
		"  a:\n"
		"    endpoints: [\"127.0.0.1:9001\"]\n"
		"    deadline: { default: 2s, max: 40s }\n"
		"    retry:\n"
		"      per_try_timeout: 3s\n"
		"      backoff: { base: 10ms, max: 20ms }\n"
		"      idempotent_paths: [/r/]\n"
		"      budget: { max_tokens: 7 }\n");
	const struct cfg_upstream *u = &c->upstreams[0];
	const struct cfg_route *rd = &c->listeners[0].routes[0], *st = &c->listeners[0].routes[1],
	                       *all = &c->listeners[0].routes[2];

	/* no override: the upstream's own structs, nothing copied */
	assert_ptr_equal(all->retry, &u->retry);
	assert_ptr_equal(all->deadline, &u->deadline);
	assert_false(all->has_retry || all->has_deadline);

	assert_ptr_equal(rd->retry, &rd->own_retry);
	assert_ptr_equal(rd->deadline, &u->deadline);
	assert_int_equal(rd->retry->max_attempts, 5);
	assert_int_equal(rd->retry->per_try_timeout_us, 3 * S);         /* inherited */
	assert_int_equal(rd->retry->backoff_base_us, 10 * MS);          /* inherited in a block */
	assert_int_equal(rd->retry->backoff_max_us, 1 * S);             /* written */
	assert_int_equal(rd->retry->budget_max_tokens, 7);              /* always the upstream's */
	assert_int_equal(rd->retry->nidempotent_paths, 1);
	assert_string_equal(rd->retry->idempotent_paths[0], "/r/");
	assert_ptr_not_equal(rd->retry->idempotent_paths, u->retry.idempotent_paths);
	assert_int_equal(u->retry.max_attempts, 3);                     /* the upstream unchanged */
	assert_int_equal(u->retry.backoff_max_us, 20 * MS);

	assert_ptr_equal(st->deadline, &st->own_deadline);
	assert_int_equal(st->deadline->default_us, 20 * S);
	assert_int_equal(st->deadline->max_us, 40 * S);                 /* inherited */
	assert_int_equal(st->deadline->min_us, 5 * MS);
	assert_false(st->retry->enabled);
	assert_int_equal(st->retry->max_attempts, 3);
	assert_string_equal(st->retry->idempotent_paths[0], "/s/");
	assert_int_equal(u->deadline.default_us, 2 * S);
	config_unref(c);
}

/* Errors in a route's policy: at their own line and column, judged against the merged values */
static void test_route_policy_errors(void **state)
{
	char *errs = NULL;
	struct config *c = load_text(
		"listeners:\n"
		"  - listen: \"127.0.0.1:15001\"\n"
		"    routes:\n"
		"      - upstream: a\n"
		"        retry:\n"
		"          budget: { ratio: 1 }\n"
		"      - upstream: a\n"
		"        deadline: { default: 31s }\n"
		"      - upstream: a\n"
		"        retry: { backoff: { base: 1s } }\n"
		"upstreams:\n"
		"  a:\n"
		"    endpoints: [\"127.0.0.1:9001\"]\n", &errs);
	assert_null(c);
	if (!strstr(errs, "t.yaml:6:11: listeners[0].routes[0].retry.budget: budget is per upstream") ||
	    !strstr(errs, "t.yaml:8:30: listeners[0].routes[1].deadline.default: deadline.default "
	                  "31s is above deadline.max 30s") ||
	    !strstr(errs, "t.yaml:10:35: listeners[0].routes[2].retry.backoff.base: backoff.base 1s "
	                  "is above backoff.max 250ms"))
		fail_msg("unexpected errors:\n%s", errs);
	free(errs);
}

static void test_refcount(void **state)
{
	struct config *c = load_ok(minimal_yaml);
	assert_ptr_equal(config_ref(c), c);
	assert_int_equal(atomic_load(&c->refs), 2);
	config_unref(c);
	assert_int_equal(atomic_load(&c->refs), 1);
	config_unref(c);      /* frees: ASan/valgrind check there is nothing left */
	config_unref(NULL);
}

/* ${NAME}: a whole value, or inside a redis:// URL's user:password (percent-encoded there);
 * never a key, never elsewhere inside a value; unset: an error at the value. */
static void test_env_values(void **state)
{
	setenv("RG_UT_TOKEN", "tok-from-env", 1);
	setenv("RG_UT_PASS", "p@ss:w/rd", 1);
	setenv("RG_UT_EMPTY", "", 1);
	struct config *c = load_ok(
		"admin:\n"
		"  token: ${RG_UT_TOKEN}\n"
		"access_log: \"${RG_UT_EMPTY}off\"\n"
		"listeners: [{ listen: \"127.0.0.1:1\", routes: [{ upstream: a, path_prefix: \"/${x}\" }] }]\n"
		"upstreams:\n"
		"  a:\n"
		"    endpoints: [\"a:1\"]\n"
		"    host_rewrite: \"${RG_UT_EMPTY}\"\n"
		"    idempotency: { store: \"redis://u:${RG_UT_PASS}@db:6379/1\" }\n");
	assert_string_equal(c->admin_token, "tok-from-env");
	assert_string_equal(c->access_log, "${RG_UT_EMPTY}off");
	assert_string_equal(c->listeners[0].routes[0].path_prefix, "/${x}");
	assert_string_equal(c->upstreams[0].host_rewrite, "");
	assert_string_equal(c->upstreams[0].idem.store, "redis://u:p%40ss%3Aw%2Frd@db:6379/1");
	assert_string_equal(c->upstreams[0].idem.store_password, "p@ss:w/rd");
	char *j = config_to_json(c);
	assert_contains(j, "\"token\": \"<redacted>\"");
	assert_contains(j, "\"host_rewrite\": \"<redacted>\"");
	assert_contains(j, "\"store\": \"redis://u:<redacted>@db:6379/1\"");
	assert_lacks(j, "tok-from-env");
	assert_lacks(j, "p%40ss");
	free(j);
	config_unref(c);

	char *errs = NULL;
	unsetenv("RG_UT_UNSET");
	assert_null(load_text("admin:\n  token: \"${RG_UT_UNSET}\"\n", &errs));
	assert_string_equal(errs, "t.yaml:2:10: environment variable RG_UT_UNSET is not set (the "
	                          "value is ${RG_UT_UNSET})\n");
	free(errs);
}

/* ------------------------------------------------------------------ --check reads the files */

static void write_file(const char *path, const char *text)
{
	FILE *f = fopen(path, "w");
	assert_non_null(f);
	fputs(text, f);
	fclose(f);
}

/* config_load_check (--check) reads every file the config names and reports each one that is
 * unusable at the key naming it; config_load leaves them to startup. */
static void test_check_files(void **state)
{
	char dir[] = "/tmp/rg-check-XXXXXX", cfg[96], junk[96], log_ok[96], text[2048], *errs = NULL;
	size_t len = 0;
	struct config *c;
	FILE *f;

	assert_non_null(mkdtemp(dir));
	snprintf(cfg, sizeof cfg, "%s/c.yaml", dir);
	snprintf(junk, sizeof junk, "%s/junk.pem", dir);
	snprintf(log_ok, sizeof log_ok, "%s/access.log", dir);
	write_file(junk, "not PEM\n");
	snprintf(text, sizeof text,
	         "access_log: %s/no/such/dir/access.log\n"                         /* 1 */
	         "listeners:\n"                                                    /* 2 */
	         "  - listen: \"127.0.0.1:15001\"\n"                               /* 3 */
	         "    tls: { cert: %s, key: %s/missing.pem }\n"                    /* 4 */
	         "    routes: [{ upstream: a }]\n"                                 /* 5 */
	         "upstreams:\n"                                                    /* 6 */
	         "  a:\n"                                                          /* 7 */
	         "    endpoints: [\"127.0.0.1:9001\"]\n"                           /* 8 */
	         "    tls: { ca: %s }\n",                                          /* 9 */
	         dir, junk, dir, junk);
	write_file(cfg, text);

	/* a normal load does not look at them */
	c = config_load(cfg, stderr);
	assert_non_null(c);
	config_unref(c);

	f = open_memstream(&errs, &len);
	assert_null(config_load_check(cfg, f));
	fclose(f);
	assert_contains(errs, ":1:13: access_log: cannot create \"");
	assert_contains(errs, "/no/such/dir/access.log\": directory ");
	assert_contains(errs, ":4:18: listeners[0].tls.cert: \"");
	assert_contains(errs, "junk.pem\" does not hold a PEM certificate\n");
	assert_contains(errs, "listeners[0].tls.key: cannot read \"");
	assert_contains(errs, "missing.pem\": No such file or directory (expected a readable file "
	                      "with a PEM private key without a passphrase)\n");
	assert_contains(errs, ":9:16: upstreams.a.tls.ca: \"");
	assert_contains(errs, "junk.pem\" does not hold PEM CA certificates\n");
	free(errs);

	/* no TLS, a log in a writable directory: nothing to say */
	snprintf(text, sizeof text, "access_log: %s\n%s", log_ok, minimal_yaml);
	write_file(cfg, text);
	f = open_memstream(&errs, &len);
	c = config_load_check(cfg, f);
	fclose(f);
	assert_non_null(c);
	assert_string_equal(errs, "");
	free(errs);
	config_unref(c);

	unlink(junk);
	unlink(cfg);
	rmdir(dir);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_defaults),
		cmocka_unit_test(test_values),
		cmocka_unit_test(test_env_values),
		cmocka_unit_test(test_aliases_shared),
		cmocka_unit_test(test_unknown_top_key),
		cmocka_unit_test(test_bad_files),
		cmocka_unit_test(test_all_errors_reported),
		cmocka_unit_test(test_structure_limits),
		cmocka_unit_test(test_bounds),
		cmocka_unit_test(test_check_files),
		cmocka_unit_test(test_shipped_configs),
		cmocka_unit_test(test_reference_config),
		cmocka_unit_test(test_every_key_documented),
		cmocka_unit_test(test_report),
		cmocka_unit_test(test_json),
		cmocka_unit_test(test_route_policy_merge),
		cmocka_unit_test(test_route_policy_errors),
		cmocka_unit_test(test_refcount),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
