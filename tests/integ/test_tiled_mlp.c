/*
 * test_tiled_mlp.c — TiledMLP through sample_host and the plugin, in process, against
 * the same runs with the MLP untiled (the oracles):
 *   - tile-count invariance: 20 steps with tiles 1, 2, 3, 7, 25, 50 and 64 over
 *     B*T = 2*25 = 50 tokens (3 and 7 do not divide 50; with 3 the tile of 17 rows
 *     [17, 34) straddles the boundary between the two sequences at row 25; 64 > 50
 *     gives 50 one-row tiles): per-step losses within 1e-6 relative, and the plugin
 *     reports N_eff = ceil(50 / ceil(50 / N)) tiles;
 *   - gradients: one step of 2 accumulated micro-batches with everything resident;
 *     every block's MLP weight gradients read inside the backward window after
 *     micro-batch 0 (dW0) and after micro-batch 1 (G0 + dW1) match the untiled run
 *     within 1e-6 relative (a mean over tiles instead of a sum, or a sum published
 *     per tile on top of G0, would be off by whole factors);
 *   - composition: every block CKPT (recompute skips the MLP) with the parameters in
 *     streamed chunks stepped by CPU Adam: losses within 1e-6 of the same plan
 *     untiled, with recomputes and streaming really happening;
 *   - memory: at T = 1024, C = 128 (one head, one block) the measured device peak of
 *     the tiled run is below the untiled one;
 *   - plan: at a 24 MiB device the tiled profile buys a plan with fewer SWAP/CKPT
 *     blocks, its peak not under-predicted;
 *   - auto: the fewest tiles whose plan fits (2 at 56 MiB, 1 at 72 MiB);
 *   - order: the tile hooks outside their windows are refused.
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

#include "host_builder.h"
#include "sh_harness.h"

#define STEPS 20

static sh_harness H;

static int setup(void **st) {
    (void)st;
    return sh_harness_open(&H, "test_tiled_mlp",
                           "to be, or not to be, that is the question: whether 'tis nobler ",
                           40000, 7, 6);
}
static int teardown(void **st) {
    (void)st;
    return sh_harness_close(&H);
}

/* INI with [protrain] `prot` and, when tiles != 0, [tiled_mlp] on with that count
 * (-1 = auto). */
static const char *ini(const char *name, const char *prot, int tiles) {
    char text[1024], tl[128] = "";
    if (tiles > 0) snprintf(tl, sizeof tl, "[tiled_mlp]\nenabled = true\ntiles = %d\n", tiles);
    if (tiles < 0) snprintf(tl, sizeof tl, "[tiled_mlp]\nenabled = true\ntiles = auto\n");
    /* prot may bring its own [memory] section (then it comes first) */
    int own_mem = strncmp(prot, "[memory]", 8) == 0;
    snprintf(text, sizeof text, "[plugin]\nlog_level = warn\nbackend = host\n%s\n%s%s\n%s",
             own_mem ? prot : "[memory]\ndevice_capacity = 1GiB", own_mem ? "" : "[protrain]\n",
             own_mem ? "" : prot, tl);
    const char *p = sh_harness_ini(&H, name, text);
    assert_non_null(p);
    return p;
}

typedef struct run_out {
    double loss[STEPS];
    pt_stats_v1 st;
} run_out;

static void run(const sh_train_opts *base, const char *inipath, int steps, run_out *r) {
    sh_train_opts o = *base;
    o.tbl = H.plug.table;
    o.ini_path = inipath;
    sh_trainer *tr = NULL;
    char err[1024];
    int rc = sh_trainer_create(&tr, &o, err, sizeof err);
    if (rc) fprintf(stderr, "create: %s\n", err);
    assert_int_equal(rc, 0);
    for (int s = 1; s <= steps; s++) {
        rc = sh_trainer_step(tr, s, 2e-3f * (float)s / (float)steps, &r->loss[s - 1]);
        if (rc) fprintf(stderr, "step %d: %s\n", s, sh_trainer_error(tr));
        assert_int_equal(rc, 0);
    }
    memset(&r->st, 0, sizeof r->st);
    r->st.struct_size = sizeof r->st;
    assert_int_equal(sh_trainer_stats(tr, &r->st), 0);
    assert_int_equal(sh_trainer_destroy(tr), 0);
}

static double max_rel_loss(const run_out *a, const run_out *b, int steps) {
    double m = 0;
    for (int s = 0; s < steps; s++) {
        double d = fabs(a->loss[s] - b->loss[s]) / fabs(b->loss[s]);
        if (d > m) m = d;
    }
    return m;
}

static void test_tile_counts(void **st) {
    (void)st;
    sh_train_opts o = sh_harness_opts(&H, 2, 32, 2, 2, 25);
    const char *prot = "force_all_persistent = true";
    run_out ref, t;
    run(&o, ini("untiled", prot, 0), STEPS, &ref);
    assert_int_equal(ref.st.mlp_tiles, 0);
    const int tiles[] = {1, 2, 3, 7, 25, 50, 64};
    const int neff[] = {1, 2, 3, 7, 25, 50, 50};
    for (size_t i = 0; i < sizeof tiles / sizeof tiles[0]; i++) {
        char nm[32];
        snprintf(nm, sizeof nm, "tiles%d", tiles[i]);
        run(&o, ini(nm, prot, tiles[i]), STEPS, &t);
        double d = max_rel_loss(&t, &ref, STEPS);
        printf("tiles %2d over 50 tokens (B 2 x T 25): N_eff %llu, max relative loss "
               "difference over %d steps %.3g\n",
               tiles[i], (unsigned long long)t.st.mlp_tiles,
               STEPS, d);
        assert_int_equal(t.st.mlp_tiles, (uint64_t)neff[i]);
        assert_true(d <= 1e-6);
        assert_true(t.loss[STEPS - 1] < t.loss[0]); /* it trains */
    }
    /* auto on a roomy device: the fewest, one tile */
    run(&o, ini("auto", prot, -1), 2, &t);
    assert_int_equal(t.st.mlp_tiles, 1);
}

/* ---- gradients ---- */

#define MAXG 4
typedef struct probe {
    int armed, calls;
    /* [call] -> copies of the MLP params' gradients of that block */
    float *g[MAXG * 2][4];
    size_t n[4];
} probe;

static const int MLP_SLOTS[4] = {SH_FCW, SH_FCB, SH_FCPROJW, SH_FCPROJB};

static void grad_probe(void *user, const sh_model *m, int l) {
    probe *p = user;
    if (!p->armed || p->calls >= MAXG * 2) return;
    for (int k = 0; k < 4; k++) {
        const pt_param_v1 *pp = &m->params[SH_P_LAYER(l, MLP_SLOTS[k])];
        size_t n = sh_model_param_numel(pp);
        p->n[k] = n;
        p->g[p->calls][k] = malloc(n * sizeof(float));
        memcpy(p->g[p->calls][k], pp->grad, n * sizeof(float));
    }
    p->calls++;
}

static void grads_run(const char *inipath, probe *p) {
    sh_train_opts o = sh_harness_opts(&H, 2, 32, 2, 2, 25);
    o.n_micro = 2;
    o.tbl = H.plug.table;
    o.ini_path = inipath;
    o.grad_probe = grad_probe;
    o.grad_probe_user = p;
    sh_trainer *tr = NULL;
    char err[1024];
    int rc = sh_trainer_create(&tr, &o, err, sizeof err);
    if (rc) fprintf(stderr, "create: %s\n", err);
    assert_int_equal(rc, 0);
    p->armed = 1; /* after the profile passes */
    double loss;
    assert_int_equal(sh_trainer_step(tr, 1, 1e-3f, &loss), 0);
    p->armed = 0;
    assert_int_equal(sh_trainer_destroy(tr), 0);
    assert_int_equal(p->calls, 4); /* 2 micro-batches x 2 blocks */
}

static void test_grads(void **st) {
    (void)st;
    const char *prot = "force_all_persistent = true";
    probe a, b;
    memset(&a, 0, sizeof a);
    memset(&b, 0, sizeof b);
    grads_run(ini("g_untiled", prot, 0), &a);
    grads_run(ini("g_tiled", prot, 3), &b);
    /* calls 0,1: micro 0 (blocks 1, 0) = dW0; calls 2,3: micro 1 = G0 + dW1 */
    double worst = 0, worst_acc = 0, worst_scale = 0;
    for (int c = 0; c < 4; c++) {
        for (int k = 0; k < 4; k++) {
            double maxref = 0, maxd = 0;
            for (size_t i = 0; i < a.n[k]; i++) {
                double r = a.g[c][k][i], t = b.g[c][k][i];
                if (fabs(r) > maxref) maxref = fabs(r);
                if (fabs(r - t) > maxd) maxd = fabs(r - t);
            }
            assert_true(maxref > 0);
            double rel = maxd / maxref;
            if (rel > worst) worst = rel;
            if (c >= 2 && rel > worst_acc) worst_acc = rel;
            if (c >= 2) {
                /* the accumulated gradient really holds both micro-batches:
                 * G0 + dW1 differs from G0 (a lost or replaced G0 fails above) */
                double diff = 0;
                for (size_t i = 0; i < a.n[k]; i++) {
                    double d = fabs((double)b.g[c][k][i] - b.g[c - 2][k][i]);
                    if (d > diff) diff = d;
                }
                if (diff / maxref > worst_scale) worst_scale = diff / maxref;
            }
        }
    }
    printf("MLP weight gradients, tiles 3 vs untiled: max relative difference %.3g (after "
           "micro-batch 1, G0 + dW: %.3g); dW1 / |G| = %.3g\n",
           worst, worst_acc, worst_scale);
    assert_true(worst <= 1e-6);
    assert_true(worst_scale > 1e-2);
    for (int c = 0; c < 4; c++)
        for (int k = 0; k < 4; k++) free(a.g[c][k]), free(b.g[c][k]);
}

static void test_ckpt_streamed(void **st) {
    (void)st;
    sh_train_opts o = sh_harness_opts(&H, 2, 32, 2, 2, 25);
    o.n_micro = 2;
    /* jitter: launched work runs late, so the gradient add must be ordered after
     * the tiles on the device's stream, and the store's gradient copies after it */
    const char *prot = "auto_memory = false\nn_persist = 0\nn_buffer = 1\nn_swap = 0\n"
                       "n_checkpoint = 2\n[testing]\ncompute_jitter = 200us\njitter_seed = 3";
    run_out ref, t;
    run(&o, ini("cs_untiled", prot, 0), 10, &ref);
    run(&o, ini("cs_tiled", prot, 7), 10, &t);
    double d = max_rel_loss(&t, &ref, 10);
    printf("CKPT every block + streamed chunks (CPU Adam), tiles 7, 2 micro-batches: max "
           "relative loss difference over 10 steps %.3g; recomputes %lld, H2D %llu bytes\n",
           d,
           (long long)t.st.recomputes, (unsigned long long)t.st.h2d_bytes);
    assert_true(d <= 1e-6);
    assert_true(t.st.recomputes > 0);
    assert_int_equal(t.st.n_checkpoint, 2);
    assert_true(t.st.h2d_bytes > 0);
    assert_int_equal(t.st.mlp_tiles, 7);
}

static void test_peak(void **st) {
    (void)st;
    sh_train_opts o = sh_harness_opts(&H, 1, 256, 1, 1, 1024);
    const char *prot = "force_all_persistent = true";
    run_out ref, t;
    run(&o, ini("p_untiled", prot, 0), 2, &ref);
    run(&o, ini("p_tiled", prot, 8), 2, &t);
    printf("T 1024, C 256, 1 block: device peak untiled %.2f MiB, tiles 8 %.2f MiB; "
           "losses %.9f / %.9f\n",
           ref.st.dev_peak / 1048576.0, t.st.dev_peak / 1048576.0,
           ref.loss[1], t.loss[1]);
    assert_true(t.st.dev_peak < ref.st.dev_peak);
    assert_true(max_rel_loss(&t, &ref, 2) <= 1e-6);
}

/* The profile sees the tiled bytes, so the planner's prediction stays exact and the
 * smaller activations buy a plan with fewer swapped / checkpointed blocks. */
static void test_plan(void **st) {
    (void)st;
    sh_train_opts o = sh_harness_opts(&H, 4, 128, 4, 2, 256);
    char prot[600], json[400];
    snprintf(json, sizeof json, "%s/plan.json", H.dir);
    snprintf(prot, sizeof prot, "[memory]\ndevice_capacity = 24MiB\n[protrain]\nplan_file = %s",
             json);
    run_out ref, t;
    run(&o, ini("pl_untiled", prot, 0), 8, &ref);
    run(&o, ini("pl_tiled", prot, 4), 8, &t);
    /* the plan names the tiles: 4 of 128 tokens over 2 x 256 */
    FILE *f = fopen(json, "r");
    assert_non_null(f);
    char buf[8192];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = '\0';
    fclose(f);
    assert_non_null(strstr(buf, "\"mlp_tiles\": 4, \"mlp_tile_len\": 128"));
    printf("24 MiB device, L 4, C 128, B 2 x T 256: untiled n_swap %d n_checkpoint %d, peak "
           "%.2f MiB (predicted %.2f); tiles 4: n_swap %d n_checkpoint %d, peak %.2f MiB "
           "(predicted %.2f)\n",
           ref.st.n_swap, ref.st.n_checkpoint, ref.st.dev_peak / 1048576.0,
           ref.st.pred_peak / 1048576.0, t.st.n_swap, t.st.n_checkpoint,
           t.st.dev_peak / 1048576.0, t.st.pred_peak / 1048576.0);
    assert_true(t.st.n_swap + t.st.n_checkpoint < ref.st.n_swap + ref.st.n_checkpoint);
    assert_true(t.st.dev_peak <= t.st.dev_capacity);
    assert_true(t.st.pred_peak >= t.st.dev_peak); /* not under-predicted */
    assert_true(max_rel_loss(&t, &ref, 8) <= 1e-6);
}

/* tiles = auto: profiled with 256-token tiles (4 here), then the fewest tiles whose
 * plan fits: at 56 MiB one 1024-token tile does not fit (its tile scratch is 12 MiB
 * against 3 MiB for 256 rows), two do; at 72 MiB one does. Both runs compute the
 * same losses. */
static void test_auto(void **st) {
    (void)st;
    sh_train_opts o = sh_harness_opts(&H, 2, 256, 1, 1, 1024);
    run_out a, b;
    run(&o, ini("auto56", "[memory]\ndevice_capacity = 56MiB", -1), 1, &a);
    run(&o, ini("auto72", "[memory]\ndevice_capacity = 72MiB", -1), 1, &b);
    printf("tiles = auto over 1024 tokens: 56 MiB device -> %llu tiles, peak %.2f MiB "
           "(predicted %.2f); 72 MiB -> %llu tiles, peak %.2f MiB (predicted %.2f); losses "
           "%.9f / %.9f\n",
           (unsigned long long)a.st.mlp_tiles, a.st.dev_peak / 1048576.0,
           a.st.pred_peak / 1048576.0, (unsigned long long)b.st.mlp_tiles,
           b.st.dev_peak / 1048576.0, b.st.pred_peak / 1048576.0, a.loss[0], b.loss[0]);
    /* The byte counts depend on the host's backward scratch, which holds one
     * attention slot per OpenMP thread: the TSan build runs OpenMP serially and
     * needs 2 MiB less, enough for one tile at 56 MiB. There only the order is
     * asserted; the normal build (two threads) asserts the counts. */
    const char *san = getenv("PT_SAN");
    if (!san || !*san) {
        assert_int_equal(a.st.mlp_tiles, 2);
    } else {
        assert_true(a.st.mlp_tiles >= b.st.mlp_tiles);
    }
    assert_int_equal(b.st.mlp_tiles, 1);
    assert_true(a.st.dev_peak <= a.st.dev_capacity && b.st.dev_peak <= b.st.dev_capacity);
    assert_true(a.st.pred_peak >= a.st.dev_peak && b.st.pred_peak >= b.st.dev_peak);
    assert_true(max_rel_loss(&a, &b, 1) <= 1e-6);
}

static void test_order(void **st) {
    (void)st;
    const pt_plugin_v1 *t = H.plug.table;
    void *ctx = NULL;
    pt_host_v1 h = hb_host(NULL);
    h.device_kind = PT_DEVICE_HOST;
    assert_int_equal(t->init(ini("order", "", 2), &h, &ctx), 0);
    pt_stats_v1 s;
    memset(&s, 0, sizeof s);
    s.struct_size = sizeof s;
    assert_int_equal(t->get_stats(ctx, &s), 0);
    assert_int_equal(s.mlp_tiles, 2); /* configured count before the model is known */
    assert_int_equal(t->tiled_mlp_forward(ctx, 0, 10), PT_ERR_ORDER);
    assert_non_null(strstr(t->last_error(ctx), "expected post_model_load"));
    void *p = NULL;
    assert_int_equal(t->tiled_mlp_scratch(ctx, 64, &p), PT_ERR_ORDER);
    assert_null(p);
    assert_non_null(strstr(t->last_error(ctx), "outside the host's mlp_forward"));
    assert_int_equal(t->finalize(ctx), 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tile_counts),
        cmocka_unit_test(test_grads),
        cmocka_unit_test(test_ckpt_streamed),
        cmocka_unit_test(test_peak),
        cmocka_unit_test(test_plan),
        cmocka_unit_test(test_auto),
        cmocka_unit_test(test_order),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
