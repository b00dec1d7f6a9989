/* The small seeded generators the engine derives its random values from
 * (initial weights, LoRA's initial A, the data order): keyed by a seed and,
 * where values must not depend on what else exists, by a tensor's name. */
#ifndef MT_BASE_RNG_H
#define MT_BASE_RNG_H

#include <stdint.h>

/* splitmix64: advances *s and returns the next 64 random bits. */
static inline uint64_t mt_splitmix64(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* FNV-1a of a string: a name as part of a seed. */
static inline uint64_t mt_fnv1a64(const char *s) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (; *s; s++) h = (h ^ (uint8_t)*s) * 0x100000001b3ull;
    return h;
}

#endif
