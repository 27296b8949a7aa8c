/*
 * test_async.c — the simulated device computes asynchronously, like a GPU.
 *
 * sample_host launches every piece of device work on the plugin's compute stream
 * ([host_backend] async_compute = true): a block's forward or backward is still
 * queued, or running on the device's thread, when the hook after it returns. Each
 * launched item first sleeps a random time up to compute_jitter, so the device
 * runs late by varying amounts. The plugin must order everything it does after
 * the host's work with events: gradient copies, swap-outs, buffer-slot reuse,
 * frees and their NaN poison.
 *
 * Oracle: for 3 jitter seeds, the per-step losses, validation loss, a sample and
 * the final parameters are bit-identical to --no-plugin, resident, CKPT, SWAP +
 * CKPT, streamed chunks with gradient offload over 2 micro-batches, and streamed
 * with global-norm clipping.
 *
 * Negative controls: [testing] debug_skip_ordering drops orderings (a bit
 * each; the host still launches asynchronously); the runs must then differ from
 * --no-plugin, which shows the oracle can see each missing ordering.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "sh_harness.h"

#define STEPS 8

static sh_harness H;

typedef struct run_out {
    double loss[STEPS];
    double val;
    uint16_t sample[16];
    float *params;
    size_t n;
    int failed;      /* a step or the evaluation returned an error */
} run_out;

static int setup(void **st) {
    (void)st;
    return sh_harness_open(&H, "test_async",
                           "to be, or not to be, that is the question: whether 'tis nobler ",
                           6000, 7, 6);
}

static int teardown(void **st) {
    (void)st;
    return sh_harness_close(&H);
}

static void run(const char *ini, float clip, int n_micro, run_out *r) {
    sh_train_opts o = sh_harness_opts(&H, 4, 32, 2, 4, 32);
    o.n_micro = n_micro;
    o.seed = 21;
    o.weight_decay = 0.1f;
    o.max_grad_norm = clip;
    o.tbl = ini ? H.plug.table : NULL;
    o.ini_path = ini;
    sh_trainer *tr = NULL;
    char err[1024];
    int rc = sh_trainer_create(&tr, &o, err, sizeof err);
    if (rc) fprintf(stderr, "create: %s\n", err);
    assert_int_equal(rc, 0);
    memset(r, 0, sizeof *r);
    for (int s = 1; s <= STEPS && !r->failed; s++)
        r->failed = sh_trainer_step(tr, s, 2e-3f * (float)s / STEPS, &r->loss[s - 1]) != 0;
    if (!r->failed) r->failed = sh_trainer_eval(tr, STEPS, 2, &r->val) != 0;
    if (!r->failed) {
        sh_rng g;
        sh_rng_seed(&g, 4, SH_STREAM_GEN);
        memcpy(r->sample, H.val.tok, 4 * sizeof(uint16_t));
        r->failed = sh_trainer_generate(tr, STEPS, r->sample, 4, 16, 0.7f, &g) != 0;
    }
    r->n = sh_trainer_model(tr)->n_floats;
    r->params = calloc(r->n, sizeof(float));
    assert_non_null(r->params);
    if (!r->failed) r->failed = sh_trainer_snapshot(tr, r->params) != 0;
    if (r->failed) fprintf(stderr, "  (run failed: %s)\n", sh_trainer_error(tr));
    assert_int_equal(sh_trainer_destroy(tr), 0);
}

static int identical(const run_out *a, const run_out *b) {
    return !a->failed && !b->failed && a->n == b->n &&
           !memcmp(a->loss, b->loss, sizeof a->loss) && !memcmp(&a->val, &b->val, sizeof a->val) &&
           !memcmp(a->sample, b->sample, sizeof a->sample) &&
           !memcmp(a->params, b->params, a->n * sizeof(float));
}

static const char *ini(const char *name, const char *protrain, int seed, const char *extra) {
    char text[1024];
    /* extra may set its own compute_jitter */
    int jitter = !extra || !strstr(extra, "compute_jitter");
    snprintf(text, sizeof text,
             "[plugin]\nlog_level = warn\nbackend = host\n[memory]\ndevice_capacity = 1GiB\n"
             "[protrain]\n%s\n[host_backend]\nasync_compute = true\n[testing]\n%s"
             "jitter_seed = %d\n%s",
             protrain, jitter ? "compute_jitter = 300us\n" : "", seed, extra ? extra : "");
    return sh_harness_ini(&H, name, text);
}

static const char *STREAMED = "chunk_size = 64KiB\nn_persist = 1\nn_buffer = 2\n"
                              "n_checkpoint = 2\nn_swap = 1";

typedef struct cfg {
    const char *name, *protrain;
    float clip;
    int n_micro;
} cfg;

static void test_async_oracle(void **st) {
    (void)st;
    static const cfg cfgs[] = {
        {"resident", "force_all_persistent = true\nn_checkpoint = 0\nn_swap = 0", 0.0f, 2},
        {"CKPT every block", "force_all_persistent = true\nn_checkpoint = 4\nn_swap = 0", 0.0f, 2},
        {"SWAP 2 + CKPT 1", "force_all_persistent = true\nn_checkpoint = 1\nn_swap = 2", 0.0f, 2},
        {"streamed, 2 micro", NULL, 0.0f, 2},
        {"streamed, clipped", NULL, 0.05f, 1},
    };
    run_out ref[2] = {0}, ref_clip = {0};
    run(NULL, 0.0f, 2, &ref[0]);
    run(NULL, 0.05f, 1, &ref_clip);
    assert_false(ref[0].failed);
    assert_true(ref[0].loss[STEPS - 1] < ref[0].loss[0]);
    for (size_t c = 0; c < sizeof cfgs / sizeof cfgs[0]; c++) {
        const run_out *want = cfgs[c].clip > 0 ? &ref_clip : &ref[0];
        for (int seed = 1; seed <= 3; seed++) {
            run_out p;
            run(ini("async", cfgs[c].protrain ? cfgs[c].protrain : STREAMED, seed, NULL),
                cfgs[c].clip, cfgs[c].n_micro, &p);
            int same = identical(&p, want);
            printf("  %-20s jitter seed %d: %s\n", cfgs[c].name, seed,
                   same ? "identical to --no-plugin" : "DIFFERS from --no-plugin");
            assert_true(same);
            free(p.params);
        }
    }
    free(ref[0].params);
    free(ref_clip.params);
}

/* Without an ordering the same launched work races the plugin's copies and frees:
 * some run must differ (NaN from poison, a stale gradient, a lost update). Each
 * ordering is dropped alone, on the configuration that exercises it, over up to 3
 * jitter seeds; "all" drops every one. An ordering this model cannot show the
 * absence of is printed as such and not asserted (see the list in main's note). */
typedef struct skip_case {
    const char *what;
    int mask;
    const char *protrain;
    int must_fail;
    const char *backend;      /* more [testing] lines, or other sections (a copy throttle) */
    float clip;               /* max_grad_norm (0: none) */
} skip_case;

static void test_negative_controls(void **st) {
    (void)st;
    const char *san = getenv("PT_SAN");
    if (san && !strcmp(san, "tsan")) {
        /* these runs race on purpose; the oracle above is what TSan checks */
        printf("  negative controls skipped under TSan: their data races are the point\n");
        skip();
    }
    static const skip_case cases[] = {
        {"all orderings", 511, NULL, 1, NULL, 0},
        /* uploads slower than the jittered compute, so a launch that does not wait
         * for one reads the slot's previous contents */
        {"uploads (1)", 1, NULL, 1, "[host_backend]\ncopy_bandwidth = 20MB/s\n", 0},
        {"slot reuse (2)", 2, NULL, 1, NULL, 0},
        {"gradient copies (4)", 4, NULL, 1, NULL, 0},
        {"swap-out/in (8)", 8, "force_all_persistent = true\nn_checkpoint = 0\nn_swap = 4", 1, NULL, 0},
        /* Not observable with this host (not asserted here): its device runs a
         * whole pass behind, so an arena poisoned too early is written again by
         * its late forward before its backward reads it; and its memcpy and
         * read_param calls find no launched work of its own still pending that
         * touches what they read or write (the runs print "still identical").
         * The three are asserted against a launched item that is certainly
         * still queued in tests/unit/test_async_controls.c (frees 16, optimizer
         * step 32, host memcpy 64: right with the ordering, wrong without). */
        {"frees (16)", 16, "force_all_persistent = true\nn_checkpoint = 0\nn_swap = 0", 0,
         NULL, 0},
        {"optimizer step (32)", 32, NULL, 0, NULL, 0},
        {"host memcpy (64)", 64, NULL, 0, NULL, 0},
        /* clipped: optimizer_step leaves the CPU steps running into the next
         * forward, whose uploads must wait for them; the steps of this tiny
         * model take microseconds, so each is made to take 20 ms first */
        {"deferred CPU steps (256)", 256, NULL, 1, "debug_cpu_step_delay = 20ms\n", 0.05f},
    };
    run_out ref, ref_clip;
    run(NULL, 0.0f, 2, &ref);
    run(NULL, 0.05f, 2, &ref_clip);
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        int differs = 0, seed;
        for (seed = 1; seed <= 3 && !differs; seed++) {
            char extra[128];
            snprintf(extra, sizeof extra, "debug_skip_ordering = %d\n%s", cases[c].mask,
                     cases[c].backend ? cases[c].backend : "");
            run_out p;
            run(ini("skip", cases[c].protrain ? cases[c].protrain : STREAMED, seed, extra),
                cases[c].clip, 2, &p);
            differs = !identical(&p, cases[c].clip > 0 ? &ref_clip : &ref);
            free(p.params);
        }
        printf("  without %-22s %s\n", cases[c].what,
               differs ? "differs from --no-plugin, as it must"
                       : "still identical here (not shown by this model; not asserted)");
        if (cases[c].must_fail) assert_true(differs);
    }
    free(ref.params);
    free(ref_clip.params);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_async_oracle),
        cmocka_unit_test(test_negative_controls),
    };
    return cmocka_run_group_tests_name("asynchronous compute stream", tests, setup, teardown);
}
