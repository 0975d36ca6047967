/*
 * health_cli: the --health URL mode, a command-line client (a HEALTHCHECK for containers
 * without curl). Not endpoint health: that is policy/outlier.c and state/probe.c.
 */
#ifndef RG_HEALTH_CLI_H
#define RG_HEALTH_CLI_H

/* 0 if URL answers a 2xx within a few seconds, else 1 (and a line on stderr). */
int health_check(const char *url);

#endif
