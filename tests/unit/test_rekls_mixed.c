/*
 * test_rekls_mixed.c — REKLS with 16-bit compute parameters through the
 * plugin: bf16 / fp16 2-D block weights with fp32 masters, stepped by REKLS on
 * the device (resident chunks: the 16-bit gradient is widened by the step's
 * gradient kernel) and on the CPU (streamed chunks: it reads the staged 16-bit
 * gradient), the rest (a non-block embedding, 1-D biases) by AdamW. Reference:
 * pt_rekls_step on an fp32 master with the same 16-bit gradients, rounded to
 * the compute dtype, and pt_adamw_elem for the others. This checks the
 * plumbing (which parameter gets which optimizer, masters, widening, rounding,
 * the step count) bit for bit; the REKLS math itself is test_rekls's.
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

#include "kernels_hd.h"
#include "optim/optim.h"
#include "protrain.h"

static const pt_plugin_v1 *P = &protrain_plugin_v1;

enum { NP = 5, NB = 2, MAXN = 96 };
static const char *NAMES[NP] = {"emb", "b0.w", "b0.b", "b1.w", "b1.b"};
static const int64_t ROWS[NP] = {64, 12, 8, 8, 8}, COLS[NP] = {1, 8, 1, 12, 1};
static const int BLOCK[NP] = {-1, 0, 0, 1, 1};
static int is2d(int i) { return COLS[i] > 1; }
static int64_t numel(int i) { return ROWS[i] * COLS[i]; }

typedef struct model {
    pt_param_v1 p[NP];
    pt_model_v1 m;
    uint16_t init[NP][MAXN];
} model;

static void make(model *t, int dtype) {
    memset(t, 0, sizeof *t);
    for (int i = 0; i < NP; i++) {
        t->p[i].name = NAMES[i];
        t->p[i].dtype = dtype;
        t->p[i].ndim = is2d(i) ? 2 : 1;
        t->p[i].shape[0] = ROWS[i];
        t->p[i].shape[1] = is2d(i) ? COLS[i] : 0;
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
    t->m.arch = "rekls-mixed";
}

static float gval(int i, int k, int s, int dtype) {
    float g = 0.05f * (float)((k * 3 + i + s * 5) % 11) - 0.25f + 0.001f * (float)(k % 7);
    return dtype == PT_BF16 ? pt_bf16_to_f32(pt_f32_to_bf16(g)) : pt_f16_to_f32(pt_f32_to_f16(g));
}

static void add_grad(pt_param_v1 *p, int i, int s, int dtype) {
    for (int k = 0; k < numel(i); k++)
        pt_store_elem(p->grad, dtype, (size_t)k,
                      pt_load_elem(p->grad, dtype, (size_t)k) + gval(i, k, s, dtype));
}

static void run_case(int dtype, const char *protrain) {
    char path[128], text[512];
    snprintf(path, sizeof path, "/tmp/pt_rekls_mixed_%d.ini", (int)getpid());
    snprintf(text, sizeof text,
             "[plugin]\nbackend = host\nlog_level = error\n[memory]\ndevice_capacity = 8MiB\n"
             "[optimizer]\ntype = rekls\nlr = 0.01\nbeta2 = 0.95\nweight_decay = 0.1\n"
             "rekls_eps = 1e-6\n%s", protrain);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
    void *ctx = NULL;
    if (P->init(path, NULL, &ctx)) fail_msg("init: %s", P->last_error(NULL));
    unlink(path);
    model t;
    make(&t, dtype);
    assert_int_equal(P->post_model_load(ctx, &t.m), PT_OK);
    assert_int_equal(P->create_optimizer(ctx, NULL), PT_OK);

    /* reference state */
    float master[NP][MAXN], m[NP][MAXN], v[NP][MAXN];
    float *aux[NP] = {0}, *ws[NP] = {0};
    memset(m, 0, sizeof m);
    memset(v, 0, sizeof v);
    for (int i = 0; i < NP; i++) {
        for (int k = 0; k < numel(i); k++) master[i][k] = pt_load_elem(t.init[i], dtype, (size_t)k);
        if (!is2d(i)) continue;
        aux[i] = malloc(pt_rekls_aux_words(ROWS[i], COLS[i]) * 4);
        ws[i] = malloc(pt_rekls_ws_words(ROWS[i], COLS[i]) * 4);
        pt_rekls_aux_init_host(aux[i], (int)ROWS[i], (int)COLS[i]);
    }
    for (int s = 0; s < 4; s++) {
        assert_int_equal(P->set_lr(ctx, 0.01f), PT_OK);
        assert_int_equal(P->pre_step(ctx, s, 0, 1), PT_OK);
        for (int b = 0; b < NB; b++) {
            assert_int_equal(P->block_pre_forward(ctx, b), PT_OK);
            assert_int_equal(P->block_post_forward(ctx, b), PT_OK);
        }
        for (int b = NB - 1; b >= 0; b--) {
            assert_int_equal(P->block_pre_backward(ctx, b), PT_OK);
            for (int i = 0; i < NP; i++)
                if (BLOCK[i] == b) add_grad(&t.p[i], i, s, dtype);
            assert_int_equal(P->block_post_backward(ctx, b), PT_OK);
        }
        add_grad(&t.p[0], 0, s, dtype);
        assert_int_equal(P->optimizer_step(ctx, -1.0f), PT_OK);
        assert_int_equal(P->post_step(ctx, s, 1.0f), PT_OK);
        float bc1, bc2r;
        pt_adamw_bias(0.9f, 0.95f, s + 1, &bc1, &bc2r);
        pt_adamw_consts c = pt_adamw_make_consts(0.01f, 0.9f, 0.95f, 1e-8f, 0.1f, bc1, bc2r, 1.0f);
        for (int i = 0; i < NP; i++) {
            if (!is2d(i) || BLOCK[i] < 0) {
                for (int k = 0; k < numel(i); k++)
                    master[i][k] = pt_adamw_elem(&c, master[i][k], gval(i, k, s, dtype), &m[i][k], &v[i][k]);
                continue;
            }
            uint16_t g16[MAXN];
            for (int k = 0; k < numel(i); k++) pt_store_elem(g16, dtype, (size_t)k, gval(i, k, s, dtype));
            pt_rekls_hyper h = {0.01f, 0.9f, 0.95f, 1e-6f, 0.1f, 0.95f, 0, s + 1, 1.0f, PT_REKLS_WD_DECOUPLED};
            pt_rekls_tensors x = {(int)ROWS[i], (int)COLS[i], g16, dtype, master[i], NULL, 0, m[i],
                                  v[i], aux[i], ws[i]};
            char err[256];
            assert_int_equal(pt_rekls_step(&pt_rekls_la_cpu, &h, &x, err, sizeof err), 0);
        }
    }
    int moved = 0;
    for (int i = 0; i < NP; i++) {
        uint16_t got[MAXN], want[MAXN];
        assert_int_equal(P->read_param(ctx, i, got, (uint64_t)numel(i) * 2), PT_OK);
        for (int k = 0; k < numel(i); k++) {
            pt_store_elem(want, dtype, (size_t)k, master[i][k]);
            moved += got[k] != t.init[i][k];
        }
        assert_memory_equal(got, want, (size_t)numel(i) * 2);
        free(aux[i]);
        free(ws[i]);
    }
    assert_true(moved > 0);
    pt_stats_v1 st = {.struct_size = sizeof st};
    assert_int_equal(P->get_stats(ctx, &st), PT_OK);
    printf("  %s, %s: %d chunks, %d resident: 16-bit params bit-identical to the fp32-master "
           "reference after 4 steps\n", dtype == PT_BF16 ? "bf16" : "fp16",
           strstr(protrain, "n_persist = 0") ? "streamed (CPU REKLS)" : "resident (device REKLS)",
           st.n_chunk, st.n_persist);
    assert_int_equal(P->finalize(ctx), PT_OK);
}

#define RESIDENT "[protrain]\nforce_all_persistent = true\n"
#define STREAMED "[protrain]\nauto_memory = false\nn_persist = 0\nn_buffer = 1\nn_swap = 0\nn_checkpoint = 0\nchunk_size = 4KiB\n"

static void test_bf16_resident(void **s) { (void)s; run_case(PT_BF16, RESIDENT); }
static void test_bf16_streamed(void **s) { (void)s; run_case(PT_BF16, STREAMED); }
static void test_fp16_resident(void **s) { (void)s; run_case(PT_F16, RESIDENT); }
static void test_fp16_streamed(void **s) { (void)s; run_case(PT_F16, STREAMED); }

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bf16_resident),
        cmocka_unit_test(test_bf16_streamed),
        cmocka_unit_test(test_fp16_resident),
        cmocka_unit_test(test_fp16_streamed),
    };
    return cmocka_run_group_tests_name("REKLS with 16-bit parameters through the plugin", tests,
                                       NULL, NULL);
}
