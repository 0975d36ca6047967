/*
 * idem_job: one request's idempotency claim, from claim to settlement (see idem_job.h).
 */
#include <stdlib.h>
#include <string.h>

#include <event2/buffer.h>

#include "http/h1_parser.h"
#include "proxy/idem_job.h"
#include "base/loop.h"
#include "http/respond.h"
#include "http/responder.h"
#include "base/util.h"

#define MAX_SCOPE_HEADERS 16

struct idem_job {
	const struct cfg_idempotency *ic;
	struct idem_store *store;
	struct idem_op *op;             /* a claim waiting for its answer */
	struct idem_key key;
	idem_claim_fn fn;
	void *arg;
	bool owns;                      /* this request claimed the key */
	bool overflow;                  /* body + trailers outgrew max_response: relayed, not
	                                 * stored */
	bool body_seen;                 /* body bytes were relayed (for gRPC: messages) */
	int status;
	struct evbuffer *hdrs;          /* "Name: value\r\n" lines */
	struct evbuffer *body;
	struct evbuffer *trailers;      /* the same lines; NULL until trailers come */
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

/* Fields no replay may carry in a trailer block: pseudo-headers, and what RFC 9113 §8.2.2
 * calls connection-specific (an HTTP/2 peer would take the replay as malformed). */
static bool not_a_trailer(const struct http_hdr *x)
{
	static const char *const conn[] = { "connection", "keep-alive", "proxy-connection",
	                                    "transfer-encoding", "upgrade", "te" };
	if (x->hop || x->nlen == 0 || x->name[0] == ':')
		return true;
	for (size_t i = 0; i < sizeof conn / sizeof *conn; i++)
		if (str_ieq(x->name, x->nlen, conn[i], strlen(conn[i])))
			return true;
	return false;
}

static void add_line(struct evbuffer *b, const struct http_hdr *x)
{
	evbuffer_add(b, x->name, x->nlen);
	evbuffer_add(b, ": ", 2);
	evbuffer_add(b, x->value, x->vlen);
	evbuffer_add(b, "\r\n", 2);
}

/* Body and trailer bytes kept so far: what max_response bounds. */
static size_t kept(const struct idem_job *j)
{
	return evbuffer_get_length(j->body) + (j->trailers ? evbuffer_get_length(j->trailers) : 0);
}

/* Past max_response the response is relayed but not stored: drop what was kept (it will
 * never be used) so a large response costs no memory here. */
static void overflow(struct idem_job *j)
{
	j->overflow = true;
	evbuffer_drain(j->body, evbuffer_get_length(j->body));
	if (j->trailers)
		evbuffer_drain(j->trailers, evbuffer_get_length(j->trailers));
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
		add_line(j->hdrs, x);
	}
}

void idem_job_record_body(struct idem_job *j, struct evbuffer *data)
{
	if (!idem_job_owns(j))
		return;
	size_t n = evbuffer_get_length(data);
	j->body_seen = j->body_seen || n > 0;
	if (j->overflow)
		return;
	if (kept(j) + n > (size_t)j->ic->max_response) {
		overflow(j);
		return;
	}
	evbuffer_add(j->body, evbuffer_pullup(data, -1), n);
}

void idem_job_record_trailers(struct idem_job *j, const struct http_hdr *t, int n)
{
	if (!idem_job_owns(j) || j->overflow)
		return;
	struct evbuffer *b = evbuffer_new();
	for (int i = 0; i < n; i++)
		if (!not_a_trailer(&t[i]))
			add_line(b, &t[i]);
	/* one trailer block per response (responder.h); a second would replace the first */
	if (j->trailers)
		evbuffer_free(j->trailers);
	j->trailers = NULL;
	if (kept(j) + evbuffer_get_length(b) > (size_t)j->ic->max_response) {
		evbuffer_free(b);
		overflow(j);
		return;
	}
	j->trailers = b;
}

bool idem_job_settle(struct idem_job *j, int last_status, int grpc_status, bool reached,
                     bool refused, bool complete)
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
	int64_t len = (j->overflow || !complete) ? -1 : (int64_t)kept(j);
	/* a gRPC call whose messages went out was committed (SPEC §10): it ran, whatever code its
	 * trailers carry */
	if (grpc_status >= 0 && last_status == 200 && j->body_seen)
		refused = false;
	switch (idem_disposition(last_status, grpc_status, reached, refused, len,
	                         ic->max_response)) {
	case IDEM_AFTER_STORE: {
		struct idem_response resp = {
			.status = last_status,
			.headers = (const char *)evbuffer_pullup(j->hdrs, -1),
			.headers_len = evbuffer_get_length(j->hdrs),
			.body = (const char *)evbuffer_pullup(j->body, -1),
			.body_len = evbuffer_get_length(j->body),
		};
		if (j->trailers) {
			resp.trailers = (const char *)evbuffer_pullup(j->trailers, -1);
			resp.trailers_len = evbuffer_get_length(j->trailers);
		}
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
	if (j->trailers)
		evbuffer_free(j->trailers);
	free(j);
}

/* "Name: value\r\n" lines (as the idempotency job writes them) into at most CAP fields
 * pointing into P; returns the count. */
static int parse_lines(const char *p, size_t len, struct http_hdr *out, int cap)
{
	const char *end = p + len;
	int k = 0;
	while (p < end && k < cap) {
		const char *eol = memchr(p, '\n', (size_t)(end - p));
		const char *le = eol ? eol : end;
		const char *colon = memchr(p, ':', (size_t)(le - p));
		if (colon) {
			const char *v = colon + 1, *ve = le;
			while (v < ve && (*v == ' ' || *v == '\t'))
				v++;
			while (ve > v && (ve[-1] == '\r' || ve[-1] == ' ' || ve[-1] == '\t'))
				ve--;
			struct http_hdr *f = &out[k++];
			f->name = p;
			f->nlen = (uint32_t)(colon - p);
			f->value = v;
			f->vlen = (uint32_t)(ve - v);
			f->hop = false;
		}
		p = eol ? eol + 1 : end;
	}
	return k;
}

void idem_replay(struct idem_replay *m, const struct idem_response *stored)
{
	int k = parse_lines(stored->headers, stored->headers_len, m->fields, HTTP_MAX_HEADERS);
	bool grpc = false;
	for (int i = 0; i < k; i++)
		grpc = grpc || (m->fields[i].nlen == 11 &&
		                    str_ieq(m->fields[i].name, 11, "grpc-status", 11));
	m->ntrailers = stored->trailers_len
	             ? parse_lines(stored->trailers, stored->trailers_len, m->trailers,
	                           HTTP_MAX_HEADERS)
	             : 0;
	respond_field(&m->fields[k++], "Idempotency-Replayed", "true", 4);
	respond_field(&m->fields[k++], "X-Retrygate-Attempts", "0", 1);
	bool bodyless = stored->status == 204 || stored->status == 304;
	/* Trailers-Only: the status was the whole answer, and it ended the stream (SPEC §10) */
	bool trailers_only = grpc && stored->body_len == 0 && m->ntrailers == 0;
	m->body_len = bodyless || trailers_only ? 0 : stored->body_len;
	m->head = (struct resp_head){
		.status = stored->status,
		.hdrs = m->fields,
		.nhdrs = k,
		/* trailers follow a body of no announced length, as they did when relayed */
		.content_length = bodyless || trailers_only || m->ntrailers ? -1
		                                                            : (int64_t)stored->body_len,
		.end_stream = trailers_only,
	};
}

void idem_replay_send(const struct responder *rsp, const struct idem_replay *m,
                         const char *body)
{
	respond_send(rsp, &m->head, body, m->body_len);
	if (m->ntrailers)
		rsp->trailers(rsp->arg, m->trailers, m->ntrailers);
}
