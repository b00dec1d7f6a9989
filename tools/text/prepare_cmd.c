/* `moetune prepare` (see prepare_cmd.h).  The datasets go through the same
 * functions a training run opens them with (engine/data), so the counts are
 * what training sees; the vocabulary they are checked against is the base
 * model's config.json when it exists (else the tokenizer's, else none). */
#include "tools/text/prepare_cmd.h"

#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <string.h>

#include "base/clock.h"
#include "engine/config/config.h"
#include "engine/data/data.h"
#include "engine/data/split.h"
#include "engine/data/text.h"

static int vocab_of(const eng_run_config_t *rc, const eng_text_t *text) {
    char path[1100];
    snprintf(path, sizeof path, "%s/config.json", rc->base_model);
    json_t *cfg = json_load_file(path, 0, NULL);
    const json_t *v = cfg ? json_object_get(cfg, "vocab_size") : NULL;
    int vocab = json_is_integer(v) ? (int)json_integer_value(v) : text ? (int)eng_text_vocab_size(text) : 0;
    json_decref(cfg);
    return vocab;
}

static void report(const eng_run_config_t *rc, const eng_dataset_t *ds, double secs) {
    const int64_t trained = eng_dataset_counted(ds);
    printf("datasets    %d file(s), read in %.2f s\n", rc->num_datasets, secs);
    printf("examples    %" PRId64 " (%" PRId64 " truncated to sequence_len %d, %" PRId64
           " left out without a trained token)\n",
           ds->examples, ds->truncated, rc->sequence_len, ds->dropped);
    printf("rows        %" PRId64 " of %d positions%s\n", ds->num_rows, ds->T,
           rc->sample_packing ? " (packed)" : " (one example each, padded)");
    printf("tokens      %" PRId64 " real, %" PRId64 " trained (%.1f%%)\n", ds->real_tokens, trained,
           ds->real_tokens ? 100.0 * (double)trained / (double)ds->real_tokens : 0.0);
    printf("efficiency  %.1f%% of positions hold a real token\n", 100.0 * eng_dataset_efficiency(ds));
}

int mt_prepare_main(int argc, char **argv) {
    if (argc < 1 || argv[0][0] == '-') {
        fprintf(stderr, "usage: moetune prepare RUN.yaml [--set key=value]...\n");
        return 2;
    }
    eng_run_config_t rc;
    mt_error_t err = {0};
    mt_status_t st = eng_run_config_load(argv[0], &rc, &err);
    for (int i = 1; st == MT_OK && i < argc; i++) {
        if (strcmp(argv[i], "--set") == 0 && i + 1 < argc) st = eng_run_config_set(&rc, argv[++i], &err);
        else st = mt_error_set(&err, MT_ERR_CONFIG, "unexpected argument '%s'", argv[i]);
    }
    if (st == MT_OK) st = eng_run_config_validate(&rc, &err);
    eng_text_t *text = NULL;
    if (st == MT_OK) st = eng_text_open_for(&rc, rc.datasets, rc.num_datasets, &text, &err);
    eng_dataset_t ds = {0};
    eng_data_report_t rep = {0};
    const double t0 = mt_now_s();
    if (st == MT_OK) {
        const char *paths[ENG_MAX_DATASETS];
        for (int i = 0; i < rc.num_datasets; i++) paths[i] = rc.datasets[i].path;
        const eng_data_opts_t o = {.T = rc.sequence_len, .vocab_size = vocab_of(&rc, text), .pack = rc.sample_packing,
                                   .seed = rc.seed, .entries = rc.datasets, .text = text,
                                   .prepared_dir = rc.dataset_prepared_path[0] ? rc.dataset_prepared_path : NULL,
                                   .report = &rep};
        st = eng_dataset_load_opts(&ds, paths, rc.num_datasets, &o, &err);
    }
    if (st == MT_OK) report(&rc, &ds, mt_now_s() - t0);
    if (st == MT_OK && rep.note[0]) printf("warning     %s\n", rep.note);
    if (st == MT_OK && rc.dataset_prepared_path[0])
        printf("prepared    %d file(s) read from %s, %d tokenized and written there\n", rep.files_cached,
               rc.dataset_prepared_path, rep.files_written);
    else fprintf(stderr, "moetune prepare: error: %s\n", err.msg);
    eng_dataset_free(&ds);
    eng_text_free(text);
    eng_run_config_free(&rc);
    return st == MT_OK ? 0 : 1;
}
