/* The grouped router's parameters from the config, and its
 * e_score_correction_bias on the device (see blocks.h).  It is a buffer, not a parameter: no gradient, no
 * optimizer state, no residency decision; E floats per MoE layer, so it is
 * uploaded from its host copy for each forward and freed after the router
 * ran rather than planned like a weight. */
#include <string.h>

#include "engine/layers/blocks.h"

mt_status_t eng_router_bias_upload(eng_layer_env_t *env, int layer, float **out, mt_error_t *err) {
    eng_model_t *m = env->model;
    *out = NULL;
    const int b = m->layers[layer].router_bias;
    if (b < 0) return MT_OK;
    const eng_param_spec_t *ps = &m->spec.buffers[b];
    MT_CHECK(m->buffer_host && m->buffer_host[b], "%s: buffer not read from the checkpoint", ps->name);
    const size_t bytes = ps->numel * sizeof(float);
    float *d = kern_alloc(env->dev, bytes, ps->name, err);
    if (!d) return err->code;
    kern_stream_t *s = kern_stream(env->dev, KERN_STREAM_COMPUTE);
    kern_memcpy_h2d(env->dev, s, d, m->buffer_host[b], bytes);
    *out = d;
    return MT_OK;
}

bool eng_router_group_of(const eng_model_config_t *c, kern_router_group_t *g) {
    memset(g, 0, sizeof *g);
    const bool v2 = c->arch == ENG_ARCH_DEEPSEEK_V2;
    if (c->routing != ENG_ROUTE_SIGMOID_GROUP_BIAS && !v2) return false;
    /* DeepSeek-V2's greedy ignores any n_group (one group of all experts);
     * its group_limited_greedy and V3 / GLM use n_group / topk_group */
    const bool grouped = c->routing == ENG_ROUTE_SIGMOID_GROUP_BIAS || c->routing == ENG_ROUTE_SOFTMAX_GROUP;
    g->n_group = grouped && c->n_group > 0 ? c->n_group : 1;
    g->topk_group = grouped && c->topk_group > 0 ? c->topk_group : 1;
    /* transformers' DeepseekV2TopkRouter never renormalises (engine/model/trainable.c
     * refuses a V2 config asking for it) */
    g->renorm = !v2 && c->norm_topk_prob;
    g->scale = c->routed_scaling_factor;
    g->softmax = v2;
    return true;
}
