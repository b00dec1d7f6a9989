/* PEFT adapter files: reading adapter_model.safetensors against the base
 * model and its adapter_config.json (adapter.h has the two forms of the
 * routed experts and the rank rules). */
#include "engine/model/lora/adapter.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/model/io/safetensors.h"

#define PEFT_PREFIX "base_model.model."

void eng_lora_weights_free(eng_lora_weights_t *w) {
    for (int i = 0; i < w->count; i++) {
        free(w->pairs[i].a);
        free(w->pairs[i].b);
    }
    for (int i = 0; i < w->num_saved; i++) free(w->saved[i].data);
    free(w->pairs);
    free(w->saved);
    memset(w, 0, sizeof *w);
}

const eng_lora_pair_t *eng_lora_weights_find(const eng_lora_weights_t *w, int param) {
    for (int i = 0; i < w->count; i++)
        if (w->pairs[i].param == param) return &w->pairs[i];
    return NULL;
}

static bool ends_with(const char *s, const char *suf) {
    size_t n = strlen(s), m = strlen(suf);
    return n >= m && strcmp(s + n - m, suf) == 0;
}

/* One fused ParamWrapper (A, B) of a layer; `nest` 0 = `experts.lora_*`, 1 = `experts.base_layer.lora_*`. */
typedef struct {
    int layer, nest;
    const eng_st_tensor_t *a, *b;
} fused_t;

typedef struct {
    const char *path, *config_path;
    const eng_model_desc_t *d;
    const eng_lora_config_t *c;
    float **a, **b, **full; /* (d->count) each */
    int *rank;              /* (d->count) the module's rank */
    double *alpha, *scale;  /* (d->count) its alpha and s */
    bool *shares;           /* (d->count) an up adapter sharing its gate's A */
} reader_t;

/* A tensor's rank: what its module claims, with where that came from. */
typedef struct {
    int r;
    double alpha;
    const char *key; /* the rank_pattern key, or NULL for r */
} rank_t;

static rank_t rank_of(const reader_t *rd, const char *name, bool rewrite) {
    rank_t k;
    eng_lora_config_lookup(rd->c, name, rewrite, &k.r, &k.alpha, &k.key);
    return k;
}

static mt_status_t check_shape(const reader_t *rd, const eng_st_tensor_t *t, int64_t d0, int64_t d1, const char *what,
                               const rank_t *k, mt_error_t *err) {
    if (t->ndim == 2 && (int64_t)t->shape[0] == d0 && (int64_t)t->shape[1] == d1) return MT_OK;
    char got[64] = "[";
    for (int i = 0; i < t->ndim && i < 4; i++)
        snprintf(got + strlen(got), sizeof got - strlen(got), "%s%llu", i ? ", " : "", (unsigned long long)t->shape[i]);
    strncat(got, "]", sizeof got - strlen(got) - 1);
    char src[300];
    if (!k) snprintf(src, sizeof src, "the base model's shape");
    else if (k->key)
        snprintf(src, sizeof src, "rank %d from rank_pattern key '%s' in %s", k->r, k->key, rd->config_path);
    else snprintf(src, sizeof src, "rank %d from r in %s", k->r, rd->config_path);
    return mt_error_set(err, MT_ERR_FORMAT, "%s: tensor %s has shape %s; expected [%lld, %lld] (%s; %s)", rd->path,
                        t->name, got, (long long)d0, (long long)d1, what, src);
}

static float *read_tensor(const eng_st_file_t *f, const eng_st_tensor_t *t, mt_error_t *err, mt_status_t *st) {
    float *buf = malloc((size_t)(t->numel ? t->numel : 1) * sizeof *buf);
    MT_CHECK_ALLOC(buf, "adapter tensor");
    *st = eng_st_read_f32(f, t, buf, err);
    if (*st != MT_OK) {
        free(buf);
        return NULL;
    }
    return buf;
}

static mt_status_t put_slot(reader_t *rd, float **slot, float *buf, const char *tensor, mt_error_t *err) {
    if (*slot) {
        free(buf);
        return mt_error_set(err, MT_ERR_FORMAT, "%s: tensor %s: its module's adapter is given twice (per-expert and "
                            "fused keys for the same expert?)", rd->path, tensor);
    }
    *slot = buf;
    return MT_OK;
}

/* Both factors of parameter p from a fused tensor. */
static mt_status_t put(reader_t *rd, int p, float *a, float *b, const rank_t *k, bool shares, const char *tensor,
                       mt_error_t *err) {
    mt_status_t st = put_slot(rd, &rd->a[p], a, tensor, err);
    if (st != MT_OK) {
        free(b);
        return st;
    }
    rd->rank[p] = k->r;
    rd->alpha[p] = k->alpha;
    rd->scale[p] = eng_lora_scale_of(rd->c, k->r, k->alpha);
    rd->shares[p] = shares;
    return put_slot(rd, &rd->b[p], b, tensor, err);
}

/* Expert e's factors of a fused pair: A (E*rf, in) read as (E, rf, in), B
 * (out, E*rf) read as (out, rf, E) (PEFT's get_delta_factors): A_e is rows
 * e*rf.., B_e's column k is B's column k*E + e; B_e rows o0 .. o0+no. */
static float *fused_a(const float *A, int e, int rf, int64_t in) {
    float *o = malloc((size_t)rf * (size_t)in * sizeof *o);
    MT_CHECK_ALLOC(o, "per-expert lora_A");
    memcpy(o, A + (size_t)e * rf * (size_t)in, (size_t)rf * (size_t)in * sizeof *o);
    return o;
}

static float *fused_b(const float *B, int e, int E, int rf, int64_t o0, int64_t no) {
    float *o = malloc((size_t)no * (size_t)rf * sizeof *o);
    MT_CHECK_ALLOC(o, "per-expert lora_B");
    for (int64_t i = 0; i < no; i++)
        for (int k = 0; k < rf; k++) o[(size_t)i * rf + k] = B[(size_t)(o0 + i) * E * rf + (size_t)k * E + e];
    return o;
}

/* The leaf of a routed expert weight of `role` in `layer` (w1, gate_proj, ...). */
static const char *expert_leaf(const eng_model_desc_t *d, int layer, eng_param_role_t role, char *buf, size_t cap) {
    const int p = eng_model_desc_find_role(d, layer, role, 0);
    if (p < 0 || !eng_lora_module_of(&d->params[p], buf, cap)) return "";
    const char *dot = strrchr(buf, '.');
    return dot ? dot + 1 : buf;
}

/* Whether PEFT on transformers 5 reaches this layer's gate_up_proj by
 * rewriting gate and up targets (config.h): target_modules names both
 * leaves, a regex probed as PEFT probes it. */
static bool gate_up_rewritten(const reader_t *rd, int layer) {
    char gbuf[256], ubuf[256], probe[2][300];
    const char *g = expert_leaf(rd->d, layer, ENG_P_EXP_GATE, gbuf, sizeof gbuf);
    const char *u = expert_leaf(rd->d, layer, ENG_P_EXP_UP, ubuf, sizeof ubuf);
    snprintf(probe[0], sizeof probe[0], "model.layers.%d.mlp.experts.%s", layer, g);
    snprintf(probe[1], sizeof probe[1], "model.layers.%d.mlp.experts.%s", layer, u);
    const char *p0[] = {probe[0]}, *p1[] = {probe[1]};
    return eng_lora_config_names(rd->c, g, p0, 1) && eng_lora_config_names(rd->c, u, p1, 1);
}

/* Splits one fused ParamWrapper pair into per-expert pairs; gate_up's into
 * a gate and an up pair per expert sharing A_e (adapter.h). */
static mt_status_t convert_fused(reader_t *rd, const eng_st_file_t *f, const fused_t *fu, mt_error_t *err) {
    const eng_model_desc_t *d = rd->d;
    const int E = d->num_experts;
    if (!fu->a || !fu->b)
        return mt_error_set(err, MT_ERR_FORMAT, "%s: tensor %s: fused expert adapter has lora_%s but no lora_%s",
                            rd->path, (fu->a ? fu->a : fu->b)->name, fu->a ? "A" : "B", fu->a ? "B" : "A");
    const int pg = eng_model_desc_find_role(d, fu->layer, ENG_P_EXP_GATE, 0);
    if (pg < 0 || E < 1)
        return mt_error_set(err, MT_ERR_FORMAT, "%s: tensor %s: layer %d of this model has no routed experts",
                            rd->path, fu->a->name, fu->layer);
    const int64_t I = d->params[pg].shape[0], H = d->params[pg].shape[1];
    const int64_t in = fu->a->ndim == 2 ? (int64_t)fu->a->shape[1] : -1;
    const int64_t out = fu->b->ndim == 2 ? (int64_t)fu->b->shape[0] : -1;
    const bool gate_up = out == 2 * I && in == H, down = out == H && in == I;
    if (!gate_up && !down)
        return mt_error_set(err, MT_ERR_FORMAT,
                            "%s: tensors %s / %s fit neither gate_up_proj (lora_A [E*r, %lld], lora_B [%lld, E*r]) "
                            "nor down_proj (lora_A [E*r, %lld], lora_B [%lld, E*r]) of layer %d with E = %d",
                            rd->path, fu->a->name, fu->b->name, (long long)H, (long long)(2 * I), (long long)I,
                            (long long)H, fu->layer, E);
    char name[160];
    snprintf(name, sizeof name, "model.layers.%d.mlp.experts.%s", fu->layer, gate_up ? "gate_up_proj" : "down_proj");
    const rank_t k = rank_of(rd, name, gate_up && gate_up_rewritten(rd, fu->layer));
    mt_status_t st = check_shape(rd, fu->a, (int64_t)E * k.r, in, "fused lora_A is [experts*rank, in]", &k, err);
    if (st == MT_OK) st = check_shape(rd, fu->b, out, (int64_t)E * k.r, "fused lora_B is [out, experts*rank]", &k, err);
    if (st != MT_OK) return st;
    float *A = read_tensor(f, fu->a, err, &st);
    if (!A) return st;
    float *B = read_tensor(f, fu->b, err, &st);
    for (int e = 0; B && e < E && st == MT_OK; e++) {
        if (down) {
            int p = eng_model_desc_find_role(d, fu->layer, ENG_P_EXP_DOWN, e);
            st = put(rd, p, fused_a(A, e, k.r, in), fused_b(B, e, E, k.r, 0, H), &k, false, fu->a->name, err);
            continue;
        }
        /* gate rows first, then up rows (transformers 5's gate_up_proj); one A_e for both */
        const int pgate = eng_model_desc_find_role(d, fu->layer, ENG_P_EXP_GATE, e);
        const int pup = eng_model_desc_find_role(d, fu->layer, ENG_P_EXP_UP, e);
        st = put(rd, pgate, fused_a(A, e, k.r, in), fused_b(B, e, E, k.r, 0, I), &k, false, fu->a->name, err);
        if (st == MT_OK)
            st = put(rd, pup, fused_a(A, e, k.r, in), fused_b(B, e, E, k.r, I, I), &k, true, fu->a->name, err);
    }
    free(A);
    free(B);
    return st;
}

/* The parameter a per-module key's module adapts: the description's name,
 * or transformers 5's (Mixtral's block_sparse_moe is mlp there). */
static int module_param(const eng_model_desc_t *d, const char *module) {
    char name[300];
    snprintf(name, sizeof name, "%s.weight", module);
    int p = eng_model_desc_find(d, name);
    const char *mlp = strstr(module, ".mlp.");
    if (p < 0 && mlp) {
        snprintf(name, sizeof name, "%.*s.block_sparse_moe.%s.weight", (int)(mlp - module), module, mlp + 5);
        p = eng_model_desc_find(d, name);
    }
    return p;
}

/* The name PEFT matches pattern keys against for module p, keyed `module`
 * in the file: the wrapped parameter's when target_parameters wraps it
 * (`….weight`), else the module's own name.  A per-expert key is one
 * module of its own (adapter.h). */
static void pattern_name(const reader_t *rd, int p, const char *module, char *buf, size_t cap) {
    const eng_param_role_t role = rd->d->params[p].role;
    char pname[300];
    snprintf(buf, cap, "%s", module);
    if (role == ENG_P_EXP_GATE || role == ENG_P_EXP_UP || role == ENG_P_EXP_DOWN) return;
    if (!eng_lora_peft_param(rd->d, p, pname, sizeof pname)) return;
    for (int j = 0; j < rd->c->num_target_parameters; j++)
        if (eng_lora_name_matches(pname, rd->c->target_parameters[j])) {
            snprintf(buf, cap, "%s", pname);
            return;
        }
}

/* A modules_to_save tensor: the parameter's own name and shape. */
static mt_status_t take_full(reader_t *rd, const eng_st_file_t *f, const eng_st_tensor_t *t, const char *rest,
                             mt_error_t *err) {
    const int p = eng_model_desc_find(rd->d, rest);
    if (p < 0)
        return mt_error_set(err, MT_ERR_FORMAT,
                            "%s: tensor %s is neither a lora_A/lora_B weight nor a parameter of the base model",
                            rd->path, t->name);
    const eng_param_spec_t *ps = &rd->d->params[p];
    if ((uint64_t)ps->numel != t->numel || t->ndim != ps->ndim ||
        (t->ndim >= 1 && (int64_t)t->shape[0] != ps->shape[0]) ||
        (t->ndim == 2 && (int64_t)t->shape[1] != ps->shape[1]))
        return mt_error_set(err, MT_ERR_FORMAT, "%s: tensor %s has %llu elements in %d dims; the base model's %s "
                            "is [%lld%s%lld]", rd->path, t->name, (unsigned long long)t->numel, t->ndim, ps->name,
                            (long long)ps->shape[0], ps->ndim == 2 ? ", " : "",
                            ps->ndim == 2 ? (long long)ps->shape[1] : 0LL);
    mt_status_t st;
    float *buf = read_tensor(f, t, err, &st);
    return buf ? put_slot(rd, &rd->full[p], buf, t->name, err) : st;
}

/* A per-module lora_A or lora_B: its module, its rank, its shape. */
static mt_status_t take_module(reader_t *rd, const eng_st_file_t *f, const eng_st_tensor_t *t, const char *module,
                               bool is_a, mt_error_t *err) {
    const int p = module_param(rd->d, module);
    if (p < 0 || !eng_lora_role_is_linear(rd->d->params[p].role))
        return mt_error_set(err, MT_ERR_FORMAT, "%s: tensor %s adapts '%s', which is not a linear module of this %s "
                            "model", rd->path, t->name, module, eng_model_desc_family_name(rd->d));
    const eng_param_spec_t *ps = &rd->d->params[p];
    const int64_t out = ps->shape[0], in = ps->ndim == 2 ? ps->shape[1] : 1;
    char name[300];
    pattern_name(rd, p, module, name, sizeof name);
    const rank_t k = rank_of(rd, name, false);
    mt_status_t st = is_a ? check_shape(rd, t, k.r, in, "lora_A is [rank, in]", &k, err)
                          : check_shape(rd, t, out, k.r, "lora_B is [out, rank]", &k, err);
    if (st != MT_OK) return st;
    rd->rank[p] = k.r;
    rd->alpha[p] = k.alpha;
    rd->scale[p] = eng_lora_scale_of(rd->c, k.r, k.alpha);
    float *buf = read_tensor(f, t, err, &st);
    return buf ? put_slot(rd, is_a ? &rd->a[p] : &rd->b[p], buf, t->name, err) : st;
}

/* Sorts a tensor into per-module slots or the fused list. */
static mt_status_t take_tensor(reader_t *rd, const eng_st_file_t *f, const eng_st_tensor_t *t, fused_t *fused,
                               int *num_fused, mt_error_t *err) {
    if (strncmp(t->name, PEFT_PREFIX, strlen(PEFT_PREFIX)) != 0)
        return mt_error_set(err, MT_ERR_FORMAT, "%s: tensor %s: a PEFT adapter's names start with '%s'", rd->path,
                            t->name, PEFT_PREFIX);
    const char *rest = t->name + strlen(PEFT_PREFIX);
    const bool is_a = ends_with(rest, ".lora_A.weight"), is_b = ends_with(rest, ".lora_B.weight");
    if (!is_a && !is_b) return take_full(rd, f, t, rest, err); /* modules_to_save: the parameter's own name */
    char module[256];
    size_t mlen = strlen(rest) - strlen(".lora_A.weight");
    if (mlen + 8 >= sizeof module)
        return mt_error_set(err, MT_ERR_FORMAT, "%s: tensor %s: name too long", rd->path, t->name);
    memcpy(module, rest, mlen);
    module[mlen] = '\0';

    int layer = -1, pos = 0;
    char block[64];
    if (sscanf(module, "model.layers.%d.%63[^.].experts%n", &layer, block, &pos) == 2 && pos > 0 &&
        (module[pos] == '\0' || strcmp(module + pos, ".base_layer") == 0)) {
        int nest = module[pos] ? 1 : 0, k = 0;
        while (k < *num_fused && !(fused[k].layer == layer && fused[k].nest == nest)) k++;
        if (k == *num_fused) {
            fused[k] = (fused_t){.layer = layer, .nest = nest};
            (*num_fused)++;
        }
        const eng_st_tensor_t **slot = is_a ? &fused[k].a : &fused[k].b;
        if (*slot) return mt_error_set(err, MT_ERR_FORMAT, "%s: tensor %s is given twice", rd->path, t->name);
        *slot = t;
        return MT_OK;
    }
    return take_module(rd, f, t, module, is_a, err);
}

/* Every target_parameters entry names something of this model as PEFT on
 * transformers 5 sees it: an entry matching nothing is refused by name. */
static mt_status_t check_target_parameters(const reader_t *rd, mt_error_t *err) {
    for (int j = 0; j < rd->c->num_target_parameters; j++) {
        bool hit = false;
        char pname[300];
        for (int p = 0; p < rd->d->count && !hit; p++)
            hit = eng_lora_peft_param(rd->d, p, pname, sizeof pname) &&
                  eng_lora_name_matches(pname, rd->c->target_parameters[j]);
        if (!hit)
            return mt_error_set(err, MT_ERR_FORMAT,
                                "%s: target_parameters entry '%s' matches no parameter of this %s model as PEFT on "
                                "transformers 5 names them (e.g. mlp.experts.gate_up_proj, mlp.experts.down_proj, "
                                "model.layers.0.mlp.gate_proj.weight); %s was written for another model",
                                rd->config_path, rd->c->target_parameters[j], eng_model_desc_family_name(rd->d),
                                rd->path);
    }
    return MT_OK;
}

/* The slots, gathered into pairs and saved modules in description order. */
static mt_status_t gather(reader_t *rd, eng_lora_weights_t *out, mt_error_t *err) {
    const eng_model_desc_t *d = rd->d;
    int pairs = 0, saved = 0;
    for (int p = 0; p < d->count; p++) {
        if (!rd->a[p] != !rd->b[p])
            return mt_error_set(err, MT_ERR_FORMAT, "%s: %s has lora_%s but no lora_%s", rd->path, d->params[p].name,
                                rd->a[p] ? "A" : "B", rd->a[p] ? "B" : "A");
        pairs += rd->a[p] != NULL;
        saved += rd->full[p] != NULL;
    }
    if (pairs + saved == 0) return mt_error_set(err, MT_ERR_FORMAT, "%s: holds no adapter tensor", rd->path);
    out->pairs = calloc((size_t)pairs + 1, sizeof *out->pairs);
    out->saved = calloc((size_t)saved + 1, sizeof *out->saved);
    MT_CHECK(out->pairs && out->saved, "out of host memory allocating %s", "adapter lists");
    for (int p = 0; p < d->count; p++) {
        if (rd->a[p]) {
            const eng_param_spec_t *ps = &d->params[p];
            out->pairs[out->count++] = (eng_lora_pair_t){.param = p, .out = ps->shape[0],
                                                         .in = ps->ndim == 2 ? ps->shape[1] : 1, .r = rd->rank[p],
                                                         .alpha = rd->alpha[p], .scale = rd->scale[p],
                                                         .shares_a = rd->shares[p],
                                                         .a = rd->a[p], .b = rd->b[p]};
            rd->a[p] = rd->b[p] = NULL;
        }
        if (rd->full[p]) {
            out->saved[out->num_saved++] = (eng_lora_full_t){.param = p, .data = rd->full[p]};
            rd->full[p] = NULL;
        }
    }
    return MT_OK;
}

mt_status_t eng_lora_weights_read(const char *path, const eng_model_desc_t *d, const eng_lora_config_t *c,
                                  const char *config_path, eng_lora_weights_t *out, mt_error_t *err) {
    memset(out, 0, sizeof *out);
    eng_st_file_t f;
    mt_status_t st = eng_st_open(path, &f, err);
    if (st != MT_OK) return st;
    const size_t n = (size_t)d->count + 1;
    reader_t rd = {.path = path, .config_path = config_path, .d = d, .c = c};
    rd.a = calloc(n, sizeof *rd.a);
    rd.b = calloc(n, sizeof *rd.b);
    rd.full = calloc(n, sizeof *rd.full);
    rd.rank = calloc(n, sizeof *rd.rank);
    rd.alpha = calloc(n, sizeof *rd.alpha);
    rd.scale = calloc(n, sizeof *rd.scale);
    rd.shares = calloc(n, sizeof *rd.shares);
    fused_t *fused = calloc((size_t)f.count + 1, sizeof *fused);
    MT_CHECK(rd.a && rd.b && rd.full && rd.rank && rd.alpha && rd.scale && rd.shares && fused,
             "out of host memory allocating %s", "adapter slots");
    int num_fused = 0;
    st = check_target_parameters(&rd, err);
    for (int i = 0; i < f.count && st == MT_OK; i++) st = take_tensor(&rd, &f, &f.tensors[i], fused, &num_fused, err);
    for (int k = 0; k < num_fused && st == MT_OK; k++) st = convert_fused(&rd, &f, &fused[k], err);
    if (st == MT_OK) st = gather(&rd, out, err);
    for (int p = 0; p < d->count; p++) {
        free(rd.a[p]);
        free(rd.b[p]);
        free(rd.full[p]);
    }
    free(rd.a);
    free(rd.b);
    free(rd.full);
    free(rd.rank);
    free(rd.alpha);
    free(rd.scale);
    free(rd.shares);
    free(fused);
    eng_st_close(&f);
    if (st != MT_OK) eng_lora_weights_free(out);
    return st;
}

mt_status_t eng_lora_weights_match(const eng_lora_weights_t *w, const eng_lora_plan_t *p, const eng_model_desc_t *d,
                                   const char *path, mt_error_t *err) {
    /* both lists are in description order: walk them together */
    int i = 0, j = 0;
    while (i < w->count || j < p->count) {
        const int wp = i < w->count ? w->pairs[i].param : d->count;
        const int pp = j < p->count ? p->targets[j].param : d->count;
        if (wp == pp) {
            i++;
            j++;
            continue;
        }
        const bool missing = pp < wp;
        return mt_error_set(err, MT_ERR_CONFIG,
                            "%s: %s %s, but the run's lora_target_modules %s it; use the adapter's own targets "
                            "or start a new adapter",
                            path, d->params[missing ? pp : wp].name,
                            missing ? "has no adapter in the file" : "has an adapter in the file",
                            missing ? "select" : "do not select");
    }
    for (int k = 0; k < p->num_saved; k++) {
        bool found = false;
        for (int m = 0; m < w->num_saved && !found; m++) found = w->saved[m].param == p->saved[k];
        if (!found)
            return mt_error_set(err, MT_ERR_CONFIG, "%s: modules_to_save %s is not in the file", path,
                                d->params[p->saved[k]].name);
    }
    return MT_OK;
}
