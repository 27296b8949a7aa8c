/*
 * base.h — the bottom of runtime/: what every subsystem runs with.
 *  - pt_config: every configuration knob, parsed and validated by plugin/
 *    (INI schema, file:line errors) and handed to the runtime read-only.
 *  - pt_logger and pt_log*: leveled logging through the host's logger
 *    (pt_host_v1.log) or stderr.
 *  - pt_fail / pt_now_s (from pt_util.h): the one error idiom and the one clock.
 */
#ifndef PT_BASE_H
#define PT_BASE_H

#include <stddef.h>
#include <stdint.h>

#include "pt_util.h"   /* pt_fail, pt_now_s, PT_PRINTF */

/* The plugin's release, in one place: the exported table reports it
 * (pt_plugin_v1.version) and ranks compare it before they train together
 * (core/dist_agree.h), since two releases may differ in their arithmetic;
 * likewise the ABI minor this build implements (protrain.h's "ABI 1.N"). */
#define PT_PLUGIN_VERSION "0.1.0"
#define PT_ABI_MINOR 5

typedef struct pt_config {
    /* [plugin] */
    int log_level;            /* log_level = error|warn|info|debug|trace (PT_LOG_*); default info */
    char backend[16];         /* backend = auto|cuda|host; default auto */
    /* [memory] */
    uint64_t device_capacity; /* device_capacity = auto | <size>; 0 = auto */
    uint64_t reserve;         /* reserve = <size>, default 0: kept free on the device */
    uint64_t pinned_budget;   /* pinned_budget = auto | <size>; 0 = auto (MemAvailable-based) */
    uint64_t extra_headroom;  /* extra_headroom = <size>, default 0: memory the profiler cannot see */
    /* [nvme]: the disk tier of offloaded chunks' optimizer states (store/tier/) */
    char nvme_path[512];      /* path = a writable folder, "" (default) = no tier */
    int nvme_io_threads;      /* io_threads = 1..64, default 2: threads doing the tier's reads/writes */
    int nvme_slots;           /* staging_slots = 3..64, -1 = auto (the store sizes them) */
    uint64_t nvme_block;      /* block_size = <size>, default 4096: file offsets and lengths align to it */
    uint64_t nvme_budget;     /* budget = auto | <size>: disk bytes the tier may use; 0 = auto (free space) */
    /* [protrain] */
    int auto_memory;          /* bool, default 1 */
    int time_calibration;     /* bool, default 1: re-plan on a time misprediction */
    float time_replan_tolerance; /* default 0.15: |measured/predicted - 1| that re-plans */
    int defer_cpu_steps;      /* bool, default 1: CPU steps run into the next forward */
    int auto_mode;            /* bool, default 1 */
    int force_all_persistent; /* bool, default 0 */
    int zero3_shard;          /* auto|on|off -> -1|1|0, default -1 */
    int n_persist, n_buffer, n_swap, n_checkpoint; /* auto | integer >= 0 -> -1 means search */
    uint64_t chunk_size;      /* auto | <size>; 0 = auto */
    char cache_dir[512];      /* default "" = no cache */
    char plan_file[512];      /* default "" = no JSON plan */
    char timeline_file[512];  /* default "" = no SVG memory timeline */
    /* [optimizer] */
    int optim_type;           /* type = adamw|rekls -> PT_OPTIM_ADAMW|PT_OPTIM_REKLS */
    float lr, beta1, beta2, eps, weight_decay, max_grad_norm; /* 3e-4, 0.9, auto, 1e-8, auto, 0 (0 = no clipping) */
                              /* NaN = auto, resolved by the optimizer type at create_optimizer:
                                 beta2 0.95 for REKLS, 0.999 for AdamW; weight_decay 0.01 for
                                 REKLS, 0 for AdamW */
    int cpu_threads;          /* 0 = auto (cores available) */
    int rekls_seed_shampoo;   /* bool, default 0 (step 1 as the reference implementation) */
    float rekls_shampoo_beta; /* default 0.95 */
    float rekls_eps;          /* default 1e-8 */
    int rekls_wd_method;      /* decoupled|independent|l2|palm -> 0..3 (pt_rekls_wd in optim/rekls.h) */
    int resume_changes;       /* bool, default 0: load_state refuses a file saved under other
                                 lr/beta1/beta2/eps/weight_decay/max_grad_norm */
    /* [osft] */
    int osft_enabled;         /* enabled = bool, default 0 */
    float osft_urr;           /* unfreeze_rank_ratio in [0,1], default 0.25: the TRAINABLE fraction of
                               * each target's rank; frozen k = min(floor(R * (1 - urr)), R - 1) */
    char osft_targets[256];   /* targets = comma list of param-name substrings, default "attn,mlp" */
    int osft_cache_frozen;    /* cache_frozen = bool, default 0: mode C keeps the gathered frozen
                               * factors whole on every rank */
    /* [tiled_mlp] */
    int tiled_mlp_enabled;    /* enabled = bool, default 0 */
    int tiled_mlp_tiles;      /* tiles = auto|int >= 1 -> 0 = auto */
    /* [dist] */
    char dist_backend[16];    /* backend = auto|nccl|mpi|none */
    char init_method[256];    /* init_method = env | file:///path | mpi ; default env */
    double dist_timeout;      /* timeout = duration > 0 in seconds, default 300 */
    int debug_hang_rank;      /* integer >= -1, default -1: testing only */
    int tp_size;              /* integer >= 1, default 1: tensor-parallel group size */
    int overlap_allreduce;    /* bool, default 1: resident gradients reduced during backward */
    /* [host_backend] */
    double copy_bandwidth;    /* bytes/s, units B/s KB/s MB/s GB/s KiB/s MiB/s GiB/s; 0 = unthrottled */
    int poison;               /* bool, default 1 */
    int fail_alloc_at;        /* integer >= 0, default 0: fail the Nth device alloc (1-based), 0 = never */
    char host_trace_file[512]; /* [host_backend] trace_file: the simulated device's op timeline, "" = off */
    char fail_op[40];         /* "<op>:<n>" or "" (default): fail the n-th call of a backend op (pt_gpu_fail_op_parse) */
    int async_compute;        /* bool, default 1: launched host work runs on the compute stream */
    double compute_jitter;    /* seconds, default 0: random delay before each launched item */
    double debug_cpu_step_delay; /* seconds, default 0 (testing): sleep before each CPU step
                                  * optimizer_step queues */
    int jitter_seed;          /* default 1 */
    int debug_tier_force;     /* testing: tier the offloaded states even when they fit */
    int debug_tier_level;     /* testing: with the tier in use, this level (0: the budget's) */
    int debug_tier_fail_write; /* testing: the N-th tier write-back fails with ENOSPC, 0 = never */
    int debug_skip_ordering;  /* PT_ORD_* mask, default 0: testing only (negative controls) */
    /* [cuda] */
    int cuda_poison;          /* bool, default 0: poison freed memory on a real GPU too */
    char source[512];         /* path the config came from, or "(defaults)" */
} pt_config;

typedef struct pt_logger {
    int level;                                   /* pt_log_level: messages above it are dropped */
    void (*fn)(void *user, int32_t level, const char *msg);  /* NULL = stderr */
    void *user;
    int rank;                                    /* prefixed when world > 1 (-1 = none) */
} pt_logger;


void pt_log(const pt_logger *lg, int level, const char *fmt, ...) PT_PRINTF(3, 4);
/* Multi-line text: one logger call per line (plans, tables). */
void pt_log_text(const pt_logger *lg, int level, const char *text);
const char *pt_log_level_name(int level);

/* FNV-1a 64-bit: h = (h ^ byte) * 1099511628211, offset basis
 * 14695981039346656037. Checksums of state files and profile caches, and the
 * model-architecture hash of the cache key. */
uint64_t pt_fnv1a64(const void *data, size_t len);
/* The same hash continued over more bytes: pt_fnv1a64_more(pt_fnv1a64(a), b)
 * hashes a then b, for data that is not contiguous (a file's header and payload). */
uint64_t pt_fnv1a64_more(uint64_t h, const void *data, size_t len);

/* Median of the n values in x (sorted in place), the mean of the middle two
 * for even n; 0 for n <= 0. */
double pt_median(double *x, int n);

/* Where the host is in its step. One copy in the whole plugin: the hook-order
 * state machine (plugin/lifecycle) owns it and rolls it back with its state
 * when a hook fails; the runtime reads it through a pointer. */
typedef struct pt_step_state {
    int64_t step;
    int32_t micro, n_micro;
    int eval;             /* a forward-only pass (pre_step with n_micro == 0) */
} pt_step_state;

#define PT_LOGE(lg, ...) pt_log((lg), 0, __VA_ARGS__)
#define PT_LOGW(lg, ...) pt_log((lg), 1, __VA_ARGS__)
#define PT_LOGI(lg, ...) pt_log((lg), 2, __VA_ARGS__)
#define PT_LOGD(lg, ...) pt_log((lg), 3, __VA_ARGS__)

/* TiledMLP tiles over `tokens` rows (one row per (batch, position), flattened
 * row-major) for a requested count n >= 1 (0 = auto): tile length
 * c = ceil(tokens / n), N_eff = ceil(tokens / c) <= n tiles, tile i covering
 * [i*c, min((i+1)*c, tokens)), so only the last tile is shorter and none is empty
 * (tokens = 5, n = 4 gives c = 2 and 3 tiles). n = 0: tiles of at most
 * PT_MLP_AUTO_TILE rows, the count `tiles = auto` profiles with (the runtime then
 * picks the fewest tiles whose plan fits, runtime/tiled/tiled_mlp.c). */
#define PT_MLP_AUTO_TILE 256
static inline int64_t pt_mlp_tile_len(int64_t tokens, int64_t n) {
    if (tokens < 1) return 1;
    if (n < 1) n = (tokens + PT_MLP_AUTO_TILE - 1) / PT_MLP_AUTO_TILE;
    return (tokens + n - 1) / n;
}
static inline int64_t pt_mlp_tiles_eff(int64_t tokens, int64_t n) {
    int64_t c = pt_mlp_tile_len(tokens, n);
    return tokens < 1 ? 0 : (tokens + c - 1) / c;
}

#endif
