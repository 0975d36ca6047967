/*
 * h2_mem: nghttp2's allocator on a loop's block lists (see h2_mem.h).
 */
#include <stdint.h>
#include <string.h>

#include "base/h2_mem.h"
#include "base/loop.h"

static void *ng_malloc(size_t n, void *ud)
{
	return loop_blk_alloc(ud, n);
}

static void ng_free(void *p, void *ud)
{
	loop_blk_free(ud, p);
}

static void *ng_calloc(size_t k, size_t n, void *ud)
{
	if (n && k > SIZE_MAX / n)
		return NULL;
	void *p = loop_blk_alloc(ud, k * n);
	if (p)
		memset(p, 0, k * n);
	return p;
}

static void *ng_realloc(void *p, size_t n, void *ud)
{
	return loop_blk_realloc(ud, p, n);
}

nghttp2_mem h2_mem(struct loop *l)
{
	nghttp2_mem m = { l, ng_malloc, ng_free, ng_calloc, ng_realloc };
	return m;
}
