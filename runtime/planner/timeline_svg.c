/*
 * timeline_svg.c — the SVG picture of timeline_svg.h.
 *
 * Layout: a plot area with the y axis in bytes (ticks in MiB or GiB, chosen
 * so there are about five), one bar per window on the x axis, a legend to the
 * right. Coordinates are printed with one decimal: enough for a picture and
 * keeps the file small for models with hundreds of windows. Every string that
 * comes from outside (the title: a device name) is XML-escaped; the rest is
 * ASCII we write ourselves.
 */
#include "timeline_svg.h"
#include "placement.h"
#include "protrain.h"
#include "base/base.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define MIB 1048576.0
#define GIB 1073741824.0

/* Canvas and margins, user units (= px). */
enum { W = 1100,
       H = 520,
       ML = 96,
       MR = 300,
       MT = 64,
       MB = 96 };   /* MR: room for the legend */

typedef struct cat {
    const char *name, *color;
} cat;
/* Bottom to top: what never changes over the step first, so the moving part
 * (activations, scratch) reads as the skyline it is. */
static const cat CATS[] = {
    {"model states (persistent chunks)", "#4e79a7"},
    {"chunk buffers", "#76b7b2"},
    {"non-block (embedding, head)", "#b07aa1"},
    {"activations", "#f28e2b"},
    {"scratch", "#edc948"},
    {"fragmentation", "#bab0ac"},
};
#define NCAT ((int)(sizeof CATS / sizeof CATS[0]))

static uint64_t cat_bytes(const pt_mem_window *w, int c) {
    switch (c) {
    case 0: return w->model_state_bytes;
    case 1: return w->buffer_bytes;
    case 2: return w->nonblock_bytes;
    case 3: return w->activation_bytes;
    case 4: return w->scratch_bytes;
    default: return w->frag_bytes;
    }
}

void pt_timeline_window_name(const pt_mem_window *w, char *buf, size_t len) {
    switch (w->phase) {
    case PT_PHASE_EMBED_FWD: snprintf(buf, len, "embed fwd"); break;
    case PT_PHASE_FWD: snprintf(buf, len, "fwd %d", (int)w->block); break;
    case PT_PHASE_TURN: snprintf(buf, len, "turn"); break;
    case PT_PHASE_BWD: snprintf(buf, len, "bwd %d", (int)w->block); break;
    case PT_PHASE_EMBED_BWD: snprintf(buf, len, "embed bwd"); break;
    default: snprintf(buf, len, "?"); break;
    }
}

int32_t pt_timeline_peak_index(const pt_mem_window *win, int32_t n_win) {
    int32_t best = -1;
    for (int32_t i = 0; i < n_win; i++)
        if (best < 0 || win[i].total_bytes > win[best].total_bytes) best = i;
    return best;
}

static void put_escaped(FILE *f, const char *s) {
    for (; *s; s++) {
        switch (*s) {
        case '<': fputs("&lt;", f); break;
        case '>': fputs("&gt;", f); break;
        case '&': fputs("&amp;", f); break;
        case '"': fputs("&quot;", f); break;
        case '\'': fputs("&apos;", f); break;
        default:
            /* control characters are not allowed in XML 1.0 text */
            fputc((unsigned char)*s < 0x20 ? ' ' : *s, f);
        }
    }
}

/* Human size for labels: MiB below 1 GiB, else GiB. */
static void human(char *buf, size_t len, double bytes) {
    if (bytes < GIB)
        snprintf(buf, len, "%.1f MiB", bytes / MIB);
    else
        snprintf(buf, len, "%.2f GiB", bytes / GIB);
}

/* Tick unit for labels: MiB up to 2 GiB, GiB above. */
static double tick_unit(double top) { return top >= 2 * GIB ? GIB : MIB; }
/* A tick step of 1, 2 or 5 times a power of ten of the unit: round numbers
 * in the unit the labels use, at most about six ticks over [0, top]. */
static double tick_step(double top) {
    double unit = tick_unit(top), x = top / unit / 6, mag = pow(10, floor(log10(x > 0 ? x : 1e-9)));
    double m = x / mag, k = m <= 1 ? 1 : m <= 2 ? 2
                                     : m <= 5   ? 5
                                                : 10;
    return k * mag * unit;
}

/* The plot's geometry: the y range, the plot area and one bar's width. */
typedef struct geo {
    double ymax, pw, ph, bw;
} geo;
#define X(i) (ML + (i) * g->bw)
#define Y(b) (MT + g->ph - g->ph * (double)(b) / g->ymax)

/* Header, titles, the y grid and its labels. */
static void svg_head(FILE *f, const geo *g, const pt_timeline_svg_opts *o) {
    fprintf(f, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
    fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\" "
               "font-family=\"sans-serif\" font-size=\"12\">\n",
            W, H, W, H);
    fprintf(f, "<rect x=\"0\" y=\"0\" width=\"%d\" height=\"%d\" fill=\"white\"/>\n", W, H);
    fprintf(f, "<text x=\"%d\" y=\"22\" font-size=\"15\" font-weight=\"bold\">", ML);
    if (o->title) put_escaped(f, o->title);
    else fputs("Predicted device memory of one step", f);
    fprintf(f, "</text>\n");
    fprintf(f, "<text x=\"%d\" y=\"42\" fill=\"#444\">one bar per window, forward then backward; "
               "the stack is the cost model&apos;s terms, its top the predicted total</text>\n",
            ML);

    /* y grid and tick labels */
    double step = tick_step(g->ymax);
    fprintf(f, "<g stroke=\"#ddd\" stroke-width=\"1\">\n");
    for (double v = step; v < g->ymax; v += step)
        fprintf(f, "<line x1=\"%d\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\"/>\n", ML, Y(v), ML + g->pw, Y(v));
    fprintf(f, "</g>\n<g text-anchor=\"end\" fill=\"#333\">\n");
    double unit = tick_unit(g->ymax);
    int dec = step >= unit ? 0 : (int)ceil(-log10(step / unit) - 1e-9);
    for (double v = 0; v < g->ymax; v += step) {
        char t[32];
        snprintf(t, sizeof t, "%.*f %s", dec, v / unit, unit == GIB ? "GiB" : "MiB");
        fprintf(f, "<text x=\"%d\" y=\"%.1f\">%s</text>\n", ML - 6, Y(v) + 4, t);
    }
    fprintf(f, "</g>\n");
}

/* The stacked bars, the predicted total through their tops, the measured dots. */
static void svg_bars(FILE *f, const geo *g, const pt_mem_window *win, int32_t n,
                     const pt_timeline_svg_opts *o) {
    /* the stacked bars: one group per category so the legend colours match */
    for (int c = 0; c < NCAT; c++) {
        fprintf(f, "<g fill=\"%s\">\n", CATS[c].color);
        for (int32_t i = 0; i < n; i++) {
            uint64_t lo = 0, b = cat_bytes(&win[i], c);
            for (int d = 0; d < c; d++) lo += cat_bytes(&win[i], d);
            if (!b) continue;
            double y1 = Y(lo + b), y0 = Y(lo);
            fprintf(f, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\"/>\n", X(i) + g->bw * 0.1, y1,
                    g->bw * 0.8, y0 - y1);
        }
        fprintf(f, "</g>\n");
    }

    /* predicted total through the bar tops (a step line: a window's bytes hold for all of it) */
    fprintf(f, "<polyline fill=\"none\" stroke=\"#222\" stroke-width=\"1.5\" points=\"");
    for (int32_t i = 0; i < n; i++)
        fprintf(f, "%.1f,%.1f %.1f,%.1f ", X(i), Y(win[i].total_bytes), X(i + 1), Y(win[i].total_bytes));
    fprintf(f, "\"/>\n");
    if (o->measured) {
        fprintf(f, "<g fill=\"#d62728\">\n");
        for (int32_t i = 0; i < n; i++)
            if (o->measured[i])
                fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3\"/>\n", X(i) + g->bw / 2, Y(o->measured[i]));
        fprintf(f, "</g>\n");
    }
}

/* Capacity, usable budget, measured peak, and the predicted peak's marker. */
static void svg_marks(FILE *f, const geo *g, const pt_mem_window *win, int32_t n, int32_t pk,
                      const pt_timeline_svg_opts *o) {
    uint64_t peak = win[pk].total_bytes;
    /* capacity and usable budget */
    if (o->capacity_bytes) {
        char t[32];
        human(t, sizeof t, (double)o->capacity_bytes);
        fprintf(f, "<line x1=\"%d\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#c00\" stroke-width=\"1.5\" "
                   "stroke-dasharray=\"8,4\"/>\n",
                ML, Y(o->capacity_bytes), ML + g->pw, Y(o->capacity_bytes));
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\" fill=\"#c00\">capacity %s</text>\n", ML + g->pw - 4,
                Y(o->capacity_bytes) - 4, t);
    }
    if (o->budget_bytes && o->budget_bytes < o->capacity_bytes) {
        char t[32];
        human(t, sizeof t, (double)o->budget_bytes);
        fprintf(f, "<line x1=\"%d\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#e07000\" stroke-width=\"1\" "
                   "stroke-dasharray=\"3,3\"/>\n",
                ML, Y(o->budget_bytes), ML + g->pw, Y(o->budget_bytes));
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\" fill=\"#e07000\">usable %s</text>\n",
                ML + g->pw - 4, Y(o->budget_bytes) + 14, t);
    }

    if (o->measured_peak_bytes) {
        /* the step's measured peak (the allocator's high-water mark): one number, so a line */
        char t[32];
        human(t, sizeof t, (double)o->measured_peak_bytes);
        double y = Y(o->measured_peak_bytes);
        fprintf(f, "<line x1=\"%d\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#d62728\" stroke-width=\"1.5\" "
                   "stroke-dasharray=\"2,3\"/>\n",
                ML, y, ML + g->pw, y);
        /* below its line at the right end, clear of the peak label above the bars */
        fprintf(f, "<text id=\"measured-peak\" x=\"%.1f\" y=\"%.1f\" fill=\"#d62728\" "
                   "text-anchor=\"end\" stroke=\"white\" stroke-width=\"3\" paint-order=\"stroke\">"
                   "measured peak %llu B (%s)</text>\n",
                ML + g->pw - 4, y + 14, (unsigned long long)o->measured_peak_bytes, t);
    }
    /* the peak: marker and exact label (anchored so it stays inside the plot) */
    char pb[32], pn[32];
    human(pb, sizeof pb, (double)peak);
    pt_timeline_window_name(&win[pk], pn, sizeof pn);
    double px = X(pk) + g->bw / 2, py = Y(peak);
    const char *anchor = pk < n / 3 ? "start" : pk > 2 * n / 3 ? "end"
                                                               : "middle";
    fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"5\" fill=\"none\" stroke=\"#000\" stroke-width=\"2\"/>\n", px,
            py);
    fprintf(f, "<text id=\"peak\" x=\"%.1f\" y=\"%.1f\" text-anchor=\"%s\" font-weight=\"bold\" "
               "stroke=\"white\" stroke-width=\"3\" paint-order=\"stroke\">peak %llu B (%s) at %s"
               "</text>\n",
            px, py - 10, anchor, (unsigned long long)peak, pb, pn);
}

/* Axes, x labels (thinned to about 40 so they stay readable), titles. */
static void svg_axes(FILE *f, const geo *g, const pt_mem_window *win, int32_t n, int32_t pk) {
    fprintf(f, "<g stroke=\"#000\" stroke-width=\"1\">\n");
    fprintf(f, "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%.1f\"/>\n", ML, MT, ML, MT + g->ph);
    fprintf(f, "<line x1=\"%d\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\"/>\n", ML, MT + g->ph, ML + g->pw, MT + g->ph);
    fprintf(f, "</g>\n");
    int32_t every = n > 40 ? (n + 39) / 40 : 1;
    fprintf(f, "<g font-size=\"10\" fill=\"#333\" text-anchor=\"end\">\n");
    for (int32_t i = 0; i < n; i++) {
        if (i % every && i != pk) continue;
        char t[32];
        pt_timeline_window_name(&win[i], t, sizeof t);
        double x = X(i) + g->bw / 2, y = MT + g->ph + 10;
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" transform=\"rotate(-55 %.1f %.1f)\">%s</text>\n", x, y, x, y, t);
    }
    fprintf(f, "</g>\n");
    fprintf(f, "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\">window of one step (forward, turn = head and loss, "
               "backward; the optimizer step adds no device bytes)</text>\n",
            ML + g->pw / 2, H - 8);
    fprintf(f, "<text x=\"18\" y=\"%.1f\" text-anchor=\"middle\" transform=\"rotate(-90 18 %.1f)\">device bytes"
               "</text>\n",
            MT + g->ph / 2, MT + g->ph / 2);
}

/* The legend, top category first as in the stack. */
static void svg_legend(FILE *f, const geo *g, const pt_timeline_svg_opts *o) {
    double lx = ML + g->pw + 16, ly = MT + 4;
    fprintf(f, "<g>\n");
    for (int c = NCAT - 1; c >= 0; c--, ly += 20) {
        fprintf(f, "<rect x=\"%.1f\" y=\"%.1f\" width=\"14\" height=\"14\" fill=\"%s\"/>\n", lx, ly, CATS[c].color);
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\">%s</text>\n", lx + 20, ly + 11, CATS[c].name);
    }
    fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#222\" stroke-width=\"1.5\"/>\n", lx,
            ly + 7, lx + 14, ly + 7);
    fprintf(f, "<text x=\"%.1f\" y=\"%.1f\">predicted total</text>\n", lx + 20, ly + 11);
    ly += 20;
    if (o->capacity_bytes) {
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#c00\" stroke-width=\"1.5\" "
                   "stroke-dasharray=\"4,2\"/>\n",
                lx, ly + 7, lx + 14, ly + 7);
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\">device capacity</text>\n", lx + 20, ly + 11);
        ly += 20;
    }
    if (o->measured) {
        fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3\" fill=\"#d62728\"/>\n", lx + 7, ly + 7);
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\">measured</text>\n", lx + 20, ly + 11);
        ly += 20;
    }
    if (o->measured_peak_bytes) {
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#d62728\" stroke-width=\"1.5\" "
                   "stroke-dasharray=\"2,3\"/>\n",
                lx, ly + 7, lx + 14, ly + 7);
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\">measured peak</text>\n", lx + 20, ly + 11);
    }
}

int pt_timeline_svg_write(FILE *f, const pt_mem_window *win, int32_t n, const pt_timeline_svg_opts *o) {
    static const pt_timeline_svg_opts none = {0};
    if (!o) o = &none;
    if (!f || !win || n <= 0) return PT_ERR_INVALID_ARG;
    int32_t pk = pt_timeline_peak_index(win, n);
    uint64_t peak = win[pk].total_bytes, top = peak;
    if (o->capacity_bytes > top) top = o->capacity_bytes;
    if (o->measured)
        for (int32_t i = 0; i < n; i++)
            if (o->measured[i] > top) top = o->measured[i];
    if (o->measured_peak_bytes > top) top = o->measured_peak_bytes;
    geo g;
    g.ymax = top > 0 ? (double)top * 1.08 : 1.0;   /* room above the highest line for its label */
    g.pw = W - ML - MR;
    g.ph = H - MT - MB;
    g.bw = g.pw / n;
    svg_head(f, &g, o);
    svg_bars(f, &g, win, n, o);
    svg_marks(f, &g, win, n, pk, o);
    svg_axes(f, &g, win, n, pk);
    svg_legend(f, &g, o);
    fprintf(f, "</g>\n</svg>\n");
    return ferror(f) ? PT_ERR_IO : PT_OK;
}
#undef X
#undef Y

void pt_timeline_free(pt_timeline *tl) {
    if (!tl) return;
    free(tl->win);
    memset(tl, 0, sizeof *tl);
}

int pt_timeline_from_plan(const pt_trace *t, const pt_plan *plan, pt_timeline *tl, char *err, size_t errlen) {
    memset(tl, 0, sizeof *tl);
    pt_cost_ctx *cx = NULL;
    int rc = pt_cost_ctx_new(t, &cx, err, errlen);
    if (rc) return rc;
    int32_t n = pt_cost_n_windows(cx);
    tl->win = calloc((size_t)n, sizeof *tl->win);
    if (!tl->win) {
        pt_cost_ctx_free(cx);
        return pt_fail(err, errlen, PT_ERR_HOST_OOM, "memory timeline: out of memory");
    }
    /* the plan's own mode map: the runtime runs it, whatever placement would say today */
    const uint8_t *modes = plan->modes && plan->n_block == t->n_block ? plan->modes : NULL;
    rc = pt_cost_mem_windows(cx, &plan->opts, &plan->knobs, modes, tl->win, n, NULL, err, errlen);
    pt_cost_ctx_free(cx);
    if (rc) {
        pt_timeline_free(tl);
        return rc;
    }
    tl->n = n;
    tl->capacity = plan->capacity;
    tl->budget = plan->budget;
    snprintf(tl->title, sizeof tl->title, "Predicted device memory of one step: %s, %d blocks, modes ",
             plan->device, (int)plan->n_block);
    size_t len = strlen(tl->title);
    for (int32_t b = 0; b < plan->n_block && modes && len + 1 < sizeof tl->title; b++)
        tl->title[len++] = modes[b] == PT_BLOCK_SWAP ? 'S' : modes[b] == PT_BLOCK_CKPT ? 'C'
                                                                                       : 'N';
    tl->title[len] = 0;
    return PT_OK;
}

int pt_timeline_write_file(const pt_timeline *tl, const uint64_t *measured, uint64_t measured_peak_bytes,
                           const char *path, char *err, size_t errlen) {
    pt_timeline_svg_opts o = {tl->title, tl->capacity, tl->budget, measured, measured_peak_bytes};
    FILE *f = fopen(path, "w");
    if (!f) return pt_fail(err, errlen, PT_ERR_IO, "memory timeline: cannot write %s: %s", path, strerror(errno));
    int rc = pt_timeline_svg_write(f, tl->win, tl->n, &o);
    if (fclose(f) && !rc) rc = PT_ERR_IO;
    if (rc) pt_fail(err, errlen, rc, "memory timeline: writing %s failed", path);
    return rc;
}

int pt_timeline_svg_plan(const pt_trace *t, const pt_plan *plan, const uint64_t *measured, const char *path,
                         char *err, size_t errlen) {
    pt_timeline tl;
    int rc = pt_timeline_from_plan(t, plan, &tl, err, errlen);
    if (!rc) rc = pt_timeline_write_file(&tl, measured, 0, path, err, errlen);
    pt_timeline_free(&tl);
    return rc;
}
