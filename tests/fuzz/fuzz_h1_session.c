/*
 * fuzz_h1_session: libFuzzer target for the HTTP/1 client codec (h1_session.c) with everything
 * under it real: exchanges, attempts, the pool, and a fake upstream on the same loop whose
 * bytes come from the input. The input is a script of steps, each an op byte and a length
 * byte: the client sends bytes, the newest upstream connection sends bytes, closes or resets,
 * the client half-closes, or the loop turns; so request bytes and upstream bytes arrive in the
 * interleavings the input chooses (a response relayed while the request body still streams,
 * then a malformed chunk, is one of them).
 *
 * Oracle, beyond ASan/UBSan and the magic checks (RG_CHECK_MAGIC, so freed objects go back to
 * malloc where ASan sees them): what the client receives is a well-formed stream of HTTP/1
 * responses, cut at most by the close (the response parser never fails on it). Inputs that
 * send a HEAD are left to the sanitizers (a HEAD answer's length is not its body's); the check
 * ends at a 101.
 */
#include <errno.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <event2/buffer.h>
#include <event2/event.h>

#include "client/h1_session.h"
#include "client/session.h"
#include "http/h1_parser.h"
#include "rig.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define MAX_UP 16

/* 6 and 7 send data too: most steps should carry bytes */
enum op { OP_CLIENT, OP_UPSTREAM, OP_TURN, OP_UP_CLOSE, OP_CLIENT_SHUT, OP_UP_RESET, OP_CLIENT2,
          OP_UPSTREAM2 };

static struct runtime *RT;
static int closed;

/* the fake upstream: reads and forgets what it is sent, writes what the input says */
static struct upconn {
	int fd;
	struct event *ev;
} ups[MAX_UP];
static int nups;

static struct runtime *rt_cb(void *arg) { return RT; }
static void closed_cb(void *arg) { closed = 1; }

static void up_close(struct upconn *u, bool rst)
{
	if (u->fd < 0)
		return;
	if (rst) {
		struct linger lg = { 1, 0 };
		setsockopt(u->fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
	}
	event_free(u->ev);
	close(u->fd);
	u->fd = -1;
}

static void up_read_cb(evutil_socket_t fd, short what, void *arg)
{
	if (!rig_collect(fd, NULL))
		up_close(arg, false);
}

static void up_accept_cb(evutil_socket_t lfd, short what, void *arg)
{
	int fd;
	while ((fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC)) >= 0) {
		if (nups == MAX_UP) {
			close(fd);
			continue;
		}
		struct upconn *u = &ups[nups++];
		u->fd = fd;
		u->ev = event_new(rig_loop.base, fd, EV_READ | EV_PERSIST, up_read_cb, u);
		event_add(u->ev, NULL);
	}
}

static struct upconn *up_newest(void)
{
	for (int i = nups - 1; i >= 0; i--)
		if (ups[i].fd >= 0)
			return &ups[i];
	return NULL;
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
	                 "              idle_timeout: 1s, header_timeout: 1s }\n"
	                 "    routes: [ { path_prefix: \"/\", upstream: api } ]\n"
	                 "upstreams:\n"
	                 "  api:\n"
	                 "    endpoints: [\"127.0.0.1:%d\"]\n"
	                 "    retry: { max_attempts: 2, backoff: { base: 1ms, max: 1ms }, max_body: 1KiB }\n",
	                 port);
	RT = rig_runtime(yaml, (size_t)n);
}

/* The oracle: the client's bytes parse as HTTP/1 responses. */
struct oracle {
	struct http_msg *m;
	struct evbuffer *in, *body;
	bool off;
};

static void oracle_feed(struct oracle *o, bool eof)
{
	while (!o->off) {
		enum http_event ev = http_msg_feed(o->m, o->in, o->body, SIZE_MAX);
		evbuffer_drain(o->body, evbuffer_get_length(o->body));
		if (ev == HTTP_NEED_MORE && eof)
			ev = http_msg_eof(o->m);
		switch (ev) {
		case HTTP_NEED_MORE:
			return;
		case HTTP_HEAD:
			if (http_msg_head(o->m)->status == 101)
				o->off = true;          /* the rest is a tunnel */
			else if (http_msg_head(o->m)->status < 200)
				http_msg_next(o->m);
			continue;
		case HTTP_BODY:
			continue;
		case HTTP_DONE:
			http_msg_next(o->m);
			http_msg_expect(o->m, false);
			if (eof && evbuffer_get_length(o->in) == 0)
				return;
			continue;
		case HTTP_ERROR: {
			if (eof && evbuffer_get_length(o->in) == 0 && http_msg_head_bytes(o->m) > 0)
				return;                 /* cut by the close: allowed */
			int st;
			const char *reason, *detail;
			http_msg_error(o->m, &st, &reason, &detail);
			if (detail && strstr(detail, "too many header lines")) {
				/* an upstream head of up to HTTP_MAX_HEADERS lines is relayed with this
				 * hop's fields added (respond_relayed): more lines than the oracle, which
				 * is the same parser, takes. Not a broken stream: stop judging it */
				o->off = true;
				return;
			}
			abort();                        /* not a response stream: the bug */
		}
		}
	}
}

static void step(struct oracle *o, int client)
{
	rig_turns(2);
	if (!rig_collect(client, o->in))
		rig_turns(1);
	oracle_feed(o, false);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (!RT)
		setup();
	if (size > 65536)
		return 0;
	int sv[2];
	rig_socketpair(sv);
	struct sockaddr_in peer = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	struct session_owner own = { .runtime = rt_cb, .on_closed = closed_cb };
	closed = 0;
	nups = 0;
	struct h1_session *s = h1_session_new(&rig_loop, &own, "f", 1, sv[0],
	                                      (struct sockaddr *)&peer, sizeof(peer));
	struct http_limits lim = { 1 << 20, 1 << 20 };
	struct oracle o = {
		.m = http_msg_new(HTTP_RESPONSE_KIND, &lim), .in = evbuffer_new(),
		.body = evbuffer_new(), .off = memmem(data, size, "HEAD", 4) != NULL,
	};
	http_msg_expect(o.m, false);

	size_t i = 0;
	while (i + 2 <= size && !closed) {
		uint8_t opb = data[i], lb = data[i + 1];
		i += 2;
		size_t len = ((size_t)(opb >> 3) << 8) | lb;
		if (len > size - i)
			len = size - i;
		struct upconn *u = up_newest();
		switch ((enum op)(opb & 7)) {
		case OP_CLIENT:
		case OP_CLIENT2: {
			ssize_t w = send(sv[1], data + i, len, MSG_NOSIGNAL);
			(void)w;
			i += len;
			break;
		}
		case OP_UPSTREAM:
		case OP_UPSTREAM2:
			if (u) {
				ssize_t w = send(u->fd, data + i, len, MSG_NOSIGNAL);
				(void)w;
			}
			i += len;
			break;
		case OP_TURN:
			rig_turns(1 + (lb & 7));
			break;
		case OP_UP_CLOSE:
			if (u)
				up_close(u, false);
			break;
		case OP_CLIENT_SHUT:
			shutdown(sv[1], SHUT_WR);
			break;
		case OP_UP_RESET:
			if (u)
				up_close(u, true);
			break;
		}
		step(&o, sv[1]);
	}
	for (int k = 0; k < 10 && !closed; k++)
		step(&o, sv[1]);
	if (!closed)
		h1_session_close(s, "fuzz: end of input");
	for (int k = 0; k < nups; k++)
		up_close(&ups[k], false);
	rig_turns(4);
	loop_run_deferred(&rig_loop);
	rig_collect(sv[1], o.in);
	oracle_feed(&o, true);
	http_msg_free(o.m);
	evbuffer_free(o.in);
	evbuffer_free(o.body);
	close(sv[1]);
	return 0;
}
