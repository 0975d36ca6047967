/*
 * probe: active health (SPEC §13), one prober for the process on the main thread's event base.
 * Every `interval` it asks each endpoint address of an upstream with active health on:
 * kind http sends `GET path` with the upstream's Host (any 2xx is healthy), kind grpc calls
 * grpc.health.v1.Health/Check for `service` (SERVING is healthy). `unhealthy_after` failures
 * in a row (or no answer within `timeout`) take the address out of rotation until
 * `healthy_after` successes in a row. Probes speak the upstream's protocol and TLS (SNI, CA,
 * verification, client certificate) as its attempts do; over HTTP/2 a non-zero grpc-status
 * is a failure. Probes are not attempts: no budget token, no in-flight slot, no request
 * metrics.
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
