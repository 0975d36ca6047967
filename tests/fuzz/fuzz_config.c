/*
 * libFuzzer target for the configuration loader: any bytes go through libyaml, the node tree
 * and the schema; a config that loads is also reported (--check) and dumped as JSON (/config),
 * then freed. ASan/LeakSanitizer check every error path frees what it allocated.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "config/config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	/* the messages are formatted (that code is under test too) but not kept */
	static FILE *sink;
	struct config *c;

	if (!sink && !(sink = fopen("/dev/null", "w")))
		abort();
	c = config_load_buffer("fuzz.yaml", (const char *)data, size, sink);
	if (c) {
		char *json;
		config_report(c, sink);
		json = config_to_json(c);
		fputs(json, sink);
		free(json);
		config_unref(config_ref(c));
		config_unref(c);
	}
	return 0;
}
