/* Model lifetime on the host: build the parameter table from the spec,
 * read the checkpoint into the host homes (see model.h).  The device side
 * is the executor's (engine/exec/exec.c); this file knows nothing of it. */
#include "engine/model/model.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/model/io/checkpoint.h"

/* Where each role a layer holds once goes in eng_layer_index_t: the one
 * place a per-layer role meets its field, so that the index is filled from
 * the description by role alone.  A role without a row here is one no
 * layer holds once: the routed experts' (per expert, below), what sits
 * outside the layers (embed, final norm, lm_head), the grouped router's
 * bias (a buffer), the LoRA factors (not in the description). */
#define FIELD(role, field) [role] = {true, offsetof(eng_layer_index_t, field)}
static const struct {
    bool set;
    size_t off;
} k_layer_field[ENG_P_ROLE_COUNT] = {
    FIELD(ENG_P_ATTN_NORM, attn_norm),
    FIELD(ENG_P_Q, q),
    FIELD(ENG_P_K, k),
    FIELD(ENG_P_V, v),
    FIELD(ENG_P_O, o),
    FIELD(ENG_P_Q_BIAS, q_bias),
    FIELD(ENG_P_K_BIAS, k_bias),
    FIELD(ENG_P_V_BIAS, v_bias),
    FIELD(ENG_P_O_BIAS, o_bias),
    FIELD(ENG_P_Q_NORM, q_norm),
    FIELD(ENG_P_K_NORM, k_norm),
    FIELD(ENG_P_MLP_NORM, mlp_norm),
    FIELD(ENG_P_ROUTER, router),
    FIELD(ENG_P_SHARED_GATE, sh_gate),
    FIELD(ENG_P_SHARED_UP, sh_up),
    FIELD(ENG_P_SHARED_DOWN, sh_down),
    FIELD(ENG_P_SHARED_EXPERT_GATE, sh_expert_gate),
    FIELD(ENG_P_DENSE_GATE, dense_gate),
    FIELD(ENG_P_DENSE_UP, dense_up),
    FIELD(ENG_P_DENSE_DOWN, dense_down),
    FIELD(ENG_P_Q_A, q_a),
    FIELD(ENG_P_Q_A_NORM, q_a_norm),
    FIELD(ENG_P_Q_B, q_b),
    FIELD(ENG_P_KV_A, kv_a),
    FIELD(ENG_P_KV_A_NORM, kv_a_norm),
    FIELD(ENG_P_KV_B, kv_b),
    FIELD(ENG_P_ATTN_SINKS, sinks),
    FIELD(ENG_P_ROUTER_B, router_b),
    FIELD(ENG_P_EXP_GATE_UP_FUSED, gate_up),
    FIELD(ENG_P_EXP_GATE_UP_BIAS, gate_up_b),
    FIELD(ENG_P_EXP_DOWN_FUSED, down),
    FIELD(ENG_P_EXP_DOWN_BIAS, down_b),
};
#undef FIELD

static int *layer_field(eng_layer_index_t *L, eng_param_role_t role) {
    return k_layer_field[role].set ? (int *)((char *)L + k_layer_field[role].off) : NULL;
}

/* Layer l's index with nothing found yet: every field -1, and the
 * per-expert tables of a MoE layer whose experts are separate tensors. */
static void empty_layer_index(const eng_model_config_t *c, int l, eng_layer_index_t *L) {
    for (int r = 0; r < ENG_P_ROLE_COUNT; r++) {
        int *field = layer_field(L, (eng_param_role_t)r);
        if (field) *field = -1;
    }
    L->router_bias = -1;
    if (c->layer_is_moe[l] && !c->experts_fused) { /* fused experts: one tensor each, in the table */
        L->exp_gate = malloc((size_t)c->num_experts * sizeof(int));
        L->exp_up = malloc((size_t)c->num_experts * sizeof(int));
        L->exp_down = malloc((size_t)c->num_experts * sizeof(int));
        MT_CHECK(L->exp_gate && L->exp_up && L->exp_down, "out of memory for expert index");
    }
}

static void build_layer_index(eng_model_t *m) {
    const eng_model_config_t *c = &m->cfg;
    m->layers = calloc((size_t)c->num_hidden_layers, sizeof *m->layers);
    MT_CHECK_ALLOC(m->layers, "layer index");
    for (int l = 0; l < c->num_hidden_layers; l++) empty_layer_index(c, l, &m->layers[l]);
    m->embed = m->final_norm = m->lm_head = -1;
    for (int i = 0; i < m->spec.count; i++) {
        const eng_param_spec_t *p = &m->spec.params[i];
        if (p->layer < 0) {
            if (p->role == ENG_P_EMBED) m->embed = i;
            else if (p->role == ENG_P_FINAL_NORM) m->final_norm = i;
            else if (p->role == ENG_P_LM_HEAD) m->lm_head = i;
            continue;
        }
        eng_layer_index_t *L = &m->layers[p->layer];
        if (p->role == ENG_P_EXP_GATE) L->exp_gate[p->expert] = i;
        else if (p->role == ENG_P_EXP_UP) L->exp_up[p->expert] = i;
        else if (p->role == ENG_P_EXP_DOWN) L->exp_down[p->expert] = i;
        else {
            int *field = layer_field(L, p->role);
            MT_CHECK(field, "%s: role %s has no field in the layer index (engine/model/model.c, k_layer_field)",
                     p->name, eng_param_role_name(p->role));
            *field = i;
        }
    }
    for (int i = 0; i < m->spec.num_buffers; i++) {
        const eng_param_spec_t *p = &m->spec.buffers[i];
        if (p->layer >= 0 && p->role == ENG_P_ROUTER_BIAS) m->layers[p->layer].router_bias = i;
    }
    if (m->lm_head < 0) m->lm_head = m->embed; /* tied */
}

int eng_model_num_blocks(const eng_model_t *m) { return m->cfg.num_hidden_layers + 2; }

static int owning_block(const eng_model_t *m, const eng_param_spec_t *ps) {
    if (ps->layer >= 0) return ps->layer + 1;
    return ps->role == ENG_P_EMBED ? 0 : m->cfg.num_hidden_layers + 1;
}

/* The dtype most of the checkpoint's parameter bytes are stored in. */
static mt_dtype_t checkpoint_dtype(const eng_checkpoint_t *ck, const eng_model_desc_t *spec) {
    double bytes[MT_DTYPE_COUNT] = {0};
    for (int i = 0; i < spec->count; i++) {
        const eng_ckpt_entry_t *e = eng_checkpoint_find(ck, spec->params[i].name);
        if (!e) continue;
        switch (e->tensor->dtype) {
        case ENG_ST_BF16:
        case ENG_ST_F8_E4M3: /* an FP8 release's tensors: dequantised, saved as bf16 (its other tensors' dtype) */
            bytes[MT_BF16] += (double)spec->params[i].numel;
            break;
        case ENG_ST_F16: bytes[MT_F16] += (double)spec->params[i].numel; break;
        case ENG_ST_U8: break; /* bitsandbytes' 4-bit codes: the tensors it left unquantised say the dtype */
        default: bytes[MT_F32] += (double)spec->params[i].numel; break;
        }
    }
    if (bytes[MT_BF16] > bytes[MT_F32] && bytes[MT_BF16] >= bytes[MT_F16]) return MT_BF16;
    if (bytes[MT_F16] > bytes[MT_F32]) return MT_F16;
    return MT_F32;
}

mt_status_t eng_model_init(eng_model_t *m, const char *dir, const eng_model_opts_t *opts, mt_error_t *err) {
    memset(m, 0, sizeof *m);
    if (opts->compute != MT_F32 && opts->compute != MT_BF16)
        return mt_error_set(err, MT_ERR_UNSUPPORTED, "compute dtype %s is not supported (F32 or BF16)",
                            mt_dtype_name(opts->compute));
    m->compute = opts->compute;
    mt_status_t st = eng_model_config_load(dir, opts->overrides_json, &m->cfg, err);
    if (st != MT_OK) return st;
    st = eng_model_desc_build(&m->cfg, &m->spec, err);
    if (st != MT_OK) goto fail;
    if (!eng_model_desc_trains(&m->spec)) {
        st = mt_error_set(err, MT_ERR_UNSUPPORTED,
                          "%s: model_type %s (%s) cannot be trained yet: moetune describes it for `moetune inspect` "
                          "and `moetune plan`, but has no block code for it",
                          dir, m->cfg.model_type, eng_model_desc_family_name(&m->spec));
        goto fail;
    }
    st = eng_model_check_trainable(&m->cfg, opts->overrides_json, dir, err);
    if (st != MT_OK) goto fail;
    build_layer_index(m);
    for (int l = 0; l < m->cfg.num_hidden_layers; l++) m->num_moe_layers += m->cfg.layer_is_moe[l];

    /* The model's home is host memory: every master starts there.  (A
     * description always has parameters; saying so also keeps GCC from
     * reading the int count as possibly negative.) */
    MT_CHECK(m->spec.count > 0, "%s: the model description has no parameters", dir);
    m->params = calloc((size_t)m->spec.count, sizeof *m->params);
    MT_CHECK_ALLOC(m->params, "parameter table");
    for (int i = 0; i < m->spec.count; i++) {
        eng_param_t *p = &m->params[i];
        p->spec = &m->spec.params[i];
        p->block = owning_block(m, p->spec);
        p->w_dtype = eng_param_working_dtype(p->spec, m->compute);
        p->host_w = malloc(p->spec->numel * sizeof(float));
        MT_CHECK_ALLOC(p->host_w, p->spec->name);
        p->lora_a = p->lora_b = -1;
    }
    m->num_params = m->spec.count;
    if (m->spec.num_buffers > 0) {
        m->buffer_host = calloc((size_t)m->spec.num_buffers, sizeof *m->buffer_host);
        MT_CHECK_ALLOC(m->buffer_host, "buffer table");
        for (int i = 0; i < m->spec.num_buffers; i++) {
            m->buffer_host[i] = malloc(m->spec.buffers[i].numel * sizeof(float));
            MT_CHECK_ALLOC(m->buffer_host[i], m->spec.buffers[i].name);
        }
    }
    return MT_OK;
fail:
    eng_model_release(m);
    return st;
}

/* A bf16 tensor on disk, laid out as the home wants it (contiguous,
 * 2-byte aligned in the mapping): its home can be the mapping itself. */
static const uint16_t *mappable_bf16(const eng_checkpoint_t *ck, const eng_param_spec_t *ps) {
    const eng_ckpt_entry_t *e = eng_checkpoint_find(ck, ps->name);
    if (!e || e->tensor->dtype != ENG_ST_BF16 || e->tensor->numel != ps->numel) return NULL;
    if ((uintptr_t)e->tensor->data % sizeof(uint16_t) != 0) return NULL;
    return (const uint16_t *)e->tensor->data;
}

/* Frozen weights kept in bf16.  Stored bf16 on disk (a bf16 base): the home
 * points into the checkpoint's read-only mapping, which stays open, so the
 * base costs no host memory beyond the page cache (the file must not change
 * under the run, as with any mmap'd model).  Otherwise read one at a time
 * through an fp32 buffer of the largest, so loading never holds the base in
 * fp32.  *keep_open: some home points into ck. */
static mt_status_t read_bf16_homes(eng_model_t *m, const eng_checkpoint_t *ck, bool *keep_open, mt_error_t *err) {
    *keep_open = false;
    size_t largest = 0;
    for (int i = 0; i < m->spec.count; i++) {
        eng_param_t *p = &m->params[i];
        if (!p->home_bf16) continue;
        const uint16_t *mapped = mappable_bf16(ck, p->spec);
        if (mapped) {
            free(p->home_bf16);
            p->home_bf16 = (uint16_t *)mapped; /* read-only: nothing writes a frozen weight's home */
            p->home_mapped = true;
            *keep_open = true;
        } else if (p->spec->numel > largest) {
            largest = p->spec->numel;
        }
    }
    if (!largest) return MT_OK;
    float *tmp = malloc(largest * sizeof *tmp);
    MT_CHECK_ALLOC(tmp, "checkpoint read buffer");
    mt_status_t st = MT_OK;
    for (int i = 0; i < m->spec.count && st == MT_OK; i++) {
        const eng_param_t *p = &m->params[i];
        if (!p->home_bf16 || p->home_mapped) continue;
        st = eng_checkpoint_read_f32(ck, p->spec->name, p->spec->ndim, p->spec->shape, tmp, err);
        if (st == MT_OK) mt_convert_from_f32(p->home_bf16, MT_BF16, tmp, p->spec->numel);
    }
    free(tmp);
    return st;
}

/* p's plain home (fp32 or bf16) is replaced by a quantised one: nothing
 * reads it, and the checkpoint load skips it (host[i] NULL). */
static void drop_plain_home(eng_param_t *p, float **host_slot) {
    free(p->host_w);
    p->host_w = NULL;
    if (!p->home_mapped) free(p->home_bf16);
    p->home_bf16 = NULL;
    p->home_mapped = false;
    *host_slot = NULL;
}

/* An FP8 weight kept as stored: its codes and its block scales (widened
 * to fp32 once, as dequant reads them), through mt_quant_check; pending,
 * its codes read from the checkpoint's mapping when it is placed. */
static mt_status_t fp8_home(const eng_checkpoint_t *ck, const eng_ckpt_entry_t *e, eng_param_t *p,
                            mt_error_t *err) {
    const eng_ckpt_entry_t *se;
    mt_status_t st = eng_checkpoint_fp8_scales(ck, e, &se, err);
    if (st != MT_OK) return st;
    const eng_st_tensor_t *t = e->tensor, *s = se->tensor;
    char what[400];
    snprintf(what, sizeof what, "%s: '%s'", ck->files[e->file].path, e->name);
    if (p->spec->ndim != 2 || (int64_t)t->shape[0] != p->spec->shape[0] || (int64_t)t->shape[1] != p->spec->shape[1])
        return mt_error_set(err, MT_ERR_FORMAT, "%s: FP8 weight of shape [%llu, %llu]; config.json implies [%lld, %lld]",
                            what, (unsigned long long)t->shape[0], (unsigned long long)t->shape[1],
                            (long long)p->spec->shape[0], (long long)(p->spec->ndim > 1 ? p->spec->shape[1] : 1));
    float *scale = malloc((s->numel ? s->numel : 1) * sizeof *scale);
    MT_CHECK_ALLOC(scale, se->name);
    st = eng_st_read_f32(&ck->files[se->file], s, scale, err);
    const mt_quant_view_t v = {.format = MT_QUANT_FP8_BLOCK, .rows = (int64_t)t->shape[0],
                               .cols = (int64_t)t->shape[1], .block = 128, .block_cols = 128,
                               .codes = t->data, .scales = scale};
    const mt_quant_sizes_t have = {.codes = (int64_t)t->numel, .scales = (int64_t)s->numel};
    if (st == MT_OK) st = mt_quant_check(&v, &have, what, err);
    if (st != MT_OK) {
        free(scale);
        return st;
    }
    p->home_q = malloc(sizeof *p->home_q);
    MT_CHECK_ALLOC(p->home_q, p->spec->name);
    eng_quant_home_defer(p->home_q, &v, &have, scale); /* the codes stay in the mapping until placed */
    return MT_OK;
}

/* gpt-oss's MXFP4 experts kept as stored: the _blocks / _scales bytes as
 * a transposed view (base/quant_elem.h), which dequantises to the layout
 * the model holds (E, C, R) without a copy in the packed order; pending,
 * read from the checkpoint's mapping when it is placed. */
static mt_status_t mxfp4_home(const eng_checkpoint_t *ck, const eng_ckpt_entry_t *b, const eng_ckpt_entry_t *s,
                              const int64_t shape[3], eng_param_t *p, mt_error_t *err) {
    char what[400];
    snprintf(what, sizeof what, "%s: '%s_blocks'", ck->files[b->file].path, p->spec->name);
    const int64_t *want = p->spec->shape;
    if (p->spec->ndim != 3 || shape[0] != want[0] || shape[1] != want[1] || shape[2] != want[2])
        return mt_error_set(err, MT_ERR_FORMAT, "%s: MXFP4 tensor dequantises to [%lld, %lld, %lld]; config.json "
                            "implies a tensor of %d dimensions [%lld, %lld, %lld]",
                            what, (long long)shape[0], (long long)shape[1], (long long)shape[2], p->spec->ndim,
                            (long long)want[0], (long long)(p->spec->ndim > 1 ? want[1] : 0),
                            (long long)(p->spec->ndim > 2 ? want[2] : 0));
    const mt_quant_view_t v = {.format = MT_QUANT_MXFP4, .rows = shape[0] * shape[1], .cols = shape[2], .block = 32,
                               .tr_rows = shape[1], .codes = b->tensor->data, .scales_u8 = s->tensor->data};
    const mt_quant_sizes_t have = {.codes = (int64_t)b->tensor->numel, .scales_u8 = (int64_t)s->tensor->numel};
    const mt_status_t st = mt_quant_check(&v, &have, what, err); /* a NaN scale 0xFF is refused here */
    if (st != MT_OK) return st;
    p->home_q = malloc(sizeof *p->home_q);
    MT_CHECK_ALLOC(p->home_q, p->spec->name);
    eng_quant_home_defer(p->home_q, &v, &have, NULL); /* read from the mapping until placed */
    return MT_OK;
}

/* A weight bitsandbytes stored in 4 bits kept as stored: its codes and
 * absmax (or absmax codes and nested state) exactly as written, through
 * mt_quant_check (eng_checkpoint_bnb4_read). */
static mt_status_t bnb4_home(const eng_checkpoint_t *ck, const eng_ckpt_entry_t *e, eng_param_t *p,
                             mt_error_t *err) {
    eng_bnb4_t b;
    const mt_status_t st = eng_checkpoint_bnb4_read(ck, e, p->spec->ndim, p->spec->shape, true, &b, err);
    if (st != MT_OK) return st;
    p->home_q = malloc(sizeof *p->home_q);
    MT_CHECK_ALLOC(p->home_q, p->spec->name);
    eng_quant_home_pack(p->home_q, &b.view, &b.have);
    eng_bnb4_free(&b);
    return MT_OK;
}

/* Quantised homes (engine/model/quant_home.h) for a LoRA run's frozen
 * matrices marked quant_ok: an F8_E4M3 weight, gpt-oss's MXFP4 pair or a
 * bitsandbytes 4-bit weight as stored; otherwise, with load_in_4bit, the checkpoint's values quantised
 * as bitsandbytes does, read one tensor at a time so the base is never
 * held wider.  Runs before
 * the checkpoint load, which then skips them.  FP8 and MXFP4 homes stay
 * pending in the checkpoint's mapping (*pending set: keep it open): the
 * executor packs those it keeps in host memory, the NVMe tier writes its
 * own straight from the mapping, so a base the host cannot hold loads. */
static mt_status_t read_quant_homes(eng_model_t *m, const eng_checkpoint_t *ck, float **host, bool *pending,
                                    mt_error_t *err) {
    const eng_lora_quant_t *qo = &m->lora.quant;
    float *tmp = NULL;
    size_t tmp_n = 0;
    mt_status_t st = MT_OK;
    for (int i = 0; i < m->spec.count && st == MT_OK; i++) {
        eng_param_t *p = &m->params[i];
        if (!p->quant_ok) continue;
        const eng_ckpt_entry_t *e = eng_checkpoint_find(ck, p->spec->name);
        if (e && e->tensor->dtype == ENG_ST_F8_E4M3) {
            st = fp8_home(ck, e, p, err);
            if (st == MT_OK) drop_plain_home(p, &host[i]);
            *pending |= st == MT_OK;
            continue;
        }
        if (eng_checkpoint_is_bnb4(ck, e)) {
            st = bnb4_home(ck, e, p, err);
            if (st == MT_OK) drop_plain_home(p, &host[i]);
            continue;
        }
        const eng_ckpt_entry_t *mb, *ms;
        int64_t mshape[3];
        if (!e && eng_checkpoint_find_mxfp4(ck, p->spec->name, &mb, &ms, mshape)) {
            st = mxfp4_home(ck, mb, ms, mshape, p, err);
            if (st == MT_OK) drop_plain_home(p, &host[i]);
            *pending |= st == MT_OK;
            continue;
        }
        if (!qo->load_in_4bit) continue;
        if (p->spec->numel > tmp_n) {
            free(tmp);
            tmp_n = p->spec->numel;
            tmp = malloc(tmp_n * sizeof *tmp);
            MT_CHECK_ALLOC(tmp, "checkpoint read buffer");
        }
        st = eng_checkpoint_read_f32(ck, p->spec->name, p->spec->ndim, p->spec->shape, tmp, err);
        if (st != MT_OK) break;
        eng_quant_home_t *h = malloc(sizeof *h);
        MT_CHECK_ALLOC(h, p->spec->name);
        const int64_t cols = p->spec->shape[p->spec->ndim - 1], rows = (int64_t)p->spec->numel / cols;
        st = eng_quant_home_bnb4(h, tmp, rows, cols, qo->format, qo->double_quant, p->spec->name, err);
        if (st != MT_OK) {
            free(h);
            break;
        }
        p->home_q = h;
        drop_plain_home(p, &host[i]);
    }
    free(tmp);
    return st;
}

/* The quantised format the checkpoint stores weights in, for full
 * fine-tuning's note ("FP8", "bitsandbytes 4-bit"), or NULL. */
static const char *stored_quant(const eng_checkpoint_t *ck) {
    for (int i = 0; i < ck->count; i++) {
        if (ck->entries[i].tensor->dtype == ENG_ST_F8_E4M3) return "FP8";
        if (eng_checkpoint_is_bnb4(ck, &ck->entries[i])) return "bitsandbytes 4-bit";
    }
    return NULL;
}

mt_status_t eng_model_read_weights(eng_model_t *m, const char *dir, mt_error_t *err) {
    float **host = calloc((size_t)m->spec.count, sizeof *host);
    MT_CHECK_ALLOC(host, "checkpoint staging table");
    for (int i = 0; i < m->spec.count; i++) host[i] = m->params[i].host_w; /* NULL: a bf16 home, below */
    eng_checkpoint_t ck;
    mt_status_t st = eng_checkpoint_open(dir, &ck, err);
    if (st != MT_OK) {
        free(host);
        return st;
    }
    st = eng_checkpoint_resolve(&ck, &m->spec, err);
    m->storage_dtype = checkpoint_dtype(&ck, &m->spec);
    bool quant_pending = false;
    if (st == MT_OK && m->lora.on) st = read_quant_homes(m, &ck, host, &quant_pending, err);
    const char *stored = st == MT_OK && !m->lora.on ? stored_quant(&ck) : NULL;
    if (stored)
        fprintf(stderr, "moetune: note: %s stores weights in %s; full fine-tuning dequantises them on load (trained "
                "weights need fp32 masters); a LoRA run keeps its frozen base in %s\n", dir, stored, stored);
    eng_ckpt_load_report_t report = {0};
    if (st == MT_OK) st = eng_checkpoint_load(&ck, &m->spec, host, &report, err);
    if (st == MT_OK && m->spec.num_buffers > 0) st = eng_checkpoint_load_buffers(&ck, &m->spec, m->buffer_host, err);
    bool keep_open = false;
    if (st == MT_OK) st = read_bf16_homes(m, &ck, &keep_open, err);
    if (st == MT_OK && report.unexpected_count > 0)
        fprintf(stderr, "moetune: note: %d tensor(s) in %s are not used by %s (first: %s)\n",
                report.unexpected_count, dir, m->cfg.model_type, report.unexpected[0]);
    eng_ckpt_load_report_free(&report);
    if (st == MT_OK && (keep_open || quant_pending)) {
        m->mapped_base = malloc(sizeof *m->mapped_base);
        MT_CHECK_ALLOC(m->mapped_base, "checkpoint mapping");
        *m->mapped_base = ck; /* homes point into its mapping, or read from it when placed */
    } else {
        eng_checkpoint_close(&ck);
    }
    free(host);
    return st;
}

void eng_model_release(eng_model_t *m) {
    if (m->params) {
        for (int i = 0; i < m->num_params; i++) {
            eng_param_t *p = &m->params[i];
            free(p->host_w);
            free(p->work_bf16);
            if (!p->home_mapped) free(p->home_bf16);
            eng_quant_home_free(p->home_q);
            free(p->home_q);
            free(p->host_mom);
        }
        free(m->params);
    }
    if (m->buffer_host) {
        for (int i = 0; i < m->spec.num_buffers; i++) free(m->buffer_host[i]);
        free(m->buffer_host);
    }
    if (m->layers) {
        for (int l = 0; l < m->cfg.num_hidden_layers; l++) {
            free(m->layers[l].exp_gate);
            free(m->layers[l].exp_up);
            free(m->layers[l].exp_down);
        }
        free(m->layers);
    }
    if (m->mapped_base) {
        eng_checkpoint_close(m->mapped_base);
        free(m->mapped_base);
    }
    eng_lora_plan_free(&m->lora.plan);
    free(m->lora.specs);
    eng_lora_weights_free(&m->lora.init);
    eng_model_desc_free(&m->spec);
    eng_model_config_free(&m->cfg);
    memset(m, 0, sizeof *m);
}

mt_dtype_t eng_save_dtype(const eng_model_t *m, const eng_run_config_t *rc) {
    switch (rc->save_dtype) {
    case ENG_SAVE_DTYPE_F32: return MT_F32;
    case ENG_SAVE_DTYPE_BF16: return MT_BF16;
    case ENG_SAVE_DTYPE_F16: return MT_F16;
    case ENG_SAVE_DTYPE_AUTO:
    default: return m->storage_dtype;
    }
}
