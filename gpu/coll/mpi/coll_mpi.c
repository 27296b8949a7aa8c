/*
 * coll_mpi.c — coll.h over MPI point-to-point messages.
 *
 * Why not MPI_Allreduce: its reduction order is the library's choice (it may
 * change with the message size, the process count or the library version), so
 * sums would not be reproducible and would not match a single rank that
 * accumulates micro-batches in order. Instead every rank sends its buffer to
 * every other rank and adds the W buffers in rank order itself; each message is
 * its own request, so when the deadline passes we know exactly which rank's
 * part is missing and can name it. Buffers travel in segments so the receive
 * space stays bounded (W-1 segments) whatever the chunk size.
 *
 * All calls come from the thread that calls the plugin's hooks
 * (MPI_THREAD_FUNNELED is enough). Traffic uses a duplicate of
 * MPI_COMM_WORLD, so a host that uses MPI itself cannot match our messages.
 *
 * Notices. A second duplicate carries one-way notices between the ranks, so a
 * rank that stops tells the others at once instead of leaving them to wait
 * [dist] timeout inside a collective (or itself waiting in MPI_Finalize for
 * ranks that are still in one). A notice is one message: a kind byte and a
 * NUL-terminated sentence.
 *   'A' abort: this rank stops, with the sentence why (pt_mpi_coll_abort);
 *   'L' leave: this rank closes the group after a clean run;
 *   'B' leave: this rank closes a broken group (it failed or heard an abort).
 * Every wait of a collective that does not finish at once probes for notices
 * between its polls, and fails on an abort ("rank r stopped: why") or a failed
 * rank's leave at once, on a clean leave when the sender's parts are still
 * missing LEAVE_GRACE_S later (they were sent before it, so normally they are
 * in by then). Close sends this rank's
 * leave to every peer and collects every peer's (within [dist] timeout), so
 * every notice sent is also received, and does not finalize MPI when a rank
 * aborted or left after a failure.
 */
#include <dlfcn.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "coll/coll.h"
#include "coll/coll_mpi.h"
#include "protrain.h"
#include "pt_util.h"

/* Elements per segment: 1 Mi floats = 4 MiB per peer in flight. */
#define SEG_ELEMS ((size_t)1 << 20)

/* Notices: their tag on their own communicator, and their longest sentence. */
#define NOTE_TAG 1
#define NOTE_MAX 1024

struct pt_mpi_coll {
    int world, rank;
    int we_init;        /* pt_coll_open called MPI_Init_thread */
    int broken;         /* a collective failed: no further collective, no finalize */
    double timeout_s;
    int hang_rank;
    unsigned seq;       /* collectives so far (message tags, error text) */
    MPI_Comm comm;
    void *recv;         /* (world-1) segments of the widest type */
    MPI_Request *req;   /* 2*(world-1) */
    pt_mpi_coll *parent; /* a sub-group's group (pt_mpi_coll_split), else NULL */
    int *root_broken;   /* the outermost group's broken flag (its own for it) */
    /* notices (the outermost group only) */
    MPI_Comm ncomm;     /* their communicator, MPI_COMM_NULL before it exists */
    char *left;         /* [world]: the leave kind each peer sent ('L'/'B'), else 0 */
    int heard;          /* an abort or a failed rank's leave came in while waiting */
    int clean_from;     /* the first peer whose clean leave came in while waiting, or -1 */
    double clean_at;    /* when (pt_now_s) */
    int told;           /* this rank sent its abort */
    MPI_Request *nreq;  /* [2 * world]: this rank's abort, then its leave, per peer */
    char nbuf[2][NOTE_MAX + 2];   /* their texts, alive until sent */
};


/* A failed collective breaks the whole tree: the outermost group must not
 * finalize, and no sub-group may wait on a peer that is gone. */
static void set_broken(pt_mpi_coll *c) {
    c->broken = 1;
    if (c->root_broken) *c->root_broken = 1;
    for (pt_mpi_coll *p = c->parent; p; p = p->parent) p->broken = 1;
}
static int is_broken(const pt_mpi_coll *c) {
    return c->broken || (c->root_broken && *c->root_broken);
}
static pt_mpi_coll *root_of(pt_mpi_coll *c) {
    while (c->parent) c = c->parent;
    return c;
}

static void pause_briefly(void) {
    /* polling at 100 us keeps latency low without spinning a core the CPU
     * optimizer's threads need */
    struct timespec ts = {0, 100000};
    nanosleep(&ts, NULL);
}

static const char *mpi_text(int code, char *buf, size_t cap) {
    int len = 0;
    char s[MPI_MAX_ERROR_STRING];
    if (MPI_Error_string(code, s, &len) != MPI_SUCCESS) snprintf(s, sizeof s, "code %d", code);
    snprintf(buf, cap, "%s", s);
    return buf;
}

/* ---- notices (see the top of this file) ---- */

/* Takes one waiting notice off the outermost group r (*got = 0: none): its
 * sender, kind and sentence (text holds NOTE_MAX bytes); a leave is recorded
 * in r->left. -1: MPI failed. */
static int note_recv(pt_mpi_coll *r, int *got, int *from, char *kind, char *text) {
    *got = 0;
    if (r->ncomm == MPI_COMM_NULL) return 0;
    int flag = 0;
    MPI_Status st;
    if (MPI_Iprobe(MPI_ANY_SOURCE, NOTE_TAG, r->ncomm, &flag, &st) != MPI_SUCCESS) return -1;
    if (!flag) return 0;
    char buf[NOTE_MAX + 2];
    if (MPI_Recv(buf, (int)sizeof buf, MPI_CHAR, st.MPI_SOURCE, NOTE_TAG, r->ncomm,
                 MPI_STATUS_IGNORE) != MPI_SUCCESS)
        return -1;
    buf[sizeof buf - 1] = '\0';
    *got = 1;
    *from = st.MPI_SOURCE;
    *kind = buf[0];
    size_t n = strnlen(buf + 1, NOTE_MAX - 1);
    memcpy(text, buf + 1, n);
    text[n] = '\0';
    if (*kind != 'A' && *from >= 0 && *from < r->world) r->left[*from] = *kind;
    return 0;
}

/* Inside a collective's wait: an abort or a failed rank's leave ends it at once
 * with that rank's sentence. A clean leave means its sender finished every
 * collective it will make, so its last parts are already on their way (sent
 * before the leave, on the same link): the wait goes on for LEAVE_GRACE_S, and
 * only if it is still missing parts then does it fail, saying that rank ended
 * its run while this one waited for it. */
#define LEAVE_GRACE_S 2.0
static int note_check(pt_mpi_coll *c, const char *what, char *err, size_t errlen) {
    pt_mpi_coll *r = root_of(c);
    int got = 0, from = -1;
    char kind = 0, text[NOTE_MAX];
    if (!note_recv(r, &got, &from, &kind, text) && got) {
        if (kind == 'A') {
            r->heard = 1;
            set_broken(c);
            return pt_fail(err, errlen, PT_ERR_BACKEND, "rank %d stopped: %s", from, text);
        }
        if (kind == 'B') {
            r->heard = 1;
            set_broken(c);
            return pt_fail(err, errlen, PT_ERR_BACKEND,
                           "[dist] %s: rank %d ended its run after a failure (closed the "
                           "plugin's group) while this rank waited for it; its own output says "
                           "why",
                           what, from);
        }
        if (r->clean_from < 0) {
            r->clean_from = from;
            r->clean_at = pt_now_s();
        }
    }
    if (r->clean_from >= 0 && pt_now_s() > r->clean_at + LEAVE_GRACE_S) {
        r->heard = 1;
        set_broken(c);
        return pt_fail(err, errlen, PT_ERR_BACKEND,
                       "[dist] %s: rank %d ended its run (closed the plugin's group) while this "
                       "rank waited for it; it stopped without saying why through the plugin "
                       "(its own output does)",
                       what, r->clean_from);
    }
    return PT_OK;
}

/* Posts notice `slot` (0 abort, 1 leave) of kind with sentence why to every peer. */
static void note_send(pt_mpi_coll *r, int slot, char kind, const char *why) {
    char *m = r->nbuf[slot];
    m[0] = kind;
    snprintf(m + 1, NOTE_MAX + 1, "%s", why ? why : "");
    int n = (int)strlen(m + 1) + 2;
    for (int p = 0; p < r->world; p++)
        if (p != r->rank)
            MPI_Isend(m, n, MPI_CHAR, p, NOTE_TAG, r->ncomm, &r->nreq[slot * r->world + p]);
}

void pt_mpi_coll_abort(pt_mpi_coll *c, const char *why) {
    if (!c) return;
    pt_mpi_coll *r = root_of(c);
    set_broken(c);
    /* one abort per rank; a rank that heard another's has nothing to add: that
     * rank told every rank */
    if (r->world < 2 || r->told || r->heard || r->ncomm == MPI_COMM_NULL || !r->nreq) return;
    note_send(r, 0, 'A', why);
    r->told = 1;
}

/* Close's leave round on the outermost group: this rank's leave to every peer,
 * and every peer's collected, for [dist] timeout at most (a peer may still be
 * working, e.g. rank 0 writing a file, or may never close this group: a host
 * that ends without finalizing one rank's context). Afterwards the group is
 * marked broken (no finalize: that would wait for a peer that is gone) when a
 * peer aborted or left after a failure, or this rank is broken itself; a clean
 * rank whose peers were merely slow finalizes as before. */
static void note_close(pt_mpi_coll *c) {
    if (c->ncomm == MPI_COMM_NULL || c->world < 2 || !c->nreq) return;
    int broken = is_broken(c);
    note_send(c, 1, broken ? 'B' : 'L', "");
    double deadline = pt_now_s() + c->timeout_s;
    int late = 0;
    for (;;) {
        int all = 1;
        for (int p = 0; p < c->world; p++)
            if (p != c->rank && !c->left[p]) all = 0;
        if (all) break;
        int got = 0, from = -1;
        char kind = 0, text[NOTE_MAX];
        if (note_recv(c, &got, &from, &kind, text)) {
            broken = 1;
            break;
        }
        if (got) {
            if (kind != 'L') broken = 1;
            continue;
        }
        if (pt_now_s() > deadline) {
            late = 1;
            break;
        }
        pause_briefly();
    }
    for (int p = 0; p < c->world; p++)
        if (p != c->rank && c->left[p] && c->left[p] != 'L') broken = 1;
    /* this rank's notices: taken by every peer that collected the leaves; any
     * still out (a late or gone peer) are left to MPI */
    for (;;) {
        int done = 0;
        if (MPI_Testall(2 * c->world, c->nreq, &done, MPI_STATUSES_IGNORE) != MPI_SUCCESS) {
            broken = 1;
            done = 0;
        }
        if (done) break;
        if (late || broken || pt_now_s() > deadline) {
            for (int i = 0; i < 2 * c->world; i++)
                if (c->nreq[i] != MPI_REQUEST_NULL) MPI_Request_free(&c->nreq[i]);
            break;
        }
        pause_briefly();
    }
    if (broken) set_broken(c);
}

/* Tag of the start-up exchange on MPI_COMM_WORLD (before the plugin has a
 * communicator of its own); a host's traffic would have to use this tag during
 * the plugin's init to be confused with it. */
#define DECLARE_TAG 0x5054

/* Every rank sends every other the world size and rank its host declared
 * (pt_host_v1), so that a disagreement is a sentence on every rank, before
 * MPI_Comm_dup, which every rank must call, and without waiting past
 * [dist] timeout for a rank that never arrives. On a miss c->broken is set:
 * MPI_Finalize would wait for the missing rank. */
static int check_declared(pt_mpi_coll *c, const pt_coll_config *cfg, int w, int r, char *err,
                          size_t errlen) {
    int mine[2] = {cfg->world_size, cfg->rank};
    int *got = calloc((size_t)w * 2, sizeof *got);
    MPI_Request *req = calloc((size_t)w * 2, sizeof *req);
    if (!got || !req) {
        free(got);
        free(req);
        return pt_fail(err, errlen, PT_ERR_HOST_OOM, "out of host memory for collectives");
    }
    got[2 * r] = mine[0];
    got[2 * r + 1] = mine[1];
    int n = 0, rc = PT_OK;
    for (int p = 0; p < w; p++) {
        if (p == r) continue;
        if (MPI_Irecv(got + 2 * p, 2, MPI_INT, p, DECLARE_TAG, MPI_COMM_WORLD, &req[n++]) ||
            MPI_Isend(mine, 2, MPI_INT, p, DECLARE_TAG, MPI_COMM_WORLD, &req[n++])) {
            rc = pt_fail(err, errlen, PT_ERR_BACKEND, "[dist]: posting the start-up exchange "
                                                      "with rank %d failed",
                         p);
            break;
        }
    }
    double deadline = pt_now_s() + cfg->timeout_s;
    for (int done = 0; !rc && !done;) {
        if (MPI_Testall(n, req, &done, MPI_STATUSES_IGNORE) != MPI_SUCCESS) {
            rc = pt_fail(err, errlen, PT_ERR_BACKEND, "[dist]: the start-up exchange of the "
                                                      "ranks' world sizes failed");
        } else if (!done && pt_now_s() > deadline) {
            int miss = -1;
            for (int i = 0; i < n && miss < 0; i += 2) {
                int f = 0;
                MPI_Test(&req[i], &f, MPI_STATUS_IGNORE);
                if (!f) miss = i / 2 < r ? i / 2 : i / 2 + 1;
            }
            rc = pt_fail(err, errlen, PT_ERR_BACKEND,
                         "[dist]: rank %d did not join the start-up exchange within [dist] "
                         "timeout = %g s (this is rank %d of %d)",
                         miss, cfg->timeout_s, r, w);
        } else if (!done) {
            pause_briefly();
        }
    }
    if (rc) set_broken(c);   /* messages may still be in flight: no finalize */
    for (int p = 0; !rc && p < w; p++)
        if (got[2 * p] != w || got[2 * p + 1] != p)
            rc = pt_fail(err, errlen, PT_ERR_CONFIG,
                         "[dist]: %s mismatch: the host of MPI's rank %d%s declares "
                         "world_size %d and rank %d in pt_host_v1, but MPI started %d "
                         "process(es); start every rank with mpirun -np N and pass MPI's "
                         "numbers",
                         got[2 * p] != w ? "world size" : "rank", p,
                         p == r ? " (this process)" : "", got[2 * p], got[2 * p + 1], w);
    free(got);
    free(req);
    return rc;
}

int pt_mpi_coll_open(const pt_coll_config *cfg, pt_mpi_coll **out, char *err, size_t errlen) {
    *out = NULL;
    int inited = 0, finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized)
        return pt_fail(err, errlen, PT_ERR_UNSUPPORTED,
                       "[dist]: MPI was already finalized in this process (an earlier plugin "
                       "instance or the host); MPI cannot start twice");
    MPI_Initialized(&inited);
    pt_mpi_coll *c = calloc(1, sizeof *c);
    if (!c) return pt_fail(err, errlen, PT_ERR_HOST_OOM, "out of host memory for collectives");
    /* calloc's zero is not MPI_COMM_NULL in every MPI (Open MPI's is the address
     * of a library object): a close before the dup must see "no communicator" */
    c->comm = MPI_COMM_NULL;
    c->ncomm = MPI_COMM_NULL;
    c->clean_from = -1;
    if (!inited) {
        /* The plugin is dlopened RTLD_LOCAL; Open MPI's own components are
         * dlopened later and need libmpi's symbols global. Promote it (it is
         * already loaded as our dependency, NOLOAD only changes its scope). */
        (void)dlopen("libmpi.so.40", RTLD_NOW | RTLD_GLOBAL | RTLD_NOLOAD);
        int prov = 0;
        if (MPI_Init_thread(NULL, NULL, MPI_THREAD_FUNNELED, &prov) != MPI_SUCCESS) {
            free(c);
            return pt_fail(err, errlen, PT_ERR_BACKEND,
                           "[dist] init_method = %s: MPI_Init_thread failed (run the host under "
                           "mpirun)",
                           cfg->init_method);
        }
        c->we_init = 1;
    }
    /* MPI_COMM_WORLD's default handler aborts the process on an error; while
     * the plugin calls MPI on it, errors come back as codes (the host's own
     * handler is put back afterwards) */
    MPI_Errhandler host_eh = MPI_ERRHANDLER_NULL;
    int have_eh = MPI_Comm_get_errhandler(MPI_COMM_WORLD, &host_eh) == MPI_SUCCESS;
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    int w = 0, r = 0;
    int rc = PT_OK;
    if (MPI_Comm_size(MPI_COMM_WORLD, &w) != MPI_SUCCESS ||
        MPI_Comm_rank(MPI_COMM_WORLD, &r) != MPI_SUCCESS)
        rc = pt_fail(err, errlen, PT_ERR_BACKEND,
                     "[dist]: MPI could not tell this process's rank and world size");
    if (!rc) rc = check_declared(c, cfg, w, r, err, errlen);
    /* MPI_Comm_dup is collective: only once every rank is known to call it */
    if (!rc && MPI_Comm_dup(MPI_COMM_WORLD, &c->comm) != MPI_SUCCESS) {
        c->comm = MPI_COMM_NULL;
        rc = pt_fail(err, errlen, PT_ERR_BACKEND, "[dist]: MPI_Comm_dup failed");
    }
    if (!rc && MPI_Comm_dup(MPI_COMM_WORLD, &c->ncomm) != MPI_SUCCESS) {
        c->ncomm = MPI_COMM_NULL;
        rc = pt_fail(err, errlen, PT_ERR_BACKEND, "[dist]: MPI_Comm_dup (notices) failed");
    }
    if (have_eh) {
        MPI_Comm_set_errhandler(MPI_COMM_WORLD, host_eh);
        MPI_Errhandler_free(&host_eh);
    }
    if (rc) {
        pt_mpi_coll_close(c);
        return rc;
    }
    c->world = w;
    c->rank = r;
    c->root_broken = &c->broken;
    c->timeout_s = cfg->timeout_s;
    c->hang_rank = cfg->debug_hang_rank;
    /* a failed peer must become an error we report, not an abort inside MPI */
    MPI_Comm_set_errhandler(c->comm, MPI_ERRORS_RETURN);
    MPI_Comm_set_errhandler(c->ncomm, MPI_ERRORS_RETURN);
    c->recv = malloc((size_t)(w > 1 ? w - 1 : 1) * SEG_ELEMS * sizeof(double));
    c->req = calloc((size_t)(2 * w), sizeof *c->req);
    c->left = calloc((size_t)w, 1);
    c->nreq = malloc(sizeof *c->nreq * (size_t)(2 * w));
    for (int i = 0; c->nreq && i < 2 * w; i++) c->nreq[i] = MPI_REQUEST_NULL;
    if (!c->recv || !c->req || !c->left || !c->nreq) {
        pt_mpi_coll_close(c);
        return pt_fail(err, errlen, PT_ERR_HOST_OOM, "out of host memory for collectives");
    }
    *out = c;
    return PT_OK;
}

void pt_mpi_coll_close(pt_mpi_coll *c) {
    if (!c) return;
    /* a host that finalized MPI and exits without finalize: the plugin's
     * unload closes the group, and no MPI call may follow MPI_Finalize */
    int done = 0;
    MPI_Finalized(&done);
    if (!done && !c->parent) note_close(c);
    if (!done && !c->broken && !(c->root_broken && *c->root_broken)) {
        if (c->comm != MPI_COMM_NULL) MPI_Comm_free(&c->comm);
        if (c->ncomm != MPI_COMM_NULL) MPI_Comm_free(&c->ncomm);
        if (c->we_init) MPI_Finalize();
    }
    free(c->recv);
    free(c->req);
    free(c->left);
    free(c->nreq);
    free(c);
}

void pt_mpi_coll_mark_broken(pt_mpi_coll *c) {
    if (c) set_broken(c);
}

int pt_mpi_coll_rank(const pt_mpi_coll *c) { return c ? c->rank : 0; }
int pt_mpi_coll_world(const pt_mpi_coll *c) { return c ? c->world : 1; }

int pt_mpi_coll_split(pt_mpi_coll *c, int color, int key, pt_mpi_coll **sub, char *err,
                      size_t errlen) {
    *sub = NULL;
    if (!c || color < 0)
        return pt_fail(err, errlen, PT_ERR_INVALID_ARG,
                       "[dist] sub-group: no group to split or a negative color %d", color);
    /* MPI_Comm_split has no deadline: a barrier with ours first, so a rank that
     * is gone is named instead of waited for */
    int rc = pt_mpi_coll_barrier(c, err, errlen);
    if (rc) return rc;
    pt_mpi_coll *s = calloc(1, sizeof *s);
    if (!s) return pt_fail(err, errlen, PT_ERR_HOST_OOM, "out of host memory for a sub-group");
    s->comm = MPI_COMM_NULL;
    s->ncomm = MPI_COMM_NULL;
    s->clean_from = -1;
    s->parent = c;
    s->root_broken = c->root_broken;
    s->timeout_s = c->timeout_s;
    s->hang_rank = -1;
    if (MPI_Comm_split(c->comm, color, key, &s->comm) != MPI_SUCCESS) {
        free(s);
        set_broken(c);
        return pt_fail(err, errlen, PT_ERR_BACKEND, "[dist] sub-group: MPI_Comm_split failed");
    }
    MPI_Comm_set_errhandler(s->comm, MPI_ERRORS_RETURN);
    MPI_Comm_size(s->comm, &s->world);
    MPI_Comm_rank(s->comm, &s->rank);
    /* testing: the rank told to hang in c hangs in its sub-groups too */
    if (c->rank == c->hang_rank) s->hang_rank = s->rank;
    s->recv = malloc((size_t)(s->world > 1 ? s->world - 1 : 1) * SEG_ELEMS * sizeof(double));
    s->req = calloc((size_t)(2 * s->world), sizeof *s->req);
    if (!s->recv || !s->req) {
        pt_mpi_coll_close(s);
        return pt_fail(err, errlen, PT_ERR_HOST_OOM, "out of host memory for a sub-group");
    }
    *sub = s;
    return PT_OK;
}

/* Tests the nreq requests req[] (the first nrecv receive from peer[i], the
 * rest send to peer[i]) until all are done or, with deadline >= 0, until the
 * deadline passes; deadline < 0 tests each once (*left: how many are still
 * out). On a miss names the first peer whose message is outstanding; `label`
 * says which collective ("collective 12", "bucket 3"). */
static int test_reqs_n(pt_mpi_coll *c, MPI_Request *req, int nreq, int nrecv, const int *peer,
                       const int *want, double deadline, const char *what, const char *label,
                       int *left_out, char *err, size_t errlen) {
    for (;;) {
        int left = 0;
        for (int i = 0; i < nreq; i++) {
            if (req[i] == MPI_REQUEST_NULL) continue;
            int done = 0;
            MPI_Status stt;
            int rc = MPI_Test(&req[i], &done, &stt);
            if (rc != MPI_SUCCESS) {
                char t[MPI_MAX_ERROR_STRING];
                set_broken(c);
                return pt_fail(err, errlen, PT_ERR_BACKEND,
                               "[dist] %s (%s): the message %s rank %d failed: %s", what, label,
                               i < nrecv ? "from" : "to", peer[i], mpi_text(rc, t, sizeof t));
            }
            if (!done) {
                left++;
            } else if (want && i < nrecv) {   /* a shorter message would go unnoticed */
                int got = -1;
                MPI_Get_count(&stt, MPI_BYTE, &got);
                if (got != want[i]) {
                    set_broken(c);
                    return pt_fail(err, errlen, PT_ERR_BACKEND, "[dist] %s (%s): rank %d sent %d "
                                                                "bytes where this rank expected %d (the ranks disagree on "
                                                                "what they exchange)",
                                   what, label, peer[i], got, want[i]);
                }
            }
        }
        if (left_out) *left_out = left;
        if (!left || deadline < 0) return PT_OK;
        if (pt_now_s() > deadline) {
            for (int i = 0; i < nreq; i++)
                if (req[i] != MPI_REQUEST_NULL) {
                    set_broken(c);
                    return pt_fail(err, errlen, PT_ERR_BACKEND,
                                   "[dist] %s (%s): rank %d did not %s within "
                                   "[dist] timeout = %g s (it exited, hung or fell behind); "
                                   "this rank stops",
                                   what, label, peer[i],
                                   i < nrecv ? "send its part" : "take this rank's part",
                                   c->timeout_s);
                }
        }
        int nrc = note_check(c, what, err, errlen);
        if (nrc) return nrc;
        pause_briefly();
    }
}

static int test_reqs(pt_mpi_coll *c, MPI_Request *req, int nreq, int nrecv, const int *peer,
                     double deadline, const char *what, const char *label, int *left_out,
                     char *err, size_t errlen) {
    return test_reqs_n(c, req, nreq, nrecv, peer, NULL, deadline, what, label, left_out, err,
                       errlen);
}

/* Waits for the 2*(W-1) requests of the current blocking collective. */
static int wait_all(pt_mpi_coll *c, int nreq, const int *peer, double deadline, const char *what,
                    char *err, size_t errlen) {
    char label[32];
    snprintf(label, sizeof label, "collective %u", c->seq);
    return test_reqs(c, c->req, nreq, nreq / 2, peer, deadline, what, label, NULL, err, errlen);
}

/* What every collective does first: refuse on a broken group, count it (tags,
 * error text; keyed operations are not counted: their tags come from their
 * key), and play the hung rank when a test asks for one. */
static int begin_n(pt_mpi_coll *c, int count, const char *what, char *err, size_t errlen) {
    if (is_broken(c))
        return pt_fail(err, errlen, PT_ERR_BACKEND,
                       "[dist] %s: an earlier collective failed; the group is broken", what);
    if (count) c->seq++;
    if (c->rank == c->hang_rank) {
        /* testing: behave like a rank stuck outside the collective; the others
         * must time out and name this rank (mpirun then ends this one) */
        double until = pt_now_s() + 20 * c->timeout_s + 10;
        while (pt_now_s() < until) pause_briefly();
        set_broken(c);
        return pt_fail(err, errlen, PT_ERR_BACKEND, "[dist] %s: [testing] debug_hang_rank = %d: "
                                                    "this rank hung on purpose",
                       what, c->hang_rank);
    }
    return PT_OK;
}

static int begin(pt_mpi_coll *c, const char *what, char *err, size_t errlen) {
    return begin_n(c, 1, what, err, errlen);
}

/* dst[e] = src[0][e] + src[1][e] + ... + src[w-1][e] for m elements of dtype,
 * added in rank order with the first addend taken as is (not added to 0, so
 * -0 and NaN payloads match a single rank's accumulation); f32 sums stay f32,
 * as a single rank accumulating micro-batches adds in f32 too. dst may be one
 * of the sources: each element is read from every source before it is written.
 * Every reduction of this transport (blocking, reduce-scatter, keyed) forms its
 * sum here, so they all leave the same bits. */
static void sum_ranks(void *dst, const char *const *src, int w, size_t m, int dtype) {
    if (dtype == PT_COLL_F32) {
        float *o = dst;
        for (size_t e = 0; e < m; e++) {
            float a = ((const float *)src[0])[e];
            for (int p = 1; p < w; p++) a += ((const float *)src[p])[e];
            o[e] = a;
        }
    } else {
        double *o = dst;
        for (size_t e = 0; e < m; e++) {
            double a = ((const double *)src[0])[e];
            for (int p = 1; p < w; p++) a += ((const double *)src[p])[e];
            o[e] = a;
        }
    }
}

/* src[p] for sum_ranks: this rank's own data, or peer p's slot of recv (the
 * slots skip this rank: p < rank at slot p, p > rank at slot p - 1) of stride
 * bytes each. */
static void rank_sources(const pt_mpi_coll *c, const char **src, const void *mine,
                         const void *recv, size_t stride) {
    for (int p = 0; p < c->world; p++)
        src[p] = p == c->rank ? (const char *)mine
                              : (const char *)recv + (size_t)(p < c->rank ? p : p - 1) * stride;
}

int pt_mpi_coll_allreduce(pt_mpi_coll *c, void *buf, size_t n, int32_t dtype, double scale,
                          const char *what, char *err, size_t errlen) {
    if (!c || c->world == 1) {
        pt_coll_scale(buf, n, dtype, scale);
        return PT_OK;
    }
    if (dtype != PT_COLL_F32 && dtype != PT_COLL_F64)
        return pt_fail(err, errlen, PT_ERR_INVALID_ARG, "[dist] %s: dtype %d is not f32 or f64",
                       what, (int)dtype);
    int brc = begin(c, what, err, errlen);
    if (brc) return brc;
    size_t es = dtype == PT_COLL_F64 ? 8 : 4;
    MPI_Datatype mt = dtype == PT_COLL_F64 ? MPI_DOUBLE : MPI_FLOAT;
    int np = c->world - 1;
    int *peer = malloc(sizeof(int) * (size_t)(2 * np));
    const char **src = malloc(sizeof *src * (size_t)c->world);
    if (!peer || !src) {
        free(peer);
        free(src);
        return pt_fail(err, errlen, PT_ERR_HOST_OOM, "out of host memory");
    }
    double deadline = pt_now_s() + c->timeout_s;
    int rc = PT_OK;
    for (size_t off = 0; off < n || (n == 0 && off == 0); off += SEG_ELEMS) {
        size_t m = n - off < SEG_ELEMS ? n - off : SEG_ELEMS;
        char *mine = (char *)buf + off * es;
        int tag = (int)(c->seq & 0x3fff);   /* messages between two ranks stay ordered */
        int i = 0;
        for (int p = 0; p < c->world; p++) {
            if (p == c->rank) continue;
            int slot = p < c->rank ? p : p - 1;
            peer[i] = p;
            MPI_Irecv((char *)c->recv + (size_t)slot * SEG_ELEMS * es, (int)m, mt, p, tag,
                      c->comm, &c->req[i]);
            i++;
        }
        for (int p = 0; p < c->world; p++) {
            if (p == c->rank) continue;
            peer[i] = p;
            MPI_Isend(mine, (int)m, mt, p, tag, c->comm, &c->req[i]);
            i++;
        }
        if ((rc = wait_all(c, 2 * np, peer, deadline, what, err, errlen))) break;
        /* nothing to add for a barrier's empty buffer (NULL there) */
        if (m) {
            rank_sources(c, src, mine, c->recv, SEG_ELEMS * es);
            sum_ranks(mine, src, c->world, m, dtype);
        }
        if (n == 0) break;
    }
    free(peer);
    free(src);
    if (!rc) pt_coll_scale(buf, n, dtype, scale);
    return rc;
}

int pt_mpi_coll_barrier(pt_mpi_coll *c, char *err, size_t errlen) {
    return pt_mpi_coll_allreduce(c, NULL, 0, PT_COLL_F32, 1.0, "barrier", err, errlen);
}

/* Sharded collectives: every part is cut into the same number of segments
 * (SEG_ELEMS elements; a part shorter than another sends fewer, possibly zero,
 * elements in a segment), so every rank posts the same messages per segment and
 * the receive space stays bounded. Zero-length messages keep the pattern
 * uniform; MPI allows them. */
static size_t seg_len(size_t part_len, size_t off) {
    if (off >= part_len) return 0;
    return part_len - off < SEG_ELEMS ? part_len - off : SEG_ELEMS;
}

int pt_mpi_coll_allgather(pt_mpi_coll *c, void *buf, size_t n, size_t elem_size, const char *what,
                          char *err, size_t errlen) {
    if (!c || c->world == 1) return PT_OK;
    if (!elem_size || elem_size > 8 || (n && !buf))
        return pt_fail(err, errlen, PT_ERR_INVALID_ARG,
                       "[dist] %s: all-gather of %zu elements of %zu bytes from %p", what, n,
                       elem_size, buf);
    int brc = begin(c, what, err, errlen);
    if (brc) return brc;
    int np = c->world - 1;
    int *peer = malloc(sizeof(int) * (size_t)(2 * np));
    if (!peer) return pt_fail(err, errlen, PT_ERR_HOST_OOM, "out of host memory");
    size_t lo_me, len_me, s_part, z;
    pt_coll_part(n, c->world, 0, &z, &s_part);   /* rank 0 holds the longest part */
    pt_coll_part(n, c->world, c->rank, &lo_me, &len_me);
    double deadline = pt_now_s() + c->timeout_s;
    int rc = PT_OK;
    /* bytes travel as MPI_BYTE: the element type does not matter for a copy */
    for (size_t off = 0; off < s_part || off == 0; off += SEG_ELEMS) {
        int tag = (int)(c->seq & 0x3fff), i = 0;
        for (int p = 0; p < c->world; p++) {
            if (p == c->rank) continue;
            size_t lo, len;
            pt_coll_part(n, c->world, p, &lo, &len);
            size_t m = seg_len(len, off);
            peer[i] = p;
            MPI_Irecv((char *)buf + (lo + (m ? off : 0)) * elem_size, (int)(m * elem_size),
                      MPI_BYTE, p, tag, c->comm, &c->req[i]);
            i++;
        }
        size_t mm = seg_len(len_me, off);
        for (int p = 0; p < c->world; p++) {
            if (p == c->rank) continue;
            peer[i] = p;
            MPI_Isend((char *)buf + (lo_me + (mm ? off : 0)) * elem_size, (int)(mm * elem_size),
                      MPI_BYTE, p, tag, c->comm, &c->req[i]);
            i++;
        }
        if ((rc = wait_all(c, 2 * np, peer, deadline, what, err, errlen))) break;
        if (s_part == 0) break;
    }
    free(peer);
    return rc;
}

int pt_mpi_coll_reduce_scatter(pt_mpi_coll *c, void *buf, size_t n, int32_t dtype, double scale,
                               const char *what, char *err, size_t errlen) {
    if (!c || c->world == 1) {
        pt_coll_scale(buf, n, dtype, scale);
        return PT_OK;
    }
    if (dtype != PT_COLL_F32 && dtype != PT_COLL_F64)
        return pt_fail(err, errlen, PT_ERR_INVALID_ARG, "[dist] %s: dtype %d is not f32 or f64",
                       what, (int)dtype);
    if (n && !buf)
        return pt_fail(err, errlen, PT_ERR_INVALID_ARG, "[dist] %s: reduce-scatter of %zu "
                                                        "elements from NULL",
                       what, n);
    int brc = begin(c, what, err, errlen);
    if (brc) return brc;
    size_t es = dtype == PT_COLL_F64 ? 8 : 4;
    MPI_Datatype mt = dtype == PT_COLL_F64 ? MPI_DOUBLE : MPI_FLOAT;
    int np = c->world - 1;
    size_t lo_me, len_me, s_part, z;
    pt_coll_part(n, c->world, 0, &z, &s_part);
    pt_coll_part(n, c->world, c->rank, &lo_me, &len_me);
    int *peer = malloc(sizeof(int) * (size_t)(2 * np));
    const char **src = malloc(sizeof *src * (size_t)c->world);
    if (!peer || !src) {
        free(peer);
        free(src);
        return pt_fail(err, errlen, PT_ERR_HOST_OOM, "out of host memory");
    }
    double deadline = pt_now_s() + c->timeout_s;
    int rc = PT_OK;
    for (size_t off = 0; off < s_part || off == 0; off += SEG_ELEMS) {
        int tag = (int)(c->seq & 0x3fff), i = 0;
        size_t m = seg_len(len_me, off);   /* this segment of our part, from every peer */
        char *mine = (char *)buf + (lo_me + (m ? off : 0)) * es;
        for (int p = 0; p < c->world; p++) {
            if (p == c->rank) continue;
            int slot = p < c->rank ? p : p - 1;
            peer[i] = p;
            MPI_Irecv((char *)c->recv + (size_t)slot * SEG_ELEMS * es, (int)m, mt, p, tag,
                      c->comm, &c->req[i]);
            i++;
        }
        for (int p = 0; p < c->world; p++) {   /* peer p's part of our buffer goes to p */
            if (p == c->rank) continue;
            size_t lo, len;
            pt_coll_part(n, c->world, p, &lo, &len);
            size_t mp = seg_len(len, off);
            peer[i] = p;
            MPI_Isend((char *)buf + (lo + (mp ? off : 0)) * es, (int)mp, mt, p, tag, c->comm,
                      &c->req[i]);
            i++;
        }
        if ((rc = wait_all(c, 2 * np, peer, deadline, what, err, errlen))) break;
        /* the same sum pt_coll_allreduce forms */
        if (m) {
            rank_sources(c, src, mine, c->recv, SEG_ELEMS * es);
            sum_ranks(mine, src, c->world, m, dtype);
        }
        if (s_part == 0) break;
    }
    free(peer);
    free(src);
    if (!rc) pt_coll_scale((char *)buf + lo_me * es, len_me, dtype, scale);
    return rc;
}

/* Personalised exchange: each pair's bytes travel as their own messages, cut
 * into segments of A2A_SEG bytes (MPI counts are ints), all posted at once;
 * a pair with nothing to exchange posts nothing (both sides derive the same
 * counts, so they agree on the segments; messages with one tag between two
 * ranks match in the order posted). */
#define A2A_SEG ((size_t)1 << 23)

static size_t n_segs(size_t bytes) { return (bytes + A2A_SEG - 1) / A2A_SEG; }

int pt_mpi_coll_alltoallv(pt_mpi_coll *c, const void *send, const size_t *soff,
                          const size_t *scount, void *recv, const size_t *roff,
                          const size_t *rcount, const char *what, char *err, size_t errlen) {
    int me = c ? c->rank : 0, w = c ? c->world : 1;
    if (scount[me] != rcount[me])
        return pt_fail(err, errlen, PT_ERR_INVALID_ARG, "[dist] %s: this rank sends itself %zu "
                                                        "bytes but expects %zu",
                       what, scount[me], rcount[me]);
    if (scount[me]) memcpy((char *)recv + roff[me], (const char *)send + soff[me], scount[me]);
    if (!c || w == 1) return PT_OK;
    int brc = begin(c, what, err, errlen);
    if (brc) return brc;
    size_t nr = 0, ns = 0;
    for (int p = 0; p < w; p++)
        if (p != me) nr += n_segs(rcount[p]), ns += n_segs(scount[p]);
    MPI_Request *req = malloc(sizeof *req * (nr + ns + 1));
    int *peer = malloc(sizeof *peer * (nr + ns + 1)), *want = malloc(sizeof *want * (nr + 1));
    if (!req || !peer || !want || nr + ns > (size_t)1 << 30) {
        free(req);
        free(peer);
        free(want);
        return pt_fail(err, errlen, PT_ERR_HOST_OOM, "[dist] %s: out of host memory for %zu "
                                                     "messages",
                       what, nr + ns);
    }
    int tag = (int)(c->seq & 0x3fff), i = 0;
    for (int p = 0; p < w; p++)
        for (size_t off = 0; p != me && off < rcount[p]; off += A2A_SEG) {
            size_t m = rcount[p] - off < A2A_SEG ? rcount[p] - off : A2A_SEG;
            peer[i] = p;
            want[i] = (int)m;
            MPI_Irecv((char *)recv + roff[p] + off, (int)m, MPI_BYTE, p, tag, c->comm, &req[i++]);
        }
    for (int p = 0; p < w; p++)
        for (size_t off = 0; p != me && off < scount[p]; off += A2A_SEG) {
            size_t m = scount[p] - off < A2A_SEG ? scount[p] - off : A2A_SEG;
            peer[i] = p;
            MPI_Isend((const char *)send + soff[p] + off, (int)m, MPI_BYTE, p, tag, c->comm,
                      &req[i++]);
        }
    char label[32];
    snprintf(label, sizeof label, "collective %u", c->seq);
    int rc = test_reqs_n(c, req, i, (int)nr, peer, want, pt_now_s() + c->timeout_s, what, label,
                         NULL, err, errlen);
    free(req);
    free(peer);
    free(want);
    return rc;
}

/* ---- keyed nonblocking all-reduce ----
 * Tags: blocking collectives use their count modulo 0x4000, keyed operations
 * 0x4000 + key, so the two never match each other (MPI guarantees tags up to
 * 32767). Messages with one tag between two ranks arrive in the order sent, so
 * the same key reused in the next step cannot be confused with this one's: a
 * rank reposts a key only after its previous operation on it completed. */
#define OP_SEG ((size_t)1 << 28)   /* elements per message: within MPI's int count */

struct pt_mpi_op {
    void *buf;
    size_t n;
    int32_t dtype;
    double scale;
    int key, nreq, done;
    char what[96];
    void *recv;          /* [(W-1) * n] the peers' buffers, slot by rank order */
    MPI_Request *req;    /* [nreq]: receives, then sends */
    int *peer;           /* [nreq] */
};

int pt_mpi_coll_iallreduce(pt_mpi_coll *c, void *buf, size_t n, int32_t dtype, double scale, int32_t key,
                           const char *what, pt_mpi_op **out, char *err, size_t errlen) {
    *out = NULL;
    if (dtype != PT_COLL_F32 && dtype != PT_COLL_F64)
        return pt_fail(err, errlen, PT_ERR_INVALID_ARG, "[dist] %s: dtype %d is not f32 or f64",
                       what, (int)dtype);
    if (key < 0 || key >= PT_COLL_KEYS || (n && !buf))
        return pt_fail(err, errlen, PT_ERR_INVALID_ARG,
                       "[dist] %s: nonblocking all-reduce with key %d (want 0..%d) of %zu "
                       "elements from %p",
                       what, (int)key, PT_COLL_KEYS - 1, n, buf);
    pt_mpi_op *op = calloc(1, sizeof *op);
    if (!op) return pt_fail(err, errlen, PT_ERR_HOST_OOM, "out of host memory");
    op->buf = buf;
    op->n = n;
    op->dtype = dtype;
    op->scale = scale;
    op->key = key;
    snprintf(op->what, sizeof op->what, "%s", what);
    *out = op;
    if (!c || c->world == 1) {   /* nothing to wait for: the result is formed now */
        pt_coll_scale(buf, n, dtype, scale);
        op->done = 1;
        return PT_OK;
    }
    int brc = begin_n(c, 0, what, err, errlen);
    if (brc) {
        pt_mpi_coll_op_free(c, op);
        *out = NULL;
        return brc;
    }
    size_t es = dtype == PT_COLL_F64 ? 8 : 4, nseg = n ? (n + OP_SEG - 1) / OP_SEG : 1;
    int np = c->world - 1;
    op->nreq = (int)(2 * (size_t)np * nseg);
    op->recv = malloc((size_t)np * n * es + 1);
    op->req = malloc(sizeof *op->req * (size_t)op->nreq);
    op->peer = malloc(sizeof *op->peer * (size_t)op->nreq);
    if (!op->recv || !op->req || !op->peer) {
        free(op->req);
        op->req = NULL;   /* nothing posted: freeing it breaks nothing */
        pt_mpi_coll_op_free(c, op);
        *out = NULL;
        return pt_fail(err, errlen, PT_ERR_HOST_OOM, "out of host memory for the all-reduce of %s",
                       what);
    }
    for (int i = 0; i < op->nreq; i++) op->req[i] = MPI_REQUEST_NULL;
    MPI_Datatype mt = dtype == PT_COLL_F64 ? MPI_DOUBLE : MPI_FLOAT;
    int tag = 0x4000 + key, half = op->nreq / 2, i = 0;
    for (int p = 0; p < c->world; p++) {
        if (p == c->rank) continue;
        int slot = p < c->rank ? p : p - 1;
        for (size_t j = 0; j < nseg; j++, i++) {
            size_t off = j * OP_SEG, m = n - off < OP_SEG ? n - off : OP_SEG;
            op->peer[i] = op->peer[half + i] = p;
            MPI_Irecv((char *)op->recv + ((size_t)slot * n + off) * es, (int)m, mt, p, tag,
                      c->comm, &op->req[i]);
            MPI_Isend((char *)buf + off * es, (int)m, mt, p, tag, c->comm, &op->req[half + i]);
        }
    }
    return PT_OK;
}

/* Every message is in: buf = scale * (buf_0 + ... + buf_{W-1}), element by
 * element in rank order, the first addend taken as is (the additions and the
 * multiply pt_coll_allreduce makes, in the same order, so the same bits). */
static void op_finish(pt_mpi_coll *c, pt_mpi_op *op) {
    size_t es = op->dtype == PT_COLL_F64 ? 8 : 4;
    const char *src[c->world];
    rank_sources(c, src, op->buf, op->recv, op->n * es);
    sum_ranks(op->buf, src, c->world, op->n, op->dtype);
    pt_coll_scale(op->buf, op->n, op->dtype, op->scale);
    op->done = 1;
}

static int op_progress(pt_mpi_coll *c, pt_mpi_op *op, double deadline, int *done, char *err,
                       size_t errlen) {
    *done = op->done;
    if (op->done) return PT_OK;
    if (is_broken(c) && deadline >= 0)
        return pt_fail(err, errlen, PT_ERR_BACKEND,
                       "[dist] %s: an earlier collective failed; the group is broken", op->what);
    char label[32];
    snprintf(label, sizeof label, "bucket %d", op->key);
    int left = 1;
    int rc = test_reqs(c, op->req, op->nreq, op->nreq / 2, op->peer, deadline, op->what, label,
                       &left, err, errlen);
    if (rc) return rc;
    if (!left) op_finish(c, op);
    *done = op->done;
    return PT_OK;
}

int pt_mpi_coll_op_test(pt_mpi_coll *c, pt_mpi_op *op, int *done, char *err, size_t errlen) {
    return op_progress(c, op, -1, done, err, errlen);
}

int pt_mpi_coll_op_wait(pt_mpi_coll *c, pt_mpi_op *op, char *err, size_t errlen) {
    int done = 0;
    return op_progress(c, op, pt_now_s() + (c ? c->timeout_s : 0), &done, err, errlen);
}

void pt_mpi_coll_op_free(pt_mpi_coll *c, pt_mpi_op *op) {
    if (!op) return;
    if (!op->done && op->req) {
        /* abandoned with messages out: they could match a later operation's */
        for (int i = 0; i < op->nreq; i++)
            if (op->req[i] != MPI_REQUEST_NULL) {
                MPI_Cancel(&op->req[i]);
                MPI_Request_free(&op->req[i]);
            }
        if (c) set_broken(c);
    }
    free(op->recv);
    free(op->req);
    free(op->peer);
    free(op);
}
