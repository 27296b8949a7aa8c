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
    const uint64_t *measured;   /* [n_win] measured bytes per window, 0 = not measured; NULL: no line */
} pt_timeline_svg_opts;

/* Short window name ("embed fwd", "fwd 3", "turn", "bwd 3", "embed bwd") into buf. */
void pt_timeline_window_name(const pt_mem_window *w, char *buf, size_t len);
/* Index of the first window with the largest total_bytes (the cost model's
 * own tie rule: the peak window is the first to reach the maximum); -1 when
 * n_win <= 0. */
int32_t pt_timeline_peak_index(const pt_mem_window *win, int32_t n_win);
/* Writes the picture to f. 0, or PT_ERR_INVALID_ARG (no windows) / PT_ERR_IO. */
int pt_timeline_svg_write(FILE *f, const pt_mem_window *win, int32_t n_win, const pt_timeline_svg_opts *o);
/* The plan's predicted picture (its knobs, mode map and cost options on the
 * trace it was searched on) written to path. measured as above, may be NULL. */
int pt_timeline_svg_plan(const pt_trace *t, const pt_plan *plan, const uint64_t *measured, const char *path,
                         char *err, size_t errlen);

#endif /* PT_TIMELINE_SVG_H */
