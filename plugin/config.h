/*
 * config.h — the plugin's INI configuration: one struct with every knob, a
 * table-driven schema (one row per key) that drives parsing, defaults, error
 * messages, pt_config_dump() and the reference text in conf/CONFIG.md.
 *
 * File rules (see conf/CONFIG.md):
 *  - sections: plugin, memory, protrain, optimizer, osft, tiled_mlp, dist,
 *    host_backend, cuda; and testing, whose keys (knobs that break the plugin on
 *    purpose, for negative controls) are accepted only when the environment has
 *    PROTRAIN_TESTING=1. Sections a host trainer owns are skipped whole:
 *    [sample_host] and every [host.<anything>].
 *  - `key = value`, one per line; leading whitespace is ignored, so values never
 *    continue on the next line. Full-line comments start with ';' or '#',
 *    inline comments with " ;". Lines are at most 198 characters (inih).
 *  - Unknown sections/keys, bad values and duplicate keys are errors naming
 *    file:line; nothing is silently ignored.
 */
#ifndef PT_CONFIG_H
#define PT_CONFIG_H

#include <stddef.h>
#include <stdint.h>

/* The parsed configuration type, pt_config, lives in runtime/base (the runtime
 * runs with it; this layer only fills it from INI text). */
#include "base/base.h"

/* Every field at its schema default; source = "(defaults)". */
void pt_config_defaults(pt_config *c);

/* Defaults, then the file, then $PROTRAIN_LOG_LEVEL. After the file, one
 * cross-key rule: auto_memory = false needs all four n_* set to numbers.
 * path NULL or "" -> $PROTRAIN_CONFIG if set (and non-empty), else defaults only.
 * Returns 0, or PT_ERR_CONFIG (2) / PT_ERR_IO (7) with one sentence in err.
 * On error *c is left unchanged. */
int pt_config_load(const char *path, pt_config *c, char *err, size_t errlen);

/* Same as pt_config_load on INI text; name (NULL -> "(string)") is the file name
 * used in messages and stored in c->source. Does not read $PROTRAIN_CONFIG. */
int pt_config_parse_string(const char *text, const char *name, pt_config *c, char *err,
                           size_t errlen);

/* Set one key on an existing config (command-line overrides, tests): same
 * per-key validation as the file; messages start with "override: " and name the
 * key and section. 0 or PT_ERR_CONFIG; on error *c is unchanged. */
int pt_config_set(pt_config *c, const char *section, const char *key, const char *value,
                  char *err, size_t errlen);

/* "64MiB", "1.5 GiB", "4096", "2GB" -> bytes. KiB/MiB/GiB/TiB = 1024^n, KB/MB/GB/TB =
 * 1000^n, B or no unit = bytes; units case-insensitive; fractional bytes round down.
 * Rejects negatives, garbage and overflow. 0 on success, PT_ERR_CONFIG otherwise. */
int pt_parse_size(const char *s, uint64_t *out);

/* "0", "12GiB/s", "800 MB/s", "1e9" (B/s) -> bytes per second. 0 or PT_ERR_CONFIG. */
int pt_parse_rate(const char *s, double *out);

/* "2ms", "500 us", "0.25s", "3e-3s", "300" -> seconds: a non-negative number, then
 * optional blanks and an optional unit s, ms, us or ns (case-insensitive); no unit
 * means seconds. The one syntax of every duration key. 0 or PT_ERR_CONFIG. */
int pt_parse_duration(const char *s, double *out);

/* The effective configuration as INI text that pt_config_parse_string reads back
 * to the same struct. 0, or PT_ERR_INVALID_ARG when len is too small (buf then
 * holds a truncated, NUL-terminated prefix). PT_CONFIG_DUMP_MAX always suffices. */
#define PT_CONFIG_DUMP_MAX 8192
int pt_config_dump(const pt_config *c, char *buf, size_t len);

/* ---- the schema, for docs and tools ---- */
typedef enum pt_cfg_type {
    PT_CFG_BOOL = 0,  /* int 0/1 */
    PT_CFG_INT = 1,   /* int in [lo, hi]; "auto" -> auto_int when PT_CFG_AUTO */
    PT_CFG_FLOAT = 2, /* float in the range given by lo/hi and the OPEN flags; "auto" -> NaN when PT_CFG_AUTO */
    PT_CFG_SIZE = 3,  /* uint64_t bytes; "auto" -> 0 when PT_CFG_AUTO */
    PT_CFG_RATE = 4,  /* double bytes/s */
    PT_CFG_ENUM = 5,  /* int: index of the value in choices mapped through enum_vals */
    PT_CFG_WORD = 6,  /* char[cap]: one of choices, stored as text */
    PT_CFG_STR = 7,   /* char[cap]: free text, checked by the row's checker if any */
    PT_CFG_TRI = 8,   /* int: auto -> -1, else a bool */
    PT_CFG_DUR = 9    /* double seconds: "2ms", "500 us", "0.1s", "300"; range from lo/hi and
                         the LO_OPEN / NO_HI flags */
} pt_cfg_type;

enum {
    PT_CFG_AUTO = 1u << 0,    /* "auto" accepted */
    PT_CFG_LO_OPEN = 1u << 1, /* value > lo (else >= lo) */
    PT_CFG_HI_OPEN = 1u << 2, /* value < hi (else <= hi) */
    PT_CFG_NO_HI = 1u << 3    /* no upper bound */
};

typedef struct pt_config_key {
    const char *section;
    const char *key;
    int type;                 /* pt_cfg_type */
    unsigned flags;           /* PT_CFG_* bits */
    size_t off;               /* offsetof(pt_config, field) */
    size_t cap;               /* bytes of the char array (WORD, STR) */
    double lo, hi;            /* numeric range */
    int auto_int;             /* INT: value stored for "auto" */
    const char *choices;      /* ENUM/WORD: "a|b|c" */
    const int *enum_vals;     /* ENUM: value for each choice */
    const char *form;         /* accepted form, overrides the generated one (STR) */
    /* STR: extra check on v (a copy of the value, cap bytes); may normalise v in
     * place; returns 0, or 1 with the reason ("expected ...") in why. */
    int (*check)(char *v, size_t cap, char *why, size_t whylen);
    const char *def;          /* default, as INI text */
    const char *help;         /* one or two sentences */
} pt_config_key;

/* The rows, in file order; *n gets the count. */
const pt_config_key *pt_config_schema(size_t *n);
/* "a float in [0, 1)", "auto or a size like 512MiB", ... (what error messages say). */
void pt_config_key_form(const pt_config_key *k, char *buf, size_t len);
/* Markdown tables (one per section) generated from the schema; conf/CONFIG.md
 * embeds this text verbatim and a test checks it. 0 or PT_ERR_INVALID_ARG. */
int pt_config_schema_markdown(char *buf, size_t len);
/* The same tables for the [testing] section alone (the keys a file may set only
 * with PROTRAIN_TESTING=1 in the environment); tests/README.md embeds them and
 * the same test checks that copy. pt_config_schema_markdown leaves them out. */
int pt_config_testing_markdown(char *buf, size_t len);

#endif
