/*
 * plugin_ini.c — --no-plugin with an INI that holds plugin sections. They are not
 * used, but they are not ignored either: a typo there would otherwise pass every
 * --no-plugin run and surface only when the plugin is used. The plugin itself
 * checks them (its own parser, the one the plugin run would use): it is loaded,
 * started on the INI with the simulated device and finalized.
 */
#include <stdio.h>
#include <string.h>

#include "protrain.h"
#include "pt_util.h"
#include "sh_config.h"

/* The check is not a run: the plugin's start-up lines are not shown, its
 * warnings and errors are. */
static void quiet_log(void *user, int32_t level, const char *msg) {
    (void)user;
    if (level <= PT_LOG_WARN) fprintf(stderr, "sample_host: plugin (checking the INI): %s\n", msg);
}

int sh_config_check_plugin_sections(const sh_config *c, char *err, size_t errlen) {
    if (!c->no_plugin || !c->config[0] || !c->plugin_sections[0]) return 0;
    pt_loaded_plugin lp;
    memset(&lp, 0, sizeof lp);
    char why[1024] = "";
    if (pt_plugin_load(c->plugin, &lp, why, sizeof why) || !lp.table) {
        fflush(stdout);
        fprintf(stderr, "sample_host: warning: --no-plugin: the sections %s of %s are not used "
                        "and could not be checked (the plugin did not load: %s)\n",
                c->plugin_sections,
                c->config, why);
        if (lp.dl) pt_plugin_unload(&lp);
        return 0;
    }
    pt_host_v1 h;
    memset(&h, 0, sizeof h);
    h.abi_version = PT_ABI_VERSION;
    h.struct_size = sizeof h;
    h.world_size = 1;
    h.log = quiet_log;
    /* the simulated device: a check must not need the GPU the INI may name */
    h.device_kind = PT_DEVICE_HOST;
    void *ctx = NULL;
    int rc = lp.table->init(c->config, &h, &ctx);
    const char *le = rc ? lp.table->last_error(NULL) : "";
    int out = 0;
    if (rc == PT_ERR_CONFIG) {
        snprintf(err, errlen, "--no-plugin: %s's plugin sections are not used, but they must be "
                              "valid: %s",
                 c->config, le ? le : "");
        out = -1;
    } else if (rc) {
        fflush(stdout);
        fprintf(stderr, "sample_host: warning: --no-plugin: the sections %s of %s are not used; "
                        "the plugin could not start to check them beyond its parser (status %d: %s)\n",
                c->plugin_sections, c->config, rc, le ? le : "");
    } else if (!c->quiet) {
        printf("sample_host: --no-plugin: the sections %s of %s were checked by the plugin and "
               "are not used\n",
               c->plugin_sections, c->config);
    }
    if (ctx) lp.table->finalize(ctx);
    pt_plugin_unload(&lp);
    return out;
}
