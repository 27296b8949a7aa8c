/*
 * fuzz_state.c — libFuzzer target: a plugin state file through load_state on
 * a live tiny model (sample_host's trainer on the simulated device, the
 * plugin linked in). Each input is written as the rank-0 state file of a
 * scratch folder and loaded. Properties: no crash, no sanitizer report, a
 * refusal carries a sentence, and a refused file changes nothing — the model's
 * parameters read back identical to before the load.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

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
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    FILE *f = fopen(FILE_, "wb");
    if (!f) abort();
    if (size && fwrite(data, 1, size, f) != size) abort();
    fclose(f);
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
