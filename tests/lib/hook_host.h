/*
 * hook_host.h — a host trainer written directly against the hook table, for
 * integration tests of planning: HH_NB blocks of one fp32 weight (HH_NEL elements)
 * between two non-block params, forward reads each weight, backward adds
 * 0.01*w + c_b into its gradient; profile_step and recompute_block given.
 * Options: declare the blocks interleaved (0, 4, 1, 5, ...), and make the
 * training steps differ from the profiled one (sleep in every block window,
 * allocate device memory the profile never sees).
 * Names: hh_ functions and types, HH_ constants.
 * Header-only (static functions, cmocka asserts): include once per test
 * program, after <cmocka.h>.
 */
#ifndef PT_HOOK_HOST_H
#define PT_HOOK_HOST_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "host_builder.h"
#include "protrain.h"

static const pt_plugin_v1 *const HH_P = &protrain_plugin_v1;

enum { HH_NB = 8,
       HH_NEL = 16384,
       HH_NPAR = HH_NB + 2,
       HH_STEPS = 4 };

typedef struct hh_opts {
    int interleave;            /* declare blocks 0, 4, 1, 5, 2, 6, 3, 7 */
    long sleep_us;             /* training steps: sleep this long in every block window */
    uint64_t hidden_bytes;     /* training steps: dev_alloc this much in block 0's forward,
                                  freed after its backward */
    const char *cache_dir;     /* [protrain] cache_dir, or NULL */
    uint64_t frag_bytes;       /* every step, profiled ones too: block 0's forward leaves a
                                  hole of this size below live blocks (alloc X, alloc Y =
                                  X/4, free X, alloc Z = 2X; Y and Z freed in its backward) */
    int frag_packed_profile;   /* ... but the profiled step skips X: same bytes, no hole */
} hh_opts;

typedef struct hh_host {
    void *ctx;
    hh_opts o;
    int profiling;             /* inside profile_step */
    void *hidden;
    void *frag[2];
    pt_param_v1 p[HH_NPAR];
    pt_model_v1 m;
    float *init[HH_NPAR];
    char names[HH_NPAR][32];
    int of_block[HH_NB];          /* param index of block b's weight */
    double loss;
} hh_host;

/* Block b's forward reads its weight; backward adds 0.01*w + c_b into its grad. */
static int hh_fwd(hh_host *h, int b) {
    const float *w = h->p[h->of_block[b]].data;
    double s = 0;
    for (int k = 0; k < HH_NEL; k += 97) s += w[k];
    h->loss += s * 1e-3;
    return isfinite(s) ? 0 : 1;
}

static void hh_bwd(hh_host *h, int b) {
    pt_param_v1 *q = &h->p[h->of_block[b]];
    float *g = q->grad;
    const float *w = q->data;
    for (int k = 0; k < HH_NEL; k++) g[k] += 0.01f * w[k] + 0.001f * (float)(b + 1);
}

static void hh_nonblock(hh_host *h, int backward) {
    int idx[2] = {0, HH_NPAR - 1};
    for (int j = 0; j < 2; j++) {
        pt_param_v1 *q = &h->p[idx[j]];
        if (backward) {
            float *g = q->grad;
            for (int k = 0; k < 1024; k++) g[k] += 0.002f;
        } else {
            h->loss += ((const float *)q->data)[0];
        }
    }
}

static void hh_nap(const hh_host *h) {
    if (h->profiling || h->o.sleep_us <= 0) return;
    struct timespec ts = {h->o.sleep_us / 1000000, (h->o.sleep_us % 1000000) * 1000};
    nanosleep(&ts, NULL);
}

static int32_t hh_pass(void *user) {
    hh_host *h = user;
    for (int b = 0; b < HH_NB; b++) {
        int rc = HH_P->block_pre_forward(h->ctx, b);
        if (!rc) rc = hh_fwd(h, b) ? PT_ERR_INTERNAL : 0;
        if (!rc && b == 0 && !h->profiling && h->o.hidden_bytes)
            rc = HH_P->dev_alloc(h->ctx, h->o.hidden_bytes, "scratch", &h->hidden);
        if (!rc && b == 0 && h->o.frag_bytes) {
            void *x = NULL;
            uint64_t f = h->o.frag_bytes;
            int hole = !(h->profiling && h->o.frag_packed_profile);
            if (hole) rc = HH_P->dev_alloc(h->ctx, f, "scratch", &x);
            if (!rc) rc = HH_P->dev_alloc(h->ctx, f / 4, "scratch", &h->frag[0]);
            if (!rc && hole) rc = HH_P->dev_free(h->ctx, x);
            if (!rc) rc = HH_P->dev_alloc(h->ctx, 2 * f, "scratch", &h->frag[1]);
        }
        hh_nap(h);
        if (!rc) rc = HH_P->block_post_forward(h->ctx, b);
        if (rc) return rc;
    }
    for (int b = HH_NB - 1; b >= 0; b--) {
        int rc = HH_P->block_pre_backward(h->ctx, b);
        if (!rc) hh_bwd(h, b);
        hh_nap(h);
        if (!rc && b == 0 && h->hidden) {
            rc = HH_P->dev_free(h->ctx, h->hidden);
            h->hidden = NULL;
        }
        for (int j = 0; j < 2 && !rc && b == 0; j++)
            if (h->frag[j]) {
                rc = HH_P->dev_free(h->ctx, h->frag[j]);
                h->frag[j] = NULL;
            }
        if (!rc) rc = HH_P->block_post_backward(h->ctx, b);
        if (rc) return rc;
    }
    return 0;
}

static void hh_log(void *user, int32_t level, const char *msg) {
    (void)user;
    (void)level;
    if (getenv("HH_LOG")) fprintf(stderr, "[plugin] %s\n", msg);
}

static int32_t hh_profile(void *user) {
    hh_host *h = user;
    h->profiling = 1;
    int32_t rc = hh_pass(h);
    h->profiling = 0;
    return rc;
}

/* CKPT: the block keeps no activations here, so a recompute is just its forward */
static int32_t hh_recompute(void *user, int32_t b) {
    hh_host *h = user;
    double keep = h->loss;
    int rc = hh_fwd(h, b);
    h->loss = keep;
    return rc;
}

/* Starts a trainer: init, post_model_load (profiles or hits the cache),
 * create_optimizer (AdamW, lr 1e-2). extra: INI lines appended. */
static void hh_make(hh_host *h, const hh_opts *o, const char *extra) {
    memset(h, 0, sizeof *h);
    h->o = *o;
    int interleave = o->interleave;
    int order[HH_NB];
    for (int i = 0; i < HH_NB; i++) order[i] = interleave ? (i % 2) * (HH_NB / 2) + i / 2 : i;
    for (int i = 0; i < HH_NPAR; i++) {
        int blk = (i == 0 || i == HH_NPAR - 1) ? -1 : order[i - 1];
        if (blk >= 0) {
            snprintf(h->names[i], sizeof h->names[i], "h.%d.w", blk);
            h->of_block[blk] = i;
        } else {
            snprintf(h->names[i], sizeof h->names[i], i ? "head" : "emb");
        }
        h->init[i] = malloc(HH_NEL * sizeof(float));
        assert_non_null(h->init[i]);
        for (int k = 0; k < HH_NEL; k++)   /* values depend on the param, not its position */
            h->init[i][k] = 0.001f * (float)(((blk + 3) * 31 + k) % 101) - 0.05f;
        h->p[i] = (pt_param_v1){.name = h->names[i], .dtype = PT_F32, .ndim = 1, .shape = {HH_NEL}, .block = blk, .trainable = 1, .tie = -1, .init = h->init[i]};
    }
    h->m = (pt_model_v1){.struct_size = sizeof h->m, .n_params = HH_NPAR, .params = h->p, .n_blocks = HH_NB, .batch = 1, .seq = 1, .arch = interleave ? "exec-order-interleaved" : "exec-order-ordered"};
    char text[2048];
    int n = snprintf(text, sizeof text,
                     "[plugin]\nbackend = host\nlog_level = %s\n[protrain]\n"
                     "chunk_size = 128KiB\n%s%s%s\n%s\n",
                     getenv("HH_LOG") ? getenv("HH_LOG") : "error", o->cache_dir ? "cache_dir = " : "",
                     o->cache_dir ? o->cache_dir : "", o->cache_dir ? "\n" : "", extra);
    assert_true(n > 0 && (size_t)n < sizeof text);
    pt_host_v1 hs = hb_host(h);
    hs.profile_step = hh_profile;
    hs.log = hh_log;
    hs.recompute_block = hh_recompute;
    h->ctx = hb_open(HH_P, text, &hs);
    if (HH_P->post_model_load(h->ctx, &h->m)) fail_msg("post_model_load: %s", HH_P->last_error(h->ctx));
    pt_optim_v1 od = {.struct_size = sizeof od, .type = PT_OPTIM_ADAMW, .lr = 1e-2f, .beta1 = NAN, .beta2 = NAN, .eps = NAN, .weight_decay = NAN, .max_grad_norm = NAN};
    if (HH_P->create_optimizer(h->ctx, &od)) fail_msg("create_optimizer: %s", HH_P->last_error(h->ctx));
}

static void hh_step(hh_host *h, int64_t s) {
    h->loss = 0;
    assert_int_equal(HH_P->pre_step(h->ctx, s, 0, 1), PT_OK);
    hh_nonblock(h, 0);
    if (hh_pass(h)) fail_msg("step %lld: %s", (long long)s, HH_P->last_error(h->ctx));
    hh_nonblock(h, 1);
    assert_int_equal(HH_P->optimizer_step(h->ctx, -1.0f), PT_OK);
    assert_int_equal(HH_P->post_step(h->ctx, s, (float)h->loss), PT_OK);
}

static void hh_done(hh_host *h) {
    assert_int_equal(HH_P->finalize(h->ctx), PT_OK);
    for (int i = 0; i < HH_NPAR; i++) free(h->init[i]);
}

#endif
