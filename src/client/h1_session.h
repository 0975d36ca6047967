/*
 * h1_session: one accepted HTTP/1.x client connection (the HTTP/1 client codec). Reads
 * request heads and bodies with http.c, hands each request to an exchange together with the
 * HTTP/1 responder it answers through (framing, keep-alive and close decided here), keeps the
 * connection alive between requests (pipelined requests are served strictly in order), and
 * closes it — once, through h1_session_close(), which reports to its owner.
 */
#ifndef RG_H1_SESSION_H
#define RG_H1_SESSION_H

#include <stdbool.h>
#include <sys/socket.h>

#include "client/session.h"

struct loop;
struct runtime;
struct h1_session;

/* Takes ownership of FD. LNAME: the listener's name (its config is looked up by it). NULL
 * when the connection closed at once (the listener is no longer configured: a reload since
 * the accept); its on_closed has been called then. */
struct h1_session *h1_session_new(struct loop *loop, const struct session_owner *own,
                                  const char *lname, uint64_t sid, int fd,
                                  const struct sockaddr *peer, int peerlen);
/* Drain: the connection closes after its next response; with CLOSE_IDLE, a connection with no
 * request in progress (none read, none waiting unread in the socket) closes now. */
void h1_session_drain(struct h1_session *s, bool close_idle);
void h1_session_close(struct h1_session *s, const char *why);
/* drain_timeout ran out: the request in progress ends (its exchange expires: an unknown
 * outcome if it may have executed) and the connection closes once its output left. */
void h1_session_expire(struct h1_session *s);

#endif
