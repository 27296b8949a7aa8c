/*
 * test_resume.c — sample_host checkpoint generations and --resume ("nothing lost").
 *
 * A run of STEPS steps (2 micro-batches, clipping, weight decay, validation and
 * sampled text on) interrupted after step k and resumed must give the uninterrupted
 * run's per-step losses and learning rates bit for bit (metrics lines up to tok_s,
 * printed with 17 digits) and byte-identical final parameters (--save):
 *  - in process (sh_run) with the plugin under a resident plan, a streamed one
 *    (n_persist = 0: every chunk offloaded, CPU AdamW) and CKPT + SWAP, and without
 *    the plugin (the host's own AdamW state in the generation);
 *  - across a plan change between the halves (saved under one INI, resumed under
 *    another);
 *  - with the built binary SIGKILLed at pseudo-random moments several times in a row
 *    (saves slowed by debug_save_sleep_ms so that some kills land inside one), resumed
 *    each time; afterwards no *.tmp.* folder is left and at most checkpoint_keep
 *    generations remain;
 *  - a corrupt newest generation (a flipped manifest byte, a truncated state file, a
 *    flipped byte inside the plugin's state file) is skipped with a warning naming it
 *    and the previous one is used (the validation losses and sampled text printed
 *    after the resume equal an uninterrupted binary run's); a generation of a
 *    different run is refused naming the setting; all generations corrupt is an error;
 *  - a generation that mixes (another generation's or another run's plugin state
 *    file copied in, host state with a negative count, NaN or -inf whose checksums
 *    were made valid) is refused naming the file and what differs, and a normal
 *    resume says nothing about "saved with" settings.
 * A NaN loss (debug_nan_step) stops the run with exit status 1 and a sentence naming
 * the step, with no generation written after it; on_nonfinite = skip (no plugin)
 * skips and counts that step.
 * With data_order = sequential or shuffled (epochs wrapping before and after the stop)
 * a resumed run is identical too, and resuming under another order is refused.
 */
#include <dirent.h>
#include <math.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "test_files.h"

#include "sh_config.h"
#include "sh_run.h"

#define STEPS 8

static char DIR_[64], TEXT[300], PLUGIN[480], EXE[480];
static char INI_RES[300], INI_STR[300], INI_CKS[300];
static char REF_P[300], REF_H[300], REF_P_SAVE[300], REF_H_SAVE[300];

static void write_ini(char *path, const char *name, const char *protrain) {
    snprintf(path, 300, "%s/%s.ini", DIR_, name);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fprintf(f, "[plugin]\nlog_level = warn\nbackend = host\n[memory]\ndevice_capacity = 1GiB\n"
               "[protrain]\n%s\n", protrain);
    assert_int_equal(fclose(f), 0);
}

static int setup(void **st) {
    (void)st;
    snprintf(DIR_, sizeof DIR_, "/tmp/test_resume.XXXXXX");
    if (!mkdtemp(DIR_)) return -1;
    snprintf(TEXT, sizeof TEXT, "%s/text.txt", DIR_);
    FILE *f = fopen(TEXT, "w");
    if (!f) return -1;
    for (int i = 0; i < 400; i++)
        fprintf(f, "the quick brown fox %d jumps over the lazy dog. ", i % 17);
    if (fclose(f)) return -1;
    const char *b = getenv("PT_BUILD");
    snprintf(PLUGIN, sizeof PLUGIN, "%s/protrain_plugin.so", b ? b : "build");
    snprintf(EXE, sizeof EXE, "%s/sample_host", b ? b : "build");
    write_ini(INI_RES, "res", "force_all_persistent = true\nn_checkpoint = 0\nn_swap = 0");
    /* every chunk offloaded and streamed through buffers; the CPU steps them */
    write_ini(INI_STR, "str", "auto_memory = false\nchunk_size = 16KiB\nn_persist = 0\n"
                              "n_buffer = 6\nn_swap = 0\nn_checkpoint = 0");
    write_ini(INI_CKS, "cks", "force_all_persistent = true\nn_checkpoint = 1\nn_swap = 1");
    return 0;
}

static int teardown(void **st) {
    (void)st;
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", DIR_);
    return system(cmd) == 0 ? 0 : -1;
}

static char *path_in(char *buf, const char *name) {
    snprintf(buf, 300, "%s/%s", DIR_, name);
    return buf;
}

/* ---- in process ---- */

/* One model for every case: small, with everything that draws or carries state on. */
static void cfg(sh_config *c, const char *ini, const char *metrics, const char *save,
                const char *ckdir) {
    sh_config_defaults(c);
    c->layers = 2; c->heads = 2; c->channels = 32; c->seq = 16; c->batch = 4;
    c->grad_accum = 2; c->steps = STEPS; c->seed = 11; c->lr = 3e-3f; c->warmup = 2;
    c->weight_decay = 0.1f; c->max_grad_norm = 0.5f; c->val_every = 3; c->val_batches = 2;
    c->gen_every = 3; c->gen_len = 6; c->metrics_no_time = 1; c->quiet = 1;
    snprintf(c->data, sizeof c->data, "%s", TEXT);
    snprintf(c->metrics, sizeof c->metrics, "%s", metrics);
    if (save) snprintf(c->save, sizeof c->save, "%s", save);
    if (ini) {
        snprintf(c->config, sizeof c->config, "%s", ini);
        snprintf(c->plugin, sizeof c->plugin, "%s", PLUGIN);
    } else {
        c->no_plugin = 1;
    }
    if (ckdir) {
        snprintf(c->checkpoint_dir, sizeof c->checkpoint_dir, "%s", ckdir);
        c->checkpoint_every = 2;
    }
}

static void run_ok(const sh_config *c) {
    char err[1024] = "";
    int rc = sh_run(c, err, sizeof err);
    if (rc) fprintf(stderr, "sh_run: %s\n", err);
    assert_int_equal(rc, 0);
}

/* Metrics lines cut before "tok_s": step, loss (17 digits) and lr only, which do not
 * depend on the plan (dev_peak does). Returns the number of lines. */
static int losses(const char *metrics, char *out, size_t n) {
    char *t = pt_test_slurp(metrics);
    assert_non_null(t);
    int lines = 0;
    out[0] = '\0';
    for (char *p = t; *p;) {
        char *nl = strchr(p, '\n');
        assert_non_null(nl);
        char *cut = strstr(p, ",\"tok_s\"");
        assert_true(cut && cut < nl);
        size_t used = strlen(out);
        snprintf(out + used, n - used, "%.*s\n", (int)(cut - p), p);
        lines++;
        p = nl + 1;
    }
    free(t);
    return lines;
}

static void expect_same_run(const char *tag, const char *ref_metrics, const char *ref_save,
                            const char *metrics, const char *save) {
    static char a[8192], b[8192];
    int na = losses(ref_metrics, a, sizeof a), nb = losses(metrics, b, sizeof b);
    assert_int_equal(na, STEPS);
    assert_int_equal(nb, STEPS);
    if (strcmp(a, b) != 0) fprintf(stderr, "%s: losses differ\n--- ref\n%s--- got\n%s", tag, a, b);
    assert_string_equal(a, b);
    char *x = pt_test_slurp(ref_save), *y = pt_test_slurp(save);
    struct stat sa, sb;
    assert_int_equal(stat(ref_save, &sa), 0);
    assert_int_equal(stat(save, &sb), 0);
    assert_int_equal(sa.st_size, sb.st_size);
    assert_memory_equal(x, y, (size_t)sa.st_size);
    free(x);
    free(y);
}

static void ensure_refs(void) {
    static int done;
    if (done) return;
    sh_config c;
    cfg(&c, INI_RES, path_in(REF_P, "ref_p.jsonl"), path_in(REF_P_SAVE, "ref_p.bin"), NULL);
    run_ok(&c);
    cfg(&c, NULL, path_in(REF_H, "ref_h.jsonl"), path_in(REF_H_SAVE, "ref_h.bin"), NULL);
    run_ok(&c);
    done = 1;
}

/* Count entries of dir whose name contains `part`. */
static int count_entries(const char *dir, const char *part) {
    DIR *d = opendir(dir);
    if (!d) return 0;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) n += strstr(e->d_name, part) != NULL;
    closedir(d);
    return n;
}

/* STEPS steps as two processes' worth of sh_run: stop after step k under ini1, then
 * resume under ini2 (NULL twice: no plugin). */
static void interrupted(const char *tag, const char *ini1, const char *ini2, int k) {
    ensure_refs();
    char m[300], s[300], ck[300], name[64];
    snprintf(name, sizeof name, "%s.jsonl", tag);
    path_in(m, name);
    snprintf(name, sizeof name, "%s.bin", tag);
    path_in(s, name);
    snprintf(name, sizeof name, "%s.ck", tag);
    path_in(ck, name);
    sh_config c;
    cfg(&c, ini1, m, s, ck);
    c.stop_after = k;
    run_ok(&c);
    struct stat sb;
    assert_int_not_equal(stat(s, &sb), 0); /* stopped early: no final --save */
    cfg(&c, ini2, m, s, ck);
    c.resume = 1;
    run_ok(&c);
    expect_same_run(tag, ini1 ? REF_P : REF_H, ini1 ? REF_P_SAVE : REF_H_SAVE, m, s);
    /* the final generation and one before it (checkpoint_keep = 2), nothing else */
    assert_int_equal(count_entries(ck, "gen-"), 2);
    assert_int_equal(count_entries(ck, "gen-00000008"), 1);
    printf("  %-22s stop after %d, resume: %d losses and the parameters identical\n", tag, k,
           STEPS);
}

static long long dev_peak(const char *metrics) {
    char *t = pt_test_slurp(metrics);
    assert_non_null(t);
    const char *p = strstr(t, "\"dev_peak\":");
    assert_non_null(p);
    long long v = atoll(p + 11);
    free(t);
    return v;
}

static void test_resident(void **st) {
    (void)st;
    interrupted("resident", INI_RES, INI_RES, 3);
}

static void test_streamed(void **st) {
    (void)st;
    interrupted("streamed", INI_STR, INI_STR, 4);
    /* the plan took effect: streaming the chunks lowers the device peak */
    char m[300];
    assert_true(dev_peak(path_in(m, "streamed.jsonl")) < dev_peak(REF_P));
}

static void test_ckpt_swap(void **st) {
    (void)st;
    interrupted("ckpt_swap", INI_CKS, INI_CKS, 5);
}

static void test_plan_change(void **st) {
    (void)st;
    interrupted("resident_to_streamed", INI_RES, INI_STR, 3);
    interrupted("streamed_to_ckpt_swap", INI_STR, INI_CKS, 5);
}

static void test_no_plugin(void **st) {
    (void)st;
    interrupted("no_plugin", NULL, NULL, 3);
}

/* ---- the binary ---- */

static void need_exe(void) {
    if (access(EXE, X_OK) != 0) {
        printf("  %s not built: skipped\n", EXE);
        skip();
    }
}

/* The same settings as cfg() with the plugin, as flags. */
static void bin_args(char *buf, size_t n, const char *ini, const char *metrics, const char *save,
                     const char *ck, const char *extra) {
    snprintf(buf, n, "--layers 2 --heads 2 --channels 32 --seq 16 --batch 4 --grad-accum 2 "
             "--steps %d --seed 11 --lr 3e-3 --warmup 2 --weight-decay 0.1 --max-grad-norm 0.5 "
             "--val-every 3 --val-batches 2 --gen-every 3 --gen-len 6 --metrics-no-time "
             "--progress off --data '%s' --metrics '%s' --save '%s' --checkpoint-dir '%s' "
             "%s%s%s %s", STEPS, TEXT, metrics, save, ck,
             ini ? "--config '" : "--no-plugin", ini ? ini : "", ini ? "'" : "", extra);
    if (ini) {
        size_t u = strlen(buf);
        snprintf(buf + u, n - u, " --plugin '%s'", PLUGIN);
    }
}

/* Run to the end; output into log; the exit status. */
static int run_bin(const char *args, const char *log) {
    char cmd[4000];
    snprintf(cmd, sizeof cmd, "'%s' %s > '%s' 2>&1", EXE, args, log);
    int rc = system(cmd);
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : 128;
}

/* Step of the newest complete generation in ck (0: none). */
static int newest(const char *ck) {
    DIR *d = opendir(ck);
    int best = 0;
    struct dirent *e;
    while (d && (e = readdir(d)) != NULL) {
        int s;
        char rest;
        if (sscanf(e->d_name, "gen-%d%c", &s, &rest) == 1 && s > best) best = s;
    }
    if (d) closedir(d);
    return best;
}

static pid_t spawn_bin(const char *args, const char *log) {
    char cmd[4000];
    /* exec: the pid killed is sample_host itself, not a shell */
    snprintf(cmd, sizeof cmd, "exec '%s' %s > '%s' 2>&1", EXE, args, log);
    fflush(stdout);
    pid_t p = fork();
    assert_true(p >= 0);
    if (p == 0) {
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    return p;
}

/* data_order = sequential and shuffled: the loaders' position (epoch, window) is in
 * the generation. The data holds 5 windows of B*T+1 tokens and a run draws 16, so the
 * order wraps into new epochs (a new permutation each) before and after the stop. */
static void ordered_case(const char *tag, int order, const char *ini) {
    char small[300], m[300], s[300], rm[300], rs[300], ck[300], name[64];
    path_in(small, "small.txt");
    FILE *f = fopen(small, "w");
    assert_non_null(f);
    for (int i = 0; i < 12; i++) fprintf(f, "%d: lazy dogs and quick foxes. ", i % 10);
    assert_int_equal(fclose(f), 0);
    snprintf(name, sizeof name, "%s_ref.jsonl", tag);
    path_in(rm, name);
    snprintf(name, sizeof name, "%s_ref.bin", tag);
    path_in(rs, name);
    snprintf(name, sizeof name, "%s.jsonl", tag);
    path_in(m, name);
    snprintf(name, sizeof name, "%s.bin", tag);
    path_in(s, name);
    snprintf(name, sizeof name, "%s.ck", tag);
    path_in(ck, name);
    sh_config c;
    cfg(&c, ini, rm, rs, NULL);
    snprintf(c.data, sizeof c.data, "%s", small);
    c.data_order = order;
    run_ok(&c);
    cfg(&c, ini, m, s, ck);
    snprintf(c.data, sizeof c.data, "%s", small);
    c.data_order = order;
    c.stop_after = 3; /* 6 windows drawn: inside epoch 1 */
    run_ok(&c);
    /* another order than the generation's is refused, naming the setting */
    cfg(&c, ini, m, s, ck);
    snprintf(c.data, sizeof c.data, "%s", small);
    c.resume = 1;
    char err[1024] = "";
    assert_int_equal(sh_run(&c, err, sizeof err), -1);
    assert_non_null(strstr(err, "data_order"));
    c.data_order = order;
    run_ok(&c);
    expect_same_run(tag, rm, rs, m, s);
    printf("  %-22s stop after 3, resume: %d losses and the parameters identical\n", tag, STEPS);
}

static void test_ordered_data(void **st) {
    (void)st;
    ordered_case("sequential", 1, NULL);
    ordered_case("shuffled", 2, NULL);
    ordered_case("shuffled_plugin", 2, INI_RES);
}

static void test_sigkill(void **st) {
    (void)st;
    need_exe();
    ensure_refs();
    char m[300], s[300], ck[300], lg[300], args[3000], tmpname[64];
    path_in(m, "kill.jsonl");
    path_in(s, "kill.bin");
    path_in(ck, "kill.ck");
    path_in(lg, "kill.log");
    /* every step saved, each save slowed (3 pauses of 15 ms): kills often land inside;
     * --debug-save-sleep-ms is a testing knob, read only with PROTRAIN_TESTING=1 */
    assert_int_equal(setenv("PROTRAIN_TESTING", "1", 1), 0);
    char fast[3000];
    bin_args(args, sizeof args, INI_STR, m, s, ck,
             "--checkpoint-every 1 --resume --debug-save-sleep-ms 15");
    bin_args(fast, sizeof fast, INI_STR, m, s, ck, "--checkpoint-every 1 --resume");
    uint64_t x = 0x9e3779b97f4a7c15ull; /* fixed sequence of delays: repeatable */
    int in_save = 0, kills = 7, progress = 0;
    for (int i = 0; i < kills; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        int ms = 5 + (int)((x >> 33) % 40);
        pid_t p = spawn_bin(i == 0 ? fast : args, lg);
        snprintf(tmpname, sizeof tmpname, ".tmp.%d", (int)p);
        /* What each kill waits for is an event, not a time, so a loaded machine
         * moves the kills but not what they hit: the first two land at random
         * early moments (start-up, first steps; the first at full speed); kills
         * 3-4 while a save is being written (its temp folder exists; saves are
         * slowed); kills 5-7 after the run got one generation further than
         * before, plus a random delay. */
        int status = 0, gone = 0, in_phase = i >= 2 && i < 4;
        if (i >= 2) {
            int before = newest(ck);
            for (int w = 0; w < 60000 && !gone; w++) {   /* up to 60 s */
                if (in_phase ? count_entries(ck, tmpname) > 0 : newest(ck) > before) break;
                gone = waitpid(p, &status, WNOHANG) == p;
                struct timespec t1 = {0, 1000000L};
                nanosleep(&t1, NULL);
            }
        }
        if (!in_phase) {
            struct timespec ts = {0, ms * 1000000L};
            nanosleep(&ts, NULL);
        }
        if (!gone) {
            kill(p, SIGKILL);
            assert_int_equal(waitpid(p, &status, 0), p);
        }
        int mid = count_entries(ck, tmpname) > 0;
        in_save += mid;
        progress = newest(ck);
        printf("  kill %d%s: newest generation %d%s\n", i + 1,
               i < 2 ? " (early)" : in_phase ? " (in a save)" : " (after a new generation)",
               newest(ck), mid ? ", inside a save" : "");
    }
    assert_int_equal(run_bin(args, lg), 0);
    char *log = pt_test_slurp(lg);
    const char *r = strstr(log, "resumed from");
    printf("  final run: %.*s\n", r ? (int)strcspn(r, "\n") : 11, r ? r : "from step 1");
    free(log);
    expect_same_run("sigkill", REF_P, REF_P_SAVE, m, s);
    assert_int_equal(count_entries(ck, ".tmp."), 0);
    assert_int_equal(count_entries(ck, ".del."), 0);
    assert_int_equal(count_entries(ck, "gen-"), 2);
    printf("  %d kills (%d inside a save), then identical losses and parameters; no "
           "leftovers\n", kills, in_save);
    assert_true(in_save >= 2);   /* kills 3 and 4 waited for a save in progress */
    assert_true(progress >= 3);  /* kills 5-7 each waited for one more generation */
}

/* Generations 4 and 6 of a run stopped after step 6, in folder `ck`. */
static void two_gens(const char *ck, const char *m, const char *s, const char *lg) {
    char args[3000];
    bin_args(args, sizeof args, INI_RES, m, s, ck, "--checkpoint-every 2 --stop-after 6");
    assert_int_equal(run_bin(args, lg), 0);
    assert_int_equal(count_entries(ck, "gen-"), 2);
}

/* The log from "step 6 val loss" up to the summary, without the timed lines: the
 * validation losses and samples of steps 6..8. */
static char *after_step6(const char *log) {
    const char *a = strstr(log, "step 6 val loss"), *b = strstr(log, "=== summary");
    assert_true(a && b && a < b);
    char *out = calloc((size_t)(b - a) + 1, 1);
    assert_non_null(out);
    for (const char *p = a; p < b;) {
        const char *nl = strchr(p, '\n');
        size_t len = (size_t)(nl - p) + 1;
        if (!memmem(p, len, "tok/s", 5)) strncat(out, p, len);
        p = nl + 1;
    }
    return out;
}

static void corrupt_case(const char *tag, const char *victim, int how, const char *why) {
    ensure_refs();
    char m[300], s[300], ck[300], lg[300], args[3000], name[64], p[400];
    snprintf(name, sizeof name, "%s.jsonl", tag);
    path_in(m, name);
    snprintf(name, sizeof name, "%s.bin", tag);
    path_in(s, name);
    snprintf(name, sizeof name, "%s.ck", tag);
    path_in(ck, name);
    path_in(lg, "corrupt.log");
    two_gens(ck, m, s, lg);
    snprintf(p, sizeof p, "%s/gen-00000006/%s", ck, victim);
    struct stat sb;
    assert_int_equal(stat(p, &sb), 0);
    if (how == 0) {
        /* flip one byte in the middle */
        FILE *f = fopen(p, "r+b");
        assert_non_null(f);
        fseek(f, sb.st_size / 2, SEEK_SET);
        int ch = fgetc(f);
        fseek(f, sb.st_size / 2, SEEK_SET);
        fputc(ch ^ 0x20, f);
        assert_int_equal(fclose(f), 0);
    } else {
        assert_int_equal(truncate(p, sb.st_size - 3), 0);
    }
    bin_args(args, sizeof args, INI_RES, m, s, ck, "--checkpoint-every 2 --resume");
    assert_int_equal(run_bin(args, lg), 0);
    char *log = pt_test_slurp(lg), want[400];
    snprintf(want, sizeof want, "warning: skipping checkpoint generation %s/gen-00000006: ", ck);
    const char *w = strstr(log, want);
    assert_non_null(w);
    printf("  %-16s %.*s\n", tag, (int)strcspn(w, "\n"), w);
    assert_non_null(strstr(w, why));
    snprintf(want, sizeof want, "resumed from %s/gen-00000004 (step 4", ck);
    assert_non_null(strstr(log, want));
    /* validation losses and sampled text after the resume as in one run */
    static char *ref_tail;
    if (!ref_tail) {
        char rm[300], rs[300], rck[300], rlg[300];
        bin_args(args, sizeof args, INI_RES, path_in(rm, "bref.jsonl"), path_in(rs, "bref.bin"),
                 path_in(rck, "bref.ck"), "");
        assert_int_equal(run_bin(args, path_in(rlg, "bref.log")), 0);
        char *rl = pt_test_slurp(rlg);
        ref_tail = after_step6(rl);
        free(rl);
    }
    char *tail = after_step6(log);
    assert_string_equal(tail, ref_tail);
    assert_non_null(strstr(tail, "--- sample at step 6"));
    free(tail);
    free(log);
    expect_same_run(tag, REF_P, REF_P_SAVE, m, s);
}

static void test_corrupt_manifest(void **st) {
    (void)st;
    need_exe();
    corrupt_case("manifest_flip", "MANIFEST", 0, "checksum mismatch");
}

static void test_truncated_state(void **st) {
    (void)st;
    need_exe();
    corrupt_case("state_truncated", "protrain_state_rank0.bin", 1, "truncated");
}

static void test_corrupt_state(void **st) {
    (void)st;
    need_exe();
    /* sizes intact: the plugin's own checksum refuses it, nothing is changed, and the
     * previous generation loads */
    corrupt_case("state_flip", "protrain_state_rank0.bin", 0, "corrupt");
}

static void test_other_run_refused(void **st) {
    (void)st;
    need_exe();
    char m[300], s[300], ck[300], lg[300], args[3000];
    path_in(m, "other.jsonl");
    path_in(s, "other.bin");
    path_in(ck, "other.ck");
    path_in(lg, "other.log");
    two_gens(ck, m, s, lg);
    /* another learning rate: resuming would not continue that run */
    bin_args(args, sizeof args, INI_RES, m, s, ck, "--checkpoint-every 2 --resume --lr 1e-3");
    assert_int_equal(run_bin(args, lg), 1);
    char *log = pt_test_slurp(lg);
    const char *e = strstr(log, "error: --resume:");
    assert_non_null(e);
    printf("  %.*s\n", (int)strcspn(e, "\n"), e);
    assert_non_null(strstr(e, "lr = 0.00300000003 but this run has lr = 0.00100000005"));
    free(log);
    /* every generation corrupt: an error, not a silent fresh start */
    char p[400];
    snprintf(p, sizeof p, "%s/gen-00000004/host.txt", ck);
    assert_int_equal(truncate(p, 10), 0);
    snprintf(p, sizeof p, "%s/gen-00000006/host.txt", ck);
    assert_int_equal(truncate(p, 10), 0);
    bin_args(args, sizeof args, INI_RES, m, s, ck, "--checkpoint-every 2 --resume");
    assert_int_equal(run_bin(args, lg), 1);
    log = pt_test_slurp(lg);
    assert_non_null(strstr(log, "none of the 2 checkpoint generations"));
    free(log);
}

/* ---- generations that mix ---- */

static void copy_file(const char *from, const char *to) {
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "cp '%s' '%s'", from, to);
    assert_int_equal(system(cmd), 0);
}

/* Resume from ck must fail (exit 1) with an error naming `file` and `field`. */
static void expect_refused(const char *ck, const char *m, const char *s, const char *lg,
                           const char *file, const char *field) {
    char args[3000];
    bin_args(args, sizeof args, INI_RES, m, s, ck, "--checkpoint-every 2 --resume");
    int rc = run_bin(args, lg);
    char *log = pt_test_slurp(lg);
    const char *e = strstr(log, "error:");
    printf("  exit %d: %.*s\n", rc, e ? (int)strcspn(e, "\n") : 60, e ? e : log);
    assert_int_equal(rc, 1);
    assert_non_null(e);
    assert_non_null(strstr(e, file));
    assert_non_null(strstr(e, field));
    free(log);
}

/* FNV-1a 64, the MANIFEST's checksum. */
static uint64_t fnv64(const char *b, size_t n) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)b[i]) * 0x100000001b3ull;
    return h;
}

/* Rewrite gen's MANIFEST line of file `name` with the file's size and checksum
 * as it is now, and the MANIFEST's own checksum: a hand-made MANIFEST. */
static void reseal(const char *gen, const char *name) {
    char p[500], q[500], want[200];
    snprintf(p, sizeof p, "%s/%s", gen, name);
    FILE *f = fopen(p, "rb");
    assert_non_null(f);
    static char buf[1 << 22];
    size_t n = fread(buf, 1, sizeof buf, f);
    assert_true(n < sizeof buf);
    fclose(f);
    uint64_t hh = fnv64(buf, n);
    snprintf(q, sizeof q, "%s/MANIFEST", gen);
    char *man = pt_test_slurp(q);
    assert_non_null(man);
    static char nm[16384];
    nm[0] = '\0';
    int k = snprintf(want, sizeof want, "file %s ", name);
    for (char *l = man; *l;) {
        char *nl = strchr(l, '\n');
        assert_non_null(nl);
        if (!strncmp(l, want, (size_t)k))
            snprintf(nm + strlen(nm), sizeof nm - strlen(nm), "file %s %zu %016llx\n", name, n,
                     (unsigned long long)hh);
        else if (strncmp(l, "end ", 4))
            strncat(nm, l, (size_t)(nl - l) + 1);
        l = nl + 1;
    }
    free(man);
    snprintf(nm + strlen(nm), sizeof nm - strlen(nm), "end %016llx\n",
             (unsigned long long)fnv64(nm, strlen(nm)));
    f = fopen(q, "w");
    assert_non_null(f);
    fputs(nm, f);
    assert_int_equal(fclose(f), 0);
}

/* Replace the line "key ..." of gen/host.txt by "key value" and rewrite the
 * MANIFEST's checksums to match: a valid-looking generation holding a value no
 * run writes. */
static void forge_host(const char *gen, const char *key, const char *value) {
    char p[500], q[500];
    snprintf(p, sizeof p, "%s/host.txt", gen);
    char *t = pt_test_slurp(p);
    assert_non_null(t);
    static char out[8192];
    out[0] = '\0';
    size_t kl = strlen(key);
    for (char *l = t; *l;) {
        char *nl = strchr(l, '\n');
        assert_non_null(nl);
        if (!strncmp(l, key, kl) && l[kl] == ' ')
            snprintf(out + strlen(out), sizeof out - strlen(out), "%s %s\n", key, value);
        else
            strncat(out, l, (size_t)(nl - l) + 1);
        l = nl + 1;
    }
    free(t);
    FILE *f = fopen(p, "w");
    assert_non_null(f);
    fputs(out, f);
    assert_int_equal(fclose(f), 0);
    (void)q;
    reseal(gen, "host.txt");
}

/* A generation whose plugin state file is another generation's, another run's
 * (--seed; also under a MANIFEST made to list its checksum), or whose host state
 * holds values no run writes: --resume refuses it,
 * naming the file and what differs, instead of training on from a mix. */
static void test_mixed_generation(void **st) {
    (void)st;
    need_exe();
    char m[300], s[300], ck[300], lg[300], g4[400], g6[400], from[500], to[500];
    path_in(m, "mix.jsonl");
    path_in(s, "mix.bin");
    path_in(ck, "mix.ck");
    path_in(lg, "mix.log");
    snprintf(g4, sizeof g4, "%s/gen-00000004", ck);
    snprintf(g6, sizeof g6, "%s/gen-00000006", ck);
    /* gen-4's state file in gen-6 */
    two_gens(ck, m, s, lg);
    snprintf(from, sizeof from, "%s/protrain_state_rank0.bin", g4);
    snprintf(to, sizeof to, "%s/protrain_state_rank0.bin", g6);
    copy_file(from, to);
    expect_refused(ck, m, s, lg, "protrain_state_rank0.bin", "step");
    /* the state file of a run with another seed, at the same step */
    char m2[300], s2[300], ck2[300], args[3000];
    path_in(m2, "mix_seed.jsonl");
    path_in(s2, "mix_seed.bin");
    path_in(ck2, "mix_seed.ck");
    bin_args(args, sizeof args, INI_RES, m2, s2, ck2,
             "--checkpoint-every 2 --stop-after 6 --seed 12");
    assert_int_equal(run_bin(args, lg), 0);
    char cmd[1000];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' '%s'", ck, m);
    assert_int_equal(system(cmd), 0);
    two_gens(ck, m, s, lg);
    snprintf(from, sizeof from, "%s/gen-00000006/protrain_state_rank0.bin", ck2);
    copy_file(from, to);
    expect_refused(ck, m, s, lg, "protrain_state_rank0.bin", "checksum");
    /* ... and with the MANIFEST made to list the foreign file's checksum: the
     * plugin's own header says whose run the file is */
    reseal(g6, "protrain_state_rank0.bin");
    expect_refused(ck, m, s, lg, "protrain_state_rank0.bin", "another run's");
    /* ... and of runs with the same seed and data but another schedule, another
     * accumulation, or another lr: the first two by the run identity, lr by the
     * optimizer settings the file records (its first step's lr) */
    static const char *const other[][2] = {
        {"--warmup 3", "another run's"},
        {"--grad-accum 1", "another run's"},
        {"--lr 6e-3", "was saved with lr = 0.006"},
    };
    for (size_t k = 0; k < sizeof other / sizeof other[0]; k++) {
        char xa[200];
        snprintf(cmd, sizeof cmd, "rm -rf '%s' '%s' '%s'", ck, m, ck2);
        assert_int_equal(system(cmd), 0);
        snprintf(xa, sizeof xa, "--checkpoint-every 2 --stop-after 6 %s", other[k][0]);
        bin_args(args, sizeof args, INI_RES, m2, s2, ck2, xa);
        assert_int_equal(run_bin(args, lg), 0);
        two_gens(ck, m, s, lg);
        snprintf(from, sizeof from, "%s/gen-00000006/protrain_state_rank0.bin", ck2);
        copy_file(from, to);
        reseal(g6, "protrain_state_rank0.bin");
        expect_refused(ck, m, s, lg, "protrain_state_rank0.bin", other[k][1]);
    }
    /* host state with values no run writes, its checksums made valid */
    static const char *const bad[][3] = {
        {"n_skipped", "-1", "n_skipped"},
        {"train_time", "nan", "train_time"},
        {"last_loss", "-inf", "last_loss"},
        {"opt_steps", "4611686018427387904", "opt_steps"},
    };
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        snprintf(cmd, sizeof cmd, "rm -rf '%s' '%s'", ck, m);
        assert_int_equal(system(cmd), 0);
        two_gens(ck, m, s, lg);
        forge_host(g6, bad[k][0], bad[k][1]);
        expect_refused(ck, m, s, lg, "host.txt", bad[k][2]);
    }
    /* and the untouched pair resumes, without a word about the settings */
    snprintf(cmd, sizeof cmd, "rm -rf '%s' '%s'", ck, m);
    assert_int_equal(system(cmd), 0);
    two_gens(ck, m, s, lg);
    bin_args(args, sizeof args, INI_RES, m, s, ck, "--checkpoint-every 2 --resume");
    assert_int_equal(run_bin(args, lg), 0);
    char *log = pt_test_slurp(lg);
    assert_non_null(strstr(log, "resumed from"));
    assert_null(strstr(log, "was saved with"));
    free(log);
}

static void test_nan_stops(void **st) {
    (void)st;
    need_exe();
    char m[300], s[300], ck[300], lg[300], args[3000];
    path_in(m, "nan.jsonl");
    path_in(s, "nan.bin");
    path_in(ck, "nan.ck");
    path_in(lg, "nan.log");
    /* --debug-nan-step is a testing knob, read only with PROTRAIN_TESTING=1 */
    assert_int_equal(setenv("PROTRAIN_TESTING", "1", 1), 0);
    bin_args(args, sizeof args, INI_STR, m, s, ck, "--checkpoint-every 2 --debug-nan-step 5");
    assert_int_equal(run_bin(args, lg), 1);
    char *log = pt_test_slurp(lg);
    const char *e = strstr(log, "error: ");
    assert_non_null(e);
    printf("  plugin: %.*s\n", (int)strcspn(e, "\n"), e);
    assert_non_null(strstr(e, "not finite (nan) at step 5"));
    assert_null(strstr(log, "final train loss"));
    free(log);
    /* nothing after the NaN was saved: the newest generation is step 4 */
    assert_int_equal(count_entries(ck, "gen-"), 2);
    assert_int_equal(count_entries(ck, "gen-00000004"), 1);
    struct stat sb;
    assert_int_not_equal(stat(s, &sb), 0);
    /* skip (no plugin): counted and reported, the run finishes with finite losses */
    ensure_refs();
    path_in(ck, "nan_skip.ck");
    bin_args(args, sizeof args, NULL, m, s, ck, "--debug-nan-step 5 --on-nonfinite skip");
    assert_int_equal(run_bin(args, lg), 0);
    log = pt_test_slurp(lg);
    assert_non_null(strstr(log, "not finite (nan) at step 5: optimizer step skipped"));
    assert_non_null(strstr(log, "skipped optimizer steps (non-finite loss): 1"));
    assert_null(strstr(log, "final train loss nan"));
    free(log);
    static char a[8192], b[8192];
    losses(REF_H, a, sizeof a);
    losses(m, b, sizeof b);
    /* steps 1-4 as without the NaN, step 5's loss null */
    char *l5 = strstr(b, "{\"step\":5,");
    assert_non_null(l5);
    assert_memory_equal(a, b, (size_t)(l5 - b));
    assert_non_null(strstr(l5, "\"loss\":null"));
    /* with the plugin, skip is refused up front (it cannot drop a step) */
    bin_args(args, sizeof args, INI_RES, m, s, ck, "--on-nonfinite skip");
    assert_int_equal(run_bin(args, lg), 1);
}

static void test_config_keys(void **st) {
    (void)st;
    char p[300], err[512];
    path_in(p, "keys.ini");
    FILE *f = fopen(p, "w");
    assert_non_null(f);
    fprintf(f, "[sample_host]\ncheckpoint_dir = x\nresume = true\ncheckpoint_keep = 0\n");
    assert_int_equal(fclose(f), 0);
    sh_config c;
    sh_config_defaults(&c);
    assert_int_equal(c.checkpoint_keep, 2);
    assert_int_equal(sh_config_load_ini(&c, p, err, sizeof err), -1);
    char want[400];
    snprintf(want, sizeof want, "%s:4: 'checkpoint_keep'", p);
    assert_non_null(strstr(err, want));
    assert_int_equal(c.resume, 1);
    sh_config_defaults(&c);
    char *argv[] = {"sample_host", "--resume", NULL};
    assert_int_equal(sh_config_from_args(&c, 2, argv, err, sizeof err), 0);
    assert_int_equal(c.resume, 1);
    assert_int_equal(sh_config_check(&c, err, sizeof err), -1);
    assert_non_null(strstr(err, "resume needs checkpoint_dir"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_config_keys),
        cmocka_unit_test(test_resident),
        cmocka_unit_test(test_streamed),
        cmocka_unit_test(test_ckpt_swap),
        cmocka_unit_test(test_plan_change),
        cmocka_unit_test(test_no_plugin),
        cmocka_unit_test(test_ordered_data),
        cmocka_unit_test(test_sigkill),
        cmocka_unit_test(test_corrupt_manifest),
        cmocka_unit_test(test_truncated_state),
        cmocka_unit_test(test_corrupt_state),
        cmocka_unit_test(test_other_run_refused),
        cmocka_unit_test(test_mixed_generation),
        cmocka_unit_test(test_nan_stops),
    };
    return cmocka_run_group_tests_name("sample_host checkpoint and resume", tests, setup,
                                       teardown);
}
