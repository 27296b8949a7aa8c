/*
 * plan.c — pt_plan lifetime and its text / JSON renderings (plan.h).
 */
#include "plan.h"
#include "placement.h"
#include "protrain.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define GIB 1073741824.0
#define MIB 1048576.0

void pt_plan_init(pt_plan *p) {
    memset(p, 0, sizeof *p);
    p->exec_mode = -1;
    p->opts.frag = 1.0;
}

void pt_plan_free(pt_plan *p) {
    if (!p) return;
    free(p->modes);
    p->modes = NULL;
}

/* ---- growable string ---- */
typedef struct sbuf {
    char *s;
    size_t n, cap;
    int oom;
} sbuf;

static void sb_printf(sbuf *b, const char *fmt, ...) {
    if (b->oom) return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int m = vsnprintf(b->s ? b->s + b->n : NULL, b->s ? b->cap - b->n : 0, fmt, ap);
        va_end(ap);
        if (m < 0) {
            b->oom = 1;
            return;
        }
        if (b->s && b->n + (size_t)m < b->cap) {
            b->n += (size_t)m;
            return;
        }
        size_t nc = b->cap ? b->cap : 1024;
        while (nc <= b->n + (size_t)m) nc *= 2;
        char *q = realloc(b->s, nc);
        if (!q) {
            b->oom = 1;
            return;
        }
        b->s = q;
        b->cap = nc;
    }
}

static char *sb_done(sbuf *b) {
    if (b->oom) {
        free(b->s);
        return NULL;
    }
    return b->s;
}

static const char *knob_src(const pt_plan *p, unsigned bit) {
    return (p->fixed & bit) ? "fixed by INI" : "searched";
}

static const char *phase_name(int ph) {
    switch (ph) {
    case PT_PHASE_EMBED_FWD: return "embedding forward";
    case PT_PHASE_FWD: return "forward of block";
    case PT_PHASE_TURN: return "head/loss";
    case PT_PHASE_BWD: return "backward of block";
    case PT_PHASE_EMBED_BWD: return "embedding backward";
    default: return "?";
    }
}

static const char *mode_name(int m) { return m == 0 ? "A" : m == 1 ? "B"
                                                        : m == 2   ? "C"
                                                                   : "auto"; }

/* Mode string of knobs (the plan's own map for the chosen plan). */
static char *modes_of(const pt_plan *p, const pt_knobs *k, const uint8_t *given) {
    int n = p->n_block > 0 ? p->n_block : 0;
    char *s = malloc((size_t)n + 2);
    if (!s) return NULL;
    uint8_t *m = NULL;
    const uint8_t *use = given;
    if (!use) {
        m = malloc((size_t)n + 1);
        if (!m || pt_place_blocks(n, k->n_swap, k->n_checkpoint, p->swap_interval, m, NULL, 0)) {
            free(m);
            free(s);
            return NULL;
        }
        use = m;
    }
    pt_place_modes_string(use, n, s, (size_t)n + 2);
    free(m);
    return s;
}

static double pct(double x, double base) { return base > 0 ? 100.0 * x / base : 0; }

char *pt_plan_text(const pt_plan *p) {
    sbuf b = {0};
    const pt_cost *c = &p->cost;
    sb_printf(&b, "ProTrain plan (device '%s', world %d, batch %lld, seq %lld)\n", p->device, p->world_size,
              (long long)p->batch, (long long)p->seq);
    sb_printf(&b, "  %-16s %8s   %s\n", "knob", "value", "source");
    sb_printf(&b, "  %-16s %8d   %s\n", "n_persist", p->knobs.n_persist, knob_src(p, PT_KNOB_PERSIST));
    sb_printf(&b, "  %-16s %8d   %s (one-block minimum %d, lookahead minimum %d)\n", "n_buffer", p->knobs.n_buffer,
              knob_src(p, PT_KNOB_BUFFER), c->n_buffer_min_block, c->n_buffer_min);
    if (p->knobs.n_buffer < c->n_buffer_min)
        sb_printf(&b, "  %-16s below the lookahead minimum: prefetches that find no free slot are skipped and "
                      "their chunks upload at the gather\n",
                  "");
    sb_printf(&b, "  %-16s %8d   %s (swap interval %d blocks, cap %d)\n", "n_swap", p->knobs.n_swap,
              knob_src(p, PT_KNOB_SWAP), p->swap_interval, p->swap_cap);
    sb_printf(&b, "  %-16s %8d   %s\n", "n_checkpoint", p->knobs.n_checkpoint, knob_src(p, PT_KNOB_CKPT));
    sb_printf(&b, "  chunks           N_chunk = %d, S_chunk = %.2f MiB (%llu bytes)\n", p->n_chunk,
              p->chunk_size / MIB, (unsigned long long)p->chunk_size);
    char *ms = modes_of(p, &p->knobs, p->modes);
    sb_printf(&b, "  block modes      %s   (%d blocks; S = swap, C = checkpoint, N = none)\n", ms ? ms : "?",
              p->n_block);
    free(ms);
    if (p->mlp_tiles > 0) {
        int64_t tok = p->batch * p->seq, last = tok - (p->mlp_tiles - 1) * p->mlp_tile_len;
        sb_printf(&b, "  tiled MLP        %lld tiles of %lld tokens (last %lld) over batch x seq = %lld "
                      "tokens, %s\n",
                  (long long)p->mlp_tiles, (long long)p->mlp_tile_len,
                  (long long)last, (long long)tok,
                  p->mlp_tiles_auto ? "auto (the fewest whose plan fits)" : "tiles from the INI");
    }
    sb_printf(&b, "  predicted peak   %.3f GiB of %.3f GiB usable (capacity %.3f GiB - reserve %.3f - headroom %.3f), at %s",
              c->peak_bytes / GIB, p->budget / GIB, p->capacity / GIB, p->opts.reserve_bytes / GIB,
              p->opts.headroom_bytes / GIB, phase_name(c->peak_phase));
    if (c->peak_block >= 0) sb_printf(&b, " %d", c->peak_block);
    sb_printf(&b, "\n");
    const char *mem_names[5] = {"model states", "chunk buffers", "activations", "scratch", "non-block"};
    uint64_t mem[5] = {c->model_state_bytes, c->buffer_bytes, c->activation_bytes, c->scratch_bytes,
                       c->nonblock_bytes};
    for (int i = 0; i < 5; i++)
        sb_printf(&b, "    %-16s %10.3f GiB  %5.1f%%\n", mem_names[i], mem[i] / GIB, pct((double)mem[i], (double)c->raw_peak_bytes));
    if (c->optim_dev_bytes || c->optim_host_bytes)
        sb_printf(&b, "    %-16s %10.3f GiB of the model states on the device, %.3f GiB in pinned "
                      "host memory (factors, bases; device scratch included)\n",
                  "REKLS",
                  c->optim_dev_bytes / GIB, c->optim_host_bytes / GIB);
    sb_printf(&b, "    %-16s x%.3f (+%.3f GiB)\n", "fragmentation", p->opts.frag,
              (double)(c->peak_bytes - c->raw_peak_bytes) / GIB);
    const pt_trace_frag *fm = &p->frag_meas;
    if (fm->factor > 0) {
        uint64_t fr = p->capacity > fm->peak_bytes ? p->capacity - fm->peak_bytes : 0;
        sb_printf(&b, "      measured       x%.3f in the profile: %.2f MiB of device range for a "
                      "%.2f MiB peak; at it the largest free block %.2f of %.2f MiB free, "
                      "rounding %.1f KiB\n",
                  fm->factor, fm->span_bytes / 1048576.0, fm->peak_bytes / 1048576.0,
                  fm->largest_free / 1048576.0, fr / 1048576.0, fm->rounding_bytes / 1024.0);
    }
    sb_printf(&b, "  predicted iter   %.4f s (fastest feasible %.4f s; plans within 1%% tie: fewer CKPT, fewer SWAP, more persistent, fewer buffers win)\n",
              c->iter_s, p->best_iter_s);
    sb_printf(&b, "    %-16s %10.4f s  %5.1f%%\n", "forward", c->fwd_s, pct(c->fwd_s, c->iter_s));
    sb_printf(&b, "    %-16s %10.4f s  %5.1f%%  (head/loss included)\n", "backward", c->bwd_s, pct(c->bwd_s, c->iter_s));
    sb_printf(&b, "    %-16s %10.4f s  %5.1f%%  (not hidden behind backward)\n", "optimizer", c->opt_s,
              pct(c->opt_s, c->iter_s));
    sb_printf(&b, "    %-16s %10.4f s  (recompute %.4f s)\n", "compute", c->compute_s, c->recompute_s);
    sb_printf(&b, "    %-16s H2D %.3f GiB %.4f s, D2H %.3f GiB %.4f s, exposed %.4f s\n", "transfers",
              c->h2d_bytes / GIB, c->h2d_s, c->d2h_bytes / GIB, c->d2h_s, c->exposed_xfer_s);
    sb_printf(&b, "    %-16s %.3f GiB uploaded at a gather, not prefetched (%.4f s of the exposed time)\n",
              "synchronous H2D", c->h2d_sync_bytes / GIB, c->sync_xfer_s);
    sb_printf(&b, "    %-16s CPU Adam %.4f s, device Adam %.4f s\n", "optimizer work", c->cpu_adam_s, c->dev_adam_s);
    if (c->optim_s > 0)
        sb_printf(&b, "    %-16s %.4f s of that is REKLS (eigh + GEMMs at the profiled rates, chunks "
                      "counted one after another)\n",
                  "", c->optim_s);
    if (c->optim_xchg_s > 0)
        sb_printf(&b, "    %-16s %.4f s moving REKLS gradients to their owner ranks and the "
                      "updates back (mode C; in the optimizer time)\n",
                  "", c->optim_xchg_s);
    if (p->world_size > 1)
        sb_printf(&b, "    %-16s all-reduce %.4f s, all-gather %.4f s, reduce-scatter %.4f s (what "
                      "the iteration waits for: mode C's on the hook thread, the all-reduce's after "
                      "backward)\n",
                  "collectives", c->allreduce_s, c->allgather_s,
                  c->reduce_scatter_s);
    if (p->tp_size > 1)
        sb_printf(&b, "    %-16s tp_size %d: the all-reduce over the %d replica(s) of this rank's "
                      "shards; REKLS gathers %.4f s (each split parameter's full gradient and "
                      "factors%s over its group, one after another before the chunks' steps)\n",
                  "tensor parallel", p->tp_size, p->world_size / p->tp_size, c->tp_gather_s,
                  p->opts.tp_l2 ? ", and weights for l2 decay," : "");
    sb_printf(&b, "  optimizer        %s\n",
              c->schedule == PT_SCHED_AFTER_BWD
                  ? "CPU Adam after backward (clipping needs the global norm first)"
              : c->schedule == PT_SCHED_DEFER
                  ? "CPU Adam after backward, into the next forward (clipping needs the global "
                    "norm first; each chunk's upload waits for its own step)"
                  : "CPU Adam overlapped with backward (starts per chunk as gradients land)");
    sb_printf(&b, "  host RAM         %.3f GiB pinned (swap pool %.3f GiB), budget ", c->host_bytes / GIB,
              c->swap_pool_bytes / GIB);
    if (p->host_budget)
        sb_printf(&b, "%.3f GiB\n", p->host_budget / GIB);
    else
        sb_printf(&b, "unlimited\n");
    if (c->on_tier) {
        sb_printf(&b, "  disk tier        %s on [nvme] path (level %d; pinned: %s%d staging slots), "
                      "%.3f GiB on disk\n",
                  c->on_tier == 1 ? "the offloaded chunks' Adam states" : "the offloaded chunks' whole images",
                  c->on_tier, c->on_tier == 1 ? "their params and gradients and " : "only ", c->tier_slots,
                  c->tier_disk_bytes / GIB);
        if (p->opts.tier_rd_Bps > 0 && p->opts.tier_wr_Bps > 0)
            sb_printf(&b, "                   I/O %.3f GiB per iteration, %.4f s at read %.3g / write %.3g "
                          "B/s, exposed %.4f s (in iter)%s%s\n",
                      c->tier_io_bytes / GIB, c->tier_io_s, p->opts.tier_rd_Bps, p->opts.tier_wr_Bps,
                      c->tier_exposed_s, p->tier_rates[0] ? "; rates " : "", p->tier_rates);
        else
            sb_printf(&b, "                   I/O %.3f GiB per iteration; its time is not modelled (no disk "
                          "rates%s%s)\n",
                      c->tier_io_bytes / GIB, p->tier_rates[0] ? ": " : "", p->tier_rates);
    }
    sb_printf(&b, "  execution mode   %s\n", p->exec_mode < 0 ? "not decided (auto)" : mode_name(p->exec_mode));
    if (p->mode_why[0]) sb_printf(&b, "                   %s\n", p->mode_why);
    if (p->n_alt > 0) sb_printf(&b, "  runner-ups\n");
    for (int i = 0; i < p->n_alt; i++) {
        const pt_plan_alt *a = &p->alt[i];
        char *am = modes_of(p, &a->knobs, NULL);
        sb_printf(&b, "    #%d n_persist=%d n_buffer=%d n_swap=%d n_checkpoint=%d  %s  iter %.4f s (%+.1f%%)  peak %.3f GiB\n",
                  i + 1, a->knobs.n_persist, a->knobs.n_buffer, a->knobs.n_swap, a->knobs.n_checkpoint, am ? am : "?",
                  a->cost.iter_s, pct(a->cost.iter_s - c->iter_s, c->iter_s), a->cost.peak_bytes / GIB);
        free(am);
    }
    sb_printf(&b, "  search           %lld candidates scored in %.2f ms\n", (long long)p->n_evaluated, p->search_s * 1e3);
    return sb_done(&b);
}

static void json_str(sbuf *b, const char *s) {
    sb_printf(b, "\"");
    for (; s && *s; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\')
            sb_printf(b, "\\%c", ch);
        else if (ch < 0x20)
            sb_printf(b, "\\u%04x", ch);
        else
            sb_printf(b, "%c", ch);
    }
    sb_printf(b, "\"");
}

#define JU(k, v) sb_printf(&b, ",\n  \"%s\": %llu", k, (unsigned long long)(v))
#define JI(k, v) sb_printf(&b, ",\n  \"%s\": %lld", k, (long long)(v))
#define JD(k, v) sb_printf(&b, ",\n  \"%s\": %.9g", k, (double)(v))
#define JB(k, v) sb_printf(&b, ",\n  \"%s\": %s", k, (v) ? "true" : "false")

char *pt_plan_json(const pt_plan *p) {
    sbuf b = {0};
    const pt_cost *c = &p->cost;
    sb_printf(&b, "{\n  \"version\": 1");
    JI("n_persist", p->knobs.n_persist);
    JI("n_buffer", p->knobs.n_buffer);
    JI("n_buffer_min_block", c->n_buffer_min_block);
    JI("n_buffer_min", c->n_buffer_min);
    JI("n_swap", p->knobs.n_swap);
    JI("n_checkpoint", p->knobs.n_checkpoint);
    JB("fixed_n_persist", p->fixed & PT_KNOB_PERSIST);
    JB("fixed_n_buffer", p->fixed & PT_KNOB_BUFFER);
    JB("fixed_n_swap", p->fixed & PT_KNOB_SWAP);
    JB("fixed_n_checkpoint", p->fixed & PT_KNOB_CKPT);
    JI("n_block", p->n_block);
    JI("n_chunk", p->n_chunk);
    JU("chunk_size", p->chunk_size);
    JI("swap_interval", p->swap_interval);
    JI("swap_cap", p->swap_cap);
    char *ms = modes_of(p, &p->knobs, p->modes);
    sb_printf(&b, ",\n  \"modes\": ");
    json_str(&b, ms ? ms : "");
    free(ms);
    JU("peak_bytes", c->peak_bytes);
    JU("raw_peak_bytes", c->raw_peak_bytes);
    JD("frag", p->opts.frag);
    JD("frag_measured", p->frag_meas.factor);
    JU("frag_peak_bytes", p->frag_meas.peak_bytes);
    JU("frag_span_bytes", p->frag_meas.span_bytes);
    JU("frag_largest_free_bytes", p->frag_meas.largest_free);
    JU("frag_rounding_bytes", p->frag_meas.rounding_bytes);
    JU("model_state_bytes", c->model_state_bytes);
    JU("buffer_bytes", c->buffer_bytes);
    JU("activation_bytes", c->activation_bytes);
    JU("scratch_bytes", c->scratch_bytes);
    JU("nonblock_bytes", c->nonblock_bytes);
    JI("peak_phase", c->peak_phase);
    JI("peak_block", c->peak_block);
    JU("capacity_bytes", p->capacity);
    JU("reserve_bytes", p->opts.reserve_bytes);
    JU("headroom_bytes", p->opts.headroom_bytes);
    JU("budget_bytes", p->budget);
    JU("host_bytes", c->host_bytes);
    JU("swap_pool_bytes", c->swap_pool_bytes);
    JU("nvme_tier", (uint64_t)c->on_tier);
    JU("tier_disk_bytes", c->tier_disk_bytes);
    JU("tier_io_bytes", c->tier_io_bytes);
    JD("tier_io_s", c->tier_io_s);
    JD("tier_exposed_s", c->tier_exposed_s);
    JD("tier_read_Bps", p->opts.tier_rd_Bps);
    JD("tier_write_Bps", p->opts.tier_wr_Bps);
    JU("host_budget_bytes", p->host_budget);
    JD("iter_s", c->iter_s);
    JD("fwd_s", c->fwd_s);
    JD("bwd_s", c->bwd_s);
    JD("opt_s", c->opt_s);
    JD("cpu_adam_s", c->cpu_adam_s);
    JD("dev_adam_s", c->dev_adam_s);
    JD("compute_s", c->compute_s);
    JD("recompute_s", c->recompute_s);
    JD("exposed_xfer_s", c->exposed_xfer_s);
    JD("h2d_s", c->h2d_s);
    JD("d2h_s", c->d2h_s);
    JU("h2d_bytes", c->h2d_bytes);
    JU("d2h_bytes", c->d2h_bytes);
    JU("h2d_sync_bytes", c->h2d_sync_bytes);
    JD("sync_xfer_s", c->sync_xfer_s);
    JD("cpu_finish_s", c->cpu_finish_s);
    JD("allreduce_s", c->allreduce_s);
    JD("allgather_s", c->allgather_s);
    JD("reduce_scatter_s", c->reduce_scatter_s);
    JD("tp_gather_s", c->tp_gather_s);
    JD("rekls_xchg_s", c->optim_xchg_s);
    sb_printf(&b, ",\n  \"optimizer_schedule\": \"%s\"", c->schedule == PT_SCHED_AFTER_BWD ? "after_backward" : c->schedule == PT_SCHED_DEFER ? "into_next_forward"
                                                                                                                                              : "overlapped");
    sb_printf(&b, ",\n  \"exec_mode\": \"%s\"", mode_name(p->exec_mode));
    sb_printf(&b, ",\n  \"exec_mode_why\": ");
    json_str(&b, p->mode_why);
    sb_printf(&b, ",\n  \"mlp_tiles\": %lld, \"mlp_tile_len\": %lld", (long long)p->mlp_tiles,
              (long long)p->mlp_tile_len);
    JI("world_size", p->world_size);
    JI("tp_size", p->tp_size > 1 ? p->tp_size : 1);
    sb_printf(&b, ",\n  \"device\": ");
    json_str(&b, p->device);
    JI("batch", p->batch);
    JI("seq", p->seq);
    JD("best_iter_s", p->best_iter_s);
    JI("n_evaluated", p->n_evaluated);
    JD("search_s", p->search_s);
    sb_printf(&b, ",\n  \"runner_ups\": [");
    for (int i = 0; i < p->n_alt; i++) {
        const pt_plan_alt *a = &p->alt[i];
        char *am = modes_of(p, &a->knobs, NULL);
        sb_printf(&b, "%s\n    {\"n_persist\": %d, \"n_buffer\": %d, \"n_swap\": %d, \"n_checkpoint\": %d, \"modes\": ",
                  i ? "," : "", a->knobs.n_persist, a->knobs.n_buffer, a->knobs.n_swap, a->knobs.n_checkpoint);
        json_str(&b, am ? am : "");
        sb_printf(&b, ", \"iter_s\": %.9g, \"peak_bytes\": %llu}", a->cost.iter_s,
                  (unsigned long long)a->cost.peak_bytes);
        free(am);
    }
    sb_printf(&b, "%s]\n}\n", p->n_alt ? "\n  " : "");
    return sb_done(&b);
}

int pt_plan_write_json(const pt_plan *p, const char *path, char *err, size_t errlen) {
    char *js = pt_plan_json(p);
    if (!js) {
        if (err && errlen) snprintf(err, errlen, "plan: out of memory rendering JSON for %s", path);
        return PT_ERR_HOST_OOM;
    }
    char tmp[4096];
    int rc = PT_OK;
    if (snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid()) >= (int)sizeof tmp) {
        free(js);
        if (err && errlen) snprintf(err, errlen, "plan: path too long: %s", path);
        return PT_ERR_INVALID_ARG;
    }
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    size_t n = strlen(js), off = 0;
    if (fd < 0) rc = PT_ERR_IO;
    while (!rc && off < n) {
        ssize_t m = write(fd, js + off, n - off);
        if (m < 0 && errno == EINTR) continue;
        if (m <= 0)
            rc = PT_ERR_IO;
        else
            off += (size_t)m;
    }
    if (!rc && fsync(fd) != 0) rc = PT_ERR_IO;
    if (fd >= 0 && close(fd) != 0) rc = PT_ERR_IO;
    if (!rc && rename(tmp, path) != 0) rc = PT_ERR_IO;
    if (rc) {
        if (err && errlen) snprintf(err, errlen, "plan: cannot write %s: %s", path, strerror(errno));
        unlink(tmp);
    }
    free(js);
    return rc;
}
