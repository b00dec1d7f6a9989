/* YaRN RoPE (DeepSeek-V3's rope_scaling), as transformers'
 * _compute_yarn_parameters and DeepseekV3RotaryEmbedding compute it (see
 * blocks.h):
 *   pos[i]  = theta ** (2i / dim)                       (fp32)
 *   inv_freq = 1/(factor pos) * (1 - e) + 1/pos * e,    e = 1 - clamp((i - low) / (high - low), 0, 1)
 *   low, high = the correction range of beta_fast / beta_slow rotations over
 *               original_max_position_embeddings (floor / ceil, clipped to
 *               [0, dim - 1]), in double as Python computes it
 *   cos, sin = cos(t inv_freq), sin(t inv_freq), both times the attention
 *              factor get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim)
 *              (get_mscale(factor) alone without both)
 * and MLA's softmax scale gains get_mscale(factor, mscale_all_dim)^2
 * (yarn_apply_mscale).  factor unset: max_position_embeddings /
 * original_max_position_embeddings, as transformers.  Each fp32 step is
 * rounded where torch rounds it. */
#include <math.h>
#include <string.h>

#include "engine/blocks.h"

static double get_mscale(double scale, double mscale) {
    return scale <= 1 ? 1.0 : 0.1 * mscale * log(scale) + 1.0;
}

static double yarn_factor(const eng_model_config_t *c) {
    if (c->rope_factor > 0) return c->rope_factor;
    return (double)c->max_position_embeddings / (double)c->rope_original_max_position_embeddings;
}

bool eng_rope_is_yarn(const eng_model_config_t *c) { return strcmp(c->rope_type, "yarn") == 0; }

double eng_rope_yarn_softmax_factor(const eng_model_config_t *c) {
    if (!eng_rope_is_yarn(c) || !(c->rope_mscale_all_dim != 0)) return 1.0;
    const double m = get_mscale(yarn_factor(c), c->rope_mscale_all_dim);
    return m * m;
}

static double correction_dim(double rotations, int dim, double base, double max_pos) {
    return (dim * log(max_pos / (rotations * 2 * M_PI))) / (2 * log(base));
}

void eng_rope_yarn_table(float *cos_out, float *sin_out, int T, int dim, const eng_model_config_t *c) {
    const int half = dim / 2;
    const double factor = yarn_factor(c);
    const double base = c->rope_theta;
    const double omp = c->rope_original_max_position_embeddings;
    const double bf = c->rope_beta_fast > 0 ? c->rope_beta_fast : 32, bs = c->rope_beta_slow > 0 ? c->rope_beta_slow : 1;
    double attn;
    if (c->rope_mscale != 0 && c->rope_mscale_all_dim != 0)
        attn = get_mscale(factor, c->rope_mscale) / get_mscale(factor, c->rope_mscale_all_dim);
    else
        attn = get_mscale(factor, 1.0);
    double low = floor(correction_dim(bf, dim, base, omp)), high = ceil(correction_dim(bs, dim, base, omp));
    if (low < 0) low = 0;
    if (high > dim - 1) high = dim - 1;
    if (low == high) high += 0.001; /* transformers: prevent a singular ramp */
    const float attn_f = (float)attn, factor_f = (float)factor, low_f = (float)low, span_f = (float)(high - low);
    for (int i = 0; i < half; i++) {
        const float pos = powf((float)base, (float)(2 * i) / (float)dim);
        const float extra = 1.0f / pos, inter = 1.0f / (factor_f * pos);
        float ramp = ((float)i - low_f) / span_f;
        ramp = ramp < 0.0f ? 0.0f : ramp > 1.0f ? 1.0f : ramp;
        const float e = 1.0f - ramp;
        const float inv_freq = inter * (1.0f - e) + extra * e;
        for (int t = 0; t < T; t++) {
            const float angle = (float)t * inv_freq;
            cos_out[(size_t)t * half + i] = cosf(angle) * attn_f;
            sin_out[(size_t)t * half + i] = sinf(angle) * attn_f;
        }
    }
}
