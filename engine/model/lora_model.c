/* A LoRA run's adapters as parameters of the model (see lora_model.h). */
#include "engine/model/lora_model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/finite.h"
#include "base/rng.h"
#include "engine/model/lora/peft5.h"

/* ---- run config -> options ------------------------------------------------ */

mt_status_t eng_lora_run_opts(const eng_run_config_t *rc, eng_lora_run_opts_t *out, mt_error_t *err) {
    memset(out, 0, sizeof *out);
    eng_lora_opts_t *o = &out->opts;
    o->r = rc->lora_r;
    o->alpha = rc->lora_alpha;
    o->use_rslora = rc->use_rslora;
    o->dropout = rc->lora_dropout;
    o->seed = rc->seed;
    o->quant = (eng_lora_quant_t){.load_in_4bit = rc->load_in_4bit,
                                  .format = rc->bnb_4bit_quant_type == ENG_BNB_FP4 ? MT_QUANT_FP4 : MT_QUANT_NF4,
                                  .double_quant = rc->bnb_4bit_use_double_quant,
                                  .skip = (const char(*)[128])rc->llm_int8_skip_modules,
                                  .num_skip = rc->num_llm_int8_skip_modules};
    int n = 0;
    for (int i = 0; i < rc->num_lora_target_modules; i++) out->modules[n++] = rc->lora_target_modules[i];
    if (rc->lora_target_linear) out->modules[n++] = "all-linear";
    o->select.modules = out->modules;
    o->select.num_modules = n;
    o->select.regex = rc->lora_target_regex[0] ? rc->lora_target_regex : NULL;
    if (o->select.regex && strcmp(o->select.regex, "all-linear") == 0) {
        o->select.regex = NULL;
        out->modules[n++] = "all-linear";
        o->select.num_modules = n;
    }
    o->select.r = o->r;
    for (int i = 0; i < rc->num_lora_modules_to_save; i++) out->to_save[i] = rc->lora_modules_to_save[i];
    o->select.modules_to_save = out->to_save;
    o->select.num_modules_to_save = rc->num_lora_modules_to_save;
    if (!rc->lora_model_dir[0]) return MT_OK;

    o->init_dir = rc->lora_model_dir;
    char path[1200];
    snprintf(path, sizeof path, "%s/adapter_config.json", rc->lora_model_dir);
    mt_status_t st = eng_lora_config_read(path, &out->init_cfg, err);
    if (st != MT_OK) return mt_error_prefix(err, "%s: lora_model_dir: ", rc->source_path);
    const eng_lora_config_t *c = &out->init_cfg;
    /* The file's r, alpha and rsLoRA define the adapter's function: a run
     * that says otherwise would silently change it. */
    if (c->r != o->r)
        return mt_error_set(err, MT_ERR_CONFIG, "%s: lora_r is %d, but the adapter in lora_model_dir (%s) has r %d; "
                            "set lora_r: %d",
                            rc->source_path, o->r, path, c->r, c->r);
    if (fabs(c->lora_alpha - o->alpha) > 1e-12 * fabs(c->lora_alpha))
        return mt_error_set(err, MT_ERR_CONFIG,
                            "%s: lora_alpha is %g, but the adapter in lora_model_dir (%s) has lora_alpha %g; set "
                            "lora_alpha: %g",
                            rc->source_path, o->alpha, path, c->lora_alpha, c->lora_alpha);
    if (c->use_rslora != o->use_rslora)
        return mt_error_set(err, MT_ERR_CONFIG,
                            "%s: use_rslora is %s, but the adapter in lora_model_dir (%s) has use_rslora %s",
                            rc->source_path, o->use_rslora ? "true" : "false", path,
                            c->use_rslora ? "true" : "false");
    if (o->select.num_modules == 0 && !o->select.regex) { /* the run continues the adapter's targets */
        eng_lora_config_select(c, &o->select);
        o->select.r = o->r;
        if (rc->num_lora_modules_to_save == 0) {
            o->select.modules_to_save = (const char *const *)c->modules_to_save;
            o->select.num_modules_to_save = c->num_modules_to_save;
        }
    }
    return MT_OK;
}

void eng_lora_run_opts_free(eng_lora_run_opts_t *o) {
    eng_lora_config_free(&o->init_cfg);
    memset(o, 0, sizeof *o);
}

/* ---- the factors as parameters -------------------------------------------- */

static void factor_spec(eng_param_spec_t *s, const eng_param_spec_t *base, eng_param_role_t role, int r) {
    memset(s, 0, sizeof *s);
    char module[sizeof s->name];
    if (!eng_lora_module_of(base, module, sizeof module)) snprintf(module, sizeof module, "%s", base->name);
    const bool a = role == ENG_P_LORA_A;
    int w = snprintf(s->name, sizeof s->name, "%s.%s.weight", module, a ? "lora_A" : "lora_B");
    MT_CHECK(w > 0 && (size_t)w < sizeof s->name, "adapter name for %s is too long", base->name);
    s->role = role;
    s->adapts = base->role;
    s->kind = ENG_TENSOR_PARAM;
    s->layer = base->layer;
    s->expert = base->expert;
    s->ndim = 2;
    s->shape[0] = a ? r : base->shape[0];
    s->shape[1] = a ? base->shape[1] : r;
    s->numel = (size_t)s->shape[0] * (size_t)s->shape[1];
    s->dtype = MT_F32;
    s->trainable = true;
}

/* As the base's loader does: a non-finite value would only surface as a
 * diverged first step, blamed on training. */
static mt_status_t check_finite(const eng_model_t *m, const eng_lora_weights_t *w, const char *path,
                                mt_error_t *err) {
    for (int t = 0; t < w->count; t++) {
        const eng_lora_pair_t *pr = &w->pairs[t];
        const float *f[2] = {pr->a, pr->b};
        const size_t n[2] = {(size_t)pr->r * (size_t)pr->in, (size_t)pr->out * (size_t)pr->r};
        for (int k = 0; k < 2; k++) {
            const size_t bad = mt_first_nonfinite_f32(f[k], n[k]);
            if (bad < n[k]) {
                char module[160];
                if (!eng_lora_module_of(&m->spec.params[pr->param], module, sizeof module))
                    snprintf(module, sizeof module, "%s", m->spec.params[pr->param].name);
                return mt_error_set(err, MT_ERR_FORMAT,
                                    "%s: %s.lora_%c holds %s at element %zu; the adapter is corrupt or diverged", path,
                                    module, k ? 'B' : 'A', mt_nonfinite_name(f[k][bad]), bad);
            }
        }
    }
    for (int k = 0; k < w->num_saved; k++) {
        const size_t n = m->spec.params[w->saved[k].param].numel, bad = mt_first_nonfinite_f32(w->saved[k].data, n);
        if (bad < n)
            return mt_error_set(err, MT_ERR_FORMAT, "%s: %s holds %s at element %zu", path,
                                m->spec.params[w->saved[k].param].name, mt_nonfinite_name(w->saved[k].data[bad]), bad);
    }
    return MT_OK;
}

/* The adapter in o->init_dir, read with its own adapter_config.json (a
 * resumed run's checkpoint holds the one moetune wrote), checked against
 * the run's selection and for non-finite values, kept in lo->init; each
 * target takes its rank, alpha, s and A-sharing from it. */
static mt_status_t read_init(eng_model_t *m, const char *dir, mt_error_t *err) {
    eng_model_lora_t *lo = &m->lora;
    char cpath[1200], wpath[1200];
    snprintf(cpath, sizeof cpath, "%s/adapter_config.json", dir);
    snprintf(wpath, sizeof wpath, "%s/adapter_model.safetensors", dir);
    eng_lora_config_t c;
    mt_status_t st = eng_lora_config_read(cpath, &c, err);
    if (st != MT_OK) return mt_error_prefix(err, "lora_model_dir: ");
    st = eng_lora_weights_read(wpath, &m->spec, &c, cpath, &lo->init, err);
    eng_lora_config_free(&c);
    if (st == MT_OK) st = eng_lora_weights_match(&lo->init, &lo->plan, &m->spec, wpath, err);
    if (st == MT_OK) st = check_finite(m, &lo->init, wpath, err);
    for (int t = 0; t < lo->plan.count && st == MT_OK; t++) {
        eng_lora_target_t *tg = &lo->plan.targets[t];
        const eng_lora_pair_t *pr = eng_lora_weights_find(&lo->init, tg->param);
        MT_CHECK(pr != NULL, "adapter pair missing after the match check");
        tg->r = pr->r;
        tg->alpha = pr->alpha;
        tg->scale = (float)pr->scale;
        if (!pr->shares_a) continue;
        const eng_param_spec_t *up = &m->spec.params[tg->param];
        tg->share_a = eng_lora_plan_find(&lo->plan, eng_model_desc_find_role(&m->spec, up->layer, ENG_P_EXP_GATE,
                                                                             up->expert));
        MT_CHECK(tg->share_a >= 0, "%s: the gate sharing its A is not adapted", up->name);
    }
    if (st != MT_OK) {
        eng_lora_weights_free(&lo->init);
        return mt_error_prefix(err, "lora_model_dir: ");
    }
    eng_lora_plan_recount(&lo->plan);
    return MT_OK;
}

/* Refuses targets no adapter can sit on: the output head, gpt-oss's router. */
static mt_status_t refuse_targets(const eng_model_t *m, const eng_lora_plan_t *p, mt_error_t *err) {
    for (int t = 0; t < p->count; t++)
        if (p->targets[t].kind == ENG_LORA_KIND_HEAD) {
            return mt_error_set(err, MT_ERR_UNSUPPORTED,
                                "lora_target_modules: LoRA on the output head (lm_head) is not supported; train it "
                                "in full with lora_modules_to_save: [lm_head]");
        } else if (p->targets[t].kind == ENG_LORA_KIND_ROUTER && m->cfg.experts_fused) {
            /* gpt-oss's router is no nn.Linear (GptOssTopKRouter): PEFT cannot load an adapter on it */
            return mt_error_set(err, MT_ERR_UNSUPPORTED,
                                "lora_target_modules: %s: LoRA on gpt-oss's router is not supported (PEFT cannot "
                                "adapt GptOssTopKRouter, so no adapter for it would load); target the attention "
                                "projections",
                                m->spec.params[p->targets[t].param].name);
        }
    return MT_OK;
}

/* A frozen weight compute reads in bf16 lives in bf16 (nothing would ever
 * read more bits of it): half the host memory of an fp32 home.  A frozen
 * matrix a quantised base keeps quantised is marked quant_ok: reading the
 * checkpoint gives it a quantised home instead (engine/model/model.c)
 * when the checkpoint stores it in FP8 or the run quantises on load. */
static void freeze_base(eng_model_t *m) {
    const int base = m->spec.count;
    const eng_lora_quant_t *qo = &m->lora.quant;
    for (int i = 0; i < base; i++) m->params[i].frozen = true;
    for (int k = 0; k < m->lora.plan.num_saved; k++) m->params[m->lora.plan.saved[k]].frozen = false;
    for (int i = 0; i < base; i++) {
        eng_param_t *p = &m->params[i];
        p->quant_ok = p->frozen && eng_quant_home_role_ok(p->spec->role) &&
                      !eng_quant_home_skipped(p->spec->name, qo->skip, qo->num_skip);
        if (!p->frozen || p->w_dtype != MT_BF16) continue;
        free(p->host_w);
        p->host_w = NULL;
        p->home_bf16 = malloc(p->spec->numel * sizeof *p->home_bf16);
        MT_CHECK_ALLOC(p->home_bf16, p->spec->name);
    }
}

/* One factor of target t as parameter idx. */
static int add_factor(eng_model_t *m, int idx, const eng_lora_target_t *tg, eng_param_role_t role) {
    eng_model_lora_t *lo = &m->lora;
    eng_param_spec_t *s = &lo->specs[lo->num_specs++];
    factor_spec(s, m->params[tg->param].spec, role, tg->r);
    eng_param_t *p = &m->params[idx];
    memset(p, 0, sizeof *p);
    p->spec = s;
    p->block = m->params[tg->param].block;
    p->w_dtype = eng_param_working_dtype(s, m->compute);
    p->host_w = calloc(s->numel, sizeof(float));
    MT_CHECK_ALLOC(p->host_w, s->name);
    p->lora_a = p->lora_b = -1;
    return idx;
}

mt_status_t eng_lora_attach(eng_model_t *m, const eng_lora_opts_t *o, mt_error_t *err) {
    eng_model_lora_t *lo = &m->lora;
    mt_status_t st = eng_lora_targets_select(&m->spec, &o->select, &lo->plan, err);
    if (st != MT_OK) return st;
    lo->r = o->r;
    lo->alpha = o->alpha;
    lo->use_rslora = o->use_rslora;
    lo->scale = (float)(o->use_rslora ? o->alpha / sqrt((double)o->r) : o->alpha / (double)o->r);
    for (int t = 0; t < lo->plan.count; t++) {
        lo->plan.targets[t].alpha = o->alpha;
        lo->plan.targets[t].scale = lo->scale;
    }
    st = refuse_targets(m, &lo->plan, err);
    if (st == MT_OK && o->init_dir) st = read_init(m, o->init_dir, err);
    if (st != MT_OK) {
        eng_lora_plan_free(&lo->plan);
        return st;
    }
    lo->on = true;
    lo->quant = o->quant;
    lo->dropout = (float)o->dropout;
    lo->seed = o->seed;
    const int T = lo->plan.count, base = m->spec.count;
    int F = 0;
    for (int t = 0; t < T; t++) F += lo->plan.targets[t].share_a >= 0 ? 1 : 2;
    lo->specs = calloc((size_t)(F > 0 ? F : 1), sizeof *lo->specs);
    MT_CHECK_ALLOC(lo->specs, "adapter descriptions");
    eng_param_t *grown = realloc(m->params, (size_t)(base + F) * sizeof *grown);
    MT_CHECK_ALLOC(grown, "parameter table with adapters");
    m->params = grown;
    freeze_base(m);
    lo->quant.skip = NULL; /* the run config's, read only by freeze_base */
    lo->quant.num_skip = 0;
    int idx = base;
    for (int t = 0; t < T; t++) {
        const eng_lora_target_t *tg = &lo->plan.targets[t];
        eng_param_t *target = &m->params[tg->param];
        target->lora_a = tg->share_a >= 0 ? -1 : add_factor(m, idx++, tg, ENG_P_LORA_A);
        target->lora_b = add_factor(m, idx++, tg, ENG_P_LORA_B);
        target->lora_scale = tg->scale;
    }
    for (int t = 0; t < T; t++) /* an up adapter in PEFT's fused form trains its gate's A */
        if (lo->plan.targets[t].share_a >= 0)
            m->params[lo->plan.targets[t].param].lora_a =
                m->params[lo->plan.targets[lo->plan.targets[t].share_a].param].lora_a;
    m->num_params = base + F;
    return MT_OK;
}

/* PEFT's default init of A: kaiming_uniform_(a = sqrt(5)) on (r, in) gives
 * bound = sqrt(6 / ((1 + 5) * in)) = 1 / sqrt(in).  The draws come from the
 * run's seed and the module's name, so they do not depend on which other
 * modules are adapted. */
static void init_a(float *a, const eng_param_spec_t *s, uint64_t seed) {
    uint64_t state = seed ^ mt_fnv1a64(s->name);
    const double bound = 1.0 / sqrt((double)s->shape[1]);
    for (size_t i = 0; i < s->numel; i++) {
        const double u = (double)(mt_splitmix64(&state) >> 11) * 0x1.0p-53; /* [0, 1) */
        a[i] = (float)((2.0 * u - 1.0) * bound);
    }
}

mt_status_t eng_lora_init_weights(eng_model_t *m, const eng_lora_opts_t *o, mt_error_t *err) {
    (void)err;
    eng_model_lora_t *lo = &m->lora;
    for (int t = 0; t < lo->plan.count; t++) {
        const eng_lora_target_t *tg = &lo->plan.targets[t];
        const eng_param_t *target = &m->params[tg->param];
        eng_param_t *a = &m->params[target->lora_a], *b = &m->params[target->lora_b];
        const eng_lora_pair_t *pr = o->init_dir ? eng_lora_weights_find(&lo->init, tg->param) : NULL;
        MT_CHECK(!o->init_dir || pr, "%s: the adapter read at attach is gone", target->spec->name);
        if (tg->share_a < 0) {
            if (pr) memcpy(a->host_w, pr->a, a->spec->numel * sizeof(float));
            else init_a(a->host_w, a->spec, o->seed);
        }
        if (pr) memcpy(b->host_w, pr->b, b->spec->numel * sizeof(float));
        else memset(b->host_w, 0, b->spec->numel * sizeof(float));
    }
    for (int k = 0; k < lo->init.num_saved; k++) {
        eng_param_t *p = &m->params[lo->init.saved[k].param];
        memcpy(p->host_w, lo->init.saved[k].data, p->spec->numel * sizeof(float));
    }
    eng_lora_weights_free(&lo->init);
    return MT_OK;
}

/* ---- what a run saves --------------------------------------------------------- */

static char *dup_or_die(const char *s) {
    char *d = strdup(s);
    MT_CHECK_ALLOC(d, "adapter config string");
    return d;
}

/* The run's defaults and modules_to_save, and the targets and patterns in
 * the form PEFT on transformers 5 loads completely (engine/model/lora/peft5.h):
 * never the run's own regex or all-linear, which PEFT there resolves to
 * other modules. */
void eng_lora_saved_config(const eng_model_t *m, const eng_run_config_t *rc, eng_lora_config_t *c) {
    memset(c, 0, sizeof *c);
    c->base_model_name_or_path = dup_or_die(rc->base_model);
    c->r = m->lora.r;
    c->lora_alpha = m->lora.alpha;
    c->lora_dropout = m->lora.dropout;
    c->use_rslora = m->lora.use_rslora;
    eng_lora_peft_config(&m->spec, &m->lora.plan, c);
    if (m->lora.plan.num_saved > 0) {
        c->modules_to_save = calloc((size_t)m->lora.plan.num_saved, sizeof *c->modules_to_save);
        MT_CHECK_ALLOC(c->modules_to_save, "adapter config modules_to_save");
        for (int k = 0; k < m->lora.plan.num_saved; k++) {
            char module[128];
            const eng_param_spec_t *s = &m->spec.params[m->lora.plan.saved[k]];
            if (!eng_lora_module_of(s, module, sizeof module)) snprintf(module, sizeof module, "%s", s->name);
            const char *dot = strrchr(module, '.');
            c->modules_to_save[c->num_modules_to_save++] = dup_or_die(dot ? dot + 1 : module);
        }
    }
}
