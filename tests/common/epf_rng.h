/* epf_rng.h — the reproducible random numbers of the tests and benchmarks (not part of the
 * library): one splitmix64 for every program.
 *   epf_rng_next(s)          the next 64 bits of the state *s
 *   epf_rng_in(s, lo, hi)    an int in [lo, hi] (hi - lo < 2^31)
 * Plain C99 (host code of C, C++ and CUDA programs). */
#ifndef EPF_RNG_H
#define EPF_RNG_H

#include <stdint.h>

static inline uint64_t epf_rng_next(uint64_t* s) {
  uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

static inline int epf_rng_in(uint64_t* s, int lo, int hi) {
  return lo + (int)(epf_rng_next(s) % (uint64_t)(hi - lo + 1));
}

#endif /* EPF_RNG_H */
