#include "lifecycle.h"

#include <stdio.h>

#include "protrain.h"
#include "pt_util.h"

static const char *hook_names[] = {"block_pre_forward", "block_post_forward",
                                   "block_pre_backward", "block_post_backward"};

const char *pt_lc_state_name(pt_lc_state s) {
    switch (s) {
    case PT_LC_INIT: return "initialised (expects post_model_load)";
    case PT_LC_LOADED: return "model loaded (expects create_optimizer)";
    case PT_LC_READY: return "between steps (expects pre_step)";
    case PT_LC_FWD: return "forward pass";
    case PT_LC_BWD: return "backward pass";
    case PT_LC_MICRO_DONE: return "micro-batch done (expects pre_step of the next micro-batch or optimizer_step)";
    case PT_LC_STEPPED: return "optimizer stepped (expects post_step)";
    }
    return "?";
}

/* What the state machine wants next, as text for error messages. */
static void expected(const pt_lifecycle *lc, char *buf, size_t n) {
    switch (lc->state) {
    case PT_LC_FWD:
        snprintf(buf, n, "%s(%d)", lc->inside ? "block_post_forward" : "block_pre_forward",
                 lc->block);
        break;
    case PT_LC_BWD:
        snprintf(buf, n, "%s(%d)", lc->inside ? "block_post_backward" : "block_pre_backward",
                 lc->block);
        break;
    case PT_LC_MICRO_DONE:
        if (lc->sx.micro + 1 < lc->sx.n_micro)
            snprintf(buf, n, "pre_step(step %lld, micro %d)", (long long)lc->sx.step, lc->sx.micro + 1);
        else
            snprintf(buf, n, "optimizer_step");
        break;
    default:
        snprintf(buf, n, "%s", pt_lc_state_name(lc->state));
    }
}

static int order_err(const pt_lifecycle *lc, const char *called, char *err, size_t errlen) {
    char want[160];
    expected(lc, want, sizeof want);
    return pt_fail(err, errlen, PT_ERR_ORDER,
                   "hook %s called out of order: expected %s (state: %s)", called, want,
                   pt_lc_state_name(lc->state));
}

int pt_lc_post_model_load(pt_lifecycle *lc, int n_blocks, char *err, size_t errlen) {
    if (lc->state != PT_LC_INIT) return order_err(lc, "post_model_load", err, errlen);
    lc->n_blocks = n_blocks;
    return PT_OK;
}

int pt_lc_create_optimizer(pt_lifecycle *lc, char *err, size_t errlen) {
    if (lc->state != PT_LC_LOADED) return order_err(lc, "create_optimizer", err, errlen);
    return PT_OK;
}

/* After the forward of the last block (or at once for a block-less model). */
static void forward_done(pt_lifecycle *lc) {
    if (lc->sx.eval) {
        lc->state = PT_LC_READY;
    } else if (lc->n_blocks > 0) {
        lc->state = PT_LC_BWD;
        lc->block = lc->n_blocks - 1;
    } else {
        lc->state = PT_LC_MICRO_DONE;
    }
    lc->inside = 0;
}

int pt_lc_pre_step(pt_lifecycle *lc, int64_t step, int32_t micro, int32_t n_micro, char *err,
                   size_t errlen) {
    char called[96];
    snprintf(called, sizeof called, "pre_step(step %lld, micro %d, n_micro %d)", (long long)step,
             micro, n_micro);
    int eval = (n_micro == 0);
    if (eval) {
        if (lc->state != PT_LC_READY) return order_err(lc, called, err, errlen);
    } else if (n_micro < 0 || micro < 0 || micro >= n_micro) {
        return pt_fail(err, errlen, PT_ERR_INVALID_ARG,
                       "%s: micro must be in [0, n_micro) and n_micro >= 1 (0 = evaluation)",
                       called);
    } else if (micro == 0) {
        if (lc->state != PT_LC_READY) return order_err(lc, called, err, errlen);
    } else if (lc->state != PT_LC_MICRO_DONE || lc->sx.micro + 1 != micro || lc->sx.step != step ||
               lc->sx.n_micro != n_micro) {
        return order_err(lc, called, err, errlen);
    }
    lc->sx.eval = eval;
    lc->sx.step = step;
    lc->sx.micro = micro;
    lc->sx.n_micro = n_micro;
    lc->state = PT_LC_FWD;
    lc->block = 0;
    lc->inside = 0;
    if (lc->n_blocks == 0) forward_done(lc);
    return PT_OK;
}

int pt_lc_block(pt_lifecycle *lc, int which, int32_t b, char *err, size_t errlen) {
    char called[64];
    snprintf(called, sizeof called, "%s(%d)", hook_names[which], b);
    /* outside a pass (before post_model_load, between steps) the block number
     * means nothing yet: the mistake is the order, whatever b is */
    if (lc->state != PT_LC_FWD && lc->state != PT_LC_BWD) return order_err(lc, called, err, errlen);
    if (b < 0 || b >= lc->n_blocks)
        return pt_fail(err, errlen, PT_ERR_INVALID_ARG,
                       "%s: block %d out of range (model has %d blocks)", hook_names[which], b,
                       lc->n_blocks);
    int fwd = which <= PT_HOOK_POST_FWD, pre = (which == PT_HOOK_PRE_FWD || which == PT_HOOK_PRE_BWD);
    pt_lc_state want = fwd ? PT_LC_FWD : PT_LC_BWD;
    if (lc->state != want || lc->block != b || lc->inside != !pre)
        return order_err(lc, called, err, errlen);
    if (pre) {
        lc->inside = 1;
        return PT_OK;
    }
    lc->inside = 0;
    if (fwd) {
        if (++lc->block == lc->n_blocks) forward_done(lc);
    } else if (--lc->block < 0) {
        lc->state = PT_LC_MICRO_DONE;
    }
    return PT_OK;
}

int pt_lc_optimizer_step(pt_lifecycle *lc, char *err, size_t errlen) {
    if (lc->state != PT_LC_MICRO_DONE || lc->sx.micro + 1 != lc->sx.n_micro)
        return order_err(lc, "optimizer_step", err, errlen);
    lc->state = PT_LC_STEPPED;
    return PT_OK;
}

int pt_lc_clip_grad_norm(const pt_lifecycle *lc, int with_norm, char *err, size_t errlen) {
    int ok = with_norm ? lc->state == PT_LC_MICRO_DONE && lc->sx.micro + 1 == lc->sx.n_micro
                       : lc->state >= PT_LC_READY && lc->state <= PT_LC_MICRO_DONE;
    return ok ? PT_OK
              : order_err(lc, with_norm ? "clip_grad_norm" : "clip_grad_norm(announce)", err,
                          errlen);
}

int pt_lc_write_param(const pt_lifecycle *lc, char *err, size_t errlen) {
    if (lc->state == PT_LC_LOADED || lc->state == PT_LC_READY) return PT_OK;
    return order_err(lc, "write_param (between steps only)", err, errlen);
}

int pt_lc_post_step(pt_lifecycle *lc, int64_t step, char *err, size_t errlen) {
    char called[64];
    snprintf(called, sizeof called, "post_step(step %lld)", (long long)step);
    if (lc->state != PT_LC_STEPPED) return order_err(lc, called, err, errlen);
    lc->state = PT_LC_READY;
    return PT_OK;
}

int pt_lc_in_block(const pt_lifecycle *lc, int32_t b) {
    return (lc->state == PT_LC_FWD || lc->state == PT_LC_BWD) && lc->inside && lc->block == b;
}
