/* One copy of the helpers the engine-level tests share (tests/harness.h).
 * The failure count is the one piece of state: a test binary is one
 * program that runs its checks one after another. */
#include "tests/harness.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int g_failures;

void th_fail(const char *file, int line, const char *fmt, ...) {
    fprintf(stderr, "FAIL %s:%d: ", file, line);
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    g_failures++;
}

int th_failures(void) { return g_failures; }

int th_finish(void) {
    if (g_failures) {
        fprintf(stderr, "%d failure(s)\n", g_failures);
        return 1;
    }
    fprintf(stderr, "all passed\n");
    return 0;
}

int th_parse_compute(int argc, char **argv, mt_dtype_t *compute) {
    const bool bf16 = argc > 1 && strcmp(argv[1], "--bf16") == 0;
    *compute = bf16 ? MT_BF16 : MT_F32;
    return bf16 ? 2 : 1;
}

const char *th_base_name(const char *dir) {
    const char *s = strrchr(dir, '/');
    return s ? s + 1 : dir;
}

double th_rel(double a, double b) { return fabs(a - b) / fmax(fmax(fabs(a), fabs(b)), 1e-30); }

mt_status_t th_run_config_load(const char *dir, eng_run_config_t *rc, mt_error_t *err) {
    char path[1024];
    snprintf(path, sizeof path, "%s/run.yaml", dir);
    return eng_run_config_load(path, rc, err);
}

kern_device_t *th_cpu_device(size_t budget) {
    kern_device_t *dev = NULL;
    mt_error_t err = {0};
    kern_device_opts_t o = {.device_budget_bytes = budget};
    TH_CHECK(kern_device_create(KERN_BACKEND_CPU, &o, &dev, &err) == MT_OK, "%s", err.msg);
    return dev;
}

eng_optim_hparams_t th_hparams(const eng_run_config_t *rc) {
    return (eng_optim_hparams_t){.lr = rc->learning_rate, .beta1 = rc->adam_beta1, .beta2 = rc->adam_beta2,
                                 .eps = rc->adam_epsilon, .weight_decay = rc->weight_decay,
                                 .max_grad_norm = rc->max_grad_norm,
                                 .skip_idle_experts = rc->idle_experts == ENG_IDLE_EXPERTS_SKIP};
}

mt_status_t th_dataset_load(eng_dataset_t *ds, const eng_run_config_t *rc, int vocab, mt_error_t *err) {
    const char *paths[ENG_MAX_DATASETS];
    for (int i = 0; i < rc->num_datasets; i++) paths[i] = rc->datasets[i].path;
    return eng_dataset_load(ds, paths, rc->num_datasets, rc->sequence_len, vocab, err);
}

float *th_st_read(const eng_st_file_t *f, const char *name, uint64_t *numel) {
    const eng_st_tensor_t *t = eng_st_find(f, name);
    if (!t) return NULL;
    float *buf = malloc((t->numel ? t->numel : 1) * sizeof *buf);
    mt_error_t err = {0};
    if (eng_st_read_f32(f, t, buf, &err) != MT_OK) {
        fprintf(stderr, "cannot read %s: %s\n", name, err.msg);
        free(buf);
        return NULL;
    }
    if (numel) *numel = t->numel;
    return buf;
}

void th_result_read_weights(th_result_t *r, eng_exec_t *x) {
    const eng_model_t *m = eng_exec_model(x);
    r->nparams = m->num_params;
    r->weights = calloc((size_t)m->num_params, sizeof *r->weights);
    r->numel = calloc((size_t)m->num_params, sizeof *r->numel);
    r->names = calloc((size_t)m->num_params, sizeof *r->names);
    for (int i = 0; i < m->num_params; i++) {
        r->numel[i] = m->params[i].spec->numel;
        r->names[i] = strdup(m->params[i].spec->name);
        r->weights[i] = malloc(r->numel[i] * sizeof(float));
        eng_exec_read_param(x, i, r->weights[i], false);
    }
}

void th_result_free(th_result_t *r) {
    for (int i = 0; i < r->nparams; i++) {
        free(r->weights[i]);
        free(r->names[i]);
    }
    free(r->names);
    free(r->weights);
    free(r->numel);
    r->names = NULL;
    r->weights = NULL;
    r->numel = NULL;
    r->nparams = 0;
}

size_t th_result_bytes(const th_result_t *r) {
    size_t n = 0;
    for (int i = 0; i < r->nparams; i++) n += r->numel[i] * sizeof(float);
    return n;
}

void th_compare_steps(const char *what, const th_result_t *a, const th_result_t *b, int steps, bool exact,
                      double tol) {
    for (int s = 0; s < steps; s++) {
        if (exact || s == 0)
            TH_CHECK(a->loss[s] == b->loss[s], "%s: step %d loss %.17g vs %.17g", what, s + 1, a->loss[s],
                     b->loss[s]);
        else
            TH_CHECK(th_rel(a->loss[s], b->loss[s]) <= tol, "%s: step %d loss %.17g vs %.17g", what, s + 1,
                     a->loss[s], b->loss[s]);
        if (exact)
            TH_CHECK(a->norm[s] == b->norm[s], "%s: step %d grad norm %.17g vs %.17g", what, s + 1, a->norm[s],
                     b->norm[s]);
        else
            TH_CHECK(th_rel(a->norm[s], b->norm[s]) <= tol, "%s: step %d grad norm %.17g vs %.17g", what, s + 1,
                     a->norm[s], b->norm[s]);
    }
}

void th_compare_weights(const char *what, const th_result_t *a, const th_result_t *b, bool exact, double tol,
                        const char *noise) {
    TH_CHECK(a->nparams == b->nparams, "%s: %d vs %d parameters", what, a->nparams, b->nparams);
    int differing = 0, worst_i = -1;
    double worst = 0, worst_elem = 0, all_dd = 0, all_nn = 0;
    for (int i = 0; i < a->nparams && i < b->nparams; i++) {
        if (memcmp(a->weights[i], b->weights[i], a->numel[i] * sizeof(float)) != 0) differing++;
        const bool skip = noise && strstr(a->names[i], noise) != NULL;
        double dd = 0, nn = 0;
        for (size_t e = 0; e < a->numel[i]; e++) {
            const double x = a->weights[i][e], y = b->weights[i][e];
            dd += (x - y) * (x - y);
            nn += x * x;
            /* printed only: AdamW moves an element whose gradient nearly
             * cancels by about lr either way, so no bound holds per element */
            worst_elem = fmax(worst_elem, fabs(x - y) / fmax(fmax(fabs(x), fabs(y)), 1e-2));
        }
        all_dd += dd;
        all_nn += nn;
        const double r = nn > 0 ? sqrt(dd / nn) : sqrt(dd);
        if (r > worst && !skip) {
            worst = r;
            worst_i = i;
        }
    }
    const double all = sqrt(all_dd / all_nn);
    fprintf(stderr,
            "   %-50s %d of %d tensors differ; whole model %.3g, worst tensor %.3g (%s), worst element %.3g",
            what, differing, a->nparams, all, worst, worst_i >= 0 ? a->names[worst_i] : "-", worst_elem);
    if (exact)
        fprintf(stderr, " (must be bit-identical)\n");
    else
        fprintf(stderr, " (whole model and each tensor <= %.3g)\n", tol);
    if (exact) {
        TH_CHECK(differing == 0, "%s: %d parameters differ", what, differing);
    } else {
        TH_CHECK(all <= tol, "%s: the weights differ by %.3g relative", what, all);
        TH_CHECK(worst <= tol, "%s: %s differs by %.3g relative", what, worst_i >= 0 ? a->names[worst_i] : "-",
                 worst);
    }
}
