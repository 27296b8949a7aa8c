/*
 * lifecycle.h — the hook-order state machine (host contract 1 in protrain.h).
 * Each check returns PT_OK or PT_ERR_ORDER with a sentence naming the hook
 * called and the hook(s) the plugin expected.
 */
#ifndef PT_LIFECYCLE_H
#define PT_LIFECYCLE_H

#include <stddef.h>
#include <stdint.h>

#include "base/base.h"   /* pt_step_state */

typedef enum pt_lc_state {
    PT_LC_INIT = 0,       /* after init: expects post_model_load */
    PT_LC_LOADED,         /* expects create_optimizer */
    PT_LC_READY,          /* between steps: expects pre_step */
    PT_LC_FWD,            /* forward pass: block hooks in increasing order */
    PT_LC_BWD,            /* backward pass: block hooks in decreasing order */
    PT_LC_MICRO_DONE,     /* backward done: next micro-batch's pre_step or optimizer_step */
    PT_LC_STEPPED         /* optimizer_step done: expects post_step */
} pt_lc_state;

typedef struct pt_lifecycle {
    pt_lc_state state;
    int n_blocks;
    int block;            /* next block expected (FWD: ascending, BWD: descending) */
    int inside;           /* 1 between pre_X(block) and post_X(block) */
    pt_step_state sx;     /* the plugin's one copy of the step state (the runtime reads it) */
} pt_lifecycle;

enum { PT_HOOK_PRE_FWD = 0,
       PT_HOOK_POST_FWD,
       PT_HOOK_PRE_BWD,
       PT_HOOK_POST_BWD };

const char *pt_lc_state_name(pt_lc_state s);
int pt_lc_post_model_load(pt_lifecycle *lc, int n_blocks, char *err, size_t errlen);
int pt_lc_create_optimizer(pt_lifecycle *lc, char *err, size_t errlen);
int pt_lc_pre_step(pt_lifecycle *lc, int64_t step, int32_t micro, int32_t n_micro, char *err,
                   size_t errlen);
int pt_lc_block(pt_lifecycle *lc, int which, int32_t b, char *err, size_t errlen);
int pt_lc_optimizer_step(pt_lifecycle *lc, char *err, size_t errlen);
/* clip_grad_norm: with a norm to return, where optimizer_step may come (after
 * the last micro-batch's backward); announcing (no norm), inside a step or
 * between steps. Changes no state. */
int pt_lc_clip_grad_norm(const pt_lifecycle *lc, int with_norm, char *err, size_t errlen);
/* write_param: between steps only (after post_model_load or post_step). */
int pt_lc_write_param(const pt_lifecycle *lc, char *err, size_t errlen);
int pt_lc_post_step(pt_lifecycle *lc, int64_t step, char *err, size_t errlen);
/* 1 when block b's params may be touched for a forward (inside its window). */
int pt_lc_in_block(const pt_lifecycle *lc, int32_t b);

#endif
