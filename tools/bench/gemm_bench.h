/* `moetune bench gemm`: matrix products of the backend's kernel table
 * against the machine's peak (see gemm_bench.c).  Returns 0, 1 or 2. */
#ifndef MT_TOOLS_BENCH_GEMM_BENCH_H
#define MT_TOOLS_BENCH_GEMM_BENCH_H

int mt_bench_gemm_main(int argc, char **argv);

#endif
