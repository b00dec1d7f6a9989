/* Model descriptions: the published parameter counts of real models (from
 * their config.json), HF names and storage dtypes, the saved activations
 * of a layer counted by hand, and what the scheduler receives from a
 * description (every parameter as a weight, the layer's activations as the
 * description lists them, LoRA adapters and their names, an unknown LoRA
 * target refused naming the family's modules), and a non-trainable buffer
 * through the checkpoint saver, loader and `inspect`. */
#include "engine/model/desc/model_desc.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/model/io/checkpoint.h"
#include "engine/config/config.h"
#include "engine/model/io/inspect.h"
#include "engine/model/desc/program.h"
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
            /* a tensor fused over E (gpt-oss) is scheduled per expert as name[e], 1/E of it each;
             * expert 0 stands for the tensor */
            char base[256];
            snprintf(base, sizeof base, "%s", r.tensors[i].name);
            char *br = strchr(base, '[');
            int64_t parts = 1;
            if (br) {
                const bool first = strcmp(br, "[0]") == 0;
                *br = '\0';
                parts = cfg->num_experts;
                if (!first) continue;
            }
            const int p = eng_model_desc_find(d, base);
            EXPECT(p >= 0 && (int64_t)d->params[p].numel == r.tensors[i].numel * parts,
                   "%s: weight %s not described as such", what, r.tensors[i].name);
            b[nb++] = p >= 0 ? d->params[p].name : r.tensors[i].name;
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
            /* head dim 128: the tensor-core attention takes it, so a bf16 run
             * saves q, k, v and the output in bf16 (and fp32 ones in fp32) */
            for (eng_act_id_t id = ENG_A_Q; id <= ENG_A_ATT; id++) {
                const eng_act_desc_t *a = eng_model_desc_act(&d, 0, id);
                if (id == ENG_A_Q_PRE || id == ENG_A_K_PRE || id == ENG_A_Q_RSTD || id == ENG_A_K_RSTD) continue;
                EXPECT(a && eng_act_dtype(a->cls, MT_BF16) == MT_BF16 && eng_act_dtype(a->cls, MT_F32) == MT_F32,
                       "%s: %s not saved in the compute dtype", models[i].dir, a ? a->name : "(missing)");
            }
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
    /* bf16 storage: the products-only activations (attn xn 32, xp 64) and
     * the routed experts' outputs (g 48, u 48, ep 64) at 2 bytes; the other
     * 160 float elements and rstd, lse, logits, probs, topw (56) stay fp32;
     * idx, counts, offsets, perm, inv (33) are int32 */
    EXPECT(eng_model_desc_layer_act_bytes(&d, 1, 4, MT_BF16, 1) == 2 * 256 + 4 * 160 + 4 * 56 + 4 * 33, "bf16 bytes %zu",
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
    const eng_act_desc_t *q = eng_model_desc_act(&d, 0, ENG_A_Q);
    EXPECT(q && q->cls == ENG_ACT_FP32, "head dim 4 (the tensor-core attention refuses it): q saved fp32");
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


/* The families described for inspect and plan only: totals within 1% of
 * the published ones (DeepSeek-V3 without its MTP layer), active
 * parameters beside the vendors' figures under the convention each uses,
 * tensors as the Hub names and shapes them, buffers, and the scheduler's
 * list. */
static void test_described_families(void) {
    /* Vendors count active parameters differently: DeepSeek counts the
     * embedding table and the head whole (37B); OpenAI counts the head but
     * not the embedding table (3.61B, 5.13B in the gpt-oss model card);
     * Zhipu's 12B counts neither. */
    enum { ALL = 0, NO_EMBED, NO_EMBED_HEAD };
    static const char *const k_conv[] = {"embedding and head counted", "embedding table not counted",
                                         "embedding and head not counted"};
    const struct {
        const char *dir, *family;
        double total, active;
        int conv;
        int buffers;
    } models[] = {
        {"deepseek-v3", "DeepSeek-V3", 671e9, 37e9, ALL, 58},
        {"glm-4.5-air", "GLM-4.5", 106e9, 12e9, NO_EMBED_HEAD, 45},
        {"gpt-oss-20b", "gpt-oss", 20.91e9, 3.61e9, NO_EMBED, 0},
        {"gpt-oss-120b", "gpt-oss", 116.83e9, 5.13e9, NO_EMBED, 0},
    };
    for (size_t i = 0; i < sizeof models / sizeof models[0]; i++) {
        eng_model_config_t cfg;
        if (!load(models[i].dir, &cfg)) continue;
        eng_model_desc_t d;
        mt_error_t err = {0};
        mt_status_t st = eng_model_desc_build(&cfg, &d, &err);
        EXPECT(st == MT_OK, "%s: %s", models[i].dir, err.msg);
        if (st != MT_OK) {
            eng_model_config_free(&cfg);
            continue;
        }
        const double total = (double)eng_model_desc_numel(&d), active = (double)eng_model_desc_active_numel(&d, &cfg);
        const int ie = eng_model_desc_find_role(&d, -1, ENG_P_EMBED, -1), ih = eng_model_desc_find_role(&d, -1, ENG_P_LM_HEAD, -1);
        const double embed = ie >= 0 ? (double)d.params[ie].numel : 0, head = ih >= 0 ? (double)d.params[ih].numel : 0;
        const double conv[3] = {active, active - embed, active - embed - head};
        printf("%-13s total %.2fB (published %.2fB, %+.2f%%); active %.2fB with embedding and head, %.2fB without the "
               "embedding table, %.2fB without either; published %.2fB (%s)\n",
               models[i].dir, total / 1e9, models[i].total / 1e9, 100 * (total / models[i].total - 1), conv[0] / 1e9,
               conv[1] / 1e9, conv[2] / 1e9, models[i].active / 1e9, k_conv[models[i].conv]);
        EXPECT(fabs(total / models[i].total - 1) < 0.01, "%s: %.0f parameters, published %.0f", models[i].dir, total,
               models[i].total);
        /* within 3% under the vendor's convention: the figures are rounded (12B, 37B) */
        EXPECT(fabs(conv[models[i].conv] / models[i].active - 1) < 0.03, "%s: %.0f active (%s), published %.0f",
               models[i].dir, conv[models[i].conv], k_conv[models[i].conv], models[i].active);
        EXPECT(strcmp(eng_model_desc_family_name(&d), models[i].family) == 0, "%s: family %s", models[i].dir,
               eng_model_desc_family_name(&d));
        /* every family here has block code (DeepSeek: engine/layers/mla.c; GLM-4.5: rope_partial.c;
         * gpt-oss: gpt_oss.c) */
        EXPECT(eng_model_desc_trains(&d), "%s: described only, not trained", models[i].dir);
        EXPECT(d.num_buffers == models[i].buffers, "%s: %d buffers", models[i].dir, d.num_buffers);
        for (int b = 0; b < d.num_buffers; b++)
            EXPECT(d.buffers[b].kind == ENG_TENSOR_BUFFER && !d.buffers[b].trainable &&
                       d.buffers[b].role == ENG_P_ROUTER_BIAS && strstr(d.buffers[b].name, ".mlp.gate.e_score_correction_bias") &&
                       d.buffers[b].numel == (size_t)cfg.num_experts,
                   "%s: buffer %s", models[i].dir, d.buffers[b].name);
        check_program(models[i].dir, &cfg, &d, 8);
        eng_model_desc_free(&d);
        eng_model_config_free(&cfg);
    }

    /* DeepSeek-V3's tensors by where they sit, with the Hub's shapes */
    eng_model_config_t cfg;
    if (!load("deepseek-v3", &cfg)) return;
    eng_model_desc_t d;
    mt_error_t err = {0};
    if (eng_model_desc_build(&cfg, &d, &err) != MT_OK) {
        EXPECT(false, "%s", err.msg);
        eng_model_config_free(&cfg);
        return;
    }
    const struct {
        const char *name;
        int64_t d0, d1;
    } ds[] = {
        {"model.layers.0.self_attn.q_a_proj.weight", 1536, 7168},
        {"model.layers.0.self_attn.q_a_layernorm.weight", 1536, 0},
        {"model.layers.0.self_attn.q_b_proj.weight", 24576, 1536},
        {"model.layers.0.self_attn.kv_a_proj_with_mqa.weight", 576, 7168},
        {"model.layers.0.self_attn.kv_a_layernorm.weight", 512, 0},
        {"model.layers.0.self_attn.kv_b_proj.weight", 32768, 512},
        {"model.layers.0.self_attn.o_proj.weight", 7168, 16384},
        {"model.layers.2.mlp.gate_proj.weight", 18432, 7168},
        {"model.layers.3.mlp.gate.weight", 256, 7168},
        {"model.layers.3.mlp.experts.255.down_proj.weight", 7168, 2048},
        {"model.layers.60.mlp.shared_experts.up_proj.weight", 2048, 7168},
    };
    for (size_t i = 0; i < sizeof ds / sizeof ds[0]; i++) {
        const int p = eng_model_desc_find(&d, ds[i].name);
        EXPECT(p >= 0 && d.params[p].shape[0] == ds[i].d0 && d.params[p].shape[1] == ds[i].d1, "%s: %s", ds[i].name,
               p >= 0 ? "wrong shape" : "not described");
    }
    EXPECT(eng_model_desc_find(&d, "model.layers.3.mlp.gate_proj.weight") < 0 &&
               eng_model_desc_find(&d, "model.layers.61.self_attn.q_a_proj.weight") < 0,
           "no dense MLP in a sparse layer, no MTP layer");
    EXPECT(eng_model_desc_find_role(&d, 3, ENG_P_EXP_GATE, 7) >= 0, "experts indexed by where they sit");
    eng_model_desc_free(&d);
    eng_model_config_free(&cfg);

    /* gpt-oss-20b: the fused experts as transformers' GptOssExperts holds them */
    if (!load("gpt-oss-20b", &cfg)) return;
    if (eng_model_desc_build(&cfg, &d, &err) != MT_OK) {
        EXPECT(false, "%s", err.msg);
        eng_model_config_free(&cfg);
        return;
    }
    int p = eng_model_desc_find(&d, "model.layers.23.mlp.experts.gate_up_proj");
    EXPECT(p >= 0 && d.params[p].ndim == 3 && d.params[p].shape[0] == 32 && d.params[p].shape[1] == 2880 &&
               d.params[p].shape[2] == 5760 && eng_param_working_dtype(&d.params[p], MT_BF16) == MT_BF16,
           "gate_up_proj [E, H, 2I]");
    p = eng_model_desc_find(&d, "model.layers.0.mlp.experts.down_proj");
    EXPECT(p >= 0 && d.params[p].ndim == 3 && d.params[p].shape[1] == 2880 && d.params[p].shape[2] == 2880,
           "down_proj [E, I, H]");
    EXPECT(eng_model_desc_find(&d, "model.layers.0.self_attn.sinks") >= 0 &&
               eng_model_desc_find(&d, "model.layers.0.self_attn.o_proj.bias") >= 0 &&
               eng_model_desc_find(&d, "model.layers.0.mlp.router.bias") >= 0 &&
               eng_model_desc_find(&d, "model.layers.0.mlp.experts.gate_up_proj_bias") >= 0 &&
               eng_model_desc_find(&d, "model.layers.0.mlp.experts.down_proj_bias") >= 0,
           "sinks, o_proj bias, router bias, expert biases");
    /* the sinks rescale the attention output with an fp32 kernel: q, k, v
     * and the output stay fp32 in a bf16 run */
    for (eng_act_id_t id = ENG_A_Q; id <= ENG_A_ATT; id++) {
        const eng_act_desc_t *a = eng_model_desc_act(&d, 0, id);
        EXPECT(!a || eng_act_dtype(a->cls, MT_BF16) == MT_F32, "gpt-oss: %s saved in bf16", a->name);
    }
    EXPECT(!cfg.layer_full_attention[0] && cfg.layer_full_attention[1] && cfg.sliding_window == 128,
           "layer_types: sliding, full, ...");
    /* LoRA on the fused experts is refused, saying why; on attention it plans */
    eng_run_config_t rc;
    eng_run_config_defaults(&rc);
    rc.micro_batch_size = 1;
    rc.sequence_len = 64;
    rc.gradient_accumulation_steps = 1;
    rc.adapter = ENG_ADAPTER_LORA;
    rc.lora_r = 8;
    rc.num_lora_target_modules = 1;
    snprintf(rc.lora_target_modules[0], sizeof rc.lora_target_modules[0], "gate_up_proj");
    sched_program_t prog;
    sched_run_shape_t shape;
    mt_status_t st = eng_program_describe(&cfg, &rc, true, &prog, &shape, &err);
    EXPECT(st == MT_ERR_CONFIG && strstr(err.msg, "'gate_up_proj' matches no module") && strstr(err.msg, "fused") &&
               strstr(err.msg, "q_proj, k_proj, v_proj, o_proj, router"),
           "fused experts as a LoRA target: %s", err.msg);
    if (st == MT_OK) sched_program_free(&prog);
    snprintf(rc.lora_target_modules[0], sizeof rc.lora_target_modules[0], "o_proj");
    st = eng_program_describe(&cfg, &rc, true, &prog, &shape, &err);
    EXPECT(st == MT_OK, "o_proj LoRA on gpt-oss: %s", err.msg);
    if (st == MT_OK) sched_program_free(&prog);
    eng_run_config_free(&rc);
    eng_model_desc_free(&d);
    eng_model_config_free(&cfg);
}

/* DeepSeek-V2-Lite's sizes (deepseek-ai/DeepSeek-V2-Lite, as its model
 * card states them: 15.7B total, 2.4B active): q_lora_rank null, so q_proj
 * directly; greedy softmax routing, no score-correction buffer. */
static void test_deepseek_v2_lite(void) {
    static const char *k_v2_lite =
        "{\"model_type\": \"deepseek_v2\", \"vocab_size\": 102400, \"hidden_size\": 2048, \"intermediate_size\": 10944,"
        " \"moe_intermediate_size\": 1408, \"num_hidden_layers\": 27, \"num_attention_heads\": 16,"
        " \"num_key_value_heads\": 16, \"n_routed_experts\": 64, \"n_shared_experts\": 2, \"num_experts_per_tok\": 6,"
        " \"first_k_dense_replace\": 1, \"moe_layer_freq\": 1, \"kv_lora_rank\": 512, \"q_lora_rank\": null,"
        " \"qk_nope_head_dim\": 128, \"qk_rope_head_dim\": 64, \"v_head_dim\": 128, \"topk_method\": \"greedy\","
        " \"norm_topk_prob\": false, \"scoring_func\": \"softmax\", \"tie_word_embeddings\": false,"
        " \"torch_dtype\": \"bfloat16\"}";
    eng_model_config_t cfg;
    mt_error_t err = {0};
    if (eng_model_config_parse(k_v2_lite, "v2-lite", NULL, &cfg, &err) != MT_OK) {
        EXPECT(false, "%s", err.msg);
        return;
    }
    eng_model_desc_t d;
    if (eng_model_desc_build(&cfg, &d, &err) != MT_OK) {
        EXPECT(false, "%s", err.msg);
        eng_model_config_free(&cfg);
        return;
    }
    const double total = (double)eng_model_desc_numel(&d), active = (double)eng_model_desc_active_numel(&d, &cfg);
    const double embed = 102400.0 * 2048;
    printf("deepseek-v2-lite total %.2fB (published 15.7B); active %.2fB, %.2fB without the embedding table "
           "(published 2.4B)\n",
           total / 1e9, active / 1e9, (active - embed) / 1e9);
    EXPECT(fabs(total / 15.7e9 - 1) < 0.01, "V2-Lite total %.0f", total);
    EXPECT(fabs((active - embed) / 2.4e9 - 1) < 0.03, "V2-Lite active %.0f", active - embed);
    const int q = eng_model_desc_find(&d, "model.layers.0.self_attn.q_proj.weight");
    EXPECT(q >= 0 && d.params[q].shape[0] == 16 * 192 && d.params[q].shape[1] == 2048, "q_proj without a q latent");
    EXPECT(eng_model_desc_find(&d, "model.layers.0.self_attn.q_a_proj.weight") < 0 && d.num_buffers == 0,
           "no q_a_proj, no e_score_correction_bias");
    EXPECT(eng_model_desc_find(&d, "model.layers.1.mlp.shared_experts.gate_proj.weight") >= 0 &&
               d.params[eng_model_desc_find(&d, "model.layers.1.mlp.shared_experts.gate_proj.weight")].shape[0] == 2816,
           "two shared experts: one FFN of twice the width");
    check_program("deepseek-v2-lite", &cfg, &d, 8);
    eng_model_desc_free(&d);
    eng_model_config_free(&cfg);
}

int main(void) {
    test_real_models();
    test_described_families();
    test_deepseek_v2_lite();
    test_tiny_acts();
    test_buffers();
    if (failures) fprintf(stderr, "model_desc_test: %d failure(s)\n", failures);
    else printf("model_desc_test: all passed\n");
    return failures != 0;
}
