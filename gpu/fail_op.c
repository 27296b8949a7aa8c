/*
 * fail_op.c — the names of the backend ops (gpu.h PT_GPU_OP_*) and the reader of
 * a failure-injection spec "<op>:<n>" (INI [testing] fail_op). The op names
 * double as the words the runtime's error sentences use, so the table lives in
 * the gpu layer where the INI checker (plugin/), the runtime and the host
 * backend's injection (host/host_faults.c) all read it.
 */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu.h"

static const char *const op_names[PT_GPU_OP_COUNT] = {
    "none",
    "memset",
    "memcpy",
    "event_sync",
    "stream_sync",
    "convert",
    "adamw",
    "sqnorm",
    "event_record",
    "stream_wait_event",
    "event_create",
    "event_elapsed_ms",
    "host_fn",
    "eigh",
    "rekls_ew",
};

const char *pt_gpu_op_name(int op) {
    return op >= 0 && op < PT_GPU_OP_COUNT ? op_names[op] : "invalid";
}

int pt_gpu_fail_op_parse(const char *spec, int *op, int *at, char *why, size_t whylen) {
    int o = PT_GPU_OP_NONE, n = 0;
    if (spec && *spec && strcmp(spec, "none") != 0) {
        const char *colon = strchr(spec, ':');
        size_t len = colon ? (size_t)(colon - spec) : 0;
        for (int k = 1; colon && k < PT_GPU_OP_COUNT; k++)
            if (strlen(op_names[k]) == len && !strncmp(spec, op_names[k], len)) o = k;
        char *end = NULL;
        long v = colon ? strtol(colon + 1, &end, 10) : 0;
        if (o == PT_GPU_OP_NONE || !end || end == colon + 1 || *end || v < 1 || v > INT_MAX) {
            if (why && whylen)
                snprintf(why, whylen,
                         "expected <op>:<n> with n >= 1 and op one of memset, memcpy, "
                         "event_sync, stream_sync, convert, adamw, sqnorm, event_record, "
                         "stream_wait_event, event_create, event_elapsed_ms, host_fn, eigh, "
                         "rekls_ew (or none)");
            return -1;
        }
        n = (int)v;
    }
    if (op) *op = o;
    if (at) *at = n;
    return 0;
}
