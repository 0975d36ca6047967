/*
 * rig: what the session fuzzers share (header-only: each fuzz_*.c is built alone): one loop, a
 * runtime from YAML text, a loopback listener on that loop for a fake upstream, and the
 * collection of what the client end of a socketpair receives. Everything is created once per
 * process; nothing of one input may survive into the next but the pooled state the proxy
 * itself keeps.
 */
#ifndef RG_FUZZ_RIG_H
#define RG_FUZZ_RIG_H

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>

#include <event2/buffer.h>
#include <event2/event.h>

#include "base/log.h"
#include "base/loop.h"
#include "config/config.h"
#include "state/runtime.h"

static struct loop rig_loop;

static void rig_loop_init(void)
{
	log_min_level = LOG_ERROR;
	if (loop_init(&rig_loop, 0) != 0)
		abort();
}

/* A loopback listener whose connections ACCEPT_CB takes; its port. */
static int rig_listen(event_callback_fn accept_cb)
{
	int lfd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t sl = sizeof(sa);
	if (lfd < 0 || bind(lfd, (struct sockaddr *)&sa, sizeof(sa)) != 0 || listen(lfd, 64) != 0 ||
	    getsockname(lfd, (struct sockaddr *)&sa, &sl) != 0)
		abort();
	struct event *ev = event_new(rig_loop.base, lfd, EV_READ | EV_PERSIST, accept_cb, NULL);
	event_add(ev, NULL);
	return ntohs(sa.sin_port);
}

/* The runtime of a YAML text; aborts on a config the fuzzer's author got wrong. */
static struct runtime *rig_runtime(const char *yaml, size_t n)
{
	struct config *cfg = config_load_buffer("fuzz.yaml", yaml, n, stderr);
	char err[256];
	struct runtime *rt = cfg ? runtime_new(cfg, err, sizeof(err)) : NULL;
	if (!rt)
		abort();
	config_unref(cfg);
	return rt;
}

/* A socketpair, both ends non-blocking; the test's end [1] takes a large send buffer so an
 * input is written whole unless the other side stops reading. */
static void rig_socketpair(int sv[2])
{
	if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv) != 0)
		abort();
	int big = 1 << 20;
	setsockopt(sv[1], SOL_SOCKET, SO_SNDBUF, &big, sizeof(big));
}

/* Append what FD has to read to OUT (NULL: discard); false once it reached EOF or an error. */
static bool rig_collect(int fd, struct evbuffer *out)
{
	char buf[65536];
	for (;;) {
		ssize_t n = recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
		if (n > 0) {
			if (out)
				evbuffer_add(out, buf, (size_t)n);
			continue;
		}
		return n < 0 && (errno == EAGAIN || errno == EINTR);
	}
}

/* A few turns of the loop, without blocking. */
static void rig_turns(int n)
{
	for (int i = 0; i < n; i++)
		event_base_loop(rig_loop.base, EVLOOP_NONBLOCK);
}

#endif
