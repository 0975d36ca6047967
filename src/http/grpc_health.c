/*
 * grpc_health: HealthCheckRequest / HealthCheckResponse in protobuf's wire format (see
 * grpc_health.h). Only what two one-field messages need: varints, and skipping the wire
 * types a newer server might add.
 */
#include <stdbool.h>
#include <string.h>

#include "http/grpc_health.h"

enum { WT_VARINT = 0, WT_I64 = 1, WT_LEN = 2, WT_I32 = 5 };

static size_t put_varint(uint64_t v, uint8_t *out)
{
	size_t n = 0;
	do {
		out[n] = (uint8_t)(v & 0x7f);
		v >>= 7;
		if (v)
			out[n] |= 0x80;
		n++;
	} while (v);
	return n;
}

/* A varint at *P (before END): advances *P; false when truncated or over 10 bytes. */
static bool get_varint(const uint8_t **p, const uint8_t *end, uint64_t *v)
{
	*v = 0;
	for (int shift = 0; shift < 70; shift += 7) {
		if (*p >= end)
			return false;
		uint8_t b = *(*p)++;
		*v |= (uint64_t)(b & 0x7f) << shift;
		if (!(b & 0x80))
			return true;
	}
	return false;
}

size_t grpc_health_request(const char *service, size_t n, uint8_t *out, size_t cap)
{
	uint8_t len[10];
	size_t ll = put_varint(n, len);
	size_t msg = n ? 1 + ll + n : 0;        /* proto3: an empty string is not written */
	if (cap < 5 || msg > cap - 5)
		return 0;
	out[0] = 0;                             /* not compressed */
	out[1] = (uint8_t)(msg >> 24);
	out[2] = (uint8_t)(msg >> 16);
	out[3] = (uint8_t)(msg >> 8);
	out[4] = (uint8_t)msg;
	if (n) {
		out[5] = (1 << 3) | WT_LEN;
		memcpy(out + 6, len, ll);
		memcpy(out + 6 + ll, service, n);
	}
	return 5 + msg;
}

int grpc_health_decode(const uint8_t *msg, size_t n)
{
	const uint8_t *p = msg, *end = msg + n;
	int status = GRPC_HEALTH_UNKNOWN;
	while (p < end) {
		uint64_t key, v;
		if (!get_varint(&p, end, &key) || key >> 3 == 0)
			return -1;
		switch (key & 7) {
		case WT_VARINT:
			if (!get_varint(&p, end, &v))
				return -1;
			if (key >> 3 == 1)      /* an enum is int32; a negative one is sign-extended */
				status = v <= INT32_MAX ? (int)v : INT32_MAX;
			continue;
		case WT_I64:
			v = 8;
			break;
		case WT_I32:
			v = 4;
			break;
		case WT_LEN:
			if (!get_varint(&p, end, &v))
				return -1;
			break;
		default:                        /* groups (3, 4) and the reserved 6, 7 */
			return -1;
		}
		if (key >> 3 == 1 || v > (uint64_t)(end - p))
			return -1;              /* field 1 of another wire type, or truncated */
		p += v;
	}
	return status;
}

int grpc_health_reply(const uint8_t *body, size_t n)
{
	if (n < 5 || body[0] != 0)
		return -1;                      /* truncated, or compressed (we offered no encoding) */
	uint32_t len = (uint32_t)body[1] << 24 | (uint32_t)body[2] << 16 | (uint32_t)body[3] << 8 |
	               body[4];
	if (len != n - 5)
		return -1;
	return grpc_health_decode(body + 5, len);
}

const char *grpc_health_status_name(int status)
{
	static const char *const names[] = { "UNKNOWN", "SERVING", "NOT_SERVING",
	                                     "SERVICE_UNKNOWN" };
	return status >= 0 && status < 4 ? names[status] : "?";
}
