/* One micro-batch's program, block by block: its buffers on the device,
 * each block's forward, the loss, each block's backward.
 *
 * Micro-batch-major order (eng_exec_forward_backward, step.c) runs one of
 * these through every block forward then backward; layer-major order
 * (layer_major.c) runs K of them through each block in turn.  The callers
 * fetch, wait for and release weights (residency.h) and fold gradients
 * (grads.h), which is where the two orders differ. */
#ifndef MT_ENGINE_EXEC_STEP_H
#define MT_ENGINE_EXEC_STEP_H

#include <stdbool.h>

#include "base/status.h"
#include "engine/data/data.h"
#include "engine/exec/place/types.h"

typedef struct exec_micro exec_micro_t;

/* Before micro-batches of `tokens` tokens (a layer-major step: all of its
 * micro-batches' tokens): re-sizes the staging pool when the plan offloads
 * activations and it was sized for fewer tokens. */
mt_status_t exec_micro_prepare(eng_exec_t *x, int tokens, mt_error_t *err);

/* Uploads the batch (ids, targets, mask weights, key lengths); *out is set
 * even on failure and goes to exec_micro_destroy. */
mt_status_t exec_micro_create(eng_exec_t *x, const eng_batch_t *batch, exec_micro_t **out, mt_error_t *err);
/* Frees the micro-batch's buffers and saved activations (after every
 * stream has finished with them). */
void exec_micro_destroy(eng_exec_t *x, exec_micro_t *st);
/* Where the micro-batch's input of decoder block b (1..L) lives: the slot
 * layer-major order offloads it from after the block's forward and
 * fetches it back into before its backward (exec_offload_acts). */
void **exec_micro_input_slot(exec_micro_t *st, int b);
/* Block b's forward for this micro-batch; its weights are on the device
 * (the caller fetched and waited).  Saved activations are kept, offloaded
 * or dropped, as the plan says. */
mt_status_t exec_micro_forward_block(eng_exec_t *x, exec_micro_t *st, int b, const eng_batch_t *batch,
                                     float *logits_out, mt_error_t *err);
/* The micro-batch's loss once the head's forward has run: the aux loss
 * (when on) and the cross-entropy, which with `backward` leaves d(logits)
 * in place of the logits for the head's backward. */
mt_status_t exec_micro_loss(eng_exec_t *x, exec_micro_t *st, const eng_batch_t *batch, float loss_scale,
                            bool backward, eng_micro_stats_t *stats, mt_error_t *err);
/* Block b's backward for this micro-batch: recomputes its activations when
 * the plan drops them, prepares the gradient targets and computes into
 * them.  Its weights and offloaded activations are on the device (the
 * caller fetched and waited); folding the gradients is the caller's
 * (exec_finish_grads), which depends on the step order. */
mt_status_t exec_micro_backward_block(eng_exec_t *x, exec_micro_t *st, int b, mt_error_t *err);

/* Block b's gradients were folded: tells whoever listens (progress.h). */
void exec_micro_block_ready(eng_exec_t *x, int b);

#endif
