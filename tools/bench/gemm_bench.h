/* `moetune bench gemm`: matrix products of the backend's kernel table
 * against the machine's peak (see gemm_bench.c).  Returns 0, 1 or 2. */
#ifndef MT_TOOLS_BENCH_GEMM_BENCH_H
#define MT_TOOLS_BENCH_GEMM_BENCH_H

int mt_bench_gemm_main(int argc, char **argv);

#include <stdbool.h>

#include "kernels/device.h"

/* `moetune bench gemm --grouped` (gemm_grouped_bench.c): a MoE layer's
 * expert products, one per expert against one grouped call, on dev (cuda:
 * both, TFLOP/s; CPU: the twin's one path).  geometry NULL: the backend's
 * default set, else "qwen3-30b-a3b", "mixtral-8x7b" or "small".  Returns 0,
 * 1 (the device cannot hold it) or 2 (bad geometry). */
int mt_bench_gemm_grouped(kern_device_t *dev, bool cuda, const char *geometry, int reps);

#endif
