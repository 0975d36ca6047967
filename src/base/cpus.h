/*
 * cpus: how many CPUs this process may really use, for `workers: auto`: the CPUs of its
 * affinity mask, lowered to the CPU quota of its cgroup (a container's --cpus), rounded up.
 */
#ifndef RG_CPUS_H
#define RG_CPUS_H

/* cgroup v2 cpu.max text ("QUOTA PERIOD" or "max PERIOD"): ceil(QUOTA / PERIOD), 0 if none. */
int cpus_from_cpu_max(const char *text);
/* cgroup v1 cpu.cfs_quota_us and cpu.cfs_period_us texts: the same; quota -1 is none. */
int cpus_from_cfs(const char *quota, const char *period);
/* The tightest quota on the way from the process's cgroup up to the hierarchy's root, under
 * ROOT (/sys/fs/cgroup), SELF being /proc/self/cgroup's text; v2 and v1 layouts. 0 if none. */
int cpus_cgroup_limit(const char *root, const char *self);
/* min(affinity CPUs, cgroup quota), at least 1. */
int cpus_available(void);

#endif
