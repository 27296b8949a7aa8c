/*
 * gen_ident.c — what makes a checkpoint generation one run's, and the values its
 * host state may hold. Every generation records the run's id (drawn once when a
 * run starts fresh, carried on by every resume), its step and world size in the
 * MANIFEST and in host.txt; the plugin's state files carry their step, rank and
 * world in their own header. A file copied in from another generation or run is
 * found by the MANIFEST's checksum of every file and by those fields; a value no
 * run writes (a checksum made valid by hand, a foreign writer) by the bounds below.
 */
#include "sh_resume.h"

#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <time.h>
#include <unistd.h>

uint64_t sh_gen_new_id(void) {
    uint64_t id = 0;
    int fd = open("/dev/urandom", O_RDONLY);
    if (fd >= 0) {
        if (read(fd, &id, sizeof id) != (ssize_t)sizeof id) id = 0;
        close(fd);
    }
    if (!id) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        id = ((uint64_t)ts.tv_sec * 1000000007ull) ^ (uint64_t)ts.tv_nsec ^
             ((uint64_t)getpid() << 32);
    }
    return id ? id : 1;   /* 0 means "not recorded" (generations of earlier versions) */
}

static int say(char *why, size_t wl, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, wl, fmt, ap);
    va_end(ap);
    return -1;
}

int sh_gen_check_values(const sh_resume_state *s, const sh_config *c, char *why, size_t wl) {
    /* step equals the folder's (checked by the caller) and is at most the run's
     * steps; the optimizer took one step per step that was not skipped, the host's
     * own AdamW counts them (with the plugin opt_steps stays 0) */
    if (s->step < 0 || s->step > c->steps)
        return say(why, wl, "step = %lld is outside [0, steps = %d]", (long long)s->step,
                   c->steps);
    if (s->n_skipped < 0 || s->n_skipped > s->step)
        return say(why, wl, "n_skipped = %lld is outside [0, step = %lld]",
                   (long long)s->n_skipped, (long long)s->step);
    if (s->tr.opt_steps < 0 || s->tr.opt_steps > s->step - s->n_skipped)
        return say(why, wl, "opt_steps = %lld is outside [0, step - n_skipped = %lld]",
                   (long long)s->tr.opt_steps, (long long)(s->step - s->n_skipped));
    if (s->metrics_bytes < 0)
        return say(why, wl, "metrics_bytes = %lld is negative", (long long)s->metrics_bytes);
    /* every rank's micro-batches of every step, at most */
    double per_step = (double)c->batch * c->seq * c->grad_accum * (c->world > 1 ? c->world : 1);
    if (s->train_tokens < 0 || (double)s->train_tokens > per_step * (double)s->step)
        return say(why, wl, "train_tokens = %lld is outside [0, %.0f tokens a step x %lld steps]",
                   (long long)s->train_tokens, per_step, (long long)s->step);
    if (!isfinite(s->train_time) || s->train_time < 0)
        return say(why, wl, "train_time = %g is not a finite number of seconds >= 0",
                   s->train_time);
    /* the summary's last losses: NaN before the first (validation) loss, never infinite */
    if (isinf(s->last_loss) || (!isnan(s->last_loss) && s->last_loss < 0))
        return say(why, wl, "last_loss = %g is not a loss (finite, >= 0, or NaN before any)",
                   s->last_loss);
    if (isinf(s->last_val) || (!isnan(s->last_val) && s->last_val < 0))
        return say(why, wl, "last_val = %g is not a loss (finite, >= 0, or NaN before any)",
                   s->last_val);
    if (s->world < 0)
        return say(why, wl, "world = %d is negative", s->world);
    return 0;
}
