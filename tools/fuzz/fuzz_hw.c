/* libFuzzer harness: the hardware profile reader (scheduler/hw.c).
 * The input is a profile's YAML text. An accepted profile's rates are read
 * back as the cost model reads them. */
#include <stddef.h>
#include <stdint.h>

#include "scheduler/hw.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    sched_hw_t hw;
    mt_error_t err = {0};
    if (sched_hw_parse((const char *)data, size, "hw.yaml", &hw, &err) != MT_OK) return 0;
    for (int r = 0; r < SCHED_RATE_COUNT; r++) (void)sched_hw_flops(&hw, (sched_rate_t)r);
    (void)sched_hw_device_bw(&hw);
    (void)sched_hw_h2d_bw(&hw);
    (void)sched_hw_d2h_bw(&hw);
    (void)sched_hw_host_bw(&hw);
    return 0;
}
