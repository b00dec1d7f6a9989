/* Encoding text into an example's tokens and labels (see text_encode.h). */
#include "engine/data/text_encode.h"

#include <stdlib.h>
#include <string.h>

#define IGNORE_INDEX (-100)

void eng_text_push(eng_text_example_t *ex, int32_t id, int32_t label) {
    if (ex->n == ex->cap) {
        ex->cap = ex->cap ? 2 * ex->cap : 256;
        ex->ids = realloc(ex->ids, ex->cap * sizeof *ex->ids);
        ex->labels = realloc(ex->labels, ex->cap * sizeof *ex->labels);
        MT_CHECK(ex->ids && ex->labels, "out of memory for an example's tokens");
    }
    ex->ids[ex->n] = id;
    ex->labels[ex->n] = label;
    ex->n++;
}

mt_status_t eng_text_append(const eng_text_t *t, const char *text, size_t len, const uint8_t *from_data,
                            const uint8_t *trained, bool add_special, bool all_trained, eng_text_example_t *ex,
                            const char *where, mt_error_t *err) {
    text_tokens_t toks = {0};
    mt_status_t st = text_tokenizer_encode(t->tok, text, len, from_data, add_special, &toks, err);
    if (st != MT_OK) {
        text_tokens_free(&toks);
        return mt_error_prefix(err, "%s: ", where);
    }
    for (size_t i = 0; i < toks.n; i++) {
        bool on = all_trained || t->train_on_inputs || !trained;
        for (uint32_t b = toks.start[i]; !on && b < toks.end[i] && b < len; b++) on = trained[b];
        eng_text_push(ex, toks.ids[i], on ? toks.ids[i] : IGNORE_INDEX);
    }
    text_tokens_free(&toks);
    return MT_OK;
}

void eng_text_example_free(eng_text_example_t *ex) {
    free(ex->ids);
    free(ex->labels);
    free(ex->text);
    memset(ex, 0, sizeof *ex);
}
