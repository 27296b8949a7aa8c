/*
 * test_lifecycle.c — the plugin table driven directly (statically linked):
 * hook order, error sentences, the resident AdamW against a reference loop,
 * clipping, memory services, finalize.
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
#include "kernels_hd.h"
#include "protrain.h"

static const pt_plugin_v1 *P = &protrain_plugin_v1;

static char ini_path[256];

static void write_ini(const char *text) {
    snprintf(ini_path, sizeof ini_path, "/tmp/pt_lc_%d.ini", (int)getpid());
    FILE *f = fopen(ini_path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

/* A tiny model: 2 blocks, one weight + bias each, plus a non-block embedding
 * and a head tied to it. */
enum { NP = 6,
       NB = 2 };
typedef struct tiny {
    pt_param_v1 p[NP];
    pt_model_v1 m;
    float init[NP][64];
} tiny;

static void tiny_make(tiny *t) {
    memset(t, 0, sizeof *t);
    static const char *names[NP] = {"emb", "b0.w", "b0.b", "b1.w", "b1.b", "head"};
    static const int64_t n[NP] = {64, 48, 8, 48, 8, 64};
    static const int blk[NP] = {-1, 0, 0, 1, 1, -1};
    for (int i = 0; i < NP; i++) {
        t->p[i].name = names[i];
        t->p[i].dtype = PT_F32;
        t->p[i].ndim = 1;
        t->p[i].shape[0] = n[i];
        t->p[i].block = blk[i];
        t->p[i].trainable = 1;
        t->p[i].tie = -1;
        for (int k = 0; k < n[i]; k++) t->init[i][k] = 0.01f * (float)((i * 37 + k * 11) % 23) - 0.1f;
        t->p[i].init = t->init[i];
    }
    t->p[5].tie = 0;
    t->p[5].init = NULL;
    t->m.struct_size = sizeof t->m;
    t->m.n_params = NP;
    t->m.params = t->p;
    t->m.n_blocks = NB;
    t->m.batch = 1;
    t->m.seq = 1;
    t->m.arch = "tiny";
}

static void *start_host(tiny *t, const char *extra, const pt_host_v1 *host);
static void *start(tiny *t, const char *extra) { return start_host(t, extra, NULL); }

static void *start_host(tiny *t, const char *extra, const pt_host_v1 *host) {
    char text[1024];
    snprintf(text, sizeof text,
             "[plugin]\nbackend = host\nlog_level = error\n[memory]\ndevice_capacity = 4MiB\n%s",
             extra ? extra : "");
    void *ctx = hb_open(P, text, host);
    tiny_make(t);
    assert_int_equal(P->post_model_load(ctx, &t->m), PT_OK);
    return ctx;
}

static void test_table_header(void **state) {
    (void)state;
    assert_int_equal(P->abi_version, 1);
    assert_int_equal(P->struct_size, sizeof(pt_plugin_v1));
    assert_string_equal(P->name, "protrain");
    /* Every hook present (the OSFT kernels included), never a stub. */
    const void *const *first = (const void *const *)&P->init;
    const void *const *end = (const void *const *)&P->write_param + 1;   /* the last field */
    for (const void *const *h = first; h < end; h++) assert_non_null(*h);
}

/* A [testing] key makes init fail unless the environment has
 * PROTRAIN_TESTING=1, with a sentence naming the file:line, the key and the
 * variable; with the variable set the same file initialises (the control). */
static void test_init_testing_key(void **state) {
    (void)state;
    const char *was = getenv("PROTRAIN_TESTING");
    char keep[16];
    snprintf(keep, sizeof keep, "%s", was ? was : "");
    static const char ini[] = "[plugin]\nbackend = host\nlog_level = error\n[testing]\n"
                              "fail_alloc_at = 3\n";
    unsetenv("PROTRAIN_TESTING");
    void *ctx = (void *)1;
    assert_int_equal(hb_init(P, ini, NULL, &ctx), PT_ERR_CONFIG);
    assert_null(ctx);
    const char *e = P->last_error(NULL);
    if (!strstr(e, ":5: key 'fail_alloc_at' in [testing]") || !strstr(e, "PROTRAIN_TESTING=1"))
        fail_msg("'%s' does not name the line, the key and PROTRAIN_TESTING=1", e);
    setenv("PROTRAIN_TESTING", "1", 1);
    assert_int_equal(hb_init(P, ini, NULL, &ctx), PT_OK);
    assert_int_equal(P->finalize(ctx), PT_OK);
    if (was) setenv("PROTRAIN_TESTING", keep, 1);
    else unsetenv("PROTRAIN_TESTING");
}

/* init on a path that is not a regular file returns at once with a sentence
 * (reading /dev/zero would never end); alarm(): a regression ends the binary
 * instead of hanging make test. */
static void test_init_not_a_file(void **state) {
    (void)state;
    alarm(60);
    void *ctx = (void *)1;
    assert_int_equal(P->init("/dev/zero", NULL, &ctx), PT_ERR_IO);
    assert_null(ctx);
    const char *e = P->last_error(NULL);
    if (!strstr(e, "/dev/zero") || !strstr(e, "not a regular file"))
        fail_msg("'%s' does not name the path and why", e);
    alarm(0);
}

static void test_init_bad_config(void **state) {
    (void)state;
    write_ini("[memory]\ndevice_capacty = 4MiB\n");
    void *ctx = (void *)1;
    int rc = P->init(ini_path, NULL, &ctx);
    assert_int_equal(rc, PT_ERR_CONFIG);
    assert_null(ctx);
    const char *e = P->last_error(NULL);
    assert_non_null(strstr(e, ":2"));
    assert_non_null(strstr(e, "device_capacty"));
    assert_non_null(strstr(e, "device_capacity"));
}

static void test_out_of_order(void **state) {
    (void)state;
    tiny t;
    void *ctx = start(&t, NULL);
    /* pre_step before create_optimizer */
    assert_int_equal(P->pre_step(ctx, 0, 0, 1), PT_ERR_ORDER);
    assert_non_null(strstr(P->last_error(ctx), "pre_step"));
    assert_non_null(strstr(P->last_error(ctx), "create_optimizer"));
    /* post_model_load twice */
    assert_int_equal(P->post_model_load(ctx, &t.m), PT_ERR_ORDER);
    assert_int_equal(P->create_optimizer(ctx, NULL), PT_OK);
    assert_int_equal(P->pre_step(ctx, 0, 0, 1), PT_OK);
    /* backward hook during forward */
    assert_int_equal(P->block_pre_backward(ctx, 1), PT_ERR_ORDER);
    const char *e = P->last_error(ctx);
    assert_non_null(strstr(e, "block_pre_backward(1)"));
    assert_non_null(strstr(e, "expected block_pre_forward(0)"));
    /* skipping a block */
    assert_int_equal(P->block_pre_forward(ctx, 0), PT_OK);
    assert_int_equal(P->block_post_forward(ctx, 0), PT_OK);
    assert_int_equal(P->block_pre_forward(ctx, 0), PT_ERR_ORDER);
    assert_non_null(strstr(P->last_error(ctx), "expected block_pre_forward(1)"));
    assert_int_equal(P->optimizer_step(ctx, -1.0f), PT_ERR_ORDER);
    /* the failed calls changed nothing: the sequence continues */
    assert_int_equal(P->block_pre_forward(ctx, 1), PT_OK);
    assert_int_equal(P->block_post_forward(ctx, 1), PT_OK);
    assert_int_equal(P->block_pre_backward(ctx, 1), PT_OK);
    assert_int_equal(P->block_post_backward(ctx, 1), PT_OK);
    assert_int_equal(P->post_step(ctx, 0, 1.0f), PT_ERR_ORDER);
    assert_non_null(strstr(P->last_error(ctx), "post_step"));
    assert_int_equal(P->block_pre_backward(ctx, 0), PT_OK);
    assert_int_equal(P->block_post_backward(ctx, 0), PT_OK);
    assert_int_equal(P->optimizer_step(ctx, -1.0f), PT_OK);
    assert_int_equal(P->post_step(ctx, 0, 1.0f), PT_OK);
    /* out-of-range block */
    assert_int_equal(P->pre_step(ctx, 1, 0, 1), PT_OK);
    assert_int_equal(P->block_pre_forward(ctx, 7), PT_ERR_INVALID_ARG);
    assert_non_null(strstr(P->last_error(ctx), "out of range"));
    assert_int_equal(P->finalize(ctx), PT_OK);
    /* NULL ctx */
    assert_int_equal(P->pre_step(NULL, 0, 0, 1), PT_ERR_INVALID_ARG);
    assert_non_null(strstr(P->last_error(NULL), "NULL context"));
}

/* One step; inside each block's forward window the params must hold `expect`. */
static void run_step(void *ctx, tiny *t, int64_t step, int n_micro, float gval,
                     float expect[NP][64]) {
    for (int mi = 0; mi < n_micro; mi++) {
        assert_int_equal(P->pre_step(ctx, step, mi, n_micro), PT_OK);
        for (int b = 0; b < NB; b++) {
            assert_int_equal(P->block_pre_forward(ctx, b), PT_OK);
            for (int i = 0; expect && i < NP; i++)
                if (t->p[i].block == b)
                    assert_memory_equal(t->p[i].data, expect[i], (size_t)t->p[i].shape[0] * 4);
            assert_int_equal(P->block_post_forward(ctx, b), PT_OK);
        }
        for (int b = NB - 1; b >= 0; b--) {
            assert_int_equal(P->block_pre_backward(ctx, b), PT_OK);
            for (int i = 0; i < NP; i++) {
                if (t->p[i].block != b) continue;
                float *g = t->p[i].grad;
                for (int k = 0; k < t->p[i].shape[0]; k++) g[k] += gval * (float)(k + 1);
            }
            assert_int_equal(P->block_post_backward(ctx, b), PT_OK);
        }
        /* non-block grads: embedding and the tied head both accumulate */
        float *ge = t->p[0].grad, *gh = t->p[5].grad;
        assert_ptr_equal(ge, gh);
        for (int k = 0; k < 64; k++) {
            ge[k] += gval;
            gh[k] += 0.5f * gval;
        }
    }
}

/* Reference AdamW over the same element body, on host copies. */
static void ref_adam(float *p, const float *g, float *m, float *v, int n, int64_t t, float lr,
                     float wd, float gs) {
    float bc1, bc2r;
    pt_adamw_bias(0.9f, 0.999f, t, &bc1, &bc2r);
    pt_adamw_consts c = pt_adamw_make_consts(lr, 0.9f, 0.999f, 1e-8f, wd, bc1, bc2r, gs);
    for (int k = 0; k < n; k++) p[k] = pt_adamw_elem(&c, p[k], g[k], &m[k], &v[k]);
}

static void adam_case(float max_norm, int n_micro, const char *protrain, int use_set_lr) {
    tiny t;
    char extra[512];
    snprintf(extra, sizeof extra,
             "[optimizer]\nlr = 0.01\nweight_decay = 0.1\nmax_grad_norm = %g\n%s", max_norm,
             protrain ? protrain : "");
    void *ctx = start(&t, extra);
    assert_int_equal(P->create_optimizer(ctx, NULL), PT_OK);
    float ref[NP][64], m[NP][64], v[NP][64], g[NP][64];
    memcpy(ref, t.init, sizeof ref);
    memset(m, 0, sizeof m);
    memset(v, 0, sizeof v);
    for (int64_t step = 0; step < 3; step++) {
        float gval = 0.3f * (float)(step + 1);
        if (use_set_lr) assert_int_equal(P->set_lr(ctx, 0.01f), PT_OK);
        run_step(ctx, &t, step, n_micro, gval, ref);
        /* expected grads, accumulated over micro-batches */
        memset(g, 0, sizeof g);
        for (int mi = 0; mi < n_micro; mi++)
            for (int i = 1; i < 5; i++)
                for (int k = 0; k < t.p[i].shape[0]; k++) g[i][k] += gval * (float)(k + 1);
        for (int mi = 0; mi < n_micro; mi++)
            for (int k = 0; k < 64; k++) g[0][k] += gval;
        for (int mi = 0; mi < n_micro; mi++)
            for (int k = 0; k < 64; k++) g[0][k] += 0.5f * gval;
        float gs = 1.0f;
        double sq = 0;
        for (int i = 0; i < 5; i++)
            for (int k = 0; k < t.p[i].shape[0]; k++) sq += (double)g[i][k] * g[i][k];
        if (max_norm > 0 && sqrt(sq) > max_norm) gs = (float)(max_norm / (sqrt(sq) + 1e-6));
        assert_int_equal(P->optimizer_step(ctx, -1.0f), PT_OK);
        assert_int_equal(P->post_step(ctx, step, 1.0f), PT_OK);
        for (int i = 0; i < 5; i++)
            ref_adam(ref[i], g[i], m[i], v[i], (int)t.p[i].shape[0], step + 1, 0.01f, 0.1f, gs);
        pt_stats_v1 st = {.struct_size = sizeof st};
        assert_int_equal(P->get_stats(ctx, &st), PT_OK);
        assert_int_equal(st.steps, step + 1);
        if (max_norm > 0) assert_true(fabs(st.last_grad_norm - sqrt(sq)) <= 1e-5 * sqrt(sq));
    }
    for (int i = 0; i < 5; i++) {
        float out[64];
        uint64_t bytes = (uint64_t)t.p[i].shape[0] * 4;
        assert_int_equal(P->read_param(ctx, i, out, bytes), PT_OK);
        if (max_norm > 0) {
            /* the plugin sums per-param squared norms in float per param: scale may differ
             * in the last bit from the all-double reference */
            for (int k = 0; k < t.p[i].shape[0]; k++)
                assert_true(fabsf(out[k] - ref[i][k]) <= 1e-6f * fmaxf(1.0f, fabsf(ref[i][k])));
        } else {
            assert_memory_equal(out, ref[i], bytes); /* same element body, same order */
        }
        /* grads were zeroed after the step */
        if (t.p[i].grad)
            for (int k = 0; k < t.p[i].shape[0]; k++) assert_true(((float *)t.p[i].grad)[k] == 0.0f);
    }
    assert_int_equal(P->finalize(ctx), PT_OK);
}

static void test_adam_matches_reference(void **s) {
    (void)s;
    adam_case(0.0f, 1, NULL, 0);
}
static void test_adam_accumulation(void **s) {
    (void)s;
    adam_case(0.0f, 3, NULL, 0);
}
static void test_adam_clipping(void **s) {
    (void)s;
    adam_case(1.0f, 2, NULL, 0);
}

/* Offloaded: every block chunk streamed through one buffer, CPU Adam. */
#define STREAMED "[protrain]\nn_persist = 0\nn_buffer = 1\nchunk_size = 4KiB\n"
static void test_offload_deferred(void **s) {
    (void)s;
    adam_case(0.0f, 1, STREAMED, 0);
}
static void test_offload_overlapped(void **s) {
    (void)s;
    adam_case(0.0f, 1, STREAMED, 1);
}
static void test_offload_accumulation(void **s) {
    (void)s;
    adam_case(0.0f, 3, STREAMED, 1);
}
static void test_offload_clipping(void **s) {
    (void)s;
    adam_case(1.0f, 2, STREAMED, 1);
}

/* A host that keeps an offloaded param's pointer past its block reads poison. */
static void test_offload_poison(void **state) {
    (void)state;
    tiny t;
    void *ctx = start(&t, STREAMED);
    assert_int_equal(P->create_optimizer(ctx, NULL), PT_OK);
    assert_int_equal(P->pre_step(ctx, 0, 0, 1), PT_OK);
    assert_int_equal(P->block_pre_forward(ctx, 0), PT_OK);
    float *stale = t.p[1].data;
    assert_non_null(stale);
    assert_false(isnan(stale[0]));
    assert_int_equal(P->block_post_forward(ctx, 0), PT_OK);
    assert_null(t.p[1].data); /* cleared at release */
    assert_non_null(t.p[0].data); /* non-block params stay resident */
    assert_int_equal(P->block_pre_forward(ctx, 1), PT_OK);
    assert_int_equal(P->block_post_forward(ctx, 1), PT_OK);
    for (int b = NB - 1; b >= 0; b--) {
        assert_int_equal(P->block_pre_backward(ctx, b), PT_OK);
        assert_int_equal(P->block_post_backward(ctx, b), PT_OK);
    }
    assert_int_equal(P->optimizer_step(ctx, -1.0f), PT_OK);
    for (int k = 0; k < 48; k++) assert_true(isnan(stale[k]));
    pt_stats_v1 st = {.struct_size = sizeof st};
    assert_int_equal(P->get_stats(ctx, &st), PT_OK);
    assert_int_equal(st.n_persist, 1); /* only the mandatory chunk(s) */
    assert_int_equal(st.mode, 1);
    assert_true(st.h2d_bytes > 0 && st.d2h_bytes > 0);
    /* ABI 1.7: the pinned high-water mark covers what is pinned now; no disk tier */
    assert_int_equal(st.struct_size, sizeof st);
    assert_true(st.pinned_current > 0 && st.pinned_peak >= st.pinned_current);
    assert_int_equal(st.tier_io_us, 0);
    assert_int_equal(st.tier_wait_us, 0);
    /* a 1.6 host's struct ends before pinned_peak: the plugin writes no further */
    union {
        pt_stats_v1 st;
        unsigned char b[sizeof(pt_stats_v1)];
    } old;
    memset(&old, 0xab, sizeof old);
    old.st.struct_size = offsetof(pt_stats_v1, pinned_peak);
    assert_int_equal(P->get_stats(ctx, &old.st), PT_OK);
    assert_int_equal(old.st.struct_size, offsetof(pt_stats_v1, pinned_peak));
    assert_int_equal(old.st.pinned_current, st.pinned_current);
    for (size_t i = offsetof(pt_stats_v1, pinned_peak); i < sizeof old; i++)
        assert_int_equal(old.b[i], 0xab);
    assert_int_equal(P->post_step(ctx, 0, 1.0f), PT_OK);
    assert_int_equal(P->finalize(ctx), PT_OK);
}

/* set_lr then a different lr at optimizer_step after the overlap used it. */
static void test_set_lr_mismatch(void **state) {
    (void)state;
    tiny t;
    void *ctx = start(&t, STREAMED);
    assert_int_equal(P->create_optimizer(ctx, NULL), PT_OK);
    assert_int_equal(P->set_lr(ctx, 0.01f), PT_OK);
    run_step(ctx, &t, 0, 1, 1.0f, NULL);
    assert_int_equal(P->optimizer_step(ctx, 0.02f), PT_ERR_INVALID_ARG);
    assert_non_null(strstr(P->last_error(ctx), "set_lr"));
    assert_int_equal(P->optimizer_step(ctx, 0.01f), PT_OK);
    assert_int_equal(P->finalize(ctx), PT_OK);
}

static void test_memory_services(void **state) {
    (void)state;
    tiny t;
    void *ctx = start(&t, NULL);
    void *p = NULL;
    assert_int_equal(P->dev_alloc(ctx, 1 << 20, "scratch", &p), PT_OK);
    assert_non_null(p);
    void *q = NULL;
    assert_int_equal(P->dev_alloc(ctx, 64u << 20, "act", &q), PT_ERR_OOM);
    assert_null(q);
    assert_non_null(strstr(P->last_error(ctx), "67108864"));
    pt_stats_v1 st = {.struct_size = sizeof st};
    assert_int_equal(P->get_stats(ctx, &st), PT_OK);
    assert_int_equal(st.dev_capacity, 4u << 20);
    assert_true(st.dev_current >= (1u << 20));
    int x = 5;
    assert_int_equal(P->dev_free(ctx, &x), PT_ERR_INVALID_ARG);
    assert_int_equal(P->dev_free(ctx, p), PT_OK);
    /* arenas only inside the block's forward window */
    assert_int_equal(P->create_optimizer(ctx, NULL), PT_OK);
    void *a = NULL;
    assert_int_equal(P->activation_arena(ctx, 0, 4096, &a), PT_ERR_ORDER);
    assert_int_equal(P->pre_step(ctx, 0, -1, 0), PT_OK); /* evaluation pass */
    assert_int_equal(P->block_pre_forward(ctx, 0), PT_OK);
    assert_int_equal(P->activation_arena(ctx, 0, 4096, &a), PT_OK);
    void *a2 = NULL;
    assert_int_equal(P->activation_arena_get(ctx, 0, &a2), PT_OK);
    assert_ptr_equal(a, a2);
    assert_int_equal(P->dev_free(ctx, a), PT_ERR_INVALID_ARG);
    assert_int_equal(P->block_post_forward(ctx, 0), PT_OK);
    assert_int_equal(P->block_pre_forward(ctx, 1), PT_OK);
    assert_int_equal(P->block_post_forward(ctx, 1), PT_OK);
    /* the evaluation pass ended: a new step may start */
    assert_int_equal(P->pre_step(ctx, 0, 0, 1), PT_OK);
    assert_int_equal(P->finalize(ctx), PT_OK);
}

static void test_bad_model(void **state) {
    (void)state;
    write_ini("[plugin]\nbackend = host\nlog_level = error\n");
    void *ctx = NULL;
    assert_int_equal(P->init(ini_path, NULL, &ctx), PT_OK);
    tiny t;
    tiny_make(&t);
    t.p[3].block = 9;
    assert_int_equal(P->post_model_load(ctx, &t.m), PT_ERR_INVALID_ARG);
    assert_non_null(strstr(P->last_error(ctx), "b1.w"));
    t.p[3].block = 1;
    /* a model bigger than the device: OOM names the bytes, and loses nothing */
    assert_int_equal(P->post_model_load(ctx, &t.m), PT_OK);
    assert_int_equal(P->finalize(ctx), PT_OK);
}

/* ---- state save / restore ---- */
static void read_all(void *ctx, tiny *t, float out[NP][64]) {
    memset(out, 0, sizeof(float) * NP * 64);
    for (int i = 0; i < NP; i++)
        assert_int_equal(P->read_param(ctx, i, out[i], (uint64_t)t->p[i].shape[0] * 4), PT_OK);
}

/* ---- struct_size of the structs the host passes in ---- */

/* Too small: refused with both sizes named, and nothing changed (the same ctx
 * goes on with a correct struct). */
static void test_struct_size_too_small(void **state) {
    (void)state;
    write_ini("[plugin]\nbackend = host\nlog_level = error\n[memory]\ndevice_capacity = 4MiB\n");
    char want[64];
    /* pt_host_v1 at init (no ctx yet: the sentence is in last_error(NULL)) */
    pt_host_v1 host;
    memset(&host, 0, sizeof host);
    host.abi_version = 1;
    host.struct_size = 16;
    host.world_size = 1;
    void *ctx = (void *)1;
    assert_int_equal(P->init(ini_path, &host, &ctx), PT_ERR_INVALID_ARG);
    assert_null(ctx);
    assert_non_null(strstr(P->last_error(NULL), "pt_host_v1"));
    assert_non_null(strstr(P->last_error(NULL), "struct_size 16"));
    snprintf(want, sizeof want, "need at least %zu", offsetof(pt_host_v1, fingerprint));
    assert_non_null(strstr(P->last_error(NULL), want));

    assert_int_equal(P->init(ini_path, NULL, &ctx), PT_OK);
    tiny t;
    tiny_make(&t);
    /* pt_model_v1: one byte short of its v1 fields, then 0 (a host that forgot it) */
    const size_t model_need = offsetof(pt_model_v1, reserved);
    const uint32_t model_sizes[2] = {(uint32_t)model_need - 1, 0};
    for (int i = 0; i < 2; i++) {
        t.m.struct_size = model_sizes[i];
        assert_int_equal(P->post_model_load(ctx, &t.m), PT_ERR_INVALID_ARG);
        const char *e = P->last_error(ctx);
        assert_non_null(strstr(e, "post_model_load"));
        assert_non_null(strstr(e, "pt_model_v1"));
        snprintf(want, sizeof want, "struct_size is %u bytes", (unsigned)model_sizes[i]);
        assert_non_null(strstr(e, want));
        snprintf(want, sizeof want, "need at least %zu", model_need);
        assert_non_null(strstr(e, want));
        assert_null(t.p[1].data);   /* the runtime never saw the model */
        /* still expecting post_model_load */
        assert_int_equal(P->create_optimizer(ctx, NULL), PT_ERR_ORDER);
        assert_non_null(strstr(P->last_error(ctx), "expects post_model_load"));
    }
    t.m.struct_size = sizeof t.m;
    assert_int_equal(P->post_model_load(ctx, &t.m), PT_OK);

    /* pt_optim_v1 */
    const size_t optim_need = offsetof(pt_optim_v1, reserved);
    pt_optim_v1 od;
    memset(&od, 0, sizeof od);
    od.type = PT_OPTIM_ADAMW;
    od.lr = od.beta1 = od.beta2 = od.eps = od.weight_decay = od.max_grad_norm = NAN;
    const uint32_t optim_sizes[2] = {(uint32_t)optim_need - 1, 0};
    for (int i = 0; i < 2; i++) {
        od.struct_size = optim_sizes[i];
        assert_int_equal(P->create_optimizer(ctx, &od), PT_ERR_INVALID_ARG);
        const char *e = P->last_error(ctx);
        assert_non_null(strstr(e, "create_optimizer"));
        assert_non_null(strstr(e, "pt_optim_v1"));
        snprintf(want, sizeof want, "struct_size is %u bytes", (unsigned)optim_sizes[i]);
        assert_non_null(strstr(e, want));
        snprintf(want, sizeof want, "need at least %zu", optim_need);
        assert_non_null(strstr(e, want));
        /* still expecting create_optimizer */
        assert_int_equal(P->pre_step(ctx, 0, 0, 1), PT_ERR_ORDER);
        assert_non_null(strstr(P->last_error(ctx), "create_optimizer"));
    }
    od.struct_size = sizeof od;
    assert_int_equal(P->create_optimizer(ctx, &od), PT_OK);
    run_step(ctx, &t, 0, 1, 0.5f, t.init);
    assert_int_equal(P->optimizer_step(ctx, -1.0f), PT_OK);
    assert_int_equal(P->post_step(ctx, 0, 1.0f), PT_OK);
    assert_int_equal(P->finalize(ctx), PT_OK);
}

/* A newer host's structs: the v1 struct first, then fields this plugin does not
 * know, struct_size covering all of it. */
typedef struct model_v1_plus {
    pt_model_v1 v1;
    uint64_t later[6];
} model_v1_plus;
typedef struct optim_v1_plus {
    pt_optim_v1 v1;
    float later_lr;
    int32_t later[9];
} optim_v1_plus;

/* Three steps with the given descriptors; params read back into out. */
static void train_with(tiny *t, pt_model_v1 *m, const pt_optim_v1 *od, float out[NP][64]) {
    /* the INI's lr differs from the descriptors': a run that ignored them shows */
    write_ini("[plugin]\nbackend = host\nlog_level = error\n[memory]\ndevice_capacity = 4MiB\n"
              "[optimizer]\nlr = 0.5\nweight_decay = 0\n");
    void *ctx = NULL;
    assert_int_equal(P->init(ini_path, NULL, &ctx), PT_OK);
    assert_int_equal(P->post_model_load(ctx, m), PT_OK);
    assert_int_equal(P->create_optimizer(ctx, od), PT_OK);
    for (int s = 0; s < 3; s++) {
        run_step(ctx, t, s, 1, 0.25f * (float)(s + 1), NULL);
        assert_int_equal(P->optimizer_step(ctx, -1.0f), PT_OK);
        assert_int_equal(P->post_step(ctx, s, 1.0f), PT_OK);
    }
    read_all(ctx, t, out);
    pt_stats_v1 st = {.struct_size = sizeof st};
    assert_int_equal(P->get_stats(ctx, &st), PT_OK);
    assert_int_equal(st.steps, 3);
    assert_int_equal(P->finalize(ctx), PT_OK);
}

/* ABI 1.5 took pt_host_v1.reserved[0] for fingerprint: a 1.4 host's struct
 * (every field before it) is still enough, and the plugin never reads the slot
 * past such a struct_size (here it holds junk that would crash a read). With
 * a struct_size that covers it, a fingerprint longer than
 * PT_HOST_FINGERPRINT_MAX is refused with a sentence. */
static void test_host_fingerprint_abi(void **state) {
    (void)state;
    write_ini("[plugin]\nbackend = host\nlog_level = error\n[memory]\ndevice_capacity = 4MiB\n");
    pt_host_v1 host;
    memset(&host, 0, sizeof host);
    host.abi_version = 1;
    host.world_size = 1;
    host.struct_size = (uint32_t)offsetof(pt_host_v1, fingerprint);
    host.fingerprint = (const char *)(uintptr_t)1;
    void *ctx = NULL;
    assert_int_equal(P->init(ini_path, &host, &ctx), PT_OK);
    assert_int_equal(P->finalize(ctx), PT_OK);
    char *fp = malloc(PT_HOST_FINGERPRINT_MAX + 2);
    assert_non_null(fp);
    memset(fp, 'a', PT_HOST_FINGERPRINT_MAX + 1);
    fp[PT_HOST_FINGERPRINT_MAX + 1] = '\0';
    host.struct_size = sizeof host;
    host.fingerprint = fp;
    ctx = (void *)1;
    assert_int_equal(P->init(ini_path, &host, &ctx), PT_ERR_INVALID_ARG);
    assert_null(ctx);
    assert_non_null(strstr(P->last_error(NULL), "pt_host_v1.fingerprint is longer than 4096"));
    fp[PT_HOST_FINGERPRINT_MAX] = '\0';   /* exactly the limit: accepted */
    assert_int_equal(P->init(ini_path, &host, &ctx), PT_OK);
    assert_int_equal(P->finalize(ctx), PT_OK);
    free(fp);
}

static void test_struct_size_larger(void **state) {
    (void)state;
    pt_optim_v1 od;
    memset(&od, 0, sizeof od);
    od.struct_size = sizeof od;
    od.type = PT_OPTIM_ADAMW;
    od.lr = 0.01f;
    od.beta1 = 0.9f;
    od.beta2 = 0.999f;
    od.eps = 1e-8f;
    od.weight_decay = 0.1f;
    od.max_grad_norm = 0.0f;

    /* the plain v1 structs */
    tiny ta;
    tiny_make(&ta);
    float plain[NP][64];
    train_with(&ta, &ta.m, &od, plain);

    /* the same content inside bigger structs, their tails full of junk */
    tiny tb;
    tiny_make(&tb);
    model_v1_plus mp;
    memset(&mp, 0xA5, sizeof mp);
    mp.v1 = tb.m;
    mp.v1.struct_size = sizeof mp;
    optim_v1_plus op;
    memset(&op, 0xA5, sizeof op);
    op.v1 = od;
    op.v1.struct_size = sizeof op;
    op.later_lr = 7.0f;
    float plus[NP][64];
    train_with(&tb, &mp.v1, &op.v1, plus);
    assert_memory_equal(plain, plus, sizeof plain);
    for (int k = 0; k < 6; k++) assert_true(mp.later[k] == 0xA5A5A5A5A5A5A5A5ull); /* untouched */

    /* and the descriptors were used: the INI's lr alone gives other values */
    tiny tc;
    tiny_make(&tc);
    float ini_only[NP][64];
    train_with(&tc, &tc.m, NULL, ini_only);
    assert_true(memcmp(plain, ini_only, sizeof plain) != 0);
}

/* Saved under one plan, restored under another: the continued runs agree bit for bit. */
static void test_state_roundtrip(void **state) {
    (void)state;
    char dir[64];
    snprintf(dir, sizeof dir, "/tmp/pt_state_%d", (int)getpid());
    mkdir(dir, 0755);
    const char *opt = "[optimizer]\nlr = 0.01\nweight_decay = 0.1\n";
    char a_ini[256], b_ini[256];
    snprintf(a_ini, sizeof a_ini, "%s%s", opt, STREAMED);
    snprintf(b_ini, sizeof b_ini, "%s[protrain]\nforce_all_persistent = true\n", opt);
    tiny ta, tb;
    void *a = start(&ta, a_ini);
    assert_int_equal(P->create_optimizer(a, NULL), PT_OK);
    for (int s = 0; s < 3; s++) {
        run_step(a, &ta, s, 1, 0.2f * (float)(s + 1), NULL);
        assert_int_equal(P->optimizer_step(a, -1.0f), PT_OK);
        assert_int_equal(P->post_step(a, s, 1.0f), PT_OK);
    }
    /* not mid-step */
    assert_int_equal(P->pre_step(a, 3, 0, 1), PT_OK);
    assert_int_equal(P->save_state(a, dir), PT_ERR_ORDER);
    assert_non_null(strstr(P->last_error(a), "between steps"));
    for (int b = 0; b < NB; b++) {
        assert_int_equal(P->block_pre_forward(a, b), PT_OK);
        assert_int_equal(P->block_post_forward(a, b), PT_OK);
    }
    for (int b = NB - 1; b >= 0; b--) {
        assert_int_equal(P->block_pre_backward(a, b), PT_OK);
        assert_int_equal(P->block_post_backward(a, b), PT_OK);
    }
    assert_int_equal(P->optimizer_step(a, -1.0f), PT_OK);
    assert_int_equal(P->post_step(a, 3, 1.0f), PT_OK);
    assert_int_equal(P->save_state(a, dir), PT_OK);

    void *b = start(&tb, b_ini);
    assert_int_equal(P->create_optimizer(b, NULL), PT_OK);
    assert_int_equal(P->load_state(b, dir), PT_OK);
    float va[NP][64], vb[NP][64];
    read_all(a, &ta, va);
    read_all(b, &tb, vb);
    assert_memory_equal(va, vb, sizeof va);
    for (int s = 4; s < 6; s++) {
        run_step(a, &ta, s, 1, 0.3f, NULL);
        run_step(b, &tb, s, 1, 0.3f, NULL);
        assert_int_equal(P->optimizer_step(a, -1.0f), PT_OK);
        assert_int_equal(P->optimizer_step(b, -1.0f), PT_OK);
        assert_int_equal(P->post_step(a, s, 1.0f), PT_OK);
        assert_int_equal(P->post_step(b, s, 1.0f), PT_OK);
    }
    read_all(a, &ta, va);
    read_all(b, &tb, vb);
    assert_memory_equal(va, vb, sizeof va);  /* m, v and step count came across too */
    pt_stats_v1 st = {.struct_size = sizeof st};
    assert_int_equal(P->get_stats(b, &st), PT_OK);
    assert_int_equal(st.steps, 6);
    assert_int_equal(P->finalize(b), PT_OK);

    /* a different model: refused, nothing changed */
    tiny tc;
    void *c = NULL;
    tiny_make(&tc);
    char other[256];
    snprintf(other, sizeof other, "[plugin]\nbackend = host\nlog_level = error\n"
                                  "[memory]\ndevice_capacity = 4MiB\n");
    write_ini(other);
    assert_int_equal(P->init(ini_path, NULL, &c), PT_OK);
    tc.p[3].shape[0] = 40;
    assert_int_equal(P->post_model_load(c, &tc.m), PT_OK);
    assert_int_equal(P->create_optimizer(c, NULL), PT_OK);
    float before[NP][64], after[NP][64];
    memset(before, 0, sizeof before);
    memset(after, 0, sizeof after);
    read_all(c, &tc, before);
    assert_int_equal(P->load_state(c, dir), PT_ERR_FORMAT);
    assert_non_null(strstr(P->last_error(c), "b1.w"));
    read_all(c, &tc, after);
    assert_memory_equal(before, after, sizeof before);
    /* truncated and missing files */
    char path[128], cmd[256];
    snprintf(path, sizeof path, "%s/protrain_state_rank0.bin", dir);
    snprintf(cmd, sizeof cmd, "truncate -s 300 %s", path);
    assert_int_equal(system(cmd), 0);
    assert_int_equal(P->load_state(a, dir), PT_ERR_FORMAT);
    assert_non_null(strstr(P->last_error(a), "truncated"));
    unlink(path);
    assert_int_equal(P->load_state(a, dir), PT_ERR_IO);
    assert_non_null(strstr(P->last_error(a), path));
    rmdir(dir);
    assert_int_equal(P->finalize(c), PT_OK);
    assert_int_equal(P->finalize(a), PT_OK);
}

/* ---- activation modes ---- */
typedef struct act_host {
    void *ctx;
    int recomputes[NB];
    float *stale[NB];
} act_host;

static const size_t ARENA_FLOATS = 1024;

static void fill(float *a, int b) {
    for (size_t k = 0; k < ARENA_FLOATS; k++) a[k] = (float)(b * 10000 + (int)k);
}

static int32_t recompute_cb(void *user, int32_t b) {
    act_host *h = user;
    void *a = NULL;
    if (P->activation_arena_get(h->ctx, b, &a)) return 1;
    fill(a, b);
    h->recomputes[b]++;
    return 0;
}

/* With the given modes, the arena a block reads in backward holds what its forward
 * wrote; CKPT recomputes once per backward; stale CKPT pointers read NaN. */
static void act_case(const char *modes_ini, int expect_ckpt, int expect_swap) {
    act_host h;
    memset(&h, 0, sizeof h);
    pt_host_v1 host;
    memset(&host, 0, sizeof host);
    host.abi_version = 1;
    host.struct_size = sizeof host;
    host.world_size = 1;
    host.user = &h;
    host.recompute_block = recompute_cb;
    tiny t;
    void *ctx = start_host(&t, modes_ini, &host);
    h.ctx = ctx;
    assert_int_equal(P->create_optimizer(ctx, NULL), PT_OK);
    for (int step = 0; step < 2; step++) {
        assert_int_equal(P->pre_step(ctx, step, 0, 1), PT_OK);
        for (int b = 0; b < NB; b++) {
            assert_int_equal(P->block_pre_forward(ctx, b), PT_OK);
            void *a = NULL;
            assert_int_equal(P->activation_arena(ctx, b, ARENA_FLOATS * 4, &a), PT_OK);
            fill(a, b);
            h.stale[b] = a;
            assert_int_equal(P->block_post_forward(ctx, b), PT_OK);
        }
        pt_stats_v1 st = {.struct_size = sizeof st};
        assert_int_equal(P->get_stats(ctx, &st), PT_OK);
        int n_ckpt_stale = 0;
        for (int b = 0; b < NB; b++)
            if (isnan(h.stale[b][0])) n_ckpt_stale++;
        /* CKPT arenas freed (poisoned) after forward; SWAP ones after their copy */
        assert_true(n_ckpt_stale >= expect_ckpt);
        for (int b = NB - 1; b >= 0; b--) {
            assert_int_equal(P->block_pre_backward(ctx, b), PT_OK);
            void *a = NULL;
            assert_int_equal(P->activation_arena_get(ctx, b, &a), PT_OK);
            float want[1024];
            fill(want, b);
            assert_memory_equal(a, want, ARENA_FLOATS * 4);
            assert_int_equal(P->block_post_backward(ctx, b), PT_OK);
        }
        assert_int_equal(P->optimizer_step(ctx, -1.0f), PT_OK);
        assert_int_equal(P->post_step(ctx, step, 1.0f), PT_OK);
    }
    int total = 0;
    for (int b = 0; b < NB; b++) total += h.recomputes[b];
    assert_int_equal(total, 2 * expect_ckpt);
    (void)expect_swap;
    assert_int_equal(P->finalize(ctx), PT_OK);
}

static void test_act_none(void **s) {
    (void)s;
    act_case("[protrain]\nn_swap = 0\nn_checkpoint = 0\n", 0, 0);
}
static void test_act_ckpt(void **s) {
    (void)s;
    act_case("[protrain]\nn_checkpoint = 2\n", 2, 0);
}
static void test_act_swap(void **s) {
    (void)s;
    act_case("[protrain]\nn_swap = 1\nn_checkpoint = 1\n", 1, 1);
}
static void test_act_swap_streamed(void **s) {
    (void)s;
    act_case("[protrain]\nn_swap = 2\nn_persist = 0\nn_buffer = 1\nchunk_size = 4KiB\n", 0, 2);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_table_header),
        cmocka_unit_test(test_init_bad_config),
        cmocka_unit_test(test_init_testing_key),
        cmocka_unit_test(test_init_not_a_file),
        cmocka_unit_test(test_out_of_order),
        cmocka_unit_test(test_adam_matches_reference),
        cmocka_unit_test(test_adam_accumulation),
        cmocka_unit_test(test_adam_clipping),
        cmocka_unit_test(test_offload_deferred),
        cmocka_unit_test(test_offload_overlapped),
        cmocka_unit_test(test_offload_accumulation),
        cmocka_unit_test(test_offload_clipping),
        cmocka_unit_test(test_offload_poison),
        cmocka_unit_test(test_set_lr_mismatch),
        cmocka_unit_test(test_memory_services),
        cmocka_unit_test(test_state_roundtrip),
        cmocka_unit_test(test_act_none),
        cmocka_unit_test(test_act_ckpt),
        cmocka_unit_test(test_act_swap),
        cmocka_unit_test(test_act_swap_streamed),
        cmocka_unit_test(test_bad_model),
        cmocka_unit_test(test_struct_size_too_small),
        cmocka_unit_test(test_struct_size_larger),
        cmocka_unit_test(test_host_fingerprint_abi),
    };
    int rc = cmocka_run_group_tests_name("lifecycle", tests, NULL, NULL);
    unlink(ini_path);
    return rc;
}
