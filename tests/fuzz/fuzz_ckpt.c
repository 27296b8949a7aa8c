/*
 * fuzz_ckpt.c — libFuzzer target: an llm.c GPT-2 checkpoint through
 * sample_host's reader: the header (sh_ckpt_read_header) and, when it is
 * valid and the model small enough to allocate here, the tensors into a
 * model of those dims (sh_ckpt_load). Properties: no crash, no sanitizer
 * report, a refusal carries a sentence; a loaded model saved (sh_ckpt_save)
 * and loaded again has bit-identical parameters.
 *
 * Input: one mode byte, then the file. The header must agree with the file's
 * size to the byte (1024 + 4 x the floats its dims give), so a mutated dim
 * almost always stops at the size check and the dims check and tensor reader
 * behind it see only the seed's shape. With the mode byte's bit 0 set the
 * target first fits the file to its header, as a writer would: when the magic
 * and version are right and the dims give at most 2^20 floats, the body is cut
 * or zero-padded to that size. Bit 1: the tensors are loaded into a model
 * whose padded vocabulary differs (the mismatched-shape refusal). Bit 2: the
 * loaded model is saved to a scratch folder and loaded back.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fuzz_file.h"
#include "sh_ckpt.h"
#include "sh_gpt.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char DIR_[64], OUT[128];

/* The scratch folder goes when the fuzzer exits. */
static void cleanup(void) {
    unlink(OUT);
    rmdir(DIR_);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    snprintf(DIR_, sizeof DIR_, "%s/fuzz_ckpt.XXXXXX", access("/dev/shm", W_OK) ? "/tmp" : "/dev/shm");
    if (!mkdtemp(DIR_)) abort();
    atexit(cleanup);
    snprintf(OUT, sizeof OUT, "%s/m.bin", DIR_);
    return 0;
}

/* The body's floats for header dims h[2..7] (the checkpoint layout of
 * sample_host/README.md: wte, wpe, 12 C^2 + 13 C per layer, lnf). 0 when
 * the dims are not positive or the body would pass 2^20 floats. */
static uint64_t body_floats(const int32_t *h) {
    for (int i = 2; i < 8; i++)
        if (h[i] <= 0) return 0;
    uint64_t T = (uint64_t)h[2], L = (uint64_t)h[4], C = (uint64_t)h[6], Vp = (uint64_t)h[7];
    if (C > 4096 || L > 64 || T > (1u << 20) || Vp > (1u << 20)) return 0;
    uint64_t n = Vp * C + T * C + L * (12 * C * C + 13 * C) + 2 * C;
    return n <= (1u << 20) ? n : 0;
}

/* The fitted copy of f (n bytes) into *out (*on bytes; the caller frees). */
static uint8_t *fit(const uint8_t *f, size_t n, size_t *on) {
    *on = n;
    int32_t h[8] = {0};
    if (n >= sizeof h) memcpy(h, f, sizeof h);
    uint64_t body = n >= 1024 && h[0] == SH_CKPT_MAGIC && h[1] == SH_CKPT_VERSION
                        ? body_floats(h)
                        : 0;
    if (body) *on = 1024 + 4 * (size_t)body;
    uint8_t *o = calloc(*on ? *on : 1, 1);
    if (!o) abort();
    memcpy(o, f, n < *on ? n : *on);
    return o;
}

static void round_trip(const sh_model *m, const sh_dims *d) {
    char err[1024] = "";
    if (sh_ckpt_save(OUT, m, m->init, err, sizeof err)) {
        fprintf(stderr, "fuzz_ckpt: saving a loaded model failed: %s\n", err);
        abort();
    }
    sh_model m2;
    if (sh_model_create(&m2, d, err, sizeof err) || sh_ckpt_load(OUT, &m2, err, sizeof err)) {
        fprintf(stderr, "fuzz_ckpt: a saved model does not load back: %s\n", err);
        abort();
    }
    if (m2.n_floats != m->n_floats || memcmp(m2.init, m->init, m->n_floats * sizeof(float)))
        abort();   /* the round trip changed a parameter */
    sh_model_destroy(&m2);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    uint8_t mode = data[0];
    size_t n = size - 1;
    uint8_t *f = (mode & 1) ? fit(data + 1, size - 1, &n) : NULL;
    const char *path = fuzz_file(f ? f : data + 1, n);
    free(f);
    char err[1024] = "";
    sh_dims d;
    int rc = sh_ckpt_read_header(path, &d, err, sizeof err);
    FUZZ_EXPECT_SENTENCE(rc, err);
    if (rc) return 0;
    /* the header checked the file size against the dims, so the file itself
     * bounds the model; still keep allocations small for the fuzzer */
    if ((uint64_t)d.Vp * (uint64_t)d.C > (1u << 22) || d.L > 64) return 0;
    sh_dims md = d;
    if (mode & 2) md.Vp += 128;
    sh_model m;
    err[0] = '\0';
    if (sh_model_create(&m, &md, err, sizeof err) != 0) {
        FUZZ_EXPECT_SENTENCE(1, err);
        return 0;
    }
    err[0] = '\0';
    rc = sh_ckpt_load(path, &m, err, sizeof err);
    FUZZ_EXPECT_SENTENCE(rc, err);
    if ((mode & 2) && rc == 0) abort();   /* another shape was accepted */
    if (!rc && (mode & 4)) round_trip(&m, &md);
    sh_model_destroy(&m);
    return 0;
}
