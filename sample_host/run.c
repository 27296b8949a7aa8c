/*
 * run.c — the sample_host program around the trainer: data, plugin loading, the
 * warmup + cosine schedule, validation, samples, metrics (JSON lines), a progress bar
 * on a terminal (plain lines otherwise), the final summary and checkpoint save.
 */
#include "sh_dist.h"
#include "sh_run.h"

#include <math.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "protrain.h"
#include "pt_util.h"
#include "sh_ckpt.h"
#include "sh_paths.h"
#include "sh_cuda.h"
#include "sh_data.h"
#include "sh_fingerprint.h"
#include "sh_lock.h"
#include "sh_preflight.h"
#include "sh_resume.h"
#include "sh_train.h"

/* lr(step), step 1-based: linear warmup, then the configured schedule (sh_llmc.h). */
static float lr_at(const sh_config *c, int step) {
    return sh_lr_at(c->lr_schedule, c->lr, c->min_lr_frac, c->warmup, c->steps, step);
}

static const char *human(double bytes, char *buf, size_t n) {
    const char *u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int i = 0;
    while (bytes >= 1024.0 && i < 4) {
        bytes /= 1024.0;
        i++;
    }
    snprintf(buf, n, i ? "%.1f %s" : "%.0f %s", bytes, u[i]);
    return buf;
}

static void print_sample(const uint16_t *s, int n, int V) {
    for (int i = 0; i < n; i++) {
        if (V <= 256) {
            int c = s[i];
            putchar((c >= 32 && c < 127) || c == '\n' || c == '\t' ? c : '.');
        } else {
            printf("%s%u", i ? " " : "", (unsigned)s[i]);
        }
    }
    putchar('\n');
}

typedef struct runstate {
    const sh_config *c;
    sh_trainer *tr;
    sh_tokens all, train, val;
    sh_tokens val_file; /* --val-data: its tokens (val views them), else empty */
    pt_loaded_plugin lp;
    int have_plugin;
    sh_cuda cuda;       /* --device cuda: the opened library */
    int have_cuda;
    FILE *metrics;
    int bar;
    double train_time;
    long long train_tokens;
    double last_loss, last_val;
    sh_rng gen_rng;     /* the sampling stream (saved in checkpoints) */
    sh_resume rz;       /* checkpoint generations (sh_resume.h) */
    int start_step;     /* steps done before this process (resume), else 0 */
    char resumed_from[SH_PATH + 32];
    long long n_skipped, last_gen; /* skipped steps; step of the newest generation (-1) */
    int stopped;        /* stop_after ended the run early */
    int lock_fd;        /* the checkpoint folder's lock (sh_lock.h), -1 when none */
} runstate;

static int load_data(runstate *rs, char *err, size_t errlen) {
    const sh_config *c = rs->c;
    if (c->val_data[0] && sh_data_load(c->val_data, &rs->val_file, err, errlen)) return -1;
    if (c->data[0]) return sh_data_load_list(c->data, &rs->all, err, errlen);
    char root[4096];
    if (sh_data_find_repo_root(root, sizeof root)) {
        snprintf(err, errlen, "no --data given and the repository root (a folder with "
                              "host_api/protrain.h) was not found from $PT_ROOT, the current folder or "
                              "the executable's folder");
        return -1;
    }
    return sh_data_default_corpus(root, &rs->all, err, errlen);
}

/* Model dims from the config, or from the checkpoint header with --load (dims given
 * on the command line must then agree with the file). */
static int resolve_dims(const sh_config *c, sh_dims *d, char *err, size_t errlen) {
    d->V = c->vocab;
    d->Vp = 0;
    d->maxT = c->max_seq ? c->max_seq : c->seq;
    d->L = c->layers;
    d->NH = c->heads;
    d->C = c->channels;
    if (!c->load[0]) return sh_model_dims_check(d, err, errlen);
    sh_dims f;
    if (sh_ckpt_read_header(c->load, &f, err, errlen)) return -1;
    struct {
        unsigned bit;
        const char *flag, *field;
        int cli, file;
    } chk[] = {
        {SH_SET_VOCAB, "--vocab", "vocab_size", c->vocab, f.V},
        {SH_SET_MAXT, "--max-seq", "max_seq_len", c->max_seq, f.maxT},
        {SH_SET_LAYERS, "--layers", "num_layers", c->layers, f.L},
        {SH_SET_HEADS, "--heads", "num_heads", c->heads, f.NH},
        {SH_SET_CHANNELS, "--channels", "channels", c->channels, f.C},
    };
    for (size_t i = 0; i < sizeof chk / sizeof chk[0]; i++) {
        if ((c->cli_dims & chk[i].bit) && chk[i].cli != chk[i].file) {
            snprintf(err, errlen, "mismatched shape: %s %d but checkpoint %s has %s = %d",
                     chk[i].flag, chk[i].cli, c->load, chk[i].field, chk[i].file);
            return -1;
        }
    }
    *d = f;
    return 0;
}

static void plugin_log(void *user, int32_t level, const char *msg) {
    runstate *rs = user;
    if (level > PT_LOG_INFO || (rs->c->quiet && level > PT_LOG_WARN)) return;
    static const char *nm[] = {"error", "warn", "info"};
    fprintf(stderr, "%sprotrain %s: %s\n", rs->bar ? "\r\033[K" : "",
            nm[level >= 0 && level <= 2 ? level : 2], msg ? msg : "");
}

static void show_step(runstate *rs, int step, double loss, float lr, double tok_s,
                      double avg_step, int have_st, const pt_stats_v1 *st) {
    const sh_config *c = rs->c;
    char mem[128] = "", a[32], b[32], d[32];
    if (have_st)
        snprintf(mem, sizeof mem, " | dev %s / %s / %s", human((double)st->dev_current, a, 32),
                 human((double)st->dev_peak, b, 32), human((double)st->dev_capacity, d, 32));
    if (rs->bar) {
        int w = 24, fill = c->steps ? (int)((long long)w * step / c->steps) : w;
        char barbuf[32];
        for (int i = 0; i < w; i++) barbuf[i] = i < fill ? '=' : (i == fill ? '>' : ' ');
        barbuf[w] = '\0';
        double eta = avg_step * (c->steps - step);
        printf("\r\033[Kstep %d/%d [%s] loss %.4f | %.0f tok/s%s | ETA %dm%02ds", step, c->steps,
               barbuf, loss, tok_s, mem, (int)(eta / 60), (int)fmod(eta, 60.0));
        fflush(stdout);
    } else if (step == 1 || step == c->steps || step % c->log_every == 0) {
        printf("step %d/%d loss %.4f lr %.3e %.0f tok/s%s\n", step, c->steps, loss, lr, tok_s,
               mem);
        fflush(stdout);
    }
}

/* The tail of a metrics line (ABI 1.7 stats; null from an older plugin or none):
 * pinned_peak, the pinned high-water mark (what [memory] pinned_budget caps);
 * tier_io_s / tier_wait_s, the disk tier's I/O-thread seconds and the seconds the
 * steps waited for it, since it last opened; pred_iter_s, the plan's predicted
 * iteration. The timed ones are null with --metrics-no-time. */
static void write_metrics_mem(FILE *f, int no_time, int have_st, const pt_stats_v1 *st) {
    int v17 = have_st && st->struct_size >= offsetof(pt_stats_v1, tier_wait_us) + sizeof st->tier_wait_us;
    if (v17) fprintf(f, ",\"pinned_peak\":%llu", (unsigned long long)st->pinned_peak);
    else fprintf(f, ",\"pinned_peak\":null");
    if (v17 && !no_time)
        fprintf(f, ",\"tier_io_s\":%.6f,\"tier_wait_s\":%.6f", st->tier_io_us / 1e6,
                st->tier_wait_us / 1e6);
    else fprintf(f, ",\"tier_io_s\":null,\"tier_wait_s\":null");
    if (have_st && !no_time) fprintf(f, ",\"pred_iter_s\":%.6g}\n", st->pred_iter_s);
    else fprintf(f, ",\"pred_iter_s\":null}\n");
}

static void write_metrics(runstate *rs, int step, double loss, float lr, double tok_s,
                          int have_st, const pt_stats_v1 *st) {
    if (!rs->metrics) return;
    FILE *f = rs->metrics;
    fprintf(f, "{\"step\":%d,\"loss\":", step);
    if (isfinite(loss)) fprintf(f, "%.17g", loss);
    else fprintf(f, "null");
    fprintf(f, ",\"lr\":%.9g,\"tok_s\":", lr);
    if (rs->c->metrics_no_time) fprintf(f, "null");
    else fprintf(f, "%.1f", tok_s);
    /* world: ranks whose micro-batches the loss averages; mode: the plugin's
     * execution mode (A resident, B replicated offload, C sharded) */
    fprintf(f, ",\"world\":%d,\"mode\":", rs->c->world > 1 ? rs->c->world : 1);
    if (have_st) fprintf(f, "\"%c\"", st->mode >= 0 && st->mode <= 2 ? "ABC"[st->mode] : '?');
    else fprintf(f, "null");
    /* pinned_bytes: this rank's pinned host memory in use (the state of offloaded
     * chunks, the swap pool): what modes B and C differ in */
    if (have_st)
        fprintf(f, ",\"dev_peak\":%llu,\"dev_capacity\":%llu,\"pinned_bytes\":%llu",
                (unsigned long long)st->dev_peak, (unsigned long long)st->dev_capacity,
                (unsigned long long)st->pinned_current);
    else
        fprintf(f, ",\"dev_peak\":null,\"dev_capacity\":null,\"pinned_bytes\":null");
    write_metrics_mem(f, rs->c->metrics_no_time, have_st, st);
}

static int evaluate(runstate *rs, int step) {
    if (sh_trainer_eval(rs->tr, step, rs->c->val_batches, &rs->last_val)) return -1;
    if (!rs->c->quiet)
        printf("%sstep %d val loss %.4f\n", rs->bar ? "\r\033[K" : "", step, rs->last_val);
    return 0;
}

static int sample(runstate *rs, int step, sh_rng *gen_rng) {
    const sh_config *c = rs->c;
    int np = rs->val.n < 8 ? (int)rs->val.n : 8;
    int total = np + c->gen_len;
    uint16_t *s = malloc((size_t)total * sizeof *s);
    if (!s) return -1;
    memcpy(s, rs->val.tok, (size_t)np * sizeof *s);
    int rc = sh_trainer_generate(rs->tr, step, s, np, total, c->temperature, gen_rng);
    if (!rc && !c->quiet) {
        printf("%s--- sample at step %d (%s) ---\n", rs->bar ? "\r\033[K" : "", step,
               c->temperature > 0.0f ? "sampled" : "greedy");
        print_sample(s, total, sh_trainer_model(rs->tr)->d.V);
        printf("---\n");
    }
    free(s);
    return rc;
}

/* The run's state after `step`: a checkpoint generation (sh_resume.h). The metrics
 * lines so far are made durable first, so the generation never points past them. */
static int checkpoint(runstate *rs, int step, char *err, size_t errlen) {
    sh_resume_state st;
    memset(&st, 0, sizeof st);
    st.step = step;
    sh_trainer_get_state(rs->tr, &st.tr);
    st.gen_rng = rs->gen_rng.s;
    st.n_skipped = rs->n_skipped;
    if (rs->metrics) {
        if (fflush(rs->metrics) != 0 || fsync(fileno(rs->metrics)) != 0) {
            snprintf(err, errlen, "error writing metrics file %s", rs->c->metrics);
            return -1;
        }
        st.metrics_bytes = ftell(rs->metrics);
    }
    st.train_tokens = rs->train_tokens;
    st.train_time = rs->train_time;
    st.last_loss = rs->last_loss;
    st.last_val = rs->last_val;
    if (sh_resume_save(&rs->rz, rs->tr, &st, err, errlen)) return -1;
    rs->last_gen = step;
    return 0;
}

static int train_loop(runstate *rs, char *err, size_t errlen) {
    const sh_config *c = rs->c;
    long long tok_per_step = (long long)c->batch * c->seq * c->grad_accum;
    double session_time = 0.0;
    pt_stats_v1 st;
    memset(&st, 0, sizeof st);
    if (c->stop_after > 0 && rs->start_step >= c->stop_after && rs->start_step < c->steps) {
        /* resumed at or past the stop: nothing to do in this process */
        rs->stopped = 1;
        if (!c->quiet)
            printf("stopped at step %d (stop_after = %d); continue with --resume\n",
                   rs->start_step, c->stop_after);
        return 0;
    }
    for (int step = rs->start_step + 1; step <= c->steps; step++) {
        float lr = lr_at(c, step);
        double t0 = pt_now_s(), loss = 0.0;
        int sk = sh_trainer_step(rs->tr, step, lr, &loss);
        if (sk < 0) goto fail;
        double dt = pt_now_s() - t0;
        rs->train_time += dt;
        session_time += dt;
        rs->train_tokens += tok_per_step;
        int have_st = sh_trainer_stats(rs->tr, &st) == 0;
        double tok_s = dt > 0 ? (double)tok_per_step / dt : 0.0;
        write_metrics(rs, step, loss, lr, tok_s, have_st, &st);
        if (!isfinite(loss)) {
            char gen[96] = "no checkpoint generation was written";
            if (rs->last_gen >= 0)
                snprintf(gen, sizeof gen, "the newest checkpoint generation is step %lld",
                         rs->last_gen);
            if (!sk) {
                /* the parameters are now poisoned: nothing after this may be saved */
                snprintf(err, errlen, "the training loss is not finite (%g) at step %d: "
                                      "stopping (on_nonfinite = stop); %s",
                         loss, step, gen);
                return -1;
            }
            rs->n_skipped++;
            fflush(stdout);
            fprintf(stderr, "sample_host: warning: the training loss is not finite (%g) at "
                            "step %d: optimizer step skipped (on_nonfinite = skip; %lld so far)\n",
                    loss, step, rs->n_skipped);
        } else {
            rs->last_loss = loss;
        }
        if (!c->quiet)
            show_step(rs, step, loss, lr, tok_s, session_time / (step - rs->start_step),
                      have_st, &st);
        if ((c->val_every > 0 && step % c->val_every == 0) || step == c->steps)
            if (evaluate(rs, step)) goto fail;
        if (c->gen_every > 0 && (step % c->gen_every == 0 || step == c->steps))
            if (sample(rs, step, &rs->gen_rng)) goto fail;
        int stop = c->stop_after > 0 && step == c->stop_after && step < c->steps;
        if (c->checkpoint_dir[0] &&
            ((c->checkpoint_every > 0 && step % c->checkpoint_every == 0) ||
             step == c->steps || stop))
            if (checkpoint(rs, step, err, errlen)) return -1;
        if (stop) {
            rs->stopped = 1;
            if (!c->quiet)
                printf("%sstopped after step %d (stop_after); continue with --resume\n",
                       rs->bar ? "\r\033[K" : "", step);
            return 0;
        }
    }
    if (c->steps == 0 && evaluate(rs, 0)) goto fail;
    if (c->steps > 0 && !isfinite(rs->last_loss)) {
        snprintf(err, errlen, "every training step's loss was non-finite (%lld skipped)",
                 rs->n_skipped);
        return -1;
    }
    return 0;
fail:
    snprintf(err, errlen, "%s", sh_trainer_error(rs->tr));
    return -1;
}

/* --resume: the newest valid generation into the trainer and the run's counters;
 * then the metrics file is cut back to the lines that generation had written. */
static int resume(runstate *rs, char *err, size_t errlen) {
    const sh_config *c = rs->c;
    sh_resume_state st;
    int rc = sh_resume_load(&rs->rz, rs->tr, &st, rs->resumed_from, sizeof rs->resumed_from,
                            err, errlen);
    if (rc < 0) return -1;
    if (rc == 1) {
        if (!c->quiet)
            printf("sample_host: no checkpoint generation in %s: starting at step 1\n",
                   c->checkpoint_dir);
        return 0;
    }
    if (st.step > c->steps) {
        snprintf(err, errlen, "--resume: %s is at step %lld, past steps = %d", rs->resumed_from,
                 (long long)st.step, c->steps);
        return -1;
    }
    rs->start_step = (int)st.step;
    rs->last_gen = st.step;
    rs->gen_rng.s = st.gen_rng;
    rs->n_skipped = st.n_skipped;
    rs->train_tokens = st.train_tokens;
    rs->train_time = st.train_time;
    rs->last_loss = st.last_loss;
    rs->last_val = st.last_val;
    if (c->metrics[0]) {
        FILE *f = fopen(c->metrics, "r+");
        struct stat sb;
        if (!f || fstat(fileno(f), &sb) != 0 || (long long)sb.st_size < st.metrics_bytes) {
            snprintf(err, errlen, "--resume: metrics file %s is %s, but %s wrote %lld bytes of "
                                  "it (use another --metrics file to continue)",
                     c->metrics,
                     f ? "shorter" : "missing", rs->resumed_from, (long long)st.metrics_bytes);
            if (f) fclose(f);
            return -1;
        }
        if (ftruncate(fileno(f), (off_t)st.metrics_bytes) != 0 || fseek(f, 0, SEEK_END) != 0) {
            snprintf(err, errlen, "--resume: cannot cut metrics file %s back to %lld bytes",
                     c->metrics, (long long)st.metrics_bytes);
            fclose(f);
            return -1;
        }
        rs->metrics = f;
    }
    if (!c->quiet)
        printf("sample_host: resumed from %s (step %lld of %d)\n", rs->resumed_from,
               (long long)st.step, c->steps);
    if (c->load[0]) {
        fflush(stdout);
        fprintf(stderr, "sample_host: note: --load %s is not used: the parameters come from %s "
                        "(--load gives the starting point of a fresh run only)\n",
                c->load,
                rs->resumed_from);
    }
    return 0;
}

static void summary(runstate *rs) {
    const sh_config *c = rs->c;
    const sh_model *m = sh_trainer_model(rs->tr);
    pt_stats_v1 st;
    char a[32], b[32];
    printf("%s=== summary ===\n", rs->bar ? "\r\033[K\n" : "");
    printf("steps %d | final train loss %.4f | final val loss %.4f\n", c->steps,
           c->steps ? rs->last_loss : NAN, rs->last_val);
    if (rs->n_skipped)
        printf("skipped optimizer steps (non-finite loss): %lld\n", rs->n_skipped);
    printf("tokens/s %.0f (%lld tokens in %.1f s of training)\n",
           rs->train_time > 0 ? (double)rs->train_tokens / rs->train_time : 0.0,
           rs->train_tokens, rs->train_time);
    printf("model %.2fM params (L=%d C=%d NH=%d V=%d)\n", (double)m->n_floats / 1e6, m->d.L,
           m->d.C, m->d.NH, m->d.V);
    if (sh_trainer_stats(rs->tr, &st) == 0)
        printf("device peak %s of %s capacity (%.1f%%)\n", human((double)st.dev_peak, a, 32),
               human((double)st.dev_capacity, b, 32),
               st.dev_capacity ? 100.0 * (double)st.dev_peak / (double)st.dev_capacity : 0.0);
    else
        printf("device peak n/a (no plugin)\n");
}

static int save_ckpt(runstate *rs, char *err, size_t errlen) {
    const sh_model *m = sh_trainer_model(rs->tr);
    float *flat = malloc(m->n_floats * sizeof(float));
    if (!flat) {
        snprintf(err, errlen, "out of host memory for the checkpoint (%zu floats)", m->n_floats);
        return -1;
    }
    int rc = sh_trainer_snapshot(rs->tr, flat);
    char written[SH_PATH + 64];
    if (rc) snprintf(err, errlen, "%s", sh_trainer_error(rs->tr));
    else if (rs->c->rank == 0)
        rc = sh_paths_save_model(rs->c, m, flat, written, sizeof written, err, errlen);
    free(flat);
    if (!rc && !rs->c->quiet) printf("saved checkpoint %s\n", rs->c->save);
    return rc;
}

/* Which optimizer settings the run takes when the INI's [optimizer] section and
 * sample_host's own settings both could apply: said, never silently chosen. */
static void optimizer_notes(const sh_config *c) {
    if (c->optim_note == 1 && !c->quiet)
        printf("sample_host: optimizer from %s's [optimizer] section (type = %s); "
               "--optimizer adamw would take sample_host's AdamW settings instead\n",
               c->config, c->ini_optim_type);
    if (c->lr_note == 1 && !c->quiet)
        printf("sample_host: peak learning rate %g from %s's [optimizer] lr (sample_host's "
               "schedule sets it every step)\n",
               (double)c->lr, c->config);
    if (c->optim_note == 2) {
        fflush(stdout);
        fprintf(stderr, "sample_host: note: --optimizer adamw on the command line overrides "
                        "%s's [optimizer] type = %s\n",
                c->config, c->ini_optim_type);
    }
}

/* The CUDA layers (device = cuda) and the plugin, each when asked for. */
static int open_device_and_plugin(runstate *rs, char *err, size_t errlen) {
    const sh_config *c = rs->c;
    int rc = 0;
    if (c->device == SH_DEVICE_CUDA) {
        /* the plugin must run its cuda backend beside a cuda host: refuse an INI that
         * asks for the simulated device before anything starts */
        if (!c->no_plugin && strcmp(c->plugin_backend, "host") == 0) {
            snprintf(err, errlen, "%s: [plugin] backend = host, but device = cuda needs the "
                                  "plugin's cuda backend (set backend = cuda or auto)",
                     c->config);
            rc = -1;
        } else if (sh_cuda_load(&rs->cuda, c->world > 1 ? c->local_rank : 0, err, errlen)) {
            /* several ranks: one GPU each, the launcher's local rank (NCCL refuses two
             * ranks on one device) */
            rc = -1;
        } else {
            rs->have_cuda = 1;
        }
    }
    if (!rc && !c->no_plugin) {
        if (pt_plugin_load(c->plugin, &rs->lp, err, errlen)) rc = -1;
        else rs->have_plugin = rs->lp.table != NULL;
    }
    return rc;
}

/* The trainer over the resolved dims, with the plugin's table when loaded. */
static int create_trainer(runstate *rs, const sh_dims *d, const char *fingerprint, char *err,
                          size_t errlen) {
    const sh_config *c = rs->c;
    sh_train_opts o;
    memset(&o, 0, sizeof o);
    o.fingerprint = fingerprint;
    o.dims = *d;
    o.B = c->batch;
    o.T = c->seq;
    o.n_micro = c->grad_accum;
    o.seed = c->seed;
    o.optim_from_ini = c->optim_from_ini;
    o.lr = c->lr;
    o.beta1 = c->beta1;
    o.beta2 = c->beta2;
    o.eps = c->eps;
    o.weight_decay = c->weight_decay;
    o.max_grad_norm = c->max_grad_norm;
    o.tbl = rs->have_plugin ? rs->lp.table : NULL;
    o.ini_path = c->config[0] ? c->config : NULL;
    o.load_path = c->load[0] ? c->load : NULL;
    o.train = &rs->train;
    o.val = &rs->val;
    o.log = plugin_log;
    o.log_user = rs;
    o.cuda = rs->have_cuda ? &rs->cuda : NULL;
    o.skip_nonfinite = c->on_nonfinite == SH_NONFINITE_SKIP;
    o.nan_step = c->debug_nan_step;
    o.data_order = c->data_order;
    o.world = c->world;
    o.rank = c->rank;
    o.local_rank = c->local_rank;
    if (!c->quiet && rs->have_cuda)
        printf("sample_host: device %s\n", rs->cuda.api->device_name(rs->cuda.ctx));
    if (!c->quiet)
        printf("sample_host: L=%d C=%d NH=%d V=%d (Vp=%d) maxT=%d | batch %dx%d x%d | "
               "%zu train / %zu val tokens | plugin %s\n",
               d->L, d->C, d->NH, d->V,
               d->Vp ? d->Vp : (d->V + 127) / 128 * 128, d->maxT, c->batch, c->seq,
               c->grad_accum, rs->train.n, rs->val.n, rs->have_plugin ? rs->lp.path : "none");
    if (c->optim_from_ini && !rs->have_plugin) {
        snprintf(err, errlen, "optimizer = ini needs the plugin (its [optimizer] section)");
        return -1;
    }
    return sh_trainer_create(&rs->tr, &o, err, errlen);
}

/* The end of a run, whatever its status rc: the metrics file closed, a rank's
 * error said before the plugin's finalize can wait on the others, the trainer,
 * plugin, CUDA layers and tokens released. The run's status. */
static int finish(runstate *rs, int rc, char *err, size_t errlen) {
    const sh_config *c = rs->c;
    if (rs->metrics && fclose(rs->metrics) != 0 && !rc) {
        snprintf(err, errlen, "error writing metrics file %s", c->metrics);
        rc = -1;
    }
    if (rc && c->world > 1) {
        /* said now: the plugin's finalize below may wait for the other ranks
         * (they are still inside a collective until its timeout), and this
         * rank's cause is the one that explains their errors */
        fflush(stdout);
        fprintf(stderr, "sample_host: rank %d: error: %s\n", c->rank, err);
        fflush(stderr);
        /* and told to the others, whose collectives would otherwise wait
         * [dist] timeout for this rank before failing without its cause */
        sh_trainer_dist_abort(rs->tr, err);
        err[0] = '\0';
    }
    if (rs->tr) {
        const char *le = NULL;
        int fs = sh_trainer_destroy(rs->tr);
        if (fs != 0 && !rc) {
            le = rs->lp.table ? rs->lp.table->last_error(NULL) : "";
            snprintf(err, errlen, "plugin finalize failed with status %d: %s", fs, le ? le : "");
            rc = -1;
        }
    }
    if (rs->have_plugin || rs->lp.dl) pt_plugin_unload(&rs->lp);
    if (rs->have_cuda) sh_cuda_unload(&rs->cuda);
    sh_data_tokens_free(&rs->all);
    sh_data_tokens_free(&rs->val_file);
    sh_lock_release(&rs->lock_fd);
    return rc;
}

int sh_run(const sh_config *c, char *err, size_t errlen) {
    runstate rs;
    memset(&rs, 0, sizeof rs);
    rs.lock_fd = -1;
    rs.c = c;
    rs.last_val = NAN;
    rs.last_loss = NAN;
    rs.last_gen = -1;
    sh_rng_seed(&rs.gen_rng, c->seed, SH_STREAM_GEN);
    if (sh_config_check(c, err, errlen)) return -1;
    /* every output path before any work: a run must not train, then fail to write
     * (every rank checks, so on a shared folder all of them stop together) */
    if (sh_paths_check(c, err, errlen)) return -1;
    if (sh_config_check_plugin_sections(c, err, errlen)) return -1;
    /* one writer per checkpoint folder for the whole run (rank 0 writes for all) */
    if (c->checkpoint_dir[0] && !c->write_shard[0] && c->rank == 0 &&
        sh_lock_dir(c->checkpoint_dir, &rs.lock_fd, err, errlen))
        return -1;
    /* a finite address-space limit that OpenBLAS's buffers do not fit would hang
     * the first GEMM: a sentence now instead */
    if (sh_preflight(c, err, errlen)) {
        sh_lock_release(&rs.lock_fd);
        return -1;
    }
    optimizer_notes(c);
    int rc = load_data(&rs, err, errlen);
    if (!rc && c->write_shard[0]) {
        rc = sh_data_write_shard(c->write_shard, rs.all.tok, rs.all.n, err, errlen);
        if (!rc && !c->quiet) printf("wrote %zu tokens to %s\n", rs.all.n, c->write_shard);
        sh_data_tokens_free(&rs.all);
        sh_lock_release(&rs.lock_fd);
        return rc;
    }
    sh_dims d;
    if (!rc) rc = resolve_dims(c, &d, err, errlen);
    if (!rc && c->val_data[0]) {
        /* a separate validation file: all of --data trains, as in llm.c */
        rs.train = rs.all;
        rs.val = rs.val_file;
    } else if (!rc) {
        sh_data_split(&rs.all, &rs.train, &rs.val);
    }
    if (!rc) rc = open_device_and_plugin(&rs, err, errlen);
    rs.bar = !c->quiet && (c->progress == 1 || (c->progress == -1 && isatty(STDOUT_FILENO)));
    char fingerprint[PT_HOST_FINGERPRINT_MAX];
    if (!rc && sh_fingerprint(c, &d, &rs.train, &rs.val, fingerprint, sizeof fingerprint)) {
        snprintf(err, errlen, "the run's fingerprint does not fit %zu bytes", sizeof fingerprint);
        rc = -1;
    }
    if (!rc) rc = create_trainer(&rs, &d, fingerprint, err, errlen);
    if (!rc) sh_resume_init(&rs.rz, c, &d, &rs.train, &rs.val, rs.have_plugin);
    if (!rc && c->resume) rc = resume(&rs, err, errlen);
    if (!rc && c->metrics[0] && !rs.metrics && !(rs.metrics = fopen(c->metrics, "w"))) {
        snprintf(err, errlen, "cannot create metrics file %s", c->metrics);
        rc = -1;
    }
    if (!rc) rc = train_loop(&rs, err, errlen);
    if (!rc && !rs.stopped && !c->quiet) summary(&rs);
    if (!rc && !rs.stopped && c->save[0]) rc = save_ckpt(&rs, err, errlen);
    return finish(&rs, rc, err, errlen);
}

int sh_run_main(int argc, char **argv) {
    /* a write past `ulimit -f` then fails with EFBIG and is said like any other
     * write error (the signal's default kills the process without a word, in
     * the middle of a save) */
    signal(SIGXFSZ, SIG_IGN);
    sh_config c;
    char err[1024] = "";
    sh_config_defaults(&c);
    int rc = sh_config_from_args(&c, argc, argv, err, sizeof err);
    if (rc == 1) return 0;
    if (rc == 0) rc = sh_dist_setup(&c, err, sizeof err);
    if (rc == 0) rc = sh_run(&c, err, sizeof err);
    if (rc) {
        fflush(stdout);
        if (!err[0]) return 1;   /* said already (several ranks) */
        if (c.world > 1) fprintf(stderr, "sample_host: rank %d: error: %s\n", c.rank, err);
        else fprintf(stderr, "sample_host: error: %s\n", err);
        return 1;
    }
    return 0;
}
