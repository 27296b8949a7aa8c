/*
 * dist_agree.h — ranks agree on everything that fixes the math before they
 * train together.
 *
 * Data-parallel ranks that differ in their model, optimizer, configuration or
 * data do not fail: they exchange gradients of different problems and each
 * trains something else, with exit 0 (or, where the difference changes the
 * collectives, they fail far from the cause, e.g. a truncated message inside
 * the profiler). So at each hook where new facts become known, and before
 * that hook's first collective, every rank describes its facts as canonical
 * text (one `name=value` per line, in a fixed order) and the ranks compare
 * it:
 *   1. a 64-bit FNV-1a digest of each rank's text is all-gathered (W * 8
 *      bytes); equal digests everywhere: agreed;
 *   2. otherwise the texts themselves are all-gathered (lengths first, then
 *      every text padded to the longest), and every rank finds the lowest
 *      rank r whose digest differs from rank 0's and the first line where r's
 *      text differs from rank 0's. Every rank so refuses with the same
 *      sentence: "rank r disagrees with rank 0 on NAME: VALUE_r vs VALUE_0".
 * Stages (each a no-op with one rank):
 *   init             plugin release and ABI minor, world size, device backend,
 *                    transport, the INI keys that fix the math or the order of
 *                    the collectives, and the host's pt_host_v1.fingerprint
 *                    (lines prefixed "host.");
 *   post_model_load  block and parameter counts, batch, sequence, arch, and per
 *                    parameter its name, dtype, shape, block, trainable, tie and
 *                    tensor-parallel split, then the FNV-1a 64 of each untied
 *                    parameter's initial values (a tensor-parallel split one's
 *                    among the ranks holding the same shard); then, agreed, a
 *                    tensor-parallel group with no split parameter is refused
 *                    (nothing would be averaged across it);
 *   create_optimizer the optimizer type and each hyper-parameter as it will be
 *                    resolved (the descriptor's value, else the INI's, and an
 *                    auto beta2 or weight_decay as the number it stands for, so
 *                    "auto" and that number agree), and the REKLS keys;
 *   first pre_step   n_micro of the first training step.
 * A rank that does not reach a stage makes the others fail at [dist] timeout
 * naming it (the collectives' deadline).
 */
#ifndef PT_DIST_AGREE_H
#define PT_DIST_AGREE_H

#include <stddef.h>
#include <stdint.h>

#include "coll/coll.h"
#include "protrain.h"

struct pt_rt;

/* The exchange: every rank of c passes its text (NUL-terminated); 0 when all
 * are equal, else PT_ERR_CONFIG with the sentence above, prefixed by stage. A
 * failed collective returns its own error. c NULL or one rank: 0. */
int pt_agree_texts(pt_coll *c, const char *stage, const char *text, char *err, size_t errlen);

/* The stages (see above); rt without collectives: 0. */
int pt_agree_init(struct pt_rt *rt, char *err, size_t errlen);
int pt_agree_model(struct pt_rt *rt, const pt_model_v1 *m, char *err, size_t errlen);
int pt_agree_optim(struct pt_rt *rt, const pt_optim_v1 *d, char *err, size_t errlen);
int pt_agree_micro(struct pt_rt *rt, int32_t n_micro, char *err, size_t errlen);

/* Keeps a copy of the host's fingerprint in rt and points rt->host.fingerprint
 * at it (the host's text need only live through init): the state files record
 * the run identity its "run." lines give (runtime/store/state_io.c). */
void pt_agree_keep_fingerprint(struct pt_rt *rt);

/* The host fingerprint's checks at init (any world size): NULL is fine; text
 * longer than PT_HOST_FINGERPRINT_MAX is refused with a sentence. */
int pt_agree_check_fingerprint(const char *fp, char *err, size_t errlen);

#endif
