/* `moetune bench nvme`: the store (store/store.h) against the directory's
 * own raw O_DIRECT rate, measured in the same run.
 *
 * Raw: one file of --gib GiB written then read sequentially in 1 MiB
 * requests (dd with oflag=direct, bs=1M), at queue depth 1 and at --qd.
 * Store: the same bytes as tensors of a few MB (1.5 to 6 MiB, odd lengths,
 * as a MoE layer's expert matrices and their AdamW moments are) written in
 * batches of a block's worth, then read back in order and in a recorded
 * order (the blocks backward, each block's tensors shuffled), every read
 * checked, one batch at a time; then the rewrite and both reads again with
 * 3 batches in flight (mt_store_submit_* / mt_store_wait), as the host
 * optimizer's prefetch and write-back keep them.  Prints each rate in GB/s
 * and store / raw at the same queue depth; the goal is >= 0.8.
 *
 * Usage: nvme --dir DIR [--gib N] [--qd N] [--io auto|uring|psync]
 * argv[0] is the subcommand's name.  Returns 0, 1 when a step failed, 2 on
 * a bad command line. */
#ifndef MT_TOOLS_BENCH_NVME_BENCH_H
#define MT_TOOLS_BENCH_NVME_BENCH_H

int mt_bench_nvme_main(int argc, char **argv);

#endif
