/* Stand-alone `staging_bench` binary: the same code as `moetune bench staging`. */
#include "tools/bench/staging_bench.h"

int main(int argc, char **argv) { return mt_bench_staging_main(argc, argv); }
