/*
 * h2_responder: the HTTP/2 responder an exchange answers a stream through (see
 * h2_session_impl.h): the response head as a field list (lowercase names, no connection-specific
 * field, content-length when known), DATA from the stream's pending buffer as the client's
 * window allows, trailers after the last DATA, RST_STREAM for a response cut short. It only
 * submits and schedules: nghttp2 itself runs from the session's clean stack.
 */
#include <stdlib.h>
#include <string.h>

#include <event2/buffer.h>
#include <event2/event.h>
#include <nghttp2/nghttp2.h>

#include "clock.h"
#include "exchange.h"
#include "h2_session_impl.h"
#include "respond.h"
#include "stream.h"
#include "util.h"

/* ------------------------------------------------------------------ the HTTP/2 responder */

/* By length first: asked for every field of every head, it answers most with one switch. */
bool h2s_connection_field(const char *n, size_t len)
{
	switch (len) {
	case 2:
		return str_ieq(n, len, "te", 2);
	case 7:
		return str_ieq(n, len, "upgrade", 7) || str_ieq(n, len, "trailer", 7);
	case 10:
		return str_ieq(n, len, "connection", 10) || str_ieq(n, len, "keep-alive", 10);
	case 14:
		return str_ieq(n, len, "content-length", 14) || str_ieq(n, len, "http2-settings", 14);
	case 16:
		return str_ieq(n, len, "proxy-connection", 16);
	case 17:
		return str_ieq(n, len, "transfer-encoding", 17);
	default:
		return false;
	}
}

/* V in decimal into BUF (24 bytes: any int64); returns the length. snprintf costs ~700
 * instructions here, a fifth of the head's own work. */
static size_t fmt_length(char *buf, int64_t v)
{
	char tmp[24];
	size_t n = 0;
	uint64_t u = v < 0 ? 0 : (uint64_t)v;       /* only called for a known length (>= 0) */
	do {
		tmp[n++] = (char)('0' + u % 10);
		u /= 10;
	} while (u > 0);
	for (size_t i = 0; i < n; i++)
		buf[i] = tmp[n - 1 - i];
	buf[n] = 0;
	return n;
}

static void nv_reserve(struct h2_session *s, size_t n, size_t names)
{
	if (n > s->nvcap) {
		s->nvcap = n + 16;
		s->nv = xrealloc(s->nv, s->nvcap * sizeof(*s->nv));
	}
	if (names > s->namescap) {
		s->namescap = names + 256;
		s->names = xrealloc(s->names, s->namescap);
	}
}

static void nv_set(nghttp2_nv *nv, const char *name, size_t nlen, const char *value, size_t vlen)
{
	nv->name = (uint8_t *)(uintptr_t)name;
	nv->namelen = nlen;
	nv->value = (uint8_t *)(uintptr_t)value;
	nv->valuelen = vlen;
	nv->flags = NGHTTP2_NV_FLAG_NONE;
}

/* A field whose value differs in every response (NAME lower-case). HPACK would add each one to
 * the connection's dynamic table, where it evicts the fields that do repeat (server,
 * content-type, ...), and nghttp2's encoder compares every entry of the same name on each
 * lookup: with a table full of request ids, ~100 memcmp per response, a sixth of the
 * instructions of an HTTP/2 request. Sent as never-indexed literals, the table keeps the
 * stable fields (RFC 7541 §6.2.3; HAProxy indexes no field at all). */
static bool unique_value(const char *name, size_t len)
{
	return len == 12 && memcmp(name, "x-request-id", 12) == 0;
}

/* Fields as HTTP/2 sends them: lower-case names, no connection-specific field (RFC 9113
 * §8.2.2), no pseudo-header from a peer. Fills s->nv from AT; returns the count. NAMES: where
 * the lower-cased names go (s->names from NOFF). */
static size_t nv_fields(struct h2_session *s, size_t at, size_t noff, const struct http_hdr *h,
                        int n)
{
	size_t k = at;
	for (int i = 0; i < n; i++) {
		const struct http_hdr *f = &h[i];
		if (f->hop || f->nlen == 0 || f->name[0] == ':' || h2s_connection_field(f->name, f->nlen))
			continue;
		char *low = s->names + noff;
		for (uint32_t j = 0; j < f->nlen; j++) {
			char c = f->name[j];
			low[j] = (char)(c >= 'A' && c <= 'Z' ? c + 32 : c);
		}
		noff += f->nlen;
		nv_set(&s->nv[k], low, f->nlen, f->value, f->vlen);
		if (unique_value(low, f->nlen))
			s->nv[k].flags = NGHTTP2_NV_FLAG_NO_INDEX;
		k++;
	}
	return k - at;
}

static size_t names_len(const struct http_hdr *h, int n)
{
	size_t t = 0;
	for (int i = 0; i < n; i++)
		t += h[i].nlen;
	return t;
}

/* The head's header block in s->nv: :status, fields, content-length. Returns the count. */
static size_t head_block(struct h2_session *s, const struct resp_head *h, char status[4],
                         char cl[24], bool length)
{
	nv_reserve(s, (size_t)h->nhdrs + 2, names_len(h->hdrs, h->nhdrs));
	int st = h->status >= 100 && h->status <= 999 ? h->status : 502;
	status[0] = (char)('0' + st / 100);
	status[1] = (char)('0' + st / 10 % 10);
	status[2] = (char)('0' + st % 10);
	status[3] = 0;
	nv_set(&s->nv[0], ":status", 7, status, 3);
	size_t n = 1 + nv_fields(s, 1, 0, h->hdrs, h->nhdrs);
	if (length)
		nv_set(&s->nv[n++], "content-length", 14, cl, fmt_length(cl, h->content_length));
	return n;
}

static void rsp_informational(void *arg, const struct resp_head *h)
{
	struct h2_stream *st = arg;
	MAGIC_CHECK(st, H2ST_MAGIC);
	struct h2_session *s = st->s;
	if (s->state == H_CLOSED || st->head_sent || h->status == 101)
		return;
	char status[4], cl[24];
	size_t n = head_block(s, h, status, cl, false);
	nghttp2_submit_headers(s->ng, NGHTTP2_FLAG_NONE, st->id, NULL, s->nv, n, NULL);
	h2s_kick(s);
}


static void rsp_head(void *arg, const struct resp_head *h)
{
	struct h2_stream *st = arg;
	MAGIC_CHECK(st, H2ST_MAGIC);
	struct h2_session *s = st->s;
	if (s->state == H_CLOSED || st->head_sent)
		return;
	st->head_sent = true;
	st->bodyless = st->head.method_head || h->status == 204 || h->status == 304 || h->end_stream;
	/* a head that ends the stream (gRPC Trailers-Only) is the whole response: resp_eof
	 * already, so that end() adds nothing to it; no length, no data provider */
	if (h->end_stream)
		st->resp_eof = true;
	char status[4], cl[24];
	size_t n = head_block(s, h, status, cl, !h->end_stream &&
	                      h->status >= 200 && h->status != 204 && h->content_length >= 0);
	nghttp2_data_provider prd = { .source.ptr = st, .read_callback = h2s_data_read_cb };
	nghttp2_submit_response(s->ng, st->id, s->nv, n, st->bodyless ? NULL : &prd);
	h2s_kick(s);
}

static void rsp_body(void *arg, struct evbuffer *data)
{
	struct h2_stream *st = arg;
	MAGIC_CHECK(st, H2ST_MAGIC);
	struct h2_session *s = st->s;
	size_t n = evbuffer_get_length(data);
	if (s->state == H_CLOSED || st->bodyless || st->cut || n == 0) {
		evbuffer_drain(data, n);
		return;
	}
	if (s->resp_pending == 0)
		s->last_progress_us = clock_now_us();
	evbuffer_add_buffer(st->resp, data);
	s->resp_pending += n;
	if (evbuffer_get_length(st->resp) > RESP_LOW)
		st->was_high = true;
	if (st->deferred) {
		st->deferred = false;
		nghttp2_session_resume_data(s->ng, st->id);
	}
	h2s_kick(s);
}

static void rsp_trailers(void *arg, const struct http_hdr *t, int n)
{
	struct h2_stream *st = arg;
	MAGIC_CHECK(st, H2ST_MAGIC);
	if (st->s->state == H_CLOSED || st->trailers || st->bodyless || n <= 0)
		return;     /* bodyless: no DATA will carry them out (a head that ended the stream) */
	/* kept until the last DATA is packed (h2s_data_read_cb submits them) */
	size_t bytes = 0;
	for (int i = 0; i < n; i++)
		bytes += t[i].nlen + t[i].vlen;
	/* one allocation for the list and its bytes (every gRPC response has trailers) */
	st->trailers = xmalloc((size_t)n * sizeof(*st->trailers) + bytes + 1);
	char *p = (char *)(st->trailers + n);
	for (int i = 0; i < n; i++) {
		const struct http_hdr *f = &t[i];
		if (f->nlen == 0 || f->name[0] == ':' || h2s_connection_field(f->name, f->nlen))
			continue;
		char *name = p;
		for (uint32_t j = 0; j < f->nlen; j++)
			*p++ = (char)(f->name[j] >= 'A' && f->name[j] <= 'Z' ? f->name[j] + 32 : f->name[j]);
		memcpy(p, f->value, f->vlen);
		nv_set(&st->trailers[st->ntrailers++], name, f->nlen, p, f->vlen);
		p += f->vlen;
	}
}

void h2s_rsp_end(void *arg, bool complete, bool close)
{
	struct h2_stream *st = arg;
	MAGIC_CHECK(st, H2ST_MAGIC);
	struct h2_session *s = st->s;
	st->ex_done = true;
	if (s->state == H_CLOSED)
		return;
	if (st->head_sent && st->resp_eof) {
		/* the head ended the stream: nothing to cut or resume; a client still sending is
		 * reset after it (NO_ERROR) as for any response that closes */
		if (close && !st->req_end)
			st->rst_after = true;
		h2s_kick(s);
		return;
	}
	if (!complete || !st->head_sent) {
		/* never END_STREAM on a cut response: the client must not take it as complete */
		st->cut = true;
		s->resp_pending -= evbuffer_get_length(st->resp);
		evbuffer_drain(st->resp, evbuffer_get_length(st->resp));
		nghttp2_submit_rst_stream(s->ng, NGHTTP2_FLAG_NONE, st->id, NGHTTP2_INTERNAL_ERROR);
	} else {
		st->resp_eof = true;
		/* SPEC §9: where §5 closes the connection, the stream is reset after the response
		 * instead, if the client is still sending (RFC 9113 §8.1) */
		if (close && !st->req_end)
			st->rst_after = true;
		if (st->deferred) {
			st->deferred = false;
			nghttp2_session_resume_data(s->ng, st->id);
		}
	}
	h2s_kick(s);
}

static size_t rsp_queued(void *arg)
{
	struct h2_stream *st = arg;
	MAGIC_CHECK(st, H2ST_MAGIC);
	return evbuffer_get_length(st->resp);
}

static void rsp_want_body(void *arg)
{
	struct h2_stream *st = arg;
	MAGIC_CHECK(st, H2ST_MAGIC);
	h2s_kick(st->s);
}

static void rsp_tunnel(void *arg, const struct resp_head *h, struct stream *upstream)
{
	/* not reached: no HTTP/2 request is an Upgrade (req->upgrade is false) */
	struct h2_stream *st = arg;
	MAGIC_CHECK(st, H2ST_MAGIC);
	stream_free(upstream);
	st->ex_done = true;
	if (st->s->state != H_CLOSED)
		nghttp2_submit_rst_stream(st->s->ng, NGHTTP2_FLAG_NONE, st->id, NGHTTP2_INTERNAL_ERROR);
	h2s_kick(st->s);
}

const struct responder h2_responder = {
	.informational = rsp_informational,
	.head = rsp_head,
	.body = rsp_body,
	.trailers = rsp_trailers,
	.end = h2s_rsp_end,
	.queued = rsp_queued,
	.want_body = rsp_want_body,
	.tunnel = rsp_tunnel,
};

