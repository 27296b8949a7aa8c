/*
 * hook_host.h — a host trainer written directly against the hook table, for
 * integration tests of planning: NB blocks of one fp32 weight (NEL elements)
 * between two non-block params, forward reads each weight, backward adds
 * 0.01*w + c_b into its gradient; profile_step and recompute_block given.
 * Options: declare the blocks interleaved (0, 4, 1, 5, ...), and make the
 * training steps differ from the profiled one (sleep in every block window,
 * allocate device memory the profile never sees).
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

#include "protrain.h"

static const pt_plugin_v1 *P = &protrain_plugin_v1;

enum { NB = 8, NEL = 16384, NPAR = NB + 2, STEPS = 4 };

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

typedef struct host {
    void *ctx;
    hh_opts o;
    int profiling;             /* inside profile_step */
    void *hidden;
    void *frag[2];
    pt_param_v1 p[NPAR];
    pt_model_v1 m;
    float *init[NPAR];
    char names[NPAR][32];
    int of_block[NB];          /* param index of block b's weight */
    double loss;
} host;

/* Block b's forward reads its weight; backward adds 0.01*w + c_b into its grad. */
static int fwd(host *h, int b) {
    const float *w = h->p[h->of_block[b]].data;
    double s = 0;
    for (int k = 0; k < NEL; k += 97) s += w[k];
    h->loss += s * 1e-3;
    return isfinite(s) ? 0 : 1;
}

static void bwd(host *h, int b) {
    pt_param_v1 *q = &h->p[h->of_block[b]];
    float *g = q->grad;
    const float *w = q->data;
    for (int k = 0; k < NEL; k++) g[k] += 0.01f * w[k] + 0.001f * (float)(b + 1);
}

static void nonblock(host *h, int backward) {
    int idx[2] = {0, NPAR - 1};
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

static void nap(const host *h) {
    if (h->profiling || h->o.sleep_us <= 0) return;
    struct timespec ts = {h->o.sleep_us / 1000000, (h->o.sleep_us % 1000000) * 1000};
    nanosleep(&ts, NULL);
}

static int32_t pass(void *user) {
    host *h = user;
    for (int b = 0; b < NB; b++) {
        int rc = P->block_pre_forward(h->ctx, b);
        if (!rc) rc = fwd(h, b) ? PT_ERR_INTERNAL : 0;
        if (!rc && b == 0 && !h->profiling && h->o.hidden_bytes)
            rc = P->dev_alloc(h->ctx, h->o.hidden_bytes, "scratch", &h->hidden);
        if (!rc && b == 0 && h->o.frag_bytes) {
            void *x = NULL;
            uint64_t f = h->o.frag_bytes;
            int hole = !(h->profiling && h->o.frag_packed_profile);
            if (hole) rc = P->dev_alloc(h->ctx, f, "scratch", &x);
            if (!rc) rc = P->dev_alloc(h->ctx, f / 4, "scratch", &h->frag[0]);
            if (!rc && hole) rc = P->dev_free(h->ctx, x);
            if (!rc) rc = P->dev_alloc(h->ctx, 2 * f, "scratch", &h->frag[1]);
        }
        nap(h);
        if (!rc) rc = P->block_post_forward(h->ctx, b);
        if (rc) return rc;
    }
    for (int b = NB - 1; b >= 0; b--) {
        int rc = P->block_pre_backward(h->ctx, b);
        if (!rc) bwd(h, b);
        nap(h);
        if (!rc && b == 0 && h->hidden) {
            rc = P->dev_free(h->ctx, h->hidden);
            h->hidden = NULL;
        }
        for (int j = 0; j < 2 && !rc && b == 0; j++)
            if (h->frag[j]) {
                rc = P->dev_free(h->ctx, h->frag[j]);
                h->frag[j] = NULL;
            }
        if (!rc) rc = P->block_post_backward(h->ctx, b);
        if (rc) return rc;
    }
    return 0;
}

static void hh_log(void *user, int32_t level, const char *msg) {
    (void)user;
    (void)level;
    if (getenv("HH_LOG")) fprintf(stderr, "[plugin] %s\n", msg);
}

static int32_t profile(void *user) {
    host *h = user;
    h->profiling = 1;
    int32_t rc = pass(h);
    h->profiling = 0;
    return rc;
}

/* CKPT: the block keeps no activations here, so a recompute is just its forward */
static int32_t recompute(void *user, int32_t b) {
    host *h = user;
    double keep = h->loss;
    int rc = fwd(h, b);
    h->loss = keep;
    return rc;
}

/* Starts a trainer: init, post_model_load (profiles or hits the cache),
 * create_optimizer (AdamW, lr 1e-2). extra: INI lines appended. */
static void make(host *h, const hh_opts *o, const char *extra) {
    memset(h, 0, sizeof *h);
    h->o = *o;
    int interleave = o->interleave;
    int order[NB];
    for (int i = 0; i < NB; i++) order[i] = interleave ? (i % 2) * (NB / 2) + i / 2 : i;
    for (int i = 0; i < NPAR; i++) {
        int blk = (i == 0 || i == NPAR - 1) ? -1 : order[i - 1];
        if (blk >= 0) {
            snprintf(h->names[i], sizeof h->names[i], "h.%d.w", blk);
            h->of_block[blk] = i;
        } else {
            snprintf(h->names[i], sizeof h->names[i], i ? "head" : "emb");
        }
        h->init[i] = malloc(NEL * sizeof(float));
        assert_non_null(h->init[i]);
        for (int k = 0; k < NEL; k++)   /* values depend on the param, not its position */
            h->init[i][k] = 0.001f * (float)(((blk + 3) * 31 + k) % 101) - 0.05f;
        h->p[i] = (pt_param_v1){.name = h->names[i], .dtype = PT_F32, .ndim = 1,
                                .shape = {NEL}, .block = blk, .trainable = 1, .tie = -1,
                                .init = h->init[i]};
    }
    h->m = (pt_model_v1){.struct_size = sizeof h->m, .n_params = NPAR, .params = h->p,
                         .n_blocks = NB, .batch = 1, .seq = 1,
                         .arch = interleave ? "exec-order-interleaved" : "exec-order-ordered"};
    char path[] = "/tmp/pt_exec_order_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    char text[2048];
    int n = snprintf(text, sizeof text,
                     "[plugin]\nbackend = host\nlog_level = %s\n[protrain]\n"
                     "chunk_size = 128KiB\n%s%s%s\n%s\n",
                     getenv("HH_LOG") ? getenv("HH_LOG") : "error", o->cache_dir ? "cache_dir = " : "",
                     o->cache_dir ? o->cache_dir : "", o->cache_dir ? "\n" : "", extra);
    assert_int_equal(write(fd, text, (size_t)n), n);
    close(fd);
    pt_host_v1 hs;
    memset(&hs, 0, sizeof hs);
    hs.abi_version = PT_ABI_VERSION;
    hs.struct_size = sizeof hs;
    hs.world_size = 1;
    hs.user = h;
    hs.profile_step = profile;
    hs.log = hh_log;
    hs.recompute_block = recompute;
    if (P->init(path, &hs, &h->ctx)) fail_msg("init: %s", P->last_error(NULL));
    unlink(path);
    if (P->post_model_load(h->ctx, &h->m)) fail_msg("post_model_load: %s", P->last_error(h->ctx));
    pt_optim_v1 od = {.struct_size = sizeof od, .type = PT_OPTIM_ADAMW, .lr = 1e-2f,
                     .beta1 = NAN, .beta2 = NAN, .eps = NAN, .weight_decay = NAN,
                     .max_grad_norm = NAN};
    if (P->create_optimizer(h->ctx, &od)) fail_msg("create_optimizer: %s", P->last_error(h->ctx));
}

static void step(host *h, int64_t s) {
    h->loss = 0;
    assert_int_equal(P->pre_step(h->ctx, s, 0, 1), PT_OK);
    nonblock(h, 0);
    if (pass(h)) fail_msg("step %lld: %s", (long long)s, P->last_error(h->ctx));
    nonblock(h, 1);
    assert_int_equal(P->optimizer_step(h->ctx, -1.0f), PT_OK);
    assert_int_equal(P->post_step(h->ctx, s, (float)h->loss), PT_OK);
}

static void done(host *h) {
    assert_int_equal(P->finalize(h->ctx), PT_OK);
    for (int i = 0; i < NPAR; i++) free(h->init[i]);
}

#endif
