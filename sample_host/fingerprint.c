/*
 * fingerprint.c — sample_host's pt_host_v1.fingerprint (sh_fingerprint.h).
 */
#include "sh_fingerprint.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "sh_llmc.h"

#define SAMPLE_TOKENS ((size_t)1 << 22)

/* FNV-1a 64 over the token ids (as 16-bit values, low byte first), all of
 * them up to SAMPLE_TOKENS, else SAMPLE_TOKENS at stride n / SAMPLE_TOKENS. */
static uint64_t tokens_hash(const sh_tokens *t) {
    uint64_t h = 14695981039346656037ull;
    if (!t || !t->tok) return h;
    size_t stride = t->n > SAMPLE_TOKENS ? t->n / SAMPLE_TOKENS : 1;
    for (size_t i = 0; i < t->n; i += stride) {
        uint16_t v = t->tok[i];
        h = (h ^ (v & 0xffu)) * 1099511628211ull;
        h = (h ^ (v >> 8)) * 1099511628211ull;
    }
    return h;
}

typedef struct fp_buf {
    char *s;
    size_t n, used;
    int full;
} fp_buf;

static void line(fp_buf *b, const char *name, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void line(fp_buf *b, const char *name, const char *fmt, ...) {
    if (b->full) return;
    int k = snprintf(b->s + b->used, b->n - b->used, "%s=", name);
    if (k < 0 || (size_t)k >= b->n - b->used) {
        b->full = 1;
        return;
    }
    b->used += (size_t)k;
    va_list ap;
    va_start(ap, fmt);
    k = vsnprintf(b->s + b->used, b->n - b->used, fmt, ap);
    va_end(ap);
    if (k < 0 || (size_t)k + 1 >= b->n - b->used) {
        b->full = 1;
        return;
    }
    b->used += (size_t)k;
    b->s[b->used++] = '\n';
    b->s[b->used] = '\0';
}

int sh_fingerprint(const sh_config *c, const sh_dims *d, const sh_tokens *train,
                   const sh_tokens *val, char *buf, size_t len) {
    static const char *const sched[] = {"cosine", "constant", "linear"};
    static const char *const order[] = {"random", "sequential", "shuffled"};
    fp_buf b = {buf, len, 0, len == 0};
    if (len) buf[0] = '\0';
    uint64_t th = tokens_hash(train), vh = tokens_hash(val);
    int W = c->world > 1 ? c->world : 1;
    /* The run's identity: what fixes the trajectory of the losses and is not
     * the optimizer's hyper-parameters (those the plugin's state files record
     * and compare themselves). The plugin hashes these lines into every state
     * file and refuses a file whose run had others. Micro-batches per step are
     * counted over all ranks: 2 ranks x 1 take the batches 1 rank x 2 takes. */
    line(&b, "run.seed", "%llu", (unsigned long long)c->seed);
    line(&b, "run.vocab", "%d", d->V);
    line(&b, "run.padded_vocab", "%d", d->Vp);
    line(&b, "run.max_seq", "%d", d->maxT);
    line(&b, "run.layers", "%d", d->L);
    line(&b, "run.heads", "%d", d->NH);
    line(&b, "run.channels", "%d", d->C);
    line(&b, "run.batch", "%d", c->batch);
    line(&b, "run.seq", "%d", c->seq);
    line(&b, "run.micro_batches_per_step", "%d", c->grad_accum * W);
    line(&b, "run.steps", "%d", c->steps);
    line(&b, "run.optimizer", "%s", c->optim_from_ini ? "ini" : "adamw");
    line(&b, "run.warmup", "%d", c->warmup);
    line(&b, "run.lr_schedule", "%s", sched[c->lr_schedule]);
    line(&b, "run.min_lr_frac", "%.9g", (double)c->min_lr_frac);
    line(&b, "run.data_order", "%s", order[c->data_order]);
    line(&b, "run.device", "%s", c->device == SH_DEVICE_CUDA ? "cuda" : "cpu");
    line(&b, "run.data.train_tokens", "%zu", train ? train->n : (size_t)0);
    line(&b, "run.data.train_hash", "%016llx", (unsigned long long)th);
    line(&b, "run.data.val_tokens", "%zu", val ? val->n : (size_t)0);
    line(&b, "run.data.val_hash", "%016llx", (unsigned long long)vh);
    /* The ranks only: what every rank must share to train together. */
    line(&b, "grad_accum", "%d", c->grad_accum);
    line(&b, "on_nonfinite", "%d", c->on_nonfinite);
    line(&b, "lr", "%.9g", (double)c->lr);
    line(&b, "weight_decay", "%.9g", (double)c->weight_decay);
    line(&b, "beta1", "%.9g", (double)c->beta1);
    line(&b, "beta2", "%.9g", (double)c->beta2);
    line(&b, "eps", "%.9g", (double)c->eps);
    line(&b, "max_grad_norm", "%.9g", (double)c->max_grad_norm);
    /* evaluation and samples run the model through the plugin (in mode C
     * gathering every chunk from all ranks), so every rank runs them at the
     * same steps; their settings also fix the validation losses */
    line(&b, "val_every", "%d", c->val_every);
    line(&b, "val_batches", "%d", c->val_batches);
    line(&b, "gen_every", "%d", c->gen_every);
    line(&b, "gen_len", "%d", c->gen_len);
    line(&b, "temperature", "%.9g", (double)c->temperature);
    /* checkpoints: every rank writes its state file into the one generation
     * folder rank 0 makes, at the same steps, so the ranks name one folder;
     * --save reads every parameter back (a gather in mode C) on every rank */
    line(&b, "checkpoint_dir", "%s", c->checkpoint_dir);
    line(&b, "checkpoint_every", "%d", c->checkpoint_every);
    line(&b, "stop_after", "%d", c->stop_after);
    line(&b, "resume", "%d", c->resume);
    line(&b, "save", "%s", c->save[0] ? "yes" : "no");
    line(&b, "debug_nan_step", "%d", c->debug_nan_step);
    return b.full ? -1 : 0;
}
