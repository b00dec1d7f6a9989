/* A directory's raw sequential O_DIRECT rates: one file written then read
 * in 1 MiB requests, at queue depth 1 and at a given depth, then removed.
 * What `moetune bench nvme` sets the store against, and what `--hw
 * calibrate` gives the planner for the NVMe tier of a run that has one. */
#ifndef MT_STORE_SIO_RATE_H
#define MT_STORE_SIO_RATE_H

#include <stdint.h>

#include "base/status.h"
#include "store/sio.h"

enum { MT_SIO_RATE_REQ = 1 << 20 }; /* bytes per raw request */

typedef struct {
    double write_1, write_q, read_1, read_q; /* bytes/s at queue depth 1 and at the given depth */
} mt_sio_rates_t;

/* `bytes` (rounded up to whole requests) through a file of dir of its own
 * (named with the process id, removed before returning, also on failure).
 * Errors name the file and the failing offset. */
mt_status_t mt_sio_measure_dir(const char *dir, uint64_t bytes, int queue_depth, mt_sio_kind_t kind,
                               mt_sio_rates_t *out, mt_error_t *err);

#endif
