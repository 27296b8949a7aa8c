/*
 * test_plan_accuracy.c — the cost model against the runtime: sample_host
 * through the plugin on the host backend with throttled copies, over a sweep of
 * 12 knob settings fixed in the INI (the plugin still profiles and predicts them).
 *
 * Peak: predicted >= measured >= predicted / 1.05, asserted for every
 * configuration. It is exact arithmetic on the plugin's own allocator (and the
 * runtime releases swapped arenas on the plan's schedule), so it is deterministic.
 *
 * Time. This machine class (2-core KVM guests) runs in spells: a plain loop's
 * speed, sampled every 0.1 s for 15 s, held at 1.0x for a second or two, then
 * 1.3x, then 1.0x again (autocorrelation 0.9 at 0.1 s, 0.5 at 1 s, 0 at 3 s),
 * and with other builds running beside it a step measured 7x its prediction.
 * A time bound in `make test` would fail on the machine, not on the model, so
 * there the time column is only printed (and checked positive and finite).
 * `make bench` runs it with PT_ACCURACY_STRICT=1: three rounds over the 12
 * settings (one run of each per round, so a slow spell touches one of a
 * setting's three runs, not all three), the median of the three per setting,
 * and three sweeps (OWN, SHARED, LEARNED below). The bar, median
 * |measured/predicted - 1| <= 5% and max <= 15%, is asserted on OWN: each run
 * profiles itself and is measured against its own prediction, 0.3-1 s later,
 * mostly in the same spell. SHARED (one cached profile for all runs, taken
 * seconds to a minute before most of them) and LEARNED (the same with the
 * calibration a first run learned) are printed beside it: their predictions
 * carry the spell of one profile into every run, which is what they measure.
 *
 * time_calibration = false in the 12 runs keeps each prediction the one made
 * before the run (a re-plan would replace the prediction under test by one
 * fitted to that run).
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "sh_harness.h"

#define NL 4
/* steps per run: WARM warm-up, then MEAS measured (their median). 15 rather
 * than 7: over 48 runs each way, alternating, the spread of a run's
 * measured/predicted went from 0.10-0.12 to 0.08-0.10 (a run then spans
 * more of a spell) */
#define WARM 3
#define MEAS 15

static sh_harness H;

static int setup(void **st) {
    (void)st;
    sh_harness_log_level = 0; /* errors only: calibration warnings are expected here */
    return sh_harness_open(&H, "test_plan_accuracy",
                           " !\"#$%&'()*+,-./0123456789:;<=>?@ABCDEFGHIJKLMNOPQRSTUVWXYZ[\\]^_`"
                           "abcdefghijklmnopqrstuvwxyz{|}~",
                           20000, 7, 1);
}

static int teardown(void **st) {
    (void)st;
    return sh_harness_close(&H);
}

typedef struct meas {
    pt_stats_v1 st;
    double median_s;
} meas;

/* Copies throttled to 400 MB/s: a block's chunks take about as long to upload as
 * the block takes to compute, so the transfer terms of the model matter. */
/* cache NULL: no profile cache, the run profiles itself. */
static void run_in(const char *cache, int learn, const char *knobs, meas *m) {
    char text[1024], dir[400] = "";
    if (cache) snprintf(dir, sizeof dir, "cache_dir = %s/%s\n", H.dir, cache);
    snprintf(text, sizeof text, "[plugin]\nlog_level = error\nbackend = host\n[memory]\n"
                                "device_capacity = 256MiB\n[host_backend]\ncopy_bandwidth = 400MB/s\n[protrain]\n"
                                "chunk_size = 128KiB\n%stime_calibration = %s\n%s\n",
             dir,
             learn ? "true" : "false", knobs);
    const char *path = sh_harness_ini(&H, "cfg", text);
    assert_non_null(path);
    sh_train_opts o = sh_harness_opts(&H, NL, 128, 4, 4, 64);
    o.seed = 3;
    o.lr = 1e-3f;
    o.tbl = H.plug.table;
    o.ini_path = path;
    sh_trainer *tr = NULL;
    char err[1024];
    int rc = sh_trainer_create(&tr, &o, err, sizeof err);
    if (rc) fail_msg("create (%s): %s", knobs, err);
    double t[WARM + MEAS + 1], loss;
    t[0] = pt_now_s();
    for (int s = 1; s <= WARM + MEAS; s++) {
        rc = sh_trainer_step(tr, s, 1e-3f, &loss);
        if (rc) fail_msg("step %d: %s", s, sh_trainer_error(tr));
        t[s] = pt_now_s();
    }
    double d[MEAS];
    for (int i = 0; i < MEAS; i++) d[i] = t[WARM + i + 1] - t[WARM + i];
    m->median_s = sh_median(d, MEAS);
    memset(&m->st, 0, sizeof m->st);
    m->st.struct_size = sizeof m->st;
    assert_int_equal(sh_trainer_stats(tr, &m->st), 0);
    assert_int_equal(sh_trainer_destroy(tr), 0);
}

static void run(const char *knobs, meas *m) { run_in("cache", 0, knobs, m); }

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Where a sweep's predictions come from:
 *   OWN      every run profiles itself (no cache) and is measured against its
 *            own prediction, as a job without a profile cache runs;
 *   SHARED   one profile, taken by a first run and cached, predicts every run;
 *   LEARNED  the same, with the calibration that first run learned from its
 *            own steps stored with the profile (as the next job on a machine
 *            plans). */
enum { OWN,
       SHARED,
       LEARNED };
static const char *const sweep_name[] = {
    "every run profiles itself and is measured against its own prediction",
    "one cached profile predicts every run",
    "one cached profile with the calibration its first run learned"};

/* One sweep over the 12 configurations; returns how many are within 15% and
 * the median and max of |measured/predicted - 1| in *med, *max. */
static int sweep(int kind, int strict, double *med, double *max) {
    const char *cache = kind == OWN ? NULL : kind == SHARED ? "cache"
                                                            : "cache_learned";
    /* n_persist counts the prefix in execution order; mandatory chunks stay too.
     * A first run (all knobs searched) tells the chunk count N. */
    meas first;
    run_in(cache, kind == LEARNED, "", &first);
    int N = first.st.n_chunk;
    assert_true(N > 8);
    char all[4][96];
    static const int allsc[4][2] = {{0, 0}, {0, 4}, {2, 0}, {1, 2}};
    for (int k = 0; k < 4; k++)
        snprintf(all[k], sizeof all[k], "n_persist = %d\nn_buffer = 0\nn_swap = %d\nn_checkpoint = %d",
                 N, allsc[k][0], allsc[k][1]);
    const char *cfg[] = {
        all[0],
        all[1],
        all[2],
        all[3],
        "n_persist = 0\nn_buffer = auto\nn_swap = 0\nn_checkpoint = 0",
        "n_persist = 0\nn_buffer = auto\nn_swap = 0\nn_checkpoint = 4",
        "n_persist = 0\nn_buffer = auto\nn_swap = 2\nn_checkpoint = 1",
        "n_persist = 0\nn_buffer = 24\nn_swap = 0\nn_checkpoint = 2",
        "n_persist = 6\nn_buffer = auto\nn_swap = 0\nn_checkpoint = 0",
        "n_persist = 6\nn_buffer = 16\nn_swap = 1\nn_checkpoint = 1",
        "n_persist = 10\nn_buffer = auto\nn_swap = 0\nn_checkpoint = 2",
        "n_persist = 10\nn_buffer = auto\nn_swap = 2\nn_checkpoint = 2",
    };
    enum { NC = (int)(sizeof cfg / sizeof cfg[0]) };
    const int n = NC, rounds = strict ? 3 : 1;
    int time_ok = 0;
    double err[NC], ratio[NC][3];
    meas m[NC];
    printf("  predictions: %s\n", sweep_name[kind]);
    /* Strict: three rounds over the 12 settings, one run of each per round
     * (round-robin), and per setting the median of its three ratios. This
     * machine has slow spells of 0.1 s to minutes (a step 1.3-1.6x its
     * neighbours for a few steps, or a whole minute's runs 20% slower): three
     * runs of a setting back to back put all three inside one spell and the
     * median with them; spread over the sweep, one spell touches one of them. */
    for (int r = 0; r < rounds; r++)
        for (int i = 0; i < n; i++) {
            meas mm;
            run_in(cache, 0, cfg[i], &mm);
            ratio[i][r] = mm.median_s / mm.st.pred_iter_s;
            if (r == 0) m[i] = mm;
            /* one cached profile and no re-plan: the same prediction every round */
            if (kind != OWN) assert_true(mm.st.pred_iter_s == m[i].st.pred_iter_s);
            assert_true(mm.st.pred_peak > 0);
            assert_true(mm.st.pred_peak >= mm.st.dev_peak);
            assert_true((double)mm.st.pred_peak <= 1.05 * (double)mm.st.dev_peak);
        }
    printf("  %-3s %-4s %-4s %-4s %-4s | %12s %12s %7s | %9s %9s %7s\n", "#", "np", "nb", "sw", "ck",
           "pred peak", "meas peak", "ratio", "pred s", "meas s", "ratio");
    for (int i = 0; i < n; i++) {
        double tr = sh_median(ratio[i], rounds);
        /* pred s: the first round's (OWN: each round predicted its own) */
        double pr = (double)m[i].st.pred_peak / (double)m[i].st.dev_peak;
        printf("  %-3d %-4d %-4d %-4d %-4d | %12llu %12llu %7.4f | %9.4f %9.4f %7.3f\n", i,
               m[i].st.n_persist, m[i].st.n_buffer, m[i].st.n_swap, m[i].st.n_checkpoint,
               (unsigned long long)m[i].st.pred_peak, (unsigned long long)m[i].st.dev_peak, pr,
               m[i].st.pred_iter_s, tr * m[i].st.pred_iter_s, tr);
        time_ok += fabs(tr - 1.0) <= 0.15;
        err[i] = fabs(tr - 1.0);
        assert_true(isfinite(tr) && tr > 0);
    }
    qsort(err, (size_t)n, sizeof err[0], cmp_d);
    *med = err[n / 2];
    *max = err[n - 1];
    printf("  time within 15%%: %d of %d configurations; |measured/predicted - 1| median %.1f%%, "
           "max %.1f%%%s\n",
           time_ok, n, *med * 100, *max * 100,
           strict ? " (strict: median of 3 runs each, in 3 round-robin rounds)" : "");
    return time_ok;
}

/* make test: the OWN sweep once, peaks asserted, times printed. Strict (make
 * bench): the three sweeps, three rounds each; the bar (median <= 5%, max <=
 * 15%) is asserted on OWN, the other two are printed beside it. */
static void test_sweep(void **st) {
    (void)st;
    const char *strict_env = getenv("PT_ACCURACY_STRICT");
    int strict = strict_env && *strict_env && *strict_env != '0';
    double med[3], max[3];
    sweep(OWN, strict, &med[OWN], &max[OWN]);
    if (!strict) return;
    sweep(SHARED, strict, &med[SHARED], &max[SHARED]);
    sweep(LEARNED, strict, &med[LEARNED], &max[LEARNED]);
    printf("  bar (own profile): median %.1f%% <= 5%%, max %.1f%% <= 15%%; one cached profile: "
           "median %.1f%%, max %.1f%%; with the learned calibration: median %.1f%%, max %.1f%%\n",
           med[OWN] * 100, max[OWN] * 100, med[SHARED] * 100, max[SHARED] * 100,
           med[LEARNED] * 100, max[LEARNED] * 100);
    assert_true(med[OWN] <= 0.05);
    assert_true(max[OWN] <= 0.15);
}

/* [protrain] timeline_file: the plugin writes the plan's picture, and after
 * calibration (step 6 of 18 here) writes it again with the measured peak. The
 * label is the prediction get_stats reports, exactly; the measured peak is the
 * calibration's, at most the prediction (asserted over the sweep above). */
static void test_timeline_file(void **st) {
    (void)st;
    char knobs[600], svg_path[512];
    snprintf(svg_path, sizeof svg_path, "%s/timeline.svg", H.dir);
    snprintf(knobs, sizeof knobs, "n_persist = 6\nn_buffer = 16\nn_swap = 1\nn_checkpoint = 1\ntimeline_file = %s",
             svg_path);
    meas m;
    run(knobs, &m);
    FILE *f = fopen(svg_path, "r");
    assert_non_null(f);
    static char svg[1 << 16];
    size_t n = fread(svg, 1, sizeof svg - 1, f);
    svg[n] = 0;
    fclose(f);
    assert_true(n > 0 && n < sizeof svg - 1);
    assert_non_null(strstr(svg, "<svg "));
    assert_non_null(strstr(svg, "</svg>"));
    char want[64];
    snprintf(want, sizeof want, ">peak %llu B (", (unsigned long long)m.st.pred_peak);
    if (!strstr(svg, want)) fprintf(stderr, "no '%s' in %s\n", want, svg_path);
    assert_non_null(strstr(svg, want));
    const char *mp = strstr(svg, ">measured peak ");
    assert_non_null(mp);
    unsigned long long meas_peak = strtoull(mp + strlen(">measured peak "), NULL, 10);
    printf("  timeline: predicted peak %llu B, measured peak %llu B\n", (unsigned long long)m.st.pred_peak,
           meas_peak);
    assert_true(meas_peak > 0 && meas_peak <= m.st.pred_peak);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_sweep), cmocka_unit_test(test_timeline_file)};
    return cmocka_run_group_tests_name("cost model vs runtime", tests, setup, teardown);
}
