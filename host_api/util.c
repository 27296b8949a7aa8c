/*
 * util.c — pt_fail, the tree's one error idiom (pt_util.h).
 */
#include "pt_util.h"

#include <stdarg.h>
#include <stdio.h>

int pt_fail(char *err, size_t errlen, int code, const char *fmt, ...) {
    if (err && errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return code;
}
