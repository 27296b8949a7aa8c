/*
 * timeline_svg.h — the predicted device memory of one step as an SVG picture.
 *
 * One stacked bar per window of pt_cost_mem_windows (cost_model.h): model
 * states, chunk buffers, non-block, activations, scratch, fragmentation; the
 * predicted total as a line over the bars, the device capacity (and the
 * usable budget when reserve/headroom take some) as dashed lines, an optional
 * measured line, and the peak marked with its exact byte count, e.g.
 *   peak 47185920 B (45.0 MiB) at bwd 3
 * which is the plan's predicted peak: the bars are the terms of the maximum
 * the cost model takes. Plain fprintf, no dependency; readable in a browser.
 */
#ifndef PT_TIMELINE_SVG_H
#define PT_TIMELINE_SVG_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "cost_model.h"
#include "plan.h"
#include "trace.h"

typedef struct pt_timeline_svg_opts {
    const char *title;          /* first line of the heading; NULL: none (XML-escaped) */
    uint64_t capacity_bytes;    /* device capacity; 0: no line */
    uint64_t budget_bytes;      /* capacity - reserve - headroom; drawn when 0 < it < capacity */
    const uint64_t *measured;   /* [n_win] measured bytes per window, 0 = not measured; NULL: none */
    uint64_t measured_peak_bytes;   /* the step's measured peak (calibration); 0: no line */
} pt_timeline_svg_opts;

/* Short window name ("embed fwd", "fwd 3", "turn", "bwd 3", "embed bwd") into buf. */
void pt_timeline_window_name(const pt_mem_window *w, char *buf, size_t len);
/* Index of the first window with the largest total_bytes (the cost model's
 * own tie rule: the peak window is the first to reach the maximum); -1 when
 * n_win <= 0. */
int32_t pt_timeline_peak_index(const pt_mem_window *win, int32_t n_win);
/* Writes the picture to f. 0, or PT_ERR_INVALID_ARG (no windows) / PT_ERR_IO. */
int pt_timeline_svg_write(FILE *f, const pt_mem_window *win, int32_t n_win, const pt_timeline_svg_opts *o);
/* A plan's picture, kept so it can be written again once measurements come
 * (the plugin rewrites it after calibration with the measured peak). */
typedef struct pt_timeline {
    pt_mem_window *win;         /* [n], owned */
    int32_t n;
    uint64_t capacity, budget;
    char title[160];
} pt_timeline;
/* The plan's windows (its knobs, mode map and cost options on the trace it
 * was searched on). tl is overwritten; pt_timeline_free releases it. */
int pt_timeline_from_plan(const pt_trace *t, const pt_plan *plan, pt_timeline *tl, char *err, size_t errlen);
void pt_timeline_free(pt_timeline *tl);
/* Write tl to path (truncating). measured / measured_peak_bytes as in the options. */
int pt_timeline_write_file(const pt_timeline *tl, const uint64_t *measured, uint64_t measured_peak_bytes,
                           const char *path, char *err, size_t errlen);
/* pt_timeline_from_plan + pt_timeline_write_file. */
int pt_timeline_svg_plan(const pt_trace *t, const pt_plan *plan, const uint64_t *measured, const char *path,
                         char *err, size_t errlen);

#endif /* PT_TIMELINE_SVG_H */
