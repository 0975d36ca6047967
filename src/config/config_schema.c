/*
 * config_schema: every key of SPEC §2 in one table per mapping level (name, type, field,
 * default as YAML text, range) and the `check` of each level for rules across keys; the
 * checks of single string values, and the parsers of the keys with a grammar of their own, are
 * config_values.c's. Adding a key is one line in a table
 * here, its field in config.h and its line in conf/retrygate.yaml (a unit test enforces the
 * documentation). The lookups by name of config.h live here too: a route's check resolves its
 * upstream with them.
 *
 * config.c walks these tables and calls their functions through them; this file calls down
 * only: config_json.c (emitters named in the tables), config_files.c, config_values.c,
 * config_diag.c.
 *
 * Invariants of a config that config_load() returned (consumers rely on them):
 *  - at least one listener; each has a literal IP:port, unique among listeners and the admin
 *    address, a unique name (default: its address) and at least one route;
 *  - every route's upstream points into config->upstreams; host is NULL (any) or lower-case,
 *    either a name, "*.suffix" or "[v6]"; path_prefix starts with "/"; its retry and deadline
 *    point at the upstream's, or at its own merged copies (KF_OVER), which hold every
 *    invariant below as the upstream's do;
 *  - workers 1-CFG_MAX_WORKERS; every upstream has 1-CFG_MAX_ENDPOINTS endpoints "host:port"
 *    with port 1-65535;
 *  - every timeout is > 0 (drain_timeout, backoff and retry_after.max may be 0), every
 *    duration <= 365 days, so adding two to a monotonic clock cannot overflow;
 *    deadline.min < deadline.default <= deadline.max; backoff.base <= backoff.max;
 *  - retry.max_attempts 1-100; budget.ratio and min_per_second >= 0; max_tokens >= 1;
 *  - max_retries_in_flight <= max_in_flight and max_uri_bytes <= max_header_bytes (the smaller
 *    governs: the loader clamps and records a warning when the larger was written);
 *  - idempotency.store is "memory" (store_host NULL) or a decoded redis URL.
 */
#include "config/config.h"
#include "config/config_impl.h"

#include <arpa/inet.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define DUR_MAX         (8760LL * 3600 * 1000000)     /* 365 days */

/* ------------------------------------------------------------------ block checks */

static void deadline_check(struct load *ld, void *base, const struct node *map)
{
	struct cfg_deadline *d = base;
	char a[32], b[32];

	if (!key_ok(ld, "default"))
		return;
	if (key_ok(ld, "max") && d->default_us > d->max_us) {
		format_duration(d->default_us, a, sizeof a);
		format_duration(d->max_us, b, sizeof b);
		key_error(ld, map, node_find(map, "default") ? "default" : "max",
		          "deadline.default %s is above deadline.max %s (expected default <= max)", a, b);
	}
	if (key_ok(ld, "min") && d->min_us >= d->default_us) {
		format_duration(d->min_us, a, sizeof a);
		format_duration(d->default_us, b, sizeof b);
		key_error(ld, map, node_find(map, "min") ? "min" : "default",
		          "deadline.min %s is not below deadline.default %s (expected min < default)",
		          a, b);
	}
}

static void backoff_check(struct load *ld, void *base, const struct node *map)
{
	struct cfg_retry *r = base;
	char a[32], b[32];

	if (key_ok(ld, "base") && key_ok(ld, "max") && r->backoff_base_us > r->backoff_max_us) {
		format_duration(r->backoff_base_us, a, sizeof a);
		format_duration(r->backoff_max_us, b, sizeof b);
		key_error(ld, map, node_find(map, "base") ? "base" : "max",
		          "backoff.base %s is above backoff.max %s (expected base <= max)", a, b);
	}
}

/* --check names the line of a risky non_idempotent (config_report.c); a route's retry that
 * does not write it keeps its upstream's */
static void retry_check(struct load *ld, void *base, const struct node *map)
{
	struct cfg_retry *r = base;
	const struct node *n = node_find(map, "non_idempotent");
	if (n)
		r->non_idempotent_line = n->line;
}

static void concurrency_check(struct load *ld, void *base, const struct node *map)
{
	struct cfg_upstream *u = base;

	if (!key_ok(ld, "max_in_flight") || !key_ok(ld, "max_retries_in_flight") ||
	    u->max_retries_in_flight <= u->max_in_flight)
		return;
	if (node_find(map, "max_retries_in_flight")) {
		size_t mark = path_push(ld, "max_retries_in_flight");
		load_warn(ld, "%d is above max_in_flight %d; %d governs", u->max_retries_in_flight,
		          u->max_in_flight, u->max_in_flight);
		path_pop(ld, mark);
	}
	u->max_retries_in_flight = u->max_in_flight;
}

static void limits_check(struct load *ld, void *base, const struct node *map)
{
	struct cfg_limits *l = base;
	char a[32], b[32];

	if (!key_ok(ld, "max_uri_bytes") || !key_ok(ld, "max_header_bytes") ||
	    l->max_uri_bytes <= l->max_header_bytes)
		return;
	if (node_find(map, "max_uri_bytes")) {
		size_t mark = path_push(ld, "max_uri_bytes");
		format_value(K_SIZE, l->max_uri_bytes, a, sizeof a);
		format_value(K_SIZE, l->max_header_bytes, b, sizeof b);
		load_warn(ld, "%s is above max_header_bytes %s; %s governs", a, b, b);
		path_pop(ld, mark);
	}
	l->max_uri_bytes = l->max_header_bytes;
}


static void idempotency_check(struct load *ld, void *base, const struct node *map)
{
	struct cfg_idempotency *id = base;

	if (key_ok(ld, "store"))
		redis_url_decode(id->store, &id->store_host, &id->store_port, &id->store_db,
		                 &id->store_user, &id->store_password);
}

static void idempotency_release(void *base)
{
	struct cfg_idempotency *id = base;
	free(id->store_host);
	free(id->store_user);
	free(id->store_password);
}

static void reconcile_check(struct load *ld, void *base, const struct node *map)
{
	struct cfg_reconcile *r = base;

	if (key_ok(ld, "redis"))
		redis_url_decode(r->redis, &r->redis_host, &r->redis_port, &r->redis_db,
		                 &r->redis_user, &r->redis_password);
}

static void reconcile_release(void *base)
{
	struct cfg_reconcile *r = base;
	free(r->redis_host);
	free(r->redis_user);
	free(r->redis_password);
}

static void budget_release(void *base)
{
	struct cfg_retry *r = base;
	free(r->budget_shared_host);
	free(r->budget_shared_user);
	free(r->budget_shared_password);
	r->budget_shared_host = r->budget_shared_user = r->budget_shared_password = NULL;
}

static void budget_check(struct load *ld, void *base, const struct node *map)
{
	struct cfg_retry *r = base;

	budget_release(r);      /* a route's copy may come through here again */
	if (key_ok(ld, "shared") && r->budget_shared && *r->budget_shared)
		redis_url_decode(r->budget_shared, &r->budget_shared_host, &r->budget_shared_port,
		                 &r->budget_shared_db, &r->budget_shared_user,
		                 &r->budget_shared_password);
}

/* A rule's kind-specific keys belong to their kind: status, retry_after, grpc_status and
 * pushback_ms to abort, delay to delay (a key that would do nothing is a mistake worth
 * saying); pushback_ms goes with grpc_status. */
static void fault_rule_check(struct load *ld, void *base, const struct node *map)
{
	struct cfg_fault_rule *r = base;
	static const struct { const char *key; int kind; } own[] = {
		{ "status", FAULT_ABORT }, { "retry_after", FAULT_ABORT }, { "delay", FAULT_DELAY },
		{ "grpc_status", FAULT_ABORT }, { "pushback_ms", FAULT_ABORT },
	};

	/* pushback_ms has a default for the tables' sake; not written, none is sent */
	if (!node_find(map, "pushback_ms"))
		r->pushback_ms = -1;
	else if (key_ok(ld, "pushback_ms") && key_ok(ld, "grpc_status") && r->grpc_status < 0)
		key_error(ld, map, "pushback_ms", "pushback_ms applies with grpc_status only "
		          "(gRPC's Retry-After travels with a gRPC status)");

	if (!key_ok(ld, "kind"))
		return;
	for (size_t i = 0; i < sizeof own / sizeof own[0]; i++)
		if (node_find(map, own[i].key) && r->kind != own[i].kind)
			key_error(ld, map, own[i].key, "%s applies to kind %s only", own[i].key,
			          cfg_fault_kind_words[own[i].kind]);
}

static void upstream_check(struct load *ld, void *base, const struct node *map)
{
	struct cfg_upstream *u = base;
	u->line = map->line;
	u->col = map->col;
	/* a gRPC call is HTTP/2: an http1 upstream cannot answer the health service */
	const struct node *active = node_find(node_find(map, "health"), "active");
	if (u->health.active_kind == PROBE_GRPC && u->protocol != UP_H2 && active &&
	    key_ok(ld, "protocol") && key_ok(ld, "health")) {
		size_t mark = path_push(ld, "health");
		path_push(ld, "active");
		key_error(ld, active, "kind", "kind grpc needs protocol: h2 on this upstream "
		          "(grpc.health.v1 is a gRPC call; expected protocol: h2, or kind http with a "
		          "path)");
		path_pop(ld, mark);
	}
	/* keys of the other kind are kept but unused: say so rather than ignore them silently */
	if (u->health.active_kind == PROBE_GRPC && *u->health.active_path)
		load_warn(ld, "health.active.path is not used with kind grpc (the probe calls %s)",
		          "/grpc.health.v1.Health/Check");
	else if (u->health.active_kind == PROBE_HTTP && *u->health.active_service)
		load_warn(ld, "health.active.service is used only with kind grpc");
}

static void route_check(struct load *ld, void *base, const struct node *map)
{
	struct cfg_route *r = base;

	if (r->host && !strcmp(r->host, "*")) {
		free(r->host);
		r->host = NULL;
	}
}

/* Points the route at its upstream; all upstreams are loaded by now, whatever the key order. */
static void route_resolve(struct load *ld, struct cfg_route *r, const struct node *map)
{
	const struct config *c = ld->c;
	struct strbuf names = { 0 };
	char q[80];

	if (r->upstream_name && (r->upstream = config_upstream(c, r->upstream_name))) {
		/* the upstream's policy, unless the route writes its own (route_*_inherit, later) */
		r->retry = &r->upstream->retry;
		r->deadline = &r->upstream->deadline;
		return;
	}
	if (!r->upstream_name)
		return;
	for (int i = 0; i < c->nupstreams && i < 10; i++)
		sb_printf(&names, "%s%s", i ? ", " : "", c->upstreams[i].name ? c->upstreams[i].name : "?");
	if (c->nupstreams > 10)
		sb_puts(&names, ", ...");
	if (c->nupstreams)
		key_error(ld, map, "upstream", "upstream %s is not defined (defined: %s)",
		          cfg_quote(r->upstream_name, q, sizeof q), names.s);
	else
		key_error(ld, map, "upstream", "upstream %s is not defined (no upstreams are defined)",
		          cfg_quote(r->upstream_name, q, sizeof q));
	free(names.s);
}

/* A route's retry: starts as a copy of its upstream's. The budget is the upstream's alone: one
 * bucket for all its routes, so a route cannot have its own. */
static bool route_retry_inherit(struct load *ld, const struct key *k, void *parent,
                                const struct node *v)
{
	struct cfg_route *r = parent;
	const struct cfg_retry *from;

	/* at the key: the value may be long, and the key is what is misplaced */
	for (int i = 0; v->kind == N_MAP && i + 1 < v->nkids; i += 2)
		if (v->kids[i]->kind == N_SCALAR && !strcmp(v->kids[i]->str, "budget")) {
			size_t mark = path_push(ld, "budget");
			value_error(ld, v->kids[i], "budget is per upstream, shared by all its routes "
			            "(expected it in upstreams.%s.retry.budget)",
			            r->upstream_name ? r->upstream_name : "NAME");
			path_pop(ld, mark);
		}
	if (!r->upstream)
		return false;
	from = &r->upstream->retry;
	/* a deep copy: block_free frees the route's own; every pointer of cfg_retry is
	 * duplicated here */
	r->own_retry = *from;
	r->own_retry.idempotent_paths = xcalloc((size_t)from->nidempotent_paths, sizeof(char *));
	for (int i = 0; i < from->nidempotent_paths; i++)
		r->own_retry.idempotent_paths[i] = xstrdup(from->idempotent_paths[i]);
	/* the budget is the upstream's: the route keeps a copy only for the dump */
	r->own_retry.budget_shared = from->budget_shared ? xstrdup(from->budget_shared) : NULL;
	r->own_retry.budget_shared_host = NULL;
	r->own_retry.budget_shared_user = r->own_retry.budget_shared_password = NULL;
	r->retry = &r->own_retry;
	return true;
}

static bool route_deadline_inherit(struct load *ld, const struct key *k, void *parent,
                                   const struct node *v)
{
	struct cfg_route *r = parent;

	if (!r->upstream)
		return false;
	r->own_deadline = r->upstream->deadline;
	r->deadline = &r->own_deadline;
	return true;
}

static void listener_check(struct load *ld, void *base, const struct node *map)
{
	struct cfg_listener *l = base;

	/* an unnamed listener is known by its address, which is unique */
	if (!l->name && l->listen)
		l->name = xstrdup(l->listen);
}

/* --check reads the files named here (config_files.c); a normal load leaves them to startup */
static void upstream_tls_check(struct load *ld, void *base, const struct node *map)
{
	const struct cfg_upstream *u = base;
	files_check_pem(ld, map, "ca", u->tls_ca, PEM_CA);
	/* a client certificate is its key's pair: one without the other cannot be presented */
	if (!u->tls_cert != !u->tls_key)
		key_error(ld, map, u->tls_cert ? "cert" : "key", "%s needs %s beside it (expected both "
		          "cert and key for a client certificate, or neither)", u->tls_cert ? "cert" : "key",
		          u->tls_cert ? "key" : "cert");
	files_check_pem(ld, map, "cert", u->tls_cert, PEM_CERT);
	files_check_pem(ld, map, "key", u->tls_key, PEM_KEY);
}

static void listener_tls_check(struct load *ld, void *base, const struct node *map)
{
	const struct cfg_listener *l = base;
	files_check_pem(ld, map, "cert", l->tls_cert, PEM_CERT);
	files_check_pem(ld, map, "key", l->tls_key, PEM_KEY);
	files_check_pem(ld, map, "client_ca", l->tls_client_ca, PEM_CA);
	if (!l->tls_client_ca && node_find(map, "require_client_cert"))
		key_error(ld, map, "require_client_cert", "require_client_cert needs client_ca (expected "
		          "client_ca: the CA file that signs the client certificates)");
}

struct bound {
	char what[32];              /* "admin.listen", "listeners[1]" */
	const char *listen;
	int line;                   /* 0: a default */
	int family, port;
	unsigned char addr[16];
};

static bool addr_is_any(const struct bound *b)
{
	static const unsigned char zero[16];
	return !memcmp(b->addr, zero, 16);
}

/* Two listeners on one port clash when the addresses are equal or either is the wildcard:
 * with SO_REUSEPORT on both, the kernel would not refuse it but split the traffic. */
static bool bound_clash(const struct bound *a, const struct bound *b)
{
	if (a->port != b->port)
		return false;
	if (addr_is_any(a) || addr_is_any(b))
		return true;
	return a->family == b->family && !memcmp(a->addr, b->addr, 16);
}

/* Routes find their upstreams; listener names and addresses are unique, and no listener
 * takes the admin address; for --check, the access log can be written. */
static void root_check(struct load *ld, void *base, const struct node *map)
{
	struct config *c = base;
	const struct node *lseq = node_find(map, "listeners"), *an = node_find(node_find(map, "admin"),
	                                                                        "listen");
	struct bound *bs = xcalloc((size_t)c->nlisteners + 1, sizeof *bs);
	int nb = 0;
	char q[80], where[32];

	if (c->admin_listen && *c->admin_listen &&
	    listen_parse(c->admin_listen, &bs[0].family, bs[0].addr, &bs[0].port)) {
		snprintf(bs[0].what, sizeof bs[0].what, "admin.listen");
		bs[0].listen = c->admin_listen;
		bs[0].line = an ? an->line : 0;
		nb = 1;
	}
	for (int i = 0; lseq && lseq->kind == N_SEQ && i < c->nlisteners; i++) {
		struct cfg_listener *l = &c->listeners[i];
		const struct node *ln = lseq->kids[i], *vn = node_find(ln, "listen");
		struct bound *b = &bs[nb];
		size_t mark = path_push(ld, "listeners");

		path_push_index(ld, i);
		const struct node *rseq = node_find(ln, "routes");
		for (int k = 0; rseq && rseq->kind == N_SEQ && k < l->nroutes; k++) {
			size_t rmark = path_push(ld, "routes");
			path_push_index(ld, k);
			if (rseq->kids[k]->kind == N_MAP)
				route_resolve(ld, &l->routes[k], rseq->kids[k]);
			path_pop(ld, rmark);
		}
		/* a default name is the address, whose clash is reported below */
		for (int j = 0; j < i && l->name && node_find(ln, "name"); j++)
			if (c->listeners[j].name && !strcmp(c->listeners[j].name, l->name)) {
				key_error(ld, ln, "name",
				          "listener name %s is already used by listeners[%d] (expected unique "
				          "names)", cfg_quote(l->name, q, sizeof q), j);
				break;
			}
		if (l->listen && listen_parse(l->listen, &b->family, b->addr, &b->port)) {
			snprintf(b->what, sizeof b->what, "listeners[%d]", i);
			b->listen = l->listen;
			b->line = vn ? vn->line : ln->line;
			for (int j = 0; j < nb; j++) {
				if (!bound_clash(&bs[j], b))
					continue;
				if (bs[j].line)
					snprintf(where, sizeof where, "line %d", bs[j].line);
				else
					snprintf(where, sizeof where, "default");
				if (!strcmp(bs[j].listen, b->listen))
					key_error(ld, ln, "listen", "address %s is already used by %s (%s) "
					          "(expected distinct addresses)", cfg_quote(l->listen, q, sizeof q),
					          bs[j].what, where);
				else
					key_error(ld, ln, "listen", "address %s overlaps %s of %s (%s) (expected "
					          "distinct addresses)", cfg_quote(l->listen, q, sizeof q),
					          bs[j].listen, bs[j].what, where);
				break;
			}
			nb++;
		}
		path_pop(ld, mark);
	}
	free(bs);
	files_check_log(ld, map, "access_log", c->access_log);
}

/* ------------------------------------------------------------------ the tables */


#define OFF(type, field) offsetof(struct type, field)
#define TIMEOUT .min = 1, .max = DUR_MAX        /* a zero timeout fails every request */
#define WAIT    .min = 0, .max = DUR_MAX

static const char *const non_idempotent_words[] = { "require-key", "never", "always", NULL };
static const char *const log_format_words[] = { "text", "json", NULL };
const char *const cfg_fault_kind_words[] = { "connect-failure", "abort", "delay", "lost-response",
                                             NULL };
static const char *const protocol_words[] = { "http1", "h2", NULL };

static const struct key backoff_keys[] = {
	{ "base", K_DUR, OFF(cfg_retry, backoff_base_us), .def = "25ms", WAIT },
	{ "max", K_DUR, OFF(cfg_retry, backoff_max_us), .def = "250ms", WAIT },
	{ .name = NULL },
};
static const struct block backoff_block = { .keys = backoff_keys, .check = backoff_check };

static const struct key retry_after_keys[] = {
	{ "honor", K_BOOL, OFF(cfg_retry, retry_after_honor), .def = "true" },
	{ "max", K_DUR, OFF(cfg_retry, retry_after_max_us), .def = "10s", WAIT },
	{ .name = NULL },
};
static const struct block retry_after_block = { .keys = retry_after_keys };

static const struct key budget_keys[] = {
	{ "ratio", K_NUM, OFF(cfg_retry, budget_ratio), .def = "0.2", .min = 0, .max = 100 },
	{ "min_per_second", K_NUM, OFF(cfg_retry, budget_min_per_second), .def = "10", .min = 0,
	  .max = 1000000 },
	/* a bucket that cannot hold one token never allows a retry: use enabled: false */
	{ "max_tokens", K_I64, OFF(cfg_retry, budget_max_tokens), .def = "100", .min = 1,
	  .max = 1000000000 },
	{ "shared", K_STR, OFF(cfg_retry, budget_shared), .def = "", .flags = KF_QUIET_EMPTY,
	  .check = check_reconcile_redis,
	  .emit = emit_store, .expect = "\"\" or redis://host:port/db" },
	{ .name = NULL },
};
static const struct block budget_block = { .keys = budget_keys, .check = budget_check,
                                           .release = budget_release };

static const struct key hedge_keys[] = {
	{ "after", K_CUSTOM, 0, .def = "0ms", .parse = hedge_after_parse, .emit = emit_hedge_after },
	{ "max_extra", K_INT, OFF(cfg_retry, hedge_max_extra), .def = "1", .min = 1,
	  .max = HEDGE_MAX_EXTRA },
	{ .name = NULL },
};
static const struct block hedge_block = { .keys = hedge_keys };

static const struct key retry_keys[] = {
	{ "enabled", K_BOOL, OFF(cfg_retry, enabled), .def = "true" },
	{ "max_attempts", K_INT, OFF(cfg_retry, max_attempts), .def = "3", .min = 1, .max = 100 },
	{ "per_try_timeout", K_DUR, OFF(cfg_retry, per_try_timeout_us), .def = "1s", TIMEOUT },
	{ "on", K_CUSTOM, 0, .def = "[connect-failure, reset, timeout, 502, 503, 504, unavailable]",
	  .parse = retry_on_parse, .emit = emit_retry_on },
	{ "backoff", K_BLOCK, 0, .sub = &backoff_block },
	{ "retry_after", K_BLOCK, 0, .sub = &retry_after_block },
	{ "budget", K_BLOCK, 0, .sub = &budget_block },
	{ "hedge", K_BLOCK, 0, .sub = &hedge_block },
	{ "non_idempotent", K_ENUM, OFF(cfg_retry, non_idempotent), .def = "require-key",
	  .names = non_idempotent_words },
	{ "idempotent_paths", K_STRS, OFF(cfg_retry, idempotent_paths),
	  OFF(cfg_retry, nidempotent_paths), .def = "[]", .check = check_idempotent_path,
	  .expect = "a path prefix such as /shop.Catalog/" },
	{ "max_body", K_SIZE, OFF(cfg_retry, max_body), .def = "64KiB", .min = 0, .max = GiB },
	{ .name = NULL },
};
static const struct block retry_block = { .keys = retry_keys, .check = retry_check };

static const struct key deadline_keys[] = {
	{ "default", K_DUR, OFF(cfg_deadline, default_us), .def = "5s", TIMEOUT },
	{ "max", K_DUR, OFF(cfg_deadline, max_us), .def = "30s", TIMEOUT },
	{ "min", K_DUR, OFF(cfg_deadline, min_us), .def = "5ms", TIMEOUT },
	{ .name = NULL },
};
static const struct block deadline_block = { .keys = deadline_keys, .check = deadline_check };

static const struct key concurrency_keys[] = {
	{ "max_in_flight", K_INT, OFF(cfg_upstream, max_in_flight), .def = "256", .min = 1,
	  .max = 1000000 },
	{ "max_retries_in_flight", K_INT, OFF(cfg_upstream, max_retries_in_flight), .def = "32",
	  .min = 0, .max = 1000000 },
	{ .name = NULL },
};
static const struct block concurrency_block = { .keys = concurrency_keys, .check = concurrency_check };

static const struct key idempotency_keys[] = {
	{ "enabled", K_BOOL, OFF(cfg_idempotency, enabled), .def = "false" },
	{ "header", K_STR, OFF(cfg_idempotency, header), .def = "Idempotency-Key",
	  .check = check_token, .expect = "a header name" },
	{ "methods", K_STRS, OFF(cfg_idempotency, methods), OFF(cfg_idempotency, nmethods),
	  .def = "[POST, PATCH]", .check = check_token, .expect = "a method" },
	{ "require_key", K_BOOL, OFF(cfg_idempotency, require_key), .def = "false" },
	{ "scope_headers", K_STRS, OFF(cfg_idempotency, scope_headers),
	  OFF(cfg_idempotency, nscope_headers), .def = "[Authorization]", .check = check_token,
	  .expect = "a header name" },
	{ "ttl", K_DUR, OFF(cfg_idempotency, ttl_us), .def = "24h", TIMEOUT },
	{ "lock_timeout", K_DUR, OFF(cfg_idempotency, lock_timeout_us), .def = "30s", TIMEOUT },
	{ "max_body", K_SIZE, OFF(cfg_idempotency, max_body), .def = "1MiB", .min = 0, .max = GiB },
	{ "max_response", K_SIZE, OFF(cfg_idempotency, max_response), .def = "1MiB", .min = 0,
	  .max = GiB },
	{ "release_on", K_CUSTOM, 0, .def = "[429, 503, resource-exhausted]",
	  .parse = release_on_parse, .emit = emit_release_on },
	{ "store", K_STR, OFF(cfg_idempotency, store), .def = "memory", .check = check_store,
	  .emit = emit_store, .expect = "\"memory\" or a redis:// URL" },
	{ .name = NULL },
};
static const struct block idempotency_block = { .keys = idempotency_keys, .check = idempotency_check,
                                                .release = idempotency_release };

static const struct key fault_rule_keys[] = {
	{ "kind", K_ENUM, OFF(cfg_fault_rule, kind), .flags = KF_REQUIRED,
	  .names = cfg_fault_kind_words },
	{ "percent", K_NUM, OFF(cfg_fault_rule, percent), .flags = KF_REQUIRED, .min = 0, .max = 100 },
	{ "methods", K_STRS, OFF(cfg_fault_rule, methods), OFF(cfg_fault_rule, nmethods), .def = "[]",
	  .check = check_token, .expect = "a method such as POST" },
	{ "path_prefix", K_STR, OFF(cfg_fault_rule, path_prefix), .def = "/",
	  .check = check_path_prefix, .expect = "a path" },
	{ "status", K_INT, OFF(cfg_fault_rule, status), .def = "503", .min = 200, .max = 599 },
	{ "retry_after", K_STR, OFF(cfg_fault_rule, retry_after), .def = "",
	  .check = check_delta_seconds, .expect = "whole seconds such as \"2\"" },
	{ "delay", K_DUR, OFF(cfg_fault_rule, delay_us), .def = "1s", TIMEOUT },
	{ "grpc_status", K_CUSTOM, OFF(cfg_fault_rule, grpc_status), .def = "",
	  .parse = fault_grpc_status_parse, .emit = emit_grpc_status },
	{ "pushback_ms", K_INT, OFF(cfg_fault_rule, pushback_ms), .def = "0", .min = 0,
	  .max = 86400000, .emit = emit_optional_int },
	{ .name = NULL },
};
static const struct block fault_rule_block = { .keys = fault_rule_keys,
                                               .size = sizeof(struct cfg_fault_rule),
                                               .check = fault_rule_check };

static const struct key fault_stop_keys[] = {
	{ "after", K_DUR, OFF(cfg_faults, stop_after_us), .def = "10m", WAIT },
	{ "min_success_rate", K_NUM, OFF(cfg_faults, stop_min_success_rate), .def = "0.9", .min = 0,
	  .max = 1 },
	{ "max_amplification", K_NUM, OFF(cfg_faults, stop_max_amplification), .def = "2.0",
	  .min = 0, .max = 100 },
	{ .name = NULL },
};
static const struct block fault_stop_block = { .keys = fault_stop_keys };

static const struct key faults_keys[] = {
	{ "enabled", K_BOOL, OFF(cfg_faults, enabled), .def = "false" },
	{ "rules", K_LIST, OFF(cfg_faults, rules), OFF(cfg_faults, nrules), .sub = &fault_rule_block,
	  .expect = "a sequence of rules" },
	{ "stop", K_BLOCK, 0, .sub = &fault_stop_block },
	{ .name = NULL },
};
static const struct block faults_block = { .keys = faults_keys };

static const struct key upstream_tls_keys[] = {
	{ "sni", K_STR, OFF(cfg_upstream, tls_sni), .check = check_sni, .expect = "a DNS name" },
	{ "ca", K_STR, OFF(cfg_upstream, tls_ca), .check = check_nonempty, .expect = "a file path" },
	{ "verify", K_BOOL, OFF(cfg_upstream, tls_verify), .def = "true" },
	{ "cert", K_STR, OFF(cfg_upstream, tls_cert), .check = check_nonempty,
	  .expect = "a PEM client certificate file" },
	{ "key", K_STR, OFF(cfg_upstream, tls_key), .check = check_nonempty,
	  .expect = "a PEM private key file" },
	{ .name = NULL },
};
static const struct block upstream_tls_block = { .keys = upstream_tls_keys,
                                                 .check = upstream_tls_check };

static const char *const balance_words[] = { "round-robin", "least-request", "random", NULL };

static const struct key passive_keys[] = {
	{ "consecutive_failures", K_INT, OFF(cfg_health, consecutive_failures), .def = "5", .min = 0,
	  .max = 1000000 },
	{ "base_ejection", K_DUR, OFF(cfg_health, base_ejection_us), .def = "10s", TIMEOUT },
	{ "max_ejection", K_DUR, OFF(cfg_health, max_ejection_us), .def = "5m", TIMEOUT },
	{ "max_ejected_percent", K_INT, OFF(cfg_health, max_ejected_percent), .def = "50", .min = 0,
	  .max = 100 },
	{ .name = NULL },
};
static const struct block passive_block = { .keys = passive_keys };

static const char *const probe_kind_words[] = { "http", "grpc", NULL };

static const struct key active_keys[] = {
	{ "kind", K_ENUM, OFF(cfg_health, active_kind), .def = "http", .names = probe_kind_words },
	{ "path", K_STR, OFF(cfg_health, active_path), .def = "", .check = check_probe_path,
	  .expect = "\"\" or a path such as /healthz" },
	{ "service", K_STR, OFF(cfg_health, active_service), .def = "", .check = check_grpc_service,
	  .expect = "\"\" or a gRPC service name such as pkg.Service" },
	{ "interval", K_DUR, OFF(cfg_health, active_interval_us), .def = "5s", TIMEOUT },
	{ "timeout", K_DUR, OFF(cfg_health, active_timeout_us), .def = "1s", TIMEOUT },
	{ "unhealthy_after", K_INT, OFF(cfg_health, unhealthy_after), .def = "3", .min = 1,
	  .max = 1000 },
	{ "healthy_after", K_INT, OFF(cfg_health, healthy_after), .def = "2", .min = 1, .max = 1000 },
	{ .name = NULL },
};
static const struct block active_block = { .keys = active_keys };

static const struct key health_keys[] = {
	{ "passive", K_BLOCK, 0, .sub = &passive_block },
	{ "active", K_BLOCK, 0, .sub = &active_block },
	{ .name = NULL },
};
static const struct block health_block = { .keys = health_keys };

static const struct key upstream_keys[] = {
	{ "endpoints", K_STRS, OFF(cfg_upstream, endpoints), OFF(cfg_upstream, nendpoints),
	  .flags = KF_REQUIRED | KF_NONEMPTY, .max = CFG_MAX_ENDPOINTS, .check = check_endpoint,
	  .expect = "host:port" },
	{ "tls", K_BLOCK, 0, OFF(cfg_upstream, tls), .flags = KF_GIVEN, .sub = &upstream_tls_block },
	{ "host_rewrite", K_STR, OFF(cfg_upstream, host_rewrite), .def = "", .check = check_visible,
	  .expect = "a Host header value" },
	{ "protocol", K_ENUM, OFF(cfg_upstream, protocol), .def = "http1", .names = protocol_words },
	{ "connect_timeout", K_DUR, OFF(cfg_upstream, connect_timeout_us), .def = "250ms", TIMEOUT },
	{ "deadline", K_BLOCK, OFF(cfg_upstream, deadline), .sub = &deadline_block },
	{ "retry", K_BLOCK, OFF(cfg_upstream, retry), .sub = &retry_block },
	{ "concurrency", K_BLOCK, 0, .sub = &concurrency_block },
	{ "balance", K_ENUM, OFF(cfg_upstream, balance), .def = "round-robin",
	  .names = balance_words },
	{ "health", K_BLOCK, OFF(cfg_upstream, health), .sub = &health_block },
	{ "idempotency", K_BLOCK, OFF(cfg_upstream, idem), .sub = &idempotency_block },
	{ "faults", K_BLOCK, OFF(cfg_upstream, faults), .sub = &faults_block },
	{ .name = NULL },
};
static const struct block upstream_block = { .keys = upstream_keys,
                                             .size = sizeof(struct cfg_upstream),
                                             .name_off = OFF(cfg_upstream, name),
                                             .check = upstream_check };

static const struct key limits_keys[] = {
	{ "max_header_bytes", K_SIZE, OFF(cfg_limits, max_header_bytes), .def = "32KiB", .min = 1,
	  .max = MiB },
	{ "header_timeout", K_DUR, OFF(cfg_limits, header_timeout_us), .def = "10s", TIMEOUT },
	{ "max_uri_bytes", K_SIZE, OFF(cfg_limits, max_uri_bytes), .def = "8KiB", .min = 1,
	  .max = MiB },
	{ "idle_timeout", K_DUR, OFF(cfg_limits, idle_timeout_us), .def = "60s", TIMEOUT },
	{ "max_body", K_SIZE, OFF(cfg_limits, max_body), .def = "0", .min = 0, .max = 1024 * GiB },
	{ "max_connections", K_I64, OFF(cfg_limits, max_connections), .def = "10000", .min = 1,
	  .max = 10000000 },
	{ "max_concurrent_streams", K_I64, OFF(cfg_limits, max_concurrent_streams), .def = "100",
	  .min = 1, .max = 100000 },
	{ .name = NULL },
};
static const struct block limits_block = { .keys = limits_keys, .check = limits_check };

static const struct key listener_tls_keys[] = {
	{ "cert", K_STR, OFF(cfg_listener, tls_cert), .flags = KF_REQUIRED | KF_NONEMPTY,
	  .expect = "a PEM certificate file" },
	{ "key", K_STR, OFF(cfg_listener, tls_key), .flags = KF_REQUIRED | KF_NONEMPTY,
	  .expect = "a PEM private key file" },
	{ "client_ca", K_STR, OFF(cfg_listener, tls_client_ca), .check = check_nonempty,
	  .expect = "a PEM CA file" },
	{ "require_client_cert", K_BOOL, OFF(cfg_listener, tls_require_client_cert), .def = "true" },
	{ .name = NULL },
};
static const struct block listener_tls_block = { .keys = listener_tls_keys,
                                                 .check = listener_tls_check };

static const struct key route_keys[] = {
	{ "host", K_STR, OFF(cfg_route, host), .check = check_host, .expect = "a host name" },
	{ "path_prefix", K_STR, OFF(cfg_route, path_prefix), .def = "/", .check = check_path_prefix,
	  .expect = "a path" },
	{ "upstream", K_STR, OFF(cfg_route, upstream_name), .flags = KF_REQUIRED | KF_NONEMPTY,
	  .expect = "the name of an upstream" },
	/* per-route policy over the upstream's, key by key; /config shows the merged result */
	{ "retry", K_BLOCK, OFF(cfg_route, own_retry), OFF(cfg_route, has_retry),
	  .flags = KF_GIVEN | KF_OVER, .sub = &retry_block, .inherit = route_retry_inherit },
	{ "deadline", K_BLOCK, OFF(cfg_route, own_deadline), OFF(cfg_route, has_deadline),
	  .flags = KF_GIVEN | KF_OVER, .sub = &deadline_block, .inherit = route_deadline_inherit },
	{ .name = NULL },
};
static const struct block route_block = { .keys = route_keys, .size = sizeof(struct cfg_route),
                                          .check = route_check };

static const struct key listener_keys[] = {
	{ "name", K_STR, OFF(cfg_listener, name), .check = check_name, .expect = "a name" },
	{ "listen", K_STR, OFF(cfg_listener, listen), .flags = KF_REQUIRED, .check = check_listen,
	  .expect = "IP:port such as 127.0.0.1:15001" },
	{ "tls", K_BLOCK, 0, OFF(cfg_listener, tls), .flags = KF_GIVEN, .sub = &listener_tls_block },
	{ "http2", K_BOOL, OFF(cfg_listener, http2), .def = "true" },
	{ "limits", K_BLOCK, OFF(cfg_listener, limits), .sub = &limits_block },
	{ "routes", K_LIST, OFF(cfg_listener, routes), OFF(cfg_listener, nroutes),
	  .flags = KF_REQUIRED | KF_NONEMPTY, .sub = &route_block, .expect = "at least one route" },
	{ .name = NULL },
};
static const struct block listener_block = { .keys = listener_keys,
                                             .size = sizeof(struct cfg_listener),
                                             .check = listener_check };

static const struct key admin_keys[] = {
	{ "listen", K_STR, OFF(config, admin_listen), .def = "127.0.0.1:9901",
	  .check = check_admin_listen, .expect = "IP:port, or \"\" for none" },
	{ "token", K_STR, OFF(config, admin_token), .def = "", .check = check_visible,
	  .emit = emit_secret, .expect = "a bearer token" },
	{ .name = NULL },
};
static const struct block admin_block = { .keys = admin_keys };

static const struct key reconcile_keys[] = {
	{ "keep", K_I64, OFF(cfg_reconcile, keep), .def = "1000", .min = 1, .max = 1000000 },
	{ "redis", K_STR, OFF(cfg_reconcile, redis), .def = "", .check = check_reconcile_redis,
	  .emit = emit_store, .expect = "\"\" or redis://host:port/db" },
	{ "stream", K_STR, OFF(cfg_reconcile, stream), .def = "retrygate:unknown",
	  .flags = KF_NONEMPTY, .check = check_visible, .expect = "a Redis key" },
	{ .name = NULL },
};
static const struct block reconcile_block = { .keys = reconcile_keys, .check = reconcile_check,
                                              .release = reconcile_release };

static const struct key root_keys[] = {
	{ "admin", K_BLOCK, 0, .sub = &admin_block },
	{ "workers", K_CUSTOM, OFF(config, workers), .def = "1", .min = 1, .max = CFG_MAX_WORKERS,
	  .parse = workers_parse, .emit = emit_workers },
	{ "drain_timeout", K_DUR, OFF(config, drain_timeout_us), .def = "15s", WAIT },
	{ "access_log", K_STR, OFF(config, access_log), .def = "off", .flags = KF_NONEMPTY,
	  .expect = "off, stdout or a file path" },
	{ "resolvers", K_STRS, OFF(config, resolvers), OFF(config, nresolvers), .def = "[]",
	  .max = 8, .check = check_resolver, .expect = "IP:port such as 127.0.0.1:53" },
	{ "log_format", K_ENUM, OFF(config, log_format), .def = "text", .names = log_format_words },
	{ "reconcile", K_BLOCK, OFF(config, reconcile), .sub = &reconcile_block },
	{ "listeners", K_LIST, OFF(config, listeners), OFF(config, nlisteners),
	  .flags = KF_REQUIRED | KF_NONEMPTY, .sub = &listener_block,
	  .expect = "at least one listener with a route" },
	{ "upstreams", K_NAMED, OFF(config, upstreams), OFF(config, nupstreams),
	  .check = check_name, .sub = &upstream_block },
	{ .name = NULL },
};
const struct block cfg_root_block = { .keys = root_keys, .check = root_check };

/* ------------------------------------------------------------------ schema keys */

static void schema_walk(const struct block *b, struct strbuf *path,
                        void (*cb)(const char *, void *), void *arg)
{
	for (const struct key *k = b->keys; k->name; k++) {
		size_t old = path->len;
		if (old)
			sb_puts(path, ".");
		sb_puts(path, k->name);
		cb(path->s, arg);
		if (k->sub)
			schema_walk(k->sub, path, cb, arg);
		path->len = old;
		path->s[old] = '\0';
	}
}

void config_schema_keys(void (*cb)(const char *dotted_path, void *arg), void *arg)
{
	struct strbuf path = { 0 };
	sb_putn(&path, "", 0);
	schema_walk(&cfg_root_block, &path, cb, arg);
	free(path.s);
}

/* ------------------------------------------------------------------ lookups (config.h) */

struct cfg_listener *config_listener(const struct config *c, const char *name)
{
	for (int i = 0; i < c->nlisteners; i++)
		if (c->listeners[i].name && !strcmp(c->listeners[i].name, name))
			return &c->listeners[i];
	return NULL;
}

struct cfg_upstream *config_upstream(const struct config *c, const char *name)
{
	for (int i = 0; i < c->nupstreams; i++)
		if (c->upstreams[i].name && !strcmp(c->upstreams[i].name, name))
			return &c->upstreams[i];
	return NULL;
}
