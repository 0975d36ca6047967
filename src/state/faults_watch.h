/*
 * faults_watch: ends gray-test experiments by themselves (SPEC §11). On the main thread's
 * loop, every 100 ms, each upstream whose faults are on has its stop conditions judged
 * (faults_stop_reason over the window since it was switched on); the first one met switches
 * the faults off, is logged once, and stays as the "stopped" reason GET /faults shows.
 */
#ifndef RG_FAULTS_WATCH_H
#define RG_FAULTS_WATCH_H

struct event_base;

void faults_watch_start(struct event_base *base);
void faults_watch_stop(void);

#endif
