/* Checkpoints bitsandbytes stored in 4 bits, read as stored
 * (docs/quantization.md, "Pre-quantised bitsandbytes checkpoints").
 *
 * Each fixture (tests/reference/make_bnb_fixtures.py: the tiny Mixtral
 * reference checkpoint loaded by transformers with BitsAndBytesConfig
 * load_in_4bit on the CPU and save_pretrained'd) is opened for a LoRA run:
 *   - every weight bitsandbytes quantised has a quantised home and nothing
 *     else has one; its dequantisation equals, bit for bit, bitsandbytes'
 *     own (dequant.safetensors) in fp32, and that value rounded to bf16 in
 *     bf16 -- but for FP4's code 8, which bitsandbytes' torch table decodes
 *     as +0 and its CUDA kernel, like moetune, as -0;
 *   - the home holds the checkpoint's codes and absmax, compared with what
 *     moetune's load_in_4bit makes of the unquantised checkpoint: NF4 codes
 *     and fp32 absmax coincide (the same table, blocks of 64, max |x|, the
 *     same fp32 rounding), so the two LoRA runs' losses are bit-identical;
 *     bitsandbytes' CPU quantiser gives FP4 values that round to zero the
 *     other zero's code (+0 for -0 and back: only the sign of a zero
 *     differs), and its double quantisation's offset is a float32 mean summed
 *     in torch's order (moetune sums in double), so those are compared
 *     with the run over bitsandbytes' dequantised values instead;
 *   - a LoRA run over it trains with finite losses, equal bit for bit to
 *     the run over an fp32 checkpoint holding bitsandbytes' dequantised
 *     values, and so does a full fine-tune (which dequantises on load);
 *   - `moetune inspect` explains every tensor and counts the 4-bit weights;
 *   - damaged copies (absmax missing, the quant_state's shape, quant_type or
 *     blocksize wrong, the codes' byte count wrong, a NaN absmax) are
 *     refused when planned and when opened, naming the tensor.
 *
 *   bnb_prequant_test REF_DATA FIXTURE_DIR... */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/quant.h"
#include "engine/config/config.h"
#include "engine/exec/exec.h"
#include "engine/model/io/inspect.h"
#include "engine/model/io/safetensors.h"
#include "engine/model/lora_model.h"
#include "engine/run/train.h"
#include "tests/harness.h"

enum { STEPS = 6, MAX_T = 256 };

static char g_tmp[256];
static char g_data[1100];
static char g_cwd[512];

typedef struct {
    double loss[STEPS + 1];
    int steps;
    bool ok;
} run_t;

/* A run config over `base` in tmp/name.yaml: LoRA on attention, or a full
 * fine-tune; `extra` more lines. */
static void write_yaml(const char *name, const char *base, bool lora, const char *extra, char *yaml, size_t cap) {
    snprintf(yaml, cap, "%s/%s.yaml", g_tmp, name);
    FILE *f = fopen(yaml, "w");
    TH_CHECK(f != NULL, "cannot write %s", yaml);
    if (!f) return;
    fprintf(f,
            "base_model: %s\ndatasets:\n  - path: %s\nsequence_len: 16\nmicro_batch_size: 2\n"
            "gradient_accumulation_steps: 1\nmax_steps: %d\nlearning_rate: 0.01\nlr_scheduler: constant\n"
            "warmup_steps: 0\nweight_decay: 0.01\nmax_grad_norm: 1.0\nshuffle: false\nseed: 1\nlogging_steps: 1\n"
            "bf16: false\nbackend: cpu\nprogress: false\noutput_dir: %s/out_%s\n%s%s",
            base, g_data, STEPS, g_tmp, name,
            lora ? "adapter: lora\nlora_r: 4\nlora_alpha: 8.0\nlora_dropout: 0.0\n"
                   "lora_target_modules: [q_proj, k_proj, v_proj, o_proj]\n"
                 : "",
            extra ? extra : "");
    fclose(f);
}

/* Trains yaml; want_err NULL: it must train, else be refused with a message
 * holding want_err and want_err2. */
static void train(const char *yaml, run_t *r, const char *want_err, const char *want_err2) {
    memset(r, 0, sizeof *r);
    eng_run_config_t rc;
    mt_error_t err = {0};
    mt_status_t st = eng_run_config_load(yaml, &rc, &err);
    if (st == MT_OK) st = eng_run_config_validate(&rc, &err);
    eng_train_result_t res;
    char out[1200];
    snprintf(out, sizeof out, "%s", st == MT_OK ? rc.output_dir : "");
    if (st == MT_OK) st = eng_train(&rc, &res, &err);
    eng_run_config_free(&rc);
    if (want_err) {
        TH_CHECK(st != MT_OK && strstr(err.msg, want_err) && (!want_err2 || strstr(err.msg, want_err2)),
                 "%s: want a refusal naming '%s' and '%s', got: %s", yaml, want_err, want_err2 ? want_err2 : "",
                 st == MT_OK ? "trained" : err.msg);
        if (st != MT_OK) printf("  refused when planned: %s\n", err.msg);
        return;
    }
    TH_CHECK(st == MT_OK, "%s: training failed: %s", yaml, err.msg);
    if (st != MT_OK) return;
    char path[1300];
    snprintf(path, sizeof path, "%s/metrics.jsonl", out);
    FILE *f = fopen(path, "r");
    TH_CHECK(f != NULL, "no %s", path);
    if (!f) return;
    char line[8192];
    while (fgets(line, sizeof line, f)) {
        json_t *j = json_loads(line, 0, NULL);
        if (json_is_number(json_object_get(j, "loss")) && r->steps < STEPS + 1)
            r->loss[r->steps++] = json_number_value(json_object_get(j, "loss"));
        json_decref(j);
    }
    fclose(f);
    r->ok = r->steps == STEPS;
    for (int s = 0; s < r->steps; s++) TH_CHECK(isfinite(r->loss[s]), "%s: loss %d is %g", yaml, s, r->loss[s]);
    TH_CHECK(r->ok, "%s: %d losses logged, expected %d", yaml, r->steps, STEPS);
}

static bool same_losses(const run_t *a, const run_t *b) {
    if (!a->ok || !b->ok || a->steps != b->steps) return false;
    for (int s = 0; s < a->steps; s++)
        if (a->loss[s] != b->loss[s]) return false;
    return true;
}

/* The model of yaml's run opened on a CPU device (NULL and *err set when
 * refused); *dev to destroy after eng_exec_free. */
static eng_exec_t *open_model(const char *yaml, kern_device_t **dev, mt_error_t *err) {
    eng_run_config_t rc;
    *dev = NULL;
    mt_status_t st = eng_run_config_load(yaml, &rc, err);
    eng_lora_run_opts_t lro;
    memset(&lro, 0, sizeof lro);
    if (st == MT_OK) st = eng_lora_run_opts(&rc, &lro, err);
    const kern_device_opts_t dopts = {0};
    if (st == MT_OK) st = kern_device_create(KERN_BACKEND_CPU, &dopts, dev, err);
    eng_exec_t *x = NULL;
    const eng_model_opts_t mo = {.lora = &lro.opts};
    if (st == MT_OK) st = eng_exec_open(&x, *dev, rc.base_model, &mo, err);
    eng_lora_run_opts_free(&lro);
    eng_run_config_free(&rc);
    if (st != MT_OK && x) {
        eng_exec_free(x);
        x = NULL;
    }
    return x;
}

static void close_model(eng_exec_t *x, kern_device_t *dev) {
    if (x) eng_exec_free(x);
    if (dev) kern_device_destroy(dev);
}

static int param_index(const eng_model_t *m, const char *name) {
    for (int i = 0; i < m->spec.count; i++)
        if (strcmp(m->spec.params[i].name, name) == 0) return i;
    return -1;
}

/* The quantised homes of x against bnb's dequantize_4bit values (dq, the
 * fixture's dequant.safetensors), fp32 and bf16, bit for bit but for the
 * sign of a zero (*zero_signs counts those); returns how many homes. */
static int check_values(eng_exec_t *x, const eng_st_file_t *dq, const char *fx, long *zero_signs) {
    const eng_model_t *m = eng_exec_model(x);
    int homes = 0;
    for (int i = 0; i < m->spec.count; i++) {
        const eng_param_t *p = &m->params[i];
        const eng_st_tensor_t *t = eng_st_find(dq, p->spec->name);
        TH_CHECK((p->home_q != NULL) == (t != NULL), "%s: '%s' %s a quantised home but bitsandbytes %s it", fx,
                 p->spec->name, p->home_q ? "has" : "has no", t ? "quantised" : "did not quantise");
        if (!p->home_q || !t) continue;
        homes++;
        const size_t n = p->spec->numel;
        float *want = malloc(n * sizeof *want), *got = malloc(n * sizeof *got);
        uint16_t *want16 = malloc(n * sizeof *want16), *got16 = malloc(n * sizeof *got16);
        mt_error_t err = {0};
        TH_CHECK(eng_st_read_f32(dq, t, want, &err) == MT_OK, "%s", err.msg);
        eng_exec_read_param(x, i, got, false);
        size_t diff = 0, first = n;
        for (size_t k = 0; k < n; k++) {
            if (memcmp(&want[k], &got[k], sizeof(float)) == 0) continue;
            if (want[k] == 0.0f && got[k] == 0.0f) {
                (*zero_signs)++; /* FP4 code 8: bitsandbytes' torch table +0, its CUDA kernel and moetune -0 */
                continue;
            }
            if (diff++ == 0) first = k;
        }
        TH_CHECK(diff == 0, "%s: '%s': %zu of %zu values differ from bitsandbytes' dequantize_4bit (first [%zu]: %.9g "
                 "against %.9g)", fx, p->spec->name, diff, n, first, first < n ? (double)got[first] : 0.0,
                 first < n ? (double)want[first] : 0.0);
        mt_convert_from_f32(want16, MT_BF16, want, n);
        mt_dequant(&p->home_q->view, got16, MT_BF16);
        size_t diff16 = 0;
        for (size_t k = 0; k < n; k++)
            diff16 += want16[k] != got16[k] && ((want16[k] | got16[k]) & 0x7FFF) != 0;
        TH_CHECK(diff16 == 0, "%s: '%s': %zu bf16 values differ from bitsandbytes' values rounded to bf16", fx,
                 p->spec->name, diff16);
        free(want);
        free(got);
        free(want16);
        free(got16);
    }
    return homes;
}

/* How the homes of a (read as stored) and b (load_in_4bit) differ: codes
 * other than a +0 / -0 swap, codes that swap zeros, and absmax state. */
typedef struct {
    long codes, zero_swaps, absmax;
} home_diff_t;

static home_diff_t compare_homes(const eng_model_t *a, const eng_model_t *b) {
    home_diff_t d = {0};
    for (int i = 0; i < a->spec.count; i++) {
        const eng_quant_home_t *ha = a->params[i].home_q;
        const int j = param_index(b, a->spec.params[i].name);
        const eng_quant_home_t *hb = j >= 0 ? b->params[j].home_q : NULL;
        if (!ha) {
            d.codes += hb != NULL; /* quantised on load, stored unquantised */
            continue;
        }
        if (!hb) {
            d.codes += 1;
            continue;
        }
        const mt_quant_view_t *va = &ha->view, *vb = &hb->view;
        const int64_t n = va->rows * va->cols, nb = (n + va->block - 1) / va->block;
        for (int64_t k = 0; k < n; k++) {
            const uint8_t ca = mt_q_nibble_hi_first(va->codes, k), cb = mt_q_nibble_hi_first(vb->codes, k);
            if (ca == cb) continue;
            if ((ca | cb) == 8 && (ca & cb) == 0) d.zero_swaps++;
            else d.codes++;
        }
        if ((va->scales == NULL) != (vb->scales == NULL) || va->block != vb->block) {
            d.absmax += nb;
            continue;
        }
        if (va->scales) {
            d.absmax += memcmp(va->scales, vb->scales, (size_t)nb * sizeof(float)) != 0;
        } else {
            d.absmax += memcmp(va->scales_u8, vb->scales_u8, (size_t)nb) != 0 ||
                        memcmp(va->absmax2, vb->absmax2, (size_t)((nb + 255) / 256) * sizeof(float)) != 0 ||
                        memcmp(&va->offset, &vb->offset, sizeof(float)) != 0;
        }
    }
    return d;
}

/* ref's tensors with bitsandbytes' dequantised values (dq) in place of
 * those it quantised, fp32, into dir (with ref's config.json). */
static bool write_dequantised(const char *ref, const eng_st_file_t *dq, const char *dir) {
    char path[1200], cmd[2600];
    snprintf(cmd, sizeof cmd, "mkdir -p %s && cp %s/config.json %s/", dir, ref, dir);
    if (system(cmd) != 0) return false;
    snprintf(path, sizeof path, "%s/model.safetensors", ref);
    eng_st_file_t f;
    mt_error_t err = {0};
    if (eng_st_open(path, &f, &err) != MT_OK) return false;
    eng_st_write_tensor_t *t = calloc((size_t)f.count, sizeof *t);
    int64_t(*shapes)[8] = calloc((size_t)f.count, sizeof *shapes);
    float **vals = calloc((size_t)f.count, sizeof *vals);
    int replaced = 0;
    for (int k = 0; k < f.count; k++) {
        const eng_st_tensor_t *s = &f.tensors[k], *q = eng_st_find(dq, s->name);
        for (int d = 0; d < s->ndim && d < 8; d++) shapes[k][d] = (int64_t)s->shape[d];
        t[k] = (eng_st_write_tensor_t){.name = s->name, .dtype = s->dtype, .ndim = s->ndim, .shape = shapes[k],
                                       .data = f.data + s->begin};
        if (!q) continue;
        vals[k] = malloc(q->numel * sizeof(float));
        if (eng_st_read_f32(dq, q, vals[k], &err) != MT_OK || q->numel != s->numel) continue;
        t[k].data = NULL;
        t[k].f32 = vals[k];
        t[k].dtype = ENG_ST_F32;
        replaced++;
    }
    char to[1200];
    snprintf(to, sizeof to, "%s/model.safetensors", dir);
    const bool ok = replaced == dq->count && eng_st_write(to, t, f.count, NULL, 0, &err) == MT_OK;
    TH_CHECK(ok, "writing %s (%d of %d replaced): %s", to, replaced, dq->count, err.msg);
    for (int k = 0; k < f.count; k++) free(vals[k]);
    free(vals);
    free(shapes);
    free(t);
    eng_st_close(&f);
    return ok;
}

/* ---- damaged copies ---- */

typedef enum { D_NO_ABSMAX, D_SHAPE, D_TYPE, D_BLOCK, D_BYTES, D_NAN_ABSMAX, D_COUNT } damage_t;

static const char *const k_damage[D_COUNT] = {"absmax missing", "quant_state shape", "quant_type", "blocksize",
                                              "code bytes", "NaN absmax"};
/* What each refusal must say beside the tensor's name. */
static const char *const k_damage_word[D_COUNT] = {"absmax", "shape", "quant_type", "blocksize", "bytes", "absmax"};

#define VICTIM "model.layers.1.self_attn.o_proj.weight"

/* fx's checkpoint with VICTIM damaged as `d`, into dir; false when the
 * fixture has nothing to damage that way (a NaN fp32 absmax under double
 * quantisation). */
static bool write_damaged(const char *fx, damage_t d, const char *dir) {
    char path[1200], cmd[2600];
    snprintf(cmd, sizeof cmd, "mkdir -p %s && cp %s/ckpt/config.json %s/", dir, fx, dir);
    if (system(cmd) != 0) return false;
    snprintf(path, sizeof path, "%s/ckpt/model.safetensors", fx);
    eng_st_file_t f;
    mt_error_t err = {0};
    if (eng_st_open(path, &f, &err) != MT_OK) return false;
    eng_st_write_tensor_t *t = calloc((size_t)f.count, sizeof *t);
    int64_t(*shapes)[8] = calloc((size_t)f.count, sizeof *shapes);
    char state[1024];
    float absmax[64];
    int nt = 0;
    bool done = false;
    for (int k = 0; k < f.count; k++) {
        const eng_st_tensor_t *s = &f.tensors[k];
        for (int i = 0; i < s->ndim && i < 8; i++) shapes[nt][i] = (int64_t)s->shape[i];
        t[nt] = (eng_st_write_tensor_t){.name = s->name, .dtype = s->dtype, .ndim = s->ndim, .shape = shapes[nt],
                                        .data = f.data + s->begin};
        const bool victim = strncmp(s->name, VICTIM, strlen(VICTIM)) == 0;
        const char *suffix = s->name + (victim ? strlen(VICTIM) : 0);
        if (victim && d == D_NO_ABSMAX && strcmp(suffix, ".absmax") == 0) {
            done = true;
            continue; /* left out */
        }
        if (victim && d == D_BYTES && strcmp(suffix, "") == 0) {
            shapes[nt][0] -= 8;
            done = true;
        }
        if (victim && d == D_NAN_ABSMAX && strcmp(suffix, ".absmax") == 0 && s->dtype == ENG_ST_F32 &&
            s->numel <= 64) {
            memcpy(absmax, f.data + s->begin, s->numel * sizeof(float));
            absmax[1] = NAN;
            t[nt].data = absmax;
            done = true;
        }
        if (victim && strncmp(suffix, ".quant_state.", 13) == 0 && (d == D_SHAPE || d == D_TYPE || d == D_BLOCK)) {
            json_t *j = json_loadb((const char *)f.data + s->begin, s->numel, 0, NULL);
            if (d == D_SHAPE) json_object_set_new(j, "shape", json_pack("[ii]", 16, 64)); /* same count, wrong shape */
            if (d == D_TYPE) json_object_set_new(j, "quant_type", json_string("nf5"));
            if (d == D_BLOCK) json_object_set_new(j, "blocksize", json_integer(48));
            char *txt = json_dumps(j, JSON_COMPACT);
            snprintf(state, sizeof state, "%s", txt);
            free(txt);
            json_decref(j);
            shapes[nt][0] = (int64_t)strlen(state);
            t[nt].data = state;
            done = true;
        }
        nt++;
    }
    char to[1200];
    snprintf(to, sizeof to, "%s/model.safetensors", dir);
    const bool ok = done && eng_st_write(to, t, nt, NULL, 0, &err) == MT_OK;
    free(shapes);
    free(t);
    eng_st_close(&f);
    return ok;
}

static void check_damaged(const char *fx) {
    for (int d = 0; d < D_COUNT; d++) {
        char dir[600], yaml[700], name[64];
        snprintf(name, sizeof name, "%s_damaged_%d", th_base_name(fx), d);
        snprintf(dir, sizeof dir, "%s/%s", g_tmp, name);
        if (!write_damaged(fx, (damage_t)d, dir)) {
            TH_CHECK(d == D_NAN_ABSMAX, "%s: could not write the '%s' copy", fx, k_damage[d]);
            continue;
        }
        printf("%s, %s:\n", th_base_name(fx), k_damage[d]);
        write_yaml(name, dir, true, NULL, yaml, sizeof yaml);
        run_t r;
        train(yaml, &r, VICTIM, k_damage_word[d]);
        kern_device_t *dev;
        mt_error_t err = {0};
        eng_exec_t *x = open_model(yaml, &dev, &err);
        TH_CHECK(!x && strstr(err.msg, VICTIM) && strstr(err.msg, k_damage_word[d]),
                 "%s, %s: want the model's opening refused naming '%s' and '%s', got: %s", fx, k_damage[d], VICTIM,
                 k_damage_word[d], x ? "opened" : err.msg);
        if (!x) printf("  refused when opened:  %s\n", err.msg);
        close_model(x, dev);
    }
}

/* `moetune inspect` of the checkpoint: every tensor explained, the 4-bit
 * weights counted. */
static void check_inspect(const char *ckpt, int listed) {
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    mt_error_t err = {0};
    const mt_status_t st = eng_inspect(ckpt, f, &err);
    fclose(f);
    char want[128];
    snprintf(want, sizeof want, "%d weights in bitsandbytes 4-bit", listed);
    TH_CHECK(st == MT_OK && strstr(buf, want) && strstr(buf, "present with the expected shapes") &&
                 !strstr(buf, "WRONG SHAPE") && !strstr(buf, "unexpected"),
             "%s: inspect: %s\n%s", ckpt, st == MT_OK ? "" : err.msg, buf);
    free(buf);
}

static void check_fixture(const char *fx) {
    const char *name = th_base_name(fx);
    char path[1400], ckpt[1200], yaml[700], yref[700], ydq[700], dqdir[600], extra[200];
    snprintf(path, sizeof path, "%s/expected.json", fx);
    json_t *exp = json_load_file(path, 0, NULL);
    TH_CHECK(exp != NULL, "cannot read %s", path);
    if (!exp) return;
    const char *qtype = json_string_value(json_object_get(exp, "quant_type"));
    const bool dq = json_is_true(json_object_get(exp, "double_quant"));
    const int listed = (int)json_array_size(json_object_get(exp, "quantized"));
    char ref[1100];
    snprintf(ref, sizeof ref, "%s/tests/fixtures/%s/ckpt", g_cwd, json_string_value(json_object_get(exp, "source")));
    snprintf(ckpt, sizeof ckpt, "%s/ckpt", fx);
    snprintf(path, sizeof path, "%s/dequant.safetensors", fx);
    eng_st_file_t dqf;
    mt_error_t err = {0};
    if (eng_st_open(path, &dqf, &err) != MT_OK) {
        TH_CHECK(0, "%s", err.msg);
        json_decref(exp);
        return;
    }

    check_inspect(ckpt, listed);

    /* the homes, against bnb's values and against moetune's load_in_4bit */
    write_yaml(name, ckpt, true, NULL, yaml, sizeof yaml);
    /* transformers 5 quantised only the attention projections (the experts
     * are 3-D parameters there, not nn.Linear): load_in_4bit skips the
     * experts to hold the same base */
    snprintf(extra, sizeof extra, "load_in_4bit: true\nbnb_4bit_quant_type: %s\nbnb_4bit_use_double_quant: %s\n"
             "llm_int8_skip_modules: [experts]\n", qtype, dq ? "true" : "false");
    char yname[128];
    snprintf(yname, sizeof yname, "%s_own4bit", name);
    write_yaml(yname, ref, true, extra, yref, sizeof yref);
    kern_device_t *da, *db;
    eng_exec_t *xa = open_model(yaml, &da, &err);
    TH_CHECK(xa != NULL, "%s: %s", yaml, err.msg);
    eng_exec_t *xb = open_model(yref, &db, &err);
    TH_CHECK(xb != NULL, "%s: %s", yref, err.msg);
    home_diff_t hd = {-1, -1, -1};
    if (xa) {
        long zero_signs = 0;
        const int homes = check_values(xa, &dqf, name, &zero_signs);
        TH_CHECK(homes == listed && homes > 0, "%s: %d quantised homes, %d weights quantised by bitsandbytes", name,
                 homes, listed);
        TH_CHECK(zero_signs == 0 || strcmp(qtype, "fp4") == 0, "%s: %ld zeros of the other sign in NF4", name,
                 zero_signs);
        printf("%s: %d quantised homes equal bitsandbytes' dequantisation bit for bit (fp32 and bf16; %ld FP4 "
               "zeros differ only in sign)\n", name, homes, zero_signs);
        if (xb) hd = compare_homes(eng_exec_model(xa), eng_exec_model(xb));
    }
    close_model(xa, da);
    close_model(xb, db);
    const bool coincide = hd.codes == 0 && hd.zero_swaps == 0 && hd.absmax == 0;
    const char *src = json_string_value(json_object_get(exp, "source"));
    printf("%s against moetune's load_in_4bit of %s: %ld codes differ, %ld swap +0 and -0, %ld absmax states differ%s\n",
           name, src, hd.codes, hd.zero_swaps, hd.absmax, coincide ? ": they coincide" : "");
    TH_CHECK(hd.codes == 0, "%s: %ld codes differ from moetune's quantisation other than a zero's sign", name,
             hd.codes);
    if (strcmp(qtype, "nf4") == 0 && !dq)
        TH_CHECK(coincide, "%s: NF4 with fp32 absmax should coincide with moetune's load_in_4bit", name);

    /* training */
    run_t rb, rd, rr, fb, fd;
    train(yaml, &rb, NULL, NULL);
    snprintf(dqdir, sizeof dqdir, "%s/%s_dequantised", g_tmp, name);
    const bool dq_ok = write_dequantised(ref, &dqf, dqdir);
    char dname[128];
    snprintf(dname, sizeof dname, "%s_deq", name);
    write_yaml(dname, dqdir, true, NULL, ydq, sizeof ydq);
    if (dq_ok) train(ydq, &rd, NULL, NULL);
    TH_CHECK(dq_ok && same_losses(&rb, &rd), "%s: LoRA losses differ from the run over bitsandbytes' dequantised "
             "values (%.9g against %.9g at step 0)", name, rb.loss[0], rd.loss[0]);
    printf("%s: LoRA, %d steps: losses %.7f .. %.7f, bit-identical to the run over bitsandbytes' dequantised "
           "values: %s\n", name, rb.steps, rb.loss[0], rb.loss[rb.steps > 0 ? rb.steps - 1 : 0],
           same_losses(&rb, &rd) ? "yes" : "NO");
    if (coincide) {
        train(yref, &rr, NULL, NULL);
        TH_CHECK(same_losses(&rb, &rr), "%s: the codes coincide but the losses differ from load_in_4bit's", name);
        printf("%s: bit-identical to moetune's own load_in_4bit run over %s: %s\n", name, src,
               same_losses(&rb, &rr) ? "yes" : "NO");
    }
    char fn1[128], fn2[128], yf1[700], yf2[700];
    snprintf(fn1, sizeof fn1, "%s_full", name);
    snprintf(fn2, sizeof fn2, "%s_full_deq", name);
    write_yaml(fn1, ckpt, false, NULL, yf1, sizeof yf1);
    write_yaml(fn2, dqdir, false, NULL, yf2, sizeof yf2);
    train(yf1, &fb, NULL, NULL);
    if (dq_ok) train(yf2, &fd, NULL, NULL);
    TH_CHECK(dq_ok && same_losses(&fb, &fd), "%s: full fine-tuning (dequantised on load) differs from the run over "
             "bitsandbytes' dequantised values", name);
    printf("%s: full fine-tune dequantised on load, bit-identical to the run over the dequantised values: %s\n", name,
           same_losses(&fb, &fd) ? "yes" : "NO");
    eng_st_close(&dqf);
    json_decref(exp);
    check_damaged(fx);
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: bnb_prequant_test REF_DATA_JSONL FIXTURE_DIR...\n");
        return 2;
    }
    const char *tmpdir = getenv("TEST_TMPDIR");
    snprintf(g_tmp, sizeof g_tmp, "%s/bnb_prequant_XXXXXX", tmpdir ? tmpdir : "/tmp");
    if (!mkdtemp(g_tmp)) {
        perror("mkdtemp");
        return 1;
    }
    /* the run configs live in g_tmp: every path in them absolute */
    char cwd[512];
    if (!getcwd(cwd, sizeof cwd)) {
        perror("getcwd");
        return 1;
    }
    snprintf(g_cwd, sizeof g_cwd, "%s", cwd);
    snprintf(g_data, sizeof g_data, "%s/%s", cwd, argv[1]);
    for (int a = 2; a < argc; a++) {
        char fx[1100];
        snprintf(fx, sizeof fx, "%s/%s", cwd, argv[a]);
        check_fixture(fx);
    }
    return th_finish();
}
