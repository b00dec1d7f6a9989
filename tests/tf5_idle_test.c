/* Idle routed experts against real transformers 5 (run config idle_experts;
 * fixtures from tests/reference/make_tf5_idle_fixtures.py): five steps of
 * `train` on each case dir given, then per-step losses and the final
 * weights of the experts idle in some step (and expert 0 of each layer)
 * compared with torch's AdamW, relative 1e-6:
 *   step: transformers 5's fused experts, an idle expert stepped with a zero gradient;
 *   skip: each expert its own torch parameter, grad None when idle;
 * and tf5_pad_gpt_oss: the embedding row of pad_token_id gets a zero gradient
 * (nn.Embedding padding_idx), on data whose padding positions count in the loss. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "engine/config/config.h"
#include "engine/model/io/checkpoint.h"
#include "engine/model/io/safetensors.h"
#include "engine/run/train.h"
#include "tests/harness.h"

static void check_losses(const char *dir, const char *out) {
    char path[2200];
    json_error_t je;
    snprintf(path, sizeof path, "%s/expected.json", dir);
    json_t *ej = json_load_file(path, 0, &je);
    TH_CHECK(ej != NULL, "%s: %s", path, je.text);
    json_t *losses = json_object_get(ej, "losses");
    snprintf(path, sizeof path, "%s/metrics.jsonl", out);
    FILE *mf = fopen(path, "r");
    TH_CHECK(mf != NULL, "no %s", path);
    char line[4096];
    int step = 0;
    while (mf && fgets(line, sizeof line, mf)) {
        json_t *o = json_loads(line, 0, &je);
        if (!o || json_object_get(o, "run_start")) {
            json_decref(o);
            continue;
        }
        const double loss = json_real_value(json_object_get(o, "loss"));
        const double ref = json_number_value(json_array_get(losses, (size_t)step));
        const double rel = fabs(loss - ref) / fabs(ref);
        fprintf(stderr, "   step %d: loss %.9g ref %.9g rel %.2g\n", step + 1, loss, ref, rel);
        TH_CHECK(rel <= 1e-6, "step %d loss %.9g vs transformers 5 %.9g", step + 1, loss, ref);
        json_decref(o);
        step++;
    }
    if (mf) fclose(mf);
    TH_CHECK(step == (int)json_array_size(losses), "%d steps logged, reference %zu", step, json_array_size(losses));
    json_decref(ej);
}

/* max |ours - ref| / max |ref| per tensor */
static void check_weights(const char *dir, const char *out) {
    char path[2200];
    mt_error_t err = {0};
    snprintf(path, sizeof path, "%s/expected_final.safetensors", dir);
    eng_st_file_t fin;
    eng_checkpoint_t ck;
    if (eng_st_open(path, &fin, &err) != MT_OK || eng_checkpoint_open(out, &ck, &err) != MT_OK) {
        TH_CHECK(0, "final weights: %s", err.msg);
        return;
    }
    double worst = 0;
    for (int i = 0; i < fin.count; i++) {
        const eng_st_tensor_t *t = &fin.tensors[i];
        uint64_t nn = 0;
        float *ref = th_st_read(&fin, t->name, &nn);
        float *ours = malloc(nn * sizeof *ours);
        int64_t shape[4];
        for (int d = 0; d < t->ndim; d++) shape[d] = (int64_t)t->shape[d];
        if (eng_checkpoint_read_f32(&ck, t->name, t->ndim, shape, ours, &err) != MT_OK) {
            TH_CHECK(0, "final checkpoint: %s", err.msg);
        } else {
            double dmax = 0, rmax = 0;
            for (uint64_t j = 0; j < nn; j++) {
                dmax = fmax(dmax, fabs((double)ours[j] - ref[j]));
                rmax = fmax(rmax, fabs((double)ref[j]));
            }
            const double rel = dmax / rmax;
            worst = fmax(worst, rel);
            TH_CHECK(rel <= 1e-6, "%s: max relative difference %.3g", t->name, rel);
        }
        free(ref);
        free(ours);
    }
    fprintf(stderr, "   final weights (%d tensors): worst max|diff|/max|ref| %.3g\n", fin.count, worst);
    eng_checkpoint_close(&ck);
    eng_st_close(&fin);
}

static void check_case(const char *dir) {
    char path[2048];
    mt_error_t err = {0};
    fprintf(stderr, "== %s\n", dir);
    snprintf(path, sizeof path, "%s/run.yaml", dir);
    eng_run_config_t rc;
    if (eng_run_config_load(path, &rc, &err) != MT_OK) {
        TH_CHECK(0, "run config: %s", err.msg);
        return;
    }
    const char *tmp = getenv("TEST_TMPDIR");
    snprintf(rc.output_dir, sizeof rc.output_dir, "%s/%s-out", tmp ? tmp : "/tmp", th_base_name(dir));
    rc.progress = false;
    eng_train_result_t res;
    if (eng_train(&rc, &res, &err) != MT_OK) {
        TH_CHECK(0, "train: %s", err.msg);
    } else {
        check_losses(dir, rc.output_dir);
        check_weights(dir, rc.output_dir);
    }
    eng_run_config_free(&rc);
}

int main(int argc, char **argv) {
    for (int i = 1; i < argc; i++) check_case(argv[i]);
    return th_finish();
}
