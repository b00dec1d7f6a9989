/* Model descriptions: the published parameter counts of real models (from
 * their config.json), HF names and storage dtypes, the saved activations
 * of a layer counted by hand, and what the scheduler receives from a
 * description (every parameter as a weight, the layer's activations as the
 * description lists them, LoRA adapters and their names, an unknown LoRA
 * target refused naming the family's modules), and a non-trainable buffer
 * through the checkpoint saver, loader and `inspect`. */
#include "engine/model_desc.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/checkpoint.h"
#include "engine/config.h"
#include "engine/inspect.h"
#include "engine/program.h"
#include "scheduler/registry.h"

static int failures;
#define EXPECT(c, ...)                                                                  \
    do {                                                                                \
        if (!(c)) {                                                                     \
            fprintf(stderr, "%s:%d: expectation failed: %s: ", __FILE__, __LINE__, #c); \
            fprintf(stderr, __VA_ARGS__);                                               \
            fprintf(stderr, "\n");                                                      \
            failures++;                                                                 \
        }                                                                               \
    } while (0)

/* 2 layers, hidden 8, 2 heads of 4 (1 KV head), 4 experts top-2 of width 6, vocab 16 */
static const char *k_tiny =
    "{\"model_type\": \"mixtral\", \"vocab_size\": 16, \"hidden_size\": 8, \"intermediate_size\": 6,"
    " \"num_hidden_layers\": 2, \"num_attention_heads\": 2, \"num_key_value_heads\": 1,"
    " \"num_local_experts\": 4, \"num_experts_per_tok\": 2, \"rms_norm_eps\": 1e-5, \"rope_theta\": 10000.0,"
    " \"max_position_embeddings\": 64, \"tie_word_embeddings\": false}";

static bool load(const char *name, eng_model_config_t *cfg) {
    char dir[256];
    snprintf(dir, sizeof dir, "configs/models/%s", name);
    mt_error_t err = {0};
    mt_status_t st = eng_model_config_load(dir, NULL, cfg, &err);
    EXPECT(st == MT_OK, "%s: %s", dir, err.msg);
    return st == MT_OK;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(const char *const *)a, *(const char *const *)b); }

/* The scheduler's list from a description: every parameter once as a
 * weight (same name and size), and each layer's saved activations exactly
 * the description's plus the layer input. */
static void check_program(const char *what, const eng_model_config_t *cfg, const eng_model_desc_t *d, int T) {
    eng_run_config_t rc;
    eng_run_config_defaults(&rc);
    rc.micro_batch_size = 1;
    rc.sequence_len = T;
    rc.gradient_accumulation_steps = 1;
    sched_program_t prog;
    sched_run_shape_t shape;
    sched_registry_t r;
    mt_error_t err = {0};
    mt_status_t st = eng_program_describe(cfg, &rc, false, &prog, &shape, &err);
    EXPECT(st == MT_OK, "%s: %s", what, err.msg);
    if (st != MT_OK) return;
    st = sched_registry_build(&prog, &shape, &r, &err);
    sched_program_free(&prog);
    EXPECT(st == MT_OK, "%s: %s", what, err.msg);
    if (st != MT_OK) return;
    const char **a = malloc((size_t)d->count * sizeof *a), **b = malloc((size_t)r.num_tensors * sizeof *b);
    int nb = 0;
    for (int i = 0; i < d->count; i++) a[i] = d->params[i].name;
    for (int i = 0; i < r.num_tensors; i++)
        if (r.tensors[i].kind == SCHED_T_WEIGHT) {
            b[nb++] = r.tensors[i].name;
            const int p = eng_model_desc_find(d, r.tensors[i].name);
            EXPECT(p >= 0 && (int64_t)d->params[p].numel == r.tensors[i].numel, "%s: weight %s not described as such",
                   what, r.tensors[i].name);
        }
    EXPECT(nb == d->count, "%s: %d weights for %d described parameters", what, nb, d->count);
    qsort(a, (size_t)d->count, sizeof *a, cmp_str);
    qsort(b, (size_t)nb, sizeof *b, cmp_str);
    for (int i = 0; i < d->count && i < nb; i++)
        if (strcmp(a[i], b[i]) != 0) {
            EXPECT(false, "%s: described %s, scheduled %s", what, a[i], b[i]);
            break;
        }
    free(a);
    free(b);
    for (int l = 0; l < cfg->num_hidden_layers; l++) {
        const double want = (double)eng_model_desc_layer_act_bytes(d, l, T, MT_F32, 1) + 4.0 * T * cfg->hidden_size;
        EXPECT(r.blocks[l + 1].act_saved_bytes == want, "%s layer %d: scheduled %g bytes of activations, described %g",
               what, l, r.blocks[l + 1].act_saved_bytes, want);
        EXPECT(r.blocks[l + 1].act_tensors == d->layer_acts[l].count + 1, "%s layer %d: %d activations, described %d",
               what, l, r.blocks[l + 1].act_tensors, d->layer_acts[l].count);
    }
    sched_registry_free(&r);
}

static void test_real_models(void) {
    const struct {
        const char *dir, *family;
        double params;
    } models[] = {
        /* the checkpoints' tensor counts */
        {"mixtral-8x7b", "Mixtral", 46702792704.0},
        {"qwen3-30b-a3b", "Qwen3-MoE", 30532122624.0},
        {"olmoe-1b-7b", "OLMoE", 6919161856.0},
    };
    for (size_t i = 0; i < sizeof models / sizeof models[0]; i++) {
        eng_model_config_t cfg;
        if (!load(models[i].dir, &cfg)) continue;
        eng_model_desc_t d;
        mt_error_t err = {0};
        mt_status_t st = eng_model_desc_build(&cfg, &d, &err);
        EXPECT(st == MT_OK, "%s: %s", models[i].dir, err.msg);
        if (st == MT_OK) {
            EXPECT((double)eng_model_desc_numel(&d) == models[i].params, "%s: %zu parameters", models[i].dir,
                   eng_model_desc_numel(&d));
            EXPECT(strcmp(eng_model_desc_family_name(&d), models[i].family) == 0, "%s: family %s", models[i].dir,
                   eng_model_desc_family_name(&d));
            EXPECT(d.num_buffers == 0, "%s: %d buffers", models[i].dir, d.num_buffers);
            for (int p = 0; p < d.count; p++)
                EXPECT(d.params[p].dtype == MT_BF16 && d.params[p].trainable && d.params[p].kind == ENG_TENSOR_PARAM,
                       "%s: %s stored as %s", models[i].dir, d.params[p].name, mt_dtype_name(d.params[p].dtype));
            check_program(models[i].dir, &cfg, &d, 8);
            eng_model_desc_free(&d);
        }
        eng_model_config_free(&cfg);
    }
    /* Mixtral's experts by where they sit */
    eng_model_config_t cfg;
    if (!load("mixtral-8x7b", &cfg)) return;
    eng_model_desc_t d;
    mt_error_t err = {0};
    if (eng_model_desc_build(&cfg, &d, &err) != MT_OK) {
        EXPECT(false, "%s", err.msg);
        eng_model_config_free(&cfg);
        return;
    }
    int w2 = eng_model_desc_find_role(&d, 1, ENG_P_EXP_DOWN, 3);
    EXPECT(w2 >= 0 && strcmp(d.params[w2].name, "model.layers.1.block_sparse_moe.experts.3.w2.weight") == 0 &&
               d.params[w2].shape[0] == 4096 && d.params[w2].shape[1] == 14336,
           "expert 3's w2 of layer 1: %s", w2 >= 0 ? d.params[w2].name : "none");
    EXPECT(eng_model_desc_find_role(&d, 0, ENG_P_SHARED_GATE, -1) < 0, "Mixtral has no shared expert");
    EXPECT(eng_model_desc_find_role(&d, -1, ENG_P_LM_HEAD, -1) == d.count - 1, "lm_head last");
    eng_model_desc_note_dtype(&d, "lm_head.weight", MT_F32);
    EXPECT(d.params[d.count - 1].dtype == MT_F32, "the checkpoint's dtype replaces config.json's");

    /* LoRA r=8 on q_proj and v_proj: A (8, 4096) + B (4096, 8) + A (8, 4096) + B (1024, 8) per layer */
    eng_run_config_t rc;
    eng_run_config_defaults(&rc);
    rc.micro_batch_size = 1;
    rc.sequence_len = 4096;
    rc.gradient_accumulation_steps = 1;
    rc.adapter = ENG_ADAPTER_LORA;
    rc.lora_r = 8;
    rc.num_lora_target_modules = 2;
    snprintf(rc.lora_target_modules[0], sizeof rc.lora_target_modules[0], "q_proj");
    snprintf(rc.lora_target_modules[1], sizeof rc.lora_target_modules[1], "v_proj");
    sched_program_t prog;
    sched_run_shape_t shape;
    sched_registry_t r;
    mt_status_t st = eng_program_describe(&cfg, &rc, true, &prog, &shape, &err);
    if (st == MT_OK) {
        st = sched_registry_build(&prog, &shape, &r, &err);
        sched_program_free(&prog);
    }
    EXPECT(st == MT_OK, "%s", err.msg);
    if (st == MT_OK) {
        EXPECT(r.train_params == 32.0 * (32768 + 32768 + 32768 + 8192), "lora trainable %.0f", r.train_params);
        EXPECT(r.params == 46702792704.0, "adapters are not model parameters");
        EXPECT(r.kind_bytes[SCHED_T_MASTER] == 0, "fp32 adapters need no master copy");
        bool named = false;
        for (int i = 0; i < r.num_tensors; i++)
            named |= strcmp(r.tensors[i].name, "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight") == 0 &&
                     r.tensors[i].dtype == MT_F32 && r.tensors[i].trainable;
        EXPECT(named, "PEFT adapter names");
        /* FLOPs: a frozen linear's backward is its dX only, plus the adapters' */
        double fwd = -1, bwd = -1;
        for (int i = 0; i < r.num_ops; i++)
            if (strcmp(r.ops[i].name, "L0.k_proj.fwd") == 0) fwd = r.ops[i].flops;
            else if (strcmp(r.ops[i].name, "L0.k_proj.bwd") == 0) bwd = r.ops[i].flops;
        EXPECT(fwd == 2.0 * 4096 * 1024 * 4096 && bwd == fwd, "frozen k_proj flops %g / %g", fwd, bwd);
        sched_registry_free(&r);
    }
    snprintf(rc.lora_target_modules[1], sizeof rc.lora_target_modules[1], "gate_proj"); /* Qwen's; Mixtral says w1 */
    st = eng_program_describe(&cfg, &rc, true, &prog, &shape, &err);
    EXPECT(st == MT_ERR_CONFIG && strstr(err.msg, "'gate_proj' matches no module") && strstr(err.msg, "w1, w2, w3"),
           "unknown target: %s", err.msg);
    if (st == MT_OK) sched_program_free(&prog);
    eng_run_config_free(&rc);
    eng_model_desc_free(&d);
    eng_model_config_free(&cfg);
}

static void test_tiny_acts(void) {
    eng_model_config_t cfg;
    mt_error_t err = {0};
    mt_status_t st = eng_model_config_parse(k_tiny, "tiny", NULL, &cfg, &err);
    EXPECT(st == MT_OK, "%s", err.msg);
    if (st != MT_OK) return;
    eng_model_desc_t d;
    st = eng_model_desc_build(&cfg, &d, &err);
    EXPECT(st == MT_OK, "%s", err.msg);
    if (st != MT_OK) {
        eng_model_config_free(&cfg);
        return;
    }
    /* parameters: embed 128; per layer norms 16, q 64, k 32, v 32, o 64, router 32, experts 576; norm 8, lm_head 128 */
    EXPECT(eng_model_desc_numel(&d) == 1896, "params %zu", eng_model_desc_numel(&d));
    EXPECT(eng_model_desc_active_numel(&d, &cfg) == 1896 - 2 * 2 * 144, "active %zu",
           eng_model_desc_active_numel(&d, &cfg));
    /* saved activations of a layer, element by element (n = 4 tokens, m = 8 rows):
     * mid 32, attn xn 32 + rstd 4, q 32, k 16, v 16, out 32, lse 8; mlp xn 32 + rstd 4,
     * logits 16, probs 16, topw 8, idx 8, counts 4, offsets 5, perm 8, inv 8,
     * xp 64, g 48, u 48, ep 64 -> 505 elements, 22 buffers */
    EXPECT(d.layer_acts[0].count == 22, "%d activations", d.layer_acts[0].count);
    EXPECT(eng_model_desc_layer_act_bytes(&d, 0, 4, MT_F32, 1) == 4 * 505, "fp32 bytes %zu",
           eng_model_desc_layer_act_bytes(&d, 0, 4, MT_F32, 1));
    /* bf16 storage: the products-only activations (attn xn 32, xp 64) at 2
     * bytes; the other 320 float elements and rstd, lse, logits, probs, topw
     * (56) stay fp32; idx, counts, offsets, perm, inv (33) are int32 */
    EXPECT(eng_model_desc_layer_act_bytes(&d, 1, 4, MT_BF16, 1) == 2 * 96 + 4 * 320 + 4 * 56 + 4 * 33, "bf16 bytes %zu",
           eng_model_desc_layer_act_bytes(&d, 1, 4, MT_BF16, 1));
    /* each buffer rounded up to 64 bytes: 22 buffers of at most 256 bytes */
    size_t aligned = 0;
    for (int i = 0; i < d.layer_acts[0].count; i++) aligned += (eng_act_numel(&d.layer_acts[0].act[i], 4) * 4 + 63) / 64 * 64;
    EXPECT(eng_model_desc_layer_act_bytes(&d, 0, 4, MT_F32, 64) == aligned && aligned > 4 * 505, "aligned %zu",
           eng_model_desc_layer_act_bytes(&d, 0, 4, MT_F32, 64));
    const eng_act_desc_t *c = eng_model_desc_act(&d, 0, ENG_A_EXPERT_COUNTS);
    EXPECT(c && c->cls == ENG_ACT_INT32 && eng_act_numel(c, 1000) == 4, "expert counts do not grow with n");
    EXPECT(!eng_model_desc_act(&d, 0, ENG_A_DENSE_G) && !eng_model_desc_act(&d, 0, ENG_A_Q_PRE),
           "a sparse layer without q/k norm saves no dense or pre-norm activations");
    check_program("tiny", &cfg, &d, 4);
    eng_model_desc_free(&d);
    eng_model_config_free(&cfg);
}

/* A buffer (as DeepSeek-V3's e_score_correction_bias will be) saved, found
 * expected by the loader, loaded with its values, shown by inspect. */
static void test_buffers(void) {
    eng_model_config_t cfg;
    mt_error_t err = {0};
    if (eng_model_config_parse(k_tiny, "tiny", NULL, &cfg, &err) != MT_OK) {
        EXPECT(false, "%s", err.msg);
        return;
    }
    eng_model_desc_t d;
    if (eng_model_desc_build(&cfg, &d, &err) != MT_OK) {
        EXPECT(false, "%s", err.msg);
        eng_model_config_free(&cfg);
        return;
    }
    d.buffers = calloc(1, sizeof *d.buffers);
    d.num_buffers = 1;
    eng_param_spec_t *bp = &d.buffers[0];
    snprintf(bp->name, sizeof bp->name, "model.layers.0.block_sparse_moe.gate.e_score_correction_bias");
    bp->role = ENG_P_ROUTER_BIAS, bp->kind = ENG_TENSOR_BUFFER, bp->layer = 0, bp->expert = -1;
    bp->ndim = 1, bp->shape[0] = 4, bp->numel = 4, bp->dtype = MT_F32, bp->trainable = false;
    const int n = d.count + 1;
    eng_ckpt_tensor_t *ts = calloc((size_t)n, sizeof *ts);
    float **data = calloc((size_t)n, sizeof *data);
    for (int i = 0; i < n; i++) {
        const eng_param_spec_t *p = i < d.count ? &d.params[i] : bp;
        data[i] = calloc(p->numel, sizeof(float));
        for (size_t j = 0; j < p->numel; j++) data[i][j] = 0.25f * (float)(i + j);
        ts[i] = (eng_ckpt_tensor_t){p->name, MT_F32, p->ndim, p->shape, data[i]};
    }
    const char *tmp = getenv("TEST_TMPDIR");
    char dir[512];
    snprintf(dir, sizeof dir, "%s/with_buffer", tmp ? tmp : "/tmp");
    mt_status_t st = eng_checkpoint_save(dir, cfg.config_json, ts, n, 0, &err);
    EXPECT(st == MT_OK, "save: %s", err.msg);
    eng_checkpoint_t ck;
    if (st == MT_OK && (st = eng_checkpoint_open(dir, &ck, &err)) == MT_OK) {
        float **dst = calloc((size_t)d.count, sizeof *dst);
        for (int i = 0; i < d.count; i++) dst[i] = calloc(d.params[i].numel, sizeof(float));
        eng_ckpt_load_report_t rep;
        st = eng_checkpoint_load(&ck, &d, dst, &rep, &err);
        EXPECT(st == MT_OK && rep.unexpected_count == 0, "load: %s, %d unexpected", err.msg, rep.unexpected_count);
        if (st == MT_OK) eng_ckpt_load_report_free(&rep);
        float buf[4] = {0};
        float *bdst[1] = {buf};
        st = eng_checkpoint_load_buffers(&ck, &d, bdst, &err);
        EXPECT(st == MT_OK && buf[0] == 0.25f * d.count && buf[3] == 0.25f * (d.count + 3), "buffer values %g %g: %s",
               buf[0], buf[3], err.msg);
        /* without the buffer in the description the checkpoint's tensor is unexpected */
        d.num_buffers = 0;
        st = eng_checkpoint_load(&ck, &d, dst, &rep, &err);
        EXPECT(st == MT_OK && rep.unexpected_count == 1 && strstr(rep.unexpected[0], "e_score_correction_bias"),
               "undescribed buffer: %d unexpected", rep.unexpected_count);
        if (st == MT_OK) eng_ckpt_load_report_free(&rep);
        d.num_buffers = 1;
        for (int i = 0; i < d.count; i++) free(dst[i]);
        free(dst);
        eng_checkpoint_close(&ck);
    }
    /* inspect describes the file from its own description: no buffers for Mixtral */
    char *out = NULL;
    size_t len = 0;
    FILE *mem = open_memstream(&out, &len);
    st = eng_inspect(dir, mem, &err);
    fclose(mem);
    char want[96];
    snprintf(want, sizeof want, "storage      (the checkpoint's) F32 %d; %d parameters, 0 buffers", d.count, d.count);
    EXPECT(st == MT_OK && strstr(out, "1 unexpected") && strstr(out, want), "inspect: %s\n%s", err.msg, out);
    free(out);
    for (int i = 0; i < n; i++) free(data[i]);
    free(data);
    free(ts);
    eng_model_desc_free(&d);
    eng_model_config_free(&cfg);
}

int main(void) {
    test_real_models();
    test_tiny_acts();
    test_buffers();
    if (failures) fprintf(stderr, "model_desc_test: %d failure(s)\n", failures);
    else printf("model_desc_test: all passed\n");
    return failures != 0;
}
