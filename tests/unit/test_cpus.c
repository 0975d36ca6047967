/*
 * test_cpus: the CPU quota behind `workers: auto` -- cpu.max and the v1 CFS files as tables,
 * then cgroup trees made under a temporary directory as /sys/fs/cgroup would lay them out.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "base/cpus.h"

struct max_row {
	const char *why;
	const char *text;
	int cpus;
};

static const struct max_row max_rows[] = {
	{ "no quota", "max 100000\n", 0 },
	{ "one CPU exactly", "100000 100000\n", 1 },
	{ "1.5 CPUs round up to 2", "150000 100000\n", 2 },
	{ "a small share still gets one worker", "10000 100000", 1 },
	{ "four CPUs with a 50 ms period", "200000 50000\n", 4 },
	{ "an empty file is no quota", "", 0 },
	{ "a single word is no quota", "150000", 0 },
	{ "garbage is no quota", "lots of cpus", 0 },
	{ "a zero period is no quota", "100000 0", 0 },
};

static void test_cpu_max_table(void **state)
{
	for (size_t i = 0; i < sizeof(max_rows) / sizeof(max_rows[0]); i++) {
		int got = cpus_from_cpu_max(max_rows[i].text);
		if (got != max_rows[i].cpus)
			fail_msg("%s: \"%s\" gave %d, want %d", max_rows[i].why, max_rows[i].text, got,
			         max_rows[i].cpus);
	}
	assert_int_equal(cpus_from_cpu_max(NULL), 0);
}

struct cfs_row {
	const char *why;
	const char *quota, *period;
	int cpus;
};

static const struct cfs_row cfs_rows[] = {
	{ "v1 without a quota says -1", "-1\n", "100000\n", 0 },
	{ "two CPUs", "200000\n", "100000\n", 2 },
	{ "2.5 CPUs round up", "250000\n", "100000\n", 3 },
	{ "an unreadable period is no quota", "200000\n", "", 0 },
	{ "a word is no quota", "none", "100000", 0 },
};

static void test_cfs_table(void **state)
{
	for (size_t i = 0; i < sizeof(cfs_rows) / sizeof(cfs_rows[0]); i++) {
		int got = cpus_from_cfs(cfs_rows[i].quota, cfs_rows[i].period);
		if (got != cfs_rows[i].cpus)
			fail_msg("%s: gave %d, want %d", cfs_rows[i].why, got, cfs_rows[i].cpus);
	}
}

/* ---------------------------------------------------------------- cgroup trees */

static char root[256];

static void put(const char *rel, const char *text)
{
	char path[512];
	snprintf(path, sizeof(path), "%s/%s", root, rel);
	/* make the parent directories */
	for (char *p = path + strlen(root) + 1; (p = strchr(p, '/')); p++) {
		*p = 0;
		mkdir(path, 0755);
		*p = '/';
	}
	FILE *f = fopen(path, "w");
	assert_non_null(f);
	fputs(text, f);
	fclose(f);
}

static void tree_make(void)
{
	snprintf(root, sizeof(root), "/tmp/test_cpus.XXXXXX");
	assert_non_null(mkdtemp(root));
}

static void tree_remove(void)
{
	char cmd[300];
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", root);
	assert_int_equal(system(cmd), 0);
}

/* a tree: up to 6 files (path under the root, text), /proc/self/cgroup's text, the answer */
struct tree_row {
	const char *why;
	const char *files[6][2];
	const char *self;
	int cpus;
};

static const struct tree_row tree_rows[] = {
	{ "v2 in a container with a cgroup namespace: \"0::/\" is the root",
	  { { "cpu.max", "150000 100000\n" } }, "0::/\n", 2 },
	{ "v2: the tightest quota on the way up wins",
	  { { "cpu.max", "max 100000\n" }, { "kubepods/cpu.max", "300000 100000\n" },
	    { "kubepods/pod1/cpu.max", "max 100000\n" },
	    { "kubepods/pod1/sidecar/cpu.max", "max 100000\n" } },
	  "0::/kubepods/pod1/sidecar\n", 3 },
	{ "v2: max everywhere is no limit",
	  { { "cpu.max", "max 100000\n" }, { "user.slice/cpu.max", "max 100000\n" } },
	  "0::/user.slice\n", 0 },
	{ "v2: a host path missing in the namespace falls back to the root",
	  { { "cpu.max", "100000 100000\n" } }, "0::/not/here\n", 1 },
	{ "v1: cpu,cpuacct with a quota on the container's cgroup",
	  { { "cpu,cpuacct/docker/abc/cpu.cfs_quota_us", "50000\n" },
	    { "cpu,cpuacct/docker/abc/cpu.cfs_period_us", "100000\n" },
	    { "cpu,cpuacct/cpu.cfs_quota_us", "-1\n" },
	    { "cpu,cpuacct/cpu.cfs_period_us", "100000\n" } },
	  "12:memory:/docker/abc\n4:cpu,cpuacct:/docker/abc\n1:name=systemd:/docker/abc\n0::/\n", 1 },
	{ "v1: cpu mounted on its own",
	  { { "cpu/cpu.cfs_quota_us", "400000\n" }, { "cpu/cpu.cfs_period_us", "100000\n" } },
	  "3:cpuset:/\n2:cpuacct:/\n1:cpu:/\n", 4 },
	{ "v1: cpuacct alone is not the cpu controller",
	  { { "cpuacct/cpu.cfs_quota_us", "100000\n" }, { "cpuacct/cpu.cfs_period_us", "100000\n" } },
	  "2:cpuacct:/\n", 0 },
	{ "nothing in /proc/self/cgroup", { { NULL, NULL } }, "", 0 },
	{ "a line without colons", { { NULL, NULL } }, "garbage without colons", 0 },
	{ "no /proc/self/cgroup text at all", { { NULL, NULL } }, NULL, 0 },
};

static void test_tree_table(void **state)
{
	for (size_t i = 0; i < sizeof(tree_rows) / sizeof(tree_rows[0]); i++) {
		const struct tree_row *r = &tree_rows[i];
		tree_make();
		for (int f = 0; f < 6 && r->files[f][0]; f++)
			put(r->files[f][0], r->files[f][1]);
		int got = cpus_cgroup_limit(root, r->self);
		tree_remove();
		if (got != r->cpus)
			fail_msg("%s: gave %d, want %d", r->why, got, r->cpus);
	}
}

static void test_available_is_at_least_one(void **state)
{
	assert_true(cpus_available() >= 1);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_cpu_max_table),
		cmocka_unit_test(test_cfs_table),
		cmocka_unit_test(test_tree_table),
		cmocka_unit_test(test_available_is_at_least_one),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
