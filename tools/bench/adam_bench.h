/* `moetune bench adam`: host AdamW against this machine's memory ceiling.
 *
 * Usage: adam [--params N] [--threads T] [--repeats R] [--isa auto|scalar|avx2|avx512]
 *             [--hugepages] [--json]
 * argv[0] is the subcommand's name (ignored); options start at argv[1].
 * Returns 0 on success, 1 when the run could not be done (memory), 2 on a
 * bad command line; never exits. */
#ifndef MT_TOOLS_BENCH_ADAM_BENCH_H
#define MT_TOOLS_BENCH_ADAM_BENCH_H

int mt_bench_adam_main(int argc, char **argv);

#endif
