/* A frozen base kept quantized: the planner's counts.
 *
 * In a LoRA run the base never changes, so its decoder layers' linear
 * weights can stay in the format they are stored in (FP8 block-scaled,
 * MXFP4) or were quantized to on load (NF4/FP4 with load_in_4bit): their
 * host home, what crosses the link when they stream and their device copy
 * when resident are counted at that format's bytes (codes plus scales,
 * base/quant.h's mt_quant_bytes_per_param), and a block in use holds a
 * working copy of them in the run's working dtype, dequantized on the
 * device just before its forward and again before its backward.
 *
 * What stays in the working dtype (the conventions): the router, norms,
 * biases, embeddings and lm_head, everything outside the decoder layers,
 * trainable weights (full fine-tuning of a quantized checkpoint is planned
 * dequantized) and the adapters.  MXFP4 as gpt-oss ships it quantizes only
 * the routed experts (its modules_to_not_convert lists attention). */
#ifndef MT_SCHEDULER_BASEQUANT_H
#define MT_SCHEDULER_BASEQUANT_H

#include <stdbool.h>
#include <stdint.h>

#include "base/quant_elem.h"
#include "scheduler/costmodel.h"
#include "scheduler/hw.h"
#include "scheduler/registry.h"

typedef struct {
    bool on;                  /* false: the base is planned in the working dtype */
    mt_quant_format_t format;
    int64_t block;            /* FP8: the square block's side (128); MXFP4: 32; NF4/FP4: 64; INT4: the group */
    bool double_quant;        /* NF4/FP4: absmax quantized again (bnb_4bit_use_double_quant) */
    bool experts_only;        /* only routed experts' weights are quantized */
    bool experts_wide;        /* routed experts stay in the working dtype (a transformers 5 bitsandbytes checkpoint) */
} sched_base_quant_t;

/* Whether registry tensor t (of a model with num_blocks blocks) is kept
 * quantized under q: a frozen weight of a decoder layer that a linear
 * layer multiplies by (not a norm, bias, router or attention sink). */
bool sched_base_quant_covers(const sched_tensor_t *t, int num_blocks, const sched_base_quant_t *q);

/* Rewrites w's weight bytes for q (nothing when !q->on): homes, fetches and
 * resident copies at the stored format's size, per block a working copy of
 * the tensors in use added to its forward and backward temporaries, and
 * the dequantization (read the codes and scales, write the working copy at
 * device bandwidth) added to its forward, backward and recomputed forward.
 * Fills w->base_quant. */
void sched_workload_quantize_base(const sched_registry_t *reg, const sched_base_quant_t *q, const sched_hw_t *hw,
                                  sched_workload_t *w);

#endif
