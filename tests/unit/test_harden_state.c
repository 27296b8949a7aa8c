/*
 * test_harden_state.c — state files that must not load: every single-bit flip
 * of the header, an old format version; hyper-parameters that differ from the
 * running ones (a warning, the load goes on); a parameter-name mismatch that
 * names two different names; stale temp files of a killed save; values no run
 * can have (NaN, infinities, a negative second moment, an absurd step) in a file
 * whose checksum is valid; no warning when the settings are the same; a file
 * of another run (another "run." identity in the host's fingerprint) refused.
 */
#include <math.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "protrain.h"
#include "host_builder.h"
#include "tiny_model.h"

static const pt_plugin_v1 *P = &protrain_plugin_v1;
static char dir[128], path[256];
enum { HEADER_BYTES = 104 };  /* the state file header (runtime/store/state_io.c) */

static char logbuf[8192];
static void host_log(void *user, int32_t level, const char *msg) {
    (void)user;
    if (level <= PT_LOG_WARN && strlen(logbuf) + strlen(msg) + 2 < sizeof logbuf) {
        strcat(logbuf, msg);
        strcat(logbuf, "\n");
    }
}

/* Initialised, model loaded, optimizer created; names may be changed first. */
static void *start(tiny *t, const char *opt, void (*edit)(tiny *)) {
    char text[1024];
    snprintf(text, sizeof text,
             "[plugin]\nbackend = host\nlog_level = warn\n[memory]\ndevice_capacity = 4MiB\n%s",
             opt ? opt : "");
    pt_host_v1 h = hb_host(NULL);
    h.log = host_log;
    void *ctx = hb_open(P, text, &h);
    tiny_make(t);
    if (edit) edit(t);
    assert_int_equal(P->post_model_load(ctx, &t->m), PT_OK);
    assert_int_equal(P->create_optimizer(ctx, NULL), PT_OK);
    return ctx;
}

/* start() with a host fingerprint; fp is overwritten after init (the host's
 * text need only live through init) */
static void *start_fp(tiny *t, const char *fp) {
    static char buf[256];
    pt_host_v1 h = hb_host(NULL);
    h.log = host_log;
    if (fp) {
        snprintf(buf, sizeof buf, "%s", fp);
        h.fingerprint = buf;
    }
    void *ctx = hb_open(P, "[plugin]\nbackend = host\nlog_level = warn\n[memory]\n"
                           "device_capacity = 4MiB\n", &h);
    snprintf(buf, sizeof buf, "run.seed=999\n");
    tiny_make(t);
    assert_int_equal(P->post_model_load(ctx, &t->m), PT_OK);
    assert_int_equal(P->create_optimizer(ctx, NULL), PT_OK);
    return ctx;
}

static void train(void *ctx, tiny *t, int steps) {
    for (int s = 0; s < steps; s++) {
        assert_int_equal(P->pre_step(ctx, s, 0, 1), PT_OK);
        for (int b = 0; b < TINY_NB; b++) {
            assert_int_equal(P->block_pre_forward(ctx, b), PT_OK);
            assert_int_equal(P->block_post_forward(ctx, b), PT_OK);
        }
        for (int b = TINY_NB - 1; b >= 0; b--) {
            assert_int_equal(P->block_pre_backward(ctx, b), PT_OK);
            for (int i = 0; i < TINY_NP; i++)
                if (t->p[i].block == b)
                    for (int k = 0; k < TINY_NEL; k++) ((float *)t->p[i].grad)[k] += 0.1f * (float)(k + s);
            assert_int_equal(P->block_post_backward(ctx, b), PT_OK);
        }
        assert_int_equal(P->optimizer_step(ctx, -1.0f), PT_OK);
        assert_int_equal(P->post_step(ctx, s, 1.0f), PT_OK);
    }
}

static void read_all(void *ctx, float out[TINY_NP][TINY_NEL]) {
    for (int i = 0; i < TINY_NP; i++)
        assert_int_equal(P->read_param(ctx, i, out[i], sizeof out[i]), PT_OK);
}

static int64_t steps_of(void *ctx) {
    pt_stats_v1 st = {.struct_size = sizeof st};
    assert_int_equal(P->get_stats(ctx, &st), PT_OK);
    return st.steps;
}

static unsigned char *slurp(size_t *n) {
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    *n = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *b = malloc(*n);
    assert_non_null(b);
    assert_int_equal(fread(b, 1, *n, f), *n);
    fclose(f);
    return b;
}

static void spit(const unsigned char *b, size_t n) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(b, 1, n, f), n);
    fclose(f);
}

static int setup(void **s) {
    (void)s;
    snprintf(dir, sizeof dir, "/tmp/pt_hstate_%d", (int)getpid());
    mkdir(dir, 0755);
    snprintf(path, sizeof path, "%s/protrain_state_rank0.bin", dir);
    logbuf[0] = '\0';
    return 0;
}

static int teardown(void **s) {
    (void)s;
    char cmd[256];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    return system(cmd) == 0 ? 0 : -1;
}

/* Every bit of the header flipped in turn: each load refused with
 * PT_ERR_FORMAT, and parameters and step count unchanged. Before the format
 * covered its header, a flip in step or a hyper-parameter loaded as valid. */
static void test_header_bit_flips(void **s) {
    (void)s;
    tiny ta, tb;
    void *a = start(&ta, NULL, NULL);
    train(a, &ta, 3);
    assert_int_equal(P->save_state(a, dir), PT_OK);
    void *b = start(&tb, NULL, NULL);
    train(b, &tb, 1);
    float before[TINY_NP][TINY_NEL], after[TINY_NP][TINY_NEL];
    read_all(b, before);
    size_t n;
    unsigned char *good = slurp(&n);
    assert_true(n > HEADER_BYTES);
    int accepted = 0;
    for (int bit = 0; bit < HEADER_BYTES * 8; bit++) {
        unsigned char *bad = malloc(n);
        memcpy(bad, good, n);
        bad[bit / 8] ^= (unsigned char)(1u << (bit % 8));
        spit(bad, n);
        free(bad);
        int rc = P->load_state(b, dir);
        if (rc != PT_ERR_FORMAT) {
            if (accepted++ < 5)
                print_message("bit %d (byte %d): load_state returned %d: %s\n", bit, bit / 8, rc,
                              P->last_error(b));
            continue;
        }
    }
    assert_int_equal(accepted, 0);
    read_all(b, after);
    assert_memory_equal(before, after, sizeof before);
    assert_int_equal(steps_of(b), 1);
    /* the intact file still loads */
    spit(good, n);
    assert_int_equal(P->load_state(b, dir), PT_OK);
    assert_int_equal(steps_of(b), 3);
    /* an old-version file is refused with both versions named */
    unsigned char *old = malloc(n);
    memcpy(old, good, n);
    uint32_t v1 = 1;
    memcpy(old + 4, &v1, 4);
    spit(old, n);
    free(old);
    assert_int_equal(P->load_state(b, dir), PT_ERR_FORMAT);
    const char *e = P->last_error(b);
    if (!strstr(e, "version 1") || !strstr(e, "version 2"))
        fail_msg("'%s' does not name both versions", e);
    free(good);
    assert_int_equal(P->finalize(a), PT_OK);
    assert_int_equal(P->finalize(b), PT_OK);
}

/* Optimizer settings that differ from the running ones (lr as created, beta1,
 * weight_decay): a resume continues the same run, so the file is refused naming
 * the setting and both values, and nothing is restored; with [optimizer]
 * resume_changes = true the change is deliberate: loaded, with a warning. */
static void test_hparam_change(void **s) {
    (void)s;
    static const char *const cases[][3] = {
        {"lr = 0.01\n", "lr = 0.02\n", "lr = 0.01, the running optimizer has lr = 0.02"},
        {"beta1 = 0.9\n", "beta1 = 0.8\n", "beta1 = 0.9"},
        {"weight_decay = 0\n", "weight_decay = 0.1\n", "weight_decay = 0, the running"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        tiny ta, tb, tc;
        char ia[128], ib[128], ic[160];
        snprintf(ia, sizeof ia, "[optimizer]\n%s", cases[k][0]);
        snprintf(ib, sizeof ib, "[optimizer]\n%s", cases[k][1]);
        snprintf(ic, sizeof ic, "[optimizer]\n%sresume_changes = true\n", cases[k][1]);
        void *a = start(&ta, ia, NULL);
        train(a, &ta, 1);
        assert_int_equal(P->save_state(a, dir), PT_OK);
        void *b = start(&tb, ib, NULL);
        assert_int_equal(P->load_state(b, dir), PT_ERR_CONFIG);
        const char *e = P->last_error(b);
        printf("  %s", cases[k][1]);
        printf("    refused: %s\n", e);
        if (!strstr(e, cases[k][2]) || !strstr(e, "resume_changes = true"))
            fail_msg("'%s' does not name '%s' and the way to allow it", e, cases[k][2]);
        assert_int_equal(steps_of(b), 0);   /* nothing restored */
        void *c = start(&tc, ic, NULL);
        logbuf[0] = '\0';
        assert_int_equal(P->load_state(c, dir), PT_OK);
        assert_int_equal(steps_of(c), 1);
        if (!strstr(logbuf, "was saved with") || !strstr(logbuf, "resume_changes = true"))
            fail_msg("no warning naming the change in the log: '%s'", logbuf);
        assert_int_equal(P->finalize(a), PT_OK);
        assert_int_equal(P->finalize(b), PT_OK);
        assert_int_equal(P->finalize(c), PT_OK);
    }
}

/* FNV-1a 64 (the state file's checksum): the header with its checksum field
 * zero, then the payload. */
static uint64_t fnv64(uint64_t h, const unsigned char *b, size_t n) {
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}
static void reseal(unsigned char *b, size_t n) {
    memset(b + 40, 0, 8);   /* checksum at offset 40 of the header */
    uint64_t h = fnv64(fnv64(0xcbf29ce484222325ull, b, HEADER_BYTES), b + HEADER_BYTES,
                       n - HEADER_BYTES);
    memcpy(b + 40, &h, 8);
}

/* A file whose checksum is valid but whose values no run can have: a NaN, an
 * infinity or a negative second moment in the payload, a negative or absurd
 * step. Each is refused naming what is wrong, and nothing changes. Tiny's first
 * parameter "emb" (f32, trainable): 20 + 3 bytes of its entry header, then
 * data[TINY_NEL], m[TINY_NEL], v[TINY_NEL]. */
static void test_values_refused(void **s) {
    (void)s;
    tiny ta, tb;
    void *a = start(&ta, NULL, NULL);
    train(a, &ta, 2);
    assert_int_equal(P->save_state(a, dir), PT_OK);
    void *b = start(&tb, NULL, NULL);
    train(b, &tb, 1);
    size_t n;
    unsigned char *good = slurp(&n);
    const size_t data = HEADER_BYTES + 23, m = data + 4 * TINY_NEL, v = m + 4 * TINY_NEL;
    struct { size_t off; float val; int64_t step; const char *want; } cases[] = {
        {data + 8, NAN, 0, "non-finite"},
        {m + 4, -INFINITY, 0, "non-finite"},
        {v + 12, -1.0f, 0, "negative"},
        {0, 0, -1, "step -1"},
        {0, 0, (int64_t)1 << 62, "step 4611686018427387904"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        unsigned char *bad = malloc(n);
        memcpy(bad, good, n);
        if (cases[k].off) memcpy(bad + cases[k].off, &cases[k].val, 4);
        else memcpy(bad + 24, &cases[k].step, 8);   /* step at offset 24 */
        reseal(bad, n);
        spit(bad, n);
        free(bad);
        assert_int_equal(P->load_state(b, dir), PT_ERR_FORMAT);
        const char *e = P->last_error(b);
        print_message("case %zu: %s\n", k, e);
        if (!strstr(e, cases[k].want)) fail_msg("'%s' does not say '%s'", e, cases[k].want);
        if (cases[k].off && !strstr(e, "'emb'")) fail_msg("'%s' does not name 'emb'", e);
        assert_int_equal(steps_of(b), 1);
    }
    /* the same file resealed unchanged still loads: the checks above are the values */
    reseal(good, n);
    spit(good, n);
    assert_int_equal(P->load_state(b, dir), PT_OK);
    assert_int_equal(steps_of(b), 2);
    free(good);
    assert_int_equal(P->finalize(a), PT_OK);
    assert_int_equal(P->finalize(b), PT_OK);
}

/* A host with an lr schedule gives each step its own lr (set_lr / optimizer_step):
 * the optimizer was created with the same settings, so resuming it says nothing. */
static void test_no_warning_same_settings(void **s) {
    (void)s;
    tiny ta, tb;
    void *a = start(&ta, "[optimizer]\nlr = 0.01\n", NULL);
    train(a, &ta, 1);
    assert_int_equal(P->pre_step(a, 1, 0, 1), PT_OK);
    for (int bl = 0; bl < TINY_NB; bl++) {
        assert_int_equal(P->block_pre_forward(a, bl), PT_OK);
        assert_int_equal(P->block_post_forward(a, bl), PT_OK);
    }
    for (int bl = TINY_NB - 1; bl >= 0; bl--) {
        assert_int_equal(P->block_pre_backward(a, bl), PT_OK);
        assert_int_equal(P->block_post_backward(a, bl), PT_OK);
    }
    assert_int_equal(P->optimizer_step(a, 0.004f), PT_OK);   /* a scheduled lr */
    assert_int_equal(P->post_step(a, 1, 1.0f), PT_OK);
    assert_int_equal(P->save_state(a, dir), PT_OK);
    void *b = start(&tb, "[optimizer]\nlr = 0.01\n", NULL);
    logbuf[0] = '\0';
    assert_int_equal(P->load_state(b, dir), PT_OK);
    if (strstr(logbuf, "was saved with")) fail_msg("a warning although nothing differs: '%s'", logbuf);
    assert_int_equal(P->finalize(a), PT_OK);
    assert_int_equal(P->finalize(b), PT_OK);
}

/* Two long names that differ after a shared prefix: the message shows both
 * differently and where they differ. */
static void long_a(tiny *t) {
    snprintf(t->names[1], sizeof t->names[1], "%s.alpha",
             "transformer.layers.0.self_attention.query_key_value.weight_scale_xx");
}
static void long_b(tiny *t) {
    snprintf(t->names[1], sizeof t->names[1], "%s.beta",
             "transformer.layers.0.self_attention.query_key_value.weight_scale_xx");
}
static void test_name_mismatch(void **s) {
    (void)s;
    tiny ta, tb;
    void *a = start(&ta, NULL, long_a);
    assert_int_equal(P->save_state(a, dir), PT_OK);
    void *b = start(&tb, NULL, long_b);
    assert_int_equal(P->load_state(b, dir), PT_ERR_FORMAT);
    const char *e = P->last_error(b);
    if (!strstr(e, ".alpha") || !strstr(e, ".beta") || !strstr(e, "differ at byte 68"))
        fail_msg("'%s' does not show the two names apart", e);
    assert_int_equal(P->finalize(a), PT_OK);
    assert_int_equal(P->finalize(b), PT_OK);
}

/* A save killed mid-write leaves <file>.tmp.<pid>; the next save removes those
 * whose writer is dead and keeps a live writer's. */
static void test_stale_temps(void **s) {
    (void)s;
    pid_t child = fork();
    if (child == 0) _exit(0);
    assert_true(child > 0);
    assert_int_equal(waitpid(child, NULL, 0), child);
    char dead[300], live[300], other[300];
    snprintf(dead, sizeof dead, "%s.tmp.%d", path, (int)child);
    snprintf(live, sizeof live, "%s.tmp.%d", path, (int)getppid());
    snprintf(other, sizeof other, "%s/protrain_state_rank1.bin.tmp.%d", dir, (int)child);
    const char *files[] = {dead, live, other};
    for (int i = 0; i < 3; i++) {
        FILE *f = fopen(files[i], "w");
        assert_non_null(f);
        fputs("partial", f);
        fclose(f);
    }
    tiny t;
    void *a = start(&t, NULL, NULL);
    assert_int_equal(P->save_state(a, dir), PT_OK);
    assert_int_equal(access(dead, F_OK), -1);    /* its writer is gone */
    assert_int_equal(access(live, F_OK), 0);     /* its writer lives */
    assert_int_equal(access(other, F_OK), 0);    /* another rank's: not ours to judge */
    assert_int_equal(access(path, F_OK), 0);
    assert_int_equal(P->finalize(a), PT_OK);
}

/* A same-step state file of another run loads silently unless the file says
 * whose it is: the host's "run." fingerprint lines are recorded in the header
 * and a load under another identity is refused; lines outside "run." may
 * differ, and a host without them (or a file without an identity) loads. */
static void test_other_run_refused(void **s) {
    (void)s;
    tiny t;
    void *a = start_fp(&t, "seed=1\nrun.seed=1\nrun.data=x\n");
    train(a, &t, 2);
    assert_int_equal(P->save_state(a, dir), PT_OK);
    assert_int_equal(P->finalize(a), PT_OK);
    void *b = start_fp(&t, "seed=2\nrun.seed=2\nrun.data=x\n");
    assert_int_equal(P->load_state(b, dir), PT_ERR_FORMAT);
    const char *e = P->last_error(b);
    printf("  another run's file: %s\n", e);
    if (!strstr(e, "is another run's") || !strstr(e, "run identity"))
        fail_msg("the refusal does not say the file is another run's: %s", e);
    assert_int_equal(steps_of(b), 0);   /* nothing restored */
    assert_int_equal(P->finalize(b), PT_OK);
    const char *ok[] = {"seed=1\nlr=0.5\nrun.seed=1\nrun.data=x\n", NULL};
    for (int i = 0; i < 2; i++) {
        void *c = start_fp(&t, ok[i]);
        if (P->load_state(c, dir) != PT_OK)
            fail_msg("fingerprint %s: %s", ok[i] ? "same run" : "none", P->last_error(c));
        assert_int_equal(steps_of(c), 2);
        assert_int_equal(P->finalize(c), PT_OK);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_header_bit_flips, setup, teardown),
        cmocka_unit_test_setup_teardown(test_hparam_change, setup, teardown),
        cmocka_unit_test_setup_teardown(test_name_mismatch, setup, teardown),
        cmocka_unit_test_setup_teardown(test_stale_temps, setup, teardown),
        cmocka_unit_test_setup_teardown(test_values_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(test_no_warning_same_settings, setup, teardown),
        cmocka_unit_test_setup_teardown(test_other_run_refused, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
