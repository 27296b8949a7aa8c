/*
 * lr.c — the learning-rate schedules (sh_llmc.h): linear warmup to lr, then
 * constant, linear down to lr * min_frac, or cosine down to it,
 * lr(p) = mn + (lr - mn) (1 + cos(pi p)) / 2 with p the fraction of the decay
 * steps done.
 */
#include <math.h>

#include "sh_llmc.h"

float sh_lr_at(int schedule, float lr_f, float min_frac, int warmup, int steps, int step) {
    double lr = lr_f, mn = lr * min_frac;
    if (warmup > 0 && step <= warmup) return (float)(lr * step / warmup);
    int decay = steps - warmup;
    if (decay <= 0 || schedule == SH_LR_CONSTANT) return (float)lr;
    double prog = (double)(step - warmup) / decay;
    if (schedule == SH_LR_LINEAR) return (float)(lr - (lr - mn) * prog);
    return (float)(mn + 0.5 * (1.0 + cos(M_PI * prog)) * (lr - mn));
}
