/*
 * tiny_model.h — the smallest model the plugin accepts, for hook-level tests
 * that drive the plugin table directly: two blocks of one fp32 weight each plus
 * a non-block embedding, 64 elements per parameter, deterministic initial
 * values. Names live in the struct so a test may change them.
 * Names: tiny_ functions and types, TINY_ constants.
 * Header-only (static functions); include once per test program.
 */
#ifndef PT_TINY_MODEL_H
#define PT_TINY_MODEL_H

#include <stdio.h>
#include <string.h>

#include "protrain.h"

enum { TINY_NP = 3,
       TINY_NB = 2,
       TINY_NEL = 64 };
typedef struct tiny {
    pt_param_v1 p[TINY_NP];
    pt_model_v1 m;
    float init[TINY_NP][TINY_NEL];
    char names[TINY_NP][128];
} tiny;

static void tiny_make(tiny *t) {
    memset(t, 0, sizeof *t);
    static const char *names[TINY_NP] = {"emb", "b0.w", "b1.w"};
    static const int blk[TINY_NP] = {-1, 0, 1};
    for (int i = 0; i < TINY_NP; i++) {
        snprintf(t->names[i], sizeof t->names[i], "%s", names[i]);
        t->p[i] = (pt_param_v1){.name = t->names[i], .dtype = PT_F32, .ndim = 1, .shape = {TINY_NEL}, .block = blk[i], .trainable = 1, .tie = -1, .init = t->init[i]};
        for (int k = 0; k < TINY_NEL; k++) t->init[i][k] = 0.01f * (float)((i * 7 + k) % 13);
    }
    t->m = (pt_model_v1){.struct_size = sizeof t->m, .n_params = TINY_NP, .params = t->p, .n_blocks = TINY_NB, .batch = 1, .seq = 1, .arch = "tiny"};
}

#endif
