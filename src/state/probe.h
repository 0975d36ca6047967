/*
 * probe: active health (SPEC §13), one prober for the process on the main thread's event base.
 * Every `interval` it sends `GET path` with the upstream's Host to each endpoint address of an
 * upstream whose health.active.path is set; `unhealthy_after` failures in a row (no 2xx within
 * `timeout`) take the address out of rotation until `healthy_after` successes in a row. Probes
 * are not attempts: no budget token, no in-flight slot, no request metrics. They speak plain
 * HTTP/1.1: an upstream with tls: is not probed (passive health only).
 */
#ifndef RG_PROBE_H
#define RG_PROBE_H

#include <stdbool.h>

struct event_base;

int probe_start(struct event_base *base);
void probe_stop(void);

/* The status of a response's first line ("HTTP/1.1 200 OK"), or 0 when it is not one (pure). */
int probe_parse_status(const char *line, int len);

#endif
