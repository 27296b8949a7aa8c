/*
 * test_quant.c — frozen quantized weights (PT_U8): opaque bytes the host
 * dequantizes itself, beside trainable fp32 parameters.
 *
 * The host, written against the hook table: NB blocks, each a trainable fp32
 * vector w_b (NW elements) and a frozen packed weight q_b of the same NW values
 * in 4 bits: NW/G fp32 group scales, then NW/2 bytes of nibbles (two values a
 * byte, low nibble first). A non-block frozen byte table (16 signed codes) maps
 * a nibble to its integer level, so the dequantized value k of block b is
 *     deq_b[k] = scale_b[k / G] * (int8) lut[nibble_b(k)]
 * Forward of block b adds 1e-3 * sum_k w_b[k] deq_b[k] to the loss; backward
 * adds 1e-3 deq_b[k] + 0.01 w_b[k] to w_b's gradient. The trainable non-block
 * embedding and head are as in tests/lib/hook_host.h.
 * Asserted:
 *  - resident (everything on the device, device AdamW) and streamed (every
 *    block chunk through two pool slots, CPU AdamW) runs give bit-identical
 *    losses and trained weights: the byte parameters reach the forward intact
 *    wherever they live;
 *  - read_param of every byte parameter after the steps returns the bytes the
 *    host gave (never modified; no gradient: grad stays NULL);
 *  - the plan counts them at 1 byte per element: growing every q_b by D bytes
 *    (smaller groups, more scales) grows the resident plan's model states by
 *    exactly NB * 2 * D (the parameter bytes and the chunk-wide gradient buffer
 *    the device allocates over a chunk that holds trainable params; each chunk
 *    here is 256-aligned in both sizes), and the streamed plan's pinned host
 *    bytes by the same (staged copy and gradient landing zone);
 *  - the same with global-norm clipping (the norm covers trainable params only);
 *  - save_state of the streamed run, load_state into a resident one: the byte
 *    params and weights come back and the next step is the same bits;
 *  - a trainable byte parameter is refused at post_model_load with a sentence.
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

#include "host_builder.h"
#include "protrain.h"

static const pt_plugin_v1 *P = &protrain_plugin_v1;

/* params: 0 emb, 1 lut, then (w_b, q_b) per block, last head */
enum { NB = 4,
       NW = 8192,
       NEL = 4096,
       NPAR = 3 + 2 * NB,
       STEPS = 4 };

typedef struct qhost {
    void *ctx;
    int G;                      /* values per scale group */
    uint64_t qbytes;            /* 4 * NW / G + NW / 2 */
    pt_param_v1 p[NPAR];
    pt_model_v1 m;
    void *init[NPAR];
    char names[NPAR][32];
    double loss;
} qhost;

static int W(int b) { return 2 + 2 * b; }
static int Q(int b) { return 3 + 2 * b; }

/* deq[k] from the packed bytes and the lookup table, as the host's kernel would */
static void dequant(const qhost *h, const unsigned char *q, const signed char *lut, float *deq) {
    const unsigned char *nib = q + 4 * (NW / h->G);
    for (int k = 0; k < NW; k++) {
        float sc;
        memcpy(&sc, q + 4 * (k / h->G), 4);
        int v = (nib[k / 2] >> (4 * (k % 2))) & 15;
        deq[k] = sc * (float)lut[v];
    }
}

static float deq_buf[NW];

static int fwd(qhost *h, int b) {
    const float *w = h->p[W(b)].data;
    if (h->p[Q(b)].grad) return 1;                     /* frozen: no gradient */
    dequant(h, h->p[Q(b)].data, h->p[1].data, deq_buf);
    double s = 0;
    for (int k = 0; k < NW; k++) s += (double)w[k] * deq_buf[k];
    h->loss += 1e-3 * s;
    return isfinite(s) ? 0 : 1;
}

static void bwd(qhost *h, int b) {
    float *g = h->p[W(b)].grad;
    const float *w = h->p[W(b)].data;
    dequant(h, h->p[Q(b)].data, h->p[1].data, deq_buf);
    for (int k = 0; k < NW; k++) g[k] += 1e-3f * deq_buf[k] + 0.01f * w[k];
}

static int32_t pass(void *user) {
    qhost *h = user;
    for (int b = 0; b < NB; b++) {
        int rc = P->block_pre_forward(h->ctx, b);
        if (!rc) rc = fwd(h, b) ? PT_ERR_INTERNAL : 0;
        if (!rc) rc = P->block_post_forward(h->ctx, b);
        if (rc) return rc;
    }
    for (int b = NB - 1; b >= 0; b--) {
        int rc = P->block_pre_backward(h->ctx, b);
        if (!rc) bwd(h, b);
        if (!rc) rc = P->block_post_backward(h->ctx, b);
        if (rc) return rc;
    }
    return 0;
}

static int32_t profile(void *user) { return pass(user); }

static int32_t recompute(void *user, int32_t b) {
    qhost *h = user;
    double keep = h->loss;
    int rc = fwd(h, b);
    h->loss = keep;
    return rc;
}

static void nonblock(qhost *h, int backward) {
    int idx[2] = {0, NPAR - 1};
    for (int j = 0; j < 2; j++) {
        pt_param_v1 *q = &h->p[idx[j]];
        if (backward) {
            float *g = q->grad;
            for (int k = 0; k < NEL; k += 7) g[k] += 0.002f * (float)(j + 1);
        } else {
            h->loss += ((const float *)q->data)[0];
        }
    }
}

static void *xmalloc(size_t n) {
    void *p = malloc(n);
    assert_non_null(p);
    return p;
}

/* Builds the model (groups of G values; trainable flag of the byte params),
 * writes the INI and runs init + post_model_load; returns its status. */
static int start(qhost *h, int G, int32_t q_trainable, const char *ini_extra) {
    memset(h, 0, sizeof *h);
    h->G = G;
    h->qbytes = 4ull * (NW / G) + NW / 2;
    unsigned rng = 12345u;
    for (int i = 0; i < NPAR; i++) {
        pt_param_v1 *q = &h->p[i];
        *q = (pt_param_v1){.name = h->names[i], .ndim = 1, .block = -1, .trainable = 1, .tie = -1};
        if (i == 0 || i == NPAR - 1) {
            snprintf(h->names[i], sizeof h->names[i], i ? "head" : "emb");
            float *v = xmalloc(NEL * sizeof(float));
            for (int k = 0; k < NEL; k++) v[k] = 0.001f * (float)((k * 7 + i) % 97) - 0.04f;
            q->dtype = PT_F32;
            q->shape[0] = NEL;
            h->init[i] = v;
        } else if (i == 1) {
            snprintf(h->names[i], sizeof h->names[i], "lut");
            signed char *v = xmalloc(16);
            for (int k = 0; k < 16; k++) v[k] = (signed char)(k - 8);
            q->dtype = PT_U8;
            q->shape[0] = 16;
            q->trainable = q_trainable;
            h->init[i] = v;
        } else if ((i - 2) % 2 == 0) {
            int b = (i - 2) / 2;
            snprintf(h->names[i], sizeof h->names[i], "h.%d.w", b);
            float *v = xmalloc(NW * sizeof(float));
            for (int k = 0; k < NW; k++) v[k] = 0.002f * (float)((k * 13 + b * 5) % 53) - 0.05f;
            q->dtype = PT_F32;
            q->shape[0] = NW;
            q->block = b;
            h->init[i] = v;
        } else {
            int b = (i - 2) / 2;
            snprintf(h->names[i], sizeof h->names[i], "h.%d.q4", b);
            unsigned char *v = xmalloc(h->qbytes);
            for (int g = 0; g < NW / G; g++) {
                float sc = 0.01f * (float)(1 + (g + b) % 5);
                memcpy(v + 4 * g, &sc, 4);
            }
            for (int k = 0; k < NW / 2; k++) {
                rng = rng * 1103515245u + 12345u;
                v[4 * (NW / G) + k] = (unsigned char)(rng >> 16);
            }
            q->dtype = PT_U8;
            q->shape[0] = (int64_t)h->qbytes;
            q->block = b;
            q->trainable = q_trainable;
            h->init[i] = v;
        }
        q->init = h->init[i];
    }
    h->m = (pt_model_v1){.struct_size = sizeof h->m, .n_params = NPAR, .params = h->p, .n_blocks = NB, .batch = 1, .seq = 1, .arch = "quant-test"};
    char text[1024];
    int n = snprintf(text, sizeof text,
                     "[plugin]\nbackend = host\nlog_level = %s\n[memory]\ndevice_capacity = "
                     "16MiB\n[protrain]\nchunk_size = 64KiB\n%s\n",
                     getenv("QH_LOG") ? getenv("QH_LOG") : "error", ini_extra);
    assert_true(n > 0 && (size_t)n < sizeof text);
    pt_host_v1 hs = hb_host(h);
    hs.profile_step = profile;
    hs.recompute_block = recompute;
    h->ctx = hb_open(P, text, &hs);
    return P->post_model_load(h->ctx, &h->m);
}

static void make(qhost *h, int G, const char *ini_extra) {
    if (start(h, G, 0, ini_extra)) fail_msg("post_model_load: %s", P->last_error(h->ctx));
    pt_optim_v1 od = {.struct_size = sizeof od, .type = PT_OPTIM_ADAMW, .lr = 1e-2f, .beta1 = NAN, .beta2 = NAN, .eps = NAN, .weight_decay = NAN, .max_grad_norm = NAN};
    if (P->create_optimizer(h->ctx, &od)) fail_msg("create_optimizer: %s", P->last_error(h->ctx));
}

static void done(qhost *h) {
    assert_int_equal(P->finalize(h->ctx), PT_OK);
    for (int i = 0; i < NPAR; i++) free(h->init[i]);
}

static double one_step(qhost *h, int s) {
    h->loss = 0;
    assert_int_equal(P->pre_step(h->ctx, s, 0, 1), PT_OK);
    nonblock(h, 0);
    if (pass(h)) fail_msg("step %d: %s", s, P->last_error(h->ctx));
    nonblock(h, 1);
    assert_int_equal(P->optimizer_step(h->ctx, -1.0f), PT_OK);
    assert_int_equal(P->post_step(h->ctx, s, (float)h->loss), PT_OK);
    return h->loss;
}

/* The byte params read back equal what the host gave; the weights into w. */
static void check_params(qhost *h, float (*w)[NW]) {
    for (int b = 0; b < NB; b++)
        assert_int_equal(P->read_param(h->ctx, W(b), w[b], NW * sizeof(float)), PT_OK);
    unsigned char *back = xmalloc(h->qbytes);
    for (int b = 0; b < NB; b++) {
        assert_int_equal(P->read_param(h->ctx, Q(b), back, h->qbytes), PT_OK);
        assert_memory_equal(back, h->init[Q(b)], h->qbytes);
        assert_null(h->p[Q(b)].grad);
    }
    assert_int_equal(P->read_param(h->ctx, 1, back, 16), PT_OK);
    assert_memory_equal(back, h->init[1], 16);
    /* a byte parameter is read at 1 byte per element, not 4 */
    char err_read = P->read_param(h->ctx, Q(0), back, 4 * h->qbytes) == PT_ERR_INVALID_ARG;
    assert_true(err_read);
    free(back);
}

/* STEPS steps; losses, the trained weights, and the byte params checked against init. */
static void train(qhost *h, double *loss, float (*w)[NW]) {
    for (int s = 0; s < STEPS; s++) loss[s] = one_step(h, s);
    check_params(h, w);
}

static float wr[NB][NW], ws[NB][NW];

/* Global-norm clipping beside byte params: resident vs streamed, same bits. */
static void test_clipped(void **st) {
    (void)st;
    double lr[STEPS], ls[STEPS];
    qhost a, b;
    make(&a, 64, "auto_memory = false\nn_persist = 99\nn_buffer = 0\nn_swap = 0\nn_checkpoint = 0"
                 "\n[optimizer]\nmax_grad_norm = 0.05");
    train(&a, lr, wr);
    pt_stats_v1 sa = {.struct_size = sizeof sa};
    assert_int_equal(P->get_stats(a.ctx, &sa), PT_OK);
    assert_true(sa.last_grad_norm > 0.05);          /* it clipped */
    done(&a);
    make(&b, 64, "auto_memory = false\nn_persist = 0\nn_buffer = 2\nn_swap = 0\nn_checkpoint = 0"
                 "\n[optimizer]\nmax_grad_norm = 0.05");
    train(&b, ls, ws);
    pt_stats_v1 sb = {.struct_size = sizeof sb};
    assert_int_equal(P->get_stats(b.ctx, &sb), PT_OK);
    assert_memory_equal(&sa.last_grad_norm, &sb.last_grad_norm, sizeof sa.last_grad_norm);
    done(&b);
    assert_memory_equal(lr, ls, sizeof lr);
    assert_memory_equal(wr, ws, sizeof wr);
}

static void test_resident_vs_streamed(void **st) {
    (void)st;
    double lr[STEPS], ls[STEPS];
    qhost a, b;
    make(&a, 64, "auto_memory = false\nn_persist = 99\nn_buffer = 0\nn_swap = 0\nn_checkpoint = 0");
    pt_stats_v1 sa = {.struct_size = sizeof sa};
    assert_int_equal(P->get_stats(a.ctx, &sa), PT_OK);
    assert_int_equal(sa.n_persist, sa.n_chunk);
    train(&a, lr, wr);
    done(&a);
    make(&b, 64, "auto_memory = false\nn_persist = 0\nn_buffer = 2\nn_swap = 0\nn_checkpoint = 0");
    pt_stats_v1 sb = {.struct_size = sizeof sb};
    assert_int_equal(P->get_stats(b.ctx, &sb), PT_OK);
    assert_true(sb.n_persist < sb.n_chunk);        /* the block chunks stream */
    train(&b, ls, ws);
    pt_stats_v1 sb2 = {.struct_size = sizeof sb2};
    assert_int_equal(P->get_stats(b.ctx, &sb2), PT_OK);
    /* every block chunk (trainable w and packed q) went up each step at least */
    assert_true(sb2.h2d_bytes - sb.h2d_bytes >=
                (uint64_t)STEPS * NB * (NW * sizeof(float) + b.qbytes));
    /* the state file carries the byte params: saved streamed, loaded resident,
     * the next step is the same bits */
    char dir[64];
    snprintf(dir, sizeof dir, "/tmp/pt_quant_state_%d", (int)getpid());
    assert_int_equal(mkdir(dir, 0700), 0);
    if (P->save_state(b.ctx, dir)) fail_msg("save_state: %s", P->last_error(b.ctx));
    qhost c;
    make(&c, 64, "auto_memory = false\nn_persist = 99\nn_buffer = 0\nn_swap = 0\nn_checkpoint = 0");
    if (P->load_state(c.ctx, dir)) fail_msg("load_state: %s", P->last_error(c.ctx));
    static float wc[NB][NW];
    check_params(&c, wc);
    assert_memory_equal(wc, ws, sizeof wc);
    double nb = one_step(&b, STEPS), nc = one_step(&c, STEPS);
    assert_memory_equal(&nb, &nc, sizeof nb);
    done(&c);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);
    done(&b);
    for (int s = 0; s < STEPS; s++)
        if (memcmp(&lr[s], &ls[s], sizeof lr[s]))
            fail_msg("step %d: resident loss %.17g, streamed %.17g", s, lr[s], ls[s]);
    assert_memory_equal(wr, ws, sizeof wr);
    /* the weights moved (the test trains something) and the loss depends on q */
    assert_true(lr[STEPS - 1] != lr[0]);
}

static double json_num(const char *path, const char *key) {
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    static char buf[1 << 16];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    char k[64];
    snprintf(k, sizeof k, "\"%s\": ", key);
    const char *p = strstr(buf, k);
    if (!p) fail_msg("plan JSON has no %s", key);
    return strtod(p + strlen(k), NULL);
}

/* The searched plan (profiled) with n_persist fixed: model states, pinned host
 * bytes and raw peak of the plan JSON. */
static void plan_of(int G, int n_persist, double *ms, double *host, double *raw, int *n_chunk) {
    char path[64], ini[256];
    snprintf(path, sizeof path, "/tmp/pt_quant_plan_%d.json", (int)getpid());
    snprintf(ini, sizeof ini, "plan_file = %s\nn_persist = %d\nn_swap = 0\nn_checkpoint = 0",
             path, n_persist);
    qhost h;
    make(&h, G, ini);
    *ms = json_num(path, "model_state_bytes");
    *host = json_num(path, "host_bytes");
    *raw = json_num(path, "raw_peak_bytes");
    *n_chunk = (int)json_num(path, "n_chunk");
    unlink(path);
    done(&h);
}

static void test_plan_counts_bytes(void **st) {
    (void)st;
    /* G 64 -> 32 adds NW/64 scales of 4 bytes: D = 512 bytes per block; both
     * block chunks (32 KiB of w + q) are multiples of 256 bytes */
    const double D = 4.0 * (NW / 32) - 4.0 * (NW / 64);
    assert_true((32768 + 4 * (NW / 64) + NW / 2) % 256 == 0);
    double ms1, h1, r1, ms2, h2, r2;
    int nc1, nc2;
    plan_of(64, 0, &ms1, &h1, &r1, &nc1);
    plan_of(32, 0, &ms2, &h2, &r2, &nc2);
    assert_int_equal(nc1, nc2);                  /* same layout, only the q sizes differ */
    assert_true(ms2 == ms1);                     /* streamed: only the non-block chunks */
    if (h2 - h1 != NB * 2 * D)
        fail_msg("streamed pinned bytes grew by %.0f (want %.0f)", h2 - h1, NB * 2 * D);
    plan_of(64, nc1, &ms1, &h1, &r1, &nc1);      /* everything resident */
    plan_of(32, nc2, &ms2, &h2, &r2, &nc2);
    if (ms2 - ms1 != NB * 2 * D)
        fail_msg("resident model states grew by %.0f bytes for %.0f more bytes in each of %d "
                 "blocks (want %.0f)",
                 ms2 - ms1, D, NB, NB * 2 * D);
    assert_true(r2 - r1 == ms2 - ms1);
}

static void test_trainable_bytes_refused(void **st) {
    (void)st;
    qhost h;
    assert_int_equal(start(&h, 64, 1, "auto_memory = false\nn_persist = 99\nn_buffer = 0\n"
                                      "n_swap = 0\nn_checkpoint = 0"),
                     PT_ERR_INVALID_ARG);
    const char *e = P->last_error(h.ctx);
    if (!strstr(e, "'lut' is u8") || !strstr(e, "must be frozen")) fail_msg("error: %s", e);
    assert_int_equal(P->finalize(h.ctx), PT_OK);
    for (int i = 0; i < NPAR; i++) free(h.init[i]);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_resident_vs_streamed),
        cmocka_unit_test(test_clipped),
        cmocka_unit_test(test_plan_counts_bytes),
        cmocka_unit_test(test_trainable_bytes_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
