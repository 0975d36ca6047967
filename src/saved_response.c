/*
 * saved_response: a retried response kept for the client (see saved_response.h).
 */
#include <stdlib.h>
#include <string.h>

#include <event2/buffer.h>

#include "attempt.h"
#include "saved_response.h"
#include "util.h"

void saved_clear(struct saved_response *s)
{
	if (s->a)
		attempt_free(s->a);
	s->a = NULL;
	if (s->body)
		evbuffer_free(s->body);
	free(s->hdrs);
	free(s->strings);
	memset(s, 0, sizeof(*s));
}

void saved_keep(struct saved_response *s, const struct http_head *h, struct attempt *a)
{
	saved_clear(s);
	size_t total = h->reason_len + 1;
	for (int i = 0; i < h->nhdrs; i++)
		total += h->hdrs[i].nlen + h->hdrs[i].vlen + 2;
	s->strings = xmalloc(total);
	s->hdrs = xcalloc((size_t)h->nhdrs + 1, sizeof(*s->hdrs));
	char *p = s->strings;
	s->h = *h;
	memcpy(p, h->reason, h->reason_len);
	s->h.reason = p;
	p += h->reason_len + 1;
	for (int i = 0; i < h->nhdrs; i++) {
		s->hdrs[i] = h->hdrs[i];
		memcpy(p, h->hdrs[i].name, h->hdrs[i].nlen);
		s->hdrs[i].name = p;
		p += h->hdrs[i].nlen + 1;
		memcpy(p, h->hdrs[i].value, h->hdrs[i].vlen);
		s->hdrs[i].value = p;
		p += h->hdrs[i].vlen + 1;
	}
	s->h.hdrs = s->hdrs;
	s->body = evbuffer_new();
	s->valid = true;
	s->a = a;
}
