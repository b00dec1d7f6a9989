/* Stand-alone `adam_bench` binary: the same code as `moetune bench adam`. */
#include "tools/bench/adam_bench.h"

int main(int argc, char **argv) { return mt_bench_adam_main(argc, argv); }
