/*
 * sh_layers.h — fp32 forward/backward kernels of the GPT-2 layers used by sample_host.
 *
 * Conventions (same as llm.c's CPU reference):
 *  - activations are row-major (N, C) with N = B*T rows (token positions);
 *  - linear weights are (out, in) row-major and out = inp * W^T + b;
 *  - backward functions ACCUMULATE (+=) into parameter gradients, because the host
 *    contract (protrain.h, contract 3) says the plugin zeroes them and micro-batches
 *    accumulate. Activation gradients follow the rule stated next to each function.
 * Determinism: every OpenMP loop partitions independent outputs (rows, columns or
 * heads) in a way fixed by the shapes alone; no reduction is split across threads, so
 * results are bit-identical for any thread count and any buffer alignment.
 */
#ifndef SH_LAYERS_H
#define SH_LAYERS_H

#include <stddef.h>
#include <stdint.h>

#include "sh_elem.h" /* SH_LN_EPS and the element formulas */

/* out(N,C)[n] = wte[tok[n]] + wpe[n % T]; wte (Vp,C), wpe (maxT,C). */
void sh_layers_encoder_fwd(float *out, const int32_t *tok, const float *wte, const float *wpe,
                           int B, int T, int C);
/* dwte[tok[n]] += dout[n]; dwpe[t] += dout[b,t]. Parallel over channels. */
void sh_layers_encoder_bwd(float *dwte, float *dwpe, const float *dout, const int32_t *tok,
                           int B, int T, int C);

/* Make OpenBLAS single-threaded: sample_host parallelises GEMMs itself over fixed row
 * slabs on OpenMP threads (call once before training; process-wide). */
void sh_layers_init(void);

/* out = (inp - mean) * rstd * w + b per row; mean (N), rstd (N) saved for backward. */
void sh_layers_layernorm_fwd(float *out, float *mean, float *rstd, const float *inp,
                             const float *w, const float *b, int N, int C);
/* dinp += ..., dw += S_w, db += S_b (this call's sums added once); dinp may be NULL. */
void sh_layers_layernorm_bwd(float *dinp, float *dw, float *db, const float *dout, const float *inp,
                             const float *w, const float *mean, const float *rstd, int N, int C);

/* out(N,OC) = inp(N,IC) * W(OC,IC)^T + bias(OC); bias may be NULL. */
void sh_layers_matmul_fwd(float *out, const float *inp, const float *W, const float *bias,
                          int N, int IC, int OC);
/* dinp(N,IC) = dout * W (OVERWRITTEN; NULL = skip); dW(OC,IC) += dout^T * inp;
 * dbias(OC) += column sums of dout (NULL = skip). wtmp (OC,IC) scratch: the product is
 * formed there and added to dW once (dW + S, the order an offloading plugin also uses
 * across micro-batches); NULL: accumulated straight into dW by the GEMM (beta = 1). */
void sh_layers_matmul_bwd(float *dinp, float *dW, float *dbias, const float *dout, const float *inp,
                          const float *W, int N, int IC, int OC, float *wtmp);

/* Causal multi-head self-attention.
 * qkv (B,T,3C) holds q | k | v; head h uses channels [h*hd, (h+1)*hd), hd = C/NH.
 * att (B,NH,T,T) = softmax_t2<=t(q.k * 1/sqrt(hd)) (entries t2>t are 0), out (B,T,C) = att*v. */
void sh_layers_attention_fwd(float *out, float *att, const float *qkv, int B, int T, int C, int NH);
/* dqkv (B,T,3C) OVERWRITTEN. datt is scratch of nslots (T,T) slots, one per thread
 * (nslots = sh_layers_attention_slots() when it was allocated; the loop uses at most nslots
 * threads). Parallel over (b,h). */
void sh_layers_attention_bwd(float *dqkv, float *datt, int nslots, const float *dout,
                             const float *qkv, const float *att, int B, int T, int C, int NH);
int sh_layers_attention_slots(void);

/* GELU, tanh approximation: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))). */
void sh_layers_gelu_fwd(float *out, const float *inp, size_t n);
/* dinp = gelu'(inp) * dout (OVERWRITTEN); dinp may alias dout. */
void sh_layers_gelu_bwd(float *dinp, const float *inp, const float *dout, size_t n);

/* out += a (element-wise), out and a of n floats. */
void sh_layers_add_inplace(float *out, const float *a, size_t n);

/* Softmax over the first V of Vp logits per row, in place (padded columns set to 0),
 * then losses[n] = -log probs[n][targets[n]]. Returns the mean loss, summed in double
 * in row order. targets must lie in [0, V). */
double sh_layers_crossentropy_fwd(float *probs_inout, float *losses, const int32_t *targets,
                                  int N, int V, int Vp);
/* dlogits[n][i] = (probs[n][i] - [i == targets[n]]) * dloss for i < V, 0 for padded
 * columns (OVERWRITTEN; may alias probs). dloss = d(total loss)/d(loss_n), e.g. 1/N. */
void sh_layers_crossentropy_bwd(float *dlogits, const float *probs, const int32_t *targets,
                                float dloss, int N, int V, int Vp);

#endif /* SH_LAYERS_H */
