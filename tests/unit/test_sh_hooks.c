/*
 * test_sh_hooks.c — sample_host's side of the host contract (protrain.h), against a mock
 * plugin table that records every hook and can misbehave on purpose:
 *  - the exact hook order of a step with 2 micro-batches, of an evaluation pass and of
 *    profile_step (called from inside post_model_load);
 *  - pointer re-reading: outside a block's hook window the mock points that block's
 *    data/grad at NaN buffers (as an offloading plugin may); the losses must equal those
 *    of a run without the swapping, bit for bit;
 *  - CKPT: the mock frees each arena after block_post_forward and, in
 *    block_pre_backward, hands a fresh NaN-filled arena to recompute_block; the
 *    recomputed arena must equal the original forward's byte for byte;
 *  - a failing hook stops the step with an error naming the hook, its argument and the
 *    plugin's last_error.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "protrain.h"
#include "sh_data.h"
#include "sh_gpt.h"
#include "sh_train.h"

#define MAXB 8

static struct mock {
    pt_host_v1 host;
    pt_model_v1 *model;
    char ev[16384];        /* event log */
    int log_on;
    int swap_params;       /* NaN pointers outside the owning block's windows */
    int ckpt;              /* free arenas after forward, recompute in pre_backward */
    int fail_pre_bwd;      /* block_pre_backward(1) fails when set */
    int in_bwd_window[MAXB], in_fwd_window[MAXB];
    float *store, *grad, *nan_buf;
    float *arena[MAXB];
    size_t arena_bytes[MAXB];
    float *saved[MAXB];    /* copy of the forward arena (ckpt mode) */
    int recompute_ok;      /* every recomputed arena matched */
    int n_recompute;
    int n_alloc;
} M;

static void ev(const char *fmt, ...) {
    if (!M.log_on) return;
    size_t n = strlen(M.ev);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(M.ev + n, sizeof M.ev - n, fmt, ap);
    va_end(ap);
}

static const char *m_last_error(void *ctx) {
    (void)ctx;
    return "mock: block_pre_backward refused on purpose";
}

static int32_t m_init(const char *ini, const pt_host_v1 *host, void **ctx) {
    (void)ini;
    M.host = *host;
    *ctx = &M;
    ev("init ");
    return 0;
}

static size_t *OFF; /* float offset of each param in the mock's store */

static void set_ptrs(int b, int real) {
    pt_model_v1 *m = M.model;
    for (int i = 0; i < m->n_params; i++) {
        pt_param_v1 *p = &m->params[i];
        if (p->block != b) continue;
        p->data = real ? M.store + OFF[i] : M.nan_buf;
        p->grad = real ? M.grad + OFF[i] : M.nan_buf + (1 << 20);
    }
}

static int32_t m_post_model_load(void *ctx, pt_model_v1 *model) {
    (void)ctx;
    M.model = model;
    size_t total = 0, maxn = 0;
    OFF = calloc((size_t)model->n_params, sizeof *OFF);
    for (int i = 0; i < model->n_params; i++) {
        pt_param_v1 *p = &model->params[i];
        size_t n = sh_model_param_numel(p);
        if (p->tie >= 0) {
            OFF[i] = OFF[p->tie];
            continue;
        }
        OFF[i] = total;
        total += n;
        if (n > maxn) maxn = n;
    }
    M.store = malloc(total * 4);
    M.grad = calloc(total, 4);
    M.nan_buf = malloc(((size_t)2 << 20) * 4);
    for (size_t k = 0; k < ((size_t)2 << 20); k++) M.nan_buf[k] = NAN;
    assert_true(maxn <= ((size_t)1 << 20));
    for (int i = 0; i < model->n_params; i++) {
        pt_param_v1 *p = &model->params[i];
        if (p->tie < 0) memcpy(M.store + OFF[i], p->init, sh_model_param_numel(p) * 4);
    }
    for (int i = 0; i < model->n_params; i++) {
        pt_param_v1 *p = &model->params[i];
        p->data = M.store + OFF[i];
        p->grad = M.grad + OFF[i];
    }
    if (M.swap_params)
        for (int b = 0; b < model->n_blocks; b++) set_ptrs(b, 0);
    ev("post_model_load(%d) ", model->n_blocks);
    ev("[profile: ");
    int32_t rc = M.host.profile_step(M.host.user);
    ev("] ");
    /* profile gradients are the plugin's to zero */
    size_t nz = total;
    memset(M.grad, 0, nz * 4);
    return rc;
}

static int32_t m_create_optimizer(void *ctx, const pt_optim_v1 *d) {
    (void)ctx;
    ev("create_optimizer(%d) ", d->type);
    return 0;
}

static int32_t m_pre_step(void *ctx, int64_t s, int32_t mi, int32_t n) {
    (void)ctx;
    ev("pre_step(%lld,%d,%d) ", (long long)s, mi, n);
    return 0;
}

static int32_t m_set_lr(void *ctx, float lr) {
    (void)ctx;
    (void)lr;
    ev("set_lr ");
    return 0;
}

static int32_t m_pre_fwd(void *ctx, int32_t b) {
    (void)ctx;
    ev("F%d ", b);
    if (M.swap_params) set_ptrs(b, 1);
    return 0;
}

static int32_t m_post_fwd(void *ctx, int32_t b) {
    (void)ctx;
    ev("f%d ", b);
    if (M.swap_params) set_ptrs(b, 0);
    if (M.ckpt && M.arena[b]) {
        free(M.saved[b]);
        M.saved[b] = malloc(M.arena_bytes[b]);
        memcpy(M.saved[b], M.arena[b], M.arena_bytes[b]);
        memset(M.arena[b], 0xff, M.arena_bytes[b]); /* poison, then release */
        free(M.arena[b]);
        M.arena[b] = NULL;
    }
    return 0;
}

static int32_t m_pre_bwd(void *ctx, int32_t b) {
    (void)ctx;
    ev("B%d ", b);
    if (M.fail_pre_bwd && b == 1) return PT_ERR_ORDER;
    if (M.swap_params) set_ptrs(b, 1);
    if (M.ckpt && M.saved[b]) {
        M.arena[b] = malloc(M.arena_bytes[b]);
        memset(M.arena[b], 0xff, M.arena_bytes[b]);
        int32_t rc = M.host.recompute_block(M.host.user, b);
        ev("R%d ", b);
        M.n_recompute++;
        if (rc || memcmp(M.arena[b], M.saved[b], M.arena_bytes[b]) != 0) M.recompute_ok = 0;
        return rc;
    }
    return 0;
}

static int32_t m_post_bwd(void *ctx, int32_t b) {
    (void)ctx;
    ev("b%d ", b);
    if (M.swap_params) set_ptrs(b, 0);
    return 0;
}

static int32_t m_optimizer_step(void *ctx, float lr) {
    (void)ctx;
    ev("optimizer_step ");
    /* SGD, then zero the grads (contract 3) */
    pt_model_v1 *m = M.model;
    for (int i = 0; i < m->n_params; i++) {
        pt_param_v1 *p = &m->params[i];
        if (p->tie >= 0) continue;
        size_t n = sh_model_param_numel(p);
        for (size_t k = 0; k < n; k++) {
            M.store[OFF[i] + k] -= lr * M.grad[OFF[i] + k];
            M.grad[OFF[i] + k] = 0.0f;
        }
    }
    return 0;
}

static int32_t m_post_step(void *ctx, int64_t s, float loss) {
    (void)ctx;
    (void)loss;
    ev("post_step(%lld) ", (long long)s);
    return 0;
}

static int32_t m_finalize(void *ctx) {
    (void)ctx;
    for (int b = 0; b < MAXB; b++) {
        free(M.arena[b]);
        free(M.saved[b]);
        M.arena[b] = M.saved[b] = NULL;
    }
    free(M.store);
    free(M.grad);
    free(M.nan_buf);
    free(OFF);
    OFF = NULL;
    M.store = M.grad = M.nan_buf = NULL;
    return 0;
}

static int32_t m_dev_alloc(void *ctx, uint64_t bytes, const char *tag, void **p) {
    (void)ctx;
    (void)tag;
    M.n_alloc++;
    *p = aligned_alloc(64, (bytes + 63) / 64 * 64);
    return *p ? 0 : PT_ERR_OOM;
}

static int32_t m_dev_free(void *ctx, void *p) {
    (void)ctx;
    M.n_alloc--;
    free(p);
    return 0;
}

static int32_t m_arena(void *ctx, int32_t b, uint64_t bytes, void **p) {
    (void)ctx;
    ev("A%d ", b);
    free(M.arena[b]);
    M.arena[b] = malloc(bytes);
    memset(M.arena[b], 0xff, bytes);
    M.arena_bytes[b] = bytes;
    *p = M.arena[b];
    return 0;
}

static int32_t m_arena_get(void *ctx, int32_t b, void **p) {
    (void)ctx;
    ev("G%d ", b);
    *p = M.arena[b];
    return *p ? 0 : PT_ERR_ORDER;
}

static int32_t m_read_param(void *ctx, int32_t i, void *dst, uint64_t bytes) {
    (void)ctx;
    memcpy(dst, M.store + OFF[i], bytes);
    return 0;
}

static const pt_plugin_v1 MOCK = {
    .abi_version = 1,
    .struct_size = sizeof(pt_plugin_v1),
    .name = "mock",
    .version = "0",
    .init = m_init,
    .last_error = m_last_error,
    .post_model_load = m_post_model_load,
    .create_optimizer = m_create_optimizer,
    .pre_step = m_pre_step,
    .block_pre_forward = m_pre_fwd,
    .block_post_forward = m_post_fwd,
    .block_pre_backward = m_pre_bwd,
    .block_post_backward = m_post_bwd,
    .optimizer_step = m_optimizer_step,
    .post_step = m_post_step,
    .finalize = m_finalize,
    .dev_alloc = m_dev_alloc,
    .dev_free = m_dev_free,
    .activation_arena = m_arena,
    .activation_arena_get = m_arena_get,
    .read_param = m_read_param,
    .set_lr = m_set_lr,
};

static sh_tokens ALL, TR, VA;

static int setup(void **st) {
    (void)st;
    ALL.n = 3000;
    ALL.tok = malloc(ALL.n * 2);
    for (size_t i = 0; i < ALL.n; i++) ALL.tok[i] = (uint16_t)("abcdefgh ij"[(i * i + i / 3) % 11]);
    sh_data_split(&ALL, &TR, &VA);
    return 0;
}

static int teardown(void **st) {
    (void)st;
    sh_data_tokens_free(&ALL);
    return 0;
}

static sh_trainer *make(int ckpt, int swap) {
    memset(&M, 0, sizeof M);
    M.ckpt = ckpt;
    M.swap_params = swap;
    M.recompute_ok = 1;
    M.log_on = 1;
    sh_train_opts o;
    memset(&o, 0, sizeof o);
    o.dims = (sh_dims){.V = 256, .maxT = 16, .L = 2, .NH = 2, .C = 16};
    o.B = 2;
    o.T = 16;
    o.n_micro = 2;
    o.seed = 5;
    o.lr = 0.1f;
    o.beta1 = 0.9f;
    o.beta2 = 0.95f;
    o.eps = 1e-8f;
    o.tbl = &MOCK;
    o.train = &TR;
    o.val = &VA;
    sh_trainer *tr = NULL;
    char err[512];
    int rc = sh_trainer_create(&tr, &o, err, sizeof err);
    if (rc) fprintf(stderr, "%s\n", err);
    assert_int_equal(rc, 0);
    return tr;
}

static void test_order(void **st) {
    (void)st;
    sh_trainer *tr = make(0, 0);
    assert_string_equal(M.ev, "init post_model_load(2) [profile: F0 A0 f0 F1 A1 f1 B1 G1 b1 "
                              "B0 G0 b0 ] create_optimizer(1) ");
    M.ev[0] = '\0';
    double loss;
    assert_int_equal(sh_trainer_step(tr, 1, 0.1f, &loss), 0);
    const char *micro = "F0 A0 f0 F1 A1 f1 B1 G1 b1 B0 G0 b0 ";
    char want[1024];
    snprintf(want, sizeof want, "pre_step(1,0,2) set_lr %spre_step(1,1,2) %soptimizer_step "
                                "post_step(1) ",
             micro, micro);
    assert_string_equal(M.ev, want);
    M.ev[0] = '\0';
    assert_int_equal(sh_trainer_eval(tr, 1, 1, &loss), 0);
    assert_string_equal(M.ev, "pre_step(1,-1,0) F0 A0 f0 F1 A1 f1 ");
    M.ev[0] = '\0';
    uint16_t s[4] = {'a', 'b', 0, 0};
    sh_rng r;
    sh_rng_seed(&r, 1, 3);
    assert_int_equal(sh_trainer_generate(tr, 1, s, 2, 4, 0.0f, &r), 0);
    assert_string_equal(M.ev, "pre_step(1,-1,0) F0 A0 f0 F1 A1 f1 pre_step(1,-1,0) F0 A0 f0 "
                              "F1 A1 f1 ");
    assert_int_equal(sh_trainer_destroy(tr), 0);
    assert_int_equal(M.n_alloc, 0); /* every dev_alloc was freed */
}

static void run_losses(int ckpt, int swap, double *loss, int n) {
    sh_trainer *tr = make(ckpt, swap);
    M.log_on = 0;
    for (int s = 0; s < n; s++) assert_int_equal(sh_trainer_step(tr, s + 1, 0.1f, &loss[s]), 0);
    assert_int_equal(sh_trainer_eval(tr, n, 2, &loss[n]), 0);
    assert_int_equal(sh_trainer_destroy(tr), 0);
}

static void test_reread_and_recompute(void **st) {
    (void)st;
    double ref[6], sw[6], ck[6];
    run_losses(0, 0, ref, 5);
    run_losses(0, 1, sw, 5);
    run_losses(1, 1, ck, 5);
    for (int i = 0; i < 6; i++) assert_true(isfinite(ref[i]));
    assert_true(ref[4] < ref[0]); /* SGD at lr 0.1 trains */
    assert_memory_equal(ref, sw, sizeof ref);  /* pointers re-read, never cached */
    assert_memory_equal(ref, ck, sizeof ref);  /* recompute gives the same backward */
    assert_true(M.recompute_ok);
    /* steps x micro x blocks, plus profile_step's backward inside post_model_load */
    assert_int_equal(M.n_recompute, 5 * 2 * 2 + 2);
}

static void test_hook_error(void **st) {
    (void)st;
    sh_trainer *tr = make(0, 0);
    M.fail_pre_bwd = 1;
    double loss;
    assert_int_equal(sh_trainer_step(tr, 1, 0.1f, &loss), -1);
    const char *e = sh_trainer_error(tr);
    printf("  error: %s\n", e);
    assert_non_null(strstr(e, "block_pre_backward(1)"));
    assert_non_null(strstr(e, "status 5"));
    assert_non_null(strstr(e, "refused on purpose"));
    assert_int_equal(sh_trainer_destroy(tr), 0);
    assert_int_equal(M.n_alloc, 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_order),
        cmocka_unit_test(test_reread_and_recompute),
        cmocka_unit_test(test_hook_error),
    };
    return cmocka_run_group_tests_name("sample_host host contract", tests, setup, teardown);
}
