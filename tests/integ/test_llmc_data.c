/*
 * test_llmc_data.c — sample_host on llm.c's data (sh_llmc.h):
 *  - a train/val pair written by --write-shard, trained with data_order = sequential
 *    and --val-data: step 1's loss equals the loss of the model on the train file's
 *    first B*T+1 tokens (inputs tok[0..B*T), targets tok[1..B*T]), bit for bit, so
 *    the first batch was exactly that window; and the run counted the val file's
 *    tokens as validation (all of the train file trains);
 *  - the sequential sampler: window w starts at w*B*T, rows are consecutive T-slices,
 *    the epoch wraps to token 0 after (n-1)/(B*T) windows;
 *  - the shuffled sampler: every epoch visits each window once, epochs differ, the
 *    order depends on the seed only, and get/set of its state continues it exactly;
 *  - --data as a comma list and a glob concatenates the files in order; a pattern
 *    without a match is an error naming it;
 *  - lr schedules: cosine as before, constant, linear to lr*min_lr_frac;
 *  - INI mistakes in the new keys name file:line and the key.
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

#include "sh_config.h"
#include "sh_llmc.h"
#include "sh_run.h"
#include "sh_train.h"

static char DIR_[64];

static int setup(void **st) {
    (void)st;
    snprintf(DIR_, sizeof DIR_, "/tmp/test_llmc.XXXXXX");
    return mkdtemp(DIR_) ? 0 : -1;
}

static int teardown(void **st) {
    (void)st;
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", DIR_);
    return system(cmd) == 0 ? 0 : -1;
}

static const char *in_dir(char *buf, const char *name) {
    snprintf(buf, 300, "%s/%s", DIR_, name);
    return buf;
}

static void write_text(const char *path, const char *fmt, int n) {
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    for (int i = 0; i < n; i++) fprintf(f, fmt, i % 13, i % 7);
    assert_int_equal(fclose(f), 0);
}

static void run_ok(const sh_config *c) {
    char err[1024] = "";
    int rc = sh_run(c, err, sizeof err);
    if (rc) fprintf(stderr, "sh_run: %s\n", err);
    assert_int_equal(rc, 0);
}

/* text -> llm.c shard through sample_host's own --write-shard path */
static void write_shard(const char *text, const char *shard) {
    sh_config c;
    sh_config_defaults(&c);
    c.quiet = 1;
    snprintf(c.data, sizeof c.data, "%s", text);
    snprintf(c.write_shard, sizeof c.write_shard, "%s", shard);
    run_ok(&c);
}

static void test_first_batch_sequential(void **st) {
    (void)st;
    char ttxt[300], vtxt[300], tbin[300], vbin[300], met[300];
    write_text(in_dir(ttxt, "train.txt"), "row %d of the training text, column %d. ", 120);
    write_text(in_dir(vtxt, "val.txt"), "VALIDATION %d/%d; ", 60);
    write_shard(ttxt, in_dir(tbin, "train.bin"));
    write_shard(vtxt, in_dir(vbin, "val.bin"));
    const int B = 4, T = 16, L = 1, C = 32, NH = 2;
    sh_config c;
    sh_config_defaults(&c);
    c.layers = L;
    c.channels = C;
    c.heads = NH;
    c.batch = B;
    c.seq = T;
    c.steps = 1;
    c.seed = 5;
    c.val_every = 0;
    c.val_batches = 1;
    c.gen_every = 0;
    c.quiet = 1;
    c.metrics_no_time = 1;
    c.no_plugin = 1;
    c.data_order = SH_ORDER_SEQUENTIAL;
    snprintf(c.data, sizeof c.data, "%s", tbin);
    snprintf(c.val_data, sizeof c.val_data, "%s", vbin);
    snprintf(c.metrics, sizeof c.metrics, "%s", in_dir(met, "m.jsonl"));
    run_ok(&c);
    FILE *f = fopen(met, "r");
    assert_non_null(f);
    char line[512];
    assert_non_null(fgets(line, sizeof line, f));
    fclose(f);
    const char *lp = strstr(line, "\"loss\":");
    assert_non_null(lp);
    char got[64];
    snprintf(got, sizeof got, "%.*s", (int)strcspn(lp + 7, ","), lp + 7);

    /* the same model (shape and seed) on the file's first B*T+1 tokens */
    sh_tokens tr, va;
    char err[512];
    assert_int_equal(sh_data_read_shard(tbin, &tr, err, sizeof err), 0);
    assert_int_equal(sh_data_read_shard(vbin, &va, err, sizeof err), 0);
    sh_train_opts o;
    memset(&o, 0, sizeof o);
    o.dims = (sh_dims){.V = 256, .maxT = T, .L = L, .NH = NH, .C = C};
    o.B = B;
    o.T = T;
    o.n_micro = 1;
    o.seed = 5;
    o.lr = c.lr;
    o.beta1 = c.beta1;
    o.beta2 = c.beta2;
    o.eps = c.eps;
    o.max_grad_norm = c.max_grad_norm;
    o.train = &tr;
    o.val = &va;
    sh_trainer *t = NULL;
    assert_int_equal(sh_trainer_create(&t, &o, err, sizeof err), 0);
    int32_t inp[4 * 16], tgt[4 * 16];
    for (int i = 0; i < B * T; i++) {
        inp[i] = tr.tok[i];
        tgt[i] = tr.tok[i + 1];
    }
    double loss = 0;
    assert_int_equal(sh_trainer_fwdbwd(t, inp, tgt, 0, &loss), 0);
    char want[64];
    snprintf(want, sizeof want, "%.17g", loss);
    assert_string_equal(got, want);
    /* and the random order draws another first batch (the check above can fail) */
    c.data_order = SH_ORDER_RANDOM;
    run_ok(&c);
    f = fopen(met, "r");
    assert_non_null(f);
    assert_non_null(fgets(line, sizeof line, f));
    fclose(f);
    assert_null(strstr(line, want));
    assert_int_equal(sh_trainer_destroy(t), 0);
    printf("  sequential: step 1 loss %s = loss on tokens [0, %d] of %s\n", got, B * T, tbin);
    sh_data_tokens_free(&tr);
    sh_data_tokens_free(&va);
}

static sh_tokens ramp(size_t n) {
    sh_tokens t = {malloc(n * sizeof(uint16_t)), n};
    assert_non_null(t.tok);
    for (size_t i = 0; i < n; i++) t.tok[i] = (uint16_t)(i % 65536);
    return t;
}

static void test_sequential_windows(void **st) {
    (void)st;
    const int B = 3, T = 5;
    sh_tokens t = ramp(4 * 15 + 7); /* (n-1)/(B*T) = 4 windows */
    sh_sampler s;
    char err[256];
    assert_int_equal(sh_sampler_init(&s, SH_ORDER_SEQUENTIAL, &t, B, T, 1, err, sizeof err), 0);
    int32_t inp[15], tgt[15];
    for (int k = 0; k < 9; k++) {
        int w = k % 4;
        sh_sampler_next(&s, inp, tgt);
        for (int i = 0; i < B * T; i++) {
            assert_int_equal(inp[i], w * B * T + i);
            assert_int_equal(tgt[i], w * B * T + i + 1);
        }
    }
    uint64_t r, e, p;
    sh_sampler_get(&s, &r, &e, &p);
    assert_int_equal(e, 2);
    assert_int_equal(p, 1);
    sh_sampler_free(&s);
    sh_tokens small = ramp(15); /* B*T+1 = 16 needed */
    assert_int_equal(sh_sampler_init(&s, SH_ORDER_SEQUENTIAL, &small, B, T, 1, err, sizeof err),
                     -1);
    assert_non_null(strstr(err, "sequential"));
    sh_data_tokens_free(&small);
    sh_data_tokens_free(&t);
}

static void test_shuffled_epochs(void **st) {
    (void)st;
    const int B = 2, T = 4, NW = 37;
    sh_tokens t = ramp((size_t)NW * B * T + 1);
    sh_sampler s, s2;
    char err[256];
    assert_int_equal(sh_sampler_init(&s, SH_ORDER_SHUFFLED, &t, B, T, 9, err, sizeof err), 0);
    int32_t inp[8], tgt[8];
    int order[3][37];
    for (int e = 0; e < 3; e++) {
        int seen[37] = {0};
        for (int k = 0; k < NW; k++) {
            sh_sampler_next(&s, inp, tgt);
            assert_int_equal(inp[0] % (B * T), 0);
            int w = inp[0] / (B * T);
            for (int i = 0; i < B * T; i++) assert_int_equal(tgt[i], inp[i] + 1);
            order[e][k] = w;
            seen[w]++;
        }
        for (int w = 0; w < NW; w++) assert_int_equal(seen[w], 1);
    }
    assert_memory_not_equal(order[0], order[1], sizeof order[0]);
    assert_memory_not_equal(order[1], order[2], sizeof order[0]);
    /* state mid-epoch, restored into a fresh sampler of the same seed, continues */
    uint64_t r, e, p;
    sh_sampler_get(&s, &r, &e, &p);
    int32_t a[8], b[8], x[8], y[8];
    for (int k = 0; k < 20; k++) sh_sampler_next(&s, a, b);
    sh_sampler_get(&s, &r, &e, &p);
    assert_int_equal(sh_sampler_init(&s2, SH_ORDER_SHUFFLED, &t, B, T, 9, err, sizeof err), 0);
    sh_sampler_set(&s2, r, e, p);
    for (int k = 0; k < 60; k++) {
        sh_sampler_next(&s, a, b);
        sh_sampler_next(&s2, x, y);
        assert_memory_equal(a, x, sizeof a);
    }
    sh_sampler_free(&s2);
    /* another seed, another order */
    assert_int_equal(sh_sampler_init(&s2, SH_ORDER_SHUFFLED, &t, B, T, 10, err, sizeof err), 0);
    int other[37];
    for (int k = 0; k < NW; k++) {
        sh_sampler_next(&s2, x, y);
        other[k] = x[0] / (B * T);
    }
    assert_memory_not_equal(order[0], other, sizeof other);
    sh_sampler_free(&s2);
    sh_sampler_free(&s);
    sh_data_tokens_free(&t);
}

static void test_data_lists(void **st) {
    (void)st;
    char a[300], b[300], c3[300], spec[700], err[512];
    write_text(in_dir(a, "part_a.txt"), "A%d%d", 3);
    write_text(in_dir(b, "part_b.txt"), "B%d%d", 2);
    write_text(in_dir(c3, "part_c.txt"), "C%d%d", 1);
    sh_tokens t;
    snprintf(spec, sizeof spec, "%s,%s", c3, a);
    assert_int_equal(sh_data_load_list(spec, &t, err, sizeof err), 0);
    assert_int_equal(t.n, 3 + 9);
    assert_int_equal(t.tok[0], 'C');
    assert_int_equal(t.tok[3], 'A');
    sh_data_tokens_free(&t);
    snprintf(spec, sizeof spec, "%s/part_*.txt", DIR_);
    assert_int_equal(sh_data_load_list(spec, &t, err, sizeof err), 0);
    assert_int_equal(t.n, 9 + 6 + 3);
    assert_int_equal(t.tok[0], 'A');
    assert_int_equal(t.tok[9], 'B');
    assert_int_equal(t.tok[15], 'C');
    sh_data_tokens_free(&t);
    snprintf(spec, sizeof spec, "%s,%s/nothing_*.bin", a, DIR_);
    assert_int_equal(sh_data_load_list(spec, &t, err, sizeof err), -1);
    assert_non_null(strstr(err, "nothing_*.bin"));
}

static void test_lr_schedules(void **st) {
    (void)st;
    /* cosine: the formula every earlier run used */
    for (int s = 1; s <= 30; s++) {
        double lr = 1e-3f, mn = lr * 0.1f; /* float settings, double math, as run.c always did */
        double want = s <= 10 ? lr * s / 10
                              : mn + 0.5 * (1.0 + cos(M_PI * (double)(s - 10) / 20)) * (lr - mn);
        assert_true(sh_lr_at(SH_LR_COSINE, 1e-3f, 0.1f, 10, 30, s) == (float)want);
    }
    assert_true(sh_lr_at(SH_LR_CONSTANT, 1e-3f, 0.1f, 10, 30, 5) == 5e-4f);
    assert_true(sh_lr_at(SH_LR_CONSTANT, 1e-3f, 0.1f, 10, 30, 30) == 1e-3f);
    assert_true(fabsf(sh_lr_at(SH_LR_LINEAR, 1e-3f, 0.1f, 10, 30, 20) - 5.5e-4f) < 1e-9f);
    assert_true(fabsf(sh_lr_at(SH_LR_LINEAR, 1e-3f, 0.1f, 10, 30, 30) - 1e-4f) < 1e-9f);
}

static void test_ini_keys(void **st) {
    (void)st;
    char ini[300], err[512];
    FILE *f = fopen(in_dir(ini, "k.ini"), "w");
    assert_non_null(f);
    fprintf(f, "[sample_host]\ndata_order = shuffled\nlr_schedule = constant\n");
    assert_int_equal(fclose(f), 0);
    sh_config c;
    sh_config_defaults(&c);
    assert_int_equal(c.data_order, SH_ORDER_RANDOM);
    assert_int_equal(c.lr_schedule, SH_LR_COSINE);
    assert_int_equal(sh_config_load_ini(&c, ini, err, sizeof err), 0);
    assert_int_equal(c.data_order, SH_ORDER_SHUFFLED);
    assert_int_equal(c.lr_schedule, SH_LR_CONSTANT);
    f = fopen(ini, "w");
    assert_non_null(f);
    fprintf(f, "[sample_host]\nseq = 8\ndata_order = backwards\n");
    assert_int_equal(fclose(f), 0);
    assert_int_equal(sh_config_load_ini(&c, ini, err, sizeof err), -1);
    char where[320];
    snprintf(where, sizeof where, "%s:3:", ini);
    assert_non_null(strstr(err, where));
    assert_non_null(strstr(err, "'data_order' = 'backwards'"));
    char *argv[] = {"sample_host", "--lr-schedule", "linear", "--data-order=sequential",
                    "--val-data", "v.bin", NULL};
    sh_config_defaults(&c);
    assert_int_equal(sh_config_from_args(&c, 6, argv, err, sizeof err), 0);
    assert_int_equal(c.lr_schedule, SH_LR_LINEAR);
    assert_int_equal(c.data_order, SH_ORDER_SEQUENTIAL);
    assert_string_equal(c.val_data, "v.bin");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_first_batch_sequential),
        cmocka_unit_test(test_sequential_windows),
        cmocka_unit_test(test_shuffled_epochs),
        cmocka_unit_test(test_data_lists),
        cmocka_unit_test(test_lr_schedules),
        cmocka_unit_test(test_ini_keys),
    };
    return cmocka_run_group_tests_name("sample_host llm.c data", tests, setup, teardown);
}
