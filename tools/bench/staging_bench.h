/* `moetune bench staging`: the staging modes moving a scaled-down MoE
 * model's weights (H2D, forward and backward) and gradients (D2H, added
 * into host accumulators) on the CPU backend with throttled links.
 *
 * Usage: staging [--layers L] [--experts E] [--active A] [--hidden H] [--inter I] [--vocab V]
 *                [--window W] [--steps S] [--repeats R] [--gbps G] [--latency-us U] [--compute-us C]
 *                [--slots N] [--slabs N] [--modes compact,per_tensor,max_slot] [--no-pack-thread]
 *                [--seed X] [--svg PATH] [--csv PATH] [--json]
 * argv[0] is the subcommand's name (ignored); options start at argv[1].
 * Returns 0 on success, 1 when the run failed (memory, device, results
 * differing between modes), 2 on a bad command line; never exits. */
#ifndef MT_TOOLS_BENCH_STAGING_BENCH_H
#define MT_TOOLS_BENCH_STAGING_BENCH_H

int mt_bench_staging_main(int argc, char **argv);

#endif
