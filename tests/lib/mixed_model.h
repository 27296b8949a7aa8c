/*
 * mixed_model.h — the 16-bit model that test_mixed's AdamW and REKLS cases train
 * through the plugin table against an fp32-master reference: a non-block
 * embedding (64 elements) and per block a weight (96 elements: 12 x 8 and
 * 8 x 12 as matrices, or flat) and a bias (8), bf16 or fp16, with fixed initial
 * values. The header opens the plugin on a given INI text, runs one step's hooks
 * adding the test's gradient values, and compares what the plugin returns with
 * the test's fp32 masters rounded to the dtype, bit for bit. The test keeps its
 * gradient values and its reference update.
 * Names: mixed_ functions and types, MX_ constants.
 * Header-only (static functions, cmocka asserts): include once per test
 * program, after <cmocka.h>.
 */
#ifndef PT_MIXED_MODEL_H
#define PT_MIXED_MODEL_H

#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "host_builder.h"
#include "kernels_hd.h"
#include "protrain.h"

static const pt_plugin_v1 *const MX_P = &protrain_plugin_v1;

enum { MX_NP = 5,
       MX_NB = 2,
       MX_MAXN = 96 };
static const char *MX_NAMES[MX_NP] = {"emb", "b0.w", "b0.b", "b1.w", "b1.b"};
static const int64_t MX_ROWS[MX_NP] = {64, 12, 8, 8, 8}, MX_COLS[MX_NP] = {1, 8, 1, 12, 1};
static const int MX_BLOCK[MX_NP] = {-1, 0, 0, 1, 1};
static int64_t mixed_numel(int i) { return MX_ROWS[i] * MX_COLS[i]; }

/* The two placements each test runs: every chunk resident (device optimizer)
 * and every chunk streamed through one 4 KiB buffer (CPU optimizer). */
#define MX_RESIDENT "[protrain]\nforce_all_persistent = true\n"
#define MX_STREAMED "[protrain]\nauto_memory = false\nn_persist = 0\nn_buffer = 1\nn_swap = 0\nn_checkpoint = 0\nchunk_size = 4KiB\n"

typedef struct mixed_model {
    pt_param_v1 p[MX_NP];
    pt_model_v1 m;
    uint16_t init[MX_NP][MX_MAXN];   /* [param][element], 16-bit values of the dtype */
} mixed_model;

/* Gradient value of element k of param i at step s; exactly representable in
 * the dtype, so the plugin and the reference see the same numbers. */
typedef float (*mixed_grad_fn)(int i, int k, int s, int dtype);

/* matrices: the block weights are 2-D (MX_ROWS x MX_COLS), else every param is 1-D. */
static void mixed_make(mixed_model *t, int dtype, int matrices, const char *arch) {
    memset(t, 0, sizeof *t);
    for (int i = 0; i < MX_NP; i++) {
        int two_d = matrices && MX_COLS[i] > 1;
        t->p[i].name = MX_NAMES[i];
        t->p[i].dtype = dtype;
        t->p[i].ndim = two_d ? 2 : 1;
        t->p[i].shape[0] = two_d ? MX_ROWS[i] : mixed_numel(i);
        t->p[i].shape[1] = two_d ? MX_COLS[i] : 0;
        t->p[i].block = MX_BLOCK[i];
        t->p[i].trainable = 1;
        t->p[i].tie = -1;
        for (int k = 0; k < mixed_numel(i); k++)
            pt_store_elem(t->init[i], dtype, (size_t)k,
                          0.013f * (float)((i * 31 + k * 7) % 29) - 0.18f);
        t->p[i].init = t->init[i];
    }
    t->m.struct_size = sizeof t->m;
    t->m.n_params = MX_NP;
    t->m.params = t->p;
    t->m.n_blocks = MX_NB;
    t->m.batch = 1;
    t->m.seq = 1;
    t->m.arch = arch;
}

/* The plugin on the INI text `ini`, with t made and loaded and the optimizer
 * created. */
static void *mixed_open(mixed_model *t, int dtype, int matrices, const char *arch, const char *ini) {
    void *ctx = hb_open(MX_P, ini, NULL);
    mixed_make(t, dtype, matrices, arch);
    assert_int_equal(MX_P->post_model_load(ctx, &t->m), PT_OK);
    assert_int_equal(MX_P->create_optimizer(ctx, NULL), PT_OK);
    return ctx;
}

static void mixed_add_grad(mixed_model *t, int i, int s, int dtype, mixed_grad_fn gval) {
    void *g = t->p[i].grad;
    assert_non_null(g);
    for (int k = 0; k < mixed_numel(i); k++)
        pt_store_elem(g, dtype, (size_t)k, pt_load_elem(g, dtype, (size_t)k) + gval(i, k, s, dtype));
}

/* Step s through the hooks at lr 0.01: forward, backward adding each block's
 * gradients inside its window, the embedding's after, the optimizer step. */
static void mixed_step(void *ctx, mixed_model *t, int s, int dtype, mixed_grad_fn gval) {
    assert_int_equal(MX_P->set_lr(ctx, 0.01f), PT_OK);
    assert_int_equal(MX_P->pre_step(ctx, s, 0, 1), PT_OK);
    for (int b = 0; b < MX_NB; b++) {
        assert_int_equal(MX_P->block_pre_forward(ctx, b), PT_OK);
        assert_int_equal(MX_P->block_post_forward(ctx, b), PT_OK);
    }
    for (int b = MX_NB - 1; b >= 0; b--) {
        assert_int_equal(MX_P->block_pre_backward(ctx, b), PT_OK);
        for (int i = 0; i < MX_NP; i++)
            if (MX_BLOCK[i] == b) mixed_add_grad(t, i, s, dtype, gval);
        assert_int_equal(MX_P->block_post_backward(ctx, b), PT_OK);
    }
    mixed_add_grad(t, 0, s, dtype, gval);
    assert_int_equal(MX_P->optimizer_step(ctx, -1.0f), PT_OK);
    assert_int_equal(MX_P->post_step(ctx, s, 1.0f), PT_OK);
}

/* Every parameter the plugin returns equals master rounded to the dtype, bit
 * for bit, and some element moved from its initial value. */
static void mixed_check(void *ctx, const mixed_model *t, int dtype, float master[MX_NP][MX_MAXN]) {
    int moved = 0;
    for (int i = 0; i < MX_NP; i++) {
        uint16_t got[MX_MAXN], want[MX_MAXN];
        assert_int_equal(MX_P->read_param(ctx, i, got, (uint64_t)mixed_numel(i) * 2), PT_OK);
        for (int k = 0; k < mixed_numel(i); k++) {
            pt_store_elem(want, dtype, (size_t)k, master[i][k]);
            moved += got[k] != t->init[i][k];
        }
        assert_memory_equal(got, want, (size_t)mixed_numel(i) * 2);
    }
    assert_true(moved > 0);
}

#endif
