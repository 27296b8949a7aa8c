/*
 * osft.h — Orthogonal Subspace Fine-Tuning inside the runtime (core-private).
 *
 * At post_model_load every trainable fp32 2-D parameter whose name contains one
 * of [osft] targets is decomposed, W (N x M, out x in) = U diag(S) Vt, thin SVD
 * in fp32, rank R = min(N, M). The top k = min(floor(R (1 - unfreeze_rank_ratio)),
 * R - 1) directions are frozen, the other kl = R - k are trained:
 *
 *   U_high [N x k]  S_high [k]  V_high [k x M]   frozen (no gradient, no optimizer state)
 *   U_low  [N x kl] S_low [kl]  V_low  [kl x M]  trainable
 *
 * The six factors replace W in an expanded parameter list that the store lays
 * out like any model (chunked in the owning block, streamed, offloaded, saved),
 * so the dense weight is never stored. The host keeps its own descriptor array:
 * after every hook the runtime copies the store's addresses of the ordinary
 * parameters into it, and a target's data / grad stay NULL; the host runs the
 * target's linear layer through osft_linear_forward / osft_linear_backward.
 *
 * Invariants kept (the frozen singular triplets survive training exactly):
 *  - gradients: right after the owning block's backward, on the device and
 *    before any reduction or offload (linear, so it commutes with the sum over
 *    ranks and over micro-batches):
 *      dU_low -= U_high (U_high^T dU_low),   dV_low -= (dV_low V_high^T) V_high;
 *  - values: after every optimizer step (Adam of a projected gradient is not
 *    projected), the same two maps on U_low and V_low wherever they were stepped
 *    (device AdamW or CPU Adam), so U_high^T U_low = 0 and V_low V_high^T = 0.
 * Both cost 4 N k kl + 4 kl k M flops per target, with no N x N or M x M term.
 */
#ifndef PT_CORE_OSFT_H
#define PT_CORE_OSFT_H

#include <stddef.h>
#include <stdint.h>

#include "protrain.h"

struct pt_rt;
struct pt_rt_ext;
typedef struct pt_osft pt_osft;

/* OSFT's entries in the runtime object's extension table (osft_ext.c). */
extern const struct pt_rt_ext pt_osft_ext;

/* Which factor of a target an expanded index is. */
enum { PT_OSFT_UH = 0,
       PT_OSFT_SH,
       PT_OSFT_VH,
       PT_OSFT_UL,
       PT_OSFT_SL,
       PT_OSFT_VL,
       PT_OSFT_NF };

/* Frozen directions for rank R at ratio urr (the trainable fraction). */
int64_t pt_osft_frozen_rank(int64_t R, float urr);

/* At post_model_load, with [osft] enabled: find the targets, decompose them
 * and point rt->model at the expanded list (rt->hmodel stays the host's). No
 * target matching: a warning, and the model runs as it is. */
int pt_osft_setup(struct pt_rt *rt, pt_model_v1 *host, char *err, size_t errlen);
void pt_osft_free(struct pt_rt *rt);
/* The store's addresses of the ordinary parameters into the host's descriptors. */
void pt_osft_mirror(struct pt_rt *rt);
/* Number of decomposed parameters (0 when OSFT is off). */
int pt_osft_count(const struct pt_rt *rt);
/* The owning block of host param `param` if it is a target, else -2. */
int pt_osft_block_of(const struct pt_rt *rt, int32_t param);

/* The hooks: y (rows x N) = x W^T without the bias; backward writes dx (rows x M,
 * may be NULL) and adds into dU_low, dS_low, dV_low. */
int pt_osft_forward(struct pt_rt *rt, int32_t param, const void *x, void *y, int64_t rows,
                    char *err, size_t errlen);
int pt_osft_backward(struct pt_rt *rt, int32_t param, const void *x, const void *dy, void *dx,
                     int64_t rows, char *err, size_t errlen);
/* Block b's gradient projection (before the store's post_backward). */
int pt_osft_project_grads(struct pt_rt *rt, int32_t b, char *err, size_t errlen);
/* The value projection of every target path not done inside a CPU step (after
 * the store's optimizer step): resident factors on the compute stream, mode C's
 * split factors gathered whole (osft_proj.c). */
int pt_osft_project_params(struct pt_rt *rt, char *err, size_t errlen);
/* The store's chunk_stepped: on the worker that just stepped offloaded chunk
 * `chunk`, the value projection of the paths whose trainable factor it holds
 * (both factors in pinned memory), with the CPU's GEMM. */
void pt_osft_chunk_stepped(struct pt_rt *rt, int32_t chunk);
/* read_param of a host index: a target gives its reconstructed dense weight,
 * W = U_high diag(S_high) V_high + U_low diag(S_low) V_low, in fp32. */
int pt_osft_read_param(struct pt_rt *rt, int32_t index, void *dst, uint64_t bytes, char *err,
                       size_t errlen);
/* launch with OSFT: the factor addresses are captured now (like a kernel's
 * arguments), and the hooks called from inside fn use those. */
int pt_osft_launch(struct pt_rt *rt, void (*fn)(void *), void *arg, char *err, size_t errlen);
/* 1 on the thread running work pt_osft_launch queued. */
int pt_osft_in_launch(void);
/* A hook that failed inside launched work (it could not return its status):
 * its status and sentence, once. */
int pt_osft_async_status(struct pt_rt *rt, char *err, size_t errlen);
/* [osft] cache_frozen: forget the gathered frozen factors (load_state may have
 * changed them); the next projection gathers them again. */
void pt_osft_drop_frozen(struct pt_rt *rt);
/* Bytes of the factors (frozen, trainable) and of the dense weights they replace. */
void pt_osft_bytes(const struct pt_rt *rt, uint64_t *frozen, uint64_t *trainable, uint64_t *dense);

#endif
