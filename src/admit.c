/*
 * admit: the request's route, deadline, retry facts and the refusals needing no upstream
 * (see admit.h). The order of the checks is the order of the answers a client sees.
 */
#include <string.h>

#include "admit.h"
#include "config.h"
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

static bool request_marked_retry(const struct http_head *r)
{
	return hdr_int(r, "X-Retrygate-Attempt") > 1 || hdr_int(r, "x-envoy-attempt-count") > 1 ||
	       hdr_int(r, "grpc-previous-rpc-attempts") > 0;
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
	if (!a->route) {
		refuse(a, 404, "no-route", false);
		return;
	}
	const struct cfg_upstream *up = a->route->upstream;
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
	a->nested = request_marked_retry(r);
	a->mclass = retry_method_class(r->method);
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
