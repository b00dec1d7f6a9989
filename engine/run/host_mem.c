/* Host memory statistics (see host_mem.h). */
#include "engine/run/host_mem.h"

#include <stdint.h>
#include <sys/resource.h>

#ifndef MT_HOST_ALLOC_SYSTEM
#include <jemalloc/jemalloc.h>
#endif

eng_host_mem_t eng_host_mem_read(void) {
    eng_host_mem_t r = {0};
#ifndef MT_HOST_ALLOC_SYSTEM
    /* jemalloc caches its statistics; bumping the epoch refreshes them */
    uint64_t epoch = 1;
    size_t sz = sizeof epoch;
    mallctl("epoch", &epoch, &sz, &epoch, sz);
    size_t v;
    sz = sizeof v;
    if (mallctl("stats.allocated", &v, &sz, NULL, 0) == 0) {
        r.jemalloc = true;
        r.allocated = v;
    }
    if (mallctl("stats.active", &v, &sz, NULL, 0) == 0) r.active = v;
    if (mallctl("stats.resident", &v, &sz, NULL, 0) == 0) r.resident = v;
#endif
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) == 0) r.peak_rss = (size_t)ru.ru_maxrss * 1024;
    return r;
}
