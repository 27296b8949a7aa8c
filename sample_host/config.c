/*
 * config.c — defaults, [sample_host] INI section (inih) and command-line flags for
 * sample_host. One table drives both the INI keys and the flags.
 */
#include "sh_config.h"

#include <errno.h>
#include <ini.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

#include "sh_llmc.h"

enum { T_INT,
       T_U64,
       T_FLOAT,
       T_STR,
       T_OPTIM,
       T_PROGRESS,
       T_DEVICE,
       T_BOOL,
       T_NONFINITE,
       T_ORDER,
       T_SCHED };

typedef struct opt {
    const char *key;   /* INI key in [sample_host]; the flag is --key with '_' -> '-' */
    int type;
    size_t off;
    double lo, hi;     /* accepted range for numbers */
    unsigned setbit;   /* SH_SET_* for model dims */
    const char *help;
} opt;

/* Words of the keys that take one of a few words; a value is its word's index
 * (the enums in sh_config.h and sh_llmc.h). */
static const char *const ORDER_NAMES[] = {"random", "sequential", "shuffled", NULL};
static const char *const SCHED_NAMES[] = {"cosine", "constant", "linear", NULL};
static const char *const DEVICE_NAMES[] = {"cpu", "cuda", NULL};
static const char *const NONFINITE_NAMES[] = {"stop", "skip", NULL};
_Static_assert(SH_ORDER_SHUFFLED == 2 && SH_LR_LINEAR == 2 && SH_DEVICE_CUDA == 1 &&
                   SH_NONFINITE_SKIP == 1,
               "names are indexed by the enums");

static const char *const *words_of(int type) {
    switch (type) {
    case T_ORDER: return ORDER_NAMES;
    case T_SCHED: return SCHED_NAMES;
    case T_DEVICE: return DEVICE_NAMES;
    case T_NONFINITE: return NONFINITE_NAMES;
    default: return NULL;
    }
}

#define O(f) offsetof(sh_config, f)
static const opt OPTS[] = {
    {"vocab", T_INT, O(vocab), 1, 65536, SH_SET_VOCAB, "vocabulary size (256 = bytes)"},
    {"max_seq", T_INT, O(max_seq), 0, 1 << 20, SH_SET_MAXT, "position table rows (0 = seq)"},
    {"layers", T_INT, O(layers), 1, 4096, SH_SET_LAYERS, "transformer blocks L"},
    {"heads", T_INT, O(heads), 1, 4096, SH_SET_HEADS, "attention heads NH"},
    {"channels", T_INT, O(channels), 1, 65536, SH_SET_CHANNELS, "channels C"},
    {"batch", T_INT, O(batch), 1, 1 << 20, 0, "micro-batch size B"},
    {"seq", T_INT, O(seq), 1, 1 << 20, 0, "sequence length T"},
    {"grad_accum", T_INT, O(grad_accum), 1, 1 << 20, 0, "micro-batches per optimizer step"},
    {"steps", T_INT, O(steps), 0, 1e9, 0, "optimizer steps"},
    {"seed", T_U64, O(seed), 0, 0, 0, "seed of init, batches and sampling"},
    {"optimizer", T_OPTIM, O(optim_from_ini), 0, 0, 0,
     "adamw (settings below) | ini (plugin's [optimizer] section)"},
    {"lr", T_FLOAT, O(lr), 0, 10, 0, "peak learning rate"},
    {"min_lr_frac", T_FLOAT, O(min_lr_frac), 0, 1, 0, "cosine floor as a fraction of lr"},
    {"warmup", T_INT, O(warmup), 0, 1e9, 0, "linear warmup steps"},
    {"weight_decay", T_FLOAT, O(weight_decay), 0, 10, 0, "decoupled decay, all params"},
    {"beta1", T_FLOAT, O(beta1), 0, 0.999999, 0, "AdamW beta1"},
    {"beta2", T_FLOAT, O(beta2), 0, 0.999999, 0, "AdamW beta2"},
    {"eps", T_FLOAT, O(eps), 0, 1, 0, "AdamW epsilon"},
    {"max_grad_norm", T_FLOAT, O(max_grad_norm), 0, 1e30, 0, "global-norm clip (0 = off)"},
    {"val_every", T_INT, O(val_every), 0, 1e9, 0, "validation loss every N steps (0 = end)"},
    {"val_batches", T_INT, O(val_batches), 1, 1e6, 0, "batches per validation"},
    {"gen_every", T_INT, O(gen_every), 0, 1e9, 0, "sample text every N steps (0 = never)"},
    {"gen_len", T_INT, O(gen_len), 1, 1 << 20, 0, "tokens per sample"},
    {"temperature", T_FLOAT, O(temperature), 0, 100, 0, "sampling temperature (0 = greedy)"},
    {"log_every", T_INT, O(log_every), 1, 1e9, 0, "plain-line log period (steps)"},
    {"data", T_STR, O(data), 0, 0, 0, "text file or llm.c shard (default: repo text)"},
    {"metrics", T_STR, O(metrics), 0, 0, 0, "JSON-lines metrics file"},
    {"load", T_STR, O(load), 0, 0, 0, "llm.c checkpoint to start from"},
    {"save", T_STR, O(save), 0, 0, 0, "llm.c checkpoint written at the end"},
    {"plugin", T_STR, O(plugin), 0, 0, 0, "plugin path or short name"},
    {"progress", T_PROGRESS, O(progress), 0, 0, 0, "auto | on | off"},
    {"device", T_DEVICE, O(device), 0, 0, 0,
     "cpu | cuda (the model's layers on a CUDA GPU through libsample_cuda.so)"},
    {"checkpoint_dir", T_STR, O(checkpoint_dir), 0, 0, 0,
     "folder of resumable checkpoint generations (gen-STEP/)"},
    {"checkpoint_every", T_INT, O(checkpoint_every), 0, 1e9, 0,
     "steps between generations (0 = only at the end)"},
    {"checkpoint_keep", T_INT, O(checkpoint_keep), 1, 1e6, 0, "generations kept"},
    {"resume", T_BOOL, O(resume), 0, 0, 0,
     "true: continue from the newest valid generation (flag: --resume)"},
    {"stop_after", T_INT, O(stop_after), 0, 1e9, 0,
     "stop after this step, with a generation written (0 = off)"},
    {"on_nonfinite", T_NONFINITE, O(on_nonfinite), 0, 0, 0,
     "stop | skip: a NaN/inf loss stops the run, or skips its step (no plugin)"},
    /* testing knobs (tests/README.md lists them; --help and the user's docs do not) */
    {"debug_nan_step", T_INT, O(debug_nan_step), 0, 1e9, 0,
     "NaN gradients and loss at this step (0 = off), so a test sees a non-finite loss "
     "stop the run or skip its step"},
    {"debug_save_sleep_ms", T_INT, O(debug_save_sleep_ms), 0, 60000, 0,
     "pause in milliseconds between the files of a checkpoint save, which widens the "
     "window a test's kill lands in (0 = none)"},
    {"data_order", T_ORDER, O(data_order), 0, 0, 0,
     "random | sequential | shuffled (llm.c's loaders, sample_host/README.md)"},
    {"val_data", T_STR, O(val_data), 0, 0, 0, "validation file (default: last 10% of data)"},
    {"lr_schedule", T_SCHED, O(lr_schedule), 0, 0, 0, "cosine | constant | linear after warmup"},
};
#define NOPTS (sizeof OPTS / sizeof OPTS[0])

/* The rows above that are testing knobs. */
static const char *const TESTING_KEYS[] = {"debug_nan_step", "debug_save_sleep_ms"};

static int is_testing(const opt *o) {
    for (size_t i = 0; i < sizeof TESTING_KEYS / sizeof TESTING_KEYS[0]; i++)
        if (!strcmp(o->key, TESTING_KEYS[i])) return 1;
    return 0;
}

void sh_config_defaults(sh_config *c) {
    memset(c, 0, sizeof *c);
    c->vocab = 256;
    c->max_seq = 0;
    c->layers = 4;
    c->heads = 4;
    c->channels = 128;
    c->batch = 8;
    c->seq = 128;
    c->grad_accum = 1;
    c->steps = 300;
    c->seed = 1337;
    c->lr = 1e-3f;
    c->min_lr_frac = 0.1f;
    c->warmup = 20;
    c->weight_decay = 0.0f;
    c->beta1 = 0.9f;
    c->beta2 = 0.95f;
    c->eps = 1e-8f;
    c->max_grad_norm = 1.0f;
    c->val_every = 50;
    c->val_batches = 8;
    c->gen_every = 100;
    c->gen_len = 64;
    c->temperature = 0.8f;
    c->log_every = 10;
    snprintf(c->plugin, sizeof c->plugin, "protrain");
    c->progress = -1;
    c->checkpoint_keep = 2;
}

/* The testing knobs are for the test suite, as the plugin's [testing] section
 * is, and under the same rule: the environment must set PROTRAIN_TESTING=1.
 * Without it a key (what: "key 'x' in [sample_host]") or flag is refused with a
 * sentence naming it and the variable. 0 when accepted. */
static int testing_refused(const opt *o, const char *what, char *msg, size_t ml) {
    const char *v = getenv("PROTRAIN_TESTING");
    if (!is_testing(o) || (v && !strcmp(v, "1"))) return 0;
    snprintf(msg, ml, "%s is a testing knob (it makes sample_host misbehave on purpose); it is "
                      "accepted only when the environment sets PROTRAIN_TESTING=1, as the test suite "
                      "does",
             what);
    return -1;
}

/* Parse value into the field; one sentence into msg on failure. */
static int set_value(sh_config *c, const opt *o, const char *val, char *msg, size_t ml) {
    char *end = NULL;
    void *f = (char *)c + o->off;
    errno = 0;
    switch (o->type) {
    case T_INT: {
        long v = strtol(val, &end, 10);
        if (end == val || *end || errno || v < (long)o->lo || v > (long)o->hi) {
            snprintf(msg, ml, "'%s' = '%s' is not an integer in [%.0f, %.0f]", o->key, val,
                     o->lo, o->hi);
            return -1;
        }
        *(int *)f = (int)v;
        return 0;
    }
    case T_U64: {
        unsigned long long v = strtoull(val, &end, 0);
        if (end == val || *end || errno || val[0] == '-') {
            snprintf(msg, ml, "'%s' = '%s' is not an unsigned integer", o->key, val);
            return -1;
        }
        *(uint64_t *)f = (uint64_t)v;
        return 0;
    }
    case T_FLOAT: {
        double v = strtod(val, &end);
        if (end == val || *end || !isfinite(v) || v < o->lo || v > o->hi) {
            snprintf(msg, ml, "'%s' = '%s' is not a number in [%g, %g]", o->key, val, o->lo,
                     o->hi);
            return -1;
        }
        *(float *)f = (float)v;
        return 0;
    }
    case T_STR:
        if (strlen(val) >= SH_PATH) {
            snprintf(msg, ml, "'%s' value is longer than %d characters", o->key, SH_PATH - 1);
            return -1;
        }
        snprintf((char *)f, SH_PATH, "%s", val);
        return 0;
    case T_OPTIM:
        if (strcmp(val, "adamw") == 0) *(int *)f = 0;
        else if (strcmp(val, "ini") == 0) *(int *)f = 1;
        else {
            snprintf(msg, ml, "'%s' = '%s' must be adamw or ini", o->key, val);
            return -1;
        }
        return 0;
    case T_PROGRESS:
        if (strcmp(val, "auto") == 0) *(int *)f = -1;
        else if (strcmp(val, "on") == 0) *(int *)f = 1;
        else if (strcmp(val, "off") == 0) *(int *)f = 0;
        else {
            snprintf(msg, ml, "'%s' = '%s' must be auto, on or off", o->key, val);
            return -1;
        }
        return 0;
    case T_BOOL:
        if (!strcmp(val, "true") || !strcmp(val, "yes") || !strcmp(val, "on") || !strcmp(val, "1"))
            *(int *)f = 1;
        else if (!strcmp(val, "false") || !strcmp(val, "no") || !strcmp(val, "off") ||
                 !strcmp(val, "0"))
            *(int *)f = 0;
        else {
            snprintf(msg, ml, "'%s' = '%s' must be true or false", o->key, val);
            return -1;
        }
        return 0;
    case T_DEVICE:
    case T_NONFINITE:
    case T_ORDER:
    case T_SCHED: {
        const char *const *names = words_of(o->type);
        char words[128] = "";
        for (int k = 0; names[k]; k++) {
            if (strcmp(val, names[k]) == 0) {
                *(int *)f = k;
                return 0;
            }
            snprintf(words + strlen(words), sizeof words - strlen(words), "%s%s",
                     k ? (names[k + 1] ? ", " : " or ") : "", names[k]);
        }
        snprintf(msg, ml, "'%s' = '%s' must be %s", o->key, val, words);
        return -1;
    }
    }
    return -1;
}

static const opt *find_key(const char *key) {
    for (size_t i = 0; i < NOPTS; i++)
        if (strcmp(OPTS[i].key, key) == 0) return &OPTS[i];
    return NULL;
}

typedef struct ini_ud {
    sh_config *c;
    unsigned char seen[NOPTS];
    char msg[384];   /* first error (inih reports its line) */
} ini_ud;

static int on_ini(void *user, const char *section, const char *name, const char *value) {
    ini_ud *u = user;
    /* the plugin's backend, remembered so a cuda host can refuse a host-backend plugin */
    if (strcmp(section, "plugin") == 0 && strcmp(name, "backend") == 0)
        snprintf(u->c->plugin_backend, sizeof u->c->plugin_backend, "%s", value);
    /* the optimizer the INI asks the plugin for: sample_host's own default must
     * not silently replace it (sh_config_from_args resolves the two) */
    if (strcmp(section, "optimizer") == 0 && strcmp(name, "type") == 0)
        snprintf(u->c->ini_optim_type, sizeof u->c->ini_optim_type, "%s", value);
    /* the peak lr the INI gives the plugin: sample_host's schedule sets the lr
     * every step, so the two are resolved (resolve_lr) */
    if (strcmp(section, "optimizer") == 0 && strcmp(name, "lr") == 0)
        snprintf(u->c->ini_lr, sizeof u->c->ini_lr, "%s", value);
    /* files the plugin will write: checked with sample_host's own outputs */
    static const char *const outs[3][2] = {{"protrain", "plan_file"},
                                           {"protrain", "timeline_file"},
                                           {"host_backend", "trace_file"}};
    for (int k = 0; k < 3; k++)
        if (strcmp(section, outs[k][0]) == 0 && strcmp(name, outs[k][1]) == 0)
            snprintf(u->c->plugin_outs[k], SH_PATH, "%s", value);
    if (strcmp(section, "sample_host") != 0) {
        /* the plugin's sections, remembered by name (--no-plugin has them checked) */
        char tag[80];
        snprintf(tag, sizeof tag, "[%.64s]", section);
        char *have = u->c->plugin_sections;
        size_t used = strlen(have);
        if (!strstr(have, tag) && used + strlen(tag) + 3 < sizeof u->c->plugin_sections)
            snprintf(have + used, sizeof u->c->plugin_sections - used, "%s%s", used ? ", " : "",
                     tag);
        return 1;
    }
    if (u->msg[0]) return 0;
    const opt *o = find_key(name);
    if (!o) {
        snprintf(u->msg, sizeof u->msg, "unknown key '%s' in [sample_host] (see "
                                        "sample_host/README.md)",
                 name);
        return 0;
    }
    char what[120];
    snprintf(what, sizeof what, "key '%s' in [sample_host]", name);
    if (testing_refused(o, what, u->msg, sizeof u->msg)) return 0;
    size_t i = (size_t)(o - OPTS);
    if (u->seen[i]) {
        snprintf(u->msg, sizeof u->msg, "duplicate key '%s' in [sample_host]", name);
        return 0;
    }
    u->seen[i] = 1;
    if (o->type == T_OPTIM) u->c->optim_set = 1;
    if (o->off == O(lr)) u->c->lr_set = 1;
    return set_value(u->c, o, value, u->msg, sizeof u->msg) == 0;
}

/* inih reads a line into a fixed buffer of INI_MAX_LINE bytes and silently
 * drops the rest of a longer one (a long path would be cut short without a
 * word): such a line is an error naming it, found before inih sees the file. */
static int long_line(const char *path, char *err, size_t errlen) {
    FILE *f = fopen(path, "r");
    if (!f) return 0;   /* ini_parse reports the open failure */
    int line = 1, len = 0, ch, rc = 0;
    while ((ch = fgetc(f)) != EOF) {
        if (ch == '\n') {
            line++;
            len = 0;
        } else if (++len >= INI_MAX_LINE - 1) {
            snprintf(err, errlen, "%s:%d: line longer than %d characters (the INI reader would "
                                  "cut it short)",
                     path, line, INI_MAX_LINE - 2);
            rc = -1;
            break;
        }
    }
    fclose(f);
    return rc;
}

/* The file must be a regular file of at most 1 MiB: opening a FIFO would wait
 * for a writer and a device such as /dev/zero never ends, so both are refused
 * before anything opens the path (stat does not open it). */
static int not_a_config(const char *path, char *err, size_t errlen) {
    struct stat sb;
    if (stat(path, &sb)) return 0;   /* ini_parse reports why it cannot open it */
    if (!S_ISREG(sb.st_mode)) {
        snprintf(err, errlen, "cannot read config file %s: it is not a regular file (%s)", path,
                 S_ISFIFO(sb.st_mode) ? "a FIFO" : S_ISDIR(sb.st_mode)                      ? "a directory"
                                               : S_ISCHR(sb.st_mode) || S_ISBLK(sb.st_mode) ? "a device"
                                                                                            : "not a plain file");
        return -1;
    }
    if (sb.st_size > (1 << 20)) {
        snprintf(err, errlen, "config file %s is %lld bytes; a configuration file may be at most "
                              "1048576 bytes (1 MiB)",
                 path, (long long)sb.st_size);
        return -1;
    }
    return 0;
}

int sh_config_load_ini(sh_config *c, const char *path, char *err, size_t errlen) {
    ini_ud u;
    memset(&u, 0, sizeof u);
    u.c = c;
    if (not_a_config(path, err, errlen) || long_line(path, err, errlen)) return -1;
    int rc = ini_parse(path, on_ini, &u);
    if (rc == -1) {
        snprintf(err, errlen, "cannot open config file %s: %s", path, strerror(errno));
        return -1;
    }
    if (rc == -2) {
        snprintf(err, errlen, "out of memory parsing config file %s", path);
        return -1;
    }
    if (rc > 0) {
        snprintf(err, errlen, "%s:%d: %s", path, rc,
                 u.msg[0] ? u.msg : "syntax error (expected 'key = value' or '[section]')");
        return -1;
    }
    return 0;
}

void sh_config_usage(void) {
    printf("usage: sample_host [flags]\n"
           "  --config FILE        INI file: [sample_host] keys below, other sections go to "
           "the plugin\n"
           "  --no-plugin          train without the plugin (own AdamW, plain allocations)\n"
           "  --device cpu|cuda    where the layers run (also [sample_host] device)\n"
           "  --metrics-no-time    write tok_s as null (bit-comparable metrics files)\n"
           "  --write-shard OUT    convert --data text (or the default corpus) to an llm.c "
           "shard and exit\n"
           "  --quiet              no per-step lines and no samples\n"
           "  --resume             continue from the newest valid generation in "
           "--checkpoint-dir\n"
           "  --help\n"
           "flags mirroring [sample_host] keys (--key VALUE or --key=VALUE):\n");
    for (size_t i = 0; i < NOPTS; i++) {
        if (is_testing(&OPTS[i])) continue;
        char flag[64];
        snprintf(flag, sizeof flag, "--%s", OPTS[i].key);
        for (char *p = flag + 2; *p; p++)
            if (*p == '_') *p = '-';
        printf("  %-20s %s\n", flag, OPTS[i].help);
    }
}

/* Match argv[*i] against --name (or --name=VALUE); fetch the value. */
static int match(const char *arg, const char *name, int argc, char **argv, int *i,
                 const char **val) {
    size_t n = strlen(name);
    if (strncmp(arg, name, n) != 0) return 0;
    if (arg[n] == '=') {
        *val = arg + n + 1;
        return 1;
    }
    if (arg[n] != '\0') return 0;
    if (*i + 1 >= argc) {
        *val = NULL;
        return 1;
    }
    *val = argv[++*i];
    return 1;
}

/* The INI's [optimizer] type against sample_host's optimizer key. sample_host's
 * default (its own AdamW settings) must not replace a type the INI names: with
 * nobody choosing, the INI's section decides (optimizer = ini); an explicit
 * --optimizer adamw wins and is said (optim_note); [sample_host] optimizer =
 * adamw in the same file as [optimizer] type = rekls contradicts itself. */
static int resolve_optimizer(sh_config *c, char *err, size_t errlen) {
    const char *t = c->ini_optim_type;
    if (!t[0] || strcasecmp(t, "adamw") == 0) return 0;
    if (c->no_plugin) {
        snprintf(err, errlen, "%s sets [optimizer] type = %s, but --no-plugin trains with "
                              "sample_host's own AdamW (drop --no-plugin, or the [optimizer] type)",
                 c->config, t);
        return -1;
    }
    if (c->optim_from_ini) return 0;
    if (c->optim_set == 0) {
        c->optim_from_ini = 1;
        c->optim_note = 1;
    } else if (c->optim_set == 1) {
        snprintf(err, errlen, "%s sets both [sample_host] optimizer = adamw and [optimizer] "
                              "type = %s: remove one (optimizer = ini takes the [optimizer] section)",
                 c->config, t);
        return -1;
    } else {
        c->optim_note = 2;
    }
    return 0;
}

/* The name of a command-line option ("--steps" of "--steps=3"), 0 when a is
 * not an option (a value). */
static size_t opt_name(const char *a) {
    if (strncmp(a, "--", 2) != 0 || !a[2]) return 0;
    return strcspn(a, "=");
}

/* The value of the option at argv[i] (name length n): after '=', or the next
 * argument. */
static const char *opt_value(int argc, char **argv, int i, size_t n) {
    if (argv[i][n] == '=') return argv[i] + n + 1;
    return i + 1 < argc ? argv[i + 1] : "";
}

/* An option given twice (--steps 2 --steps 3): the later one wins, as scripts
 * that add an override to a common argument list rely on, and a note names
 * both values, so it is never a silent choice. --config twice is refused: the
 * settings would come from both files but the plugin would read only the
 * last. The walk follows the parser: an option that takes a value consumes
 * the next argument unless it is written --key=VALUE. */
static int repeated(int argc, char **argv, char *err, size_t errlen) {
    static const char *const bare[] = {"--no-plugin", "--metrics-no-time", "--quiet", "--resume",
                                       "--help"};
    int first[64], nseen = 0;
    for (int i = 1; i < argc; i++) {
        size_t n = opt_name(argv[i]);
        if (!n) continue;
        int idx = i, takes = argv[i][n] != '=', is_bare = 0;
        for (size_t b = 0; b < sizeof bare / sizeof bare[0]; b++)
            if (strlen(bare[b]) == n && !strncmp(argv[i], bare[b], n)) is_bare = 1;
        if (is_bare) takes = 0;
        if (takes) i++;
        int k = 0;
        while (k < nseen && !(opt_name(argv[first[k]]) == n && !strncmp(argv[first[k]], argv[idx], n)))
            k++;
        if (k == nseen) {
            if (nseen < 64) first[nseen++] = idx;
            continue;
        }
        if (is_bare) continue;   /* the same switch twice: one meaning */
        const char *v0 = opt_value(argc, argv, first[k], n), *v1 = opt_value(argc, argv, idx, n);
        if (n == 8 && !strncmp(argv[idx], "--config", 8)) {
            snprintf(err, errlen, "command line: --config is given twice (%s and %s): "
                                  "sample_host would take settings from both but the plugin reads one file; "
                                  "give one",
                     v0, v1);
            return -1;
        }
        if (strcmp(v0, v1) != 0)
            fprintf(stderr, "sample_host: note: %.*s is given twice (%s, then %s): the last, "
                            "%s, is used\n",
                    (int)n, argv[idx], v0, v1, v1);
        first[k] = idx;
    }
    return 0;
}

/* optimizer = ini: the plugin's [optimizer] lr against sample_host's lr. The
 * schedule (warmup, decay) is sample_host's and sets the plugin's lr at every
 * step from its own peak, so [optimizer] lr alone would be replaced without a
 * word: it becomes the peak; both given and different is refused. */
static int resolve_lr(sh_config *c, char *err, size_t errlen) {
    if (!c->optim_from_ini || !c->ini_lr[0]) return 0;
    char *end = NULL;
    double v = strtod(c->ini_lr, &end);
    if (end == c->ini_lr || *end || !isfinite(v) || v <= 0 || v > 10)
        return 0;   /* the plugin refuses a bad value with its own sentence */
    if (!c->lr_set) {
        c->lr = (float)v;
        c->lr_note = 1;
        return 0;
    }
    if ((float)v != c->lr) {
        snprintf(err, errlen, "%s sets [optimizer] lr = %s, and sample_host's lr is %g (%s): "
                              "with optimizer = ini sample_host's schedule still sets the plugin's learning "
                              "rate every step from its own lr, so one of them would be ignored; remove one",
                 c->config, c->ini_lr, (double)c->lr,
                 c->lr_set == 2 ? "--lr" : "[sample_host] lr");
        return -1;
    }
    return 0;
}

int sh_config_from_args(sh_config *c, int argc, char **argv, char *err, size_t errlen) {
    if (repeated(argc, argv, err, errlen)) return -1;
    /* pass 1: --help and --config, so the file is read before the other flags apply */
    for (int i = 1; i < argc; i++) {
        const char *v = NULL;
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            sh_config_usage();
            return 1;
        }
        if (match(argv[i], "--config", argc, argv, &i, &v)) {
            if (!v) {
                snprintf(err, errlen, "flag --config needs a value");
                return -1;
            }
            snprintf(c->config, sizeof c->config, "%s", v);
            if (sh_config_load_ini(c, v, err, errlen)) return -1;
        }
    }
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = NULL;
        if (strcmp(a, "--no-plugin") == 0) {
            c->no_plugin = 1;
            continue;
        }
        if (strcmp(a, "--metrics-no-time") == 0) {
            c->metrics_no_time = 1;
            continue;
        }
        if (strcmp(a, "--quiet") == 0) {
            c->quiet = 1;
            continue;
        }
        if (strcmp(a, "--resume") == 0) {
            c->resume = 1;
            continue;
        }
        if (match(a, "--config", argc, argv, &i, &v)) continue;
        if (match(a, "--write-shard", argc, argv, &i, &v)) {
            if (!v || strlen(v) >= SH_PATH) {
                snprintf(err, errlen, "flag --write-shard needs a path value");
                return -1;
            }
            snprintf(c->write_shard, sizeof c->write_shard, "%s", v);
            continue;
        }
        int done = 0;
        for (size_t k = 0; k < NOPTS && !done; k++) {
            char flag[64];
            snprintf(flag, sizeof flag, "--%s", OPTS[k].key);
            for (char *p = flag + 2; *p; p++)
                if (*p == '_') *p = '-';
            if (!match(a, flag, argc, argv, &i, &v)) continue;
            if (!v) {
                snprintf(err, errlen, "flag %s needs a value", flag);
                return -1;
            }
            char msg[384], what[80];
            snprintf(what, sizeof what, "flag %s", flag);
            if (testing_refused(&OPTS[k], what, msg, sizeof msg) ||
                set_value(c, &OPTS[k], v, msg, sizeof msg)) {
                snprintf(err, errlen, "command line: %s", msg);
                return -1;
            }
            c->cli_dims |= OPTS[k].setbit;
            if (OPTS[k].type == T_OPTIM) c->optim_set = 2;
            if (OPTS[k].off == O(lr)) c->lr_set = 2;
            done = 1;
        }
        if (!done) {
            snprintf(err, errlen, "unknown command-line argument '%s' (try --help)", a);
            return -1;
        }
    }
    if (resolve_optimizer(c, err, errlen)) return -1;
    return resolve_lr(c, err, errlen);
}

int sh_config_check(const sh_config *c, char *err, size_t errlen) {
    int maxT = c->max_seq ? c->max_seq : c->seq;
    if (c->seq > maxT) {
        snprintf(err, errlen, "seq (%d) is longer than max_seq (%d)", c->seq, maxT);
        return -1;
    }
    if (c->channels % c->heads != 0) {
        snprintf(err, errlen, "channels (%d) must be a multiple of heads (%d)", c->channels,
                 c->heads);
        return -1;
    }
    if (c->resume && !c->checkpoint_dir[0]) {
        snprintf(err, errlen, "resume needs checkpoint_dir (--checkpoint-dir DIR): the folder "
                              "of the generations to continue from");
        return -1;
    }
    if (c->stop_after && !c->checkpoint_dir[0]) {
        snprintf(err, errlen, "stop_after needs checkpoint_dir: the run would stop with "
                              "nothing to resume from");
        return -1;
    }
    if (c->on_nonfinite == SH_NONFINITE_SKIP && !c->no_plugin) {
        snprintf(err, errlen, "on_nonfinite = skip needs --no-plugin: the plugin has no hook "
                              "to drop a step (it steps offloaded chunks while backward runs), so use "
                              "stop with the plugin");
        return -1;
    }
    if ((double)c->batch * c->seq > 1e8) {
        snprintf(err, errlen, "batch x seq = %.0f tokens is too large", (double)c->batch * c->seq);
        return -1;
    }
    return 0;
}

int sh_config_testing_markdown(char *buf, size_t len) {
    if (!buf || !len) return -1;
    size_t o = (size_t)snprintf(buf, len, "### [sample_host] (testing keys)\n\n"
                                          "| key | flag | accepted values | default | meaning |\n"
                                          "|---|---|---|---|---|\n");
    sh_config d;
    sh_config_defaults(&d);
    size_t rows = 0;
    for (size_t i = 0; i < NOPTS && o < len; i++) {
        const opt *k = &OPTS[i];
        if (!is_testing(k)) continue;
        rows++;
        char flag[64];
        snprintf(flag, sizeof flag, "--%s", k->key);
        for (char *p = flag + 2; *p; p++)
            if (*p == '_') *p = '-';
        /* every testing knob is an integer (T_INT); another type needs its words here */
        if (k->type != T_INT) return -1;
        o += (size_t)snprintf(buf + o, len - o, "| `%s` | `%s` | an integer in [%.0f, %.0f] | "
                                                "`%d` | %s |\n",
                              k->key, flag, k->lo, k->hi,
                              *(const int *)((const char *)&d + k->off), k->help);
    }
    /* a name in TESTING_KEYS that no row has would leave that row ungated */
    if (rows != sizeof TESTING_KEYS / sizeof TESTING_KEYS[0]) return -1;
    return o < len ? 0 : -1;
}
