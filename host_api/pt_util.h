/*
 * pt_util.h — the two helpers every layer shares (host_api is the bottom layer,
 * so the loader, the plugin, the backends and sample_host all link util.c and
 * clock.c):
 *
 *  - pt_fail: the tree's one error idiom. A failing function writes one
 *    sentence naming the cause into the caller's buffer and returns a
 *    pt_status: `return pt_fail(err, errlen, PT_ERR_OOM, "...", ...);`.
 *  - pt_now_s: the tree's one clock (CLOCK_MONOTONIC, seconds as a double),
 *    for every host-side duration: profiler windows, throttles, benchmarks.
 *
 * Not part of the ABI: a host needs protrain.h only.
 */
#ifndef PT_UTIL_H
#define PT_UTIL_H

#include <stddef.h>

#if defined(__GNUC__)
#define PT_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define PT_PRINTF(a, b)
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* Format one sentence into err (when err && errlen; always terminated,
 * truncated safely) and return code unchanged. */
int pt_fail(char *err, size_t errlen, int code, const char *fmt, ...) PT_PRINTF(4, 5);

/* Monotonic seconds since an arbitrary origin. */
double pt_now_s(void);

#ifdef __cplusplus
}
#endif

#endif
