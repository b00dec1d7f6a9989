// AdamW on the device (adamw.h), for optimizer state kept on the GPU.
//
// fp32 moments: one thread per element, grid-stride.  The arithmetic is
// adamw_math.h's, the host kernel's exact op order; with --fmad=false (this
// file's build) the only fused op is the explicit fmaf of torch's lerp, and
// sqrtf and division are IEEE, so the device update is bit-identical to the
// host one.  Coefficients are computed once on the host, as the host kernel
// does.
//
// bf16 and 8-bit moments (moments_math.h): one thread block of 256 threads
// per block of 256 elements (the 8-bit absmax block), grid-stride over
// blocks; the block's new absmax is a shared-memory max reduction (max is
// exact in any order), so the codes and scales equal the host kernel's
// (kernels/host/moments.c) bit for bit.  The two 8-bit maps travel in the
// kernel's arguments and are copied to shared memory.
//
// The updated-weights check (hp->nonfinite, an int in device memory) is
// fused into the update, as on the host: a thread that writes a NaN or Inf
// master stores 1 there (every writer stores the same value), so the step
// makes no second pass over p to look for one.
#include "kernels/cuda/kern_cuda.cuh"

extern "C" {
#include "kernels/math/adamw_math.h"
#include "kernels/math/moments_math.h"
#include "kernels/math/moments_qmap.h"
}

#define ADAMW_THREADS 256

// One element of the fp32-moment update: what adamw_kernel and
// adamw_many_kernel both do at i.
static __device__ __forceinline__ void adamw_at(size_t i, float *p, float *m, float *v, const float *g,
                                                const uint16_t *g_bf16, uint16_t *p_bf16,
                                                const kern_adamw_coef_t &c, int *nonfinite) {
    const float gi = g ? g[i] : mt_bf16_to_f32(g_bf16[i]);
    float mi = m[i], vi = v[i];
    const float pi = kern_adamw_elem(&c, p[i], &mi, &vi, gi);
    p[i] = pi;
    if (nonfinite && !isfinite(pi)) *nonfinite = 1;
    m[i] = mi;
    v[i] = vi;
    if (p_bf16) p_bf16[i] = mt_f32_to_bf16(pi);
}

static __global__ void adamw_kernel(float *p, float *m, float *v, const float *g,
                                    const uint16_t *g_bf16, uint16_t *p_bf16, size_t n,
                                    kern_adamw_coef_t c, int *nonfinite) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        adamw_at(i, p, m, v, g, g_bf16, p_bf16, c, nonfinite);
}

// adamw_many: up to ADAMW_MANY fp32-moment tensors per launch, their
// pointers and coefficients passed by value in the launch (no copy to
// make), each tensor over its own blocks [first[t], first[t + 1]).
#define ADAMW_MANY 24

typedef struct {
    float *p, *m, *v;
    const float *g;
    const uint16_t *g_bf16;
    uint16_t *p_bf16;
    int *nonfinite;
    size_t n;
    kern_adamw_coef_t c;
} adamw_one_t;

typedef struct {
    adamw_one_t t[ADAMW_MANY];
    unsigned first[ADAMW_MANY + 1];
} adamw_many_t;

static __global__ void adamw_many_kernel(adamw_many_t d) {
    unsigned b, nb;
    const int k = kc_many_tensor(d.first, &b, &nb);
    const adamw_one_t a = d.t[k];
    for (size_t i = (size_t)b * blockDim.x + threadIdx.x; i < a.n; i += (size_t)nb * blockDim.x)
        adamw_at(i, a.p, a.m, a.v, a.g, a.g_bf16, a.p_bf16, a.c, a.nonfinite);
}

typedef struct {
    float qs[256], qu[256]; // signed (m) and unsigned (v) maps
} qmaps_t;

static __global__ void adamw_lite_kernel(float *p, kern_moments_t mom, const float *g,
                                         const uint16_t *g_bf16, uint16_t *p_bf16, size_t n,
                                         kern_adamw_coef_t c, uint64_t key, qmaps_t maps, int *nonfinite) {
    __shared__ float qs[256], qu[256], red_m[ADAMW_THREADS], red_v[ADAMW_THREADS];
    const bool q8 = mom.fmt == KERN_MOMENTS_8BIT;
    if (q8) {
        qs[threadIdx.x] = maps.qs[threadIdx.x];
        qu[threadIdx.x] = maps.qu[threadIdx.x];
        __syncthreads();
    }
    const size_t nblk = (n + KERN_MOMENTS_QBLOCK - 1) / KERN_MOMENTS_QBLOCK;
    for (size_t blk = blockIdx.x; blk < nblk; blk += gridDim.x) {
        const size_t i = blk * KERN_MOMENTS_QBLOCK + threadIdx.x;
        const bool in = i < n;
        float mi = 0.0f, vi = 0.0f;
        if (in) {
            if (q8) {
                mi = qs[((const uint8_t *)mom.m)[i]] * mom.m_absmax[blk];
                vi = qu[((const uint8_t *)mom.v)[i]] * mom.v_absmax[blk];
            } else {
                mi = mt_bf16_to_f32(((const uint16_t *)mom.m)[i]);
                vi = mt_bf16_to_f32(((const uint16_t *)mom.v)[i]);
            }
            const float gi = g ? g[i] : mt_bf16_to_f32(g_bf16[i]);
            const float pi = kern_adamw_elem(&c, p[i], &mi, &vi, gi);
            p[i] = pi;
            if (nonfinite && !isfinite(pi)) *nonfinite = 1;
            if (p_bf16) p_bf16[i] = mt_f32_to_bf16(pi);
        }
        if (!q8) {
            if (in) {
                ((uint16_t *)mom.m)[i] = kern_moments_bf16_sr(mi, key, i, 0);
                ((uint16_t *)mom.v)[i] = kern_moments_bf16_sr(vi, key, i, 1);
            }
            continue;
        }
        red_m[threadIdx.x] = fabsf(mi);
        red_v[threadIdx.x] = fabsf(vi);
        __syncthreads();
        for (int s = ADAMW_THREADS / 2; s > 0; s >>= 1) {
            if ((int)threadIdx.x < s) {
                red_m[threadIdx.x] = fmaxf(red_m[threadIdx.x], red_m[threadIdx.x + s]);
                red_v[threadIdx.x] = fmaxf(red_v[threadIdx.x], red_v[threadIdx.x + s]);
            }
            __syncthreads();
        }
        const float am = red_m[0], av = red_v[0];
        if (in) {
            ((uint8_t *)mom.m)[i] = kern_moments_quantize_m(qs, mi, am);
            ((uint8_t *)mom.v)[i] = kern_moments_quantize_v(qu, vi, av);
        }
        if (threadIdx.x == 0) {
            mom.m_absmax[blk] = am;
            mom.v_absmax[blk] = av;
        }
        __syncthreads(); // red_* are reused by the next block
    }
}

extern "C" void kern_adamw_cuda(kern_stream_t *s, float *p, const kern_moments_t *mom, const float *g,
                                const uint16_t *g_bf16, uint16_t *p_bf16, size_t n,
                                const kern_adamw_params_t *hp) {
    MT_CHECK(hp != NULL && mom != NULL, "kern_adamw_cuda: hyperparameters or moments are NULL");
    MT_CHECK((g == NULL) != (g_bf16 == NULL),
             "kern_adamw_cuda: pass exactly one of g (fp32) and g_bf16 (got %s)",
             g ? "both" : "neither");
    MT_CHECK(hp->step >= 1, "kern_adamw_cuda: step must be >= 1 (got %lld)", (long long)hp->step);
    if (n == 0) return;
    const kern_adamw_coef_t c = kern_adamw_coef(hp);
    cudaStream_t cs = kern_cuda_stream_begin(s);
    if (mom->fmt == KERN_MOMENTS_F32) {
        adamw_kernel<<<kc_blocks(n, ADAMW_THREADS), ADAMW_THREADS, 0, cs>>>(
            p, (float *)mom->m, (float *)mom->v, g, g_bf16, p_bf16, n, c, hp->nonfinite);
    } else {
        qmaps_t maps;
        memcpy(maps.qs, kern_moments_qmap_signed, sizeof maps.qs);
        memcpy(maps.qu, kern_moments_qmap_unsigned, sizeof maps.qu);
        const uint64_t key = kern_moments_sr_key(mom->seed, hp->step);
        adamw_lite_kernel<<<kc_blocks(n, ADAMW_THREADS), ADAMW_THREADS, 0, cs>>>(p, *mom, g, g_bf16, p_bf16,
                                                                                 n, c, key, maps, hp->nonfinite);
    }
    KC_LAUNCHED(s, "adamw");
}

static void check_item(const kern_adamw_item_t *it) {
    MT_CHECK((it->g == NULL) != (it->g_bf16 == NULL),
             "kern_adamw_many_cuda: pass exactly one of g (fp32) and g_bf16 (got %s)", it->g ? "both" : "neither");
    MT_CHECK(it->hp.step >= 1, "kern_adamw_many_cuda: step must be >= 1 (got %lld)", (long long)it->hp.step);
}

extern "C" void kern_adamw_many_cuda(kern_stream_t *s, const kern_adamw_item_t *items, int count) {
    cudaStream_t cs = kern_cuda_stream_begin(s);
    adamw_many_t d;
    int m = 0;
    for (int i = 0; i <= count; i++) {
        const kern_adamw_item_t *it = i < count ? &items[i] : NULL;
        if (it && it->mom.fmt != KERN_MOMENTS_F32) { /* bf16 and 8-bit moments: their own kernel */
            kern_adamw_cuda(s, it->p, &it->mom, it->g, it->g_bf16, it->p_bf16, it->n, &it->hp);
            continue;
        }
        if (it && it->n > 0) {
            check_item(it);
            if (m == 0) memset(&d, 0, sizeof d);
            d.t[m] = (adamw_one_t){it->p, (float *)it->mom.m, (float *)it->mom.v, it->g, it->g_bf16, it->p_bf16,
                                   it->hp.nonfinite, it->n, kern_adamw_coef(&it->hp)};
            d.first[m + 1] = d.first[m] + kc_blocks(it->n, ADAMW_THREADS);
            m++;
        }
        if (m > 0 && (m == ADAMW_MANY || !it)) {
            adamw_many_kernel<<<d.first[m], ADAMW_THREADS, 0, cs>>>(d);
            KC_LAUNCHED(s, "adamw_many");
            m = 0;
        }
    }
}
