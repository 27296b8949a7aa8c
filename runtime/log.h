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

#include "pt_util.h"   /* pt_fail, pt_now_s, PT_PRINTF */

void pt_log(const pt_logger *lg, int level, const char *fmt, ...) PT_PRINTF(3, 4);
/* Multi-line text: one logger call per line (plans, tables). */
void pt_log_text(const pt_logger *lg, int level, const char *text);
const char *pt_log_level_name(int level);

#define PT_LOGE(lg, ...) pt_log((lg), 0, __VA_ARGS__)
#define PT_LOGW(lg, ...) pt_log((lg), 1, __VA_ARGS__)
#define PT_LOGI(lg, ...) pt_log((lg), 2, __VA_ARGS__)
#define PT_LOGD(lg, ...) pt_log((lg), 3, __VA_ARGS__)

#endif
