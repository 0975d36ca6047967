/*
 * listener: the proxy's listening sockets. Every worker has its own socket per configured
 * listener (SO_REUSEPORT: the kernel spreads connections), all bound by the main thread at
 * startup so that a bind error stops the process before it serves anything, and on a reload
 * that adds or moves a listener before the new config is published (a bind error fails it). max_connections
 * counts across workers: at the cap a worker's listener pauses until a connection closes.
 */
#ifndef RG_LISTENER_H
#define RG_LISTENER_H

#include <stdbool.h>
#include <stdint.h>

struct loop;
struct config;
struct sockaddr;
struct cfg_listener;
struct listener;

/* Bind one socket for listener L (main thread). Returns the fd or -1 with *err set, also
 * when another process listens on ADDR already (one instance per address; SO_REUSEPORT
 * groups only this process's sockets). */
int listener_bind(const char *addr, const char **err);
/* Bind ADDR for one socket only, no SO_REUSEPORT (the admin listener). */
int listener_bind_single(const char *addr, const char **err);

/* What a listener reports up: each accepted connection (FD taken), and where it reads the
 * current config (its max_connections) with that config's generation (*GEN: unique per
 * reload, never reused; the config stays valid while the generation is current). */
struct listener_owner {
	void (*on_accept)(void *arg, struct listener *l, const char *name, int fd,
	                  const struct sockaddr *sa, int salen);
	const struct config *(*config)(void *arg, uint64_t *gen);
	void *arg;
};

/* Wrap FD, bound to ADDR, on LOOP; NAME is the listener's name (its config is looked up by
 * it; a config that has NAME at another address makes this socket a stale one). */
struct listener *listener_new(struct loop *loop, const struct listener_owner *own,
                              const char *name, const char *addr, int fd);
void listener_free(struct listener *l);
/* Stop accepting (drain): the socket and the connections waiting at the cap close. */
void listener_stop(struct listener *l);
/* False when a reload removed it from the config or moved it to another address: it is
 * stopped then (and stays so). */
bool listener_check(struct listener *l);
/* Stopped, and every connection it accepted has closed: it may be freed. */
bool listener_done(const struct listener *l);
/* A connection it accepted closed: its place is free again. */
void listener_release(struct listener *l);

#endif
