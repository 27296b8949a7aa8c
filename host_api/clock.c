/*
 * clock.c — pt_now_s, the tree's one clock (pt_util.h): CLOCK_MONOTONIC in
 * seconds as a double, so durations never jump with the wall clock.
 */
#include <time.h>

#include "pt_util.h"

double pt_now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
