/* What the text datasets' files share (text.c: the tokenizer, plain text,
 * Alpaca and input/output rows; chat.c: conversations); private to
 * engine/data. */
#ifndef MT_ENGINE_DATA_TEXT_INTERNAL_H
#define MT_ENGINE_DATA_TEXT_INTERNAL_H

#include <jansson.h>

#include "engine/data/text.h"
#include "text/jinja/jinja.h"
#include "text/tokenizer/tokenizer.h"

struct eng_text {
    text_tokenizer_t *tok;
    text_template_t *tmpl;    /* NULL when no chat dataset needs one */
    json_t *special;          /* {bos_token: "<s>", eos_token: ..., ...}: what the template sees */
    char eos_text[256];       /* the EOS token's text, "" when the tokenizer names none */
    int32_t bos_id, eos_id;   /* -1 when none */
    bool train_on_inputs;
};

/* Appends one token and its label to ex. */
void eng_text_push(eng_text_example_t *ex, int32_t id, int32_t label);

/* Encodes text[0, len) (from_data per byte or NULL) and appends every token,
 * labelled as itself where trained[] (per byte, NULL: all) touches one of
 * its bytes and -100 elsewhere; every token trained with train_on_inputs. */
mt_status_t eng_text_append(const eng_text_t *t, const char *text, size_t len, const uint8_t *from_data,
                            const uint8_t *trained, bool add_special, bool all_trained, eng_text_example_t *ex,
                            const char *where, mt_error_t *err);

/* A chat_template row (chat.c). */
mt_status_t eng_text_chat_row(const eng_text_t *t, const eng_dataset_entry_t *d, const json_t *row,
                              const char *where, eng_text_example_t *ex, mt_error_t *err);

#endif
