// A CPU emulator for the CUDA kernels of kernels/cuda, so that their index
// arithmetic, tiling, masks, barriers and warp shuffles run (and are tested
// against the CPU twins) on machines without a GPU.
//
// The kernels' sources are compiled unchanged by g++ after cu2cc.py turns
// `k<<<grid, block, smem, stream>>>(args)` into `emu_launch(k, ...)(args)`.
// Each CUDA thread of a block is a coroutine with its own stack; a block's
// threads run one at a time until they reach a __syncthreads (block
// barrier), a __syncwarp or a shuffle (warp barrier), so barrier semantics
// and shuffle data exchange are exact.  Blocks run one after another (the
// kernels never communicate between blocks).  __shared__ variables become
// function statics (one block at a time, so they are shared exactly by the
// block's threads) and dynamic shared memory is a per-block buffer filled
// with 0xFF (NaN) so reads of unwritten shared memory show.
//
// What it checks beyond the results: launch configurations a GPU rejects
// (empty grids, > 1024 threads, > 48 KB of dynamic shared memory without
// the opt-in, > 227 KB), shuffles from lanes that did not take part,
// barriers reached by only part of a block or warp (deadlock on a GPU), and,
// by running the threads of odd blocks in reverse order, reads of shared
// memory that a missing barrier leaves racing.  Not modelled: device
// numerics (expf here is glibc's), memory coalescing and bank conflicts.
#ifndef MT_TESTS_GPU_EMU_CUDA_EMU_H
#define MT_TESTS_GPU_EMU_CUDA_EMU_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <tuple>
#include <utility>

#include "cuda_runtime_api.h"

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static

struct uint3 {
    unsigned x, y, z;
};

struct dim3 {
    unsigned x, y, z;
    constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};

extern uint3 threadIdx, blockIdx;
extern dim3 blockDim, gridDim;

static inline int min(int a, int b) { return a < b ? a : b; }
static inline int max(int a, int b) { return a > b ? a : b; }

void __syncthreads(void);
void __syncwarp(unsigned mask = 0xffffffffu);

// Deposits size bytes for this lane, waits for the warp, and returns where
// lane src's bytes of the same shuffle are.
const void *emu_shfl_exchange(const void *v, size_t size, int src);
int emu_lane(void);

template <class T>
T __shfl_xor_sync(unsigned, T v, int lane_mask) {
    static_assert(sizeof(T) <= 8, "emulated shuffles move at most 8 bytes");
    T r;
    memcpy(&r, emu_shfl_exchange(&v, sizeof v, emu_lane() ^ lane_mask), sizeof r);
    return r;
}

template <class T>
T __shfl_sync(unsigned, T v, int src) {
    static_assert(sizeof(T) <= 8, "emulated shuffles move at most 8 bytes");
    T r;
    memcpy(&r, emu_shfl_exchange(&v, sizeof v, src & 31), sizeof r);
    return r;
}

void *emu_dynamic_smem_ptr(void);
template <class T>
T *emu_dynamic_smem(void) {
    return static_cast<T *>(emu_dynamic_smem_ptr());
}

struct emu_cfg {
    dim3 grid, block;
    size_t smem;
    const void *kernel;
};

// Runs body(ctx) as every thread of every block of c.
void emu_run(const emu_cfg &c, void (*body)(void *), void *ctx);
// Records that kernel may use `bytes` of dynamic shared memory.
void emu_note_smem_optin(const void *kernel, size_t bytes);

template <class... P>
struct emu_launcher {
    void (*k)(P...);
    emu_cfg c;
    template <class... A>
    void operator()(A &&...a) const {
        static_assert(sizeof...(A) == sizeof...(P), "kernel launched with the wrong argument count");
        std::tuple<P...> args(static_cast<P>(a)...);
        struct call_t {
            void (*k)(P...);
            std::tuple<P...> *args;
        } call = {k, &args};
        emu_run(c, [](void *p) { auto *x = static_cast<call_t *>(p); std::apply(x->k, *x->args); }, &call);
    }
};

template <class... P>
emu_launcher<P...> emu_launch(void (*k)(P...), dim3 grid, dim3 block, size_t smem = 0,
                              cudaStream_t stream = nullptr) {
    (void)stream;
    return emu_launcher<P...>{k, emu_cfg{grid, block, smem, reinterpret_cast<const void *>(k)}};
}

#endif
