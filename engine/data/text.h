/* Text datasets: rows of text, instructions or conversations turned into
 * token ids and labels with the model's own tokenizer (tokenizer.json) and
 * chat template, as the tools users come from (axolotl, TRL) do.
 *
 * What each datasets[].type makes of one JSON row (labels as HF's: the
 * token itself where it is trained, -100 where not; train_on_inputs: true
 * trains every token):
 *   completion / pretrain  row[field] (default "text"), encoded with the
 *                 tokenizer's special tokens (its BOS), EOS appended unless
 *                 last; every token trained; a text longer than sequence_len
 *                 becomes several examples of sequence_len tokens (axolotl's
 *                 completion), never truncated.  A row with input_ids and no
 *                 text field is read as tokenized.
 *   alpaca        instruction, input (optional), output in axolotl's Alpaca
 *                 prompt; the prompt (with BOS) untrained, the output and
 *                 its EOS trained.
 *   input_output  segments: [{text, label}], each encoded without special
 *                 tokens and concatenated; label true trains the segment.
 *   chat_template row[field_messages] (default "messages"), messages with
 *                 role and content under message_property_mappings' keys,
 *                 rendered by the chat template (text/jinja) as transformers'
 *                 apply_chat_template(tokenize=False) renders it and encoded
 *                 without adding special tokens, as it does.  A user's text
 *                 never becomes a special token (text/tokenizer's from_data).
 *                 Trained: with a template that marks {% generation %},
 *                 exactly transformers' assistant mask; otherwise each
 *                 message whose role is in roles_to_train, from its first
 *                 rendered byte of content (reasoning included) to its last
 *                 (found by rendering the conversation again with that
 *                 message's text replaced, axolotl's method), plus the EOS
 *                 token that closes the turn as train_on_eos says.
 * An example's tokens and labels are the row's whole; sequence_len
 * truncation and packing are the dataset's (data.h). */
#ifndef MT_ENGINE_DATA_TEXT_H
#define MT_ENGINE_DATA_TEXT_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/status.h"
#include "engine/config/config.h"
#include "engine/data/text_encode.h" /* eng_text_example_t */


typedef struct {
    const char *tokenizer_dir;       /* tokenizer.json, tokenizer_config.json, chat_template.jinja */
    const char *chat_template;       /* "tokenizer_default", a named template, or "jinja" */
    const char *chat_template_jinja; /* chat_template: jinja: the template's text */
    bool train_on_inputs;
    bool need_template;              /* a chat_template dataset is read: the template must exist */
} eng_text_opts_t;

/* Reads the tokenizer and, when o->need_template, the chat template.
 * Errors name the file (tokenizer.json, tokenizer_config.json) or the key
 * (chat_template) and what was expected. */
mt_status_t eng_text_open(const eng_text_opts_t *o, eng_text_t **out, mt_error_t *err);
void eng_text_free(eng_text_t *t);

/* What a run config's dataset entries need: *out = NULL when every entry
 * is tokenized; otherwise the tokenizer from tokenizer_config (default
 * base_model) and, with a chat_template entry, the template.  A completion
 * entry alone opens the tokenizer only when tokenizer.json exists (its rows
 * may be tokenized already; a text row without one is then an error). */
mt_status_t eng_text_open_for(const eng_run_config_t *rc, const eng_dataset_entry_t *entries, int num_entries,
                              eng_text_t **out, mt_error_t *err);


/* One row of dataset entry d -> *ex (emptied first; ex->n == 0: the row
 * yields no token).  `where` ("FILE:LINE") prefixes every error: a field
 * missing or of the wrong type, an unknown role, a template that fails to
 * render, text that is not UTF-8. */
mt_status_t eng_text_row(const eng_text_t *t, const eng_dataset_entry_t *d, const json_t *row, const char *where,
                         eng_text_example_t *ex, mt_error_t *err);
void eng_text_example_free(eng_text_example_t *ex);

/* Plain encoding of text[0, len) (with the tokenizer's special tokens when
 * add_special), every token its own label, into *ex (emptied first): what
 * the tokenizer makes of a text, without a dataset format around it. */
mt_status_t eng_text_encode(const eng_text_t *t, const char *text, size_t len, bool add_special, const char *where,
                            eng_text_example_t *ex, mt_error_t *err);

/* Token id's text in the vocabulary (NULL if none). */
const char *eng_text_token(const eng_text_t *t, int32_t id);
/* The tokenizer's vocabulary size (largest id + 1). */
int32_t eng_text_vocab_size(const eng_text_t *t);

#endif
