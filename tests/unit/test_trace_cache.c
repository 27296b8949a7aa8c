/*
 * test_trace_cache.c — runtime/trace_cache.h: round trip, misses with a
 * warning for corrupt / truncated / foreign-key / other-version files, and a
 * mutation fuzz loop (with and without a repaired checksum) that must never
 * crash or return an invalid trace.
 */
#include <dirent.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "planner/ds_estimates.h"
#include "protrain.h"
#include "planner/trace_cache.h"

static char dir[256];

static int setup(void **state) {
    (void)state;
    snprintf(dir, sizeof dir, "/tmp/pt_trace_cache_test.%ld", (long)getpid());
    return 0;
}

static void rm_dir(void) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    char p[512];
    while ((e = readdir(d)))
        if (e->d_name[0] != '.') {
            snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
            unlink(p);
        }
    closedir(d);
    rmdir(dir);
}

static int teardown(void **state) {
    (void)state;
    rm_dir();
    return 0;
}

static void sample(pt_trace *t) {
    pt_model_shape m = {PT_ARCH_LLAMA, 6, 512, 8, 4, 0, 32000, 256, 2, 0, PT_BF16, 0, 1, 0.5};
    pt_hw_shape hw = {4ull << 30, 12.5e9, 11e9, 1, 1, 8e8, 2e10, 30e12, 0, 6ull << 30, "Fake GPU \"x\"", 0, 0};
    pt_trace_init(t);
    char err[256];
    assert_int_equal(pt_shape_trace(&m, &hw, 4 << 20, t, err, sizeof err), PT_OK);
    t->blocks[3].fwd_s = 1.0 / 3.0;   /* a value that needs all 64 bits */
    /* the allocator's fragmentation as a profile records it */
    t->frag = (pt_trace_frag){.factor = 7.0 / 6.0, .peak_bytes = 6ull << 20, .span_bytes = 7ull << 20, .largest_free = 3ull << 20, .rounding_bytes = 4608};
    /* exact footprints on some chunks (as the profiler fills them), 0 on others */
    for (int32_t k = 0; k < t->n_chunk; k += 2) {
        t->chunks[k].dev_bytes = pt_trace_chunk_dev_state(t, &t->chunks[k]) + 256 * (uint64_t)(k % 5) + 17;
        t->chunks[k].host_bytes = pt_trace_chunk_host_state(t, &t->chunks[k]) + (uint64_t)k;
    }
    /* tensor parallel (tp 2 of 4 ranks): gather bytes on one block chunk */
    t->key.world_size = 4;
    t->tp_size = 2;
    t->chunks[1].tp_grad_bytes = 8 * t->chunks[1].trainable_elems;
    t->chunks[1].tp_factor_bytes = 3 * t->chunks[1].tp_grad_bytes + 5;
    /* mode C REKLS figures on one chunk (they travel like the rest) */
    t->chunks[1].optim_aux_words = 4097;
    t->chunks[1].optim_mn = 1025;
    t->chunks[1].optim_own_max = 3001;
}

static void assert_same(const pt_trace *a, const pt_trace *b) {
    assert_memory_equal(&a->key, &b->key, offsetof(pt_trace_key, device));
    assert_string_equal(a->key.device, b->key.device);
    assert_int_equal(a->n_block, b->n_block);
    assert_int_equal(a->n_chunk, b->n_chunk);
    assert_memory_equal(a->blocks, b->blocks, (size_t)a->n_block * sizeof *a->blocks);
    assert_memory_equal(a->chunks, b->chunks, (size_t)a->n_chunk * sizeof *a->chunks);
    assert_true(a->chunk_size == b->chunk_size && a->slot_bytes == b->slot_bytes);
    assert_int_equal(a->tp_size, b->tp_size);
    assert_true(a->embed_fwd_s == b->embed_fwd_s && a->head_bwd_s == b->head_bwd_s);
    assert_true(a->nonblock_bytes == b->nonblock_bytes && a->nonblock_scratch_bytes == b->nonblock_scratch_bytes);
    assert_true(a->param_elem_bytes == b->param_elem_bytes && a->master_elem_bytes == b->master_elem_bytes &&
                a->host_grad_elem_bytes == b->host_grad_elem_bytes);
    assert_memory_equal(&a->hw, &b->hw, sizeof a->hw);
    assert_memory_equal(&a->calib, &b->calib, sizeof a->calib);
    assert_memory_equal(&a->frag, &b->frag, sizeof a->frag);
}

static long file_size(const char *p) {
    struct stat st;
    return stat(p, &st) == 0 ? (long)st.st_size : -1;
}

static unsigned char *slurp(const char *p, long *n) {
    *n = file_size(p);
    FILE *f = fopen(p, "rb");
    assert_non_null(f);
    unsigned char *b = malloc((size_t)*n);
    assert_int_equal(fread(b, 1, (size_t)*n, f), (size_t)*n);
    fclose(f);
    return b;
}

static void spit(const char *p, const unsigned char *b, long n) {
    FILE *f = fopen(p, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(b, 1, (size_t)n, f), (size_t)n);
    fclose(f);
}

static void test_round_trip(void **state) {
    (void)state;
    pt_trace t, u;
    sample(&t);
    pt_trace_init(&u);
    char warn[512] = "x", err[512];
    /* nothing stored yet: clean miss, empty warning */
    assert_int_equal(pt_trace_cache_load(dir, &t.key, &u, warn, sizeof warn), PT_CACHE_MISS);
    assert_string_equal(warn, "");
    assert_int_equal(pt_trace_cache_store(dir, &t, err, sizeof err), PT_OK);
    assert_int_equal(pt_trace_cache_load(dir, &t.key, &u, warn, sizeof warn), PT_CACHE_HIT);
    assert_string_equal(warn, "");
    assert_same(&t, &u);
    assert_true(u.chunks[0].dev_bytes > 0 && u.chunks[2].host_bytes > 0);
    assert_int_equal(pt_trace_chunk_dev_state(&u, &u.chunks[0]), t.chunks[0].dev_bytes);
    assert_int_equal(pt_trace_chunk_host_state(&u, &u.chunks[2]), t.chunks[2].host_bytes);
    /* exactly one file, no temp left behind */
    DIR *d = opendir(dir);
    int files = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (e->d_name[0] != '.') {
            files++;
            assert_non_null(strstr(e->d_name, ".trace"));
            assert_null(strstr(e->d_name, ".tmp"));
        }
    closedir(d);
    assert_int_equal(files, 1);
    /* a different key is a clean miss (another file name) */
    pt_trace_key k2 = t.key;
    k2.batch++;
    assert_int_equal(pt_trace_cache_load(dir, &k2, &u, warn, sizeof warn), PT_CACHE_MISS);
    assert_string_equal(warn, "");
    /* storing again replaces atomically */
    t.blocks[0].arena_bytes += 1;
    assert_int_equal(pt_trace_cache_store(dir, &t, err, sizeof err), PT_OK);
    assert_int_equal(pt_trace_cache_load(dir, &t.key, &u, warn, sizeof warn), PT_CACHE_HIT);
    assert_same(&t, &u);
    pt_trace_free(&t);
    pt_trace_free(&u);
}

static void store_and_path(pt_trace *t, char *path, size_t len) {
    char err[512];
    sample(t);
    assert_int_equal(pt_trace_cache_store(dir, t, err, sizeof err), PT_OK);
    assert_int_equal(pt_trace_cache_path(dir, &t->key, path, len), PT_OK);
}

static void expect_miss(const pt_trace *t, const char *why) {
    pt_trace u;
    pt_trace_init(&u);
    char warn[512] = "";
    assert_int_equal(pt_trace_cache_load(dir, &t->key, &u, warn, sizeof warn), PT_CACHE_MISS);
    assert_true(strlen(warn) > 0);
    if (!strstr(warn, why)) fprintf(stderr, "warning was: %s\n", warn);
    assert_non_null(strstr(warn, why));
    assert_null(u.blocks);
    pt_trace_free(&u);
}

static void test_corrupt_truncated_foreign(void **state) {
    (void)state;
    pt_trace t;
    char path[512];
    store_and_path(&t, path, sizeof path);
    long n;
    unsigned char *orig = slurp(path, &n);
    assert_true(n > PT_TRACE_HEADER_BYTES + 100);
    unsigned char *b = malloc((size_t)n);

    memcpy(b, orig, (size_t)n);
    b[n - 7] ^= 0x40;   /* payload bit flip */
    spit(path, b, n);
    expect_miss(&t, "checksum");

    memcpy(b, orig, (size_t)n);
    b[0] = 'X';
    spit(path, b, n);
    expect_miss(&t, "magic");

    long cuts[] = {0, 10, PT_TRACE_HEADER_BYTES - 1, PT_TRACE_HEADER_BYTES, PT_TRACE_HEADER_BYTES + 5, n - 1};
    for (size_t i = 0; i < sizeof cuts / sizeof cuts[0]; i++) {
        spit(path, orig, cuts[i]);
        expect_miss(&t, "truncated");
    }
    /* trailing garbage is not silently accepted either */
    memcpy(b, orig, (size_t)n);
    spit(path, b, n);
    FILE *f = fopen(path, "ab");
    fputs("junk", f);
    fclose(f);
    expect_miss(&t, "truncated or oversized");

    /* the file of another key placed under this key's name */
    pt_trace other;
    pt_trace_init(&other);
    assert_int_equal(pt_trace_copy(&other, &t, NULL, 0), PT_OK);
    other.key.seq *= 2;
    char err[512];
    assert_int_equal(pt_trace_write_file(path, &other, err, sizeof err), PT_OK);
    expect_miss(&t, "another key");

    /* another trace version (header field at offset 44) */
    memcpy(b, orig, (size_t)n);
    b[44] = (unsigned char)(PT_TRACE_VERSION + 1);
    spit(path, b, n);
    expect_miss(&t, "trace version");
    /* another file format (offset 8) */
    memcpy(b, orig, (size_t)n);
    b[8] = (unsigned char)(PT_TRACE_FILE_VERSION + 1);
    spit(path, b, n);
    expect_miss(&t, "file format");

    /* the original still loads */
    spit(path, orig, n);
    pt_trace u;
    pt_trace_init(&u);
    char warn[512];
    assert_int_equal(pt_trace_cache_load(dir, &t.key, &u, warn, sizeof warn), PT_CACHE_HIT);
    pt_trace_free(&u);
    free(b);
    free(orig);
    pt_trace_free(&other);
    pt_trace_free(&t);
}

/* FNV-1a as the file format defines it, to repair the checksum after a mutation. */
static uint64_t fnv(const unsigned char *p, size_t n) {
    uint64_t h = 14695981039346656037ull;
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

static void test_fuzz(void **state) {
    (void)state;
    pt_trace t;
    char path[512];
    store_and_path(&t, path, sizeof path);
    long n;
    unsigned char *orig = slurp(path, &n);
    unsigned char *b = malloc((size_t)n);
    uint64_t rng = 0x9e3779b97f4a7c15ull;
    int hits = 0, misses = 0;
    for (int it = 0; it < 400; it++) {
        memcpy(b, orig, (size_t)n);
        int flips = 1 + it % 4;
        for (int j = 0; j < flips; j++) {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            b[rng % (uint64_t)n] ^= (unsigned char)(1u << (rng >> 60 & 7));
        }
        if (it % 2) {   /* repair the checksum so the decoder and validator are reached */
            uint64_t h = fnv(b + PT_TRACE_HEADER_BYTES, (size_t)(n - PT_TRACE_HEADER_BYTES));
            for (int i = 0; i < 8; i++) b[120 + i] = (unsigned char)(h >> (8 * i));
        }
        spit(path, b, n);
        pt_trace u;
        pt_trace_init(&u);
        char warn[512] = "";
        int r = pt_trace_cache_load(dir, &t.key, &u, warn, sizeof warn);
        if (r == PT_CACHE_HIT) {
            hits++;
            assert_int_equal(pt_trace_validate(&u, NULL, 0), PT_OK);
        } else {
            misses++;
            assert_true(strlen(warn) > 0);
        }
        pt_trace_free(&u);
    }
    /* most mutations must be caught; some land in value fields and still validate */
    assert_true(misses > 200);
    assert_int_equal(hits + misses, 400);
    free(b);
    free(orig);
    pt_trace_free(&t);
}

static void test_validate_names_problem(void **state) {
    (void)state;
    pt_trace t;
    sample(&t);
    char err[256];
    assert_int_equal(pt_trace_validate(&t, err, sizeof err), PT_OK);
    t.blocks[1].chunk_hi++;
    assert_int_equal(pt_trace_validate(&t, err, sizeof err), PT_ERR_INVALID_ARG);
    assert_non_null(strstr(err, "block 1"));
    pt_trace_derive_ranges(&t);
    t.hw.copy_engines = 3;
    assert_int_equal(pt_trace_validate(&t, err, sizeof err), PT_ERR_INVALID_ARG);
    assert_non_null(strstr(err, "copy_engines"));
    t.hw.copy_engines = 1;
    /* fragmentation: a factor below 1, rounding above the peak, a span below it */
    t.frag.factor = 0.5;
    assert_int_equal(pt_trace_validate(&t, err, sizeof err), PT_ERR_INVALID_ARG);
    assert_non_null(strstr(err, "fragmentation"));
    t.frag.factor = 0.0;                     /* not measured: fine */
    assert_int_equal(pt_trace_validate(&t, err, sizeof err), PT_OK);
    t.frag.rounding_bytes = t.frag.peak_bytes + 1;
    assert_int_equal(pt_trace_validate(&t, err, sizeof err), PT_ERR_INVALID_ARG);
    t.frag.rounding_bytes = 0;
    t.frag.span_bytes = t.frag.peak_bytes - 1;
    assert_int_equal(pt_trace_validate(&t, err, sizeof err), PT_ERR_INVALID_ARG);
    t.frag.span_bytes = t.frag.peak_bytes;
    assert_int_equal(pt_trace_validate(&t, err, sizeof err), PT_OK);
    /* tensor parallel: a group size that does not divide the world, gather
     * bytes above P * 4 bytes per trainable element, gather bytes without TP */
    t.tp_size = 3;
    assert_int_equal(pt_trace_validate(&t, err, sizeof err), PT_ERR_INVALID_ARG);
    assert_non_null(strstr(err, "tp_size 3"));
    t.tp_size = 2;
    t.chunks[1].tp_grad_bytes = 8 * t.chunks[1].trainable_elems + 1;
    assert_int_equal(pt_trace_validate(&t, err, sizeof err), PT_ERR_INVALID_ARG);
    assert_non_null(strstr(err, "chunk 1 tensor-parallel"));
    t.chunks[1].tp_grad_bytes = 8 * t.chunks[1].trainable_elems;
    t.tp_size = 1;
    assert_int_equal(pt_trace_validate(&t, err, sizeof err), PT_ERR_INVALID_ARG);
    assert_non_null(strstr(err, "chunk 1 tensor-parallel"));
    t.tp_size = 2;
    assert_int_equal(pt_trace_validate(&t, err, sizeof err), PT_OK);
    t.chunks[2].trainable_elems = t.chunks[2].elems + 1;
    assert_int_equal(pt_trace_validate(&t, err, sizeof err), PT_ERR_INVALID_ARG);
    assert_non_null(strstr(err, "chunk 2"));
    /* an invalid trace is never written */
    char path[512];
    snprintf(path, sizeof path, "%s.bad", dir);
    assert_int_equal(pt_trace_write_file(path, &t, err, sizeof err), PT_ERR_INVALID_ARG);
    assert_int_equal(file_size(path), -1);
    pt_trace_free(&t);
    /* the arch hash is FNV-1a 64: reference value of the empty string and "a" */
    assert_true(pt_trace_arch_hash("") == 0xcbf29ce484222325ull);
    assert_true(pt_trace_arch_hash("a") == 0xaf63dc4c8601ec8cull);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_round_trip, setup, teardown),
        cmocka_unit_test_setup_teardown(test_corrupt_truncated_foreign, setup, teardown),
        cmocka_unit_test_setup_teardown(test_fuzz, setup, teardown),
        cmocka_unit_test_setup_teardown(test_validate_names_problem, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
