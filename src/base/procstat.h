/*
 * procstat: the process figures operators expect beside our own (resident memory, open file
 * descriptors, CPU time, start time), read from /proc/self when /metrics is scraped. Linux
 * only; a figure that cannot be read is -1.
 */
#ifndef RG_PROCSTAT_H
#define RG_PROCSTAT_H

struct proc_figures {
	double rss_bytes;           /* resident set size */
	double open_fds;            /* entries of /proc/self/fd */
	double cpu_seconds;         /* user + system */
	double start_time_s;        /* seconds since the Unix epoch */
};

void procstat_read(struct proc_figures *p);

#endif
