/* `moetune bench step`: training steps of a synthetic MoE under keep_all,
 * offload_all and min_memory on the CPU backend with throttled links; see
 * step_bench.c.  Returns 0, 1 (a run failed) or 2 (bad command line). */
#ifndef MT_TOOLS_BENCH_STEP_BENCH_H
#define MT_TOOLS_BENCH_STEP_BENCH_H

int mt_bench_step_main(int argc, char **argv);

#endif
