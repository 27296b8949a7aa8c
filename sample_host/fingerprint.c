/*
 * fingerprint.c — sample_host's pt_host_v1.fingerprint (sh_fingerprint.h).
 */
#include "sh_fingerprint.h"

#include <stdint.h>
#include <stdio.h>

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

int sh_fingerprint(const sh_config *c, const sh_tokens *train, const sh_tokens *val, char *buf,
                   size_t len) {
    int n = snprintf(buf, len,
                     "seed=%llu\nbatch=%d\nseq=%d\ngrad_accum=%d\nsteps=%d\n"
                     "optimizer_from_ini=%d\nlr=%.9g\nmin_lr_frac=%.9g\nwarmup=%d\n"
                     "lr_schedule=%d\nweight_decay=%.9g\nbeta1=%.9g\nbeta2=%.9g\neps=%.9g\n"
                     "max_grad_norm=%.9g\non_nonfinite=%d\ndata_order=%d\n"
                     "data.train_tokens=%zu\ndata.train_hash=%016llx\n"
                     "data.val_tokens=%zu\ndata.val_hash=%016llx\n"
                     /* the run's identity the plugin records in its state files and
                     * compares on load: what a resume of this run must share */
                     "run.seed=%llu\nrun.data.train_hash=%016llx\nrun.data.val_hash=%016llx\n",
                     (unsigned long long)c->seed, c->batch, c->seq, c->grad_accum, c->steps,
                     c->optim_from_ini, (double)c->lr, (double)c->min_lr_frac, c->warmup,
                     c->lr_schedule, (double)c->weight_decay, (double)c->beta1,
                     (double)c->beta2, (double)c->eps, (double)c->max_grad_norm,
                     c->on_nonfinite, c->data_order, train ? train->n : (size_t)0,
                     (unsigned long long)tokens_hash(train), val ? val->n : (size_t)0,
                     (unsigned long long)tokens_hash(val), (unsigned long long)c->seed,
                     (unsigned long long)tokens_hash(train), (unsigned long long)tokens_hash(val));
    return n < 0 || (size_t)n >= len ? -1 : 0;
}
