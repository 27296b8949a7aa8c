/*
 * sh_config.h — sample_host settings: built-in defaults, the [sample_host] section of
 * the INI file (other sections belong to the plugin and are ignored here), then
 * command-line flags, in that order of precedence (CLI wins).
 */
#ifndef SH_CONFIG_H
#define SH_CONFIG_H

#include <stddef.h>
#include <stdint.h>

#define SH_PATH 512

/* Bits of sh_config.cli_dims: model dims given on the command line (checked against
 * a --load checkpoint instead of being replaced by it). */
enum { SH_SET_VOCAB = 1,
       SH_SET_MAXT = 2,
       SH_SET_LAYERS = 4,
       SH_SET_HEADS = 8,
       SH_SET_CHANNELS = 16 };

/* sh_config.device */
enum { SH_DEVICE_CPU = 0,
       SH_DEVICE_CUDA = 1 };

typedef struct sh_config {
    /* model */
    int vocab, max_seq, layers, heads, channels;
    /* batch: micro-batch B x T, grad_accum micro-batches per optimizer step */
    int batch, seq, grad_accum;
    int steps;
    uint64_t seed;
    /* optimizer and schedule */
    int optim_from_ini;  /* 1: let the plugin's [optimizer] section decide (plugin only) */
    float lr, min_lr_frac, weight_decay, beta1, beta2, eps, max_grad_norm;
    int warmup;
    /* evaluation */
    int val_every, val_batches, gen_every, gen_len;
    float temperature;   /* <= 0: greedy */
    int log_every;
    /* I/O */
    char config[SH_PATH], plugin[SH_PATH], data[SH_PATH], metrics[SH_PATH];
    char load[SH_PATH], save[SH_PATH], write_shard[SH_PATH];
    int no_plugin, metrics_no_time;
    int progress;        /* -1 auto (TTY), 0 plain lines, 1 bar */
    int quiet;           /* no per-step output and no samples (tests) */
    unsigned cli_dims;   /* SH_SET_* bits */
    int device;          /* SH_DEVICE_*: where the layers run */
    char plugin_backend[16]; /* [plugin] backend of the INI ("" when absent) */
    char ini_optim_type[16]; /* [optimizer] type of the INI ("" when absent) */
    int optim_set;           /* optimizer given by 0: nobody, 1: [sample_host], 2: the flag */
    int optim_note;          /* 1: taken from [optimizer] type, 2: the flag overrode it */
    char plugin_sections[256]; /* the INI's sections other than [sample_host], "[a], [b]" */
    /* the files the plugin writes, from its INI sections (checked as outputs):
     * [protrain] plan_file, [protrain] timeline_file, [host_backend] trace_file */
    char plugin_outs[3][SH_PATH];
    char ini_lr[32];         /* [optimizer] lr of the INI ("" when absent) */
    int lr_set;              /* lr given by 1: [sample_host] lr, 2: --lr */
    int lr_note;             /* 1: the peak lr was taken from [optimizer] lr */
    /* checkpointing and resume (sh_resume.h) */
    char checkpoint_dir[SH_PATH]; /* "" = no generations written */
    int checkpoint_every;  /* steps between generations; 0 = only at the end */
    int checkpoint_keep;   /* complete generations kept (>= 1) */
    int resume;            /* continue from the newest valid generation */
    int stop_after;        /* stop (exit 0) after this step's generation; 0 = off */
    int on_nonfinite;      /* SH_NONFINITE_*: what a NaN/inf training loss does */
    /* testing knobs (PROTRAIN_TESTING=1 only): NaN gradients and loss at this
     * step (0 = off); pause between the files of a save */
    int debug_nan_step;
    int debug_save_sleep_ms;
    /* llm.c data (sh_llmc.h): SH_ORDER_*, SH_LR_*, validation file ("" = split --data) */
    int data_order, lr_schedule;
    char val_data[SH_PATH];
    /* data parallel, from the MPI launcher's environment (sh_dist.h) */
    int world, rank, local_rank;
} sh_config;

/* sh_config.on_nonfinite */
enum { SH_NONFINITE_STOP = 0,
       SH_NONFINITE_SKIP = 1 };

void sh_config_defaults(sh_config *c);
/* Read [sample_host] from path. Unknown key, bad value or duplicate -> error naming
 * path:line and the key. */
int sh_config_load_ini(sh_config *c, const char *path, char *err, size_t errlen);
/* Apply command-line flags (argv[1..]); --config is read first, then the other flags
 * override it. Returns 0, or 1 when --help was printed, or -1 with err. */
int sh_config_from_args(sh_config *c, int argc, char **argv, char *err, size_t errlen);
/* Cross-field checks (positive sizes, ranges). */
int sh_config_check(const sh_config *c, char *err, size_t errlen);
void sh_config_usage(void);
/* The testing knobs ([sample_host] keys accepted only with PROTRAIN_TESTING=1)
 * as a markdown table: what tests/README.md embeds. 0, or -1 when len is too
 * small. */
int sh_config_testing_markdown(char *buf, size_t len);

/* --no-plugin with an INI that has plugin sections: the plugin (loaded, init on
 * the INI with the simulated device, finalized) checks them, so an unknown key or a
 * bad value is refused as it would be with the plugin; the sections are then
 * named as not used. A plugin that cannot be loaded or started for another
 * reason leaves a warning that they were not checked. 0 or -1 with err. */
int sh_config_check_plugin_sections(const sh_config *c, char *err, size_t errlen);

#endif /* SH_CONFIG_H */
