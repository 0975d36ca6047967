/*
 * admin: the admin listener (SPEC §7) on the main thread: /healthz /ready /metrics /stats
 * /config /retries. It parses requests with the same http.c as the proxy.
 */
#ifndef RG_ADMIN_H
#define RG_ADMIN_H

struct event_base;
struct config;
struct sockaddr;

enum admin_state { ADMIN_STARTING, ADMIN_READY, ADMIN_DRAINING };

int admin_start(struct event_base *base, const struct config *cfg);
void admin_reconfigure(const struct config *cfg);
/* A reload moving admin.listen: bind CFG's address into *FD (-1: unchanged or off) before
 * anything is switched; -1 after logging why it cannot. Then, once CFG is published,
 * admin_move() listens there (FD taken) and closes the old socket, whose connections close
 * after what they are answering. */
int admin_bind_moved(const struct config *old, const struct config *cfg, int *fd);
void admin_move(const struct config *old, const struct config *cfg, int fd);
void admin_set_state(enum admin_state st);
void admin_stop(void);
/* Serve one accepted connection FD from peer SA (what the listener does; the fuzzer calls it
 * with a socketpair). */
void admin_serve(struct event_base *base, int fd, const struct sockaddr *sa);

#endif
