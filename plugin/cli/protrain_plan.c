/*
 * protrain-plan — the ProTrain planner without a host or a device.
 *
 *   protrain-plan --model gpt2.ini --hw a100.ini [--json] [--json-file F]
 *   protrain-plan --layers 32 --hidden 4096 --heads 32 --arch llama --device-memory-gib 24
 *   protrain-plan --trace cache/0123456789abcdef.trace
 *   protrain-plan --model gpt2.ini --timeline step.svg
 *   protrain-plan --arch llama ... --host-ram-gib 64 --nvme-path /mnt/nvme   (or --nvme-bw R,W)
 *
 * Every INI key is also a flag (--key value, '-' or '_' alike). Sections:
 * [model] (the shape), [hw] (the machine), [plan] (search options), [nvme]
 * (the disk tier: a folder to time, or assumed rates; cost_model.h). The model
 * shape is turned into a synthetic trace (runtime/ds_estimates.h), the
 * searcher picks the plan, and the plan is printed beside DeepSpeed's ZeRO-2 /
 * ZeRO-3 model-state estimates for the same model (DeepSpeed's own formulas).
 * --timeline FILE.svg draws the plan's predicted device memory, window by
 * window (runtime/planner/timeline_svg.h).
 * Exit status: 0 plan found, 1 no plan fits (the message states the capacity
 * that would), 2 bad input.
 */
#include <ini.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/statvfs.h>

#include "core/profiler_disk.h"
#include "planner/planner.h"
#include "protrain.h"

#define GIB 1073741824.0

typedef struct opts {
    pt_model_shape m;
    pt_hw_shape hw;
    double device_gib, pcie_gbps, h2d_gbps, d2h_gbps, tflops, host_ram_gib, allreduce_gbps;
    double allgather_gbps, reduce_scatter_gbps;
    double reserve_gib, headroom_gib, frag, max_grad_norm, chunk_mib;
    int64_t gpus_per_node;
    int64_t n_persist, n_buffer, n_swap, n_checkpoint, runner_ups, shard, defer;
    int64_t layers_set, hidden_set, heads_set;
    const char *trace_path, *json_file, *timeline_file;
    int json;
    char arch[16], dtype[8];
    char nvme_path[512], nvme_bw[64];
    int64_t nvme_slots, nvme_block, nvme_io_threads;
    double nvme_budget_gib;
} opts;

enum { K_I64,
       K_F64,
       K_STR };
typedef struct key {
    const char *section, *name;
    int type;
    size_t off;
    size_t len;   /* K_STR buffer size */
    const char *help;
} key;

#define O(f) offsetof(opts, f)
static const key KEYS[] = {
    {"model", "arch", K_STR, O(arch), 16, "gpt | llama (default gpt)"},
    {"model", "layers", K_I64, O(m.layers), 0, "transformer blocks (required)"},
    {"model", "hidden", K_I64, O(m.hidden), 0, "hidden size (required)"},
    {"model", "heads", K_I64, O(m.heads), 0, "attention heads (required)"},
    {"model", "kv_heads", K_I64, O(m.kv_heads), 0, "key/value heads (default heads)"},
    {"model", "ffn", K_I64, O(m.ffn), 0, "MLP width (default 4*hidden gpt, ~8/3*hidden llama)"},
    {"model", "vocab", K_I64, O(m.vocab), 0, "vocabulary (default 50257)"},
    {"model", "positions", K_I64, O(m.positions), 0, "gpt position table rows (default seq)"},
    {"model", "seq", K_I64, O(m.seq), 0, "sequence length (default 1024)"},
    {"model", "batch", K_I64, O(m.batch), 0, "micro-batch (default 1)"},
    {"model", "dtype", K_STR, O(dtype), 8, "fp32 | bf16 | fp16 (default bf16)"},
    {"model", "trainable_fraction", K_F64, O(m.trainable_fraction), 0, "(0,1], default 1"},
    {"model", "tied", K_I64, O(m.tied), 0, "LM head tied to the embedding (default 1)"},
    {"model", "flash_attn", K_I64, O(m.flash_attn), 0, "no seq^2 attention activations (default 0)"},
    {"hw", "device_memory_gib", K_F64, O(device_gib), 0, "device memory (default 80)"},
    {"hw", "pcie_gbps", K_F64, O(pcie_gbps), 0, "pinned copy GB/s each way (default 25)"},
    {"hw", "h2d_gbps", K_F64, O(h2d_gbps), 0, "host->device GB/s (default pcie_gbps)"},
    {"hw", "d2h_gbps", K_F64, O(d2h_gbps), 0, "device->host GB/s (default pcie_gbps)"},
    {"hw", "copy_engines", K_I64, O(hw.copy_engines), 0, "1 shared or 2 (default 2)"},
    {"hw", "cpu_adam_rate", K_F64, O(hw.cpu_adam_elems_per_s), 0, "CPU Adam params/s (default 1e9)"},
    {"hw", "dev_adam_rate", K_F64, O(hw.dev_adam_elems_per_s), 0, "device Adam params/s (default 5e10)"},
    {"hw", "tflops", K_F64, O(tflops), 0, "achieved device TFLOPS (default 200)"},
    {"hw", "host_ram_gib", K_F64, O(host_ram_gib), 0, "pinned host budget per rank, 0 = unlimited"},
    {"hw", "world_size", K_I64, O(hw.world_size), 0, "data-parallel ranks (default 1)"},
    {"hw", "gpus_per_node", K_I64, O(gpus_per_node), 0, "for the DeepSpeed estimates (default world_size)"},
    {"hw", "allreduce_gbps", K_F64, O(allreduce_gbps), 0, "gradient all-reduce GB/s, 0 = not modelled"},
    {"hw", "allgather_gbps", K_F64, O(allgather_gbps), 0, "mode C chunk all-gather GB/s (bus), 0 = not modelled"},
    {"hw", "reduce_scatter_gbps", K_F64, O(reduce_scatter_gbps), 0, "mode C gradient reduce-scatter GB/s (bus), 0 = not modelled"},
    {"hw", "device_name", K_STR, O(hw.device), 64, "label (default synthetic)"},
    {"hw", "reserve_gib", K_F64, O(reserve_gib), 0, "device memory kept out of the plan (default 0.5)"},
    {"hw", "headroom_gib", K_F64, O(headroom_gib), 0, "extra safety margin (default 0.5)"},
    {"hw", "frag", K_F64, O(frag), 0, "fragmentation factor (default 1.0)"},
    {"plan", "n_persist", K_I64, O(n_persist), 0, "fix the knob (default searched)"},
    {"plan", "n_buffer", K_I64, O(n_buffer), 0, "fix the knob"},
    {"plan", "n_swap", K_I64, O(n_swap), 0, "fix the knob"},
    {"plan", "n_checkpoint", K_I64, O(n_checkpoint), 0, "fix the knob"},
    {"plan", "max_grad_norm", K_F64, O(max_grad_norm), 0, "> 0: clipping, CPU Adam after backward"},
    {"plan", "defer_cpu_steps", K_I64, O(defer), 0,
     "with clipping: 1 (default) CPU Adam runs into the next forward, 0 before it"},
    {"plan", "chunk_mib", K_F64, O(chunk_mib), 0, "chunk size (default: least-waste grid)"},
    {"plan", "shard", K_I64, O(shard), 0, "1: host state sharded over ranks (mode C)"},
    {"plan", "runner_ups", K_I64, O(runner_ups), 0, "alternatives to show (default 3)"},
    {"nvme", "nvme_path", K_STR, O(nvme_path), 512, "disk tier folder: its rates are timed there (a few MiB)"},
    {"nvme", "nvme_bw", K_STR, O(nvme_bw), 64, "READ,WRITE bytes/s: the tier's rates assumed, not timed"},
    {"nvme", "nvme_io_threads", K_I64, O(nvme_io_threads), 0, "requests in flight (default 2)"},
    {"nvme", "nvme_slots", K_I64, O(nvme_slots), 0, "staging slots (default -1: auto, as the store sizes them)"},
    {"nvme", "nvme_block", K_I64, O(nvme_block), 0, "block size, power of two >= 512 (default 4096)"},
    {"nvme", "nvme_budget_gib", K_F64, O(nvme_budget_gib), 0,
     "disk the tier may take (default: the folder's free space, unlimited without one)"},
};
#define NKEYS (sizeof KEYS / sizeof KEYS[0])

static void defaults(opts *o) {
    memset(o, 0, sizeof *o);
    strcpy(o->arch, "gpt");
    strcpy(o->dtype, "bf16");
    o->m.vocab = 50257;
    o->m.seq = 1024;
    o->m.batch = 1;
    o->m.tied = 1;
    o->m.trainable_fraction = 1.0;
    o->m.layers = o->m.hidden = o->m.heads = -1;
    o->device_gib = 80;
    o->pcie_gbps = 25;
    o->hw.copy_engines = 2;
    o->hw.cpu_adam_elems_per_s = 1e9;
    o->hw.dev_adam_elems_per_s = 5e10;
    o->tflops = 200;
    o->hw.world_size = 1;
    o->reserve_gib = 0.5;
    o->headroom_gib = 0.5;
    o->frag = 1.0;
    o->n_persist = o->n_buffer = o->n_swap = o->n_checkpoint = -1;
    o->runner_ups = 3;
    o->defer = 1;
    o->nvme_slots = -1;
    o->nvme_block = 4096;
    o->nvme_io_threads = 2;
}

/* Set key `name` (section may be NULL = any). 0 ok, 1 unknown key, 2 bad value. */
static int set_key(opts *o, const char *section, const char *name, const char *value) {
    char nm[64];
    size_t n = strlen(name);
    if (n >= sizeof nm) return 1;
    for (size_t i = 0; i <= n; i++) nm[i] = name[i] == '-' ? '_' : name[i];
    for (size_t i = 0; i < NKEYS; i++) {
        const key *k = &KEYS[i];
        if (strcmp(k->name, nm) != 0 || (section && *section && strcmp(section, k->section) != 0)) continue;
        char *end = NULL;
        void *dst = (char *)o + k->off;
        if (k->type == K_STR) {
            if (strlen(value) >= k->len) return 2;
            strcpy(dst, value);
        } else if (k->type == K_I64) {
            long long v = strtoll(value, &end, 0);
            if (end == value || *end) return 2;
            if (strcmp(nm, "copy_engines") == 0 || strcmp(nm, "world_size") == 0 || strcmp(nm, "tied") == 0 ||
                strcmp(nm, "flash_attn") == 0)
                *(int32_t *)dst = (int32_t)v;
            else
                *(int64_t *)dst = v;
        } else {
            double v = strtod(value, &end);
            if (end == value || *end || !isfinite(v)) return 2;
            *(double *)dst = v;
        }
        return 0;
    }
    return 1;
}

typedef struct ini_ctx {
    opts *o;
    const char *path;
    char bad[256];
} ini_ctx;

static int on_ini(void *user, const char *section, const char *name, const char *value) {
    ini_ctx *c = user;
    int r = set_key(c->o, section, name, value);
    if (r == 1) snprintf(c->bad, sizeof c->bad, "unknown key '%s' in section [%s]", name, section);
    if (r == 2) snprintf(c->bad, sizeof c->bad, "bad value '%s' for key '%s'", value, name);
    return r == 0;
}

static int load_ini(opts *o, const char *path) {
    ini_ctx c = {o, path, {0}};
    int line = ini_parse(path, on_ini, &c);
    if (line < 0) {
        fprintf(stderr, "protrain-plan: cannot open %s\n", path);
        return 2;
    }
    if (line > 0) {
        fprintf(stderr, "protrain-plan: %s:%d: %s\n", path, line, c.bad[0] ? c.bad : "syntax error");
        return 2;
    }
    return 0;
}

static void usage(FILE *f) {
    fprintf(f, "usage: protrain-plan [--model FILE.ini] [--hw FILE.ini] [--trace FILE] [--json] [--json-file F]\n"
               "                     [--timeline FILE.svg] [--KEY VALUE ...]\n"
               "Plans ProTrain's four knobs for a model shape (or a cached profile trace) without a device,\n"
               "and prints DeepSpeed's ZeRO-2/ZeRO-3 estimates for the same model. --timeline writes the plan's\n"
               "predicted device memory per window of one step as an SVG picture. Keys (INI section, flag):\n");
    for (size_t i = 0; i < NKEYS; i++) fprintf(f, "  [%s] --%-20s %s\n", KEYS[i].section, KEYS[i].name, KEYS[i].help);
}

static int parse_args(opts *o, int argc, char **argv) {
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            exit(0);
        }
        if (!strcmp(a, "--json")) {
            o->json = 1;
            continue;
        }
        if (strncmp(a, "--", 2) != 0) {
            fprintf(stderr, "protrain-plan: unexpected argument '%s' (see --help)\n", a);
            return 2;
        }
        char name[64];
        const char *eq = strchr(a, '='), *val;
        size_t n = eq ? (size_t)(eq - a - 2) : strlen(a + 2);
        if (n >= sizeof name) {
            fprintf(stderr, "protrain-plan: option too long: %s\n", a);
            return 2;
        }
        memcpy(name, a + 2, n);
        name[n] = 0;
        if (eq)
            val = eq + 1;
        else if (i + 1 < argc)
            val = argv[++i];
        else {
            fprintf(stderr, "protrain-plan: option --%s needs a value\n", name);
            return 2;
        }
        int r;
        if (!strcmp(name, "model") || !strcmp(name, "hw")) {
            if ((r = load_ini(o, val))) return r;
            continue;
        }
        if (!strcmp(name, "trace")) {
            o->trace_path = val;
            continue;
        }
        if (!strcmp(name, "timeline")) {
            o->timeline_file = val;
            continue;
        }
        if (!strcmp(name, "json-file") || !strcmp(name, "json_file")) {
            o->json_file = val;
            continue;
        }
        r = set_key(o, NULL, name, val);
        if (r) {
            fprintf(stderr, "protrain-plan: %s option --%s%s%s (see --help)\n", r == 1 ? "unknown" : "bad value for",
                    name, r == 2 ? " " : "", r == 2 ? val : "");
            return 2;
        }
    }
    return 0;
}

static int finish_opts(opts *o) {
    if (!strcasecmp(o->arch, "gpt"))
        o->m.arch = PT_ARCH_GPT;
    else if (!strcasecmp(o->arch, "llama"))
        o->m.arch = PT_ARCH_LLAMA;
    else {
        fprintf(stderr, "protrain-plan: arch '%s' must be gpt or llama\n", o->arch);
        return 2;
    }
    if (!strcasecmp(o->dtype, "fp32"))
        o->m.dtype = PT_F32;
    else if (!strcasecmp(o->dtype, "bf16"))
        o->m.dtype = PT_BF16;
    else if (!strcasecmp(o->dtype, "fp16"))
        o->m.dtype = PT_F16;
    else {
        fprintf(stderr, "protrain-plan: dtype '%s' must be fp32, bf16 or fp16\n", o->dtype);
        return 2;
    }
    if (!(o->device_gib > 0) || !(o->reserve_gib >= 0) || !(o->headroom_gib >= 0) || !(o->frag >= 1.0) ||
        !(o->host_ram_gib >= 0) || !(o->chunk_mib >= 0) || !(o->tflops > 0) || !(o->pcie_gbps > 0) ||
        !(o->h2d_gbps >= 0) || !(o->d2h_gbps >= 0) || !(o->allreduce_gbps >= 0) ||
        !(o->allgather_gbps >= 0) || !(o->reduce_scatter_gbps >= 0)) {
        fprintf(stderr, "protrain-plan: device_memory_gib, tflops and pcie_gbps must be > 0, frag >= 1, "
                        "other sizes and rates >= 0\n");
        return 2;
    }
    if (o->runner_ups < 0 || o->runner_ups > PT_PLAN_MAX_ALT) {
        fprintf(stderr, "protrain-plan: runner_ups must be in [0, %d]\n", PT_PLAN_MAX_ALT);
        return 2;
    }
    o->hw.device_bytes = (uint64_t)(o->device_gib * GIB);
    o->hw.h2d_Bps = (o->h2d_gbps > 0 ? o->h2d_gbps : o->pcie_gbps) * 1e9;
    o->hw.d2h_Bps = (o->d2h_gbps > 0 ? o->d2h_gbps : o->pcie_gbps) * 1e9;
    o->hw.flops = o->tflops * 1e12;
    o->hw.allreduce_Bps = o->allreduce_gbps * 1e9;
    o->hw.allgather_Bps = o->allgather_gbps * 1e9;
    o->hw.reduce_scatter_Bps = o->reduce_scatter_gbps * 1e9;
    o->hw.host_ram_bytes = (uint64_t)(o->host_ram_gib * GIB);
    if (o->gpus_per_node <= 0) o->gpus_per_node = o->hw.world_size > 0 ? o->hw.world_size : 1;
    if ((o->nvme_slots != -1 && (o->nvme_slots < 3 || o->nvme_slots > 64)) || o->nvme_io_threads < 1 || o->nvme_io_threads > 64 ||
        o->nvme_block < 512 || (o->nvme_block & (o->nvme_block - 1)) || !(o->nvme_budget_gib >= 0)) {
        fprintf(stderr, "protrain-plan: nvme_slots must be in [3, 64] or -1 (auto), nvme_io_threads in [1, 64], nvme_block a "
                        "power of two of at least 512, nvme_budget_gib >= 0\n");
        return 2;
    }
    return 0;
}

/* [nvme]: the tier's terms of the search. Rates: --nvme-bw as given
 * (assumed), else timed in --nvme-path (profiler_disk.h; no cache). */
static int tier_opts(const opts *o, uint64_t pinned_budget, pt_search_opts *so, char *src, size_t srclen) {
    if (!o->nvme_path[0] && !o->nvme_bw[0]) return 0;
    so->cost.tier_slots = (int32_t)o->nvme_slots;
    so->cost.tier_above = pinned_budget;
    so->cost.tier_block = (uint64_t)o->nvme_block;
    so->disk_budget = (uint64_t)(o->nvme_budget_gib * GIB);
    if (o->nvme_bw[0]) {
        char *end = NULL;
        double r = strtod(o->nvme_bw, &end), w = end && *end == ',' ? strtod(end + 1, &end) : NAN;
        if (!end || *end || !(r > 0) || !(w > 0) || !isfinite(r) || !isfinite(w)) {
            fprintf(stderr, "protrain-plan: --nvme-bw '%s' must be READ,WRITE in bytes/s, both > 0\n", o->nvme_bw);
            return 2;
        }
        so->cost.tier_rd_Bps = r;
        so->cost.tier_wr_Bps = w;
        snprintf(src, srclen, "assumed (--nvme-bw)");
        return 0;
    }
    pt_disk_rates dr;
    char err[700];
    if (pt_disk_probe(o->nvme_path, (int)o->nvme_io_threads, NULL, &dr, err, sizeof err)) {
        fprintf(stderr, "protrain-plan: %s (or give the rates with --nvme-bw READ,WRITE)\n", err);
        return 2;
    }
    so->cost.tier_rd_Bps = dr.rd_Bps;
    so->cost.tier_wr_Bps = dr.wr_Bps;
    snprintf(src, srclen, "timed in %.80s with %d thread(s), %s", o->nvme_path, (int)o->nvme_io_threads,
             dr.direct ? "O_DIRECT" : "buffered");
    if (!so->disk_budget) {
        struct statvfs vs;
        if (!statvfs(o->nvme_path, &vs)) so->disk_budget = (uint64_t)vs.f_bavail * vs.f_frsize;
    }
    return 0;
}

/* DeepSpeed's table for the same model, text or JSON. */
static void print_ds(const opts *o, int64_t P, int64_t Lm, int json) {
    int g = (int)o->gpus_per_node, world = o->hw.world_size > 0 ? o->hw.world_size : 1;
    int nodes = (world + g - 1) / g;
    if (nodes < 1) nodes = 1;
    struct {
        const char *name;
        int stage, off_p, off_o, zi;
    } rows[] = {
        {"zero3_offload_param_opt_zero_init", 3, 1, 1, 1},
        {"zero3_offload_param_opt", 3, 1, 1, 0},
        {"zero3_offload_opt_zero_init", 3, 0, 1, 1},
        {"zero3_offload_opt", 3, 0, 1, 0},
        {"zero3_no_offload_zero_init", 3, 0, 0, 1},
        {"zero3_no_offload", 3, 0, 0, 0},
        {"zero2_offload_opt", 2, 0, 1, 0},
        {"zero2_no_offload", 2, 0, 0, 0},
    };
    size_t nr = sizeof rows / sizeof rows[0];
    if (json)
        printf(",\n  \"deepspeed\": {\"params\": %lld, \"largest_module\": %lld, \"gpus_per_node\": %d, \"nodes\": %d",
               (long long)P, (long long)Lm, g, nodes);
    else
        printf("DeepSpeed model-state estimates, same model (P = %lld, largest module %lld, "
               "%d GPU(s)/node x %d node(s), buffer factor %.1f; activations not included):\n",
               (long long)P, (long long)Lm, g, nodes, PT_DS_BUFFER_FACTOR);
    for (size_t i = 0; i < nr; i++) {
        pt_ds_est e;
        int r = rows[i].stage == 3
                    ? pt_ds_zero3(P, Lm, g, nodes, rows[i].off_p, rows[i].off_o, rows[i].zi, PT_DS_BUFFER_FACTOR, &e)
                    : pt_ds_zero2(P, g, nodes, rows[i].off_o, PT_DS_BUFFER_FACTOR, &e);
        if (r) continue;
        if (json)
            printf(", \"%s\": {\"gpu_bytes\": %.0f, \"cpu_bytes\": %.0f}", rows[i].name, e.gpu_bytes, e.cpu_bytes);
        else
            printf("  %-36s GPU %9.2f GiB per GPU   CPU %9.2f GiB per node\n", rows[i].name, e.gpu_bytes / GIB,
                   e.cpu_bytes / GIB);
    }
    if (json) printf("}");
}

int main(int argc, char **argv) {
    opts o;
    defaults(&o);
    int rc = parse_args(&o, argc, argv);
    if (!rc) rc = finish_opts(&o);
    if (rc) return rc;
    char err[1024] = {0};
    pt_trace t;
    pt_trace_init(&t);
    int have_shape = 0;
    int64_t P = 0, Lm = 0;
    if (o.trace_path) {
        if (pt_trace_read_file(o.trace_path, NULL, &t, err, sizeof err)) {
            fprintf(stderr, "protrain-plan: %s\n", err);
            return 2;
        }
    } else {
        if (o.m.layers < 0 || o.m.hidden < 0 || o.m.heads < 0) {
            fprintf(stderr, "protrain-plan: give a model (--model FILE.ini or --layers/--hidden/--heads) or --trace FILE\n");
            return 2;
        }
        if (pt_shape_check(&o.m, err, sizeof err)) {
            fprintf(stderr, "protrain-plan: %s\n", err);
            return 2;
        }
        rc = pt_shape_trace(&o.m, &o.hw, (uint64_t)(o.chunk_mib * 1048576.0), &t, err, sizeof err);
        if (rc) {
            fprintf(stderr, "protrain-plan: %s\n", err);
            pt_trace_free(&t);
            return 2;
        }
        pt_shape_count(&o.m, &P, &Lm, NULL);
        have_shape = 1;
    }
    pt_search_opts so;
    pt_search_opts_default(&so);
    so.cost.frag = o.frag;
    so.cost.reserve_bytes = (uint64_t)(o.reserve_gib * GIB);
    so.cost.headroom_bytes = (uint64_t)(o.headroom_gib * GIB);
    so.cost.clip = o.max_grad_norm > 0;
    so.cost.defer = o.defer != 0;
    so.cost.shard = o.shard != 0;
    if (o.trace_path) {   /* flags given with a trace override its machine */
        so.capacity = o.device_gib != 80 ? o.hw.device_bytes : 0;
        so.host_ram = o.hw.host_ram_bytes;
    }
    so.n_persist = (int32_t)o.n_persist;
    so.n_buffer = (int32_t)o.n_buffer;
    so.n_swap = (int32_t)o.n_swap;
    so.n_checkpoint = (int32_t)o.n_checkpoint;
    so.n_alt = (int32_t)o.runner_ups;
    char tier_src[160] = "";
    if ((rc = tier_opts(&o, so.host_ram ? so.host_ram : t.hw.host_ram_bytes, &so, tier_src, sizeof tier_src))) {
        pt_trace_free(&t);
        return rc;
    }
    pt_plan plan;
    pt_plan_init(&plan);
    rc = pt_search(&t, &so, &plan, err, sizeof err);
    snprintf(plan.tier_rates, sizeof plan.tier_rates, "%s", tier_src);
    /* the mode these knobs run in (the plugin's auto_mode weighs the pinned
     * budget too; here --shard says which of B and C) */
    if (!rc && o.hw.world_size > 1) {
        plan.exec_mode = plan.knobs.n_persist >= plan.n_chunk ? 0 : o.shard ? 2
                                                                            : 1;
        plan.world_size = (int32_t)o.hw.world_size;
    }
    int exit_code = 0;
    if (rc == PT_ERR_INFEASIBLE) {
        fprintf(stderr, "protrain-plan: %s\n", err);
        exit_code = 1;
    } else if (rc) {
        fprintf(stderr, "protrain-plan: %s\n", err);
        exit_code = 2;
    }
    if (!exit_code) {
        if (o.json) {
            char *js = pt_plan_json(&plan);
            /* nest the plan object and add the estimates beside it */
            printf("{\n  \"plan\": %s", js ? js : "{}\n");
            free(js);
            printf("  , \"model_params\": %lld", (long long)P);
            if (have_shape) print_ds(&o, P, Lm, 1);
            printf("\n}\n");
        } else {
            char *tx = pt_plan_text(&plan);
            fputs(tx ? tx : "(out of memory)\n", stdout);
            free(tx);
            if (have_shape)
                print_ds(&o, P, Lm, 0);
            else
                printf("(DeepSpeed estimates need a model shape: give --model instead of --trace)\n");
        }
        if (o.json_file && pt_plan_write_json(&plan, o.json_file, err, sizeof err)) {
            fprintf(stderr, "protrain-plan: %s\n", err);
            exit_code = 2;
        }
        if (o.timeline_file && pt_timeline_svg_plan(&t, &plan, NULL, o.timeline_file, err, sizeof err)) {
            fprintf(stderr, "protrain-plan: %s\n", err);
            exit_code = 2;
        }
    }
    pt_plan_free(&plan);
    pt_trace_free(&t);
    return exit_code;
}
