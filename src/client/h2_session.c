/*
 * h2_session: one HTTP/2 client connection (see h2_session.h): an nghttp2 server session fed
 * from the stream's input and writing to its output, one exchange per stream; the connection's
 * side of it here (the send path, stream ends, defences, timers, drain, close), the request
 * intake in h2_request.c, the HTTP/2 responder the exchanges answer through in h2_responder.c.
 *
 *   H2CL_OPEN --drain--> H2CL_DRAINING (shutdown notice, then the final GOAWAY) --+
 *     |                    no stream left, or a defence / error / EOF -----------+--> H2CL_CLOSING
 *     +-------------------------------------------------------------------------+       (flush)
 *                                                                                 --> H2CL_CLOSED
 *
 * Flow control both ways (DESIGN rule 4): request DATA is consumed (WINDOW_UPDATE) only as the
 * exchange takes it, so a slow upstream stalls its client's stream; response DATA waits in a
 * per-stream buffer that nghttp2 pulls from as the client's window allows, and the exchange
 * sees that buffer through queued() and pauses a fast upstream. Everything that runs nghttp2
 * (recv, send, consume) runs from a clean stack: the read callback, the write callback, or the
 * send event that responder calls schedule; responder calls only submit and schedule.
 *
 * The top of the codec's files (h2_session_impl.h): this file calls into h2_request.c and
 * the core; nothing in the codec calls it back but through nghttp2's callbacks and events.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/queue.h>

#include <event2/buffer.h>
#include <event2/event.h>
#include <nghttp2/nghttp2.h>

#include "base/clock.h"
#include "config/config.h"
#include "proxy/exchange.h"
#include "client/h2_guard.h"
#include "base/h2_mem.h"
#include "client/h2_session.h"
#include "client/h2_session_impl.h"
#include "base/log.h"
#include "base/loop.h"
#include "obs/stats.h"
#include "net/stream.h"
#include "state/runtime.h"
#include "base/util.h"

static void flush(struct h2_session *s);

/* The one writer of s's state (DESIGN rule 2). */
DEFINE_STATE_SETTER(set_state, h2_session, h2cl_state, H2CL_CLOSED)

static const char *const defence_name[] = {
#define X_NAME(id, value) [id] = value,
	H2ERR_VALUES(X_NAME)
#undef X_NAME
};

/* SPEC §9: counted per event, logged once per connection and kind. */
static void defence(struct h2_session *s, int kind, const char *detail)
{
	STAT_INC(g_gstats[s->loop->id].h2_errors[kind]);
	if (s->logged & (1u << kind))
		return;
	s->logged |= 1u << kind;
	slog(LOG_INFO, s->id, "http2 %s: %s", defence_name[kind], detail);
}

/* ------------------------------------------------------------------ streams */

static void stream_free_cb(void *p)
{
	struct h2_client_stream *st = p;
	st->magic = 0;
	loop_obj_put(st->loop, LOOP_H2_STREAM, st);
}

/* The stream is gone (closed by nghttp2, or the connection closes): its exchange, if still
 * running, is cancelled (SPEC §3: the attempt's connection closed, its slot released). */
static void stream_destroy(struct h2_client_stream *st)
{
	struct h2_session *s = st->s;
	if (st->ex) {
		exchange_free(st->ex);
		st->ex = NULL;
	}
	if (s->last == st)
		s->last = NULL;
	if (st->rst_after)
		s->nrst_after--;
	h2cl_resp_count(s, 0, evbuffer_get_length(st->resp));
	TAILQ_REMOVE(&s->streams, st, link);
	s->nstreams--;
	h2cl_head_release(st);
	free(st->cookie);
	loop_blk_free(s->loop, st->head_blk);
	loop_blk_free(s->loop, st->trailers);
	st->head_blk = NULL;
	st->trailers = NULL;
	loop_buf_put(s->loop, st->req_in);
	loop_buf_put(s->loop, st->resp);
	loop_buf_put(s->loop, st->req_trailers);
	st->req_in = st->resp = NULL;
	loop_defer_free(s->loop, stream_free_cb, st);
}

/* ------------------------------------------------------------------ nghttp2 callbacks */

/* nghttp2 makes a stream beyond the SETTINGS_MAX_CONCURRENT_STREAMS it sent a connection
 * error; SPEC §9 wants REFUSED_STREAM. So nghttp2 is told a limit it never reaches and each
 * SETTINGS frame of ours is rewritten on its way out to advertise ours (h2_request.c's
 * begin_headers_cb refuses the streams beyond it). */
#define NG_STREAM_LIMIT 0x7fffffffu

/* A SETTINGS frame of ours (not an ACK) that still has to be patched: frames reach send_cb
 * whole (nghttp2 hands over a frame's bytes at once, and send_cb takes all or none). */
static bool settings_to_patch(const struct h2_session *s, const uint8_t *f, size_t len)
{
	return s->settings_to_patch > 0 && len >= 9 && f[3] == NGHTTP2_SETTINGS &&
	       !(f[4] & NGHTTP2_FLAG_ACK);
}

static void advertise_limit(struct h2_session *s, uint8_t *f, size_t len)
{
	s->settings_to_patch--;
	size_t plen = ((size_t)f[0] << 16) | ((size_t)f[1] << 8) | f[2];
	uint32_t max = s->streams_advertised;
	for (size_t i = 9; i + 6 <= 9 + plen && i + 6 <= len; i += 6) {
		if (f[i] == 0 && f[i + 1] == NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS) {
			f[i + 2] = (uint8_t)(max >> 24);
			f[i + 3] = (uint8_t)(max >> 16);
			f[i + 4] = (uint8_t)(max >> 8);
			f[i + 5] = (uint8_t)max;
		}
	}
}

/* The frames gathered so far go to the output, in order. */
static void stage_flush(struct h2_session *s)
{
	if (s->staged > 0 && s->strm) {
		evbuffer_add(stream_output(s->strm), s->stage, s->staged);
		s->staged = 0;
	}
}

/* nghttp2_session_send with its frames gathered on the stack and appended once: an append
 * costs more than the copy (the output's callback, a chain per small piece when it waits),
 * and a round sends a few frames per stream. Small DATA joins the stage; larger DATA flushes
 * it first (the order holds) and moves its chains. */
#define STAGE_BYTES 8192
#define STAGE_SMALL_DATA 1024           /* DATA up to this is copied into the stage too */
static int session_send(struct h2_session *s)
{
	uint8_t buf[STAGE_BYTES];
	s->stage = buf;
	s->staged = 0;
	s->stagecap = sizeof(buf);
	int rv = nghttp2_session_send(s->ng);
	stage_flush(s);
	s->stage = NULL;
	s->stagecap = 0;
	return rv;
}

static ssize_t send_cb(nghttp2_session *ng, const uint8_t *data, size_t len, int flags,
                       void *arg)
{
	struct h2_session *s = arg;
	MAGIC_CHECK(s, H2CL_SESSION_MAGIC);
	struct evbuffer *out = stream_output(s->strm);
	if (evbuffer_get_length(out) + s->staged >= OUT_HIGH)
		return NGHTTP2_ERR_WOULDBLOCK;
	bool patch = settings_to_patch(s, data, len);
	if (s->stage && !patch) {
		if (s->staged + len > s->stagecap)
			stage_flush(s);
		if (len <= s->stagecap) {
			memcpy(s->stage + s->staged, data, len);
			s->staged += len;
			return (ssize_t)len;
		}
	}
	stage_flush(s);
	if (patch) {
		struct evbuffer_iovec v;
		if (evbuffer_reserve_space(out, (ev_ssize_t)len, &v, 1) < 1)
			return NGHTTP2_ERR_CALLBACK_FAILURE;
		memcpy(v.iov_base, data, len);
		advertise_limit(s, v.iov_base, len);
		v.iov_len = len;
		evbuffer_commit_space(out, &v, 1);
		return (ssize_t)len;
	}
	evbuffer_add(out, data, len);
	return (ssize_t)len;
}

static int send_data_cb(nghttp2_session *ng, nghttp2_frame *frame, const uint8_t *framehd,
                        size_t length, nghttp2_data_source *src, void *arg)
{
	struct h2_session *s = arg;
	MAGIC_CHECK(s, H2CL_SESSION_MAGIC);
	struct h2_client_stream *st = src->ptr;
	MAGIC_CHECK(st, H2CL_STREAM_MAGIC);
	struct evbuffer *out = stream_output(s->strm);
	if (evbuffer_get_length(out) + s->staged >= OUT_HIGH)
		return NGHTTP2_ERR_WOULDBLOCK;
	if (s->stage && length <= STAGE_SMALL_DATA) {
		/* a small frame is copied into the stage with the frames around it */
		if (s->staged + 9 + length > s->stagecap)
			stage_flush(s);
		memcpy(s->stage + s->staged, framehd, 9);
		if (length > 0)
			evbuffer_remove(st->resp, s->stage + s->staged + 9, length);
		s->staged += 9 + length;
	} else {
		/* a large one moves its chains: no copy */
		stage_flush(s);
		evbuffer_add(out, framehd, 9);
		evbuffer_remove_buffer(st->resp, out, length);
	}
	h2cl_resp_count(s, 0, length);
	if (length > 0)
		s->last_progress_us = clock_now_us();
	if (st->was_high && evbuffer_get_length(st->resp) < RESP_LOW) {
		st->was_high = false;
		st->drained = true;
	}
	return 0;
}

static int frame_send_cb(nghttp2_session *ng, const nghttp2_frame *frame, void *arg)
{
	struct h2_session *s = arg;
	MAGIC_CHECK(s, H2CL_SESSION_MAGIC);
	if (frame->hd.type == NGHTTP2_RST_STREAM) {
		if (frame->rst_stream.error_code == NGHTTP2_REFUSED_STREAM)
			defence(s, H2E_REFUSED, "stream beyond max_concurrent_streams refused");
		else if (frame->rst_stream.error_code == NGHTTP2_PROTOCOL_ERROR)
			defence(s, H2E_MALFORMED, "malformed request: stream reset");
		return 0;
	}
	if (frame->hd.type == NGHTTP2_DATA)
		h2_guard_data_sent(&s->guard, 1);
	/* nrst_after: no stream lookup for the last frame of every response when none waits */
	if (s->nrst_after > 0 &&
	    (frame->hd.type == NGHTTP2_DATA || frame->hd.type == NGHTTP2_HEADERS) &&
	    (frame->hd.flags & NGHTTP2_FLAG_END_STREAM)) {
		struct h2_client_stream *st = h2cl_stream_of(s, frame->hd.stream_id);
		if (st && st->rst_after && !st->req_end)
			nghttp2_submit_rst_stream(ng, NGHTTP2_FLAG_NONE, st->id, NGHTTP2_NO_ERROR);
	}
	return 0;
}

static void terminate(struct h2_session *s, uint32_t code)
{
	nghttp2_session_terminate_session(s->ng, code);
	if (s->state == H2CL_OPEN || s->state == H2CL_DRAINING)
		set_state(s, H2CL_CLOSING);
}

/* Never a fatal error from here (issue 12): the stream is gone, the connection goes on. */
static int stream_close_cb(nghttp2_session *ng, int32_t id, uint32_t code, void *arg)
{
	struct h2_session *s = arg;
	MAGIC_CHECK(s, H2CL_SESSION_MAGIC);
	struct h2_client_stream *st = h2cl_stream_of(s, id);
	if (!st)
		return 0;
	nghttp2_session_set_stream_user_data(ng, id, NULL);
	size_t left = h2cl_req_pending(st);
	if (left > 0)
		nghttp2_session_consume_connection(ng, left);
	bool early = st->client_reset && !st->head_sent;
	bool by_us = code != NGHTTP2_NO_ERROR && !st->client_reset;
	stream_destroy(st);
	if (h2_guard_stream_closed(&s->guard, (uint32_t)id, early, by_us) &&
	    s->state < H2CL_CLOSING) {
		defence(s, H2E_RAPID_RESET, "most streams reset by the client before a response");
		terminate(s, NGHTTP2_ENHANCE_YOUR_CALM);
	}
	return 0;
}

/* ------------------------------------------------------------------ connection */

static void session_free_cb(void *p)
{
	struct h2_session *s = p;
	s->magic = 0;
	free(s->lname);
	free(s->nv);
	free(s->names);
	free(s);
}

void h2_session_close(struct h2_session *s, const char *why)
{
	if (s->state == H2CL_CLOSED)
		return;
	set_state(s, H2CL_CLOSED);
	slog(LOG_DEBUG, s->id, "close: %s", why);
	struct h2_client_stream *st;
	while ((st = TAILQ_FIRST(&s->streams))) {
		nghttp2_session_set_stream_user_data(s->ng, st->id, NULL);
		stream_destroy(st);     /* cancels its exchange */
	}
	nghttp2_session_del(s->ng);     /* after the rcbufs went back: they use its allocator */
	s->ng = NULL;
	stream_free(s->strm);
	s->strm = NULL;
	event_free(s->send_ev);
	event_free(s->idle_ev);
	event_free(s->hdr_ev);
	event_free(s->stall_ev);
	evbuffer_free(s->tmp);
	runtime_unref(s->rt);
	s->rt = NULL;
	loop_defer_free(s->loop, session_free_cb, s);
	s->own.on_closed(s->own.closed_arg);
}

static void arm(struct event *ev, int64_t us)
{
	struct timeval tv = clock_tv(us > 0 ? us : 0);
	evtimer_add(ev, &tv);
}

/* Timers follow the state after every round: idle (no stream open), header block open,
 * response bytes waiting (stall). A stream that opened and ended within the round (one
 * retrygate answered itself) restarts the idle count as any stream does. */
static void timers(struct h2_session *s)
{
	const struct cfg_limits *lim = &s->lcfg->limits;
	if (s->nstreams == 0) {
		if (s->stream_seen || !evtimer_pending(s->idle_ev, NULL))
			arm(s->idle_ev, lim->idle_timeout_us);
	} else {
		evtimer_del(s->idle_ev);
	}
	s->stream_seen = false;
	int64_t since;
	if (h2_guard_block_open(&s->guard, &since)) {
		if (!evtimer_pending(s->hdr_ev, NULL))
			arm(s->hdr_ev, since + lim->header_timeout_us - clock_now_us());
	} else {
		evtimer_del(s->hdr_ev);
	}
	if (s->resp_pending > 0 && !evtimer_pending(s->stall_ev, NULL))
		arm(s->stall_ev, lim->idle_timeout_us);
}

/* One round: request bodies to their exchanges, frames out, timers, the end. */
static void flush(struct h2_session *s)
{
	struct h2_client_stream *st, *next;
	if (s->state == H2CL_CLOSED)
		return;
	for (st = TAILQ_FIRST(&s->streams); st && s->state < H2CL_CLOSING; st = next) {
		next = TAILQ_NEXT(st, link);
		h2cl_stream_pump(s, st);
	}
	int rv = session_send(s);
	if (rv != 0) {
		slog(LOG_INFO, s->id, "http2: %s", nghttp2_strerror(rv));
		h2_session_close(s, "nghttp2 send error");
		return;
	}
	TAILQ_FOREACH(st, &s->streams, link) {
		if (st->drained || (st->budget_wait && !h2cl_resp_full(s))) {
			st->drained = false;
			st->budget_wait = false;
			if (st->ex && !st->ex_done)
				exchange_client_drained(st->ex);
		}
	}
	if (s->state == H2CL_DRAINING && s->goaway_final && s->nstreams == 0)
		set_state(s, H2CL_CLOSING);
	if (!nghttp2_session_want_read(s->ng) && !nghttp2_session_want_write(s->ng) &&
	    s->state < H2CL_CLOSING)
		set_state(s, H2CL_CLOSING);
	if (s->state == H2CL_CLOSING) {
		/* the GOAWAY (if any) is in the output: close once it left */
		stream_disable(s->strm, EV_READ);
		if (evbuffer_get_length(stream_output(s->strm)) == 0)
			h2_session_close(s, "done");
		return;
	}
	timers(s);
}

static void send_ev_cb(evutil_socket_t fd, short what, void *arg)
{
	struct h2_session *s = arg;
	MAGIC_CHECK(s, H2CL_SESSION_MAGIC);
	s->send_pending = false;
	flush(s);
}

/* The frame guard ended the connection: count, log once, GOAWAY with the RFC's code. */
static void guard_verdict(struct h2_session *s, enum h2g_verdict g)
{
	switch (g) {
	case H2G_FLOOD:
		defence(s, H2E_FLOOD, "control or empty DATA frames over the limit in 10 s");
		terminate(s, NGHTTP2_ENHANCE_YOUR_CALM);
		break;
	case H2G_HEADER_BLOCK:
		defence(s, H2E_HEADER_BLOCK, "header block over twice max_header_bytes");
		terminate(s, NGHTTP2_ENHANCE_YOUR_CALM);
		break;
	case H2G_PROTOCOL:
		defence(s, H2E_MALFORMED, "HEADERS on an unexpected stream id, or PRIORITY on stream 0");
		terminate(s, NGHTTP2_PROTOCOL_ERROR);
		break;
	case H2G_STREAM_CLOSED:
	case H2G_OK:
		defence(s, H2E_MALFORMED, "frames on closed streams");
		terminate(s, NGHTTP2_STREAM_CLOSED);
		break;
	}
}

/* Replies (ACKs, RST_STREAMs, HEADERS) wait inside nghttp2 behind an output at its high-water
 * mark. DATA alone does not count: it waits in its stream, bounded by the response budget. */
static bool replies_wait(struct h2_session *s)
{
	return evbuffer_get_length(stream_output(s->strm)) >= OUT_HIGH &&
	       nghttp2_session_get_outbound_queue_size(s->ng) > 0;
}

static void read_cb(struct stream *strm, void *arg)
{
	struct h2_session *s = arg;
	MAGIC_CHECK(s, H2CL_SESSION_MAGIC);
	struct evbuffer *in = stream_input(strm);
	while (s->state < H2CL_CLOSING && evbuffer_get_length(in) > 0) {
		if (replies_wait(s)) {
			/* the client sends faster than it reads our replies: read no more of it
			 * until the output drains (write_cb); the kernel's buffers hold the rest */
			s->read_paused = true;
			stream_disable(strm, EV_READ);
			break;
		}
		struct evbuffer_iovec v;
		if (evbuffer_peek(in, -1, NULL, &v, 1) < 1)
			break;
		if (v.iov_len > RECV_SLICE)
			v.iov_len = RECV_SLICE;
		enum h2g_verdict g = h2_guard_feed(&s->guard, v.iov_base, v.iov_len, clock_now_us());
		if (g != H2G_OK) {
			guard_verdict(s, g);
			break;
		}
		for (uint32_t sid; h2_guard_take_reset(&s->guard, &sid);)
			nghttp2_submit_rst_stream(s->ng, NGHTTP2_FLAG_NONE, (int32_t)sid,
			                          NGHTTP2_STREAM_CLOSED);
		ssize_t n = nghttp2_session_mem_recv(s->ng, v.iov_base, v.iov_len);
		if (n < 0) {
			if (n == NGHTTP2_ERR_FLOODED) {
				/* replies the client does not read piled up past nghttp2's bound */
				defence(s, H2E_FLOOD, "nghttp2: flooding detected");
				terminate(s, NGHTTP2_ENHANCE_YOUR_CALM);
			} else if (n == NGHTTP2_ERR_TOO_MANY_CONTINUATIONS) {
				/* nghttp2's own CONTINUATION count (CVE-2024-28182) can stop a
				 * block of many small frames before the guard's byte count does,
				 * when they arrive one read at a time: the same defence (SPEC §9) */
				defence(s, H2E_HEADER_BLOCK, "header block: too many CONTINUATION frames");
				terminate(s, NGHTTP2_ENHANCE_YOUR_CALM);
			} else {
				defence(s, H2E_MALFORMED, nghttp2_strerror((int)n));
			}
			if (s->state < H2CL_CLOSING)
				set_state(s, H2CL_CLOSING);
			break;
		}
		evbuffer_drain(in, (size_t)n);
		/* replies (SETTINGS and PING ACKs) leave as they are due, before more is read:
		 * nghttp2 bounds how many may wait */
		if (session_send(s) != 0) {
			set_state(s, H2CL_CLOSING);
			break;
		}
	}
	if (s->state >= H2CL_CLOSING)
		evbuffer_drain(in, evbuffer_get_length(in));
	flush(s);
}

static void write_cb(struct stream *strm, void *arg)
{
	struct h2_session *s = arg;
	MAGIC_CHECK(s, H2CL_SESSION_MAGIC);
	flush(s);
	if (s->read_paused && s->state < H2CL_CLOSING && !replies_wait(s)) {
		s->read_paused = false;
		stream_enable(strm, EV_READ);
		stream_trigger_read(strm);      /* what waited in the input */
	}
}

static void event_cb(struct stream *strm, short what, void *arg)
{
	struct h2_session *s = arg;
	MAGIC_CHECK(s, H2CL_SESSION_MAGIC);
	if (what & BEV_EVENT_CONNECTED)
		return;
	if (what & BEV_EVENT_TIMEOUT) {
		defence(s, H2E_STALLED, "client stopped reading");
		h2_session_close(s, "write timeout");
		return;
	}
	h2_session_close(s, (what & BEV_EVENT_EOF) ? "client closed" : "client error");
}

/* A connection defence met: count it, GOAWAY with CODE, close once that left. */
static void defend_and_end(struct h2_session *s, int kind, const char *detail, uint32_t code)
{
	defence(s, kind, detail);
	terminate(s, code);
	flush(s);
}

static void idle_cb(evutil_socket_t fd, short what, void *arg)
{
	struct h2_session *s = arg;
	MAGIC_CHECK(s, H2CL_SESSION_MAGIC);
	if (s->nstreams == 0 && s->state < H2CL_CLOSING)
		defend_and_end(s, H2E_IDLE, "no stream for idle_timeout", NGHTTP2_NO_ERROR);
}

static void hdr_cb(evutil_socket_t fd, short what, void *arg)
{
	struct h2_session *s = arg;
	MAGIC_CHECK(s, H2CL_SESSION_MAGIC);
	if (s->state < H2CL_CLOSING && h2_guard_block_open(&s->guard, NULL))
		defend_and_end(s, H2E_HEADER_BLOCK, "header block not complete within header_timeout",
		               NGHTTP2_ENHANCE_YOUR_CALM);
}

/* SPEC §9: a client that keeps its window shut is closed after idle_timeout with no DATA
 * byte written. */
static void stall_cb(evutil_socket_t fd, short what, void *arg)
{
	struct h2_session *s = arg;
	MAGIC_CHECK(s, H2CL_SESSION_MAGIC);
	if (s->state == H2CL_CLOSED || s->resp_pending == 0)
		return;
	int64_t idle = s->lcfg->limits.idle_timeout_us, now = clock_now_us();
	if (now - s->last_progress_us < idle) {
		arm(s->stall_ev, s->last_progress_us + idle - now);
		return;
	}
	defence(s, H2E_STALLED, "no window for idle_timeout");
	h2_session_close(s, "stalled");
}

struct h2_session *h2_session_new(struct loop *loop, const struct session_owner *own,
                                  const struct h2_handoff *h)
{
	struct h2_session *s = xcalloc(1, sizeof(*s));
	s->magic = H2CL_SESSION_MAGIC;
	s->loop = loop;
	s->own = *own;
	s->lname = xstrdup(h->lname);
	s->id = h->sid;
	s->tls = h->tls;
	s->strm = h->strm;
	snprintf(s->peer_ip, sizeof(s->peer_ip), "%s", h->peer_ip);
	TAILQ_INIT(&s->streams);
	s->rt = runtime_ref(own->runtime(own->runtime_arg));
	s->lcfg = config_listener(s->rt->cfg, s->lname);
	s->send_ev = event_new(loop->base, -1, 0, send_ev_cb, s);
	s->idle_ev = evtimer_new(loop->base, idle_cb, s);
	s->hdr_ev = evtimer_new(loop->base, hdr_cb, s);
	s->stall_ev = evtimer_new(loop->base, stall_cb, s);
	s->tmp = evbuffer_new();
	set_state(s, H2CL_OPEN);
	if (!s->lcfg) {
		h2_session_close(s, "listener no longer configured");
		return NULL;
	}
	const struct cfg_limits *lim = &s->lcfg->limits;
	h2_guard_init(&s->guard, (size_t)lim->max_header_bytes);
	s->max_streams = s->streams_advertised = (uint32_t)lim->max_concurrent_streams;
	s->settings_unacked = s->settings_to_patch = 1;     /* the first SETTINGS, below */

	nghttp2_session_callbacks *cbs;
	nghttp2_session_callbacks_new(&cbs);
	nghttp2_session_callbacks_set_send_callback(cbs, send_cb);
	nghttp2_session_callbacks_set_send_data_callback(cbs, send_data_cb);
	h2cl_request_callbacks(cbs);
	nghttp2_session_callbacks_set_on_frame_send_callback(cbs, frame_send_cb);
	nghttp2_session_callbacks_set_on_stream_close_callback(cbs, stream_close_cb);
	nghttp2_option *opt;
	nghttp2_option_new(&opt);
	nghttp2_option_set_no_auto_window_update(opt, 1);
	nghttp2_option_set_no_closed_streams(opt, 1);
	/* SPEC §9's malformed requests are checked once, by h2_request.c, which reads every
	 * field anyway: nghttp2's own checks cost ~230 instructions a field on top */
	nghttp2_option_set_no_http_messaging(opt, 1);
	nghttp2_mem mem = h2_mem(loop);
	nghttp2_session_server_new3(&s->ng, cbs, s, opt, &mem);
	nghttp2_option_del(opt);
	nghttp2_session_callbacks_del(cbs);

	nghttp2_settings_entry iv[] = {
		{ NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS, NG_STREAM_LIMIT },  /* see send_cb */
		{ NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE, STREAM_WINDOW },
		{ NGHTTP2_SETTINGS_MAX_HEADER_LIST_SIZE, (uint32_t)lim->max_header_bytes },
		{ NGHTTP2_SETTINGS_NO_RFC7540_PRIORITIES, 1 },
	};
	nghttp2_submit_settings(s->ng, NGHTTP2_FLAG_NONE, iv, sizeof(iv) / sizeof(iv[0]));
	nghttp2_session_set_local_window_size(s->ng, NGHTTP2_FLAG_NONE, 0, CONN_WINDOW);

	stream_setcb(s->strm, read_cb, write_cb, event_cb, s);
	stream_setwatermark(s->strm, EV_READ, 0, 256 * 1024);
	stream_setwatermark(s->strm, EV_WRITE, OUT_LOW, 0);
	stream_set_write_timeout(s->strm, lim->idle_timeout_us);
	stream_enable(s->strm, EV_READ | EV_WRITE);
	/* the preface (and more) may already be in the input: read it from the loop */
	stream_trigger_read(s->strm);
	h2cl_kick(s);
	return s;
}

/* CANCEL, on the streams and in the GOAWAY: retrygate abandons work it promised (the final
 * GOAWAY's last-stream-id covered these streams) on purpose, as its operator asked. Not
 * REFUSED_STREAM: the request may have been processed, a client must not take it as safe
 * to retry; not INTERNAL_ERROR: nothing failed, and gRPC clients read CANCEL as CANCELLED,
 * a call ended by the server's side without a verdict. */
void h2_session_expire(struct h2_session *s)
{
	if (s->state >= H2CL_CLOSING)
		return;
	struct h2_client_stream *st;
	TAILQ_FOREACH(st, &s->streams, link) {
		/* first: the reset the exchange's cut would submit finds this one queued */
		nghttp2_submit_rst_stream(s->ng, NGHTTP2_FLAG_NONE, st->id, NGHTTP2_CANCEL);
		if (st->ex && !st->ex_done)
			exchange_expire(st->ex);    /* its end() only marks the stream */
	}
	slog(LOG_DEBUG, s->id, "drain timeout: %d stream(s) reset", s->nstreams);
	/* the resets go out before the GOAWAY is queued: nghttp2 sends no RST_STREAM once it
	 * is terminating the session (from the worker's event: a clean stack) */
	if (session_send(s) != 0) {
		h2_session_close(s, "nghttp2 send error");
		return;
	}
	terminate(s, NGHTTP2_CANCEL);
	flush(s);
}

void h2_session_reconfigure(struct h2_session *s)
{
	if (s->state >= H2CL_CLOSING || !h2cl_refresh_config(s))
		return;
	uint32_t want = (uint32_t)s->lcfg->limits.max_concurrent_streams;
	if (want == s->streams_advertised)
		return;
	/* a higher limit holds at once (the client keeps to the lower one it knows); a lower
	 * one once the client acknowledged it: until then it may rightly open up to the old */
	s->streams_advertised = want;
	if (want > s->max_streams)
		s->max_streams = want;
	s->settings_unacked++;
	s->settings_to_patch++;
	nghttp2_settings_entry iv = { NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS, NG_STREAM_LIMIT };
	nghttp2_submit_settings(s->ng, NGHTTP2_FLAG_NONE, &iv, 1);
	h2cl_kick(s);
}

void h2_session_drain(struct h2_session *s, bool close_idle)
{
	if (s->state >= H2CL_CLOSING)
		return;
	int64_t now = clock_now_us();
	if (!s->notice_sent) {
		s->notice_sent = true;
		s->notice_us = now;
		set_state(s, H2CL_DRAINING);
		nghttp2_submit_shutdown_notice(s->ng);
	}
	if (!s->goaway_final && (close_idle || now - s->notice_us >= NOTICE_RTT_US)) {
		/* the last-stream-id covers every stream this connection will serve */
		s->goaway_final = true;
		nghttp2_submit_goaway(s->ng, NGHTTP2_FLAG_NONE,
		                      nghttp2_session_get_last_proc_stream_id(s->ng), NGHTTP2_NO_ERROR,
		                      NULL, 0);
	}
	h2cl_kick(s);
}
