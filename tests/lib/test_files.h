/*
 * test_files.h — reading a whole file in a test. Header-only; include after
 * <cmocka.h> (a failed allocation or a short read fails the test).
 */
#ifndef PT_TEST_FILES_H
#define PT_TEST_FILES_H

#include <stdio.h>
#include <stdlib.h>

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

#endif
