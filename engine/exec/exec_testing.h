/* What the executor's tests use to take paths deterministically that
 * otherwise depend on timing.  Not for the executor's users. */
#ifndef MT_ENGINE_EXEC_EXEC_TESTING_H
#define MT_ENGINE_EXEC_EXEC_TESTING_H

#include <stdbool.h>

#include "engine/exec/exec.h"

/* While held, the host optimizer starts no update overlapped with the
 * backward (eng_optim_begin_step), so the optimizer step takes every one
 * back and defers it (eng_optim_stats_t.taken_back); only for plans whose
 * host-updated blocks are all streamed with their gradients and state in
 * host memory (any other overlapped update would wait for the hold). */
void eng_exec_hold_overlapped_updates(eng_exec_t *x, bool hold);

#endif
