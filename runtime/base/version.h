/*
 * version.h — the plugin's release, in one place: the exported table reports
 * it (pt_plugin_v1.version) and ranks compare it before they train together
 * (core/dist_agree.h), since two releases may differ in their arithmetic.
 */
#ifndef PT_VERSION_H
#define PT_VERSION_H

#define PT_PLUGIN_VERSION "0.1.0"
/* The ABI minor this build implements (protrain.h's "ABI 1.N" notes). */
#define PT_ABI_MINOR 5

#endif
