/*
 * reply: retrygate's own responses.
 */
#include <stdio.h>
#include <string.h>

#include <event2/buffer.h>

#include "reply.h"
#include "util.h"

const char *reply_status_text(int status)
{
	switch (status) {
	case 100: return "Continue";
	case 200: return "OK";
	case 400: return "Bad Request";
	case 401: return "Unauthorized";
	case 403: return "Forbidden";
	case 404: return "Not Found";
	case 405: return "Method Not Allowed";
	case 408: return "Request Timeout";
	case 409: return "Conflict";
	case 413: return "Content Too Large";
	case 414: return "URI Too Long";
	case 422: return "Unprocessable Content";
	case 431: return "Request Header Fields Too Large";
	case 500: return "Internal Server Error";
	case 501: return "Not Implemented";
	case 502: return "Bad Gateway";
	case 503: return "Service Unavailable";
	case 504: return "Gateway Timeout";
	case 505: return "HTTP Version Not Supported";
	default:  return "Unknown";
	}
}

static void reply_error_impl(struct evbuffer *out, int status, const char *reason,
                             const char *upstream, int attempts, bool close, bool keep_alive_10,
                             const char *extra, bool content)
{
	char body[512], up[256];
	json_escape(up, sizeof(up), upstream, upstream ? strlen(upstream) : 0);
	int blen = snprintf(body, sizeof(body), "{\"error\":\"%s\",\"upstream\":\"%s\",\"attempts\":%d}\n",
	                    reason, up, attempts);
	evbuffer_add_printf(out,
	                    "HTTP/1.1 %d %s\r\n"
	                    "Content-Type: application/json\r\n"
	                    "Content-Length: %d\r\n"
	                    "X-Retrygate-Reason: %s\r\n"
	                    "X-Retrygate-Attempts: %d\r\n"
	                    "%s%s%s\r\n",
	                    status, reply_status_text(status), blen, reason, attempts,
	                    extra ? extra : "",
	                    close ? "Connection: close\r\n" : "",
	                    (!close && keep_alive_10) ? "Connection: keep-alive\r\n" : "");
	if (content)
		evbuffer_add(out, body, (size_t)blen);
}

void reply_error(struct evbuffer *out, int status, const char *reason, const char *upstream,
                 int attempts, bool close, bool keep_alive_10, const char *extra)
{
	reply_error_impl(out, status, reason, upstream, attempts, close, keep_alive_10, extra, true);
}

void reply_error_head(struct evbuffer *out, int status, const char *reason, const char *upstream,
                      int attempts, bool close, bool keep_alive_10, const char *extra)
{
	reply_error_impl(out, status, reason, upstream, attempts, close, keep_alive_10, extra, false);
}
