/*
 * stream: plain sockets with edge-triggered I/O, TLS through bufferevent_openssl (stream.h).
 *
 * Plain stream invariants:
 *  - the socket is registered once (EV_READ|EV_WRITE|EV_CLOSED|EV_ET|EV_PERSIST), never
 *    modified; EV_CLOSED (EPOLLRDHUP) matters because a FIN queued behind data raises no
 *    edge of its own after a short read;
 *  - can_read: an edge said "readable" and no short read or EAGAIN has been seen since; while
 *    reading is off or input is at its high-water mark the bytes wait in the kernel, and
 *    turning reading back on reads them from the `soon` event;
 *  - memory held is about the bytes counted, which the owners' watermarks bound: the input
 *    holds chains about the size of what they carry (do_read), and small chains moved into
 *    an output that waits (the kernel buffer was full, or a connect is under way) are packed
 *    (out_pack); an output that leaves in this round's writev is not;
 *  - appending to the output schedules `soon`, which runs after the callbacks already queued
 *    in this loop round: everything a round appended leaves in one writev. When the kernel
 *    buffer is full the rest waits for the next writable edge.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/bufferevent_ssl.h>
#include <event2/event.h>
#include <event2/util.h>

#include "base/loop.h"
#include "net/stream.h"
#include "base/util.h"

#define READ_CHUNK  16384
#define READ_ROUNDS 4       /* reads per wake-up before yielding to other connections */
#define PACK_ADDS   64      /* appends to a waiting output before its tail is looked at */
#define PACK_SMALL  1024    /* ... and repacked when they brought fewer bytes than this each */

struct stream {
	struct loop *loop;
	struct event_base *base;
	int fd;
	struct bufferevent *strm;        /* TLS streams only */
	struct evbuffer *in, *out;
	struct event *io;               /* plain: the socket, edge-triggered, registered once */
	struct loop_soon soon;          /* plain: flush the output, read, report (the loop's) */
	struct event *wr_timer;         /* plain: output stuck with no progress */
	struct timeval wr_timeout;
	struct evbuffer_cb_entry *out_cb, *in_cb;
	stream_data_fn rd, wr;
	stream_take_fn take;
	stream_event_fn ev;
	void *arg;
	size_t rd_high, wr_low;
	size_t packed;                  /* output bytes at the front already packed (out_pack) */
	uint64_t written;               /* output bytes that left: the kernel (plain) or the TLS
	                                 * layer took them; never what packing moved */
	unsigned out_adds;              /* appends to the output since it was packed or empty */
	bool reading, can_read, connecting, trigger, freed, packing;
	bool eof;                       /* the read side ended (EOF or error reported) */
	bool broken;                    /* a write failed (reported) */
	bool wr_armed;                  /* wr_timer added and not yet fired or deleted */
	bool blocked;                   /* a write met EAGAIN: the output waits for an edge */
	bool rdhup;                     /* the peer's FIN is queued behind the data */
	short pending_event;            /* to report from `soon` (connect result) */
	int pending_errno;
};

static void soon_cb(void *arg);

static void stream_schedule(struct stream *s)
{
	if (!s->freed)
		loop_soon_add(s->loop, &s->soon, soon_cb, s);
}

/* EOF or error, once per side; the owner decides what to close. After a read-side EOF the
 * output is still written (a client that half-closed still gets its response). */
static void stream_report(struct stream *s, short what)
{
	if (s->freed)
		return;
	if (what & BEV_EVENT_WRITING) {
		if (s->broken)
			return;
		s->broken = true;
	} else {
		if (s->eof)
			return;
		s->eof = true;
		if (what & BEV_EVENT_ERROR)
			s->broken = true;   /* a reset socket writes no more either */
	}
	if (s->ev)
		s->ev(s, what, s->arg);
}

/* One sendmsg of what the first chains of the output hold (at most WRITE_MAX bytes in
 * WRITE_IOV pieces), drained by what the kernel took. */
#define WRITE_IOV 16
#define WRITE_MAX (1024 * 1024)
static int send_some(struct stream *s)
{
	struct evbuffer_iovec v[WRITE_IOV];
	int nv = evbuffer_peek(s->out, WRITE_MAX, NULL, v, WRITE_IOV);
	if (nv > WRITE_IOV)
		nv = WRITE_IOV;
	struct iovec iov[WRITE_IOV];
	for (int i = 0; i < nv; i++) {
		iov[i].iov_base = v[i].iov_base;
		iov[i].iov_len = v[i].iov_len;
	}
	struct msghdr msg = { .msg_iov = iov, .msg_iovlen = (size_t)nv };
	ssize_t n = sendmsg(s->fd, &msg, MSG_DONTWAIT | MSG_NOSIGNAL);
	if (n > 0) {
		s->written += (uint64_t)n;
		evbuffer_drain(s->out, (size_t)n);
	}
	return (int)n;
}

static void do_write(struct stream *s)
{
	if (s->connecting || s->broken || s->freed)
		return;
	bool progress = false;
	while (evbuffer_get_length(s->out) > 0) {
		int n = send_some(s);
		if (n > 0)
			progress = true;
		if (n < 0) {
			if (errno == EINTR)
				continue;
			if (errno == EAGAIN || errno == EWOULDBLOCK) {
				/* the next writable edge continues; a peer that stops reading for the
				 * write timeout is reported */
				s->blocked = true;
				if (s->wr_timer && (progress || !s->wr_armed)) {
					evtimer_add(s->wr_timer, &s->wr_timeout);
					s->wr_armed = true;
				}
				return;
			}
			stream_report(s, BEV_EVENT_ERROR | BEV_EVENT_WRITING);
			return;
		}
		if (n == 0)
			return;
	}
	s->blocked = false;
	if (s->wr_armed) {              /* most writes never armed it: no event_del for them */
		evtimer_del(s->wr_timer);
		s->wr_armed = false;
	}
	if (s->wr && evbuffer_get_length(s->out) <= s->wr_low)
		s->wr(s, s->arg);
}

static void wr_timeout_cb(evutil_socket_t fd, short what, void *arg)
{
	struct stream *s = arg;
	s->wr_armed = false;
	if (!s->freed && evbuffer_get_length(s->out) > 0)
		stream_report(s, BEV_EVENT_TIMEOUT | BEV_EVENT_WRITING);
}

/* Reads go to a scratch buffer on the stack, then evbuffer_add copies them into the input:
 * into the free space of its last chain, or into a chain sized to the bytes read. Reading
 * straight into reserved space would pin a fresh 16 KiB chain (32 KiB from malloc) per read,
 * and chains move, uncopied, to the other side's output: a peer sending 100-byte pieces would
 * hold 300 times the bytes the watermarks count. The copy is at most READ_CHUNK bytes per
 * system call, and the stack buffer is per thread, as the loop is. */
static void do_read(struct stream *s)
{
	for (int round = 0; round < READ_ROUNDS; round++) {
		if (!s->reading || !s->can_read || s->eof || s->freed)
			return;
		size_t have = evbuffer_get_length(s->in);
		if (s->rd_high && have >= s->rd_high)
			return;             /* the kernel keeps the rest: backpressure */
		size_t want = READ_CHUNK;
		if (s->rd_high && s->rd_high - have < want)
			want = s->rd_high - have;
		char scratch[READ_CHUNK];
		/* recv, not read: the socket call skips the file-position lock read takes */
		ssize_t n = recv(s->fd, scratch, want, MSG_DONTWAIT);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			if (errno == EAGAIN || errno == EWOULDBLOCK) {
				s->can_read = false;
				return;
			}
			s->can_read = false;
			stream_report(s, BEV_EVENT_ERROR | BEV_EVENT_READING);
			return;
		}
		if (n == 0) {
			s->can_read = false;
			stream_report(s, BEV_EVENT_EOF | BEV_EVENT_READING);
			return;
		}
		size_t took = (s->take && have == 0) ? s->take(s, scratch, (size_t)n, s->arg) : 0;
		if (took < (size_t)n && evbuffer_add(s->in, scratch + took, (size_t)n - took) != 0) {
			s->can_read = false;
			stream_report(s, BEV_EVENT_ERROR | BEV_EVENT_READING);
			return;
		}
		/* a short read drained the socket: wait for an edge, unless a FIN is queued (it
		 * raises no further edge, so read on to see the EOF) */
		if ((size_t)n < want && !s->rdhup)
			s->can_read = false;
		if (s->rd)
			s->rd(s, s->arg);
	}
	/* still readable after our share: come back after the others */
	if (s->reading && s->can_read && !s->eof && !s->freed)
		stream_schedule(s);
}

static void io_cb(evutil_socket_t fd, short what, void *arg)
{
	struct stream *s = arg;
	if (s->freed)
		return;
	if (s->connecting) {
		int err = 0;
		socklen_t len = sizeof(err);
		if (getsockopt(s->fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0)
			err = errno;
		if (err == EINPROGRESS || err == EALREADY || (!err && !(what & EV_WRITE)))
			return;
		if (err) {
			errno = err;
			s->connecting = false;
			stream_report(s, BEV_EVENT_ERROR);
			return;
		}
		s->connecting = false;
		if (s->ev)
			s->ev(s, BEV_EVENT_CONNECTED, s->arg);
		if (s->freed)
			return;
		do_write(s);
		if (!(what & EV_READ))
			return;
	}
	if (what & EV_CLOSED)
		s->rdhup = true;
	if (what & (EV_READ | EV_CLOSED)) {
		s->can_read = true;
		do_read(s);
		if (s->freed)
			return;
	}
	if ((what & EV_WRITE) && evbuffer_get_length(s->out) > 0)
		do_write(s);
}

static void soon_cb(void *arg)
{
	struct stream *s = arg;
	if (s->freed)
		return;
	if (s->pending_event) {
		short ev = s->pending_event;
		s->pending_event = 0;
		errno = s->pending_errno;
		s->connecting = false;
		if (ev == BEV_EVENT_CONNECTED) {
			if (s->ev)
				s->ev(s, ev, s->arg);
		} else {
			stream_report(s, ev);
		}
		if (s->freed)
			return;
	}
	if (s->trigger) {
		s->trigger = false;
		if (s->reading && s->rd)
			s->rd(s, s->arg);
		if (s->freed)
			return;
	}
	do_read(s);
	if (s->freed)
		return;
	do_write(s);
}

/* The owner consumed input that had reached the high-water mark: read on (the kernel holds
 * the rest, and no new edge comes while the peer waits for window). */
static void in_changed_cb(struct evbuffer *buf, const struct evbuffer_cb_info *info, void *arg)
{
	struct stream *s = arg;
	if (info->n_deleted > 0 && s->rd_high && info->orig_size >= s->rd_high &&
	    info->orig_size - info->n_deleted < s->rd_high && s->reading && s->can_read)
		stream_schedule(s);
}

/* Chains move whole between buffers (evbuffer_add_buffer), so small pieces appended to an
 * output that is not draining (a slow reader, a connect under way) each bring a chain of at
 * least 1 KiB. Every PACK_ADDS appends of under PACK_SMALL bytes on average, the bytes that
 * came since the last packing are copied into contiguous chains: each byte is copied at most
 * once, and only while the output waits. The packed front is moved out and back, not copied. */
static void out_pack(struct stream *s)
{
	size_t len = evbuffer_get_length(s->out);
	size_t fresh = len - s->packed;
	if (fresh / s->out_adds >= PACK_SMALL) {
		s->out_adds = 0;
		return;
	}
	struct evbuffer *tail = evbuffer_new();
	s->packing = true;
	evbuffer_add_buffer(tail, s->out);
	evbuffer_remove_buffer(tail, s->out, s->packed);
	evbuffer_expand(s->out, fresh);
	struct evbuffer_iovec v[16];
	while (evbuffer_get_length(tail) > 0) {
		int n = evbuffer_peek(tail, -1, NULL, v, 16);
		size_t took = 0;
		for (int i = 0; i < n && i < 16; i++) {
			evbuffer_add(s->out, v[i].iov_base, v[i].iov_len);
			took += v[i].iov_len;
		}
		evbuffer_drain(tail, took);
	}
	evbuffer_free(tail);
	s->packing = false;
	s->packed = len;
	s->out_adds = 0;
}

static void out_changed_cb(struct evbuffer *buf, const struct evbuffer_cb_info *info, void *arg)
{
	struct stream *s = arg;
	if (s->packing)
		return;
	if (info->n_deleted > 0) {
		s->packed = s->packed > info->n_deleted ? s->packed - info->n_deleted : 0;
		if (info->orig_size == info->n_deleted)
			s->out_adds = 0;            /* drained: nothing waits */
	}
	if (info->n_added > 0) {
		/* only an output that waits: what leaves this round is not worth a copy (an HTTP/2
		 * session appends a few frames per stream, hundreds in a round) */
		if (++s->out_adds >= PACK_ADDS && (s->blocked || s->connecting))
			out_pack(s);
		if (!s->connecting && s->fd >= 0)
			stream_schedule(s);
	}
}

/* ---------------------------------------------------------------- TLS: bufferevent */

/* The output of a TLS stream drains only as SSL_write takes its bytes: no packing there. */
static void tls_out_cb(struct evbuffer *buf, const struct evbuffer_cb_info *info, void *arg)
{
	struct stream *s = arg;
	s->written += info->n_deleted;
}

static void tls_read_cb(struct bufferevent *strm, void *arg)
{
	struct stream *s = arg;
	if (s->rd)
		s->rd(s, s->arg);
}

static void tls_write_cb(struct bufferevent *strm, void *arg)
{
	struct stream *s = arg;
	if (s->wr)
		s->wr(s, s->arg);
}

static void tls_event_cb(struct bufferevent *strm, short what, void *arg)
{
	struct stream *s = arg;
	if (s->ev)
		s->ev(s, what, s->arg);
}

/* ---------------------------------------------------------------- API */

struct stream *stream_new(struct loop *loop, int fd, SSL *ssl, enum stream_tls mode)
{
	struct event_base *base = loop->base;
	struct stream *s = xcalloc(1, sizeof(*s));
	s->loop = loop;
	s->base = base;
	s->fd = fd;
	if (ssl) {
		s->strm = bufferevent_openssl_socket_new(base, fd, ssl,
		                                        mode == STREAM_TLS_ACCEPT ? BUFFEREVENT_SSL_ACCEPTING
		                                                                  : BUFFEREVENT_SSL_CONNECTING,
		                                        BEV_OPT_CLOSE_ON_FREE);
		if (!s->strm) {
			SSL_free(ssl);
			if (fd >= 0)
				close(fd);
			free(s);
			return NULL;
		}
		bufferevent_openssl_set_allow_dirty_shutdown(s->strm, 1);
		bufferevent_setcb(s->strm, tls_read_cb, tls_write_cb, tls_event_cb, s);
		s->in = bufferevent_get_input(s->strm);
		s->out = bufferevent_get_output(s->strm);
		s->out_cb = evbuffer_add_cb(s->out, tls_out_cb, s);
		if (fd >= 0)
			loop_fd_seen(loop, fd);
		return s;
	}
	s->in = evbuffer_new();
	s->out = evbuffer_new();
	s->out_cb = evbuffer_add_cb(s->out, out_changed_cb, s);
	s->in_cb = evbuffer_add_cb(s->in, in_changed_cb, s);
	if (fd >= 0) {
		evutil_make_socket_nonblocking(fd);
		s->io = event_new(base, fd, EV_READ | EV_WRITE | EV_CLOSED | EV_ET | EV_PERSIST, io_cb, s);
		event_add(s->io, NULL);
		loop_fd_seen(loop, fd);
	}
	return s;
}

int stream_connect(struct stream *s, const struct sockaddr *sa, int salen)
{
	if (s->strm) {
		int rc = bufferevent_socket_connect(s->strm, (struct sockaddr *)sa, salen);
		loop_fd_seen(s->loop, bufferevent_getfd(s->strm));
		return rc;
	}
	int fd = socket(sa->sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -1;
	s->fd = fd;
	s->connecting = true;
	s->io = event_new(s->base, fd, EV_READ | EV_WRITE | EV_CLOSED | EV_ET | EV_PERSIST, io_cb, s);
	int rc = connect(fd, sa, (socklen_t)salen);
	if (rc == 0 || errno != EINPROGRESS) {
		/* done at once (or refused at once): say so from the loop, never from here */
		s->pending_event = rc == 0 ? BEV_EVENT_CONNECTED : BEV_EVENT_ERROR;
		s->pending_errno = rc == 0 ? 0 : errno;
		stream_schedule(s);
	}
	event_add(s->io, NULL);
	loop_fd_seen(s->loop, fd);
	return 0;
}

static void stream_free_cb(void *arg)
{
	struct stream *s = arg;
	if (!s->strm) {
		evbuffer_free(s->in);
		evbuffer_free(s->out);
	}
	free(s);
}

void stream_free(struct stream *s)
{
	if (!s || s->freed)
		return;
	s->freed = true;
	if (s->strm) {
		bufferevent_setcb(s->strm, NULL, NULL, NULL, NULL);
		evbuffer_remove_cb_entry(s->out, s->out_cb);
		bufferevent_free(s->strm);
		s->in = s->out = NULL;
	} else {
		if (s->io)
			event_free(s->io);
		loop_soon_del(s->loop, &s->soon);
		if (s->wr_timer)
			event_free(s->wr_timer);
		evbuffer_remove_cb_entry(s->out, s->out_cb);
		evbuffer_remove_cb_entry(s->in, s->in_cb);
		if (s->fd >= 0)
			close(s->fd);
	}
	s->fd = -1;
	/* callers up the stack may still look at the struct: free it once they unwound */
	loop_defer_free(s->loop, stream_free_cb, s);
}

void stream_setcb(struct stream *s, stream_data_fn rd, stream_data_fn wr, stream_event_fn ev,
                  void *arg)
{
	s->rd = rd;
	s->wr = wr;
	s->ev = ev;
	s->arg = arg;
	s->take = NULL;
}

void stream_set_take(struct stream *s, stream_take_fn take)
{
	s->take = take;
}

uint64_t stream_written(const struct stream *s) { return s->written; }
struct evbuffer *stream_input(struct stream *s) { return s->in; }
struct evbuffer *stream_output(struct stream *s) { return s->out; }

SSL *stream_ssl(struct stream *s)
{
	return s->strm ? bufferevent_openssl_get_ssl(s->strm) : NULL;
}

int stream_fd(struct stream *s)
{
	return s->strm ? bufferevent_getfd(s->strm) : s->fd;
}

unsigned long stream_tls_error(struct stream *s)
{
	return s->strm ? bufferevent_get_openssl_error(s->strm) : 0;
}

enum tls_failure stream_tls_failure(struct stream *s, char *detail, size_t cap)
{
	enum tls_failure f = TLSF_NONE;
	SSL *ssl = stream_ssl(s);
	if (cap)
		detail[0] = 0;
	for (unsigned long e; (e = stream_tls_error(s)) != 0;) {
		/* bufferevent_openssl puts SSL_get_error()'s verdict first: SSL_ERROR_SSL or
		 * SSL_ERROR_SYSCALL (the socket failed: a reset says nothing about TLS), not a code */
		if (e == SSL_ERROR_SSL || e == SSL_ERROR_SYSCALL)
			continue;
		enum tls_failure g = tls_failure_of(ssl, e);
		if (f == TLSF_NONE || (f == TLSF_OTHER && g != TLSF_OTHER)) {
			f = g;
			tls_failure_detail(ssl, e, detail, cap);
		}
	}
	return f;
}

void stream_enable(struct stream *s, short what)
{
	if (s->strm) {
		bufferevent_enable(s->strm, what);
		return;
	}
	if ((what & EV_READ) && !s->reading) {
		s->reading = true;
		if (s->can_read)
			stream_schedule(s);
	}
}

void stream_disable(struct stream *s, short what)
{
	if (s->strm) {
		bufferevent_disable(s->strm, what);
		return;
	}
	if (what & EV_READ)
		s->reading = false;
}

void stream_setwatermark(struct stream *s, short what, size_t low, size_t high)
{
	if (s->strm) {
		bufferevent_setwatermark(s->strm, what, low, high);
		return;
	}
	if (what & EV_READ) {
		s->rd_high = high;
		if (s->reading && s->can_read)
			stream_schedule(s);
	}
	if (what & EV_WRITE)
		s->wr_low = low;
}

void stream_trigger_read(struct stream *s)
{
	if (s->strm) {
		bufferevent_trigger(s->strm, EV_READ, BEV_TRIG_IGNORE_WATERMARKS | BEV_TRIG_DEFER_CALLBACKS);
		return;
	}
	s->trigger = true;
	stream_schedule(s);
}

void stream_set_write_timeout(struct stream *s, int64_t us)
{
	struct timeval tv = { (time_t)(us / 1000000), (suseconds_t)(us % 1000000) };
	if (s->strm) {
		bufferevent_set_timeouts(s->strm, NULL, us > 0 ? &tv : NULL);
		return;
	}
	s->wr_timeout = tv;
	if (us > 0 && !s->wr_timer)
		s->wr_timer = evtimer_new(s->base, wr_timeout_cb, s);
}
