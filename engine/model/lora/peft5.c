/* The adapter_config.json PEFT on transformers 5 loads completely, and
 * what it cannot (the rules are in peft5.h). */
#include "engine/model/lora/peft5.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* One thing PEFT on transformers 5 wraps: a module (nn.Linear) or a
 * parameter (a routed expert layer's gate_up_proj / down_proj, or a 2-D
 * weight whose module's leaf PEFT would rewrite). */
typedef struct {
    char name[300]; /* as PEFT there names it */
    bool param;     /* target_parameters (else target_modules) */
    bool adapted;
    int r;          /* when adapted */
    double alpha;
} ent_t;

typedef struct {
    ent_t *e;
    int n;
} ents_t;

static bool routed(eng_param_role_t r) {
    return r == ENG_P_EXP_GATE || r == ENG_P_EXP_UP || r == ENG_P_EXP_DOWN;
}

/* The entity parameter i belongs to; -1 for no linear module. */
static int entity_of(ents_t *s, const eng_model_desc_t *d, int i) {
    const eng_param_spec_t *ps = &d->params[i];
    if (!eng_lora_role_is_linear(ps->role) || ps->role == ENG_P_LM_HEAD) return -1;
    char name[300], mod[300];
    bool param = routed(ps->role);
    if (!param && eng_lora_peft_module(d, i, mod, sizeof mod)) {
        const char *dot = strrchr(mod, '.');
        param = eng_lora_peft_rewritten_leaf(d, dot ? dot + 1 : mod);
    }
    if (param ? !eng_lora_peft_param(d, i, name, sizeof name) : !eng_lora_peft_module(d, i, name, sizeof name))
        return -1;
    for (int k = 0; k < s->n; k++)
        if (s->e[k].param == param && strcmp(s->e[k].name, name) == 0) return k;
    ent_t *e = &s->e[s->n];
    memset(e, 0, sizeof *e);
    snprintf(e->name, sizeof e->name, "%s", name);
    e->param = param;
    return s->n++;
}

/* alpha' such that rank r_to at alpha' has the s of rank r at alpha. */
static double alpha_for(bool rslora, int r, double alpha, int r_to) {
    return rslora ? alpha * sqrt((double)r_to / r) : alpha * r_to / r;
}

/* Target t's rank and alpha as its entity's: a routed expert's gate and up
 * adapters are one gate_up_proj to PEFT (rank r_gate + r_up when separate). */
static void take(ent_t *e, const eng_model_desc_t *d, const eng_lora_plan_t *p, int t, bool rslora) {
    const eng_lora_target_t *tg = &p->targets[t];
    const eng_param_spec_t *ps = &d->params[tg->param];
    if (e->adapted) return; /* from its first expert */
    e->adapted = true;
    e->r = tg->r;
    e->alpha = tg->alpha;
    if (ps->role != ENG_P_EXP_GATE && ps->role != ENG_P_EXP_UP) return;
    const int g = eng_lora_plan_find(p, eng_model_desc_find_role(d, ps->layer, ENG_P_EXP_GATE, ps->expert));
    const int u = eng_lora_plan_find(p, eng_model_desc_find_role(d, ps->layer, ENG_P_EXP_UP, ps->expert));
    if (u >= 0 && p->targets[u].share_a >= 0) return; /* PEFT's own fused form */
    const int rg = g >= 0 ? p->targets[g].r : 0, ru = u >= 0 ? p->targets[u].r : 0;
    e->r = rg + ru;
    e->alpha = alpha_for(rslora, tg->r, tg->alpha, e->r);
}

static void build(ents_t *s, const eng_model_desc_t *d, const eng_lora_plan_t *p, bool rslora) {
    s->e = calloc((size_t)d->count + 1, sizeof *s->e);
    MT_CHECK_ALLOC(s->e, "PEFT target list");
    s->n = 0;
    for (int i = 0; i < d->count; i++) {
        const int k = entity_of(s, d, i), t = eng_lora_plan_find(p, i);
        if (k >= 0 && t >= 0) take(&s->e[k], d, p, t, rslora);
    }
}

enum { FOR_TARGETS, FOR_RANK, FOR_ALPHA };

static bool same_value(const ent_t *a, const ent_t *b, int mode) {
    if (mode == FOR_RANK) return a->r == b->r;
    return fabs(a->alpha - b->alpha) <= 1e-12 * fabs(b->alpha);
}

/* The shortest dot-boundary suffix of entity k's name that selects no
 * entity it must not: for a target list, none of its list left out; for a
 * pattern key, no adapted entity of another value.  Never "weight" alone. */
static const char *shortest(const ents_t *s, int k, int mode) {
    const char *name = s->e[k].name;
    for (const char *suf = name + strlen(name); suf > name;) {
        while (suf > name && suf[-1] != '.') suf--;
        /* a bare "weight" would reach every parameter of the model, norms and embeddings too */
        bool ok = strcmp(suf, "weight") != 0;
        for (int j = 0; j < s->n && ok; j++) {
            const ent_t *x = &s->e[j];
            if (!eng_lora_name_matches(x->name, suf)) continue;
            ok = mode == FOR_TARGETS ? x->param != s->e[k].param || x->adapted
                                     : !x->adapted || same_value(x, &s->e[k], mode);
        }
        if (ok) return suf;
        if (suf > name) suf--; /* past the dot: one more component */
    }
    return name;
}

static void add_unique(char **list, int *n, const char *s) {
    for (int i = 0; i < *n; i++)
        if (strcmp(list[i], s) == 0) return;
    list[*n] = strdup(s);
    MT_CHECK_ALLOC(list[*n], "PEFT target");
    (*n)++;
}

/* A pattern key: the suffix with its dots escaped (PEFT matches keys as regular expressions). */
static void add_pattern(eng_lora_config_t *c, bool rank, const char *suf, double value) {
    char key[700];
    size_t w = 0;
    for (const char *p = suf; *p && w + 3 < sizeof key; p++) {
        if (*p == '.') key[w++] = '\\';
        key[w++] = *p;
    }
    key[w] = '\0';
    const eng_lora_pattern_t *list = rank ? c->rank_pattern : c->alpha_pattern;
    const int n = rank ? c->num_rank_pattern : c->num_alpha_pattern;
    for (int i = 0; i < n; i++)
        if (strcmp(list[i].key, key) == 0) return;
    eng_lora_config_add_pattern(c, rank, key, value);
}

void eng_lora_peft_config(const eng_model_desc_t *d, const eng_lora_plan_t *p, eng_lora_config_t *c) {
    ents_t s;
    build(&s, d, p, c->use_rslora);
    c->target_modules = calloc((size_t)s.n + 1, sizeof *c->target_modules);
    c->target_parameters = calloc((size_t)s.n + 1, sizeof *c->target_parameters);
    MT_CHECK(c->target_modules && c->target_parameters, "out of host memory allocating %s", "PEFT target lists");
    for (int k = 0; k < s.n; k++) {
        const ent_t *e = &s.e[k];
        if (!e->adapted) continue;
        const char *suf = shortest(&s, k, FOR_TARGETS);
        if (e->param) add_unique(c->target_parameters, &c->num_target_parameters, suf);
        else add_unique(c->target_modules, &c->num_target_modules, suf);
        if (e->r != c->r) add_pattern(c, true, shortest(&s, k, FOR_RANK), e->r);
        if (fabs(e->alpha - c->lora_alpha) > 1e-12 * c->lora_alpha)
            add_pattern(c, false, shortest(&s, k, FOR_ALPHA), e->alpha);
    }
    free(s.e);
}

/* ---- what PEFT on transformers 5 still cannot load --------------------------- */

typedef struct {
    char *buf;
    size_t cap, len;
    int count;
} notes_t;

static void note(notes_t *n, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    if (n->len < n->cap) {
        int w = vsnprintf(n->buf + n->len, n->cap - n->len, fmt, ap);
        if (w > 0) n->len = n->len + (size_t)w < n->cap ? n->len + (size_t)w : n->cap - 1;
    }
    va_end(ap);
    n->count++;
}

/* Layer l's routed experts: every expert adapted alike, gate and up together at one scale. */
static void expert_layer_notes(notes_t *n, const eng_model_desc_t *d, const eng_lora_plan_t *p, int l) {
    static const eng_param_role_t roles[3] = {ENG_P_EXP_GATE, ENG_P_EXP_UP, ENG_P_EXP_DOWN};
    int adapted[3] = {0, 0, 0};
    bool scales_differ = false;
    for (int e = 0; e < d->num_experts; e++) {
        int t[3];
        for (int k = 0; k < 3; k++) {
            t[k] = eng_lora_plan_find(p, eng_model_desc_find_role(d, l, roles[k], e));
            adapted[k] += t[k] >= 0;
        }
        if (t[0] >= 0 && t[1] >= 0 && p->targets[t[0]].scale != p->targets[t[1]].scale) scales_differ = true;
    }
    const char *what[3] = {"gate", "up", "down"};
    for (int k = 0; k < 3; k++)
        if (adapted[k] > 0 && adapted[k] < d->num_experts)
            note(n, "PEFT on transformers 5 cannot load layer %d's %s adapters: they are on %d of its %d experts, "
                    "and PEFT's fused experts take an adapter on every expert or none\n",
                 l, what[k], adapted[k], d->num_experts);
    if ((adapted[0] > 0) != (adapted[1] > 0))
        note(n, "PEFT on transformers 5 cannot load layer %d's %s adapters: gate and up are one gate_up_proj "
                "there, adapted together or not at all\n",
             l, adapted[0] ? "gate" : "up");
    if (scales_differ)
        note(n, "PEFT on transformers 5 computes layer %d's gate and up adapters at one scale (one gate_up_proj "
                "adapter), but they differ here\n", l);
}

int eng_lora_peft_warnings(const eng_model_desc_t *d, const eng_lora_plan_t *p, double dropout, char *buf,
                           size_t cap) {
    notes_t n = {.buf = buf, .cap = cap};
    if (cap) buf[0] = '\0';
    int layers = 0;
    for (int i = 0; i < d->count; i++)
        if (d->params[i].layer + 1 > layers) layers = d->params[i].layer + 1;
    for (int l = 0; l < layers; l++)
        if (eng_model_desc_find_role(d, l, ENG_P_EXP_GATE, 0) >= 0) expert_layer_notes(&n, d, p, l);
    if (dropout > 0) {
        ents_t s;
        build(&s, d, p, false);
        int wrapped = 0, first = -1;
        for (int k = 0; k < s.n; k++)
            if (s.e[k].adapted && s.e[k].param) {
                if (first < 0) first = k;
                wrapped++;
            }
        if (wrapped)
            note(&n,
                 "PEFT on transformers 5 cannot load this adapter: it wraps %s%s as a parameter (ParamWrapper), "
                 "which refuses lora_dropout %g; use lora_dropout: 0 for an adapter PEFT loads there\n",
                 s.e[first].name, wrapped > 1 ? " and others" : "", dropout);
        free(s.e);
    }
    return n.count;
}
