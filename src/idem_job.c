/*
 * idem_job: one request's idempotency claim, from claim to settlement (see idem_job.h).
 */
#include <stdlib.h>
#include <string.h>

#include <event2/buffer.h>

#include "http.h"
#include "idem_job.h"
#include "loop.h"
#include "responder.h"
#include "util.h"

#define MAX_SCOPE_HEADERS 16

struct idem_job {
	const struct cfg_idempotency *ic;
	struct idem_store *store;
	struct idem_op *op;             /* a claim waiting for its answer */
	struct idem_key key;
	idem_claim_fn fn;
	void *arg;
	bool owns;                      /* this request claimed the key */
	bool overflow;                  /* the body outgrew max_response: relayed, not stored */
	int status;
	struct evbuffer *hdrs;          /* "Name: value\r\n" lines */
	struct evbuffer *body;
};

bool idem_job_applies(const struct cfg_idempotency *ic, const char *method, bool has_key)
{
	if (!ic->enabled || !has_key)
		return false;
	for (int i = 0; i < ic->nmethods; i++)
		if (strcmp(ic->methods[i], method) == 0)
			return true;
	return false;
}

static void claimed_cb(void *arg, enum idem_result r, const struct idem_response *stored)
{
	struct idem_job *j = arg;
	j->op = NULL;
	if (r == IDEM_CLAIMED) {
		j->owns = true;
		j->hdrs = evbuffer_new();
		j->body = evbuffer_new();
	}
	j->fn(j->arg, r, stored);
}

struct idem_job *idem_job_claim(struct loop *loop, const struct cfg_idempotency *ic,
                                const char *upstream, const struct http_head *req,
                                struct evbuffer *body, idem_claim_fn fn, void *arg,
                                const char **err)
{
	struct idem_store *store = idem_store_get(ic, loop->base, loop->dns, err);
	if (!store)
		return NULL;
	struct idem_job *j = xcalloc(1, sizeof(*j));
	j->ic = ic;
	j->store = store;
	j->fn = fn;
	j->arg = arg;
	const char *vals[MAX_SCOPE_HEADERS];
	size_t lens[MAX_SCOPE_HEADERS];
	int nv = ic->nscope_headers < MAX_SCOPE_HEADERS ? ic->nscope_headers : MAX_SCOPE_HEADERS;
	for (int i = 0; i < nv; i++)
		vals[i] = http_head_get(req, ic->scope_headers[i], &lens[i]);
	size_t klen = 0, ctlen = 0;
	const char *key = http_head_get(req, ic->header, &klen);
	const char *ct = http_head_get(req, "Content-Type", &ctlen);
	idem_scope(j->key.scope, upstream, vals, lens, nv, key, klen);
	idem_fingerprint(j->key.fp, req->method, strlen(req->method), req->path, req->path_len, ct,
	                 ctlen, body);
	j->op = idem_claim(store, &j->key, ic->lock_timeout_us, claimed_cb, j);
	return j;
}

bool idem_job_owns(const struct idem_job *j)
{
	return j && j->owns;
}

static bool ours(const struct http_hdr *x)
{
	return str_ieq(x->name, x->nlen, "X-Retrygate-Attempts", 20) ||
	       str_ieq(x->name, x->nlen, "X-Retrygate-Retry-Refused", 25);
}

void idem_job_record_head(struct idem_job *j, const struct resp_head *h)
{
	if (!idem_job_owns(j))
		return;
	j->status = h->status;
	evbuffer_drain(j->hdrs, evbuffer_get_length(j->hdrs));
	for (int i = 0; i < h->nhdrs; i++) {
		const struct http_hdr *x = &h->hdrs[i];
		if (x->hop || ours(x))
			continue;
		evbuffer_add(j->hdrs, x->name, x->nlen);
		evbuffer_add(j->hdrs, ": ", 2);
		evbuffer_add(j->hdrs, x->value, x->vlen);
		evbuffer_add(j->hdrs, "\r\n", 2);
	}
}

void idem_job_record_body(struct idem_job *j, struct evbuffer *data)
{
	if (!idem_job_owns(j) || j->overflow)
		return;
	size_t n = evbuffer_get_length(data);
	if (evbuffer_get_length(j->body) + n > (size_t)j->ic->max_response) {
		j->overflow = true;     /* relayed, not stored: the key stays claimed */
		return;
	}
	evbuffer_add(j->body, evbuffer_pullup(data, -1), n);
}

bool idem_job_settle(struct idem_job *j, int last_status, bool reached, bool complete)
{
	if (!j)
		return false;
	if (j->op) {
		idem_cancel(j->op);
		j->op = NULL;
	}
	if (!j->owns)
		return false;
	j->owns = false;
	const struct cfg_idempotency *ic = j->ic;
	int64_t blen = (j->overflow || !complete) ? -1 : (int64_t)evbuffer_get_length(j->body);
	switch (idem_disposition(last_status, reached, blen, ic->max_response)) {
	case IDEM_AFTER_STORE: {
		struct idem_response resp = {
			.status = last_status,
			.headers = (const char *)evbuffer_pullup(j->hdrs, -1),
			.headers_len = evbuffer_get_length(j->hdrs),
			.body = (const char *)evbuffer_pullup(j->body, -1),
			.body_len = (size_t)blen,
		};
		idem_complete(j->store, &j->key, &resp, ic->ttl_us);
		return true;
	}
	case IDEM_AFTER_KEEP:
		idem_keep_claimed(j->store, &j->key, ic->ttl_us);
		break;
	case IDEM_AFTER_RELEASE:
		idem_release(j->store, &j->key);
		break;
	case IDEM_AFTER_EXPIRE:
		break;
	}
	return false;
}

void idem_job_free(struct idem_job *j)
{
	if (!j)
		return;
	if (j->op)
		idem_cancel(j->op);
	if (j->hdrs)
		evbuffer_free(j->hdrs);
	if (j->body)
		evbuffer_free(j->body);
	free(j);
}
