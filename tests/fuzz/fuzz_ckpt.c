/*
 * fuzz_ckpt.c — libFuzzer target: an llm.c GPT-2 checkpoint through
 * sample_host's reader: the header (sh_ckpt_read_header) and, when it is
 * valid and the model small enough to allocate here, the tensors into a
 * model of those dims (sh_ckpt_load). Properties: no crash, no sanitizer
 * report, a refusal carries a sentence.
 */
#include <stdint.h>

#include "fuzz_file.h"
#include "sh_ckpt.h"
#include "sh_gpt.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *path = fuzz_file(data, size);
    char err[1024] = "";
    sh_dims d;
    int rc = sh_ckpt_read_header(path, &d, err, sizeof err);
    FUZZ_EXPECT_SENTENCE(rc, err);
    if (rc) return 0;
    /* the header checked the file size against the dims, so the file itself
     * bounds the model; still keep allocations small for the fuzzer */
    if ((uint64_t)d.Vp * (uint64_t)d.C > (1u << 22) || d.L > 64) return 0;
    sh_model m;
    err[0] = '\0';
    if (sh_model_create(&m, &d, err, sizeof err) != 0) {
        FUZZ_EXPECT_SENTENCE(1, err);
        return 0;
    }
    err[0] = '\0';
    rc = sh_ckpt_load(path, &m, err, sizeof err);
    FUZZ_EXPECT_SENTENCE(rc, err);
    sh_model_destroy(&m);
    return 0;
}
