/*
 * fuzz_admin: libFuzzer target for the admin port's request reader (admin.c) over a socketpair,
 * with the real handlers (metrics, stats, config, retries, faults, unknown) on a runtime.
 *
 * Input: byte 0 picks the setting (bit 0: admin.token set; bit 1: a loopback peer; bit 2: the
 * client reads nothing until it has sent everything, so answers pile up; bit 3: it half-closes
 * after sending), byte 1 where the request bytes are cut in two sends, the rest is what the
 * client sends.
 *
 * Oracle, beyond ASan/UBSan and the magic checks: the same request parser, run here over the
 * bytes sent, says which requests the admin port read (and whether they were HEAD); what the
 * client receives must be exactly one well-formed response per request, in order (plus one
 * for a malformed request, after which the connection closes, as after a request that asks
 * for it), and a half-closing client gets them all before the close.
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

#include "app/admin.h"
#include "http/h1_parser.h"
#include "rig.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define MAX_REQS 4096

static struct runtime *RT_TOKEN, *RT_OPEN;

static void dummy_accept(evutil_socket_t fd, short what, void *arg) {}

static struct runtime *runtime_of(const char *token)
{
	char yaml[1024];
	int n = snprintf(yaml, sizeof(yaml),
	                 "admin: { listen: \"\"%s%s%s }\n"
	                 "listeners:\n"
	                 "  - name: f\n"
	                 "    listen: \"127.0.0.1:1\"\n"
	                 "    routes: [ { path_prefix: \"/\", upstream: api } ]\n"
	                 "upstreams:\n"
	                 "  api:\n"
	                 "    endpoints: [\"127.0.0.1:%d\"]\n"
	                 "  other:\n"
	                 "    endpoints: [\"127.0.0.1:%d\"]\n",
	                 token ? ", token: \"" : "", token ? token : "", token ? "\"" : "",
	                 rig_listen(dummy_accept), rig_listen(dummy_accept));
	return rig_runtime(yaml, (size_t)n);
}

static void setup(void)
{
	rig_loop_init();
	RT_TOKEN = runtime_of("s3cret");
	RT_OPEN = runtime_of(NULL);
}

/* What the admin port should answer: one entry per request it reads (true: HEAD), whether
 * the last one is a refusal of a malformed request, and whether the connection ends there. */
struct expect {
	bool head[MAX_REQS];
	int n;
	bool error;
	bool close;             /* the last one ends the connection */
};

static void predict(const uint8_t *p, size_t len, struct expect *e)
{
	struct http_limits lim = { 16 * 1024, 8 * 1024 };   /* admin.c's */
	struct http_msg *m = http_msg_new(HTTP_REQUEST_KIND, &lim);
	struct evbuffer *in = evbuffer_new(), *sink = evbuffer_new();
	evbuffer_add(in, p, len);
	memset(e, 0, sizeof(*e));
	while (e->n < MAX_REQS) {
		enum http_event ev = http_msg_feed(m, in, sink, 64 * 1024);
		evbuffer_drain(sink, evbuffer_get_length(sink));
		const struct http_head *h = ev == HTTP_HEAD || ev == HTTP_DONE ? http_msg_head(m) : NULL;
		bool has_body = h && (h->chunked || h->content_length > 0);
		if (ev == HTTP_NEED_MORE)
			break;
		if (ev == HTTP_ERROR) {
			e->head[e->n++] = false;
			e->error = e->close = true;
			break;
		}
		if ((ev == HTTP_HEAD && !has_body) || ev == HTTP_DONE) {
			e->head[e->n++] = h->method_head;
			if (!h->keep_alive) {
				e->close = true;        /* Connection: close, or HTTP/1.0 */
				break;
			}
			http_msg_next(m);
		}
	}
	http_msg_free(m);
	evbuffer_free(in);
	evbuffer_free(sink);
}

/* Parse the responses in OUT; how many there are (aborts on a malformed one). */
static int responses(struct evbuffer *out, const struct expect *e, bool *cut)
{
	struct http_limits lim = { 1 << 20, 1 << 20 };
	struct http_msg *m = http_msg_new(HTTP_RESPONSE_KIND, &lim);
	struct evbuffer *body = evbuffer_new();
	int n = 0;
	*cut = false;
	http_msg_expect(m, e->n > 0 && e->head[0]);
	for (;;) {
		enum http_event ev = http_msg_feed(m, out, body, SIZE_MAX);
		evbuffer_drain(body, evbuffer_get_length(body));
		if (ev == HTTP_NEED_MORE) {
			*cut = http_msg_head_bytes(m) > 0;
			break;
		}
		if (ev == HTTP_ERROR)
			abort();                    /* not a response stream */
		if (ev == HTTP_DONE) {
			n++;
			http_msg_next(m);
			http_msg_expect(m, n < e->n && e->head[n]);
		}
	}
	http_msg_free(m);
	evbuffer_free(body);
	return n;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (!RT_TOKEN)
		setup();
	if (size < 2 || size > 65536)
		return 0;
	uint8_t flags = data[0];
	const uint8_t *p = data + 2;
	size_t len = size - 2, cut1 = len * data[1] / 255;
	struct runtime *rt = flags & 1 ? RT_TOKEN : RT_OPEN;
	runtime_publish(runtime_ref(rt));
	admin_reconfigure(rt->cfg);

	int sv[2];
	rig_socketpair(sv);
	struct sockaddr_in peer = { .sin_family = AF_INET,
	                            .sin_addr.s_addr = htonl(flags & 2 ? INADDR_LOOPBACK : 0x0a000001) };
	admin_serve(rig_loop.base, sv[0], (struct sockaddr *)&peer);
	struct evbuffer *got = evbuffer_new();
	bool slow = flags & 4;

	/* the bytes the socket took: a short send ends the input there */
	ssize_t w = send(sv[1], p, cut1, MSG_NOSIGNAL);
	size_t sent = w > 0 ? (size_t)w : 0;
	rig_turns(2);
	if (!slow)
		rig_collect(sv[1], got);
	if (sent == cut1) {
		w = send(sv[1], p + cut1, len - cut1, MSG_NOSIGNAL);
		sent += w > 0 ? (size_t)w : 0;
	}
	if (flags & 8)
		shutdown(sv[1], SHUT_WR);
	/* run until the admin port has nothing more to say (or closed) */
	bool open = true;
	int quiet = 0;
	while (quiet < 3) {
		size_t before = evbuffer_get_length(got);
		rig_turns(2);
		open = rig_collect(sv[1], got);
		if (!open)
			break;
		quiet = evbuffer_get_length(got) == before ? quiet + 1 : 0;
	}

	struct expect e;
	predict(p, sent, &e);
	bool cut;
	int n = responses(got, &e, &cut);
	if (n != e.n || cut || evbuffer_get_length(got) != 0)
		abort();                            /* an answer missing, extra, or cut */
	if ((e.close || (flags & 8)) && open)
		abort();            /* a refusal, a request's close or a half-close ends the connection */

	close(sv[1]);
	rig_turns(2);
	loop_run_deferred(&rig_loop);
	evbuffer_free(got);
	return 0;
}
