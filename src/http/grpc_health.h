/*
 * grpc_health: the two messages of the standard gRPC health protocol (grpc.health.v1), by
 * hand: a HealthCheckRequest { string service = 1; } out, a HealthCheckResponse
 * { ServingStatus status = 1; } in. Two fields do not need a protobuf library. Pure: no I/O,
 * no state; the prober (state/probe.c) asks here.
 */
#ifndef RG_GRPC_HEALTH_H
#define RG_GRPC_HEALTH_H

#include <stddef.h>
#include <stdint.h>

#define GRPC_HEALTH_PATH "/grpc.health.v1.Health/Check"

enum grpc_health_status {
	GRPC_HEALTH_UNKNOWN = 0,
	GRPC_HEALTH_SERVING = 1,
	GRPC_HEALTH_NOT_SERVING = 2,
	GRPC_HEALTH_SERVICE_UNKNOWN = 3,
};

/* The request body for SERVICE (N bytes): one length-prefixed gRPC message (5-byte prefix,
 * uncompressed) holding HealthCheckRequest{service}. Returns its length, or 0 when it does not
 * fit in CAP. An empty service is the empty message (the whole server). */
size_t grpc_health_request(const char *service, size_t n, uint8_t *out, size_t cap);

/* Decodes a HealthCheckResponse (the protobuf, without the gRPC prefix): the status (the last
 * field 1 wins, as protobuf says; an empty message is UNKNOWN, 0; a value outside int is
 * INT32_MAX), unknown fields skipped; -1 when malformed (truncated, field 1 not a varint, a
 * group or reserved wire type). */
int grpc_health_decode(const uint8_t *msg, size_t n);

/* The status in a response body (BODY, N bytes): exactly one uncompressed length-prefixed
 * message, decoded as above; -1 when the body is not that. */
int grpc_health_reply(const uint8_t *body, size_t n);

/* "UNKNOWN", "SERVING", "NOT_SERVING", "SERVICE_UNKNOWN", or "?" for another value. */
const char *grpc_health_status_name(int status);

#endif
