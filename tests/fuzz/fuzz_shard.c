/*
 * fuzz_shard.c — libFuzzer target: an llm.c token shard through sample_host's
 * reader (sh_data_read_shard, every header field and the size checked) and the
 * --data detector (sh_data_load: shard by magic, else text, a damaged shard
 * refused). Properties: no crash, no sanitizer report, a refusal carries a
 * sentence; tokens written as a shard (sh_data_write_shard) read back equal;
 * a --data list naming the file twice holds its tokens twice.
 *
 * Input: one mode byte, then the file. Bit 0: the file is reached through a
 * name ending in .bin (llm.c's shard extension, which the detector treats as a
 * shard). Bit 1: the header's token count is set to the body's, with an odd
 * last byte dropped, as a writer would (a mutated count almost always stops at
 * the size check). Bit 2: the tokens sh_data_load returned go through
 * sh_data_write_shard and sh_data_read_shard. Bit 3: the file goes through
 * sh_data_load_list as "F,F" and as a glob matching it.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fuzz_file.h"
#include "sh_data.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char DIR_[64], BIN[128], OUT[128], LIST[300], GLOB[128];

/* The scratch folder goes when the fuzzer exits. */
static void cleanup(void) {
    unlink(BIN);
    unlink(OUT);
    rmdir(DIR_);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    snprintf(DIR_, sizeof DIR_, "%s/fuzz_shard.XXXXXX", access("/dev/shm", W_OK) ? "/tmp" : "/dev/shm");
    if (!mkdtemp(DIR_)) abort();
    atexit(cleanup);
    snprintf(BIN, sizeof BIN, "%s/in.bin", DIR_);
    snprintf(OUT, sizeof OUT, "%s/out.shard", DIR_);
    snprintf(LIST, sizeof LIST, "%s,%s", BIN, BIN);
    snprintf(GLOB, sizeof GLOB, "%s/i*.bin", DIR_);
    return 0;
}

static void put32(uint8_t *p, uint32_t v) {
    for (int k = 0; k < 4; k++) p[k] = (uint8_t)(v >> (8 * k));
}

static void round_trip(const sh_tokens *t) {
    char err[1024] = "";
    if (sh_data_write_shard(OUT, t->tok, t->n, err, sizeof err)) {
        fprintf(stderr, "fuzz_shard: writing %zu tokens failed: %s\n", t->n, err);
        abort();
    }
    sh_tokens u = {0};
    if (sh_data_read_shard(OUT, &u, err, sizeof err) || u.n != t->n ||
        memcmp(u.tok, t->tok, t->n * sizeof *t->tok)) {
        fprintf(stderr, "fuzz_shard: a written shard does not read back equal: %s\n", err);
        abort();
    }
    sh_data_tokens_free(&u);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    uint8_t mode = data[0];
    size_t n = size - 1;
    uint8_t *f = malloc(n ? n : 1);
    if (!f) abort();
    memcpy(f, data + 1, n);
    if ((mode & 2) && n >= 1024) {
        n -= (n - 1024) % 2;
        put32(f + 8, (uint32_t)((n - 1024) / 2 > 0x7fffffff ? 0x7fffffff : (n - 1024) / 2));
    }
    const char *path = fuzz_file(f, n);
    free(f);
    unlink(BIN);
    if ((mode & 9) && symlink(path, BIN) != 0) abort();
    if (mode & 1) path = BIN;
    char err[1024] = "";
    sh_tokens t = {0};
    int rc = sh_data_read_shard(path, &t, err, sizeof err);
    FUZZ_EXPECT_SENTENCE(rc, err);
    sh_data_tokens_free(&t);
    err[0] = '\0';
    sh_tokens u = {0};
    rc = sh_data_load(path, &u, err, sizeof err);
    FUZZ_EXPECT_SENTENCE(rc, err);
    if (!rc && (mode & 4)) round_trip(&u);
    if (mode & 8) {
        sh_tokens l = {0};
        err[0] = '\0';
        int lr = sh_data_load_list(LIST, &l, err, sizeof err);
        FUZZ_EXPECT_SENTENCE(lr, err);
        /* the list reads the file as .bin: accepted only where that is accepted */
        if (!lr && (l.n % 2 || (rc == 0 && (mode & 1) && l.n != 2 * u.n))) abort();
        sh_data_tokens_free(&l);
        err[0] = '\0';
        lr = sh_data_load_list(GLOB, &l, err, sizeof err);
        FUZZ_EXPECT_SENTENCE(lr, err);
        sh_data_tokens_free(&l);
    }
    sh_data_tokens_free(&u);
    return 0;
}
