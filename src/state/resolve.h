/*
 * resolve: the addresses of every endpoint name (SPEC §13), one resolver for the process, on
 * the main thread's event base (workers never wait on DNS). /etc/hosts first, else A and AAAA
 * through evdns (the `resolvers`, or /etc/resolv.conf), again when the records' TTL runs out
 * (clamped to 1 s - 5 min); a failed lookup keeps the last good addresses. Answers go into the
 * upstream registry (upstream_name_set), which retires the addresses that went away.
 */
#ifndef RG_RESOLVE_H
#define RG_RESOLVE_H

#include <stdint.h>

struct event_base;
struct config;

#define RESOLVE_TTL_MIN_US   (1 * 1000000LL)
#define RESOLVE_TTL_MAX_US   (300 * 1000000LL)
#define RESOLVE_HOSTS_TTL_US (5 * 1000000LL)

/* Start on BASE with CFG's resolvers; 0 or -1. */
int resolve_start(struct event_base *base, const struct config *cfg);
/* After a reload: use CFG's resolvers (names new to it are looked up on the next tick). */
void resolve_reconfigure(const struct config *cfg);
/* At startup, before traffic: run BASE until every name had an answer, or TIMEOUT passed. */
void resolve_settle(struct event_base *base, int64_t timeout_us);
void resolve_stop(void);

/* The TTL a lookup's answer is trusted for (pure): TTL_S seconds, clamped. */
int64_t resolve_ttl_us(int ttl_s);

#endif
