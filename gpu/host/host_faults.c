/*
 * host_faults.c — failure injection for the host backend's non-allocation ops
 * (pt_gpu_config.fail_op / fail_op_at, INI [testing] fail_op = <op>:<n>),
 * the counterpart of fail_alloc_at in the device wrapper: the n-th call of the
 * chosen op returns PT_ERR_BACKEND, once, and changes nothing (no work queued,
 * nothing waited for), which is what a failed driver call looks like to the
 * runtime. Tests use it to show every such status reaches a hook.
 *
 * The op names double as the words the runtime's error sentences use, so the
 * table lives in the gpu layer where both the INI checker (plugin/) and the
 * backend read it.
 */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "host_backend.h"
#include "protrain.h"

static const char *const op_names[PT_GPU_OP_COUNT] = {
    "none",         "memset",       "memcpy",            "event_sync",
    "stream_sync",  "convert",      "adamw",             "sqnorm",
    "event_record", "stream_wait_event", "event_create", "event_elapsed_ms",
    "host_fn",      "eigh",         "rekls_ew",
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

int pt_hb_inject(hb *h, int op) {
    if (!h || h->cfg.fail_op != op || h->cfg.fail_op_at <= 0) return 0;
    pthread_mutex_lock(&h->mu);
    uint64_t n = ++h->op_calls;
    pt_gpu_log_fn log = h->log;
    void *user = h->log_user;
    pthread_mutex_unlock(&h->mu);
    if (n != (uint64_t)h->cfg.fail_op_at) return 0;
    if (log) {
        char msg[200];
        snprintf(msg, sizeof msg,
                 "host backend: injected failure: %s call #%d returns PT_ERR_BACKEND "
                 "([testing] fail_op = %s:%d)",
                 pt_gpu_op_name(op), h->cfg.fail_op_at, pt_gpu_op_name(op), h->cfg.fail_op_at);
        log(user, PT_LOG_WARN, msg);
    }
    return 1;
}

void pt_hb_set_log(void *impl, pt_gpu_log_fn fn, void *user) {
    hb *h = impl;
    if (!h) return;
    pthread_mutex_lock(&h->mu);
    h->log = fn;
    h->log_user = user;
    pthread_mutex_unlock(&h->mu);
}
