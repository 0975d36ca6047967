/*
 * saved_response: a retried response kept for the client (see saved_response.h).
 */
#include <stdlib.h>
#include <string.h>

#include <event2/buffer.h>

#include "upstream/attempt.h"
#include "proxy/saved_response.h"
#include "base/util.h"

void saved_clear(struct saved_response *s)
{
	if (s->a)
		attempt_free(s->a);
	s->a = NULL;
	if (s->body)
		evbuffer_free(s->body);
	free(s->hdrs);
	free(s->strings);
	free(s->trailers);
	free(s->tstrings);
	memset(s, 0, sizeof(*s));
}

/* Deep copies of N fields FROM into *OUT (array) and *MEM (their strings, NUL after each). */
void saved_copy_fields(const struct http_hdr *from, int n, struct http_hdr **out, char **mem,
                        size_t extra)
{
	size_t total = extra;
	for (int i = 0; i < n; i++)
		total += from[i].nlen + from[i].vlen + 2;
	char *p = *mem = xmalloc(total + 1);
	struct http_hdr *o = *out = xcalloc((size_t)n + 1, sizeof(*o));
	p += extra;
	for (int i = 0; i < n; i++) {
		o[i] = from[i];
		memcpy(p, from[i].name, from[i].nlen);
		o[i].name = p;
		p += from[i].nlen + 1;
		memcpy(p, from[i].value, from[i].vlen);
		o[i].value = p;
		p += from[i].vlen + 1;
	}
}

void saved_keep(struct saved_response *s, const struct http_head *h, struct attempt *a)
{
	saved_clear(s);
	saved_copy_fields(h->hdrs, h->nhdrs, &s->hdrs, &s->strings, h->reason_len + 1);
	s->h = *h;
	memcpy(s->strings, h->reason, h->reason_len);
	s->strings[h->reason_len] = 0;
	s->h.reason = s->strings;
	s->h.hdrs = s->hdrs;
	s->body = evbuffer_new();
	s->valid = true;
	s->a = a;
}

void saved_keep_trailers(struct saved_response *s, const struct http_hdr *t, int n)
{
	free(s->trailers);
	free(s->tstrings);
	saved_copy_fields(t, n, &s->trailers, &s->tstrings, 0);
	s->ntrailers = n;
}
