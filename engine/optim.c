/* Optimizer step (see optim.h). */
#include "engine/optim.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

mt_status_t eng_optim_step(eng_model_t *m, const eng_optim_hparams_t *hp, eng_optim_stats_t *out,
                           mt_error_t *err) {
    kern_device_t *dev = m->dev;
    kern_stream_t *s = kern_stream(dev, KERN_STREAM_COMPUTE);
    const kern_ops_t *ops = dev->ops;
    memset(out, 0, sizeof *out);

    /* Global norm over the parameters that have a gradient, summed in
     * parameter order in double so the result is deterministic. */
    float *sq = kern_alloc(dev, sizeof(float), "gradient norm scalar", err);
    if (!sq) return err->code;
    double total = 0;
    for (int i = 0; i < m->spec.count; i++) {
        const eng_param_t *p = &m->params[i];
        if (!p->has_grad) continue;
        float part;
        ops->sumsq(s, sq, p->g, p->spec->numel);
        kern_memcpy_d2h(dev, s, &part, sq, sizeof part);
        kern_stream_sync(dev, s);
        total += part;
    }
    kern_free(dev, sq);
    out->grad_norm = sqrt(total);
    out->clip_scale = 1.0;
    if (hp->max_grad_norm > 0) {
        const double coef = hp->max_grad_norm / (out->grad_norm + 1e-6);
        if (coef < 1.0) out->clip_scale = coef;
    }

    for (int i = 0; i < m->spec.count; i++) {
        eng_param_t *p = &m->params[i];
        if (!p->has_grad) {
            out->skipped++;
            continue;
        }
        const size_t bytes = p->spec->numel * sizeof(float);
        if (!p->m) { /* lazily, as torch creates state on the first step */
            char tag[192];
            snprintf(tag, sizeof tag, "AdamW m of %s", p->spec->name);
            p->m = kern_alloc(dev, bytes, tag, err);
            if (!p->m) return err->code;
            snprintf(tag, sizeof tag, "AdamW v of %s", p->spec->name);
            p->v = kern_alloc(dev, bytes, tag, err);
            if (!p->v) return err->code;
            kern_memset(dev, s, p->m, 0, bytes);
            kern_memset(dev, s, p->v, 0, bytes);
        }
        p->step++;
        const kern_adamw_params_t ap = {
            .lr = (float)hp->lr,
            .beta1 = (float)hp->beta1,
            .beta2 = (float)hp->beta2,
            .eps = (float)hp->eps,
            .weight_decay = (float)hp->weight_decay,
            .grad_scale = (float)out->clip_scale,
            .step = p->step,
        };
        ops->adamw(s, p->w, p->m, p->v, p->g, NULL, NULL, p->spec->numel, &ap);
        out->updated++;
    }
    kern_stream_sync(dev, s);
    eng_model_zero_grad(m);
    return MT_OK;
}
