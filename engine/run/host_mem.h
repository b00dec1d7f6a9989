/* Host memory accounting for reports: jemalloc's own statistics
 * (allocated, active, resident) and the process's peak resident set.
 * Under the ASan build host allocations use the system allocator (so ASan
 * sees every buffer) and the jemalloc numbers read as 0. */
#ifndef MT_ENGINE_HOST_MEM_H
#define MT_ENGINE_HOST_MEM_H

#include <stdbool.h>
#include <stddef.h>

typedef struct {
    bool jemalloc;          /* false when built without it */
    size_t allocated;       /* bytes the application holds */
    size_t active;          /* bytes in active pages */
    size_t resident;        /* bytes physically resident in jemalloc's pages */
    size_t peak_rss;        /* process peak resident set (getrusage) */
} eng_host_mem_t;

eng_host_mem_t eng_host_mem_read(void);

#endif
