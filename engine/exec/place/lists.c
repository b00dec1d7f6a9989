/* The blocks' parameter lists (see lists.h). */
#include "engine/exec/place/lists.h"

#include <stdlib.h>
#include <string.h>

#include "base/status.h"
#include "engine/exec/place/plan_query.h"

static void add_used(exec_lists_t *l, int b, int i) {
    if (i < 0) return;
    l->used[b][l->nused[b]++] = i;
}

void exec_lists_init(exec_lists_t *l, const eng_layer_env_t *env) {
    const eng_model_t *m = env->model;
    const int L = m->cfg.num_hidden_layers;
    memset(l, 0, sizeof *l);
    l->env = env;
    l->nb = eng_model_num_blocks(m);
    l->used = calloc((size_t)l->nb, sizeof *l->used);
    l->nused = calloc((size_t)l->nb, sizeof *l->nused);
    l->mark = calloc((size_t)m->num_params, sizeof *l->mark);
    MT_CHECK(l->used && l->nused && l->mark, "out of memory for block lists");
    for (int b = 0; b < l->nb; b++) {
        l->used[b] = malloc((size_t)m->num_params * sizeof(int));
        MT_CHECK_ALLOC(l->used[b], "block list");
    }
    /* dense (non-routed) parameters each block computes with */
    for (int i = 0; i < m->num_params; i++)
        if (m->params[i].spec->expert < 0 && m->params[i].block != L + 1 && i != m->embed)
            add_used(l, m->params[i].block, i);
    add_used(l, 0, m->embed);
    add_used(l, L + 1, m->final_norm);
    add_used(l, L + 1, m->lm_head);
}

void exec_lists_free(exec_lists_t *l) {
    for (int b = 0; l->used && b < l->nb; b++) free(l->used[b]);
    free(l->used);
    free(l->nused);
    free(l->mark);
    memset(l, 0, sizeof *l);
}

int *exec_id_buffer(const exec_lists_t *l, int b) {
    const eng_model_t *m = l->env->model;
    const int n = l->nused[b] + 9 * m->cfg.num_experts + 1;
    int *ids = malloc((size_t)n * sizeof *ids);
    MT_CHECK_ALLOC(ids, "parameter list");
    return ids;
}

int *exec_block_ids(const exec_lists_t *l, int b, int *n) {
    int *ids = exec_id_buffer(l, b);
    *n = l->nused[b];
    memcpy(ids, l->used[b], (size_t)*n * sizeof *ids);
    return ids;
}

/* An expert's adapter moves and trains with it, and like it only when the
 * expert got tokens. */
int exec_expert_ids(const eng_layer_env_t *env, int l, const int32_t *counts, int *ids, int n) {
    const eng_model_t *m = env->model;
    const eng_layer_index_t *Lx = &m->layers[l];
    for (int e = 0; counts && e < m->cfg.num_experts; e++)
        if (counts[e] > 0 && !exec_ep_foreign(env, &m->params[Lx->exp_gate[e]])) {
            const int mods[3] = {Lx->exp_gate[e], Lx->exp_up[e], Lx->exp_down[e]};
            for (int k = 0; k < 3; k++) {
                const eng_param_t *p = &m->params[mods[k]];
                ids[n++] = mods[k];
                if (p->lora_a < 0) continue;
                /* an up adapter in PEFT's fused form shares its gate's A: listed once */
                if (k != 1 || p->lora_a != m->params[mods[0]].lora_a) ids[n++] = p->lora_a;
                ids[n++] = p->lora_b;
            }
        }
    return n;
}
