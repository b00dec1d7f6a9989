/* A frozen base kept quantized (see basequant.h).
 *
 * Design notes:
 * - Per block the covered tensors split as the cost model splits weights:
 *   dense ones (moved whole; gpt-oss's fused experts are listed as dense
 *   parts) and one routed expert's, scaled by the experts a micro-batch or
 *   a step hits, as the registry does for the working dtype.
 * - The working copy is sized for the experts a whole step hits (the
 *   larger of the two step orders' uses), so both orders are covered. */
#include "scheduler/basequant.h"

#include <stdlib.h>
#include <string.h>

#include "base/quant.h"

/* Names of tensors that stay in the working dtype though they sit in a decoder layer. */
static bool kept_wide(const char *name) {
    static const char *const parts[] = {"norm", "bias", "sinks", ".gate.weight", "router", "shared_expert_gate",
                                        "e_score_correction"};
    for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++)
        if (strstr(name, parts[i])) return true;
    return false;
}

bool sched_base_quant_covers(const sched_tensor_t *t, int num_blocks, const sched_base_quant_t *q) {
    if (!q->on || t->kind != SCHED_T_WEIGHT || t->trainable) return false;
    if (t->block <= 0 || t->block >= num_blocks - 1 || kept_wide(t->name)) return false;
    const bool expert = t->expert >= 0 || strstr(t->name, "experts");
    if (q->experts_only && !expert) return false;
    if (q->experts_wide && expert) return false;
    return t->numel > 0;
}

typedef struct {
    double dense_work, dense_q;   /* dense tensors: working-dtype bytes, stored bytes */
    double expert_work, expert_q; /* one routed expert's */
} block_q_t;

/* A block's costs with its covered tensors at their stored size. */
static void quantize_cost(sched_block_cost_t *c, const sched_block_info_t *bi, const block_q_t *k, double dev_bw) {
    const double dd = k->dense_work - k->dense_q, de = k->expert_work - k->expert_q;
    const double E = bi->num_experts > 0 ? bi->num_experts : 0;
    c->w_resident_bytes -= dd + E * de;
    c->w_home_bytes -= dd + E * de;
    c->w_fetch_bytes -= dd + bi->experts_hit * de;
    c->w_fetch_step_bytes -= dd + bi->experts_hit_step * de;
    const double work = k->dense_work + bi->experts_hit_step * k->expert_work;
    c->fwd_temp_bytes += work;
    c->bwd_temp_bytes += work;
    const double dq_s = (k->dense_q + k->dense_work + bi->experts_hit * (k->expert_q + k->expert_work)) / dev_bw;
    c->fwd_s += dq_s;
    c->bwd_s += dq_s;
    c->recompute_s += dq_s;
}

void sched_workload_quantize_base(const sched_registry_t *reg, const sched_base_quant_t *q, const sched_hw_t *hw,
                                  sched_workload_t *w) {
    if (!q->on) return;
    const int N = reg->num_blocks;
    block_q_t *k = calloc((size_t)N, sizeof *k);
    MT_CHECK_ALLOC(k, "quantized base counts");
    const double bpp = mt_quant_bytes_per_param(q->format, q->block, q->double_quant);
    w->base_quantized = true;
    w->base_quant_format = q->format;
    for (int i = 0; i < reg->num_tensors; i++) {
        const sched_tensor_t *t = &reg->tensors[i];
        if (!sched_base_quant_covers(t, N, q)) continue;
        const double qb = (double)t->numel * bpp;
        if (t->expert < 0) {
            k[t->block].dense_work += (double)t->bytes, k[t->block].dense_q += qb;
        } else if (t->expert == 0) {
            k[t->block].expert_work += (double)t->bytes, k[t->block].expert_q += qb;
        }
        w->base_quant_bytes += qb;
        w->base_quant_work_bytes += (double)t->bytes;
    }
    const double dev_bw = sched_hw_device_bw(hw);
    for (int b = 0; b < N; b++) {
        if (k[b].dense_work <= 0 && k[b].expert_work <= 0) continue;
        quantize_cost(&w->blocks[b], &reg->blocks[b], &k[b], dev_bw);
        /* expert parallel splits full fine-tuning's experts, which this never covers: same counts */
        if (w->ep_blocks) quantize_cost(&w->ep_blocks[b], &reg->blocks[b], &k[b], dev_bw);
    }
    free(k);
}
