/* RoPE tables of a config (see rope_tables.h).  YaRN follows
 * transformers 5's _compute_yarn_parameters line by line: the correction
 * range in double (Python floats), the frequencies, ramp and blend in fp32
 * (torch float32 tensors), the attention factor applied to cos and sin in
 * fp32 as GptOssRotaryEmbedding and DeepseekV3RotaryEmbedding do. */
#include "engine/model/desc/rope_tables.h"

#include <math.h>
#include <stddef.h>
#include <string.h>

#include "kernels/rope.h"

bool eng_rope_type_computed(const eng_model_config_t *c) {
    return strcmp(c->rope_type, "default") == 0 || strcmp(c->rope_type, "yarn") == 0;
}

/* The dimension at which a wavelength makes num_rot rotations over max_pos. */
static double correction_dim(double num_rot, int dim, double base, double max_pos) {
    return (dim * log(max_pos / (num_rot * 2 * M_PI))) / (2 * log(base));
}

static double yarn_mscale(double scale, double mscale) { return scale <= 1 ? 1.0 : 0.1 * mscale * log(scale) + 1.0; }

static bool is_yarn(const eng_model_config_t *c) { return strcmp(c->rope_type, "yarn") == 0; }

static double yarn_factor(const eng_model_config_t *c) {
    return c->rope_factor > 0 ? c->rope_factor
                              : (double)c->max_position_embeddings / c->rope_original_max_position_embeddings;
}

double eng_rope_yarn_softmax_factor(const eng_model_config_t *c) {
    if (!is_yarn(c) || !(c->rope_mscale_all_dim != 0)) return 1.0;
    const double m = yarn_mscale(yarn_factor(c), c->rope_mscale_all_dim);
    return m * m;
}

void eng_rope_tables(const eng_model_config_t *c, int T, int dim, float *cos_out, float *sin_out) {
    const int half = dim / 2;
    if (!is_yarn(c)) {
        kern_rope_table(cos_out, sin_out, T, dim, c->rope_theta);
        return;
    }
    const double base = c->rope_theta;
    const double factor = yarn_factor(c);
    double att = c->rope_attention_factor;
    if (!(att > 0))
        att = c->rope_mscale != 0 && c->rope_mscale_all_dim != 0
                  ? yarn_mscale(factor, c->rope_mscale) / yarn_mscale(factor, c->rope_mscale_all_dim)
                  : yarn_mscale(factor, 1.0);
    const double beta_fast = c->rope_beta_fast != 0 ? c->rope_beta_fast : 32; /* `or 32`: 0 means the default */
    const double beta_slow = c->rope_beta_slow != 0 ? c->rope_beta_slow : 1;
    const double max_pos = c->rope_original_max_position_embeddings;
    double low = correction_dim(beta_fast, dim, base, max_pos), high = correction_dim(beta_slow, dim, base, max_pos);
    if (c->rope_truncate) {
        low = floor(low);
        high = ceil(high);
    }
    low = low > 0 ? low : 0;
    high = high < dim - 1 ? high : dim - 1;
    if (low == high) high += 0.001; /* transformers: prevent a zero-width ramp */
    const float attf = (float)att;
    for (int i = 0; i < half; i++) {
        const float pos_freq = powf((float)base, (float)(2 * i) / (float)dim);
        const float extrap = 1.0f / pos_freq, interp = 1.0f / ((float)factor * pos_freq);
        float ramp = ((float)i - (float)low) / (float)(high - low);
        ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
        const float keep = 1.0f - ramp; /* the share that extrapolates (unscaled frequency) */
        const float inv_freq = interp * (1.0f - keep) + extrap * keep;
        for (int t = 0; t < T; t++) {
            const float angle = (float)t * inv_freq;
            cos_out[(size_t)t * half + i] = cosf(angle) * attf;
            sin_out[(size_t)t * half + i] = sinf(angle) * attf;
        }
    }
}
