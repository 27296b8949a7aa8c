/*
 * test_tp_plugin.c — tensor-parallel REKLS through the plugin's hooks, alone
 * and inside data parallel.
 *
 * A hook-level host (this file) declares, FULL shapes,
 *   b0.w 16 x 32 split along rows    (tp_split 1: each rank holds 16/P x 32),
 *   b1.w 32 x 16 split along columns (tp_split 2: each rank holds 32 x 16/P),
 *   b2.w 24 x 40 replicated          (tp_split 0: every rank holds all of it),
 *   b3.b 32      split along rows    (1-D: REKLS leaves it to AdamW, which
 *                                      steps each rank's shard),
 * with [dist] tp_size = P ($TP_SIZE, default: the number of ranks W; 1 under
 * make test, 2 and 4 under mpirun in tests/dist.sh). Ranks form groups of P
 * consecutive ranks; the W / P groups are data-parallel replicas, replica d
 * (= rank / P) holding shard rank % P. Each step has D * nm batches, nm
 * micro-batches per replica; batch b = d * nm + micro gives the gradient of
 * full element (i, j) as f(b, step, i, j) + 0.01 w(i, j), scaled by 1/nm (a
 * rank writes the elements of its shard). The oracle, inside the test, is
 * single-rank REKLS (pt_rekls_step) on the full matrices and single-rank AdamW
 * (pt_cpu_adam_range) on the full bias, fed the gradient the plugin must form:
 * per replica the micro-batches summed in order, then the replicas summed in
 * rank order times 1/D. After every step every rank's shard (read_param) must
 * equal the oracle's rows / columns bit for bit, for
 *   - every chunk resident (mode A) and every chunk offloaded (mode B);
 *   - offloaded with global-norm clipping: the reported norm equals the full
 *     matrices' norm (1e-6 relative: the sum order differs), and the oracle,
 *     given the clip factor computed from that norm as the plugin does, again
 *     matches bit for bit; control (P > 1): this rank's shards alone give
 *     another norm, so the check sees the group sum;
 *   - 2 micro-batches per replica (gradient accumulation);
 *   - l2 weight decay from the INI with beta2 left to auto (0.95 for REKLS);
 *     control: an oracle with AdamW's 0.999 differs;
 *   - weight_decay left to auto (INI default, NaN in the descriptor): REKLS
 *     matches an oracle with 0.01 and AdamW (the plugin's and the oracle's,
 *     every parameter) one with 0; controls: 0 for REKLS and 0.01 for AdamW
 *     differ; a number in the INI or in the descriptor wins over auto;
 *   - bf16 weights (one replica: resident 16-bit gradients are not reduced
 *     across replicas yet): fp32 masters in the plugin and in the oracle;
 *   - the planner's view (auto_memory: a profile, cached, and a plan file):
 *     the trace records tp_size P and, on the chunks, the fp32 bytes REKLS
 *     gathers per step for the two split weights, 4 (16 * 32 + 32 * 16) =
 *     4096 of gradient and 4 (16^2 + 32^2) * 2 = 10240 of factors (0 and 0
 *     with P = 1); the plan file has tp_size P and a positive tp_gather_s
 *     exactly when P > 1;
 *   - every block weight split (b2.w along rows too, as a Megatron-style host
 *     declares them), every chunk resident: no REKLS param is stepped whole on
 *     the device, so no device workspace or eigh status buffer exists and the
 *     step must not touch one;
 *   - save_state after step 3, a new plugin instance, load_state, steps 4-5:
 *     still bit-identical (resume is exact); control: without load_state the
 *     shards differ; a file saved under tp_size P refused by a run with 2P.
 * With $TP_DUMP set, the final shards of the mode-A/B runs go to
 * $TP_DUMP.<run>.<rank>: dist.sh compares 4 ranks (tp 2 x dp 2, batches {0, 1}
 * on the two replicas) with 2 ranks (tp 2, batches {0, 1} as 2 micro-batches)
 * byte for byte. Control for every comparison: an oracle with another shampoo
 * beta differs. Refusals: a split weight whose full shape does not divide by P
 * (P > 1), tp_size not dividing world_size, tp_size > 1 with OSFT, a bad
 * tp_split value.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <dirent.h>
#include <string.h>
#include <unistd.h>

#include "coll/coll.h"
#include "host_builder.h"
#include "kernels_hd.h"
#include "optim/optim.h"
#include "planner/trace_cache.h"
#include "protrain.h"

static const pt_plugin_v1 *PL = &protrain_plugin_v1;
static pt_coll *COLL;
static int WORLD = 1, RANK = 0, TP = 1, D = 1;

enum { NW = 4,
       STEPS = 5 };
static const int FM[NW] = {16, 32, 24, 32}, FN[NW] = {32, 16, 40, 1};
static const int SPLIT0[NW] = {1, 2, 0, 1};
static int SPLIT[NW] = {1, 2, 0, 1};   /* test_all_split_resident splits b2.w too */

typedef struct host {
    void *ctx;
    int P, r, d, k;            /* group size, rank in it, replica, the step being run */
    int micro, nm, dtype;      /* micro-batch, micro-batches per step, weight dtype */
    int lm[NW], ln[NW];        /* local shapes */
    pt_param_v1 p[NW];
    pt_model_v1 m;
    void *init[NW];
} host;

static float gfun(int w, int k, int b, int i, int j) {
    return sinf(0.37f * (float)(i * 41 + j) + 1.3f * (float)k + (float)w + 0.71f * (float)b) *
           0.5f;
}
static float winit(int w, int i, int j) { return 0.02f * cosf(0.11f * (float)(i * 53 + j * 7 + w)); }
/* full index of local element (i, j) of weight w on group rank r */
static int fi(const host *h, int w, int i) { return SPLIT[w] == 1 ? h->r * h->lm[w] + i : i; }
static int fj(const host *h, int w, int j) { return SPLIT[w] == 2 ? h->r * h->ln[w] + j : j; }

static int32_t pass(void *user) {
    host *h = user;
    double loss = 0;
    int batch = h->d * h->nm + h->micro;
    float s = 1.0f / (float)h->nm;
    for (int b = 0; b < NW; b++) {
        int rc = PL->block_pre_forward(h->ctx, b);
        if (rc) return rc;
        loss += pt_load_elem(h->p[b].data, h->dtype, 0);
        if ((rc = PL->block_post_forward(h->ctx, b))) return rc;
    }
    for (int b = NW - 1; b >= 0; b--) {
        int rc = PL->block_pre_backward(h->ctx, b);
        if (rc) return rc;
        for (int i = 0; i < h->lm[b]; i++)
            for (int j = 0; j < h->ln[b]; j++) {
                size_t e = (size_t)i * h->ln[b] + j;
                float x = pt_load_elem(h->p[b].data, h->dtype, e);
                float v = s * (gfun(b, h->k, batch, fi(h, b, i), fj(h, b, j)) + 0.01f * x);
                pt_store_elem(h->p[b].grad, h->dtype, e, pt_load_elem(h->p[b].grad, h->dtype, e) + v);
            }
        if ((rc = PL->block_post_backward(h->ctx, b))) return rc;
    }
    return isfinite(loss) ? 0 : PT_ERR_INTERNAL;
}
static int32_t recompute(void *user, int32_t b) {
    (void)user, (void)b;
    return 0;
}
static void hlog(void *user, int32_t level, const char *msg) {
    (void)user, (void)level;
    if (getenv("TP_LOG")) fprintf(stderr, "[rank %d] %s\n", RANK, msg);
}

/* init + post_model_load; returns the failing hook's code (0: started). split0:
 * b0.w's split (for the bad-value case); cols0: b0.w's full column count. */
static int start(host *h, int P, const char *extra, int split0, int cols0, int dtype) {
    memset(h, 0, sizeof *h);
    h->P = P;
    h->r = P > 1 ? RANK % P : 0;
    h->d = P > 1 ? RANK / P : 0;
    h->nm = 1;
    h->dtype = dtype;
    static char names[NW][16];
    for (int w = 0; w < NW; w++) {
        int fm = FM[w], fn = w == 0 ? cols0 : FN[w];
        h->lm[w] = SPLIT[w] == 1 ? fm / P : fm;
        h->ln[w] = SPLIT[w] == 2 ? fn / P : fn;
        h->init[w] = malloc(pt_dtype_size(dtype) * (size_t)h->lm[w] * h->ln[w]);
        assert_non_null(h->init[w]);
        for (int i = 0; i < h->lm[w]; i++)
            for (int j = 0; j < h->ln[w]; j++)
                pt_store_elem(h->init[w], dtype, (size_t)i * h->ln[w] + j,
                              winit(w, fi(h, w, i), fj(h, w, j)));
        snprintf(names[w], sizeof names[w], w == 3 ? "b%d.b" : "b%d.w", w);
        h->p[w] = (pt_param_v1){.name = names[w], .dtype = dtype, .ndim = w == 3 ? 1 : 2, .shape = {h->lm[w], w == 3 ? 0 : h->ln[w]}, .block = w, .trainable = 1, .tie = -1, .tp_split = w == 0 ? split0 : SPLIT[w], .init = h->init[w]};
    }
    h->m = (pt_model_v1){.struct_size = sizeof h->m, .n_params = NW, .params = h->p, .n_blocks = NW, .batch = 1, .seq = 1, .arch = "tp-hooks"};
    char text[1024];
    int n = snprintf(text, sizeof text,
                     "[plugin]\nbackend = host\nlog_level = %s\n[optimizer]\ncpu_threads = 1\n"
                     "[dist]\ntimeout = 60\ntp_size = %d\n%s\n",
                     getenv("TP_LOG") ? "info" : "error", P, extra);
    assert_true(n > 0 && (size_t)n < sizeof text);
    pt_host_v1 hs = hb_host(h);
    hs.world_size = WORLD;
    hs.rank = RANK;
    hs.local_rank = RANK;
    hs.profile_step = pass;
    hs.log = hlog;
    hs.recompute_block = recompute;
    int rc = hb_init(PL, text, &hs, &h->ctx);
    if (rc) return rc;
    return PL->post_model_load(h->ctx, &h->m);
}

static void stop(host *h) {
    if (h->ctx) assert_int_equal(PL->finalize(h->ctx), PT_OK);
    h->ctx = NULL;
    for (int w = 0; w < NW; w++) free(h->init[w]);
}

/* beta2, wd: the descriptor's (NaN: the INI's) */
static int create_opt(host *h, int type, float max_norm, float beta2, float wd) {
    pt_optim_v1 od = {.struct_size = sizeof od, .type = type, .lr = 1e-3f, .beta1 = 0.9f, .beta2 = beta2, .eps = NAN, .weight_decay = wd, .max_grad_norm = max_norm};
    return PL->create_optimizer(h->ctx, &od);
}

static const char *RESIDENT_INI = "[protrain]\nforce_all_persistent = true\n";
static const char *OFFLOAD_INI = "[protrain]\nauto_mode = false\nauto_memory = false\n"
                                 "n_persist = 0\nn_buffer = 3\nn_swap = 0\nn_checkpoint = 0\n"
                                 "chunk_size = 16384\n";

typedef struct runopt {
    const char *ini;        /* placement and other INI text */
    float clip;             /* max_grad_norm */
    int nm;                 /* micro-batches per replica */
    int dtype;              /* PT_F32 or PT_BF16 */
    float beta2;            /* descriptor beta2 (NaN: the INI's, auto) */
    float wd;               /* descriptor weight_decay (NaN: the INI's, auto) */
    int adamw;              /* plugin and oracle: AdamW on every parameter instead of REKLS */
    float oracle_bs, oracle_beta2, oracle_wd;
    int oracle_wdm;         /* pt_rekls_wd of the oracle */
    int resume_at;          /* save after this step, restart, load (0: no) */
    int skip_load;          /* control: restart without load_state */
    const char *dump;       /* run name for $TP_DUMP, or NULL */
} runopt;

static runopt base_opt(const char *ini) {
    runopt o = {ini, 0, 1, PT_F32, 0.95f, 0.01f, 0, 0.95f, 0.95f, 0.01f, PT_REKLS_WD_DECOUPLED, 0, 0,
                NULL};
    return o;
}

static void begin(host *h, const runopt *o) {
    if (start(h, TP, o->ini, SPLIT[0], FN[0], o->dtype))
        fail_msg("rank %d: start: %s", RANK, PL->last_error(h->ctx));
    h->nm = o->nm;
    if (create_opt(h, o->adamw ? PT_OPTIM_ADAMW : PT_OPTIM_REKLS, o->clip, o->beta2, o->wd))
        fail_msg("rank %d: create_optimizer: %s", RANK, PL->last_error(h->ctx));
}

/* P ranks vs the oracle over STEPS steps. Returns 1 when every shard matched
 * every step; *norm_err: the largest relative norm difference. */
static int run(const runopt *o, double *norm_err) {
    host h;
    begin(&h, o);
    const int dt = o->dtype;
    /* the oracle: full tensors, optimizer state of its own */
    float *W[NW], *M[NW], *V[NW], *aux[NW], *ws[NW], *G[NW], *acc[NW];
    void *Wc[NW];   /* compute copy (bf16) */
    for (int w = 0; w < NW; w++) {
        size_t mn = (size_t)FM[w] * FN[w];
        W[w] = malloc(mn * 4), G[w] = malloc(mn * 4), M[w] = calloc(mn, 4), V[w] = calloc(mn, 4);
        acc[w] = malloc(mn * 4);
        Wc[w] = malloc(mn * pt_dtype_size(dt));
        aux[w] = malloc(pt_rekls_aux_words(FM[w], FN[w]) * 4);
        ws[w] = malloc(pt_rekls_ws_words(FM[w], FN[w]) * 4);
        assert_true(W[w] && G[w] && M[w] && V[w] && acc[w] && Wc[w] && aux[w] && ws[w]);
        for (size_t e = 0; e < mn; e++) {
            pt_store_elem(Wc[w], dt, e, winit(w, (int)(e / FN[w]), (int)(e % FN[w])));
            W[w][e] = pt_load_elem(Wc[w], dt, e);   /* the master starts from the copy */
        }
        pt_rekls_aux_init_host(aux[w], FM[w], FN[w]);
    }
    int same = 1;
    *norm_err = 0;
    char err[512];
    for (int k = 1; k <= STEPS; k++) {
        h.k = k;
        for (int mi = 0; mi < o->nm; mi++) {
            h.micro = mi;
            assert_int_equal(PL->pre_step(h.ctx, k, mi, o->nm), PT_OK);
            if (pass(&h)) fail_msg("rank %d step %d: %s", RANK, k, PL->last_error(h.ctx));
        }
        if (PL->optimizer_step(h.ctx, -1.0f)) fail_msg("rank %d step %d: %s", RANK, k, PL->last_error(h.ctx));
        assert_int_equal(PL->post_step(h.ctx, k, 0.0f), PT_OK);
        /* the oracle's gradients: per replica the micro-batches in order (fp32
         * sums; one 16-bit micro-batch is rounded once), the replicas in rank
         * order, times 1/D; their norm in double over the full tensors */
        double sq = 0, sq_own = 0;
        float s = 1.0f / (float)o->nm;
        for (int w = 0; w < NW; w++)
            for (int i = 0; i < FM[w]; i++)
                for (int j = 0; j < FN[w]; j++) {
                    size_t e = (size_t)i * FN[w] + j;
                    float x = pt_load_elem(Wc[w], dt, e);
                    for (int d = 0; d < D; d++) {
                        float a = 0.0f;
                        for (int mi = 0; mi < o->nm; mi++) {
                            float v = s * (gfun(w, k, d * o->nm + mi, i, j) + 0.01f * x);
                            if (dt != PT_F32) {   /* the host's 16-bit gradient */
                                float r;   /* room for any element size */
                                pt_store_elem(&r, dt, 0, a + v);
                                a = pt_load_elem(&r, dt, 0);
                            } else {
                                a = a + v;
                            }
                        }
                        if (d == 0) acc[w][e] = a;
                        else acc[w][e] += a;
                    }
                    G[w][e] = D > 1 ? acc[w][e] * (float)(1.0 / D) : acc[w][e];
                    sq += (double)G[w][e] * G[w][e];
                    int mine = SPLIT[w] == 0 || (SPLIT[w] == 1 ? i / h.lm[w] : j / h.ln[w]) == h.r;
                    if (mine) sq_own += (double)G[w][e] * G[w][e];
                }
        float gs = 1.0f;
        if (o->clip > 0) {
            pt_stats_v1 st = {.struct_size = sizeof st};
            assert_int_equal(PL->get_stats(h.ctx, &st), PT_OK);
            double dn = fabs(st.last_grad_norm - sqrt(sq)) / sqrt(sq);
            if (dn > *norm_err) *norm_err = dn;
            /* control: this rank's shards alone give another norm */
            if (TP > 1) assert_true(fabs(st.last_grad_norm - sqrt(sq_own)) / sqrt(sq) > 1e-3);
            if (st.last_grad_norm > o->clip)   /* the plugin's clip factor, from its norm */
                gs = (float)(o->clip / (st.last_grad_norm + 1e-6));
        }
        for (int w = 0; w < NW; w++) {
            void *out = dt == PT_F32 ? NULL : Wc[w];
            if (w < 3 && !o->adamw) {
                pt_rekls_hyper hy = {1e-3f, 0.9f, o->oracle_beta2, 1e-8f, o->oracle_wd, o->oracle_bs,
                                     0, k, gs, o->oracle_wdm};
                pt_rekls_tensors x = {FM[w], FN[w], G[w], PT_F32, W[w], out, dt, M[w], V[w],
                                      aux[w], ws[w]};
                assert_int_equal(pt_rekls_step(&pt_rekls_la_cpu, &hy, &x, err, sizeof err), 0);
            } else {   /* AdamW, decoupled decay, on the full bias (every weight with adamw) */
                float bc1, bc2r;
                pt_adamw_bias(0.9f, o->oracle_beta2, k, &bc1, &bc2r);
                pt_cpu_adam_args a = {W[w], G[w], PT_F32, M[w], V[w], out, dt,
                                      (size_t)FM[w] * FN[w],
                                      pt_adamw_make_consts(1e-3f, 0.9f, o->oracle_beta2, 1e-8f,
                                                           o->oracle_wd, bc1, bc2r, gs)};
                pt_cpu_adam_range(&a, 0, a.n);
            }
            if (dt == PT_F32) memcpy(Wc[w], W[w], (size_t)FM[w] * FN[w] * 4);
            size_t es = pt_dtype_size(dt), ln = (size_t)h.lm[w] * h.ln[w];
            unsigned char *got = malloc(ln * es);
            assert_non_null(got);
            assert_int_equal(PL->read_param(h.ctx, w, got, ln * es), PT_OK);
            for (int i = 0; i < h.lm[w]; i++)
                for (int j = 0; j < h.ln[w]; j++) {
                    size_t le = (size_t)i * h.ln[w] + j;
                    size_t fe = (size_t)fi(&h, w, i) * FN[w] + fj(&h, w, j);
                    if (memcmp(got + le * es, (unsigned char *)Wc[w] + fe * es, es)) same = 0;
                }
            free(got);
        }
        if (k == o->resume_at) {   /* save, a new instance, load */
            char dir[] = "/tmp/pt_tp_state_XXXXXX";
            assert_non_null(mkdtemp(dir));
            if (PL->save_state(h.ctx, dir)) fail_msg("rank %d: save_state: %s", RANK, PL->last_error(h.ctx));
            stop(&h);
            begin(&h, o);
            if (!o->skip_load && PL->load_state(h.ctx, dir))
                fail_msg("rank %d: load_state: %s", RANK, PL->last_error(h.ctx));
            if (TP > 1 && !o->skip_load && WORLD >= 2 * TP) {
                /* a run with twice the group size holds other shards: refused */
                host h2;
                assert_int_equal(start(&h2, 2 * TP, RESIDENT_INI, SPLIT[0], FN[0], o->dtype), PT_OK);
                assert_int_equal(create_opt(&h2, PT_OPTIM_REKLS, 0, 0.95f, 0.01f), PT_OK);
                assert_int_not_equal(PL->load_state(h2.ctx, dir), PT_OK);
                const char *e = PL->last_error(h2.ctx);
                if (RANK == 0) printf("  refused: %s\n", e);
                assert_non_null(strstr(e, "tp_size"));
                stop(&h2);
            }
            char f[128];
            snprintf(f, sizeof f, "%s/protrain_state_rank%d.bin", dir, RANK);
            unlink(f);
            rmdir(dir);
        }
    }
    const char *dp = getenv("TP_DUMP");
    if (dp && o->dump) {
        char f[512];
        snprintf(f, sizeof f, "%s.%s.%d", dp, o->dump, RANK);
        FILE *fp = fopen(f, "wb");
        assert_non_null(fp);
        for (int w = 0; w < NW; w++) {
            size_t n = (size_t)h.lm[w] * h.ln[w] * pt_dtype_size(dt);
            void *got = malloc(n);
            assert_int_equal(PL->read_param(h.ctx, w, got, n), PT_OK);
            assert_int_equal(fwrite(got, 1, n, fp), n);
            free(got);
        }
        fclose(fp);
    }
    for (int w = 0; w < NW; w++) {
        free(W[w]);
        free(G[w]);
        free(M[w]);
        free(V[w]);
        free(aux[w]);
        free(ws[w]);
        free(acc[w]);
        free(Wc[w]);
    }
    stop(&h);
    return same;
}

static void report(const char *what, int ok) {
    if (RANK == 0)
        printf("  %d rank(s), tp %d x dp %d, %s: %s\n", WORLD, TP, D, what,
               ok ? "every shard bit-identical to the single-rank oracle over 5 steps"
                  : "DIFFERS");
}

static void test_resident(void **s) {
    (void)s;
    double ne;
    runopt o = base_opt(RESIDENT_INI);
    o.dump = "A";
    int ok = run(&o, &ne);
    report("resident chunks (mode A)", ok);
    assert_true(ok);
}

static void test_offloaded(void **s) {
    (void)s;
    double ne;
    runopt o = base_opt(OFFLOAD_INI);
    o.dump = "B";
    int ok = run(&o, &ne);
    report("offloaded chunks (mode B)", ok);
    assert_true(ok);
    /* negative control: another factor decay in the oracle differs */
    o.oracle_bs = 0.9f;
    o.dump = NULL;
    assert_false(run(&o, &ne));
}

static void test_clipped(void **s) {
    (void)s;
    double ne;
    runopt o = base_opt(OFFLOAD_INI);
    o.clip = 0.05f;
    int ok = run(&o, &ne);
    report("offloaded, clipped", ok);
    if (RANK == 0) printf("  global norm vs the full tensors': max relative difference %.2g\n", ne);
    assert_true(ne <= 1e-6);
    assert_true(ok);
}

/* 2 micro-batches per replica; with one replica the dumps are what dist.sh
 * compares with 2 replicas of one micro-batch each (the same two batches) */
static void test_accumulated(void **s) {
    (void)s;
    double ne;
    for (int pl = 0; pl < 2; pl++) {
        runopt o = base_opt(pl ? OFFLOAD_INI : RESIDENT_INI);
        o.nm = 2;
        o.dump = pl ? "B2" : "A2";
        int ok = run(&o, &ne);
        report(pl ? "offloaded, 2 micro-batches" : "resident, 2 micro-batches", ok);
        assert_true(ok);
    }
}

/* l2 decay from the INI; beta2 from the INI's auto, which must be REKLS's 0.95 */
static void test_l2_and_beta2_auto(void **s) {
    (void)s;
    double ne;
    runopt o = base_opt("[protrain]\nforce_all_persistent = true\n[optimizer]\n"
                        "rekls_weight_decay_method = l2\n");
    o.beta2 = NAN;
    o.oracle_wdm = PT_REKLS_WD_L2;
    int ok = run(&o, &ne);
    report("l2 weight decay, beta2 = auto", ok);
    assert_true(ok);
    o.oracle_beta2 = 0.999f;   /* control: AdamW's beta2 differs */
    assert_false(run(&o, &ne));
    o.oracle_beta2 = 0.95f;    /* control: decoupled decay differs */
    o.oracle_wdm = PT_REKLS_WD_DECOUPLED;
    assert_false(run(&o, &ne));
}

/* weight_decay = auto: the INI's default and a NaN descriptor value resolve by
 * the optimizer type at create_optimizer, 0.01 for REKLS and 0 for AdamW */
static void test_weight_decay_auto(void **s) {
    (void)s;
    double ne;
    runopt o = base_opt(RESIDENT_INI);
    o.wd = o.beta2 = NAN;
    int ok = run(&o, &ne);
    report("REKLS, weight_decay = auto (0.01), beta2 = auto", ok);
    assert_true(ok);
    o.oracle_wd = 0.0f;   /* control: no decay differs */
    assert_false(run(&o, &ne));
    /* AdamW (beta2 auto = 0.999): no decay */
    o.adamw = 1;
    o.oracle_beta2 = 0.999f;
    ok = run(&o, &ne);
    report("AdamW, weight_decay = auto (0), beta2 = auto", ok);
    assert_true(ok);
    o.oracle_wd = 0.01f;  /* control: REKLS's 0.01 differs */
    assert_false(run(&o, &ne));
    /* a number wins over auto: in the INI ... */
    runopt n = base_opt("[protrain]\nforce_all_persistent = true\n[optimizer]\nweight_decay = 0\n");
    n.wd = NAN;
    n.oracle_wd = 0.0f;
    ok = run(&n, &ne);
    report("REKLS, INI weight_decay = 0 over auto", ok);
    assert_true(ok);
    /* ... and in the descriptor */
    n = base_opt(RESIDENT_INI);
    n.wd = n.oracle_wd = 0.0f;
    ok = run(&n, &ne);
    report("REKLS, descriptor weight_decay = 0 over auto", ok);
    assert_true(ok);
}

/* The profile's trace and the plan as the planner sees tensor parallel (see
 * the header comment for the bytes) */
static void test_plan_terms(void **s) {
    (void)s;
    char cache[128], plan[160], extra[512];
    snprintf(cache, sizeof cache, "/tmp/pt_tp_cache_%d", (int)getpid());
    snprintf(plan, sizeof plan, "%s.plan.json", cache);
    snprintf(extra, sizeof extra, "[optimizer]\ntype = rekls\n[protrain]\ncache_dir = %s\n"
                                  "plan_file = %s\n",
             cache, plan);
    host h;
    if (start(&h, TP, extra, SPLIT[0], FN[0], PT_F32))
        fail_msg("rank %d: start: %s", RANK, PL->last_error(h.ctx));
    if (create_opt(&h, PT_OPTIM_REKLS, 0, NAN, NAN))
        fail_msg("rank %d: create_optimizer: %s", RANK, PL->last_error(h.ctx));
    stop(&h);
    DIR *d = opendir(cache);
    assert_non_null(d);
    struct dirent *e;
    char path[512] = "";
    while ((e = readdir(d)))
        if (strstr(e->d_name, ".trace") && !strstr(e->d_name, ".tmp"))
            snprintf(path, sizeof path, "%s/%s", cache, e->d_name);
    closedir(d);
    pt_trace t;
    pt_trace_init(&t);
    char err[512];
    if (pt_trace_read_file(path, NULL, &t, err, sizeof err)) fail_msg("%s: %s", path, err);
    uint64_t g = 0, f = 0;
    for (int k = 0; k < t.n_chunk; k++) {
        g += t.chunks[k].tp_grad_bytes;
        f += t.chunks[k].tp_factor_bytes;
    }
    if (RANK == 0)
        printf("  trace: tp_size %d, gathered per step %llu gradient + %llu factor bytes\n",
               t.tp_size, (unsigned long long)g, (unsigned long long)f);
    assert_int_equal(t.tp_size, TP);
    assert_int_equal(g, TP > 1 ? 4096 : 0);
    assert_int_equal(f, TP > 1 ? 10240 : 0);
    pt_trace_free(&t);
    FILE *fp = fopen(plan, "r");
    assert_non_null(fp);
    char text[16384];
    size_t n = fread(text, 1, sizeof text - 1, fp);
    fclose(fp);
    text[n] = 0;
    char want[64];
    snprintf(want, sizeof want, "\"tp_size\": %d", TP);
    assert_non_null(strstr(text, want));
    const char *tg = strstr(text, "\"tp_gather_s\": ");
    assert_non_null(tg);
    double tgs = atof(tg + strlen("\"tp_gather_s\": "));
    if (RANK == 0) printf("  plan: tp_gather_s %g\n", tgs);
    assert_true(TP > 1 ? tgs > 0 : tgs == 0);
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' '%s'", cache, plan);
    assert_int_equal(system(cmd), 0);
}

static void test_bf16(void **s) {
    (void)s;
    if (D > 1) {   /* resident 16-bit gradients are not reduced across replicas yet */
        if (RANK == 0) printf("  bf16: skipped with %d replicas\n", D);
        skip();   /* every rank alike (D is the same on all): SKIPPED, not PASSED */
    }
    double ne;
    for (int pl = 0; pl < 2; pl++) {
        runopt o = base_opt(pl ? OFFLOAD_INI : RESIDENT_INI);
        o.dtype = PT_BF16;
        int ok = run(&o, &ne);
        report(pl ? "bf16 weights, offloaded" : "bf16 weights, resident", ok);
        assert_true(ok);
    }
}

/* Megatron-style: every REKLS weight split, every chunk resident */
static void test_all_split_resident(void **s) {
    (void)s;
    double ne;
    SPLIT[2] = 1;
    runopt o = base_opt(RESIDENT_INI);
    int ok = run(&o, &ne);
    report("every block weight split (Megatron-style), resident chunks", ok);
    assert_true(ok);
}
static int restore_split(void **s) {
    (void)s;
    memcpy(SPLIT, SPLIT0, sizeof SPLIT);
    return 0;
}

static void test_resume(void **s) {
    (void)s;
    double ne;
    for (int pl = 0; pl < 2; pl++) {
        runopt o = base_opt(pl ? OFFLOAD_INI : RESIDENT_INI);
        o.resume_at = 3;
        int ok = run(&o, &ne);
        report(pl ? "offloaded, saved after step 3 and loaded into a new instance"
                  : "resident, saved after step 3 and loaded into a new instance",
               ok);
        assert_true(ok);
    }
    /* control: a new instance without load_state starts over */
    runopt o = base_opt(OFFLOAD_INI);
    o.resume_at = 3;
    o.skip_load = 1;
    assert_false(run(&o, &ne));
}

static void test_refusals(void **s) {
    (void)s;
    host h;
    const char *e;
    /* b0.w 16 x 33 split on rows: 33 columns do not divide by P (only P > 1) */
    if (TP > 1 && TP <= 4) {
        assert_int_equal(start(&h, TP, RESIDENT_INI, 1, 33 / TP * TP + 1, PT_F32), PT_OK);
        assert_int_not_equal(create_opt(&h, PT_OPTIM_REKLS, 0, 0.95f, 0.01f), PT_OK);
        e = PL->last_error(h.ctx);
        if (RANK == 0) printf("  refused: %s\n", e);
        assert_non_null(strstr(e, "does not divide"));
        assert_non_null(strstr(e, "b0.w"));
        stop(&h);
    }
    /* a tp_split outside 0..2 */
    assert_int_not_equal(start(&h, TP, RESIDENT_INI, 3, FN[0], PT_F32), PT_OK);
    assert_non_null(strstr(PL->last_error(h.ctx), "tp_split 3"));
    stop(&h);
    /* tp_size that does not divide world_size */
    assert_int_not_equal(start(&h, WORLD + 1, RESIDENT_INI, 1, FN[0], PT_F32), PT_OK);
    e = PL->last_error(NULL);
    if (RANK == 0) printf("  refused: %s\n", e);
    assert_non_null(strstr(e, "tp_size"));
    stop(&h);
    /* with OSFT */
    assert_int_not_equal(start(&h, 2, "[osft]\nenabled = true\n", 1, FN[0], PT_F32), PT_OK);
    assert_non_null(strstr(PL->last_error(NULL), "OSFT"));
    stop(&h);
}

int main(void) {
    const char *ws = getenv("OMPI_COMM_WORLD_SIZE"), *rk = getenv("OMPI_COMM_WORLD_RANK");
    if (ws && rk) {
        WORLD = atoi(ws);
        RANK = atoi(rk);
    }
    const char *tp = getenv("TP_SIZE");
    TP = tp ? atoi(tp) : WORLD;
    if (TP < 1 || WORLD % TP) {
        fprintf(stderr, "test_tp_plugin: TP_SIZE=%d does not divide %d ranks\n", TP, WORLD);
        return 1;
    }
    D = WORLD / TP;
    if (WORLD > 1) {   /* keeps MPI up across the plugin's inits and finalizes */
        pt_coll_config cc = {WORLD, RANK, "env", 60.0, -1, "mpi", 0, NULL, NULL};
        char err[512];
        if (pt_coll_open(&cc, &COLL, err, sizeof err)) {
            fprintf(stderr, "test_tp_plugin: %s\n", err);
            return 1;
        }
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_resident),
        cmocka_unit_test(test_offloaded),
        cmocka_unit_test(test_clipped),
        cmocka_unit_test(test_accumulated),
        cmocka_unit_test(test_l2_and_beta2_auto),
        cmocka_unit_test(test_weight_decay_auto),
        cmocka_unit_test(test_plan_terms),
        cmocka_unit_test(test_bf16),
        cmocka_unit_test_teardown(test_all_split_resident, restore_split),
        cmocka_unit_test(test_resume),
        cmocka_unit_test(test_refusals),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    pt_coll_close(COLL);
    return rc;
}
