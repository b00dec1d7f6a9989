/* Tensor-core attention through cuDNN's fused SDPA (the graph/backend C
 * API): kern_attention_fwd_tc_cuda / kern_attention_bwd_tc_cuda of
 * kernels/attention.h are defined in attention_cudnn.c; this header adds
 * what tests and benchmarks ask of the path beyond the op table.
 *
 * Plans are built once per (B, T, nh, nkv, hd, window, padding) and stream
 * and kept in the stream's cache (kern_stream.cudnn_attn); a shape cuDNN
 * refuses is remembered as refused, with cuDNN's reason, and is not tried
 * again. */
#ifndef MT_KERNELS_CUDNN_ATTENTION_CUDNN_H
#define MT_KERNELS_CUDNN_ATTENTION_CUDNN_H

#include <stdbool.h>
#include <stddef.h>

#include "kernels/device.h"

#ifdef __cplusplus
extern "C" {
#endif

/* What the last tc call on stream s did: "cudnn" (handled), or why it was
 * not handled (copied into why, at most why_len bytes).  deterministic:
 * for a handled backward, whether the chosen engine is the deterministic
 * one (cuDNN's dP-workspace backward, whose numerical notes do not say
 * NONDETERMINISTIC); forwards are always deterministic. */
typedef struct {
    bool handled;
    bool deterministic;
    char why[512];
} kern_cudnn_attn_report_t;

void kern_cudnn_attn_last(kern_stream_t *s, kern_cudnn_attn_report_t *out);

/* The cuDNN version the process runs against (cudnnGetVersion), 0 when the
 * library cannot be loaded. */
size_t kern_cudnn_version(void);

#ifdef __cplusplus
}
#endif

#endif
