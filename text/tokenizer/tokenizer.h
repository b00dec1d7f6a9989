/* Hugging Face tokenizers, read from tokenizer.json, encoding and decoding
 * exactly as the `tokenizers` library (0.23) does for the pipelines of the
 * model families moetune trains: byte-level BPE (GPT-2, GPT-NeoX/OLMoE,
 * Qwen2/Qwen3, DeepSeek-V3, gpt-oss) and SentencePiece-style BPE
 * (Llama-2/Mixtral: Prepend/Replace normalizers or Metaspace, byte fallback).
 * docs/tokenizers.md lists what is supported and what is refused.
 *
 * Encoding, as `tokenizers` does it:
 *   1. added tokens with normalized=false are matched on the input (leftmost,
 *      longest; single_word, lstrip and rstrip as `tokenizers` applies them);
 *   2. each piece between them is normalized, then added tokens with
 *      normalized=true are matched on the normalized text;
 *   3. the rest is pre-tokenized and each pre-token encoded by the BPE model;
 *   4. the post-processor adds special tokens (when add_special_tokens) and
 *      trims offsets (ByteLevel trim_offsets).
 *
 * The user-data rule: `from_data`, when not NULL, holds one flag per input
 * byte; a *special* added token is never matched over a range that touches a
 * flagged byte, so a literal "<|im_end|>" typed by a user is encoded as plain
 * text.  Non-special added tokens still match there.  With from_data == NULL
 * the result is the library's.
 *
 * Offsets are byte offsets [start, end) into the input text (the library's
 * Rust offsets; Python's are the same positions counted in characters).
 * Tokens added by the post-processor have offsets (0, 0).
 *
 * A loaded tokenizer is read-only: encode and decode may run on it from
 * several threads at once. */
#ifndef MT_TEXT_TOKENIZER_H
#define MT_TEXT_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/status.h"

typedef struct text_tokenizer text_tokenizer_t;

/* Token ids with byte offsets, appendable: zero-initialise, pass to encode
 * as often as wanted (each call appends), free with text_tokens_free. */
typedef struct {
    int32_t *ids;
    uint32_t *start, *end; /* (n) byte offsets into the text of the call that added the token */
    size_t n, cap;
} text_tokens_t;

/* Reads tokenizer.json.  MT_ERR_IO when it cannot be read, MT_ERR_FORMAT for
 * malformed JSON, MT_ERR_UNSUPPORTED naming the JSON path and type of a
 * component this implementation does not have (e.g. a WordPiece or Unigram
 * model, a BertNormalizer). */
mt_status_t text_tokenizer_load(const char *tokenizer_json_path, text_tokenizer_t **out, mt_error_t *err);
/* The same from tokenizer.json's text; `what` names it in messages. */
mt_status_t text_tokenizer_load_string(const char *json, size_t len, const char *what, text_tokenizer_t **out,
                                       mt_error_t *err);
void text_tokenizer_free(text_tokenizer_t *t);

/* Encodes text[0, len) and appends its tokens to out.  MT_ERR_DATA naming the
 * byte offset when the text is not valid UTF-8 (nothing is appended then). */
mt_status_t text_tokenizer_encode(const text_tokenizer_t *t, const char *text, size_t len, const uint8_t *from_data,
                                  bool add_special_tokens, text_tokens_t *out, mt_error_t *err);

/* Decodes ids to a NUL-terminated string (*text, caller frees with free(),
 * *len bytes without the NUL).  Ids outside the vocabulary are skipped, as
 * the library skips them; skip_special leaves out special added tokens. */
mt_status_t text_tokenizer_decode(const text_tokenizer_t *t, const int32_t *ids, size_t n, bool skip_special,
                                  char **text, size_t *len, mt_error_t *err);

int32_t text_tokenizer_token_id(const text_tokenizer_t *t, const char *token); /* -1 if none */
const char *text_tokenizer_token(const text_tokenizer_t *t, int32_t id);       /* NULL if none */
int32_t text_tokenizer_vocab_size(const text_tokenizer_t *t);                  /* largest id + 1 */
bool text_tokenizer_is_special(const text_tokenizer_t *t, int32_t id);

void text_tokens_free(text_tokens_t *toks);

#endif
