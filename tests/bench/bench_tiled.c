/*
 * bench_tiled.c — TiledMLP on the simulated device: device peak and step time,
 * tiled vs untiled, at T = 512, 1024, 2048, 4096 (one block, C = 128, B = 1,
 * everything resident, activations kept), in one process, runs alternating,
 * median of 3.
 *
 * Model of what tiling saves: untiled, a block keeps the MLP's two (T, 4C)
 * intermediates (fc output and its GELU) in its arena and its backward needs a
 * (T, 4C) gradient scratch; tiled with N tiles only one tile's (T/N, 4C) worth
 * of each exists, in the plugin's tile scratch. The saving is therefore about
 * 3 * (T - T/N) * 4C floats of the peak; the bench prints the measured peak
 * difference beside that model and the time ratio (the recompute of each tile's
 * forward inside backward costs about one extra MLP forward).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sh_harness.h"

#define REPEATS 3
#define STEPS 4

static sh_harness H;

typedef struct res {
    double step_s;
    uint64_t peak;
} res;

static int run(int T, int tiles, res *r) {
    char text[512], tl[96] = "";
    if (tiles > 0) snprintf(tl, sizeof tl, "[tiled_mlp]\nenabled = true\ntiles = %d\n", tiles);
    snprintf(text, sizeof text,
             "[plugin]\nlog_level = error\nbackend = host\n[memory]\ndevice_capacity = 1GiB\n"
             "[protrain]\nforce_all_persistent = true\nn_swap = 0\nn_checkpoint = 0\n%s",
             tl);
    const char *ini = sh_harness_ini(&H, "cfg", text);
    if (!ini) return 1;
    sh_train_opts o = sh_harness_opts(&H, 1, 128, 4, 1, T);
    o.tbl = H.plug.table;
    o.ini_path = ini;
    sh_trainer *tr = NULL;
    char err[1024];
    if (sh_trainer_create(&tr, &o, err, sizeof err)) {
        fprintf(stderr, "bench_tiled: %s\n", err);
        return 1;
    }
    double t[STEPS + 1], loss;
    t[0] = pt_now_s();
    for (int s = 1; s <= STEPS; s++) {
        if (sh_trainer_step(tr, s, 1e-3f, &loss)) {
            fprintf(stderr, "bench_tiled: step %d: %s\n", s, sh_trainer_error(tr));
            sh_trainer_destroy(tr);
            return 1;
        }
        t[s] = pt_now_s();
    }
    double d[STEPS - 1];
    for (int s = 1; s < STEPS; s++) d[s - 1] = t[s + 1] - t[s];   /* the first step warms up */
    r->step_s = sh_median(d, STEPS - 1);
    pt_stats_v1 st;
    memset(&st, 0, sizeof st);
    st.struct_size = sizeof st;
    if (sh_trainer_stats(tr, &st)) return 1;
    r->peak = st.dev_peak;
    return sh_trainer_destroy(tr) ? 1 : 0;
}

int main(void) {
    if (sh_harness_open(&H, "bench_tiled", "tiles of a long sequence, one after another. ", 70000,
                        3, 1))
        return 1;
    const int Ts[] = {512, 1024, 2048, 4096};
    const int C = 128, N = 8;
    printf("bench_tiled: 1 block, C %d, B 1, %d tiles vs untiled, median of %d alternating runs\n",
           C, N, REPEATS);
    printf("%6s %12s %12s %12s %12s %10s\n", "T", "peak untiled", "peak tiled", "saved MiB",
           "model MiB", "time x");
    int rc = 0;
    for (size_t i = 0; i < sizeof Ts / sizeof Ts[0] && !rc; i++) {
        int T = Ts[i];
        double pu[REPEATS], pt[REPEATS], tu[REPEATS], tt[REPEATS];
        for (int k = 0; k < REPEATS && !rc; k++) {
            res u, t;
            rc = run(T, 0, &u) || run(T, N, &t);
            pu[k] = (double)u.peak;
            pt[k] = (double)t.peak;
            tu[k] = u.step_s;
            tt[k] = t.step_s;
        }
        if (rc) break;
        double mu = sh_median(pu, REPEATS), mt = sh_median(pt, REPEATS);
        double model = 3.0 * (double)(T - (T + N - 1) / N) * 4.0 * C * 4.0;
        printf("%6d %12.2f %12.2f %12.2f %12.2f %10.2f\n", T, mu / 1048576.0, mt / 1048576.0,
               (mu - mt) / 1048576.0, model / 1048576.0,
               sh_median(tt, REPEATS) / sh_median(tu, REPEATS));
    }
    sh_harness_close(&H);
    return rc;
}
