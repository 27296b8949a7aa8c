/*
 * ds_estimates.h — DeepSpeed's model-state memory estimates, re-implemented
 * from the formulas in ANCHORS.md 5a/5b (DeepSpeed's code, not its docs), so
 * protrain-plan can print them beside its own plan.
 *
 * P = total params (shared counted once), Lmax = params of the largest single
 * module, g = GPUs per node, n = nodes, G = g*n, f = additional_buffer_factor
 * (DeepSpeed default 1.5). Results are bytes (doubles: DeepSpeed's CPU terms
 * are floating point); DeepSpeed prints them / 2^30 as "GB".
 *
 * ZeRO-3 (estimate_zero3_model_states_mem_needs):
 *   param+optimizer offload: GPU = 4 Lmax
 *                            CPU = zero_init ? 18 P f / n : P max(4g, 18/n) f
 *   optimizer offload only:  GPU = 4 Lmax + int(2 P / G)
 *                            CPU = zero_init ? 16 P f / n : P max(4g, 16/n) f
 *   no offload:              GPU = 4 Lmax + int(18 P / G)
 *                            CPU = zero_init ? 4 g f Lmax : 4 g f P
 * ZeRO-2 (estimate_zero2_model_states_mem_needs):
 *   optimizer offload:       GPU = 2 P;  CPU = P max(4G, 16) f
 *   no offload:              GPU = 2 P + int(18 P / G);  CPU = 4 g f P
 */
#ifndef PT_DS_ESTIMATES_H
#define PT_DS_ESTIMATES_H

#include <stdint.h>

#define PT_DS_BUFFER_FACTOR 1.5

typedef struct pt_ds_est {
    double gpu_bytes;   /* per GPU */
    double cpu_bytes;   /* per node */
} pt_ds_est;

/* offload_param requires offload_opt (DeepSpeed has no param-only offload):
 * returns -1 for that combination or non-positive sizes, else 0. */
int pt_ds_zero3(int64_t params, int64_t largest_layer, int gpus_per_node, int nodes, int offload_param,
                int offload_opt, int zero_init, double buffer_factor, pt_ds_est *out);
int pt_ds_zero2(int64_t params, int gpus_per_node, int nodes, int offload_opt, double buffer_factor, pt_ds_est *out);

#endif /* PT_DS_ESTIMATES_H */
