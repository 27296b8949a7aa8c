/*
 * rt_oom.c — what a device that is too small needs: the sentence appended to a
 * failed post_model_load or create_optimizer, and the measuring setup that
 * makes its number one that works.
 *
 * On the simulated device the setup (the host's first dev_allocs, the store
 * under the profiling plan, the profiling step's activations and scratch) runs
 * in the device's measuring mode: an allocation past the capacity lands in an
 * overflow range instead of failing, so the setup completes and its highest
 * device address is the size the profiling plan needs. The profiling plan is
 * the smallest there is (every chunk streamed through the minimal pool, every
 * block checkpointed), and the planner then picks a plan within the capacity,
 * so a device of that size trains. On a device whose memory ends at the
 * capacity (cuda) nothing can run past it: the number said there is the
 * failing request plus the bytes in use then, a lower bound, and says so.
 */
#include "rt.h"

#include <stdio.h>
#include <string.h>

#include "device_ext.h"
#include "rt_internal.h"

/* "param 1.00 MiB, act 4.01 MiB, ..." of the bytes per tag. */
static void tag_list(const uint64_t tags[PT_TAG_COUNT], char *held, size_t n) {
    size_t o = 0;
    held[0] = '\0';
    for (int t = 0; t < PT_TAG_COUNT && o < n; t++) {
        if (!tags[t]) continue;
        int k = snprintf(held + o, n - o, "%s%s %.2f MiB", o ? ", " : "", pt_mem_tag_name(t),
                         tags[t] / 1048576.0);
        if (k < 0) break;
        o += (size_t)k;
    }
    if (!o) snprintf(held, n, "nothing");
}

int pt_rt_explain_oom(pt_rt *rt, int rc, char *err, size_t errlen) {
    uint64_t tags[PT_TAG_COUNT];
    uint64_t need = pt_gpu_last_oom(rt->dev.gpu, tags);
    if (!rc || !need || !err || !errlen) return rc;
    pt_gpu_usage u;
    pt_gpu_usage_get(rt->dev.gpu, &u);
    const char *src = rt->plan.kn.source ? rt->plan.kn.source : "INI";
    const char *plan = !strcmp(src, "bootstrap")
        ? "the profiling plan (every chunk streamed through the minimal buffer pool, every "
          "block checkpointed: the smallest plan there is)"
        : !strcmp(src, "force_all_persistent") ? "force_all_persistent (everything resident)"
                                               : "the plan in force";
    const char *kind = "a lower bound: the failing request plus the bytes in use then";
    /* everything resident: the model states' exact footprint is known from the
     * store, plus whatever else was in use when the allocation failed */
    if (rt->st && !strcmp(src, "force_all_persistent")) {
        uint64_t states = 0;
        for (int k = 0; k < pt_store_n_chunks(rt->st); k++) {
            pt_store_chunk_info ci;
            pt_store_chunk_info_get(rt->st, k, &ci);
            states += ci.dev_bytes;
        }
        uint64_t other = 0;
        for (int t = 0; t < PT_TAG_COUNT; t++)
            if (t != PT_TAG_PARAM && t != PT_TAG_GRAD && t != PT_TAG_OPTIM) other += tags[t];
        if (states + other > need) {
            need = states + other;
            kind = "parameters, gradients and optimizer state of every chunk, plus the other "
                   "bytes in use then";
        }
    }
    char held[512];
    tag_list(tags, held, sizeof held);
    size_t len = strnlen(err, errlen);
    if (len + 1 < errlen)
        snprintf(err + len, errlen - len,
                 "; the device (capacity %llu bytes, %.2f MiB) is too small for this model "
                 "and batch under %s: it needs at least %llu bytes (%.2f MiB; %s); in use "
                 "when it failed: %s",
                 (unsigned long long)u.capacity, u.capacity / 1048576.0, plan,
                 (unsigned long long)need, need / 1048576.0, kind, held);
    return rc;
}

void pt_rt_measure_setup(pt_rt *rt) {
    if (rt) (void)pt_gpu_measure_begin(rt->dev.gpu);
}

int pt_rt_setup_end(pt_rt *rt, int profiled, int rc, char *err, size_t errlen) {
    uint64_t need = pt_gpu_measure_end(rt->dev.gpu);
    if (!need) return rc ? pt_rt_explain_oom(rt, rc, err, errlen) : rc;
    pt_gpu_usage u;
    pt_gpu_usage_get(rt->dev.gpu, &u);
    if (rc && rc != PT_ERR_OOM && rc != PT_ERR_INFEASIBLE) {
        /* a failure of its own (a bad argument, a host callback): it stays the
         * cause; the size is a note, measured up to where the setup stopped */
        size_t len = err ? strnlen(err, errlen) : 0;
        if (err && len + 1 < errlen)
            snprintf(err + len, errlen - len, " (the device, capacity %llu bytes, is also too "
                     "small: the setup used %llu bytes before it stopped)",
                     (unsigned long long)u.capacity, (unsigned long long)need);
        return rc;
    }
    /* the setup ran past the capacity: whatever else it reported (the planner
     * finding no plan within the capacity, most often), the device is the cause */
    char held[512], first[768] = "";
    tag_list(u.tag_peak, held, sizeof held);
    if (rc && err && errlen) snprintf(first, sizeof first, "; what failed then: %s", err);
    const char *src = rt->plan.kn.source ? rt->plan.kn.source : "INI";
    char what[400];
    if (profiled)
        snprintf(what, sizeof what, "with device_capacity set to it the profiling plan (every "
                 "chunk streamed through the minimal buffer pool, every block checkpointed: the "
                 "smallest plan there is) fits, and the planner picks a plan within it");
    else
        snprintf(what, sizeof what, "a lower bound: under %s no training step ran in the "
                 "measurement, so a step's activations are not in it",
                 !strcmp(src, "force_all_persistent") ? "force_all_persistent (everything "
                 "resident)" : "the plan in force (the INI's or the profile cache's)");
    return pt_fail(err, errlen, PT_ERR_OOM,
                   "device out of memory: the device (capacity %llu bytes, %.2f MiB) is too small "
                   "for this model and batch: it needs %s%llu bytes (%.2f MiB), measured on the "
                   "simulated device by letting the setup run past the capacity (the highest "
                   "device address the host and the plugin used through post_model_load); %s; "
                   "peak per tag: %s%s",
                   (unsigned long long)u.capacity, u.capacity / 1048576.0,
                   profiled ? "" : "at least ", (unsigned long long)need, need / 1048576.0, what,
                   held, first);
}
