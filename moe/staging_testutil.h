/* Helpers shared by the staging tests (testonly): the EXPECT macro (each
 * test file defines `static int g_failures;`), a CPU device with throttled
 * links, pools with default settings, and the closing summary. */
#ifndef MT_MOE_STAGING_TESTUTIL_H
#define MT_MOE_STAGING_TESTUTIL_H

#include <stdio.h>

#include "moe/staging.h"

#define EXPECT(cond, ...)                                        \
    do {                                                         \
        if (!(cond)) {                                           \
            fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__); \
            fprintf(stderr, __VA_ARGS__);                        \
            fprintf(stderr, "\n");                               \
            g_failures++;                                        \
        }                                                        \
    } while (0)

double staging_test_now(void);
/* A CPU device; both links throttled to bytes_per_s and latency_s (0 = off).  Exits on failure. */
kern_device_t *staging_test_device(size_t budget, double bytes_per_s, double latency_s);
/* A pool with default settings but these; exits on failure. */
moe_staging_t *staging_test_pool_slabs(kern_device_t *dev, moe_staging_mode_t mode, size_t capacity,
                                       size_t max_tensor, bool pack_thread, int slabs);
moe_staging_t *staging_test_pool(kern_device_t *dev, moe_staging_mode_t mode, size_t capacity, size_t max_tensor,
                                 bool pack_thread);
/* Prints the summary; returns the process status. */
int staging_test_finish(const char *name, int failures);

#endif
