/*
 * fuzz_trace.c — libFuzzer target: a profile-cache file through
 * pt_trace_read_file (any key accepted). Properties: no crash, no sanitizer
 * report, a refusal carries a sentence, and an accepted trace is freed cleanly.
 */
#include <stdint.h>

#include "fuzz_file.h"
#include "planner/planner.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *path = fuzz_file(data, size);
    pt_trace t;
    pt_trace_init(&t);
    char err[1024] = "";
    int rc = pt_trace_read_file(path, NULL, &t, err, sizeof err);
    FUZZ_EXPECT_SENTENCE(rc, err);
    pt_trace_free(&t);
    return 0;
}
