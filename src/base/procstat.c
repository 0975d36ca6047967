/*
 * procstat: /proc/self/statm, /proc/self/stat, /proc/self/fd and the boot time of /proc/stat
 * turned into the figures of procstat.h. Called on the admin thread at scrape time; it only
 * reads small files, never blocks on the network.
 */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/procstat.h"

/* the whole of a small /proc file, NUL-terminated, into BUF; its length or -1 */
static long slurp(const char *path, char *buf, size_t cap)
{
	FILE *f = fopen(path, "r");
	if (!f)
		return -1;
	size_t n = fread(buf, 1, cap - 1, f);
	fclose(f);
	buf[n] = '\0';
	return (long)n;
}

static double boot_time_s(void)
{
	char buf[16384];
	if (slurp("/proc/stat", buf, sizeof buf) < 0)
		return -1;
	const char *p = strstr(buf, "\nbtime ");
	return p ? strtod(p + 7, NULL) : -1;
}

static double count_fds(void)
{
	DIR *d = opendir("/proc/self/fd");
	if (!d)
		return -1;
	double n = 0;
	for (struct dirent *e; (e = readdir(d));)
		if (e->d_name[0] != '.')
			n++;
	closedir(d);
	return n - 1;               /* not the descriptor opendir holds */
}

void procstat_read(struct proc_figures *p)
{
	char buf[1024];
	double ticks = (double)sysconf(_SC_CLK_TCK);
	long page = sysconf(_SC_PAGESIZE);
	unsigned long long size, resident, utime, stime, start;

	p->rss_bytes = p->cpu_seconds = p->start_time_s = -1;
	p->open_fds = count_fds();
	if (slurp("/proc/self/statm", buf, sizeof buf) > 0 &&
	    sscanf(buf, "%llu %llu", &size, &resident) == 2)
		p->rss_bytes = (double)resident * (double)page;
	/* after "pid (comm) ": the comm may hold spaces and parentheses, the last ')' ends it;
	 * then state is field 3, utime 14, stime 15, starttime 22 */
	const char *q = slurp("/proc/self/stat", buf, sizeof buf) > 0 ? strrchr(buf, ')') : NULL;
	if (q && ticks > 0 &&
	    sscanf(q + 1, " %*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu %*d %*d %*d %*d "
	                  "%*d %*d %llu", &utime, &stime, &start) == 3) {
		p->cpu_seconds = (double)(utime + stime) / ticks;
		double boot = boot_time_s();
		if (boot >= 0)
			p->start_time_s = boot + (double)start / ticks;
	}
}
