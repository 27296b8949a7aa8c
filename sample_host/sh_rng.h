/*
 * sh_rng.h — sample_host's own deterministic PRNG (splitmix64). Every random choice
 * (init, batch offsets, sampling) comes from a stream derived from --seed, so one seed
 * gives one run, bit for bit, on any machine.
 */
#ifndef SH_RNG_H
#define SH_RNG_H

#include <math.h>
#include <stdint.h>

typedef struct sh_rng {
    uint64_t s;
} sh_rng;

/* Streams: independent sequences from one seed (init, train batches, generation). */
enum { SH_STREAM_INIT = 1,
       SH_STREAM_BATCH = 2,
       SH_STREAM_GEN = 3 };

static inline uint64_t sh_rng_next(sh_rng *r) {
    /* splitmix64: state += golden gamma; output = mix(state). */
    uint64_t z = (r->s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static inline void sh_rng_seed(sh_rng *r, uint64_t seed, uint64_t stream) {
    r->s = seed ^ (stream * 0xd1b54a32d192ed03ull);
    (void)sh_rng_next(r); /* decorrelate nearby seeds */
}

/* Uniform in [0,1) with 53 random bits. */
static inline double sh_rng_uniform(sh_rng *r) {
    return (double)(sh_rng_next(r) >> 11) * (1.0 / 9007199254740992.0);
}

/* Uniform integer in [0, n), n > 0 (modulo bias <= n / 2^64, negligible). */
static inline uint64_t sh_rng_below(sh_rng *r, uint64_t n) {
    return sh_rng_next(r) % n;
}

/* Standard normal by Box-Muller (one value per call; u1 in (0,1]). */
static inline double sh_rng_normal(sh_rng *r) {
    double u1 = 1.0 - sh_rng_uniform(r);
    double u2 = sh_rng_uniform(r);
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

#endif /* SH_RNG_H */
