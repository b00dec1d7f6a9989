/* What attention_cudnn.c (the plan cache and execution) and
 * attention_cudnn_graph.c (the graphs and the engine choice) share, private
 * to kernels/cudnn: the graph tensors' ids, a plan's key and the plan. */
#ifndef MT_KERNELS_CUDNN_ATTENTION_CUDNN_GRAPH_H
#define MT_KERNELS_CUDNN_ATTENTION_CUDNN_GRAPH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cudnn.h>

/* Unique ids of the graph's tensors that the variant pack names. */
enum {
    U_Q = 1,
    U_K,
    U_V,
    U_O,
    U_STATS,
    U_DO,
    U_DQ,
    U_DK,
    U_DV,
    U_SCALE,
    U_SEQ_Q,
    U_SEQ_KV,
    U_NEG_INF,
    U_ONE,
    U_WINDOW,
    U_SOFTMAX_SUM,
    U_DQ_ACCUM,
    U_FIRST_VIRTUAL = 1000,
};

#define TC_MAX_DESCS 320
#define TC_MAX_OPS 64
#define TC_MAX_ENGINES 16
#define TC_ALIGN ((size_t)256)

typedef struct {
    int B, T, nh, nkv, hd, window; /* window 0: none (or >= T, the same) */
    bool pad;                      /* kv_len given: cuDNN's padding mask */
    bool seg;                      /* seg_start given: refused, remembered per shape */
    bool bwd;
} tc_key_t;

typedef struct tc_plan {
    tc_key_t key;
    bool ok;
    bool deterministic;
    bool dq_accum; /* the backward's fp32 dQ accumulator variant */
    bool mem_logged; /* a failed allocation was logged (once per shape) */
    char why[512];
    cudnnBackendDescriptor_t plan;
    int64_t workspace; /* cuDNN's own workspace bytes */
    /* The by-value scalars; the variant pack points at these. */
    float scale, neg_inf, one, window;
    cudnnBackendDescriptor_t descs[TC_MAX_DESCS]; /* everything the plan was built from */
    int ndescs;
    struct tc_plan *next;
} tc_plan_t;

/* Builds p's graph for p->key (set by the caller, the rest zero) and
 * finalizes a plan: p->ok, or p->why says why not.  A backward takes the
 * deterministic graph when an engine builds it, else the fp32 dQ
 * accumulator one (p->dq_accum, p->deterministic false). */
void kern_cudnn_plan_build(cudnnHandle_t h, tc_plan_t *p);
/* Destroys what p's plan was built from and marks it not built. */
void kern_cudnn_plan_clear(tc_plan_t *p);
/* "cuDNN WHAT failed: STATUS (cuDNN's last error)" into buf. */
void kern_cudnn_status_text(cudnnStatus_t st, const char *what, char *buf, size_t len);

#endif
