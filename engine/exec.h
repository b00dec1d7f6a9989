/* The executor: runs the step program of a model under a plan (see
 * scheduler/plan.h) on a backend.  Internal to the engine; the public face
 * is model.h (forward/backward of a micro-batch) and optim.h (the step).
 *
 * Streams: compute (kernels), H2D (weight and activation fetches, prefetched
 * `prefetch_window` blocks ahead), D2H (activation offload, gradients),
 * with an event for every cross-stream dependency.  Buffers that a copy
 * still reads are freed only after the copy's event has fired. */
#ifndef MT_ENGINE_EXEC_H
#define MT_ENGINE_EXEC_H

#include "engine/model.h"
#include "engine/optim.h"

/* Places the host-resident model on the device as plan says. */
mt_status_t eng_exec_create(eng_model_t *m, const sched_plan_t *plan, mt_error_t *err);
void eng_exec_destroy(eng_model_t *m);

/* Folds the finished gradient of parameter i into its accumulator. */
void eng_exec_finish_grad(eng_model_t *m, int i);
/* Waits for every stream and frees what pending copies held. */
void eng_exec_drain(eng_model_t *m);

#endif
