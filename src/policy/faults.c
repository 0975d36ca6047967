/*
 * faults: which fault an attempt gets, and when an experiment stops (see faults.h). Pure.
 */
#include <string.h>

#include "policy/faults.h"

const char *faults_kind_name(int kind)
{
	static const char *const names[FAULT_NKINDS] = {
		[FAULT_CONNECT_FAILURE] = "connect-failure", [FAULT_ABORT] = "abort",
		[FAULT_DELAY] = "delay", [FAULT_LOST_RESPONSE] = "lost-response",
	};
	return kind >= 0 && kind < FAULT_NKINDS ? names[kind] : "";
}

static bool rule_matches(const struct cfg_fault_rule *r, const char *method, const char *path,
                         size_t plen)
{
	if (r->nmethods > 0) {
		bool listed = false;
		for (int i = 0; i < r->nmethods && !listed; i++)
			listed = strcmp(r->methods[i], method) == 0;
		if (!listed)
			return false;
	}
	size_t n = r->path_prefix ? strlen(r->path_prefix) : 0;
	return n <= plen && memcmp(path, r->path_prefix, n) == 0;
}

const struct cfg_fault_rule *faults_pick(const struct cfg_faults *f, const char *method,
                                         const char *path, size_t plen, uint64_t rand)
{
	/* 53 random bits: a uniform draw in [0, 100) fine enough for fractions of a percent */
	double u = (double)(rand >> 11) * (1.0 / 9007199254740992.0) * 100.0;
	double from = 0;
	for (int i = 0; i < f->nrules; i++) {
		const struct cfg_fault_rule *r = &f->rules[i];
		if (r->percent <= 0 || !rule_matches(r, method, path, plen))
			continue;
		if (u < from + r->percent)
			return u >= from ? r : NULL;
		from += r->percent;
	}
	return NULL;
}

int64_t faults_wait_us(const struct cfg_fault_rule *r, int64_t per_try_us, int64_t remaining_us,
                       bool *cut)
{
	*cut = false;
	if (r->kind != FAULT_DELAY)
		return 0;
	if (per_try_us < remaining_us && r->delay_us >= per_try_us) {
		*cut = true;
		return per_try_us;
	}
	return r->delay_us;
}

enum faults_stop faults_stop_reason(const struct cfg_faults *f, const struct faults_window *w)
{
	if (f->stop_after_us > 0 && w->on_for_us >= f->stop_after_us)
		return FS_AFTER;
	/* the sums are read while workers add to them: never let a failure count go negative */
	uint64_t ok = w->responses > w->failures ? w->responses - w->failures : 0;
	if (f->stop_min_success_rate > 0 && w->responses >= FAULTS_STOP_MIN_REQUESTS &&
	    (double)ok < f->stop_min_success_rate * (double)w->responses)
		return FS_SUCCESS_RATE;
	if (f->stop_max_amplification > 0 && w->first_attempts >= FAULTS_STOP_MIN_REQUESTS &&
	    (double)w->attempts > f->stop_max_amplification * (double)w->first_attempts)
		return FS_AMPLIFICATION;
	return FS_NONE;
}

const char *faults_stop_name(enum faults_stop s)
{
	switch (s) {
	case FS_AFTER: return "after";
	case FS_SUCCESS_RATE: return "min_success_rate";
	case FS_AMPLIFICATION: return "max_amplification";
	default: return NULL;
	}
}
