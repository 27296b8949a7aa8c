/*
 * sh_ops.h — the layer operations the model (gpt.c) runs, as a table, so one model
 * source drives the CPU layers (layers.c, table sh_cpu_ops) and the CUDA kernels
 * (libsample_cuda.so, sh_cuda.h). Every entry has the semantics, shapes and
 * accumulation rules of its namesake in sh_layers.h, with the table's ctx first.
 *
 * On the CPU an entry has finished when it returns. On CUDA it is enqueued on the
 * host's compute stream and returns at once; pointers are device addresses and the
 * CPU may read results only after the stream is synchronised.
 */
#ifndef SH_OPS_H
#define SH_OPS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct sh_layer_ops {
    void *ctx; /* first argument of every entry (NULL for the CPU table) */
    void (*encoder_fwd)(void *ctx, float *out, const int32_t *tok, const float *wte,
                        const float *wpe, int B, int T, int C);
    void (*encoder_bwd)(void *ctx, float *dwte, float *dwpe, const float *dout,
                        const int32_t *tok, int B, int T, int C);
    void (*layernorm_fwd)(void *ctx, float *out, float *mean, float *rstd, const float *inp,
                          const float *w, const float *b, int N, int C);
    void (*layernorm_bwd)(void *ctx, float *dinp, float *dw, float *db, const float *dout,
                          const float *inp, const float *w, const float *mean,
                          const float *rstd, int N, int C);
    void (*matmul_fwd)(void *ctx, float *out, const float *inp, const float *W,
                       const float *bias, int N, int IC, int OC);
    void (*matmul_bwd)(void *ctx, float *dinp, float *dW, float *dbias, const float *dout,
                       const float *inp, const float *W, int N, int IC, int OC, float *wtmp);
    void (*attention_fwd)(void *ctx, float *out, float *att, const float *qkv, int B, int T,
                          int C, int NH);
    /* datt: nslots (T,T) scratch slots; attention_slots(ctx, NH) tells how many the
     * table wants (the CPU: one per OpenMP thread; CUDA: one per head). */
    void (*attention_bwd)(void *ctx, float *dqkv, float *datt, int nslots, const float *dout,
                          const float *qkv, const float *att, int B, int T, int C, int NH);
    int (*attention_slots)(void *ctx, int NH);
    void (*gelu_fwd)(void *ctx, float *out, const float *inp, size_t n);
    void (*gelu_bwd)(void *ctx, float *dinp, const float *inp, const float *dout, size_t n);
    void (*add_inplace)(void *ctx, float *out, const float *a, size_t n);
    /* Softmax and losses as sh_layers_crossentropy_fwd; the mean loss (double, summed in row
     * order) is ADDED to *loss_acc when loss_acc is not NULL. loss_acc lives where the
     * table computes: host memory for the CPU, device memory for CUDA. */
    void (*crossentropy_fwd)(void *ctx, float *probs, float *losses, const int32_t *targets,
                             int N, int V, int Vp, double *loss_acc);
    void (*crossentropy_bwd)(void *ctx, float *dlogits, const float *probs,
                             const int32_t *targets, float dloss, int N, int V, int Vp);
    /* dst = 0 over bytes (host memset on the CPU, async memset on CUDA). */
    void (*zero)(void *ctx, void *dst, size_t bytes);
} sh_layer_ops;

/* The CPU layers of layers.c behind the table (ctx unused). */
extern const sh_layer_ops sh_cpu_ops;

#ifdef __cplusplus
}
#endif
#endif /* SH_OPS_H */
