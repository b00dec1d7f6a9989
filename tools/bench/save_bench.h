/* `moetune bench save`: how long a resumable checkpoint-N save (model,
 * optimizer.safetensors, trainer_state.json, each file fsync'd, switched in
 * atomically) takes for the quick start's model, against the disk's own
 * sequential write speed measured in the same run (one file of the same
 * size written and fsync'd in the same directory).  The ratio says what the
 * save's extra work costs over the disk: conversion, the optimizer state
 * read back, the staging directory and renames.
 *
 * Usage: save [--scale K] [--dir DIR] [--repeats R] [--json]
 *   --scale K  multiplies the quick start model's hidden_size, head_dim and
 *              intermediate_size by K (parameters grow about K^2)
 *   --dir DIR  where to write (default: a new directory under $TMPDIR or
 *              /tmp), to measure the disk a run's output_dir is on
 * argv[0] is the subcommand's name.  Returns 0, 1 when the run failed, 2 on
 * a bad command line. */
#ifndef MT_TOOLS_BENCH_SAVE_BENCH_H
#define MT_TOOLS_BENCH_SAVE_BENCH_H

int mt_bench_save_main(int argc, char **argv);

#endif
