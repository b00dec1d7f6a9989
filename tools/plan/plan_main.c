/* Stand-alone `plan` binary (the same as `moetune plan`), for development. */
#include "tools/plan/plan_cmd.h"

int main(int argc, char **argv) { return mt_plan_main(argc, argv); }
