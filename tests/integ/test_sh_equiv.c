/*
 * test_sh_equiv.c — sample_host with the plugin against --no-plugin, in process.
 *
 * The plugin's AdamW element body is the one sample_host's own optimizer repeats
 * (gpu/kernels_hd.h), the model code is the same on plugin-provided pointers, and the
 * host backend's device memory is ordinary memory: so for 20 steps (2 micro-batches
 * each, weight decay on) the per-step losses, the validation loss, a generated sample
 * and the final parameters must be IDENTICAL, bit for bit, with
 *   - everything resident (mode A, activations kept),
 *   - every block checkpointed (arenas freed, recompute_block re-runs the forward),
 *   - SWAP + CKPT mixed (arenas moved to pinned memory and back),
 *   - parameters offloaded in streamed chunks (CPU AdamW) with SWAP + CKPT.
 * With global-norm clipping the squared norm is formed the same way on both sides:
 * each parameter's squares summed in double in element order (the device sqnorm
 * accumulates in double), the per-parameter sums added in declaration order; so the
 * clipped run is bit-identical too.
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
#include "sh_data.h"
#include "sh_train.h"

#define STEPS 20

static char DIR_[256];
static pt_loaded_plugin PLUG;
static sh_tokens ALL, TR, VA;

static void quiet_log(void *u, int32_t level, const char *msg) {
    (void)u;
    if (level <= PT_LOG_WARN) fprintf(stderr, "protrain: %s\n", msg);
}

static int setup(void **st) {
    (void)st;
    snprintf(DIR_, sizeof DIR_, "/tmp/test_sh_equiv.XXXXXX");
    if (!mkdtemp(DIR_)) return -1;
    const char *b = getenv("PT_BUILD");
    char so[600], err[600];
    snprintf(so, sizeof so, "%s/protrain_plugin.so", b ? b : "build");
    if (pt_plugin_load(so, &PLUG, err, sizeof err) != 0 || !PLUG.table) {
        fprintf(stderr, "test_sh_equiv: cannot load %s: %s\n", so, err);
        return -1;
    }
    /* a text with structure, so the model learns and gradients are not noise */
    ALL.n = 6000;
    ALL.tok = malloc(ALL.n * sizeof(uint16_t));
    if (!ALL.tok) return -1;
    const char *s = "to be, or not to be, that is the question: whether 'tis nobler ";
    for (size_t i = 0; i < ALL.n; i++) ALL.tok[i] = (uint16_t)(unsigned char)s[(i * 7 / 6) % 64];
    sh_data_split(&ALL, &TR, &VA);
    return 0;
}

static int teardown(void **st) {
    (void)st;
    pt_plugin_unload(&PLUG);
    sh_data_tokens_free(&ALL);
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", DIR_);
    return system(cmd) == 0 ? 0 : -1;
}

static const char *write_ini(const char *name, const char *protrain_section) {
    static char path[400];
    snprintf(path, sizeof path, "%s/%s.ini", DIR_, name);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fprintf(f, "[plugin]\nlog_level = warn\nbackend = host\n[memory]\ndevice_capacity = 1GiB\n"
               "[protrain]\n%s\n",
            protrain_section);
    assert_int_equal(fclose(f), 0);
    return path;
}

typedef struct run_out {
    double loss[STEPS];
    double val;
    uint16_t sample[24];
    float *params;
    size_t n;
    uint64_t dev_peak, dev_capacity;
    pt_stats_v1 st;            /* the plugin's stats at the end (zero without it) */
} run_out;

static void run(const pt_plugin_v1 *tbl, const char *ini, float clip, int n_micro, run_out *r) {
    sh_train_opts o;
    memset(&o, 0, sizeof o);
    o.dims = (sh_dims){.V = 256, .maxT = 32, .L = 4, .NH = 2, .C = 32};
    o.B = 4;
    o.T = 32;
    o.n_micro = n_micro;
    o.seed = 21;
    o.lr = 2e-3f;
    o.beta1 = 0.9f;
    o.beta2 = 0.95f;
    o.eps = 1e-8f;
    o.weight_decay = 0.1f;
    o.max_grad_norm = clip;
    o.tbl = tbl;
    o.ini_path = ini;
    o.train = &TR;
    o.val = &VA;
    o.log = quiet_log;
    sh_trainer *tr = NULL;
    char err[1024];
    int rc = sh_trainer_create(&tr, &o, err, sizeof err);
    if (rc) fprintf(stderr, "create: %s\n", err);
    assert_int_equal(rc, 0);
    for (int s = 1; s <= STEPS; s++) {
        float lr = 2e-3f * (float)s / STEPS;
        rc = sh_trainer_step(tr, s, lr, &r->loss[s - 1]);
        if (rc) fprintf(stderr, "step %d: %s\n", s, sh_trainer_error(tr));
        assert_int_equal(rc, 0);
    }
    rc = sh_trainer_eval(tr, STEPS, 3, &r->val);
    if (rc) fprintf(stderr, "eval: %s\n", sh_trainer_error(tr));
    assert_int_equal(rc, 0);
    sh_rng g;
    sh_rng_seed(&g, 4, SH_STREAM_GEN);
    memcpy(r->sample, VA.tok, 4 * sizeof(uint16_t));
    rc = sh_trainer_generate(tr, STEPS, r->sample, 4, 24, 0.7f, &g);
    if (rc) fprintf(stderr, "generate: %s\n", sh_trainer_error(tr));
    assert_int_equal(rc, 0);
    r->n = sh_trainer_model(tr)->n_floats;
    r->params = malloc(r->n * sizeof(float));
    assert_non_null(r->params);
    assert_int_equal(sh_trainer_snapshot(tr, r->params), 0);
    pt_stats_v1 st;
    r->dev_peak = r->dev_capacity = 0;
    memset(&r->st, 0, sizeof r->st);
    if (sh_trainer_stats(tr, &st) == 0) {
        r->dev_peak = st.dev_peak;
        r->dev_capacity = st.dev_capacity;
        r->st = st;
    }
    assert_int_equal(sh_trainer_destroy(tr), 0);
}

static void expect_identical(const char *what, const run_out *a, const run_out *b) {
    assert_memory_equal(a->loss, b->loss, sizeof a->loss);
    assert_memory_equal(&a->val, &b->val, sizeof a->val);
    assert_memory_equal(a->sample, b->sample, sizeof a->sample);
    assert_int_equal(a->n, b->n);
    assert_memory_equal(a->params, b->params, a->n * sizeof(float));
    printf("  %-22s identical: losses %.6f -> %.6f, val %.6f, %zu params, dev peak %.1f MiB\n",
           what, a->loss[0], a->loss[STEPS - 1], a->val, a->n, (double)a->dev_peak / 1048576.0);
}

/* The plan a case asked for took effect (identical results alone would also
 * come from a plugin that ignored the INI and kept everything resident): its
 * mode, resident chunks, SWAP/CKPT blocks, and the traffic they cause. */
static void expect_plan(const run_out *r, int mode, int n_swap, int n_ckpt) {
    const pt_stats_v1 *s = &r->st;
    printf("  %-22s plan: mode %d, %d of %d chunks resident, %d SWAP, %d CKPT; %.2f MiB "
           "swapped out, %lld recomputes, %.2f MiB to the host, CPU optimizer %.3f s\n",
           "",
           s->mode, s->n_persist, s->n_chunk, s->n_swap, s->n_checkpoint,
           (double)s->swap_bytes / 1048576.0, (long long)s->recomputes,
           (double)s->d2h_bytes / 1048576.0, s->cpu_optim_s);
    assert_int_equal(s->mode, mode);
    assert_int_equal(s->n_swap, n_swap);
    assert_int_equal(s->n_checkpoint, n_ckpt);
    if (n_swap) assert_true(s->swap_bytes > 0);
    if (n_ckpt) assert_true(s->recomputes > 0);
    if (mode == 0) {
        assert_int_equal(s->n_persist, s->n_chunk);
    } else {   /* offloaded chunks: stepped on the CPU, their gradients sent to the host */
        assert_true(s->n_persist < s->n_chunk);
        assert_true(s->d2h_bytes > 0);
        assert_true(s->cpu_optim_s > 0);
    }
}

/* Max relative differences of losses and of parameters (|dp| / max|p|). */
static int compare(const run_out *a, const run_out *b, double *dl, double *dp) {
    double pmax = 0.0;
    *dl = *dp = 0.0;
    for (int s = 0; s < STEPS; s++) *dl = fmax(*dl, fabs(a->loss[s] - b->loss[s]) / fabs(b->loss[s]));
    *dl = fmax(*dl, fabs(a->val - b->val) / fabs(b->val));
    for (size_t i = 0; i < b->n; i++) {
        *dp = fmax(*dp, fabs((double)a->params[i] - (double)b->params[i]));
        pmax = fmax(pmax, fabs((double)b->params[i]));
    }
    *dp /= pmax;
    return memcmp(a->params, b->params, b->n * sizeof(float)) == 0 &&
           memcmp(a->loss, b->loss, sizeof a->loss) == 0 && a->val == b->val;
}

static run_out REF;            /* --no-plugin, no clipping */
static uint64_t PEAK_RESIDENT; /* device peak with every activation kept */

static void ensure_ref(void) {
    if (REF.params) return;
    run(NULL, NULL, 0.0f, 2, &REF);
    assert_true(REF.loss[STEPS - 1] < REF.loss[0]); /* it trains */
}

static void test_resident(void **st) {
    (void)st;
    ensure_ref();
    run_out p;
    run(PLUG.table, write_ini("resident", "force_all_persistent = true\nn_checkpoint = 0\n"
                                          "n_swap = 0"),
        0.0f, 2, &p);
    assert_true(p.dev_peak > 0 && p.dev_peak <= p.dev_capacity);
    PEAK_RESIDENT = p.dev_peak;
    expect_identical("resident (mode A)", &p, &REF);
    free(p.params);
}

static void test_checkpoint_all(void **st) {
    (void)st;
    run_out p;
    ensure_ref();
    run(PLUG.table, write_ini("ckpt", "force_all_persistent = true\nn_checkpoint = 4\n"
                                      "n_swap = 0"),
        0.0f, 2, &p);
    expect_identical("CKPT on every block", &p, &REF);
    /* the INI took effect: dropping the arenas lowers the peak */
    if (PEAK_RESIDENT) assert_true(p.dev_peak < PEAK_RESIDENT);
    free(p.params);
}

static void test_swap_ckpt(void **st) {
    (void)st;
    run_out p;
    ensure_ref();
    run(PLUG.table, write_ini("swap", "force_all_persistent = true\nn_checkpoint = 1\n"
                                      "n_swap = 2"),
        0.0f, 2, &p);
    expect_identical("SWAP 2 + CKPT 1", &p, &REF);
    expect_plan(&p, 0, 2, 1);
    free(p.params);
}

static void test_offload(void **st) {
    (void)st;
    /* 64 KiB chunks: the 60k-param model spans several; one stays resident, the rest
     * stream through two buffers, their gradients are offloaded per micro-batch and
     * summed on the host, and the CPU optimizer steps them. Identical because the host
     * forms every block gradient as "micro-batch sum, then one add" (layers.c,
     * ACCUMULATION), the order the plugin uses for offloaded chunks. */
    run_out p;
    ensure_ref();
    run(PLUG.table, write_ini("offload", "chunk_size = 64KiB\nn_persist = 1\nn_buffer = 2\n"
                                         "n_checkpoint = 2\nn_swap = 1"),
        0.0f, 2, &p);
    expect_identical("offload + SWAP/CKPT", &p, &REF);
    expect_plan(&p, 1, 1, 2);
    free(p.params);
}

static void test_clipping(void **st) {
    (void)st;
    run_out n, p;
    run(NULL, NULL, 0.05f, 2, &n);
    run(PLUG.table, write_ini("clip", "force_all_persistent = true"), 0.05f, 2, &p);
    double dl, dp;
    int same = compare(&p, &n, &dl, &dp);
    printf("  clipping (0.05)        %s: max rel loss diff %.2e, max |dp|/max|p| %.2e\n",
           same ? "identical" : "NOT bit-identical", dl, dp);
    assert_true(same);
    free(n.params);
    free(p.params);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_resident),
        cmocka_unit_test(test_checkpoint_all),
        cmocka_unit_test(test_swap_ckpt),
        cmocka_unit_test(test_offload),
        cmocka_unit_test(test_clipping),
    };
    int rc = cmocka_run_group_tests_name("sample_host plugin equivalence", tests, setup,
                                         teardown);
    free(REF.params);
    return rc;
}
