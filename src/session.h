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
/* Drain: close if idle, else close after the current response. */
void session_drain(struct session *s);
void session_close(struct session *s, const char *why);
/* All sessions of W: drain each, or close each. */
void session_drain_all(struct worker *w);
void session_close_all(struct worker *w);

#endif
