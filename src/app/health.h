/*
 * health: the --health URL mode (a HEALTHCHECK for containers without curl).
 */
#ifndef RG_HEALTH_H
#define RG_HEALTH_H

/* 0 if URL answers a 2xx within a few seconds, else 1 (and a line on stderr). */
int health_check(const char *url);

#endif
