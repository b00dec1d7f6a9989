/* Bulk fp32 -> bf16 conversion against the one-value rule (mt_f32_to_bf16)
 * over every class of input (ties both ways, subnormals, infinities, NaNs
 * of both signs with payloads, values that round up to infinity) and random
 * bit patterns, at lengths and offsets that leave vector tails. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/dtype.h"

static int failures;

static void check(const uint32_t *bits, size_t n, size_t offset) {
    float *src = malloc((n + offset) * sizeof *src);
    uint16_t *dst = malloc((n + offset) * sizeof *dst);
    if (!src || !dst) abort();
    memcpy(src + offset, bits, n * sizeof *bits);
    memset(dst, 0xAB, (n + offset) * sizeof *dst);
    mt_convert_from_f32(dst + offset, MT_BF16, src + offset, n);
    for (size_t i = 0; i < n; i++) {
        const uint16_t want = mt_f32_to_bf16(src[offset + i]);
        if (dst[offset + i] != want && failures++ < 10)
            fprintf(stderr, "dtype_test: %08x -> %04x, expected %04x (n %zu, offset %zu)\n", bits[i],
                    dst[offset + i], want, n, offset);
    }
    for (size_t i = 0; i < offset; i++)
        if (dst[i] != 0xABAB && failures++ < 10) fprintf(stderr, "dtype_test: wrote before the output\n");
    free(src);
    free(dst);
}

int main(void) {
    const uint32_t special[] = {
        0x00000000, 0x80000000, 0x00000001, 0x80000001, 0x007fffff, 0x00008000, 0x00018000, /* subnormals, ties */
        0x3f808000, 0x3f818000, 0x3f80ffff, 0x3f807fff, 0xbf808000, 0xbf818000,             /* ties to even */
        0x7f7fffff, 0xff7fffff, 0x7f7f8000, 0x7f7f7fff,                                     /* to infinity or not */
        0x7f800000, 0xff800000, 0x7f800001, 0xff800001, 0x7fc00000, 0xffc00000, 0x7fbfffff, /* inf, NaNs */
        0x7f80ffff, 0xffff0000, 0x7fff8000, 0x3f800000, 0x40490fdb, 0xc0490fdb,
    };
    const size_t ns = sizeof special / sizeof special[0];
    for (size_t off = 0; off < 9; off++)
        for (size_t n = 0; n <= ns; n++) check(special, n, off);
    enum { R = 1 << 22 };
    uint32_t *r = malloc(R * sizeof *r);
    if (!r) abort();
    uint64_t x = 0x9E3779B97F4A7C15ull;
    for (size_t i = 0; i < R; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        r[i] = (uint32_t)(x >> 11);
    }
    check(r, R, 3);
    check(r, R - 5, 0);
    free(r);
    if (failures) fprintf(stderr, "dtype_test: %d failure(s)\n", failures);
    else printf("dtype_test: all passed\n");
    return failures != 0;
}
