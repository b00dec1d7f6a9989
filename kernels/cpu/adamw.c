/* The CPU backend's AdamW table entry: the host AdamW (kernels/host) over
 * the backend's kernel pool, since on this backend device memory is host
 * memory. */
#include "kernels/adamw.h"
#include "kernels/cpu/backend_cpu.h"
#include "kernels/host/adamw_host.h"

/* The backend defines this; a weak reference lets the kernels link without
 * the backend. A non-NULL stream exists only when the backend made it, so
 * then the symbol is always there. */
#pragma weak kern_cpu_stream_threadpool

void kern_adamw_cpu(kern_stream_t *s, float *p, const kern_moments_t *mom, const float *g,
                    const uint16_t *g_bf16, uint16_t *p_bf16, size_t n,
                    const kern_adamw_params_t *hp) {
    kern_threadpool_t *pool = NULL;
    if (s && kern_cpu_stream_threadpool) pool = kern_cpu_stream_threadpool(s);
    kern_adamw_cpu_pool(pool, p, mom, g, g_bf16, p_bf16, n, hp);
}

void kern_adamw_many_cpu(kern_stream_t *s, const kern_adamw_item_t *items, int count) {
    for (int i = 0; i < count; i++) {
        const kern_adamw_item_t *it = &items[i];
        kern_adamw_cpu(s, it->p, &it->mom, it->g, it->g_bf16, it->p_bf16, it->n, &it->hp);
    }
}
