/*
 * footprint.c — what the chunks cost where they live: the pinned bytes of an
 * offloaded chunk and the device bytes of a resident one (the optimizer
 * kind's state included, from the planner terms it left in the chunk), as
 * the store allocates them; and the pinned budget the offloaded chunks must
 * fit before anything is allocated.
 */
#include <stdio.h>
#include <sys/resource.h>

#include "store_internal.h"

/* Pinned bytes of one offloaded chunk (the real cost of an offloaded parameter,
 * never 2 bytes per parameter), exactly as alloc_offloaded allocates them;
 * rounded: each allocation rounded as the pinned arena carves it; tiered: its
 * states on the disk tier. */
static uint64_t pinned_of(const cs_chunk *c, int rounded, int tiered) {
    if (tiered == 2) return 0;   /* the whole image on disk: only staging slots */
    if (c->sh) {   /* this rank's parts, and the optimizer state of the params it owns */
        uint64_t own = c->plan.own_words * 4, eb = (uint64_t)c->n_state * 4;
        if (rounded) eb = pt_gpu_round_size(eb);
        /* tiered: m and v of its parts on disk */
        uint64_t sh = pt_sh_pinned(c, rounded) - (tiered && c->trainable ? 2 * eb : 0);
        return sh + (rounded && own ? pt_gpu_round_size(own) : own);
    }
    uint64_t pb = rounded ? pt_gpu_round_size(c->used) : c->used;
    if (!c->trainable) return pb;                              /* h_param only */
    if (tiered) return 2 * pb;   /* h_param, h_gstage: the states are on disk */
    uint64_t eb = (uint64_t)c->n_state * 4, ob = c->plan.aux_words * 4;
    if (rounded) eb = pt_gpu_round_size(eb), ob = ob ? pt_gpu_round_size(ob) : 0;
    /* h_param, h_gstage, m, v, fp32 masters, the optimizer kind's state (REKLS:
     * factors and bases) */
    return 2 * pb + 2 * eb + (c->has16 ? eb : 0) + ob;
}

uint64_t pt_ms_chunk_pinned(const cs_chunk *c, int rounded) {
    return pinned_of(c, rounded, c->tiered);
}

/* What the planner sees (the profile's host_bytes): the chunk's pinned cost
 * with its states in pinned memory, tier or not, so a profile is the same
 * either way and the cost model decides where the states go (pt_cost_pinned). */
uint64_t pt_ms_chunk_host_bytes(const cs_chunk *c) { return pinned_of(c, 0, 0); }

/* Device bytes of one resident chunk as alloc_persistent and pt_store_optimizer_init
 * allocate them, each allocation rounded like the allocator rounds it. */
uint64_t pt_ms_chunk_dev_bytes(const cs_chunk *c) {
    uint64_t b = pt_gpu_round_size(c->used);                    /* d_param */
    if (!c->trainable) return b;
    uint64_t st = pt_gpu_round_size(c->n_state * 4);
    b += pt_gpu_round_size(c->used) + 2 * st;                   /* d_grad, d_m, d_v */
    if (c->has16) b += st;                                      /* d_master */
    return b + pt_ms_chunk_optim_dev_bytes(c);
}

/* The optimizer kind's state on the device (REKLS: factors and bases), plus
 * the scratch of the chunk's largest param it steps. The kind allocates one
 * scratch for the largest resident param, so summing this over resident
 * chunks is an upper bound by at most (such chunks - 1) scratches. */
uint64_t pt_ms_chunk_optim_dev_bytes(const cs_chunk *c) {
    if (!c->plan.aux_words) return 0;
    return pt_gpu_round_size(c->plan.aux_words * 4) + pt_gpu_round_size(c->plan.ws_words * 4);
}

static uint64_t mem_available(void) {
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f) return 0;
    char line[256];
    unsigned long long kb = 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) break;
    fclose(f);
    return (uint64_t)kb * 1024;
}

uint64_t pt_ms_profile_pinned(uint64_t s) { return 2 * s > 65536 ? 2 * s : 65536; }

uint64_t pt_ms_pinned_limit(const pt_store *st) {
    uint64_t b = st->env.cfg->pinned_budget;
    return b ? b : mem_available() / 10 * 9;
}

int pt_ms_check_pinned(pt_store *st, uint64_t need, char *err, size_t errlen) {
    uint64_t avail = mem_available();
    uint64_t budget = st->env.cfg->pinned_budget;
    struct rlimit rl;
    int have_rl = getrlimit(RLIMIT_MEMLOCK, &rl) == 0;
    char lim[64];
    if (!have_rl || rl.rlim_cur == RLIM_INFINITY) snprintf(lim, sizeof lim, "unlimited");
    else snprintf(lim, sizeof lim, "%llu", (unsigned long long)rl.rlim_cur);
    /* auto budget: 90% of MemAvailable. RLIMIT_MEMLOCK binds only where pages are
     * really locked (cuda pins through the driver, which ignores it; the host
     * backend does not lock), so it is reported, not enforced. */
    uint64_t eff = budget ? budget : avail / 10 * 9;
    if (need > eff || (avail && need > avail)) {
        /* mode C: also what mode B (replicated) would need per rank */
        char alt[160] = "";
        if (st->shard) {
            uint64_t rep = 0;
            for (int k = 0; k < st->n_chunks; k++) {
                const cs_chunk *c = &st->ch[k];
                if (c->sh)   /* the optimizer kind's state replicated too */
                    rep += c->trainable ? 2 * c->used + 2 * 4 * c->sh->n_state_full +
                                              4 * c->plan.aux_words
                                        : c->used;
            }
            snprintf(alt, sizeof alt, " (this rank's parts in mode C, split over %d ranks; "
                                      "replicated on every rank, mode B, they would need %llu)",
                     st->world,
                     (unsigned long long)rep);
        }
        /* a profiling run then times the copy rates through one more pinned
         * buffer of max(2 x chunk_size, the largest arena, 64 KiB); the arenas
         * are not known yet, and where the budget leaves less the profiler
         * times at what is left (profiler_hw.c), so the chunks plus
         * max(2 x chunk_size, 64 KiB) is a budget that runs */
        uint64_t tb = pt_ms_profile_pinned(st->lay.chunk_size);
        return pt_fail(err, errlen, PT_ERR_HOST_OOM, "pinned host memory: the offloaded chunks need %llu bytes%s, but the budget is %llu "
                                                     "(pinned_budget = %s), MemAvailable is %llu and RLIMIT_MEMLOCK is %s; lower "
                                                     "offload (raise n_persist / device_capacity) or set [memory] pinned_budget to at "
                                                     "least %llu (the chunks, plus %llu that profiling uses to time the copy rates)",
                       (unsigned long long)need, alt, (unsigned long long)eff, budget ? "set" : "auto: 90% of "
                                                                                                "MemAvailable",
                       (unsigned long long)avail, lim, (unsigned long long)(need + tb),
                       (unsigned long long)tb);
    }
    return PT_OK;
}
