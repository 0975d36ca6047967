/*
 * fuzz_grpc_health: libFuzzer target for the hand-written grpc.health.v1 messages
 * (http/grpc_health.c), which read bytes an upstream sends to the prober.
 *
 * Input: any bytes, taken as a HealthCheckResponse and as a service name. Invariants checked,
 * beyond ASan and UBSan being quiet:
 *  - decode gives -1 or a status >= 0;
 *  - the same bytes behind a gRPC prefix (uncompressed, their length) decode the same, and a
 *    prefix that lies about the length, or says "compressed", is refused;
 *  - a message repeated twice decodes as once (protobuf merges: the last field 1 wins, and it
 *    is the same one), and one followed by "status = S" decodes as S;
 *  - a request made for the input as a service name has the prefix its length says, and is
 *    never taken for a response with a status (field 1 is a string there), unless empty.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "http/grpc_health.h"

#define MAX_IN 4096

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static size_t put_prefix(uint8_t *out, uint8_t flag, size_t n)
{
	out[0] = flag;
	out[1] = (uint8_t)(n >> 24);
	out[2] = (uint8_t)(n >> 16);
	out[3] = (uint8_t)(n >> 8);
	out[4] = (uint8_t)n;
	return 5;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static uint8_t buf[2 * MAX_IN + 32];
	if (size > MAX_IN)
		return 0;
	int s = grpc_health_decode(data, size);
	if (s < -1)
		abort();

	/* behind an honest prefix: the same answer; a dishonest or compressed one: refused */
	size_t p = put_prefix(buf, 0, size);
	memcpy(buf + p, data, size);
	if (grpc_health_reply(buf, p + size) != s)
		abort();
	put_prefix(buf, 0, size + 1);
	if (grpc_health_reply(buf, p + size) != -1)
		abort();
	put_prefix(buf, 1, size);
	if (grpc_health_reply(buf, p + size) != -1)
		abort();

	if (s >= 0) {
		/* twice is once; then "status = 2" (field 1, varint) overrides it */
		memcpy(buf, data, size);
		memcpy(buf + size, data, size);
		if (grpc_health_decode(buf, 2 * size) != s)
			abort();
		buf[size] = 0x08;
		buf[size + 1] = GRPC_HEALTH_NOT_SERVING;
		if (grpc_health_decode(buf, size + 2) != GRPC_HEALTH_NOT_SERVING)
			abort();
	}

	/* the input as a service name: a request with a true prefix, never read as a status */
	size_t n = grpc_health_request((const char *)data, size, buf, sizeof(buf));
	if (n == 0)
		abort();        /* MAX_IN always fits */
	size_t len = ((size_t)buf[1] << 24) | ((size_t)buf[2] << 16) | ((size_t)buf[3] << 8) | buf[4];
	if (buf[0] != 0 || len + 5 != n)
		abort();
	if (grpc_health_reply(buf, n) != (size == 0 ? GRPC_HEALTH_UNKNOWN : -1))
		abort();
	(void)grpc_health_status_name(s);
	return 0;
}
