/*
 * test_exec_order.c — chunks follow the order the hooks use the blocks in, not
 * the order the host declared its parameters in.
 *
 * The hook contract runs forward over blocks 0, 1, ..., n-1, so that is the
 * order of first use. A host that declares its block weights interleaved
 * (0, 4, 1, 5, 2, 6, 3, 7: say, two stacks declared side by side) used to get
 * chunks packed in that order: a chunk of two blocks held blocks 0 and 4, a
 * forward through two buffer slots switched chunks at every block and gathered
 * each chunk twice (5505024 bytes uploaded in 3 steps against 2359296), and a
 * profiled plan under a small device failed (the bootstrap layout needed more
 * than the device). Here both hosts train the same
 * model through the hooks:
 *  - with the knobs fixed (everything streamed through two slots), the interleaved
 *    host uploads exactly the bytes per step the ordered host uploads;
 *  - with the plan searched under a small device, the interleaved host profiles and
 *    plans;
 *  - both end with bit-identical parameters (the layout changes where bytes
 *    live, never the math).
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "protrain.h"

static const pt_plugin_v1 *P = &protrain_plugin_v1;

enum { NB = 8, NEL = 16384, NPAR = NB + 2, STEPS = 4 };

typedef struct host {
    void *ctx;
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

static int32_t pass(void *user) {
    host *h = user;
    for (int b = 0; b < NB; b++) {
        int rc = P->block_pre_forward(h->ctx, b);
        if (!rc) rc = fwd(h, b) ? PT_ERR_INTERNAL : 0;
        if (!rc) rc = P->block_post_forward(h->ctx, b);
        if (rc) return rc;
    }
    for (int b = NB - 1; b >= 0; b--) {
        int rc = P->block_pre_backward(h->ctx, b);
        if (!rc) bwd(h, b);
        if (!rc) rc = P->block_post_backward(h->ctx, b);
        if (rc) return rc;
    }
    return 0;
}

/* CKPT: the block keeps no activations here, so a recompute is just its forward */
static int32_t recompute(void *user, int32_t b) {
    host *h = user;
    double keep = h->loss;
    int rc = fwd(h, b);
    h->loss = keep;
    return rc;
}

/* interleaved: declare blocks 0,4,1,5,2,6,3,7 (else 0..7), between two non-block params */
static void make(host *h, int interleave, const char *extra) {
    memset(h, 0, sizeof *h);
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
    char text[1024];
    int n = snprintf(text, sizeof text,
                     "[plugin]\nbackend = host\nlog_level = error\n[protrain]\n"
                     "chunk_size = 128KiB\n%s\n", extra);
    assert_int_equal(write(fd, text, (size_t)n), n);
    close(fd);
    pt_host_v1 hs;
    memset(&hs, 0, sizeof hs);
    hs.abi_version = PT_ABI_VERSION;
    hs.struct_size = sizeof hs;
    hs.world_size = 1;
    hs.user = h;
    hs.profile_step = pass;
    hs.recompute_block = recompute;
    if (P->init(path, &hs, &h->ctx)) fail_msg("init: %s", P->last_error(NULL));
    unlink(path);
    if (P->post_model_load(h->ctx, &h->m)) fail_msg("post_model_load: %s", P->last_error(h->ctx));
    pt_optim_v1 o = {.struct_size = sizeof o, .type = PT_OPTIM_ADAMW, .lr = 1e-2f,
                     .beta1 = NAN, .beta2 = NAN, .eps = NAN, .weight_decay = NAN,
                     .max_grad_norm = NAN};
    if (P->create_optimizer(h->ctx, &o)) fail_msg("create_optimizer: %s", P->last_error(h->ctx));
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

/* Trains STEPS steps; returns the H2D bytes of the last STEPS-1 and copies each
 * block's final weight (by block, not by declaration slot) into w[NB][NEL]. */
static uint64_t train(host *h, float (*w)[NEL], float *emb) {
    pt_stats_v1 s0 = {.struct_size = sizeof s0}, s1 = {.struct_size = sizeof s1};
    step(h, 0);
    assert_int_equal(P->get_stats(h->ctx, &s0), PT_OK);
    for (int s = 1; s < STEPS; s++) step(h, s);
    assert_int_equal(P->get_stats(h->ctx, &s1), PT_OK);
    for (int b = 0; b < NB; b++)
        assert_int_equal(P->read_param(h->ctx, h->of_block[b], w[b], NEL * sizeof(float)), PT_OK);
    assert_int_equal(P->read_param(h->ctx, 0, emb, NEL * sizeof(float)), PT_OK);
    return s1.h2d_bytes - s0.h2d_bytes;
}

static void done(host *h) {
    assert_int_equal(P->finalize(h->ctx), PT_OK);
    for (int i = 0; i < NPAR; i++) free(h->init[i]);
}

static float wa[NB][NEL], wb[NB][NEL], ea[NEL], eb[NEL];

static void test_streamed_fixed_knobs(void **st) {
    (void)st;
    const char *knobs = "auto_memory = false\nn_persist = 0\nn_buffer = 2\nn_swap = 0\n"
                        "n_checkpoint = 0";
    host a, b;
    make(&a, 0, knobs);
    uint64_t ha = train(&a, wa, ea);
    done(&a);
    make(&b, 1, knobs);
    uint64_t hb = train(&b, wb, eb);
    done(&b);
    /* every block chunk streams: two gathers per step per chunk at least */
    assert_true(ha >= (uint64_t)(STEPS - 1) * NB * NEL * sizeof(float));
    if (hb != ha)
        fail_msg("interleaved host uploaded %llu bytes in %d steps, ordered host %llu",
                 (unsigned long long)hb, STEPS - 1, (unsigned long long)ha);
    assert_memory_equal(wa, wb, sizeof wa);
    assert_memory_equal(ea, eb, sizeof ea);
}

/* A searched plan under a device too small for everything: profiles, plans,
 * trains, and matches the ordered host's plan and values. */
static void test_profiled_plan(void **st) {
    (void)st;
    const char *cfg = "[memory]\ndevice_capacity = 1MiB";
    host a, b;
    make(&a, 0, cfg);
    pt_stats_v1 sa = {.struct_size = sizeof sa}, sb = {.struct_size = sizeof sb};
    assert_int_equal(P->get_stats(a.ctx, &sa), PT_OK);
    uint64_t ha = train(&a, wa, ea);
    done(&a);
    make(&b, 1, cfg);
    assert_int_equal(P->get_stats(b.ctx, &sb), PT_OK);
    uint64_t hb = train(&b, wb, eb);
    done(&b);
    assert_true(sa.n_persist < sa.n_chunk);   /* the capacity forced streaming */
    assert_int_equal(sb.n_persist, sa.n_persist);
    assert_int_equal(sb.n_buffer, sa.n_buffer);
    assert_int_equal(sb.n_chunk, sa.n_chunk);
    assert_true(sb.pred_peak == sa.pred_peak);
    assert_true(hb == ha);
    assert_memory_equal(wa, wb, sizeof wa);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_streamed_fixed_knobs),
        cmocka_unit_test(test_profiled_plan),
    };
    return cmocka_run_group_tests_name("exec_order", tests, NULL, NULL);
}
