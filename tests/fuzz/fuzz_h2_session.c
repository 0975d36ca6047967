/*
 * fuzz_h2_session: libFuzzer target for the HTTP/2 client codec (h2_session.c, h2_request.c,
 * h2_responder.c, h2_guard.c) with everything under it real: exchanges, attempts and a fake
 * HTTP/1.1 upstream on the same loop that answers every request "200 hello" and closes. Each
 * input is what one client connection sends (byte 0 bit 0: prepend the connection preface, so
 * inputs can start with frames); it is written into a socketpair, the loop runs until quiet
 * while the client end is read, then the session is closed and its deferred frees run.
 * ASan/UBSan and the magic checks (RG_CHECK_MAGIC) are the oracle; nothing may leak between
 * inputs.
 */
#include <errno.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <event2/event.h>

#include "client/h2_session.h"
#include "net/stream.h"

#include "rig.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static struct runtime *RT;
static int closed;

static struct runtime *rt_cb(void *arg) { return RT; }
static void closed_cb(void *arg) { closed = 1; }

/* the fake upstream: read a head, answer, close */
struct upconn { int fd; struct event *ev; size_t seen; };

static void up_read_cb(evutil_socket_t fd, short what, void *arg)
{
	struct upconn *u = arg;
	char buf[4096];
	ssize_t n = recv(fd, buf, sizeof(buf), 0);
	if (n > 0) {
		u->seen += (size_t)n;
		if (!memmem(buf, (size_t)n, "\r\n\r\n", 4))
			return;
		static const char rsp[] = "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello";
		ssize_t w = send(fd, rsp, sizeof(rsp) - 1, MSG_NOSIGNAL);
		(void)w;
	} else if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
		return;
	}
	event_free(u->ev);
	close(fd);
	free(u);
}

static void up_accept_cb(evutil_socket_t lfd, short what, void *arg)
{
	int fd;
	while ((fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC)) >= 0) {
		struct upconn *u = calloc(1, sizeof(*u));
		u->fd = fd;
		u->ev = event_new(rig_loop.base, fd, EV_READ | EV_PERSIST, up_read_cb, u);
		event_add(u->ev, NULL);
	}
}

static void setup(void)
{
	rig_loop_init();
	int port = rig_listen(up_accept_cb);
	char yaml[1024];
	int n = snprintf(yaml, sizeof(yaml),
	                 "admin: { listen: \"\" }\n"
	                 "listeners:\n"
	                 "  - name: f\n"
	                 "    listen: \"127.0.0.1:1\"\n"
	                 "    limits: { max_header_bytes: 4KiB, max_uri_bytes: 1KiB, max_body: 64KiB,\n"
	                 "              max_concurrent_streams: 8, idle_timeout: 1s, header_timeout: 1s }\n"
	                 "    routes: [ { path_prefix: \"/x\", upstream: api } ]\n"
	                 "upstreams:\n"
	                 "  api:\n"
	                 "    endpoints: [\"127.0.0.1:%d\"]\n"
	                 "    retry: { max_attempts: 2, backoff: { base: 1ms, max: 1ms }, max_body: 1KiB }\n",
	                 port);
	RT = rig_runtime(yaml, (size_t)n);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static const char preface[] = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
	if (!RT)
		setup();
	if (size == 0 || size > 65536)
		return 0;
	int sv[2];
	rig_socketpair(sv);
	if (data[0] & 1) {
		ssize_t w = send(sv[1], preface, sizeof(preface) - 1, MSG_NOSIGNAL);
		(void)w;
	}
	ssize_t w = send(sv[1], data + 1, size - 1, MSG_NOSIGNAL);
	(void)w;

	struct session_owner own = { .runtime = rt_cb, .on_closed = closed_cb };
	struct h2_handoff h = {
		.strm = stream_new(&rig_loop, sv[0], NULL, STREAM_PLAIN), .lname = "f", .sid = 1,
		.peer_ip = "127.0.0.1", .tls = (data[0] & 2) != 0,
	};
	closed = 0;
	struct h2_session *s = h2_session_new(&rig_loop, &own, &h);
	for (int i = 0; i < 40 && !closed; i++) {
		rig_turns(1);
		rig_collect(sv[1], NULL);
	}
	if (!closed)
		h2_session_close(s, "fuzz: end of input");
	rig_turns(4);
	loop_run_deferred(&rig_loop);
	close(sv[1]);
	return 0;
}
