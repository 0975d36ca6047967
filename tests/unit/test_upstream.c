/*
 * test_upstream: the lifetime of the upstream registry across reloads, without sockets.
 * Runtimes are built from YAML text and published as SIGHUP does; the registry is observed
 * through its stats walker. Checks that endpoint and upstream states no live runtime names are
 * forgotten (their index reused, nothing growing), that a runtime still serving a request keeps
 * its states, that per-upstream state is kept by name while configured, and that a worker's
 * pool never confuses a forgotten endpoint with the new one that took its index.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <netinet/in.h>
#include <arpa/inet.h>

#include "policy/budget.h"
#include "base/clock.h"
#include "config/config.h"
#include "base/loop.h"
#include "upstream/pool.h"
#include "state/runtime.h"
#include "state/upstream.h"

/* a config with upstream "a" on 127.0.0.1:PORT (none when PORT is 0), and "b" on :9 */
static struct config *cfg_with(int port, bool with_b)
{
	char a[128] = "", text[1024];
	if (port)
		snprintf(a, sizeof(a), "  a:\n    endpoints: [\"127.0.0.1:%d\"]\n", port);
	snprintf(text, sizeof(text),
	         "listeners:\n"
	         "  - listen: \"127.0.0.1:15001\"\n"
	         "    routes: [{ upstream: %s }]\n"
	         "upstreams:\n%s%s",
	         port ? "a" : "b", a, with_b ? "  b:\n    endpoints: [\"127.0.0.1:9\"]\n" : "");
	char *errs = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&errs, &len);
	struct config *c = config_load_buffer("t.yaml", text, strlen(text), f);
	fclose(f);
	if (!c)
		fail_msg("config did not load:\n%s\n%s", text, errs);
	free(errs);
	return c;
}

/* Build and publish, as on_hup does; returns the state binding of upstream NAME. */
static struct upstream_binding *reload(struct config *cfg, const char *name)
{
	char err[256] = "";
	struct runtime *rt = runtime_new(cfg, err, sizeof(err));
	config_unref(cfg);
	if (!rt)
		fail_msg("runtime_new: %s", err);
	runtime_publish(rt);
	for (int i = 0; i < rt->cfg->nupstreams; i++)
		if (strcmp(rt->cfg->upstreams[i].name, name) == 0)
			return &rt->ups[i];
	return NULL;
}

struct census {
	int upstreams, endpoints;
	bool a_enabled;
};

static void census_cb(void *arg, const struct stats_upstream *u)
{
	struct census *c = arg;
	c->upstreams++;
	c->endpoints += u->nendpoints;
	if (strcmp(u->name, "a") == 0)
		c->a_enabled = u->retries_enabled;
}

static struct census census(void)
{
	struct census c = { 0, 0, false };
	runtime_stats_walk(census_cb, &c);
	return c;
}

/* The address of B's first (literal) endpoint. */
static struct ep_state *ep0(struct upstream_binding *b)
{
	struct ep_state *eps[MAX_ENDPOINTS];
	assert_int_equal(runtime_endpoints(b, eps), 1);
	return eps[0];
}

/* Forget what retired, as the resolver's tick does once the grace has passed. */
static void sweep(void)
{
	upstream_sweep(clock_now_us() + EP_GRACE_US);
}

static int teardown(void **state)
{
	runtime_publish_none();
	upstream_states_free();
	return 0;
}

static void test_reloads_with_new_endpoints_reuse_the_index(void **state)
{
	struct upstream_binding *b = reload(cfg_with(20000, false), "a");
	struct upstream_state *st = b->st;
	for (int i = 1; i <= 70; i++) {
		b = reload(cfg_with(20000 + i, false), "a");
		sweep();
		assert_ptr_equal(b->st, st);                /* kept by name */
		assert_non_null(ep0(b));
		/* the new one is bound while the old one still serves: two indexes, taken in turn */
		assert_int_equal(ep0(b)->index, i % 2);
		struct census c = census();
		assert_int_equal(c.upstreams, 1);
		assert_int_equal(c.endpoints, 1);
	}
}

static void test_runtime_in_use_keeps_its_endpoint(void **state)
{
	struct upstream_binding *b = reload(cfg_with(20000, false), "a");
	struct runtime *in_flight = runtime_current();   /* a request still being served */
	struct ep_state *old = ep0(b);
	uint64_t serial = atomic_load(&old->serial);
	int id = b->st->id;
	b = reload(cfg_with(20001, false), "a");
	assert_int_equal(ep0(b)->index, 1);
	assert_true(upstream_ep_live(id, 0, serial));
	assert_string_equal(old->name, "127.0.0.1:20000");  /* still alive, still readable */
	assert_int_equal(census().endpoints, 2);
	uint64_t epoch = upstream_forget_epoch();
	runtime_unref(in_flight);                          /* the request ended */
	assert_true(upstream_ep_live(id, 0, serial));      /* retired: draining, not yet forgotten */
	assert_false(upstream_ep_usable(old, serial));     /* but no new attempt goes there */
	sweep();
	assert_false(upstream_ep_live(id, 0, serial));
	assert_true(upstream_forget_epoch() != epoch);
	assert_int_equal(census().endpoints, 1);
	assert_true(upstream_ep_live(id, 1, ep0(b)->serial));
}

static void test_upstream_state_kept_by_name_forgotten_when_removed(void **state)
{
	struct upstream_binding *b = reload(cfg_with(20000, true), "a");
	struct upstream_state *st = b->st;
	int64_t now = clock_now_us();
	assert_true(budget_take(&st->budget, &b->cfg->retry, now));
	double tokens = budget_tokens(&st->budget, &b->cfg->retry, now);
	atomic_store(&st->runtime_enabled, false);
	b = reload(cfg_with(20001, true), "a");
	assert_ptr_equal(b->st, st);
	assert_false(atomic_load(&b->st->runtime_enabled));
	assert_true(budget_tokens(&b->st->budget, &b->cfg->retry, now) <= tokens + 0.5);
	/* "a" removed: forgotten; added back: fresh */
	reload(cfg_with(0, true), "b");
	struct census c = census();
	assert_int_equal(c.upstreams, 1);
	b = reload(cfg_with(20002, true), "a");
	assert_true(atomic_load(&b->st->runtime_enabled));
	assert_int_equal(census().upstreams, 2);
}

static void test_more_endpoints_alive_than_indexes_fails_the_reload(void **state)
{
	reload(cfg_with(20000, false), "a");
	struct runtime *held[MAX_ENDPOINTS];
	for (int i = 0; i < MAX_ENDPOINTS - 1; i++) {
		held[i] = runtime_current();
		reload(cfg_with(20001 + i, false), "a");
	}
	held[MAX_ENDPOINTS - 1] = runtime_current();
	char err[256] = "";
	struct config *cfg = cfg_with(30000, false);
	assert_null(runtime_new(cfg, err, sizeof(err)));
	assert_non_null(strstr(err, "upstream a: more than 64 endpoints in use at once"));
	assert_int_equal(census().endpoints, MAX_ENDPOINTS);   /* the failed one left nothing */
	for (int i = 0; i < MAX_ENDPOINTS; i++)
		runtime_unref(held[i]);
	sweep();
	struct runtime *rt = runtime_new(cfg, err, sizeof(err));
	assert_non_null(rt);
	config_unref(cfg);
	runtime_publish(rt);
	sweep();
	assert_int_equal(census().endpoints, 1);
}

static void test_pool_of_a_forgotten_endpoint_is_not_reused(void **state)
{
	struct loop l;
	memset(&l, 0, sizeof(l));
	struct upstream_binding *b = reload(cfg_with(20000, true), "a");
	struct pool_ep *pe = pool_ep_get(&l, ep0(b));
	assert_ptr_equal(pool_ep_get(&l, ep0(b)), pe);
	assert_string_equal(pe->name, "127.0.0.1:20000");
	reload(cfg_with(20001, true), "a");
	sweep();
	b = reload(cfg_with(20002, true), "a");
	sweep();
	assert_int_equal(ep0(b)->index, 0);          /* the slot is reused */
	struct pool_ep *pe2 = pool_ep_get(&l, ep0(b));
	assert_int_equal(pe2->serial, ep0(b)->serial);
	assert_string_equal(pe2->name, "127.0.0.1:20002");
	/* nothing of the old endpoint: the address is the new one's */
	assert_int_equal(ntohs(((struct sockaddr_in *)&pe2->addr)->sin_port), 20002);
	/* a forgotten upstream's pools are swept when another pool is asked for */
	struct upstream_binding *bb = reload(cfg_with(0, true), "b");
	pool_ep_get(&l, ep0(bb));
	pool_free_all(&l);
}

/* Reloads faster than the grace: the retired addresses give their indexes up to new ones, and
 * are freed by the sweep once unreferenced. */
static void test_quick_reloads_never_run_out_of_indexes(void **state)
{
	struct upstream_binding *b = reload(cfg_with(20000, false), "a");
	int id = b->st->id;
	uint64_t first = atomic_load(&ep0(b)->serial);
	for (int i = 1; i <= 3 * MAX_ENDPOINTS; i++) {
		b = reload(cfg_with(20000 + i, false), "a");     /* no sweep in between */
		char name[32];
		snprintf(name, sizeof(name), "127.0.0.1:%d", 20000 + i);
		assert_string_equal(ep0(b)->name, name);
	}
	assert_false(upstream_ep_live(id, 0, first));   /* its index went to another one */
	assert_int_equal(census().endpoints, MAX_ENDPOINTS);
	sweep();
	assert_int_equal(census().endpoints, 1);
}

/* An exchange keeping an endpoint (across a backoff or a fault delay, or to record its outcome)
 * keeps its memory and identity, however long after it retired. */
static void test_kept_endpoint_is_not_reused(void **state)
{
	struct upstream_binding *b = reload(cfg_with(20000, false), "a");
	int id = b->st->id;
	struct ep_state *kept = NULL;
	upstream_ep_keep(&kept, ep0(b));
	uint64_t serial = atomic_load(&kept->serial);
	for (int i = 1; i <= 2 * MAX_ENDPOINTS; i++) {
		b = reload(cfg_with(20000 + i, false), "a");
		sweep();
		assert_int_equal(atomic_load(&kept->serial), serial);
		assert_string_equal(kept->name, "127.0.0.1:20000");
		assert_int_equal(atomic_load(&kept->life), EPL_RETIRED);
		assert_false(upstream_ep_usable(kept, serial));
	}
	upstream_ep_keep(&kept, NULL);
	assert_null(kept);
	sweep();
	assert_false(upstream_ep_live(id, 0, serial));
	assert_int_equal(census().endpoints, 1);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_teardown(test_reloads_with_new_endpoints_reuse_the_index, teardown),
		cmocka_unit_test_teardown(test_runtime_in_use_keeps_its_endpoint, teardown),
		cmocka_unit_test_teardown(test_upstream_state_kept_by_name_forgotten_when_removed,
		                          teardown),
		cmocka_unit_test_teardown(test_more_endpoints_alive_than_indexes_fails_the_reload,
		                          teardown),
		cmocka_unit_test_teardown(test_pool_of_a_forgotten_endpoint_is_not_reused, teardown),
		cmocka_unit_test_teardown(test_quick_reloads_never_run_out_of_indexes, teardown),
		cmocka_unit_test_teardown(test_kept_endpoint_is_not_reused, teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
