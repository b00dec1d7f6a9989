/* A text dataset's reader and the example it builds, shared by text.c
 * (plain text, Alpaca, input/output rows) and chat.c (conversations):
 * the tokenizer, the template and the special tokens they were read with,
 * and encoding text into tokens and labels.  The struct is private to
 * engine/data's text files; everything else goes through text.h. */
#ifndef MT_ENGINE_DATA_TEXT_ENCODE_H
#define MT_ENGINE_DATA_TEXT_ENCODE_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/status.h"
#include "text/jinja/jinja.h"
#include "text/tokenizer/tokenizer.h"

typedef struct eng_text {
    text_tokenizer_t *tok;
    text_template_t *tmpl;    /* NULL when no chat dataset needs one */
    json_t *special;          /* {bos_token: "<s>", eos_token: ..., ...}: what the template sees */
    char eos_text[256];       /* the EOS token's text, "" when the tokenizer names none */
    int32_t bos_id, eos_id;   /* -1 when none */
    bool train_on_inputs;
    uint64_t fingerprint[2];  /* a hash of what encoding depends on (prepared.h keys by it) */
} eng_text_t;

typedef struct {
    int32_t *ids, *labels; /* (n) */
    size_t n, cap;
    bool split;            /* completion: split into sequence_len pieces rather than truncated */
    char *text;            /* chat_template: the rendered conversation (len bytes), else NULL */
    size_t text_len;
} eng_text_example_t;

void eng_text_example_free(eng_text_example_t *ex);

/* Appends one token and its label to ex. */
void eng_text_push(eng_text_example_t *ex, int32_t id, int32_t label);

/* Encodes text[0, len) (from_data per byte or NULL) and appends every token,
 * labelled as itself where trained[] (per byte, NULL: all) touches one of
 * its bytes and -100 elsewhere; every token trained with all_trained or the
 * reader's train_on_inputs.  Errors are prefixed with `where`. */
mt_status_t eng_text_append(const eng_text_t *t, const char *text, size_t len, const uint8_t *from_data,
                            const uint8_t *trained, bool add_special, bool all_trained, eng_text_example_t *ex,
                            const char *where, mt_error_t *err);

#endif
