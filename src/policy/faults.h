/*
 * faults: the pure half of SPEC §11 fault injection. faults_pick() says which rule, if any,
 * one attempt gets from one random draw; faults_stop_reason() says whether a stop condition
 * is met by the figures of the window since the faults were switched on. No globals, no
 * clock reads, no atomics: the caller owns the switch (upstream.h) and the figures (stats.h).
 */
#ifndef RG_FAULTS_H
#define RG_FAULTS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "config/config.h"

/* "connect-failure" "abort" "delay" "lost-response" */
const char *faults_kind_name(int kind);

/* The rule attempt of METHOD to PATH (PLEN bytes) gets, or NULL. One draw RAND (64 random
 * bits) per attempt: the rules that match (method listed or none listed, path starting with
 * path_prefix) each own a slice of [0, 100) as wide as their percent, in rule order, and the
 * draw lands in at most one. So each rule hits its percent of the attempts it matches (as long
 * as the matching rules add up to 100 at most), and the first rule wins where they overlap. */
const struct cfg_fault_rule *faults_pick(const struct cfg_faults *f, const char *method,
                                         const char *path, size_t plen, uint64_t rand);

/* How long an attempt hit by R waits before its fault shows (SPEC §11), PER_TRY_US its per-try
 * timeout and REMAINING_US the deadline's time left when it started: a delay its length, but
 * the per-try timeout when that comes first (and before the deadline): then *CUT, the wait
 * ends as a timeout; abort and connect-failure none (lost-response waits for no timer). */
int64_t faults_wait_us(const struct cfg_fault_rule *r, int64_t per_try_us, int64_t remaining_us,
                       bool *cut);

/* The figures a stop condition is judged on: the part of the last 60 s since the faults were
 * switched on. */
struct faults_window {
	int64_t on_for_us;              /* how long the faults have been on */
	uint64_t responses;             /* client-visible responses */
	uint64_t failures;              /* of those, 5xx */
	uint64_t first_attempts;
	uint64_t attempts;              /* first attempts, retries and hedges */
};

/* At least this many client responses (for the success rate) or first attempts (for the
 * amplification) before either ratio is judged: a handful of requests proves nothing. */
#define FAULTS_STOP_MIN_REQUESTS 20

enum faults_stop { FS_NONE, FS_AFTER, FS_SUCCESS_RATE, FS_AMPLIFICATION };

/* The first stop condition of F met by W (after, min_success_rate, max_amplification, in that
 * order; a condition set to 0 is off), or FS_NONE. */
enum faults_stop faults_stop_reason(const struct cfg_faults *f, const struct faults_window *w);
/* "after" "min_success_rate" "max_amplification"; NULL for FS_NONE */
const char *faults_stop_name(enum faults_stop s);

#endif
