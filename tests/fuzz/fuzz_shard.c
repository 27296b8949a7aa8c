/*
 * fuzz_shard.c — libFuzzer target: an llm.c token shard through sample_host's
 * reader (sh_data_read_shard, every header field and the size checked) and the
 * --data detector (sh_data_load: shard by magic, else text). Properties: no
 * crash, no sanitizer report, a refusal carries a sentence.
 */
#include <stdint.h>

#include "fuzz_file.h"
#include "sh_data.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *path = fuzz_file(data, size);
    char err[1024] = "";
    sh_tokens t = {0};
    int rc = sh_data_read_shard(path, &t, err, sizeof err);
    FUZZ_EXPECT_SENTENCE(rc, err);
    sh_data_tokens_free(&t);
    err[0] = '\0';
    sh_tokens u = {0};
    rc = sh_data_load(path, &u, err, sizeof err);
    FUZZ_EXPECT_SENTENCE(rc, err);
    sh_data_tokens_free(&u);
    return 0;
}
