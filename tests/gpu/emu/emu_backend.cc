// The CUDA backend's host-side helpers as the CPU emulator build needs them
// (tests/gpu/emu): streams are the CPU backend's, scratch is host memory,
// the stable sort is std::stable_sort, GEMMs are the CPU twin's (cuBLASLt
// is not emulated; tests/gpu/gemm_test covers it on a GPU).  No CUDA
// backend is registered in this build (it links the CPU backend only), so
// opening a CUDA device reports that none is linked.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <vector>

#include "cuda_emu.h"

extern "C" {
#include "kernels/cuda/backend_cuda_internal.h"
#include "kernels/cpu/gemm_internal.h"
#include "kernels/attention.h"
#include "kernels/gemm.h"
}

// sort.cuh's declaration (C++ linkage), implemented here instead of CUB.
void kc_sort_positions(kern_stream_t *s, const int32_t *keys, int n, int key_bits,
                       int32_t **keys_out, int32_t **pos_out, const char *what);

namespace {
constexpr size_t kScratchBytes = KERN_CUDA_SCRATCH_COMPUTE_BYTES;
}

extern "C" {

int kern_cuda_current_device(void) { return 0; }

cudaStream_t kern_cuda_stream_begin(kern_stream_t *s) {
    MT_CHECK(s != NULL, "CUDA kernel called with a NULL stream (use kern_stream(dev, role))");
    return nullptr;
}

// The GPU's size, or MOETUNE_EMU_SCRATCH_BYTES: a small scratch makes the
// products that would not fit on a GPU run in pieces here on small shapes.
static size_t scratch_bytes() {
    static const size_t n = [] {
        const char *env = getenv("MOETUNE_EMU_SCRATCH_BYTES");
        return env && *env ? (size_t)strtoull(env, nullptr, 10) : kScratchBytes;
    }();
    return n;
}

size_t kern_cuda_scratch_capacity(const kern_stream_t *s) {
    (void)s;
    return scratch_bytes();
}

void *kern_cuda_scratch(kern_stream_t *s, size_t bytes, const char *what) {
    (void)s;
    static std::vector<unsigned char> scratch(scratch_bytes());
    MT_CHECK(bytes <= scratch.size(), "%s needs %zu bytes of stream scratch, the emulator has %zu", what,
             bytes, scratch.size());
    memset(scratch.data(), 0xFF, bytes); // ops must not rely on what scratch held
    return scratch.data();
}

void kern_cuda_after_launch(kern_stream_t *s, const char *file, int line, const char *what) {
    (void)s;
    (void)file;
    (void)line;
    (void)what;
}

void kern_cuda_smem_optin(kern_stream_t *s, const void *kernel, size_t bytes, const char *what) {
    (void)s;
    MT_CHECK(bytes <= 227 * 1024, "%s needs %zu bytes of shared memory per block", what, bytes);
    emu_note_smem_optin(kernel, bytes);
}

void kern_cuda_gemm_cache_free(kern_cuda_gemm_cache_t *c) { (void)c; }

// cuBLASLt's typed product (bf16 A/B multiplied exactly, fp32 accumulation)
// as the CPU twin's convert + sgemm path forms it.
void kern_cuda_gemm(kern_stream_t *s, void *C, mt_dtype_t c_dt, const void *A, const void *B, mt_dtype_t ab_dt,
                    int M, int N, int K, bool trans_a, bool trans_b, float alpha, float beta) {
    (void)s;
    MT_CHECK(ab_dt == MT_BF16 || c_dt == MT_F32, "cuBLASLt has no F32 x F32 -> %s product",
             mt_dtype_name(c_dt));
    kern_mm_t p = {};
    p.C = {C, c_dt, M, N};
    p.A = {const_cast<void *>(A), ab_dt, trans_a ? K : M, trans_a ? M : K};
    p.B = {const_cast<void *>(B), ab_dt, trans_b ? N : K, trans_b ? K : N};
    p.trans_a = trans_a;
    p.trans_b = trans_b;
    p.alpha = alpha;
    p.beta = beta;
    p.compute = ab_dt;
    if (K == 0 && c_dt == MT_BF16)
        MT_CHECK(beta == 0.0f || beta == 1.0f, "matmul with K == 0 and beta %g on a BF16 output",
                 (double)beta);
    kern_mm_grouped_cpu_path(NULL, &p, 1, KERN_CPU_BF16_SGEMM);
}

static float emu_load(const void *base, mt_dtype_t dt, size_t i) {
    return dt == MT_BF16 ? mt_bf16_to_f32(((const uint16_t *)base)[i]) : ((const float *)base)[i];
}

// cuBLAS's grouped GEMM as its column-major definition states it, read from
// the very arrays kern_mm_grouped_cuda fills, so the row-major mapping and
// the choice of products are tested here: D = alpha op(LA) op(LB) + beta C
// per problem, fp32 sums, C not read when beta == 0, a BF16 C rounded once.
// MOETUNE_EMU_GROUPED_REFUSE=1 answers as a cuBLAS without the type
// combination would, so the fallback to one product at a time is tested.
bool kern_cuda_gemm_grouped(kern_stream_t *s, const kern_cuda_grouped_t *g, char *why, size_t why_len) {
    (void)s;
    MT_CHECK(g->count > 0, "grouped GEMM of %d products", g->count);
    const char *refuse = getenv("MOETUNE_EMU_GROUPED_REFUSE");
    if (refuse && strcmp(refuse, "1") == 0) {
        snprintf(why, why_len, "the emulated cuBLAS refuses %s -> %s grouped products", mt_dtype_name(g->ab_dt),
                 mt_dtype_name(g->c_dt));
        return false;
    }
    for (int i = 0; i < g->count; i++) {
        const int m = g->m[i], n = g->n[i], k = g->k[i];
        const int64_t lda = g->lda[i], ldb = g->ldb[i], ldc = g->ldc[i];
        MT_CHECK(m > 0 && n > 0 && k > 0, "grouped GEMM problem %d: m=%d n=%d k=%d", i, m, n, k);
        const size_t ab = mt_dtype_size(g->ab_dt), cb = mt_dtype_size(g->c_dt), al = KERN_CUDA_GROUPED_ALIGN;
        MT_CHECK((uintptr_t)g->la[i] % al == 0 && (uintptr_t)g->lb[i] % al == 0 && (uintptr_t)g->c[i] % al == 0 &&
                     (size_t)lda * ab % al == 0 && (size_t)ldb * ab % al == 0 && (size_t)ldc * cb % al == 0,
                 "grouped GEMM problem %d: a matrix or row not %zu-byte aligned (the GPU faults on it)", i, al);
        MT_CHECK(lda >= (g->trans_la[i] ? k : m) && ldb >= (g->trans_lb[i] ? n : k) && ldc >= m,
                 "grouped GEMM problem %d: leading dimensions %lld %lld %lld too small for m=%d n=%d k=%d", i,
                 (long long)lda, (long long)ldb, (long long)ldc, m, n, k);
        for (int col = 0; col < n; col++)
            for (int r = 0; r < m; r++) {
                float acc = 0.0f;
                for (int kk = 0; kk < k; kk++) {
                    const size_t ia = g->trans_la[i] ? (size_t)kk + (size_t)r * lda : (size_t)r + (size_t)kk * lda;
                    const size_t ib = g->trans_lb[i] ? (size_t)col + (size_t)kk * ldb : (size_t)kk + (size_t)col * ldb;
                    acc += emu_load(g->la[i], g->ab_dt, ia) * emu_load(g->lb[i], g->ab_dt, ib);
                }
                const size_t ic = (size_t)r + (size_t)col * ldc;
                float v = g->alpha[i] * acc;
                if (g->beta[i] != 0.0f) v += g->beta[i] * emu_load(g->c[i], g->c_dt, ic);
                if (g->c_dt == MT_BF16) ((uint16_t *)g->c[i])[ic] = mt_f32_to_bf16(v);
                else ((float *)g->c[i])[ic] = v;
            }
    }
    return true;
}

// cuDNN is not emulated: the tensor-core attention path declines every
// call here, as it does on a GPU for a shape cuDNN refuses, and the caller
// runs the fp32 kernels (emulated above).  tests/gpu/attention_tc_test
// covers the path on a GPU.
bool kern_attention_fwd_tc_cuda(kern_stream_t *s, void *out, float *lse, const void *q, const void *k, const void *v,
                                mt_dtype_t dt, const int32_t *kv_len, const int32_t *seg_start, int B, int T, int nh,
                                int nkv, int hd, int window) {
    (void)s, (void)out, (void)lse, (void)q, (void)k, (void)v, (void)dt, (void)kv_len, (void)seg_start;
    (void)B, (void)T, (void)nh, (void)nkv, (void)hd, (void)window;
    return false;
}

bool kern_attention_bwd_tc_cuda(kern_stream_t *s, float *dq, float *dk, float *dv, const float *dout, const void *q,
                                const void *k, const void *v, const void *out, mt_dtype_t dt, const float *lse,
                                const int32_t *kv_len, const int32_t *seg_start, int B, int T, int nh, int nkv,
                                int hd, int window) {
    (void)s, (void)dq, (void)dk, (void)dv, (void)dout, (void)q, (void)k, (void)v, (void)out, (void)dt, (void)lse;
    (void)kv_len, (void)seg_start, (void)B, (void)T, (void)nh, (void)nkv, (void)hd, (void)window;
    return false;
}

} // extern "C"

void kc_sort_positions(kern_stream_t *s, const int32_t *keys, int n, int key_bits,
                       int32_t **keys_out, int32_t **pos_out, const char *what) {
    MT_CHECK(n > 0 && key_bits >= 1 && key_bits <= 32, "%s: sort of %d keys of %d bits", what, n,
             key_bits);
    std::vector<std::pair<int32_t, int32_t>> kv((size_t)n);
    for (int i = 0; i < n; i++) {
        MT_CHECK(key_bits == 32 || (keys[i] >= 0 && keys[i] < (int32_t)(1u << key_bits)),
                 "%s: key %d at %d does not fit in %d bits (the radix sort would misplace it)", what,
                 keys[i], i, key_bits);
        kv[(size_t)i] = {keys[i], i};
    }
    std::stable_sort(kv.begin(), kv.end(),
                     [](const std::pair<int32_t, int32_t> &a, const std::pair<int32_t, int32_t> &b) {
                         return a.first < b.first;
                     });
    const size_t arr = ((size_t)n * sizeof(int32_t) + 255) & ~(size_t)255;
    char *base = (char *)kern_cuda_scratch(s, 3 * arr, what);
    int32_t *ko = (int32_t *)base, *po = (int32_t *)(base + 2 * arr);
    for (int i = 0; i < n; i++) {
        ko[i] = kv[(size_t)i].first;
        po[i] = kv[(size_t)i].second;
    }
    *keys_out = ko;
    *pos_out = po;
}
