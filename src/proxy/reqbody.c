/*
 * reqbody: buffered for replay or streamed to the attempt (see reqbody.h).
 */
#include <event2/buffer.h>

#include "upstream/attempt.h"
#include "base/loop.h"
#include "proxy/reqbody.h"

#define STREAM_HIGH (256 * 1024)    /* upstream output above this: stop reading the client */
#define BUFFER_STEP (64 * 1024)     /* what a buffering body takes per read */

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
		if (b->len <= keep_max) {
			/* kept for replay in BUF, which the attempts read where it is
			 * (reqbody_ref): an empty send tells the one in flight that it grew. The
			 * first piece (a unary call's one message) moves in whole; later ones are
			 * copied behind it, so memory held follows the bytes counted */
			if (evbuffer_get_length(b->buf) == 0)
				evbuffer_add_buffer(b->buf, data);
			else
				loop_buf_hold(b->buf, data);
			if (to)
				attempt_send_body(to, data);
			return RB_TAKEN;
		}
		/* outgrew replay: from now on it only streams. The attempt in flight reads
		 * the rest of BUF first, then what it is sent; without one, all of it waits in
		 * BUF for the next one */
		b->mode = BODY_STREAM;
		if (!to) {
			loop_buf_hold(b->buf, data);
			return RB_TAKEN;
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
		/* it reads BUF, everything so far and the rest as it comes (reqbody_ref) */
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

struct evbuffer *reqbody_ref(const struct reqbody *b)
{
	if (b->mode == BODY_TEE || (b->mode == BODY_BUFFER && b->len > 0))
		return b->buf;
	return NULL;
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
