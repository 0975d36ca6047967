/*
 * h2_session: one HTTP/2 client connection (the HTTP/2 client codec, SPEC §9), on a stream
 * (plain or TLS) handed over by the HTTP/1 session that saw the preface or ALPN h2. Each
 * stream is one exchange, answered through this session's HTTP/2 responder; flow control
 * gives backpressure both ways; the connection defences of §9 live here (with h2_guard's
 * frame accounting). It closes once, through h2_session_close(), which reports to its owner.
 */
#ifndef RG_H2_SESSION_H
#define RG_H2_SESSION_H

#include <stdbool.h>

#include "client/session.h"

struct loop;
struct h2_session;

/* Takes H's stream; bytes already in its input are the start of the connection (preface
 * included). NULL when the listener is no longer configured (the stream is closed then, and
 * the owner's on_closed was called). */
struct h2_session *h2_session_new(struct loop *loop, const struct session_owner *own,
                                  const struct h2_handoff *h);
/* Drain: GOAWAY (a shutdown notice first, the final one on a later call), in-flight streams
 * finish, then the connection closes. CLOSE_IDLE: no need to wait for the notice's round trip. */
void h2_session_drain(struct h2_session *s, bool close_idle);
void h2_session_close(struct h2_session *s, const char *why);
/* After a reload: a changed max_concurrent_streams is sent to the client (SETTINGS), and a
 * lower one enforced once the client acknowledged it. */
void h2_session_reconfigure(struct h2_session *s);
/* drain_timeout ran out: every open stream is reset (CANCEL) and its exchange expires (an
 * unknown outcome if it may have executed), a last GOAWAY follows; the connection closes
 * once they left. */
void h2_session_expire(struct h2_session *s);

#endif
