/*
 * planner.h — the planner subsystem's interface. Pure computation on a
 * profile: it never touches the device or the chunk store.
 *   trace.h        what a profile holds (per-block times and bytes, chunks, rates)
 *   trace_cache.h  profiles on disk, keyed by model and device
 *   cost_model.h   predicted peak and iteration time of a plan
 *   placement.h    which blocks swap / checkpoint for given counts
 *   searcher.h     the four-knob search
 *   plan.h         the chosen plan as text and JSON
 *   ds_estimates.h DeepSpeed ZeRO-2/3 memory estimates (planner CLI)
 *   timeline_svg.h the predicted memory of one step, window by window, as SVG
 * Code outside runtime/planner includes this header only.
 */
#ifndef PT_PLANNER_H
#define PT_PLANNER_H

#include "trace.h"
#include "trace_cache.h"
#include "cost_model.h"
#include "placement.h"
#include "searcher.h"
#include "plan.h"
#include "ds_estimates.h"
#include "timeline_svg.h"

#endif
