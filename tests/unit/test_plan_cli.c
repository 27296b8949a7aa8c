/*
 * test_plan_cli.c — DeepSpeed estimates against figures DeepSpeed's estimators print, the shape
 * parameter count, and the protrain-plan binary ($PT_BUILD/protrain-plan):
 * resident plan for a small model, offload for a big one, JSON that parses,
 * INI input and its errors, infeasible exit, --trace input.
 */
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

#include "test_files.h"

#include "planner/ds_estimates.h"
#include "protrain.h"
#include "planner/trace_cache.h"

#define GIB 1073741824.0

static void gib2(double bytes, const char *want) {
    char got[32];
    snprintf(got, sizeof got, "%.2f", bytes / GIB);
    if (strcmp(got, want)) fprintf(stderr, "got %s want %s\n", got, want);
    assert_string_equal(got, want);
}

/* DeepSpeed's ZeRO-3 estimator example: t5-3b, P = 2851e6, Lmax = 32e6, 1 node x 8 GPUs, printed in GiB. */
static void test_ds_t5_3b(void **state) {
    (void)state;
    const int64_t P = 2851000000LL, L = 32000000LL;
    struct {
        int op, oo, zi;
        const char *cpu, *gpu;
    } rows[] = {
        {1, 1, 1, "71.69", "0.12"},
        {1, 1, 0, "127.45", "0.12"},
        {0, 1, 1, "63.72", "0.78"},
        {0, 1, 0, "127.45", "0.78"},
        {0, 0, 1, "1.43", "6.09"},
        {0, 0, 0, "127.45", "6.09"},
    };
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        pt_ds_est e;
        assert_int_equal(pt_ds_zero3(P, L, 8, 1, rows[i].op, rows[i].oo, rows[i].zi, PT_DS_BUFFER_FACTOR, &e), 0);
        gib2(e.cpu_bytes, rows[i].cpu);
        gib2(e.gpu_bytes, rows[i].gpu);
    }
    /* ZeRO-2 (5b): the code's no-offload GPU figure, 11.28 (the docs' 15.93 is the old formula) */
    pt_ds_est e;
    assert_int_equal(pt_ds_zero2(P, 8, 1, 0, PT_DS_BUFFER_FACTOR, &e), 0);
    gib2(e.gpu_bytes, "11.28");
    assert_int_equal(pt_ds_zero2(P, 8, 1, 1, PT_DS_BUFFER_FACTOR, &e), 0);
    gib2(e.gpu_bytes, "5.31");          /* 2P */
    gib2(e.cpu_bytes, "127.45");        /* P * max(4*8, 16) * 1.5 */
    /* DeepSpeed has no param-only offload */
    assert_int_equal(pt_ds_zero3(P, L, 8, 1, 1, 0, 1, PT_DS_BUFFER_FACTOR, &e), -1);
}

/* GPT-2 124M on one GPU, exact bytes. */
static void test_ds_gpt2_exact(void **state) {
    (void)state;
    pt_model_shape m = {PT_ARCH_GPT, 12, 768, 12, 0, 0, 50257, 1024, 1, 1024, PT_F32, 1, 0, 1.0};
    int64_t P, L, pb;
    assert_int_equal(pt_shape_check(&m, NULL, 0), 0);
    pt_shape_count(&m, &P, &L, &pb);
    assert_true(P == 124439808LL);
    assert_true(L == 38597376LL);   /* wte */
    assert_true(pb == 7087872LL);   /* 12 h^2 + 13 h */
    pt_ds_est e;
    for (int zi = 0; zi < 2; zi++) {
        pt_ds_zero3(P, L, 1, 1, 1, 1, zi, PT_DS_BUFFER_FACTOR, &e);
        assert_true(e.cpu_bytes == 3359874816.0 && e.gpu_bytes == 154389504.0);
        pt_ds_zero3(P, L, 1, 1, 0, 1, zi, PT_DS_BUFFER_FACTOR, &e);
        assert_true(e.cpu_bytes == 2986555392.0 && e.gpu_bytes == 403269120.0);
    }
    pt_ds_zero3(P, L, 1, 1, 0, 0, 1, PT_DS_BUFFER_FACTOR, &e);
    assert_true(e.cpu_bytes == 231584256.0 && e.gpu_bytes == 2394306048.0);
    pt_ds_zero3(P, L, 1, 1, 0, 0, 0, PT_DS_BUFFER_FACTOR, &e);
    assert_true(e.cpu_bytes == 746638848.0 && e.gpu_bytes == 2394306048.0);
    pt_ds_zero2(P, 1, 1, 1, PT_DS_BUFFER_FACTOR, &e);
    assert_true(e.cpu_bytes == 2986555392.0 && e.gpu_bytes == 248879616.0);
    pt_ds_zero2(P, 1, 1, 0, PT_DS_BUFFER_FACTOR, &e);
    assert_true(e.cpu_bytes == 746638848.0 && e.gpu_bytes == 2488796160.0);
}

/* ---------------- the binary ---------------- */

static char tmp[256], outp[320], errp[320];

static int setup(void **state) {
    (void)state;
    snprintf(tmp, sizeof tmp, "/tmp/pt_plan_cli.%ld", (long)getpid());
    mkdir(tmp, 0755);
    snprintf(outp, sizeof outp, "%s/out", tmp);
    snprintf(errp, sizeof errp, "%s/err", tmp);
    return 0;
}

static int teardown(void **state) {
    (void)state;
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
    return system(cmd) == 0 ? 0 : -1;
}

/* Run protrain-plan with args; returns the exit status; out and err get stdout and stderr. */
static int run(const char *args, char **out, char **err) {
    const char *bd = getenv("PT_BUILD");
    assert_non_null(bd);   /* the Makefile sets it */
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "'%s/protrain-plan' %s > '%s' 2> '%s'", bd, args, outp, errp);
    int st = system(cmd);
    *out = pt_test_slurp(outp);
    *err = pt_test_slurp(errp);
    assert_non_null(*out);
    assert_non_null(*err);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* Minimal JSON syntax check: returns the end of one value or NULL. */
static const char *ws(const char *p) {
    while (*p == ' ' || *p == '\n' || *p == '\t' || *p == '\r') p++;
    return p;
}
static const char *jval(const char *p);
static const char *jstr(const char *p) {
    if (*p++ != '"') return NULL;
    while (*p && *p != '"') {
        if ((unsigned char)*p < 0x20) return NULL;
        p += *p == '\\' ? 2 : 1;
    }
    return *p == '"' ? p + 1 : NULL;
}
static const char *jval(const char *p) {
    p = ws(p);
    if (*p == '{' || *p == '[') {
        char close = *p == '{' ? '}' : ']';
        int obj = *p == '{';
        p = ws(p + 1);
        if (*p == close) return p + 1;
        for (;;) {
            if (obj) {
                p = jstr(ws(p));
                if (!p) return NULL;
                p = ws(p);
                if (*p++ != ':') return NULL;
            }
            p = jval(p);
            if (!p) return NULL;
            p = ws(p);
            if (*p == ',') {
                p++;
                continue;
            }
            return *p == close ? p + 1 : NULL;
        }
    }
    if (*p == '"') return jstr(p);
    if (!strncmp(p, "true", 4)) return p + 4;
    if (!strncmp(p, "false", 5)) return p + 5;
    if (!strncmp(p, "null", 4)) return p + 4;
    char *end;
    strtod(p, &end);
    return end == p ? NULL : end;
}

static void assert_json(const char *s) {
    const char *e = jval(s);
    assert_non_null(e);
    assert_int_equal(*ws(e), 0);
}

/* First number after "key": */
static double jnum(const char *s, const char *key) {
    char k[80];
    snprintf(k, sizeof k, "\"%s\":", key);
    const char *p = strstr(s, k);
    if (!p) fprintf(stderr, "missing key %s\n", key);
    assert_non_null(p);
    return strtod(p + strlen(k), NULL);
}

static void test_cli_small_model_resident(void **state) {
    (void)state;
    char *out, *err;
    int rc = run("--json --layers 4 --hidden 256 --heads 4 --vocab 1000 --seq 128 --batch 2 --device-memory-gib 16",
                 &out, &err);
    if (rc) fprintf(stderr, "%s", err);
    assert_int_equal(rc, 0);
    assert_json(out);
    const char *keys[] = {"plan", "n_persist", "n_buffer", "n_swap", "n_checkpoint", "n_chunk", "chunk_size", "modes",
                          "peak_bytes", "model_state_bytes", "buffer_bytes", "activation_bytes", "scratch_bytes",
                          "iter_s", "fwd_s", "bwd_s", "opt_s", "host_bytes", "optimizer_schedule", "runner_ups",
                          "deepspeed", "zero3_offload_param_opt", "zero2_no_offload", "fixed_n_persist"};
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
        char k[64];
        snprintf(k, sizeof k, "\"%s\":", keys[i]);
        if (!strstr(out, k)) fprintf(stderr, "missing %s\n", k);
        assert_non_null(strstr(out, k));
    }
    /* everything resident: all chunks persistent, no buffers, no CKPT/SWAP */
    assert_true(jnum(out, "n_persist") == jnum(out, "n_chunk"));
    assert_true(jnum(out, "n_buffer") == 0);
    assert_true(jnum(out, "n_swap") == 0);
    assert_true(jnum(out, "n_checkpoint") == 0);
    assert_non_null(strstr(out, "\"modes\": \"NNNN\""));
    assert_true(jnum(out, "host_bytes") == 0);
    free(out);
    free(err);
}

static void test_cli_big_model_offloads(void **state) {
    (void)state;
    char *out, *err;
    /* Llama-7B shape on a 24 GiB card: does not fit resident */
    int rc = run("--arch llama --layers 32 --hidden 4096 --heads 32 --vocab 32000 --seq 2048 --batch 1 "
                 "--flash-attn 1 --tied 0 --device-memory-gib 24 --pcie-gbps 16 --json",
                 &out, &err);
    if (rc) fprintf(stderr, "%s", err);
    assert_int_equal(rc, 0);
    assert_json(out);
    double np = jnum(out, "n_persist"), nc = jnum(out, "n_chunk"), nb = jnum(out, "n_buffer");
    assert_true(np < nc);
    assert_true(nb >= 1);
    assert_true(jnum(out, "peak_bytes") <= jnum(out, "budget_bytes"));
    assert_true(jnum(out, "host_bytes") > 0);
    free(out);
    free(err);
    /* the text form shows the plan and the DeepSpeed comparison */
    rc = run("--arch llama --layers 32 --hidden 4096 --heads 32 --vocab 32000 --seq 2048 --flash-attn 1 --tied 0 "
             "--device-memory-gib 24 --n-checkpoint 4 --max-grad-norm 1.0",
             &out, &err);
    assert_int_equal(rc, 0);
    assert_non_null(strstr(out, "ProTrain plan"));
    assert_non_null(strstr(out, "fixed by INI"));
    assert_non_null(strstr(out, "after backward"));
    assert_non_null(strstr(out, "zero3_offload_param_opt"));
    assert_non_null(strstr(out, "block modes"));
    free(out);
    free(err);
}

/* The disk tier from the command line: a Llama-7B shape on a 24 GiB card with
 * 32 GiB of pinned RAM does not fit without it; with assumed rates it does at
 * level 1 (its pinned bytes within the budget), at 8 GiB at level 2, with the
 * I/O in the JSON; malformed rates and a missing folder are refused (exit 2). */
static void test_cli_nvme(void **state) {
    (void)state;
    const char *m = "--arch llama --layers 32 --hidden 4096 --heads 32 --vocab 32000 --seq 2048 --flash-attn 1 "
                    "--tied 0 --device-memory-gib 24 --pcie-gbps 16";
    char args[600];
    char *out, *err;
    snprintf(args, sizeof args, "%s --host-ram-gib 32 --json", m);
    assert_int_equal(run(args, &out, &err), 1);
    free(out);
    free(err);
    static const struct {
        int ram, level;
    } cases[] = {{32, 1}, {8, 2}};
    for (size_t i = 0; i < 2; i++) {
        snprintf(args, sizeof args, "%s --host-ram-gib %d --nvme-bw 3e9,2e9 --json", m, cases[i].ram);
        int rc = run(args, &out, &err);
        if (rc) fprintf(stderr, "%s", err);
        assert_int_equal(rc, 0);
        assert_json(out);
        assert_true(jnum(out, "nvme_tier") == cases[i].level);
        assert_true(jnum(out, "host_bytes") <= cases[i].ram * GIB);
        assert_true(jnum(out, "tier_disk_bytes") > 0);
        double io = jnum(out, "tier_io_s"), ex = jnum(out, "tier_exposed_s");
        assert_true(io > 0 && ex >= 0 && ex <= io);
        assert_true(jnum(out, "tier_read_Bps") == 3e9 && jnum(out, "tier_write_Bps") == 2e9);
        assert_true(jnum(out, "iter_s") >= ex);
        free(out);
        free(err);
    }
    snprintf(args, sizeof args, "%s --host-ram-gib 8 --nvme-bw 3e9", m);
    assert_int_equal(run(args, &out, &err), 2);
    assert_non_null(strstr(err, "READ,WRITE"));
    free(out);
    free(err);
    snprintf(args, sizeof args, "%s --host-ram-gib 8 --nvme-path /nonexistent/pt_nvme", m);
    assert_int_equal(run(args, &out, &err), 2);
    assert_non_null(strstr(err, "/nonexistent/pt_nvme"));
    free(out);
    free(err);
}

static void write_file(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static void test_cli_ini_and_errors(void **state) {
    (void)state;
    char model[400], hw[400], args[1400], jf[400];
    snprintf(model, sizeof model, "%s/model.ini", tmp);
    snprintf(hw, sizeof hw, "%s/hw.ini", tmp);
    snprintf(jf, sizeof jf, "%s/plan.json", tmp);
    write_file(model, "[model]\narch = gpt\nlayers = 12\nhidden = 768\nheads = 12\nseq = 1024\nbatch = 8\n"
                      "dtype = fp32\n");
    write_file(hw, "[hw]\ndevice_memory_gib = 12\npcie_gbps = 16\ncpu_adam_rate = 1e9\ntflops = 60\n"
                   "[plan]\nruntime_check_unused = 0\n");
    /* unknown key: exit 2, file:line named */
    char *out, *err;
    snprintf(args, sizeof args, "--model '%s' --hw '%s'", model, hw);
    assert_int_equal(run(args, &out, &err), 2);
    char want[450];
    snprintf(want, sizeof want, "%s:7", hw);
    if (!strstr(err, want)) fprintf(stderr, "stderr: %s\n", err);
    assert_non_null(strstr(err, want));
    assert_non_null(strstr(err, "runtime_check_unused"));
    free(out);
    free(err);
    write_file(hw, "[hw]\ndevice_memory_gib = 12\npcie_gbps = 16\ncpu_adam_rate = 1e9\ntflops = 60\n");
    snprintf(args, sizeof args, "--model '%s' --hw '%s' --json-file '%s'", model, hw, jf);
    assert_int_equal(run(args, &out, &err), 0);
    assert_non_null(strstr(out, "ProTrain plan"));
    char *js = pt_test_slurp(jf);
    assert_non_null(js);
    assert_json(js);
    assert_true(jnum(js, "capacity_bytes") == 12.0 * GIB);
    free(js);
    free(out);
    free(err);
    /* bad value, no model, infeasible */
    snprintf(args, sizeof args, "--model '%s' --device-memory-gib lots", model);
    assert_int_equal(run(args, &out, &err), 2);
    assert_non_null(strstr(err, "device-memory-gib"));
    free(out);
    free(err);
    assert_int_equal(run("--device-memory-gib 8", &out, &err), 2);
    assert_non_null(strstr(err, "--model"));
    free(out);
    free(err);
    snprintf(args, sizeof args, "--model '%s' --device-memory-gib 1.5", model);
    assert_int_equal(run(args, &out, &err), 1);
    assert_non_null(strstr(err, "needs at least"));
    free(out);
    free(err);
}

static void test_cli_trace_input(void **state) {
    (void)state;
    pt_model_shape m = {PT_ARCH_GPT, 6, 512, 8, 0, 0, 8000, 256, 4, 0, PT_BF16, 1, 0, 1.0};
    pt_hw_shape hw = {2ull << 30, 16e9, 16e9, 2, 1, 1e9, 3e10, 50e12, 0, 0, "cached", 0, 0};
    pt_trace t;
    pt_trace_init(&t);
    char e[256], path[400], args[500];
    assert_int_equal(pt_shape_trace(&m, &hw, 0, &t, e, sizeof e), PT_OK);
    snprintf(path, sizeof path, "%s/x.trace", tmp);
    assert_int_equal(pt_trace_write_file(path, &t, e, sizeof e), PT_OK);
    char *out, *err;
    snprintf(args, sizeof args, "--trace '%s' --json", path);
    assert_int_equal(run(args, &out, &err), 0);
    assert_json(out);
    assert_non_null(strstr(out, "\"device\": \"cached\""));
    assert_true(jnum(out, "n_chunk") == t.n_chunk);
    free(out);
    free(err);
    /* a corrupt trace file is a clear error */
    FILE *f = fopen(path, "r+b");
    fseek(f, 200, SEEK_SET);
    fputc('!', f);
    fclose(f);
    assert_int_equal(run(args, &out, &err), 2);
    assert_non_null(strstr(err, "corrupt"));
    free(out);
    free(err);
    pt_trace_free(&t);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ds_t5_3b),
        cmocka_unit_test(test_ds_gpt2_exact),
        cmocka_unit_test_setup_teardown(test_cli_small_model_resident, setup, teardown),
        cmocka_unit_test_setup_teardown(test_cli_big_model_offloads, setup, teardown),
        cmocka_unit_test_setup_teardown(test_cli_ini_and_errors, setup, teardown),
        cmocka_unit_test_setup_teardown(test_cli_trace_input, setup, teardown),
        cmocka_unit_test_setup_teardown(test_cli_nvme, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
