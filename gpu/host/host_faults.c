/*
 * host_faults.c — failure injection for the host backend's non-allocation ops
 * (pt_gpu_config.fail_op / fail_op_at, INI [testing] fail_op = <op>:<n>),
 * the counterpart of fail_alloc_at in the device wrapper: the n-th call of the
 * chosen op returns PT_ERR_BACKEND, once, and changes nothing (no work queued,
 * nothing waited for), which is what a failed driver call looks like to the
 * runtime. Tests use it to show every such status reaches a hook. The op names
 * and the "<op>:<n>" reader: gpu/fail_op.c.
 */
#include <stdio.h>

#include "host_backend.h"
#include "protrain.h"

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
