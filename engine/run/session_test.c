/* eng_run_open as `moetune bench step` uses it, everything given instead of
 * read from a run config (a CPU device's options, a plan, staging
 * settings, synthetic data): the run opens one executor over the given
 * data, keeps its own copy of the run config (the caller's is freed and
 * overwritten at once), takes a training step, and closes.  And the
 * cleanup pattern: a run
 * whose model fails to open still owns the data it was given, and
 * eng_run_close frees it and returns the failure (the ASan build checks
 * that nothing leaks). */
#include "engine/run/session.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/exec/optim.h"
#include "engine/model/io/init_random.h"

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

enum { LAYERS = 2, VOCAB = 64, SEQ = 16, BATCH = 2, ROWS = 8 };

/* Random tokens, every target counted (as bench step's synthetic data). */
static void make_dataset(eng_dataset_t *ds) {
    memset(ds, 0, sizeof *ds);
    ds->T = SEQ;
    ds->num_rows = ROWS;
    const size_t n = (size_t)ROWS * SEQ;
    ds->inputs = malloc(n * sizeof *ds->inputs);
    ds->targets = malloc(n * sizeof *ds->targets);
    ds->mask = malloc(n);
    MT_CHECK(ds->inputs && ds->targets && ds->mask, "out of memory for the synthetic dataset");
    for (size_t i = 0; i < n; i++) ds->inputs[i] = (int32_t)((i * 7 + 3) % VOCAB), ds->mask[i] = 1;
    for (size_t i = 0; i < n; i++) ds->targets[i] = (i + 1) % SEQ ? ds->inputs[i + 1] : -100;
}

/* A run config that says only what eng_run_open reads when the rest is given. */
static void bench_config(eng_run_config_t *rc, const char *ckpt) {
    eng_run_config_defaults(rc);
    snprintf(rc->base_model, sizeof rc->base_model, "%s", ckpt);
    rc->micro_batch_size = BATCH;
    rc->shuffle = false;
    rc->seed = 0;
    rc->bf16 = ENG_BF16_OFF;
}

static mt_status_t one_step(eng_run_t *run, double *loss, mt_error_t *err) {
    const eng_optim_hparams_t hp = {.lr = 1e-4, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8};
    eng_optim_begin_step(run->x, &hp, 1, true);
    eng_batch_t b;
    eng_loader_next(&run->ld, &b);
    eng_micro_stats_t ms;
    mt_status_t st = eng_exec_forward_backward(run->x, &b, 1.0f, NULL, &ms, err);
    eng_optim_stats_t os;
    if (st == MT_OK) st = eng_optim_step(run->x, &hp, &os, err);
    *loss = ms.loss;
    return st;
}

static void test_given_parts(const char *ckpt) {
    eng_run_config_t rc;
    bench_config(&rc, ckpt);
    const kern_device_opts_t dopts = {.link_latency_s = 10e-6};
    sched_plan_t plan;
    sched_plan_init_uniform(&plan, LAYERS + 2, SCHED_POLICY_OFFLOAD_ALL);
    eng_staging_settings_t ss;
    eng_staging_settings_init(&ss);
    ss.tokens = BATCH * SEQ;
    eng_dataset_t ds;
    make_dataset(&ds);
    const eng_run_opts_t ro = {
        .device = &dopts, .backend = KERN_BACKEND_CPU, .plan = &plan, .staging = &ss, .dataset = &ds};
    eng_run_t run;
    mt_error_t err = {0};
    rc.model_config_json = strdup("{\"rms_norm_eps\": 1e-5}");
    MT_CHECK_ALLOC(rc.model_config_json, "model_config");
    mt_status_t st = eng_run_open(&run, &rc, &ro, &err);
    EXPECT(st == MT_OK, "%s", err.msg);
    eng_run_config_free(&rc);
    memset(&rc, 0xa5, sizeof rc); /* the run reads its own copy from here on */
    EXPECT(ds.inputs == NULL, "the given dataset is the run's");
    EXPECT(strcmp(run.rc->model_config_json, "{\"rms_norm_eps\": 1e-5}") == 0, "the run's copy");
    EXPECT(st != MT_OK || (run.x && run.dev && run.ds.num_rows == ROWS && run.ld.micro_batch == BATCH),
           "one executor over the given data");
    EXPECT(st != MT_OK || eng_exec_plan(run.x)->policy == SCHED_POLICY_OFFLOAD_ALL, "the given plan");
    double loss = NAN;
    if (st == MT_OK) st = one_step(&run, &loss, &err);
    EXPECT(st == MT_OK && isfinite(loss) && loss > 0, "a step: %s (loss %g)", err.msg, loss);
    st = eng_run_close(&run, st, &err);
    EXPECT(st == MT_OK, "%s", err.msg);
    EXPECT(run.dev == NULL && run.x == NULL && run.ds.inputs == NULL, "closed");
    sched_plan_free(&plan);
}

static void test_failed_open(const char *ckpt) {
    char missing[1000];
    snprintf(missing, sizeof missing, "%s/no-such-model", ckpt);
    eng_run_config_t rc;
    bench_config(&rc, missing);
    const kern_device_opts_t dopts = {0};
    sched_plan_t plan;
    sched_plan_init_uniform(&plan, LAYERS + 2, SCHED_POLICY_KEEP_ALL);
    eng_dataset_t ds;
    make_dataset(&ds);
    const eng_run_opts_t ro = {.device = &dopts, .backend = KERN_BACKEND_CPU, .plan = &plan, .dataset = &ds};
    eng_run_t run;
    mt_error_t err = {0};
    const mt_status_t st = eng_run_open(&run, &rc, &ro, &err);
    EXPECT(st != MT_OK, "a missing checkpoint fails");
    EXPECT(run.dev != NULL && run.x == NULL, "the device stays open for eng_run_close, the model is not");
    EXPECT(ds.inputs == NULL && run.ds.inputs != NULL, "the run owns the given dataset even so");
    EXPECT(eng_run_close(&run, st, &err) == st, "close returns the failure");
    EXPECT(strstr(err.msg, "no-such-model") != NULL, "the message names the checkpoint: %s", err.msg);
    sched_plan_free(&plan);
    eng_run_config_free(&rc);
}

int main(void) {
    const char *tmp = getenv("TEST_TMPDIR");
    char ckpt[512];
    snprintf(ckpt, sizeof ckpt, "%s/session-test-XXXXXX", tmp && tmp[0] ? tmp : "/tmp");
    MT_CHECK(mkdtemp(ckpt), "cannot create %s", ckpt);
    char config[1024];
    snprintf(config, sizeof config,
             "{\"model_type\": \"mixtral\", \"vocab_size\": %d, \"hidden_size\": 32, \"intermediate_size\": 32,"
             " \"num_hidden_layers\": %d, \"num_attention_heads\": 4, \"num_key_value_heads\": 2,"
             " \"num_local_experts\": 4, \"num_experts_per_tok\": 2, \"rms_norm_eps\": 1e-5,"
             " \"rope_theta\": 10000.0, \"tie_word_embeddings\": false, \"output_router_logits\": true}",
             VOCAB, LAYERS);
    mt_error_t err = {0};
    MT_CHECK(eng_checkpoint_init_random(ckpt, config, 1, &err) == MT_OK, "%s", err.msg);
    test_given_parts(ckpt);
    test_failed_open(ckpt);
    if (failures) fprintf(stderr, "%d expectation(s) failed\n", failures);
    else printf("ok: a run from given parts steps and closes; a failed open is closed by eng_run_close\n");
    return failures ? 1 : 0;
}
