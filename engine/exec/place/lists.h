/* The parameters each block works with, as lists of parameter indices: the
 * dense (non-routed) ones it computes with, the experts of a MoE layer that
 * got tokens (with their LoRA factors), and per-parameter stamps for taking
 * a list's duplicates out (a tied weight is in two blocks' lists).
 *
 * Built once when the executor opens; read by residency (what to fetch),
 * gradients (what gets a target) and the staging pool (how big a window
 * is), which is why it sits below all three. */
#ifndef MT_ENGINE_EXEC_LISTS_H
#define MT_ENGINE_EXEC_LISTS_H

#include <stdint.h>

#include "engine/layers/env.h"

typedef struct {
    const eng_layer_env_t *env; /* not owned: the model and the plan */
    int nb;                     /* blocks: L + 2 */
    int **used, *nused;         /* per block: dense parameters it computes with */
    int *mark;                  /* per parameter: the stamp of the last pass that took it */
    int mark_gen;               /* the running pass's stamp (++mark_gen starts one) */
} exec_lists_t;

void exec_lists_init(exec_lists_t *l, const eng_layer_env_t *env);
void exec_lists_free(exec_lists_t *l);

/* A list big enough for block b's dense tensors and every expert's (free it). */
int *exec_id_buffer(const exec_lists_t *l, int b);
/* exec_id_buffer(l, b) holding block b's dense parameters, *n of them. */
int *exec_block_ids(const exec_lists_t *l, int b, int *n);
/* Appends to ids[n..] the tensors of layer l's experts with tokens on this
 * device (counts NULL: none) with their LoRA factors; returns the new n. */
int exec_expert_ids(const eng_layer_env_t *env, int l, const int32_t *counts, int *ids, int n);

#endif
