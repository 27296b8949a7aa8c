/*
 * placement.h — which block gets which activation mode.
 *
 * The searcher only chooses the COUNTS n_swap and n_checkpoint; this rule turns
 * them into a per-block map (PT_BLOCK_NONE / CKPT / SWAP, trace.h).
 *
 * The rule, for N blocks, s = n_swap, c = n_checkpoint, swap interval I >= 1:
 *  1. Swap region (only when s > 0). Block 0 is SWAP; the s SWAP blocks follow
 *     one another with g = min(c, (s-1)(I-1)) CKPT blocks spread over the s-1
 *     gaps between them as evenly as possible (earlier gaps take the extra
 *     one). When c >= (s-1)(I-1) every gap holds exactly I-1 CKPT blocks, so
 *     consecutive SWAP blocks are exactly I apart.
 *     Why: a SWAP block's arena leaves over PCIe while the following blocks
 *     compute; I is the number of block-forwards one arena's D2H needs, so with
 *     I blocks between swaps each D2H is hidden and at most one swap is in
 *     flight. The blocks in between are CKPT because they too release their
 *     arena right after their forward, so nothing piles up while the D2H
 *     runs; and a NONE block never precedes a SWAP block, so in backward
 *     (reverse order) every NONE arena is freed before the first swap-in
 *     needs room. Swapping early gives each D2H the most compute to hide
 *     behind and brings the arenas back last, after memory was freed.
 *     When fewer than (s-1)(I-1) CKPT blocks exist the swaps move closer
 *     rather than letting a NONE block into the swap region; the cost model
 *     charges the resulting D2H queue (longer in-flight arenas, exposed time).
 *  2. The remaining r = c - g CKPT blocks are spread evenly, centred, over the
 *     R = N - (end of the swap region) blocks after it: offset
 *     floor((2k+1) R / (2r)) for k = 0..r-1. In backward the late blocks'
 *     chunks are still cached (no re-upload to hide behind), and the early ones
 *     are persistent; the middle is where recompute overlaps chunk traffic.
 *  3. Everything else is NONE; NONE blocks end the model whenever r < R/2.
 * Properties (tested): counts exact; every SWAP precedes every NONE; CKPT
 * blocks only between or after SWAP blocks; SWAP spacing == I when
 * c >= (s-1)(I-1) (possible iff s + (s-1)(I-1) <= N, implied by s*I <= N).
 */
#ifndef PT_PLACEMENT_H
#define PT_PLACEMENT_H

#include <stddef.h>
#include <stdint.h>

#include "trace.h"

/* Swap interval: smallest integer I >= 1 with T_D2H(arena_b) <= I * fwd_s[b],
 * taken as the maximum over blocks (blocks with fwd_s == 0 or no arena are
 * skipped), so that every block's swap is hidden. */
int pt_place_swap_interval(const pt_trace *t);

/* Largest n_swap the searcher tries: ceil(n_block / interval). */
int pt_place_swap_cap(int n_block, int interval);

/* Fill modes[n_block] by the rule above. 0, or PT_ERR_INVALID_ARG with err
 * filled when counts are negative or n_swap + n_checkpoint > n_block. */
int pt_place_blocks(int n_block, int n_swap, int n_checkpoint, int interval, uint8_t *modes,
                    char *err, size_t errlen);

/* "SSCNCNNN"-style string: S = swap, C = checkpoint, N = none. buf gets at most
 * len-1 characters (a trailing '~' marks truncation). */
void pt_place_modes_string(const uint8_t *modes, int n_block, char *buf, size_t len);

#endif /* PT_PLACEMENT_H */
