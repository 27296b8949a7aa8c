/*
 * ds_estimates.h — DeepSpeed's model-state memory estimates, re-implemented
 * from DeepSpeed's own estimator formulas (its code, not its docs), so
 * protrain-plan can print them beside its own plan.
 *
 * P = total params (shared counted once), Lmax = params of the largest single
 * module, g = GPUs per node, n = nodes, G = g*n, f = additional_buffer_factor
 * (DeepSpeed default 1.5). Results are bytes (doubles: DeepSpeed's CPU terms
 * are floating point); DeepSpeed prints them / 2^30 as "GB".
 *
 * ZeRO-3 (estimate_zero3_model_states_mem_needs):
 *   param+optimizer offload: GPU = 4 Lmax
 *                            CPU = zero_init ? 18 P f / n : P max(4g, 18/n) f
 *   optimizer offload only:  GPU = 4 Lmax + int(2 P / G)
 *                            CPU = zero_init ? 16 P f / n : P max(4g, 16/n) f
 *   no offload:              GPU = 4 Lmax + int(18 P / G)
 *                            CPU = zero_init ? 4 g f Lmax : 4 g f P
 * ZeRO-2 (estimate_zero2_model_states_mem_needs):
 *   optimizer offload:       GPU = 2 P;  CPU = P max(4G, 16) f
 *   no offload:              GPU = 2 P + int(18 P / G);  CPU = 4 g f P
 */
#ifndef PT_DS_ESTIMATES_H
#define PT_DS_ESTIMATES_H

#include <stddef.h>
#include <stdint.h>

#include "trace.h"

#define PT_DS_BUFFER_FACTOR 1.5

typedef struct pt_ds_est {
    double gpu_bytes;   /* per GPU */
    double cpu_bytes;   /* per node */
} pt_ds_est;

/* offload_param requires offload_opt (DeepSpeed has no param-only offload):
 * returns -1 for that combination or non-positive sizes, else 0. */
int pt_ds_zero3(int64_t params, int64_t largest_layer, int gpus_per_node, int nodes, int offload_param,
                int offload_opt, int zero_init, double buffer_factor, pt_ds_est *out);
int pt_ds_zero2(int64_t params, int gpus_per_node, int nodes, int offload_opt, double buffer_factor, pt_ds_est *out);

/* ---- model shapes (protrain-plan, tests, benchmarks) ----
 * A GPT-2 or Llama-style decoder described by its sizes, turned into parameter
 * counts and into a synthetic profile trace (model_shape.c: both need the same
 * per-tensor parameter list). */
enum { PT_ARCH_GPT = 0,
       PT_ARCH_LLAMA = 1 };

typedef struct pt_model_shape {
    int32_t arch;                 /* PT_ARCH_GPT: LayerNorm+bias, GELU MLP, learned positions;
                                     PT_ARCH_LLAMA: RMSNorm, SwiGLU, no biases, GQA */
    int64_t layers, hidden, heads;
    int64_t kv_heads;             /* 0 = heads */
    int64_t ffn;                  /* 0 = 4*hidden (GPT) or 8/3*hidden rounded up to 256 (Llama) */
    int64_t vocab, seq, batch;
    int64_t positions;            /* GPT learned position table rows; 0 = seq */
    int32_t dtype;                /* pt_dtype of the compute copy */
    int32_t tied;                 /* LM head shares the embedding */
    int32_t flash_attn;           /* attention keeps no seq x seq matrices */
    double trainable_fraction;    /* (0, 1]: share of each chunk with gradients/optimizer state */
} pt_model_shape;

typedef struct pt_hw_shape {
    uint64_t device_bytes;        /* device capacity */
    double h2d_Bps, d2h_Bps;      /* PCIe, pinned */
    int32_t copy_engines;         /* 1 or 2 */
    int32_t world_size;
    double cpu_adam_elems_per_s, dev_adam_elems_per_s;
    double flops;                 /* achieved device FLOP/s for the matmuls */
    double allreduce_Bps;         /* 0 = not modelled */
    uint64_t host_ram_bytes;      /* 0 = unlimited */
    char device[64];
    double allgather_Bps, reduce_scatter_Bps;  /* mode C's collectives; 0 = not modelled */
} pt_hw_shape;

/* Fill defaults for missing fields (ffn, kv_heads) and check ranges. 0 or -1
 * with err naming the field. */
int pt_shape_check(pt_model_shape *m, char *err, size_t errlen);
/* Total params (tied counted once) and the largest single module (DeepSpeed's Lmax). */
void pt_shape_count(const pt_model_shape *m, int64_t *params, int64_t *largest_module,
                    int64_t *params_per_block);
/* Chunk size as ProTrain picks it: the grid {32, 64, 128, 256, 512} MiB, least
 * slack over all chunks but the last, ties to the smaller. */
uint64_t pt_shape_chunk_size(const pt_model_shape *m);
/* Synthesise a trace: chunks laid out with seal-before-block packing at
 * tensor granularity (oversized tensors get their own chunk; non-block params
 * in mandatory chunks), activation bytes from the per-layer formula (see the
 * .c), compute times from FLOPs (6 * params * tokens per block split 1:2
 * forward:backward, plus attention 4*b*s^2*h forward). chunk_size 0 = auto.
 * 0, or PT_ERR_INVALID_ARG with err filled. */
int pt_shape_trace(const pt_model_shape *m, const pt_hw_shape *hw, uint64_t chunk_size, pt_trace *out,
                   char *err, size_t errlen);

#endif /* PT_DS_ESTIMATES_H */
