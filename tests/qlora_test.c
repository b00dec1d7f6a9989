/* LoRA over a quantised frozen base (docs/quantization.md).
 *
 * For each fixture (the LoRA fixtures of tests/fixtures/lora_*: Mixtral,
 * Qwen3-MoE, Qwen2-MoE, DeepSeek-V3 with MLA), in fp32 and in bf16:
 *   - a run with load_in_4bit (NF4) gives, bit for bit, the losses of the
 *     same run over the base dequantised once and written as an fp32
 *     checkpoint (read back from the quantised run's own homes, which is
 *     also the path a merged save reads): the device dequantisation just
 *     before use is exactly "dequantise, then run LoRA";
 *   - the same with the weights streamed, resident, and streamed in
 *     layer-major order with activations recomputed;
 *   - in fp32, its merged save equals the reference run's merged save bit
 *     for bit (dequantise, then W + s B A, as PEFT's merge_and_unload);
 *   - the quantisation changed the losses (the test would not notice a
 *     base silently left unquantised otherwise).
 * FP4 with double quantisation and llm_int8_skip_modules on one fixture.
 * In fp32 with NF4, the losses are also held within 1e-5 of PyTorch's over
 * the base quantised from bitsandbytes' definition in numpy
 * (tests/reference/make_qlora_fixtures.py: expected_nf4.json), where the
 * fixture has them.
 *
 * Then the link: a random Mixtral whose base matrices dominate, trained
 * with its weights streamed, in bf16 as written, with load_in_4bit (NF4),
 * and from an FP8 (e4m3, 128 x 128 block scales) copy of the checkpoint
 * (kept as stored): the weight bytes sent host->device per step
 * (metrics.jsonl's weight_h2d_bytes; 256 tokens a micro-batch, so every
 * expert is fetched in every run whatever the routing) must fall to <= 0.3 (4-bit) and
 * <= 0.55 (FP8) of bf16's; the FP8 run equals, bit for bit, the run over
 * the FP8 base dequantised once; and an FP8 base with a NaN block scale is
 * refused naming the tensor.
 *
 *   qlora_test FIXTURE_DIR... */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/quant.h"
#include "engine/config/config.h"
#include "engine/exec/exec.h"
#include "engine/model/io/init_random.h"
#include "engine/model/io/safetensors.h"
#include "engine/model/lora_model.h"
#include "engine/run/train.h"
#include "tests/harness.h"

enum { MAX_STEPS = 64 };

typedef struct {
    double loss[MAX_STEPS];
    int steps;
    uint64_t h2d; /* weight_h2d_bytes of the last step */
    int nvme_base, nvme_unpacked; /* frozen base weights on the NVMe tier; of them, never in host memory */
    bool ok;
} run_t;

/* check_link's FP8 base needs more host memory than this: the plan puts
 * some of its layers' homes on the NVMe tier */
#define FP8_NVME_HOST "8MiB"

static char g_tmp[256];
static int g_serial;

/* Trains dir/run.yaml with `sets` (NULL-ended) into `out`. */
static void train(const char *yaml, const char *const *sets, const char *out, run_t *r) {
    memset(r, 0, sizeof *r);
    eng_run_config_t rc;
    mt_error_t err = {0};
    mt_status_t st = eng_run_config_load(yaml, &rc, &err);
    char assign[1400];
    snprintf(assign, sizeof assign, "output_dir=%s", out);
    if (st == MT_OK) st = eng_run_config_set(&rc, assign, &err);
    if (st == MT_OK) st = eng_run_config_set(&rc, "progress=false", &err);
    for (int i = 0; sets && sets[i] && st == MT_OK; i++) st = eng_run_config_set(&rc, sets[i], &err);
    if (st == MT_OK) st = eng_run_config_validate(&rc, &err);
    eng_train_result_t res;
    if (st == MT_OK) st = eng_train(&rc, &res, &err);
    eng_run_config_free(&rc);
    TH_CHECK(st == MT_OK, "%s: training failed: %s", yaml, err.msg);
    if (st != MT_OK) return;
    r->nvme_base = res.nvme_base_homes;
    r->nvme_unpacked = res.nvme_base_unpacked;
    char path[1100];
    snprintf(path, sizeof path, "%s/metrics.jsonl", out);
    FILE *f = fopen(path, "r");
    TH_CHECK(f != NULL, "no %s", path);
    if (!f) return;
    char line[8192];
    while (fgets(line, sizeof line, f)) {
        json_t *j = json_loads(line, 0, NULL);
        if (json_is_number(json_object_get(j, "loss")) && r->steps < MAX_STEPS) {
            r->loss[r->steps++] = json_number_value(json_object_get(j, "loss"));
            r->h2d = (uint64_t)json_number_value(json_object_get(j, "weight_h2d_bytes"));
        }
        json_decref(j);
    }
    fclose(f);
    r->ok = r->steps > 0;
}

static bool same_losses(const run_t *a, const run_t *b) {
    if (!a->ok || !b->ok || a->steps != b->steps) return false;
    for (int s = 0; s < a->steps; s++)
        if (a->loss[s] != b->loss[s]) return false;
    return true;
}

/* The base of yaml's run, as a run with `sets` holds it in host memory,
 * written to dst as a checkpoint: every quantised home dequantised to fp32
 * (through eng_exec_read_param), every other tensor as stored.  *quantised:
 * how many tensors the run kept quantised. */
static bool write_dequantised(const char *yaml, const char *const *sets, const char *dst, int *quantised) {
    *quantised = 0;
    eng_run_config_t rc;
    mt_error_t err = {0};
    mt_status_t st = eng_run_config_load(yaml, &rc, &err);
    for (int i = 0; sets && sets[i] && st == MT_OK; i++) st = eng_run_config_set(&rc, sets[i], &err);
    eng_lora_run_opts_t lro;
    memset(&lro, 0, sizeof lro);
    if (st == MT_OK) st = eng_lora_run_opts(&rc, &lro, &err);
    kern_device_t *dev = NULL;
    const kern_device_opts_t dopts = {0};
    if (st == MT_OK) st = kern_device_create(KERN_BACKEND_CPU, &dopts, &dev, &err);
    eng_exec_t *x = NULL;
    const eng_model_opts_t mo = {.lora = &lro.opts};
    if (st == MT_OK) st = eng_exec_open(&x, dev, rc.base_model, &mo, &err);
    TH_CHECK(st == MT_OK, "%s: opening the quantised model: %s", yaml, err.msg);
    char path[1200], to[1200];
    snprintf(path, sizeof path, "%s/model.safetensors", rc.base_model);
    eng_st_file_t f;
    bool ok = st == MT_OK && eng_st_open(path, &f, &err) == MT_OK;
    TH_CHECK(st != MT_OK || ok, "%s", err.msg);
    if (ok) {
        const eng_model_t *m = eng_exec_model(x);
        eng_st_write_tensor_t *t = calloc((size_t)f.count, sizeof *t);
        float **vals = calloc((size_t)f.count, sizeof *vals);
        int64_t(*shapes)[8] = calloc((size_t)f.count, sizeof *shapes);
        int nt = 0;
        for (int j = 0; j < f.count; j++) {
            const eng_st_tensor_t *s = &f.tensors[j];
            const size_t len = strlen(s->name);
            if (len > 10 && strcmp(s->name + len - 10, "_scale_inv") == 0) continue; /* FP8 scales: folded in */
            if (len > 7 && strcmp(s->name + len - 7, "_scales") == 0) continue; /* MXFP4 scales: likewise */
            /* MXFP4: NAME_blocks stands for NAME */
            const size_t blen = len > 7 && strcmp(s->name + len - 7, "_blocks") == 0 ? len - 7 : len;
            const int k = nt++;
            t[k] = (eng_st_write_tensor_t){.name = s->name, .dtype = s->dtype, .ndim = s->ndim, .shape = shapes[k],
                                           .data = f.data + s->begin};
            for (int d = 0; d < s->ndim && d < 8; d++) shapes[k][d] = (int64_t)s->shape[d];
            for (int i = 0; i < m->spec.count; i++)
                if (m->params[i].home_q && strlen(m->spec.params[i].name) == blen &&
                    strncmp(m->spec.params[i].name, s->name, blen) == 0) {
                    const eng_param_spec_t *ps = &m->spec.params[i];
                    t[k].name = ps->name;
                    t[k].ndim = ps->ndim;
                    for (int d = 0; d < ps->ndim && d < 8; d++) shapes[k][d] = ps->shape[d];
                    vals[k] = malloc(ps->numel * sizeof(float));
                    eng_exec_read_param(x, i, vals[k], false);
                    t[k].data = NULL;
                    t[k].f32 = vals[k];
                    t[k].dtype = ENG_ST_F32;
                    (*quantised)++;
                }
        }
        char cmd[1300];
        snprintf(cmd, sizeof cmd, "mkdir -p %s", dst);
        ok = system(cmd) == 0;
        snprintf(to, sizeof to, "%s/model.safetensors", dst);
        if (ok) ok = eng_st_write(to, t, nt, NULL, 0, &err) == MT_OK;
        TH_CHECK(ok, "writing %s: %s", to, err.msg);
        for (int k = 0; k < f.count; k++) free(vals[k]);
        free(vals);
        free(shapes);
        free(t);
        eng_st_close(&f);
        /* config.json without quantization_config: the weights are dequantised */
        snprintf(path, sizeof path, "%s/config.json", rc.base_model);
        snprintf(to, sizeof to, "%s/config.json", dst);
        json_t *cfg = json_load_file(path, 0, NULL);
        if (cfg) json_object_del(cfg, "quantization_config");
        ok = ok && cfg && json_dump_file(cfg, to, JSON_INDENT(2)) == 0;
        json_decref(cfg);
    }
    if (x) eng_exec_free(x);
    if (dev) kern_device_destroy(dev);
    eng_lora_run_opts_free(&lro);
    eng_run_config_free(&rc);
    return ok;
}

/* Two safetensors files with the same tensors (names, dtypes, shapes,
 * bytes); their metadata (where the run came from) may differ. */
static bool same_tensors(const char *a, const char *b) {
    eng_st_file_t fa, fb;
    mt_error_t err = {0};
    if (eng_st_open(a, &fa, &err) != MT_OK) return false;
    if (eng_st_open(b, &fb, &err) != MT_OK) {
        eng_st_close(&fa);
        return false;
    }
    bool same = fa.count == fb.count;
    for (int k = 0; k < fa.count && same; k++) {
        const eng_st_tensor_t *ta = &fa.tensors[k], *tb = eng_st_find(&fb, ta->name);
        same = tb && ta->dtype == tb->dtype && ta->numel == tb->numel && ta->end - ta->begin == tb->end - tb->begin &&
               memcmp(fa.data + ta->begin, fb.data + tb->begin, ta->end - ta->begin) == 0;
    }
    eng_st_close(&fa);
    eng_st_close(&fb);
    return same;
}

/* The PyTorch reference's losses over the same base quantised to NF4 from
 * bitsandbytes' definition (tests/reference/make_qlora_fixtures.py), where
 * the fixture has them: within 1e-5 relative per step (1e-6 the first),
 * the tolerance lora_test holds the unquantised runs to: the two sides sum
 * in different orders. */
static void check_golden(const char *dir, const run_t *got) {
    char path[1100];
    snprintf(path, sizeof path, "%s/expected_nf4.json", dir);
    if (access(path, R_OK) != 0) {
        printf("%-22s no PyTorch QLoRA reference (make_qlora_fixtures.py covers the lora_ref cases)\n",
               th_base_name(dir));
        return;
    }
    json_t *j = json_load_file(path, 0, NULL);
    json_t *losses = json_object_get(j, "losses");
    TH_CHECK(json_is_array(losses) && (int)json_array_size(losses) == got->steps, "%s: %d losses, moetune ran %d",
             path, (int)json_array_size(losses), got->steps);
    double worst = 0;
    for (int s = 0; json_is_array(losses) && s < got->steps && s < (int)json_array_size(losses); s++) {
        const double want = json_number_value(json_array_get(losses, (size_t)s)), rel = th_rel(got->loss[s], want);
        TH_CHECK(rel <= (s == 0 ? 1e-6 : 1e-5), "%s step %d: loss %.9f, PyTorch's %.9f (rel %.1e)", dir, s + 1,
                 got->loss[s], want, rel);
        worst = fmax(worst, rel);
    }
    printf("%-22s NF4 losses within %.1e (relative) of PyTorch's over the same bitsandbytes-quantised base\n",
           th_base_name(dir), worst);
    json_decref(j);
}

/* One quantisation (`quant`, NULL-ended) of fixture dir in one precision. */
static void check_equivalence(const char *dir, bool bf16, const char *const *quant, const char *label) {
    char yaml[1100], deq[600], out[600], base_set[700];
    snprintf(yaml, sizeof yaml, "%s/run.yaml", dir);
    const char *prec = bf16 ? "bf16=true" : "bf16=false";
    const char *sets[12];
    int n = 0;
    for (int i = 0; quant[i]; i++) sets[n++] = quant[i];
    sets[n++] = prec;
    sets[n] = NULL;
    int quantised = 0;
    snprintf(deq, sizeof deq, "%s/deq%d", g_tmp, g_serial++);
    if (!write_dequantised(yaml, sets, deq, &quantised)) return;
    TH_CHECK(quantised > 0, "%s: the run kept no tensor quantised", dir);

    run_t q_stream, q_res, ref, plain;
    const char *extra_stream[] = {"scheduler.weights=stream", "merge_lora=true", "save_dtype=float32"};
    const char *qs[16];
    int k = 0;
    for (int i = 0; sets[i]; i++) qs[k++] = sets[i];
    for (int i = 0; i < 3; i++) qs[k++] = extra_stream[i];
    qs[k] = NULL;
    char out_q[600], out_ref[600];
    snprintf(out_q, sizeof out_q, "%s/q%d", g_tmp, g_serial++);
    train(yaml, qs, out_q, &q_stream);
    const char *qr[16];
    k = 0;
    for (int i = 0; sets[i]; i++) qr[k++] = sets[i];
    qr[k] = NULL;
    snprintf(out, sizeof out, "%s/r%d", g_tmp, g_serial++);
    train(yaml, qr, out, &q_res);
    snprintf(base_set, sizeof base_set, "base_model=%s", deq);
    const char *rs[] = {base_set, prec, "scheduler.weights=stream", "merge_lora=true", "save_dtype=float32", NULL};
    snprintf(out_ref, sizeof out_ref, "%s/ref%d", g_tmp, g_serial++);
    train(yaml, rs, out_ref, &ref);
    /* layer-major order, streamed, activations recomputed: the backward's
     * recompute fetches and dequantises the weights again */
    run_t q_layer;
    const char *lm[20];
    k = 0;
    for (int i = 0; sets[i]; i++) lm[k++] = sets[i];
    const char *layer_sets[] = {"step_order=layer", "scheduler.weights=stream", "scheduler.grads=host",
                                "scheduler.optimizer=host", "scheduler.activations=recompute"};
    for (int i = 0; i < 5; i++) lm[k++] = layer_sets[i];
    lm[k] = NULL;
    snprintf(out, sizeof out, "%s/l%d", g_tmp, g_serial++);
    train(yaml, lm, out, &q_layer);
    const char *ps[] = {prec, NULL};
    snprintf(out, sizeof out, "%s/p%d", g_tmp, g_serial++);
    train(yaml, ps, out, &plain);
    if (!q_stream.ok || !q_res.ok || !q_layer.ok || !ref.ok || !plain.ok) return;
    const int before = th_failures();
    TH_CHECK(same_losses(&q_stream, &ref), "%s %s %s: streamed quantised run's losses differ from the dequantised "
             "base's (step 1: %.17g vs %.17g)", dir, label, prec, q_stream.loss[0], ref.loss[0]);
    TH_CHECK(same_losses(&q_res, &ref), "%s %s %s: resident quantised run's losses differ from the dequantised "
             "base's (step 1: %.17g vs %.17g)", dir, label, prec, q_res.loss[0], ref.loss[0]);
    TH_CHECK(same_losses(&q_layer, &ref), "%s %s %s: layer-major quantised run's losses differ from the dequantised "
             "base's (step 1: %.17g vs %.17g)", dir, label, prec, q_layer.loss[0], ref.loss[0]);
    TH_CHECK(q_stream.loss[0] != plain.loss[0], "%s %s %s: quantising the base did not change the first loss", dir,
             label, prec);
    char ma[700], mb[700];
    snprintf(ma, sizeof ma, "%s/merged/model.safetensors", out_q);
    snprintf(mb, sizeof mb, "%s/merged/model.safetensors", out_ref);
    /* in bf16 the reference holds its base rounded to bf16 (what compute
     * reads), while a merge over a quantised home reads the exact fp32
     * dequantised value: the two merges agree in fp32 only */
    TH_CHECK(bf16 || same_tensors(ma, mb), "%s %s %s: the merged save differs from the dequantised base's merged save", dir, label,
             prec);
    if (!bf16 && strcmp(label, "nf4") == 0) check_golden(dir, &q_stream);
    if (th_failures() > before) return;
    printf("%-22s %-18s %-10s %d tensors quantised: %d losses equal the dequantised base's bit for bit "
           "(streamed, resident, layer-major)%s; first loss %.6f vs unquantised %.6f\n",
           th_base_name(dir), label, prec, quantised, q_stream.steps, bf16 ? "" : ", merged save equal", q_stream.loss[0],
           plain.loss[0]);
}

/* ---- the link ------------------------------------------------------------ */

/* Nearest E4M3 code to x (|x| <= 448): a binary search over the positive
 * codes, which increase with their value up to 0x7E. */
static uint8_t e4m3_code(float x) {
    const float a = fabsf(x);
    int lo = 0, hi = 0x7E;
    while (lo < hi) {
        const int mid = (lo + hi + 1) / 2;
        if (mt_fp8_e4m3_to_f32((uint8_t)mid) <= a) lo = mid;
        else hi = mid - 1;
    }
    if (lo < 0x7E && fabsf(mt_fp8_e4m3_to_f32((uint8_t)(lo + 1)) - a) < fabsf(mt_fp8_e4m3_to_f32((uint8_t)lo) - a))
        lo++;
    return (uint8_t)(lo | (x < 0 ? 0x80 : 0));
}

/* A copy of the checkpoint in src with every attention and expert matrix
 * stored as DeepSeek-V3 stores its weights: F8_E4M3 and fp32
 * weight_scale_inv per 128 x 128 block (scale = block absmax / 448).
 * nan_scale: the first scale of the first such matrix is NaN (damaged). */
static bool write_fp8(const char *src, const char *dst, bool nan_scale) {
    char path[700], cmd[1500];
    snprintf(cmd, sizeof cmd, "mkdir -p %s", dst);
    if (system(cmd) != 0) return false;
    snprintf(path, sizeof path, "%s/model.safetensors", src);
    eng_st_file_t f;
    mt_error_t err = {0};
    if (eng_st_open(path, &f, &err) != MT_OK) {
        TH_CHECK(false, "%s", err.msg);
        return false;
    }
    eng_st_write_tensor_t *t = calloc((size_t)f.count * 2, sizeof *t);
    void **bufs = calloc((size_t)f.count * 2, sizeof *bufs);
    int64_t(*shapes)[2] = calloc((size_t)f.count * 2, sizeof *shapes);
    char(*names)[300] = calloc((size_t)f.count, sizeof *names);
    const char *damaged = NULL;
    int n = 0;
    for (int k = 0; k < f.count; k++) {
        const eng_st_tensor_t *s = &f.tensors[k];
        const bool quant = s->ndim == 2 && (strstr(s->name, "_proj.weight") || strstr(s->name, ".experts."));
        float *x = malloc(s->numel * sizeof *x);
        eng_st_read_f32(&f, s, x, &err);
        bufs[n] = x;
        shapes[n][0] = (int64_t)s->shape[0];
        shapes[n][1] = s->ndim > 1 ? (int64_t)s->shape[1] : 0;
        t[n] = (eng_st_write_tensor_t){.name = s->name, .dtype = ENG_ST_F32, .ndim = s->ndim, .shape = shapes[n],
                                       .f32 = x};
        n++;
        if (!quant) continue;
        const int64_t R = shapes[n - 1][0], C = shapes[n - 1][1], sr = (R + 127) / 128, sc = (C + 127) / 128;
        float *scale = calloc((size_t)(sr * sc), sizeof *scale);
        uint8_t *codes = malloc((size_t)(R * C));
        for (int64_t r = 0; r < R; r++)
            for (int64_t c = 0; c < C; c++)
                scale[(r / 128) * sc + c / 128] = fmaxf(scale[(r / 128) * sc + c / 128], fabsf(x[r * C + c]));
        for (int64_t b = 0; b < sr * sc; b++) scale[b] = scale[b] > 0 ? scale[b] / 448.0f : 1.0f;
        if (nan_scale && !damaged) {
            scale[0] = NAN;
            damaged = s->name;
        }
        for (int64_t r = 0; r < R; r++)
            for (int64_t c = 0; c < C; c++) {
                const float sv = scale[(r / 128) * sc + c / 128];
                codes[r * C + c] = isnan(sv) ? 0 : e4m3_code(x[r * C + c] / sv);
            }
        t[n - 1].dtype = ENG_ST_F8_E4M3;
        t[n - 1].f32 = NULL;
        t[n - 1].data = codes;
        bufs[n - 1] = codes;
        free(x);
        snprintf(names[k], sizeof names[k], "%s_scale_inv", s->name);
        shapes[n][0] = sr;
        shapes[n][1] = sc;
        t[n] = (eng_st_write_tensor_t){.name = names[k], .dtype = ENG_ST_F32, .ndim = 2, .shape = shapes[n],
                                       .f32 = scale};
        bufs[n++] = scale;
    }
    snprintf(path, sizeof path, "%s/model.safetensors", dst);
    const bool ok = eng_st_write(path, t, n, NULL, 0, &err) == MT_OK;
    TH_CHECK(ok, "writing %s: %s", path, err.msg);
    for (int k = 0; k < n; k++) free(bufs[k]);
    free(bufs);
    free(t);
    free(shapes);
    free(names);
    eng_st_close(&f);
    /* config.json with DeepSeek-V3's quantization_config */
    snprintf(path, sizeof path, "%s/config.json", src);
    json_t *cfg = json_load_file(path, 0, NULL);
    if (!cfg) return false;
    json_object_set_new(cfg, "quantization_config",
                        json_pack("{s:s, s:s, s:s, s:[i,i]}", "quant_method", "fp8", "fmt", "e4m3",
                                  "activation_scheme", "dynamic", "weight_block_size", 128, 128));
    snprintf(path, sizeof path, "%s/config.json", dst);
    const int wr = json_dump_file(cfg, path, JSON_INDENT(2));
    json_decref(cfg);
    return ok && wr == 0;
}

/* The FP8 run again with a host budget below its base: the plan streams
 * the base from the NVMe tier, whose FP8 homes are written there straight
 * from the checkpoint's mapping, never packed in host memory; the losses
 * are f8's bit for bit. */
static void check_fp8_on_nvme(const char *yaml, const char *fp8_set, const run_t *f8) {
    char nvd[600], nv_set[700], out[700], cmd[700];
    snprintf(nvd, sizeof nvd, "%s/link-nvd", g_tmp);
    snprintf(cmd, sizeof cmd, "mkdir -p %s", nvd);
    TH_CHECK(system(cmd) == 0, "cannot make %s", nvd);
    snprintf(nv_set, sizeof nv_set, "memory.nvme.path=%s", nvd);
    const char *sets[] = {fp8_set, nv_set, "memory.host=" FP8_NVME_HOST, NULL};
    snprintf(out, sizeof out, "%s/link-fp8-nvme", g_tmp);
    run_t nv;
    train(yaml, sets, out, &nv);
    if (!nv.ok) return;
    TH_CHECK(nv.nvme_base > 0, "FP8 base with memory.host=" FP8_NVME_HOST ": no frozen base weight on the NVMe tier");
    TH_CHECK(nv.nvme_unpacked > 0 && nv.nvme_unpacked <= nv.nvme_base,
             "FP8 base on the NVMe tier: %d of its %d frozen homes written straight from the checkpoint",
             nv.nvme_unpacked, nv.nvme_base);
    TH_CHECK(same_losses(&nv, f8), "FP8 base on the NVMe tier: losses differ from the run in host memory (step 1: "
             "%.17g vs %.17g)", nv.loss[0], f8->loss[0]);
    if (nv.nvme_unpacked > 0 && same_losses(&nv, f8))
        printf("FP8 base on the NVMe tier: %d frozen homes there, %d written straight from the checkpoint; %d losses "
               "equal the run in host memory bit for bit\n", nv.nvme_base, nv.nvme_unpacked, nv.steps);
}

static void check_link(void) {
    char cwd[512], yaml[700], text[4096], base[600], fp8[600];
    if (!getcwd(cwd, sizeof cwd)) return;
    const char *model_json =
        "{\"architectures\": [\"MixtralForCausalLM\"], \"model_type\": \"mixtral\", \"vocab_size\": 128,"
        " \"hidden_size\": 256, \"intermediate_size\": 1024, \"num_hidden_layers\": 2,"
        " \"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"head_dim\": 64, \"num_local_experts\": 8,"
        " \"num_experts_per_tok\": 2, \"max_position_embeddings\": 512, \"rms_norm_eps\": 1e-05,"
        " \"rope_theta\": 10000.0, \"tie_word_embeddings\": false, \"torch_dtype\": \"float32\"}\n";
    snprintf(base, sizeof base, "%s/link-base", g_tmp);
    snprintf(fp8, sizeof fp8, "%s/link-fp8", g_tmp);
    mt_error_t err = {0};
    const mt_status_t st = eng_checkpoint_init_random(base, model_json, 5, &err);
    TH_CHECK(st == MT_OK, "random base: %s", err.msg);
    if (st != MT_OK || !write_fp8(base, fp8, false)) return;
    snprintf(yaml, sizeof yaml, "%s/link.yaml", g_tmp);
    snprintf(text, sizeof text,
             "base_model: %s\ndatasets:\n  - path: %s/configs/data/quickstart.jsonl\n"
             "sequence_len: 64\nmicro_batch_size: 4\nmax_steps: 2\nlearning_rate: 1.0e-3\nseed: 3\nbf16: true\n"
             "backend: cpu\nadapter: lora\nlora_r: 4\nlora_alpha: 8\nlora_target_modules: [q_proj, v_proj]\n"
             "scheduler:\n  weights: stream\n",
             base, cwd);
    FILE *f = fopen(yaml, "w");
    TH_CHECK(f != NULL, "cannot write %s", yaml);
    if (!f) return;
    fputs(text, f);
    fclose(f);
    char out[700], fp8_set[700];
    run_t bf16, nf4, nf4dq, f8;
    snprintf(out, sizeof out, "%s/link-bf16", g_tmp);
    train(yaml, NULL, out, &bf16);
    const char *q4[] = {"load_in_4bit=true", NULL};
    snprintf(out, sizeof out, "%s/link-nf4", g_tmp);
    train(yaml, q4, out, &nf4);
    const char *q4dq[] = {"load_in_4bit=true", "bnb_4bit_use_double_quant=true", NULL};
    snprintf(out, sizeof out, "%s/link-nf4dq", g_tmp);
    train(yaml, q4dq, out, &nf4dq);
    snprintf(fp8_set, sizeof fp8_set, "base_model=%s", fp8);
    const char *f8s[] = {fp8_set, NULL};
    snprintf(out, sizeof out, "%s/link-fp8-out", g_tmp);
    train(yaml, f8s, out, &f8);
    if (!bf16.ok || !nf4.ok || !nf4dq.ok || !f8.ok) return;
    /* FP8 kept as stored equals the run over the FP8 base dequantised once */
    char f8deq[600], f8deq_set[700];
    snprintf(f8deq, sizeof f8deq, "%s/link-fp8-deq", g_tmp);
    int quantised = 0;
    if (write_dequantised(yaml, f8s, f8deq, &quantised)) {
        run_t f8ref;
        snprintf(f8deq_set, sizeof f8deq_set, "base_model=%s", f8deq);
        const char *rs[] = {f8deq_set, NULL};
        snprintf(out, sizeof out, "%s/link-fp8-ref", g_tmp);
        train(yaml, rs, out, &f8ref);
        TH_CHECK(quantised == 2 * (4 + 3 * 8), "the FP8 run kept %d matrices quantised, not the 56 stored in FP8",
                 quantised);
        TH_CHECK(same_losses(&f8, &f8ref), "FP8 as stored: losses differ from the dequantised FP8 base's (step 1: "
                 "%.17g vs %.17g)", f8.loss[0], f8ref.loss[0]);
        if (same_losses(&f8, &f8ref))
            printf("FP8 base kept as stored (%d matrices): %d losses equal the dequantised FP8 base's bit for bit\n",
                   quantised, f8.steps);
    }
    check_fp8_on_nvme(yaml, fp8_set, &f8);
    const double r4 = (double)nf4.h2d / (double)bf16.h2d, r4dq = (double)nf4dq.h2d / (double)bf16.h2d,
                 r8 = (double)f8.h2d / (double)bf16.h2d;
    TH_CHECK(bf16.h2d > 0, "nothing streamed");
    TH_CHECK(r4 <= 0.3, "load_in_4bit sent %.3f of bf16's weight bytes per step (at most 0.3)", r4);
    TH_CHECK(r4dq <= 0.3, "load_in_4bit with double quant sent %.3f of bf16's weight bytes (at most 0.3)", r4dq);
    TH_CHECK(r8 <= 0.55, "the FP8 base sent %.3f of bf16's weight bytes per step (at most 0.55)", r8);
    for (int s = 0; s < f8.steps; s++)
        TH_CHECK(isfinite(f8.loss[s]) && fabs(f8.loss[s] - bf16.loss[s]) < 0.05 * fabs(bf16.loss[s]),
                 "FP8 base step %d: loss %g, bf16 %g", s + 1, f8.loss[s], bf16.loss[s]);
    /* a damaged scale is refused when the quantised home is made, naming the tensor */
    char bad[600], bad_set[700];
    snprintf(bad, sizeof bad, "%s/link-fp8-nan", g_tmp);
    if (write_fp8(base, bad, true)) {
        eng_run_config_t rc;
        mt_error_t err = {0};
        snprintf(bad_set, sizeof bad_set, "base_model=%s", bad);
        mt_status_t bst = eng_run_config_load(yaml, &rc, &err);
        if (bst == MT_OK) bst = eng_run_config_set(&rc, bad_set, &err);
        snprintf(out, sizeof out, "output_dir=%s/link-nan-out", g_tmp);
        if (bst == MT_OK) bst = eng_run_config_set(&rc, out, &err);
        eng_train_result_t res;
        if (bst == MT_OK) bst = eng_train(&rc, &res, &err);
        eng_run_config_free(&rc);
        TH_CHECK(bst != MT_OK && strstr(err.msg, "model.layers.0.") && strstr(err.msg, "weight_scale_inv holds nan"),
                 "an FP8 base with a NaN block scale: %s", bst == MT_OK ? "trained" : err.msg);
        if (bst != MT_OK) printf("NaN block scale refused: %s\n", err.msg);
    }
    printf("weight bytes host->device per step (streamed, bf16 compute): bf16 %llu, NF4 %llu (%.3f), NF4 double "
           "quant %llu (%.3f), FP8 %llu (%.3f)\n",
           (unsigned long long)bf16.h2d, (unsigned long long)nf4.h2d, r4, (unsigned long long)nf4dq.h2d, r4dq,
           (unsigned long long)f8.h2d, r8);
}

/* ---- gpt-oss's MXFP4 experts ---------------------------------------------- */

/* Nearest E2M1 code (low 4 bits) to x, |x| <= 6. */
static uint8_t e2m1_code(float x) {
    int best = 0;
    for (int c = 1; c < 8; c++)
        if (fabsf(mt_fp4_e2m1_to_f32((uint8_t)c) - fabsf(x)) < fabsf(mt_fp4_e2m1_to_f32((uint8_t)best) - fabsf(x)))
            best = c;
    return (uint8_t)(best | (x < 0 ? 8 : 0));
}

/* A copy of gpt-oss checkpoint src with every expert tensor (E, K, C) whose
 * K is whole 32-value blocks stored as gpt-oss stores it: NAME_blocks
 * (E, C, K/32, 16) and NAME_scales (E, C, K/32), the transpose packed
 * (scale: the smallest power of two putting the block's absmax within 6).
 * nan_scale: the first scale is 0xFF (damaged).  *packed: how many. */
static bool write_mxfp4(const char *src, const char *dst, bool nan_scale, int *packed) {
    char path[700], cmd[1500];
    *packed = 0;
    snprintf(cmd, sizeof cmd, "mkdir -p %s", dst);
    if (system(cmd) != 0) return false;
    snprintf(path, sizeof path, "%s/model.safetensors", src);
    eng_st_file_t f;
    mt_error_t err = {0};
    if (eng_st_open(path, &f, &err) != MT_OK) {
        TH_CHECK(false, "%s", err.msg);
        return false;
    }
    eng_st_write_tensor_t *t = calloc((size_t)f.count * 2, sizeof *t);
    void **bufs = calloc((size_t)f.count * 2, sizeof *bufs);
    int64_t(*shapes)[4] = calloc((size_t)f.count * 2, sizeof *shapes);
    char(*names)[2][300] = calloc((size_t)f.count, sizeof *names);
    int n = 0;
    for (int k = 0; k < f.count; k++) {
        const eng_st_tensor_t *s = &f.tensors[k];
        float *x = malloc(s->numel * sizeof *x);
        eng_st_read_f32(&f, s, x, &err);
        const size_t len = strlen(s->name);
        const bool quant = s->ndim == 3 && strstr(s->name, ".experts.") && s->shape[1] % 32 == 0 &&
                           strcmp(s->name + len - 5, "_bias") != 0;
        if (!quant) {
            for (int d = 0; d < s->ndim; d++) shapes[n][d] = (int64_t)s->shape[d];
            t[n] = (eng_st_write_tensor_t){.name = s->name, .dtype = ENG_ST_F32, .ndim = s->ndim, .shape = shapes[n],
                                           .f32 = x};
            bufs[n++] = x;
            continue;
        }
        const int64_t E = (int64_t)s->shape[0], K = (int64_t)s->shape[1], C = (int64_t)s->shape[2], G = K / 32;
        uint8_t *blocks = calloc((size_t)(E * C * G * 16), 1), *scales = malloc((size_t)(E * C * G));
        for (int64_t e = 0; e < E; e++)
            for (int64_t c = 0; c < C; c++)
                for (int64_t g = 0; g < G; g++) {
                    float amax = 0;
                    for (int64_t j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(x[(e * K + g * 32 + j) * C + c]));
                    int sc = 127;
                    while (amax > 0 && amax / ldexpf(1.0f, sc - 127) > 6.0f) sc++;
                    while (amax > 0 && sc > 1 && amax / ldexpf(1.0f, sc - 128) <= 6.0f) sc--;
                    const int64_t row = e * C + c;
                    scales[row * G + g] = (uint8_t)sc;
                    for (int64_t j = 0; j < 32; j++) {
                        const uint8_t q = e2m1_code(x[(e * K + g * 32 + j) * C + c] / ldexpf(1.0f, sc - 127));
                        blocks[(row * G + g) * 16 + j / 2] |= (uint8_t)(j % 2 ? q << 4 : q);
                    }
                }
        if (nan_scale && *packed == 0) scales[0] = 0xFF;
        (*packed)++;
        free(x);
        snprintf(names[k][0], sizeof names[k][0], "%s_blocks", s->name);
        snprintf(names[k][1], sizeof names[k][1], "%s_scales", s->name);
        shapes[n][0] = shapes[n + 1][0] = E;
        shapes[n][1] = shapes[n + 1][1] = C;
        shapes[n][2] = shapes[n + 1][2] = G;
        shapes[n][3] = 16;
        t[n] = (eng_st_write_tensor_t){.name = names[k][0], .dtype = ENG_ST_U8, .ndim = 4, .shape = shapes[n],
                                       .data = blocks};
        bufs[n++] = blocks;
        t[n] = (eng_st_write_tensor_t){.name = names[k][1], .dtype = ENG_ST_U8, .ndim = 3, .shape = shapes[n],
                                       .data = scales};
        bufs[n++] = scales;
    }
    snprintf(path, sizeof path, "%s/model.safetensors", dst);
    const bool ok = eng_st_write(path, t, n, NULL, 0, &err) == MT_OK;
    TH_CHECK(ok, "writing %s: %s", path, err.msg);
    for (int k = 0; k < n; k++) free(bufs[k]);
    free(bufs);
    free(t);
    free(shapes);
    free(names);
    eng_st_close(&f);
    snprintf(path, sizeof path, "%s/config.json", src);
    json_t *cfg = json_load_file(path, 0, NULL);
    if (!cfg) return false;
    json_object_set_new(cfg, "quantization_config",
                        json_pack("{s:s, s:[s,s,s]}", "quant_method", "mxfp4", "modules_to_not_convert",
                                  "model.layers.*.self_attn", "model.layers.*.mlp.router", "lm_head"));
    snprintf(path, sizeof path, "%s/config.json", dst);
    const int wr = json_dump_file(cfg, path, JSON_INDENT(2));
    json_decref(cfg);
    return ok && wr == 0;
}

/* A LoRA run over gpt-oss's MXFP4 experts keeps them quantised as stored
 * and equals, bit for bit, the run over the same base dequantised once;
 * a NaN scale (0xFF) is refused naming the tensor. */
static void check_mxfp4(const char *fixture) {
    char yaml[700], src[700], mx[700], mx_set[800], deq[700], deq_set[800], out[800];
    snprintf(yaml, sizeof yaml, "%s/run.yaml", fixture);
    snprintf(src, sizeof src, "%s/ckpt", fixture);
    snprintf(mx, sizeof mx, "%s/mxfp4", g_tmp);
    int packed = 0, quantised = 0;
    if (!write_mxfp4(src, mx, false, &packed)) return;
    snprintf(mx_set, sizeof mx_set, "base_model=%s", mx);
    const char *sets[] = {mx_set, "adapter=lora", "lora_r=4", "lora_alpha=8", "lora_target_modules=[q_proj, v_proj]",
                          "max_steps=3", "scheduler.weights=stream", NULL};
    run_t q, ref;
    snprintf(out, sizeof out, "%s/mxfp4-out", g_tmp);
    train(yaml, sets, out, &q);
    snprintf(deq, sizeof deq, "%s/mxfp4-deq", g_tmp);
    if (!q.ok || !write_dequantised(yaml, sets, deq, &quantised)) return;
    snprintf(deq_set, sizeof deq_set, "base_model=%s", deq);
    const char *rsets[] = {deq_set, "adapter=lora", "lora_r=4", "lora_alpha=8", "lora_target_modules=[q_proj, v_proj]",
                           "max_steps=3", "scheduler.weights=stream", NULL};
    snprintf(out, sizeof out, "%s/mxfp4-ref", g_tmp);
    train(yaml, rsets, out, &ref);
    TH_CHECK(packed > 0 && quantised == packed, "the MXFP4 run kept %d expert tensors quantised of the %d stored so",
             quantised, packed);
    TH_CHECK(same_losses(&q, &ref), "MXFP4 as stored: losses differ from the dequantised base's (step 1: %.17g vs "
             "%.17g)", q.loss[0], ref.loss[0]);
    TH_CHECK(q.h2d < ref.h2d, "the MXFP4 base sent %llu weight bytes per step, the dequantised one %llu",
             (unsigned long long)q.h2d, (unsigned long long)ref.h2d);
    if (same_losses(&q, &ref))
        printf("gpt-oss MXFP4 experts kept as stored (%d tensors): %d losses equal the dequantised base's bit for "
               "bit; weight bytes per step %llu vs %llu\n",
               quantised, q.steps, (unsigned long long)q.h2d, (unsigned long long)ref.h2d);
    char bad[700], bad_set[800];
    snprintf(bad, sizeof bad, "%s/mxfp4-nan", g_tmp);
    if (!write_mxfp4(src, bad, true, &packed)) return;
    eng_run_config_t rc;
    mt_error_t err = {0};
    snprintf(bad_set, sizeof bad_set, "base_model=%s", bad);
    mt_status_t st = eng_run_config_load(yaml, &rc, &err);
    for (int i = 0; sets[i] && st == MT_OK; i++) st = eng_run_config_set(&rc, i == 0 ? bad_set : sets[i], &err);
    snprintf(out, sizeof out, "output_dir=%s/mxfp4-nan-out", g_tmp);
    if (st == MT_OK) st = eng_run_config_set(&rc, out, &err);
    if (st == MT_OK) st = eng_run_config_validate(&rc, &err);
    eng_train_result_t res;
    if (st == MT_OK) st = eng_train(&rc, &res, &err);
    eng_run_config_free(&rc);
    TH_CHECK(st != MT_OK && strstr(err.msg, "gate_up_proj_blocks") && strstr(err.msg, "0xFF"),
             "an MXFP4 base with a NaN scale: %s", st == MT_OK ? "trained" : err.msg);
    if (st != MT_OK) printf("MXFP4 NaN scale refused: %s\n", err.msg);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: qlora_test FIXTURE_DIR...\n");
        return 2;
    }
    const char *tmp = getenv("TEST_TMPDIR");
    snprintf(g_tmp, sizeof g_tmp, "%s/qlora_test.XXXXXX", tmp ? tmp : "/tmp");
    if (!mkdtemp(g_tmp)) {
        perror("mkdtemp");
        return 2;
    }
    static const char *const nf4[] = {"load_in_4bit=true", NULL};
    static const char *const fp4dq[] = {"load_in_4bit=true", "bnb_4bit_quant_type=fp4",
                                        "bnb_4bit_use_double_quant=true", "llm_int8_skip_modules=[o_proj]", NULL};
    for (int i = 1; i < argc; i++) {
        check_equivalence(argv[i], false, nf4, "nf4");
        check_equivalence(argv[i], true, nf4, "nf4");
    }
    check_equivalence(argv[1], true, fp4dq, "fp4 dq, skip o_proj");
    check_link();
    check_mxfp4("tests/fixtures/ref_gpt_oss");
    return th_finish();
}
