/* Checkpoint directories end to end, on tiny models written in
 * $TEST_TMPDIR: init_random (determinism, HF init rules), sharded and
 * single-file save -> load bit-identical, HF shard split and index format,
 * stale-file cleanup, bf16/f16 storage, every load error naming what it
 * should, and inspect's output. */
#include "engine/model/io/checkpoint.h"

#include <dirent.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine/model/io/init_random.h"
#include "engine/model/io/inspect.h"

typedef struct {
    int failures;
    char root[512];
} tctx_t;

#define EXPECT(t, cond, ...)                                                \
    do {                                                                    \
        if (!(cond)) {                                                      \
            fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond); \
            fprintf(stderr, __VA_ARGS__);                                   \
            fprintf(stderr, "\n");                                          \
            (t)->failures++;                                                \
        }                                                                   \
    } while (0)

/* Layers: 0 dense, 1 MoE (with shared expert), 2 dense; qkv bias; pad row 3. */
static const char *k_qwen2_tiny =
    "{\"model_type\":\"qwen2_moe\",\"vocab_size\":64,\"hidden_size\":32,\"intermediate_size\":48,"
    "\"moe_intermediate_size\":16,\"shared_expert_intermediate_size\":24,\"num_hidden_layers\":3,"
    "\"num_attention_heads\":4,\"num_key_value_heads\":2,\"num_experts\":4,"
    "\"num_experts_per_tok\":2,\"decoder_sparse_step\":2,\"pad_token_id\":3,"
    "\"initializer_range\":0.05}\n";

static const char *k_qwen3_30b_like =
    "{\"model_type\":\"qwen3_moe\",\"head_dim\":128,\"hidden_size\":2048,\"intermediate_size\":6144,"
    "\"moe_intermediate_size\":768,\"norm_topk_prob\":true,\"num_attention_heads\":32,"
    "\"num_experts\":128,\"num_experts_per_tok\":8,\"num_hidden_layers\":48,"
    "\"num_key_value_heads\":4,\"vocab_size\":151936}";

typedef struct {
    eng_model_config_t cfg;
    eng_model_desc_t spec;
    float **buf;
} model_t;

static void model_free(model_t *m) {
    for (int i = 0; m->buf && i < m->spec.count; i++) free(m->buf[i]);
    free(m->buf);
    eng_model_desc_free(&m->spec);
    eng_model_config_free(&m->cfg);
    memset(m, 0, sizeof *m);
}

/* Reads config.json and all weights of dir; report may be NULL. */
static mt_status_t model_load(const char *dir, model_t *m, eng_ckpt_load_report_t *report,
                              mt_error_t *err) {
    memset(m, 0, sizeof *m);
    mt_status_t st = eng_model_config_load(dir, NULL, &m->cfg, err);
    if (st != MT_OK) return st;
    st = eng_model_desc_build(&m->cfg, &m->spec, err);
    if (st != MT_OK) return st;
    m->buf = calloc((size_t)m->spec.count, sizeof *m->buf);
    for (int i = 0; i < m->spec.count; i++) m->buf[i] = malloc(m->spec.params[i].numel * sizeof(float) + 1);
    eng_checkpoint_t ck;
    st = eng_checkpoint_open(dir, &ck, err);
    if (st != MT_OK) return st;
    st = eng_checkpoint_load(&ck, &m->spec, m->buf, report, err);
    if (report && st == MT_OK) {
        /* names point into the checkpoint: copy what the tests look at */
        for (int i = 0; i < report->unexpected_count; i++)
            report->unexpected[i] = strdup(report->unexpected[i]);
    }
    eng_checkpoint_close(&ck);
    return st;
}

static bool same_bits(const model_t *a, const model_t *b) {
    if (a->spec.count != b->spec.count) return false;
    for (int i = 0; i < a->spec.count; i++)
        if (memcmp(a->buf[i], b->buf[i], a->spec.params[i].numel * sizeof(float)) != 0) return false;
    return true;
}

static eng_ckpt_tensor_t *tensors_of(const model_t *m, mt_dtype_t dt) {
    eng_ckpt_tensor_t *ts = calloc((size_t)m->spec.count, sizeof *ts);
    for (int i = 0; i < m->spec.count; i++) {
        const eng_param_spec_t *p = &m->spec.params[i];
        ts[i] = (eng_ckpt_tensor_t){p->name, dt, p->ndim, p->shape, m->buf[i]};
    }
    return ts;
}

static void sub(const tctx_t *t, char *out, size_t cap, const char *name) {
    snprintf(out, cap, "%s/%s", t->root, name);
}

/* Files in dir, space-separated and sorted, into out. */
static void list_dir(const char *dir, char *out, size_t cap) {
    struct dirent **names;
    int n = scandir(dir, &names, NULL, alphasort);
    size_t len = 0;
    out[0] = '\0';
    for (int i = 0; i < n; i++) {
        if (names[i]->d_name[0] != '.' && len < cap)
            len += (size_t)snprintf(out + len, cap - len, "%s ", names[i]->d_name);
        free(names[i]);
    }
    free(names);
}

static const float *param(const model_t *m, const char *name) {
    int i = eng_model_desc_find(&m->spec, name);
    return i >= 0 ? m->buf[i] : NULL;
}

static void test_init_random(tctx_t *t, model_t *ref) {
    char d1[600], d2[600], d3[600];
    sub(t, d1, sizeof d1, "rand_a");
    sub(t, d2, sizeof d2, "rand_b");
    sub(t, d3, sizeof d3, "rand_c");
    mt_error_t err = {0};
    EXPECT(t, eng_checkpoint_init_random(d1, k_qwen2_tiny, 7, &err) == MT_OK, "%s", err.msg);
    EXPECT(t, eng_checkpoint_init_random(d2, k_qwen2_tiny, 7, &err) == MT_OK, "%s", err.msg);
    EXPECT(t, eng_checkpoint_init_random(d3, k_qwen2_tiny, 8, &err) == MT_OK, "%s", err.msg);
    model_t b, c;
    EXPECT(t, model_load(d1, ref, NULL, &err) == MT_OK, "%s", err.msg);
    EXPECT(t, model_load(d2, &b, NULL, &err) == MT_OK, "%s", err.msg);
    EXPECT(t, model_load(d3, &c, NULL, &err) == MT_OK, "%s", err.msg);
    EXPECT(t, same_bits(ref, &b), "same seed must give bit-identical weights");
    EXPECT(t, !same_bits(ref, &c), "different seeds must differ");
    EXPECT(t, strcmp(ref->cfg.config_json, k_qwen2_tiny) == 0, "config.json written unchanged");
    model_free(&b);
    model_free(&c);

    const float *norm = param(ref, "model.layers.1.input_layernorm.weight");
    const float *bias = param(ref, "model.layers.0.self_attn.q_proj.bias");
    const float *emb = param(ref, "model.embed_tokens.weight");
    const float *fn = param(ref, "model.norm.weight");
    EXPECT(t, norm && bias && emb && fn, "expected tensors present");
    if (!norm || !bias || !emb || !fn) return;
    for (int k = 0; k < 32; k++) {
        EXPECT(t, norm[k] == 1.0f && fn[k] == 1.0f, "RMSNorm weights are ones");
        EXPECT(t, bias[k] == 0.0f, "biases are zero");
        EXPECT(t, emb[3 * 32 + k] == 0.0f, "padding row (pad_token_id 3) is zero");
    }
    /* normal(0, 0.05): over the experts' 4*3*16*32 = 6144 values the sample
     * std is within ~1% (1/sqrt(2n)) and the mean within 0.05/sqrt(n) = 6e-4
     * of the truth; 5% / 3e-3 leave room for any seed. */
    double s = 0, s2 = 0;
    size_t n = 0;
    for (int i = 0; i < ref->spec.count; i++) {
        const eng_param_spec_t *p = &ref->spec.params[i];
        if (p->expert < 0) continue;
        for (size_t k = 0; k < p->numel; k++, n++) {
            s += ref->buf[i][k];
            s2 += (double)ref->buf[i][k] * ref->buf[i][k];
        }
    }
    double mean = s / (double)n, sd = sqrt(s2 / (double)n - mean * mean);
    EXPECT(t, n == 6144 && fabs(mean) < 3e-3 && fabs(sd - 0.05) < 0.05 * 0.05,
           "expert init mean %g std %g over %zu values", mean, sd, n);
}

static void test_round_trip(tctx_t *t, const model_t *ref) {
    char d[600], names[4096];
    sub(t, d, sizeof d, "sharded");
    mt_error_t err = {0};
    eng_ckpt_tensor_t *ts = tensors_of(ref, MT_F32);
    /* 6000 bytes: the 8192-byte embedding and lm_head exceed it and get shards of their own */
    mt_status_t st = eng_checkpoint_save(d, ref->cfg.config_json, ts, ref->spec.count, 6000, &err);
    EXPECT(t, st == MT_OK, "%s", err.msg);
    list_dir(d, names, sizeof names);
    EXPECT(t, strstr(names, "model.safetensors.index.json") && !strstr(names, "model.safetensors ") &&
                  !strstr(names, ".tmp"),
           "files: %s", names);
    model_t back;
    EXPECT(t, model_load(d, &back, NULL, &err) == MT_OK, "%s", err.msg);
    EXPECT(t, same_bits(ref, &back), "sharded fp32 round trip must be bit-identical");
    model_free(&back);

    /* Index: sorted weight_map naming every tensor, total_size = sum of tensor bytes. */
    char ip[700];
    snprintf(ip, sizeof ip, "%s/model.safetensors.index.json", d);
    json_t *idx = json_load_file(ip, 0, NULL);
    json_t *wm = json_object_get(idx, "weight_map");
    json_int_t total = json_integer_value(json_object_get(json_object_get(idx, "metadata"), "total_size"));
    EXPECT(t, (int)json_object_size(wm) == ref->spec.count, "weight_map size %zu", json_object_size(wm));
    EXPECT(t, total == (json_int_t)(eng_model_desc_numel(&ref->spec) * 4), "total_size %lld",
           (long long)total);
    const char *emb_file = json_string_value(json_object_get(wm, "model.embed_tokens.weight"));
    int nshards = 0, idx0 = 0;
    EXPECT(t, emb_file && sscanf(emb_file, "model-%5d-of-%5d.safetensors", &idx0, &nshards) == 2 &&
                  idx0 == 1 && nshards > 3,
           "embedding shard %s", emb_file ? emb_file : "(none)");
    const char *lm_file = json_string_value(json_object_get(wm, "lm_head.weight"));
    const char *norm_file = json_string_value(json_object_get(wm, "model.norm.weight"));
    /* HF order: the oversized lm_head's own shard comes before the still-open
     * shard that holds model.norm.weight, which precedes it in the state dict */
    EXPECT(t, lm_file && norm_file && strcmp(lm_file, norm_file) < 0, "lm_head %s, norm %s",
           lm_file ? lm_file : "-", norm_file ? norm_file : "-");
    if (emb_file) {
        char sp[800];
        snprintf(sp, sizeof sp, "%s/%s", d, emb_file);
        eng_st_file_t f;
        if (eng_st_open(sp, &f, &err) == MT_OK) {
            EXPECT(t, f.count == 1, "oversized tensor alone in its shard (%d)", f.count);
            eng_st_close(&f);
        }
    }
    json_decref(idx);

    /* BF16 and F16 on disk: reload gives the rounded values exactly. */
    const mt_dtype_t dts[2] = {MT_BF16, MT_F16};
    for (int k = 0; k < 2; k++) {
        char dd[600];
        sub(t, dd, sizeof dd, k == 0 ? "as_bf16" : "as_f16");
        eng_ckpt_tensor_t *tl = tensors_of(ref, dts[k]);
        st = eng_checkpoint_save(dd, ref->cfg.config_json, tl, ref->spec.count, 0, &err);
        EXPECT(t, st == MT_OK, "%s", err.msg);
        free(tl);
        if (model_load(dd, &back, NULL, &err) != MT_OK) {
            EXPECT(t, false, "%s", err.msg);
            model_free(&back);
            continue;
        }
        int bad = 0;
        for (int i = 0; i < ref->spec.count; i++)
            for (size_t e = 0; e < ref->spec.params[i].numel; e++) {
                float x = ref->buf[i][e];
                float want = k == 0 ? mt_bf16_to_f32(mt_f32_to_bf16(x)) : mt_f16_to_f32(mt_f32_to_f16(x));
                bad += memcmp(&want, &back.buf[i][e], 4) != 0;
            }
        EXPECT(t, bad == 0, "%s reload: %d values differ from rounding", mt_dtype_name(dts[k]), bad);
        model_free(&back);
    }
    free(ts);
}

static void test_stale_files(tctx_t *t, const model_t *ref) {
    char d[600], names[4096];
    sub(t, d, sizeof d, "resave");
    mt_error_t err = {0};
    eng_ckpt_tensor_t *ts = tensors_of(ref, MT_F32);
    EXPECT(t, eng_checkpoint_save(d, ref->cfg.config_json, ts, ref->spec.count, 0, &err) == MT_OK,
           "%s", err.msg);
    EXPECT(t, eng_checkpoint_save(d, NULL, ts, ref->spec.count, 6000, &err) == MT_OK, "%s", err.msg);
    list_dir(d, names, sizeof names);
    EXPECT(t, !strstr(names, "model.safetensors ") && strstr(names, "-of-"),
           "single file replaced by shards: %s", names);
    int n_small = 0;
    for (const char *p = names; (p = strstr(p, "-of-")) != NULL; p++) n_small++;
    EXPECT(t, eng_checkpoint_save(d, NULL, ts, ref->spec.count, 20000, &err) == MT_OK, "%s", err.msg);
    list_dir(d, names, sizeof names);
    int n_big = 0, idx, tot, wrong_total = 0, first_total = -1;
    char *save = NULL, *copy = strdup(names);
    for (char *w = strtok_r(copy, " ", &save); w; w = strtok_r(NULL, " ", &save))
        if (sscanf(w, "model-%5d-of-%5d", &idx, &tot) == 2) {
            n_big++;
            if (first_total < 0) first_total = tot;
            wrong_total += tot != first_total;
        }
    free(copy);
    EXPECT(t, n_big > 1 && n_big < n_small && wrong_total == 0 && n_big == first_total,
           "stale shards removed: %d then %d files (%s)", n_small, n_big, names);
    model_t back;
    EXPECT(t, model_load(d, &back, NULL, &err) == MT_OK && same_bits(ref, &back), "reload: %s", err.msg);
    model_free(&back);
    EXPECT(t, eng_checkpoint_save(d, NULL, ts, ref->spec.count, 0, &err) == MT_OK, "%s", err.msg);
    list_dir(d, names, sizeof names);
    EXPECT(t, strstr(names, "model.safetensors ") && !strstr(names, "index") && !strstr(names, "-of-"),
           "shards and index replaced by a single file: %s", names);
    free(ts);
}

static void expect_msg(tctx_t *t, int line, mt_status_t st, const mt_error_t *err, mt_status_t code,
                       const char *a, const char *b, const char *c) {
    const char *need[3] = {a, b, c};
    bool ok = st == code;
    for (int i = 0; i < 3; i++) ok &= !need[i] || strstr(err->msg, need[i]) != NULL;
    if (!ok) {
        fprintf(stderr, "FAIL line %d: got %s '%s', want %s naming '%s' '%s' '%s'\n", line,
                mt_status_name(st), err->msg, mt_status_name(code), a ? a : "", b ? b : "",
                c ? c : "");
        t->failures++;
    }
}

static void write_text(const char *path, const char *text) {
    FILE *fp = fopen(path, "w");
    fputs(text, fp);
    fclose(fp);
}

static void test_errors(tctx_t *t, const model_t *ref) {
    mt_error_t err = {0};
    model_t m;
    char d[600], p[800];
    eng_ckpt_tensor_t *ts = tensors_of(ref, MT_F32);
    int n = ref->spec.count;

    /* a shard named in the index is missing */
    sub(t, d, sizeof d, "missing_shard");
    eng_checkpoint_save(d, ref->cfg.config_json, ts, n, 6000, &err);
    char names[4096], shard2[64] = "";
    list_dir(d, names, sizeof names);
    const char *s2 = strstr(names, "model-00002-of-");
    if (s2) snprintf(shard2, sizeof shard2, "%.32s", s2);
    snprintf(p, sizeof p, "%s/%s", d, shard2);
    unlink(p);
    mt_status_t st = model_load(d, &m, NULL, &err);
    expect_msg(t, __LINE__, st, &err, MT_ERR_IO, d, shard2, "missing");
    model_free(&m);

    /* the index lists a tensor its shard does not hold */
    sub(t, d, sizeof d, "index_liar");
    eng_checkpoint_save(d, ref->cfg.config_json, ts, n, 6000, &err);
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", d);
    json_t *idx = json_load_file(p, 0, NULL);
    json_t *wmap = json_object_get(idx, "weight_map");
    char realname[64];
    snprintf(realname, sizeof realname, "%s",
             json_string_value(json_object_get(wmap, "lm_head.weight")));
    json_object_set_new(wmap, "model.extra.weight", json_string(realname));
    json_dump_file(idx, p, JSON_INDENT(2));
    json_decref(idx);
    st = model_load(d, &m, NULL, &err);
    expect_msg(t, __LINE__, st, &err, MT_ERR_FORMAT, "'model.extra.weight'", realname, d);
    model_free(&m);

    /* a parameter is missing */
    sub(t, d, sizeof d, "missing_tensor");
    int gi = eng_model_desc_find(&ref->spec, "model.layers.1.mlp.gate.weight");
    eng_ckpt_tensor_t *fewer = calloc((size_t)n, sizeof *fewer);
    int k = 0;
    for (int i = 0; i < n; i++)
        if (i != gi) fewer[k++] = ts[i];
    eng_checkpoint_save(d, ref->cfg.config_json, fewer, k, 0, &err);
    st = model_load(d, &m, NULL, &err);
    expect_msg(t, __LINE__, st, &err, MT_ERR_FORMAT, "'model.layers.1.mlp.gate.weight'", d, "missing");
    model_free(&m);
    /* inspect reports it, then fails naming it (scripts rely on the exit code) */
    char *out = NULL;
    size_t outlen = 0;
    FILE *mem = open_memstream(&out, &outlen);
    st = eng_inspect(d, mem, &err);
    fclose(mem);
    EXPECT(t, st == MT_ERR_FORMAT && strstr(out, "1 missing") && strstr(out, "model.layers.1.mlp.gate.weight") &&
                  strstr(err.msg, "missing tensor 'model.layers.1.mlp.gate.weight'"),
           "inspect of a checkpoint missing a tensor: %s\n%s", err.msg, out);
    free(out);

    /* a tensor's shape disagrees with config.json: k_proj is (2*8, 32); store it as (32, 16) */
    sub(t, d, sizeof d, "wrong_shape");
    int ki = eng_model_desc_find(&ref->spec, "model.layers.0.self_attn.k_proj.weight");
    const int64_t swapped[2] = {32, 16};
    memcpy(fewer, ts, (size_t)n * sizeof *ts);
    fewer[ki].shape = swapped;
    eng_checkpoint_save(d, ref->cfg.config_json, fewer, n, 0, &err);
    st = model_load(d, &m, NULL, &err);
    expect_msg(t, __LINE__, st, &err, MT_ERR_FORMAT, "'model.layers.0.self_attn.k_proj.weight'",
               "[32, 16]", "[16, 32]");
    model_free(&m);

    /* an extra tensor is ignored but reported */
    sub(t, d, sizeof d, "extra");
    eng_ckpt_tensor_t *more = calloc((size_t)n + 1, sizeof *more);
    memcpy(more, ts, (size_t)n * sizeof *ts);
    const int64_t inv_shape[1] = {4};
    const float inv[4] = {1, 2, 3, 4};
    more[n] = (eng_ckpt_tensor_t){"model.layers.0.self_attn.rotary_emb.inv_freq", MT_F32, 1, inv_shape, inv};
    eng_checkpoint_save(d, ref->cfg.config_json, more, n + 1, 0, &err);
    eng_ckpt_load_report_t rep;
    st = model_load(d, &m, &rep, &err);
    EXPECT(t, st == MT_OK && rep.unexpected_count == 1 &&
                  strcmp(rep.unexpected[0], "model.layers.0.self_attn.rotary_emb.inv_freq") == 0,
           "extra tensor: %s (count %d)", err.msg, rep.unexpected_count);
    EXPECT(t, same_bits(ref, &m), "extra tensor changes nothing else");
    for (int i = 0; i < rep.unexpected_count; i++) free((void *)rep.unexpected[i]);
    eng_ckpt_load_report_free(&rep);
    model_free(&m);
    free(more);

    /* a dtype that is not F32/BF16/F16 */
    sub(t, d, sizeof d, "int_dtype");
    mkdir(d, 0755);
    snprintf(p, sizeof p, "%s/config.json", d);
    write_text(p, ref->cfg.config_json);
    eng_st_write_tensor_t *w = calloc((size_t)n, sizeof *w);
    for (int i = 0; i < n; i++)
        w[i] = (eng_st_write_tensor_t){ts[i].name, i == ki ? ENG_ST_I32 : ENG_ST_F32, ts[i].ndim,
                                       ts[i].shape, i == ki ? (const void *)ts[i].data : NULL,
                                       i == ki ? NULL : ts[i].data};
    snprintf(p, sizeof p, "%s/model.safetensors", d);
    st = eng_st_write(p, w, n, NULL, 0, &err);
    EXPECT(t, st == MT_OK, "%s", err.msg);
    free(w);
    st = model_load(d, &m, NULL, &err);
    expect_msg(t, __LINE__, st, &err, MT_ERR_UNSUPPORTED, "'model.layers.0.self_attn.k_proj.weight'",
               "I32", p);
    model_free(&m);

    /* no config.json; no weights; a .bin checkpoint */
    sub(t, d, sizeof d, "no_config");
    eng_checkpoint_save(d, NULL, ts, n, 0, &err);
    st = model_load(d, &m, NULL, &err);
    snprintf(p, sizeof p, "%s/config.json", d);
    expect_msg(t, __LINE__, st, &err, MT_ERR_IO, p, NULL, NULL);
    model_free(&m);
    sub(t, d, sizeof d, "config_only");
    eng_checkpoint_save(d, ref->cfg.config_json, NULL, 0, 0, &err);
    snprintf(p, sizeof p, "%s/model.safetensors", d);
    unlink(p);
    st = model_load(d, &m, NULL, &err);
    expect_msg(t, __LINE__, st, &err, MT_ERR_IO, d, "model.safetensors", NULL);
    model_free(&m);
    snprintf(p, sizeof p, "%s/pytorch_model.bin", d);
    write_text(p, "not really");
    st = model_load(d, &m, NULL, &err);
    expect_msg(t, __LINE__, st, &err, MT_ERR_UNSUPPORTED, d, "pytorch_model.bin", NULL);
    model_free(&m);
    free(fewer);
    free(ts);
}

static void test_inspect(tctx_t *t) {
    char d[600];
    mt_error_t err = {0};
    char *out = NULL;
    size_t len = 0;
    sub(t, d, sizeof d, "rand_a");
    FILE *mem = open_memstream(&out, &len);
    mt_status_t st = eng_inspect(d, mem, &err);
    fclose(mem);
    EXPECT(t, st == MT_OK, "%s", err.msg);
    EXPECT(t, strstr(out, "qwen2_moe") && strstr(out, "MoE layers   1 of 3 (index 1);") && strstr(out, "dense (width 48): 0,2") &&
                  strstr(out, "F32") && strstr(out, "all 53 tensors present") &&
                  strstr(out, "4 routed, top-2"),
           "inspect output:\n%s", out);
    free(out);

    /* 128 experts x 48 layers from config.json alone: compact, exact count */
    sub(t, d, sizeof d, "qwen3_config_only");
    mkdir(d, 0755);
    char p[700];
    snprintf(p, sizeof p, "%s/config.json", d);
    write_text(p, k_qwen3_30b_like);
    mem = open_memstream(&out, &len);
    st = eng_inspect(d, mem, &err);
    fclose(mem);
    int lines = 0;
    for (const char *c = out; c && *c; c++) lines += *c == '\n';
    EXPECT(t, st == MT_OK && strstr(out, "30532122624") && strstr(out, "none (config.json only)") &&
                  strstr(out, "0-47") && lines < 40,
           "%s: %d lines:\n%s", err.msg, lines, out);
    free(out);
}

/* DeepSeek-V3's FP8 weights: an F8_E4M3 weight with a sibling
 * weight_scale_inv (128 x 128 blocks, partial at the edges) reads as
 * fp8 * scale_inv per block; a scale grid of the wrong shape, and a NaN
 * code, are refused naming the file and tensor. */
static void test_fp8(tctx_t *t) {
    char d[600], p[700];
    snprintf(d, sizeof d, "%s/fp8", t->root);
    mkdir(d, 0755);
    const int64_t R = 130, C = 200, wshape[2] = {R, C}, sshape[2] = {2, 2}, bad_shape[2] = {1, 2};
    uint8_t *w = malloc((size_t)(R * C));
    for (int64_t i = 0; i < R * C; i++) w[i] = (uint8_t)(i % 7 == 0 ? 0xB8 : 0x30 + i % 8); /* -1, 0.5 .. 0.9375 */
    const float scale[4] = {0.5f, 2.0f, 4.0f, 0.125f};
    eng_st_write_tensor_t ts[2] = {
        {"model.layers.0.self_attn.kv_b_proj.weight", ENG_ST_F8_E4M3, 2, wshape, w, NULL},
        {"model.layers.0.self_attn.kv_b_proj.weight_scale_inv", ENG_ST_F32, 2, sshape, NULL, scale},
    };
    snprintf(p, sizeof p, "%s/model.safetensors", d);
    mt_error_t err = {0};
    mt_status_t st = eng_st_write(p, ts, 2, NULL, 0, &err);
    EXPECT(t, st == MT_OK, "%s", err.msg);
    float *out = malloc((size_t)(R * C) * sizeof *out);
    eng_checkpoint_t ck;
    if (st == MT_OK && (st = eng_checkpoint_open(d, &ck, &err)) == MT_OK) {
        st = eng_checkpoint_read_f32(&ck, ts[0].name, 2, wshape, out, &err);
        EXPECT(t, st == MT_OK, "%s", err.msg);
        int bad = 0;
        for (int64_t r = 0; r < R && st == MT_OK; r++)
            for (int64_t c = 0; c < C; c++) {
                const uint8_t b = w[r * C + c];
                const float v = b == 0xB8 ? -1.0f : 0.5f * (1.0f + (float)(b & 7) / 8.0f);
                bad += out[r * C + c] != v * scale[(r / 128) * 2 + c / 128];
            }
        EXPECT(t, bad == 0, "%d values differ from fp8 * scale_inv", bad);
        eng_checkpoint_close(&ck);
    }
    ts[1].shape = bad_shape;
    w[5] = 0x7F; /* NaN */
    st = eng_st_write(p, ts, 2, NULL, 0, &err);
    if (st == MT_OK && (st = eng_checkpoint_open(d, &ck, &err)) == MT_OK) {
        st = eng_checkpoint_read_f32(&ck, ts[0].name, 2, wshape, out, &err);
        EXPECT(t, st == MT_ERR_FORMAT && strstr(err.msg, "model.safetensors") && strstr(err.msg, "kv_b_proj.weight") &&
                      strstr(err.msg, "needs [2, 2]"),
               "scale grid: %s", err.msg);
        eng_checkpoint_close(&ck);
    }
    ts[1].shape = sshape;
    st = eng_st_write(p, ts, 2, NULL, 0, &err);
    if (st == MT_OK && (st = eng_checkpoint_open(d, &ck, &err)) == MT_OK) {
        st = eng_checkpoint_read_f32(&ck, ts[0].name, 2, wshape, out, &err);
        EXPECT(t, st == MT_ERR_FORMAT && strstr(err.msg, "non-finite") && strstr(err.msg, "kv_b_proj.weight"),
               "NaN code: %s", err.msg);
        eng_checkpoint_close(&ck);
    }
    free(out);
    free(w);
}

/* gpt-oss's MXFP4 experts: NAME_blocks (E, R, G, 16) and NAME_scales
 * (E, R, G) read as NAME (E, G*32, R), transformers' layout; a NaN scale
 * is refused naming the scales tensor. */
static void test_mxfp4(tctx_t *t) {
    char d[600], p[700];
    snprintf(d, sizeof d, "%s/mxfp4", t->root);
    mkdir(d, 0755);
    const int64_t E = 2, R = 3, G = 2, bshape[4] = {E, R, G, 16}, sshape[3] = {E, R, G}, want[3] = {E, G * 32, R};
    uint8_t blocks[2 * 3 * 2 * 16], scales[2 * 3 * 2];
    for (size_t i = 0; i < sizeof blocks; i++) blocks[i] = (uint8_t)(i * 29 + 7);
    for (size_t i = 0; i < sizeof scales; i++) scales[i] = (uint8_t)(125 + i % 5);
    eng_st_write_tensor_t ts[2] = {
        {"model.layers.0.mlp.experts.gate_up_proj_blocks", ENG_ST_U8, 4, bshape, blocks, NULL},
        {"model.layers.0.mlp.experts.gate_up_proj_scales", ENG_ST_U8, 3, sshape, scales, NULL},
    };
    snprintf(p, sizeof p, "%s/model.safetensors", d);
    mt_error_t err = {0};
    mt_status_t st = eng_st_write(p, ts, 2, NULL, 0, &err);
    EXPECT(t, st == MT_OK, "%s", err.msg);
    float out[2 * 64 * 3];
    eng_checkpoint_t ck;
    const char *name = "model.layers.0.mlp.experts.gate_up_proj";
    if (st == MT_OK && (st = eng_checkpoint_open(d, &ck, &err)) == MT_OK) {
        st = eng_checkpoint_read_f32(&ck, name, 3, want, out, &err);
        EXPECT(t, st == MT_OK, "%s", err.msg);
        static const float k_e2m1[16] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6, -0.0f, -0.5f, -1, -1.5f, -2, -3, -4, -6};
        int bad = 0;
        for (int64_t e = 0; e < E && st == MT_OK; e++)
            for (int64_t r = 0; r < R; r++)
                for (int64_t k = 0; k < G * 32; k++) {
                    const uint8_t byte = blocks[((e * R + r) * G + k / 32) * 16 + (k % 32) / 2];
                    const float v = k_e2m1[k % 2 ? byte >> 4 : byte & 0xF] *
                                    ldexpf(1.0f, scales[(e * R + r) * G + k / 32] - 127);
                    bad += out[(e * G * 32 + k) * R + r] != v;
                }
        EXPECT(t, bad == 0, "%d values differ from e2m1 * 2^(scale - 127) at [e, k, r]", bad);
        const int64_t wrong[3] = {E, R, G * 32};
        st = eng_checkpoint_read_f32(&ck, name, 3, wrong, out, &err);
        EXPECT(t, st == MT_ERR_FORMAT && strstr(err.msg, "gate_up_proj_blocks") && strstr(err.msg, "[2, 64, 3]"),
               "shape: %s", err.msg);
        eng_checkpoint_close(&ck);
    }
    scales[4] = 0xFF;
    st = eng_st_write(p, ts, 2, NULL, 0, &err);
    if (st == MT_OK && (st = eng_checkpoint_open(d, &ck, &err)) == MT_OK) {
        st = eng_checkpoint_read_f32(&ck, name, 3, want, out, &err);
        EXPECT(t, st == MT_ERR_FORMAT && strstr(err.msg, "gate_up_proj_scales") && strstr(err.msg, "NaN"),
               "NaN scale: %s", err.msg);
        eng_checkpoint_close(&ck);
    }
}

int main(void) {
    tctx_t t = {0};
    const char *base = getenv("TEST_TMPDIR");
    snprintf(t.root, sizeof t.root, "%s/ckpt_test_%d", base ? base : "/tmp", (int)getpid());
    if (mkdir(t.root, 0755) != 0) {
        perror(t.root);
        return 2;
    }
    model_t ref;
    test_init_random(&t, &ref);
    if (ref.buf) {
        test_round_trip(&t, &ref);
        test_stale_files(&t, &ref);
        test_errors(&t, &ref);
    }
    test_inspect(&t);
    test_fp8(&t);
    test_mxfp4(&t);
    model_free(&ref);
    if (t.failures) {
        fprintf(stderr, "checkpoint_test: %d failure(s)\n", t.failures);
        return 1;
    }
    printf("checkpoint_test: all passed\n");
    return 0;
}
