/*
 * h2_mem: nghttp2's allocator on a loop's block lists (loop_blk_alloc), for the client
 * sessions (h2_session.c) and the upstream connections (h2_conn.c) alike: a session lives and
 * dies on one loop, and malloc + free cost several times a list pop.
 */
#ifndef RG_H2_MEM_H
#define RG_H2_MEM_H

#include <nghttp2/nghttp2.h>

struct loop;

/* The allocator to hand to nghttp2_session_*_new3() (nghttp2 copies it). */
nghttp2_mem h2_mem(struct loop *l);

#endif
