/*
 * route: listener route matching (pure).
 */
#include <string.h>
#include <strings.h>

#include "config/config.h"
#include "proxy/route.h"

/* "host", "host:port", "[v6]:port" -> the name part */
static size_t host_without_port(const char *h, size_t n)
{
	if (n > 0 && h[0] == '[') {
		const char *rb = memchr(h, ']', n);
		return rb ? (size_t)(rb - h) + 1 : n;
	}
	const char *colon = memchr(h, ':', n);
	return colon ? (size_t)(colon - h) : n;
}

bool route_host_matches(const char *pattern, const char *host, size_t hlen)
{
	hlen = host_without_port(host, hlen);
	/* a trailing dot names the same host */
	if (hlen > 0 && host[hlen - 1] == '.')
		hlen--;
	size_t plen = strlen(pattern);
	if (plen >= 2 && pattern[0] == '*' && pattern[1] == '.') {
		size_t slen = plen - 1;          /* ".example.com" */
		return hlen > slen && strncasecmp(host + hlen - slen, pattern + 1, slen) == 0;
	}
	return hlen == plen && strncasecmp(host, pattern, plen) == 0;
}

struct cfg_route *route_match(const struct cfg_listener *l, const char *host, size_t hlen,
                              const char *path, size_t plen)
{
	for (int i = 0; i < l->nroutes; i++) {
		struct cfg_route *r = &l->routes[i];
		if (r->host && (!host || !route_host_matches(r->host, host, hlen)))
			continue;
		size_t pl = strlen(r->path_prefix);
		/* "OPTIONS *" asks about the server as a whole: the catch-all route "/" answers it */
		if (plen == 1 && path[0] == '*') {
			if (pl == 1 && r->path_prefix[0] == '/')
				return r;
			continue;
		}
		if (pl > plen || memcmp(path, r->path_prefix, pl) != 0)
			continue;
		return r;
	}
	return NULL;
}
