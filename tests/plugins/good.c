/*
 * good.c — test plugin: a complete, valid v1 table with stub hooks (every hook
 * of the mandatory core set, the optional ones NULL).
 */
#include "protrain.h"

static int g_ctx_token;   /* what init hands back as ctx, so a test can check it */

static int32_t stub_init(const char *ini, const pt_host_v1 *host, void **ctx) {
    (void)ini;
    (void)host;
    if (!ctx) return PT_ERR_INVALID_ARG;
    *ctx = &g_ctx_token;
    return PT_OK;
}
static const char *stub_last_error(void *ctx) {
    (void)ctx;
    return "good-test: no error";
}
static int32_t stub_model(void *ctx, pt_model_v1 *m) {
    (void)ctx;
    (void)m;
    return PT_OK;
}
static int32_t stub_optim(void *ctx, const pt_optim_v1 *d) {
    (void)ctx;
    (void)d;
    return PT_OK;
}
static int32_t stub_pre_step(void *ctx, int64_t s, int32_t m, int32_t n) {
    (void)ctx;
    (void)s;
    (void)m;
    (void)n;
    return PT_OK;
}
static int32_t stub_block(void *ctx, int32_t b) {
    (void)ctx;
    (void)b;
    return PT_OK;
}
static int32_t stub_step(void *ctx, float lr) {
    (void)ctx;
    (void)lr;
    return PT_OK;
}
static int32_t stub_post(void *ctx, int64_t s, float l) {
    (void)ctx;
    (void)s;
    (void)l;
    return PT_OK;
}
static int32_t stub_finalize(void *ctx) { return ctx == &g_ctx_token ? PT_OK : PT_ERR_INVALID_ARG; }

const pt_plugin_v1 protrain_plugin_v1 = {
    .abi_version = 1,
    .struct_size = sizeof(pt_plugin_v1),
    .name = "good-test",
    .version = "0.0.1",
    .init = stub_init,
    .last_error = stub_last_error,
    .post_model_load = stub_model,
    .create_optimizer = stub_optim,
    .pre_step = stub_pre_step,
    .block_pre_forward = stub_block,
    .block_post_forward = stub_block,
    .block_pre_backward = stub_block,
    .block_post_backward = stub_block,
    .optimizer_step = stub_step,
    .post_step = stub_post,
    .finalize = stub_finalize,
};
