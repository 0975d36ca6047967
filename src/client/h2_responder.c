/*
 * h2_responder: the HTTP/2 responder an exchange answers a stream through (see
 * h2_session_impl.h): the response head as a field list (lowercase names, no connection-specific
 * field, content-length when known), DATA from the stream's pending buffer as the client's
 * window allows, trailers after the last DATA, RST_STREAM for a response cut short. It only
 * submits and schedules: nghttp2 itself runs from the session's clean stack.
 *
 * Calls go down only (h2_session_impl.h): into the core (schedule a send); the exchange and
 * h2_request.c call it, h2_session.c does not, and it calls neither.
 */
#include <stdlib.h>
#include <string.h>

#include <event2/buffer.h>
#include <event2/event.h>
#include <nghttp2/nghttp2.h>

#include "base/clock.h"
#include "proxy/exchange.h"
#include "client/h2_session_impl.h"
#include "base/loop.h"
#include "http/respond.h"
#include "net/stream.h"
#include "base/util.h"

/* ------------------------------------------------------------------ the HTTP/2 responder */

atomic_size_t h2cl_resp_total;

/* N (LEN bytes) is LIT, in any case. Exact bytes first: a name from an HTTP/2 peer is
 * lower-case already (nghttp2 refuses others), and memcmp is a few instructions where
 * str_ieq folds each byte of both. */
#define IS(n, len, lit) \
	(memcmp((n), lit, sizeof(lit) - 1) == 0 || str_ieq((n), (len), lit, sizeof(lit) - 1))

/* By length first, then the first letter: asked for every field of every head (request and
 * response), it answers most with a switch and one compare. */
bool h2cl_connection_field(const char *n, size_t len)
{
	if (len == 0)
		return false;
	char c = (char)(n[0] | 0x20);       /* lower-case for a letter; a non-letter matches none */
	switch (len) {
	case 2:
		return c == 't' && IS(n, len, "te");
	case 7:
		return (c == 'u' && IS(n, len, "upgrade")) || (c == 't' && IS(n, len, "trailer"));
	case 10:
		return (c == 'c' && IS(n, len, "connection")) || (c == 'k' && IS(n, len, "keep-alive"));
	case 14:
		return (c == 'c' && IS(n, len, "content-length")) ||
		       (c == 'h' && IS(n, len, "http2-settings"));
	case 16:
		return c == 'p' && IS(n, len, "proxy-connection");
	case 17:
		return c == 't' && IS(n, len, "transfer-encoding");
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

static void nv_reserve(struct h2_session *s, size_t n, size_t bytes)
{
	if (n > s->nvcap) {
		s->nvcap = n + 16;
		s->nv = xrealloc(s->nv, s->nvcap * sizeof(*s->nv));
	}
	if (bytes > s->namescap) {
		s->namescap = bytes + 256;
		s->names = xrealloc(s->names, s->namescap);
	}
}

static void nv_set(nghttp2_nv *nv, const char *name, size_t nlen, const char *value, size_t vlen,
                   uint8_t flags)
{
	nv->name = (uint8_t *)(uintptr_t)name;
	nv->namelen = nlen;
	nv->value = (uint8_t *)(uintptr_t)value;
	nv->valuelen = vlen;
	nv->flags = flags;
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

/* A never-indexed literal still names its field by index when the name is in the table
 * (RFC 7541 §6.2.3): so the connection's first X-Request-Id is indexed, once, and every later
 * one is sent as that index and a literal value, without its name Huffman-coded again (~420
 * instructions a response). One entry is no crowd; the name is indexed again every
 * REQID_REINDEX responses, as the entry may have been evicted meanwhile. */
#define REQID_REINDEX 256
static uint8_t unique_flags(struct h2_session *s, uint8_t flags)
{
	if (s->reqids++ % REQID_REINDEX == 0)
		return flags;
	return flags | NGHTTP2_NV_FLAG_NO_INDEX;
}

static bool sent_field(const struct http_hdr *f)
{
	return !f->hop && f->nlen > 0 && f->name[0] != ':' &&
	       !h2cl_connection_field(f->name, f->nlen);
}

/* Fields as HTTP/2 sends them: lower-case names, no connection-specific field (RFC 9113
 * §8.2.2), no pseudo-header from a peer. Fills s->nv from AT (FLAGS on each entry); the names,
 * lower-cased, and the values are copied to DST from *OFF. Returns the count. */
static size_t nv_fields(struct h2_session *s, size_t at, char *dst, size_t *off,
                        const struct http_hdr *h, int n, uint8_t flags)
{
	size_t k = at, o = *off;
	for (int i = 0; i < n; i++) {
		const struct http_hdr *f = &h[i];
		if (!sent_field(f))
			continue;
		char *name = dst + o, *value = name + f->nlen;
		ascii_lower_copy(name, f->name, f->nlen);
		memcpy(value, f->value, f->vlen);
		o += (size_t)f->nlen + f->vlen;
		nv_set(&s->nv[k], name, f->nlen, value, f->vlen,
		       unique_value(name, f->nlen) ? unique_flags(s, flags) : flags);
		k++;
	}
	*off = o;
	return k - at;
}

/* What a head's fields and values take at most (skipped fields counted too). */
static size_t fields_bytes(const struct http_hdr *h, int n)
{
	size_t t = 0;
	for (int i = 0; i < n; i++)
		t += (size_t)h[i].nlen + h[i].vlen;
	return t;
}

#define STATUS_CL_BYTES (3 + 20)        /* :status and a content-length value */
#define NO_COPY (NGHTTP2_NV_FLAG_NO_COPY_NAME | NGHTTP2_NV_FLAG_NO_COPY_VALUE)

/* The head's header block in s->nv: :status, fields, content-length, its bytes in DST (at
 * least fields_bytes + STATUS_CL_BYTES), FLAGS on each entry. Returns the count. */
static size_t head_block(struct h2_session *s, const struct resp_head *h, char *dst,
                         uint8_t flags, bool length)
{
	int st = h->status >= 100 && h->status <= 999 ? h->status : 502;
	dst[0] = (char)('0' + st / 100);
	dst[1] = (char)('0' + st / 10 % 10);
	dst[2] = (char)('0' + st % 10);
	nv_set(&s->nv[0], ":status", 7, dst, 3, flags);
	size_t off = 3;
	size_t n = 1 + nv_fields(s, 1, dst, &off, h->hdrs, h->nhdrs, flags);
	if (length) {
		char cl[24];
		size_t len = fmt_length(cl, h->content_length);
		memcpy(dst + off, cl, len);
		nv_set(&s->nv[n++], "content-length", 14, dst + off, len, flags);
	}
	return n;
}

/* The data provider of every response: nghttp2 pulls DATA from the stream's pending response
 * as the client's window allows; trailers go after the last of it. */
static ssize_t data_read_cb(nghttp2_session *ng, int32_t id, uint8_t *buf, size_t length,
                            uint32_t *flags, nghttp2_data_source *src, void *arg)
{
	struct h2_client_stream *st = src->ptr;
	MAGIC_CHECK(st, H2CL_STREAM_MAGIC);
	size_t have = evbuffer_get_length(st->resp);
	size_t n = have < length ? have : length;
	/* a cut response: what was relayed went out (the head before it); now nghttp2 resets
	 * the stream, INTERNAL_ERROR, after the frames queued before it (SPEC §9) */
	if (st->cut && have == 0)
		return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;
	if (n == 0 && !st->resp_eof) {
		st->deferred = true;
		return NGHTTP2_ERR_DEFERRED;
	}
	*flags |= NGHTTP2_DATA_FLAG_NO_COPY;
	if (st->resp_eof && n == have) {
		*flags |= NGHTTP2_DATA_FLAG_EOF;
		if (st->ntrailers > 0) {
			*flags |= NGHTTP2_DATA_FLAG_NO_END_STREAM;
			nghttp2_submit_trailer(ng, id, st->trailers, st->ntrailers);
		}
	}
	return (ssize_t)n;
}

static void rsp_informational(void *arg, const struct resp_head *h)
{
	struct h2_client_stream *st = arg;
	MAGIC_CHECK(st, H2CL_STREAM_MAGIC);
	struct h2_session *s = st->s;
	if (s->state == H2CL_CLOSED || st->head_sent || h->status == 101)
		return;
	/* rare, and more than one may wait: nghttp2 copies these (from the session's scratch) */
	size_t bytes = fields_bytes(h->hdrs, h->nhdrs) + STATUS_CL_BYTES;
	nv_reserve(s, (size_t)h->nhdrs + 2, bytes);
	size_t n = head_block(s, h, s->names, NGHTTP2_NV_FLAG_NONE, false);
	nghttp2_submit_headers(s->ng, NGHTTP2_FLAG_NONE, st->id, NULL, s->nv, n, NULL);
	h2cl_kick(s);
}


static void rsp_head(void *arg, const struct resp_head *h)
{
	struct h2_client_stream *st = arg;
	MAGIC_CHECK(st, H2CL_STREAM_MAGIC);
	struct h2_session *s = st->s;
	if (s->state == H2CL_CLOSED || st->head_sent)
		return;
	st->head_sent = true;
	st->bodyless = st->head.method_head || h->status == 204 || h->status == 304 || h->end_stream;
	/* a head that ends the stream (gRPC Trailers-Only) is the whole response: resp_eof
	 * already, so that end() adds nothing to it; no length, no data provider */
	if (h->end_stream)
		st->resp_eof = true;
	/* The head's bytes are copied once, into a block the stream holds until it is destroyed:
	 * nghttp2 then takes them as they are (NO_COPY: no second copy, no second
	 * lower-casing, ~1,200 instructions a response) and reads them when it packs the
	 * HEADERS frame, from the session's send event, after the exchange (and the upstream
	 * head the fields point into) may be gone. A failed allocation falls back to nghttp2's
	 * copy from the scratch. */
	size_t bytes = fields_bytes(h->hdrs, h->nhdrs) + STATUS_CL_BYTES;
	nv_reserve(s, (size_t)h->nhdrs + 2, 0);
	st->head_blk = loop_blk_alloc(s->loop, bytes);
	uint8_t flags = NO_COPY;
	char *dst = st->head_blk;
	if (!dst) {
		nv_reserve(s, 0, bytes);
		dst = s->names;
		flags = NGHTTP2_NV_FLAG_NONE;
	}
	size_t n = head_block(s, h, dst, flags, !h->end_stream &&
	                      h->status >= 200 && h->status != 204 && h->content_length >= 0);
	nghttp2_data_provider prd = { .source.ptr = st, .read_callback = data_read_cb };
	nghttp2_submit_response(s->ng, st->id, s->nv, n, st->bodyless ? NULL : &prd);
	h2cl_kick(s);
}

static void rsp_body(void *arg, struct evbuffer *data)
{
	struct h2_client_stream *st = arg;
	MAGIC_CHECK(st, H2CL_STREAM_MAGIC);
	struct h2_session *s = st->s;
	size_t n = evbuffer_get_length(data);
	if (s->state == H2CL_CLOSED || st->bodyless || st->cut || n == 0) {
		evbuffer_drain(data, n);
		return;
	}
	if (s->resp_pending == 0)
		s->last_progress_us = clock_now_us();
	evbuffer_add_buffer(st->resp, data);
	h2cl_resp_count(s, n, 0);
	if (evbuffer_get_length(st->resp) > RESP_LOW)
		st->was_high = true;
	if (st->deferred) {
		st->deferred = false;
		nghttp2_session_resume_data(s->ng, st->id);
	}
	h2cl_kick(s);
}

static void rsp_trailers(void *arg, const struct http_hdr *t, int n)
{
	struct h2_client_stream *st = arg;
	MAGIC_CHECK(st, H2CL_STREAM_MAGIC);
	if (st->s->state == H2CL_CLOSED || st->trailers || st->bodyless || n <= 0)
		return;     /* bodyless: no DATA will carry them out (a head that ended the stream) */
	/* kept until the stream is destroyed: data_read_cb submits them after the last DATA,
	 * without nghttp2's copy (NO_COPY) */
	size_t bytes = fields_bytes(t, n);
	/* one block for the list and its bytes (every gRPC response has trailers) */
	nghttp2_nv *nv = loop_blk_alloc(st->s->loop, (size_t)n * sizeof(*nv) + bytes + 1);
	if (!nv)
		return;     /* out of memory: the response ends without them (as with no trailers) */
	st->trailers = nv;
	char *p = (char *)(nv + n);
	for (int i = 0; i < n; i++) {
		const struct http_hdr *f = &t[i];
		if (f->nlen == 0 || f->name[0] == ':' || h2cl_connection_field(f->name, f->nlen))
			continue;
		char *name = p;
		ascii_lower_copy(name, f->name, f->nlen);
		memcpy(name + f->nlen, f->value, f->vlen);
		nv_set(&nv[st->ntrailers++], name, f->nlen, name + f->nlen, f->vlen, NO_COPY);
		p += f->nlen + f->vlen;
	}
}

/* A response that closes (SPEC §5) resets its stream after it if the client is still sending
 * (RFC 9113 §8.1); nrst_after counts the streams waiting for that */
static void reset_after(struct h2_session *s, struct h2_client_stream *st)
{
	if (st->req_end || st->rst_after)
		return;
	st->rst_after = true;
	s->nrst_after++;
}

void h2cl_rsp_end(void *arg, bool complete, bool close)
{
	struct h2_client_stream *st = arg;
	MAGIC_CHECK(st, H2CL_STREAM_MAGIC);
	struct h2_session *s = st->s;
	st->ex_done = true;
	if (s->state == H2CL_CLOSED)
		return;
	if (st->head_sent && st->resp_eof) {
		/* the head ended the stream: nothing to cut or resume; a client still sending is
		 * reset after it (NO_ERROR) as for any response that closes */
		if (close)
			reset_after(s, st);
		h2cl_kick(s);
		return;
	}
	if (!st->head_sent) {
		/* nothing was relayed: the stream is reset at once */
		st->cut = true;
		h2cl_resp_count(s, 0, evbuffer_get_length(st->resp));
		evbuffer_drain(st->resp, evbuffer_get_length(st->resp));
		nghttp2_submit_rst_stream(s->ng, NGHTTP2_FLAG_NONE, st->id, NGHTTP2_INTERNAL_ERROR);
	} else if (!complete && st->bodyless) {
		/* its head went with END_STREAM: that is all of it there was to relay */
		reset_after(s, st);
	} else if (!complete) {
		/* never END_STREAM on a cut response: the client must not take it as complete. A
		 * RST_STREAM submitted now would make nghttp2 drop the head and DATA still queued;
		 * the data source sends what was relayed, then has the stream reset */
		st->cut = true;
		if (st->deferred) {
			st->deferred = false;
			nghttp2_session_resume_data(s->ng, st->id);
		}
	} else {
		st->resp_eof = true;
		/* SPEC §9: where §5 closes the connection, the stream is reset after the response
		 * instead, if the client is still sending (RFC 9113 §8.1) */
		if (close)
			reset_after(s, st);
		if (st->deferred) {
			st->deferred = false;
			nghttp2_session_resume_data(s->ng, st->id);
		}
	}
	h2cl_kick(s);
}

/* The per-connection budget (SPEC §9: memory per connection bounded by the limits): a full
 * connection stops every exchange that asks, and the session's flush wakes them */
static size_t rsp_queued(void *arg)
{
	struct h2_client_stream *st = arg;
	MAGIC_CHECK(st, H2CL_STREAM_MAGIC);
	if (h2cl_resp_full(st->s)) {
		st->budget_wait = true;
		return RESPONDER_FULL;
	}
	return evbuffer_get_length(st->resp);
}

static void rsp_want_body(void *arg)
{
	struct h2_client_stream *st = arg;
	MAGIC_CHECK(st, H2CL_STREAM_MAGIC);
	h2cl_kick(st->s);
}

static void rsp_tunnel(void *arg, const struct resp_head *h, struct stream *upstream)
{
	/* not reached: no HTTP/2 request is an Upgrade (req->upgrade is false) */
	struct h2_client_stream *st = arg;
	MAGIC_CHECK(st, H2CL_STREAM_MAGIC);
	stream_free(upstream);
	st->ex_done = true;
	if (st->s->state != H2CL_CLOSED)
		nghttp2_submit_rst_stream(st->s->ng, NGHTTP2_FLAG_NONE, st->id, NGHTTP2_INTERNAL_ERROR);
	h2cl_kick(st->s);
}

const struct responder h2_responder = {
	.informational = rsp_informational,
	.head = rsp_head,
	.body = rsp_body,
	.trailers = rsp_trailers,
	.end = h2cl_rsp_end,
	.queued = rsp_queued,
	.want_body = rsp_want_body,
	.tunnel = rsp_tunnel,
};

