/*
 * h2_request: request intake of the HTTP/2 client codec (see h2_session_impl.h). nghttp2's
 * receive callbacks for what the client sends on a stream: the head's fields (kept in the
 * rcbufs nghttp2 decoded them into, no copy), its checks (SPEC §9: malformed, 414 / 431 /
 * 501, the §5 precedence), the start of the stream's exchange, request DATA and trailers, and
 * the pump that hands the body to the exchange as it takes it.
 *
 * Invariants: a stream's exchange starts once, when its head is complete and passed every
 * check, and only from a receive callback; the request's http_head points into rcbufs the
 * stream holds until it is destroyed (an oversized head holds none: see refuse_head); request
 * DATA is consumed (WINDOW_UPDATE) only as the exchange takes it, or when nobody will.
 *
 * Calls go down only (h2_session_impl.h): into h2_responder.c (the responder each exchange
 * gets, the refusals made here) and the core; h2_session.c calls this file, never the reverse.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/queue.h>

#include <event2/buffer.h>
#include <nghttp2/nghttp2.h>

#include "obs/accesslog.h"
#include "config/config.h"
#include "proxy/exchange.h"
#include "http/grpc.h"
#include "http/h2_fields.h"
#include "client/h2_session_impl.h"
#include "http/h1_parser.h"
#include "base/log.h"
#include "base/loop.h"
#include "http/respond.h"
#include "http/responder.h"
#include "obs/stats.h"
#include "state/runtime.h"
#include "base/util.h"

static struct http_hdr *hdr_slot(struct h2_client_stream *st);

/* ------------------------------------------------------------------ the exchange */

bool h2cl_refresh_config(struct h2_session *s)
{
	struct runtime *rt = s->own.runtime(s->own.runtime_arg);
	if (rt == s->rt)
		return s->lcfg != NULL;
	struct cfg_listener *l = config_listener(rt->cfg, s->lname);
	if (!l)
		return false;
	runtime_unref(s->rt);
	s->rt = runtime_ref(rt);
	s->lcfg = l;
	return true;
}

/* The kind of a refusal, for its log line: a bit of h2_session.refusals_logged. */
static unsigned refusal_bit(int status)
{
	switch (status) {
	case 404: return 1u << 0;
	case 414: return 1u << 1;
	case 431: return 1u << 2;
	case 501: return 1u << 3;
	default: return 1u << 4;
	}
}

/* A response retrygate makes itself, before any exchange (§5 on the stream, §9 limits).
 * Logged once per connection and kind, as the connection defences are: the connection stays
 * open, and a client could otherwise write a line per stream; the access log and the metrics
 * count every one. */
static void stream_refuse(struct h2_client_stream *st, int status, const char *reason)
{
	struct h2_session *s = st->s;
	unsigned bit = refusal_bit(status);
	if (!(s->refusals_logged & bit)) {
		s->refusals_logged |= bit;
		slog(LOG_INFO, s->id, "stream %d refused %d %s (logged once per connection; "
		     "every one is counted)", st->id, status, reason);
	}
	accesslog_write_refusal(s->id, s->peer_ip, &s->loop->rng, status, reason);
	STAT_INC(g_gstats[s->loop->id].requests[status / 100]);
	struct made_response m;
	if (st->grpc) {
		respond_grpc_error(&m, reason, "", 0, NULL);    /* SPEC §10 */
		int pb;
		STAT_INC(g_gstats[s->loop->id].grpc_status[grpc_status_for_reason(reason, &pb)]);
	} else
		respond_error(&m, status, reason, "", 0, NULL, NULL, true);
	struct responder rsp = h2_responder;
	rsp.arg = st;
	respond_send(&rsp, &m.head, m.body, m.body_len);
	h2cl_rsp_end(st, true, true);
}

static void stream_malformed(struct h2_client_stream *st, const char *why)
{
	slog(LOG_DEBUG, st->s->id, "stream %d malformed: %s", st->id, why);
	st->ex_done = true;
	nghttp2_submit_rst_stream(st->s->ng, NGHTTP2_FLAG_NONE, st->id, NGHTTP2_PROTOCOL_ERROR);
}

/* ------------------------------------------------------------------ SPEC §9: malformed */

/* nghttp2 is told to leave HTTP messaging to us (h2_session.c): each field is checked here
 * as it comes (RFC 9113 §8.2-8.3, the rules nghttp2 applies), the head's completeness when it
 * ends (head_malformed), the DATA against content-length as it comes. */
enum { PS_METHOD = 1, PS_SCHEME = 2, PS_AUTHORITY = 4, PS_PATH = 8, PS_HOST = 16 };
enum { RQ_SCHEME_HTTP = 1, RQ_PATH_SLASH = 2, RQ_PATH_ASTERISK = 4, RQ_CONNECT = 8,
       RQ_OPTIONS = 16 };

static bool is_alpha(unsigned c)
{
	return (c | 0x20) >= 'a' && (c | 0x20) <= 'z';
}

static bool is_digit(unsigned c)
{
	return c >= '0' && c <= '9';
}

/* tchar (RFC 9110 §5.6.2), upper case included when UPPER */
static bool is_tchar(unsigned c, bool upper)
{
	if ((c >= 'a' && c <= 'z') || is_digit(c) || c == '-')
		return true;
	if (c >= 'A' && c <= 'Z')
		return upper;
	switch (c) {
	case '!': case '#': case '$': case '%': case '&': case '\'': case '*': case '+': case '.':
	case '^': case '_': case '`': case '|': case '~':
		return true;
	default:
		return false;
	}
}

static bool all_tchar(const char *v, size_t n, bool upper)
{
	for (size_t i = 0; i < n; i++)
		if (!is_tchar((unsigned char)v[i], upper))
			return false;
	return n > 0;
}

static bool authority_ok(const char *v, size_t n)
{
	return h2f_all_of(v, n, H2F_AUTHORITY);
}

static bool scheme_ok(const char *v, size_t n)
{
	if (n == 0 || !is_alpha((unsigned char)v[0]))
		return false;
	for (size_t i = 1; i < n; i++) {
		unsigned c = (unsigned char)v[i];
		if (!is_alpha(c) && !is_digit(c) && c != '+' && c != '-' && c != '.')
			return false;
	}
	return true;
}

static bool lit_ieq(const char *v, size_t n, const char *lit)
{
	return str_ieq(v, n, lit, strlen(lit));
}

/* A pseudo-header N: V of a head (not trailers). False: malformed. */
static bool check_pseudo(struct h2_client_stream *st, const char *n, size_t nl, const char *v,
                         size_t vl)
{
	int bit;
	bool ok;
	if (nl == 7 && memcmp(n, ":method", 7) == 0) {
		bit = PS_METHOD;
		ok = all_tchar(v, vl, true);
		if (vl == 7 && memcmp(v, "CONNECT", 7) == 0)
			st->req_flags |= RQ_CONNECT;
		else if (vl == 7 && memcmp(v, "OPTIONS", 7) == 0)
			st->req_flags |= RQ_OPTIONS;
	} else if (nl == 5 && memcmp(n, ":path", 5) == 0) {
		bit = PS_PATH;
		ok = h2f_path_ok(v, vl);
		if (vl > 0 && v[0] == '/')
			st->req_flags |= RQ_PATH_SLASH;
		else if (vl == 1 && v[0] == '*')
			st->req_flags |= RQ_PATH_ASTERISK;
	} else if (nl == 7 && memcmp(n, ":scheme", 7) == 0) {
		bit = PS_SCHEME;
		ok = scheme_ok(v, vl);
		if ((vl == 4 && memcmp(v, "http", 4) == 0) || lit_ieq(v, vl, "http") ||
		    lit_ieq(v, vl, "https"))
			st->req_flags |= RQ_SCHEME_HTTP;
	} else if (nl == 10 && memcmp(n, ":authority", 10) == 0) {
		bit = PS_AUTHORITY;
		ok = authority_ok(v, vl);
	} else {
		return false;   /* unknown (:protocol too: extended CONNECT is not offered) or
		                 * a response's (:status) */
	}
	if (st->regular_seen || (st->pseudo & bit) || vl == 0)
		return false;
	st->pseudo |= (uint8_t)bit;
	return ok;
}

/* Field N: V of the head, or of the trailers when TRAILER. False: malformed. */
static bool check_field(struct h2_client_stream *st, const char *n, size_t nl, const char *v,
                        size_t vl, bool trailer)
{
	if (nl > 0 && n[0] == ':')
		return !trailer && check_pseudo(st, n, nl, v, vl);
	st->regular_seen = true;
	switch (h2f_regular(n, nl, v, vl)) {
	case H2F_BAD:
		return false;
	case H2F_HOST:
		if ((st->pseudo & PS_HOST) || vl == 0)
			return false;
		st->pseudo |= PS_HOST;
		return authority_ok(v, vl);
	case H2F_CONTENT_LENGTH:
		if (st->cl_seen)
			return false;
		st->cl_seen = true;
		/* in trailers (none in the head): it must say what came, as nghttp2 had it */
		return !trailer || h2f_parse_length(v, vl) == (int64_t)st->req_bytes;
	default:
		return true;
	}
}

/* The priority field (RFC 9218 §4), which nghttp2 read for us while it checked the head:
 * "u=N" (0-7) and "i" (or i=?1 / i=?0) of a dictionary; other members are skipped up to
 * their comma. A field it cannot read makes the stream's fields ignored, as nghttp2 did. */
#define PRIO_SET 0x80
#define PRIO_BAD 0x40
#define PRIO_INC 0x08
#define PRIO_URGENCY 0x07
static void note_priority(struct h2_client_stream *st, const char *v, size_t n)
{
	uint8_t p = st->prio & PRIO_SET ? st->prio : (PRIO_SET | 3);
	size_t i = 0;
	if (st->prio & PRIO_BAD)
		return;
	while (i < n) {
		while (i < n && (v[i] == ' ' || v[i] == '\t'))
			i++;
		char key = i < n ? v[i] : 0;
		bool one = i + 1 >= n || v[i + 1] == '=' || v[i + 1] == ';' || v[i + 1] == ',' ||
		           v[i + 1] == ' ' || v[i + 1] == '\t';
		size_t end = i;
		while (end < n && v[end] != ',')
			end++;
		if (one && key == 'u') {
			if (i + 2 >= end || v[i + 1] != '=' || v[i + 2] < '0' || v[i + 2] > '7' ||
			    (i + 3 < end && v[i + 3] != ';' && v[i + 3] != ' ' && v[i + 3] != '\t'))
				goto bad;
			p = (uint8_t)((p & ~PRIO_URGENCY) | (v[i + 2] - '0'));
		} else if (one && key == 'i') {
			bool val = true;
			if (i + 1 < end && v[i + 1] == '=') {
				if (i + 3 >= end || v[i + 2] != '?' || (v[i + 3] != '0' && v[i + 3] != '1'))
					goto bad;
				val = v[i + 3] == '1';
			}
			p = (uint8_t)(val ? p | PRIO_INC : p & ~PRIO_INC);
		} else if (key == 0 || !((key >= 'a' && key <= 'z') || key == '*')) {
			goto bad;
		}
		i = end + 1;
	}
	st->prio = p;
	return;
bad:
	st->prio = PRIO_BAD;
}

/* The head is complete (its END_STREAM, if any, noted): what it must have. */
static bool head_malformed(const struct h2_client_stream *st)
{
	if (st->req_flags & RQ_CONNECT)
		return (st->pseudo & (PS_SCHEME | PS_PATH)) || !(st->pseudo & PS_AUTHORITY);
	if ((st->pseudo & (PS_METHOD | PS_SCHEME | PS_PATH)) != (PS_METHOD | PS_SCHEME | PS_PATH))
		return true;
	if (!(st->pseudo & (PS_AUTHORITY | PS_HOST)))
		return true;
	if ((st->req_flags & RQ_SCHEME_HTTP) && !(st->req_flags & RQ_PATH_SLASH) &&
	    !((st->req_flags & RQ_OPTIONS) && (st->req_flags & RQ_PATH_ASTERISK)))
		return true;
	/* a head that ends the stream carries no body: a content-length must say 0 */
	return st->req_end && st->head.content_length > 0;
}

/* The request's DATA ended (END_STREAM): it must be as long as its content-length said. */
static void body_end_check(struct h2_client_stream *st)
{
	if (!st->malformed && !st->refused && st->head.content_length >= 0 &&
	    st->req_bytes != (uint64_t)st->head.content_length) {
		st->malformed = true;
		stream_malformed(st, "DATA shorter than content-length");
	}
}

/* The head is complete: check what is left to check, build the http_head, start. */
static void stream_start(struct h2_client_stream *st)
{
	struct h2_session *s = st->s;
	struct http_head *h = &st->head;
	st->head_done = true;
	if (st->refused) {
		st->ex_done = true;
		nghttp2_submit_rst_stream(s->ng, NGHTTP2_FLAG_NONE, st->id, NGHTTP2_REFUSED_STREAM);
		return;
	}
	if (st->malformed || head_malformed(st)) {
		stream_malformed(st, "malformed head (RFC 9113 §8.2-8.3)");
		return;
	}
	if (st->cookie) {
		if (st->refuse_status == 0 && h->nhdrs < HTTP_MAX_HEADERS) {
			*hdr_slot(st) = (struct http_hdr){ .name = "cookie", .nlen = 6, .value = st->cookie,
			                        .vlen = (uint32_t)st->cookie_len };
		}
	}
	if (st->refuse_status) {
		stream_refuse(st, st->refuse_status, st->refuse_reason);
		return;
	}
	int mc = http_method_class(h->method, strlen(h->method));
	if (mc != METH_OK) {
		stream_refuse(st, 501, "not-implemented");
		return;
	}
	if (st->authority) {
		h->host = st->authority;
		h->host_len = st->alen;
	} else if (st->hosthdr) {
		h->host = st->hosthdr;
		h->host_len = st->hlen;
	}
	h->target = h->path;
	h->target_len = h->path_len;
	h->version = 20;
	h->keep_alive = true;
	h->method_head = strcmp(h->method, "HEAD") == 0;
	h->chunked = !st->req_end && h->content_length < 0;
	h->hdrs = st->hdrs;
	if (!h2cl_refresh_config(s)) {
		stream_refuse(st, 404, "no-route");
		return;
	}
	if (st->prio & PRIO_SET) {
		nghttp2_extpri pri = { .urgency = st->prio & PRIO_URGENCY,
		                       .inc = !!(st->prio & PRIO_INC) };
		nghttp2_session_change_extpri_stream_priority(s->ng, st->id, &pri, 0);
	}
	struct client_info ci = { .sid = s->id, .peer_ip = s->peer_ip, .tls = s->tls };
	struct responder rsp = h2_responder;
	rsp.arg = st;
	st->ex = exchange_new(s->loop, s->rt, s->lcfg, &ci, h, &rsp);
	exchange_start(st->ex);
}

/* The kept request trailers go to the exchange (before its body ends). */
static void deliver_request_trailers(struct h2_client_stream *st)
{
	const char *p = (const char *)evbuffer_pullup(st->req_trailers, -1);
	struct http_hdr t[HTTP_MAX_HEADERS];
	int n = 0;
	for (; n < st->nreq_trailers; n++) {
		uint32_t lens[2];
		memcpy(lens, p, sizeof(lens));
		p += sizeof(lens);
		t[n] = (struct http_hdr){ .name = p, .nlen = lens[0], .value = p + lens[0],
		                          .vlen = lens[1] };
		p += lens[0] + lens[1];
	}
	exchange_trailers(st->ex, t, n);
}

/* Request DATA received and not yet taken. The buffer is got with the first DATA: most
 * requests (GET) have none, and flush asks this of every stream each round. */
size_t h2cl_req_pending(const struct h2_client_stream *st)
{
	return st->req_in ? evbuffer_get_length(st->req_in) : 0;
}

/* Request body bytes go to the exchange as it takes them, and only then are consumed
 * (WINDOW_UPDATE): a stalled upstream stalls this stream, nothing else. */
void h2cl_stream_pump(struct h2_session *s, struct h2_client_stream *st)
{
	while (st->ex && !st->ex_done && h2cl_req_pending(st) > 0) {
		size_t room = exchange_body_room(st->ex);
		if (room == 0)
			return;
		size_t have = evbuffer_get_length(st->req_in);
		size_t n = room < have ? room : have;
		/* all of it fits (a unary call's one message): handed over where it is, not moved
		 * into the scratch buffer first */
		struct evbuffer *part = n == have ? st->req_in : s->tmp;
		if (part == s->tmp)
			evbuffer_remove_buffer(st->req_in, s->tmp, n);
		exchange_body(st->ex, part);
		evbuffer_drain(part, evbuffer_get_length(part));
		nghttp2_session_consume(s->ng, st->id, n);
	}
	size_t left = h2cl_req_pending(st);
	if (left > 0 && (st->ex_done || !st->ex)) {
		evbuffer_drain(st->req_in, left);    /* nobody reads it: discard, keep the window */
		nghttp2_session_consume(s->ng, st->id, left);
		left = 0;
	}
	if (st->req_end && left == 0 && !st->body_end_sent && st->ex && !st->ex_done) {
		st->body_end_sent = true;
		if (st->nreq_trailers > 0)
			deliver_request_trailers(st);
		if (!st->ex_done)
			exchange_body_end(st->ex);
	}
}

/* ------------------------------------------------------------------ nghttp2's receive side */

static int begin_headers_cb(nghttp2_session *ng, const nghttp2_frame *frame, void *arg)
{
	struct h2_session *s = arg;
	MAGIC_CHECK(s, H2CL_SESSION_MAGIC);
	if (frame->hd.type != NGHTTP2_HEADERS || frame->headers.cat != NGHTTP2_HCAT_REQUEST)
		return 0;
	struct h2_client_stream *st = loop_obj_get(s->loop, LOOP_H2_STREAM, sizeof(*st));
	st->magic = H2CL_STREAM_MAGIC;
	st->loop = s->loop;
	st->s = s;
	st->id = frame->hd.stream_id;
	st->head.content_length = -1;
	st->resp = loop_buf_get(s->loop);     /* req_in: with the first DATA */
	st->refused = (uint32_t)s->nstreams >= s->max_streams;
	TAILQ_INSERT_TAIL(&s->streams, st, link);
	s->nstreams++;
	s->stream_seen = true;      /* for the idle timer: it may end before the round does */
	nghttp2_session_set_stream_user_data(ng, st->id, st);
	s->last = st;       /* its fields come next */
	return 0;
}

void h2cl_head_release(struct h2_client_stream *st)
{
	for (int i = 0; i < st->nrc; i++)
		nghttp2_rcbuf_decref(st->rc[i]);
	st->nrc = st->caprc = st->cap = 0;
	if (st->rc != st->rc_in)
		free(st->rc);
	st->rc = NULL;
	if (st->hdrs != st->hdrs_in)
		free(st->hdrs);
	st->hdrs = NULL;
	st->head.hdrs = NULL;
	st->head.nhdrs = 0;
	/* these point into the rcbufs just let go of */
	st->authority = st->hosthdr = NULL;
	st->alen = st->hlen = 0;
	st->head.path = NULL;
	st->head.path_len = 0;
}

/* :authority and host, both present, must agree (SPEC §9). Checked as the second of them is
 * kept, while both are held: a head that passes max_header_bytes later lets go of them before
 * it is complete. */
static void check_host(struct h2_client_stream *st)
{
	if (st->authority && st->hosthdr &&
	    !str_ieq(st->authority, st->alen, st->hosthdr, st->hlen))
		st->malformed = true;
}

static int refuse_rank(int status)
{
	return status == 414 ? 3 : status == 431 ? 2 : status ? 1 : 0;
}

/* Precedence (SPEC §5): 414 (checked before the head size), then 431, then 501. */
static void refuse_head(struct h2_client_stream *st, int status, const char *reason)
{
	if (refuse_rank(status) > refuse_rank(st->refuse_status)) {
		st->refuse_status = status;
		st->refuse_reason = reason;
	}
	if (status == 431 && !st->oversize) {
		st->oversize = true;
		h2cl_head_release(st);  /* keep nothing more of an oversized head */
	}
}

/* Room for one more field in the head: the stream's own array first, then the heap. */
static struct http_hdr *hdr_slot(struct h2_client_stream *st)
{
	if (st->cap == 0) {
		st->hdrs = st->hdrs_in;
		st->cap = HDRS_INLINE;
	}
	if (st->head.nhdrs + 1 >= st->cap) {
		int cap = 2 * st->cap;
		struct http_hdr *h = xmalloc((size_t)cap * sizeof(*h));
		memcpy(h, st->hdrs, (size_t)st->head.nhdrs * sizeof(*h));
		if (st->hdrs != st->hdrs_in)
			free(st->hdrs);
		st->hdrs = h;
		st->cap = cap;
	}
	return &st->hdrs[st->head.nhdrs++];
}

static void keep(struct h2_client_stream *st, nghttp2_rcbuf *a, nghttp2_rcbuf *b)
{
	if (st->caprc == 0) {
		st->rc = st->rc_in;
		st->caprc = RC_INLINE;
	}
	if (st->nrc + 2 > st->caprc) {
		int cap = 2 * st->caprc;
		nghttp2_rcbuf **r = xmalloc((size_t)cap * sizeof(*r));
		memcpy(r, st->rc, (size_t)st->nrc * sizeof(*r));
		if (st->rc != st->rc_in)
			free(st->rc);
		st->rc = r;
		st->caprc = cap;
	}
	nghttp2_rcbuf_incref(a);
	nghttp2_rcbuf_incref(b);
	st->rc[st->nrc++] = a;
	st->rc[st->nrc++] = b;
}

/* A field of the request's trailers (check_field passed it: no pseudo-field, no
 * connection-specific one). Kept, up to max_header_bytes as a head is, for an HTTP/2
 * upstream; past that the rest is dropped. */
static void keep_request_trailer(struct h2_session *s, struct h2_client_stream *st,
                                 nghttp2_rcbuf *name, nghttp2_rcbuf *value)
{
	nghttp2_vec nv = nghttp2_rcbuf_get_buf(name), vv = nghttp2_rcbuf_get_buf(value);
	st->req_trailer_bytes += nv.len + vv.len + 32;
	if (st->req_trailer_bytes > (size_t)s->lcfg->limits.max_header_bytes ||
	    st->nreq_trailers >= HTTP_MAX_HEADERS)
		return;
	if (!st->req_trailers)
		st->req_trailers = loop_buf_get(s->loop);
	uint32_t lens[2] = { (uint32_t)nv.len, (uint32_t)vv.len };
	evbuffer_add(st->req_trailers, lens, sizeof(lens));
	evbuffer_add(st->req_trailers, nv.base, nv.len);
	evbuffer_add(st->req_trailers, vv.base, vv.len);
	st->nreq_trailers++;
}

static int header_cb(nghttp2_session *ng, const nghttp2_frame *frame, nghttp2_rcbuf *name,
                     nghttp2_rcbuf *value, uint8_t flags, void *arg)
{
	struct h2_session *s = arg;
	MAGIC_CHECK(s, H2CL_SESSION_MAGIC);
	struct h2_client_stream *st = h2cl_stream_of(s, frame->hd.stream_id);
	if (!st || st->malformed || st->refused)
		return 0;
	nghttp2_vec nv = nghttp2_rcbuf_get_buf(name), vv = nghttp2_rcbuf_get_buf(value);
	const char *n = (const char *)nv.base, *v = (const char *)vv.base;
	size_t nl = nv.len, vl = vv.len;
	if (!check_field(st, n, nl, v, vl, st->head_done)) {
		st->malformed = true;   /* a head's is reset once it is complete (stream_start) */
		if (st->head_done)
			stream_malformed(st, "malformed trailer field");
		return 0;
	}
	if (st->head_done) {
		keep_request_trailer(s, st, name, value);
		return 0;
	}
	st->list_bytes += nl + vl + 32;
	if (st->list_bytes > (size_t)s->lcfg->limits.max_header_bytes)
		refuse_head(st, 431, "headers-too-large");
	if (nl > 0 && n[0] == ':') {
		if (nl == 7 && memcmp(n, ":method", 7) == 0) {
			if (vl >= sizeof(st->head.method)) {
				refuse_head(st, 501, "not-implemented");
				return 0;
			}
			memcpy(st->head.method, v, vl);
			st->head.method[vl] = 0;
			if (strcmp(st->head.method, "CONNECT") == 0)
				refuse_head(st, 501, "not-implemented");
		} else if (nl == 5 && memcmp(n, ":path", 5) == 0) {
			if (vl > (size_t)s->lcfg->limits.max_uri_bytes) {
				refuse_head(st, 414, "uri-too-long");
				return 0;
			}
			if (st->oversize)
				return 0;
			keep(st, name, value);
			st->head.path = v;
			st->head.path_len = vl;
		} else if (nl == 10 && memcmp(n, ":authority", 10) == 0 && !st->oversize) {
			keep(st, name, value);
			st->authority = v;
			st->alen = vl;
			check_host(st);
		}
		return 0;
	}
	if (nl == 4 && memcmp(n, "host", 4) == 0) {
		if (st->host_kept) {
			st->malformed = true;
			return 0;
		}
		if (!st->oversize) {
			keep(st, name, value);
			st->hosthdr = v;
			st->hlen = vl;
			st->host_kept = true;
			check_host(st);
		}
		return 0;
	}
	if (nl == 8 && memcmp(n, "priority", 8) == 0)
		note_priority(st, v, vl);
	if (nl == 12 && memcmp(n, "content-type", 12) == 0 && grpc_content_type(v, vl))
		st->grpc = true;        /* noted even in an oversized head: the refusal is gRPC */
	if (nl == 14 && memcmp(n, "content-length", 14) == 0) {
		int64_t cl = h2f_parse_length(v, vl);
		if (cl < 0 || (st->head.content_length >= 0 && st->head.content_length != cl))
			st->malformed = true;
		st->head.content_length = cl;
	}
	if (st->oversize)
		return 0;
	if (nl == 6 && memcmp(n, "cookie", 6) == 0) {
		st->cookie = xrealloc(st->cookie, st->cookie_len + 2 + vl + 1);
		if (st->cookie_len > 0) {
			memcpy(st->cookie + st->cookie_len, "; ", 2);
			st->cookie_len += 2;
		}
		memcpy(st->cookie + st->cookie_len, v, vl);
		st->cookie_len += vl;
		return 0;
	}
	if (st->head.nhdrs >= HTTP_MAX_HEADERS) {
		refuse_head(st, 431, "headers-too-large");
		return 0;
	}
	keep(st, name, value);
	*hdr_slot(st) = (struct http_hdr){
		.name = n, .nlen = (uint32_t)nl, .value = v, .vlen = (uint32_t)vl,
		.hop = h2cl_connection_field(n, nl),
	};
	return 0;
}

static int frame_recv_cb(nghttp2_session *ng, const nghttp2_frame *frame, void *arg)
{
	struct h2_session *s = arg;
	MAGIC_CHECK(s, H2CL_SESSION_MAGIC);
	if (frame->hd.type == NGHTTP2_SETTINGS && (frame->hd.flags & NGHTTP2_FLAG_ACK) &&
	    s->settings_unacked > 0 && --s->settings_unacked == 0)
		s->max_streams = s->streams_advertised;     /* all we said is known: enforce it */
	struct h2_client_stream *st =
		frame->hd.stream_id ? h2cl_stream_of(s, frame->hd.stream_id) : NULL;
	if (!st)
		return 0;
	switch (frame->hd.type) {
	case NGHTTP2_HEADERS:
		if (frame->hd.flags & NGHTTP2_FLAG_END_STREAM)
			st->req_end = true;
		if (!st->head_done) {
			stream_start(st);
		} else if (!(frame->hd.flags & NGHTTP2_FLAG_END_STREAM)) {
			/* trailers end the stream, or are not trailers (RFC 9113 §8.1) */
			if (!st->malformed) {
				st->malformed = true;
				stream_malformed(st, "trailers without END_STREAM");
			}
		} else {
			body_end_check(st);
		}
		break;
	case NGHTTP2_DATA:
		if (frame->hd.flags & NGHTTP2_FLAG_END_STREAM) {
			st->req_end = true;
			body_end_check(st);
		}
		break;
	case NGHTTP2_RST_STREAM:
		st->client_reset = true;
		break;
	default:
		break;
	}
	return 0;
}

static int data_chunk_cb(nghttp2_session *ng, uint8_t flags, int32_t id, const uint8_t *data,
                         size_t len, void *arg)
{
	struct h2_session *s = arg;
	MAGIC_CHECK(s, H2CL_SESSION_MAGIC);
	struct h2_client_stream *st = h2cl_stream_of(s, id);
	if (st && !st->malformed && !st->refused) {
		st->req_bytes += len;
		if (st->head.content_length >= 0 && st->req_bytes > (uint64_t)st->head.content_length) {
			st->malformed = true;
			stream_malformed(st, "DATA beyond content-length");
		}
	}
	if (!st || st->ex_done || !st->ex) {
		nghttp2_session_consume(ng, id, len);
		return 0;
	}
	if (!st->req_in)
		st->req_in = loop_buf_get(s->loop);
	evbuffer_add(st->req_in, data, len);
	return 0;
}

void h2cl_request_callbacks(nghttp2_session_callbacks *cbs)
{
	nghttp2_session_callbacks_set_on_begin_headers_callback(cbs, begin_headers_cb);
	nghttp2_session_callbacks_set_on_header_callback2(cbs, header_cb);
	nghttp2_session_callbacks_set_on_frame_recv_callback(cbs, frame_recv_cb);
	nghttp2_session_callbacks_set_on_data_chunk_recv_callback(cbs, data_chunk_cb);
}
