/*
 * reqbody: buffered for replay or streamed to the attempt (see reqbody.h).
 */
#include <event2/buffer.h>

#include "upstream/attempt.h"
#include "base/loop.h"
#include "proxy/reqbody.h"

#define STREAM_HIGH (256 * 1024)    /* upstream output above this: stop reading the client */
#define BUFFER_STEP (64 * 1024)     /* what a buffering body takes per read */

/* Append a copy of SRC to DST, extent by extent (SRC untouched, not made contiguous). */
static void copy_into(struct evbuffer *dst, struct evbuffer *src)
{
	struct evbuffer_iovec v[8];
	/* one extent (a gRPC call's message, most often): copied without walking positions */
	if (evbuffer_peek(src, -1, NULL, v, 2) == 1) {
		evbuffer_add(dst, v[0].iov_base, v[0].iov_len);
		return;
	}
	struct evbuffer_ptr at;
	evbuffer_ptr_set(src, &at, 0, EVBUFFER_PTR_SET);
	size_t left = evbuffer_get_length(src);
	while (left > 0) {
		int n = evbuffer_peek(src, (ev_ssize_t)left, &at, v, 8);
		if (n <= 0)
			break;
		size_t got = 0;
		for (int i = 0; i < n && i < 8; i++) {
			size_t len = v[i].iov_len < left - got ? v[i].iov_len : left - got;
			evbuffer_add(dst, v[i].iov_base, len);
			got += len;
		}
		left -= got;
		evbuffer_ptr_set(src, &at, got, EVBUFFER_PTR_ADD);
	}
}

void reqbody_init(struct reqbody *b, struct evbuffer *buf, bool present, enum body_mode mode)
{
	b->mode = present ? mode : BODY_NONE;
	b->buf = buf;
	b->len = 0;
	b->present = present;
	b->done = !present;
}

enum reqbody_event reqbody_take(struct reqbody *b, struct evbuffer *data, int64_t limit,
                                int64_t keep_max, bool strict, struct attempt *to)
{
	size_t n = evbuffer_get_length(data);
	b->len += (int64_t)n;
	if (limit > 0 && b->len > limit) {
		evbuffer_drain(data, n);
		return RB_OVER_LIMIT;
	}
	if (b->mode == BODY_BUFFER) {
		loop_buf_hold(b->buf, data);
		if (b->len <= keep_max)
			return RB_TAKEN;
		if (strict)
			return RB_OVER_LIMIT;
		b->mode = BODY_STREAM;  /* a chunked body outgrew replay: it will never be re-sent */
		return RB_OUTGREW;
	}
	if (b->mode == BODY_TEE) {
		if (b->len > keep_max) {
			/* outgrew replay: from now on it only streams (without an attempt in flight,
			 * all of it waits in BUF for the next one) */
			b->mode = BODY_STREAM;
			if (!to) {
				loop_buf_hold(b->buf, data);
				return RB_TAKEN;
			}
			evbuffer_drain(b->buf, evbuffer_get_length(b->buf));
		} else {
			copy_into(b->buf, data);        /* the replay copy */
			if (!to) {
				evbuffer_drain(data, n);
				return RB_TAKEN;
			}
		}
	}
	if ((b->mode == BODY_STREAM || b->mode == BODY_TEE) && to)
		attempt_send_body(to, data);
	else
		evbuffer_drain(data, n);
	return RB_TAKEN;
}

void reqbody_end(struct reqbody *b, struct attempt *to)
{
	b->done = true;
	if ((b->mode == BODY_STREAM || b->mode == BODY_TEE) && to)
		attempt_send_body_end(to);
}

void reqbody_stream_to(struct reqbody *b, struct attempt *to)
{
	if (b->mode == BODY_TEE) {
		/* a replay: a copy of everything so far, the rest as it comes */
		if (evbuffer_get_length(b->buf) > 0) {
			struct evbuffer *copy = evbuffer_new();
			copy_into(copy, b->buf);
			attempt_send_body(to, copy);
			evbuffer_free(copy);
		}
		if (b->done)
			attempt_send_body_end(to);
		return;
	}
	if (b->mode != BODY_STREAM)
		return;
	if (evbuffer_get_length(b->buf) > 0)
		attempt_send_body(to, b->buf);
	if (b->done)
		attempt_send_body_end(to);
}

size_t reqbody_room(const struct reqbody *b, const struct attempt *to)
{
	if (b->mode != BODY_STREAM && b->mode != BODY_TEE)
		return BUFFER_STEP;
	if (!to)
		return 0;
	size_t pending = attempt_send_pending(to);
	return pending < STREAM_HIGH ? STREAM_HIGH - pending : 0;
}
