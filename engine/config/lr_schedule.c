/* The learning-rate schedule, exactly as transformers.get_scheduler builds
 * it (src/transformers/optimization.py):
 *   constant              1                      (warmup ignored, as HF does)
 *   constant_with_warmup  s/max(1,w) for s < w, then 1
 *   linear                s/max(1,w) for s < w, then max(0, (N-s)/max(1, N-w))
 *   cosine                s/max(1,w) for s < w, then with p = (s-w)/max(1, N-w)
 *                         max(0, 0.5*(1 + cos(pi * 0.5 * 2 * p)))  (num_cycles 0.5)
 * with s the optimizer step (0-based: torch's LambdaLR gives the first
 * optimizer.step() lambda(0)), w = warmup_steps, N = total optimizer steps.
 * Note cosine past N rises again (p > 1), as HF's does; the trainer never
 * goes there.  The arithmetic is done in double in Python's order so the
 * values match HF's to the last bit where libm's cos agrees. */
#include <math.h>

#include "engine/config/config.h"

double eng_lr_at(const eng_run_config_t *cfg, int step, int total) {
    const double s = (double)step;
    const int w = cfg->warmup_steps;
    const int wmax = w > 1 ? w : 1;
    const int decay = total - w > 1 ? total - w : 1;
    double mult = 1.0;
    switch (cfg->lr_scheduler) {
    case ENG_LR_CONSTANT: mult = 1.0; break;
    case ENG_LR_CONSTANT_WITH_WARMUP: mult = step < w ? s / (double)wmax : 1.0; break;
    case ENG_LR_LINEAR:
        if (step < w) mult = s / (double)wmax;
        else mult = fmax(0.0, (double)(total - step) / (double)decay);
        break;
    case ENG_LR_COSINE:
        if (step < w) {
            mult = s / (double)wmax;
        } else {
            const double progress = (double)(step - w) / (double)decay;
            mult = fmax(0.0, 0.5 * (1.0 + cos(M_PI * 0.5 * 2.0 * progress)));
        }
        break;
    }
    return cfg->learning_rate * mult;
}
