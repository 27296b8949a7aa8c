/*
 * ds_estimates.c — DeepSpeed's estimates (ds_estimates.h; the model-shape
 * synthesiser declared beside them is model_shape.c). int(a / b) of
 * DeepSpeed's Python is floor division for the positive integers used here,
 * so it is done in integers; the rest follows Python's float arithmetic order.
 */
#include "ds_estimates.h"

int pt_ds_zero3(int64_t P, int64_t L, int g, int n, int offload_param, int offload_opt, int zero_init, double f,
                pt_ds_est *out) {
    if (P <= 0 || L < 0 || g < 1 || n < 1 || !out || (offload_param && !offload_opt)) return -1;
    int64_t G = (int64_t)g * n;
    double largest = 4.0 * (double)L;   /* fp16 param + fp16 grad of the largest module */
    double gpus_factor = 1.0 / n;
    if (offload_param) {
        out->gpu_bytes = largest;
        out->cpu_bytes = zero_init ? (double)P * 18 * gpus_factor * f
                                   : (double)P * (4.0 * g > 18.0 * gpus_factor ? 4.0 * g : 18.0 * gpus_factor) * f;
    } else if (offload_opt) {
        out->gpu_bytes = largest + (double)((2 * P) / G);
        out->cpu_bytes = zero_init ? (double)P * 16 * gpus_factor * f
                                   : (double)P * (4.0 * g > 16.0 * gpus_factor ? 4.0 * g : 16.0 * gpus_factor) * f;
    } else {
        out->gpu_bytes = largest + (double)((18 * P) / G);
        out->cpu_bytes = zero_init ? (double)L * 4 * g * f : (double)P * 4 * g * f;
    }
    return 0;
}

int pt_ds_zero2(int64_t P, int g, int n, int offload_opt, double f, pt_ds_est *out) {
    if (P <= 0 || g < 1 || n < 1 || !out) return -1;
    int64_t G = (int64_t)g * n;
    if (offload_opt) {
        out->gpu_bytes = 2.0 * (double)P;
        out->cpu_bytes = (double)P * (4.0 * (double)G > 16.0 ? 4.0 * (double)G : 16.0) * f;
    } else {
        out->gpu_bytes = 2.0 * (double)P + (double)((18 * P) / G);
        out->cpu_bytes = (double)P * 4 * g * f;
    }
    return 0;
}
