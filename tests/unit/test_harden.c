/*
 * test_harden.c — host mistakes the plugin must answer with an error code and
 * a sentence naming the cause, never a crash, and without changing anything:
 * calls after finalize, bad host identity fields, non-finite hyper-parameters,
 * hooks out of order before post_model_load, a host address given as device
 * memory, impossible allocations, a host without recompute_block.
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
#include "host_builder.h"
#include "tiny_model.h"

static const pt_plugin_v1 *P = &protrain_plugin_v1;
static void *start(tiny *t, const char *extra) {
    char text[1024];
    snprintf(text, sizeof text,
             "[plugin]\nbackend = host\nlog_level = error\n[memory]\ndevice_capacity = 4MiB\n%s",
             extra ? extra : "");
    void *ctx = hb_open(P, text, NULL);
    tiny_make(t);
    assert_int_equal(P->post_model_load(ctx, &t->m), PT_OK);
    return ctx;
}

static void one_pass(void *ctx, int64_t step) {
    assert_int_equal(P->pre_step(ctx, step, 0, 1), PT_OK);
    for (int b = 0; b < TINY_NB; b++) {
        assert_int_equal(P->block_pre_forward(ctx, b), PT_OK);
        assert_int_equal(P->block_post_forward(ctx, b), PT_OK);
    }
    for (int b = TINY_NB - 1; b >= 0; b--) {
        assert_int_equal(P->block_pre_backward(ctx, b), PT_OK);
        assert_int_equal(P->block_post_backward(ctx, b), PT_OK);
    }
}

static int has(const char *hay, const char *needle) { return strstr(hay, needle) != NULL; }

/* finalize twice, and every hook after finalize: PT_ERR_ORDER, never a crash
 * (the context is freed by the first finalize: a second must not free or use it). */
static void test_after_finalize(void **state) {
    (void)state;
    tiny t;
    void *ctx = start(&t, NULL);
    assert_int_equal(P->create_optimizer(ctx, NULL), PT_OK);
    assert_int_equal(P->finalize(ctx), PT_OK);
    assert_int_equal(P->finalize(ctx), PT_ERR_ORDER);
    assert_true(has(P->last_error(ctx), "after finalize"));
    assert_true(has(P->last_error(ctx), "finalize"));
    assert_int_equal(P->pre_step(ctx, 0, 0, 1), PT_ERR_ORDER);
    assert_true(has(P->last_error(ctx), "pre_step called after finalize"));
    void *p = NULL;
    assert_int_equal(P->dev_alloc(ctx, 256, "act", &p), PT_ERR_ORDER);
    assert_null(p);
    assert_int_equal(P->block_pre_forward(ctx, 0), PT_ERR_ORDER);
    assert_int_equal(P->set_lr(ctx, 0.1f), PT_ERR_ORDER);
    pt_stats_v1 st = {.struct_size = sizeof st};
    assert_int_equal(P->get_stats(ctx, &st), PT_ERR_ORDER);
    assert_int_equal(P->save_state(ctx, "/tmp"), PT_ERR_ORDER);
    /* a new context after that works normally */
    tiny t2;
    void *c2 = start(&t2, NULL);
    assert_int_equal(P->create_optimizer(c2, NULL), PT_OK);
    assert_int_equal(P->finalize(c2), PT_OK);
}

/* init refuses identity fields that mean nothing, naming the field and value. */
static void test_init_bad_host(void **state) {
    (void)state;
    static const char ini[] = "[plugin]\nbackend = host\nlog_level = error\n";
    struct {
        int field;
        int32_t value;
        const char *name;
    } cases[] = {
        {0, 0, "world_size is 0"}, {1, -7, "rank is -7"}, {2, 99, "device_kind is 99"}, {1, 1, "rank is 1"}, {3, -1, "device_index is -1"}, {4, -2, "local_rank is -2"}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        pt_host_v1 h = hb_host(NULL);
        switch (cases[i].field) {
        case 0: h.world_size = cases[i].value; break;
        case 1: h.rank = cases[i].value; break;
        case 2: h.device_kind = cases[i].value; break;
        case 3: h.device_index = cases[i].value; break;
        default: h.local_rank = cases[i].value; break;
        }
        void *ctx = (void *)1;
        assert_int_equal(hb_init(P, ini, &h, &ctx), PT_ERR_INVALID_ARG);
        assert_null(ctx);
        if (!has(P->last_error(NULL), cases[i].name))
            fail_msg("case %zu: '%s' does not name '%s'", i, P->last_error(NULL), cases[i].name);
    }
}

/* A block hook before post_model_load is an order mistake, whatever the block. */
static void test_block_hook_before_load(void **state) {
    (void)state;
    void *ctx = NULL;
    assert_int_equal(hb_init(P, "[plugin]\nbackend = host\nlog_level = error\n", NULL, &ctx), PT_OK);
    assert_int_equal(P->block_pre_forward(ctx, 0), PT_ERR_ORDER);
    assert_true(has(P->last_error(ctx), "post_model_load"));
    assert_int_equal(P->block_post_backward(ctx, 3), PT_ERR_ORDER);
    assert_int_equal(P->finalize(ctx), PT_OK);
}

/* Infinite hyper-parameters: refused with the field and value, nothing changed. */
static void test_nonfinite_hparams(void **state) {
    (void)state;
    tiny t;
    void *ctx = start(&t, "[optimizer]\nlr = 0.01\n");
    const char *fields[] = {"lr", "beta1", "beta2", "eps", "weight_decay", "max_grad_norm"};
    for (int f = 0; f < 6; f++) {
        pt_optim_v1 d = {.struct_size = sizeof d, .type = PT_OPTIM_FROM_CONFIG, .lr = NAN, .beta1 = NAN, .beta2 = NAN, .eps = NAN, .weight_decay = NAN, .max_grad_norm = NAN};
        float *slot[] = {&d.lr, &d.beta1, &d.beta2, &d.eps, &d.weight_decay, &d.max_grad_norm};
        *slot[f] = (f & 1) ? -INFINITY : INFINITY;
        assert_int_equal(P->create_optimizer(ctx, &d), PT_ERR_INVALID_ARG);
        char want[64];
        snprintf(want, sizeof want, "%s is %s", fields[f], (f & 1) ? "-inf" : "inf");
        if (!has(P->last_error(ctx), want))
            fail_msg("'%s' does not name '%s'", P->last_error(ctx), want);
    }
    assert_int_equal(P->create_optimizer(ctx, NULL), PT_OK);
    assert_int_equal(P->set_lr(ctx, INFINITY), PT_ERR_INVALID_ARG);
    assert_true(has(P->last_error(ctx), "inf"));
    one_pass(ctx, 0);
    float before[TINY_NEL], after[TINY_NEL];
    assert_int_equal(P->read_param(ctx, 1, before, sizeof before), PT_OK);
    assert_int_equal(P->optimizer_step(ctx, INFINITY), PT_ERR_INVALID_ARG);
    assert_true(has(P->last_error(ctx), "lr is inf"));
    assert_int_equal(P->optimizer_step(ctx, -INFINITY), PT_ERR_INVALID_ARG);
    assert_int_equal(P->read_param(ctx, 1, after, sizeof after), PT_OK);
    assert_memory_equal(before, after, sizeof before);
    /* nothing changed: the step goes on */
    assert_int_equal(P->optimizer_step(ctx, -1.0f), PT_OK);
    assert_int_equal(P->post_step(ctx, 0, 1.0f), PT_OK);
    assert_int_equal(P->read_param(ctx, 1, after, sizeof after), PT_OK);
    for (int k = 0; k < TINY_NEL; k++) assert_true(isfinite(after[k]));
    assert_int_equal(P->finalize(ctx), PT_OK);
}

/* memcpy with a host address on the device side: refused on the host backend
 * (on a GPU the same call would fault). */
static void test_memcpy_host_pointer(void **state) {
    (void)state;
    tiny t;
    void *ctx = start(&t, NULL);
    float host_a[16] = {1}, host_b[16];
    void *dev = NULL;
    assert_int_equal(P->dev_alloc(ctx, sizeof host_a, "input", &dev), PT_OK);
    assert_int_equal(P->memcpy(ctx, host_b, host_a, sizeof host_a, PT_COPY_H2D), PT_ERR_INVALID_ARG);
    assert_true(has(P->last_error(ctx), "destination"));
    assert_true(has(P->last_error(ctx), "not device memory"));
    assert_int_equal(P->memcpy(ctx, host_b, host_a, sizeof host_a, PT_COPY_D2H), PT_ERR_INVALID_ARG);
    assert_true(has(P->last_error(ctx), "source"));
    assert_int_equal(P->memcpy(ctx, dev, host_a, sizeof host_a, PT_COPY_D2D), PT_ERR_INVALID_ARG);
    /* a copy running past the end of the device is refused too */
    assert_int_equal(P->memcpy(ctx, dev, host_a, (uint64_t)1 << 40, PT_COPY_H2D),
                     PT_ERR_INVALID_ARG);
    /* the real ones work */
    assert_int_equal(P->memcpy(ctx, dev, host_a, sizeof host_a, PT_COPY_H2D), PT_OK);
    assert_int_equal(P->memcpy(ctx, host_b, dev, sizeof host_a, PT_COPY_D2H), PT_OK);
    assert_memory_equal(host_a, host_b, sizeof host_a);
    assert_int_equal(P->dev_free(ctx, dev), PT_OK);
    assert_int_equal(P->finalize(ctx), PT_OK);
}

/* A copy that starts inside a dev_alloc block and runs past its end is refused
 * before a byte moves: the block after it keeps its contents. */
static void test_memcpy_range(void **state) {
    (void)state;
    tiny t;
    void *ctx = start(&t, NULL);
    enum { SMALL = 4096 };
    void *a = NULL, *b = NULL;
    assert_int_equal(P->dev_alloc(ctx, SMALL, "input", &a), PT_OK);
    assert_int_equal(P->dev_alloc(ctx, SMALL, "input", &b), PT_OK);
    static unsigned char big[1 << 20], back[SMALL], mark[SMALL];
    memset(big, 0x5a, sizeof big);
    memset(mark, 0x11, sizeof mark);
    assert_int_equal(P->memcpy(ctx, b, mark, SMALL, PT_COPY_H2D), PT_OK);
    assert_int_equal(P->memcpy(ctx, a, big, sizeof big, PT_COPY_H2D), PT_ERR_INVALID_ARG);
    const char *e = P->last_error(ctx);
    assert_true(has(e, "runs past the end"));
    assert_true(has(e, "4096 bytes"));
    assert_int_equal(P->memcpy(ctx, back, b, SMALL, PT_COPY_D2H), PT_OK);
    assert_memory_equal(back, mark, SMALL);
    /* reading past the end is refused the same way */
    assert_int_equal(P->memcpy(ctx, big, a, SMALL + 1, PT_COPY_D2H), PT_ERR_INVALID_ARG);
    assert_true(has(P->last_error(ctx), "source"));
    /* the last bytes of the block, exactly: fine */
    assert_int_equal(P->memcpy(ctx, (char *)a + SMALL - 16, big, 16, PT_COPY_H2D), PT_OK);
    assert_int_equal(P->memcpy(ctx, (char *)a + SMALL - 16, big, 17, PT_COPY_H2D),
                     PT_ERR_INVALID_ARG);
    /* a parameter the host reads through its address is in reach */
    float w[TINY_NEL];
    assert_int_equal(P->memcpy(ctx, w, t.p[0].data, sizeof w, PT_COPY_D2H), PT_OK);
    assert_memory_equal(w, t.init[0], sizeof w);
    assert_int_equal(P->dev_free(ctx, a), PT_OK);
    assert_int_equal(P->dev_free(ctx, b), PT_OK);
    assert_int_equal(P->finalize(ctx), PT_OK);
}

/* dev_free takes only what dev_alloc returned: a parameter's storage (or an
 * address inside a host block) is refused, stays the parameter's, and is not
 * handed out again by the next dev_alloc. */
static void test_dev_free_not_host(void **state) {
    (void)state;
    tiny t;
    void *ctx = start(&t, NULL);
    assert_int_equal(P->create_optimizer(ctx, NULL), PT_OK);
    pt_stats_v1 s0 = {.struct_size = sizeof s0}, s1 = {.struct_size = sizeof s1};
    assert_int_equal(P->get_stats(ctx, &s0), PT_OK);
    for (int i = 0; i < TINY_NP; i++) {
        void *addr[2] = {t.p[i].data, t.p[i].grad};
        for (int k = 0; k < 2; k++) {
            if (!addr[k]) continue;
            assert_int_equal(P->dev_free(ctx, addr[k]), PT_ERR_INVALID_ARG);
            assert_true(has(P->last_error(ctx), "not an allocation from dev_alloc"));
            assert_true(has(P->last_error(ctx), "plugin's"));
        }
    }
    assert_int_equal(P->get_stats(ctx, &s1), PT_OK);
    assert_int_equal(s1.dev_current, s0.dev_current);
    void *p = NULL;
    assert_int_equal(P->dev_alloc(ctx, TINY_NEL * sizeof(float), "act", &p), PT_OK);
    for (int i = 0; i < TINY_NP; i++) assert_ptr_not_equal(p, t.p[i].data);
    assert_int_equal(P->dev_free(ctx, (char *)p + 4), PT_ERR_INVALID_ARG);
    assert_true(has(P->last_error(ctx), "4 bytes into a dev_alloc block"));
    float w[TINY_NEL];
    for (int i = 0; i < TINY_NP; i++) {
        assert_int_equal(P->read_param(ctx, i, w, sizeof w), PT_OK);
        assert_memory_equal(w, t.init[i], sizeof w);
    }
    assert_int_equal(P->dev_free(ctx, p), PT_OK);
    assert_int_equal(P->dev_free(ctx, p), PT_ERR_INVALID_ARG); /* twice */
    assert_int_equal(P->finalize(ctx), PT_OK);
}

/* A chunk_size whose buffer slot cannot fit on the whole device names the
 * setting, not the device's size (it said "the device is too small for this
 * model", asking for a 2 TiB device). */
static void test_chunk_size_larger_than_device(void **state) {
    (void)state;
    void *ctx = hb_open(P, "[plugin]\nbackend = host\nlog_level = error\n[memory]\n"
                           "device_capacity = 4MiB\n[protrain]\nauto_memory = false\nn_persist = 0\n"
                           "n_buffer = 1\nn_swap = 0\nn_checkpoint = 0\nchunk_size = 1TiB\n",
                        NULL);
    tiny t;
    tiny_make(&t);
    assert_int_equal(P->post_model_load(ctx, &t.m), PT_ERR_INVALID_ARG);
    const char *e = P->last_error(ctx);
    if (!has(e, "chunk_size = 1099511627776 bytes") || !has(e, "more than the device's whole "
                                                               "capacity") ||
        has(e, "too small for this model"))
        fail_msg("'%s' does not name chunk_size as the cause", e);
    assert_int_equal(P->finalize(ctx), PT_OK);
}

/* An impossible size says so, not "(0 with 256-byte alignment)". */
static void test_dev_alloc_huge(void **state) {
    (void)state;
    tiny t;
    void *ctx = start(&t, NULL);
    void *p = (void *)1;
    assert_int_equal(P->dev_alloc(ctx, UINT64_MAX, "act", &p), PT_ERR_OOM);
    assert_null(p);
    const char *e = P->last_error(ctx);
    assert_false(has(e, "(0 with"));
    assert_true(has(e, "18446744073709551615"));
    assert_true(has(e, "more than any device"));
    assert_int_equal(P->finalize(ctx), PT_OK);
}

/* ---- a host with profile_step (and maybe recompute_block), logging warnings ---- */
typedef struct phost {
    void *ctx;
    uint64_t arena;
    char log[4096];
    int finalize_inside;     /* 1: profile_step, 2: recompute_block calls finalize once */
    int finalize_rc;
    char finalize_err[512];
} phost;

/* The host's mistake under test: finalize from inside a callback. */
static void ph_finalize_inside(phost *h, int where) {
    if (h->finalize_inside != where) return;
    h->finalize_inside = 0;
    h->finalize_rc = P->finalize(h->ctx);
    snprintf(h->finalize_err, sizeof h->finalize_err, "%s", P->last_error(h->ctx));
}

static void ph_log(void *user, int32_t level, const char *msg) {
    phost *h = user;
    if (level <= PT_LOG_WARN && strlen(h->log) + strlen(msg) + 2 < sizeof h->log) {
        strcat(h->log, msg);
        strcat(h->log, "\n");
    }
}

static int32_t ph_recompute(void *user, int32_t b) {
    phost *h = user;
    void *a = NULL;
    ph_finalize_inside(h, 2);
    return P->activation_arena(h->ctx, b, h->arena, &a);
}

/* One forward and backward through the hooks, as a host's profile_step does. */
static int32_t ph_profile(void *user) {
    phost *h = user;
    ph_finalize_inside(h, 1);
    for (int b = 0; b < TINY_NB; b++) {
        void *a = NULL;
        int rc = P->block_pre_forward(h->ctx, b);
        if (!rc) rc = P->activation_arena(h->ctx, b, h->arena, &a);
        if (!rc) rc = P->block_post_forward(h->ctx, b);
        if (rc) return rc;
    }
    for (int b = TINY_NB - 1; b >= 0; b--) {
        void *a = NULL;
        int rc = P->block_pre_backward(h->ctx, b);
        if (!rc) rc = P->activation_arena_get(h->ctx, b, &a);
        if (!rc) rc = P->block_post_backward(h->ctx, b);
        if (rc) return rc;
    }
    return 0;
}

/* init with this host; post_model_load's status returned, ctx in h->ctx. */
static int ph_start(phost *h, tiny *t, const char *extra, int with_recompute, int with_profile) {
    char text[1024];
    snprintf(text, sizeof text,
             "[plugin]\nbackend = host\nlog_level = warn\n[memory]\n%s", extra);
    pt_host_v1 host = hb_host(h);
    host.log = ph_log;
    host.profile_step = with_profile ? ph_profile : NULL;
    host.recompute_block = with_recompute ? ph_recompute : NULL;
    h->ctx = hb_open(P, text, &host);
    tiny_make(t);
    return P->post_model_load(h->ctx, &t->m);
}

/* finalize from inside profile_step (and from recompute_block, which the
 * profiling plan calls for every checkpointed block) is refused: post_model_load
 * is still running on that runtime. It crashed (the runtime was freed under it). */
static void test_finalize_inside_callback(void **state) {
    (void)state;
    for (int where = 1; where <= 2; where++) {
        phost h = {.arena = 4096, .finalize_inside = where, .finalize_rc = -1};
        tiny t;
        assert_int_equal(ph_start(&h, &t, "device_capacity = 4MiB\n", 1, 1), PT_OK);
        assert_int_equal(h.finalize_inside, 0);   /* the callback ran */
        assert_int_equal(h.finalize_rc, PT_ERR_ORDER);
        if (!has(h.finalize_err, "finalize called from inside post_model_load") ||
            !has(h.finalize_err, "nothing was freed"))
            fail_msg("'%s' does not give the reason", h.finalize_err);
        /* the context is whole: it trains, then finalizes */
        assert_int_equal(P->create_optimizer(h.ctx, NULL), PT_OK);
        one_pass(h.ctx, 0);
        assert_int_equal(P->optimizer_step(h.ctx, 0.01f), PT_OK);
        assert_int_equal(P->post_step(h.ctx, 0, 1.0f), PT_OK);
        assert_int_equal(P->finalize(h.ctx), PT_OK);
    }
}

/* No recompute_block: the profiling plan checkpoints every block, and the
 * error says so (it was "profile_step returned 10"). */
static void test_no_recompute_block(void **state) {
    (void)state;
    phost h = {.arena = 4096};
    tiny t;
    assert_int_equal(ph_start(&h, &t, "device_capacity = 4MiB\n", 0, 1), PT_ERR_INVALID_ARG);
    const char *e = P->last_error(h.ctx);
    if (!has(e, "recompute_block is NULL") || !has(e, "checkpoints every block"))
        fail_msg("'%s' does not give the reason", e);
    assert_int_equal(P->finalize(h.ctx), PT_OK);
    /* with the callback the same run profiles and plans */
    phost h2 = {.arena = 4096};
    assert_int_equal(ph_start(&h2, &t, "device_capacity = 4MiB\n", 1, 1), PT_OK);
    assert_int_equal(P->finalize(h2.ctx), PT_OK);
}

/* Too small a device: the error names the least capacity that could work (or
 * a lower bound) and what held the bytes. */
static void test_too_small_names_minimum(void **state) {
    (void)state;
    phost h = {.arena = 8u << 20};   /* one block's activations exceed the device */
    tiny t;
    assert_int_not_equal(ph_start(&h, &t, "device_capacity = 4MiB\n", 1, 1), PT_OK);
    const char *e = P->last_error(h.ctx);
    if (!has(e, "too small for this model and batch") || !has(e, "profiling plan") ||
        !has(e, "it needs ") || !has(e, "measured"))
        fail_msg("profiling: '%s' does not name the size it measured", e);
    /* the size said is one that works: the same host and model start with it */
    unsigned long long need = 0;
    assert_int_equal(sscanf(strstr(e, "it needs ") + 9, "%llu", &need), 1);
    assert_int_equal(P->finalize(h.ctx), PT_OK);
    char mem[64];
    snprintf(mem, sizeof mem, "device_capacity = %llu\n", need);
    phost h1 = {.arena = 8u << 20};
    if (ph_start(&h1, &t, mem, 1, 1) != PT_OK)
        fail_msg("device_capacity = %llu (the size said) fails: %s", need, P->last_error(h1.ctx));
    assert_int_equal(P->finalize(h1.ctx), PT_OK);

    phost h2 = {.arena = 4096};
    assert_int_equal(ph_start(&h2, &t, "device_capacity = 1KiB\n[protrain]\n"
                                       "force_all_persistent = true\n",
                              1, 0),
                     PT_ERR_OOM);
    e = P->last_error(h2.ctx);
    if (!has(e, "too small for this model and batch") || !has(e, "force_all_persistent") ||
        !has(e, "needs at least"))
        fail_msg("force_all_persistent: '%s' does not name the minimum", e);
    assert_int_equal(P->finalize(h2.ctx), PT_OK);
}

/* n_persist beyond the chunk count and a chunk size off the alignment: run,
 * with a warning naming the value used (both were silent). */
static void test_knob_adjustments_warned(void **state) {
    (void)state;
    phost h = {.arena = 4096};
    tiny t;
    assert_int_equal(ph_start(&h, &t, "device_capacity = 4MiB\n[protrain]\nn_persist = 1000\n", 1, 0),
                     PT_OK);
    if (!has(h.log, "n_persist = 1000") || !has(h.log, "is used"))
        fail_msg("no warning for n_persist = 1000: '%s'", h.log);
    assert_int_equal(P->finalize(h.ctx), PT_OK);
    phost h2 = {.arena = 4096};
    assert_int_equal(ph_start(&h2, &t, "device_capacity = 4MiB\n[protrain]\nchunk_size = 1\n", 1, 0),
                     PT_OK);
    if (!has(h2.log, "chunk_size = 1 bytes") || !has(h2.log, "are used"))
        fail_msg("no warning for chunk_size = 1: '%s'", h2.log);
    assert_int_equal(P->finalize(h2.ctx), PT_OK);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_after_finalize),
        cmocka_unit_test(test_init_bad_host),
        cmocka_unit_test(test_block_hook_before_load),
        cmocka_unit_test(test_nonfinite_hparams),
        cmocka_unit_test(test_memcpy_host_pointer),
        cmocka_unit_test(test_memcpy_range),
        cmocka_unit_test(test_dev_free_not_host),
        cmocka_unit_test(test_dev_alloc_huge),
        cmocka_unit_test(test_chunk_size_larger_than_device),
        cmocka_unit_test(test_no_recompute_block),
        cmocka_unit_test(test_finalize_inside_callback),
        cmocka_unit_test(test_too_small_names_minimum),
        cmocka_unit_test(test_knob_adjustments_warned),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
