/*
 * cpu_ops.c — the CPU layers (layers.c) behind the sh_layer_ops table: thin
 * wrappers that drop the table's ctx, so the model source is the same for CPU and
 * CUDA and the CPU arithmetic is exactly that of layers.c.
 */
#include <string.h>

#include "sh_layers.h"
#include "sh_ops.h"

static void enc_fwd(void *c, float *out, const int32_t *tok, const float *wte,
                    const float *wpe, int B, int T, int C) {
    (void)c;
    sh_layers_encoder_fwd(out, tok, wte, wpe, B, T, C);
}
static void enc_bwd(void *c, float *dwte, float *dwpe, const float *dout, const int32_t *tok,
                    int B, int T, int C) {
    (void)c;
    sh_layers_encoder_bwd(dwte, dwpe, dout, tok, B, T, C);
}
static void ln_fwd(void *c, float *out, float *mean, float *rstd, const float *inp,
                   const float *w, const float *b, int N, int C) {
    (void)c;
    sh_layers_layernorm_fwd(out, mean, rstd, inp, w, b, N, C);
}
static void ln_bwd(void *c, float *dinp, float *dw, float *db, const float *dout,
                   const float *inp, const float *w, const float *mean, const float *rstd,
                   int N, int C) {
    (void)c;
    sh_layers_layernorm_bwd(dinp, dw, db, dout, inp, w, mean, rstd, N, C);
}
static void mm_fwd(void *c, float *out, const float *inp, const float *W, const float *bias,
                   int N, int IC, int OC) {
    (void)c;
    sh_layers_matmul_fwd(out, inp, W, bias, N, IC, OC);
}
static void mm_bwd(void *c, float *dinp, float *dW, float *dbias, const float *dout,
                   const float *inp, const float *W, int N, int IC, int OC, float *wtmp) {
    (void)c;
    sh_layers_matmul_bwd(dinp, dW, dbias, dout, inp, W, N, IC, OC, wtmp);
}
static void att_fwd(void *c, float *out, float *att, const float *qkv, int B, int T, int C,
                    int NH) {
    (void)c;
    sh_layers_attention_fwd(out, att, qkv, B, T, C, NH);
}
static void att_bwd(void *c, float *dqkv, float *datt, int nslots, const float *dout,
                    const float *qkv, const float *att, int B, int T, int C, int NH) {
    (void)c;
    sh_layers_attention_bwd(dqkv, datt, nslots, dout, qkv, att, B, T, C, NH);
}
static int att_slots(void *c, int NH) {
    (void)c;
    (void)NH;
    return sh_layers_attention_slots();
}
static void gelu_f(void *c, float *out, const float *inp, size_t n) {
    (void)c;
    sh_layers_gelu_fwd(out, inp, n);
}
static void gelu_b(void *c, float *dinp, const float *inp, const float *dout, size_t n) {
    (void)c;
    sh_layers_gelu_bwd(dinp, inp, dout, n);
}
static void add_ip(void *c, float *out, const float *a, size_t n) {
    (void)c;
    sh_layers_add_inplace(out, a, n);
}
static void xent_fwd(void *c, float *probs, float *losses, const int32_t *targets, int N,
                     int V, int Vp, double *loss_acc) {
    (void)c;
    double l = sh_layers_crossentropy_fwd(probs, losses, targets, N, V, Vp);
    if (loss_acc) *loss_acc += l;
}
static void xent_bwd(void *c, float *dlogits, const float *probs, const int32_t *targets,
                     float dloss, int N, int V, int Vp) {
    (void)c;
    sh_layers_crossentropy_bwd(dlogits, probs, targets, dloss, N, V, Vp);
}
static void zero(void *c, void *dst, size_t bytes) {
    (void)c;
    memset(dst, 0, bytes);
}

const sh_layer_ops sh_cpu_ops = {
    .ctx = NULL,
    .encoder_fwd = enc_fwd,
    .encoder_bwd = enc_bwd,
    .layernorm_fwd = ln_fwd,
    .layernorm_bwd = ln_bwd,
    .matmul_fwd = mm_fwd,
    .matmul_bwd = mm_bwd,
    .attention_fwd = att_fwd,
    .attention_bwd = att_bwd,
    .attention_slots = att_slots,
    .gelu_fwd = gelu_f,
    .gelu_bwd = gelu_b,
    .add_inplace = add_ip,
    .crossentropy_fwd = xent_fwd,
    .crossentropy_bwd = xent_bwd,
    .zero = zero,
};
