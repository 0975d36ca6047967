/*
 * config_values: the checks of single string values the schema tables name (tokens, names,
 * listen addresses, endpoints, host patterns, path prefixes, SNI, the idempotency store URL).
 * Each normalises its value in place where the schema says so and returns NULL, or what was
 * expected, for the loader's FILE:LINE:COL message. The retry.on words live here too, for the
 * schema, the JSON and the report alike; and the parsers of the keys with a grammar of their
 * own (workers, retry.on, idempotency.release_on, a fault's grpc_status, retry.hedge.after),
 * which take the YAML node. Calls go down only, to config_diag.c.
 */
#include "config/config.h"
#include "config/config_impl.h"
#include "base/cpus.h"
#include "http/grpc.h"

#include <arpa/inet.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* the words of retry.on, in the order of their RETRY_ON_* bits */
const char *const cfg_retry_on_words[] = { "connect-failure", "reset", "timeout", NULL };

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

const char *check_nonempty(char *s, char *buf, size_t cap)
{
	return *s ? NULL : "empty (expected a file path)";
}

const char *check_visible(char *s, char *buf, size_t cap)
{
	return str_is_visible(s) ? NULL : "contains a space or a non-printable character "
	                                  "(expected printable ASCII)";
}

const char *check_name(char *s, char *buf, size_t cap)
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

const char *check_token(char *s, char *buf, size_t cap)
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
bool listen_parse(const char *s, int *family, unsigned char addr[16], int *port)
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

const char *check_listen(char *s, char *buf, size_t cap)
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
const char *check_admin_listen(char *s, char *buf, size_t cap)
{
	return *s ? check_listen(s, buf, cap) : NULL;
}

const char *check_endpoint(char *s, char *buf, size_t cap)
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
const char *check_host(char *s, char *buf, size_t cap)
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

const char *check_path_prefix(char *s, char *buf, size_t cap)
{
	char q[80];

	if (s[0] == '/' && str_is_visible(s) && !strchr(s, '#'))
		return NULL;
	snprintf(buf, cap, "bad path prefix %s (expected a path starting with \"/\", printable, "
	         "without spaces or '#')", cfg_quote(s, q, sizeof q));
	return buf;
}

/* health.active.path: "" (no probes) or an origin-form path */
const char *check_probe_path(char *s, char *buf, size_t cap)
{
	return *s ? check_path_prefix(s, buf, cap) : NULL;
}

/* health.active.service: "" (the whole server) or a service name as gRPC writes it
 * ("grpc.health.v1.Health"); a HealthCheckRequest carries it, so it is short */
const char *check_grpc_service(char *s, char *buf, size_t cap)
{
	char q[80];

	if (strlen(s) <= 200 && str_is_visible(s) && !strchr(s, '/'))
		return NULL;
	snprintf(buf, cap, "bad service %s (expected \"\" or a service name such as pkg.Service, "
	         "printable, without '/', at most 200 bytes)", cfg_quote(s, q, sizeof q));
	return buf;
}

/* resolvers: a DNS server, "IP:port" (the port may not be left out: say 53) */
const char *check_resolver(char *s, char *buf, size_t cap)
{
	return check_listen(s, buf, cap);
}

const char *check_sni(char *s, char *buf, size_t cap)
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

const char *check_store(char *s, char *buf, size_t cap)
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

/* A redis URL decoded into its parts (the host, the port and db, user and password
 * percent-decoded; *USER NULL when the URL names none). False when URL is not one. */
bool redis_url_decode(const char *url, char **host, int *port, int *db, char **user,
                             char **pass)
{
	struct store_url u;

	if (!url || !store_split(url, &u) || !u.redis)
		return false;
	*host = xstrdup(u.host);
	*port = u.port;
	*db = u.db;
	if (u.user) {
		*user = u.user_len ? percent_decode(u.user, u.user_len) : NULL;
		*pass = percent_decode(u.pass, u.pass_len);
	}
	return true;
}

/* retry.hedge.after (SPEC §14): a duration (0ms: off) or p95 / p99 */
void hedge_after_parse(struct load *ld, const struct key *k, const struct node *v,
                              void *base)
{
	struct cfg_retry *r = base;
	char q[64];
	int64_t us;

	if (v->kind != N_SCALAR || node_is_null(v)) {
		type_error(ld, v, "a duration such as 20ms, or p95 or p99");
		return;
	}
	if (!strcmp(v->str, "p95") || !strcmp(v->str, "p99")) {
		r->hedge_pct = v->str[2] == '5' ? 95 : 99;
		r->hedge_after_us = 0;
		return;
	}
	if (parse_duration(v->str, &us) < 0 || us > 3600 * INT64_C(1000000)) {
		value_error(ld, v, "bad hedge delay %s (expected a duration such as 20ms, 0ms for "
		            "off, or p95 or p99)", cfg_quote(v->str, q, sizeof q));
		return;
	}
	r->hedge_pct = 0;
	r->hedge_after_us = us;
}

/* ------------------------------------------------------------------ custom keys */

void workers_parse(struct load *ld, const struct key *k, const struct node *v, void *base)
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

/* One item of a list of answers (retry.on, idempotency.release_on): a status 400-599 or a gRPC
 * code name but "ok", set in STATUS_BITS / GRPC_BITS as config.h keeps them. Anything else is
 * reported as an unknown NOUN, with the closest of WORDS; VERB says why "ok" or another status
 * cannot be listed, EXPECT what the list takes. */
static void answer_item(struct load *ld, const struct node *item, const char *const *words,
                        const char *noun, const char *verb, const char *expect,
                        uint8_t status_bits[200 / 8], uint32_t *grpc_bits)
{
	const char *near;
	int64_t status;
	char q[80];
	int code = grpc_status_by_name(item->str, strlen(item->str));

	if (code > GRPC_OK)
		*grpc_bits |= 1u << code;
	else if (code == GRPC_OK)
		value_error(ld, item, "gRPC status \"ok\" is a success and %s (%s)", verb, expect);
	else if (scan_int(item->str, &status) == 0 && status >= 400 && status <= 599)
		status_bits[(status - 400) / 8] |= (uint8_t)(1u << ((status - 400) % 8));
	else if (scan_int(item->str, &status) == 0)
		value_error(ld, item, "status %s %s (%s)", cfg_quote(item->str, q, sizeof q), verb,
		            expect);
	else if ((near = closest_word(item->str, words)))
		value_error(ld, item, "unknown %s %s (did you mean \"%s\"?)", noun,
		            cfg_quote(item->str, q, sizeof q), near);
	else
		value_error(ld, item, "unknown %s %s (%s)", noun, cfg_quote(item->str, q, sizeof q),
		            expect);
}

/* WORDS[N...]: the gRPC code names but "ok", NULL-terminated, for "did you mean" */
static void grpc_words(const char **words, int n)
{
	for (int c = GRPC_OK + 1; c < GRPC_NCODES; c++)
		words[n++] = grpc_status_name(c);
	words[n] = NULL;
}

void retry_on_parse(struct load *ld, const struct key *k, const struct node *v, void *base)
{
	static const char expect[] = "expected connect-failure, reset, timeout, a status code "
	                             "400-599 or a gRPC code name such as unavailable";
	struct cfg_retry *r = base;
	/* the words, then the gRPC names but "ok", for "did you mean" */
	const char *words[8 + GRPC_NCODES];
	int nw = 0;

	for (int w = 0; cfg_retry_on_words[w]; w++)
		words[nw++] = cfg_retry_on_words[w];
	grpc_words(words, nw);

	if (v->kind != N_SEQ && !node_is_null(v)) {
		type_error(ld, v, "a sequence of conditions");
		return;
	}
	/* replaces the default; duplicates merge into the same bit */
	r->on_flags = 0;
	memset(r->on_status, 0, sizeof r->on_status);
	r->on_grpc = 0;
	for (int i = 0; v->kind == N_SEQ && i < v->nkids; i++) {
		const struct node *item = v->kids[i];
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
		if (!cfg_retry_on_words[w])
			answer_item(ld, item, words, "condition", "cannot be retried", expect,
			            r->on_status, &r->on_grpc);
	}
}

/* idempotency.release_on: the answers by which the service says it did not take the request
 * (SPEC §6); a connect-failure always releases and is no answer to list */
void release_on_parse(struct load *ld, const struct key *k, const struct node *v,
                             void *base)
{
	static const char expect[] = "expected a status code 400-599 or a gRPC code name such as "
	                             "resource-exhausted";
	struct cfg_idempotency *id = base;
	const char *words[GRPC_NCODES + 1];

	grpc_words(words, 0);
	if (v->kind != N_SEQ && !node_is_null(v)) {
		type_error(ld, v, "a sequence of statuses and gRPC code names");
		return;
	}
	memset(id->release_status, 0, sizeof id->release_status);
	id->release_grpc = 0;
	for (int i = 0; v->kind == N_SEQ && i < v->nkids; i++) {
		const struct node *item = v->kids[i];

		if (item->kind != N_SCALAR || node_is_null(item)) {
			type_error(ld, item, "a status or a gRPC code name");
			continue;
		}
		answer_item(ld, item, words, "answer", "cannot mean \"not executed\"", expect,
		            id->release_status, &id->release_grpc);
	}
}

/* retry.idempotent_paths: a path prefix like a route's; a query could never match, since the
 * prefix is compared with the path without its query */
const char *check_idempotent_path(char *s, char *buf, size_t cap)
{
	const char *bad = check_path_prefix(s, buf, cap);
	char q[80];

	if (bad || !strchr(s, '?'))
		return bad;
	snprintf(buf, cap, "bad path prefix %s (expected a path without a query: the query is not "
	         "compared)", cfg_quote(s, q, sizeof q));
	return buf;
}

/* abort's Retry-After: "" (none) or delta-seconds */
const char *check_delta_seconds(char *s, char *buf, size_t cap)
{
	char q[80];
	size_t n = strlen(s);

	if (n <= 9 && strspn(s, "0123456789") == n)
		return NULL;
	snprintf(buf, cap, "bad Retry-After %s (expected whole seconds such as \"2\", or \"\")",
	         cfg_quote(s, q, sizeof q));
	return buf;
}

/* "" (no Redis) or a redis URL, whose password is never echoed */
const char *check_reconcile_redis(char *s, char *buf, size_t cap)
{
	struct store_url u;

	if (!*s || (store_split(s, &u) && u.redis))
		return NULL;
	snprintf(buf, cap, "bad redis URL (expected \"\" or redis://[user:password@]host:port[/db])");
	return buf;
}

/* faults.rules[].grpc_status: a SPEC §10 code name; "" (the default): none */
void fault_grpc_status_parse(struct load *ld, const struct key *k, const struct node *v,
                                    void *base)
{
	const char *words[GRPC_NCODES + 1];
	const char *near;
	char q[80];
	int *code = FIELD(base, k->off, int);

	*code = -1;
	if (v->kind != N_SCALAR || node_is_null(v)) {
		type_error(ld, v, "a gRPC code name such as unavailable");
		return;
	}
	if (!v->str[0] && !v->plain)
		return;
	*code = grpc_status_by_name(v->str, strlen(v->str));
	if (*code >= 0)
		return;
	for (int c = 0; c < GRPC_NCODES; c++)
		words[c] = grpc_status_name(c);
	words[GRPC_NCODES] = NULL;
	if ((near = closest_word(v->str, words)))
		value_error(ld, v, "unknown gRPC code %s (did you mean \"%s\"?)",
		            cfg_quote(v->str, q, sizeof q), near);
	else
		value_error(ld, v, "unknown gRPC code %s (expected a name such as unavailable, "
		            "resource-exhausted or internal)", cfg_quote(v->str, q, sizeof q));
}
