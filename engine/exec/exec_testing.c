/* The executor's test hooks (exec_testing.h). */
#include "engine/exec/exec_testing.h"

#include "engine/exec/executor.h"
#include "engine/optim/host_optim.h"

void eng_exec_hold_overlapped_updates(eng_exec_t *x, bool hold) { exec_host_optim_hold(&x->hopt, hold); }
