/*
 * fuzz_ini.c — libFuzzer target: INI text through the parser and the schema
 * validation (pt_config_parse_string). Properties: no crash, no sanitizer
 * report, and a refused input always comes with a sentence.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "fuzz_file.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *text = malloc(size + 1);
    if (!text) return 0;
    memcpy(text, data, size);
    text[size] = '\0';
    pt_config c;
    pt_config_defaults(&c);
    char err[1024] = "";
    int rc = pt_config_parse_string(text, "fuzz.ini", &c, err, sizeof err);
    FUZZ_EXPECT_SENTENCE(rc, err);
    free(text);
    return 0;
}
