/*
 * sh_train.h — the sample_host trainer: one code path with or without the plugin.
 *
 * With a plugin table, every device byte comes from dev_alloc (tags "input", "act",
 * "scratch") or activation_arena, parameters live where post_model_load put them, and
 * the plugin steps the optimizer. Without one (--no-plugin) the trainer points
 * params[i].data/grad at its own aligned allocations (cudaMalloc on cuda), uses plain
 * allocations for the arenas and runs its own AdamW with the plugin's arithmetic (the
 * element update is sh_adamw_elem of sh_elem.h, on the CPU or as a CUDA kernel):
 *   bc1 = (float)(1 - b1^t), bc2r = (float)(1/sqrt(1 - b2^t))   (double math)
 *   norm = sqrt(sum_i S_i), S_i = sum_k (double)g_ik^2 in element order (on cuda in a
 *          fixed tree order), i over trainable untied params in declaration order
 *   s = max_grad_norm > 0 && norm > max_grad_norm ? (float)(max_grad_norm/(norm+1e-6)) : 1
 *   g = g*s; m = b1*m + (1-b1)*g; v = b2*v + (1-b2)*g*g; p = p - (lr*wd)*p;
 *   p = p - (lr/bc1)*m/(sqrtf(v)*bc2r + eps)
 * with (1-b1), (1-b2), lr*wd, lr/bc1 computed once per step in float; weight decay
 * applies to every trainable parameter (the plugin applies one decay to all).
 */
#ifndef SH_TRAIN_H
#define SH_TRAIN_H

#include <stddef.h>
#include <stdint.h>

#include "protrain.h"
#include "sh_cuda.h"
#include "sh_data.h"
#include "sh_gpt.h"
#include "sh_llmc.h"

typedef struct sh_trainer sh_trainer;

typedef struct sh_train_opts {
    sh_dims dims;
    int B, T, n_micro;
    uint64_t seed;
    int optim_from_ini;   /* plugin only: NaN descriptor fields, the INI decides */
    float lr, beta1, beta2, eps, weight_decay, max_grad_norm;
    const pt_plugin_v1 *tbl; /* NULL = no plugin */
    const char *ini_path;          /* passed to the plugin's init (may be NULL) */
    const char *load_path;         /* llm.c checkpoint for the initial values, or NULL */
    const sh_tokens *train, *val;  /* borrowed; must outlive the trainer */
    /* plugin log lines; NULL = stderr for levels <= INFO */
    void (*log)(void *user, int32_t level, const char *msg);
    void *log_user;
    /* The opened CUDA library (borrowed, outlives the trainer), or NULL: the layers run
     * on the CPU. With it every device byte is GPU memory, the layers are kernels on its
     * stream, the plugin gets device_kind CUDA and that stream as compute_stream, and
     * the CPU touches device memory only through the library's copies. */
    const sh_cuda *cuda;
    /* No plugin only: a step whose loss is not finite leaves parameters and AdamW
     * state untouched (sh_trainer_step returns 1). The plugin cannot drop a step: it
     * steps offloaded chunks while backward still runs. */
    int skip_nonfinite;
    /* Testing: step nan_step (> 0) gets NaN gradients and a NaN loss. */
    int64_t nan_step;
    /* SH_ORDER_* (sh_llmc.h): how batches are drawn from train; 0 = random rows. */
    int data_order;
    /* Testing: called after block l's backward work has run (the device synced),
     * inside its backward window, where params[i].grad of block l is readable. */
    void (*grad_probe)(void *user, const sh_model *m, int l);
    void *grad_probe_user;
    /* Data parallel (0 = 1): this process is rank `rank` of `world` (sh_dist.h). Each
     * micro-batch draws `world` batches and trains on batch `rank` of them; the
     * reported loss is the mean over every rank's micro-batches (plugin only). */
    int world, rank, local_rank;
    /* pt_host_v1.fingerprint (sh_fingerprint.h), or NULL; read during create only */
    const char *fingerprint;
} sh_train_opts;

/* Build the model, start the plugin (init, buffers, post_model_load, create_optimizer)
 * or the no-plugin state. On failure *out is NULL and err holds one sentence. */
int sh_trainer_create(sh_trainer **out, const sh_train_opts *o, char *err, size_t errlen);
/* One optimizer step (n_micro micro-batches from the batch stream); *loss = mean loss.
 * Returns 1 when skip_nonfinite skipped the update (the batches are still consumed). */
int sh_trainer_step(sh_trainer *tr, int64_t step, float lr, double *loss);
/* Mean loss over validation batches 0..n-1 (forward-only passes). */
int sh_trainer_eval(sh_trainer *tr, int64_t step, int n_batches, double *loss);
/* Extend seq[0..n_prompt) to seq[0..n_total) one token at a time: greedy when
 * temperature <= 0, else sampled from softmax(logits / temperature) with rng. */
int sh_trainer_generate(sh_trainer *tr, int64_t step, uint16_t *seq, int n_prompt,
                        int n_total, float temperature, sh_rng *rng);
/* Current parameter values in the model's flat layout (model->n_floats floats). */
int sh_trainer_snapshot(sh_trainer *tr, float *flat);
/* Device counters; returns 1 (st untouched) without a plugin or get_stats hook. */
int sh_trainer_stats(sh_trainer *tr, pt_stats_v1 *st);
const sh_model *sh_trainer_model(const sh_trainer *tr);
const char *sh_trainer_error(const sh_trainer *tr);
/* Global grad norm of the last no-plugin step (NaN if clipping was off). */
double sh_trainer_last_norm(const sh_trainer *tr);
/* Frees everything; calls the plugin's finalize. Returns its status (0 = OK). */
int sh_trainer_destroy(sh_trainer *tr);

/* Checkpoint access (sh_resume.h). The host's part of the training state besides
 * the parameters: the batch sampler's position (random stream, epoch and window) and the no-plugin optimizer's step
 * count (bias correction continues from it). */
typedef struct sh_trainer_state {
    uint64_t batch_rng;
    int64_t opt_steps;
    uint64_t data_epoch, data_pos; /* sequential / shuffled orders: the next window */
} sh_trainer_state;
void sh_trainer_get_state(const sh_trainer *tr, sh_trainer_state *s);
void sh_trainer_set_state(sh_trainer *tr, const sh_trainer_state *s);
/* No plugin: the flat parameters and AdamW m, v (model->n_floats floats each) copied
 * out of the trainer (load = 0) or into it (load = 1). */
int sh_trainer_opt_io(sh_trainer *tr, float *p, float *m, float *v, int load);
/* Plugin: save_state / load_state on dir (one file per rank, protrain.h). */
int sh_trainer_plugin_state(sh_trainer *tr, const char *dir, int load);
/* Several ranks: v[0..n) summed over the ranks in place (the plugin's
 * dist_allreduce; also what keeps the ranks in step around a checkpoint). */
int sh_trainer_dist_sum(sh_trainer *tr, double *v, int n);
/* Several ranks: this rank stops with the sentence why, and the others' waits
 * end with it (the plugin's dist_abort, ABI 1.6; nothing without it). */
void sh_trainer_dist_abort(sh_trainer *tr, const char *why);

/* Gradient-check entry (no-plugin only): one forward on (inp, tgt) of (B,T) tokens,
 * plus backward with dloss = 1/(B*T) when backward != 0 (grads accumulate). */
int sh_trainer_fwdbwd(sh_trainer *tr, const int32_t *inp, const int32_t *tgt, int backward,
                      double *loss);
/* No-plugin only: zero every gradient. */
void sh_trainer_zero_grads(sh_trainer *tr);

#endif /* SH_TRAIN_H */
