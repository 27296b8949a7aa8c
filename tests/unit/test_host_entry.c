/*
 * test_host_entry.c — the order every queued op's entry point of the host
 * backend checks things in: the injected failure first (so a call with bad
 * arguments still counts towards fail_op_at and, when it is the named call,
 * fails with PT_ERR_BACKEND), then the arguments (PT_ERR_INVALID_ARG). And the
 * ops with no injection point (gemm, cols, svd) are never counted or failed,
 * even with fail_op = none and a call number set.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "gpu.h"
#include "protrain.h"

static const pt_gpu_backend *B = &pt_gpu_backend_host;

static void *open_failing(int op, int at) {
    pt_gpu_config c;
    memset(&c, 0, sizeof c);
    c.capacity = 16ull << 20;
    c.fail_op = op;
    c.fail_op_at = at;
    void *h = NULL;
    char err[256] = "";
    assert_int_equal(B->open(&c, &h, err, sizeof err), PT_OK);
    assert_non_null(h);
    return h;
}

/* One call of op's entry point with arguments it must refuse. */
static int bad_call(void *h, int op) {
    unsigned char buf[16] = {0};
    switch (op) {
    case PT_GPU_OP_MEMSET: return B->memset_async(h, NULL, 0, sizeof buf, NULL);
    case PT_GPU_OP_MEMCPY: return B->memcpy_async(h, NULL, buf, sizeof buf, PT_GPU_H2H, NULL);
    case PT_GPU_OP_HOST_FN: return B->host_fn(h, NULL, NULL, NULL);
    case PT_GPU_OP_ADAMW: return B->adamw(h, NULL, NULL);
    case PT_GPU_OP_SQNORM: return B->sqnorm(h, buf, PT_F32, 4, NULL, NULL);
    case PT_GPU_OP_CONVERT: return B->convert(h, buf, 7, buf, PT_F32, 4, 0, NULL);
    case PT_GPU_OP_EIGH: return B->eigh(h, -1, NULL, NULL, NULL, NULL);
    case PT_GPU_OP_REKLS_EW: return B->rekls_ew(h, NULL, NULL);
    default: fail_msg("no bad call for op %d", op);
    }
    return PT_OK;
}

static const int INJECTABLE[] = {PT_GPU_OP_MEMSET, PT_GPU_OP_MEMCPY, PT_GPU_OP_HOST_FN,
                                 PT_GPU_OP_ADAMW, PT_GPU_OP_SQNORM, PT_GPU_OP_CONVERT,
                                 PT_GPU_OP_EIGH, PT_GPU_OP_REKLS_EW};

/* fail_op_at = 2: the first bad call is refused as bad (and counted), the
 * second is the injected failure, the third is refused as bad again (the
 * injection fires once). Checking arguments first would give INVALID_ARG for
 * all three. */
static void test_injection_before_arguments(void **state) {
    (void)state;
    for (size_t i = 0; i < sizeof INJECTABLE / sizeof INJECTABLE[0]; i++) {
        int op = INJECTABLE[i];
        void *h = open_failing(op, 2);
        int got[3];
        for (int k = 0; k < 3; k++) got[k] = bad_call(h, op);
        if (got[0] != PT_ERR_INVALID_ARG || got[1] != PT_ERR_BACKEND ||
            got[2] != PT_ERR_INVALID_ARG)
            fail_msg("op %s: bad calls returned %d %d %d, want %d %d %d", pt_gpu_op_name(op),
                     got[0], got[1], got[2], PT_ERR_INVALID_ARG, PT_ERR_BACKEND,
                     PT_ERR_INVALID_ARG);
        assert_int_equal(bad_call(NULL, op), PT_ERR_INVALID_ARG);   /* no backend */
        B->close(h);
    }
}

/* fail_op = none with a call number: nothing is ever injected, and the ops
 * without an injection point run (a 1x1x1 GEMM gives 2 * 3 = 6) or refuse bad
 * arguments as bad. */
static void test_uninjectable_ops(void **state) {
    (void)state;
    void *h = open_failing(PT_GPU_OP_NONE, 1);
    float a = 2.0f, b = 3.0f, c = -1.0f;
    pt_gemm_args g = {.m = 1, .n = 1, .k = 1, .alpha = 1.0f, .beta = 0.0f, .a = &a, .lda = 1, .b = &b, .ldb = 1, .c = &c, .ldc = 1};
    for (int k = 0; k < 3; k++) {
        c = -1.0f;
        assert_int_equal(B->gemm_f32(h, &g, NULL), PT_OK);
        assert_true(c == 6.0f);
        assert_int_equal(B->cols_f32(h, NULL, NULL), PT_ERR_INVALID_ARG);
        assert_int_equal(B->svd_f32(h, NULL, NULL), PT_ERR_INVALID_ARG);
    }
    unsigned char buf[4] = {0};
    assert_int_equal(B->memset_async(h, buf, 5, sizeof buf, NULL), PT_OK);
    assert_int_equal(buf[3], 5);
    B->close(h);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_injection_before_arguments),
        cmocka_unit_test(test_uninjectable_ops),
    };
    return cmocka_run_group_tests_name("host backend entry points", tests, NULL, NULL);
}
