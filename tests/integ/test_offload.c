/*
 * test_offload.c — sample_host through the plugin with streamed chunks and
 * activation modes, against --no-plugin.
 *
 * What is bit-identical and why: the model code is the same on plugin pointers,
 * chunk uploads copy bytes, the CPU AdamW is bit-identical to the element body the
 * host's own AdamW repeats, and the activation modes only move or recompute the
 * same values with the same code. So with one micro-batch per step every run below
 * must match --no-plugin bit for bit.
 * That includes n_micro > 1 (sample_host adds each micro-batch's block gradient
 * as one sum, the order the plugin uses when it accumulates an offloaded chunk's
 * gradient on the host) and clipping (per-parameter squares in double on both
 * sides). Every run below must match --no-plugin bit for bit.
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

#include "sh_harness.h"

#define STEPS 12
#define NL 4

static sh_harness H;

static int setup(void **st) {
    (void)st;
    return sh_harness_open(&H, "test_offload",
                           "a chunk in time saves nine; offload what you cannot hold. ", 6000, 5, 4);
}

static int teardown(void **st) {
    (void)st;
    return sh_harness_close(&H);
}

/* 16 KiB chunks: every block spans several chunks, no tensor is oversize.
 * Fixed-knob runs set auto_memory = false: they test the runtime under exactly
 * those knobs (below the planner's lookahead minimum too), not the planner. */
/* Every run computes on the asynchronous device with jitter; the seed rotates
 * over 1..3 from run to run, so each oracle below holds under several
 * interleavings of the host's work and the plugin's copies. */
static const char *ini(const char *name, const char *memory, const char *protrain) {
    static int runs;
    char text[1024];
    snprintf(text, sizeof text, "[plugin]\nlog_level = warn\nbackend = host\n[memory]\n%s\n"
                                "[protrain]\nchunk_size = 16KiB\n%s\n[host_backend]\nasync_compute = true\n"
                                "[testing]\ncompute_jitter = 200us\njitter_seed = %d\n",
             memory ? memory : "device_capacity = 256MiB", protrain, 1 + runs++ % 3);
    const char *path = sh_harness_ini(&H, name, text);
    assert_non_null(path);
    return path;
}

typedef struct run_out {
    double loss[STEPS];
    float *params;
    size_t n;
    pt_stats_v1 st;
} run_out;

static void run(const pt_plugin_v1 *tbl, const char *ini_path, float clip, int n_micro,
                run_out *r) {
    sh_train_opts o = sh_harness_opts(&H, NL, 32, 2, 4, 32);
    o.n_micro = n_micro;
    o.weight_decay = 0.1f;
    o.max_grad_norm = clip;
    o.tbl = tbl;
    o.ini_path = ini_path;
    sh_trainer *tr = NULL;
    char err[1024];
    int rc = sh_trainer_create(&tr, &o, err, sizeof err);
    if (rc) fail_msg("create: %s", err);
    for (int s = 1; s <= STEPS; s++) {
        rc = sh_trainer_step(tr, s, 2e-3f * (float)s / STEPS, &r->loss[s - 1]);
        if (rc) fail_msg("step %d: %s", s, sh_trainer_error(tr));
    }
    r->n = sh_trainer_model(tr)->n_floats;
    r->params = malloc(r->n * sizeof(float));
    assert_non_null(r->params);
    assert_int_equal(sh_trainer_snapshot(tr, r->params), 0);
    memset(&r->st, 0, sizeof r->st);
    r->st.struct_size = sizeof r->st;
    if (tbl) assert_int_equal(sh_trainer_stats(tr, &r->st), 0);
    assert_int_equal(sh_trainer_destroy(tr), 0);
}

static run_out REF1, REF4, REFC; /* --no-plugin: n_micro 1, n_micro 4, clipping */

static const run_out *ref(int n_micro, float clip) {
    run_out *r = clip > 0 ? &REFC : n_micro == 4 ? &REF4
                                                 : &REF1;
    if (!r->params) {
        run(NULL, NULL, clip, n_micro, r);
        assert_true(r->loss[STEPS - 1] < r->loss[0]);
    }
    return r;
}

static void identical(const char *what, const run_out *a, const run_out *b) {
    assert_memory_equal(a->loss, b->loss, sizeof a->loss);
    assert_int_equal(a->n, b->n);
    assert_memory_equal(a->params, b->params, a->n * sizeof(float));
    printf("  %-34s identical  (n_persist %d of %d chunks, n_buffer %d, peak %.2f MiB)\n", what,
           a->st.n_persist, a->st.n_chunk, a->st.n_buffer, a->st.dev_peak / 1048576.0);
}

static void case_(const char *name, const char *protrain, float clip, int n_micro,
                  int expect_offload) {
    run_out p;
    run(H.plug.table, ini(name, NULL, protrain), clip, n_micro, &p);
    if (expect_offload) {
        assert_int_equal(p.st.mode, 1);
        assert_true(p.st.n_persist < p.st.n_chunk);
        assert_true(p.st.h2d_bytes > 0 && p.st.d2h_bytes > 0);
        /* the offloaded chunks live in one pinned arena: none took its own
         * driver allocation (micro-batch sums and swap buffers come later and
         * may; these cases use neither unless n_micro > 1) */
        assert_true(p.st.pinned_arena > 0);
        /* the hidden part of the CPU optimizer's work is a part of it */
        assert_true(p.st.cpu_optim_hidden_s >= 0);
        assert_true(p.st.cpu_optim_hidden_s <= p.st.cpu_optim_s * (1 + 1e-9) + 1e-9);
        if (n_micro == 1 && !strstr(protrain, "n_swap = 1")) assert_int_equal(p.st.pinned_own_allocs, 0);
    }
    identical(name, &p, ref(n_micro, clip));
    free(p.params);
}

static void test_all_persistent(void **s) {
    (void)s;
    case_("all persistent", "force_all_persistent = true\nn_swap = 0\nn_checkpoint = 0", 0, 1, 0);
}
static void test_all_streamed(void **s) {
    (void)s;
    case_("n_persist 0, minimal buffers", "auto_memory = false\nn_persist = 0\nn_buffer = 6\nn_swap = 0\nn_checkpoint = 0",
          0, 1, 1);
}
static void test_middle(void **s) {
    (void)s;
    case_("n_persist 9, n_buffer 12", "auto_memory = false\nn_persist = 9\nn_buffer = 12\nn_swap = 0\nn_checkpoint = 0",
          0, 1, 1);
}
static void test_streamed_micro4(void **s) {
    (void)s;
    case_("streamed, n_micro 4", "auto_memory = false\nn_persist = 2\nn_buffer = 8\nn_swap = 0\nn_checkpoint = 0", 0, 4, 1);
}
static void test_streamed_clip(void **s) {
    (void)s;
    case_("streamed, clipping 0.05", "auto_memory = false\nn_persist = 2\nn_buffer = 8\nn_swap = 0\nn_checkpoint = 0",
          0.05f, 1, 1);
}

/* Activation modes with streamed chunks: every (n_swap, n_checkpoint) pair, bit-identical, and
 * the measured device peak falls as n_checkpoint grows; SWAP lowers it too. */
static void test_activation_grid(void **s) {
    (void)s;
    const int ck[] = {0, 1, NL / 2, NL}, sw[] = {0, 1, NL / 2};
    uint64_t peak[3][4] = {{0}};
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 4; j++) {
            if (sw[i] + ck[j] > NL) continue;
            char name[64], pr[160];
            snprintf(name, sizeof name, "swap %d ckpt %d streamed", sw[i], ck[j]);
            snprintf(pr, sizeof pr, "auto_memory = false\nn_persist = 1\nn_buffer = 6\nn_swap = %d\nn_checkpoint = %d",
                     sw[i], ck[j]);
            run_out p;
            run(H.plug.table, ini("grid", NULL, pr), 0, 1, &p);
            identical(name, &p, ref(1, 0));
            peak[i][j] = p.st.dev_peak;
            free(p.params);
        }
    for (int i = 0; i < 3; i++)
        for (int j = 1; j < 4; j++)
            if (peak[i][j]) assert_true(peak[i][j] <= peak[i][j - 1]);
    assert_true(peak[0][3] < peak[0][0]);   /* CKPT everywhere saves memory */
    assert_true(peak[2][0] < peak[0][0]);   /* so does SWAP */
}

/* A device smaller than the all-resident footprint: the searcher offloads, the run
 * trains, and the allocator's peak stays within the capacity. */
static void test_capacity(void **s) {
    (void)s;
    run_out full, p;
    run(H.plug.table, ini("full", NULL, "force_all_persistent = true\nn_swap = 0\nn_checkpoint = 0"),
        0, 1, &full);
    uint64_t cap = full.st.dev_peak * 6 / 10 / 4096 * 4096;
    char mem[64];
    snprintf(mem, sizeof mem, "device_capacity = %llu", (unsigned long long)cap);
    run(H.plug.table, ini("small", mem, ""), 0, 1, &p);
    printf("  capacity %.2f MiB (60%% of resident peak %.2f MiB): peak %.2f MiB, n_persist %d/%d, "
           "n_buffer %d, n_swap %d, n_checkpoint %d\n",
           cap / 1048576.0,
           full.st.dev_peak / 1048576.0, p.st.dev_peak / 1048576.0, p.st.n_persist, p.st.n_chunk,
           p.st.n_buffer, p.st.n_swap, p.st.n_checkpoint);
    assert_true(p.st.dev_capacity == cap);
    assert_true(p.st.dev_peak <= cap);
    assert_true(p.loss[STEPS - 1] < p.loss[0]);
    identical("auto plan under 60% capacity", &p, ref(1, 0));
    free(full.params);
    free(p.params);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_all_persistent),
        cmocka_unit_test(test_all_streamed),
        cmocka_unit_test(test_middle),
        cmocka_unit_test(test_streamed_micro4),
        cmocka_unit_test(test_streamed_clip),
        cmocka_unit_test(test_activation_grid),
        cmocka_unit_test(test_capacity),
    };
    int rc = cmocka_run_group_tests_name("offload and activation equivalence", tests, setup,
                                         teardown);
    free(REF1.params);
    free(REF4.params);
    free(REFC.params);
    return rc;
}
