/*
 * bench_search.c — wall time of pt_search on synthetic 7B (32 blocks, ~200
 * chunks) and 70B (80 blocks, ~1200 chunks) layouts; median of 5 runs each.
 * Goal: under 50 ms per search.
 *
 * Layouts are uniform: each block's params split into cpb equal chunks, plus
 * a mandatory embedding and head chunk; per-block times and activation bytes
 * follow the Llama shape (bf16, flash attention, seq 4096, batch 1) as in
 * runtime/planner/ds_estimates.c; hardware is an H100-class card on PCIe 5.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "protrain.h"
#include "pt_util.h"
#include "planner/searcher.h"
#include "planner/trace_cache.h"

typedef struct layout {
    const char *name;
    int layers, cpb;
    double hidden, ffn, kv, vocab;
} layout;

static void build(pt_trace *t, const layout *L, uint64_t capacity) {
    const double s = 4096, B = 1, p = 2, h = L->hidden, f = L->ffn, kvh = L->kv, F = 400e12;
    double per_block = 2 * h * h + 2 * h * kvh + 3 * h * f + 2 * h;
    uint64_t chunk = (uint64_t)(per_block * p / L->cpb) + 1;
    pt_trace_init(t);
    int K = L->layers * L->cpb + 2;
    if (pt_trace_alloc(t, L->layers, K, NULL, 0)) exit(1);
    uint64_t emb = (uint64_t)(L->vocab * h);
    int k = 0;
    t->chunks[k++] = (pt_trace_chunk){emb * 2, emb, emb, -1, -1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
    for (int b = 0; b < L->layers; b++)
        for (int j = 0; j < L->cpb; j++) t->chunks[k++] = (pt_trace_chunk){chunk, chunk / 2, chunk / 2, b, b, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
    t->chunks[k++] = (pt_trace_chunk){emb * 2, emb, emb, -1, -1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
    double act = 12 * s * B * h + 4 * s * B * kvh + 8 * s * B * f, in = s * B * h * p;
    double fwd = 2 * per_block * s * B / F + 4 * B * s * s * h / F;
    for (int b = 0; b < L->layers; b++)
        t->blocks[b] = (pt_trace_block){fwd, 2 * fwd, fwd, (uint64_t)(act - in), (uint64_t)in,
                                        (uint64_t)(s * B * f * p), (uint64_t)(2 * s * B * f * p), (uint64_t)(2 * in), 0, 0};
    pt_trace_derive_ranges(t);
    t->chunk_size = chunk;
    t->slot_bytes = 2 * chunk;
    t->param_elem_bytes = t->grad_elem_bytes = 2;
    t->master_elem_bytes = t->adam_m_elem_bytes = t->adam_v_elem_bytes = t->host_grad_elem_bytes = 4;
    t->embed_fwd_s = t->embed_bwd_s = 1e-4;
    t->head_fwd_s = 2 * L->vocab * h * s * B / F;
    t->head_bwd_s = 2 * t->head_fwd_s;
    t->nonblock_bytes = (uint64_t)(s * B * L->vocab * 4 + 2 * in);
    t->nonblock_scratch_bytes = (uint64_t)(s * B * L->vocab * 4);
    t->hw = (pt_trace_hw){50e9, 50e9, 2e9, 1e11, 0, 2, 0, 0, capacity, 0, 0, 0, 0, 0, 0, 0, 0};
    t->key.world_size = 1;
    t->key.version = PT_TRACE_VERSION;
    snprintf(t->key.device, sizeof t->key.device, "bench");
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(void) {
    const layout lays[] = {
        {"7B ", 32, 6, 4096, 11008, 4096, 32000},
        {"70B", 80, 15, 8192, 28672, 1024, 32000},
    };
    const double gibs[] = {24, 80, 141};
    int slow = 0;
    printf("%-4s %6s %7s %8s %10s %10s   %s\n", "model", "chunks", "device", "median", "min", "evaluated",
           "plan (n_persist n_buffer n_swap n_checkpoint, iter)");
    for (size_t i = 0; i < sizeof lays / sizeof lays[0]; i++)
        for (size_t g = 0; g < sizeof gibs / sizeof gibs[0]; g++) {
            pt_trace t;
            build(&t, &lays[i], (uint64_t)(gibs[g] * 1073741824.0));
            pt_search_opts o;
            pt_search_opts_default(&o);
            o.cost.reserve_bytes = 1ull << 30;
            double ms[5];
            pt_plan plan;
            pt_plan_init(&plan);
            char err[512];
            int rc = 0;
            for (int r = 0; r < 5; r++) {
                double t0 = pt_now_s();
                rc = pt_search(&t, &o, &plan, err, sizeof err);
                ms[r] = 1e3 * (pt_now_s() - t0);
            }
            qsort(ms, 5, sizeof ms[0], cmp);
            printf("%-4s %6d %5.0fGiB %6.2fms %8.2fms %10lld   ", lays[i].name, t.n_chunk, gibs[g], ms[2], ms[0],
                   (long long)plan.n_evaluated);
            if (rc == PT_OK)
                printf("%d %d %d %d, %.3f s\n", plan.knobs.n_persist, plan.knobs.n_buffer, plan.knobs.n_swap,
                       plan.knobs.n_checkpoint, plan.cost.iter_s);
            else
                printf("infeasible: needs %.1f GiB\n", plan.min_capacity / 1073741824.0);
            if (ms[2] > 50) slow = 1;
            pt_plan_free(&plan);
            pt_trace_free(&t);
        }
    printf("goal: every median under 50 ms: %s\n", slow ? "MISSED" : "met");
    return 0;
}
