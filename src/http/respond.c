/*
 * respond: the responses retrygate makes, and the fields of relayed ones (see respond.h).
 */
#include <string.h>

#include <event2/buffer.h>

#include "http/grpc.h"
#include "http/h1_write.h"
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

void respond_field(struct http_hdr *f, const char *name, const char *value, size_t vlen)
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
	respond_field(&m->fields[k++], "Content-Type", "application/json", 16);
	respond_field(&m->fields[k++], "X-Retrygate-Reason", reason, strlen(reason));
	respond_field(&m->fields[k++], "X-Retrygate-Attempts", m->attempts, alen);
	if (refused)
		respond_field(&m->fields[k++], "X-Retrygate-Retry-Refused", refused, strlen(refused));
	if (retry_after)
		respond_field(&m->fields[k++], "Retry-After", retry_after, strlen(retry_after));
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
	respond_field(&m->fields[k++], "content-type", "application/grpc", 16);
	respond_field(&m->fields[k++], "grpc-status", m->code, clen);
	/* grpc-message is percent-encoded on the wire; a reason is [a-z-] and needs none */
	respond_field(&m->fields[k++], "grpc-message", reason, strlen(reason));
	respond_field(&m->fields[k++], "X-Retrygate-Reason", reason, strlen(reason));
	respond_field(&m->fields[k++], "X-Retrygate-Attempts", m->attempts, alen);
	if (refused)
		respond_field(&m->fields[k++], "X-Retrygate-Retry-Refused", refused, strlen(refused));
	if (pushback_ms >= 0)
		respond_field(&m->fields[k++], "grpc-retry-pushback-ms", m->pushback,
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
	respond_field(&out[k++], "X-Retrygate-Attempts", num, h1_fmt_int(num, attempts));
	if (refused)
		respond_field(&out[k++], "X-Retrygate-Retry-Refused", refused, strlen(refused));
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
		respond_field(&r->fields[n++], "Connection", "upgrade", 7);
		respond_field(&r->fields[n++], "Upgrade", u ? u : "", u ? ulen : 0);
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
		respond_field(&fields[k++], "X-Request-Id", reqid, strlen(reqid));
	h->hdrs = fields;
	h->nhdrs = k;
}
