/*
 * fuzz_trace.c — libFuzzer target: a profile-cache file through
 * pt_trace_read_file. Properties: no crash, no sanitizer report, a refusal
 * carries a sentence, and an accepted trace is freed cleanly; an accepted
 * trace written back with pt_trace_write_file reads back equal field by field
 * (the bytes of the rewritten file are the same on a second round trip).
 *
 * Input: one mode byte, then the file. The payload's checksum covers every
 * payload byte, so a random mutation of a real file is refused at the checksum
 * and the decoder and pt_trace_validate behind it never run. With the mode
 * byte's bit 0 set the target seals the file first, as the writer would:
 * payload size = the bytes after the 128-byte header, checksum = FNV-1a 64 of
 * the payload. With it clear the file goes in as given (the framing checks
 * stay fuzzed). Bit 1: the reader is given the file's own key as the expected
 * one, and then a key that differs in its batch (the foreign-key refusal).
 * The offsets are trace_cache.h's; a format change stops the build here.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/base.h"
#include "fuzz_file.h"
#include "planner/planner.h"
#include "planner/trace_cache.h"

_Static_assert(PT_TRACE_HEADER_BYTES == 128u && PT_TRACE_FILE_VERSION == 10u,
               "the trace file's framing changed: update OFF_* and seal() to trace_cache.h");
enum { HDR = 128,
       OFF_PAYLOAD = 112,
       OFF_SUM = 120 };

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char DIR_[64], OUT1[128], OUT2[128];

/* The scratch folder goes when the fuzzer exits. */
static void cleanup(void) {
    unlink(OUT1);
    unlink(OUT2);
    rmdir(DIR_);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    snprintf(DIR_, sizeof DIR_, "%s/fuzz_trace.XXXXXX", access("/dev/shm", W_OK) ? "/tmp" : "/dev/shm");
    if (!mkdtemp(DIR_)) abort();
    atexit(cleanup);
    snprintf(OUT1, sizeof OUT1, "%s/a.trace", DIR_);
    snprintf(OUT2, sizeof OUT2, "%s/b.trace", DIR_);
    return 0;
}

static void seal(uint8_t *f, size_t n) {
    if (n < HDR || memcmp(f, "PTTRACE", 8) != 0) return;
    uint64_t payload = n - HDR, sum = pt_fnv1a64(f + HDR, n - HDR);
    memcpy(f + OFF_PAYLOAD, &payload, 8);
    memcpy(f + OFF_SUM, &sum, 8);
}

static uint8_t *slurp(const char *p, size_t *n) {
    FILE *f = fopen(p, "rb");
    if (!f) abort();
    fseek(f, 0, SEEK_END);
    long k = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *b = malloc((size_t)k + 1);
    if (!b || fread(b, 1, (size_t)k, f) != (size_t)k) abort();
    fclose(f);
    *n = (size_t)k;
    return b;
}

/* Write t, read it back, write that: the two files must be byte-identical
 * (a field the writer and reader disagree on would differ). */
static void round_trip(const pt_trace *t) {
    char err[1024] = "";
    if (pt_trace_write_file(OUT1, t, err, sizeof err)) {
        /* a trace the reader accepted is one the writer takes (both validate) */
        fprintf(stderr, "fuzz_trace: an accepted trace is refused by the writer: %s\n", err);
        abort();
    }
    pt_trace u;
    pt_trace_init(&u);
    if (pt_trace_read_file(OUT1, &t->key, &u, err, sizeof err)) {
        fprintf(stderr, "fuzz_trace: a written trace does not read back: %s\n", err);
        abort();
    }
    if (pt_trace_write_file(OUT2, &u, err, sizeof err)) abort();
    pt_trace_free(&u);
    size_t n1, n2;
    uint8_t *a = slurp(OUT1, &n1), *b = slurp(OUT2, &n2);
    if (n1 != n2 || memcmp(a, b, n1)) {
        fprintf(stderr, "fuzz_trace: a trace read back and written again differs\n");
        abort();
    }
    free(a);
    free(b);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    uint8_t mode = data[0];
    uint8_t *f = malloc(size);
    if (!f) abort();
    memcpy(f, data + 1, size - 1);
    if (mode & 1) seal(f, size - 1);
    const char *path = fuzz_file(f, size - 1);
    free(f);
    pt_trace t;
    pt_trace_init(&t);
    char err[1024] = "";
    int rc = pt_trace_read_file(path, NULL, &t, err, sizeof err);
    FUZZ_EXPECT_SENTENCE(rc, err);
    if (!rc && (mode & 2)) {
        pt_trace u;
        pt_trace_init(&u);
        pt_trace_key k = t.key;
        if (pt_trace_read_file(path, &k, &u, err, sizeof err)) abort();   /* its own key */
        pt_trace_free(&u);
        k.batch++;
        err[0] = '\0';
        if (pt_trace_read_file(path, &k, &u, err, sizeof err) == 0) abort();
        FUZZ_EXPECT_SENTENCE(1, err);
        pt_trace_free(&u);
    }
    if (!rc) round_trip(&t);
    pt_trace_free(&t);
    return 0;
}
