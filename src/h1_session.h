/*
 * session: one accepted client connection. Reads request heads and bodies with http.c, hands
 * each request to an exchange, writes nothing itself but its own refusals, keeps the
 * connection alive between requests (pipelined requests are served strictly in order), and
 * closes it — once, through session_close().
 */
#ifndef RG_SESSION_H
#define RG_SESSION_H

#include <stdbool.h>
#include <sys/socket.h>

struct loop;
struct runtime;
struct session;

/* What a session needs from its owner: the current runtime (refreshed per request), and the
 * news of its end (once, from session_close, after which the session is never used). */
struct session_owner {
	struct runtime *(*runtime)(void *arg);
	void *runtime_arg;
	void (*on_closed)(void *arg);
	void *closed_arg;
};

/* Takes ownership of FD. LNAME: the listener's name (its config is looked up by it). */
struct session *session_new(struct loop *loop, const struct session_owner *own, const char *lname,
                            uint64_t sid, int fd, const struct sockaddr *peer, int peerlen);
/* Drain: every connection closes after its next response; with CLOSE_IDLE, a connection
 * with no request in progress closes now. */
void session_drain(struct session *s, bool close_idle);
void session_close(struct session *s, const char *why);

#endif
