/*
 * dist_agree.c — the ranks' agreement on what fixes the math (dist_agree.h):
 * the canonical text of each stage and the exchange that compares it.
 */
#include "dist_agree.h"

#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "rt_internal.h"

/* ---- canonical text ---- */

typedef struct ag_text {
    char *s;
    size_t n, cap;
    int oom;
} ag_text;

static void put(ag_text *t, const char *name, const char *fmt, ...) PT_PRINTF(3, 4);
static void put(ag_text *t, const char *name, const char *fmt, ...) {
    if (t->oom) return;
    va_list ap, aq;
    va_start(ap, fmt);
    va_copy(aq, ap);
    int vn = vsnprintf(NULL, 0, fmt, aq);
    va_end(aq);
    size_t need = strlen(name) + (vn > 0 ? (size_t)vn : 0) + 3;
    if (vn < 0 || t->n + need > t->cap) {
        size_t cap = t->cap ? t->cap : 1024;
        while (t->n + need > cap) cap *= 2;
        char *s = vn < 0 ? NULL : realloc(t->s, cap);
        if (!s) {
            va_end(ap);
            t->oom = 1;
            return;
        }
        t->s = s;
        t->cap = cap;
    }
    size_t o = t->n + (size_t)snprintf(t->s + t->n, t->cap - t->n, "%s=", name);
    vsnprintf(t->s + o, t->cap - o, fmt, ap);
    va_end(ap);
    /* a line is one field: newlines inside a value (a host's free text) would
     * split it, so they become spaces */
    for (char *p = t->s + o; *p; p++)
        if (*p == '\n' || *p == '\r') *p = ' ';
    t->n = o + (size_t)vn;
    t->s[t->n++] = '\n';
    t->s[t->n] = '\0';
}

/* A feature's key (pt_rt_ext.agree_keys), its value already text. */
static void put_text(void *t, const char *name, const char *value) { put(t, name, "%s", value); }

/* A float as text that reads back to the same bits; NaN ("from the INI" /
 * auto) as "auto". */
static void put_f(ag_text *t, const char *name, double v) {
    if (isnan(v)) put(t, name, "auto");
    else put(t, name, "%.9g", v);
}

static int finish(ag_text *t, pt_coll *c, const char *stage, char *err, size_t errlen) {
    int rc;
    if (t->oom || !t->s)
        rc = pt_fail(err, errlen, PT_ERR_HOST_OOM, "%s: out of host memory describing this "
                     "rank for the ranks' agreement", stage);
    else
        rc = pt_agree_texts(c, stage, t->s, err, errlen);
    free(t->s);
    return rc;
}

/* ---- the exchange ---- */

/* Line k of text (0-based): its start and length without the newline; 0 when
 * the text has fewer lines. */
static int line_at(const char *s, size_t n, size_t k, const char **b, size_t *len) {
    size_t i = 0;
    for (size_t line = 0; i < n; line++) {
        size_t e = i;
        while (e < n && s[e] != '\n') e++;
        if (line == k) {
            *b = s + i;
            *len = e - i;
            return 1;
        }
        i = e + 1;
    }
    return 0;
}

/* "name=value" -> the name's length (the whole line when there is no '='). */
static size_t name_len(const char *b, size_t len) {
    const char *eq = memchr(b, '=', len);
    return eq ? (size_t)(eq - b) : len;
}

/* The sentence naming the first line where text r differs from text 0. */
static int name_difference(const char *stage, int r, const char *t0, size_t n0, const char *tr,
                           size_t nr, char *err, size_t errlen) {
    const char *why = "every rank must run the same model, optimizer, configuration and data";
    for (size_t k = 0;; k++) {
        const char *b0 = NULL, *br = NULL;
        size_t l0 = 0, lr = 0;
        int h0 = line_at(t0, n0, k, &b0, &l0), hr = line_at(tr, nr, k, &br, &lr);
        if (!h0 && !hr) break;
        if (h0 && hr && l0 == lr && !memcmp(b0, br, l0)) continue;
        size_t k0 = h0 ? name_len(b0, l0) : 0, kr = hr ? name_len(br, lr) : 0;
        if (h0 && hr && k0 == kr && !memcmp(b0, br, k0)) {
            const char *v0 = k0 < l0 ? b0 + k0 + 1 : "", *vr = kr < lr ? br + kr + 1 : "";
            return pt_fail(err, errlen, PT_ERR_CONFIG,
                           "%s: rank %d disagrees with rank 0 on %.*s: %.*s vs %.*s (%s)", stage,
                           r, (int)k0, b0, (int)(lr - (vr - br)), vr, (int)(l0 - (v0 - b0)), v0,
                           why);
        }
        if (!hr)
            return pt_fail(err, errlen, PT_ERR_CONFIG,
                           "%s: rank %d disagrees with rank 0 on %.*s: rank %d has no such field, "
                           "rank 0 has %.*s (%s)", stage, r, (int)k0, b0, r, (int)l0, b0, why);
        if (!h0)
            return pt_fail(err, errlen, PT_ERR_CONFIG,
                           "%s: rank %d disagrees with rank 0 on %.*s: rank %d has %.*s, rank 0 "
                           "has no such field (%s)", stage, r, (int)kr, br, r, (int)lr, br, why);
        return pt_fail(err, errlen, PT_ERR_CONFIG,
                       "%s: rank %d disagrees with rank 0 on %.*s: rank %d has %.*s where rank 0 "
                       "has %.*s (%s)", stage, r, (int)kr, br, r, (int)lr, br, (int)l0, b0, why);
    }
    /* equal texts with different digests cannot happen; say what was seen */
    return pt_fail(err, errlen, PT_ERR_INTERNAL,
                   "%s: rank %d's description has another digest than rank 0's but the same "
                   "text", stage, r);
}

int pt_agree_texts(pt_coll *c, const char *stage, const char *text, char *err, size_t errlen) {
    if (!c || pt_coll_world(c) < 2) return PT_OK;
    int W = pt_coll_world(c), me = pt_coll_rank(c);
    size_t n = strlen(text);
    uint64_t *d = calloc((size_t)W * 2, sizeof *d);
    if (!d)
        return pt_fail(err, errlen, PT_ERR_HOST_OOM, "%s: out of host memory for the ranks' "
                       "agreement", stage);
    uint64_t *len = d + W;
    /* each rank owns element `rank` of a W-element buffer (pt_coll_part: one
     * element per rank), so an all-gather hands every rank every digest */
    d[me] = pt_fnv1a64_more(pt_fnv1a64(text, n), &n, sizeof n);
    int rc = pt_coll_allgather(c, d, (size_t)W, sizeof *d, "the ranks' agreement digests", err,
                               errlen);
    int r = 1;
    while (!rc && r < W && d[r] == d[0]) r++;
    if (rc || r == W) {
        free(d);
        return rc;
    }
    /* they differ: every rank's text, padded to the longest, to name the field */
    len[me] = n;
    rc = pt_coll_allgather(c, len, (size_t)W, sizeof *len, "the ranks' agreement lengths", err,
                           errlen);
    size_t mx = 1;
    for (int p = 0; !rc && p < W; p++)
        if (len[p] > mx) mx = (size_t)len[p];
    char *all = rc ? NULL : calloc((size_t)W, mx);
    if (!rc && !all)
        rc = pt_fail(err, errlen, PT_ERR_HOST_OOM, "%s: out of host memory for the ranks' "
                     "descriptions (%d x %zu bytes)", stage, W, mx);
    if (!rc) {
        memcpy(all + (size_t)me * mx, text, n);
        rc = pt_coll_allgather(c, all, (size_t)W * mx, 1, "the ranks' agreement texts", err,
                               errlen);
    }
    if (!rc)
        rc = name_difference(stage, r, all, (size_t)len[0], all + (size_t)r * mx, (size_t)len[r],
                             err, errlen);
    free(all);
    free(d);
    return rc;
}

/* ---- the stages ---- */

int pt_agree_check_fingerprint(const char *fp, char *err, size_t errlen) {
    if (!fp) return PT_OK;
    size_t n = strnlen(fp, PT_HOST_FINGERPRINT_MAX + 1);
    if (n > PT_HOST_FINGERPRINT_MAX)
        return pt_fail(err, errlen, PT_ERR_INVALID_ARG,
                       "init: pt_host_v1.fingerprint is longer than %u bytes (or not "
                       "NUL-terminated); give the facts themselves, or a hash of a long one",
                       PT_HOST_FINGERPRINT_MAX);
    return PT_OK;
}

void pt_agree_keep_fingerprint(pt_rt *rt) {
    const int has = rt->host.struct_size >= offsetof(pt_host_v1, fingerprint) + sizeof(const char *);
    if (!has || !rt->host.fingerprint) return;
    /* at most PT_HOST_FINGERPRINT_MAX bytes: init refused a longer one */
    snprintf(rt->dist.fingerprint, sizeof rt->dist.fingerprint, "%s", rt->host.fingerprint);
    rt->host.fingerprint = rt->dist.fingerprint;
}

static const char *tri(int v) { return v < 0 ? "auto" : v ? "on" : "off"; }

/* The host's fingerprint, line by line, as host.<line>. */
static void put_host(ag_text *t, const char *fp) {
    if (!fp) {
        put(t, "host.fingerprint", "(none)");
        return;
    }
    size_t n = strlen(fp);
    for (size_t i = 0; i < n;) {
        size_t e = i;
        while (e < n && fp[e] != '\n') e++;
        if (e > i) {
            char line[PT_HOST_FINGERPRINT_MAX + 8];
            size_t l = e - i, k = name_len(fp + i, l);
            snprintf(line, sizeof line, "host.%.*s", (int)k, fp + i);
            put(t, line, "%.*s", (int)(k < l ? l - k - 1 : 0), k < l ? fp + i + k + 1 : "");
        }
        i = e + 1;
    }
}

int pt_agree_init(pt_rt *rt, char *err, size_t errlen) {
    if (!rt->dist.coll) return PT_OK;
    const pt_config *c = &rt->cfg;
    ag_text t = {0};
    put(&t, "plugin.version", "%s", PT_PLUGIN_VERSION);
    put(&t, "plugin.abi_minor", "%d", PT_ABI_MINOR);
    put(&t, "world_size", "%d", pt_coll_world(rt->dist.coll));
    put(&t, "plugin.device_backend", "%s", pt_gpu_backend_name(rt->dev.gpu));
    put(&t, "dist.transport", "%s", pt_coll_transport(rt->dist.coll));
    put(&t, "dist.tp_size", "%d", c->tp_size);
    put(&t, "dist.overlap_allreduce", "%d", c->overlap_allreduce);
    /* what decides the mode and the chunks every collective runs over */
    put(&t, "protrain.auto_mode", "%d", c->auto_mode);
    put(&t, "protrain.force_all_persistent", "%d", c->force_all_persistent);
    put(&t, "protrain.zero3_shard", "%s", tri(c->zero3_shard));
    put(&t, "protrain.chunk_size", "%llu", (unsigned long long)c->chunk_size);
    pt_rt_ext_agree_keys(c, &(pt_rt_keys){&t, put_text});
    const char *fp = rt->host.struct_size >= offsetof(pt_host_v1, fingerprint) + sizeof(const char *)
                         ? rt->host.fingerprint : NULL;
    put_host(&t, fp);
    return finish(&t, rt->dist.coll, "init", err, errlen);
}

static const char *dtype_name(int32_t d) {
    switch (d) {
    case PT_F32: return "f32";
    case PT_BF16: return "bf16";
    case PT_F16: return "f16";
    case PT_U8: return "u8";
    default: return "unknown";
    }
}

/* Tensor parallel: a group in which nothing is split holds the whole model on
 * every rank and averages no gradient across the group (only split
 * parameters' groups share work), so each rank would train its own replica. */
static int tp_needs_split(const pt_rt *rt, const pt_model_v1 *m, char *err, size_t errlen) {
    if (rt->cfg.tp_size <= 1) return PT_OK;
    for (int32_t i = 0; i < m->n_params; i++)
        if (m->params[i].tp_split) return PT_OK;
    return pt_fail(err, errlen, PT_ERR_INVALID_ARG,
                   "post_model_load: [dist] tp_size = %d, but no parameter is split "
                   "(pt_param_v1.tp_split is 0 for all %d): every rank of a tensor-parallel "
                   "group would hold the whole model and no gradient would be averaged across "
                   "the group; declare the split parameters, or set tp_size = 1 for data "
                   "parallel (config %s)", rt->cfg.tp_size, m->n_params, rt->cfg.source);
}

static size_t dtype_bytes(int32_t d) {
    return d == PT_F32 ? 4 : d == PT_U8 ? 1 : 2;
}

/* One line per parameter (split: those with tp_split set, else the others) with
 * the FNV-1a 64 of its initial values: ranks that loaded other weights (another
 * seed's initialisation, another checkpoint) would average gradients of
 * different models. One pass over the bytes the host hands in anyway. Tied
 * parameters take their values from their root; none given: "(none)". */
static void put_inits(ag_text *t, const pt_model_v1 *m, int split) {
    for (int32_t i = 0; m->params && i < m->n_params; i++) {
        const pt_param_v1 *p = &m->params[i];
        if (p->tie >= 0 || (p->tp_split != 0) != split) continue;
        uint64_t n = 1;
        for (int32_t d = 0; d < p->ndim && d < 4; d++) n *= (uint64_t)p->shape[d];
        size_t bytes = (size_t)n * dtype_bytes(p->dtype);
        char k[240];
        snprintf(k, sizeof k, "model.param[%d] %.160s initial values (FNV-1a 64 of %zu bytes)",
                 (int)i, p->name ? p->name : "", bytes);
        if (p->init) put(t, k, "%016llx", (unsigned long long)pt_fnv1a64(p->init, bytes));
        else put(t, k, "(none)");
    }
}

int pt_agree_model(pt_rt *rt, const pt_model_v1 *m, char *err, size_t errlen) {
    if (!rt->dist.coll) return PT_OK;
    ag_text t = {0};
    /* counts first, so a different depth is named as such */
    put(&t, "model.n_blocks", "%d", m->n_blocks);
    put(&t, "model.n_params", "%d", m->n_params);
    put(&t, "model.batch", "%lld", (long long)m->batch);
    put(&t, "model.seq", "%lld", (long long)m->seq);
    put(&t, "model.arch", "%s", m->arch ? m->arch : "");
    for (int32_t i = 0; m->params && i < m->n_params; i++) {
        const pt_param_v1 *p = &m->params[i];
        char k[64], shp[96] = "";
        size_t o = 0;
        for (int32_t d = 0; d < p->ndim && d < 4; d++)
            o += (size_t)snprintf(shp + o, sizeof shp - o, "%s%lld", d ? "x" : "",
                                  (long long)p->shape[d]);
        snprintf(k, sizeof k, "model.param[%d]", (int)i);
        put(&t, k, "%s %s %s block %d trainable %d tie %d tp_split %d", p->name ? p->name : "",
            dtype_name(p->dtype), shp, p->block, p->trainable, p->tie, p->tp_split);
    }
    /* initial values last, so a shape or dtype that differs is named as such */
    put_inits(&t, m, 0);
    int rc = finish(&t, rt->dist.coll, "post_model_load", err, errlen);
    /* a tensor-parallel split parameter: each rank of a group holds another
     * shard, so its values are compared among the ranks holding the same one */
    if (!rc && rt->dist.dp_coll && m->params) {
        ag_text ts = {0};
        put_inits(&ts, m, 1);
        if (ts.s || ts.oom)   /* no split parameter: nothing to compare */
            rc = finish(&ts, rt->dist.dp_coll, "post_model_load (tensor-parallel shards)", err,
                        errlen);
    }
    if (!rc && m->params) rc = tp_needs_split(rt, m, err, errlen);
    return rc;
}

int pt_agree_optim(pt_rt *rt, const pt_optim_v1 *d, char *err, size_t errlen) {
    if (!rt->dist.coll) return PT_OK;
    const pt_config *c = &rt->cfg;
    ag_text t = {0};
    int type = (d && d->type != PT_OPTIM_FROM_CONFIG) ? d->type : c->optim_type;
    put(&t, "optimizer.type", "%s", type == PT_OPTIM_ADAMW ? "adamw"
                                    : type == PT_OPTIM_REKLS ? "rekls" : "unknown");
    /* the value create_optimizer resolves: the descriptor's unless NaN, then the
     * INI's (auto resolves by the type above, which is compared too) */
    static const char *const names[6] = {
        "optimizer.lr", "optimizer.beta1",
        "optimizer.beta2 (as resolved: auto is 0.95 for rekls, 0.999 for adamw)",
        "optimizer.eps",
        "optimizer.weight_decay (as resolved: auto is 0.01 for rekls, 0 for adamw)",
        "optimizer.max_grad_norm"};
    const float ini[6] = {c->lr, c->beta1, c->beta2, c->eps, c->weight_decay, c->max_grad_norm};
    const float given[6] = {d ? d->lr : NAN, d ? d->beta1 : NAN, d ? d->beta2 : NAN,
                            d ? d->eps : NAN, d ? d->weight_decay : NAN,
                            d ? d->max_grad_norm : NAN};
    /* what create_optimizer will use: "auto" on one rank and the number it
     * stands for on another are the same math, so they agree */
    float v[6];
    for (int i = 0; i < 6; i++) v[i] = !isnan(given[i]) ? given[i] : ini[i];
    if (isnan(v[2])) v[2] = type == PT_OPTIM_REKLS ? 0.95f : 0.999f;
    if (isnan(v[4])) v[4] = type == PT_OPTIM_REKLS ? 0.01f : 0.0f;
    for (int i = 0; i < 6; i++) put_f(&t, names[i], v[i]);
    put(&t, "optimizer.rekls_seed_shampoo", "%d", c->rekls_seed_shampoo);
    put_f(&t, "optimizer.rekls_shampoo_beta", c->rekls_shampoo_beta);
    /* a descriptor's eps is REKLS's eps too (create_optimizer) */
    put_f(&t, "optimizer.rekls_eps (as resolved: the descriptor's eps when given)",
          !isnan(given[3]) ? given[3] : c->rekls_eps);
    put(&t, "optimizer.rekls_weight_decay_method", "%d", c->rekls_wd_method);
    return finish(&t, rt->dist.coll, "create_optimizer", err, errlen);
}

int pt_agree_micro(pt_rt *rt, int32_t n_micro, char *err, size_t errlen) {
    if (!rt->dist.coll) return PT_OK;
    ag_text t = {0};
    put(&t, "n_micro", "%d", n_micro);
    return finish(&t, rt->dist.coll, "pre_step", err, errlen);
}
