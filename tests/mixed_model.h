/*
 * mixed_model.h — the 16-bit model that test_mixed and test_rekls_mixed train
 * through the plugin table against an fp32-master reference: a non-block
 * embedding (64 elements) and per block a weight (96 elements: 12 x 8 and
 * 8 x 12 as matrices, or flat) and a bias (8), bf16 or fp16, with fixed initial
 * values. The header opens the plugin on a given INI text, runs one step's hooks
 * adding the test's gradient values, and compares what the plugin returns with
 * the test's fp32 masters rounded to the dtype, bit for bit. The test keeps its
 * gradient values and its reference update.
 * Header-only (static functions, cmocka asserts): include once per test
 * program, after <cmocka.h>.
 */
#ifndef PT_MIXED_MODEL_H
#define PT_MIXED_MODEL_H

#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "kernels_hd.h"
#include "protrain.h"

static const pt_plugin_v1 *P = &protrain_plugin_v1;

enum { NP = 5, NB = 2, MAXN = 96 };
static const char *NAMES[NP] = {"emb", "b0.w", "b0.b", "b1.w", "b1.b"};
static const int64_t ROWS[NP] = {64, 12, 8, 8, 8}, COLS[NP] = {1, 8, 1, 12, 1};
static const int BLOCK[NP] = {-1, 0, 0, 1, 1};
static int64_t numel(int i) { return ROWS[i] * COLS[i]; }

/* The two placements each test runs: every chunk resident (device optimizer)
 * and every chunk streamed through one 4 KiB buffer (CPU optimizer). */
#define RESIDENT "[protrain]\nforce_all_persistent = true\n"
#define STREAMED "[protrain]\nauto_memory = false\nn_persist = 0\nn_buffer = 1\nn_swap = 0\nn_checkpoint = 0\nchunk_size = 4KiB\n"

typedef struct model {
    pt_param_v1 p[NP];
    pt_model_v1 m;
    uint16_t init[NP][MAXN];   /* [param][element], 16-bit values of the dtype */
} model;

/* Gradient value of element k of param i at step s; exactly representable in
 * the dtype, so the plugin and the reference see the same numbers. */
typedef float (*mixed_grad_fn)(int i, int k, int s, int dtype);

/* matrices: the block weights are 2-D (ROWS x COLS), else every param is 1-D. */
static void mixed_make(model *t, int dtype, int matrices, const char *arch) {
    memset(t, 0, sizeof *t);
    for (int i = 0; i < NP; i++) {
        int two_d = matrices && COLS[i] > 1;
        t->p[i].name = NAMES[i];
        t->p[i].dtype = dtype;
        t->p[i].ndim = two_d ? 2 : 1;
        t->p[i].shape[0] = two_d ? ROWS[i] : numel(i);
        t->p[i].shape[1] = two_d ? COLS[i] : 0;
        t->p[i].block = BLOCK[i];
        t->p[i].trainable = 1;
        t->p[i].tie = -1;
        for (int k = 0; k < numel(i); k++)
            pt_store_elem(t->init[i], dtype, (size_t)k,
                          0.013f * (float)((i * 31 + k * 7) % 29) - 0.18f);
        t->p[i].init = t->init[i];
    }
    t->m.struct_size = sizeof t->m;
    t->m.n_params = NP;
    t->m.params = t->p;
    t->m.n_blocks = NB;
    t->m.batch = 1;
    t->m.seq = 1;
    t->m.arch = arch;
}

/* The plugin on the INI text `ini` (written to a scratch file named after
 * arch), with t made and loaded and the optimizer created. */
static void *mixed_open(model *t, int dtype, int matrices, const char *arch, const char *ini) {
    char path[128];
    snprintf(path, sizeof path, "/tmp/pt_%s_%d.ini", arch, (int)getpid());
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(ini, f);
    fclose(f);
    void *ctx = NULL;
    if (P->init(path, NULL, &ctx)) fail_msg("init: %s", P->last_error(NULL));
    unlink(path);
    mixed_make(t, dtype, matrices, arch);
    assert_int_equal(P->post_model_load(ctx, &t->m), PT_OK);
    assert_int_equal(P->create_optimizer(ctx, NULL), PT_OK);
    return ctx;
}

static void mixed_add_grad(model *t, int i, int s, int dtype, mixed_grad_fn gval) {
    void *g = t->p[i].grad;
    assert_non_null(g);
    for (int k = 0; k < numel(i); k++)
        pt_store_elem(g, dtype, (size_t)k, pt_load_elem(g, dtype, (size_t)k) + gval(i, k, s, dtype));
}

/* Step s through the hooks at lr 0.01: forward, backward adding each block's
 * gradients inside its window, the embedding's after, the optimizer step. */
static void mixed_step(void *ctx, model *t, int s, int dtype, mixed_grad_fn gval) {
    assert_int_equal(P->set_lr(ctx, 0.01f), PT_OK);
    assert_int_equal(P->pre_step(ctx, s, 0, 1), PT_OK);
    for (int b = 0; b < NB; b++) {
        assert_int_equal(P->block_pre_forward(ctx, b), PT_OK);
        assert_int_equal(P->block_post_forward(ctx, b), PT_OK);
    }
    for (int b = NB - 1; b >= 0; b--) {
        assert_int_equal(P->block_pre_backward(ctx, b), PT_OK);
        for (int i = 0; i < NP; i++)
            if (BLOCK[i] == b) mixed_add_grad(t, i, s, dtype, gval);
        assert_int_equal(P->block_post_backward(ctx, b), PT_OK);
    }
    mixed_add_grad(t, 0, s, dtype, gval);
    assert_int_equal(P->optimizer_step(ctx, -1.0f), PT_OK);
    assert_int_equal(P->post_step(ctx, s, 1.0f), PT_OK);
}

/* Every parameter the plugin returns equals master rounded to the dtype, bit
 * for bit, and some element moved from its initial value. */
static void mixed_check(void *ctx, const model *t, int dtype, float master[NP][MAXN]) {
    int moved = 0;
    for (int i = 0; i < NP; i++) {
        uint16_t got[MAXN], want[MAXN];
        assert_int_equal(P->read_param(ctx, i, got, (uint64_t)numel(i) * 2), PT_OK);
        for (int k = 0; k < numel(i); k++) {
            pt_store_elem(want, dtype, (size_t)k, master[i][k]);
            moved += got[k] != t->init[i][k];
        }
        assert_memory_equal(got, want, (size_t)numel(i) * 2);
    }
    assert_true(moved > 0);
}

#endif
