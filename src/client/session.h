/*
 * session: what a client session (HTTP/1 or HTTP/2 codec) needs from its owner, the worker:
 * the current runtime, the news of its end (once), and — for an HTTP/1 session that finds it
 * is speaking to an HTTP/2 client (preface, or ALPN h2) — the hand-off of its connection, after
 * which the HTTP/1 session is gone without an on_closed of its own.
 */
#ifndef RG_SESSION_H
#define RG_SESSION_H

#include <stdbool.h>
#include <stdint.h>

struct runtime;
struct stream;

/* The connection an HTTP/1 session hands over: the stream (taken; its input still holds
 * every byte read so far), and who the client is. Valid during the callback only. */
struct h2_handoff {
	struct stream *strm;
	const char *lname;
	uint64_t sid;
	const char *peer_ip;
	bool tls;
};

struct session_owner {
	struct runtime *(*runtime)(void *arg);
	void *runtime_arg;
	void (*on_closed)(void *arg);
	void *closed_arg;
	/* the connection is HTTP/2 (called with closed_arg); NULL: HTTP/2 is never handed off */
	void (*on_h2)(void *arg, const struct h2_handoff *h);
};

#endif
