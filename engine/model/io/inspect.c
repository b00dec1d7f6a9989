/* `moetune inspect` (see inspect.h).  Everything printed is derived from
 * the model description (the same list the loader and planner use) plus what the
 * safetensors headers say; no tensor data is read, so inspecting a 60 GB
 * checkpoint costs only its headers. */
#include "engine/model/io/inspect.h"
#include "engine/model/io/outdir.h"

#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "engine/model/io/checkpoint.h"
#include "engine/model/hf/model_config.h"
#include "engine/model/desc/model_desc.h"
#include "engine/model/io/safetensors.h"

static const char *human(char *buf, size_t cap, double v) {
    if (v >= 1e9) snprintf(buf, cap, "%.2fB", v / 1e9);
    else if (v >= 1e6) snprintf(buf, cap, "%.2fM", v / 1e6);
    else if (v >= 1e3) snprintf(buf, cap, "%.1fK", v / 1e3);
    else snprintf(buf, cap, "%.0f", v);
    return buf;
}

static const char *human_bytes(char *buf, size_t cap, double v) {
    if (v >= 1024.0 * 1024 * 1024) snprintf(buf, cap, "%.2f GiB", v / (1024.0 * 1024 * 1024));
    else if (v >= 1024.0 * 1024) snprintf(buf, cap, "%.2f MiB", v / (1024.0 * 1024));
    else if (v >= 1024.0) snprintf(buf, cap, "%.1f KiB", v / 1024.0);
    else snprintf(buf, cap, "%.0f B", v);
    return buf;
}

/* Per-layer parameter counts by group. */
enum { G_NORM, G_ATTN, G_ROUTER, G_EXPERTS, G_SHARED, G_DENSE, G_COUNT };
static const char *const k_group_names[G_COUNT] = {"norms", "attention", "router", "experts",
                                                   "shared", "dense mlp"};

static int group_of(eng_param_role_t r) {
    switch (r) {
    case ENG_P_ATTN_NORM:
    case ENG_P_MLP_NORM: return G_NORM;
    case ENG_P_Q: case ENG_P_K: case ENG_P_V: case ENG_P_O:
    case ENG_P_Q_BIAS: case ENG_P_K_BIAS: case ENG_P_V_BIAS: case ENG_P_O_BIAS:
    case ENG_P_Q_NORM: case ENG_P_K_NORM:
    case ENG_P_Q_A: case ENG_P_Q_A_NORM: case ENG_P_Q_B:
    case ENG_P_KV_A: case ENG_P_KV_A_NORM: case ENG_P_KV_B:
    case ENG_P_ATTN_SINKS: return G_ATTN;
    case ENG_P_ROUTER: case ENG_P_ROUTER_B: return G_ROUTER;
    case ENG_P_EXP_GATE: case ENG_P_EXP_UP: case ENG_P_EXP_DOWN:
    case ENG_P_EXP_GATE_UP_FUSED: case ENG_P_EXP_GATE_UP_BIAS:
    case ENG_P_EXP_DOWN_FUSED: case ENG_P_EXP_DOWN_BIAS: return G_EXPERTS;
    case ENG_P_SHARED_GATE: case ENG_P_SHARED_UP: case ENG_P_SHARED_DOWN:
    case ENG_P_SHARED_EXPERT_GATE: return G_SHARED;
    case ENG_P_DENSE_GATE: case ENG_P_DENSE_UP: case ENG_P_DENSE_DOWN: return G_DENSE;
    default: return -1;
    }
}

/* "0-3,5,7-9" from a boolean list; "none" when empty. */
static void ranges(char *buf, size_t cap, const bool *on, int n) {
    size_t len = 0;
    buf[0] = '\0';
    for (int i = 0; i < n && len < cap; i++) {
        if (!on[i]) continue;
        int j = i;
        while (j + 1 < n && on[j + 1]) j++;
        len += (size_t)snprintf(buf + len, cap - len, j > i ? "%s%d-%d" : "%s%d", len ? "," : "", i, j);
        i = j;
    }
    if (len == 0) snprintf(buf, cap, "none");
}

/* What DeepSeek's, GLM-4.5's and gpt-oss's configs add to the decoder's:
 * MLA's ranks, the router's rule, RoPE scaling, gpt-oss's attention. */
static void print_family_extras(FILE *out, const eng_model_config_t *c) {
    if (c->mla) {
        fprintf(out, "MLA          q_lora_rank %d%s, kv_lora_rank %d, qk head %d (nope %d + rope %d), v head %d\n",
                c->q_lora_rank, c->q_lora_rank ? "" : " (q_proj directly)", c->kv_lora_rank,
                c->qk_nope_head_dim + c->qk_rope_head_dim, c->qk_nope_head_dim, c->qk_rope_head_dim, c->v_head_dim);
    }
    static const char *const k_route[] = {
        [ENG_ROUTE_SOFTMAX] = "softmax, top-k",
        [ENG_ROUTE_SOFTMAX_GROUP] = "softmax, group-limited top-k",
        [ENG_ROUTE_SIGMOID_GROUP_BIAS] = "sigmoid, group-limited top-k on score + e_score_correction_bias",
        [ENG_ROUTE_TOPK_SOFTMAX] = "top-k of the logits (router bias), softmax over the k",
    };
    if (c->routing != ENG_ROUTE_SOFTMAX || c->n_group > 0 || c->routed_scaling_factor != 1.0f)
        fprintf(out, "routing      %s; groups %d, top groups %d, routed scale %g\n", k_route[c->routing], c->n_group,
                c->topk_group, (double)c->routed_scaling_factor);
    if (strcmp(c->rope_type, "default") != 0 || c->partial_rotary_factor != 1.0f || c->rope_interleave) {
        fprintf(out, "rope type    %s", c->rope_type);
        if (strcmp(c->rope_type, "default") != 0)
            fprintf(out, " (factor %g, original max positions %d)", (double)c->rope_factor,
                    c->rope_original_max_position_embeddings);
        fprintf(out, ", rotary fraction %g%s\n", (double)c->partial_rotary_factor,
                c->rope_interleave ? ", interleaved pairs" : ", rotate halves");
    }
    if (c->attn_sinks) {
        int full = 0;
        for (int l = 0; l < c->num_hidden_layers; l++) full += c->layer_full_attention[l];
        fprintf(out, "gpt-oss      attention sinks; %d full-attention layers, %d sliding; experts fused with biases, "
                "swiglu_limit %g\n",
                full, c->num_hidden_layers - full, (double)c->swiglu_limit);
    }
    if (c->num_nextn_predict_layers > 0)
        fprintf(out, "MTP          %d multi-token-prediction layer%s in the checkpoint after the last layer: not "
                "described, not counted, allowed unused\n",
                c->num_nextn_predict_layers, c->num_nextn_predict_layers == 1 ? "" : "s");
}

static void print_arch(FILE *out, const char *dir, const eng_model_config_t *c, const eng_model_desc_t *d) {
    char b[1024];
    fprintf(out, "checkpoint   %s\n", dir);
    fprintf(out, "model_type   %s (%s)\n", c->model_type, eng_model_desc_family_name(d));
    fprintf(out, "layers       %d, hidden %d, vocab %d, max positions %d\n", c->num_hidden_layers,
            c->hidden_size, c->vocab_size, c->max_position_embeddings);
    if (c->mla) /* every head has its own k and v, decompressed from one latent (the MLA line below) */
        fprintf(out, "attention    MLA, %d heads, ", c->num_attention_heads);
    else
        fprintf(out, "attention    %d heads, %d kv heads, head_dim %d, qkv bias %s, qk norm %s, ",
                c->num_attention_heads, c->num_key_value_heads, c->head_dim, c->qkv_bias ? "yes" : "no",
                c->qk_norm ? "yes" : "no");
    if (c->sliding_window) fprintf(out, "sliding window %d\n", c->sliding_window);
    else fprintf(out, "full causal\n");
    fprintf(out, "rope         theta %g; rms_norm_eps %g; tied embeddings %s\n", (double)c->rope_theta,
            (double)c->rms_norm_eps, c->tie_word_embeddings ? "yes" : "no");
    fprintf(out, "experts      %d routed, top-%d, width %d, renormalise top-k %s", c->num_experts,
            c->num_experts_per_tok, c->moe_intermediate_size, c->norm_topk_prob ? "yes" : "no");
    if (c->n_shared_experts > 0)
        fprintf(out, "; %d shared expert%s, width %d", c->n_shared_experts, c->n_shared_experts == 1 ? "" : "s",
                c->shared_expert_intermediate_size);
    else if (c->shared_expert_intermediate_size > 0)
        fprintf(out, "; shared expert width %d (sigmoid gate)", c->shared_expert_intermediate_size);
    fprintf(out, "\n");
    print_family_extras(out, c);
    ranges(b, sizeof b, c->layer_is_moe, c->num_hidden_layers);
    int nmoe = 0;
    for (int l = 0; l < c->num_hidden_layers; l++) nmoe += c->layer_is_moe[l];
    /* the layers' indices, so "0" alone is layer 0, not a count: say both */
    fprintf(out, "MoE layers   %d of %d (%s %s)", nmoe, c->num_hidden_layers, nmoe == 1 ? "index" : "indices", b);
    bool dense[ENG_MAX_LAYERS];
    int nd = 0;
    for (int l = 0; l < c->num_hidden_layers; l++) nd += dense[l] = !c->layer_is_moe[l];
    if (nd) {
        ranges(b, sizeof b, dense, c->num_hidden_layers);
        fprintf(out, "; dense (width %d): %s", c->intermediate_size, b);
    }
    fprintf(out, "\n");
    fprintf(out, "aux loss     %s (router_aux_loss_coef %g)\n",
            c->output_router_logits ? "on" : "off", (double)c->router_aux_loss_coef);
}

static void print_layers(FILE *out, const eng_model_config_t *c, const eng_model_desc_t *spec) {
    int L = c->num_hidden_layers;
    size_t (*cnt)[G_COUNT] = calloc((size_t)L, sizeof *cnt);
    MT_CHECK_ALLOC(cnt, "inspect");
    size_t embed = 0, head = 0, fnorm = 0;
    for (int i = 0; i < spec->count; i++) {
        const eng_param_spec_t *p = &spec->params[i];
        int g = group_of(p->role);
        if (p->layer >= 0 && g >= 0) cnt[p->layer][g] += p->numel;
        else if (p->role == ENG_P_EMBED) embed += p->numel;
        else if (p->role == ENG_P_LM_HEAD) head += p->numel;
        else fnorm += p->numel;
    }
    char b[8][32];
    fprintf(out, "\nparameters by layer (identical consecutive layers merged; per layer)\n");
    fprintf(out, "  %-9s %-6s", "layers", "kind");
    for (int g = 0; g < G_COUNT; g++) fprintf(out, " %10s", k_group_names[g]);
    fprintf(out, " %10s\n", "total");
    for (int l = 0; l < L;) {
        int m = l;
        while (m + 1 < L && c->layer_is_moe[m + 1] == c->layer_is_moe[l] &&
               memcmp(cnt[m + 1], cnt[l], sizeof cnt[l]) == 0)
            m++;
        char lr[24];
        if (m > l) snprintf(lr, sizeof lr, "%d-%d", l, m);
        else snprintf(lr, sizeof lr, "%d", l);
        fprintf(out, "  %-9s %-6s", lr, c->layer_is_moe[l] ? "moe" : "dense");
        size_t tot = 0;
        for (int g = 0; g < G_COUNT; g++) {
            tot += cnt[l][g];
            fprintf(out, " %10s", cnt[l][g] ? human(b[0], sizeof b[0], (double)cnt[l][g]) : "-");
        }
        fprintf(out, " %10s\n", human(b[0], sizeof b[0], (double)tot));
        l = m + 1;
    }
    fprintf(out, "  embed_tokens %s, final norm %s, lm_head %s\n", human(b[0], sizeof b[0], (double)embed),
            human(b[1], sizeof b[1], (double)fnorm),
            head ? human(b[2], sizeof b[2], (double)head) : "tied to embed_tokens");
    free(cnt);

    /* One expert, described once: its tensors and shapes. */
    size_t per_expert = 0;
    int first = -1;
    for (int i = 0; i < spec->count; i++) {
        const eng_param_spec_t *p = &spec->params[i];
        if (p->expert != 0) continue;
        if (first < 0) first = p->layer;
        if (p->layer != first) break;
        if (per_expert == 0) fprintf(out, "\none expert (every MoE layer has %d):\n", c->num_experts);
        const char *tail = strstr(p->name, ".experts.0.");
        fprintf(out, "  %-28s [%lld, %lld]\n", tail ? tail + 11 : p->name, (long long)p->shape[0],
                (long long)p->shape[1]);
        per_expert += p->numel;
    }
    /* fused over E (gpt-oss): each tensor holds every expert of its layer */
    for (int i = 0; i < spec->count && per_expert == 0; i++) {
        const eng_param_spec_t *p = &spec->params[i];
        if (!eng_param_role_fused_experts(p->role)) continue;
        if (first < 0) {
            first = p->layer;
            fprintf(out, "\nexperts fused over E (every MoE layer has %d; one expert is 1/%d of each):\n",
                    c->num_experts, c->num_experts);
        }
    }
    if (per_expert == 0 && first >= 0)
        for (int i = 0; i < spec->count; i++) {
            const eng_param_spec_t *p = &spec->params[i];
            if (p->layer != first || !eng_param_role_fused_experts(p->role)) continue;
            const char *tail = strstr(p->name, ".experts.");
            fprintf(out, "  %-28s [%lld, %lld%s", tail ? tail + 9 : p->name, (long long)p->shape[0],
                    (long long)p->shape[1], p->ndim == 3 ? "" : "]\n");
            if (p->ndim == 3) fprintf(out, ", %lld]\n", (long long)p->shape[2]);
            per_expert += p->numel / (size_t)c->num_experts;
        }
    if (per_expert) {
        int nmoe = 0;
        for (int l = 0; l < L; l++) nmoe += c->layer_is_moe[l];
        double all = (double)per_expert * c->num_experts * nmoe;
        fprintf(out, "  = %s per expert, %s per layer, %s in all experts (%.1f%% of the model)\n",
                human(b[0], sizeof b[0], (double)per_expert),
                human(b[1], sizeof b[1], (double)per_expert * c->num_experts),
                human(b[2], sizeof b[2], all), 100.0 * all / (double)eng_model_desc_numel(spec));
    }
}

/* Storage dtypes of the description's tensors: config.json's until a
 * checkpoint says otherwise (eng_model_desc_note_dtype). */
static void print_storage(FILE *out, const eng_model_desc_t *d, const char *source) {
    int n_by[MT_DTYPE_COUNT] = {0};
    for (int i = 0; i < d->count; i++) n_by[d->params[i].dtype]++;
    for (int i = 0; i < d->num_buffers; i++) n_by[d->buffers[i].dtype]++;
    fprintf(out, "storage      (%s)", source);
    for (int t = 0; t < MT_DTYPE_COUNT; t++)
        if (n_by[t]) fprintf(out, " %s %d", mt_dtype_name((mt_dtype_t)t), n_by[t]);
    fprintf(out, "; %d parameters, %d buffers", d->count, d->num_buffers);
    for (int i = 0; i < d->num_buffers && i < 3; i++) fprintf(out, "%s%s", i ? ", " : " (", d->buffers[i].name);
    fprintf(out, "%s\n", d->num_buffers > 3 ? ", ...)" : d->num_buffers ? ")" : "");
}

/* Where a description tensor stands in the checkpoint: 0 = present with its
 * shape (its dtype noted), 1 = wrong shape, 2 = missing.  *mxfp4 counts
 * MXFP4 pairs, *bnb4 the companions of bitsandbytes 4-bit weights (absmax,
 * maps, quant_state: read with the codes). */
static int check_tensor(const eng_checkpoint_t *ck, eng_model_desc_t *spec, const eng_param_spec_t *p,
                        int *mxfp4, int *bnb4) {
    const eng_ckpt_entry_t *e = eng_checkpoint_find(ck, p->name);
    const eng_ckpt_entry_t *mb, *ms;
    int64_t mshape[3];
    if (!e && eng_checkpoint_find_mxfp4(ck, p->name, &mb, &ms, mshape)) {
        /* gpt-oss's MXFP4 experts: two tensors in the file for one described */
        bool ok = p->ndim == 3;
        for (int d = 0; ok && d < 3; d++) ok = mshape[d] == p->shape[d];
        *mxfp4 += ok;
        return ok ? 0 : 1;
    }
    if (eng_checkpoint_is_bnb4(ck, e)) {
        /* bitsandbytes 4-bit: U8 codes, the shape in its quant_state, companions beside it */
        eng_bnb4_t b;
        mt_error_t err = {0};
        const bool ok = eng_checkpoint_bnb4_read(ck, e, p->ndim, p->shape, false, &b, &err) == MT_OK;
        *bnb4 += ok ? eng_checkpoint_bnb4_parts(ck, e) : 0;
        return ok ? 0 : 1;
    }
    bool ok = e && e->tensor->ndim == p->ndim;
    for (int d = 0; ok && d < p->ndim; d++) ok = (int64_t)e->tensor->shape[d] == p->shape[d];
    mt_dtype_t dt;
    if (ok && eng_st_dtype_to_mt(e->tensor->dtype, &dt)) eng_model_desc_note_dtype(spec, p->name, dt);
    return ok ? 0 : e ? 1 : 2;
}

static mt_status_t print_weights(FILE *out, const char *dir, eng_model_desc_t *spec,
                                 mt_error_t *err) {
    char b[3][32];
    size_t dl = strlen(dir) + 64;
    char *p1 = malloc(dl), *p2 = malloc(dl);
    MT_CHECK_ALLOC(p1, "path");
    MT_CHECK_ALLOC(p2, "path");
    snprintf(p1, dl, "%s/%s", dir, ENG_CKPT_SINGLE_FILE);
    snprintf(p2, dl, "%s/%s", dir, ENG_CKPT_INDEX_FILE);
    struct stat sb;
    bool any = stat(p1, &sb) == 0 || stat(p2, &sb) == 0;
    free(p1);
    free(p2);
    fprintf(out, "\nweights      ");
    if (!any) {
        fprintf(out, "none (config.json only)\n");
        print_storage(out, spec, "config.json");
        return MT_OK;
    }
    eng_checkpoint_t ck;
    mt_status_t st = eng_checkpoint_open(dir, &ck, err);
    if (st != MT_OK) return st;
    st = eng_checkpoint_resolve(&ck, spec, err);
    if (st != MT_OK) {
        eng_checkpoint_close(&ck);
        return st;
    }
    bool own_fused = false; /* gpt-oss: fused over E is the family's only layout */
    for (int i = 0; i < spec->count && !own_fused; i++) own_fused = eng_param_role_fused_experts(spec->params[i].role);
    fprintf(out, "%d file%s, %s on disk, %d tensors, experts stored %s\n", ck.file_count, ck.file_count == 1 ? "" : "s",
            human_bytes(b[0], sizeof b[0], (double)ck.disk_bytes), ck.count,
            own_fused ? "fused over E with biases (the family's own layout)"
            : ck.layout == ENG_CKPT_LAYOUT_FUSED ? "fused (transformers 5: experts.gate_up_proj, experts.down_proj)"
                                                 : "per expert (the Hub's layout)");
    int n_by[ENG_ST_DTYPE_COUNT] = {0};
    uint64_t bytes_by[ENG_ST_DTYPE_COUNT] = {0};
    for (int i = 0; i < ck.count; i++) {
        const eng_st_tensor_t *t = ck.entries[i].tensor;
        n_by[t->dtype]++;
        bytes_by[t->dtype] += t->end - t->begin;
    }
    for (int d = 0; d < ENG_ST_DTYPE_COUNT; d++)
        if (n_by[d])
            fprintf(out, "  %-5s %6d tensors, %s\n", eng_st_dtype_name((eng_st_dtype_t)d), n_by[d],
                    human_bytes(b[0], sizeof b[0], (double)bytes_by[d]));
    /* Agreement with config.json: missing, wrong shape, unexpected (parameters and buffers). */
    int missing = 0, wrong = 0, shown = 0, mxfp4 = 0, bnb4 = 0;
    const eng_param_spec_t *first_bad = NULL;
    int first_where = 0;
    const int described = spec->count + spec->num_buffers;
    for (int i = 0; i < described; i++) {
        const eng_param_spec_t *p = i < spec->count ? &spec->params[i] : &spec->buffers[i - spec->count];
        const int where = check_tensor(&ck, spec, p, &mxfp4, &bnb4);
        if (where == 0) continue;
        if (where == 1) wrong++;
        else missing++;
        if (!first_bad) {
            first_bad = p;
            first_where = where;
        }
        if (shown++ < 5)
            fprintf(out, "  %s: %s\n", where == 1 ? "WRONG SHAPE" : "MISSING", p->name);
    }
    int bnb4_weights = 0;
    for (int i = 0; i < ck.count; i++) bnb4_weights += eng_checkpoint_is_bnb4(&ck, &ck.entries[i]);
    /* an MXFP4 tensor is two in the file; a bnb one its codes plus its companions */
    int used = described - missing + mxfp4 + bnb4;
    int unexpected = ck.count - used;
    if (missing || wrong || unexpected)
        fprintf(out, "  vs config.json: %d missing, %d wrong shape, %d unexpected (ignored)\n", missing,
                wrong, unexpected);
    else
        fprintf(out, "  vs config.json: all %d tensors present with the expected shapes\n", described);
    if (mxfp4) fprintf(out, "  %d expert tensors in MXFP4 (_blocks + _scales), dequantised when read\n", mxfp4);
    if (bnb4_weights)
        fprintf(out, "  %d weights in bitsandbytes 4-bit (codes, absmax, quant_state), kept as stored in a LoRA run\n",
                bnb4_weights);
    print_storage(out, spec, "the checkpoint's");
    /* A checkpoint that lacks a tensor config.json implies (or holds it in
     * another shape) cannot be trained or loaded by transformers: inspect
     * says so by failing, naming the first, so scripts can rely on it. */
    if (first_bad) {
        char want[96];
        size_t n = (size_t)snprintf(want, sizeof want, "[");
        for (int d = 0; d < first_bad->ndim && n < sizeof want; d++)
            n += (size_t)snprintf(want + n, sizeof want - n, "%s%lld", d ? ", " : "", (long long)first_bad->shape[d]);
        if (n < sizeof want) snprintf(want + n, sizeof want - n, "]");
        st = mt_error_set(err, MT_ERR_FORMAT,
                          "%s: %s tensor '%s' (config.json implies shape %s); %d missing, %d wrong shape in all",
                          dir, first_where == 1 ? "wrong shape of" : "missing", first_bad->name, want, missing, wrong);
    }
    eng_checkpoint_close(&ck);
    return st;
}

mt_status_t eng_inspect(const char *dir, FILE *out, mt_error_t *err) {
    /* a save moetune did not finish is refused even before its weights exist */
    mt_status_t st = eng_ckpt_dir_check(dir, err);
    if (st != MT_OK) return st;
    eng_model_config_t cfg;
    st = eng_model_config_load(dir, NULL, &cfg, err);
    if (st != MT_OK) return st;
    eng_model_desc_t spec;
    st = eng_model_desc_build(&cfg, &spec, err);
    if (st != MT_OK) {
        eng_model_config_free(&cfg);
        return st;
    }
    print_arch(out, dir, &cfg, &spec);
    char b[2][32];
    size_t total = eng_model_desc_numel(&spec), active = eng_model_desc_active_numel(&spec, &cfg);
    fprintf(out, "parameters   %s total (%zu), %s active per token (%zu)\n",
            human(b[0], sizeof b[0], (double)total), total, human(b[1], sizeof b[1], (double)active),
            active);
    print_layers(out, &cfg, &spec);
    st = print_weights(out, dir, &spec, err);
    eng_model_desc_free(&spec);
    eng_model_config_free(&cfg);
    return st;
}
