/*
 * route: pick the route of a listener for a request (SPEC §2): first match wins; host is
 * matched without its port, ignoring case, exactly or as "*.suffix" (any depth, not the bare
 * suffix); path_prefix is a plain string prefix.
 */
#ifndef RG_ROUTE_H
#define RG_ROUTE_H

#include <stdbool.h>
#include <stddef.h>

struct cfg_listener;
struct cfg_route;

struct cfg_route *route_match(const struct cfg_listener *l, const char *host, size_t hlen,
                              const char *path, size_t plen);
bool route_host_matches(const char *pattern, const char *host, size_t hlen);

#endif
