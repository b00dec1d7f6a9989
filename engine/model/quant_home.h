/* A frozen base matrix kept quantised in host memory: the home of a LoRA
 * run's frozen weight when its checkpoint stores it in FP8 with block
 * scales (kept as stored), or when the run quantises it on load
 * (load_in_4bit: bitsandbytes NF4 / FP4, optionally double-quantised).
 *
 * Every buffer the format needs (codes, scales, the nested absmax state)
 * lives in ONE host allocation, each at an offset aligned for its type, so
 * the tensor crosses the host link as one staged copy of `nbytes` and the
 * device rebuilds the view over its own copy with the same offsets
 * (eng_quant_home_view_at).  The executor calls the `dequant` kernel on that
 * copy to make the bf16 / fp32 working copy just before use
 * (engine/exec/place/copies.h).
 *
 * Which matrices are quantised follows the conventions of transformers'
 * bitsandbytes integration (eng_quant_home_role_ok): the linear layers of
 * attention and the MLP / experts; the embedding, norms, biases, routers,
 * Qwen2-MoE's one-row shared-expert gate and lm_head stay as they are. */
#ifndef MT_ENGINE_MODEL_QUANT_HOME_H
#define MT_ENGINE_MODEL_QUANT_HOME_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/quant.h"
#include "base/status.h"
#include "engine/model/desc/model_desc.h"

typedef struct {
    mt_quant_view_t view; /* the host view: its buffers point into bytes (pending: into the sources) */
    uint8_t *bytes;       /* (nbytes) codes, scales, nested state at the offsets below */
    size_t nbytes;        /* what crosses the link per fetch */
    /* offsets into bytes of each buffer, SIZE_MAX where the format has none */
    size_t off_codes, off_scales, off_scales_u8, off_zeros, off_absmax2, off_code2;
    /* Not packed yet (eng_quant_home_defer): bytes is NULL and the view's
     * buffers are the sources, mostly in the base checkpoint's mapping;
     * `owned` is the one source buffer the home allocated itself (FP8's
     * block scales widened to fp32), part_bytes each buffer's size. */
    bool pending;
    void *owned;
    size_t part_bytes[6];
} eng_quant_home_t;

/* Whether a parameter of this role is a linear layer's weight a quantised
 * base stores quantised (see the file note). */
bool eng_quant_home_role_ok(eng_param_role_t role);

/* Whether module `name` (a parameter's name, ".weight" dropped) is one of
 * skip[0..n): equal to an entry, or an entry as a dotted component
 * ("q_proj" skips "model.layers.0.self_attn.q_proj", "self_attn" every
 * projection under it) -- llm_int8_skip_modules' names. */
bool eng_quant_home_skipped(const char *name, const char (*skip)[128], int n);

/* Packs a checked view (host buffers, mt_quant_check passed) into one
 * allocation; `have` gives each buffer's element count. */
void eng_quant_home_pack(eng_quant_home_t *h, const mt_quant_view_t *q, const mt_quant_sizes_t *have);

/* The layout of a checked view without its bytes: the home stays pending,
 * reading its sources where they are (which must outlive it), until it is
 * packed (eng_quant_home_materialize) or written elsewhere from them
 * (eng_quant_home_fill) and let go (eng_quant_home_drop_bytes).  This is
 * how a base kept as stored reaches the NVMe tier without ever being
 * copied into host memory.  `owned` (may be NULL): a source buffer the
 * home now frees. */
void eng_quant_home_defer(eng_quant_home_t *h, const mt_quant_view_t *q, const mt_quant_sizes_t *have, void *owned);

/* A pending home packed into its own allocation, as eng_quant_home_pack
 * would have; a packed one is left as it is. */
void eng_quant_home_materialize(eng_quant_home_t *h);

/* h's nbytes, exactly as a packed home holds them (padding zeroed), written
 * to dst, from its bytes or, pending, from its sources. */
void eng_quant_home_fill(const eng_quant_home_t *h, void *dst);

/* x (rows * cols fp32) quantised as bitsandbytes' quantize_4bit does, packed
 * (`what` names the tensor in errors). */
mt_status_t eng_quant_home_bnb4(eng_quant_home_t *h, const float *x, int64_t rows, int64_t cols,
                                mt_quant_format_t fmt, bool double_quant, const char *what, mt_error_t *err);

/* The view over a copy of h->bytes at `base` (e.g. on the device). */
mt_quant_view_t eng_quant_home_view_at(const eng_quant_home_t *h, const void *base);

/* The host bytes (or a pending home's sources) let go, the layout kept
 * (nbytes, offsets, the view's shape and format; its buffers NULL): the
 * bytes live elsewhere (the NVMe tier) and are read through
 * eng_quant_home_view_at over a copy. */
void eng_quant_home_drop_bytes(eng_quant_home_t *h);

void eng_quant_home_free(eng_quant_home_t *h);

#endif
