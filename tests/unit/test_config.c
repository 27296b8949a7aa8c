/*
 * test_config.c — plugin INI configuration: every value form, every error path
 * with its exact file:line message, env variables, dump round trip, and that
 * conf/default.ini, conf/example-offload.ini and conf/CONFIG.md match the schema.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "config.h"
#include "protrain.h"

static char err[1024];

static int parse(const char *text, pt_config *c) {
    err[0] = '\0';
    return pt_config_parse_string(text, "t.ini", c, err, sizeof(err));
}

/* Parses text, expects PT_ERR_CONFIG and exactly msg; the config must be untouched. */
static void expect_err(const char *text, const char *msg) {
    pt_config c;
    pt_config_defaults(&c);
    c.lr = 123.0f; /* sentinel: a failed parse leaves *c as it was */
    int rc = parse(text, &c);
    if (rc != PT_ERR_CONFIG || strcmp(err, msg))
        print_error("text:\n%s\nwant: %s\ngot (%d): %s\n", text, msg, rc, err);
    assert_int_equal(rc, PT_ERR_CONFIG);
    assert_string_equal(err, msg);
    assert_true(c.lr == 123.0f);
}

static void expect_err_has(const char *text, const char *part) {
    pt_config c;
    assert_int_equal(parse(text, &c), PT_ERR_CONFIG);
    if (!strstr(err, part)) print_error("want substring: %s\ngot: %s\n", part, err);
    assert_non_null(strstr(err, part));
}

/* ---- defaults ---- */

static void test_defaults(void **s) {
    (void)s;
    pt_config c;
    pt_config_defaults(&c);
    assert_int_equal(c.log_level, PT_LOG_INFO);
    assert_string_equal(c.backend, "auto");
    assert_true(c.device_capacity == 0 && c.reserve == 0 && c.pinned_budget == 0);
    assert_true(c.auto_memory == 1 && c.auto_mode == 1 && c.force_all_persistent == 0);
    assert_int_equal(c.zero3_shard, -1);
    assert_true(c.n_persist == -1 && c.n_buffer == -1 && c.n_swap == -1 && c.n_checkpoint == -1);
    assert_true(c.chunk_size == 0 && c.cache_dir[0] == 0 && c.plan_file[0] == 0);
    assert_int_equal(c.optim_type, PT_OPTIM_ADAMW);
    assert_true(c.lr == 3e-4f && c.beta1 == 0.9f && isnan(c.beta2) && c.eps == 1e-8f && c.rekls_wd_method == 0);
    assert_true(isnan(c.weight_decay) && c.max_grad_norm == 0.0f && c.cpu_threads == 0);
    assert_true(c.rekls_seed_shampoo == 0 && c.rekls_shampoo_beta == 0.95f && c.rekls_eps == 1e-8f);
    assert_true(c.osft_enabled == 0 && c.osft_urr == 0.25f);
    assert_string_equal(c.osft_targets, "attn,mlp");
    assert_true(c.tiled_mlp_enabled == 0 && c.tiled_mlp_tiles == 0);
    assert_string_equal(c.dist_backend, "auto");
    assert_string_equal(c.init_method, "env");
    assert_true(c.copy_bandwidth == 0.0 && c.poison == 1 && c.fail_alloc_at == 0);
    assert_string_equal(c.source, "(defaults)");
}

/* Every row's default text parses through pt_config_set (so the defaults are
 * exactly what the table says) and no two rows share a section+key. */
static void test_schema_rows(void **s) {
    (void)s;
    size_t n;
    const pt_config_key *k = pt_config_schema(&n);
    assert_true(n >= 38);
    for (size_t i = 0; i < n; i++) {
        pt_config c;
        pt_config_defaults(&c);
        if (pt_config_set(&c, k[i].section, k[i].key, k[i].def, err, sizeof(err)))
            print_error("[%s] %s default '%s': %s\n", k[i].section, k[i].key, k[i].def, err);
        assert_int_equal(pt_config_set(&c, k[i].section, k[i].key, k[i].def, err, sizeof(err)), 0);
        assert_true(k[i].help && strlen(k[i].help) > 10);
        for (size_t j = 0; j < i; j++)
            assert_false(!strcmp(k[i].section, k[j].section) && !strcmp(k[i].key, k[j].key));
    }
}

/* ---- sizes and rates ---- */

static void test_parse_size(void **s) {
    (void)s;
    static const struct {
        const char *in;
        uint64_t want;
    } ok[] = {
        {"4096", 4096},
        {"64MiB", 64ull << 20},
        {"1.5 GiB", 3ull << 29},
        {"2GB", 2000000000ull},
        {"0", 0},
        {"1kib", 1024},
        {" 7 B ", 7},
        {"0.5KB", 500},
        {"1.1KiB", 1126}, /* 1126.4 rounds down */
        {"3TiB", 3ull << 40},
        {"1.25tb", 1250000000000ull},
        {"18446744073709551615", UINT64_MAX},
        {"0.000000001GB", 1},
    };
    for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
        uint64_t v = 12345;
        assert_int_equal(pt_parse_size(ok[i].in, &v), 0);
        if (v != ok[i].want) print_error("%s -> %llu\n", ok[i].in, (unsigned long long)v);
        assert_true(v == ok[i].want);
    }
    static const char *const bad[] = {"-1", "", "abc", "1.", ".5",
                                      "12 XB", "1e3", "1,000", "1.5.2", "18446744073709551616",
                                      "17000000TiB", "16777216TiB", "5 MiB/s", "auto", "+3"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        uint64_t v = 7;
        if (!pt_parse_size(bad[i], &v)) print_error("accepted '%s'\n", bad[i]);
        assert_int_equal(pt_parse_size(bad[i], &v), PT_ERR_CONFIG);
        assert_true(v == 7);
    }
}

static void test_parse_rate(void **s) {
    (void)s;
    double v;
    assert_int_equal(pt_parse_rate("0", &v), 0), assert_true(v == 0);
    assert_int_equal(pt_parse_rate("12GiB/s", &v), 0), assert_true(v == 12.0 * 1073741824.0);
    assert_int_equal(pt_parse_rate("800 MB/s", &v), 0), assert_true(v == 8e8);
    assert_int_equal(pt_parse_rate("1e9", &v), 0), assert_true(v == 1e9);
    assert_int_equal(pt_parse_rate("1.5kib/S", &v), 0), assert_true(v == 1536);
    assert_int_equal(pt_parse_rate("100B/s", &v), 0), assert_true(v == 100);
    assert_int_equal(pt_parse_rate("2PB/s", &v), 0), assert_true(v == 2e15);
    assert_int_equal(pt_parse_rate("1 pib/s", &v), 0), assert_true(v == 1125899906842624.0);
    static const char *const bad[] = {"12GiB", "-1", "fast", "inf", "nan", "", "1 XB/s", "/s",
                                      "1PB"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        assert_int_equal(pt_parse_rate(bad[i], &v), PT_ERR_CONFIG);
}

static void test_parse_duration(void **s) {
    (void)s;
    double v;
    assert_int_equal(pt_parse_duration("0", &v), 0), assert_true(v == 0);
    assert_int_equal(pt_parse_duration("2ms", &v), 0), assert_true(v == 2e-3);
    assert_int_equal(pt_parse_duration("300 us", &v), 0), assert_true(v == 300 * 1e-6);
    assert_int_equal(pt_parse_duration("0.25S", &v), 0), assert_true(v == 0.25);
    assert_int_equal(pt_parse_duration("5ns", &v), 0), assert_true(v == 5 * 1e-9);
    /* no unit: seconds, the one duration syntax of every key */
    assert_int_equal(pt_parse_duration("5", &v), 0), assert_true(v == 5.0);
    assert_int_equal(pt_parse_duration(" 10 s ", &v), 0), assert_true(v == 10.0);
    static const char *const bad[] = {"2 min", "-1ms", "inf", "ms", "", "1e400s", "5 m", "1s2"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        assert_int_equal(pt_parse_duration(bad[i], &v), PT_ERR_CONFIG);
    /* the key's range: at most 1 s, named in the error */
    pt_config c;
    char err[512];
    assert_int_equal(pt_config_parse_string("[testing]\ncompute_jitter = 2s\n", "j.ini", &c,
                                            err, sizeof err),
                     PT_ERR_CONFIG);
    assert_non_null(strstr(err, "j.ini:2"));
    assert_non_null(strstr(err, "compute_jitter"));
    assert_int_equal(pt_config_parse_string("[testing]\ncompute_jitter = 250us\n", "j.ini",
                                            &c, err, sizeof err),
                     0);
    assert_true(c.compute_jitter == 250 * 1e-6);
    /* [dist] timeout takes the same syntax as every other duration */
    static const struct {
        const char *v;
        double want;
    } to[] = {
        {"10 s", 10.0}, {"10s", 10.0}, {"300", 300.0}, {"2ms", 2e-3}, {"1.5 S", 1.5}};
    for (size_t i = 0; i < sizeof to / sizeof to[0]; i++) {
        char text[64];
        snprintf(text, sizeof text, "[dist]\ntimeout = %s\n", to[i].v);
        if (pt_config_parse_string(text, "d.ini", &c, err, sizeof err))
            print_error("timeout = %s: %s\n", to[i].v, err);
        assert_int_equal(pt_config_parse_string(text, "d.ini", &c, err, sizeof err), 0);
        assert_true(c.dist_timeout == to[i].want);
    }
    /* > 0: a zero timeout would fail every collective at once */
    static const char *const tbad[] = {"0", "0s", "-1s", "10 min", "soon"};
    for (size_t i = 0; i < sizeof tbad / sizeof tbad[0]; i++) {
        char text[64];
        snprintf(text, sizeof text, "[dist]\ntimeout = %s\n", tbad[i]);
        assert_int_equal(pt_config_parse_string(text, "d.ini", &c, err, sizeof err),
                         PT_ERR_CONFIG);
        assert_non_null(strstr(err, "d.ini:2"));
        assert_non_null(strstr(err, "a duration > 0s"));
    }
    /* the default reads back through the dump */
    pt_config_defaults(&c);
    assert_true(c.dist_timeout == 300.0);
}

/* ---- every key, non-default values ---- */

static const char full_ini[] =
    "[plugin]\nlog_level = debug\nbackend = host\n"
    "[memory]\ndevice_capacity = 48MiB\nreserve = 1MiB\npinned_budget = 2GiB\n"
    "extra_headroom = 512KiB\n"
    "[protrain]\nauto_memory = off\nauto_mode = no\nforce_all_persistent = yes\n"
    "zero3_shard = on\nn_persist = 3\nn_buffer = 2\nn_swap = 1\nn_checkpoint = 0\n"
    "chunk_size = 4MiB\ncache_dir = /tmp/pt cache\nplan_file = \"/tmp/plan.json\"\n"
    "[optimizer]\ntype = rekls\nlr = 1e-3\nbeta1 = 0\nbeta2 = 0.95\neps = 1e-6\n"
    "weight_decay = 0.1\nmax_grad_norm = 1.0\ncpu_threads = 2\nrekls_seed_shampoo = true\n"
    "rekls_shampoo_beta = 0.9\nrekls_eps = 1e-10\nrekls_weight_decay_method = L2\n"
    "[osft]\nenabled = 1\nunfreeze_rank_ratio = 1\ntargets = attn , mlp,  c_fc\n"
    "[tiled_mlp]\nenabled = on\ntiles = 4\n"
    "[dist]\nbackend = mpi\ninit_method = file:///tmp/rdzv\n"
    "[host_backend]\ncopy_bandwidth = 2GiB/s\npoison = false\n[testing]\nfail_alloc_at = 7\n";

static void check_full(const pt_config *c) {
    assert_int_equal(c->log_level, PT_LOG_DEBUG);
    assert_string_equal(c->backend, "host");
    assert_true(c->device_capacity == 48ull << 20 && c->reserve == 1ull << 20);
    assert_true(c->pinned_budget == 2ull << 30 && c->extra_headroom == 512ull << 10);
    assert_true(c->auto_memory == 0 && c->auto_mode == 0 && c->force_all_persistent == 1);
    assert_int_equal(c->zero3_shard, 1);
    assert_true(c->n_persist == 3 && c->n_buffer == 2 && c->n_swap == 1 && c->n_checkpoint == 0);
    assert_true(c->chunk_size == 4ull << 20);
    assert_string_equal(c->cache_dir, "/tmp/pt cache");
    assert_string_equal(c->plan_file, "/tmp/plan.json"); /* quotes removed */
    assert_int_equal(c->optim_type, PT_OPTIM_REKLS);
    assert_true(c->lr == 1e-3f && c->beta1 == 0.0f && c->beta2 == 0.95f && c->eps == 1e-6f);
    assert_true(c->weight_decay == 0.1f && c->max_grad_norm == 1.0f && c->cpu_threads == 2);
    assert_true(c->rekls_seed_shampoo == 1 && c->rekls_shampoo_beta == 0.9f);
    assert_true(c->rekls_eps == 1e-10f && c->rekls_wd_method == 2);
    assert_true(c->osft_enabled == 1 && c->osft_urr == 1.0f);
    assert_string_equal(c->osft_targets, "attn,mlp,c_fc"); /* normalised */
    assert_true(c->tiled_mlp_enabled == 1 && c->tiled_mlp_tiles == 4);
    assert_string_equal(c->dist_backend, "mpi");
    assert_string_equal(c->init_method, "file:///tmp/rdzv");
    assert_true(c->copy_bandwidth == 2.0 * 1073741824.0 && c->poison == 0);
    assert_int_equal(c->fail_alloc_at, 7);
}

static void test_every_key(void **s) {
    (void)s;
    pt_config c;
    unsetenv("PROTRAIN_LOG_LEVEL");
    assert_int_equal(parse(full_ini, &c), 0);
    check_full(&c);
    assert_string_equal(c.source, "t.ini");
}

/* dump -> parse gives the same values, and the dump is stable. */
static void test_dump_roundtrip(void **s) {
    (void)s;
    pt_config a, b, d;
    static char t1[PT_CONFIG_DUMP_MAX], t2[PT_CONFIG_DUMP_MAX];
    assert_int_equal(parse(full_ini, &a), 0);
    assert_int_equal(pt_config_dump(&a, t1, sizeof(t1)), 0);
    assert_int_equal(parse(t1, &b), 0);
    check_full(&b);
    assert_int_equal(pt_config_dump(&b, t2, sizeof(t2)), 0);
    /* first line names the source, which differs; the rest must match */
    assert_string_equal(strchr(t1, '\n'), strchr(t2, '\n'));
    assert_non_null(strstr(t1, "device_capacity = 48MiB\n"));
    assert_non_null(strstr(t1, "copy_bandwidth = 2GiB/s\n"));
    assert_non_null(strstr(t1, "lr = 0.001\n"));
    /* defaults round trip too (auto forms) */
    pt_config_defaults(&d);
    assert_int_equal(pt_config_dump(&d, t1, sizeof(t1)), 0);
    assert_non_null(strstr(t1, "n_persist = auto\n"));
    assert_non_null(strstr(t1, "zero3_shard = auto\n"));
    assert_non_null(strstr(t1, "beta2 = auto\n"));
    assert_non_null(strstr(t1, "weight_decay = auto\n"));
    assert_int_equal(parse(t1, &b), 0);
    assert_true(isnan(b.beta2) && isnan(b.weight_decay));
    assert_int_equal(pt_config_dump(&b, t2, sizeof(t2)), 0);
    assert_string_equal(strchr(t1, '\n'), strchr(t2, '\n'));
    /* odd values: a rate that is no power-of-two multiple, a size of plain bytes */
    assert_int_equal(parse("[host_backend]\ncopy_bandwidth = 123.25MB/s\n[memory]\nreserve = 1000\n", &a), 0);
    assert_int_equal(pt_config_dump(&a, t1, sizeof(t1)), 0);
    assert_int_equal(parse(t1, &b), 0);
    assert_true(b.copy_bandwidth == a.copy_bandwidth && b.reserve == 1000);
    /* too small: error, NUL-terminated prefix */
    char small[40];
    assert_int_equal(pt_config_dump(&a, small, sizeof(small)), PT_ERR_INVALID_ARG);
    assert_true(strlen(small) < sizeof(small));
}

static void test_bools_and_autos(void **s) {
    (void)s;
    static const char *const t[] = {"true", "on", "yes", "1", "TRUE", "Yes"};
    static const char *const f[] = {"false", "off", "no", "0", "False", "OFF"};
    char buf[128];
    pt_config c;
    for (int i = 0; i < 6; i++) {
        snprintf(buf, sizeof(buf), "[host_backend]\npoison = %s\n[protrain]\nauto_mode = %s\n", f[i], t[i]);
        assert_int_equal(parse(buf, &c), 0);
        assert_true(c.poison == 0 && c.auto_mode == 1);
    }
    assert_int_equal(parse("[protrain]\nn_persist = auto\nn_buffer = 0\nzero3_shard = off\n"
                           "chunk_size = auto\n[memory]\ndevice_capacity = AUTO\n"
                           "pinned_budget = 0\n[tiled_mlp]\ntiles = auto\n"
                           "[optimizer]\ncpu_threads = 0\n",
                           &c),
                     0);
    assert_true(c.n_persist == -1 && c.n_buffer == 0 && c.zero3_shard == 0 && c.chunk_size == 0);
    assert_true(c.device_capacity == 0 && c.pinned_budget == 0 && c.tiled_mlp_tiles == 0);
    assert_int_equal(c.cpu_threads, 0);
    /* a float key with auto: NaN means "absent", decided later by the runtime */
    assert_int_equal(parse("[optimizer]\nbeta2 = AUTO\n", &c), 0);
    assert_true(isnan(c.beta2));
    assert_int_equal(parse("[optimizer]\nbeta2 = 0.999\n", &c), 0);
    assert_true(c.beta2 == 0.999f);
    assert_int_equal(parse("[protrain]\nzero3_shard = auto\n[plugin]\nlog_level = WARN\n", &c), 0);
    assert_true(c.zero3_shard == -1 && c.log_level == PT_LOG_WARN);
    assert_int_equal(parse("[plugin]\nbackend = CUDA\n", &c), 0);
    assert_string_equal(c.backend, "cuda"); /* canonical spelling */
}

/* ---- syntax: comments, indentation, CRLF, BOM, skipped host sections ---- */

static void test_syntax_forms(void **s) {
    (void)s;
    pt_config c;
    assert_int_equal(parse("; comment\n# comment\n\n[optimizer]   ; trailing\n"
                           "  lr = 1e-3 ; inline\n\tbeta1 = 0.8\n    [ memory ]\n reserve=1KiB\n"
                           "[optimizer]\neps : 1e-7\n",
                           &c),
                     0);
    /* indented lines are separate keys, not continuations of lr */
    assert_true(c.lr == 1e-3f && c.beta1 == 0.8f && c.reserve == 1024 && c.eps == 1e-7f);
    assert_int_equal(parse("\xEF\xBB\xBF[optimizer]\r\nlr = 2e-3\r\n\r\nbeta2 = 0.9\r\n", &c), 0);
    assert_true(c.lr == 2e-3f && c.beta2 == 0.9f);
    /* CRLF does not shift line numbers */
    expect_err("[optimizer]\r\nlr = 1\r\nbeta2 = 2\r\n",
               "t.ini:3: bad value '2' for key 'beta2' in [optimizer]: expected auto or a float in [0, 1)");
    /* host sections: anything goes inside, known sections resume after */
    assert_int_equal(parse("[sample_host]\nlr = abc\nmodel = gpt2\nmodel = twice\n"
                           "[host.data]\nwhatever = 1\n[optimizer]\nlr = 5e-4\n",
                           &c),
                     0);
    assert_true(c.lr == 5e-4f);
    /* an empty file is all defaults */
    assert_int_equal(parse("", &c), 0);
    assert_true(c.lr == 3e-4f);
}

/* ---- error messages ---- */

static void test_unknown_names(void **s) {
    (void)s;
    expect_err("[plugin]\nlog_level = info\n[memry]\nreserve = 0\n",
               "t.ini:3: unknown section [memry]; did you mean [memory]?");
    /* an empty misspelt section is still found, at its header line */
    expect_err("[optimizer]\nlr = 1e-3\n\n[optimiser]\n",
               "t.ini:4: unknown section [optimiser]; did you mean [optimizer]?");
    expect_err_has("[trainer]\nx = 1\n", "t.ini:1: unknown section [trainer]; valid sections are "
                                         "[plugin], [memory], [protrain]");
    expect_err_has("[]\n", "t.ini:1: unknown section []");
    expect_err("[optimizer]\nlr = 1e-3\n\n[protrain]\nn_persit = 2\n",
               "t.ini:5: unknown key 'n_persit' in [protrain]; did you mean 'n_persist'?");
    expect_err("[optimizer]\nLR = 1e-3\n",
               "t.ini:2: unknown key 'LR' in [optimizer]; did you mean 'lr'?");
    /* too far from every key: list them */
    expect_err("[tiled_mlp]\nnumber_of_tiles = 3\n",
               "t.ini:2: unknown key 'number_of_tiles' in [tiled_mlp]; valid keys in [tiled_mlp] "
               "are enabled, tiles");
    expect_err("[memory]\nlr = 1e-3\n", "t.ini:2: unknown key 'lr' in [memory]; 'lr' belongs in [optimizer]");
    expect_err("lr = 1e-3\n[optimizer]\n",
               "t.ini:1: key 'lr' is outside any section; put it under [optimizer]");
}

static void test_bad_values(void **s) {
    (void)s;
    expect_err("[plugin]\nbackend = host\n\n\n\n\n\n\n\n\n\n\n\n\n[optimizer]\nlr = abc\n",
               "t.ini:16: bad value 'abc' for key 'lr' in [optimizer]: expected a float > 0");
    static const struct {
        const char *ini, *msg;
    } cases[] = {
        {"[optimizer]\nbeta1 = 1\n", "t.ini:2: bad value '1' for key 'beta1' in [optimizer]: expected a float in [0, 1)"},
        {"[optimizer]\nbeta2 = -0.1\n", "t.ini:2: bad value '-0.1' for key 'beta2' in [optimizer]: expected auto or a float in [0, 1)"},
        {"[optimizer]\neps = 0\n", "t.ini:2: bad value '0' for key 'eps' in [optimizer]: expected a float > 0"},
        {"[optimizer]\nlr = 1e39\n", "t.ini:2: bad value '1e39' for key 'lr' in [optimizer]: expected a float > 0"},
        {"[optimizer]\nlr = nan\n", "t.ini:2: bad value 'nan' for key 'lr' in [optimizer]: expected a float > 0"},
        {"[optimizer]\nlr =\n", "t.ini:2: bad value '' for key 'lr' in [optimizer]: expected a float > 0"},
        {"[optimizer]\nlr = 1e-3x\n", "t.ini:2: bad value '1e-3x' for key 'lr' in [optimizer]: expected a float > 0"},
        {"[optimizer]\nweight_decay = -1\n", "t.ini:2: bad value '-1' for key 'weight_decay' in [optimizer]: expected auto or a float >= 0"},
        {"[optimizer]\ntype = sgd\n", "t.ini:2: bad value 'sgd' for key 'type' in [optimizer]: expected one of adamw|rekls"},
        {"[optimizer]\ntype = rekls\n\nrekls_weight_decay_method = adamw\n", "t.ini:4: bad value 'adamw' for key 'rekls_weight_decay_method' in [optimizer]: expected one of decoupled|independent|l2|palm"},
        {"[optimizer]\nbeta2 = automatic\n", "t.ini:2: bad value 'automatic' for key 'beta2' in [optimizer]: expected auto or a float in [0, 1)"},
        {"[optimizer]\ncpu_threads = 5000\n", "t.ini:2: bad value '5000' for key 'cpu_threads' in [optimizer]: expected auto or an integer in [0, 1024]"},
        {"[plugin]\nlog_level = verbose\n", "t.ini:2: bad value 'verbose' for key 'log_level' in [plugin]: expected one of error|warn|info|debug|trace"},
        {"[plugin]\nbackend = rocm\n", "t.ini:2: bad value 'rocm' for key 'backend' in [plugin]: expected one of auto|cuda|host"},
        {"[memory]\ndevice_capacity = lots\n", "t.ini:2: bad value 'lots' for key 'device_capacity' in [memory]: expected auto or a size like 512MiB"},
        {"[memory]\nreserve = auto\n", "t.ini:2: bad value 'auto' for key 'reserve' in [memory]: expected a size like 512MiB"},
        {"[memory]\nreserve = -5MiB\n", "t.ini:2: bad value '-5MiB' for key 'reserve' in [memory]: expected a size like 512MiB"},
        {"[host_backend]\npoison = maybe\n", "t.ini:2: bad value 'maybe' for key 'poison' in [host_backend]: expected true|false|on|off|yes|no|1|0"},
        {"[testing]\nfail_alloc_at = -1\n", "t.ini:2: bad value '-1' for key 'fail_alloc_at' in [testing]: expected an integer >= 0"},
        {"[host_backend]\ncopy_bandwidth = 2GiB\n", "t.ini:2: bad value '2GiB' for key 'copy_bandwidth' in [host_backend]: expected 0 or a rate like 2GiB/s, from 1MB/s (1e+06 B/s) to 1PB/s (1e+15 B/s)"},
        {"[protrain]\nn_persist = -1\n", "t.ini:2: bad value '-1' for key 'n_persist' in [protrain]: expected auto or an integer >= 0"},
        {"[protrain]\nn_swap = 99999999999\n", "t.ini:2: bad value '99999999999' for key 'n_swap' in [protrain]: expected auto or an integer >= 0"},
        {"[protrain]\nzero3_shard = sometimes\n", "t.ini:2: bad value 'sometimes' for key 'zero3_shard' in [protrain]: expected auto|on|off (or another bool form)"},
        {"[tiled_mlp]\ntiles = 0\n", "t.ini:2: bad value '0' for key 'tiles' in [tiled_mlp]: expected auto or an integer >= 1"},
        {"[osft]\nunfreeze_rank_ratio = 1.5\n", "t.ini:2: bad value '1.5' for key 'unfreeze_rank_ratio' in [osft]: expected a float in [0, 1]"},
        {"[osft]\ntargets = attn,,mlp\n", "t.ini:2: bad value 'attn,,mlp' for key 'targets' in [osft]: expected a comma-separated list of non-empty parameter-name substrings like attn,mlp"},
        {"[dist]\ninit_method = tcp://host:1234\n", "t.ini:2: bad value 'tcp://host:1234' for key 'init_method' in [dist]: expected env, mpi or file:///absolute/path"},
        {"[dist]\nbackend = gloo\n", "t.ini:2: bad value 'gloo' for key 'backend' in [dist]: expected one of auto|nccl|mpi|host|none"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) expect_err(cases[i].ini, cases[i].msg);
}

/* Text a parser could drop or bend without a word: a key on a section's
 * header line, a misspelt first section after a byte-order mark, an absurd
 * copy rate, a size below one byte that rounded to 0 (= auto). */
static void test_nothing_dropped(void **s) {
    (void)s;
    expect_err("[memory] device_capacity = 1KiB\n",
               "t.ini:1: text 'device_capacity = 1KiB' after the section header [memory] would "
               "be ignored; put each key = value on its own line");
    expect_err_has("[plugin]\nlog_level = info\n[optimizer]   lr = 0.1\n", "t.ini:3: text 'lr = 0.1'");
    /* a comment after the header is fine */
    pt_config c;
    assert_int_equal(parse("[memory] ; the device\ndevice_capacity = 1KiB\n", &c), 0);
    assert_true(c.device_capacity == 1024);
    /* a BOM is skipped and the first section is still checked */
    expect_err("\xEF\xBB\xBF[memroy]\ndevice_capacity = 1KiB\n",
               "t.ini:1: unknown section [memroy]; did you mean [memory]?");
    assert_int_equal(parse("\xEF\xBB\xBF[memory]\ndevice_capacity = 3KiB\n", &c), 0);
    assert_true(c.device_capacity == 3072);
    /* copy rates outside [1 MB/s, 1 PB/s] (0 = off) */
    expect_err_has("[host_backend]\ncopy_bandwidth = 1B/s\n",
                   "t.ini:2: bad value '1B/s' for key 'copy_bandwidth' in [host_backend]: 1 "
                   "bytes/s is outside the accepted range");
    expect_err_has("[host_backend]\ncopy_bandwidth = 1e-300B/s\n", "from 1MB/s");
    expect_err_has("[host_backend]\ncopy_bandwidth = 1e300B/s\n", "outside the accepted range");
    assert_int_equal(parse("[host_backend]\ncopy_bandwidth = 1MB/s\n", &c), 0);
    assert_int_equal(parse("[host_backend]\ncopy_bandwidth = 0\n", &c), 0);
    /* the upper limit the form names, written as it names it */
    assert_int_equal(parse("[host_backend]\ncopy_bandwidth = 1PB/s\n", &c), 0);
    assert_true(c.copy_bandwidth == 1e15);
    expect_err_has("[host_backend]\ncopy_bandwidth = 1PiB/s\n", "outside the accepted range");
    /* below one byte: not silently 0 (= auto, 1 GiB) */
    expect_err_has("[memory]\ndevice_capacity = 0.0001KiB\n",
                   "t.ini:2: bad value '0.0001KiB' for key 'device_capacity' in [memory]: it is "
                   "less than one byte and would round to 0");
    expect_err_has("[memory]\nreserve = 0.5B\n", "round to 0");
    assert_int_equal(parse("[memory]\ndevice_capacity = 0\nreserve = 0.0MiB\n", &c), 0);
}

static void test_duplicates_and_syntax(void **s) {
    (void)s;
    expect_err("[optimizer]\nlr = 1e-3\nlr = 2e-3\n",
               "t.ini:3: duplicate key 'lr' in [optimizer] (first set at line 2)");
    /* across repeated section headers */
    expect_err("[plugin]\nlog_level = info\n[optimizer]\n\n\n\nlr = 1e-3\n[memory]\nreserve = 0\n"
               "[optimizer]\n; again\nbeta1 = 0.9\n\n\n\n\n\n\n\nlr = 2e-3\n",
               "t.ini:20: duplicate key 'lr' in [optimizer] (first set at line 7)");
    /* same key name in two sections is not a duplicate */
    pt_config c;
    assert_int_equal(parse("[osft]\nenabled = 1\n[tiled_mlp]\nenabled = 1\n", &c), 0);
    expect_err("[optimizer]\nlr = 1e-3\njust some words\n",
               "t.ini:3: cannot parse 'just some words': expected [section], key = value, or a "
               "comment starting with ';' or '#'");
    expect_err("[optimizer\nlr = 1e-3\n", "t.ini:1: section header '[optimizer' has no closing ']'");
    /* the first error by line wins, whichever kind it is */
    expect_err("[optimizer]\nno equals here\nlr = bad\n",
               "t.ini:2: cannot parse 'no equals here': expected [section], key = value, or a "
               "comment starting with ';' or '#'");
    expect_err("[optimizer]\nlr = bad\nno equals here\n",
               "t.ini:2: bad value 'bad' for key 'lr' in [optimizer]: expected a float > 0");
    /* a line longer than inih's buffer is reported, not split into two lines */
    char longl[400];
    int n = snprintf(longl, sizeof(longl), "[protrain]\ncache_dir = /");
    memset(longl + n, 'a', 250);
    strcpy(longl + n + 250, "\n");
    expect_err_has(longl, "t.ini:2: line 'cache_dir = /aaaa");
    expect_err_has(longl, "is 263 characters long; inih reads at most 198");
}

static void test_cross_rule(void **s) {
    (void)s;
    expect_err("[protrain]\nn_persist = 1\nauto_memory = false\nn_buffer = 2\nn_swap = 0\n",
               "t.ini:3: [protrain] auto_memory = false needs n_persist, n_buffer, n_swap and "
               "n_checkpoint set to numbers, but n_checkpoint is auto");
    pt_config c;
    assert_int_equal(parse("[protrain]\nauto_memory = false\nn_persist = 1\nn_buffer = 2\n"
                           "n_swap = 0\nn_checkpoint = 3\n",
                           &c),
                     0);
    assert_true(c.auto_memory == 0 && c.n_checkpoint == 3);
}

static void test_set(void **s) {
    (void)s;
    pt_config c;
    pt_config_defaults(&c);
    assert_int_equal(pt_config_set(&c, "memory", "device_capacity", "64MiB", err, sizeof(err)), 0);
    assert_true(c.device_capacity == 64ull << 20);
    assert_int_equal(pt_config_set(&c, "memory", "device_capacty", "1", err, sizeof(err)), PT_ERR_CONFIG);
    assert_string_equal(err, "override: unknown key 'device_capacty' in [memory]; did you mean 'device_capacity'?");
    assert_int_equal(pt_config_set(&c, "memroy", "x", "1", err, sizeof(err)), PT_ERR_CONFIG);
    assert_string_equal(err, "override: unknown section [memroy]; did you mean [memory]?");
    assert_int_equal(pt_config_set(&c, "optimizer", "lr", "-1", err, sizeof(err)), PT_ERR_CONFIG);
    assert_string_equal(err, "override: bad value '-1' for key 'lr' in [optimizer]: expected a float > 0");
    assert_true(c.lr == 3e-4f);
    /* a string longer than its field is refused with the limit */
    char big[700];
    memset(big, 'x', 600);
    big[600] = '\0';
    assert_int_equal(pt_config_set(&c, "protrain", "cache_dir", big, err, sizeof(err)), PT_ERR_CONFIG);
    assert_non_null(strstr(err, "for key 'cache_dir' in [protrain]: it is 600 characters long; at most 511 fit"));
    assert_string_equal(c.cache_dir, "");
    assert_int_equal(pt_config_set(&c, "osft", "targets", " q , k ", err, sizeof(err)), 0);
    assert_string_equal(c.osft_targets, "q,k");
    assert_int_equal(pt_config_set(NULL, "a", "b", "c", err, sizeof(err)), PT_ERR_INVALID_ARG);
}

/* ---- files and environment ---- */

static char tmpdir[64];

static int setup_dir(void **s) {
    (void)s;
    snprintf(tmpdir, sizeof(tmpdir), "/tmp/pt_test_config_XXXXXX");
    return mkdtemp(tmpdir) ? 0 : -1;
}

static int teardown_dir(void **s) {
    (void)s;
    char p[128];
    snprintf(p, sizeof(p), "%s/a.ini", tmpdir);
    unlink(p);
    snprintf(p, sizeof(p), "%s/nul.ini", tmpdir);
    unlink(p);
    rmdir(tmpdir);
    unsetenv("PROTRAIN_CONFIG");
    unsetenv("PROTRAIN_LOG_LEVEL");
    return 0;
}

static void write_file(const char *path, const char *text, size_t n) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(text, 1, n, f), n);
    fclose(f);
}

static void test_files_and_env(void **s) {
    (void)s;
    char path[128], want[256];
    pt_config c;
    unsetenv("PROTRAIN_CONFIG");
    unsetenv("PROTRAIN_LOG_LEVEL");
    snprintf(path, sizeof(path), "%s/a.ini", tmpdir);
    const char *text = "[plugin]\nlog_level = warn\n[optimizer]\nlr = 7e-4\nbeta1 = 2\n";
    write_file(path, text, strlen(text));
    assert_int_equal(pt_config_load(path, &c, err, sizeof(err)), PT_ERR_CONFIG);
    snprintf(want, sizeof(want), "%s:5: bad value '2' for key 'beta1' in [optimizer]: expected a float in [0, 1)", path);
    assert_string_equal(err, want);
    text = "[plugin]\nlog_level = warn\n[optimizer]\nlr = 7e-4\n";
    write_file(path, text, strlen(text));
    assert_int_equal(pt_config_load(path, &c, err, sizeof(err)), 0);
    assert_true(c.lr == 7e-4f && c.log_level == PT_LOG_WARN);
    assert_string_equal(c.source, path);
    /* NULL / "" path: $PROTRAIN_CONFIG, else defaults */
    assert_int_equal(pt_config_load(NULL, &c, err, sizeof(err)), 0);
    assert_string_equal(c.source, "(defaults)");
    setenv("PROTRAIN_CONFIG", path, 1);
    assert_int_equal(pt_config_load("", &c, err, sizeof(err)), 0);
    assert_true(c.lr == 7e-4f);
    assert_string_equal(c.source, path);
    /* PROTRAIN_LOG_LEVEL wins over the file; a bad one names the variable */
    setenv("PROTRAIN_LOG_LEVEL", "trace", 1);
    assert_int_equal(pt_config_load(NULL, &c, err, sizeof(err)), 0);
    assert_int_equal(c.log_level, PT_LOG_TRACE);
    setenv("PROTRAIN_LOG_LEVEL", "loud", 1);
    c.lr = 1.0f;
    assert_int_equal(pt_config_load(NULL, &c, err, sizeof(err)), PT_ERR_CONFIG);
    assert_string_equal(err, "environment variable PROTRAIN_LOG_LEVEL: bad value 'loud': expected "
                             "one of error|warn|info|debug|trace");
    assert_true(c.lr == 1.0f);
    unsetenv("PROTRAIN_LOG_LEVEL");
    /* missing file, a directory, a NUL byte */
    assert_int_equal(pt_config_load("/nonexistent/pt.ini", &c, err, sizeof(err)), PT_ERR_IO);
    assert_string_equal(err, "cannot open config file /nonexistent/pt.ini: No such file or directory");
    setenv("PROTRAIN_CONFIG", "/nonexistent/env.ini", 1);
    assert_int_equal(pt_config_load(NULL, &c, err, sizeof(err)), PT_ERR_IO);
    assert_non_null(strstr(err, "/nonexistent/env.ini"));
    unsetenv("PROTRAIN_CONFIG");
    assert_int_equal(pt_config_load(tmpdir, &c, err, sizeof(err)), PT_ERR_IO);
    assert_non_null(strstr(err, "cannot read config file"));
    snprintf(path, sizeof(path), "%s/nul.ini", tmpdir);
    write_file(path, "[optimizer]\nlr = 1\0\n", 20);
    assert_int_equal(pt_config_load(path, &c, err, sizeof(err)), PT_ERR_CONFIG);
    snprintf(want, sizeof(want), "%s:2: the file contains a NUL byte", path);
    assert_non_null(strstr(err, want));
    /* small error buffers are fine */
    char tiny[8];
    assert_int_equal(pt_config_load("/nonexistent/pt.ini", &c, tiny, sizeof(tiny)), PT_ERR_IO);
    assert_true(strlen(tiny) == 7);
    assert_int_equal(pt_config_load("/nonexistent/pt.ini", &c, NULL, 0), PT_ERR_IO);
}

/* A config path that is not a regular file is refused at once, naming what it
 * is: a FIFO (reading it would wait for a writer), /dev/zero (reading it would
 * never end), a directory. A regular file may be at most 1 MiB. alarm(): a
 * regression blocks or reads forever; the signal then ends the binary, which
 * make test counts as a failure instead of hanging. */
static void test_not_regular_files(void **s) {
    (void)s;
    char fifo[128], big[128];
    pt_config c;
    alarm(60);
    snprintf(fifo, sizeof fifo, "%s/fifo.ini", tmpdir);
    assert_int_equal(mkfifo(fifo, 0600), 0);
    assert_int_equal(pt_config_load(fifo, &c, err, sizeof err), PT_ERR_IO);
    assert_non_null(strstr(err, fifo));
    assert_non_null(strstr(err, "it is a FIFO, not a regular file"));
    assert_int_equal(pt_config_load("/dev/zero", &c, err, sizeof err), PT_ERR_IO);
    assert_non_null(strstr(err, "/dev/zero: it is a character device, not a regular file"));
    assert_int_equal(pt_config_load(tmpdir, &c, err, sizeof err), PT_ERR_IO);
    assert_non_null(strstr(err, "it is a directory"));
    unlink(fifo);
    /* exactly 1 MiB of comments and one key loads; one byte more is refused */
    enum { LIMIT = 1 << 20 };
    char *text = malloc(LIMIT + 2);
    assert_non_null(text);
    static const char key[] = "[optimizer]\nlr = 1e-3\n";
    size_t k = strlen(key);
    memcpy(text, key, k);
    for (size_t i = k; i < LIMIT; i++) text[i] = (i - k) % 100 == 0 ? ';' : (i - k) % 100 == 99 ? '\n'
                                                                                                : 'x';
    text[LIMIT - 1] = '\n';
    snprintf(big, sizeof big, "%s/big.ini", tmpdir);
    write_file(big, text, LIMIT);
    if (pt_config_load(big, &c, err, sizeof err)) print_error("%s\n", err);
    assert_int_equal(pt_config_load(big, &c, err, sizeof err), 0);
    assert_true(c.lr == 1e-3f);
    text[LIMIT] = '\n';
    write_file(big, text, LIMIT + 1);
    assert_int_equal(pt_config_load(big, &c, err, sizeof err), PT_ERR_CONFIG);
    assert_non_null(strstr(err, "is 1048577 bytes; a configuration file may be at most 1048576"));
    unlink(big);
    free(text);
    alarm(0);
}

/* ---- the shipped files agree with the schema ---- */

static char *slurp(const char *rel) {
    const char *root = getenv("PT_ROOT");
    char p[1024];
    snprintf(p, sizeof(p), "%s/%s", root ? root : ".", rel);
    FILE *f = fopen(p, "rb");
    if (!f) print_error("cannot open %s\n", p);
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)n + 1);
    assert_non_null(b);
    assert_int_equal(fread(b, 1, (size_t)n, f), (size_t)n);
    b[n] = '\0';
    fclose(f);
    return b;
}

static void test_default_ini(void **s) {
    (void)s;
    const char *root = getenv("PT_ROOT");
    char p[1024];
    pt_config c;
    unsetenv("PROTRAIN_LOG_LEVEL");
    snprintf(p, sizeof(p), "%s/conf/default.ini", root ? root : ".");
    if (pt_config_load(p, &c, err, sizeof(err))) print_error("%s\n", err);
    assert_int_equal(pt_config_load(p, &c, err, sizeof(err)), 0);
    assert_string_equal(c.backend, "host");
    assert_true(c.device_capacity > 0); /* the demo must offload: a fixed small capacity */
    snprintf(p, sizeof(p), "%s/conf/example-offload.ini", root ? root : ".");
    if (pt_config_load(p, &c, err, sizeof(err))) print_error("%s\n", err);
    assert_int_equal(pt_config_load(p, &c, err, sizeof(err)), 0);
    assert_int_equal(c.auto_memory, 0);

    /* every key is set in default.ini, in its section, right under the line
     * "; accepted: <form>; default: <default>" generated from the schema */
    char *text = slurp("conf/default.ini");
    size_t n;
    const pt_config_key *k = pt_config_schema(&n);
    for (size_t i = 0; i < n; i++) {
        char form[200], want[512], sec[64];
        if (!strcmp(k[i].section, "testing")) continue;   /* tests/README.md lists those */
        pt_config_key_form(&k[i], form, sizeof(form));
        snprintf(want, sizeof(want), "; accepted: %s; default: %s\n%s =", form,
                 *k[i].def ? k[i].def : "\"\"", k[i].key);
        snprintf(sec, sizeof(sec), "\n[%s]\n", k[i].section);
        /* search from the section header; no other header may come in between */
        const char *hs = strstr(text, sec), *at = hs ? strstr(hs, want) : NULL;
        if (!at) print_error("default.ini lacks '%s' under [%s]\n", want, k[i].section);
        assert_non_null(at);
        const char *next = strstr(hs + 1, "\n[");
        if (next && next < at) print_error("[%s] %s is not in its section\n", k[i].section, k[i].key);
        assert_true(!next || next > at);
    }
    assert_non_null(strstr(text, "\n[sample_host]\n"));
    /* no testing knob in the user's file: no [testing] section, no debug_ or
     * fail_ key anywhere (a line starting with one) */
    assert_null(strstr(text, "[testing]"));
    assert_null(strstr(text, "\ndebug_"));
    assert_null(strstr(text, "\nfail_"));
    free(text);
}

/* The text between the generated-keys markers of file rel equals gen; when it
 * does not, gen is written to $PT_BUILD/<out> for pasting. */
static void check_generated(const char *rel, const char *gen, const char *out) {
    char *md = slurp(rel);
    const char *b = strstr(md, "<!-- BEGIN GENERATED KEYS -->\n");
    const char *e = strstr(md, "<!-- END GENERATED KEYS -->");
    assert_non_null(b);
    assert_non_null(e);
    b += strlen("<!-- BEGIN GENERATED KEYS -->\n");
    int same = (size_t)(e - b) == strlen(gen) && !memcmp(b, gen, strlen(gen));
    if (!same) {
        const char *build = getenv("PT_BUILD");
        char p[1024];
        snprintf(p, sizeof(p), "%s/%s", build ? build : "/tmp", out);
        FILE *f = fopen(p, "w");
        if (f) fputs(gen, f), fclose(f);
        print_error("%s is out of date with the schema; paste %s between the markers\n", rel, p);
    }
    assert_true(same);
    free(md);
}

static void test_config_md(void **s) {
    (void)s;
    static char gen[32768];
    assert_int_equal(pt_config_schema_markdown(gen, sizeof(gen)), 0);
    /* the user's reference has no testing knob */
    assert_null(strstr(gen, "[testing]"));
    assert_null(strstr(gen, "debug_"));
    check_generated("conf/CONFIG.md", gen, "CONFIG.generated.md");
    char small[16];
    assert_int_equal(pt_config_schema_markdown(small, sizeof(small)), PT_ERR_INVALID_ARG);
    /* the testing knobs are listed in tests/README.md, from the same schema */
    assert_int_equal(pt_config_testing_markdown(gen, sizeof(gen)), 0);
    assert_non_null(strstr(gen, "### [testing]"));
    assert_non_null(strstr(gen, "`debug_skip_ordering`"));
    check_generated("tests/README.md", gen, "TESTING.generated.md");
}

/* A [testing] key is accepted only with PROTRAIN_TESTING=1 in the environment;
 * without it (unset, or another value) the file is refused at the key's line
 * with a sentence naming the key and the variable, and so is an override. */
static void test_testing_gate(void **s) {
    (void)s;
    const char *was = getenv("PROTRAIN_TESTING");
    char keep[16];
    snprintf(keep, sizeof keep, "%s", was ? was : "");
    pt_config c;
    static const char ini[] = "[optimizer]\nlr = 1e-3\n[testing]\ndebug_skip_ordering = 4\n";
    static const char *const envs[] = {NULL, "0", "yes"};
    for (int i = 0; i < 3; i++) {
        if (envs[i]) setenv("PROTRAIN_TESTING", envs[i], 1);
        else unsetenv("PROTRAIN_TESTING");
        expect_err_has(ini, "t.ini:4: key 'debug_skip_ordering' in [testing]");
        assert_non_null(strstr(err, "PROTRAIN_TESTING=1"));
        pt_config_defaults(&c);
        assert_int_equal(pt_config_set(&c, "testing", "fail_op", "memset:2", err, sizeof err),
                         PT_ERR_CONFIG);
        assert_non_null(strstr(err, "fail_op"));
        assert_non_null(strstr(err, "PROTRAIN_TESTING=1"));
        assert_string_equal(c.fail_op, "");
        /* a file without the section needs nothing */
        assert_int_equal(parse("[optimizer]\nlr = 1e-3\n", &c), 0);
    }
    /* negative control: the same file with the variable set is accepted */
    setenv("PROTRAIN_TESTING", "1", 1);
    assert_int_equal(parse(ini, &c), 0);
    assert_int_equal(c.debug_skip_ordering, 4);
    assert_int_equal(pt_config_set(&c, "testing", "fail_op", "memset:2", err, sizeof err), 0);
    assert_string_equal(c.fail_op, "memset:2");
    /* a testing knob under another section is refused, naming [testing] */
    expect_err_has("[host_backend]\ndebug_skip_ordering = 4\n", "belongs in [testing]");
    expect_err_has("[dist]\ndebug_hang_rank = 1\n", "belongs in [testing]");
    if (was) setenv("PROTRAIN_TESTING", keep, 1);
    else unsetenv("PROTRAIN_TESTING");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults),
        cmocka_unit_test(test_schema_rows),
        cmocka_unit_test(test_parse_size),
        cmocka_unit_test(test_parse_rate),
        cmocka_unit_test(test_parse_duration),
        cmocka_unit_test(test_every_key),
        cmocka_unit_test(test_dump_roundtrip),
        cmocka_unit_test(test_bools_and_autos),
        cmocka_unit_test(test_syntax_forms),
        cmocka_unit_test(test_unknown_names),
        cmocka_unit_test(test_bad_values),
        cmocka_unit_test(test_duplicates_and_syntax),
        cmocka_unit_test(test_nothing_dropped),
        cmocka_unit_test(test_cross_rule),
        cmocka_unit_test(test_set),
        cmocka_unit_test_setup_teardown(test_files_and_env, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_not_regular_files, setup_dir, teardown_dir),
        cmocka_unit_test(test_default_ini),
        cmocka_unit_test(test_config_md),
        cmocka_unit_test(test_testing_gate),
    };
    unsetenv("PROTRAIN_CONFIG");
    unsetenv("PROTRAIN_LOG_LEVEL");
    return cmocka_run_group_tests(tests, NULL, NULL);
}
