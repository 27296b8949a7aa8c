/*
 * test_agree_hooks.c — the ranks' agreement through the plugin's hooks, for the
 * facts sample_host cannot vary alone (its fingerprint is compared first): a
 * hook-level host, two ranks under mpirun (tests/dist_agree.sh), rank 1
 * differing as $AGREE_CASE says:
 *   clean  nothing: both ranks train one step and finalize (exit 0);
 *   name   its second parameter's name (post_model_load names model.param[1]);
 *   dtype  that parameter's dtype, bf16 (post_model_load names it);
 *   micro  n_micro 2 at the first pre_step (pre_step names n_micro);
 *   init   one initial value of its third parameter (post_model_load names
 *          that parameter's initial values);
 *   fp     its pt_host_v1.fingerprint line "data=b" against rank 0's "data=a"
 *          (init names host.data), while a host without a fingerprint (every
 *          other case: NULL) agrees with itself;
 *   leave  rank 0 finalizes right after init, as a host ending without a word
 *          (exit 3): rank 1's post_model_load fails within seconds saying
 *          rank 0 ended its run, not at [dist] timeout;
 *   abort  rank 0 calls dist_abort("the host stops here") after init, then
 *          finalizes (exit 3): rank 1's post_model_load fails at once with
 *          "rank 0 stopped: the host stops here".
 * Each rank prints "agree rank R: HOOK status S: SENTENCE" when a hook fails
 * and exits with the status (0 after a clean step); the script checks each
 * rank's status and sentence. Alone (not under mpirun) it says it is skipped.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "protrain.h"

#define NEL 64
static const pt_plugin_v1 *P = &protrain_plugin_v1;

/* Report, then finalize as a host would (it closes the collectives on every
 * rank alike, so MPI finalizes instead of the job being torn down). */
static int fail_at(void *ctx, int rank, const char *hook, int rc) {
    printf("agree rank %d: %s status %d: %s\n", rank, hook, rc, P->last_error(ctx));
    fflush(stdout);
    if (ctx) P->finalize(ctx);
    return rc;
}

int main(void) {
    const char *ws = getenv("OMPI_COMM_WORLD_SIZE"), *rs = getenv("OMPI_COMM_WORLD_RANK");
    const char *cs = getenv("AGREE_CASE"), *ini = getenv("AGREE_INI");
    if (!ws || !rs || !cs || !ini) {
        printf("test_agree_hooks: skipped: run under mpirun with AGREE_CASE and AGREE_INI "
               "(tests/dist_agree.sh does)\n");
        return 0;
    }
    int rank = atoi(rs), odd = rank == 1;
    pt_host_v1 h;
    memset(&h, 0, sizeof h);
    h.abi_version = PT_ABI_VERSION;
    h.struct_size = sizeof h;
    h.world_size = atoi(ws);
    h.rank = rank;
    h.device_kind = PT_DEVICE_HOST;
    if (!strcmp(cs, "fp")) h.fingerprint = odd ? "seed=1\ndata=b\n" : "seed=1\ndata=a\n";
    void *ctx = NULL;
    int rc = P->init(ini, &h, &ctx);
    if (rc) return fail_at(NULL, rank, "init", rc);
    if (!odd && (!strcmp(cs, "leave") || !strcmp(cs, "abort"))) {
        if (!strcmp(cs, "abort")) P->dist_abort(ctx, "the host stops here");
        P->finalize(ctx);
        printf("agree rank %d: %s after init\n", rank, cs);
        fflush(stdout);
        return 3;
    }

    static float init[3][NEL];
    pt_param_v1 p[3];
    static const char *names[3] = {"emb", "b0.w", "b1.w"};
    for (int i = 0; i < 3; i++) {
        for (int k = 0; k < NEL; k++) init[i][k] = 0.01f * (float)((i * 7 + k) % 13);
        p[i] = (pt_param_v1){.name = names[i], .dtype = PT_F32, .ndim = 1, .shape = {NEL},
                             .block = i - 1, .trainable = 1, .tie = -1, .init = init[i]};
    }
    if (odd && !strcmp(cs, "name")) p[1].name = "b0.weight";
    if (odd && !strcmp(cs, "dtype")) p[1].dtype = PT_BF16;
    if (odd && !strcmp(cs, "init")) init[2][5] += 1e-3f;
    pt_model_v1 m = {.struct_size = sizeof m, .n_params = 3, .params = p, .n_blocks = 2,
                     .batch = 1, .seq = 1, .arch = "agree"};
    if ((rc = P->post_model_load(ctx, &m))) return fail_at(ctx, rank, "post_model_load", rc);
    if ((rc = P->create_optimizer(ctx, NULL))) return fail_at(ctx, rank, "create_optimizer", rc);
    int nm = odd && !strcmp(cs, "micro") ? 2 : 1;
    if ((rc = P->pre_step(ctx, 1, 0, nm))) return fail_at(ctx, rank, "pre_step", rc);
    for (int b = 0; b < 2 && !rc; b++)
        if ((rc = P->block_pre_forward(ctx, b)) || (rc = P->block_post_forward(ctx, b)))
            return fail_at(ctx, rank, "forward", rc);
    for (int b = 1; b >= 0; b--)
        if ((rc = P->block_pre_backward(ctx, b)) || (rc = P->block_post_backward(ctx, b)))
            return fail_at(ctx, rank, "backward", rc);
    if ((rc = P->optimizer_step(ctx, -1.0f))) return fail_at(ctx, rank, "optimizer_step", rc);
    if ((rc = P->post_step(ctx, 1, 0.0f))) return fail_at(ctx, rank, "post_step", rc);
    if ((rc = P->finalize(ctx))) return fail_at(NULL, rank, "finalize", rc);
    printf("agree rank %d: trained one step\n", rank);
    return 0;
}
