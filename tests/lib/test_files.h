/*
 * test_files.h — files in a test: reading a whole file, and a scratch folder
 * holding a small text corpus for sample_host runs. Header-only; include after
 * <cmocka.h> (a failed allocation or a short read fails the test).
 */
#ifndef PT_TEST_FILES_H
#define PT_TEST_FILES_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The file at path as a NUL-terminated string (the caller frees it), or NULL
 * when it cannot be opened. */
static inline char *pt_test_slurp(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = calloc((size_t)(n > 0 ? n : 0) + 1, 1);
    assert_non_null(b);
    assert_int_equal(fread(b, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    return b;
}

/* A fresh folder from the mkdtemp template `dir` (e.g. "/tmp/test_x.XXXXXX",
 * rewritten in place) with `text` = dir/text.txt, a corpus of 200 short lines;
 * 0, or -1 when the folder or the file cannot be made (a cmocka setup's
 * failure value). */
static inline int pt_test_corpus_dir(char *dir, char *text, size_t text_len) {
    if (!mkdtemp(dir)) return -1;
    snprintf(text, text_len, "%s/text.txt", dir);
    FILE *f = fopen(text, "w");
    if (!f) return -1;
    for (int i = 0; i < 200; i++) fprintf(f, "a small corpus line %d. ", i % 11);
    return fclose(f);
}

/* Removes a folder pt_test_corpus_dir made, with everything in it. */
static inline int pt_test_rm_dir(const char *dir) {
    char cmd[128];
    if (strlen(dir) + 16 > sizeof cmd) return -1;
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    return system(cmd) == 0 ? 0 : -1;
}

#endif
