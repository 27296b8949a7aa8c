/*
 * test_sh_formats.c — sample_host file formats and configuration:
 *  - llm.c checkpoint: save -> load gives identical parameters and an identical forward
 *    loss; the file uses llm.c's stacked tensor order; every malformed file (magic,
 *    version, truncated header/body, trailing bytes, bad field, mismatched shape, missing
 *    file) is refused with a sentence naming the file and the field;
 *  - llm.c token shard: round trip (ids above 255 included), detection by magic, and
 *    every malformed shard refused;
 *  - [sample_host] INI section and flags: values, precedence, and file:line errors;
 *  - the built binary exits 1 (not a signal) on a malformed checkpoint.
 */
#include <errno.h>
#include <setjmp.h>
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

#include "sh_ckpt.h"
#include "sh_config.h"
#include "sh_data.h"
#include "sh_gpt.h"
#include "sh_train.h"

static char DIR_[256];

static void path_of(char *out, size_t n, const char *name) {
    snprintf(out, n, "%s/%s", DIR_, name);
}

static int setup(void **st) {
    (void)st;
    snprintf(DIR_, sizeof DIR_, "/tmp/test_sh_formats.XXXXXX");
    return mkdtemp(DIR_) ? 0 : -1;
}

static int teardown(void **st) {
    (void)st;
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", DIR_);
    return system(cmd) == 0 ? 0 : -1;
}

static void write_bytes(const char *path, const void *b, size_t n) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(b, 1, n, f), n);
    assert_int_equal(fclose(f), 0);
}

static unsigned char *read_bytes(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    *n = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *b = malloc(*n + 16);
    assert_non_null(b);
    assert_int_equal(fread(b, 1, *n, f), *n);
    fclose(f);
    return b;
}

static sh_tokens make_text(size_t n, uint64_t seed) {
    sh_tokens t;
    sh_rng r;
    sh_rng_seed(&r, seed, 5);
    t.n = n;
    t.tok = malloc(n * sizeof(uint16_t));
    for (size_t i = 0; i < n; i++) t.tok[i] = (uint16_t)('a' + sh_rng_below(&r, 26));
    return t;
}

static const sh_dims TINY = {.V = 200, .Vp = 0, .maxT = 16, .L = 2, .NH = 2, .C = 8};

static sh_train_opts tiny_opts(const sh_tokens *tr, const sh_tokens *va, const char *load) {
    sh_train_opts o;
    memset(&o, 0, sizeof o);
    o.dims = TINY;
    o.B = 2;
    o.T = 16;
    o.n_micro = 1;
    o.seed = 11;
    o.lr = 3e-3f;
    o.beta1 = 0.9f;
    o.beta2 = 0.95f;
    o.eps = 1e-8f;
    o.weight_decay = 0.1f;
    o.max_grad_norm = 1.0f;
    o.train = tr;
    o.val = va;
    o.load_path = load;
    return o;
}

/* ---- checkpoint ---- */

static void test_ckpt_roundtrip(void **st) {
    (void)st;
    sh_tokens all = make_text(2000, 1), tr_tok, va_tok;
    sh_data_split(&all, &tr_tok, &va_tok);
    char ck[300], err[512];
    path_of(ck, sizeof ck, "a.bin");
    sh_train_opts o = tiny_opts(&tr_tok, &va_tok, NULL);
    sh_trainer *a = NULL, *b = NULL;
    assert_int_equal(sh_trainer_create(&a, &o, err, sizeof err), 0);
    double loss;
    for (int s = 1; s <= 3; s++) assert_int_equal(sh_trainer_step(a, s, 3e-3f, &loss), 0);
    const sh_model *ma = sh_trainer_model(a);
    size_t nf = ma->n_floats;
    float *fa = malloc(nf * 4), *fb = malloc(nf * 4);
    assert_int_equal(sh_trainer_snapshot(a, fa), 0);
    assert_int_equal(sh_ckpt_save(ck, ma, fa, err, sizeof err), 0);

    /* header and llm.c's stacked order: ln1w of layer 0 then layer 1 right after wpe */
    size_t n = 0;
    unsigned char *raw = read_bytes(ck, &n);
    int32_t h[8];
    memcpy(h, raw, sizeof h);
    assert_int_equal(h[0], SH_CKPT_MAGIC);
    assert_int_equal(h[1], SH_CKPT_VERSION);
    assert_int_equal(h[2], 16);
    assert_int_equal(h[3], 200);
    assert_int_equal(h[4], 2);
    assert_int_equal(h[5], 2);
    assert_int_equal(h[6], 8);
    assert_int_equal(h[7], 256);
    size_t C = 8, off = 1024 + 4 * (256 * C + 16 * C);
    assert_memory_equal(raw + off, fa + ma->off[SH_P_LAYER(0, SH_LN1W)], C * 4);
    assert_memory_equal(raw + off + 4 * C, fa + ma->off[SH_P_LAYER(1, SH_LN1W)], C * 4);
    off += 4 * (2 * C + 2 * C); /* ln1w, ln1b stacked */
    assert_memory_equal(raw + off + 4 * 3 * C * C, fa + ma->off[SH_P_LAYER(1, SH_QKVW)],
                        3 * C * C * 4);
    assert_memory_equal(raw + n - 4 * C, fa + ma->off[SH_P_LNFB(2)], C * 4);
    free(raw);

    /* load into a fresh trainer: same params, same forward loss, bit for bit */
    o.load_path = ck;
    assert_int_equal(sh_trainer_create(&b, &o, err, sizeof err), 0);
    assert_int_equal(sh_trainer_snapshot(b, fb), 0);
    assert_memory_equal(fa, fb, nf * 4);
    int32_t inp[32], tgt[32];
    for (int i = 0; i < 32; i++) {
        inp[i] = tr_tok.tok[i];
        tgt[i] = tr_tok.tok[i + 1];
    }
    double la = 0, lb = 0;
    assert_int_equal(sh_trainer_fwdbwd(a, inp, tgt, 0, &la), 0);
    assert_int_equal(sh_trainer_fwdbwd(b, inp, tgt, 0, &lb), 0);
    assert_memory_equal(&la, &lb, sizeof la);
    /* and a trained model differs from the fresh init (the test can fail) */
    sh_trainer *c = NULL;
    o.load_path = NULL;
    assert_int_equal(sh_trainer_create(&c, &o, err, sizeof err), 0);
    double lc = 0;
    assert_int_equal(sh_trainer_fwdbwd(c, inp, tgt, 0, &lc), 0);
    assert_true(lc != la);
    sh_trainer_destroy(a);
    sh_trainer_destroy(b);
    sh_trainer_destroy(c);
    free(fa);
    free(fb);
    sh_data_tokens_free(&all);
}

/* Write a valid checkpoint of TINY, then apply a mutation and expect an error mentioning
 * every string in `want` (NULL-terminated). */
static void expect_bad_ckpt(const char *name, void (*mut)(unsigned char **b, size_t *n),
                            const sh_dims *model_dims, const char *const *want) {
    char ck[300], err[512] = "";
    path_of(ck, sizeof ck, name);
    sh_model m;
    assert_int_equal(sh_model_create(&m, &TINY, err, sizeof err), 0);
    sh_model_init_random(&m, 3);
    assert_int_equal(sh_ckpt_save(ck, &m, m.init, err, sizeof err), 0);
    sh_model_destroy(&m);
    size_t n = 0;
    unsigned char *b = read_bytes(ck, &n);
    mut(&b, &n);
    write_bytes(ck, b, n);
    free(b);
    assert_int_equal(sh_model_create(&m, model_dims, err, sizeof err), 0);
    int rc = sh_ckpt_load(ck, &m, err, sizeof err);
    printf("  %-14s -> %s\n", name, err);
    assert_int_equal(rc, -1);
    assert_non_null(strstr(err, ck)); /* names the file */
    for (int i = 0; want[i]; i++) assert_non_null(strstr(err, want[i]));
    sh_model_destroy(&m);
}

static void m_magic(unsigned char **b, size_t *n) {
    (void)n;
    (*b)[0] ^= 0x55;
}
static void m_version(unsigned char **b, size_t *n) {
    (void)n;
    int32_t v = 5;
    memcpy(*b + 4, &v, 4);
}
static void m_hdr(unsigned char **b, size_t *n) {
    (void)b;
    *n = 100;
}
static void m_body(unsigned char **b, size_t *n) {
    (void)b;
    *n -= 4;
}
static void m_trail(unsigned char **b, size_t *n) {
    (void)b;
    *n += 8;
}
static void m_layers(unsigned char **b, size_t *n) {
    (void)n;
    int32_t v = 0;
    memcpy(*b + 16, &v, 4);
}
static void m_heads(unsigned char **b, size_t *n) {
    (void)n;
    int32_t v = 3;
    memcpy(*b + 20, &v, 4);
}
static void m_none(unsigned char **b, size_t *n) {
    (void)b;
    (void)n;
}
static void m_vp0(unsigned char **b, size_t *n) {
    (void)n;
    int32_t v = 0;
    memcpy(*b + 28, &v, 4);
}

static void test_ckpt_malformed(void **st) {
    (void)st;
    const char *w_magic[] = {"magic", "20240326", NULL};
    const char *w_ver[] = {"version", "bf16", NULL};
    const char *w_hdr[] = {"truncated checkpoint header", NULL};
    const char *w_body[] = {"truncated", "file size", NULL};
    const char *w_trail[] = {"trailing bytes", NULL};
    const char *w_layers[] = {"num_layers", NULL};
    const char *w_heads[] = {"channels", "heads", NULL};
    const char *w_shape[] = {"mismatched shape", "channels", NULL};
    expect_bad_ckpt("magic.bin", m_magic, &TINY, w_magic);
    expect_bad_ckpt("version.bin", m_version, &TINY, w_ver);
    expect_bad_ckpt("header.bin", m_hdr, &TINY, w_hdr);
    expect_bad_ckpt("body.bin", m_body, &TINY, w_body);
    expect_bad_ckpt("trailing.bin", m_trail, &TINY, w_trail);
    expect_bad_ckpt("layers.bin", m_layers, &TINY, w_layers);
    expect_bad_ckpt("heads.bin", m_heads, &TINY, w_heads);
    /* Vp = 0 is never the saved model's (sh_model_dims_check's "0 = derive from V" is for
     * a fresh model only): refused, naming the field */
    const char *w_vp0[] = {"padded_vocab_size", NULL};
    expect_bad_ckpt("vp0.bin", m_vp0, &TINY, w_vp0);
    sh_dims other = TINY;
    other.C = 16;
    expect_bad_ckpt("shape.bin", m_none, &other, w_shape);
    /* missing file */
    sh_dims d;
    char err[512];
    assert_int_equal(sh_ckpt_read_header("/nonexistent/x.bin", &d, err, sizeof err), -1);
    assert_non_null(strstr(err, "cannot open checkpoint /nonexistent/x.bin"));
}

/* ---- shards ---- */

static void test_shard_roundtrip(void **st) {
    (void)st;
    char p[300], err[512];
    path_of(p, sizeof p, "s.bin");
    uint16_t tok[1000];
    for (int i = 0; i < 1000; i++) tok[i] = (uint16_t)((i * 7919) % 50257);
    assert_int_equal(sh_data_write_shard(p, tok, 1000, err, sizeof err), 0);
    size_t n = 0;
    unsigned char *raw = read_bytes(p, &n);
    assert_int_equal(n, 1024 + 2000);
    int32_t h[3];
    memcpy(h, raw, sizeof h);
    assert_int_equal(h[0], SH_SHARD_MAGIC);
    assert_int_equal(h[1], 1);
    assert_int_equal(h[2], 1000);
    free(raw);
    sh_tokens t;
    assert_int_equal(sh_data_read_shard(p, &t, err, sizeof err), 0);
    assert_int_equal(t.n, 1000);
    assert_memory_equal(t.tok, tok, sizeof tok);
    sh_data_tokens_free(&t);
    assert_int_equal(sh_data_load(p, &t, err, sizeof err), 0); /* detected by magic */
    assert_memory_equal(t.tok, tok, sizeof tok);
    int mx = 0;
    for (int i = 0; i < 1000; i++) mx = tok[i] > mx ? tok[i] : mx;
    assert_int_equal(sh_data_tokens_vocab(&t), mx + 1);
    sh_data_tokens_free(&t);
    /* text: bytes become tokens */
    path_of(p, sizeof p, "t.txt");
    write_bytes(p, "hello\xff", 6);
    assert_int_equal(sh_data_load(p, &t, err, sizeof err), 0);
    assert_int_equal(t.n, 6);
    assert_int_equal(t.tok[0], 'h');
    assert_int_equal(t.tok[5], 255);
    sh_data_tokens_free(&t);
}

static void bad_shard(const char *name, const void *b, size_t n, const char *want) {
    char p[300], err[512] = "";
    path_of(p, sizeof p, name);
    write_bytes(p, b, n);
    sh_tokens t;
    int rc = sh_data_read_shard(p, &t, err, sizeof err);
    printf("  %-14s -> %s\n", name, err);
    assert_int_equal(rc, -1);
    assert_non_null(strstr(err, p));
    assert_non_null(strstr(err, want));
}

static void test_shard_malformed(void **st) {
    (void)st;
    unsigned char b[1024 + 32] = {0};
    int32_t h[3] = {SH_SHARD_MAGIC, 1, 10};
    memcpy(b, h, sizeof h);
    bad_shard("sh_hdr.bin", b, 500, "truncated shard header");
    bad_shard("sh_body.bin", b, 1024 + 19, "truncated");
    bad_shard("sh_trail.bin", b, 1024 + 22, "trailing bytes"); /* 10 tokens = 20 bytes */
    int32_t h2[3] = {SH_SHARD_MAGIC, 2, 10};
    memcpy(b, h2, sizeof h2);
    bad_shard("sh_ver.bin", b, 1024 + 20, "version");
    int32_t h3[3] = {1234, 1, 10};
    memcpy(b, h3, sizeof h3);
    bad_shard("sh_magic.bin", b, 1024 + 20, "magic");
    int32_t h4[3] = {SH_SHARD_MAGIC_U32, 7, 10};
    memcpy(b, h4, sizeof h4);
    bad_shard("sh_u32.bin", b, 1024 + 20, "uint32");
    int32_t h5[3] = {SH_SHARD_MAGIC, 1, -4};
    memcpy(b, h5, sizeof h5);
    bad_shard("sh_neg.bin", b, 1024 + 20, "negative");
    /* a shard whose magic is wrong is not text: sh_data_load (which takes text or
     * shards, alone or in a comma list) refuses it instead of training on its bytes */
    char p[300], q[300], spec[700], err[512] = "";
    sh_tokens t;
    memcpy(b, h3, sizeof h3);
    path_of(p, sizeof p, "sh_magic_any.dat");   /* not named .bin: the header says shard */
    write_bytes(p, b, 1024 + 20);
    assert_int_equal(sh_data_load(p, &t, err, sizeof err), -1);
    printf("  %-14s -> %s\n", "sh_magic_any", err);
    assert_non_null(strstr(err, "magic is 1234"));
    path_of(q, sizeof q, "plain.txt");
    write_bytes(q, "hello", 5);
    snprintf(spec, sizeof spec, "%s,%s", q, p);
    err[0] = '\0';
    assert_int_equal(sh_data_load_list(spec, &t, err, sizeof err), -1);
    assert_non_null(strstr(err, "magic is 1234"));
    /* a .bin file whose first bytes are not a shard's header at all */
    path_of(p, sizeof p, "junk.bin");
    write_bytes(p, "not a shard, not text either", 28);
    err[0] = '\0';
    assert_int_equal(sh_data_load(p, &t, err, sizeof err), -1);
    printf("  %-14s -> %s\n", "junk.bin", err);
    assert_non_null(strstr(err, ".bin"));
}

/* ---- config ---- */

static void test_config(void **st) {
    (void)st;
    char p[300], err[512];
    path_of(p, sizeof p, "c.ini");
    const char *ini = "[memory]\ndevice_capacity = 1GiB\n"
                      "[sample_host]\nlayers = 3\nchannels = 48\nlr = 0.002\nseed = 99\n"
                      "optimizer = ini\nprogress = off\ndata = corpus.txt\n";
    write_bytes(p, ini, strlen(ini));
    sh_config c;
    sh_config_defaults(&c);
    char a0[] = "sh", a1[] = "--config", a3[] = "--layers=5", a4[] = "--lr", a5[] = "0.01",
         a6[] = "--no-plugin";
    char *argv[] = {a0, a1, p, a3, a4, a5, a6};
    assert_int_equal(sh_config_from_args(&c, 7, argv, err, sizeof err), 0);
    assert_int_equal(c.layers, 5);          /* flag beats INI */
    assert_int_equal(c.channels, 48);       /* INI beats default */
    assert_float_equal(c.lr, 0.01f, 0);
    assert_int_equal(c.seed, 99);
    assert_int_equal(c.optim_from_ini, 1);
    assert_int_equal(c.progress, 0);
    assert_string_equal(c.data, "corpus.txt");
    assert_int_equal(c.no_plugin, 1);
    assert_true(c.cli_dims & SH_SET_LAYERS);
    assert_false(c.cli_dims & SH_SET_CHANNELS);

    struct {
        const char *ini, *want;
    } bad[] = {
        {"[sample_host]\nlayers = 2\nlayrs = 3\n", ":3: unknown key 'layrs'"},
        {"[sample_host]\nlayers = 2\n\nlayers = 3\n", ":4: duplicate key 'layers'"},
        {"[sample_host]\nlr = fast\n", ":2: 'lr' = 'fast' is not a number"},
        {"[sample_host]\nheads = 0\n", ":2: 'heads' = '0' is not an integer in [1, 4096]"},
        {"[sample_host]\nprogress = maybe\n", ":2: 'progress' = 'maybe' must be auto"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        write_bytes(p, bad[i].ini, strlen(bad[i].ini));
        sh_config_defaults(&c);
        assert_int_equal(sh_config_load_ini(&c, p, err, sizeof err), -1);
        printf("  ini -> %s\n", err);
        assert_non_null(strstr(err, p));
        assert_non_null(strstr(err, bad[i].want));
    }
    /* a line longer than the INI reader's buffer is refused with its own line
     * number (the reader would keep only its first 198 characters) */
    {
        char longini[512];
        int n = snprintf(longini, sizeof longini, "[sample_host]\nlayers = 2\nmetrics = /tmp/");
        memset(longini + n, 'a', 300);
        snprintf(longini + n + 300, sizeof longini - (size_t)n - 300, "\nlayrs = 3\n");
        write_bytes(p, longini, strlen(longini));
        sh_config_defaults(&c);
        assert_int_equal(sh_config_load_ini(&c, p, err, sizeof err), -1);
        printf("  ini -> %s\n", err);
        assert_non_null(strstr(err, ":3: line longer than"));
        /* 198 characters still fit */
        n = snprintf(longini, sizeof longini, "[sample_host]\nmetrics = ");
        memset(longini + n, 'b', 198 - (size_t)n + 14);
        longini[14 + 198] = '\n';
        longini[14 + 199] = '\0';
        write_bytes(p, longini, strlen(longini));
        sh_config_defaults(&c);
        assert_int_equal(sh_config_load_ini(&c, p, err, sizeof err), 0);
        assert_int_equal(strlen(c.metrics), 198 - 10);
    }
    /* a FIFO (opening it would wait for a writer) and /dev/zero (reading it never
     * ends) are refused before anything opens them */
    {
        char fifo[320];
        snprintf(fifo, sizeof fifo, "%s.fifo", p);
        assert_int_equal(mkfifo(fifo, 0600), 0);
        sh_config_defaults(&c);
        assert_int_equal(sh_config_load_ini(&c, fifo, err, sizeof err), -1);
        assert_non_null(strstr(err, "it is not a regular file (a FIFO)"));
        unlink(fifo);
        assert_int_equal(sh_config_load_ini(&c, "/dev/zero", err, sizeof err), -1);
        assert_non_null(strstr(err, "/dev/zero: it is not a regular file (a device)"));
    }
    sh_config_defaults(&c);
    char b1[] = "--bogus";
    char *argv2[] = {a0, b1};
    assert_int_equal(sh_config_from_args(&c, 2, argv2, err, sizeof err), -1);
    assert_non_null(strstr(err, "--bogus"));
    char b2[] = "--steps";
    char *argv3[] = {a0, b2};
    assert_int_equal(sh_config_from_args(&c, 2, argv3, err, sizeof err), -1);
    assert_non_null(strstr(err, "needs a value"));
}

/* ---- the binary: a malformed checkpoint is an exit code, not a crash ---- */

static void test_binary_exit(void **st) {
    (void)st;
    const char *b = getenv("PT_BUILD");
    char exe[512], ck[300], cmd[1400], log[300];
    snprintf(exe, sizeof exe, "%s/sample_host", b ? b : "build");
    if (access(exe, X_OK) != 0) {
        printf("  %s not built: skipped\n", exe);
        skip();
    }
    path_of(ck, sizeof ck, "bad.bin");
    path_of(log, sizeof log, "bad.log");
    write_bytes(ck, "not a checkpoint at all", 23);
    snprintf(cmd, sizeof cmd, "'%s' --no-plugin --load '%s' --steps 1 --quiet > '%s' 2>&1", exe,
             ck, log);
    int rc = system(cmd);
    assert_true(WIFEXITED(rc));
    assert_int_equal(WEXITSTATUS(rc), 1);
    size_t n = 0;
    unsigned char *out = read_bytes(log, &n);
    out[n] = '\0';
    assert_non_null(strstr((char *)out, "truncated checkpoint header"));
    free(out);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ckpt_roundtrip),
        cmocka_unit_test(test_ckpt_malformed),
        cmocka_unit_test(test_shard_roundtrip),
        cmocka_unit_test(test_shard_malformed),
        cmocka_unit_test(test_config),
        cmocka_unit_test(test_binary_exit),
    };
    return cmocka_run_group_tests_name("sample_host formats", tests, setup, teardown);
}
