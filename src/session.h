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

struct worker;
struct listener;
struct session;

/* Takes ownership of FD. */
struct session *session_new(struct worker *w, struct listener *lst, int fd,
                            const struct sockaddr *peer, int peerlen);
/* Drain: every connection closes after its next response; with CLOSE_IDLE, a connection
 * with no request in progress closes now. */
void session_drain(struct session *s, bool close_idle);
void session_close(struct session *s, const char *why);
/* All sessions of W: drain each, or close each. */
void session_drain_all(struct worker *w, bool close_idle);
void session_close_all(struct worker *w);

#endif
