/*
 * stats.c — the one median every measurement in the runtime takes (profiler
 * passes, copy latencies, calibration steps).
 */
#include "base.h"

/* Insertion sort in place: n is a handful of samples. */
double pt_median(double *x, int n) {
    if (n <= 0) return 0;
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && x[j - 1] > x[j]; j--) {
            double tmp = x[j];
            x[j] = x[j - 1];
            x[j - 1] = tmp;
        }
    return n % 2 ? x[n / 2] : 0.5 * (x[n / 2 - 1] + x[n / 2]);
}
