/*
 * tunnel: a byte pipe between two bufferevents (see tunnel.h).
 *
 * Idle timeout: each read or write notes the time; one timer, armed for the idle timeout and
 * re-armed from the last activity when it fires early, so a busy tunnel costs no timer
 * operation per read.
 */
#include <stdbool.h>
#include <stdlib.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>

#include "base/clock.h"
#include "net/tunnel.h"
#include "net/stream.h"
#include "base/util.h"
#include "base/loop.h"

#define TUNNEL_HIGH (256 * 1024)

struct tunnel {
	struct loop *loop;
	struct stream *c, *u;
	void (*on_close)(void *);
	void *arg;
	bool ending, freed;
	struct event *idle_ev;
	int64_t idle_us, last_us;       /* the idle timeout; the last byte moved or written */
};

static struct stream *other(struct tunnel *t, struct stream *strm)
{
	return strm == t->c ? t->u : t->c;
}

static void end(struct tunnel *t)
{
	if (t->freed)
		return;
	t->on_close(t->arg);
}

static void move(struct tunnel *t, struct stream *from)
{
	struct stream *to = other(t, from);
	evbuffer_add_buffer(stream_output(to), stream_input(from));
	if (evbuffer_get_length(stream_output(to)) >= TUNNEL_HIGH) {
		stream_disable(from, EV_READ);
		stream_setwatermark(to, EV_WRITE, TUNNEL_HIGH / 2, 0);
	}
}

static void arm_idle(struct tunnel *t, int64_t us)
{
	struct timeval tv = clock_tv(us);
	evtimer_add(t->idle_ev, &tv);
}

static void idle_cb(evutil_socket_t fd, short what, void *arg)
{
	struct tunnel *t = arg;
	int64_t quiet = clock_now_us() - t->last_us;
	if (quiet < t->idle_us) {
		arm_idle(t, t->idle_us - quiet);
		return;
	}
	end(t);
}

static void read_cb(struct stream *strm, void *arg)
{
	struct tunnel *t = arg;
	t->last_us = clock_now_us();
	move(t, strm);
}

static void write_cb(struct stream *strm, void *arg)
{
	struct tunnel *t = arg;
	t->last_us = clock_now_us();
	if (t->ending) {
		if (evbuffer_get_length(stream_output(strm)) == 0)
			end(t);
		return;
	}
	stream_enable(other(t, strm), EV_READ);
}

static void event_cb(struct stream *strm, short what, void *arg)
{
	struct tunnel *t = arg;
	if (what & BEV_EVENT_CONNECTED)
		return;
	if (t->ending || (what & BEV_EVENT_ERROR)) {
		end(t);
		return;
	}
	/* EOF: flush what this side sent to the other, then close both */
	struct stream *to = other(t, strm);
	move(t, strm);
	t->ending = true;
	stream_disable(t->c, EV_READ);
	stream_disable(t->u, EV_READ);
	if (evbuffer_get_length(stream_output(to)) == 0) {
		end(t);
		return;
	}
	stream_setwatermark(to, EV_WRITE, 0, 0);
}

struct tunnel *tunnel_new(struct loop *loop, struct stream *client, struct stream *upstream,
                          int64_t idle_us, void (*on_close)(void *arg), void *arg)
{
	struct tunnel *t = xcalloc(1, sizeof(*t));
	t->loop = loop;
	t->c = client;
	t->u = upstream;
	t->on_close = on_close;
	t->arg = arg;
	t->idle_us = idle_us;
	t->last_us = clock_now_us();
	t->idle_ev = evtimer_new(loop->base, idle_cb, t);
	arm_idle(t, idle_us);
	stream_setcb(client, read_cb, write_cb, event_cb, t);
	stream_setcb(upstream, read_cb, write_cb, event_cb, t);
	stream_setwatermark(client, EV_READ, 0, 0);
	stream_setwatermark(upstream, EV_READ, 0, 0);
	stream_setwatermark(client, EV_WRITE, 0, 0);
	stream_setwatermark(upstream, EV_WRITE, 0, 0);
	stream_enable(client, EV_READ | EV_WRITE);
	stream_enable(upstream, EV_READ | EV_WRITE);
	/* bytes that arrived with the heads */
	move(t, client);
	move(t, upstream);
	return t;
}

void tunnel_free(struct tunnel *t)
{
	if (!t || t->freed)
		return;
	t->freed = true;
	event_free(t->idle_ev);
	stream_setcb(t->c, NULL, NULL, NULL, NULL);
	stream_free(t->u);
	t->u = NULL;
	loop_defer_free(t->loop, free, t);
}
