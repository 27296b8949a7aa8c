/*
 * sh_trainer_int.h — the trainer object shared by the files of the trainer
 * (train.c: setup, passes, callbacks, steps; trainer_io.c: reading and writing
 * its state). Not for other sample_host code: they use sh_train.h.
 */
#ifndef SH_TRAINER_INT_H
#define SH_TRAINER_INT_H

#include <stddef.h>
#include <stdint.h>

#include "protrain.h"
#include "sh_llmc.h"
#include "sh_tiled.h"
#include "sh_train.h"
#include "sh_work.h"

struct sh_trainer {
    sh_train_opts o;
    sh_model model;
    const pt_plugin_v1 *tbl; /* NULL: no plugin */
    const sh_cuda *cu;       /* NULL: the layers run on the CPU */
    void *ctx;
    pt_host_v1 host;
    pt_model_v1 pm;
    /* device buffers (dev_alloc or aligned_alloc) */
    int32_t *inp, *tgt;   /* (B,T) "input" */
    float **res;          /* L+1 of (B,T,C) "act": res[l] is the input of block l */
    float *head_buf;      /* "act": lnf (N,C) mean (N) rstd (N) logits (N,Vp) losses (N) */
    sh_head_acts head;
    float *scr_buf;       /* "scratch": dres (N,C) dbig (N,4C) dsmall (N,C) datt (slots,T,T)
                             wtmp (4C,C) */
    float *dres;
    sh_scratch scr;
    float **arenas;       /* no-plugin: L arenas of the (B,T) layout */
    /* no-plugin parameter state, flat layout (model.n_floats) */
    float *p_data, *p_grad, *opt_m, *opt_v;
    int64_t t;            /* no-plugin optimizer steps taken */
    double last_norm;
    /* host staging */
    int32_t *h_inp, *h_tgt; /* (B,T) */
    int32_t *h_skip;        /* (2,B,T): other ranks' batches, drawn and dropped */
    float *h_row;           /* (Vp) logits row for sampling */
    sh_sampler batch;   /* the batch order (sh_llmc.h) */
    sh_launcher lw;         /* device work: at once, or launched on the plugin's stream */
    double loss_acc;        /* the head's losses land here (read after sh_work_sync) */
    double *dstat;          /* cuda: device doubles [loss accumulator, last grad norm] */
    size_t *seg_off, *seg_len; /* cuda no-plugin: trainable untied params (floats) */
    int nseg;
    char opened[16];        /* the backend the plugin's start line named ("" unseen) */
    int curB, curT, in_pass;
    sh_tiled tl;            /* TiledMLP (tiled.c): tl.on when the plugin tiles the MLPs */
    int32_t osft_st;        /* the first failed OSFT hook's status (model.osft_status) */
    int64_t osft_targets;   /* weights the plugin decomposed (0: OSFT off) */
    char err[768];
    char cb_err[384];       /* error raised inside a callback */
};

/* One sentence into tr->err; returns -1. */
int sh_trainer_fail(sh_trainer *tr, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* A hook returned non-zero: name it, its argument, the status and the plugin's sentence. */
int sh_trainer_hook_fail(sh_trainer *tr, const char *hook, long long arg, int32_t st);
/* The CPU waits for the device work so far (0 or -1 with tr->err). */
int sh_trainer_sync(sh_trainer *tr);
/* Copies through the one device interface (kind PT_COPY_*); 0 or -1. */
int sh_trainer_copy(sh_trainer *tr, void *dst, const void *src, size_t bytes, int kind);
void sh_trainer_dzero(sh_trainer *tr, void *dst, size_t bytes);

/* Call a plugin hook; a non-zero status returns from the caller with tr->err set. */
#define HOOK(name, arg, ...) \
    do { \
        int32_t st_ = tr->tbl->name(tr->ctx, __VA_ARGS__); \
        if (st_ != 0) return sh_trainer_hook_fail(tr, #name, (long long)(arg), st_); \
    } while (0)

/* The CPU is about to read what launched work computed. */
#define SYNC() \
    do { \
        if (sh_trainer_sync(tr)) return -1; \
    } while (0)

#endif
