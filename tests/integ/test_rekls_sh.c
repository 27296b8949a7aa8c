/*
 * test_rekls_sh.c — REKLS through the plugin on sample_host.
 *  - Offloaded chunks (REKLS on the CPU optimizer's workers) and resident chunks
 *    (REKLS through the backend's gemm_f32 / eigh / rekls_ew ops on the compute
 *    stream) give bit-identical losses and parameters, with clipping and with
 *    gradient accumulation. Negative control: a different rekls_shampoo_beta
 *    changes the bits, so the comparison can fail.
 *  - 50 steps train with the defaults (beta2 and weight_decay auto): every
 *    loss finite, the last five below the first five, bit-identical to the
 *    explicit beta2 0.95 / weight_decay 0.01, printed beside AdamW (its
 *    defaults, and REKLS's numbers) on the same lr schedule.
 *  - save_state / load_state mid-run resumes bit-exactly (the factors, bases
 *    and eigenvalues are in the state file).
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "sh_harness.h"

#define NL 2
#define MAXSTEPS 50

static sh_harness H;

static int setup(void **st) {
    (void)st;
    return sh_harness_open(&H, "test_rekls_sh",
                           "the eigenbasis turns with every step; adam walks inside it. ", 6000, 5,
                           4);
}
static int teardown(void **st) {
    (void)st;
    return sh_harness_close(&H);
}

static const char *ini(const char *name, const char *protrain, const char *optim) {
    char text[1024];
    snprintf(text, sizeof text,
             "[plugin]\nlog_level = warn\nbackend = host\n[memory]\ndevice_capacity = 256MiB\n"
             "[protrain]\nchunk_size = 16KiB\n%s\n[optimizer]\n%s\n[host_backend]\n"
             "async_compute = true\n[testing]\ncompute_jitter = 100us\n",
             protrain, optim);
    const char *path = sh_harness_ini(&H, name, text);
    assert_non_null(path);
    return path;
}

typedef struct run_out {
    double loss[MAXSTEPS];
    float *params;
    size_t n;
    pt_stats_v1 st;
} run_out;

static const char *RES = "force_all_persistent = true\nn_swap = 0\nn_checkpoint = 0";
static const char *OFF = "auto_memory = false\nn_persist = 1\nn_buffer = 12\nn_swap = 0\n"
                         "n_checkpoint = 0";
static const char *REKLS0 = "type = rekls\nweight_decay = 0.01\nbeta2 = 0.95";
static const char *REKLS = "type = rekls\nweight_decay = 0.01\nbeta2 = 0.95\nmax_grad_norm = 1";

/* steps [1, steps]; save_at > 0: save after that step into dir, then destroy
 * the trainer and continue in a new one loaded from it. */
static void run(const char *ini_path, float clip, int n_micro, int steps, int save_at,
                run_out *r) {
    sh_train_opts o = sh_harness_opts(&H, NL, 32, 2, 4, 32);
    o.n_micro = n_micro;
    o.max_grad_norm = clip;
    o.weight_decay = 0.01f;
    o.tbl = H.plug.table;
    o.ini_path = ini_path;
    o.optim_from_ini = 1;
    sh_trainer *tr = NULL;
    char err[1024];
    if (sh_trainer_create(&tr, &o, err, sizeof err)) fail_msg("create: %s", err);
    char dir[512];
    snprintf(dir, sizeof dir, "%s/rekls_state", H.dir);
    mkdir(dir, 0755);
    for (int s = 1; s <= steps; s++) {
        float lr = 3e-3f * (s < 10 ? (float)s / 10 : 1.0f);
        if (sh_trainer_step(tr, s, lr, &r->loss[s - 1])) fail_msg("step %d: %s", s, sh_trainer_error(tr));
        if (s == save_at) {
            sh_trainer_state hs;
            sh_trainer_get_state(tr, &hs);
            if (sh_trainer_plugin_state(tr, dir, 0)) fail_msg("save: %s", sh_trainer_error(tr));
            assert_int_equal(sh_trainer_destroy(tr), 0);
            if (sh_trainer_create(&tr, &o, err, sizeof err)) fail_msg("create: %s", err);
            if (sh_trainer_plugin_state(tr, dir, 1)) fail_msg("load: %s", sh_trainer_error(tr));
            sh_trainer_set_state(tr, &hs);
        }
    }
    r->n = sh_trainer_model(tr)->n_floats;
    r->params = malloc(r->n * sizeof(float));
    assert_non_null(r->params);
    assert_int_equal(sh_trainer_snapshot(tr, r->params), 0);
    memset(&r->st, 0, sizeof r->st);
    r->st.struct_size = sizeof r->st;
    assert_int_equal(sh_trainer_stats(tr, &r->st), 0);
    assert_int_equal(sh_trainer_destroy(tr), 0);
}

static int same(const run_out *a, const run_out *b, int steps) {
    return !memcmp(a->loss, b->loss, sizeof(double) * (size_t)steps) && a->n == b->n &&
           !memcmp(a->params, b->params, a->n * sizeof(float));
}

static void offload_vs_resident(float clip, int n_micro, run_out *keep) {
    run_out a, b;
    char opt[256];   /* optimizer settings come from the INI (optim_from_ini) */
    snprintf(opt, sizeof opt, "%s\nmax_grad_norm = %g", REKLS0, (double)clip);
    run(ini("res", RES, opt), clip, n_micro, 6, 0, &a);
    run(ini("off", OFF, opt), clip, n_micro, 6, 0, &b);
    assert_int_equal(a.st.mode, 0);
    assert_int_equal(b.st.mode, 1);
    assert_true(b.st.n_persist < b.st.n_chunk);
    for (int s = 0; s < 6; s++) assert_true(isfinite(a.loss[s]));
    assert_true(same(&a, &b, 6));
    printf("  clip %g, %d micro-batch(es): resident and offloaded REKLS bit-identical over 6 steps "
           "(loss %.6f -> %.9f)\n",
           (double)clip, n_micro, a.loss[0], a.loss[5]);
    if (keep) *keep = a;
    else free(a.params);
    free(b.params);
}

static void test_offload_equals_resident(void **s) {
    (void)s;
    run_out plain, clipped;
    offload_vs_resident(0, 1, &plain);
    offload_vs_resident(0.05f, 1, &clipped);   /* below the gradient norm: clipping acts */
    assert_false(same(&plain, &clipped, 6));
    free(plain.params);
    free(clipped.params);
    offload_vs_resident(0, 2, NULL);
    /* negative control: another factor decay changes the result */
    run_out a, b;
    run(ini("res", RES, REKLS0), 0, 1, 6, 0, &a);
    run(ini("off2", OFF, "type = rekls\nweight_decay = 0.01\nbeta2 = 0.95\nrekls_shampoo_beta = 0.9"),
        0, 1, 6, 0, &b);
    assert_false(same(&a, &b, 6));
    free(a.params);
    free(b.params);
}

/* 50 steps with each optimizer's defaults (beta2 = auto, weight_decay = auto:
 * REKLS 0.95 / 0.01, AdamW 0.999 / 0) on the same lr schedule, beside AdamW
 * with REKLS's numbers. REKLS's defaults must give the bits of the explicit
 * 0.95 / 0.01 (auto resolved through sample_host's INI path); AdamW's default
 * decay of 0 must differ from 0.01 there. README's table is this output. */
static void test_trains(void **s) {
    (void)s;
    run_out r, e, w, w2;
    run(ini("r50", OFF, "type = rekls\nmax_grad_norm = 1"), 1.0f, 1, MAXSTEPS, 0, &r);
    run(ini("e50", OFF, "type = rekls\nweight_decay = 0.01\nbeta2 = 0.95\nmax_grad_norm = 1"), 1.0f,
        1, MAXSTEPS, 0, &e);
    run(ini("a50", OFF, "type = adamw\nmax_grad_norm = 1"), 1.0f, 1, MAXSTEPS, 0, &w);
    run(ini("b50", OFF, "type = adamw\nweight_decay = 0.01\nbeta2 = 0.95\nmax_grad_norm = 1"), 1.0f,
        1, MAXSTEPS, 0, &w2);
    assert_true(same(&r, &e, MAXSTEPS));
    assert_false(same(&w, &w2, MAXSTEPS));
    double first = 0, last = 0;
    printf("  lr 3e-3 (10 warm-up steps), clip 1, 2 blocks C=32, offloaded; defaults: REKLS "
           "beta2 0.95 wd 0.01, AdamW beta2 0.999 wd 0\n");
    printf("  step   REKLS     AdamW     AdamW (beta2 0.95, wd 0.01)\n");
    for (int i = 0; i < MAXSTEPS; i++) {
        assert_true(isfinite(r.loss[i]));
        if (i < 5) first += r.loss[i];
        if (i >= MAXSTEPS - 5) last += r.loss[i];
        if (i % 5 == 0 || i == MAXSTEPS - 1)
            printf("  %4d  %.4f    %.4f    %.4f\n", i + 1, r.loss[i], w.loss[i], w2.loss[i]);
    }
    assert_true(last < first);
    free(r.params);
    free(e.params);
    free(w.params);
    free(w2.params);
}

static void test_resume(void **s) {
    (void)s;
    run_out a, b;
    run(ini("c1", OFF, REKLS), 1.0f, 1, 8, 0, &a);
    run(ini("c2", OFF, REKLS), 1.0f, 1, 8, 4, &b);
    assert_true(same(&a, &b, 8));
    free(b.params);
    run(ini("c3", RES, REKLS), 1.0f, 1, 8, 4, &b);   /* saved and loaded resident */
    assert_true(same(&a, &b, 8));
    printf("  save after step 4, load, 4 more steps: bit-identical (offloaded and resident)\n");
    /* the file says which optimizer wrote it: REKLS state into an AdamW run is refused */
    sh_train_opts o = sh_harness_opts(&H, NL, 32, 2, 4, 32);
    o.tbl = H.plug.table;
    o.ini_path = ini("c4", OFF, "type = adamw");
    o.optim_from_ini = 1;
    sh_trainer *tr = NULL;
    char err[512], dir[512];
    assert_int_equal(sh_trainer_create(&tr, &o, err, sizeof err), 0);
    snprintf(dir, sizeof dir, "%s/rekls_state", H.dir);
    assert_int_not_equal(sh_trainer_plugin_state(tr, dir, 1), 0);
    assert_non_null(strstr(sh_trainer_error(tr), "REKLS optimizer state"));
    printf("  refused: %s\n", sh_trainer_error(tr));
    sh_trainer_destroy(tr);
    free(a.params);
    free(b.params);
}

/* REKLS with OSFT is refused at create_optimizer with a sentence naming both. */
static void test_refuses_osft(void **s) {
    (void)s;
    char text[1024];
    snprintf(text, sizeof text,
             "[plugin]\nlog_level = error\nbackend = host\n[memory]\ndevice_capacity = 256MiB\n"
             "[protrain]\nforce_all_persistent = true\n[optimizer]\n%s\n[osft]\nenabled = true\n"
             "targets = qkvw,attprojw,fcw,fcprojw\n",
             REKLS);
    sh_train_opts o = sh_harness_opts(&H, NL, 32, 2, 4, 32);
    o.tbl = H.plug.table;
    o.ini_path = sh_harness_ini(&H, "osft", text);
    o.optim_from_ini = 1;
    sh_trainer *tr = NULL;
    char err[1024] = "";
    assert_int_not_equal(sh_trainer_create(&tr, &o, err, sizeof err), 0);
    assert_non_null(strstr(err, "REKLS together with OSFT"));
    printf("  refused: %.160s...\n", strstr(err, "create_optimizer"));
    if (tr) sh_trainer_destroy(tr);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_offload_equals_resident),
        cmocka_unit_test(test_trains),
        cmocka_unit_test(test_resume),
        cmocka_unit_test(test_refuses_osft),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
