/*
 * admit: the request's route, deadline, retry facts and the refusals needing no upstream
 * (see admit.h). The order of the checks is the order of the answers a client sees.
 */
#include <string.h>

#include "admit.h"
#include "config.h"
#include "grpc.h"
#include "http.h"
#include "idem_job.h"
#include "route.h"

static int64_t hdr_int(const struct http_head *h, const char *name)
{
	size_t n;
	const char *v = http_head_get(h, name, &n);
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

bool admit_response_nested(const struct http_head *h)
{
	return hdr_int(h, "X-Retrygate-Attempts") > 1 ||
	       http_head_get(h, "X-Retrygate-Retry-Refused", NULL) != NULL;
}

/* A gRPC call's grpc-previous-rpc-attempts is its client's own retry count (gRFC A6): any
 * value but 0, even one we cannot read, says a retry policy above us is already at work. */
static bool request_marked_retry(const struct http_head *r, bool grpc)
{
	if (grpc && http_head_get(r, "grpc-previous-rpc-attempts", NULL) &&
	    hdr_int(r, "grpc-previous-rpc-attempts") != 0)
		return true;
	return hdr_int(r, "X-Retrygate-Attempt") > 1 || hdr_int(r, "x-envoy-attempt-count") > 1 ||
	       hdr_int(r, "grpc-previous-rpc-attempts") > 0;
}

/* SPEC §10: HTTP/2 and a gRPC content-type. Over HTTP/1 the same content-type is just a
 * POST: gRPC needs trailers, which we only relay over HTTP/2. */
static bool request_is_grpc(const struct http_head *r)
{
	if (r->version != 20)
		return false;           /* no header scan for an HTTP/1 request */
	size_t n = 0;
	const char *ct = http_head_get(r, "content-type", &n);
	return ct && grpc_content_type(ct, n);
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
	a->grpc = request_is_grpc(r);   /* first: every refusal of a gRPC call is in gRPC form */
	a->route = route_match(l, r->host, r->host_len, r->path, r->path_len);
	if (!a->route) {
		refuse(a, 404, "no-route", false);
		return;
	}
	const struct cfg_upstream *up = a->route->upstream;
	/* gRPC's status travels in trailers, which an HTTP/1.1 upstream hop cannot carry back:
	 * the exchange answers this in gRPC form, UNIMPLEMENTED */
	if (a->grpc && up->protocol != UP_H2) {
		refuse(a, 501, "not-implemented", true);
		return;
	}
	struct dl_value vals[DL_NKINDS];
	deadline_collect(r->hdrs, r->nhdrs, vals, a->dl_present);
	int kind;
	if (deadline_resolve(vals, &up->deadline, &a->budget_us, &kind) != DL_OK) {
		refuse(a, 400, "bad-deadline", true);
		return;
	}
	if (a->budget_us < up->deadline.min_us || a->budget_us < 1000) {
		refuse(a, 504, "deadline-exceeded", false);
		a->too_late = true;
		return;
	}
	a->nested = request_marked_retry(r, a->grpc);
	/* an idempotent path is idempotent whatever the method: rule 4, the log and the
	 * unknown-outcome record all read it from the class */
	a->idempotent_path = path_idempotent(&up->retry, r->path, r->path_len);
	a->mclass = a->idempotent_path ? MC_IDEMPOTENT : retry_method_class(r->method);
	size_t klen = 0;
	const char *key = http_head_get(r, up->idem.header, &klen);
	if (key && klen > 0) {
		a->key = key;
		a->keylen = klen;
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
	else if (a->idem || r->chunked || r->content_length <= up->retry.max_body)
		a->bmode = BODY_BUFFER;
	else
		a->bmode = BODY_STREAM;
}
