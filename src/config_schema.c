/*
 * config_schema: every key of SPEC §2 in one table per mapping level (name, type, field,
 * default as YAML text, range), the string checks of single values and the `check` of each
 * level for rules across keys. Adding a key is one line in a table here, its field in
 * config.h and its line in conf/retrygate.yaml (a unit test enforces the documentation).
 *
 * Invariants of a config that config_load() returned (consumers rely on them):
 *  - at least one listener; each has a literal IP:port, unique among listeners and the admin
 *    address, a unique name (default: its address) and at least one route;
 *  - every route's upstream points into config->upstreams; host is NULL (any) or lower-case,
 *    either a name, "*.suffix" or "[v6]"; path_prefix starts with "/";
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
#include "config.h"
#include "config_impl.h"
#include "cpus.h"

#include <arpa/inet.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define DUR_MAX         (8760LL * 3600 * 1000000)     /* 365 days */

/* ------------------------------------------------------------------ string checks */

static bool char_is_tchar(int c)
{
	return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
	       (c && strchr("!#$%&'*+-.^_`|~", c));
}

static bool str_is_visible(const char *s)
{
	for (; *s; s++)
		if ((unsigned char)*s <= 0x20 || (unsigned char)*s >= 0x7f)
			return false;
	return true;
}

/* DNS-ish: dot-separated labels of letters, digits, '-' and '_', 1-63 each, 253 in all.
 * Also accepts dotted IPv4. */
static bool hostname_ok(const char *h)
{
	size_t label = 0, n = strlen(h);

	if (n == 0 || n > 253)
		return false;
	for (; *h; h++) {
		char c = *h;
		if (c == '.') {
			if (label == 0)
				return false;
			label = 0;
		} else if ((c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
		           c == '-' || c == '_') {
			if (++label > 63)
				return false;
		} else
			return false;
	}
	return label > 0;
}

static const char *check_nonempty(char *s, char *buf, size_t cap)
{
	return *s ? NULL : "empty (expected a file path)";
}

static const char *check_visible(char *s, char *buf, size_t cap)
{
	return str_is_visible(s) ? NULL : "contains a space or a non-printable character "
	                                  "(expected printable ASCII)";
}

static const char *check_name(char *s, char *buf, size_t cap)
{
	char q[80];
	size_t n = strlen(s);

	for (const char *p = s; *p; p++)
		if (!((*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') ||
		      strchr("-_.:", *p))) {
			snprintf(buf, cap, "bad name %s (expected letters, digits, '-', '_', '.' or ':')",
			         cfg_quote(s, q, sizeof q));
			return buf;
		}
	if (n == 0 || n > 128)
		return "bad name length (expected 1 to 128 characters)";
	return NULL;
}

static const char *check_token(char *s, char *buf, size_t cap)
{
	char q[80];

	for (const char *p = s; *p; p++)
		if (!char_is_tchar((unsigned char)*p))
			goto bad;
	if (*s)
		return NULL;
bad:
	snprintf(buf, cap, "%s is not an HTTP token (expected a name such as POST or Idempotency-Key)",
	         cfg_quote(s, q, sizeof q));
	return buf;
}

/* a literal IP and a port, as a listener binds it: names are not resolved here */
static bool listen_parse(const char *s, int *family, unsigned char addr[16], int *port)
{
	char host[HOST_MAX];

	if (split_host_port(s, host, sizeof host, port) < 0)
		return false;
	memset(addr, 0, 16);
	if (s[0] == '[') {
		*family = AF_INET6;
		return inet_pton(AF_INET6, host, addr) == 1;
	}
	*family = AF_INET;
	return inet_pton(AF_INET, host, addr) == 1;
}

static const char *check_listen(char *s, char *buf, size_t cap)
{
	unsigned char addr[16];
	int family, port;
	char q[80];

	if (listen_parse(s, &family, addr, &port))
		return NULL;
	snprintf(buf, cap, "bad address %s (expected IP:port such as 127.0.0.1:15001 or [::1]:15001)",
	         cfg_quote(s, q, sizeof q));
	return buf;
}

/* admin.listen: "" turns the admin listener off */
static const char *check_admin_listen(char *s, char *buf, size_t cap)
{
	return *s ? check_listen(s, buf, cap) : NULL;
}

static const char *check_endpoint(char *s, char *buf, size_t cap)
{
	char host[HOST_MAX], q[80];
	int port;

	if (split_host_port(s, host, sizeof host, &port) == 0 && (s[0] == '[' || hostname_ok(host)))
		return NULL;
	snprintf(buf, cap, "bad endpoint %s (expected host:port with port 1-65535, IPv6 in brackets)",
	         cfg_quote(s, q, sizeof q));
	return buf;
}

/* Route host pattern: lower-cased in place; "*" alone means any host. */
static const char *check_host(char *s, char *buf, size_t cap)
{
	static const char expect[] = "(expected a name like payments or *.example.com)";
	unsigned char addr[16];
	char q[80], *p = s;

	if (!strcmp(s, "*"))
		return NULL;
	for (; *p; p++)
		if (*p >= 'A' && *p <= 'Z')
			*p = (char)(*p - 'A' + 'a');
	if (s[0] == '[') {
		size_t n = strlen(s);
		char v6[HOST_MAX];
		if (n > 2 && n < sizeof v6 && s[n - 1] == ']') {
			memcpy(v6, s + 1, n - 2);
			v6[n - 2] = '\0';
			if (inet_pton(AF_INET6, v6, addr) == 1)
				return NULL;
		}
		snprintf(buf, cap, "bad IPv6 host %s %s", cfg_quote(s, q, sizeof q), expect);
		return buf;
	}
	p = !strncmp(s, "*.", 2) ? s + 2 : s;
	if (strchr(p, '*'))
		snprintf(buf, cap, "host %s: a wildcard is only allowed as the whole first label %s",
		         cfg_quote(s, q, sizeof q), expect);
	else if (strchr(p, ':'))
		snprintf(buf, cap, "host %s must not include a port %s", cfg_quote(s, q, sizeof q), expect);
	else if (!hostname_ok(p))
		snprintf(buf, cap, "bad host %s %s", cfg_quote(s, q, sizeof q), expect);
	else
		return NULL;
	return buf;
}

static const char *check_path_prefix(char *s, char *buf, size_t cap)
{
	char q[80];

	if (s[0] == '/' && str_is_visible(s) && !strchr(s, '#'))
		return NULL;
	snprintf(buf, cap, "bad path prefix %s (expected a path starting with \"/\", printable, "
	         "without spaces or '#')", cfg_quote(s, q, sizeof q));
	return buf;
}

static const char *check_sni(char *s, char *buf, size_t cap)
{
	char q[80];

	if (hostname_ok(s))
		return NULL;
	snprintf(buf, cap, "bad server name %s (expected a DNS name)", cfg_quote(s, q, sizeof q));
	return buf;
}

/* ------------------------------------------------------------------ the idempotency store URL */

/* Decodes %XX escapes of N bytes at S into a new string; NULL when an escape is malformed. */
static char *percent_decode(const char *s, size_t n)
{
	char *out = xmalloc(n + 1), *o = out;

	for (size_t i = 0; i < n; i++) {
		if (s[i] != '%') {
			*o++ = s[i];
			continue;
		}
		unsigned v = 0;
		for (int k = 1; k <= 2; k++) {
			char c = i + (size_t)k < n ? s[i + (size_t)k] : 0;
			int d = (c >= '0' && c <= '9') ? c - '0' : (c >= 'a' && c <= 'f') ? c - 'a' + 10 :
			        (c >= 'A' && c <= 'F') ? c - 'A' + 10 : -1;
			if (d < 0) {
				free(out);
				return NULL;
			}
			v = v * 16 + (unsigned)d;
		}
		if (v == 0) {
			free(out);
			return NULL;
		}
		*o++ = (char)v;
		i += 2;
	}
	*o = '\0';
	return out;
}

bool store_split(const char *s, struct store_url *u)
{
	const char *rest, *at, *hp, *slash, *colon;
	size_t hplen;

	memset(u, 0, sizeof *u);
	if (!strcmp(s, "memory"))
		return true;
	if (strncmp(s, "redis://", 8) != 0)
		return false;
	u->redis = true;
	u->port = 6379;
	rest = s + 8;
	at = strrchr(rest, '@');
	hp = rest;
	if (at) {
		colon = memchr(rest, ':', (size_t)(at - rest));
		if (!colon || colon + 1 == at)
			return false;   /* userinfo must be user:password or :password */
		u->user = rest;
		u->user_len = (size_t)(colon - rest);
		u->pass = colon + 1;
		u->pass_len = (size_t)(at - colon - 1);
		for (int k = 0; k < 2; k++) {
			char *d = k ? percent_decode(u->pass, u->pass_len) :
			              percent_decode(u->user, u->user_len);
			if (!d)
				return false;
			free(d);
		}
		hp = at + 1;
	}
	slash = strchr(hp, '/');
	hplen = slash ? (size_t)(slash - hp) : strlen(hp);
	if (slash) {
		const char *d = slash + 1;
		long db = 0;
		if (!*d || strlen(d) > 6)
			return false;
		for (; *d; d++) {
			if (*d < '0' || *d > '9')
				return false;
			db = db * 10 + (*d - '0');
		}
		u->db = (int)db;
	}
	if (hplen == 0 || hplen >= sizeof u->host)
		return false;
	if (memchr(hp, ':', hplen) || hp[0] == '[') {
		char tmp[HOST_MAX];
		memcpy(tmp, hp, hplen);
		tmp[hplen] = '\0';
		if (split_host_port(tmp, u->host, sizeof u->host, &u->port) < 0)
			return false;
		return hp[0] == '[' || hostname_ok(u->host);
	}
	memcpy(u->host, hp, hplen);
	u->host[hplen] = '\0';
	return hostname_ok(u->host);
}

static const char *check_store(char *s, char *buf, size_t cap)
{
	struct store_url u;
	char q[80];

	if (store_split(s, &u))
		return NULL;
	/* the URL may hold a password: do not echo it */
	if (!strncmp(s, "redis://", 8))
		snprintf(buf, cap, "bad redis URL (expected redis://[user:password@]host:port[/db])");
	else
		snprintf(buf, cap, "unknown store %s (expected \"memory\" or "
		         "\"redis://[user:password@]host:port[/db]\")", cfg_quote(s, q, sizeof q));
	return buf;
}

/* ------------------------------------------------------------------ custom keys */

static void workers_parse(struct load *ld, const struct key *k, const struct node *v, void *base)
{
	int64_t n;

	if (v->kind == N_SCALAR && !strcmp(v->str, "auto")) {
		long cpus = cpus_available();   /* the affinity mask and the cgroup CPU quota */
		*FIELD(base, k->off, int) = cpus < 1 ? 1 : cpus > k->max ? (int)k->max : (int)cpus;
		return;
	}
	if (v->kind != N_SCALAR || !v->plain || scan_int(v->str, &n) != 0) {
		type_error(ld, v, "a positive integer or \"auto\"");
		return;
	}
	if (range_ok(ld, k, v, (double)n, v->str))
		*FIELD(base, k->off, int) = (int)n;
}

const char *const cfg_retry_on_words[] = { "connect-failure", "reset", "timeout", NULL };

static void retry_on_parse(struct load *ld, const struct key *k, const struct node *v, void *base)
{
	static const char expect[] =
	        "expected connect-failure, reset, timeout or a status code 400-599";
	struct cfg_retry *r = base;
	char q[80];

	if (v->kind != N_SEQ && !node_is_null(v)) {
		type_error(ld, v, "a sequence of conditions");
		return;
	}
	/* replaces the default; duplicates merge into the same bit */
	r->on_flags = 0;
	memset(r->on_status, 0, sizeof r->on_status);
	for (int i = 0; v->kind == N_SEQ && i < v->nkids; i++) {
		const struct node *item = v->kids[i];
		const char *near;
		int64_t status;
		int w;

		if (item->kind != N_SCALAR || node_is_null(item)) {
			type_error(ld, item, "a condition");
			continue;
		}
		for (w = 0; cfg_retry_on_words[w]; w++)
			if (!strcmp(item->str, cfg_retry_on_words[w])) {
				r->on_flags |= 1u << w;
				break;
			}
		if (cfg_retry_on_words[w])
			continue;
		if (scan_int(item->str, &status) == 0 && status >= 400 && status <= 599)
			r->on_status[(status - 400) / 8] |= (uint8_t)(1u << ((status - 400) % 8));
		else if (scan_int(item->str, &status) == 0)
			value_error(ld, item, "status %s cannot be retried (%s)",
			            cfg_quote(item->str, q, sizeof q), expect);
		else if ((near = closest_word(item->str, cfg_retry_on_words)))
			value_error(ld, item, "unknown condition %s (did you mean \"%s\"?)",
			            cfg_quote(item->str, q, sizeof q), near);
		else
			value_error(ld, item, "unknown condition %s (%s)", cfg_quote(item->str, q, sizeof q),
			            expect);
	}
}

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
	struct store_url u;

	if (!key_ok(ld, "store") || !id->store || !store_split(id->store, &u) || !u.redis)
		return;
	id->store_host = xstrdup(u.host);
	id->store_port = u.port;
	id->store_db = u.db;
	if (u.user) {
		id->store_user = u.user_len ? percent_decode(u.user, u.user_len) : NULL;
		id->store_password = percent_decode(u.pass, u.pass_len);
	}
}

static void idempotency_release(void *base)
{
	struct cfg_idempotency *id = base;
	free(id->store_host);
	free(id->store_user);
	free(id->store_password);
}

static void upstream_check(struct load *ld, void *base, const struct node *map)
{
	struct cfg_upstream *u = base;
	u->line = map->line;
	u->col = map->col;
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

	if (!r->upstream_name || (r->upstream = config_upstream(c, r->upstream_name)))
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
}

static void listener_tls_check(struct load *ld, void *base, const struct node *map)
{
	const struct cfg_listener *l = base;
	files_check_pem(ld, map, "cert", l->tls_cert, PEM_CERT);
	files_check_pem(ld, map, "key", l->tls_key, PEM_KEY);
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
	{ .name = NULL },
};
static const struct block budget_block = { .keys = budget_keys };

static const struct key retry_keys[] = {
	{ "enabled", K_BOOL, OFF(cfg_retry, enabled), .def = "true" },
	{ "max_attempts", K_INT, OFF(cfg_retry, max_attempts), .def = "3", .min = 1, .max = 100 },
	{ "per_try_timeout", K_DUR, OFF(cfg_retry, per_try_timeout_us), .def = "1s", TIMEOUT },
	{ "on", K_CUSTOM, 0, .def = "[connect-failure, reset, timeout, 502, 503, 504]",
	  .parse = retry_on_parse, .emit = emit_retry_on },
	{ "backoff", K_BLOCK, 0, .sub = &backoff_block },
	{ "retry_after", K_BLOCK, 0, .sub = &retry_after_block },
	{ "budget", K_BLOCK, 0, .sub = &budget_block },
	{ "non_idempotent", K_ENUM, OFF(cfg_retry, non_idempotent), .def = "require-key",
	  .names = non_idempotent_words },
	{ "max_body", K_SIZE, OFF(cfg_retry, max_body), .def = "64KiB", .min = 0, .max = GiB },
	{ .name = NULL },
};
static const struct block retry_block = { .keys = retry_keys };

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
	{ "store", K_STR, OFF(cfg_idempotency, store), .def = "memory", .check = check_store,
	  .emit = emit_store, .expect = "\"memory\" or a redis:// URL" },
	{ .name = NULL },
};
static const struct block idempotency_block = { .keys = idempotency_keys, .check = idempotency_check,
                                                .release = idempotency_release };

static const struct key upstream_tls_keys[] = {
	{ "sni", K_STR, OFF(cfg_upstream, tls_sni), .check = check_sni, .expect = "a DNS name" },
	{ "ca", K_STR, OFF(cfg_upstream, tls_ca), .check = check_nonempty, .expect = "a file path" },
	{ "verify", K_BOOL, OFF(cfg_upstream, tls_verify), .def = "true" },
	{ .name = NULL },
};
static const struct block upstream_tls_block = { .keys = upstream_tls_keys,
                                                 .check = upstream_tls_check };

static const struct key upstream_keys[] = {
	{ "endpoints", K_STRS, OFF(cfg_upstream, endpoints), OFF(cfg_upstream, nendpoints),
	  .flags = KF_REQUIRED | KF_NONEMPTY, .max = CFG_MAX_ENDPOINTS, .check = check_endpoint,
	  .expect = "host:port" },
	{ "tls", K_BLOCK, 0, OFF(cfg_upstream, tls), .flags = KF_GIVEN, .sub = &upstream_tls_block },
	{ "host_rewrite", K_STR, OFF(cfg_upstream, host_rewrite), .def = "", .check = check_visible,
	  .expect = "a Host header value" },
	{ "connect_timeout", K_DUR, OFF(cfg_upstream, connect_timeout_us), .def = "250ms", TIMEOUT },
	{ "deadline", K_BLOCK, OFF(cfg_upstream, deadline), .sub = &deadline_block },
	{ "retry", K_BLOCK, OFF(cfg_upstream, retry), .sub = &retry_block },
	{ "concurrency", K_BLOCK, 0, .sub = &concurrency_block },
	{ "idempotency", K_BLOCK, OFF(cfg_upstream, idem), .sub = &idempotency_block },
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

static const struct key root_keys[] = {
	{ "admin", K_BLOCK, 0, .sub = &admin_block },
	{ "workers", K_CUSTOM, OFF(config, workers), .def = "1", .min = 1, .max = CFG_MAX_WORKERS,
	  .parse = workers_parse, .emit = emit_workers },
	{ "drain_timeout", K_DUR, OFF(config, drain_timeout_us), .def = "15s", WAIT },
	{ "access_log", K_STR, OFF(config, access_log), .def = "off", .flags = KF_NONEMPTY,
	  .expect = "off, stdout or a file path" },
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
