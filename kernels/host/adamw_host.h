/* Host AdamW: the optimizer step on host memory, over a host thread pool.
 *
 * Host work, not a device's kernel: the engine runs it on host copies of
 * the weights beside any device (//kernels/host is below both backends and
 * the engine), and the CPU backend's table entry kern_adamw_cpu(s, ...)
 * (kernels/adamw.h) is this over the backend's pool.  These take the pool
 * directly, so tests, the benchmark and the engine's host-optimizer threads
 * run the kernel without a backend, and pick the instruction set (tests
 * compare the paths on one machine).
 *
 * Numerics (all paths, bit-identical to each other and to the CUDA twin):
 * kernels/math/adamw_math.h defines the per-element op order, torch's fp32 AdamW
 * (torch >= 2.0 _single_tensor_adamw) op by op:
 *   g   = g * grad_scale
 *   p   = p * decay                          decay = (float)(1 - lr*wd)
 *   m   = fma(w, g - m, m)                   torch lerp_, w = (float)(1-beta1)
 *         (fma(w - 1, g - m, g) when w >= 0.5, lerp's other branch)
 *   v   = v*beta2 + ((1-beta2)*g)*g          mul_ then addcmul_, unfused
 *   den = sqrt(v) / bc2_sqrt + eps           bc2_sqrt = (float)sqrt(1-beta2^t)
 *   p   = p + ((-step_size) * m) / den       addcdiv_, step_size =
 *                                            (float)(lr / (1-beta1^t))
 * Bias corrections are computed in double (as Python does) and rounded to
 * float once. The only fused operation is the lerp's, which torch's AVX2 /
 * AVX-512 lerp kernel also fuses; the scalar path uses fmaf() so that every
 * path gives the same bits (and results don't depend on the machine).
 *
 * Against torch itself: m, the decay, den and the p update round exactly as
 * torch's CPU kernels do, but torch builds compiled with FMA contraction
 * (GCC's default for C++; Debian's torch here) turn addcmul_ into
 * fma((1-beta2)*g, g, v*beta2), so v can differ by a few ulp (measured: up
 * to 4 ulp in ~19% of elements over 5 steps) and p by what that implies.
 * Fusing v the same way here and in adamw_math.h was measured bit-identical
 * to that torch on 1M elements x 5 steps (p, m, v, bf16 copy), all paths.
 * Against a double-precision evaluation of the formula, adamw_test.c checks
 * a derived first-order bound (m within u(|m'|+|g|+2|g-m|), v within 6u v',
 * p within u(|p'|+2|p*decay|+(step/den)(M+10|m'|)), u = 2^-24). */
#ifndef MT_KERNELS_HOST_ADAMW_HOST_H
#define MT_KERNELS_HOST_ADAMW_HOST_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/adamw.h"
#include "kernels/host/threadpool.h"
#include "kernels/math/adamw_math.h"

typedef enum {
    KERN_ISA_AUTO = 0, /* the widest this CPU supports */
    KERN_ISA_SCALAR,
    KERN_ISA_AVX2,   /* AVX2 + FMA */
    KERN_ISA_AVX512, /* AVX-512F */
} kern_cpu_isa_t;

/* The widest path this CPU (and OS) can run. */
kern_cpu_isa_t kern_cpu_isa_best(void);
/* 1 when this CPU can run isa (AUTO and SCALAR always). */
int kern_cpu_isa_supported(kern_cpu_isa_t isa);
const char *kern_cpu_isa_name(kern_cpu_isa_t isa);

/* Same semantics as kern_adamw_cpu, for moments in any format
 * (moments.c); pool NULL runs on the calling thread. */
void kern_adamw_cpu_pool(kern_threadpool_t *pool, float *p, const kern_moments_t *mom, const float *g,
                         const uint16_t *g_bf16, uint16_t *p_bf16, size_t n,
                         const kern_adamw_params_t *hp);

/* Out of place: the update of the state in p_src and mom_src (left as it
 * was) written to p and mom, the same bits the in-place update would leave
 * there.  Speculation (engine/optim/speculate.h) keeps the old state this
 * way without copying it first.  p_src == p with mom_src's buffers equal to
 * mom's is the in-place call; otherwise no source may overlap a destination
 * (fatal), and mom_src has mom's format (the bf16 format's rounding uses
 * mom's seed).  Traffic: the in-place 28 bytes per element (fp32 moments)
 * plus, on CPUs that allocate on write, a read of each destination line
 * before it is written (12 bytes). */
void kern_adamw_cpu_pool_from(kern_threadpool_t *pool, const float *p_src, const kern_moments_t *mom_src, float *p,
                              const kern_moments_t *mom, const float *g, const uint16_t *g_bf16, uint16_t *p_bf16,
                              size_t n, const kern_adamw_params_t *hp);
void kern_adamw_moments_isa_from(kern_threadpool_t *pool, kern_cpu_isa_t isa, const float *p_src,
                                 const kern_moments_t *mom_src, float *p, const kern_moments_t *mom, const float *g,
                                 const uint16_t *g_bf16, uint16_t *p_bf16, size_t n, const kern_adamw_params_t *hp);

/* As kern_adamw_cpu_pool on a chosen path (the fp32 format goes to
 * kern_adamw_cpu_isa); every path gives the same bits. */
void kern_adamw_moments_isa(kern_threadpool_t *pool, kern_cpu_isa_t isa, float *p, const kern_moments_t *mom,
                            const float *g, const uint16_t *g_bf16, uint16_t *p_bf16, size_t n,
                            const kern_adamw_params_t *hp);

/* The moments' one allocation (kernels/adamw.h): its bytes for n elements,
 * and the view of base laid out as m | v | m_absmax | v_absmax (each part
 * 64-byte aligned); seed: the bf16 format's stochastic-rounding seed. */
size_t kern_moments_bytes(kern_moments_fmt_t fmt, size_t n);
kern_moments_t kern_moments_view(kern_moments_fmt_t fmt, void *base, size_t n, uint64_t seed);
size_t kern_moments_blocks(size_t n); /* 8-bit absmax blocks of n elements */
const char *kern_moments_fmt_name(kern_moments_fmt_t fmt); /* "fp32", "bf16", "8bit" */
/* The moments as fp32 (either output may be NULL), and set from fp32 (the
 * format's rounding: bf16 stochastic with step 0's bits, 8-bit by block).
 * fp32 and bf16 round-trip exactly (bf16 values round to themselves);
 * 8-bit does not always (a block's new absmax), so its state is moved and
 * saved as codes and scales. */
void kern_moments_to_f32(const kern_moments_t *mom, size_t n, float *m, float *v);
void kern_moments_from_f32(const kern_moments_t *mom, size_t n, const float *m, const float *v);

/* As kern_adamw_cpu_pool on a chosen path. An ISA the CPU lacks is a broken
 * invariant (fatal); ask kern_cpu_isa_supported first. */
void kern_adamw_cpu_isa(kern_threadpool_t *pool, kern_cpu_isa_t isa, float *p, float *m, float *v,
                        const float *g, const uint16_t *g_bf16, uint16_t *p_bf16, size_t n,
                        const kern_adamw_params_t *hp);
/* Its out-of-place form (as kern_adamw_cpu_pool_from): all three sources
 * equal to their destinations, or none of them overlapping any. */
void kern_adamw_cpu_isa_from(kern_threadpool_t *pool, kern_cpu_isa_t isa, const float *p_src, const float *m_src,
                             const float *v_src, float *p, float *m, float *v, const float *g,
                             const uint16_t *g_bf16, uint16_t *p_bf16, size_t n, const kern_adamw_params_t *hp);

/* The update of n elements on the calling thread with the per-call
 * constants already made (kern_adamw_coef), on an ISA this CPU has: the
 * lighter moment formats run it on each block's fp32 moments.  Returns 1
 * when a master value it wrote is NaN or Inf. */
int kern_adamw_block_isa(kern_cpu_isa_t isa, const kern_adamw_coef_t *c, float *p, float *m, float *v,
                         const float *g, const uint16_t *g_bf16, uint16_t *p_bf16, size_t n);

/* Elements per thread-pool task for a tensor of n elements on nthreads
 * (exposed for the benchmark, which splits its ceiling pass the same way). */
size_t kern_adamw_chunk_elems(size_t n, int nthreads);

#endif
