/*
 * config_internal.h — private seam between config.c (parsing, defaults,
 * messages, dump) and config_schema.c (the schema table, accepted-value text,
 * markdown reference). Not part of the plugin's interface; only plugin/config*.c
 * include it.
 */
#ifndef PT_CONFIG_INTERNAL_H
#define PT_CONFIG_INTERNAL_H

#include <stddef.h>

#include "config.h"

#if defined(__GNUC__)
#define FMT(a, b) __attribute__((format(printf, a, b)))
#else
#define FMT(a, b)
#endif

/* Row and section counts as constants, so config.c can size per-key arrays
 * (pstate.set_line); config_schema.c static-asserts both against its tables. */
#define PT_CFG_NKEYS 65
#define PT_CFG_NSECTIONS 11

/* The schema rows in file order (PT_CFG_NKEYS of them) and the section names a
 * file may use (PT_CFG_NSECTIONS), in the same order the rows first use them. */
extern const pt_config_key pt_cfg_keys[];
extern const char *const pt_cfg_sections[];

/* The section of the testing knobs: a file may set its keys only when the
 * environment has PROTRAIN_TESTING=1; the user's reference leaves them out. */
#define PT_CFG_TESTING_SECTION "testing"
int pt_config_is_testing(const pt_config_key *k);
/* PROTRAIN_TESTING=1 is set in the environment. */
int pt_config_testing_allowed(void);

/* printf-append to buf at *o (len bytes in all); returns 1 once the buffer is
 * full, after which *o == len and buf holds a NUL-terminated prefix. */
int pt_config_put(char *buf, size_t len, size_t *o, const char *fmt, ...) FMT(4, 5);

#endif
