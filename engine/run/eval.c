/* Evaluation (see eval.h). */
#include "engine/run/eval.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "base/clock.h"
#include "engine/data/split.h"
#include "engine/data/text.h"

mt_status_t eng_eval_open_set(const eng_run_config_t *rc, int vocab, eng_dataset_t *train, eng_dataset_t *eval,
                              mt_error_t *err) {
    memset(eval, 0, sizeof *eval);
    const char *what;
    mt_status_t st = MT_OK;
    if (rc->num_test_datasets > 0) {
        const char *paths[ENG_MAX_DATASETS];
        for (int i = 0; i < rc->num_test_datasets; i++) paths[i] = rc->test_datasets[i].path;
        eng_text_t *text;
        st = eng_text_open_for(rc, rc->test_datasets, rc->num_test_datasets, &text, err);
        if (st != MT_OK) return st;
        const eng_data_opts_t o = {.T = rc->sequence_len, .vocab_size = vocab, .entries = rc->test_datasets,
                                   .text = text};
        st = eng_dataset_load_opts(eval, paths, rc->num_test_datasets, &o, err);
        eng_text_free(text);
        if (st != MT_OK) return mt_error_prefix(err, "test_datasets: ");
        what = "test_datasets";
    } else if (rc->val_set_size.size > 0) {
        char key[96];
        snprintf(key, sizeof key, "val_set_size (of the %lld examples of datasets)", (long long)train->num_rows);
        st = eng_dataset_split(train, rc->val_set_size.size, rc->seed, key, eval, err);
        if (st != MT_OK) return st;
        what = "val_set_size";
    } else {
        return MT_OK;
    }
    if (eng_dataset_counted(eval) == 0)
        return mt_error_set(err, MT_ERR_DATA,
                            "%s: the evaluation set's %lld examples have no trained token (every label is -100 "
                            "after the shift), so it has no loss; evaluate on examples with labels",
                            what, (long long)eval->num_rows);
    return MT_OK;
}

bool eng_eval_due(const eng_run_config_t *rc, const eng_dataset_t *eval, int done, int total) {
    if (eval->num_rows == 0 || rc->eval_steps == 0) return false;
    if (rc->eval_steps < 0) return done == total;
    return done % rc->eval_steps == 0;
}

mt_status_t eng_eval_run(eng_exec_t *x, const eng_run_config_t *rc, const eng_dataset_t *eval,
                         eng_eval_result_t *out, mt_error_t *err) {
    memset(out, 0, sizeof *out);
    const double t0 = mt_now_s();
    const int bs = rc->eval_batch_size > 0 ? rc->eval_batch_size : rc->micro_batch_size;
    eng_loader_t ld;
    eng_loader_init(&ld, eval, bs, false, rc->seed);
    const int64_t nb = eng_loader_batches_per_epoch(&ld);
    double sum = 0;
    mt_status_t st = MT_OK;
    for (int64_t i = 0; i < nb && st == MT_OK; i++) {
        eng_batch_t b;
        eng_loader_next(&ld, &b);
        eng_micro_stats_t ms;
        st = eng_exec_forward(x, &b, NULL, &ms, err);
        if (st != MT_OK) {
            mt_error_prefix(err, "evaluation batch %lld of %lld: ", (long long)i + 1, (long long)nb);
            break;
        }
        sum += ms.ce_sum;
        out->counted += ms.counted;
        out->tokens += ms.tokens;
        out->examples += b.B;
        out->batches++;
    }
    eng_loader_free(&ld);
    if (st != MT_OK) return st;
    out->loss = out->counted > 0 ? sum / (double)out->counted : 0.0;
    out->ppl = exp(out->loss);
    out->seconds = mt_now_s() - t0;
    if (!isfinite(out->loss))
        return mt_error_set(err, MT_ERR_DATA, "evaluation: the eval loss is %g (the weights give non-finite logits)",
                            out->loss);
    return MT_OK;
}
