/* Helpers shared by the staging tests (see staging_testutil.h). */
#include "moe/staging_testutil.h"
#include "base/clock.h"

#include <stdlib.h>
#include <time.h>

kern_device_t *staging_test_device(size_t budget, double bytes_per_s, double latency_s) {
    kern_device_opts_t o = {.device_budget_bytes = budget, .host_threads = 1, .link_h2d_bytes_per_s = bytes_per_s,
                            .link_d2h_bytes_per_s = bytes_per_s, .link_latency_s = latency_s};
    kern_device_t *dev = NULL;
    mt_error_t err = {0};
    if (kern_device_create(KERN_BACKEND_CPU, &o, &dev, &err) != MT_OK) {
        fprintf(stderr, "cannot create the CPU device: %s\n", err.msg);
        exit(1);
    }
    return dev;
}

moe_staging_t *staging_test_pool_slabs(kern_device_t *dev, moe_staging_mode_t mode, size_t capacity,
                                       size_t max_tensor, bool pack_thread, int slabs) {
    moe_staging_opts_t o;
    moe_staging_opts_init(&o, mode);
    o.num_slabs = slabs;
    o.capacity_bytes = capacity;
    o.max_tensor_bytes = max_tensor;
    o.pack_thread = pack_thread;
    moe_staging_t *p = NULL;
    mt_error_t err = {0};
    if (moe_staging_create(dev, &o, &p, &err) != MT_OK) {
        fprintf(stderr, "cannot create a %s pool: %s\n", moe_staging_mode_name(mode), err.msg);
        exit(1);
    }
    return p;
}

moe_staging_t *staging_test_pool(kern_device_t *dev, moe_staging_mode_t mode, size_t capacity, size_t max_tensor,
                                 bool pack_thread) {
    return staging_test_pool_slabs(dev, mode, capacity, max_tensor, pack_thread, MOE_STAGING_SLABS_AUTO);
}

int staging_test_finish(const char *name, int failures) {
    if (failures) {
        fprintf(stderr, "%s: %d check(s) failed\n", name, failures);
        return 1;
    }
    printf("%s: all checks passed\n", name);
    return 0;
}
