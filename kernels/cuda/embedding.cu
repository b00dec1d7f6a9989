// Token embedding lookup and its deterministic scatter-add (embedding.h).
//
// Backward without atomics, bit-identical to the CPU twin: the token ids
// are sorted stably (sort.cu), so each distinct id owns one run of
// positions in ascending order; one block per run start adds those dout
// rows to the table row in that order, starting from the table's value.
// That is exactly the twin's "dtable[ids[i]] += dout[i] for i = 0..n-1"
// element by element, so the sums round alike.  (Chosen over one block
// per vocabulary row scanning all ids, which costs V x n reads.)  Blocks
// at positions that do not start a run exit at once.
#include "kernels/cuda/sort.cuh"

#define EMB_THREADS 256

static __global__ void emb_fwd_kernel(float *out, const float *table, const int32_t *ids, size_t total,
                                      int H) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x) {
        const size_t row = i / (size_t)H, c = i % (size_t)H;
        out[i] = table[(size_t)ids[row] * H + c];
    }
}

static __global__ void emb_bwd_runs_kernel(float *dtable, const float *dout, const int32_t *skeys,
                                           const int32_t *spos, int n, int H) {
    __shared__ int run_end;
    const int p = blockIdx.x;
    const int32_t id = skeys[p];
    if (p > 0 && skeys[p - 1] == id) return; // not the start of a run
    if (threadIdx.x == 0) {
        int q = p + 1;
        while (q < n && skeys[q] == id) q++;
        run_end = q;
    }
    __syncthreads();
    const int end = run_end;
    float *dst = dtable + (size_t)id * H;
    for (int c = threadIdx.x; c < H; c += blockDim.x) {
        float acc = dst[c];
        for (int q = p; q < end; q++) acc += dout[(size_t)spos[q] * H + c];
        dst[c] = acc;
    }
}

extern "C" {

void kern_embedding_fwd_cuda(kern_stream_t *s, float *out, const float *table, const int32_t *ids,
                             int n, int H) {
    if (n <= 0 || H <= 0) return;
    const size_t total = (size_t)n * H;
    cudaStream_t cs = kern_cuda_stream_begin(s);
    emb_fwd_kernel<<<kc_blocks(total, EMB_THREADS), EMB_THREADS, 0, cs>>>(out, table, ids, total, H);
    KC_LAUNCHED(s, "embedding_fwd");
}

void kern_embedding_bwd_cuda(kern_stream_t *s, float *dtable, const float *dout, const int32_t *ids,
                             int n, int H) {
    if (n <= 0 || H <= 0) return;
    int32_t *skeys, *spos;
    kc_sort_positions(s, ids, n, 32, &skeys, &spos, "embedding_bwd");
    cudaStream_t cs = kern_cuda_stream_begin(s);
    const int threads = H >= EMB_THREADS ? EMB_THREADS : (int)kc_div_up((size_t)H, 32) * 32;
    emb_bwd_runs_kernel<<<n, threads, 0, cs>>>(dtable, dout, skeys, spos, n, H);
    KC_LAUNCHED(s, "embedding_bwd");
}

} // extern "C"
