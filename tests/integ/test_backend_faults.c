/*
 * test_backend_faults.c — a failing device-backend op always reaches the host as
 * a hook's PT_ERR_BACKEND, never as a crash or a silently wrong step.
 *
 * [testing] fail_op = <op>:<n> makes the n-th call of one backend op fail
 * (gpu/host/host_faults.c; the backend logs "injected failure" when it fires).
 * For each op and several n along a short sample_host training run (3 steps,
 * then reading every parameter back), under plans that reach the different
 * code paths (a synchronous host streaming chunks with clipping and 2
 * micro-batches, an asynchronous host streaming chunks with the CPU step
 * overlapping backward, everything resident with clipping, and the profiler),
 * the test asserts:
 *  - fired before finalize: some hook returned PT_ERR_BACKEND, and its
 *    last_error names the op;
 *  - fired inside finalize (a destructor's wait): a warning naming the op;
 *  - did not fire (n past the run's calls): the run succeeded;
 *  - always: finalize returns 0 and reports no device or pinned allocation
 *    left over (the plugin frees everything after a failure too).
 * Every op listed for a plan must fire before finalize at least once there.
 * convert is only called for 16-bit parameters, which sample_host lacks: a
 * bf16 model driven through the plugin table directly covers it.
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "gpu.h"
#include "kernels_hd.h"
#include "host_builder.h"
#include "sh_harness.h"

#define STEPS 3
#define MAX_POINTS 12

static sh_harness H;
static pt_plugin_v1 SYNC_TBL;   /* the plugin's table without launch: a synchronous host */

/* What the plugin logged during one run (callbacks may come from its threads). */
typedef struct capture {
    pthread_mutex_t mu;
    const char *op;
    int in_fini;               /* the test is inside finalize */
    int fired, fired_in_fini;  /* the backend's "injected failure" notice */
    int leak;                  /* "never freed" from finalize */
    char fini_warn[512];       /* a warning naming op logged during finalize */
} capture;

static void cap_log(void *u, int32_t level, const char *msg) {
    capture *c = u;
    if (getenv("PT_FAULTS_VERBOSE")) fprintf(stderr, "    log %d: %s\n", (int)level, msg);
    pthread_mutex_lock(&c->mu);
    if (strstr(msg, "injected failure")) {
        c->fired = 1;
        if (c->in_fini) c->fired_in_fini = 1;
    } else if (level <= PT_LOG_WARN && c->in_fini && strstr(msg, c->op) && !c->fini_warn[0]) {
        snprintf(c->fini_warn, sizeof c->fini_warn, "%s", msg);
    }
    if (strstr(msg, "never freed")) c->leak = 1;
    pthread_mutex_unlock(&c->mu);
}

typedef struct outcome {
    int fired, fired_in_fini, failed, status, leak, fini_rc;
    char err[1024], fini_warn[512];
} outcome;

/* "... failed with status N: <last_error>" (sh_trainer's sentence): N and the
 * plugin's sentence. */
static const char *split_status(const char *err, int *status) {
    const char *p = strstr(err, "with status ");
    *status = 0;
    if (!p || sscanf(p, "with status %d", status) != 1) return "";
    const char *q = strstr(p, ": ");
    return q ? q + 2 : "";
}

typedef struct plan {
    const char *name;
    int sync;                  /* host without launch: the plugin orders by waiting */
    const char *memory, *protrain;
    float clip;
    int n_micro;
    const int *ops;            /* PT_GPU_OP_* to inject, 0-terminated */
} plan;

static void run(const plan *pl, int op, int n, outcome *out) {
    char text[1024];
    snprintf(text, sizeof text,
             "[plugin]\nlog_level = warn\nbackend = host\n[memory]\n%s\n[protrain]\n%s\n"
             "[host_backend]\npoison = false\n[testing]\nfail_op = %s:%d\n",
             pl->memory, pl->protrain, pt_gpu_op_name(op), n);
    const char *ini = sh_harness_ini(&H, "faults", text);
    assert_non_null(ini);
    capture cap;
    memset(&cap, 0, sizeof cap);
    pthread_mutex_init(&cap.mu, NULL);
    cap.op = pt_gpu_op_name(op);
    sh_train_opts o = sh_harness_opts(&H, 4, 32, 2, 4, 32);
    o.n_micro = pl->n_micro;
    o.max_grad_norm = pl->clip;
    o.tbl = pl->sync ? &SYNC_TBL : H.plug.table;
    o.ini_path = ini;
    o.log = cap_log;
    o.log_user = &cap;
    memset(out, 0, sizeof *out);
    sh_trainer *tr = NULL;
    int rc = sh_trainer_create(&tr, &o, out->err, sizeof out->err);
    if (!rc) {
        for (int s = 1; s <= STEPS && !rc; s++) {
            double loss;
            rc = sh_trainer_step(tr, s, 1e-3f, &loss);
        }
        if (!rc) {
            float *flat = calloc(sh_trainer_model(tr)->n_floats, sizeof(float));
            assert_non_null(flat);
            rc = sh_trainer_snapshot(tr, flat);
            free(flat);
        }
        if (rc) snprintf(out->err, sizeof out->err, "%s", sh_trainer_error(tr));
        pthread_mutex_lock(&cap.mu);
        cap.in_fini = 1;
        pthread_mutex_unlock(&cap.mu);
        out->fini_rc = sh_trainer_destroy(tr);
    }
    out->failed = rc != 0;
    split_status(out->err, &out->status);
    out->fired = cap.fired;
    out->fired_in_fini = cap.fired_in_fini;
    out->leak = cap.leak;
    snprintf(out->fini_warn, sizeof out->fini_warn, "%s", cap.fini_warn);
    pthread_mutex_destroy(&cap.mu);
}

/* Runs every op of the plan at n = 1, 3, 7, 15, ... until the injection no
 * longer fires; returns the number of broken expectations (each printed). */
static int check_plan(const plan *pl) {
    int bad = 0;
    for (const int *op = pl->ops; *op; op++) {
        const char *name = pt_gpu_op_name(*op);
        int hook_errors = 0, points = 0;
        for (int n = 1, k = 0; k < MAX_POINTS; n = 2 * n + 1, k++) {
            outcome r;
            run(pl, *op, n, &r);
            int status;
            const char *le = split_status(r.err, &status);
            const char *why = NULL;
            /* a hook the host called from inside a callback (launch from
             * recompute_block) returned PT_ERR_BACKEND to the host, which then
             * failed its callback: the plugin reports that as PT_ERR_CALLBACK */
            int via_callback = r.status == PT_ERR_CALLBACK &&
                               strstr(r.err, "host callback") && strstr(r.err, "status 6");
            if (r.fired && !r.fired_in_fini) {
                if (!r.failed) why = "SILENT: every hook returned 0";
                else if (via_callback) hook_errors++;
                else if (r.status != PT_ERR_BACKEND) why = "the hook's status is not PT_ERR_BACKEND";
                else if (!strstr(le, name)) why = "last_error does not name the op";
                /* every plan here fits: a failed op is not an out-of-memory (the
                 * profiler's probe buffers that did not fit once left such a
                 * record, and a later failure was explained by it) */
                else if (strstr(r.err, "is too small")) why = "a failed op explained as the device being too small";
                else hook_errors++;
            } else if (r.fired_in_fini) {
                if (r.failed) why = "failed before finalize, yet fired only in finalize";
                else if (!r.fini_warn[0]) why = "finalize's failure was not logged";
            } else if (r.failed) {
                why = "the run failed without an injected failure";
            }
            if (!why && r.fini_rc != 0) why = "finalize did not return 0";
            if (!why && r.leak) why = "finalize reported allocations never freed";
            if (why) {
                printf("  [%s] %s:%d: %s (%s)\n", pl->name, name, n, why,
                       r.err[0] ? r.err : "no error");
                bad++;
            } else if (r.fired && !r.fired_in_fini) {
                printf("  [%s] %s:%d -> %d: %s\n", pl->name, name, n, r.status, le);
            } else if (r.fired_in_fini) {
                printf("  [%s] %s:%d -> in finalize: %s\n", pl->name, name, n, r.fini_warn);
            }
            points++;
            if (!r.fired) break;
        }
        if (!hook_errors) {
            printf("  [%s] %s: no injection reached a hook (%d points)\n", pl->name, name, points);
            bad++;
        }
    }
    return bad;
}

static const char *STREAMED = "chunk_size = 64KiB\nn_persist = 1\nn_buffer = 2\n"
                              "n_checkpoint = 1\nn_swap = 2\nauto_memory = false";

static const int OPS_SYNC[] = {PT_GPU_OP_MEMSET, PT_GPU_OP_MEMCPY,
                               PT_GPU_OP_EVENT_SYNC, PT_GPU_OP_STREAM_SYNC,
                               PT_GPU_OP_EVENT_RECORD, PT_GPU_OP_STREAM_WAIT_EVENT,
                               PT_GPU_OP_SQNORM, PT_GPU_OP_ADAMW,
                               PT_GPU_OP_EVENT_CREATE, 0};
static const int OPS_ASYNC[] = {PT_GPU_OP_EVENT_SYNC, PT_GPU_OP_STREAM_SYNC,
                                PT_GPU_OP_EVENT_RECORD, PT_GPU_OP_STREAM_WAIT_EVENT,
                                PT_GPU_OP_MEMCPY, PT_GPU_OP_MEMSET,
                                PT_GPU_OP_HOST_FN, 0};
static const int OPS_RESIDENT[] = {PT_GPU_OP_ADAMW, PT_GPU_OP_SQNORM, PT_GPU_OP_MEMSET,
                                   PT_GPU_OP_STREAM_SYNC, 0};
static const int OPS_PROFILED[] = {PT_GPU_OP_EVENT_RECORD, PT_GPU_OP_EVENT_ELAPSED_MS,
                                   PT_GPU_OP_ADAMW, PT_GPU_OP_STREAM_SYNC, PT_GPU_OP_MEMSET, 0};

static void test_sync_streamed(void **st) {
    (void)st;
    plan p = {"sync streamed, clip, 2 micro", 1, "device_capacity = 1GiB", STREAMED, 1.0f, 2,
              OPS_SYNC};
    assert_int_equal(check_plan(&p), 0);
}

static void test_async_streamed(void **st) {
    (void)st;
    plan p = {"async streamed", 0, "device_capacity = 1GiB", STREAMED, 0.0f, 1, OPS_ASYNC};
    assert_int_equal(check_plan(&p), 0);
}

static void test_resident(void **st) {
    (void)st;
    plan p = {"resident, clip", 0, "device_capacity = 1GiB",
              "force_all_persistent = true\nn_checkpoint = 0\nn_swap = 0", 1.0f, 1, OPS_RESIDENT};
    assert_int_equal(check_plan(&p), 0);
}

static void test_profiled(void **st) {
    (void)st;
    plan p = {"profiled", 0, "device_capacity = 3MiB", "auto_memory = true", 0.0f, 1,
              OPS_PROFILED};
    assert_int_equal(check_plan(&p), 0);
}

/* ---- convert: bf16 parameters through the plugin table ---- */

static const pt_plugin_v1 *P = &protrain_plugin_v1;

enum { NP = 5,
       NB = 2,
       MAXN = 96 };

typedef struct bf16_model {
    pt_param_v1 p[NP];
    pt_model_v1 m;
    uint16_t init[NP][MAXN];
} bf16_model;

static void bf16_make(bf16_model *t) {
    static const char *names[NP] = {"emb", "b0.w", "b0.b", "b1.w", "b1.b"};
    static const int64_t numel[NP] = {64, 96, 8, 96, 8};
    static const int blk[NP] = {-1, 0, 0, 1, 1};
    memset(t, 0, sizeof *t);
    for (int i = 0; i < NP; i++) {
        t->p[i].name = names[i];
        t->p[i].dtype = PT_BF16;
        t->p[i].ndim = 1;
        t->p[i].shape[0] = numel[i];
        t->p[i].block = blk[i];
        t->p[i].trainable = 1;
        t->p[i].tie = -1;
        for (int k = 0; k < numel[i]; k++)
            t->init[i][k] = pt_f32_to_bf16(0.01f * (float)((i * 13 + k * 5) % 17) - 0.08f);
        t->p[i].init = t->init[i];
    }
    t->m.struct_size = sizeof t->m;
    t->m.n_params = NP;
    t->m.params = t->p;
    t->m.n_blocks = NB;
    t->m.batch = 1;
    t->m.seq = 1;
    t->m.arch = "bf16-faults";
}

/* One resident bf16 run with convert:n injected; returns the first failing
 * hook's status (0: none) with its last_error in le. */
static int bf16_run(int n, capture *cap, char *le, size_t lelen, int *fini_rc) {
    char text[512];
    snprintf(text, sizeof text,
             "[plugin]\nbackend = host\nlog_level = warn\n[memory]\ndevice_capacity = 4MiB\n"
             "[protrain]\nforce_all_persistent = true\n[host_backend]\npoison = false\n"
             "[testing]\nfail_op = convert:%d\n",
             n);
    pt_host_v1 host = hb_host(cap);
    host.device_kind = PT_DEVICE_HOST;
    host.log = cap_log;
    void *ctx = hb_open(P, text, &host);
    static bf16_model t;
    bf16_make(&t);
    int rc = P->post_model_load(ctx, &t.m);
    if (!rc) rc = P->create_optimizer(ctx, NULL);
    for (int s = 0; s < 3 && !rc; s++) {
        rc = P->pre_step(ctx, s, 0, 1);
        for (int b = 0; b < NB && !rc; b++) {
            rc = P->block_pre_forward(ctx, b);
            if (!rc) rc = P->block_post_forward(ctx, b);
        }
        for (int b = NB - 1; b >= 0 && !rc; b--) {
            rc = P->block_pre_backward(ctx, b);
            for (int i = 0; i < NP && !rc; i++) {
                if (t.p[i].block != b && !(b == 0 && t.p[i].block < 0)) continue;
                uint16_t *g = t.p[i].grad;
                for (int k = 0; k < t.p[i].shape[0]; k++)
                    g[k] = pt_f32_to_bf16(0.02f * (float)((k + i + s) % 7) - 0.06f);
            }
            if (!rc) rc = P->block_post_backward(ctx, b);
        }
        if (!rc) rc = P->optimizer_step(ctx, -1.0f);
        if (!rc) rc = P->post_step(ctx, s, 1.0f);
    }
    snprintf(le, lelen, "%s", rc ? P->last_error(ctx) : "");
    pthread_mutex_lock(&cap->mu);
    cap->in_fini = 1;
    pthread_mutex_unlock(&cap->mu);
    *fini_rc = P->finalize(ctx);
    return rc;
}

static void test_convert_bf16(void **st) {
    (void)st;
    int reached = 0;
    for (int n = 1; n <= 40; n = 3 * n + 1) {
        capture cap;
        memset(&cap, 0, sizeof cap);
        pthread_mutex_init(&cap.mu, NULL);
        cap.op = "convert";
        char le[1024];
        int fini_rc = -1;
        int rc = bf16_run(n, &cap, le, sizeof le, &fini_rc);
        printf("  [bf16 resident] convert:%d -> %s%d: %s\n", n,
               cap.fired ? "" : "(not fired) ", rc, le);
        if (cap.fired && !cap.fired_in_fini) {
            assert_int_equal(rc, PT_ERR_BACKEND);
            assert_non_null(strstr(le, "convert"));
            reached++;
        } else {
            assert_int_equal(rc, 0);
        }
        assert_int_equal(fini_rc, 0);
        assert_false(cap.leak);
        pthread_mutex_destroy(&cap.mu);
        if (!cap.fired) break;
    }
    assert_true(reached >= 2);   /* the masters' widening and a step's gradient widening */
}

/* ---- the spec parser and its INI key ---- */

static void test_spec_parse(void **st) {
    (void)st;
    int op = -1, at = -1;
    char why[300];
    assert_int_equal(pt_gpu_fail_op_parse("event_sync:3", &op, &at, why, sizeof why), 0);
    assert_int_equal(op, PT_GPU_OP_EVENT_SYNC);
    assert_int_equal(at, 3);
    assert_int_equal(pt_gpu_fail_op_parse("", &op, &at, why, sizeof why), 0);
    assert_int_equal(op, PT_GPU_OP_NONE);
    assert_int_equal(at, 0);
    assert_int_equal(pt_gpu_fail_op_parse("none", &op, &at, why, sizeof why), 0);
    static const char *bad[] = {"memset", "memset:", "memset:0", "memset:-2", "memset:3x",
                                "memsetx:3", ":3", "none:1"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        why[0] = 0;
        assert_int_equal(pt_gpu_fail_op_parse(bad[i], &op, &at, why, sizeof why), -1);
        assert_non_null(strstr(why, "<op>:<n>"));
    }
    for (int k = 1; k < PT_GPU_OP_COUNT; k++) {
        char spec[64];
        snprintf(spec, sizeof spec, "%s:7", pt_gpu_op_name(k));
        assert_int_equal(pt_gpu_fail_op_parse(spec, &op, &at, why, sizeof why), 0);
        assert_int_equal(op, k);
        assert_int_equal(at, 7);
    }
    /* the INI refuses a bad spec at init, naming the key */
    const char *ini = sh_harness_ini(&H, "badspec", "[testing]\nfail_op = memcpy:zero\n");
    assert_non_null(ini);
    void *ctx = NULL;
    assert_int_equal(H.plug.table->init(ini, NULL, &ctx), PT_ERR_CONFIG);
    assert_null(ctx);
    assert_non_null(strstr(H.plug.table->last_error(NULL), "fail_op"));
}

static int setup(void **st) {
    (void)st;
    if (sh_harness_open(&H, "test_backend_faults",
                        "to be, or not to be, that is the question: whether 'tis nobler ",
                        6000, 7, 6))
        return -1;
    SYNC_TBL = *H.plug.table;
    SYNC_TBL.launch = NULL;
    return 0;
}

static int teardown(void **st) {
    (void)st;
    return sh_harness_close(&H);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_spec_parse),
        cmocka_unit_test(test_sync_streamed),
        cmocka_unit_test(test_async_streamed),
        cmocka_unit_test(test_resident),
        cmocka_unit_test(test_profiled),
        cmocka_unit_test(test_convert_bf16),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
