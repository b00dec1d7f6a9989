/* The cuDNN graphs of tensor-core attention (attention_cudnn.c) and the
 * plan chosen for them, built with cuDNN's backend C API.
 *
 * The graphs are the ones NVIDIA's cudnn-frontend lowers its SDPA nodes to
 * for cuDNN 9.x before the unified SDPA/softmax/band-mask operations (its
 * CompositeSDPANode, CompositeSDPABackwardNode, CompositeSoftmaxNode and
 * CompositeDiagonalBandMaskNode): cuDNN recognises the pattern and runs one
 * fused flash-attention kernel, so the op list must match it closely.
 *
 * Forward:  S = Q K^T (fp32) -> * scale -> [padding mask: GEN_INDEX rows and
 *   columns, row < seq_q AND col < seq_kv, BINARY_SELECT -inf] -> causal
 *   (row >= col) -> [window: col + w > row] -> MAX -> SUB -> EXP -> ADD-reduce
 *   -> Stats = max + LOG(sum) -> P = exp / sum (bf16) -> O = P V.
 * Backward: softmax_sum = rowsum(dO * O) (fp32, in the workspace); S and the
 *   masks as above, P = EXP(S - Stats); dV = P^T dO, dP = dO V^T,
 *   dS = (dP - softmax_sum) * P * scale, dK = dS^T Q, dQ = dS K; with GQA
 *   dK and dV are products over the query heads reduced (ADD) over each
 *   group.  dQ comes straight out of its product in the deterministic
 *   variant (cuDNN's dP-workspace engine on Hopper) and through an fp32
 *   accumulator plus IDENTITY in the other, which cuDNN fills with atomics.
 *   The deterministic one is tried first; a backward that had to take the
 *   other says so (kern_cudnn_attn_last, and the once-per-shape log line).
 *
 * Checked against cuDNN's API log of PyTorch's cuDNN attention (frontend
 * 1.18 on cuDNN 9.19, H200, causal GQA forward and backward): the same
 * operations in the same order, the same virtual tensor types (GEN_INDEX
 * with FLOAT precision into INT32, CMP into BOOLEAN, P and the transposed
 * P and dS in bf16, the reshaped K in fp32), the scale, -inf and 1.0 passed
 * by value from host memory, ALPHA1/ALPHA2 on every pointwise op, and
 * softmax_sum and the dQ accumulator as workspace tensors.  PyTorch runs
 * the accumulator backward; the deterministic variant tried first here is
 * the graph cudnn-frontend builds when asked for a deterministic one. */
#include "kernels/cudnn/attention_cudnn_graph.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

/* ---- graph building, failures latched into the plan's `why` ---- */

typedef struct {
    tc_plan_t *p;
    cudnnHandle_t h;
    cudnnBackendDescriptor_t ops[TC_MAX_OPS];
    int nops;
    int64_t next_uid;
    bool failed;
} gb_t;

void kern_cudnn_status_text(cudnnStatus_t st, const char *what, char *buf, size_t len) {
    char last[256] = "";
    cudnnGetLastErrorString(last, sizeof last);
    snprintf(buf, len, "cuDNN %s failed: %s%s%s%s", what, cudnnGetErrorString(st), last[0] ? " (" : "", last,
             last[0] ? ")" : "");
}

static void gb_fail(gb_t *g, cudnnStatus_t st, const char *what) {
    if (g->failed) return;
    g->failed = true;
    kern_cudnn_status_text(st, what, g->p->why, sizeof g->p->why);
}

static cudnnBackendDescriptor_t gb_new(gb_t *g, cudnnBackendDescriptorType_t type, const char *what) {
    if (g->failed) return NULL;
    if (g->p->ndescs == TC_MAX_DESCS) {
        g->failed = true;
        snprintf(g->p->why, sizeof g->p->why, "attention graph needs more than %d cuDNN descriptors", TC_MAX_DESCS);
        return NULL;
    }
    cudnnBackendDescriptor_t d = NULL;
    cudnnStatus_t st = cudnnBackendCreateDescriptor(type, &d);
    if (st != CUDNN_STATUS_SUCCESS) {
        gb_fail(g, st, what);
        return NULL;
    }
    g->p->descs[g->p->ndescs++] = d;
    return d;
}

static void gb_set(gb_t *g, cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t attr,
                   cudnnBackendAttributeType_t type, int64_t n, const void *v, const char *what) {
    if (g->failed || d == NULL) return;
    cudnnStatus_t st = cudnnBackendSetAttribute(d, attr, type, n, v);
    if (st != CUDNN_STATUS_SUCCESS) gb_fail(g, st, what);
}

static void gb_finalize(gb_t *g, cudnnBackendDescriptor_t d, const char *what) {
    if (g->failed || d == NULL) return;
    cudnnStatus_t st = cudnnBackendFinalize(d);
    if (st != CUDNN_STATUS_SUCCESS) gb_fail(g, st, what);
}

static void gb_desc(gb_t *g, cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t attr,
                    cudnnBackendDescriptor_t v, const char *what) {
    if (v == NULL && !g->failed) {
        g->failed = true;
        snprintf(g->p->why, sizeof g->p->why, "attention graph: %s has no tensor", what);
        return;
    }
    gb_set(g, d, attr, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &v, what);
}

/* A tensor descriptor; uid 0 takes the next virtual id. */
static cudnnBackendDescriptor_t gb_tensor(gb_t *g, int64_t uid, cudnnDataType_t dt, const int64_t dim[4],
                                          const int64_t str[4], bool virt, bool by_value) {
    cudnnBackendDescriptor_t d = gb_new(g, CUDNN_BACKEND_TENSOR_DESCRIPTOR, "tensor descriptor");
    const int64_t id = uid ? uid : g->next_uid++, align = 16;
    const bool v = virt;
    gb_set(g, d, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &dt, "tensor data type");
    gb_set(g, d, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dim, "tensor dims");
    gb_set(g, d, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, str, "tensor strides");
    gb_set(g, d, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &id, "tensor uid");
    gb_set(g, d, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &align, "tensor alignment");
    gb_set(g, d, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &v, "tensor virtual flag");
    if (by_value) {
        const bool bv = true;
        gb_set(g, d, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &bv, "tensor by-value flag");
    }
    gb_finalize(g, d, "tensor descriptor");
    return d;
}

static cudnnBackendDescriptor_t gb_virt(gb_t *g, cudnnDataType_t dt, const int64_t dim[4], const int64_t str[4]) {
    return gb_tensor(g, 0, dt, dim, str, true, false);
}

/* A scalar passed by value (the variant pack points at host memory). */
static cudnnBackendDescriptor_t gb_scalar(gb_t *g, int64_t uid, cudnnDataType_t dt) {
    static const int64_t one[4] = {1, 1, 1, 1};
    return gb_tensor(g, uid, dt, one, one, false, true);
}

static void gb_op(gb_t *g, cudnnBackendDescriptor_t op, const char *what) {
    gb_finalize(g, op, what);
    if (g->failed) return;
    if (g->nops == TC_MAX_OPS) {
        g->failed = true;
        snprintf(g->p->why, sizeof g->p->why, "attention graph needs more than %d operations", TC_MAX_OPS);
        return;
    }
    g->ops[g->nops++] = op;
}

/* y = mode(x[, b[, t]]); axis >= 0 for GEN_INDEX (and the window's ADD, as
 * cudnn-frontend sets it). */
static cudnnBackendDescriptor_t gb_pw(gb_t *g, cudnnPointwiseMode_t mode, cudnnDataType_t prec,
                                      cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t b,
                                      cudnnBackendDescriptor_t t, cudnnBackendDescriptor_t y, int64_t axis) {
    cudnnBackendDescriptor_t pw = gb_new(g, CUDNN_BACKEND_POINTWISE_DESCRIPTOR, "pointwise descriptor");
    gb_set(g, pw, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode, "pointwise mode");
    gb_set(g, pw, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &prec, "pointwise precision");
    if (axis >= 0) gb_set(g, pw, CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis, "pointwise axis");
    gb_finalize(g, pw, "pointwise descriptor");
    cudnnBackendDescriptor_t op = gb_new(g, CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, "pointwise operation");
    const float alpha = 1.0f;
    gb_desc(g, op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, pw, "pointwise op descriptor");
    gb_desc(g, op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, x, "pointwise x");
    if (b) gb_desc(g, op, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, b, "pointwise b");
    gb_desc(g, op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, y, "pointwise y");
    if (t) gb_desc(g, op, CUDNN_ATTR_OPERATION_POINTWISE_TDESC, t, "pointwise t");
    gb_set(g, op, CUDNN_ATTR_OPERATION_POINTWISE_ALPHA1, CUDNN_TYPE_FLOAT, 1, &alpha, "pointwise alpha1");
    gb_set(g, op, CUDNN_ATTR_OPERATION_POINTWISE_ALPHA2, CUDNN_TYPE_FLOAT, 1, &alpha, "pointwise alpha2");
    gb_op(g, op, "pointwise operation");
    return y;
}

static cudnnBackendDescriptor_t gb_reduce(gb_t *g, cudnnReduceTensorOp_t mode, cudnnBackendDescriptor_t x,
                                          cudnnBackendDescriptor_t y) {
    const cudnnDataType_t f32 = CUDNN_DATA_FLOAT;
    cudnnBackendDescriptor_t rd = gb_new(g, CUDNN_BACKEND_REDUCTION_DESCRIPTOR, "reduction descriptor");
    gb_set(g, rd, CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &mode, "reduction mode");
    gb_set(g, rd, CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &f32, "reduction precision");
    gb_finalize(g, rd, "reduction descriptor");
    cudnnBackendDescriptor_t op = gb_new(g, CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR, "reduction operation");
    gb_desc(g, op, CUDNN_ATTR_OPERATION_REDUCTION_XDESC, x, "reduction x");
    gb_desc(g, op, CUDNN_ATTR_OPERATION_REDUCTION_YDESC, y, "reduction y");
    gb_desc(g, op, CUDNN_ATTR_OPERATION_REDUCTION_DESC, rd, "reduction descriptor");
    gb_op(g, op, "reduction operation");
    return y;
}

/* c = a b over the last two dims, fp32 accumulation; m/n/k override the
 * product's extents per batch row (the padding mask's sequence lengths). */
static cudnnBackendDescriptor_t gb_matmul(gb_t *g, cudnnBackendDescriptor_t a, cudnnBackendDescriptor_t b,
                                          cudnnBackendDescriptor_t c, cudnnBackendDescriptor_t m,
                                          cudnnBackendDescriptor_t n, cudnnBackendDescriptor_t k, bool pad_zero) {
    const cudnnDataType_t f32 = CUDNN_DATA_FLOAT;
    const double pad_value = 0.0;
    cudnnBackendDescriptor_t md = gb_new(g, CUDNN_BACKEND_MATMUL_DESCRIPTOR, "matmul descriptor");
    gb_set(g, md, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &f32, "matmul precision");
    if (pad_zero) gb_set(g, md, CUDNN_ATTR_MATMUL_PADDING_VALUE, CUDNN_TYPE_DOUBLE, 1, &pad_value, "matmul padding");
    gb_finalize(g, md, "matmul descriptor");
    cudnnBackendDescriptor_t op = gb_new(g, CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR, "matmul operation");
    gb_desc(g, op, CUDNN_ATTR_OPERATION_MATMUL_ADESC, a, "matmul a");
    gb_desc(g, op, CUDNN_ATTR_OPERATION_MATMUL_BDESC, b, "matmul b");
    gb_desc(g, op, CUDNN_ATTR_OPERATION_MATMUL_CDESC, c, "matmul c");
    gb_desc(g, op, CUDNN_ATTR_OPERATION_MATMUL_DESC, md, "matmul descriptor");
    if (m) gb_desc(g, op, CUDNN_ATTR_OPERATION_MATMUL_GEMM_M_OVERRIDE_DESC, m, "matmul m override");
    if (n) gb_desc(g, op, CUDNN_ATTR_OPERATION_MATMUL_GEMM_N_OVERRIDE_DESC, n, "matmul n override");
    if (k) gb_desc(g, op, CUDNN_ATTR_OPERATION_MATMUL_GEMM_K_OVERRIDE_DESC, k, "matmul k override");
    gb_op(g, op, "matmul operation");
    return c;
}

static cudnnBackendDescriptor_t gb_reshape(gb_t *g, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y) {
    cudnnBackendDescriptor_t op = gb_new(g, CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR, "reshape operation");
    gb_desc(g, op, CUDNN_ATTR_OPERATION_RESHAPE_XDESC, x, "reshape x");
    gb_desc(g, op, CUDNN_ATTR_OPERATION_RESHAPE_YDESC, y, "reshape y");
    gb_op(g, op, "reshape operation");
    return y;
}

/* ---- the SDPA graphs ---- */

/* Shapes and the small tensors both graphs share. */
typedef struct {
    int64_t sd[4], ss[4]; /* scores [B, nh, T, T], row-major */
    int64_t rd[4], rs[4]; /* per query row [B, nh, T, 1] (Stats, softmax_sum) */
    int64_t qd[4], qs[4]; /* Q, O, dO, dQ: [B, nh, T, hd] over (B, T, nh, hd) memory */
    int64_t kd[4], ks[4]; /* K, V, dK, dV: [B, nkv, T, hd] over (B, T, nkv, hd) memory */
    int64_t td[4], ts[4]; /* K^T, V^T: [B, nkv, hd, T], the same memory */
    cudnnBackendDescriptor_t scale, neg_inf, window, seq_q, seq_kv;
} gctx_t;

static void tc_gctx(gctx_t *c, gb_t *g, const tc_key_t *k) {
    const int64_t B = k->B, T = k->T, H = k->nh, HK = k->nkv, D = k->hd;
    const int64_t sd[4] = {B, H, T, T}, ss[4] = {H * T * T, T * T, T, 1};
    const int64_t rd[4] = {B, H, T, 1}, rs[4] = {H * T, T, 1, 1};
    const int64_t qd[4] = {B, H, T, D}, qs[4] = {T * H * D, D, H * D, 1};
    const int64_t kd[4] = {B, HK, T, D}, ks[4] = {T * HK * D, D, HK * D, 1};
    const int64_t td[4] = {B, HK, D, T}, ts[4] = {T * HK * D, D, 1, HK * D};
    memcpy(c->sd, sd, sizeof sd), memcpy(c->ss, ss, sizeof ss), memcpy(c->rd, rd, sizeof rd);
    memcpy(c->rs, rs, sizeof rs), memcpy(c->qd, qd, sizeof qd), memcpy(c->qs, qs, sizeof qs);
    memcpy(c->kd, kd, sizeof kd), memcpy(c->ks, ks, sizeof ks), memcpy(c->td, td, sizeof td);
    memcpy(c->ts, ts, sizeof ts);
    c->scale = gb_scalar(g, U_SCALE, CUDNN_DATA_FLOAT);
    c->neg_inf = gb_scalar(g, U_NEG_INF, CUDNN_DATA_FLOAT);
    c->window = k->window > 0 ? gb_scalar(g, U_WINDOW, CUDNN_DATA_FLOAT) : NULL;
    c->seq_q = c->seq_kv = NULL;
    if (k->pad) {
        const int64_t bd[4] = {B, 1, 1, 1}, bs[4] = {1, 1, 1, 1};
        c->seq_q = gb_tensor(g, U_SEQ_Q, CUDNN_DATA_INT32, bd, bs, false, false);
        c->seq_kv = gb_tensor(g, U_SEQ_KV, CUDNN_DATA_INT32, bd, bs, false, false);
    }
}

/* s with the key-padding, causal and sliding-window masks applied (-inf
 * where attention.h's rule hides the key), as cudnn-frontend's
 * padding_mask and CompositeDiagonalBandMaskNode build them. */
static cudnnBackendDescriptor_t gb_masks(gb_t *g, const gctx_t *c, cudnnBackendDescriptor_t s) {
    const cudnnDataType_t f32 = CUDNN_DATA_FLOAT, i32 = CUDNN_DATA_INT32, b8 = CUDNN_DATA_BOOLEAN;
#define V_(dt) gb_virt(g, (dt), c->sd, c->ss)
    if (c->seq_kv) {
        cudnnBackendDescriptor_t row = gb_pw(g, CUDNN_POINTWISE_GEN_INDEX, i32, s, NULL, NULL, V_(i32), 2);
        cudnnBackendDescriptor_t col = gb_pw(g, CUDNN_POINTWISE_GEN_INDEX, i32, s, NULL, NULL, V_(i32), 3);
        cudnnBackendDescriptor_t rm = gb_pw(g, CUDNN_POINTWISE_CMP_LT, b8, row, c->seq_q, NULL, V_(b8), -1);
        cudnnBackendDescriptor_t cm = gb_pw(g, CUDNN_POINTWISE_CMP_LT, b8, col, c->seq_kv, NULL, V_(b8), -1);
        cudnnBackendDescriptor_t m = gb_pw(g, CUDNN_POINTWISE_LOGICAL_AND, b8, rm, cm, NULL, V_(b8), -1);
        s = gb_pw(g, CUDNN_POINTWISE_BINARY_SELECT, f32, s, c->neg_inf, m, V_(f32), -1);
    }
    /* causal: the right bound of the diagonal band, row >= col kept */
    cudnnBackendDescriptor_t row = gb_pw(g, CUDNN_POINTWISE_GEN_INDEX, f32, s, NULL, NULL, V_(i32), 2);
    cudnnBackendDescriptor_t col = gb_pw(g, CUDNN_POINTWISE_GEN_INDEX, f32, s, NULL, NULL, V_(i32), 3);
    cudnnBackendDescriptor_t m = gb_pw(g, CUDNN_POINTWISE_CMP_GE, b8, row, col, NULL, V_(b8), -1);
    s = gb_pw(g, CUDNN_POINTWISE_BINARY_SELECT, f32, s, c->neg_inf, m, V_(f32), -1);
    if (c->window) { /* the left bound: col + window > row kept, i.e. row - col < window */
        row = gb_pw(g, CUDNN_POINTWISE_GEN_INDEX, f32, s, NULL, NULL, V_(i32), 2);
        col = gb_pw(g, CUDNN_POINTWISE_GEN_INDEX, f32, s, NULL, NULL, V_(i32), 3);
        cudnnBackendDescriptor_t cw = gb_pw(g, CUDNN_POINTWISE_ADD, f32, col, c->window, NULL, V_(f32), 3);
        m = gb_pw(g, CUDNN_POINTWISE_CMP_GT, b8, cw, row, NULL, V_(b8), -1);
        s = gb_pw(g, CUDNN_POINTWISE_BINARY_SELECT, f32, s, c->neg_inf, m, V_(f32), -1);
    }
#undef V_
    return s;
}

static void tc_graph_fwd(gb_t *g, const tc_key_t *k) {
    const cudnnDataType_t f32 = CUDNN_DATA_FLOAT, bf16 = CUDNN_DATA_BFLOAT16;
    gctx_t c;
    tc_gctx(&c, g, k);
    cudnnBackendDescriptor_t q = gb_tensor(g, U_Q, bf16, c.qd, c.qs, false, false);
    cudnnBackendDescriptor_t kt = gb_tensor(g, U_K, bf16, c.td, c.ts, false, false);
    cudnnBackendDescriptor_t v = gb_tensor(g, U_V, bf16, c.kd, c.ks, false, false);
    cudnnBackendDescriptor_t o = gb_tensor(g, U_O, bf16, c.qd, c.qs, false, false);
    cudnnBackendDescriptor_t stats = gb_tensor(g, U_STATS, f32, c.rd, c.rs, false, false);

    cudnnBackendDescriptor_t s =
        gb_matmul(g, q, kt, gb_virt(g, f32, c.sd, c.ss), c.seq_q, c.seq_kv, NULL, k->pad);
    s = gb_pw(g, CUDNN_POINTWISE_MUL, f32, s, c.scale, NULL, gb_virt(g, f32, c.sd, c.ss), -1);
    s = gb_masks(g, &c, s);
    /* softmax with Stats = max + log(sum exp(s - max)), the natural-log lse */
    cudnnBackendDescriptor_t mx = gb_reduce(g, CUDNN_REDUCE_TENSOR_MAX, s, gb_virt(g, f32, c.rd, c.rs));
    cudnnBackendDescriptor_t sub = gb_pw(g, CUDNN_POINTWISE_SUB, f32, s, mx, NULL, gb_virt(g, f32, c.sd, c.ss), -1);
    cudnnBackendDescriptor_t e = gb_pw(g, CUDNN_POINTWISE_EXP, f32, sub, NULL, NULL, gb_virt(g, f32, c.sd, c.ss), -1);
    cudnnBackendDescriptor_t sum = gb_reduce(g, CUDNN_REDUCE_TENSOR_ADD, e, gb_virt(g, f32, c.rd, c.rs));
    cudnnBackendDescriptor_t lg = gb_pw(g, CUDNN_POINTWISE_LOG, f32, sum, NULL, NULL, gb_virt(g, f32, c.rd, c.rs), -1);
    gb_pw(g, CUDNN_POINTWISE_ADD, f32, mx, lg, NULL, stats, -1);
    /* P in the inputs' type: the second product's A operand */
    cudnnBackendDescriptor_t p = gb_pw(g, CUDNN_POINTWISE_DIV, f32, e, sum, NULL, gb_virt(g, bf16, c.sd, c.ss), -1);
    gb_matmul(g, p, v, o, c.seq_q, NULL, c.seq_kv, false);
}

/* dst (B, nkv, T, hd) = sum over each group of the per-query-head product
 * a b (cudnn-frontend's GQA reduction), or the product itself for MHA. */
static void gb_group_product(gb_t *g, const tc_key_t *k, const gctx_t *c, cudnnBackendDescriptor_t a,
                             cudnnBackendDescriptor_t b, cudnnBackendDescriptor_t dst) {
    if (k->nh == k->nkv) {
        gb_matmul(g, a, b, dst, c->seq_kv, NULL, c->seq_q, false);
        return;
    }
    const int64_t H = k->nh, T = k->T, D = k->hd;
    const int64_t fd[4] = {k->B, H, T, D}, fs[4] = {H * T * D, T * D, D, 1};
    cudnnBackendDescriptor_t full =
        gb_matmul(g, a, b, gb_virt(g, CUDNN_DATA_BFLOAT16, fd, fs), c->seq_kv, NULL, c->seq_q, false);
    gb_reduce(g, CUDNN_REDUCE_TENSOR_ADD, full, dst);
}

/* accum: dQ through the fp32 accumulator (cuDNN's atomic, non-deterministic
 * variant); else dQ straight out of its product (the dP-workspace one). */
static void tc_graph_bwd(gb_t *g, const tc_key_t *k, bool accum) {
    const cudnnDataType_t f32 = CUDNN_DATA_FLOAT, bf16 = CUDNN_DATA_BFLOAT16;
    const int64_t B = k->B, H = k->nh, T = k->T, D = k->hd;
    gctx_t c;
    tc_gctx(&c, g, k);
    cudnnBackendDescriptor_t q = gb_tensor(g, U_Q, bf16, c.qd, c.qs, false, false);
    cudnnBackendDescriptor_t kt = gb_tensor(g, U_K, bf16, c.td, c.ts, false, false);
    cudnnBackendDescriptor_t vt = gb_tensor(g, U_V, bf16, c.td, c.ts, false, false);
    cudnnBackendDescriptor_t o = gb_tensor(g, U_O, bf16, c.qd, c.qs, false, false);
    cudnnBackendDescriptor_t dout = gb_tensor(g, U_DO, bf16, c.qd, c.qs, false, false);
    cudnnBackendDescriptor_t stats = gb_tensor(g, U_STATS, f32, c.rd, c.rs, false, false);
    cudnnBackendDescriptor_t dq = gb_tensor(g, U_DQ, bf16, c.qd, c.qs, false, false);
    cudnnBackendDescriptor_t dk = gb_tensor(g, U_DK, bf16, c.kd, c.ks, false, false);
    cudnnBackendDescriptor_t dv = gb_tensor(g, U_DV, bf16, c.kd, c.ks, false, false);
    cudnnBackendDescriptor_t one = gb_scalar(g, U_ONE, f32);

    /* softmax_sum = rowsum(dO * O), kept in the workspace */
    const int64_t pd[4] = {B, H, T, D}, ps[4] = {H * T * D, T * D, H * D, 1};
    cudnnBackendDescriptor_t x = gb_pw(g, CUDNN_POINTWISE_MUL, f32, dout, o, NULL, gb_virt(g, f32, pd, ps), -1);
    x = gb_reduce(g, CUDNN_REDUCE_TENSOR_ADD, x, gb_virt(g, f32, c.rd, c.rs));
    cudnnBackendDescriptor_t ssum = gb_pw(g, CUDNN_POINTWISE_MUL, f32, x, one, NULL,
                                          gb_tensor(g, U_SOFTMAX_SUM, f32, c.rd, c.rs, false, false), -1);
    /* P = exp(scale * Q K^T - Stats), masked */
    cudnnBackendDescriptor_t s = gb_matmul(g, q, kt, gb_virt(g, f32, c.sd, c.ss), c.seq_q, c.seq_kv, NULL, false);
    s = gb_pw(g, CUDNN_POINTWISE_MUL, f32, s, c.scale, NULL, gb_virt(g, f32, c.sd, c.ss), -1);
    s = gb_pw(g, CUDNN_POINTWISE_SUB, f32, s, stats, NULL, gb_virt(g, f32, c.sd, c.ss), -1);
    s = gb_masks(g, &c, s);
    cudnnBackendDescriptor_t p = gb_pw(g, CUDNN_POINTWISE_EXP, f32, s, NULL, NULL, gb_virt(g, f32, c.sd, c.ss), -1);
    /* dV = P^T dO */
    const int64_t tsd[4] = {B, H, T, T}, tss[4] = {H * T * T, T * T, 1, T};
    cudnnBackendDescriptor_t pt = gb_reshape(g, p, gb_virt(g, bf16, tsd, tss));
    gb_group_product(g, k, &c, pt, dout, dv);
    /* dS = (dO V^T - softmax_sum) * P * scale */
    cudnnBackendDescriptor_t dp = gb_matmul(g, dout, vt, gb_virt(g, f32, c.sd, c.ss), c.seq_q, c.seq_kv, NULL, false);
    dp = gb_pw(g, CUDNN_POINTWISE_SUB, f32, dp, ssum, NULL, gb_virt(g, f32, c.sd, c.ss), -1);
    dp = gb_pw(g, CUDNN_POINTWISE_MUL, f32, dp, p, NULL, gb_virt(g, f32, c.sd, c.ss), -1);
    cudnnBackendDescriptor_t ds = gb_pw(g, CUDNN_POINTWISE_MUL, f32, dp, c.scale, NULL, gb_virt(g, f32, c.sd, c.ss), -1);
    /* dK = dS^T Q */
    cudnnBackendDescriptor_t dst = gb_reshape(g, ds, gb_virt(g, bf16, tsd, tss));
    gb_group_product(g, k, &c, dst, q, dk);
    /* dQ = dS K */
    cudnnBackendDescriptor_t kk = gb_reshape(g, kt, gb_virt(g, f32, c.kd, c.ks)); /* fp32, as cudnn-frontend types it */
    if (accum) {
        const int64_t as[4] = {H * T * D, T * D, D, 1};
        cudnnBackendDescriptor_t acc = gb_tensor(g, U_DQ_ACCUM, f32, c.qd, as, false, false);
        gb_matmul(g, ds, kk, acc, c.seq_q, NULL, c.seq_kv, false);
        gb_pw(g, CUDNN_POINTWISE_IDENTITY, f32, acc, NULL, NULL, dq, -1);
    } else {
        gb_matmul(g, ds, kk, dq, c.seq_q, NULL, c.seq_kv, false);
    }
}

/* ---- engine choice: heuristics mode A, the first engine that finalizes ---- */

/* Whether the engine behind cfg carries no NONDETERMINISTIC numerical note. */
static bool tc_engine_deterministic(cudnnBackendDescriptor_t cfg) {
    cudnnBackendDescriptor_t eng = NULL;
    if (cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINE_DESCRIPTOR, &eng) != CUDNN_STATUS_SUCCESS) return false;
    int64_t n = 0, nn = 0;
    bool det = false;
    cudnnBackendNumericalNote_t notes[32];
    if (cudnnBackendGetAttribute(cfg, CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &n, &eng) ==
            CUDNN_STATUS_SUCCESS &&
        n == 1 &&
        cudnnBackendGetAttribute(eng, CUDNN_ATTR_ENGINE_NUMERICAL_NOTE, CUDNN_TYPE_NUMERICAL_NOTE, 32, &nn, notes) ==
            CUDNN_STATUS_SUCCESS) {
        det = true;
        for (int64_t i = 0; i < nn && i < 32; i++)
            if (notes[i] == CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC) det = false;
    }
    cudnnBackendDestroyDescriptor(eng);
    return det;
}

/* Finalizes the plan of the first engine heuristics propose (that is
 * deterministic, when need_det) into g->p; on failure g->p->why says why. */
static void tc_choose_plan(gb_t *g, bool need_det) {
    tc_plan_t *p = g->p;
    cudnnBackendDescriptor_t graph = gb_new(g, CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, "operation graph");
    gb_set(g, graph, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &g->h, "operation graph handle");
    gb_set(g, graph, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, g->nops, g->ops,
           "operation graph ops");
    gb_finalize(g, graph, "operation graph");
    cudnnBackendDescriptor_t heur = gb_new(g, CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, "heuristics");
    const cudnnBackendHeurMode_t mode = CUDNN_HEUR_MODE_A;
    gb_desc(g, heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, graph, "heuristics graph");
    gb_set(g, heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode, "heuristics mode");
    gb_finalize(g, heur, "heuristics");
    if (g->failed) return;
    int64_t n = 0;
    cudnnStatus_t st = cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                                                0, &n, NULL);
    if (st != CUDNN_STATUS_SUCCESS) return gb_fail(g, st, "heuristics results");
    if (n <= 0) {
        snprintf(p->why, sizeof p->why, "cuDNN heuristics returned no engine for this attention graph");
        g->failed = true;
        return;
    }
    if (n > TC_MAX_ENGINES) n = TC_MAX_ENGINES;
    cudnnBackendDescriptor_t cfgs[TC_MAX_ENGINES] = {0};
    int64_t got = 0;
    for (int64_t i = 0; i < n; i++) cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, &cfgs[i]);
    st = cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, n, &got, cfgs);
    if (st != CUDNN_STATUS_SUCCESS) got = 0, gb_fail(g, st, "heuristics results");
    char first[384] = "";
    int nondet = 0;
    int64_t chosen = -1;
    for (int64_t i = 0; i < got && i < n && chosen < 0; i++) {
        const bool det = tc_engine_deterministic(cfgs[i]);
        if (need_det && !det) {
            nondet++;
            continue;
        }
        cudnnBackendDescriptor_t plan = NULL;
        st = cudnnBackendCreateDescriptor(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, &plan);
        if (st == CUDNN_STATUS_SUCCESS)
            st = cudnnBackendSetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &g->h);
        if (st == CUDNN_STATUS_SUCCESS)
            st = cudnnBackendSetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG,
                                          CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &cfgs[i]);
        if (st == CUDNN_STATUS_SUCCESS) st = cudnnBackendFinalize(plan);
        int64_t ws = 0, nws = 0;
        if (st == CUDNN_STATUS_SUCCESS)
            st = cudnnBackendGetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &nws,
                                          &ws);
        if (st != CUDNN_STATUS_SUCCESS || p->ndescs + 2 > TC_MAX_DESCS) {
            if (!first[0]) kern_cudnn_status_text(st, "execution plan", first, sizeof first);
            if (plan) cudnnBackendDestroyDescriptor(plan);
            continue;
        }
        p->descs[p->ndescs++] = cfgs[i];
        p->descs[p->ndescs++] = plan;
        p->plan = plan, p->workspace = ws, p->deterministic = det, p->ok = true;
        chosen = i;
    }
    for (int64_t i = 0; i < n; i++)
        if (i != chosen && cfgs[i]) cudnnBackendDestroyDescriptor(cfgs[i]);
    if (!p->ok && !g->failed) {
        g->failed = true;
        if (first[0])
            snprintf(p->why, sizeof p->why, "none of the %lld engines cuDNN proposed builds a plan: %s", (long long)got,
                     first);
        else
            snprintf(p->why, sizeof p->why, "none of the %lld engines cuDNN proposed is deterministic (%d are not)",
                     (long long)got, nondet);
    }
}

/* ---- plans ---- */

void kern_cudnn_plan_clear(tc_plan_t *p) {
    for (int i = p->ndescs - 1; i >= 0; i--) cudnnBackendDestroyDescriptor(p->descs[i]);
    p->ndescs = 0;
    p->plan = NULL;
    p->ok = p->deterministic = p->dq_accum = false;
    p->workspace = 0;
}

void kern_cudnn_plan_build(cudnnHandle_t h, tc_plan_t *p) {
    const tc_key_t *k = &p->key;
    p->scale = 1.0f / sqrtf((float)k->hd);
    p->neg_inf = -INFINITY;
    p->one = 1.0f;
    p->window = (float)k->window;
    gb_t g = {.p = p, .h = h, .next_uid = U_FIRST_VIRTUAL};
    if (!k->bwd) {
        tc_graph_fwd(&g, k);
        tc_choose_plan(&g, false);
        return;
    }
    tc_graph_bwd(&g, k, false);
    tc_choose_plan(&g, true);
    if (p->ok) return;
    /* no deterministic engine: the fp32 dQ accumulator variant, said so */
    char det_why[512];
    snprintf(det_why, sizeof det_why, "%s", p->why);
    kern_cudnn_plan_clear(p);
    p->why[0] = 0;
    gb_t g2 = {.p = p, .h = h, .next_uid = U_FIRST_VIRTUAL};
    tc_graph_bwd(&g2, k, true);
    tc_choose_plan(&g2, false);
    p->dq_accum = true;
    p->deterministic = false; /* atomics into the accumulator, whatever the notes say */
    if (!p->ok) {
        char acc_why[512];
        snprintf(acc_why, sizeof acc_why, "%s", p->why);
        snprintf(p->why, sizeof p->why, "deterministic graph: %.200s; accumulator graph: %.200s", det_why, acc_why);
    }
}
