/* `moetune prepare RUN.yaml [--set key=value]...`: reads and tokenizes the
 * run's datasets exactly as `train` will (types, chat template, masking,
 * truncation, packing, evaluation split) and prints what came of them,
 * without loading a model: examples, tokens, trained tokens, rows, what
 * was dropped or truncated, and packing efficiency. */
#ifndef MT_TOOLS_TEXT_PREPARE_CMD_H
#define MT_TOOLS_TEXT_PREPARE_CMD_H

/* argv[0] is the run config; returns the exit status. */
int mt_prepare_main(int argc, char **argv);

#endif
