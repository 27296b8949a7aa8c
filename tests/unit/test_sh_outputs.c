/*
 * test_sh_outputs.c — sample_host refuses, before any work, an output that would
 * destroy what it names or fail after training, and names the cause:
 *  - an output path that is a FIFO, a socket, a character device (a private
 *    node made with mknod when root, and /dev/full) or a symbolic link, for
 *    --save, --metrics and --write-shard, and --save whose temporary file is a
 *    FIFO: refused naming the kind; afterwards the node is still what it was and
 *    a link's target was never written;
 *  - an output that is an input of the run or another output, told apart by
 *    (st_dev, st_ino): --metrics on the data spelled another way, through a
 *    hard link and inside a --data glob, --save on the config, val data and
 *    --load files, --metrics and --save on one file, --save's temporary file
 *    (NAME.tmp) on --metrics or on the val data, --write-shard on its own
 *    input: refused, and the data file keeps its bytes;
 *  - names that do not fit: a 256-character --save name and a 252-character one
 *    (256 with ".tmp") are refused before step 1 while 251 trains and saves; a
 *    256-character --checkpoint-dir name is refused before step 1;
 *  - a checkpoint folder locked by another holder: refused naming its pid, and
 *    a run starts once the lock is dropped;
 *  - an output inside a generation folder, or named like a generation or the
 *    lock in the checkpoint folder: refused (one beside them is not);
 *  - a generation of the default data order resumed with another: the message
 *    names both orders, not "another version";
 *  - the command line: an option given twice takes the last value (said in a
 *    note), --config given twice is refused (a value spelled like an option
 *    is a value); with optimizer = ini the INI's [optimizer] lr
 *    becomes the schedule's peak, while a different [sample_host] lr or --lr
 *    beside it is refused.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/un.h>
#include <unistd.h>

#include <cmocka.h>

#include "test_files.h"

#include "sh_config.h"
#include "sh_lock.h"
#include "sh_run.h"

static char DIR_[64], TEXT[300];

static int setup(void **st) {
    (void)st;
    snprintf(DIR_, sizeof DIR_, "/tmp/test_sh_outputs.XXXXXX");
    return pt_test_corpus_dir(DIR_, TEXT, sizeof TEXT);
}

static int teardown(void **st) {
    (void)st;
    return pt_test_rm_dir(DIR_);
}

static void cfg(sh_config *c) {
    sh_config_defaults(c);
    c->layers = 1;
    c->heads = 2;
    c->channels = 16;
    c->seq = 8;
    c->batch = 2;
    c->steps = 2;
    c->val_every = 0;
    c->gen_every = 0;
    c->quiet = 1;
    c->no_plugin = 1;
    snprintf(c->data, sizeof c->data, "%s", TEXT);
}

/* src into dst of n bytes (the test's own paths always fit). */
static void cp(char *dst, size_t n, const char *src) {
    size_t l = strlen(src);
    assert_true(l < n);
    memcpy(dst, src, l + 1);
}

static void in_dir(char *out, size_t n, const char *name) { snprintf(out, n, "%s/%s", DIR_, name); }

static long long size_of(const char *p) {
    struct stat sb;
    return stat(p, &sb) == 0 ? (long long)sb.st_size : -1;
}

/* sh_run refuses c with a sentence holding every one of the words. */
static void refused(const sh_config *c, const char *w1, const char *w2) {
    char err[1024] = "";
    int rc = sh_run(c, err, sizeof err);
    printf("  %s\n", err);
    assert_int_equal(rc, -1);
    assert_non_null(strstr(err, w1));
    if (w2) assert_non_null(strstr(err, w2));
}

static void ran(const sh_config *c) {
    char err[1024] = "";
    int rc = sh_run(c, err, sizeof err);
    if (rc) fail_msg("sh_run: %s", err);
}

/* --save, --metrics or --write-shard (k = 0, 1, 2) set to p. */
static void set_out(sh_config *c, int k, const char *p) {
    char *f = k == 0 ? c->save : k == 1 ? c->metrics
                                        : c->write_shard;
    cp(f, SH_PATH, p);
}

static const char *const FLAG[3] = {"--save", "--metrics", "--write-shard"};

static void test_not_regular(void **st) {
    (void)st;
    char fifo[100], sock[100], dev[100], tmpfifo[120], save[100];
    in_dir(fifo, sizeof fifo, "fifo");
    in_dir(sock, sizeof sock, "sock");
    in_dir(dev, sizeof dev, "full");
    assert_int_equal(mkfifo(fifo, 0600), 0);
    int s = socket(AF_UNIX, SOCK_STREAM, 0);
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    cp(a.sun_path, sizeof a.sun_path, sock);
    assert_int_equal(bind(s, (struct sockaddr *)&a, sizeof a), 0);
    /* a node of its own for the root case (the device of /dev/full) */
    int have_dev = mknod(dev, S_IFCHR | 0600, makedev(1, 7)) == 0;
    if (!have_dev) printf("  (not root: no private device node; /dev/full only)\n");
    struct {
        const char *path, *kind;
        mode_t type;
    } nodes[] = {
        {fifo, "a FIFO", S_IFIFO},
        {sock, "a socket", S_IFSOCK},
        {dev, "a character device", S_IFCHR},
        {"/dev/full", "a character device", S_IFCHR},
    };
    for (size_t i = 0; i < sizeof nodes / sizeof nodes[0]; i++) {
        if (nodes[i].path == dev && !have_dev) continue;
        for (int k = 0; k < 3; k++) {
            sh_config c;
            cfg(&c);
            set_out(&c, k, nodes[i].path);
            refused(&c, FLAG[k], nodes[i].kind);
            struct stat sb;
            assert_int_equal(lstat(nodes[i].path, &sb), 0);
            assert_int_equal(sb.st_mode & S_IFMT, nodes[i].type);
        }
    }
    close(s);
    /* the temporary file beside --save a FIFO: opening it would wait forever */
    in_dir(save, sizeof save, "model.bin");
    snprintf(tmpfifo, sizeof tmpfifo, "%s.tmp", save);
    assert_int_equal(mkfifo(tmpfifo, 0600), 0);
    sh_config c;
    cfg(&c);
    set_out(&c, 0, save);
    refused(&c, "model.bin.tmp", "a FIFO");
    unlink(tmpfifo);
}

static void test_symlink(void **st) {
    (void)st;
    char link[300], target[300];
    in_dir(link, sizeof link, "link.bin");
    in_dir(target, sizeof target, "target.bin");
    FILE *f = fopen(target, "w");
    assert_non_null(f);
    fputs("keep", f);
    fclose(f);
    assert_int_equal(symlink(target, link), 0);
    for (int k = 0; k < 3; k++) {
        sh_config c;
        cfg(&c);
        set_out(&c, k, link);
        refused(&c, FLAG[k], "symbolic link");
        struct stat sb;
        assert_int_equal(lstat(link, &sb), 0);
        assert_true(S_ISLNK(sb.st_mode));
        assert_int_equal(size_of(target), 4);
    }
}

static void test_inputs(void **st) {
    (void)st;
    long long n0 = size_of(TEXT);
    char spelled[300], hard[300], glob[300], ini[300], val[300], m[300];
    snprintf(spelled, sizeof spelled, "%s/./text.txt", DIR_);
    in_dir(hard, sizeof hard, "hard.txt");
    assert_int_equal(link(TEXT, hard), 0);
    snprintf(glob, sizeof glob, "%s/te*.txt", DIR_);
    in_dir(ini, sizeof ini, "run.ini");
    in_dir(val, sizeof val, "val.txt");
    in_dir(m, sizeof m, "m.jsonl");
    FILE *f = fopen(ini, "w");
    assert_non_null(f);
    fputs("[sample_host]\nsteps = 2\n", f);
    fclose(f);
    f = fopen(val, "w");
    assert_non_null(f);
    fputs("some validation text, long enough for a window or two of eight.\n", f);
    fclose(f);
    sh_config c;
    cfg(&c);
    set_out(&c, 1, spelled);
    refused(&c, "--metrics", "--data");
    cfg(&c);
    set_out(&c, 1, hard);
    refused(&c, "--metrics", "--data");
    cfg(&c);
    snprintf(c.data, sizeof c.data, "%s", glob);
    set_out(&c, 1, TEXT);
    refused(&c, "--metrics", "--data");
    cfg(&c);
    snprintf(c.config, sizeof c.config, "%s", ini);
    set_out(&c, 0, ini);
    refused(&c, "--save", "--config");
    cfg(&c);
    snprintf(c.val_data, sizeof c.val_data, "%s", val);
    set_out(&c, 0, val);
    refused(&c, "--save", "--val-data");
    cfg(&c);
    snprintf(c.load, sizeof c.load, "%s", val);   /* identity is checked before reading */
    set_out(&c, 1, val);
    refused(&c, "--metrics", "--load");
    cfg(&c);
    set_out(&c, 0, m);
    set_out(&c, 1, m);
    refused(&c, "--save", "name one file");
    /* the temporary file --save writes beside its path: another output or an input */
    char mt[320], vt[320], vbase[300];
    snprintf(mt, sizeof mt, "%s.tmp", m);
    cfg(&c);
    set_out(&c, 0, m);
    set_out(&c, 1, mt);
    refused(&c, "temporary file", "name one file");
    snprintf(vt, sizeof vt, "%s.tmp", val);
    assert_int_equal(rename(val, vt), 0);
    cp(vbase, sizeof vbase, val);
    cfg(&c);
    cp(c.val_data, sizeof c.val_data, vt);
    set_out(&c, 0, vbase);
    refused(&c, "temporary file", "--val-data");
    assert_int_equal(rename(vt, val), 0);
    cfg(&c);
    set_out(&c, 2, hard);
    refused(&c, "--write-shard", "--data");
    assert_int_equal(size_of(TEXT), n0);
    assert_int_not_equal(access(m, F_OK), 0);
    unlink(hard);
}

/* A name of n characters under DIR_. */
static void long_name(char *out, size_t len, int n) {
    int k = snprintf(out, len, "%s/", DIR_);
    memset(out + k, 'a', (size_t)n);
    out[k + n] = '\0';
}

static void test_long_names(void **st) {
    (void)st;
    char save[600], m[300];
    in_dir(m, sizeof m, "long.jsonl");
    sh_config c;
    int bad[2] = {256, 252};
    for (int i = 0; i < 2; i++) {
        cfg(&c);
        long_name(save, sizeof save, bad[i]);
        set_out(&c, 0, save);
        set_out(&c, 1, m);
        refused(&c, "--save", "file name is");
        assert_int_not_equal(access(m, F_OK), 0);   /* no step ran */
    }
    cfg(&c);
    long_name(save, sizeof save, 251);
    set_out(&c, 0, save);
    ran(&c);
    assert_true(size_of(save) > 1024);
    unlink(save);
    /* a checkpoint folder name longer than the file system takes: found now,
     * not at the first save after the training */
    cfg(&c);
    long_name(c.checkpoint_dir, sizeof c.checkpoint_dir, 256);
    set_out(&c, 1, m);
    refused(&c, "--checkpoint-dir", "too long");
    assert_int_not_equal(access(m, F_OK), 0);
}

static void test_lock(void **st) {
    (void)st;
    char ck[300], err[512] = "", want[32];
    in_dir(ck, sizeof ck, "ck_lock");
    int fd = -1;
    assert_int_equal(sh_lock_dir(ck, &fd, err, sizeof err), 0);
    /* a second holder, even in this process (another open of the file) */
    int fd2 = -1;
    assert_int_equal(sh_lock_dir(ck, &fd2, err, sizeof err), -1);
    snprintf(want, sizeof want, "process %ld", (long)getpid());
    assert_non_null(strstr(err, want));
    sh_config c;
    cfg(&c);
    snprintf(c.checkpoint_dir, sizeof c.checkpoint_dir, "%s", ck);
    refused(&c, "--checkpoint-dir", want);
    c.resume = 1;
    refused(&c, "--checkpoint-dir", want);
    sh_lock_release(&fd);
    assert_int_equal(fd, -1);
    ran(&c);
    char gen[400];
    snprintf(gen, sizeof gen, "%s/gen-00000002/MANIFEST", ck);
    assert_int_equal(access(gen, F_OK), 0);
}

/* An output inside the checkpoint folder's generations (or named like one,
 * or its lock) would be deleted by a prune or break a generation. */
static void test_inside_generation(void **st) {
    (void)st;
    char ck[300], p[400];
    in_dir(ck, sizeof ck, "ck_inside");
    sh_config c;
    cfg(&c);
    snprintf(c.checkpoint_dir, sizeof c.checkpoint_dir, "%s", ck);
    ran(&c);   /* gen-00000002 */
    const char *names[] = {"gen-00000002/host.txt", "gen-00000002/m.jsonl", "gen-7", ".lock"};
    for (int i = 0; i < 4; i++) {
        snprintf(p, sizeof p, "%s/%s", ck, names[i]);
        cfg(&c);
        snprintf(c.checkpoint_dir, sizeof c.checkpoint_dir, "%s", ck);
        set_out(&c, 1, p);
        refused(&c, "--metrics", "checkpoint folder");
    }
    snprintf(p, sizeof p, "%s/m.jsonl", ck);   /* beside the generations: fine */
    cfg(&c);
    snprintf(c.checkpoint_dir, sizeof c.checkpoint_dir, "%s", ck);
    c.resume = 1;
    c.steps = 3;
    set_out(&c, 1, p);
    refused(&c, "steps", NULL);   /* the generation's run had 2 steps: the paths passed */
}

static void test_resume_order(void **st) {
    (void)st;
    char ck[300];
    in_dir(ck, sizeof ck, "ck_order");
    sh_config c;
    cfg(&c);
    snprintf(c.checkpoint_dir, sizeof c.checkpoint_dir, "%s", ck);
    c.stop_after = 1;
    ran(&c);
    c.resume = 1;
    c.data_order = 1;   /* sequential */
    refused(&c, "data_order = random (the default", "data_order = sequential");
}

static int args(sh_config *c, char *err, size_t n, const char *a1, const char *a2,
                const char *a3, const char *a4, const char *a5) {
    char *argv[] = {"sample_host", (char *)a1, (char *)a2, (char *)a3, (char *)a4, (char *)a5,
                    NULL};
    int argc = 1;
    while (argv[argc]) argc++;
    sh_config_defaults(c);
    err[0] = '\0';
    int rc = sh_config_from_args(c, argc, argv, err, n);
    if (err[0]) printf("  %s\n", err);
    return rc;
}

static void test_args(void **st) {
    (void)st;
    sh_config c;
    char err[1024], ini[300], ini2[300];
    /* an option given twice: the last wins, said on stderr (the note is in
     * tests/sh_outputs.sh); --config twice is refused */
    assert_int_equal(args(&c, err, sizeof err, "--steps", "2", "--steps", "3", NULL), 0);
    assert_int_equal(c.steps, 3);
    assert_int_equal(args(&c, err, sizeof err, "--config", "a.ini", "--config=b.ini", NULL, NULL),
                     -1);
    assert_non_null(strstr(err, "--config is given twice (a.ini and b.ini)"));
    /* a value that spells an option is the value, not the option given again */
    assert_int_equal(args(&c, err, sizeof err, "--metrics", "--steps", "--steps", "4", NULL), 0);
    assert_string_equal(c.metrics, "--steps");
    assert_int_equal(c.steps, 4);
    assert_int_equal(args(&c, err, sizeof err, "--steps", "3", "--lr", "0.01", NULL), 0);
    assert_int_equal(c.steps, 3);
    in_dir(ini, sizeof ini, "opt.ini");
    FILE *f = fopen(ini, "w");
    assert_non_null(f);
    fputs("[sample_host]\noptimizer = ini\n[optimizer]\nlr = 0.0123\n", f);
    fclose(f);
    assert_int_equal(args(&c, err, sizeof err, "--config", ini, NULL, NULL, NULL), 0);
    assert_true(c.lr == 0.0123f && c.lr_note == 1);
    assert_int_equal(args(&c, err, sizeof err, "--config", ini, "--lr", "0.5", NULL), -1);
    assert_non_null(strstr(err, "[optimizer] lr = 0.0123"));
    assert_non_null(strstr(err, "--lr"));
    assert_int_equal(args(&c, err, sizeof err, "--config", ini, "--lr", "0.0123", NULL), 0);
    in_dir(ini2, sizeof ini2, "opt2.ini");
    f = fopen(ini2, "w");
    assert_non_null(f);
    fputs("[sample_host]\noptimizer = ini\nlr = 0.5\n[optimizer]\nlr = 0.0123\n", f);
    fclose(f);
    assert_int_equal(args(&c, err, sizeof err, "--config", ini2, NULL, NULL, NULL), -1);
    assert_non_null(strstr(err, "[sample_host] lr"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_not_regular),
        cmocka_unit_test(test_symlink),
        cmocka_unit_test(test_inputs),
        cmocka_unit_test(test_long_names),
        cmocka_unit_test(test_lock),
        cmocka_unit_test(test_inside_generation),
        cmocka_unit_test(test_resume_order),
        cmocka_unit_test(test_args),
    };
    return cmocka_run_group_tests_name("sample_host outputs", tests, setup, teardown);
}
