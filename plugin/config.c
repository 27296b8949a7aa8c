/*
 * config.c — INI configuration: the inih driver with exact file:line
 * messages, defaults, overrides and the dump. The schema table, the
 * accepted-value text and the markdown reference are in config_schema.c; the
 * readers of sizes, rates and durations in units.c.
 *
 * Line numbers: the installed inih (r55) calls the handler without a line
 * number, so we feed it through ini_parse_stream with our own reader. inih reads
 * exactly one line per reader call and calls the handler while processing that
 * line, so the reader's line counter is the handler's line. The reader also
 * strips leading whitespace, which turns off inih's multi-line continuation
 * (an indented "key = v" after another key would otherwise be glued onto it),
 * and it validates section headers itself because inih does not call the
 * handler for a header (an empty misspelt section must still be an error).
 */
#include "config_internal.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <ini.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "protrain.h"
#include "pt_util.h"

/* ---- small helpers ---- */

static int is_skipped_section(const char *s) {
    return !strcmp(s, "sample_host") || !strncmp(s, "host.", 5);
}

static int section_index(const char *s) {
    for (size_t i = 0; i < PT_CFG_NSECTIONS; i++)
        if (!strcmp(s, pt_cfg_sections[i])) return (int)i;
    return -1;
}

static int find_key(const char *sec, const char *key) {
    for (size_t i = 0; i < PT_CFG_NKEYS; i++)
        if (!strcmp(pt_cfg_keys[i].section, sec) && !strcmp(pt_cfg_keys[i].key, key)) return (int)i;
    return -1;
}

/* Levenshtein distance, case-insensitive; names are short (inih caps them at 50). */
static int lev(const char *a, const char *b) {
    size_t la = strlen(a), lb = strlen(b);
    if (la > 63 || lb > 63) return 64;
    int prev[64], cur[64];
    for (size_t j = 0; j <= lb; j++) prev[j] = (int)j;
    for (size_t i = 1; i <= la; i++) {
        cur[0] = (int)i;
        for (size_t j = 1; j <= lb; j++) {
            int sub = prev[j - 1] + (tolower((unsigned char)a[i - 1]) !=
                                     tolower((unsigned char)b[j - 1]));
            int del = prev[j] + 1, ins = cur[j - 1] + 1;
            cur[j] = sub < del ? (sub < ins ? sub : ins) : (del < ins ? del : ins);
        }
        memcpy(prev, cur, sizeof(int) * (lb + 1));
    }
    return prev[lb];
}

/* Suggest only when the typo is small relative to the word: d <= max(2, len/3). */
static int close_enough(const char *typed, int d) {
    int len = (int)strlen(typed), lim = len / 3 > 2 ? len / 3 : 2;
    return d <= lim;
}

static void quote_val(const char *v, char *out, size_t len) {
    size_t n = strlen(v);
    if (n + 1 <= len && n <= 64) {
        memcpy(out, v, n + 1);
    } else {
        snprintf(out, len, "%.60s...", v);
    }
}

/* ---- value parsers ---- */

static int parse_bool(const char *v, int *out) {
    static const char *const t[] = {"true", "on", "yes", "1"}, *const f[] = {"false", "off", "no", "0"};
    for (int i = 0; i < 4; i++) {
        if (!strcasecmp(v, t[i])) return *out = 1, 0;
        if (!strcasecmp(v, f[i])) return *out = 0, 0;
    }
    return 1;
}

/* Index of v among "a|b|c" (case-insensitive), or -1. */
static int choice_index(const char *choices, const char *v) {
    int i = 0;
    size_t n = strlen(v);
    for (const char *p = choices;; i++) {
        const char *e = strchr(p, '|');
        size_t l = e ? (size_t)(e - p) : strlen(p);
        if (l == n && !strncasecmp(p, v, n)) return i;
        if (!e) return -1;
        p = e + 1;
    }
}

/* Parse v for row k into c. 0, or 1 with why = "expected ..." (or another reason). */
static int set_value(const pt_config_key *k, pt_config *c, const char *v, char *why, size_t wl) {
    char *base = (char *)c + k->off;
    char form[160];
    pt_config_key_form(k, form, sizeof(form));
    snprintf(why, wl, "expected %s", form);
    switch (k->type) {
    case PT_CFG_BOOL: return parse_bool(v, (int *)base);
    case PT_CFG_TRI:
        if (!strcasecmp(v, "auto")) return *(int *)base = -1, 0;
        return parse_bool(v, (int *)base);
    case PT_CFG_INT: {
        char *end;
        if ((k->flags & PT_CFG_AUTO) && !strcasecmp(v, "auto")) return *(int *)base = k->auto_int, 0;
        errno = 0;
        long x = strtol(v, &end, 10);
        if (!*v || *end || errno || x < (long)k->lo || x > (long)k->hi) return 1;
        *(int *)base = (int)x;
        return 0;
    }
    case PT_CFG_FLOAT: {
        char *end;
        /* auto is stored as NaN, which no number parses to; the runtime decides */
        if ((k->flags & PT_CFG_AUTO) && !strcasecmp(v, "auto")) return *(float *)base = NAN, 0;
        errno = 0;
        double d = strtod(v, &end);
        if (!*v || *end || errno == ERANGE || !isfinite(d)) return 1;
        float f = (float)d; /* range is checked on the value actually stored */
        if (!isfinite(f)) return 1;
        if ((k->flags & PT_CFG_LO_OPEN) ? !(f > k->lo) : !(f >= k->lo)) return 1;
        if (!(k->flags & PT_CFG_NO_HI) && ((k->flags & PT_CFG_HI_OPEN) ? !(f < k->hi) : !(f <= k->hi)))
            return 1;
        *(float *)base = f;
        return 0;
    }
    case PT_CFG_SIZE: {
        uint64_t x;
        if ((k->flags & PT_CFG_AUTO) && !strcasecmp(v, "auto")) return *(uint64_t *)base = 0, 0;
        if (pt_parse_size(v, &x)) return 1;
        /* a non-zero amount below one byte would silently become 0, which for
         * these keys means "auto" or "none" */
        if (x == 0 && strpbrk(v, "123456789")) {
            snprintf(why, wl, "it is less than one byte and would round to 0 (which means %s); "
                              "write %s explicitly or a size of at least 1 byte",
                     (k->flags & PT_CFG_AUTO) ? "auto" : "none",
                     (k->flags & PT_CFG_AUTO) ? "auto or 0" : "0");
            return 1;
        }
        *(uint64_t *)base = x;
        return 0;
    }
    case PT_CFG_RATE: {
        double r;
        if (pt_parse_rate(v, &r)) return 1;
        /* 0 is "off"; anything else must lie in the row's range (no rounding to 0) */
        if (r != 0.0 && !(r >= k->lo && r <= k->hi)) {
            snprintf(why, wl, "%g bytes/s is outside the accepted range: expected %s", r, form);
            return 1;
        }
        *(double *)base = r;
        return 0;
    }
    case PT_CFG_DUR: {
        double d;
        if (pt_parse_duration(v, &d)) return 1;
        if ((k->flags & PT_CFG_LO_OPEN) ? !(d > k->lo) : !(d >= k->lo)) return 1;
        if (!(k->flags & PT_CFG_NO_HI) && d > k->hi) return 1;
        *(double *)base = d;
        return 0;
    }
    case PT_CFG_ENUM: {
        int i = choice_index(k->choices, v);
        if (i < 0) return 1;
        *(int *)base = k->enum_vals[i];
        return 0;
    }
    case PT_CFG_WORD: {
        int i = choice_index(k->choices, v);
        if (i < 0) return 1;
        /* store the canonical (lower-case) spelling */
        const char *p = k->choices;
        for (int j = 0; j < i; j++) p = strchr(p, '|') + 1;
        size_t l = strcspn(p, "|");
        memcpy(base, p, l);
        base[l] = '\0';
        return 0;
    }
    default: { /* PT_CFG_STR: one pair of surrounding double quotes is removed */
        char tmp[512];
        size_t n = strlen(v);
        if (n >= 2 && v[0] == '"' && v[n - 1] == '"') v++, n -= 2;
        if (n >= k->cap) {
            snprintf(why, wl, "it is %zu characters long; at most %zu fit", n, k->cap - 1);
            return 1;
        }
        memcpy(tmp, v, n);
        tmp[n] = '\0';
        if (k->check && k->check(tmp, k->cap, why, wl)) return 1;
        memcpy(base, tmp, strlen(tmp) + 1);
        return 0;
    }
    }
}

void pt_config_defaults(pt_config *c) {
    char why[256];
    memset(c, 0, sizeof(*c));
    /* Defaults go through the parser, so a schema default that does not
     * parse is caught by the unit test that checks every row. */
    for (size_t i = 0; i < PT_CFG_NKEYS; i++) (void)set_value(&pt_cfg_keys[i], c, pt_cfg_keys[i].def, why, sizeof(why));
    snprintf(c->source, sizeof(c->source), "(defaults)");
}

/* ---- messages for unknown names ---- */

static void unknown_section_msg(const char *name, const char *sec, char *out, size_t len) {
    int best = -1, bd = 1 << 20;
    for (size_t i = 0; i < PT_CFG_NSECTIONS; i++) {
        int d = lev(sec, pt_cfg_sections[i]);
        if (d < bd) bd = d, best = (int)i;
    }
    if (best >= 0 && close_enough(sec, bd))
        snprintf(out, len, "%sunknown section [%s]; did you mean [%s]?", name, sec, pt_cfg_sections[best]);
    else snprintf(out, len,
                  "%sunknown section [%s]; valid sections are [plugin], [memory], [protrain], "
                  "[optimizer], [osft], [tiled_mlp], [dist], [host_backend] (host trainer sections "
                  "[sample_host] and [host.*] are skipped)",
                  name, sec);
}

static void unknown_key_msg(const char *name, const char *sec, const char *key, char *out,
                            size_t len) {
    int best = -1, bd = 1 << 20, elsewhere = -1;
    for (size_t i = 0; i < PT_CFG_NKEYS; i++) {
        if (strcmp(pt_cfg_keys[i].section, sec)) {
            if (!strcmp(pt_cfg_keys[i].key, key) && elsewhere < 0) elsewhere = (int)i;
            continue;
        }
        int d = lev(key, pt_cfg_keys[i].key);
        if (d < bd) bd = d, best = (int)i;
    }
    int n = snprintf(out, len, "%sunknown key '%s' in [%s]; ", name, key, sec);
    if (n < 0 || (size_t)n >= len) return;
    out += n, len -= (size_t)n;
    if (best >= 0 && close_enough(key, bd)) {
        snprintf(out, len, "did you mean '%s'?", pt_cfg_keys[best].key);
    } else if (elsewhere >= 0) {
        snprintf(out, len, "'%s' belongs in [%s]", key, pt_cfg_keys[elsewhere].section);
    } else {
        size_t o = (size_t)snprintf(out, len, "valid keys in [%s] are", sec);
        const char *sep = " ";
        for (size_t i = 0; i < PT_CFG_NKEYS && o < len; i++) {
            if (strcmp(pt_cfg_keys[i].section, sec)) continue;
            o += (size_t)snprintf(out + o, len - o, "%s%s", sep, pt_cfg_keys[i].key);
            sep = ", ";
        }
    }
}

/* A [testing] key without PROTRAIN_TESTING=1 in the environment. */
static const char *testing_refusal(const char *key, char *out, size_t len) {
    snprintf(out, len, "key '%s' in [testing] is a testing knob (it makes the plugin misbehave "
                       "on purpose); it is accepted only when the environment sets "
                       "PROTRAIN_TESTING=1, as the test suite does",
             key);
    return out;
}

/* ---- the inih driver ---- */

typedef struct pstate {
    const char *name;      /* file name for messages */
    const char *text, *pos;
    int line;              /* lines handed to inih so far = current line */
    pt_config *c;
    int set_line[PT_CFG_NKEYS];  /* where each key was first set, 0 = not yet */
    int err_line;          /* first error found by us (0 = none) */
    char err[768];
} pstate;

static void st_err(pstate *st, const char *fmt, ...) FMT(2, 3);
static void st_err(pstate *st, const char *fmt, ...) {
    if (st->err_line) return; /* keep the first one */
    st->err_line = st->line;
    int n = snprintf(st->err, sizeof(st->err), "%s:%d: ", st->name, st->line);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(st->err + n, sizeof(st->err) - (size_t)n, fmt, ap);
    va_end(ap);
}

static void trim_copy(const char *s, size_t n, char *out, size_t len) {
    while (n && isspace((unsigned char)*s)) s++, n--;
    while (n && isspace((unsigned char)s[n - 1])) n--;
    if (n >= len) n = len - 1;
    memcpy(out, s, n);
    out[n] = '\0';
}

/* fgets-style reader: one line per call, leading whitespace removed, CRLF -> LF. */
static char *reader(char *str, int num, void *stream) {
    pstate *st = stream;
    const char *p = st->pos;
    if (!*p) return NULL;
    st->line++;
    const char *nl = strchr(p, '\n');
    const char *end = nl ? nl : p + strlen(p);
    st->pos = nl ? nl + 1 : end;
    /* A UTF-8 byte-order mark (editors on Windows write one) is not text: drop
     * it here, so the first line is still checked like any other. */
    if (st->line == 1 && end - p >= 3 && !memcmp(p, "\xEF\xBB\xBF", 3)) p += 3;
    while (p < end && (*p == ' ' || *p == '\t')) p++;
    size_t n = (size_t)(end - p);
    if (n && p[n - 1] == '\r') n--;
    if (num < 3 || n + 2 > (size_t)num) {
        char pre[48];
        trim_copy(p, n < 40 ? n : 40, pre, sizeof(pre));
        st_err(st, "line '%s...' is %zu characters long; inih reads at most %d", pre, n,
               num - 2);
        return NULL;
    }
    memcpy(str, p, n);
    str[n] = '\n';
    str[n + 1] = '\0';
    if (*p == '[') { /* validate the header here: inih never reports empty sections */
        const char *rb = memchr(p, ']', n);
        if (rb) {
            char sec[128];
            trim_copy(p + 1, (size_t)(rb - p - 1), sec, sizeof(sec));
            if (section_index(sec) < 0 && !is_skipped_section(sec)) {
                char m[600];
                unknown_section_msg("", sec, m, sizeof(m));
                st_err(st, "%s", m);
            }
            /* inih drops whatever follows ']': a key written on the header line
             * would be lost without a word */
            const char *q = rb + 1, *e = p + n;
            while (q < e && (*q == ' ' || *q == '\t')) q++;
            if (q < e && *q != ';' && *q != '#') {
                char rest[72];
                trim_copy(q, (size_t)(e - q) < 64 ? (size_t)(e - q) : 64, rest, sizeof(rest));
                st_err(st, "text '%s' after the section header [%s] would be ignored; put each "
                           "key = value on its own line",
                       rest, sec);
            }
        }
    }
    return str;
}

static int handler(void *user, const char *section, const char *name, const char *value) {
    pstate *st = user;
    char sec[64], why[256], vq[72];
    trim_copy(section, strlen(section), sec, sizeof(sec));
    if (is_skipped_section(sec)) return 1;
    if (!*sec) {
        int k = -1;
        for (size_t i = 0; i < PT_CFG_NKEYS && k < 0; i++)
            if (!strcmp(pt_cfg_keys[i].key, name)) k = (int)i;
        if (k >= 0) st_err(st, "key '%s' is outside any section; put it under [%s]", name, pt_cfg_keys[k].section);
        else st_err(st, "key '%s' is outside any section; start the file with a [section] header", name);
        return 0;
    }
    if (section_index(sec) < 0) return 1; /* reported at the header line */
    int k = find_key(sec, name);
    char m[600];
    if (k < 0) {
        unknown_key_msg("", sec, name, m, sizeof(m));
        st_err(st, "%s", m);
        return 0;
    }
    if (pt_config_is_testing(&pt_cfg_keys[k]) && !pt_config_testing_allowed()) {
        st_err(st, "%s", testing_refusal(name, m, sizeof m));
        return 0;
    }
    if (!value) {
        st_err(st, "key '%s' in [%s] has no value", name, sec);
        return 0;
    }
    if (st->set_line[k]) {
        st_err(st, "duplicate key '%s' in [%s] (first set at line %d)", name, sec, st->set_line[k]);
        return 0;
    }
    st->set_line[k] = st->line;
    if (set_value(&pt_cfg_keys[k], st->c, value, why, sizeof(why))) {
        quote_val(value, vq, sizeof(vq));
        st_err(st, "bad value '%s' for key '%s' in [%s]: %s", vq, name, sec, why);
        return 0;
    }
    return 1;
}

/* Returns the text of line `no` (1-based) trimmed, into out. */
static void line_text(const char *text, int no, char *out, size_t len) {
    const char *p = text;
    for (int i = 1; i < no && p; i++) {
        p = strchr(p, '\n');
        if (p) p++;
    }
    if (!p) p = "";
    const char *e = strchr(p, '\n');
    size_t n = e ? (size_t)(e - p) : strlen(p);
    trim_copy(p, n < 64 ? n : 64, out, len);
}

/* Cross-key rules, checked after the whole file is read. */
static int cross_check(pstate *st) {
    const pt_config *c = st->c;
    if (!c->auto_memory) {
        const char *miss = c->n_persist < 0 ? "n_persist" : c->n_buffer < 0   ? "n_buffer"
                                                        : c->n_swap < 0       ? "n_swap"
                                                        : c->n_checkpoint < 0 ? "n_checkpoint"
                                                                              : NULL;
        if (miss) {
            st->line = st->set_line[find_key("protrain", "auto_memory")];
            st_err(st, "[protrain] auto_memory = false needs n_persist, n_buffer, n_swap and "
                       "n_checkpoint set to numbers, but %s is auto",
                   miss);
            return 1;
        }
    }
    return 0;
}

static int env_log_level(pt_config *c, char *err, size_t errlen) {
    const char *v = getenv("PROTRAIN_LOG_LEVEL");
    if (!v || !*v) return 0;
    char why[256], vq[72];
    if (set_value(&pt_cfg_keys[find_key("plugin", "log_level")], c, v, why, sizeof(why))) {
        quote_val(v, vq, sizeof(vq));
        return pt_fail(err, errlen, PT_ERR_CONFIG, "environment variable PROTRAIN_LOG_LEVEL: bad value '%s': %s", vq, why);
    }
    return 0;
}

int pt_config_parse_string(const char *text, const char *name, pt_config *c, char *err,
                           size_t errlen) {
    if (!text || !c) {
        return pt_fail(err, errlen, PT_ERR_INVALID_ARG, "pt_config_parse_string: text and config must not be NULL");
    }
    if (!name) name = "(string)";
    pt_config tmp;
    pt_config_defaults(&tmp);
    pstate *st = calloc(1, sizeof(*st));
    if (!st) {
        return pt_fail(err, errlen, PT_ERR_HOST_OOM, "%s: out of host memory parsing the configuration", name);
    }
    st->name = name, st->text = st->pos = text, st->c = &tmp;
    int rc = ini_parse_stream(reader, st, handler, st);
    if (rc == 0 && !st->err_line) cross_check(st);
    int status = PT_OK;
    if (rc > 0 && (!st->err_line || rc < st->err_line)) {
        /* a line inih itself could not parse (no '=', unclosed '[') */
        char lt[72];
        line_text(text, rc, lt, sizeof(lt));
        if (lt[0] == '[')
            status = pt_fail(err, errlen, PT_ERR_CONFIG,
                             "%s:%d: section header '%s' has no closing ']'", name, rc, lt);
        else
            status = pt_fail(err, errlen, PT_ERR_CONFIG,
                             "%s:%d: cannot parse '%s': expected [section], key = value, "
                             "or a comment starting with ';' or '#'",
                             name, rc, lt);
    } else if (st->err_line || rc != 0) {
        status = rc == -2 ? PT_ERR_HOST_OOM : PT_ERR_CONFIG;
        if (st->err_line) pt_fail(err, errlen, status, "%s", st->err);
        else pt_fail(err, errlen, status, "%s: inih failed with code %d", name, rc);
    }
    free(st);
    if (status) return status;
    snprintf(tmp.source, sizeof(tmp.source), "%s", name);
    if ((status = env_log_level(&tmp, err, errlen))) return status;
    *c = tmp;
    return PT_OK;
}

/* The largest configuration file read: every key with its comment is a few
 * KiB, so this only stops a huge file (or one that keeps growing) from taking
 * the host's memory. */
#define PT_CONFIG_MAX_BYTES (1 << 20)

/* "a directory", "a FIFO", ... for a file that is not regular. */
static const char *file_kind(mode_t m) {
    return S_ISDIR(m) ? "a directory" : S_ISFIFO(m) ? "a FIFO"
                                    : S_ISCHR(m)    ? "a character device"
                                    : S_ISBLK(m)    ? "a block device"
                                    : S_ISSOCK(m)   ? "a socket"
                                                    : "not a plain file";
}

int pt_config_load(const char *path, pt_config *c, char *err, size_t errlen) {
    if (!c) {
        return pt_fail(err, errlen, PT_ERR_INVALID_ARG, "pt_config_load: config must not be NULL");
    }
    if (!path || !*path) {
        const char *e = getenv("PROTRAIN_CONFIG");
        path = (e && *e) ? e : NULL;
    }
    if (!path) {
        pt_config tmp;
        pt_config_defaults(&tmp);
        int st = env_log_level(&tmp, err, errlen);
        if (!st) *c = tmp;
        return st;
    }
    /* O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer
     * before the checks below could refuse it (regular files ignore the flag). */
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) {
        return pt_fail(err, errlen, PT_ERR_IO, "cannot open config file %s: %s", path, strerror(errno));
    }
    struct stat sb;
    if (fstat(fd, &sb)) {
        int e = errno;
        close(fd);
        return pt_fail(err, errlen, PT_ERR_IO, "cannot read config file %s: %s", path, strerror(e));
    }
    if (!S_ISREG(sb.st_mode)) {
        close(fd);
        return pt_fail(err, errlen, PT_ERR_IO, "cannot read config file %s: it is %s, not a regular "
                                               "file (a configuration is read whole at init; a FIFO could block it and a "
                                               "device never end)",
                       path, file_kind(sb.st_mode));
    }
    if (sb.st_size > PT_CONFIG_MAX_BYTES) {
        close(fd);
        return pt_fail(err, errlen, PT_ERR_CONFIG, "config file %s is %lld bytes; a configuration "
                                                   "file may be at most %d bytes (1 MiB)",
                       path, (long long)sb.st_size,
                       PT_CONFIG_MAX_BYTES);
    }
    FILE *f = fdopen(fd, "rb");
    if (!f) {
        int e = errno;
        close(fd);
        return pt_fail(err, errlen, PT_ERR_IO, "cannot read config file %s: %s", path, strerror(e));
    }
    /* read at most one byte past the limit: a file that grew after fstat is
     * refused too, and nothing unbounded is ever allocated */
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    int rc = PT_OK, oom = !buf;
    while (!oom && n <= PT_CONFIG_MAX_BYTES) {
        if (n + 1 >= cap) {
            char *nb = realloc(buf, cap * 2);
            if (!nb) {
                oom = 1;
                break;
            }
            buf = nb, cap *= 2;
        }
        size_t got = fread(buf + n, 1, cap - 1 - n, f);
        n += got;
        if (got == 0) break;
    }
    if (oom) {
        rc = pt_fail(err, errlen, PT_ERR_HOST_OOM, "out of host memory reading config file %s", path);
    } else if (ferror(f)) {
        rc = pt_fail(err, errlen, PT_ERR_IO, "cannot read config file %s: %s", path, strerror(errno));
    } else if (n > PT_CONFIG_MAX_BYTES) {
        rc = pt_fail(err, errlen, PT_ERR_CONFIG, "config file %s is over %d bytes; a configuration "
                                                 "file may be at most %d bytes (1 MiB)",
                     path, PT_CONFIG_MAX_BYTES,
                     PT_CONFIG_MAX_BYTES);
    }
    fclose(f);
    if (!rc) {
        buf[n] = '\0';
        if (strlen(buf) != n) {
            int line = 1;
            for (const char *p = buf; *p; p++) line += *p == '\n';
            rc = pt_fail(err, errlen, PT_ERR_CONFIG, "%s:%d: the file contains a NUL byte; a config file must be "
                                                     "text",
                         path, line);
        } else {
            rc = pt_config_parse_string(buf, path, c, err, errlen);
        }
    }
    free(buf);
    return rc;
}

int pt_config_set(pt_config *c, const char *section, const char *key, const char *value,
                  char *err, size_t errlen) {
    if (!c || !section || !key || !value) {
        return pt_fail(err, errlen, PT_ERR_INVALID_ARG, "pt_config_set: arguments must not be NULL");
    }
    char m[600], why[256], vq[72];
    if (section_index(section) < 0) {
        unknown_section_msg("override: ", section, m, sizeof(m));
        return pt_fail(err, errlen, PT_ERR_CONFIG, "%s", m);
    }
    int k = find_key(section, key);
    if (k < 0) {
        unknown_key_msg("override: ", section, key, m, sizeof(m));
        return pt_fail(err, errlen, PT_ERR_CONFIG, "%s", m);
    }
    if (pt_config_is_testing(&pt_cfg_keys[k]) && !pt_config_testing_allowed()) {
        char r[400];
        return pt_fail(err, errlen, PT_ERR_CONFIG, "override: %s",
                       testing_refusal(key, r, sizeof r));
    }
    pt_config tmp = *c;
    if (set_value(&pt_cfg_keys[k], &tmp, value, why, sizeof(why))) {
        quote_val(value, vq, sizeof(vq));
        return pt_fail(err, errlen, PT_ERR_CONFIG, "override: bad value '%s' for key '%s' in [%s]: %s", vq, key, section, why);
    }
    *c = tmp;
    return PT_OK;
}

/* ---- dump ---- */

/* Shortest "%.Ng" that reads back to the same float (or double when dbl). */
static void fmt_real(double x, int dbl, char *b, size_t n) {
    for (int prec = 6; prec <= 17; prec++) {
        snprintf(b, n, "%.*g", prec, x);
        double y = strtod(b, NULL);
        if (dbl ? y == x : (float)y == (float)x) return;
    }
}

static void fmt_value(const pt_config_key *k, const pt_config *c, char *b, size_t n) {
    const char *base = (const char *)c + k->off;
    switch (k->type) {
    case PT_CFG_BOOL: snprintf(b, n, "%s", *(const int *)base ? "true" : "false"); break;
    case PT_CFG_TRI: {
        int v = *(const int *)base;
        snprintf(b, n, "%s", v < 0 ? "auto" : v ? "on"
                                                : "off");
        break;
    }
    case PT_CFG_INT: {
        int v = *(const int *)base;
        if ((k->flags & PT_CFG_AUTO) && v == k->auto_int) snprintf(b, n, "auto");
        else snprintf(b, n, "%d", v);
        break;
    }
    case PT_CFG_FLOAT:
        if ((k->flags & PT_CFG_AUTO) && isnan(*(const float *)base)) snprintf(b, n, "auto");
        else fmt_real(*(const float *)base, 0, b, n);
        break;
    case PT_CFG_SIZE: {
        uint64_t v = *(const uint64_t *)base;
        static const char *const un[] = {"TiB", "GiB", "MiB", "KiB"};
        if (!v && (k->flags & PT_CFG_AUTO)) {
            snprintf(b, n, "auto");
            break;
        }
        snprintf(b, n, "%llu", (unsigned long long)v);
        for (int i = 0; i < 4 && v; i++) {
            uint64_t m = 1ull << (10 * (4 - i));
            if (v % m == 0) {
                snprintf(b, n, "%llu%s", (unsigned long long)(v / m), un[i]);
                break;
            }
        }
        break;
    }
    case PT_CFG_DUR: {
        char num[40];
        fmt_real(*(const double *)base, 1, num, sizeof(num));
        snprintf(b, n, "%ss", num);
        break;
    }
    case PT_CFG_RATE: {
        double v = *(const double *)base;
        static const char *const un[] = {"GiB/s", "MiB/s", "KiB/s"};
        char num[40];
        for (int i = 0; i < 3; i++) {
            double m = (double)(1ull << (10 * (3 - i))), q = v / m;
            if (v > 0 && q == floor(q) && q * m == v && q < 1e15) {
                snprintf(b, n, "%.0f%s", q, un[i]);
                return;
            }
        }
        fmt_real(v, 1, num, sizeof(num));
        snprintf(b, n, v == 0 ? "%s" : "%sB/s", num);
        break;
    }
    case PT_CFG_ENUM: {
        int v = *(const int *)base, i = 0;
        const char *p = k->choices;
        while (k->enum_vals[i] != v && strchr(p, '|')) p = strchr(p, '|') + 1, i++;
        snprintf(b, n, "%.*s", (int)strcspn(p, "|"), p);
        break;
    }
    default: snprintf(b, n, "%s", base); break;
    }
}

/* Some [testing] key differs from its default. */
static int testing_used(const pt_config *c) {
    pt_config d;
    char a[600], b[600];
    pt_config_defaults(&d);
    for (size_t i = 0; i < PT_CFG_NKEYS; i++) {
        if (!pt_config_is_testing(&pt_cfg_keys[i])) continue;
        fmt_value(&pt_cfg_keys[i], c, a, sizeof(a));
        fmt_value(&pt_cfg_keys[i], &d, b, sizeof(b));
        if (strcmp(a, b)) return 1;
    }
    return 0;
}

/* The [testing] section is written only when one of its keys is set: a
 * training configuration's dump then reads back without PROTRAIN_TESTING. */
int pt_config_dump(const pt_config *c, char *buf, size_t len) {
    if (!c || !buf || !len) return PT_ERR_INVALID_ARG;
    size_t o = 0;
    char v[600];
    int testing = testing_used(c);
    buf[0] = '\0';
    pt_config_put(buf, len, &o, "; protrain effective configuration (source: %s)\n", c->source);
    for (size_t i = 0; i < PT_CFG_NKEYS; i++) {
        if (pt_config_is_testing(&pt_cfg_keys[i]) && !testing) continue;
        if (!i || strcmp(pt_cfg_keys[i].section, pt_cfg_keys[i - 1].section))
            pt_config_put(buf, len, &o, "%s[%s]\n", i ? "\n" : "", pt_cfg_keys[i].section);
        fmt_value(&pt_cfg_keys[i], c, v, sizeof(v));
        pt_config_put(buf, len, &o, "%s =%s%s\n", pt_cfg_keys[i].key, *v ? " " : "", v);
    }
    return o >= len ? PT_ERR_INVALID_ARG : PT_OK;
}
