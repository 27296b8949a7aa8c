/* log.h — leveled logging through the host's logger (pt_host_v1.log) or stderr. */
#ifndef PT_LOG_H
#define PT_LOG_H

#include <stddef.h>
#include <stdint.h>

typedef struct pt_logger {
    int level;                                   /* pt_log_level: messages above it are dropped */
    void (*fn)(void *user, int32_t level, const char *msg);  /* NULL = stderr */
    void *user;
    int rank;                                    /* prefixed when world > 1 (-1 = none) */
} pt_logger;

#if defined(__GNUC__)
#define PT_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define PT_PRINTF(a, b)
#endif

void pt_log(const pt_logger *lg, int level, const char *fmt, ...) PT_PRINTF(3, 4);
/* Multi-line text: one logger call per line (plans, tables). */
void pt_log_text(const pt_logger *lg, int level, const char *text);
const char *pt_log_level_name(int level);

/* Write one sentence into err (when err && errlen) and return code: the
 * runtime's error idiom, `return pt_fail(err, errlen, PT_ERR_..., "...", ...)`. */
int pt_fail(char *err, size_t errlen, int code, const char *fmt, ...) PT_PRINTF(4, 5);

#define PT_LOGE(lg, ...) pt_log((lg), 0, __VA_ARGS__)
#define PT_LOGW(lg, ...) pt_log((lg), 1, __VA_ARGS__)
#define PT_LOGI(lg, ...) pt_log((lg), 2, __VA_ARGS__)
#define PT_LOGD(lg, ...) pt_log((lg), 3, __VA_ARGS__)

#endif
