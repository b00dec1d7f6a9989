/* Pinned bytes each staging mode needs for one in-flight window, without a
 * device (see staging.h).  `moetune plan` calls moe_staging_plan_all with
 * the tensors its plan keeps in flight at once.
 *
 * The model follows what each layout does at run time (staging.c):
 *  - compact packs tensors at `align`, so a window costs its payload plus
 *    less than `align` per tensor; the pool must still hold the largest
 *    tensor of the run in one slab even when the window is smaller.
 *  - per_tensor pins each tensor alone: page granularity (cudaHostAlloc,
 *    mmap), or with pow2_round the next power of two, as PyTorch's
 *    CachingHostAllocator rounds every pin_memory request (MemAscend: a
 *    129.5 MB tensor occupies 256 MB).  Both are reported by
 *    moe_staging_plan_all; the pool's per_tensor mode defaults to pages.
 *  - max_slot holds one tensor per slot and every slot is the size of the
 *    largest tensor (ZeRO-Infinity's swap buffers), so the same window
 *    needs one embedding-sized slot per tensor in flight. */
#include <string.h>

#include "moe/staging.h"

static size_t round_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

static size_t next_pow2(size_t x) {
    size_t p = 1;
    while (p < x) p <<= 1;
    return p;
}

static size_t pinned_block(size_t bytes, size_t page, bool pow2) {
    size_t b = bytes ? bytes : 1;
    if (pow2) b = next_pow2(b);
    return round_up(b, page);
}

static size_t largest(const size_t *t, int n, size_t at_least) {
    size_t m = at_least;
    for (int k = 0; k < n; k++)
        if (t[k] > m) m = t[k];
    return m;
}

size_t moe_staging_plan_bytes(moe_staging_mode_t mode, const size_t *t, int n, const moe_staging_plan_opts_t *o) {
    const moe_staging_plan_opts_t d = {0};
    if (!o) o = &d;
    const size_t align = o->align ? o->align : MOE_STAGING_DEFAULT_ALIGN;
    const size_t page = o->page_bytes ? o->page_bytes : MOE_STAGING_PAGE;
    const size_t big = largest(t, n, o->largest_tensor);
    size_t sum = 0;
    switch (mode) {
    case MOE_STAGING_COMPACT:
        for (int k = 0; k < n; k++) sum += round_up(t[k] ? t[k] : 1, align);
        return sum > round_up(big, align) ? sum : round_up(big, align);
    case MOE_STAGING_PER_TENSOR:
        for (int k = 0; k < n; k++) sum += pinned_block(t[k], page, o->pow2_round);
        return sum > pinned_block(big, page, o->pow2_round) ? sum : pinned_block(big, page, o->pow2_round);
    case MOE_STAGING_MAX_SLOT: {
        const size_t slots = o->slots > 0 ? (size_t)o->slots : (size_t)(n > 0 ? n : 1);
        return slots * round_up(big, align);
    }
    default: return 0;
    }
}

void moe_staging_plan_all(const size_t *t, int n, const moe_staging_plan_opts_t *o, moe_staging_plan_t *out) {
    const moe_staging_plan_opts_t d = {0};
    if (!o) o = &d;
    memset(out, 0, sizeof *out);
    out->tensors = n;
    for (int k = 0; k < n; k++) out->payload += t[k];
    out->largest_in_window = largest(t, n, 0);
    out->largest_tensor = largest(t, n, o->largest_tensor);
    moe_staging_plan_opts_t q = *o;
    out->compact = moe_staging_plan_bytes(MOE_STAGING_COMPACT, t, n, &q);
    q.pow2_round = false;
    out->per_tensor = moe_staging_plan_bytes(MOE_STAGING_PER_TENSOR, t, n, &q);
    q.pow2_round = true;
    out->per_tensor_pow2 = moe_staging_plan_bytes(MOE_STAGING_PER_TENSOR, t, n, &q);
    out->max_slot = moe_staging_plan_bytes(MOE_STAGING_MAX_SLOT, t, n, o);
    out->max_slot_slots = o->slots > 0 ? o->slots : (n > 0 ? n : 1);
}
