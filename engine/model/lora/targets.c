/* LoRA target selection; the rules are in targets.h.  The matching
 * runs once per run over a few thousand names, so it is plain string work. */
#include "engine/model/lora/targets.h"

#include <regex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *eng_lora_kind_name(eng_lora_kind_t k) {
    switch (k) {
    case ENG_LORA_KIND_ATTN: return "attention";
    case ENG_LORA_KIND_EXPERT: return "routed experts";
    case ENG_LORA_KIND_SHARED: return "shared experts";
    case ENG_LORA_KIND_DENSE: return "dense MLP";
    case ENG_LORA_KIND_ROUTER: return "router";
    case ENG_LORA_KIND_HEAD: return "output head";
    case ENG_LORA_KIND_SAVED: return "modules_to_save";
    case ENG_LORA_KIND_COUNT: break;
    }
    return "?";
}

bool eng_lora_role_is_linear(eng_param_role_t role) {
    switch (role) {
    case ENG_P_Q: case ENG_P_K: case ENG_P_V: case ENG_P_O:
    case ENG_P_Q_A: case ENG_P_Q_B: case ENG_P_KV_A: case ENG_P_KV_B:
    case ENG_P_ROUTER:
    case ENG_P_EXP_GATE: case ENG_P_EXP_UP: case ENG_P_EXP_DOWN:
    case ENG_P_SHARED_GATE: case ENG_P_SHARED_UP: case ENG_P_SHARED_DOWN:
    case ENG_P_SHARED_EXPERT_GATE:
    case ENG_P_DENSE_GATE: case ENG_P_DENSE_UP: case ENG_P_DENSE_DOWN:
    case ENG_P_LM_HEAD:
        return true;
    default:
        return false;
    }
}

eng_lora_kind_t eng_lora_role_kind(eng_param_role_t role) {
    switch (role) {
    case ENG_P_Q: case ENG_P_K: case ENG_P_V: case ENG_P_O:
    case ENG_P_Q_A: case ENG_P_Q_B: case ENG_P_KV_A: case ENG_P_KV_B: return ENG_LORA_KIND_ATTN;
    case ENG_P_ROUTER: return ENG_LORA_KIND_ROUTER;
    case ENG_P_EXP_GATE: case ENG_P_EXP_UP: case ENG_P_EXP_DOWN: return ENG_LORA_KIND_EXPERT;
    case ENG_P_SHARED_GATE: case ENG_P_SHARED_UP: case ENG_P_SHARED_DOWN:
    case ENG_P_SHARED_EXPERT_GATE: return ENG_LORA_KIND_SHARED;
    case ENG_P_DENSE_GATE: case ENG_P_DENSE_UP: case ENG_P_DENSE_DOWN: return ENG_LORA_KIND_DENSE;
    case ENG_P_LM_HEAD: return ENG_LORA_KIND_HEAD;
    default: return ENG_LORA_KIND_SAVED;
    }
}

bool eng_lora_module_of(const eng_param_spec_t *p, char *buf, size_t cap) {
    size_t n = strlen(p->name);
    const char *suf = ".weight";
    size_t sn = strlen(suf);
    if (n <= sn || strcmp(p->name + n - sn, suf) != 0 || n - sn >= cap) return false;
    memcpy(buf, p->name, n - sn);
    buf[n - sn] = '\0';
    return true;
}

static const char *leaf(const char *module) {
    const char *dot = strrchr(module, '.');
    return dot ? dot + 1 : module;
}

bool eng_lora_name_matches(const char *module, const char *entry) {
    size_t m = strlen(module), e = strlen(entry);
    if (m == e) return strcmp(module, entry) == 0;
    return m > e && module[m - e - 1] == '.' && strcmp(module + m - e, entry) == 0;
}

static bool routed_expert(eng_param_role_t role) {
    return role == ENG_P_EXP_GATE || role == ENG_P_EXP_UP || role == ENG_P_EXP_DOWN;
}

bool eng_lora_peft_module(const eng_model_desc_t *d, int p, char *buf, size_t cap) {
    char mod[256];
    if (!eng_lora_module_of(&d->params[p], mod, sizeof mod)) return false;
    const char *bsm = strstr(mod, ".block_sparse_moe."); /* transformers 5 renames Mixtral's MoE block */
    int w = bsm ? snprintf(buf, cap, "%.*s.mlp.%s", (int)(bsm - mod), mod, bsm + strlen(".block_sparse_moe."))
                : snprintf(buf, cap, "%s", mod);
    return w > 0 && (size_t)w < cap;
}

bool eng_lora_peft_param(const eng_model_desc_t *d, int p, char *buf, size_t cap) {
    const eng_param_spec_t *ps = &d->params[p];
    if (!eng_lora_role_is_linear(ps->role)) return false;
    int w;
    if (routed_expert(ps->role)) {
        w = snprintf(buf, cap, "model.layers.%d.mlp.experts.%s", ps->layer,
                     ps->role == ENG_P_EXP_DOWN ? "down_proj" : "gate_up_proj");
    } else {
        char mod[256];
        if (!eng_lora_peft_module(d, p, mod, sizeof mod)) return false;
        w = snprintf(buf, cap, "%s.weight", mod);
    }
    return w > 0 && (size_t)w < cap;
}

bool eng_lora_peft_rewritten_leaf(const eng_model_desc_t *d, const char *name) {
    if (strcmp(name, "gate") == 0) return true;
    for (int i = 0; i < d->count; i++) {
        char mod[256];
        if (routed_expert(d->params[i].role) && eng_lora_module_of(&d->params[i], mod, sizeof mod) &&
            strcmp(leaf(mod), name) == 0)
            return true;
    }
    return false;
}

/* all-linear leaves out the output head (as PEFT does) and, in moetune,
 * the gates that decide routing. */
static bool in_all_linear(eng_param_role_t role) {
    return eng_lora_role_is_linear(role) && role != ENG_P_LM_HEAD && role != ENG_P_ROUTER &&
           role != ENG_P_SHARED_EXPERT_GATE;
}

/* "q_proj, k_proj, v_proj, o_proj, gate (router), w1, w2, w3": the model's
 * linear module kinds in checkpoint order, for the no-match message. */
static void module_kinds(const eng_model_desc_t *d, char *buf, size_t cap) {
    buf[0] = '\0';
    size_t len = 0;
    for (int i = 0; i < d->count; i++) {
        const eng_param_spec_t *p = &d->params[i];
        char mod[160], item[192];
        if (!eng_lora_role_is_linear(p->role) || !eng_lora_module_of(p, mod, sizeof mod)) continue;
        snprintf(item, sizeof item, "%s%s", leaf(mod), p->role == ENG_P_ROUTER ? " (router)" : "");
        /* already listed? (compare whole items between separators) */
        bool seen = false;
        for (const char *s = buf; *s && !seen;) {
            const char *e = strstr(s, ", ");
            size_t n = e ? (size_t)(e - s) : strlen(s);
            seen = n == strlen(item) && strncmp(s, item, n) == 0;
            s = e ? e + 2 : s + n;
        }
        if (seen) continue;
        int w = snprintf(buf + len, cap - len, "%s%s", len ? ", " : "", item);
        if (w < 0 || (size_t)w >= cap - len) break;
        len += (size_t)w;
    }
}

static void add_count(eng_lora_plan_t *p, eng_lora_kind_t k, size_t n) {
    p->modules[k]++;
    p->trainable[k] += n;
    p->total_trainable += n;
}

/* The compiled selection, and which entries hit something. */
typedef struct {
    const eng_lora_select_t *sel;
    bool all_linear, use_re, re_hit;
    regex_t re;
    bool *hit; /* modules, then modules_to_save, then params */
} selector_t;

const char *eng_lora_regex_unbounded(const char *re) {
    if (strlen(re) > 1024) return "longer than 1024 bytes";
    int counts = 0;
    bool after_quant = false, lazy_seen = false;
    for (const char *p = re; *p; p++) {
        if (*p == '\\' && p[1]) {
            p++;
            after_quant = lazy_seen = false;
            continue;
        }
        if (*p == '[') { /* a bracket expression is one atom: skip to its ']' (a leading ']' is literal) */
            const char *q = p + 1 + (p[1] == '^');
            if (*q == ']') q++;
            while (*q && *q != ']') q++;
            if (!*q) return NULL; /* unterminated: regcomp refuses it */
            p = q;
            after_quant = lazy_seen = false;
            continue;
        }
        const bool quant = *p == '*' || *p == '+' || *p == '?' || *p == '{';
        if (quant && after_quant) {
            /* a single lazy '?' after a quantifier is Python's x*? (same matches under fullmatch) */
            if (*p != '?' || lazy_seen) return "a repetition applied to a repetition (such as a++ or a*{2})";
            lazy_seen = true;
            continue;
        }
        if (*p == '{') {
            char *end;
            long lo = strtol(p + 1, &end, 10), hi = lo;
            if (*end == ',') hi = end[1] == '}' ? lo : strtol(end + 1, &end, 10);
            if (lo > 100 || hi > 100) return "a counted repetition above {100}";
            if (++counts > 8) return "more than 8 counted repetitions";
            const char *close = strchr(p, '}');
            if (close) p = close;
        }
        after_quant = quant;
        lazy_seen = false;
    }
    return NULL;
}

static mt_status_t selector_open(selector_t *s, const eng_lora_select_t *sel, mt_error_t *err) {
    memset(s, 0, sizeof *s);
    s->sel = sel;
    s->all_linear = sel->all_linear || (sel->regex && strcmp(sel->regex, "all-linear") == 0);
    for (int j = 0; j < sel->num_modules; j++)
        if (strcmp(sel->modules[j], "all-linear") == 0) s->all_linear = true;
    if (!s->all_linear && !sel->regex && sel->num_modules == 0 && sel->num_params == 0)
        return mt_error_set(err, MT_ERR_CONFIG,
                            "adapter: lora selects no module: set lora_target_modules (e.g. [q_proj, v_proj]) "
                            "or lora_target_linear: true");
    s->use_re = sel->regex && !s->all_linear;
    const char *unbounded = s->use_re ? eng_lora_regex_unbounded(sel->regex) : NULL;
    if (unbounded) {
        s->use_re = false;
        return mt_error_set(err, MT_ERR_CONFIG, "lora_target_modules: '%.200s' is refused: %s", sel->regex, unbounded);
    }
    if (s->use_re) {
        /* PEFT's re.fullmatch: anchor the whole pattern */
        size_t n = strlen(sel->regex) + 8;
        char *anch = malloc(n);
        MT_CHECK_ALLOC(anch, "LoRA target regex");
        snprintf(anch, n, "^(%s)$", sel->regex);
        int rc = regcomp(&s->re, anch, REG_EXTENDED | REG_NOSUB);
        free(anch);
        if (rc != 0) {
            s->use_re = false;
            return mt_error_set(err, MT_ERR_CONFIG, "lora_target_modules: '%s' is not a valid regular expression",
                                sel->regex);
        }
    }
    s->hit = calloc((size_t)(sel->num_modules + sel->num_modules_to_save + sel->num_params) + 1, sizeof *s->hit);
    MT_CHECK_ALLOC(s->hit, "LoRA target lists");
    return MT_OK;
}

static void selector_close(selector_t *s) {
    if (s->use_re) regfree(&s->re);
    free(s->hit);
}

/* Whether linear parameter i (module mod) is selected, noting the entries it hits. */
static bool selects(selector_t *s, const eng_model_desc_t *d, int i, const char *mod) {
    const eng_lora_select_t *sel = s->sel;
    bool sel_it = s->all_linear && in_all_linear(d->params[i].role);
    if (s->use_re && regexec(&s->re, mod, 0, NULL, 0) == 0) sel_it = s->re_hit = true;
    for (int j = 0; j < sel->num_modules; j++)
        if (strcmp(sel->modules[j], "all-linear") != 0 && eng_lora_name_matches(mod, sel->modules[j]))
            sel_it = s->hit[j] = true;
    char pname[300];
    if (sel->num_params > 0 && eng_lora_peft_param(d, i, pname, sizeof pname))
        for (int j = 0; j < sel->num_params; j++)
            if (eng_lora_name_matches(pname, sel->params[j]))
                sel_it = s->hit[sel->num_modules + sel->num_modules_to_save + j] = true;
    return sel_it;
}

/* An entry that selected nothing is an error naming it and the model's modules. */
static mt_status_t selector_unused(const selector_t *s, const eng_model_desc_t *d, mt_error_t *err) {
    const eng_lora_select_t *sel = s->sel;
    char kinds[1024];
    module_kinds(d, kinds, sizeof kinds);
    for (int j = 0; j < sel->num_modules; j++)
        if (!s->hit[j] && strcmp(sel->modules[j], "all-linear") != 0)
            return mt_error_set(err, MT_ERR_CONFIG,
                                "lora_target_modules: '%s' matches no linear module of this %s model; its modules "
                                "are: %s",
                                sel->modules[j], eng_model_desc_family_name(d), kinds);
    for (int j = 0; j < sel->num_modules_to_save; j++)
        if (!s->hit[sel->num_modules + j])
            return mt_error_set(err, MT_ERR_CONFIG,
                                "lora_modules_to_save: '%s' matches no module of this %s model (e.g. lm_head, "
                                "embed_tokens)",
                                sel->modules_to_save[j], eng_model_desc_family_name(d));
    for (int j = 0; j < sel->num_params; j++)
        if (!s->hit[sel->num_modules + sel->num_modules_to_save + j])
            return mt_error_set(err, MT_ERR_CONFIG,
                                "target_parameters: '%s' matches no parameter of this %s model as PEFT on "
                                "transformers 5 names them (e.g. mlp.experts.gate_up_proj, mlp.experts.down_proj, "
                                "model.layers.0.mlp.gate_proj.weight)",
                                sel->params[j], eng_model_desc_family_name(d));
    if (s->use_re && !s->re_hit)
        return mt_error_set(err, MT_ERR_CONFIG,
                            "lora_target_modules: the regular expression '%s' matches no linear module of this %s "
                            "model (it must match the whole name, e.g. model.layers.0.self_attn.q_proj); its "
                            "modules are: %s",
                            sel->regex, eng_model_desc_family_name(d), kinds);
    return MT_OK;
}

mt_status_t eng_lora_targets_select(const eng_model_desc_t *d, const eng_lora_select_t *sel,
                                    eng_lora_plan_t *out, mt_error_t *err) {
    memset(out, 0, sizeof *out);
    if (sel->r < 1) return mt_error_set(err, MT_ERR_CONFIG, "lora_r must be >= 1, got %d", sel->r);
    selector_t s;
    mt_status_t st = selector_open(&s, sel, err);
    if (st != MT_OK) {
        selector_close(&s);
        return st;
    }
    out->targets = calloc((size_t)d->count + 1, sizeof *out->targets);
    out->saved = calloc((size_t)d->count + 1, sizeof *out->saved);
    MT_CHECK(out->targets && out->saved, "out of host memory allocating %s", "LoRA target lists");
    for (int i = 0; i < d->count && st == MT_OK; i++) {
        const eng_param_spec_t *p = &d->params[i];
        out->total_params += p->numel;
        char mod[160];
        if (!eng_lora_module_of(p, mod, sizeof mod)) continue;
        bool saved = false;
        for (int j = 0; j < sel->num_modules_to_save; j++)
            if (eng_lora_name_matches(mod, sel->modules_to_save[j])) saved = s.hit[sel->num_modules + j] = true;
        if (saved) {
            out->saved[out->num_saved++] = i;
            add_count(out, ENG_LORA_KIND_SAVED, p->numel);
            continue;
        }
        if (!eng_lora_role_is_linear(p->role) || !selects(&s, d, i, mod)) continue;
        const int64_t o = p->shape[0], in = p->ndim == 2 ? p->shape[1] : 1;
        if ((int64_t)sel->r > (o < in ? o : in)) {
            st = mt_error_set(err, MT_ERR_CONFIG,
                              "lora_r %d is larger than the smaller dimension of %s (shape [%lld, %lld]): a "
                              "rank-%d update of it cannot exist; lower lora_r or leave the module out",
                              sel->r, mod, (long long)o, (long long)in, sel->r);
            break;
        }
        eng_lora_target_t *t = &out->targets[out->count++];
        *t = (eng_lora_target_t){.param = i, .kind = eng_lora_role_kind(p->role), .out = o, .in = in, .r = sel->r,
                                 .share_a = -1};
        add_count(out, t->kind, (size_t)sel->r * (size_t)(o + in));
    }
    if (st == MT_OK) st = selector_unused(&s, d, err);
    if (st == MT_OK && out->count == 0 && out->num_saved == 0) {
        char kinds[1024];
        module_kinds(d, kinds, sizeof kinds);
        st = mt_error_set(err, MT_ERR_CONFIG, "adapter: lora selects no module of this %s model; its modules are: %s",
                          eng_model_desc_family_name(d), kinds);
    }
    selector_close(&s);
    if (st != MT_OK) eng_lora_plan_free(out);
    return st;
}

void eng_lora_plan_free(eng_lora_plan_t *p) {
    free(p->targets);
    free(p->saved);
    memset(p, 0, sizeof *p);
}

void eng_lora_plan_recount(eng_lora_plan_t *p) {
    for (int k = 0; k < ENG_LORA_KIND_COUNT; k++) {
        if (k == ENG_LORA_KIND_SAVED) continue;
        p->total_trainable -= p->trainable[k];
        p->trainable[k] = 0;
        p->modules[k] = 0;
    }
    for (int t = 0; t < p->count; t++) {
        const eng_lora_target_t *tg = &p->targets[t];
        add_count(p, tg->kind, (size_t)tg->r * (size_t)(tg->out + (tg->share_a >= 0 ? 0 : tg->in)));
    }
}

int eng_lora_plan_find(const eng_lora_plan_t *p, int param) {
    /* targets are in parameter order: binary search */
    int lo = 0, hi = p->count - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        if (p->targets[mid].param == param) return mid;
        if (p->targets[mid].param < param) lo = mid + 1;
        else hi = mid - 1;
    }
    return -1;
}

void eng_lora_plan_summary(const eng_lora_plan_t *p, char *buf, size_t cap) {
    size_t len = 0;
    int w = snprintf(buf, cap, "LoRA: %zu trainable parameters (%.4f%% of %zu)", p->total_trainable,
                     p->total_params ? 100.0 * (double)p->total_trainable / (double)p->total_params : 0.0,
                     p->total_params);
    if (w < 0 || (size_t)w >= cap) return;
    len = (size_t)w;
    for (int k = 0; k < ENG_LORA_KIND_COUNT; k++) {
        if (!p->modules[k]) continue;
        w = snprintf(buf + len, cap - len, "\n  %-16s %6zu modules %12zu parameters", eng_lora_kind_name(k),
                     p->modules[k], p->trainable[k]);
        if (w < 0 || (size_t)w >= cap - len) return;
        len += (size_t)w;
    }
}
