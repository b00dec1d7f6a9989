/* HF-style random initialisation (see init_random.h). */
#include "engine/model/io/init_random.h"

#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/rng.h"
#include "engine/model/io/checkpoint.h"
#include "engine/model/hf/model_config.h"

/* normal(0, std) by Box-Muller; u1 in (0, 1] so log() is finite. */
static void fill_normal(float *dst, size_t n, double std, uint64_t state) {
    const double two_pi = 6.283185307179586476925286766559;
    for (size_t i = 0; i < n; i += 2) {
        double u1 = (double)((mt_splitmix64(&state) >> 11) + 1) * 0x1.0p-53;
        double u2 = (double)(mt_splitmix64(&state) >> 11) * 0x1.0p-53;
        double r = sqrt(-2.0 * log(u1)) * std;
        dst[i] = (float)(r * cos(two_pi * u2));
        if (i + 1 < n) dst[i + 1] = (float)(r * sin(two_pi * u2));
    }
}

static void init_one(const eng_model_desc_t *spec, int i, double initializer_range, int pad_token_id, uint64_t seed,
                     float *const *dst) {
    {
        const eng_param_spec_t *p = &spec->params[i];
        float *d = dst[i];
        switch (p->role) {
        case ENG_P_ATTN_NORM:
        case ENG_P_MLP_NORM:
        case ENG_P_FINAL_NORM:
        case ENG_P_Q_NORM:
        case ENG_P_K_NORM:
        case ENG_P_Q_A_NORM:
        case ENG_P_KV_A_NORM:
            for (size_t k = 0; k < p->numel; k++) d[k] = 1.0f;
            break;
        case ENG_P_Q_BIAS:
        case ENG_P_K_BIAS:
        case ENG_P_V_BIAS:
        case ENG_P_O_BIAS:
        case ENG_P_EXP_GATE_UP_BIAS: /* gpt-oss's _init_weights zeroes the experts' biases; */
        case ENG_P_EXP_DOWN_BIAS:    /* the router's bias is drawn like its weight (default) */
            memset(d, 0, p->numel * sizeof *d);
            break;
        default: {
            uint64_t state = seed ^ mt_fnv1a64(p->name);
            (void)mt_splitmix64(&state); /* decorrelate nearby seeds */
            fill_normal(d, p->numel, initializer_range, state);
            if (p->role == ENG_P_EMBED && pad_token_id >= 0 && pad_token_id < p->shape[0])
                memset(d + (size_t)pad_token_id * (size_t)p->shape[1], 0,
                       (size_t)p->shape[1] * sizeof *d);
            break;
        }
        }
    }
}

typedef struct {
    const eng_model_desc_t *spec;
    double std;
    int pad;
    uint64_t seed;
    float *const *dst;
    atomic_int next;
} init_job_t;

static void *init_worker(void *arg) {
    init_job_t *j = arg;
    for (int i; (i = atomic_fetch_add(&j->next, 1)) < j->spec->count;)
        init_one(j->spec, i, j->std, j->pad, j->seed, j->dst);
    return NULL;
}

/* Tensors on every core, one at a time each: a tensor's values depend only
 * on (seed, its name), so the split changes nothing, and a model of a few
 * billion parameters (a benchmark's geometry) is drawn in seconds, not a
 * minute. */
void eng_init_random_params(const eng_model_desc_t *spec, double initializer_range,
                            int pad_token_id, uint64_t seed, float *const *dst) {
    init_job_t j = {spec, initializer_range, pad_token_id, seed, dst, 0};
    enum { MAX_THREADS = 64 };
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    int n = cores < 1 ? 1 : cores > MAX_THREADS ? MAX_THREADS : (int)cores;
    if (n > spec->count) n = spec->count;
    pthread_t th[MAX_THREADS];
    int started = 0;
    for (int t = 1; t < n; t++)
        if (pthread_create(&th[started], NULL, init_worker, &j) == 0) started++;
    init_worker(&j); /* this thread too; alone when no thread could start */
    for (int t = 0; t < started; t++) pthread_join(th[t], NULL);
}

/* initializer_range and pad_token_id: not in eng_model_config_t (only
 * initialisation uses them), so read here. */
static mt_status_t read_init_keys(const char *text, const char *path, double *std, int *pad,
                                  mt_error_t *err) {
    json_error_t jerr;
    json_t *root = json_loads(text, 0, &jerr);
    if (!root) return mt_error_set(err, MT_ERR_CONFIG, "%s: not valid JSON: %s", path, jerr.text);
    mt_status_t st = MT_OK;
    *std = 0.02;
    *pad = -1;
    json_t *v = json_object_get(root, "initializer_range");
    if (v && !json_is_number(v))
        st = mt_error_set(err, MT_ERR_CONFIG, "%s: key 'initializer_range' must be a number", path);
    else if (v)
        *std = json_number_value(v);
    if (st == MT_OK && !(*std >= 0))
        st = mt_error_set(err, MT_ERR_CONFIG, "%s: key 'initializer_range' must not be negative", path);
    v = json_object_get(root, "pad_token_id");
    if (st == MT_OK && v && !json_is_null(v)) {
        if (!json_is_integer(v))
            st = mt_error_set(err, MT_ERR_CONFIG, "%s: key 'pad_token_id' must be an integer or null",
                              path);
        else
            *pad = (int)json_integer_value(v);
    }
    json_decref(root);
    return st;
}

mt_status_t eng_checkpoint_init_random(const char *dir, const char *config_json_text, uint64_t seed,
                                       mt_error_t *err) {
    size_t n = strlen(dir) + sizeof "/config.json";
    char *path = malloc(n);
    MT_CHECK_ALLOC(path, "path");
    snprintf(path, n, "%s/config.json", dir);
    eng_model_config_t cfg;
    eng_model_desc_t spec = {0};
    float **bufs = NULL;
    eng_ckpt_tensor_t *ts = NULL;
    double std = 0.02;
    int pad = -1;
    mt_status_t st = eng_model_config_parse(config_json_text, path, NULL, &cfg, err);
    if (st != MT_OK) goto out_path;
    st = read_init_keys(config_json_text, path, &std, &pad, err);
    if (st == MT_OK) st = eng_model_desc_build(&cfg, &spec, err);
    if (st != MT_OK) goto out_cfg;
    /* parameters, then buffers (DeepSeek-V3's e_score_correction_bias),
     * which transformers initialises to zeros */
    const int total = spec.count + spec.num_buffers;
    bufs = calloc((size_t)total, sizeof *bufs);
    ts = calloc((size_t)total, sizeof *ts);
    MT_CHECK_ALLOC(bufs, "init buffers");
    MT_CHECK_ALLOC(ts, "init tensors");
    for (int i = 0; i < total; i++) {
        const eng_param_spec_t *p = i < spec.count ? &spec.params[i] : &spec.buffers[i - spec.count];
        bufs[i] = i < spec.count ? malloc(p->numel ? p->numel * sizeof(float) : 1)
                                 : calloc(p->numel ? p->numel : 1, sizeof(float));
        MT_CHECK_ALLOC(bufs[i], p->name);
        /* stored in the dtype config.json names (torch_dtype / dtype), as
         * save_pretrained would store a model of that dtype */
        ts[i] = (eng_ckpt_tensor_t){p->name, p->dtype, p->ndim, p->shape, bufs[i]};
    }
    eng_init_random_params(&spec, std, pad, seed, bufs);
    st = eng_checkpoint_save(dir, config_json_text, ts, total, ENG_CKPT_DEFAULT_MAX_SHARD_BYTES, err);
    for (int i = 0; i < total; i++) free(bufs[i]);
    free(bufs);
    free(ts);
    eng_model_desc_free(&spec);
out_cfg:
    eng_model_config_free(&cfg);
out_path:
    free(path);
    return st;
}
