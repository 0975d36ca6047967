/*
 * admit: the request's route, deadline, retry facts and the refusals needing no upstream
 * (see admit.h). The order of the checks is the order of the answers a client sees.
 */
#include <string.h>

#include "proxy/admit.h"
#include "config/config.h"
#include "http/grpc.h"
#include "http/h1_parser.h"
#include "proxy/idem_job.h"
#include "proxy/route.h"
#include "base/util.h"

/* A value as a non-negative integer of at most 18 digits; -1 when absent (V NULL) or
 * anything else. */
static int64_t value_int(const char *v, size_t n)
{
	if (!v || n == 0 || n > 18)
		return -1;
	int64_t x = 0;
	for (size_t i = 0; i < n; i++) {
		if (v[i] < '0' || v[i] > '9')
			return -1;
		x = x * 10 + (v[i] - '0');
	}
	return x;
}

static int64_t field_int(const struct http_hdr *f)
{
	return f ? value_int(f->value, f->vlen) : -1;
}

static int64_t hdr_int(const struct http_head *h, const char *name)
{
	size_t n = 0;
	const char *v = http_head_get(h, name, &n);
	return value_int(v, n);
}

bool admit_response_nested(const struct http_head *h)
{
	return hdr_int(h, "X-Retrygate-Attempts") > 1 ||
	       http_head_get(h, "X-Retrygate-Retry-Refused", NULL) != NULL;
}

/* The request fields admission reads, each its first occurrence (NULL: absent). One pass
 * over the head finds them all, told apart by length before any byte is compared: looking
 * each name up on its own walked every field once per name, for every request. */
struct req_fields {
	const struct http_hdr *attempt;         /* X-Retrygate-Attempt */
	const struct http_hdr *envoy_count;     /* x-envoy-attempt-count */
	const struct http_hdr *grpc_prev;       /* grpc-previous-rpc-attempts */
	const struct http_hdr *ctype;           /* content-type */
	const struct http_hdr *key;             /* the upstream's idempotency header */
};

#define IS_FIELD(f, lit) str_ieq((f)->name, (f)->nlen, lit, sizeof(lit) - 1)
/* within find_fields: a field of LIT's length is LIT or none of the others */
#define FIELD_CASE(lit, member)                                         \
	case sizeof(lit) - 1:                                           \
		slot = IS_FIELD(f, lit) ? &out->member : NULL;          \
		break;

static void find_fields(const struct http_head *r, const char *keyname, struct req_fields *out)
{
	size_t keylen = keyname ? strlen(keyname) : 0;
	memset(out, 0, sizeof(*out));
	for (int i = 0; i < r->nhdrs; i++) {
		const struct http_hdr *f = &r->hdrs[i];
		const struct http_hdr **slot = NULL;
		switch (f->nlen) {
		FIELD_CASE("content-type", ctype)
		FIELD_CASE("x-retrygate-attempt", attempt)
		FIELD_CASE("x-envoy-attempt-count", envoy_count)
		FIELD_CASE("grpc-previous-rpc-attempts", grpc_prev)
		}
		if (slot && !*slot)
			*slot = f;
		/* not one of the cases above: the configured name may be any of them */
		if (keyname && !out->key && f->nlen == keylen && str_ieq(f->name, f->nlen, keyname, keylen))
			out->key = f;
	}
}

/* A gRPC call's grpc-previous-rpc-attempts is its client's own retry count (gRFC A6): any
 * value but 0, even one we cannot read, says a retry policy above us is already at work. */
static bool request_marked_retry(const struct req_fields *rf, bool grpc)
{
	if (grpc && rf->grpc_prev && field_int(rf->grpc_prev) != 0)
		return true;
	return field_int(rf->attempt) > 1 || field_int(rf->envoy_count) > 1 ||
	       field_int(rf->grpc_prev) > 0;
}

/* SPEC §10: HTTP/2 and a gRPC content-type. Over HTTP/1 the same content-type is just a
 * POST: gRPC needs trailers, which we only relay over HTTP/2. */
static bool request_is_grpc(const struct http_head *r, const struct req_fields *rf)
{
	return r->version == 20 && rf->ctype && grpc_content_type(rf->ctype->value, rf->ctype->vlen);
}

/* The path without its query starts with one of retry.idempotent_paths (§4 rule 4) */
static bool path_idempotent(const struct cfg_retry *rc, const char *path, size_t len)
{
	const char *q = path ? memchr(path, '?', len) : NULL;
	if (q)
		len = (size_t)(q - path);
	for (int i = 0; path && i < rc->nidempotent_paths; i++) {
		size_t plen = strlen(rc->idempotent_paths[i]);
		if (plen <= len && memcmp(path, rc->idempotent_paths[i], plen) == 0)
			return true;
	}
	return false;
}

static void refuse(struct admission *a, int status, const char *reason, bool close)
{
	a->status = status;
	a->reason = reason;
	a->close = close;
}

void admit_request(const struct cfg_listener *l, const struct http_head *r, struct admission *a)
{
	memset(a, 0, sizeof(*a));
	a->route = route_match(l, r->host, r->host_len, r->path, r->path_len);
	const struct cfg_upstream *up = a->route ? a->route->upstream : NULL;
	struct req_fields rf;
	find_fields(r, up ? up->idem.header : NULL, &rf);
	a->grpc = request_is_grpc(r, &rf);  /* first: every refusal of a gRPC call is in gRPC form */
	if (!a->route) {
		refuse(a, 404, "no-route", false);
		return;
	}
	/* gRPC's status travels in trailers, which an HTTP/1.1 upstream hop cannot carry back:
	 * the exchange answers this in gRPC form, UNIMPLEMENTED */
	if (a->grpc && up->protocol != UP_H2) {
		refuse(a, 501, "not-implemented", true);
		return;
	}
	/* the route's policy: its upstream's, or its own (SPEC §2) */
	const struct cfg_retry *rc = a->route->retry;
	const struct cfg_deadline *dc = a->route->deadline;
	struct dl_value vals[DL_NKINDS];
	deadline_collect(r->hdrs, r->nhdrs, vals, a->dl_present);
	int kind;
	if (deadline_resolve(vals, dc, &a->budget_us, &kind) != DL_OK) {
		refuse(a, 400, "bad-deadline", true);
		return;
	}
	if (a->budget_us < dc->min_us || a->budget_us < 1000) {
		refuse(a, 504, "deadline-exceeded", false);
		a->too_late = true;
		return;
	}
	a->nested = request_marked_retry(&rf, a->grpc);
	/* an idempotent path is idempotent whatever the method: rule 4, the log and the
	 * unknown-outcome record all read it from the class */
	a->idempotent_path = path_idempotent(rc, r->path, r->path_len);
	a->mclass = a->idempotent_path ? MC_IDEMPOTENT : retry_method_class(r->method);
	if (rf.key && rf.key->vlen > 0) {
		a->key = rf.key->value;
		a->keylen = rf.key->vlen;
	}
	if (l->limits.max_body > 0 && r->content_length > l->limits.max_body) {
		refuse(a, 413, "body-too-large", true);
		return;
	}
	const struct cfg_idempotency *ic = &up->idem;
	if (idem_job_applies(ic, r->method, true) && !a->key && ic->require_key) {
		refuse(a, 400, "idempotency-key-required", true);
		return;
	}
	a->idem = idem_job_applies(ic, r->method, a->key != NULL);
	/* the fingerprint hashes the whole body: it is buffered, up to idempotency.max_body */
	if (a->idem && r->content_length > ic->max_body) {
		refuse(a, 413, "body-too-large", true);
		return;
	}
	if (!r->chunked && r->content_length <= 0)
		a->bmode = BODY_NONE;
	else if (a->idem || r->chunked || r->content_length <= rc->max_body)
		a->bmode = BODY_BUFFER;
	else
		a->bmode = BODY_STREAM;
}
