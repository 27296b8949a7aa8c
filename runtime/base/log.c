#include "base.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

const char *pt_log_level_name(int level) {
    static const char *names[] = {"error", "warn", "info", "debug", "trace"};
    return (level >= 0 && level <= 4) ? names[level] : "?";
}

static void emit(const pt_logger *lg, int level, const char *msg) {
    if (lg && lg->fn) {
        lg->fn(lg->user, level, msg);
        return;
    }
    if (lg && lg->rank >= 0)
        fprintf(stderr, "[protrain %s r%d] %s\n", pt_log_level_name(level), lg->rank, msg);
    else
        fprintf(stderr, "[protrain %s] %s\n", pt_log_level_name(level), msg);
}

void pt_log(const pt_logger *lg, int level, const char *fmt, ...) {
    if (lg && level > lg->level) return;
    char buf[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    emit(lg, level, buf);
}

void pt_log_text(const pt_logger *lg, int level, const char *text) {
    if (lg && level > lg->level) return;
    char line[1024];
    while (text && *text) {
        const char *nl = strchr(text, '\n');
        size_t n = nl ? (size_t)(nl - text) : strlen(text);
        if (n >= sizeof line) n = sizeof line - 1;
        memcpy(line, text, n);
        line[n] = 0;
        emit(lg, level, line);
        text = nl ? nl + 1 : text + strlen(text);
    }
}
