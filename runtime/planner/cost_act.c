/*
 * cost_act.c — the activation profile: per window, the bytes of activations
 * and scratch a mode map (none / checkpoint / swap per block) keeps on the
 * device, the swap-out schedule behind it, and the window and phase of the
 * peak. pt_cost_memory adds the static terms to it.
 */
#include "cost_model.h"
#include "cost_internal.h"
#include "protrain.h"

#include <stdlib.h>
#include <string.h>

int pt_act_init(const pt_cost_ctx *cx, pt_act_profile *a) {
    memset(a, 0, sizeof *a);
    a->n_block = cx->N;
    a->modes = calloc((size_t)cx->N, 1);
    a->fwd_swap_s = calloc((size_t)cx->N + 1, sizeof *a->fwd_swap_s);
    a->bwd_swap_in = calloc((size_t)cx->N + 1, sizeof *a->bwd_swap_in);
    a->work = calloc((size_t)cx->N + 2, sizeof *a->work);
    a->swap_done = calloc((size_t)cx->N, sizeof *a->swap_done);
    a->fwd_free_s = calloc((size_t)cx->N + 1, sizeof *a->fwd_free_s);
    a->bwd_free_s = calloc((size_t)cx->N, sizeof *a->bwd_free_s);
    if (!a->modes || !a->fwd_swap_s || !a->bwd_swap_in || !a->work || !a->swap_done ||
        !a->fwd_free_s || !a->bwd_free_s) {
        pt_act_free(a);
        return PT_ERR_HOST_OOM;
    }
    return PT_OK;
}

void pt_act_free(pt_act_profile *a) {
    if (!a) return;
    free(a->modes);
    free(a->fwd_swap_s);
    free(a->bwd_swap_in);
    free(a->work);
    free(a->swap_done);
    free(a->fwd_free_s);
    free(a->bwd_free_s);
    memset(a, 0, sizeof *a);
}

/* Every window's dynamic bytes pass through here, so the per-window picture
 * (rec_*, pt_cost_mem_windows) and the peak are one computation. */
static void note_peak(pt_act_profile *a, int32_t win, uint64_t act, uint64_t scr, int phase, int block) {
    if (a->rec_act) {
        a->rec_act[win] = act;
        a->rec_scr[win] = scr;
    }
    if (act + scr > a->peak_dyn || (a->peak_phase < 0)) {
        a->peak_dyn = act + scr;
        a->act_at_peak = act;
        a->scratch_at_peak = scr;
        a->peak_phase = phase;
        a->peak_block = block;
    }
}

/* The poison fills of the step's frees, per window (after the swap schedule:
 * a SWAP arena is freed at the start of the window after the last one its
 * copy drains in, swap_done[b] + 1). With f = 1 / free_Bps, g = 1 /
 * free_fwd_Bps (f when 0), A the arena, Sf and Sb the host's forward and
 * backward scratch of block b:
 *   forward window b   += Sf f, + A g when CKPT (freed right after its forward)
 *   forward window w   += A f when SWAP, w = swap_done[b] + 1 (N: the turn)
 *   backward window b  += (A + Sb) f, + Sf f when CKPT (its recompute's scratch)
 * Measured on the host backend (sample_host, 4 blocks): the four 2.2 MB arena
 * fills of a NONE step took 0.40-0.47 ms of a 21-23 ms step, outside every
 * window the profile times. */
static void free_costs(const pt_trace *t, const uint8_t *modes, pt_act_profile *a) {
    const pt_trace_block *B = t->blocks;
    const int32_t N = a->n_block;
    const double f = t->hw.free_Bps > 0 ? 1.0 / t->hw.free_Bps : 0;
    const double g = t->hw.free_fwd_Bps > 0 ? 1.0 / t->hw.free_fwd_Bps : f;
    a->free_f_s = a->free_b_s = 0;
    for (int32_t w = 0; w <= N; w++) a->fwd_free_s[w] = 0;
    for (int32_t b = 0; b < N; b++) a->bwd_free_s[b] = 0;
    if (f == 0 && g == 0) return;
    for (int32_t b = 0; b < N; b++) {
        double A = (double)B[b].arena_bytes * f, Sf = (double)B[b].fwd_scratch_bytes * f;
        a->fwd_free_s[b] += Sf;
        a->bwd_free_s[b] += A + (double)B[b].bwd_scratch_bytes * f;
        if (modes[b] == PT_BLOCK_CKPT) {
            a->fwd_free_s[b] += (double)B[b].arena_bytes * g;
            a->bwd_free_s[b] += Sf;
        } else if (modes[b] == PT_BLOCK_SWAP) {
            int32_t w = a->swap_done[b] + 1;
            a->fwd_free_s[w < N ? w : N] += A;
        }
    }
    for (int32_t b = 0; b < N; b++) {
        a->free_f_s += a->fwd_free_s[b];
        a->free_b_s += a->bwd_free_s[b];
    }
    a->free_b_s += a->fwd_free_s[N];
}

void pt_act_compute(const pt_cost_ctx *cx, const uint8_t *modes, pt_act_profile *a) {
    const pt_trace *t = cx->t;
    const pt_trace_block *B = t->blocks;
    int32_t N = cx->N;
    memcpy(a->modes, modes, (size_t)N);
    a->peak_dyn = a->act_at_peak = a->scratch_at_peak = 0;
    a->peak_phase = -1;
    a->peak_block = -1;
    a->swap_pool = 0;
    a->recompute_s = a->swap_out_s = a->swap_in_s = 0;
    for (int32_t w = 0; w <= N; w++) {
        a->fwd_swap_s[w] = 0;
        a->bwd_swap_in[w] = 0;
    }
    /* Swap-out as a FIFO fluid: window w can hide fwd_s[w] seconds of D2H;
     * done_at[j] is the last window (N = turn) holding part of j's D2H. The
     * done_at array reuses bwd_swap_in's storage until the walk below. */
    uint64_t *done_at = a->bwd_swap_in;
    int32_t w = 1;
    double left = N > 1 ? B[1].fwd_s : 0;   /* capacity left in window w */
    for (int32_t j = 0; j < N; j++) {
        a->swap_done[j] = -1;
        if (modes[j] == PT_BLOCK_CKPT) a->recompute_s += B[j].recompute_s;
        if (modes[j] != PT_BLOCK_SWAP) continue;
        a->swap_pool += B[j].arena_bytes;
        /* one copy each way, bytes at the rate plus the per-copy latency */
        double need = (double)B[j].arena_bytes / t->hw.d2h_Bps + t->hw.d2h_lat_s;
        a->swap_out_s += need;
        a->swap_in_s += (double)B[j].arena_bytes / t->hw.h2d_Bps + t->hw.h2d_lat_s;
        if (w < j + 1) {
            w = j + 1;
            left = w < N ? B[w].fwd_s : 0;
        }
        int32_t last = j;
        while (need > 0) {
            if (w >= N) {
                a->fwd_swap_s[N] += need;
                last = N;
                break;
            }
            double take = need < left ? need : left;
            if (take > 0) {
                a->fwd_swap_s[w] += take;
                need -= take;
                left -= take;
                last = w;
            }
            /* relative tolerance: a drain that finishes exactly at a window end stays in it */
            if (need <= 1e-12 * (double)B[j].arena_bytes / t->hw.d2h_Bps) break;
            w++;
            left = w < N ? B[w].fwd_s : 0;
        }
        done_at[j] = (uint64_t)last;
        /* a copy done inside block j's own window (none is: it starts after it)
         * still holds the arena until window j+1 starts */
        a->swap_done[j] = last > j ? last : j;
    }
    free_costs(t, modes, a);
    /* Memory walk. inputs = sum of input_bytes alive; kept = NONE arenas of
     * finished blocks; flight(w) = SWAP arenas j < w with done_at[j] >= w,
     * kept as a difference array: +arena at window j+1, -arena after done_at[j]. */
    int64_t *diff = a->work;
    for (int32_t w2 = 0; w2 <= N + 1; w2++) diff[w2] = 0;
    for (int32_t j = 0; j < N; j++)
        if (modes[j] == PT_BLOCK_SWAP && done_at[j] >= (uint64_t)j + 1) {
            diff[j + 1] += (int64_t)B[j].arena_bytes;
            diff[done_at[j] + 1] -= (int64_t)B[j].arena_bytes;
        }
    uint64_t inputs = B[0].input_bytes, kept = 0;
    int64_t flight = 0;
    note_peak(a, 0, inputs, t->nonblock_scratch_bytes, PT_PHASE_EMBED_FWD, -1);
    for (int32_t b = 0; b < N; b++) {
        flight += diff[b];
        uint64_t next_in = b + 1 < N ? B[b + 1].input_bytes : 0;
        note_peak(a, 1 + b, inputs + next_in + kept + (uint64_t)flight + B[b].arena_bytes, B[b].fwd_scratch_bytes,
                  PT_PHASE_FWD, b);
        inputs += next_in;
        if (modes[b] == PT_BLOCK_NONE) kept += B[b].arena_bytes;
    }
    /* Turn: swaps still draining (a SWAP block N-1 always is: no forward window
     * follows it, and its swap-in is charged in time but its arena counted
     * once), head/loss scratch. */
    flight += diff[N];
    note_peak(a, N + 1, inputs + kept + (uint64_t)flight + B[N - 1].grad_act_bytes, t->nonblock_scratch_bytes,
              PT_PHASE_TURN, -1);
    /* The swap-in schedule replaces done_at from here on. */
    for (int32_t j = 0; j <= N; j++) a->bwd_swap_in[j] = 0;
    if (modes[N - 1] == PT_BLOCK_SWAP) a->bwd_swap_in[N] = B[N - 1].arena_bytes;
    for (int32_t b = N - 1; b >= 0; b--) {
        if (modes[b] == PT_BLOCK_NONE) kept -= B[b].arena_bytes;   /* now "this block's arena" */
        uint64_t ahead = 0;
        if (b >= 1 && modes[b - 1] == PT_BLOCK_SWAP) {
            ahead = B[b - 1].arena_bytes;
            a->bwd_swap_in[b] = ahead;
        }
        uint64_t scr = B[b].bwd_scratch_bytes;
        if (modes[b] == PT_BLOCK_CKPT && B[b].fwd_scratch_bytes > scr) scr = B[b].fwd_scratch_bytes;
        note_peak(a, 2 * N + 1 - b, inputs + kept + B[b].arena_bytes + ahead + B[b].grad_act_bytes, scr, PT_PHASE_BWD, b);
        inputs -= B[b].input_bytes;
    }
    note_peak(a, 2 * N + 2, B[0].grad_act_bytes, t->nonblock_scratch_bytes, PT_PHASE_EMBED_BWD, -1);
}
