/*
 * h2_stream: the streams of the HTTP/2 transport (see h2_conn.h; shared parts in
 * h2_conn_impl.h): a request opened on a connection h2_conn.c picked, its body and trailers
 * handed to nghttp2 as it asks for them, and the frames nghttp2 parsed turned into the
 * stream's head, DATA (appended to the opener's body_out), trailers and one end.
 *
 * A stream's HEADERS count as sent only once the frame was serialized and a byte of it left
 * the process (hdr_mark against what the kernel took of the connection's output,
 * stream_written: never the output buffer's drains, which packing fakes): a stream closed
 * before that was not processed and ends as OUT_CONNECT_FAILURE. Every stream ends exactly once,
 * through h2u_end (on_close), unless its owner cancelled it first; either way it is taken off
 * its connection then and freed once the callback stack unwound.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/queue.h>

#include <event2/buffer.h>

#include "upstream/h2_conn.h"
#include "upstream/h2_conn_impl.h"
#include "base/loop.h"
#include "base/util.h"
#include "http/h2_fields.h"
#include "net/stream.h"

/* The one writer of the state (DESIGN rule 2). */
DEFINE_STATE_SETTER(h2u_set_state, h2_upstream_stream, h2u_stream_state, US_CLOSED)

bool h2u_sent(const struct h2_upstream_stream *s)
{
	return s->hdr_queued && s->c && s->c->strm && stream_written(s->c->strm) > s->hdr_mark;
}

/* nghttp2 keeps each stream's owner (given at submit, cleared when the stream is detached):
 * a lookup in its stream map, not a walk of ours */
static struct h2_upstream_stream *find(struct h2_conn *c, int32_t id)
{
	if (c->last && c->last->id == id)
		return c->last;
	struct h2_upstream_stream *s = nghttp2_session_get_stream_user_data(c->ng, id);
	if (s)
		c->last = s;
	return s;
}

static void h2u_free_cb(void *p)
{
	struct h2_upstream_stream *s = p;
	s->magic = 0;
	free(s->nv);
	free(s->tnv);
	free(s->tmem);
	free(s);
}

/* Keep a copy of the request trailers T[N] (names lowercase, pseudo-fields skipped). */
static void keep_trailers(struct h2_upstream_stream *s, const struct http_hdr *t, int n)
{
	if (s->tnv || n <= 0)
		return;
	size_t bytes = 0;
	for (int i = 0; i < n; i++)
		bytes += t[i].nlen + t[i].vlen;
	char *p = s->tmem = xmalloc(bytes + 1);
	s->tnv = xcalloc((size_t)n, sizeof(*s->tnv));
	for (int i = 0; i < n; i++) {
		if (t[i].nlen == 0 || t[i].name[0] == ':')
			continue;
		nghttp2_nv *v = &s->tnv[s->ntnv++];
		v->name = (uint8_t *)p;
		ascii_lower_copy(p, t[i].name, t[i].nlen);
		p += t[i].nlen;
		v->namelen = t[i].nlen;
		memcpy(p, t[i].value, t[i].vlen);
		v->value = (uint8_t *)p;
		v->valuelen = t[i].vlen;
		p += t[i].vlen;
		v->flags = NGHTTP2_NV_FLAG_NONE;
	}
}

/* The request body is all out: END_STREAM on the last DATA, or the trailers carry it. */
static void body_eof(struct h2_conn *c, struct h2_upstream_stream *s, uint32_t *flags)
{
	*flags |= NGHTTP2_DATA_FLAG_EOF;
	if (s && s->ntnv > 0 &&
	    nghttp2_submit_trailer(c->ng, s->id, s->tnv, s->ntnv) == 0)
		*flags |= NGHTTP2_DATA_FLAG_NO_END_STREAM;
}

/* Take S off its connection: no callback reaches its owner after this. */
static void h2u_detach(struct h2_upstream_stream *s)
{
	struct h2_conn *c = s->c;
	h2u_set_state(s, US_CLOSED);
	/* fails only for a stream nghttp2 no longer knows (its HEADERS dropped): nothing of
	 * nghttp2's points here then */
	nghttp2_session_set_stream_user_data(c->ng, s->id, NULL);
	if (s->pending)
		loop_buf_put(c->loop, s->pending);
	s->pending = NULL;
	s->body = NULL;
	s->c = NULL;
	loop_defer_free(c->loop, h2u_free_cb, s);
	h2conn_stream_removed(c, s);
}

/* Report the end and forget S. The owner may open or cancel streams from inside on_close. */
void h2u_end(struct h2_upstream_stream *s, enum outcome out, const char *detail)
{
	struct transport_cbs cbs = s->cbs;
	void *arg = s->arg;
	bool bad = s->bad_head && out == OUT_RESET;
	h2u_detach(s);
	cbs.on_close(arg, out, bad, detail);
}

/* ---------------------------------------------------------------- frames out */

static int on_frame_send_cb(nghttp2_session *ng, const nghttp2_frame *f, void *ud)
{
	struct h2_conn *c = ud;
	MAGIC_CHECK(c, H2U_CONN_MAGIC);
	if (f->hd.type != NGHTTP2_HEADERS)
		return 0;
	struct h2_upstream_stream *s = find(c, f->hd.stream_id);
	if (s && !s->hdr_queued) {
		/* mem_send reports a frame before returning its bytes: they start here */
		s->hdr_queued = true;
		s->hdr_mark = c->queued;
		free(s->nv);        /* it stays on this connection now */
		s->nv = NULL;
	}
	return 0;
}

static int on_frame_not_send_cb(nghttp2_session *ng, const nghttp2_frame *f, int err, void *ud)
{
	struct h2_conn *c = ud;
	MAGIC_CHECK(c, H2U_CONN_MAGIC);
	if (f->hd.type != NGHTTP2_HEADERS)
		return 0;
	struct h2_upstream_stream *s = find(c, f->hd.stream_id);
	if (s && !s->hdr_queued)
		h2u_end(s, OUT_CONNECT_FAILURE, nghttp2_strerror(err));
	return 0;
}

/* ------------------------------------------------------------ RFC 9113 §8: malformed */

/* nghttp2 is told to leave HTTP messaging to us (h2_conn.c): each field is checked as it
 * comes, each head and the END_STREAM when their frame is in, the DATA against the
 * content-length as it comes; the rules and their outcome are nghttp2's (lib/nghttp2_http.c):
 * the stream is reset with PROTOCOL_ERROR, and the attempt ends as a reset. */
enum {
	RC_STATUS = 1,          /* this block: :status came */
	RC_REGULAR = 2,         /* this block: a regular field came, no pseudo-header after it */
	RC_CL = 4,              /* this block: a content-length came */
	RC_BLOCK = RC_STATUS | RC_REGULAR | RC_CL,
	RC_HEAD_REQ = 8,        /* the request was a HEAD: no response body */
	RC_BAD = 16,            /* malformed: reset, the rest of it ignored */
};

/* Reset S's stream: it is malformed. It ends once its frame is in (malformed_end). */
static void malformed(struct h2_conn *c, struct h2_upstream_stream *s)
{
	s->rchk |= RC_BAD;
	nghttp2_submit_rst_stream(c->ng, NGHTTP2_FLAG_NONE, s->id, NGHTTP2_PROTOCOL_ERROR);
}

static void malformed_end(struct h2_upstream_stream *s)
{
	h2u_end(s, OUT_RESET, "malformed response (RFC 9113 §8.1-8.3), stream reset");
}

/* A field of a response head, or of its trailers (once the final head is in): 1 to keep it,
 * 0 to drop it (:status, noted; a 204's content-length: 0, as nghttp2 dropped it), -1 for a
 * malformed one. */
static int check_field(struct h2_upstream_stream *s, const char *n, size_t nl, const char *v,
                       size_t vl)
{
	bool trailer = s->state == US_BODY;
	if (nl > 0 && n[0] == ':') {
		if (trailer || (s->rchk & (RC_STATUS | RC_REGULAR)) || nl != 7 ||
		    memcmp(n, ":status", 7) != 0 || vl != 3)
			return -1;
		int st = 0;
		for (size_t i = 0; i < 3; i++) {
			if (v[i] < '0' || v[i] > '9')
				return -1;
			st = st * 10 + (v[i] - '0');
		}
		if (st == 101)
			return -1;      /* no Upgrade in HTTP/2 (RFC 9113 §8.6) */
		s->status = st;
		s->rchk |= RC_STATUS;
		return 0;
	}
	s->rchk |= RC_REGULAR;
	switch (h2f_regular(n, nl, v, vl)) {
	case H2F_BAD:
		return -1;
	case H2F_CONTENT_LENGTH: {
		if (s->rchk & RC_CL)
			return -1;
		s->rchk |= RC_CL;
		int64_t cl = h2f_parse_length(v, vl);
		if (trailer)    /* none in the head: it must say what came */
			return s->resp_cl == -1 && cl == (int64_t)s->resp_bytes ? 1 : -1;
		if (s->status == 204)
			return vl == 1 && v[0] == '0' ? 0 : -1;
		if (s->status / 100 == 1 || cl < 0)
			return -1;
		s->resp_cl = cl;
		return 1;
	}
	default:
		return 1;
	}
}

/* A head's frame is in (ES: it ends the stream): whether it is complete and may end so. */
static bool head_ok(struct h2_upstream_stream *s, bool es)
{
	if (!(s->rchk & RC_STATUS))
		return false;
	if (s->status / 100 == 1)
		return !es;     /* an informational head is followed by the final one */
	if ((s->rchk & RC_HEAD_REQ) || s->status == 204 || s->status == 304)
		s->resp_cl = 0;
	return !es || s->resp_cl <= 0;
}

/* The stream ended (END_STREAM): the DATA must be as long as the content-length said. */
static bool end_ok(const struct h2_upstream_stream *s)
{
	return s->resp_cl < 0 || s->resp_bytes == (uint64_t)s->resp_cl;
}

/* ---------------------------------------------------------------- frames in, body out */

static int on_begin_headers_cb(nghttp2_session *ng, const nghttp2_frame *f, void *ud)
{
	struct h2_conn *c = ud;
	MAGIC_CHECK(c, H2U_CONN_MAGIC);
	c->hused = 0;
	c->nhf = 0;
	struct h2_upstream_stream *s = find(c, f->hd.stream_id);
	if (s) {
		s->status = 0;
		s->rchk &= (uint8_t)~RC_BLOCK;
		if (s->state == US_OPEN)
			s->resp_cl = -1;
	}
	return 0;
}

static int on_header_cb(nghttp2_session *ng, const nghttp2_frame *f, const uint8_t *name,
                        size_t nlen, const uint8_t *value, size_t vlen, uint8_t flags, void *ud)
{
	struct h2_conn *c = ud;
	MAGIC_CHECK(c, H2U_CONN_MAGIC);
	struct h2_upstream_stream *s = find(c, f->hd.stream_id);
	if (!s || (s->rchk & RC_BAD))
		return 0;
	int keep = check_field(s, (const char *)name, nlen, (const char *)value, vlen);
	if (keep <= 0) {
		if (keep < 0)
			malformed(c, s);
		return 0;
	}
	if (c->hused + nlen + vlen + 32 > H2_HEAD_MAX || c->nhf >= H2_MAX_FIELDS) {
		s->bad_head = true;
		return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;   /* resets the stream */
	}
	if (c->hused + nlen + vlen > c->hcap) {
		size_t cap = c->hcap ? c->hcap * 2 : 1024;
		while (cap < c->hused + nlen + vlen)
			cap *= 2;
		c->hb = xrealloc(c->hb, cap);
		c->hcap = cap;
	}
	struct hfield *h = &c->hf[c->nhf++];
	h->noff = (uint32_t)c->hused;
	h->nlen = (uint32_t)nlen;
	memcpy(c->hb + c->hused, name, nlen);
	c->hused += nlen;
	h->voff = (uint32_t)c->hused;
	h->vlen = (uint32_t)vlen;
	memcpy(c->hb + c->hused, value, vlen);
	c->hused += vlen;
	return 0;
}

/* The complete header block as fields in c->hdrs (content-length marked as framing: every
 * writer above computes its own; HTTP/2 has no other hop-by-hop field). */
static void block_fields(struct h2_conn *c, int64_t *clen)
{
	*clen = -1;
	for (int i = 0; i < c->nhf; i++) {
		struct http_hdr *h = &c->hdrs[i];
		h->name = c->hb + c->hf[i].noff;
		h->nlen = c->hf[i].nlen;
		h->value = c->hb + c->hf[i].voff;
		h->vlen = c->hf[i].vlen;
		h->hop = false;
		/* check_field refused any name with a capital letter (RFC 9113 §8.2.1) */
		if (h->nlen == 14 && memcmp(h->name, "content-length", 14) == 0) {
			h->hop = true;
			/* check_field took its digits, and on_data_chunk_cb holds the DATA to it */
			*clen = h2f_parse_length(h->value, h->vlen);
		}
	}
}

/* The fields (c->hdrs) are valid for the callback only: the next block reuses them. */
static void deliver_head(struct h2_upstream_stream *s, bool end_stream)
{
	struct h2_conn *c = s->c;
	struct http_head h;
	memset(&h, 0, sizeof(h));
	h.status = s->status;
	h.reason = "";
	h.version = 11;
	h.keep_alive = true;
	h.hdrs = c->hdrs;
	h.nhdrs = c->nhf;
	block_fields(c, &h.content_length);
	if (s->status >= 200) {
		h2u_set_state(s, US_BODY);
		if (end_stream && h.content_length < 0)
			h.content_length = 0;
		h.end_stream = end_stream;
	}
	s->cbs.on_head(s->arg, &h);
}

static void deliver_trailers(struct h2_upstream_stream *s)
{
	struct h2_conn *c = s->c;
	int64_t clen;
	block_fields(c, &clen);
	s->cbs.on_trailers(s->arg, c->hdrs, c->nhf);
}

static int on_frame_recv_cb(nghttp2_session *ng, const nghttp2_frame *f, void *ud)
{
	struct h2_conn *c = ud;
	MAGIC_CHECK(c, H2U_CONN_MAGIC);
	switch (f->hd.type) {
	case NGHTTP2_SETTINGS:
	case NGHTTP2_GOAWAY:
		h2conn_peer_frame(c, f);
		return 0;
	case NGHTTP2_HEADERS:
	case NGHTTP2_DATA:
		break;
	default:
		return 0;
	}
	struct h2_upstream_stream *s = find(c, f->hd.stream_id);
	if (!s)
		return 0;
	bool es = (f->hd.flags & NGHTTP2_FLAG_END_STREAM) != 0;
	if (!(s->rchk & RC_BAD) && f->hd.type == NGHTTP2_HEADERS) {
		if (s->state == US_OPEN ? !head_ok(s, es) : !es || !end_ok(s))
			malformed(c, s);        /* trailers end the stream (RFC 9113 §8.1) */
	} else if (!(s->rchk & RC_BAD) && es && !end_ok(s)) {
		malformed(c, s);
	}
	if (s->rchk & RC_BAD) {
		malformed_end(s);
		return 0;
	}
	if (f->hd.type == NGHTTP2_HEADERS) {
		if (s->state == US_OPEN) {
			if (s->status < 100) {
				s->bad_head = true;
				return 0;   /* not a status (RFC 9110 §15): a bad response */
			}
			deliver_head(s, es);
		} else {
			deliver_trailers(s);
		}
		/* the owner may have cancelled it meanwhile */
		if (s->state == US_CLOSED || s->c != c)
			return 0;
	}
	if (es && s->state == US_BODY)
		h2u_end(s, OUT_NONE, NULL);     /* complete: a later RST_STREAM changes nothing */
	return 0;
}

static int on_data_chunk_cb(nghttp2_session *ng, uint8_t flags, int32_t id, const uint8_t *data,
                            size_t len, void *ud)
{
	struct h2_conn *c = ud;
	MAGIC_CHECK(c, H2U_CONN_MAGIC);
	struct h2_upstream_stream *s = find(c, id);
	if (s && !(s->rchk & RC_BAD)) {
		s->resp_bytes += len;
		/* none before the final head, none beyond its content-length */
		if (s->state != US_BODY ||
		    (s->resp_cl >= 0 && s->resp_bytes > (uint64_t)s->resp_cl))
			malformed(c, s);
	}
	if (!s || s->state != US_BODY || (s->rchk & RC_BAD)) {
		nghttp2_session_consume(ng, id, len);   /* nobody wants it: keep the window open */
		return 0;
	}
	evbuffer_add(s->body_out, data, len);
	s->cbs.on_data(s->arg);
	return 0;
}

static const char *rst_detail(uint32_t code)
{
	switch (code) {
	case NGHTTP2_NO_ERROR: return "stream closed (NO_ERROR) before the response ended";
	case NGHTTP2_PROTOCOL_ERROR: return "RST_STREAM PROTOCOL_ERROR";
	case NGHTTP2_INTERNAL_ERROR: return "RST_STREAM INTERNAL_ERROR";
	case NGHTTP2_FLOW_CONTROL_ERROR: return "RST_STREAM FLOW_CONTROL_ERROR";
	case NGHTTP2_STREAM_CLOSED: return "RST_STREAM STREAM_CLOSED";
	case NGHTTP2_CANCEL: return "RST_STREAM CANCEL";
	case NGHTTP2_ENHANCE_YOUR_CALM: return "RST_STREAM ENHANCE_YOUR_CALM";
	default: return "RST_STREAM";
	}
}

/* Never a fatal error from here (the rule): the session carries on. */
static int on_stream_close_cb(nghttp2_session *ng, int32_t id, uint32_t code, void *ud)
{
	struct h2_conn *c = ud;
	MAGIC_CHECK(c, H2U_CONN_MAGIC);
	struct h2_upstream_stream *s = find(c, id);
	if (!s)
		return 0;
	if (s->state == US_BODY)
		h2u_end(s, OUT_RESET, "upstream stream reset after the response head");
	else if (code == NGHTTP2_REFUSED_STREAM)
		h2u_end(s, OUT_CONNECT_FAILURE, "RST_STREAM REFUSED_STREAM");
	else if (c->goaway_seen && id > c->goaway_last)
		h2u_end(s, OUT_CONNECT_FAILURE, "above the GOAWAY last-stream-id");
	else if (!h2u_sent(s))
		h2u_end(s, OUT_CONNECT_FAILURE, "HEADERS never sent");
	else if (s->bad_head)
		h2u_end(s, OUT_RESET, "invalid response header block");
	else
		h2u_end(s, OUT_RESET, rst_detail(code));
	return 0;
}

/* Request body: the buffered body from its offset, then streamed bytes as they come. */
static ssize_t body_read_cb(nghttp2_session *ng, int32_t id, uint8_t *buf, size_t len,
                            uint32_t *flags, nghttp2_data_source *src, void *ud)
{
	struct h2_conn *c = ud;
	MAGIC_CHECK(c, H2U_CONN_MAGIC);
	struct h2_upstream_stream *s = find(c, id);
	if (!s) {
		body_eof(c, NULL, flags);
		return 0;
	}
	size_t n = 0;
	if (s->body) {
		size_t have = evbuffer_get_length(s->body);
		if (s->body_off < have) {
			struct evbuffer_ptr at;
			evbuffer_ptr_set(s->body, &at, s->body_off, EVBUFFER_PTR_SET);
			ev_ssize_t got = evbuffer_copyout_from(s->body, &at, buf, len);
			n = got > 0 ? (size_t)got : 0;
			s->body_off += n;
		}
		if (s->body_off < have)
			return (ssize_t)n;
	}
	if (n < len && s->pending && evbuffer_get_length(s->pending) > 0) {
		int got = evbuffer_remove(s->pending, buf + n, len - n);
		n += got > 0 ? (size_t)got : 0;
		if (evbuffer_get_length(s->pending) == 0 && !s->body_ended)
			s->drain_due = true;
	}
	if (!s->streaming || s->body_ended) {
		if (!s->pending || evbuffer_get_length(s->pending) == 0)
			body_eof(c, s, flags);
		return (ssize_t)n;
	}
	if (n == 0) {
		s->data_deferred = true;
		s->drain_due = true;
		return NGHTTP2_ERR_DEFERRED;
	}
	return (ssize_t)n;
}

void h2u_set_callbacks(nghttp2_session_callbacks *cb)
{
	nghttp2_session_callbacks_set_on_frame_send_callback(cb, on_frame_send_cb);
	nghttp2_session_callbacks_set_on_frame_not_send_callback(cb, on_frame_not_send_cb);
	nghttp2_session_callbacks_set_on_frame_recv_callback(cb, on_frame_recv_cb);
	nghttp2_session_callbacks_set_on_begin_headers_callback(cb, on_begin_headers_cb);
	nghttp2_session_callbacks_set_on_header_callback(cb, on_header_cb);
	nghttp2_session_callbacks_set_on_data_chunk_recv_callback(cb, on_data_chunk_cb);
	nghttp2_session_callbacks_set_on_stream_close_callback(cb, on_stream_close_cb);
}

/* ---------------------------------------------------------------- opening and sending */

#define NV_LOCAL 64                     /* a longer field list is copied by nghttp2 */

/* The per-request fields come flagged never-indexed: their values may differ in every
 * request, and entering the connection's HPACK table each one would evict the fields that
 * repeat. Two exceptions go indexable.
 *
 * The first x-request-id of a connection: one entry, whose name every later never-indexed
 * x-request-id then names by index instead of as a Huffman-coded literal (~420 instructions
 * of nghttp2's a request).
 *
 * The time-left fields: an HTTP request without a deadline from the client repeats them (the
 * per-try timeout: send_attempt() counts the time spent before it in whole milliseconds; a
 * gRPC call is told its remaining time, which rarely repeats): a value equal to the previous
 * one on this connection goes indexable — it is then entered once and sent as one byte from
 * the table after that. */
static bool goes_indexed(struct h2_conn *c, const nghttp2_nv *e)
{
	int k;
	if (e->namelen != 12)
		return false;
	if (memcmp(e->name, "x-request-id", 12) == 0) {
		bool first = !c->rid_indexed;
		c->rid_indexed = true;
		return first;
	}
	if (memcmp(e->name, "x-timeout-ms", 12) == 0)
		k = 0;
	else if (memcmp(e->name, "grpc-timeout", 12) == 0)
		k = 1;
	else
		return false;
	bool same = e->valuelen == c->last_tmo_len[k] &&
	            memcmp(e->value, c->last_tmo[k], e->valuelen) == 0;
	if (!same && e->valuelen <= sizeof(c->last_tmo[k])) {
		memcpy(c->last_tmo[k], e->value, e->valuelen);
		c->last_tmo_len[k] = (uint8_t)e->valuelen;
	}
	return same;
}

static struct h2_upstream_stream *stream_of(struct transport *t)
{
	struct h2_upstream_stream *s = (struct h2_upstream_stream *)t;
	MAGIC_CHECK(s, H2U_STREAM_MAGIC);
	return s;
}

/* Queue S's HEADERS (NV[N]) and body on C: its stream id, or an nghttp2 error. */
static int32_t submit(struct h2_conn *c, struct h2_upstream_stream *s, const nghttp2_nv *nv,
                      size_t n)
{
	nghttp2_data_provider dp = { .source.ptr = s, .read_callback = body_read_cb };
	return nghttp2_submit_request(c->ng, NULL, nv, n, s->has_body ? &dp : NULL, s);
}

static struct transport *h2_upstream_open(struct loop *l, struct ep_state *ep,
                                          const struct transport_req *o,
                                          const struct transport_cbs *cbs, void *arg,
                                          const char **err)
{
	struct h2_conn *c = h2conn_pick(l, ep, o);
	if (!c || c->state == UC_DEAD) {
		*err = "cannot open an HTTP/2 connection";
		return NULL;    /* a new connection that failed at once */
	}
	size_t nb = o->nv_bytes && o->nvlen <= NV_LOCAL ? o->nv_bytes_len : 0;
	struct h2_upstream_stream *s = xmalloc(sizeof(*s) + nb);
	memset(s, 0, sizeof(*s));
	s->t.ops = &h2_transport;
	s->magic = H2U_STREAM_MAGIC;
	s->c = c;
	s->cbs = *cbs;
	s->arg = arg;
	s->body_out = o->body_out;
	s->ep = ep;
	s->body = o->body;
	s->streaming = o->streaming;
	s->resp_cl = -1;
	if (o->is_head)
		s->rchk |= RC_HEAD_REQ;
	if (o->streaming)
		s->pending = loop_buf_get(l);
	keep_trailers(s, o->trailers, o->ntrailers);
	s->has_body = o->streaming || (o->body && evbuffer_get_length(o->body) > 0) ||
	              s->ntnv > 0;
	/* the list itself is copied by nghttp2 whatever the flags: it is built on the stack */
	nghttp2_nv local[NV_LOCAL];
	const nghttp2_nv *nv = o->nv;
	if (nb > 0) {
		memcpy(s->fields, o->nv_bytes, nb);
		/* every value lies in nv_bytes (transport_req), and every name but the literals:
		 * each moves by as much */
		const uint8_t *lo = (const uint8_t *)o->nv_bytes;
		for (size_t i = 0; i < o->nvlen; i++) {
			const nghttp2_nv *e = &o->nv[i];
			nghttp2_nv *d = &local[i];
			uintptr_t at = (uintptr_t)e->name - (uintptr_t)lo;
			d->name = at < nb ? (uint8_t *)s->fields + at : e->name;
			d->value = (uint8_t *)s->fields + (e->value - lo);
			d->namelen = e->namelen;
			d->valuelen = e->valuelen;
			d->flags = e->flags | NGHTTP2_NV_FLAG_NO_COPY_NAME | NGHTTP2_NV_FLAG_NO_COPY_VALUE;
			if ((e->flags & NGHTTP2_NV_FLAG_NO_INDEX) && goes_indexed(c, e))
				d->flags &= (uint8_t)~NGHTTP2_NV_FLAG_NO_INDEX;
		}
		nv = local;
		/* it may wait beyond a limit the server has not told yet: keep the list (pointing
		 * into s->fields) to move it */
		if (!c->settings_seen || (uint32_t)c->nstreams >= c->peer_max) {
			s->nv = xmalloc(o->nvlen * sizeof(*s->nv));
			memcpy(s->nv, local, o->nvlen * sizeof(*s->nv));
			s->nvlen = o->nvlen;
		}
	}
	int32_t id = submit(c, s, nv, o->nvlen);
	if (id < 0) {
		if (s->pending)
			loop_buf_put(l, s->pending);
		free(s->nv);
		free(s->tnv);
		free(s->tmem);
		free(s);
		if (c->nstreams == 0 && c->state != UC_DEAD)
			h2conn_fail(c, "cannot submit", true);
		*err = "cannot open an HTTP/2 connection";
		return NULL;
	}
	s->id = id;
	h2conn_stream_added(c, s);
	return &s->t;
}

bool h2u_move(struct h2_upstream_stream *s)
{
	struct h2_conn *c = s->c;
	if (!s->nv || s->hdr_queued)
		return false;
	struct transport_req o = { .tls = c->tls, .sni = c->sni, .verify = c->verify,
	                           .connect_timeout_us = c->connect_timeout_us };
	struct h2_conn *to = h2conn_pick(c->loop, s->ep, &o);
	if (to == c)
		return false;   /* every connection is full: it waits here */
	/* a RST_STREAM for a stream whose HEADERS is still queued cancels the HEADERS: nothing
	 * of it is serialized here, and nghttp2 forgets it */
	nghttp2_submit_rst_stream(c->ng, NGHTTP2_FLAG_NONE, s->id, NGHTTP2_CANCEL);
	if (!to || to->state == UC_DEAD) {
		h2u_end(s, OUT_CONNECT_FAILURE, "cannot open an HTTP/2 connection");
		return true;
	}
	nghttp2_session_set_stream_user_data(c->ng, s->id, NULL);
	h2conn_stream_removed(c, s);
	s->c = to;
	s->data_deferred = false;
	s->id = submit(to, s, s->nv, s->nvlen);
	h2conn_stream_added(to, s);
	if (s->id < 0) {
		s->id = 0;
		h2u_end(s, OUT_CONNECT_FAILURE, "cannot submit");
	}
	return true;
}

static void h2_upstream_cancel(struct transport *t)
{
	struct h2_upstream_stream *s = stream_of(t);
	if (s->state == US_CLOSED)
		return;
	struct h2_conn *c = s->c;
	/* a HEADERS still queued is dropped by nghttp2; a sent stream is reset */
	if (c->state != UC_DEAD)
		nghttp2_submit_rst_stream(c->ng, NGHTTP2_FLAG_NONE, s->id, NGHTTP2_CANCEL);
	h2u_detach(s);
	h2conn_flush(c);
}

static bool h2_upstream_sent(const struct transport *t)
{
	return h2u_sent((const struct h2_upstream_stream *)t);
}

static size_t h2_upstream_pending(const struct transport *t)
{
	const struct h2_upstream_stream *s = (const struct h2_upstream_stream *)t;
	return s->pending ? evbuffer_get_length(s->pending) : 0;
}

static void h2_upstream_send_body(struct transport *t, struct evbuffer *data)
{
	struct h2_upstream_stream *s = stream_of(t);
	if (s->state == US_CLOSED || !s->pending) {
		evbuffer_drain(data, evbuffer_get_length(data));
		return;
	}
	evbuffer_add_buffer(s->pending, data);
	if (s->data_deferred) {
		s->data_deferred = false;
		nghttp2_session_resume_data(s->c->ng, s->id);
	}
	h2conn_kick(s->c);
}

static void h2_upstream_send_trailers(struct transport *t, const struct http_hdr *f, int n)
{
	struct h2_upstream_stream *s = stream_of(t);
	if (s->state == US_CLOSED || s->body_ended)
		return;
	keep_trailers(s, f, n);
}

static void h2_upstream_body_end(struct transport *t)
{
	struct h2_upstream_stream *s = stream_of(t);
	if (s->state == US_CLOSED || s->body_ended)
		return;
	s->body_ended = true;
	if (s->data_deferred) {
		s->data_deferred = false;
		nghttp2_session_resume_data(s->c->ng, s->id);
	}
	h2conn_kick(s->c);
}

static void h2_upstream_consume(struct transport *t, size_t n)
{
	struct h2_upstream_stream *s = stream_of(t);
	if (s->state == US_CLOSED || n == 0)
		return;
	nghttp2_session_consume(s->c->ng, s->id, n);
	h2conn_kick(s->c);
}

static void h2_upstream_pause(struct transport *t, bool paused)
{
	/* nothing to do: what the owner does not consume keeps the windows shut */
}

const struct transport_ops h2_transport = {
	.open = h2_upstream_open,
	.cancel = h2_upstream_cancel,
	.sent = h2_upstream_sent,
	.pending = h2_upstream_pending,
	.send_body = h2_upstream_send_body,
	.send_trailers = h2_upstream_send_trailers,
	.body_end = h2_upstream_body_end,
	.consume = h2_upstream_consume,
	.pause = h2_upstream_pause,
	.take_stream = NULL,    /* no Upgrade over HTTP/2 */
};

