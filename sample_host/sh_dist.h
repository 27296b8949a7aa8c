/*
 * sh_dist.h — sample_host under mpirun: which rank this process is.
 *
 * sample_host includes only host_api headers, so it never calls MPI itself: it
 * reads the rank and world size that the launcher puts in the environment
 * (Open MPI's OMPI_COMM_WORLD_*, else the PMI_* of MPICH's hydra) and passes
 * them to the plugin in pt_host_v1, which runs the collectives (and checks the
 * numbers against MPI's). Data parallel: rank r of W takes batch r of every W
 * the sampler draws, so 2 ranks see exactly the batches one rank with
 * --grad-accum 2 sees as its two micro-batches; rank 0 alone prints, writes
 * --metrics and --save.
 */
#ifndef SH_DIST_H
#define SH_DIST_H

#include <stddef.h>

#include "sh_config.h"

/* Fills c->world, c->rank, c->local_rank from the environment (1, 0, 0 when not
 * launched by an MPI launcher); on rank > 0 turns off what only rank 0 does
 * (output, metrics, save). 0, or -1 with one sentence in err (bad numbers, or
 * options that do not work with several ranks yet). */
int sh_dist_setup(sh_config *c, char *err, size_t errlen);

#endif /* SH_DIST_H */
