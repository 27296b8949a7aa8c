/*
 * config_schema.c — what the configuration file may contain: the schema table
 * (one row per key, in file order, with its default and help text), the
 * accepted-value text that error messages and docs show for each row, and the
 * markdown reference that conf/CONFIG.md embeds. Parsing, defaults, messages and
 * the dump live in config.c; config_internal.h is the seam between the two.
 */
#include "config_internal.h"

#include <limits.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <sys/stat.h>
#include <unistd.h>

#include "gpu.h"
#include "protrain.h"

#define OFF(f) offsetof(pt_config, f)
#define CAP(f) sizeof(((pt_config *)0)->f)

static const int log_vals[] = {PT_LOG_ERROR, PT_LOG_WARN, PT_LOG_INFO, PT_LOG_DEBUG,
                               PT_LOG_TRACE};
static const int optim_vals[] = {PT_OPTIM_ADAMW, PT_OPTIM_REKLS};
static const int wd_vals[] = {0, 1, 2, 3};   /* pt_rekls_wd: decoupled, independent, l2, palm */
static const char bool_form[] = "true|false|on|off|yes|no|1|0";

const char *const pt_cfg_sections[] = {"plugin", "memory", "nvme", "protrain", "optimizer",
                                       "osft", "tiled_mlp", "dist", "host_backend",
                                       "cuda", "testing"};
_Static_assert(sizeof(pt_cfg_sections) / sizeof(pt_cfg_sections[0]) == PT_CFG_NSECTIONS,
               "PT_CFG_NSECTIONS in config_internal.h must match pt_cfg_sections");

/* ---- row checkers for free-text keys (may normalise v in place) ---- */

/* "attn, mlp" -> "attn,mlp": items are trimmed; an empty item is an error. */
static int check_targets(char *v, size_t cap, char *why, size_t wl) {
    char out[256];
    size_t o = 0;
    const char *p = v;
    (void)cap;
    for (;;) {
        while (*p == ' ' || *p == '\t') p++;
        const char *e = p;
        while (*e && *e != ',') e++;
        const char *t = e;
        while (t > p && (t[-1] == ' ' || t[-1] == '\t')) t--;
        if (t == p) {
            snprintf(why, wl, "expected a comma-separated list of non-empty parameter-name "
                              "substrings like attn,mlp");
            return 1;
        }
        if (o) out[o++] = ',';
        memcpy(out + o, p, (size_t)(t - p));
        o += (size_t)(t - p);
        if (!*e) break;
        p = e + 1;
    }
    out[o] = '\0';
    memcpy(v, out, o + 1); /* o <= strlen(v) < cap */
    return 0;
}

static int check_init_method(char *v, size_t cap, char *why, size_t wl) {
    (void)cap;
    if (!strcmp(v, "env") || !strcmp(v, "mpi")) return 0;
    if (!strncmp(v, "file://", 7) && v[7] == '/' && v[8]) return 0;
    snprintf(why, wl, "expected env, mpi or file:///absolute/path");
    return 1;
}

/* "<op>:<n>" naming a backend op (gpu.h pt_gpu_op_name), or empty / none. */
static int check_fail_op(char *v, size_t cap, char *why, size_t wl) {
    (void)cap;
    return pt_gpu_fail_op_parse(v, NULL, NULL, why, wl) ? 1 : 0;
}

/* The tier's folder, checked when the file is read: it must exist, be a
 * folder and be writable (a read-only mount is refused here, not at the first
 * write). Empty: no tier. */
static int check_nvme_path(char *v, size_t cap, char *why, size_t wl) {
    (void)cap;
    if (!*v) return 0;
    struct stat sb;
    if (stat(v, &sb)) {
        snprintf(why, wl, "the folder %s cannot be used: %s", v, strerror(errno));
        return 1;
    }
    if (!S_ISDIR(sb.st_mode)) {
        snprintf(why, wl, "%s is not a folder", v);
        return 1;
    }
    if (access(v, W_OK | X_OK)) {
        snprintf(why, wl, "the folder %s is not writable: %s", v, strerror(errno));
        return 1;
    }
    return 0;
}

/* ---- the schema: one row per key, in file order ---- */
#define R_BOOL(s, k, f, d, h) {s, k, PT_CFG_BOOL, 0, OFF(f), 0, 0, 0, 0, NULL, NULL, NULL, NULL, d, h}
#define R_INT(s, k, f, fl, lo, hi, ai, d, h) \
    {s, k, PT_CFG_INT, fl, OFF(f), 0, lo, hi, ai, NULL, NULL, NULL, NULL, d, h}
#define R_FLT(s, k, f, fl, lo, hi, d, h) \
    {s, k, PT_CFG_FLOAT, fl, OFF(f), 0, lo, hi, 0, NULL, NULL, NULL, NULL, d, h}
#define R_SIZE(s, k, f, fl, d, h) {s, k, PT_CFG_SIZE, fl, OFF(f), 0, 0, 0, 0, NULL, NULL, NULL, NULL, d, h}
#define R_ENUM(s, k, f, ch, vals, d, h) \
    {s, k, PT_CFG_ENUM, 0, OFF(f), 0, 0, 0, 0, ch, vals, NULL, NULL, d, h}
#define R_WORD(s, k, f, ch, d, h) \
    {s, k, PT_CFG_WORD, 0, OFF(f), CAP(f), 0, 0, 0, ch, NULL, NULL, NULL, d, h}
#define R_STR(s, k, f, form, chk, d, h) \
    {s, k, PT_CFG_STR, 0, OFF(f), CAP(f), 0, 0, 0, NULL, NULL, form, chk, d, h}

const pt_config_key pt_cfg_keys[] = {
    R_ENUM("plugin", "log_level", log_level, "error|warn|info|debug|trace", log_vals, "info",
           "Messages above this level are dropped. $PROTRAIN_LOG_LEVEL overrides it."),
    R_WORD("plugin", "backend", backend, "auto|cuda|host", "auto",
           "Device backend. cuda: libprotrain_cuda.so on a CUDA device; host: the simulated "
           "device (own memory pool with a hard capacity, worker-thread streams); auto: cuda "
           "when it loads and finds a device, else host."),
    R_SIZE("memory", "device_capacity", device_capacity, PT_CFG_AUTO, "auto",
           "Device bytes the plugin may use in all (parameters, gradients, buffers, "
           "activations, every host dev_alloc). auto: the whole device on cuda, 1 GiB on the "
           "host backend."),
    R_SIZE("memory", "reserve", reserve, 0, "0",
           "Device bytes kept free: subtracted from device_capacity before planning (other "
           "processes, the CUDA context)."),
    R_SIZE("memory", "pinned_budget", pinned_budget, PT_CFG_AUTO, "auto",
           "Pinned host bytes the plugin may allocate (staging buffers, offloaded chunks, "
           "optimizer state). auto: derived from MemAvailable in /proc/meminfo at init."),
    R_SIZE("memory", "extra_headroom", extra_headroom, 0, "0",
           "Device bytes the profiler cannot see (library workspaces, other allocators); the "
           "planner keeps them free on top of its own margin."),
    R_STR("nvme", "path", nvme_path, "a writable folder, or empty for none", check_nvme_path, "",
          "Folder on a fast local disk for the disk tier: when the offloaded chunks do not fit "
          "pinned_budget, their fp32 Adam moments (and the fp32 masters of 16-bit parameters) "
          "live in one file per rank here and pass through a few pinned staging buffers; the "
          "tier is scratch (state files stay the checkpoint) and its files are removed at "
          "finalize. Two runs cannot share the folder (a lock file). Empty: no tier, and a "
          "run whose chunks exceed pinned_budget is refused."),
    R_INT("nvme", "io_threads", nvme_io_threads, 0, 1, 64, 0, "2",
          "Threads doing the tier's reads and writes (the queue depth: each has one request "
          "in flight)."),
    R_INT("nvme", "staging_slots", nvme_slots, PT_CFG_AUTO, 3, 64, -1, "auto",
          "Pinned staging buffers, each the largest record: one being stepped, one being "
          "written back, the rest read ahead. Counted in pinned_budget. auto: the most chunks "
          "one block's backward completes plus 2 (every step of a block read ahead), at least "
          "3, no more than pinned_budget leaves."),
    R_SIZE("nvme", "block_size", nvme_block, 0, "4096",
           "File offsets and lengths of the tier align to this (a power of two, at least 512): "
           "O_DIRECT needs the disk's logical block; where the filesystem refuses O_DIRECT "
           "(tmpfs) the tier uses buffered I/O and says so."),
    R_SIZE("nvme", "budget", nvme_budget, PT_CFG_AUTO, "auto",
           "Disk bytes the tier may use; auto: the free space of the folder's filesystem. The "
           "whole file is reserved at post_model_load, so a full disk is found there."),
    R_BOOL("protrain", "auto_memory", auto_memory, "true",
           "true: the searcher picks every n_* knob left at auto (a number fixes that knob). "
           "false: no search; n_persist, n_buffer, n_swap and n_checkpoint must all be set."),
    R_BOOL("protrain", "time_calibration", time_calibration, "true",
           "After the warm-up steps, when the measured iteration is more than time_replan_tolerance "
           "(15%; and 2 ms) "
           "off the prediction, plan again with the profile's forward, backward and optimizer "
           "times scaled by what the device clock measured (at most twice per run); the "
           "factors are kept in the profile cache with the profile. false: the plan keeps the "
           "profiled times (an under-predicted peak still re-plans)."),
    R_FLT("protrain", "time_replan_tolerance", time_replan_tolerance, PT_CFG_LO_OPEN | PT_CFG_NO_HI,
          0, 0, "0.15",
          "With time_calibration: how far (as a fraction) the measured iteration may be from the "
          "prediction before the plan is searched again. A smaller miss (above 5%, or above this "
          "tolerance when it is smaller) does not re-plan the running job; its factors are "
          "stored in the profile cache and the next run plans with them."),
    R_BOOL("protrain", "defer_cpu_steps", defer_cpu_steps, "true",
           "CPU optimizer steps that cannot run during backward (with max_grad_norm > 0 they "
           "need the global norm; without set_lr they need lr) are queued by optimizer_step in "
           "the order the next forward needs the chunks and run while it does; a chunk's "
           "upload waits only for its own step, and read_param / save_state wait for what "
           "they read. Same math. false: optimizer_step waits for every step."),
    R_BOOL("protrain", "auto_mode", auto_mode, "true",
           "Pick the execution mode from memory: A (all resident) if everything fits, else B "
           "(offload, replicated host state) if pinned RAM per rank holds it, else C (ZeRO-3 "
           "sharding). false: force_all_persistent and zero3_shard decide."),
    R_BOOL("protrain", "force_all_persistent", force_all_persistent, "false",
           "Keep every chunk resident on the device (mode A); init fails with the byte counts "
           "if it does not fit."),
    {"protrain", "zero3_shard", PT_CFG_TRI, 0, OFF(zero3_shard), 0, 0, 0, 0, NULL, NULL, NULL,
     NULL, "auto",
     "Shard non-persistent chunks and their optimizer state across ranks (mode C). auto: "
     "auto_mode decides. No effect with one rank."},
    R_INT("protrain", "n_persist", n_persist, PT_CFG_AUTO | PT_CFG_NO_HI, 0, INT_MAX, -1, "auto",
          "Chunks kept resident for the whole iteration (the first ones in execution order)."),
    R_INT("protrain", "n_buffer", n_buffer, PT_CFG_AUTO | PT_CFG_NO_HI, 0, INT_MAX, -1, "auto",
          "Device buffer slots that stream the non-persistent chunks (prefetch one block "
          "ahead)."),
    R_INT("protrain", "n_swap", n_swap, PT_CFG_AUTO | PT_CFG_NO_HI, 0, INT_MAX, -1, "auto",
          "Blocks whose saved activations go to pinned host memory after forward and come back "
          "before backward."),
    R_INT("protrain", "n_checkpoint", n_checkpoint, PT_CFG_AUTO | PT_CFG_NO_HI, 0, INT_MAX, -1,
          "auto",
          "Blocks whose activations are freed after forward and recomputed in backward "
          "(through the host's recompute_block)."),
    R_SIZE("protrain", "chunk_size", chunk_size, PT_CFG_AUTO, "auto",
           "Bytes per parameter chunk (consecutive parameters in execution order). auto: "
           "searched to minimise wasted space."),
    R_STR("protrain", "cache_dir", cache_dir, "a directory path, or empty for none", NULL, "",
          "Directory for the profiler cache (keyed by model, batch, sequence and backend); "
          "empty: profile on every run."),
    R_STR("protrain", "plan_file", plan_file, "a file path, or empty for none", NULL, "",
          "Write the chosen plan (knobs, predicted peak and time, mode, reasons) as JSON here; "
          "empty: the plan is only logged."),
    R_STR("protrain", "timeline_file", timeline_file, "a file path, or empty for none", NULL, "",
          "Write the plan's predicted device memory per window of one step as an SVG picture "
          "here (rewritten with the measured peak after calibration); empty: none."),
    R_ENUM("optimizer", "type", optim_type, "adamw|rekls", optim_vals, "adamw",
           "adamw, or rekls: Adam in the eigenbasis of two KL-Shampoo Kronecker factors, "
           "eigendecomposed every step, for every trainable 2-D parameter inside a block; "
           "biases, norms, embeddings and the head keep AdamW. REKLS's reference defaults (beta2 "
           "0.95, weight_decay 0.01) are what beta2 = auto and weight_decay = auto become for "
           "rekls. A host descriptor type other than FROM_CONFIG wins."),
    R_FLT("optimizer", "lr", lr, PT_CFG_LO_OPEN | PT_CFG_NO_HI, 0, 0, "3e-4",
          "Learning rate; the host may pass another one to each optimizer_step."),
    R_FLT("optimizer", "beta1", beta1, PT_CFG_HI_OPEN, 0, 1, "0.9", "First-moment decay."),
    R_FLT("optimizer", "beta2", beta2, PT_CFG_HI_OPEN | PT_CFG_AUTO, 0, 1, "auto",
          "Second-moment decay. auto: 0.95 when the optimizer is rekls (the reference's "
          "betas (0.9, 0.95)), 0.999 for adamw; decided at create_optimizer, so a host "
          "descriptor's type counts too."),
    R_FLT("optimizer", "eps", eps, PT_CFG_LO_OPEN | PT_CFG_NO_HI, 0, 0, "1e-8",
          "Added to the denominator sqrt(v_hat)."),
    R_FLT("optimizer", "weight_decay", weight_decay, PT_CFG_NO_HI | PT_CFG_AUTO, 0, 0, "auto",
          "Decoupled weight decay: p -= lr * weight_decay * p each step (AdamW; a parameter "
          "REKLS steps follows rekls_weight_decay_method). auto: 0.01 when the optimizer is "
          "rekls (the reference's default, for every parameter of the run, the ones REKLS "
          "leaves to AdamW included), 0 for adamw (so an AdamW run decays nothing unless "
          "asked); decided at create_optimizer, so a host descriptor's type counts too, and "
          "a number here or in the descriptor wins."),
    R_FLT("optimizer", "max_grad_norm", max_grad_norm, PT_CFG_NO_HI, 0, 0, "0",
          "Clip the global gradient L2 norm to this value; 0 disables clipping (CPU steps "
          "then start without waiting for every gradient)."),
    R_INT("optimizer", "cpu_threads", cpu_threads, PT_CFG_AUTO, 0, 1024, 0, "auto",
          "Threads for the CPU optimizer step on offloaded chunks; auto (or 0): the cores "
          "available to the process."),
    R_BOOL("optimizer", "rekls_seed_shampoo", rekls_seed_shampoo, "false",
           "REKLS: seed step 1 with plain Shampoo factors (G G^T / n, G^T G / m) instead of "
           "the reference's step 1, whose factors G G^T / (n eps) let the first gradient "
           "dominate the eigenbasis for hundreds of steps."),
    R_FLT("optimizer", "rekls_shampoo_beta", rekls_shampoo_beta, PT_CFG_HI_OPEN, 0, 1, "0.95",
          "REKLS: decay of the Kronecker factor averages."),
    R_FLT("optimizer", "rekls_eps", rekls_eps, PT_CFG_LO_OPEN | PT_CFG_NO_HI, 0, 0, "1e-8",
          "REKLS: floor of the factor eigenvalues in the factor update and the epsilon of its "
          "Adam ratio (one value for both, as the reference has it)."),
    R_ENUM("optimizer", "rekls_weight_decay_method", rekls_wd_method,
           "decoupled|independent|l2|palm", wd_vals, "decoupled",
           "REKLS: how weight_decay (wd) enters a REKLS-stepped parameter W, skipped when wd = "
           "0. decoupled: W -= lr * wd * W; independent: W -= wd * W; palm: W -= lr^2 * wd * W; "
           "l2: wd * W is added to the gradient after the Kronecker factor update, so Adam in "
           "the eigenbasis sees it and the factors do not. Parameters REKLS leaves to AdamW "
           "keep decoupled decay."),
    R_BOOL("optimizer", "resume_changes", resume_changes, "false",
           "load_state of a state file saved under other optimizer settings (lr as the run "
           "was created, beta1, beta2, eps, weight_decay, max_grad_norm): false refuses it, "
           "naming the first that differs (a resume continues the same run); true loads it, "
           "keeps this run's settings and logs each change as a warning (a deliberate change "
           "on resume)."),
    R_BOOL("osft", "enabled", osft_enabled, "false",
           "Orthogonal Subspace Fine-Tuning on the target weights."),
    R_FLT("osft", "unfreeze_rank_ratio", osft_urr, 0, 0, 1, "0.25",
          "Trainable fraction of each target's rank R: the top floor(R * (1 - ratio)) "
          "singular directions are frozen (at most R - 1); 1 freezes none."),
    R_STR("osft", "targets", osft_targets,
          "a comma-separated list of parameter-name substrings like attn,mlp", check_targets,
          "attn,mlp", "2-D parameters whose name contains any of these substrings are targets."),
    R_BOOL("osft", "cache_frozen", osft_cache_frozen, "false",
           "Mode C: keep each target's frozen factors whole on every rank after their first "
           "gather (pinned memory: the frozen factors' full bytes on every rank), so each step's "
           "value projection gathers only the trainable ones. No effect in modes A and B."),
    R_BOOL("tiled_mlp", "enabled", tiled_mlp_enabled, "false",
           "Run each block's MLP in sequence tiles to cut its activation peak."),
    R_INT("tiled_mlp", "tiles", tiled_mlp_tiles, PT_CFG_AUTO | PT_CFG_NO_HI, 1, INT_MAX, 0,
          "auto", "Tiles over the batch x seq tokens (tile length ceil(tokens / tiles), the last "
                  "shorter); auto: the fewest tiles whose plan fits the device."),
    R_WORD("dist", "backend", dist_backend, "auto|nccl|mpi|host|none", "auto",
           "Collectives between ranks. auto: the host's own when it hands them "
           "(pt_host_v1.coll, e.g. the PyTorch host under torchrun), else nccl on cuda, mpi on "
           "the host backend, none with one rank. nccl needs the cuda backend and "
           "libprotrain_nccl.so; mpi needs the host backend (it adds buffers with the CPU); "
           "host needs the host's table and the host backend; the other pairings are "
           "refused."),
    R_STR("dist", "init_method", init_method, "env, mpi or file:///absolute/path",
          check_init_method, "env",
          "Rendezvous: env (rank/world from the host, checked against MPI's) or mpi (the plugin "
          "calls MPI_Init unless the host did): MPI starts, and with nccl carries NCCL's id "
          "from rank 0. file:///path (nccl only, no MPI): rank 0 writes NCCL's id to path, "
          "which must not exist yet, on a filesystem every rank sees; the others poll for it "
          "until [dist] timeout; rank 0 removes it once all have joined."),
    {"dist", "timeout", PT_CFG_DUR, PT_CFG_LO_OPEN | PT_CFG_NO_HI, OFF(dist_timeout), 0, 0, 0,
     0, NULL, NULL, NULL, NULL, "300s",
     "How long a collective (and NCCL's start-up) may wait for the other ranks; past it the "
     "rank fails with an error instead of hanging (mpi names the rank that did not arrive; "
     "nccl cannot tell which, aborts its communicator and names this rank)."},
    R_BOOL("dist", "overlap_allreduce", overlap_allreduce, "true",
           "Several ranks: each chunk's gradient (resident, or mode B's offloaded fp32 sum) is "
           "all-reduced as soon as backward has finished it (one chunk per bucket), while the "
           "rest of backward runs; false: every gradient is reduced after backward. The same "
           "sums either way."),
    R_INT("dist", "tp_size", tp_size, PT_CFG_NO_HI, 1, INT_MAX, 0, "1",
          "Tensor-parallel group size P: ranks form groups of P consecutive ranks, parameters "
          "the host declares split (pt_param_v1.tp_split) hold 1/P of the full tensor on each "
          "rank of a group, and a split 2-D weight under REKLS gets the full matrix's update. P "
          "must divide world_size; with world_size > P the world_size / P groups are "
          "data-parallel replicas (gradients averaged across them). Not with OSFT or zero3_shard; "
          "host backend only."),
    {"host_backend", "copy_bandwidth", PT_CFG_RATE, 0, OFF(copy_bandwidth), 0,
     PT_GPU_COPY_BW_MIN, PT_GPU_COPY_BW_MAX, 0, NULL,
     NULL, NULL, NULL, "0",
     "Throttle each copy stream to this rate (units B/s, KB/s, MB/s, GB/s, TB/s, PB/s, KiB/s, "
     "MiB/s, GiB/s, TiB/s, PiB/s) so overlap can be measured; 0: unthrottled."},
    R_BOOL("host_backend", "poison", poison, "true",
           "Fill freed and offloaded device memory with NaN so a stray read fails a test."),
    R_STR("host_backend", "trace_file", host_trace_file, "a file path, or empty for none", NULL, "",
          "Write every op the simulated device ran (stream, op, size, start and end in us) "
          "to this file when the plugin finalizes: the timeline to compare with the plan's "
          "predicted phases; empty: none."),
    R_BOOL("host_backend", "async_compute", async_compute, "true",
           "Run a host's launched work on the simulated device's compute stream, after the "
           "hook that launched it returns, as a GPU does; false: launched work runs at once "
           "on the host's thread."),
    R_BOOL("cuda", "poison", cuda_poison, "false",
           "On a CUDA device, fill freed device memory with NaN too (a memset and a wait "
           "on every free: a debugging aid, off by default for speed)."),
    /* [testing]: knobs that make the plugin misbehave on purpose so a test can
     * show a guard matters. A file may set them only when the environment has
     * PROTRAIN_TESTING=1 (config.c); conf/default.ini and conf/CONFIG.md leave
     * them out and tests/README.md lists them (pt_config_testing_markdown). */
    R_INT("testing", "debug_skip_ordering", debug_skip_ordering, 0, 0, 65535, 0, "0",
          "Orderings to skip, a bit mask (1 uploads, 2 slot reuse, 4 gradient "
          "copies, 8 swaps, 16 frees, 32 optimizer step, 64 host memcpy, 128 OSFT projection, "
          "256 an upload after its chunk's deferred CPU step, 512 mode C's collectives on a "
          "chunk's slot, 1024 a gradient bucket's all-reduce during backward, 2048 OSFT's value "
          "projection after a chunk's CPU step (skipped: before it), 4096 mode C REKLS's update "
          "sent back from a parameter's owner to the other ranks' parts, 8192 mode C REKLS's "
          "restored state taken by each parameter's owner, 16384 the disk tier's read of a "
          "chunk's states before its step (skipped: the staging buffer keeps what it held), "
          "32768 the tier's write-back after a step (skipped: dropped); 65535 all), so a test shows it "
          "fails without each; the bits are runtime/store/ord_bits.h's PT_ORD_*."),
    {"testing", "debug_cpu_step_delay", PT_CFG_DUR, 0, OFF(debug_cpu_step_delay), 0, 0,
     1.0, 0, NULL, NULL, NULL, NULL, "0",
     "Each CPU optimizer step that optimizer_step queues first sleeps this "
     "long, so an upload that did not wait for its chunk's step reads the old values and a "
     "test sees it. 0: none."},
    {"testing", "compute_jitter", PT_CFG_DUR, 0, OFF(compute_jitter), 0, 0, 1.0, 0, NULL,
     NULL, NULL, NULL, "0",
     "Host backend: each piece of launched work first sleeps a random time up to this (seeded "
     "by jitter_seed), so a missing stream ordering shows up as a failed test; 0: none."},
    R_INT("testing", "jitter_seed", jitter_seed, PT_CFG_NO_HI, 0, INT_MAX, 0, "1",
          "Seed of the compute jitter's random delays."),
    R_INT("testing", "fail_alloc_at", fail_alloc_at, PT_CFG_NO_HI, 0, INT_MAX, 0, "0",
          "Make the N-th device allocation (1-based) fail like an OOM; 0: never."),
    R_STR("testing", "fail_op", fail_op, "<op>:<n>, or empty for none", check_fail_op, "",
          "Host backend: make the n-th call (1-based) of one backend op fail like a driver "
          "error, e.g. event_sync:3 (ops: memset, memcpy, event_sync, stream_sync, convert, "
          "adamw, sqnorm, event_record, stream_wait_event, event_create, event_elapsed_ms, "
          "host_fn); empty: never."),
    R_INT("testing", "debug_hang_rank", debug_hang_rank, PT_CFG_NO_HI, -1, INT_MAX, 0, "-1",
          "This rank stops joining collectives (as if hung) so the others must time out "
          "naming it; -1: none."),
    R_INT("testing", "debug_tier_level", debug_tier_level, 0, 0, 2, 0, "0",
          "With the disk tier in use: its level, 1 (the offloaded chunks' Adam states on "
          "disk) or 2 (their whole images: parameters and gradients too); 0: the lowest level "
          "whose pinned bytes fit pinned_budget."),
    R_BOOL("testing", "debug_tier_force", debug_tier_force, "false",
           "With [nvme] path: the offloaded chunks' states go to the disk tier even when they "
           "fit pinned_budget (small test models, whose staging slots alone exceed their "
           "states)."),
    R_INT("testing", "debug_tier_fail_write", debug_tier_fail_write, PT_CFG_NO_HI, 0, INT_MAX, 0,
          "0", "Make the disk tier's N-th write-back (1-based) fail as on a full disk (ENOSPC); "
               "0: never."),
};
/* config.c sizes per-key arrays with PT_CFG_NKEYS; a row added here without
 * bumping it fails the build rather than overrunning those arrays. */
_Static_assert(sizeof(pt_cfg_keys) / sizeof(pt_cfg_keys[0]) == PT_CFG_NKEYS,
               "PT_CFG_NKEYS in config_internal.h must match the rows of pt_cfg_keys");

const pt_config_key *pt_config_schema(size_t *n) {
    if (n) *n = PT_CFG_NKEYS;
    return pt_cfg_keys;
}

/* ---- forms (what an error message says is expected) ---- */

void pt_config_key_form(const pt_config_key *k, char *buf, size_t len) {
    char lo[32], hi[32];
    snprintf(lo, sizeof(lo), "%g", k->lo);
    snprintf(hi, sizeof(hi), "%g", k->hi);
    const char *au = (k->flags & PT_CFG_AUTO) ? "auto or " : "";
    switch (k->type) {
    case PT_CFG_BOOL: snprintf(buf, len, "%s", bool_form); break;
    case PT_CFG_TRI: snprintf(buf, len, "auto|on|off (or another bool form)"); break;
    case PT_CFG_INT:
        if (k->flags & PT_CFG_NO_HI) snprintf(buf, len, "%san integer >= %s", au, lo);
        else snprintf(buf, len, "%san integer in [%s, %s]", au, lo, hi);
        break;
    case PT_CFG_FLOAT: {
        const char *lc = (k->flags & PT_CFG_LO_OPEN) ? "(" : "[";
        const char *hc = (k->flags & PT_CFG_HI_OPEN) ? ")" : "]";
        if (k->flags & PT_CFG_NO_HI)
            snprintf(buf, len, "%sa float %s %s", au, (k->flags & PT_CFG_LO_OPEN) ? ">" : ">=",
                     lo);
        else snprintf(buf, len, "%sa float in %s%s, %s%s", au, lc, lo, hi, hc);
        break;
    }
    case PT_CFG_SIZE: snprintf(buf, len, "%sa size like 512MiB", au); break;
    case PT_CFG_RATE:
        snprintf(buf, len, "0 or a rate like 2GiB/s, from 1MB/s (%g B/s) to 1PB/s (%g B/s)",
                 k->lo, k->hi);
        break;
    case PT_CFG_DUR: /* one syntax for every duration (pt_parse_duration) */
        if (k->flags & PT_CFG_NO_HI)
            snprintf(buf, len, "a duration %s %gs like 300s, 1.5 s or 500ms (units s, ms, us, "
                               "ns; no unit: seconds)",
                     (k->flags & PT_CFG_LO_OPEN) ? ">" : ">=", k->lo);
        else
            snprintf(buf, len, "a duration like 2ms (units s, ms, us, ns; no unit: seconds) up "
                               "to %gs",
                     k->hi);
        break;
    case PT_CFG_ENUM:
    case PT_CFG_WORD: snprintf(buf, len, "one of %s", k->choices); break;
    default: snprintf(buf, len, "%s", k->form ? k->form : "text"); break;
    }
}

/* ---- generated reference ---- */

/* Appends to buf at *o; returns 1 once the buffer is full (config_internal.h). */
int pt_config_put(char *buf, size_t len, size_t *o, const char *fmt, ...) {
    if (*o >= len) return 1;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf + *o, len - *o, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= len - *o) {
        *o = len;
        return 1;
    }
    *o += (size_t)n;
    return 0;
}

/* Markdown table cell: '|' must be escaped inside a table. */
static void md_cell(char *buf, size_t len, size_t *o, const char *s) {
    for (; *s; s++) {
        if (*s == '|') pt_config_put(buf, len, o, "\\|");
        else pt_config_put(buf, len, o, "%c", *s);
    }
}

int pt_config_is_testing(const pt_config_key *k) {
    return !strcmp(k->section, PT_CFG_TESTING_SECTION);
}

int pt_config_testing_allowed(void) {
    const char *v = getenv("PROTRAIN_TESTING");
    return v && !strcmp(v, "1");
}

/* The tables of the rows whose testing flag is `testing` (one per section). */
static int markdown(char *buf, size_t len, int testing) {
    if (!buf || !len) return PT_ERR_INVALID_ARG;
    size_t o = 0;
    char form[160];
    const char *prev = NULL;
    buf[0] = '\0';
    for (size_t i = 0; i < PT_CFG_NKEYS; i++) {
        const pt_config_key *k = &pt_cfg_keys[i];
        if (pt_config_is_testing(k) != testing) continue;
        if (!prev || strcmp(k->section, prev))
            pt_config_put(buf, len, &o,
                          "%s### [%s]\n\n| key | accepted values | default | meaning |\n"
                          "|---|---|---|---|\n",
                          prev ? "\n" : "", k->section);
        prev = k->section;
        pt_config_key_form(k, form, sizeof(form));
        pt_config_put(buf, len, &o, "| `%s` | ", k->key);
        md_cell(buf, len, &o, form);
        pt_config_put(buf, len, &o, " | `%s` | ", *k->def ? k->def : "\"\"");
        md_cell(buf, len, &o, k->help);
        pt_config_put(buf, len, &o, " |\n");
    }
    return o >= len ? PT_ERR_INVALID_ARG : PT_OK;
}

int pt_config_schema_markdown(char *buf, size_t len) { return markdown(buf, len, 0); }

int pt_config_testing_markdown(char *buf, size_t len) { return markdown(buf, len, 1); }
