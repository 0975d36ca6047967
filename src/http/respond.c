/*
 * respond: the responses retrygate makes, and the fields of relayed ones (see respond.h).
 */
#include <string.h>

#include <event2/buffer.h>

#include "http/grpc.h"
#include "http/h1_write.h"
#include "idempotency/idempotency.h"
#include "http/respond.h"
#include "base/util.h"

const char *respond_status_text(int status)
{
	switch (status) {
	case 100: return "Continue";
	case 200: return "OK";
	case 400: return "Bad Request";
	case 401: return "Unauthorized";
	case 403: return "Forbidden";
	case 404: return "Not Found";
	case 405: return "Method Not Allowed";
	case 408: return "Request Timeout";
	case 409: return "Conflict";
	case 413: return "Content Too Large";
	case 414: return "URI Too Long";
	case 422: return "Unprocessable Content";
	case 431: return "Request Header Fields Too Large";
	case 500: return "Internal Server Error";
	case 501: return "Not Implemented";
	case 502: return "Bad Gateway";
	case 503: return "Service Unavailable";
	case 504: return "Gateway Timeout";
	case 505: return "HTTP Version Not Supported";
	default:  return "Unknown";
	}
}

static void set_field(struct http_hdr *f, const char *name, const char *value, size_t vlen)
{
	f->name = name;
	f->nlen = (uint32_t)strlen(name);
	f->value = value;
	f->vlen = (uint32_t)vlen;
	f->hop = false;
}

static size_t put(char *dst, size_t at, size_t cap, const char *s, size_t n)
{
	if (at + n >= cap)
		n = at < cap ? cap - at - 1 : 0;
	memcpy(dst + at, s, n);
	return at + n;
}

#define PUT(b, at, lit) put((b), (at), sizeof(b), lit, sizeof(lit) - 1)

void respond_error(struct made_response *m, int status, const char *reason, const char *upstream,
                   int attempts, const char *refused, const char *retry_after, bool close)
{
	char up[256];
	size_t ulen = json_escape(up, sizeof(up), upstream, upstream ? strlen(upstream) : 0);
	size_t alen = h1_fmt_int(m->attempts, attempts);
	size_t n = PUT(m->body, 0, "{\"error\":\"");
	n = put(m->body, n, sizeof(m->body), reason, strlen(reason));
	n = PUT(m->body, n, "\",\"upstream\":\"");
	n = put(m->body, n, sizeof(m->body), up, ulen);
	n = PUT(m->body, n, "\",\"attempts\":");
	n = put(m->body, n, sizeof(m->body), m->attempts, alen);
	n = PUT(m->body, n, "}\n");
	m->body_len = n;

	int k = 0;
	set_field(&m->fields[k++], "Content-Type", "application/json", 16);
	set_field(&m->fields[k++], "X-Retrygate-Reason", reason, strlen(reason));
	set_field(&m->fields[k++], "X-Retrygate-Attempts", m->attempts, alen);
	if (refused)
		set_field(&m->fields[k++], "X-Retrygate-Retry-Refused", refused, strlen(refused));
	if (retry_after)
		set_field(&m->fields[k++], "Retry-After", retry_after, strlen(retry_after));
	m->head = (struct resp_head){
		.status = status,
		.hdrs = m->fields,
		.nhdrs = k,
		.content_length = (int64_t)m->body_len,
		.close = close,
	};
}

void respond_grpc_error(struct made_response *m, const char *reason, const char *upstream,
                        int attempts, const char *refused)
{
	int pushback_ms;
	int code = grpc_status_for_reason(reason, &pushback_ms);
	size_t alen = h1_fmt_int(m->attempts, attempts);
	size_t clen = h1_fmt_int(m->code, code);
	(void)upstream;
	m->body_len = 0;

	/* lower-case as gRPC writes them; the HTTP/2 responder lowercases the rest */
	int k = 0;
	set_field(&m->fields[k++], "content-type", "application/grpc", 16);
	set_field(&m->fields[k++], "grpc-status", m->code, clen);
	/* grpc-message is percent-encoded on the wire; a reason is [a-z-] and needs none */
	set_field(&m->fields[k++], "grpc-message", reason, strlen(reason));
	set_field(&m->fields[k++], "X-Retrygate-Reason", reason, strlen(reason));
	set_field(&m->fields[k++], "X-Retrygate-Attempts", m->attempts, alen);
	if (refused)
		set_field(&m->fields[k++], "X-Retrygate-Retry-Refused", refused, strlen(refused));
	if (pushback_ms >= 0)
		set_field(&m->fields[k++], "grpc-retry-pushback-ms", m->pushback,
		          h1_fmt_int(m->pushback, pushback_ms));
	m->head = (struct resp_head){
		.status = 200,
		.hdrs = m->fields,
		.nhdrs = k,
		.content_length = 0,
		.end_stream = true,
	};
}

/* The length first, here: most fields differ in it, and str_ieq is a call (asked three times
 * of every field of every relayed head). */
static bool named(const struct http_hdr *h, const char *name, size_t nlen)
{
	return h->nlen == nlen && str_ieq(h->name, h->nlen, name, nlen);
}

#define NAMED(h, lit) named((h), lit, sizeof(lit) - 1)

static int relay_fields(const struct http_head *up, int attempts, const char *refused,
                        char num[24], struct http_hdr *out, int cap)
{
	int k = 0;
	for (int i = 0; i < up->nhdrs && k < cap - 2; i++) {
		const struct http_hdr *x = &up->hdrs[i];
		if (x->hop || NAMED(x, "X-Retrygate-Attempts"))
			continue;
		if (refused && NAMED(x, "X-Retrygate-Retry-Refused"))
			continue;
		out[k++] = *x;
	}
	set_field(&out[k++], "X-Retrygate-Attempts", num, h1_fmt_int(num, attempts));
	if (refused)
		set_field(&out[k++], "X-Retrygate-Retry-Refused", refused, strlen(refused));
	return k;
}

void respond_relayed(struct relayed_head *r, const struct http_head *up, int attempts,
                     const char *refused, bool close, bool tunnel)
{
	int cap = HTTP_MAX_HEADERS + 2;
	int n = relay_fields(up, attempts, refused, r->num, r->fields, cap);
	if (tunnel) {
		size_t ulen = 0;
		const char *u = http_head_get(up, "Upgrade", &ulen);
		set_field(&r->fields[n++], "Connection", "upgrade", 7);
		set_field(&r->fields[n++], "Upgrade", u ? u : "", u ? ulen : 0);
	}
	r->head = (struct resp_head){
		.status = up->status,
		.reason = up->reason,
		.reason_len = up->reason_len,
		.hdrs = r->fields,
		.nhdrs = n,
		.content_length = tunnel ? -1 : up->content_length,
		.close = close,
		.end_stream = up->end_stream,   /* Trailers-Only stays Trailers-Only (SPEC §10) */
	};
}

void respond_send(const struct responder *rsp, const struct resp_head *h, const char *body,
                  size_t len)
{
	rsp->head(rsp->arg, h);
	if (len > 0) {
		struct evbuffer *b = evbuffer_new();
		evbuffer_add(b, body, len);
		rsp->body(rsp->arg, b);
		evbuffer_free(b);
	}
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

void respond_replay(struct replay_response *m, const struct idem_response *stored)
{
	int k = parse_lines(stored->headers, stored->headers_len, m->fields, HTTP_MAX_HEADERS);
	bool grpc = false;
	for (int i = 0; i < k; i++)
		grpc = grpc || NAMED(&m->fields[i], "grpc-status");
	m->ntrailers = stored->trailers_len
	             ? parse_lines(stored->trailers, stored->trailers_len, m->trailers,
	                           HTTP_MAX_HEADERS)
	             : 0;
	set_field(&m->fields[k++], "Idempotency-Replayed", "true", 4);
	set_field(&m->fields[k++], "X-Retrygate-Attempts", "0", 1);
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

void respond_replay_send(const struct responder *rsp, const struct replay_response *m,
                         const char *body)
{
	respond_send(rsp, &m->head, body, m->body_len);
	if (m->ntrailers)
		rsp->trailers(rsp->arg, m->trailers, m->ntrailers);
}

void respond_request_id(struct resp_head *h, struct http_hdr *fields, int cap, const char *reqid)
{
	if (!reqid || !*reqid)
		return;
	int k = 0;
	for (int i = 0; i < h->nhdrs; i++) {
		if (NAMED(&fields[i], "X-Request-Id"))
			continue;
		if (k != i)
			fields[k] = fields[i];
		k++;
	}
	if (k < cap)
		set_field(&fields[k++], "X-Request-Id", reqid, strlen(reqid));
	h->hdrs = fields;
	h->nhdrs = k;
}
