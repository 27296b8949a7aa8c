/*
 * fuzz_state.c — libFuzzer target: a plugin state file through load_state on
 * a live tiny model (sample_host's trainer on the simulated device, the
 * plugin linked in). Each input is written as the rank-0 state file of a
 * scratch folder and loaded. Properties: no crash, no sanitizer report, a
 * refusal carries a sentence, and a refused file changes nothing — the model's
 * parameters read back identical to before the load.
 *
 * Input: one mode byte, then the file. The file's checksum covers every byte,
 * so a random mutation of a real file is refused at the checksum and the
 * payload reader behind it never runs. With the mode byte's bit 0 set the
 * target seals the file first, as a writer would: payload_bytes = the bytes
 * after the header, checksum = FNV-1a 64 of the header (checksum field 0) and
 * payload. With it clear the file goes in as given (the framing checks stay
 * fuzzed). The seal's offsets are checked at start-up against a file the
 * plugin saves: a changed format stops the target with a sentence instead of
 * fuzzing the checksum check alone again.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/base.h"
#include "protrain.h"
#include "sh_train.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

extern const pt_plugin_v1 protrain_plugin_v1;

static sh_trainer *TR;
static char DIR_[64], FILE_[128];
static float *before, *after;
static size_t NF;

static void quiet(void *u, int32_t level, const char *msg) { (void)u, (void)level, (void)msg; }

/* The state file's framing (runtime/store/state_io.c: st_header). */
enum { HDR = 104,
       OFF_MAGIC = 0,
       OFF_PAYLOAD = 32,
       OFF_SUM = 40 };
static const uint32_t MAGIC = 0x54535450u;   /* "PTST" */

/* Seal f[0..n) in place when it has a header with the state magic. */
static void seal(uint8_t *f, size_t n) {
    uint32_t magic;
    if (n < HDR) return;
    memcpy(&magic, f + OFF_MAGIC, sizeof magic);
    if (magic != MAGIC) return;
    uint64_t payload = n - HDR, zero = 0;
    memcpy(f + OFF_PAYLOAD, &payload, sizeof payload);
    memcpy(f + OFF_SUM, &zero, sizeof zero);
    uint64_t sum = pt_fnv1a64_more(pt_fnv1a64(f, HDR), f + HDR, n - HDR);
    memcpy(f + OFF_SUM, &sum, sizeof sum);
}

/* The plugin saves this model's state; sealing a copy of it must give back
 * the same bytes, or the offsets above no longer describe the format. */
static void check_seal(void) {
    if (sh_trainer_plugin_state(TR, DIR_, 0)) {
        fprintf(stderr, "fuzz_state: save_state failed: %s\n", sh_trainer_error(TR));
        abort();
    }
    FILE *f = fopen(FILE_, "rb");
    if (!f) abort();
    static uint8_t ref[1 << 20], copy[1 << 20];
    size_t n = fread(ref, 1, sizeof ref, f);
    fclose(f);
    memcpy(copy, ref, n);
    memset(copy + OFF_SUM, 0xA5, 8);
    memset(copy + OFF_PAYLOAD, 0x5A, 8);
    seal(copy, n);
    if (n < HDR || n == sizeof ref || memcmp(ref, copy, n)) {
        fprintf(stderr, "fuzz_state: the state file's header no longer matches this target's "
                        "seal() (magic, payload_bytes, checksum offsets or header size); "
                        "update it to the format in runtime/store/state_io.c\n");
        abort();
    }
    /* PT_FUZZ_STATE_SEED=path: write this file as a sealed-mode seed
     * (tests/fuzz/corpus/fuzz_state/ holds one made so) */
    const char *seed = getenv("PT_FUZZ_STATE_SEED");
    if (seed && (f = fopen(seed, "wb"))) {
        fputc(1, f);
        fwrite(ref, 1, n, f);
        fclose(f);
    }
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    snprintf(DIR_, sizeof DIR_, "/tmp/fuzz_state.%d", (int)getpid());
    snprintf(FILE_, sizeof FILE_, "%s/protrain_state_rank0.bin", DIR_);
    if (mkdir(DIR_, 0700) && access(DIR_, W_OK)) abort();
    static uint16_t tok[4096];
    for (size_t i = 0; i < sizeof tok / sizeof tok[0]; i++) tok[i] = (uint16_t)("fuzz the state file "[i % 20]);
    sh_train_opts o;
    memset(&o, 0, sizeof o);
    o.dims = (sh_dims){.V = 256, .maxT = 8, .L = 1, .NH = 2, .C = 16};
    o.B = 1;
    o.T = 8;
    o.n_micro = 1;
    o.seed = 1;
    o.lr = 1e-3f;
    o.beta1 = 0.9f;
    o.beta2 = 0.95f;
    o.eps = 1e-8f;
    o.tbl = &protrain_plugin_v1;
    static sh_tokens toks;
    toks.tok = tok;
    toks.n = sizeof tok / sizeof tok[0];
    o.train = &toks;
    o.val = &toks;
    static char ini[128];
    snprintf(ini, sizeof ini, "%s/fuzz.ini", DIR_);
    FILE *cf = fopen(ini, "w");
    if (!cf) abort();
    fputs("[plugin]\nbackend = host\nlog_level = error\n[memory]\ndevice_capacity = 16MiB\n", cf);
    fclose(cf);
    o.ini_path = ini;
    o.log = quiet;
    char err[512];
    if (sh_trainer_create(&TR, &o, err, sizeof err)) {
        fprintf(stderr, "fuzz_state: trainer: %s\n", err);
        abort();
    }
    double loss;
    if (sh_trainer_step(TR, 1, 1e-3f, &loss)) abort();
    NF = sh_trainer_model(TR)->n_floats;
    before = malloc(NF * sizeof(float));
    after = malloc(NF * sizeof(float));
    if (!before || !after) abort();
    check_seal();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!size) return 0;
    size_t n = size - 1;
    uint8_t *file = malloc(n ? n : 1);
    if (!file) abort();
    memcpy(file, data + 1, n);
    if (data[0] & 1) seal(file, n);
    FILE *f = fopen(FILE_, "wb");
    if (!f) abort();
    if (n && fwrite(file, 1, n, f) != n) abort();
    fclose(f);
    free(file);
    if (sh_trainer_snapshot(TR, before)) abort();
    int rc = sh_trainer_plugin_state(TR, DIR_, 1);
    if (rc) {
        const char *e = sh_trainer_error(TR);
        if (!e || !e[0]) abort();                       /* a refusal says why */
        if (sh_trainer_snapshot(TR, after)) abort();
        if (memcmp(before, after, NF * sizeof(float))) abort();   /* and changes nothing */
    }
    return 0;
}
