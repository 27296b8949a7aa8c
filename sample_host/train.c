/*
 * train.c — sample_host trainer: plugin lifecycle, device buffers, forward/backward
 * passes with the block hooks, host callbacks (recompute_block, profile_step), the
 * no-plugin AdamW. See sh_train.h for the contract and the optimizer arithmetic.
 */
#include "sh_train.h"

#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sh_adamw.h"
#include "sh_ckpt.h"
#include "sh_layers.h"
#include "sh_tiled.h"
#include "sh_trainer_int.h"
#include "sh_work.h"


#define P(i) (tr->model.params[(i)])

int sh_trainer_fail(sh_trainer *tr, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(tr->err, sizeof tr->err, fmt, ap);
    va_end(ap);
    return -1;
}

/* A hook returned non-zero: name it, its argument, the status and the plugin's sentence. */
int sh_trainer_hook_fail(sh_trainer *tr, const char *hook, long long arg, int32_t st) {
    const char *le = tr->tbl->last_error ? tr->tbl->last_error(tr->ctx) : "";
    sh_trainer_fail(tr, "plugin hook %s(%lld) failed with status %d: %s%s%s", hook, arg, (int)st,
                    le ? le : "", tr->cb_err[0] ? " (host callback: " : "", tr->cb_err[0] ? tr->cb_err : "");
    if (tr->cb_err[0]) strncat(tr->err, ")", sizeof tr->err - strlen(tr->err) - 1);
    return -1;
}


/* Run or launch one piece of device work (sh_work.h). */
#define WORK(...) \
    do { \
        sh_op op_ = {__VA_ARGS__}; \
        int32_t st_ = sh_work_run(&tr->lw, &tr->model, &op_); \
        if (st_ != 0) return sh_trainer_hook_fail(tr, "launch", (long long)op_.kind, st_); \
    } while (0)

/* The CPU waits for the device work so far: the CUDA stream, or the plugin's stream
 * when work was launched on it. */
int sh_trainer_sync(sh_trainer *tr) {
    if (tr->cu) {
        if (tr->cu->api->sync(tr->cu->ctx) != 0)
            return sh_trainer_fail(tr, "%s", tr->cu->api->last_error(tr->cu->ctx));
        return 0;
    }
    int32_t st = sh_work_sync(&tr->lw);
    if (st != 0) return sh_trainer_hook_fail(tr, "stream_sync", 0, st);
    /* an OSFT hook run on this thread that failed (launched work reports through
     * stream_sync above) */
    if (tr->osft_st) return sh_trainer_hook_fail(tr, "osft_linear_forward/backward", 0, tr->osft_st);
    return 0;
}


/* ---- memory: every device byte through one interface ---- */

static int dalloc(sh_trainer *tr, size_t bytes, const char *tag, void **p) {
    *p = NULL;
    if (tr->tbl) {
        int32_t st = tr->tbl->dev_alloc(tr->ctx, bytes, tag, p);
        if (st != 0 || !*p) return sh_trainer_hook_fail(tr, "dev_alloc", (long long)bytes, st ? st : -1);
        return 0;
    }
    if (tr->cu) {
        if (tr->cu->api->dev_alloc(tr->cu->ctx, bytes, p) != 0 || !*p)
            return sh_trainer_fail(tr, "out of GPU memory: %zu bytes for %s buffers (%s)", bytes, tag,
                                   tr->cu->api->last_error(tr->cu->ctx));
        return 0;
    }
    size_t n = (bytes + 63) & ~(size_t)63;
    *p = aligned_alloc(64, n ? n : 64);
    if (!*p) return sh_trainer_fail(tr, "out of host memory: %zu bytes for %s buffers", bytes, tag);
    return 0;
}

static void dfree(sh_trainer *tr, void *p) {
    if (!p) return;
    if (tr->tbl) tr->tbl->dev_free(tr->ctx, p);
    else if (tr->cu) tr->cu->api->dev_free(tr->cu->ctx, p);
    else free(p);
}

/* dst = 0 over bytes of device memory (ordered on the stream on cuda). */
void sh_trainer_dzero(sh_trainer *tr, void *dst, size_t bytes) {
    if (tr->cu) tr->cu->ops.zero(tr->cu->ctx, dst, bytes);
    else memset(dst, 0, bytes);
}

/* Copy between host staging and device buffers. cuda: the library's copies on the
 * stream (H2D returns with src free again; D2H waits, so dst is ready on return);
 * else the plugin's memcpy when it has one, else memcpy. */
int sh_trainer_copy(sh_trainer *tr, void *dst, const void *src, size_t bytes, int kind) {
    if (tr->cu) {
        if (kind == PT_COPY_H2D) {
            tr->cu->api->h2d(tr->cu->ctx, dst, src, bytes);
            return 0;
        }
        tr->cu->api->d2h(tr->cu->ctx, dst, src, bytes);
        return sh_trainer_sync(tr);
    }
    if (tr->tbl && PT_HAS_HOOK(tr->tbl, memcpy)) {
        int32_t st = tr->tbl->memcpy(tr->ctx, dst, src, bytes, kind);
        if (st != 0) return sh_trainer_hook_fail(tr, "memcpy", (long long)bytes, st);
        return 0;
    }
    memcpy(dst, src, bytes);
    return 0;
}

static size_t al16(size_t x) { return (x + 15) & ~(size_t)15; }

static int alloc_buffers(sh_trainer *tr) {
    const sh_dims *d = &tr->model.d;
    size_t B = (size_t)tr->o.B, T = (size_t)tr->o.T, N = B * T, C = (size_t)d->C;
    void *p;
    if (dalloc(tr, N * sizeof(int32_t), "input", &p)) return -1;
    tr->inp = p;
    if (dalloc(tr, N * sizeof(int32_t), "input", &p)) return -1;
    tr->tgt = p;
    for (int l = 0; l <= d->L; l++) {
        if (dalloc(tr, N * C * sizeof(float), "act", &p)) return -1;
        tr->res[l] = p;
    }
    size_t o_lnf = 0, o_mean = al16(N * C), o_rstd = o_mean + al16(N),
           o_logits = o_rstd + al16(N), o_loss = o_logits + al16(N * (size_t)d->Vp),
           head_n = o_loss + al16(N);
    if (dalloc(tr, head_n * sizeof(float), "act", &p)) return -1;
    tr->head_buf = p;
    tr->head.lnf = tr->head_buf + o_lnf;
    tr->head.lnf_mean = tr->head_buf + o_mean;
    tr->head.lnf_rstd = tr->head_buf + o_rstd;
    tr->head.logits = tr->head_buf + o_logits;
    tr->head.losses = tr->head_buf + o_loss;
    const sh_layer_ops *ops = tr->cu ? &tr->cu->ops : &sh_cpu_ops;
    int slots = ops->attention_slots(ops->ctx, d->NH);
    /* dbig: (N,4C) for the MLP backward, or only dqkv (N,3C) when the MLP is tiled */
    size_t o_big = al16(N * C), o_small = o_big + al16(N * (tr->tl.on ? 3 : 4) * C),
           o_att = o_small + al16(N * C), o_w = o_att + al16((size_t)slots * T * T),
           scr_n = o_w + al16(4 * C * C);
    if (dalloc(tr, scr_n * sizeof(float), "scratch", &p)) return -1;
    tr->scr_buf = p;
    tr->dres = tr->scr_buf;
    tr->scr.dbig = tr->scr_buf + o_big;
    tr->scr.dsmall = tr->scr_buf + o_small;
    tr->scr.datt = tr->scr_buf + o_att;
    tr->scr.nslots = slots;
    tr->scr.wtmp = tr->scr_buf + o_w;
    if (tr->cu) {
        if (dalloc(tr, 2 * sizeof(double), "scratch", &p)) return -1;
        tr->dstat = p;
    }
    if (!tr->tbl) {
        sh_arena_layout lay;
        sh_model_arena_layout_make(&lay, d, tr->o.B, tr->o.T);
        for (int l = 0; l < d->L; l++) {
            if (dalloc(tr, lay.total * sizeof(float), "act", &p)) return -1;
            tr->arenas[l] = p;
        }
    }
    return 0;
}

static int arena_new(sh_trainer *tr, int l, size_t bytes, float **a) {
    if (!tr->tbl) {
        *a = tr->arenas[l];
        return 0;
    }
    void *p = NULL;
    HOOK(activation_arena, l, l, bytes, &p);
    if (!p) return sh_trainer_fail(tr, "plugin hook activation_arena(%d) returned a NULL arena", l);
    *a = p;
    return 0;
}

static int arena_get(sh_trainer *tr, int l, float **a) {
    if (!tr->tbl) {
        *a = tr->arenas[l];
        return 0;
    }
    void *p = NULL;
    HOOK(activation_arena_get, l, l, &p);
    if (!p) return sh_trainer_fail(tr, "plugin hook activation_arena_get(%d) returned NULL", l);
    *a = p;
    return 0;
}

/* ---- passes ---- */

/* Forward over tr->inp (B,T): embeddings, blocks between their hooks, then the head
 * inside the last block's window (so an evaluation pass, which ends at
 * block_post_forward(L-1), reads the non-block params inside it). */
/* The head adds the mean loss to *loss (when with_targets), which the CPU reads
 * after SYNC(). */
static int pass_fwd(sh_trainer *tr, int B, int T, int with_targets, double *loss) {
    const sh_model *m = &tr->model;
    int L = m->d.L;
    tr->curB = B;
    tr->curT = T;
    WORK(.kind = SH_OP_ENCODER_FWD, .B = B, .T = T, .out = tr->res[0], .tok = tr->inp);
    sh_arena_layout lay;
    sh_model_arena_layout_make_t(&lay, &m->d, B, T, tr->tl.on);
    for (int l = 0; l < L; l++) {
        float *a = NULL;
        if (tr->tbl) HOOK(block_pre_forward, l, l);
        if (arena_new(tr, l, lay.total * sizeof(float), &a)) return -1;
        if (tr->tl.on) {
            WORK(.kind = SH_OP_BLOCK_FWD_ATTN, .l = l, .B = B, .T = T, .a = a, .x = tr->res[l]);
            int32_t st = sh_tiled_fwd(&tr->tl, l, a, tr->res[l + 1], B, T);
            if (st) return sh_trainer_hook_fail(tr, "tiled_mlp_forward", l, st);
        } else {
            WORK(.kind = SH_OP_BLOCK_FWD, .l = l, .B = B, .T = T, .a = a, .x = tr->res[l],
                 .out = tr->res[l + 1]);
        }
        if (l == L - 1)
            WORK(.kind = SH_OP_HEAD_FWD, .B = B, .T = T, .x = tr->res[L],
                 .tgt = with_targets ? tr->tgt : NULL, .head = tr->head, .loss_out = loss);
        if (tr->tbl) HOOK(block_post_forward, l, l);
    }
    return 0;
}

static int pass_bwd(sh_trainer *tr, int B, int T, float dloss) {
    const sh_model *m = &tr->model;
    int L = m->d.L;
    WORK(.kind = SH_OP_HEAD_BWD, .B = B, .T = T, .x = tr->res[L], .tgt = tr->tgt, .dloss = dloss,
         .dres = tr->dres, .head = tr->head, .scr = tr->scr);
    for (int l = L - 1; l >= 0; l--) {
        float *a = NULL;
        if (tr->tbl) HOOK(block_pre_backward, l, l);
        /* re-read: the plugin may have recomputed (CKPT) or swapped the arena back */
        if (arena_get(tr, l, &a)) return -1;
        if (tr->tl.on) {
            int32_t st = sh_tiled_bwd(&tr->tl, l, a, tr->dres, tr->scr.dsmall, B, T);
            if (st) return sh_trainer_hook_fail(tr, "tiled_mlp_backward", l, st);
            WORK(.kind = SH_OP_BLOCK_BWD_ATTN, .l = l, .B = B, .T = T, .a = a, .x = tr->res[l],
                 .dres = tr->dres, .scr = tr->scr);
        } else {
            WORK(.kind = SH_OP_BLOCK_BWD, .l = l, .B = B, .T = T, .a = a, .x = tr->res[l],
                 .dres = tr->dres, .scr = tr->scr);
        }
        if (tr->o.grad_probe) {
            SYNC();
            tr->o.grad_probe(tr->o.grad_probe_user, m, l);
        }
        if (tr->tbl) HOOK(block_post_backward, l, l);
    }
    WORK(.kind = SH_OP_ENCODER_BWD, .B = B, .T = T, .dres = tr->dres, .tok = tr->inp);
    return 0;
}

/* Where the head adds its mean losses: host memory on the CPU, device memory on cuda. */
static double *loss_ptr(sh_trainer *tr) { return tr->cu ? &tr->dstat[0] : &tr->loss_acc; }

static void loss_reset(sh_trainer *tr) {
    tr->loss_acc = 0.0;
    if (tr->cu) sh_trainer_dzero(tr, tr->dstat, sizeof(double));
}

/* After SYNC(): the accumulated losses into tr->loss_acc. */
static int loss_read(sh_trainer *tr) {
    return tr->cu ? sh_trainer_copy(tr, &tr->loss_acc, tr->dstat, sizeof(double), PT_COPY_D2H) : 0;
}

static float micro_dloss(const sh_trainer *tr) {
    /* mean over B*T positions and over n_micro micro-batches */
    return (float)(1.0 / ((double)tr->o.B * tr->o.T * tr->o.n_micro));
}

/* ---- host callbacks (called by the plugin from inside a hook, on this thread) ---- */

static int32_t cb_recompute(void *user, int32_t b) {
    sh_trainer *tr = user;
    if (!tr->in_pass || b < 0 || b >= tr->model.d.L) {
        snprintf(tr->cb_err, sizeof tr->cb_err, "recompute_block(%d) called outside a "
                                                "backward pass or with a bad block index",
                 (int)b);
        return PT_ERR_ORDER;
    }
    void *p = NULL;
    int32_t st = tr->tbl->activation_arena_get(tr->ctx, b, &p);
    if (st != 0 || !p) {
        snprintf(tr->cb_err, sizeof tr->cb_err, "recompute_block(%d): activation_arena_get "
                                                "failed with status %d",
                 (int)b, (int)st);
        return st ? st : PT_ERR_INTERNAL;
    }
    /* Re-run the forward from the saved input res[b]; the block output is not needed
     * again (block b+1's backward is done), so it goes to backward scratch that is
     * idle between blocks instead of overwriting res[b+1]. */
    /* tiled MLP: only the part up to ln2; the MLP's output is not needed and each
     * tile's backward recomputes its own intermediates */
    sh_op op = {.kind = tr->tl.on ? SH_OP_BLOCK_FWD_ATTN : SH_OP_BLOCK_FWD, .l = b, .B = tr->curB, .T = tr->curT, .a = p, .x = tr->res[b], .out = tr->scr.dsmall};
    st = sh_work_run(&tr->lw, &tr->model, &op);
    if (st != 0) {
        snprintf(tr->cb_err, sizeof tr->cb_err, "recompute_block(%d): launch failed with "
                                                "status %d",
                 (int)b, (int)st);
        return st;
    }
    return 0;
}

static int32_t cb_mlp_fwd(void *user, int32_t b, int64_t begin, int64_t count) {
    return sh_tiled_cb(&((sh_trainer *)user)->tl, b, begin, count, 0);
}
static int32_t cb_mlp_bwd(void *user, int32_t b, int64_t begin, int64_t count) {
    return sh_tiled_cb(&((sh_trainer *)user)->tl, b, begin, count, 1);
}

static int32_t cb_profile(void *user) {
    sh_trainer *tr = user;
    if (tr->in_pass) {
        snprintf(tr->cb_err, sizeof tr->cb_err, "profile_step called during a pass");
        return PT_ERR_ORDER;
    }
    tr->in_pass = 1;
    int rc = pass_fwd(tr, tr->o.B, tr->o.T, 1, loss_ptr(tr));
    if (rc == 0) rc = pass_bwd(tr, tr->o.B, tr->o.T, micro_dloss(tr));
    tr->in_pass = 0;
    if (rc) {
        /* keep the first part of the pass's error: cb_err is shorter than err */
        snprintf(tr->cb_err, sizeof tr->cb_err, "profile_step: %.360s", tr->err);
        return PT_ERR_CALLBACK;
    }
    return 0;
}

/* pt_host_v1 has one user pointer for every callback: route log lines to the
 * caller's logger (with its own user pointer) or to stderr for levels <= INFO. */
static void log_tramp(void *user, int32_t level, const char *msg) {
    sh_trainer *tr = user;
    /* the plugin's start line, "backend NAME (device), ...": remember NAME (a word of
     * lower-case letters; other lines starting with "backend" are not it) */
    if (msg && strncmp(msg, "backend ", 8) == 0) {
        size_t n = strspn(msg + 8, "abcdefghijklmnopqrstuvwxyz");
        if (n > 0 && n < sizeof tr->opened && msg[8 + n] == ' ') {
            memcpy(tr->opened, msg + 8, n);
            tr->opened[n] = '\0';
        }
    }
    if (tr->o.log) {
        tr->o.log(tr->o.log_user, level, msg);
        return;
    }
    static const char *nm[] = {"error", "warn", "info", "debug", "trace"};
    if (level <= PT_LOG_INFO)
        fprintf(stderr, "protrain %s: %s\n", nm[level >= 0 && level <= 4 ? level : 2],
                msg ? msg : "");
}

/* ---- setup ---- */

static int check_table(sh_trainer *tr) {
    const pt_plugin_v1 *t = tr->tbl;
#define NEED(f) \
    do { \
        if (!PT_HAS_HOOK(t, f)) \
            return sh_trainer_fail(tr, "plugin %s lacks the required hook " #f, \
                                   t->name ? t->name : "?"); \
    } while (0)
    NEED(init);
    NEED(last_error);
    NEED(post_model_load);
    NEED(create_optimizer);
    NEED(pre_step);
    NEED(block_pre_forward);
    NEED(block_post_forward);
    NEED(block_pre_backward);
    NEED(block_post_backward);
    NEED(optimizer_step);
    NEED(post_step);
    NEED(finalize);
    NEED(dev_alloc);
    NEED(dev_free);
    NEED(activation_arena);
    NEED(activation_arena_get);
#undef NEED
    return 0;
}

static int check_data(sh_trainer *tr) {
    const sh_train_opts *o = &tr->o;
    const sh_tokens *s[2] = {o->train, o->val};
    const char *nm[2] = {"training", "validation"};
    for (int i = 0; i < 2; i++) {
        if (!s[i] || s[i]->n <= (size_t)o->T)
            return sh_trainer_fail(tr, "the %s split has %zu tokens; it needs more than seq = %d", nm[i],
                                   s[i] ? s[i]->n : (size_t)0, o->T);
        int v = sh_data_tokens_vocab(s[i]);
        if (v > tr->model.d.V)
            return sh_trainer_fail(tr, "the %s data holds token id %d but the model vocab is %d", nm[i],
                                   v - 1, tr->model.d.V);
    }
    if (o->T > tr->model.d.maxT)
        return sh_trainer_fail(tr, "seq = %d is longer than the model's max_seq = %d", o->T,
                               tr->model.d.maxT);
    return 0;
}

static int start_plugin(sh_trainer *tr) {
    if (check_table(tr)) return -1;
    pt_host_v1 *h = &tr->host;
    h->abi_version = PT_ABI_VERSION;
    h->struct_size = sizeof *h;
    h->world_size = tr->o.world > 1 ? tr->o.world : 1;
    h->rank = tr->o.world > 1 ? tr->o.rank : 0;
    h->local_rank = tr->o.world > 1 ? tr->o.local_rank : 0;
    /* on cuda each rank has the GPU of its local rank (run.c opened that one) */
    h->device_index = tr->cu ? h->local_rank : 0;
    /* on the CPU the model runs as CPU code on device pointers: the device must be
     * addressable (host backend). On cuda the layers are kernels on the library's
     * stream, which the plugin adopts as its compute stream and orders its own copies
     * against (so the host's work is asynchronous: the flag). */
    h->device_kind = tr->cu ? PT_DEVICE_CUDA : PT_DEVICE_HOST;
    h->user = tr;
    h->log = log_tramp;
    h->recompute_block = cb_recompute;
    h->profile_step = cb_profile;
    h->mlp_forward = cb_mlp_fwd;
    h->mlp_backward = cb_mlp_bwd;
    h->fingerprint = tr->o.fingerprint;
    if (tr->cu) {
        h->compute_stream = tr->cu->api->stream(tr->cu->ctx);
        h->flags |= PT_HOST_ASYNC_COMPUTE;
    } else if (sh_work_can_launch(tr->tbl)) {
        /* with a compute stream, every piece of device work is launched on it */
        h->flags |= PT_HOST_ASYNC_COMPUTE;
    }
    int32_t st = tr->tbl->init(tr->o.ini_path, h, &tr->ctx);
    if (st != 0) {
        const char *le = tr->tbl->last_error(NULL);
        tr->ctx = NULL;
        return sh_trainer_fail(tr, "plugin init failed with status %d: %s", (int)st, le ? le : "");
    }
    tr->lw.tbl = tr->tbl;
    tr->lw.ctx = tr->ctx;
    tr->tl = (sh_tiled){.tbl = tr->tbl, .ctx = tr->ctx, .lw = &tr->lw, .m = &tr->model, .err = tr->cb_err, .errlen = sizeof tr->cb_err};
    sh_tiled_query(&tr->tl);
    /* OSFT: from init on the plugin says whether it will decompose weights; the
     * model then sends every weight whose data is NULL in its window through the
     * hooks (decided before post_model_load, whose profile_step runs the blocks) */
    pt_stats_v1 ost = {.struct_size = sizeof ost};
    if (PT_HAS_HOOK(tr->tbl, get_stats) && tr->tbl->get_stats(tr->ctx, &ost) == 0 &&
        ost.struct_size >= offsetof(pt_stats_v1, osft_targets) + sizeof ost.osft_targets &&
        ost.osft_targets > 0) {
        if (tr->cu)
            return sh_trainer_fail(tr, "the plugin decomposes weights ([osft] enabled = true), but "
                                       "sample_host --device cuda adds the biases of decomposed layers on the "
                                       "CPU only: set enabled = false or use --device cpu");
        if (!PT_HAS_HOOK(tr->tbl, osft_linear_forward) || !PT_HAS_HOOK(tr->tbl, osft_linear_backward))
            return sh_trainer_fail(tr, "the plugin reports OSFT targets but lacks the osft_linear hooks");
        tr->model.osft_tbl = tr->tbl;
        tr->model.osft_ctx = tr->ctx;
        tr->model.osft_status = &tr->osft_st;
    }
    /* cuda: running an op enqueues its kernels, no launch hook needed */
    tr->lw.async = !tr->cu && sh_work_can_launch(tr->tbl);
    if (tr->cu && tr->opened[0] && strcmp(tr->opened, "cuda") != 0)
        return sh_trainer_fail(tr, "the plugin opened its %s backend, but --device cuda needs its cuda "
                                   "backend ([plugin] backend = cuda or auto, on a machine with a GPU)",
                               tr->opened);
    return 0;
}

static int start_model(sh_trainer *tr) {
    sh_model *m = &tr->model;
    if (tr->tbl) {
        pt_model_v1 *pm = &tr->pm;
        pm->struct_size = sizeof *pm;
        pm->n_params = m->n_params;
        pm->params = m->params;
        pm->n_blocks = m->d.L;
        pm->batch = tr->o.B;
        pm->seq = tr->o.T;
        pm->arch = "gpt2-fp32";
        /* profile_step may run inside post_model_load: it needs a batch in place */
        tr->in_pass = 0;
        HOOK(post_model_load, m->d.L, pm);
        pt_optim_v1 od;
        memset(&od, 0, sizeof od);
        od.struct_size = sizeof od;
        if (tr->o.optim_from_ini) {
            od.type = PT_OPTIM_FROM_CONFIG;
            od.lr = od.beta1 = od.beta2 = od.eps = od.weight_decay = od.max_grad_norm = NAN;
        } else {
            od.type = PT_OPTIM_ADAMW;
            od.lr = tr->o.lr;
            od.beta1 = tr->o.beta1;
            od.beta2 = tr->o.beta2;
            od.eps = tr->o.eps;
            od.weight_decay = tr->o.weight_decay;
            od.max_grad_norm = tr->o.max_grad_norm;
        }
        HOOK(create_optimizer, od.type, &od);
    } else {
        size_t n = m->n_floats;
        void *p;
        if (dalloc(tr, n * sizeof(float), "param", &p)) return -1;
        tr->p_data = p;
        if (sh_trainer_copy(tr, tr->p_data, m->init, n * sizeof(float), PT_COPY_H2D)) return -1;
        if (dalloc(tr, n * sizeof(float), "grad", &p)) return -1;
        tr->p_grad = p;
        if (dalloc(tr, n * sizeof(float), "optim", &p)) return -1;
        tr->opt_m = p;
        if (dalloc(tr, n * sizeof(float), "optim", &p)) return -1;
        tr->opt_v = p;
        sh_trainer_dzero(tr, tr->p_grad, n * sizeof(float));
        sh_trainer_dzero(tr, tr->opt_m, n * sizeof(float));
        sh_trainer_dzero(tr, tr->opt_v, n * sizeof(float));
        if (tr->cu) {
            /* the clipping segments: trainable untied params in declaration order */
            tr->seg_off = calloc((size_t)m->n_params, sizeof *tr->seg_off);
            tr->seg_len = calloc((size_t)m->n_params, sizeof *tr->seg_len);
            if (!tr->seg_off || !tr->seg_len) return sh_trainer_fail(tr, "out of host memory");
            for (int i = 0; i < m->n_params; i++) {
                if (!m->params[i].trainable || m->params[i].tie >= 0) continue;
                tr->seg_off[tr->nseg] = m->off[i];
                tr->seg_len[tr->nseg++] = sh_model_param_numel(&m->params[i]);
            }
        }
        for (int i = 0; i < m->n_params; i++) {
            m->params[i].data = tr->p_data + m->off[i];
            m->params[i].grad = tr->p_grad + m->off[i];
        }
    }
    /* the initial values now live in plugin/trainer storage */
    for (int i = 0; i < m->n_params; i++) m->params[i].init = NULL;
    free(m->init);
    m->init = NULL;
    return 0;
}

int sh_trainer_create(sh_trainer **out, const sh_train_opts *o, char *err, size_t errlen) {
    *out = NULL;
    sh_trainer *tr = calloc(1, sizeof *tr);
    if (!tr) {
        snprintf(err, errlen, "out of host memory for the trainer");
        return -1;
    }
    tr->o = *o;
    tr->tbl = o->tbl;
    tr->cu = o->cuda;
    sh_layers_init();
    tr->last_norm = NAN;
    int rc = 0;
    if (o->B < 1 || o->T < 1 || o->n_micro < 1)
        rc = sh_trainer_fail(tr, "batch (%d), seq (%d) and grad_accum (%d) must be positive", o->B, o->T,
                             o->n_micro);
    if (!rc && sh_model_create(&tr->model, &o->dims, tr->err, sizeof tr->err)) rc = -1;
    if (!rc && tr->cu) tr->model.ops = &tr->cu->ops;
    if (!rc) {
        if (o->load_path && *o->load_path)
            rc = sh_ckpt_load(o->load_path, &tr->model, tr->err, sizeof tr->err);
        else
            sh_model_init_random(&tr->model, o->seed);
    }
    if (!rc) rc = check_data(tr);
    if (!rc) {
        int L = tr->model.d.L;
        size_t N = (size_t)o->B * o->T;
        tr->res = calloc((size_t)L + 1, sizeof *tr->res);
        tr->arenas = calloc((size_t)L, sizeof *tr->arenas);
        tr->h_inp = malloc(N * sizeof(int32_t));
        tr->h_tgt = malloc(N * sizeof(int32_t));
        tr->h_skip = malloc(2 * N * sizeof(int32_t));
        tr->h_row = malloc((size_t)tr->model.d.Vp * sizeof(float));
        if (!tr->res || !tr->arenas || !tr->h_inp || !tr->h_tgt || !tr->h_skip || !tr->h_row)
            rc = sh_trainer_fail(tr, "out of host memory for trainer tables");
    }
    if (!rc && sh_sampler_init(&tr->batch, o->data_order, o->train, o->B, o->T, o->seed,
                               tr->err, sizeof tr->err)) rc = -1;
    if (!rc && tr->tbl) rc = start_plugin(tr);
    if (!rc) rc = alloc_buffers(tr);
    if (!rc) {
        /* profile_step's batch: the first training batch, peeked so training starts with it */
        sh_sampler_peek(&tr->batch, tr->h_inp, tr->h_tgt);
        size_t nb = (size_t)o->B * o->T * sizeof(int32_t);
        rc = sh_trainer_copy(tr, tr->inp, tr->h_inp, nb, PT_COPY_H2D);
        if (!rc) rc = sh_trainer_copy(tr, tr->tgt, tr->h_tgt, nb, PT_COPY_H2D);
    }
    if (!rc) rc = start_model(tr);
    if (rc) {
        snprintf(err, errlen, "%s", tr->err);
        sh_trainer_destroy(tr);
        return -1;
    }
    *out = tr;
    return 0;
}

int sh_trainer_destroy(sh_trainer *tr) {
    if (!tr) return 0;
    int rc = 0;
    /* no kernel may still use what is freed below (the error, if any, was reported) */
    if (tr->cu) (void)tr->cu->api->sync(tr->cu->ctx);
    if (!tr->tbl || tr->ctx) {
        dfree(tr, tr->inp);
        dfree(tr, tr->tgt);
        if (tr->res)
            for (int l = 0; l <= tr->model.d.L; l++) dfree(tr, tr->res[l]);
        dfree(tr, tr->head_buf);
        dfree(tr, tr->scr_buf);
        dfree(tr, tr->dstat);
        if (tr->arenas)
            for (int l = 0; l < tr->model.d.L; l++) dfree(tr, tr->arenas[l]);
        dfree(tr, tr->p_data);
        dfree(tr, tr->p_grad);
        dfree(tr, tr->opt_m);
        dfree(tr, tr->opt_v);
    }
    if (tr->tbl && tr->ctx) {
        rc = tr->tbl->finalize(tr->ctx);
        tr->ctx = NULL;
    }
    free(tr->res);
    free(tr->arenas);
    free(tr->h_inp);
    free(tr->h_tgt);
    free(tr->h_skip);
    free(tr->h_row);
    free(tr->seg_off);
    free(tr->seg_len);
    sh_model_destroy(&tr->model);
    sh_sampler_free(&tr->batch);
    free(tr);
    return rc;
}

/* ---- no-plugin optimizer ---- */

static void adamw_step(sh_trainer *tr, float lr) {
    const sh_model *m = &tr->model;
    const sh_train_opts *o = &tr->o;
    tr->t++;
    const sh_adamw_k k =
        sh_adamw_consts(lr, o->beta1, o->beta2, o->eps, o->weight_decay, tr->t);
    tr->last_norm = NAN;
    if (tr->cu) {
        /* the same steps as kernels; the norm lands in dstat[1], read after the sync */
        tr->cu->api->adamw(tr->cu->ctx, tr->p_data, tr->p_grad, tr->opt_m, tr->opt_v,
                           m->n_floats, tr->seg_off, tr->seg_len, tr->nseg, o->max_grad_norm,
                           &k, &tr->dstat[1]);
        return;
    }
    tr->last_norm =
        sh_adamw_cpu(m, tr->p_data, tr->p_grad, tr->opt_m, tr->opt_v, o->max_grad_norm, &k);
}

/* ---- public steps ---- */

/* Tokens into the device buffers: launched (the bytes copied at launch, so the
 * staging buffers are free at once) behind the work still reading the previous
 * batch, or copied now. */
static int upload_to(sh_trainer *tr, void *dst, const void *src, size_t bytes) {
    if (!tr->lw.async) return sh_trainer_copy(tr, dst, src, bytes, PT_COPY_H2D);
    WORK(.kind = SH_OP_UPLOAD, .dst = dst, .src = src, .bytes = bytes);
    return 0;
}

static int upload(sh_trainer *tr, size_t ntok) {
    if (upload_to(tr, tr->inp, tr->h_inp, ntok * sizeof(int32_t))) return -1;
    return upload_to(tr, tr->tgt, tr->h_tgt, ntok * sizeof(int32_t));
}

/* Several ranks: loss_acc becomes the sum of every rank's, added in rank order by
 * the plugin, so the mean matches one rank accumulating the same micro-batches. */
static int world_loss(sh_trainer *tr) {
    if (tr->o.world <= 1) return 0;
    if (!PT_HAS_HOOK(tr->tbl, dist_allreduce))
        return sh_trainer_fail(tr, "%d ranks need a plugin with dist_allreduce (ABI 1.3)", tr->o.world);
    HOOK(dist_allreduce, tr->o.world, &tr->loss_acc, 1);
    return 0;
}

int sh_trainer_step(sh_trainer *tr, int64_t step, float lr, double *loss) {
    const sh_train_opts *o = &tr->o;
    /* test knob: this step's gradients and loss are NaN, as after an overflow */
    int poison = o->nan_step > 0 && step == o->nan_step;
    float dloss = poison ? NAN : micro_dloss(tr);
    loss_reset(tr);       /* no work of an earlier step is pending: it synced */
    for (int mi = 0; mi < o->n_micro; mi++) {
        if (tr->tbl) {
            HOOK(pre_step, step, step, mi, o->n_micro);
            /* lr early, so offloaded chunks can be stepped while backward runs */
            if (mi == 0 && PT_HAS_HOOK(tr->tbl, set_lr)) HOOK(set_lr, step, lr);
        }
        sh_sampler_next_rank(&tr->batch, o->world, o->rank, tr->h_inp, tr->h_tgt, tr->h_skip);
        if (upload(tr, (size_t)o->B * o->T)) return -1;
        tr->in_pass = 1;
        int rc = pass_fwd(tr, o->B, o->T, 1, loss_ptr(tr));
        if (!rc) rc = pass_bwd(tr, o->B, o->T, dloss);
        tr->in_pass = 0;
        if (rc) return -1;
    }
    if (tr->tbl) {
        HOOK(optimizer_step, step, lr);
        SYNC();   /* the loss, for post_step and the caller */
        if (loss_read(tr)) return -1;
        if (world_loss(tr)) return -1;
        *loss = poison ? NAN : tr->loss_acc / ((double)o->n_micro * (o->world > 1 ? o->world : 1));
        HOOK(post_step, step, step, (float)*loss);
        return 0;
    }
    /* no plugin: the loss before the update, so a non-finite one can skip it */
    if (tr->cu && o->skip_nonfinite) {
        SYNC();
        if (loss_read(tr)) return -1;
    }
    *loss = poison ? NAN : tr->loss_acc / o->n_micro;
    if (o->skip_nonfinite && !isfinite(*loss)) {
        sh_trainer_zero_grads(tr);   /* the step never happened: t, m, v, p unchanged */
        tr->last_norm = NAN;
        return 1;
    }
    adamw_step(tr, lr);
    if (tr->cu) {
        SYNC();   /* the loss and the gradient norm */
        double st[2];
        if (sh_trainer_copy(tr, st, tr->dstat, sizeof st, PT_COPY_D2H)) return -1;
        *loss = poison ? NAN : st[0] / o->n_micro;
        if (o->max_grad_norm > 0.0f) tr->last_norm = st[1];
    }
    return 0;
}

int sh_trainer_eval(sh_trainer *tr, int64_t step, int n_batches, double *loss) {
    const sh_train_opts *o = &tr->o;
    loss_reset(tr);
    for (int k = 0; k < n_batches; k++) {
        if (tr->tbl) HOOK(pre_step, step, step, -1, 0);
        sh_data_val_batch(o->val, k, o->B, o->T, tr->h_inp, tr->h_tgt);
        if (upload(tr, (size_t)o->B * o->T)) return -1;
        tr->in_pass = 1;
        int rc = pass_fwd(tr, o->B, o->T, 1, loss_ptr(tr));
        tr->in_pass = 0;
        if (rc) return -1;
    }
    SYNC();
    if (loss_read(tr)) return -1;
    *loss = n_batches > 0 ? tr->loss_acc / n_batches : NAN;
    return 0;
}

int sh_trainer_generate(sh_trainer *tr, int64_t step, uint16_t *seq, int n_prompt,
                        int n_total, float temperature, sh_rng *rng) {
    const sh_dims *d = &tr->model.d;
    if (n_prompt < 1) return sh_trainer_fail(tr, "generation needs a prompt of at least one token");
    for (int len = n_prompt; len < n_total; len++) {
        int win = len < tr->o.T ? len : tr->o.T; /* sliding window of the last T tokens */
        for (int i = 0; i < win; i++) tr->h_inp[i] = seq[len - win + i];
        if (upload_to(tr, tr->inp, tr->h_inp, (size_t)win * sizeof(int32_t))) return -1;
        if (tr->tbl) HOOK(pre_step, step, step, -1, 0);
        tr->in_pass = 1;
        int rc = pass_fwd(tr, 1, win, 0, NULL);
        tr->in_pass = 0;
        if (rc) return -1;
        SYNC();   /* the logits */
        if (sh_trainer_copy(tr, tr->h_row, tr->head.logits + (size_t)(win - 1) * d->Vp,
                            (size_t)d->Vp * sizeof(float), PT_COPY_D2H))
            return -1;
        int pick = sh_model_pick_token(tr->h_row, d->V, temperature, rng);
        seq[len] = (uint16_t)pick;
    }
    return 0;
}

int sh_trainer_fwdbwd(sh_trainer *tr, const int32_t *inp, const int32_t *tgt, int backward,
                      double *loss) {
    if (tr->tbl) return sh_trainer_fail(tr, "sh_trainer_fwdbwd is for the no-plugin gradient check");
    size_t n = (size_t)tr->o.B * tr->o.T;
    if (sh_trainer_copy(tr, tr->inp, inp, n * sizeof(int32_t), PT_COPY_H2D)) return -1;
    if (sh_trainer_copy(tr, tr->tgt, tgt, n * sizeof(int32_t), PT_COPY_H2D)) return -1;
    loss_reset(tr);
    if (pass_fwd(tr, tr->o.B, tr->o.T, 1, loss_ptr(tr))) return -1;
    if (backward) {
        float dl = (float)(1.0 / (double)n);
        if (pass_bwd(tr, tr->o.B, tr->o.T, dl)) return -1;
    }
    SYNC();
    if (loss_read(tr)) return -1;
    *loss = tr->loss_acc;
    return 0;
}
