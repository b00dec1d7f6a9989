/* The prepared-data cache (`dataset_prepared_path`): a JSONL file's
 * examples, once tokenized, kept in one binary file per (data file,
 * tokenizer, settings), so that a later run (or a resume) reads tokens
 * instead of tokenizing again.
 *
 * The key is a 128-bit hash of everything the examples depend on: the data
 * file's bytes, the dataset entry's settings (type, fields, roles, EOS
 * rule), the reader's fingerprint (tokenizer.json, tokenizer_config.json,
 * the template text, train_on_inputs), sequence_len (completions are split
 * by it) and the vocabulary size.  Change any of them and the key changes:
 * a stale file is never read, only left unused.
 *
 * File: "MTEXAMP1", the key, counts, then the examples' arrays (examples.h)
 * and a checksum of all of it.  It is written under a temporary name and
 * renamed, so a killed run leaves no half file under a key; a file that
 * fails its size or checksum check is reported and the data tokenized
 * again (and the file rewritten), never used. */
#ifndef MT_ENGINE_DATA_PREPARED_H
#define MT_ENGINE_DATA_PREPARED_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/status.h"
#include "engine/config/config.h"
#include "engine/data/examples.h"
#include "engine/data/text_encode.h"

typedef struct {
    uint64_t h[2];
} eng_prep_key_t;

/* 128-bit FNV-1a style hash of len bytes, continuing from *k (start from
 * eng_prep_key_start); the same whether bytes come at once or in pieces. */
eng_prep_key_t eng_prep_key_start(void);
void eng_prep_key_add(eng_prep_key_t *k, const void *data, size_t len);

/* The key of data file `path` read as entry d (NULL: tokenized) with
 * reader text (NULL: none). */
mt_status_t eng_prep_key_of(const char *path, const eng_dataset_entry_t *d, const eng_text_t *text, int T,
                            int vocab, eng_prep_key_t *out, mt_error_t *err);

/* Appends the cached examples of key k to ex (their file index `file`);
 * false when there is no file for k, or it fails its checks (then *note
 * says why, for a warning). */
bool eng_prep_load(const char *dir, const eng_prep_key_t *k, eng_examples_t *ex, int file, char *note, size_t cap);

/* Writes ex's examples [first, ex->n) under key k (dir created if needed). */
mt_status_t eng_prep_save(const char *dir, const eng_prep_key_t *k, const eng_examples_t *ex, int64_t first,
                          int64_t untrained, mt_error_t *err);

#endif
