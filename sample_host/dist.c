/* dist.c — rank and world size from the MPI launcher's environment (sh_dist.h). */
#include "sh_dist.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The first of the names that is set, as an int >= 0; -1 when none is; -2 when
 * one is set to something that is not such a number. */
static int env_int(const char *a, const char *b, const char **which) {
    const char *names[2] = {a, b};
    for (int i = 0; i < 2; i++) {
        const char *v = names[i] ? getenv(names[i]) : NULL;
        if (!v) continue;
        *which = names[i];
        char *end;
        long x = strtol(v, &end, 10);
        return (*v && !*end && x >= 0 && x < (1 << 20)) ? (int)x : -2;
    }
    return -1;
}

int sh_dist_setup(sh_config *c, char *err, size_t errlen) {
    const char *nw = "", *nr = "", *nl = "";
    int w = env_int("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", &nw);
    int r = env_int("OMPI_COMM_WORLD_RANK", "PMI_RANK", &nr);
    int l = env_int("OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", &nl);
    c->world = 1;
    c->rank = 0;
    c->local_rank = 0;
    if (w == -1 && r == -1) return 0;   /* not launched by mpirun */
    if (w < 1 || r < 0 || r >= w || l == -2) {
        snprintf(err, errlen, "the MPI launcher's environment is inconsistent: %s = %s, %s = %s "
                              "(world size must be >= 1 and the rank in [0, size))",
                 nw,
                 *nw ? getenv(nw) : "unset", nr, *nr ? getenv(nr) : "unset");
        return -1;
    }
    c->world = w;
    c->rank = r;
    c->local_rank = l >= 0 ? l : 0;
    if (w == 1) return 0;
    if (c->no_plugin) {
        snprintf(err, errlen, "%d ranks need the plugin (it sums the gradients across ranks); "
                              "--no-plugin trains one rank only",
                 w);
        return -1;
    }
    if (r > 0) {
        /* the state is replicated on every rank: rank 0 speaks for all of them */
        c->quiet = 1;
        c->progress = 0;
        c->metrics[0] = '\0';
        /* --save stays: every rank reads the parameters back (in mode C that
         * gathers them from all ranks), rank 0 alone writes the file */
        c->write_shard[0] = '\0';
    }
    return 0;
}
