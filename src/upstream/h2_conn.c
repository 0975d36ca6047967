/*
 * h2_conn: multiplexed HTTP/2 connections to upstream endpoints (see h2_conn.h).
 *
 * Connection states: UC_CONNECTING -> UC_READY -> UC_GOAWAY (the peer's GOAWAY, or our drain:
 * no new stream, the rest finish) -> UC_DEAD (unlinked, every stream reported, freed once the
 * callback stack unwound). Streams: US_OPEN (no final head) -> US_BODY -> US_CLOSED. (UC_, US_,
 * h2u_, h2_upstream_: the upstream side; the client side's streams are in src/client/.)
 * Frames are serialized with nghttp2_session_mem_send into the stream's output only while the
 * output is below H2_OUT_HIGH and never from inside an nghttp2 callback (c->busy): a flush
 * asked for meanwhile runs when the outer call returns. Received DATA opens the windows only
 * as the owner consumes it (no automatic WINDOW_UPDATE): backpressure towards the server.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/queue.h>
#include <netinet/in.h>
#include <netinet/tcp.h>

#include <event2/buffer.h>
#include <event2/event.h>
#include <event2/event_struct.h>

#include "upstream/h2_conn.h"
#include "base/h2_mem.h"
#include "base/clock.h"
#include "http/h1_parser.h"
#include "base/loop.h"
#include "upstream/pool.h"
#include "net/stream.h"
#include "net/tls.h"
#include "state/upstream.h"
#include "base/util.h"

/* distinct from the client side's (h2_session_impl.h): a stream of one side handed to the
 * other fails the check */
#define H2U_CONN_MAGIC 0x4832c0a1u
#define H2U_STREAM_MAGIC 0x48557e5bu
#define H2_OUT_HIGH (64 * 1024)         /* serialize no more while this much waits to be written */
#define H2_STREAM_WINDOW (256 * 1024)   /* per stream: what a paused owner may leave unread */
#define H2_CONN_WINDOW (4 * 1024 * 1024)
#define H2_DEFAULT_STREAMS 100          /* assumed until the server's SETTINGS say otherwise */
#define H2_MAX_CONNS_PER_EP 32          /* beyond this, streams queue on the least loaded */
#define H2_HEAD_MAX (64 * 1024)         /* response header block, as for HTTP/1.1 */
#define H2_MAX_FIELDS 100               /* ... and its fields */

enum h2u_conn_state { UC_CONNECTING, UC_READY, UC_GOAWAY, UC_DEAD };
enum h2u_stream_state { US_OPEN, US_BODY, US_CLOSED };

struct hfield {
	uint32_t noff, nlen, voff, vlen;
};

struct h2_upstream_stream {
	struct transport t;             /* first: what the attempt holds */
	uint32_t magic;
	enum h2u_stream_state state;
	struct h2_conn *c;
	int32_t id;
	struct transport_cbs cbs;
	void *arg;
	struct evbuffer *body_out;      /* the opener's: response DATA goes here */
	bool hdr_queued;                /* our HEADERS were serialized, starting at hdr_mark */
	uint64_t hdr_mark;
	bool streaming, body_ended, drain_due, data_deferred, bad_head;
	struct evbuffer *body;          /* referenced replayable body, read from body_off */
	size_t body_off;
	struct evbuffer *pending;       /* streamed body not yet taken by nghttp2 */
	nghttp2_nv *tnv;                /* request trailers, sent when the body ends */
	size_t ntnv;
	char *tmem;
	int status;
	TAILQ_ENTRY(h2_upstream_stream) link;
	/* A copy of the request's field bytes follows the struct: nghttp2 was told not to copy
	 * them (NGHTTP2_NV_FLAG_NO_COPY_*), and reads them when it serializes the HEADERS, which
	 * may be a flush later. A stream is freed only once its HEADERS left, was dropped
	 * (on_frame_not_send), or was cancelled in the queue by our RST_STREAM (h2_upstream_cancel:
	 * nghttp2 then never serializes it) — or with the whole session. */
	char fields[];
};

struct h2_conn {
	uint32_t magic;
	enum h2u_conn_state state;
	struct loop *loop;
	struct h2_table *t;
	uint64_t serial;                /* of the endpoint: with tls, the table's key */
	SSL_CTX *tls;
	char sni[256];
	bool verify;
	struct pool_ep *pe;
	struct stream *strm;
	struct evbuffer_cb_entry *out_cb;
	nghttp2_session *ng;
	uint64_t queued, drained;       /* bytes serialized into / written out of the output */
	int nstreams;
	uint32_t peer_max;
	int32_t goaway_last;            /* valid in UC_GOAWAY when goaway_seen */
	bool goaway_seen;
	/* the last x-timeout-ms and grpc-timeout values sent (see repeats_last) */
	char last_tmo[2][16];
	uint8_t last_tmo_len[2];
	int busy;
	bool want_flush;
	int64_t connect_timeout_us;
	struct event timer;             /* connect timeout, then idle lifetime */
	struct event kick;              /* zero-delay flush: a stream opened never hears back
	                                 * before h2_upstream_open returned */
	TAILQ_HEAD(, h2_upstream_stream) streams;
	TAILQ_ENTRY(h2_conn) link;
	/* the last stream find() returned: the callbacks of one frame all name the same stream */
	struct h2_upstream_stream *last;
	/* The header block being received. A block is never interleaved with another stream's
	 * (RFC 9113 §4.3: CONTINUATION follows at once), so one per connection serves every
	 * stream, and no stream allocates for its head. */
	char *hb;
	size_t hused, hcap;
	struct hfield hf[H2_MAX_FIELDS];
	int nhf;
	struct http_hdr hdrs[H2_MAX_FIELDS + 1];    /* the block as fields, for on_head */
};

struct h2_table {
	TAILQ_HEAD(, h2_conn) conns;
	bool draining;
};

static void conn_fail(struct h2_conn *c, const char *detail, bool unprocessed);
static void conn_flush(struct h2_conn *c);

#define NV_LOCAL 64                     /* a longer field list is copied by nghttp2 */

/* The time-left fields come flagged never-indexed: their values may differ in every request,
 * and entering the connection's HPACK table each one would evict the fields that repeat. Yet
 * without a deadline from the client they repeat too (the per-try timeout: ex_send_attempt
 * counts the time spent before it in whole milliseconds): a value equal to the previous one
 * on this connection goes indexable — it is then entered once and sent as one byte from the
 * table after that. */
static bool repeats_last(struct h2_conn *c, const nghttp2_nv *e)
{
	int k;
	if (e->namelen != 12)
		return false;
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

/* The one writer of each object's state (DESIGN rule 2). */
DEFINE_STATE_SETTER(conn_set_state, h2_conn, h2u_conn_state, UC_DEAD)
DEFINE_STATE_SETTER(h2u_set_state, h2_upstream_stream, h2u_stream_state, US_CLOSED)

static struct h2_table *table(struct loop *l)
{
	if (!l->h2) {
		l->h2 = xcalloc(1, sizeof(*l->h2));
		TAILQ_INIT(&l->h2->conns);
	}
	return l->h2;
}

static bool stream_sent(const struct h2_upstream_stream *s)
{
	return s->hdr_queued && s->c && s->c->drained > s->hdr_mark;
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
	TAILQ_REMOVE(&c->streams, s, link);
	c->nstreams--;
	/* fails only for a stream nghttp2 no longer knows (its HEADERS dropped): nothing of
	 * nghttp2's points here then */
	nghttp2_session_set_stream_user_data(c->ng, s->id, NULL);
	if (c->last == s)
		c->last = NULL;
	if (s->pending)
		loop_buf_put(c->loop, s->pending);
	s->pending = NULL;
	s->body = NULL;
	s->c = NULL;
	loop_defer_free(c->loop, h2u_free_cb, s);
	if (c->nstreams == 0 && c->state == UC_READY) {
		/* idle: its lifetime starts (at once when the worker drains) */
		evtimer_del(&c->timer);
		struct timeval tv = clock_tv(c->t->draining ? 0 : POOL_IDLE_US);
		evtimer_add(&c->timer, &tv);
	}
}

/* Report the end and forget S. The owner may open or cancel streams from inside on_close. */
static void h2u_end(struct h2_upstream_stream *s, enum outcome out, const char *detail)
{
	struct transport_cbs cbs = s->cbs;
	void *arg = s->arg;
	bool bad = s->bad_head && out == OUT_RESET;
	h2u_detach(s);
	cbs.on_close(arg, out, bad, detail);
}

/* ---------------------------------------------------------------- connection teardown */

static void conn_free_cb(void *p)
{
	struct h2_conn *c = p;
	if (c->ng)
		nghttp2_session_del(c->ng);
	c->magic = 0;
	free(c->hb);
	free(c);
}

static void conn_close(struct h2_conn *c)
{
	if (c->state == UC_DEAD)
		return;
	conn_set_state(c, UC_DEAD);
	TAILQ_REMOVE(&c->t->conns, c, link);
	evtimer_del(&c->timer);
	evtimer_del(&c->kick);
	if (c->strm) {
		if (c->out_cb)
			evbuffer_remove_cb_entry(stream_output(c->strm), c->out_cb);
		stream_setcb(c->strm, NULL, NULL, NULL, NULL);
		stream_free(c->strm);
		c->strm = NULL;
	}
	loop_defer_free(c->loop, conn_free_cb, c);
}

/* The connection is gone: every stream learns how far it got. UNPROCESSED: none was (the
 * endpoint never spoke HTTP/2 with us: a failed connect, TLS, or ALPN). */
static void conn_fail(struct h2_conn *c, const char *detail, bool unprocessed)
{
	if (c->state == UC_DEAD)
		return;
	struct h2_upstream_stream *s;
	/* streams the owners open from on_close go elsewhere; no flush meanwhile */
	conn_set_state(c, UC_GOAWAY);
	c->goaway_seen = false;
	c->busy++;
	while ((s = TAILQ_FIRST(&c->streams)) != NULL) {
		if (s->state == US_BODY)
			h2u_end(s, OUT_RESET, "upstream connection lost after the response head");
		else if (unprocessed || !stream_sent(s))
			h2u_end(s, OUT_CONNECT_FAILURE, detail);
		else
			h2u_end(s, OUT_RESET, "upstream connection lost before a response head");
	}
	c->busy--;
	conn_close(c);
}

/* A connection that may take no new stream and has none left closes. */
static void conn_maybe_retire(struct h2_conn *c)
{
	if (c->state == UC_GOAWAY && c->nstreams == 0 && c->busy == 0 && c->strm &&
	    evbuffer_get_length(stream_output(c->strm)) == 0)
		conn_close(c);
}

/* ---------------------------------------------------------------- output */

static void deliver_drains(struct h2_conn *c)
{
	for (;;) {
		struct h2_upstream_stream *s, *due = NULL;
		TAILQ_FOREACH(s, &c->streams, link)
			if (s->drain_due) {
				due = s;
				break;
			}
		if (!due)
			return;
		due->drain_due = false;
		due->cbs.on_drain(due->arg);
		if (c->state == UC_DEAD)
			return;
	}
}

static void conn_flush(struct h2_conn *c)
{
	if (c->state != UC_READY && c->state != UC_GOAWAY)
		return;
	if (!c->strm)
		return;
	if (c->busy) {
		c->want_flush = true;
		return;
	}
	struct evbuffer *out = stream_output(c->strm);
	/* frames are gathered here and appended together: nghttp2 hands them over one at a time,
	 * and an append costs more than the copy (the output's callback) */
	uint8_t stage[8192];
	size_t staged = 0;
	c->busy++;
	do {
		c->want_flush = false;
		while (evbuffer_get_length(out) + staged < H2_OUT_HIGH) {
			const uint8_t *p;
			ssize_t n = nghttp2_session_mem_send(c->ng, &p);
			if (n < 0) {
				c->busy--;
				conn_fail(c, nghttp2_strerror((int)n), false);
				return;
			}
			if (n == 0)
				break;
			if (staged + (size_t)n > sizeof(stage)) {
				evbuffer_add(out, stage, staged);
				staged = 0;
			}
			if ((size_t)n <= sizeof(stage)) {
				memcpy(stage + staged, p, (size_t)n);
				staged += (size_t)n;
			} else {
				evbuffer_add(out, p, (size_t)n);
			}
			c->queued += (uint64_t)n;
		}
	} while (c->want_flush && evbuffer_get_length(out) + staged < H2_OUT_HIGH);
	if (staged > 0)
		evbuffer_add(out, stage, staged);
	c->busy--;
	deliver_drains(c);
	if (c->state == UC_DEAD)
		return;
	if (!nghttp2_session_want_read(c->ng) && !nghttp2_session_want_write(c->ng) &&
	    evbuffer_get_length(out) == 0) {
		conn_fail(c, "upstream HTTP/2 session ended", false);
		return;
	}
	conn_maybe_retire(c);
}

static void out_drained_cb(struct evbuffer *buf, const struct evbuffer_cb_info *info, void *arg)
{
	struct h2_conn *c = arg;
	MAGIC_CHECK(c, H2U_CONN_MAGIC);
	c->drained += info->n_deleted;
}

/* ---------------------------------------------------------------- nghttp2 callbacks */

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

static int on_begin_headers_cb(nghttp2_session *ng, const nghttp2_frame *f, void *ud)
{
	struct h2_conn *c = ud;
	MAGIC_CHECK(c, H2U_CONN_MAGIC);
	c->hused = 0;
	c->nhf = 0;
	struct h2_upstream_stream *s = find(c, f->hd.stream_id);
	if (s)
		s->status = 0;
	return 0;
}

static int on_header_cb(nghttp2_session *ng, const nghttp2_frame *f, const uint8_t *name,
                        size_t nlen, const uint8_t *value, size_t vlen, uint8_t flags, void *ud)
{
	struct h2_conn *c = ud;
	MAGIC_CHECK(c, H2U_CONN_MAGIC);
	struct h2_upstream_stream *s = find(c, f->hd.stream_id);
	if (!s)
		return 0;
	if (nlen == 7 && memcmp(name, ":status", 7) == 0) {
		int st = 0;
		for (size_t i = 0; i < vlen && i < 3; i++)
			st = st * 10 + (value[i] - '0');
		s->status = vlen == 3 ? st : 0;
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
		/* nghttp2 refused any name with a capital letter (RFC 9113 §8.2.1) */
		if (h->nlen == 14 && memcmp(h->name, "content-length", 14) == 0) {
			h->hop = true;
			int64_t v = 0;
			for (uint32_t j = 0; j < h->vlen && v < (1LL << 50); j++)
				v = v * 10 + (h->value[j] - '0');
			*clen = v;      /* nghttp2 checked it is digits and matches the DATA */
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
		if (!(f->hd.flags & NGHTTP2_FLAG_ACK))
			c->peer_max = nghttp2_session_get_remote_settings(ng,
			                      NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS);
		return 0;
	case NGHTTP2_GOAWAY:
		c->goaway_seen = true;
		c->goaway_last = f->goaway.last_stream_id;
		if (c->state != UC_DEAD)
			conn_set_state(c, UC_GOAWAY);
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
	if (f->hd.type == NGHTTP2_HEADERS) {
		if (s->state == US_OPEN) {
			if (s->status < 100) {
				s->bad_head = true;
				return 0;   /* nghttp2 resets a response without :status */
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
	if (!s || s->state != US_BODY) {
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
	else if (!stream_sent(s))
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

/* ---------------------------------------------------------------- input and events */

static void conn_read_cb(struct stream *strm, void *arg)
{
	struct h2_conn *c = arg;
	MAGIC_CHECK(c, H2U_CONN_MAGIC);
	if (c->state == UC_DEAD)
		return;
	struct evbuffer *in = stream_input(strm);
	c->busy++;
	while (evbuffer_get_length(in) > 0 && c->state != UC_DEAD) {
		struct evbuffer_iovec v;
		if (evbuffer_peek(in, -1, NULL, &v, 1) < 1)
			break;
		ssize_t n = nghttp2_session_mem_recv(c->ng, v.iov_base, v.iov_len);
		if (n < 0) {
			c->busy--;
			conn_fail(c, nghttp2_strerror((int)n), false);
			return;
		}
		evbuffer_drain(in, (size_t)n);
	}
	c->busy--;
	if (c->state == UC_DEAD)
		return;
	conn_flush(c);
}

static void conn_write_cb(struct stream *strm, void *arg)
{
	struct h2_conn *c = arg;
	MAGIC_CHECK(c, H2U_CONN_MAGIC);
	if (c->state != UC_DEAD)
		conn_flush(c);
}

static bool alpn_is_h2(struct stream *strm, SSL_CTX *tls)
{
	if (!tls)
		return true;
	SSL *ssl = stream_ssl(strm);
	const unsigned char *p = NULL;
	unsigned int n = 0;
	if (ssl)
		SSL_get0_alpn_selected(ssl, &p, &n);
	return n == 2 && memcmp(p, "h2", 2) == 0;
}

static void conn_event_cb(struct stream *strm, short what, void *arg)
{
	struct h2_conn *c = arg;
	MAGIC_CHECK(c, H2U_CONN_MAGIC);
	if (c->state == UC_DEAD)
		return;
	if (what & BEV_EVENT_CONNECTED) {
		int one = 1;
		setsockopt(stream_fd(strm), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
		if (!alpn_is_h2(strm, c->tls)) {
			conn_fail(c, "the endpoint did not select h2 (ALPN)", true);
			return;
		}
		evtimer_del(&c->timer);
		if (c->state == UC_CONNECTING)
			conn_set_state(c, UC_READY);
		if (c->nstreams == 0 && c->state == UC_READY) {
			struct timeval tv = clock_tv(POOL_IDLE_US);
			evtimer_add(&c->timer, &tv);
		}
		conn_flush(c);
		return;
	}
	if (c->state == UC_CONNECTING) {
		conn_fail(c, (what & BEV_EVENT_ERROR) ?
		          evutil_socket_error_to_string(EVUTIL_SOCKET_ERROR()) : "closed while connecting",
		          true);
		return;
	}
	/* whatever is still buffered may be the server's last frames (a GOAWAY, a response) */
	conn_read_cb(strm, c);
	if (c->state != UC_DEAD)
		conn_fail(c, "upstream closed the HTTP/2 connection", false);
}

static void conn_kick_cb(evutil_socket_t fd, short what, void *arg)
{
	struct h2_conn *c = arg;
	MAGIC_CHECK(c, H2U_CONN_MAGIC);
	conn_flush(c);
}

static void conn_timer_cb(evutil_socket_t fd, short what, void *arg)
{
	struct h2_conn *c = arg;
	MAGIC_CHECK(c, H2U_CONN_MAGIC);
	if (c->state == UC_CONNECTING) {
		conn_fail(c, "connect timeout", true);
		return;
	}
	if (c->nstreams == 0) {
		/* idle too long: say goodbye */
		nghttp2_submit_goaway(c->ng, NGHTTP2_FLAG_NONE,
		                      nghttp2_session_get_last_proc_stream_id(c->ng), NGHTTP2_NO_ERROR,
		                      NULL, 0);
		conn_set_state(c, UC_GOAWAY);
		conn_flush(c);
		if (c->state != UC_DEAD)
			conn_close(c);
	}
}

/* ---------------------------------------------------------------- connecting */

/* Connect to the endpoint's address (resolved once per process: resolve.c). */
static void conn_connect(struct h2_conn *c)
{
	SSL *ssl = NULL;
	if (c->tls) {
		ssl = tls_client_ssl(c->tls, c->sni[0] ? c->sni : NULL, c->verify);
		if (ssl)
			SSL_set_alpn_protos(ssl, (const unsigned char *)"\x02h2", 3);
	}
	struct stream *strm = (!c->tls || ssl) ?
	        stream_new(c->loop, -1, ssl, ssl ? STREAM_TLS_CONNECT : STREAM_PLAIN) : NULL;
	if (!strm) {
		conn_fail(c, "out of sockets", true);
		return;
	}
	c->strm = strm;
	stream_setcb(strm, conn_read_cb, conn_write_cb, conn_event_cb, c);
	c->out_cb = evbuffer_add_cb(stream_output(strm), out_drained_cb, c);
	stream_enable(strm, EV_READ | EV_WRITE);
	if (stream_connect(strm, (struct sockaddr *)&c->pe->addr, c->pe->addrlen) < 0)
		conn_fail(c, "connect failed", true);
}

static nghttp2_session *session_new(struct h2_conn *c)
{
	nghttp2_session_callbacks *cb;
	nghttp2_option *opt;
	nghttp2_session *ng = NULL;
	if (nghttp2_session_callbacks_new(&cb) != 0)
		return NULL;
	nghttp2_session_callbacks_set_on_frame_send_callback(cb, on_frame_send_cb);
	nghttp2_session_callbacks_set_on_frame_not_send_callback(cb, on_frame_not_send_cb);
	nghttp2_session_callbacks_set_on_frame_recv_callback(cb, on_frame_recv_cb);
	nghttp2_session_callbacks_set_on_begin_headers_callback(cb, on_begin_headers_cb);
	nghttp2_session_callbacks_set_on_header_callback(cb, on_header_cb);
	nghttp2_session_callbacks_set_on_data_chunk_recv_callback(cb, on_data_chunk_cb);
	nghttp2_session_callbacks_set_on_stream_close_callback(cb, on_stream_close_cb);
	nghttp2_option_new(&opt);
	nghttp2_option_set_no_auto_window_update(opt, 1);
	/* one stream until the server's SETTINGS say how many it takes (then its value, or
	 * unlimited): a burst on a new connection waits one round trip, queued, instead of being
	 * refused by a server whose limit is low */
	nghttp2_option_set_peer_max_concurrent_streams(opt, 1);
	nghttp2_mem mem = h2_mem(c->loop);
	if (nghttp2_session_client_new3(&ng, cb, c, opt, &mem) != 0)
		ng = NULL;
	nghttp2_option_del(opt);
	nghttp2_session_callbacks_del(cb);
	if (!ng)
		return NULL;
	nghttp2_settings_entry iv[] = {
		{ NGHTTP2_SETTINGS_ENABLE_PUSH, 0 },
		{ NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE, H2_STREAM_WINDOW },
		{ NGHTTP2_SETTINGS_NO_RFC7540_PRIORITIES, 1 },
	};
	nghttp2_submit_settings(ng, NGHTTP2_FLAG_NONE, iv, sizeof(iv) / sizeof(iv[0]));
	nghttp2_session_set_local_window_size(ng, NGHTTP2_FLAG_NONE, 0, H2_CONN_WINDOW);
	return ng;
}

static struct h2_conn *conn_new(struct loop *l, struct ep_state *ep, struct pool_ep *pe,
                                const struct transport_req *o)
{
	struct h2_conn *c = xcalloc(1, sizeof(*c));
	c->magic = H2U_CONN_MAGIC;
	c->loop = l;
	c->t = table(l);
	c->serial = ep->serial;
	c->tls = o->tls;
	c->verify = o->verify;
	size_t n = o->sni ? strlen(o->sni) : 0;
	if (n < sizeof(c->sni))
		memcpy(c->sni, o->sni ? o->sni : "", n);
	c->pe = pe;
	c->peer_max = H2_DEFAULT_STREAMS;
	c->connect_timeout_us = o->connect_timeout_us;
	TAILQ_INIT(&c->streams);
	c->ng = session_new(c);
	if (!c->ng) {
		free(c);
		return NULL;
	}
	TAILQ_INSERT_TAIL(&c->t->conns, c, link);
	conn_set_state(c, UC_CONNECTING);
	evtimer_assign(&c->timer, l->base, conn_timer_cb, c);
	evtimer_assign(&c->kick, l->base, conn_kick_cb, c);
	struct timeval tv = clock_tv(o->connect_timeout_us > 0 ? o->connect_timeout_us : 1000000);
	evtimer_add(&c->timer, &tv);
	conn_connect(c);     /* may fail at once: the connection is then dead */
	return c;
}

/* The connection for a new stream to EP: the first with room, else a new one. */
static struct h2_conn *conn_pick(struct loop *l, struct ep_state *ep, struct pool_ep *pe,
                                 const struct transport_req *o)
{
	struct h2_table *t = table(l);
	struct h2_conn *c, *least = NULL;
	int n = 0;
	TAILQ_FOREACH(c, &t->conns, link) {
		if (c->serial != ep->serial || c->tls != o->tls || c->state == UC_GOAWAY ||
		    c->state == UC_DEAD)
			continue;
		if ((uint32_t)c->nstreams < c->peer_max)
			return c;
		n++;
		if (!least || c->nstreams < least->nstreams)
			least = c;
	}
	if (n >= H2_MAX_CONNS_PER_EP && least)
		return least;       /* nghttp2 queues beyond the server's limit */
	return conn_new(l, ep, pe, o);
}

/* ---------------------------------------------------------------- streams */

/* Frames wait for the end of this loop turn, then leave together: a body, its end and the
 * window updates of one turn in one flush (and one DATA frame with END_STREAM, not two). */
static void conn_kick(struct h2_conn *c)
{
	event_active(&c->kick, EV_TIMEOUT, 0);
}

static struct h2_upstream_stream *stream_of(struct transport *t)
{
	struct h2_upstream_stream *s = (struct h2_upstream_stream *)t;
	MAGIC_CHECK(s, H2U_STREAM_MAGIC);
	return s;
}

static struct transport *h2_upstream_open(struct loop *l, struct ep_state *ep,
                                          const struct transport_req *o,
                                          const struct transport_cbs *cbs, void *arg,
                                          const char **err)
{
	struct h2_conn *c = conn_pick(l, ep, pool_ep_get(l, ep), o);
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
	s->body = o->body;
	s->streaming = o->streaming;
	if (o->streaming)
		s->pending = loop_buf_get(l);
	keep_trailers(s, o->trailers, o->ntrailers);
	nghttp2_data_provider dp = { .source.ptr = s, .read_callback = body_read_cb };
	bool has_body = o->streaming || (o->body && evbuffer_get_length(o->body) > 0) ||
	                s->ntnv > 0;
	/* the list itself is copied by nghttp2 whatever the flags: it is built on the stack */
	nghttp2_nv local[NV_LOCAL];
	const nghttp2_nv *nv = o->nv;
	if (nb > 0) {
		memcpy(s->fields, o->nv_bytes, nb);
		const uint8_t *lo = (const uint8_t *)o->nv_bytes, *hi = lo + nb;
		for (size_t i = 0; i < o->nvlen; i++) {
			const nghttp2_nv *e = &o->nv[i];
			local[i] = *e;
			if ((e->flags & NGHTTP2_NV_FLAG_NO_INDEX) && repeats_last(c, e))
				local[i].flags &= (uint8_t)~NGHTTP2_NV_FLAG_NO_INDEX;
			if (e->name >= lo && e->name + e->namelen <= hi) {
				local[i].name = (uint8_t *)s->fields + (e->name - lo);
				local[i].flags |= NGHTTP2_NV_FLAG_NO_COPY_NAME;
			}
			if (e->value >= lo && e->value + e->valuelen <= hi) {
				local[i].value = (uint8_t *)s->fields + (e->value - lo);
				local[i].flags |= NGHTTP2_NV_FLAG_NO_COPY_VALUE;
			}
		}
		nv = local;
	}
	int32_t id = nghttp2_submit_request(c->ng, NULL, nv, o->nvlen, has_body ? &dp : NULL, s);
	if (id < 0) {
		if (s->pending)
			loop_buf_put(l, s->pending);
		free(s->tnv);
		free(s->tmem);
		free(s);
		if (c->nstreams == 0 && c->state != UC_DEAD)
			conn_fail(c, "cannot submit", true);
		*err = "cannot open an HTTP/2 connection";
		return NULL;
	}
	s->id = id;
	TAILQ_INSERT_TAIL(&c->streams, s, link);
	c->nstreams++;
	if (c->state == UC_READY && c->nstreams == 1)
		evtimer_del(&c->timer);     /* no longer idle (armed only while no stream is) */
	/* activated rather than a zero timeout (a heap insertion and removal per stream): queued
	 * behind the callbacks of this loop round, it still sends the HEADERS they opened in one
	 * flush */
	event_active(&c->kick, EV_TIMEOUT, 0);
	return &s->t;
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
	conn_flush(c);
}

static bool h2_upstream_sent(const struct transport *t)
{
	return stream_sent((const struct h2_upstream_stream *)t);
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
	conn_kick(s->c);
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
	conn_kick(s->c);
}

static void h2_upstream_consume(struct transport *t, size_t n)
{
	struct h2_upstream_stream *s = stream_of(t);
	if (s->state == US_CLOSED || n == 0)
		return;
	nghttp2_session_consume(s->c->ng, s->id, n);
	conn_kick(s->c);
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

/* ---------------------------------------------------------------- worker exit */

void h2_drain(struct loop *l)
{
	struct h2_table *t = l->h2;
	if (!t)
		return;
	/* in-flight streams finish (and may still retry); idle connections say goodbye */
	t->draining = true;
	struct h2_conn *c, *next;
	for (c = TAILQ_FIRST(&t->conns); c; c = next) {
		next = TAILQ_NEXT(c, link);
		if (c->nstreams == 0 && c->state == UC_READY) {
			evtimer_del(&c->timer);
			struct timeval tv = { 0, 0 };
			evtimer_add(&c->timer, &tv);
		} else if (c->nstreams == 0) {
			conn_close(c);
		}
	}
}

void h2_free_all(struct loop *l)
{
	struct h2_table *t = l->h2;
	if (!t)
		return;
	struct h2_conn *c;
	while ((c = TAILQ_FIRST(&t->conns)) != NULL)
		conn_fail(c, "worker exiting", false);
	free(t);
	l->h2 = NULL;
}
