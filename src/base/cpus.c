/*
 * cpus: the CPU count behind `workers: auto`. sysconf's online count ignores both the
 * affinity mask (taskset, cpuset) and a container's CPU quota (cgroup cpu.max, or v1's
 * cpu.cfs_quota_us / cpu.cfs_period_us), so a sidecar limited to 2 CPUs on a 64-core node
 * would start 64 workers. The parsers are pure; cpus_cgroup_limit reads files under a root
 * it is given, so that tests can hand it a tree of their own.
 */
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/cpus.h"

/* ceil(quota / period); 0 when either is not a positive number */
static int quota_cpus(long long quota, long long period)
{
	if (quota <= 0 || period <= 0)
		return 0;
	long long n = (quota + period - 1) / period;
	return n > 1 << 20 ? 1 << 20 : (int)n;
}

static int parse_ll(const char *s, long long *out)
{
	char *end;
	if (!s)
		return -1;
	long long v = strtoll(s, &end, 10);
	if (end == s)
		return -1;
	while (*end == ' ' || *end == '\t' || *end == '\n')
		end++;
	if (*end)
		return -1;
	*out = v;
	return 0;
}

int cpus_from_cpu_max(const char *text)
{
	long long quota, period;
	char q[32];
	if (!text || sscanf(text, "%31s %lld", q, &period) != 2 || strcmp(q, "max") == 0 ||
	    parse_ll(q, &quota) != 0)
		return 0;
	return quota_cpus(quota, period);
}

int cpus_from_cfs(const char *quota, const char *period)
{
	long long q, p;
	if (parse_ll(quota, &q) != 0 || parse_ll(period, &p) != 0)
		return 0;
	return quota_cpus(q, p);
}

/* the first line of DIR/NAME into BUF; NULL if unreadable */
static const char *read_line(const char *dir, const char *name, char *buf, size_t cap)
{
	char path[4096];
	if ((size_t)snprintf(path, sizeof(path), "%s/%s", dir, name) >= sizeof(path))
		return NULL;
	FILE *f = fopen(path, "re");
	if (!f)
		return NULL;
	const char *r = fgets(buf, (int)cap, f);
	fclose(f);
	return r;
}

/* the quota in directory DIR, v2 (cpu.max) or v1 (cfs files); 0 if none */
static int dir_limit(const char *dir, int v2)
{
	char a[64], b[64];
	if (v2)
		return cpus_from_cpu_max(read_line(dir, "cpu.max", a, sizeof(a)));
	const char *q = read_line(dir, "cpu.cfs_quota_us", a, sizeof(a));
	const char *p = read_line(dir, "cpu.cfs_period_us", b, sizeof(b));
	return q && p ? cpus_from_cfs(q, p) : 0;
}

/* min over BASE/CG and each of its parents up to BASE itself; 0 if none limits */
static int walk_limit(const char *base, const char *cg, int v2)
{
	char dir[4096];
	if ((size_t)snprintf(dir, sizeof(dir), "%s%s", base, cg) >= sizeof(dir))
		return 0;
	size_t baselen = strlen(base);
	int best = 0;
	for (;;) {
		size_t n = strlen(dir);
		while (n > baselen && dir[n - 1] == '/')
			dir[--n] = 0;
		int lim = dir_limit(dir, v2);
		if (lim > 0 && (best == 0 || lim < best))
			best = lim;
		char *slash = strrchr(dir, '/');
		if (n <= baselen || !slash || (size_t)(slash - dir) < baselen)
			break;
		*slash = 0;
	}
	return best;
}

/* does the comma-separated list L[0..len) name controller "cpu"? */
static int names_cpu(const char *l, size_t len)
{
	for (const char *p = l, *end = l + len; p < end;) {
		const char *c = memchr(p, ',', (size_t)(end - p));
		size_t n = c ? (size_t)(c - p) : (size_t)(end - p);
		if (n == 3 && memcmp(p, "cpu", 3) == 0)
			return 1;
		p += n + 1;
	}
	return 0;
}

int cpus_cgroup_limit(const char *root, const char *self)
{
	int best = 0;
	/* /proc/self/cgroup: "ID:CONTROLLERS:PATH" per line; v2 is "0::PATH" */
	for (const char *ln = self; ln && *ln;) {
		const char *nl = strchr(ln, '\n');
		size_t len = nl ? (size_t)(nl - ln) : strlen(ln);
		const char *c1 = memchr(ln, ':', len);
		const char *c2 = c1 ? memchr(c1 + 1, ':', len - (size_t)(c1 + 1 - ln)) : NULL;
		if (c2) {
			char cg[2048], base[4096];
			size_t cl = len - (size_t)(c2 + 1 - ln), ctl = (size_t)(c2 - c1 - 1);
			if (cl < sizeof(cg)) {
				memcpy(cg, c2 + 1, cl);
				cg[cl] = 0;
				int lim = 0;
				if (ctl == 0 && c1 - ln == 1 && ln[0] == '0') {
					lim = walk_limit(root, cg, 1);
				} else if (names_cpu(c1 + 1, ctl) && ctl < 256) {
					struct stat st;
					snprintf(base, sizeof(base), "%s/%.*s", root, (int)ctl, c1 + 1);
					if (stat(base, &st) != 0)
						snprintf(base, sizeof(base), "%s/cpu", root);
					lim = walk_limit(base, cg, 0);
				}
				if (lim > 0 && (best == 0 || lim < best))
					best = lim;
			}
		}
		ln = nl ? nl + 1 : NULL;
	}
	return best;
}

int cpus_available(void)
{
	int n = 0;
	cpu_set_t set;
	if (sched_getaffinity(0, sizeof(set), &set) == 0)
		n = CPU_COUNT(&set);
	if (n < 1) {
		long online = sysconf(_SC_NPROCESSORS_ONLN);
		n = online < 1 ? 1 : online > 1 << 20 ? 1 << 20 : (int)online;
	}
	char self[8192];
	size_t len = 0;
	FILE *f = fopen("/proc/self/cgroup", "re");
	if (f) {
		len = fread(self, 1, sizeof(self) - 1, f);
		fclose(f);
	}
	self[len] = 0;
	int quota = cpus_cgroup_limit("/sys/fs/cgroup", self);
	return quota > 0 && quota < n ? quota : n;
}
