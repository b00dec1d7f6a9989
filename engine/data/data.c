/* Training data -> rows of (inputs, shifted targets, mask), and the
 * micro-batch loader (see data.h for the row layout).
 *
 * Design notes:
 * - Everything is checked while loading, once: a bad line or an id outside
 *   the vocabulary is an error naming file and line (or token offset)
 *   before any training starts, not a crash in the embedding kernel later.
 *   All ids and labels of an example are checked, also the truncated tail:
 *   an out-of-range id anywhere means the data was tokenized for another
 *   model.
 * - Rows are materialised (T inputs + T targets + T mask bytes each), so
 *   the loader only gathers rows; the per-epoch order is the only state.
 * - Shuffling uses our own PRNG (splitmix64-seeded xoshiro256**, unbiased
 *   bounded draws, Fisher-Yates), so an epoch's order depends only on
 *   (seed, epoch): identical across runs, machines and libc versions, and
 *   a resumed run can rebuild it.
 * - llm.c files are little-endian int32 header + uint16/uint32 tokens, read
 *   as such; this code assumes a little-endian host (checked below). */
#include "engine/data/data.h"
#include "engine/data/pack.h"
#include "engine/data/prepared.h"
#include "engine/data/text.h"

#include "base/fileio.h"
#include "base/rng.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "llm.c token files are little-endian; add byte swapping for this host"
#endif

#define IGNORE_INDEX (-100) /* HF's CrossEntropyLoss ignore_index */

#define LLMC_HEADER_INTS 256
#define LLMC_MAGIC_U16 20240520
#define LLMC_VERSION_U16 1
#define LLMC_MAGIC_U32 20240801
#define LLMC_VERSION_U32 7

/* ---- JSONL --------------------------------------------------------------- */

/* Checks that `key` is an array of integers of length n (n < 0: any
 * length); *out = NULL when the key is absent (an error when required). */
static mt_status_t int_array(json_t *obj, const char *key, bool required, int64_t n, json_t **out,
                             const char *path, int64_t line, mt_error_t *err) {
    json_t *a = json_object_get(obj, key);
    *out = NULL;
    if (!a || json_is_null(a)) {
        if (required) return mt_error_set(err, MT_ERR_FORMAT, "%s:%" PRId64 ": no \"%s\"", path, line, key);
        return MT_OK;
    }
    if (!json_is_array(a))
        return mt_error_set(err, MT_ERR_FORMAT, "%s:%" PRId64 ": \"%s\" is not an array", path, line, key);
    size_t len = json_array_size(a);
    if (n >= 0 && (int64_t)len != n)
        return mt_error_set(err, MT_ERR_FORMAT, "%s:%" PRId64 ": \"%s\" has %zu entries, input_ids has %" PRId64,
                            path, line, key, len, n);
    for (size_t i = 0; i < len; i++) {
        if (!json_is_integer(json_array_get(a, i)))
            return mt_error_set(err, MT_ERR_FORMAT, "%s:%" PRId64 ": %s[%zu] is not an integer", path, line, key, i);
    }
    *out = a;
    return MT_OK;
}

static mt_status_t jsonl_example(eng_examples_t *ex, int file, json_t *obj, const char *path, int64_t line,
                                 int vocab, mt_error_t *err) {
    json_t *ids, *labels, *am;
    mt_status_t st = int_array(obj, "input_ids", true, -1, &ids, path, line, err);
    if (st != MT_OK) return st;
    int64_t n = (int64_t)json_array_size(ids);
    if (n == 0) return mt_error_set(err, MT_ERR_FORMAT, "%s:%" PRId64 ": input_ids is empty", path, line);
    if ((st = int_array(obj, "labels", false, n, &labels, path, line, err)) != MT_OK) return st;
    if ((st = int_array(obj, "attention_mask", false, n, &am, path, line, err)) != MT_OK) return st;

    const int64_t hi = vocab > 0 ? vocab : INT32_MAX; /* vocab <= 0: only int32 range is checked */
    for (int64_t i = 0; i < n; i++) {
        json_int_t id = json_integer_value(json_array_get(ids, (size_t)i));
        if (id < 0 || id >= hi)
            return mt_error_set(err, MT_ERR_DATA,
                                "%s:%" PRId64 ": input_ids[%" PRId64 "] = %lld is outside the vocabulary [0, %" PRId64 ")",
                                path, line, i, (long long)id, hi);
        if (labels) {
            json_int_t lab = json_integer_value(json_array_get(labels, (size_t)i));
            if (lab != IGNORE_INDEX && (lab < 0 || lab >= hi))
                return mt_error_set(err, MT_ERR_DATA,
                                    "%s:%" PRId64 ": labels[%" PRId64 "] = %lld is outside the vocabulary [0, %" PRId64
                                    ") and is not -100",
                                    path, line, i, (long long)lab, hi);
        }
        if (am) {
            json_int_t m = json_integer_value(json_array_get(am, (size_t)i));
            if (m != 0 && m != 1)
                return mt_error_set(err, MT_ERR_FORMAT, "%s:%" PRId64 ": attention_mask[%" PRId64 "] = %lld, expected 0 or 1",
                                    path, line, i, (long long)m);
        }
    }

    int32_t *buf = malloc((size_t)n * 2 * sizeof *buf);
    uint8_t *mb = malloc((size_t)n);
    MT_CHECK(buf && mb, "out of host memory reading %s:%" PRId64, path, line);
    json_t *lab_src = labels ? labels : ids;
    for (int64_t t = 0; t < n; t++) {
        buf[t] = (int32_t)json_integer_value(json_array_get(ids, (size_t)t));
        buf[n + t] = (int32_t)json_integer_value(json_array_get(lab_src, (size_t)t));
        mb[t] = (uint8_t)(am ? json_integer_value(json_array_get(am, (size_t)t)) : 1);
    }
    eng_examples_add(ex, buf, buf + n, mb, n, file, line);
    free(buf);
    free(mb);
    return MT_OK;
}

/* A row of a text dataset (text.h) as one example, or as several of at
 * most T tokens for a completion longer than T (axolotl's completion). */
static mt_status_t text_example(eng_examples_t *ex, int file, const eng_text_t *text, const eng_dataset_entry_t *d,
                                const json_t *obj, int T, int vocab, const char *path, int64_t line,
                                mt_error_t *err) {
    char where[1200];
    snprintf(where, sizeof where, "%s:%" PRId64, path, line);
    if (!text)
        return mt_error_set(err, MT_ERR_DATA,
                            "%s: a text row (no input_ids) in a %s dataset, but there is no tokenizer.json beside "
                            "the base model; set tokenizer_config: to the folder that holds the model's tokenizer",
                            where, d->type == ENG_DATA_COMPLETION ? "completion" : "text");
    eng_text_example_t te = {0};
    mt_status_t st = eng_text_row(text, d, obj, where, &te, err);
    for (size_t i = 0; st == MT_OK && vocab > 0 && i < te.n; i++)
        if (te.ids[i] >= vocab)
            st = mt_error_set(err, MT_ERR_DATA,
                              "%s: the tokenizer gave token id %d (%.60s), outside the model's vocabulary of %d: "
                              "the tokenizer (tokenizer_config) does not belong to this model",
                              where, te.ids[i], eng_text_token(text, te.ids[i]) ? eng_text_token(text, te.ids[i]) : "?",
                              vocab);
    const size_t step = te.split ? (size_t)T : te.n;
    for (size_t at = 0; st == MT_OK && at < te.n; at += step) {
        const size_t len = te.n - at < step ? te.n - at : step;
        /* position t learns label t + 1 of what fits in a row: an example
         * with none there would add nothing but padding to learn from */
        bool trained = false;
        for (size_t t = 1; t < len && t < (size_t)T && !trained; t++) trained = te.labels[at + t] != IGNORE_INDEX;
        if (trained) eng_examples_add(ex, te.ids + at, te.labels + at, NULL, (int64_t)len, file, line);
        else ex->untrained++;
    }
    eng_text_example_free(&te);
    return st;
}

/* Whether a row of entry d is read as tokenized: a tokenized entry, or a
 * completion row that carries input_ids instead of its text field. */
static bool tokenized_row(const eng_dataset_entry_t *d, const json_t *obj) {
    return !d || d->type == ENG_DATA_TOKENIZED ||
           (d->type == ENG_DATA_COMPLETION && !json_object_get(obj, d->field) && json_object_get(obj, "input_ids"));
}

static mt_status_t load_jsonl(eng_examples_t *ex, const char *path, const eng_dataset_entry_t *d,
                              const eng_data_opts_t *o, mt_error_t *err) {
    const int vocab = o->vocab_size;
    FILE *f;
    mt_status_t ost = mt_fopen_regular(path, "data file", &f, err);
    if (ost != MT_OK) return ost;
    const int file = eng_examples_file(ex, path);
    char *buf = NULL;
    size_t cap = 0;
    ssize_t got;
    int64_t line = 0, examples = 0;
    mt_status_t st = MT_OK;
    while (st == MT_OK && (got = getline(&buf, &cap, f)) != -1) {
        line++;
        size_t len = (size_t)got;
        bool blank = true;
        for (size_t i = 0; i < len && blank; i++)
            blank = buf[i] == ' ' || buf[i] == '\t' || buf[i] == '\r' || buf[i] == '\n';
        if (blank) continue;
        json_error_t je;
        json_t *obj = json_loadb(buf, len, JSON_REJECT_DUPLICATES, &je);
        if (!obj) {
            st = mt_error_set(err, MT_ERR_FORMAT, "%s:%" PRId64 ": invalid JSON at column %d: %s", path, line,
                              je.column, je.text);
        } else if (!json_is_object(obj)) {
            st = mt_error_set(err, MT_ERR_FORMAT, "%s:%" PRId64 ": expected a JSON object with \"input_ids\"", path,
                              line);
        } else if (tokenized_row(d, obj)) {
            st = jsonl_example(ex, file, obj, path, line, vocab, err);
            examples++;
        } else {
            st = text_example(ex, file, o->text, d, obj, o->T, vocab, path, line, err);
            examples++;
        }
        json_decref(obj);
    }
    if (st == MT_OK && ferror(f)) st = mt_error_set(err, MT_ERR_IO, "%s: read error", path);
    if (st == MT_OK && examples == 0) st = mt_error_set(err, MT_ERR_DATA, "%s: no examples", path);
    free(buf);
    fclose(f);
    return st;
}

/* ---- llm.c token files --------------------------------------------------- */

static mt_status_t load_llmc(eng_rows_t *r, const char *path, int vocab, mt_error_t *err) {
    FILE *f;
    mt_status_t ost = mt_fopen_regular(path, "data file", &f, err);
    if (ost != MT_OK) return ost;
    mt_status_t st = MT_OK;
    uint8_t *raw = NULL;
    int32_t hdr[LLMC_HEADER_INTS];
    if (fread(hdr, sizeof hdr, 1, f) != 1) {
        st = mt_error_set(err, MT_ERR_FORMAT, "%s: shorter than the %zu-byte llm.c header", path, sizeof hdr);
        goto done;
    }
    size_t tok_bytes;
    if (hdr[0] == LLMC_MAGIC_U16 && hdr[1] == LLMC_VERSION_U16) tok_bytes = 2;
    else if (hdr[0] == LLMC_MAGIC_U32 && hdr[1] == LLMC_VERSION_U32) tok_bytes = 4;
    else {
        st = mt_error_set(err, MT_ERR_FORMAT,
                          "%s: not an llm.c token file (magic %d version %d; expected %d v%d or %d v%d)", path,
                          hdr[0], hdr[1], LLMC_MAGIC_U16, LLMC_VERSION_U16, LLMC_MAGIC_U32, LLMC_VERSION_U32);
        goto done;
    }
    const int64_t ntok = hdr[2];
    if (ntok < 0) {
        st = mt_error_set(err, MT_ERR_FORMAT, "%s: negative token count %" PRId64 " in the header", path, ntok);
        goto done;
    }
    if (fseeko(f, 0, SEEK_END) != 0) {
        st = mt_error_set(err, MT_ERR_IO, "%s: cannot seek: %s", path, strerror(errno));
        goto done;
    }
    const int64_t fsize = (int64_t)ftello(f);
    const int64_t want = (int64_t)sizeof hdr + ntok * (int64_t)tok_bytes;
    /* llm.c's dataloader requires the exact size; a longer file is as suspect as a short one */
    if (fsize != want) {
        st = mt_error_set(err, MT_ERR_FORMAT,
                          "%s: header says %" PRId64 " tokens (%" PRId64 " bytes with the header) but the file has %" PRId64
                          " bytes",
                          path, ntok, want, fsize);
        goto done;
    }
    const int T = r->T;
    if (ntok < (int64_t)T + 1) {
        st = mt_error_set(err, MT_ERR_DATA, "%s: %" PRId64 " tokens, fewer than sequence_len + 1 = %d", path, ntok,
                          T + 1);
        goto done;
    }
    raw = malloc((size_t)ntok * tok_bytes);
    MT_CHECK_ALLOC(raw, "llm.c tokens");
    if (fseeko(f, (off_t)sizeof hdr, SEEK_SET) != 0 || fread(raw, tok_bytes, (size_t)ntok, f) != (size_t)ntok) {
        st = mt_error_set(err, MT_ERR_IO, "%s: read error", path);
        goto done;
    }
    const int64_t hi = vocab > 0 ? vocab : INT32_MAX;
    int32_t *tok = (int32_t *)malloc((size_t)ntok * sizeof(int32_t));
    MT_CHECK_ALLOC(tok, "llm.c tokens");
    for (int64_t i = 0; i < ntok; i++) {
        uint32_t v;
        if (tok_bytes == 2) {
            uint16_t u;
            memcpy(&u, raw + i * 2, 2);
            v = u;
        } else {
            memcpy(&v, raw + i * 4, 4);
        }
        if ((int64_t)v >= hi) {
            free(tok);
            st = mt_error_set(err, MT_ERR_DATA,
                              "%s: token %" PRId64 " (byte offset %" PRId64 ") = %" PRIu32
                              " is outside the vocabulary [0, %" PRId64 ")",
                              path, i, (int64_t)sizeof hdr + i * (int64_t)tok_bytes, v, hi);
            goto done;
        }
        tok[i] = (int32_t)v;
    }
    /* llm.c: row i is tokens [i*T, i*T + T]; the final token of one row is the first of the next */
    const int64_t nrows = (ntok - 1) / T;
    eng_rows_reserve(r, nrows, false);
    for (int64_t i = 0; i < nrows; i++) {
        const int32_t *src = tok + i * T;
        int64_t o = (r->rows + i) * T;
        memcpy(r->inputs + o, src, (size_t)T * sizeof(int32_t));
        memcpy(r->targets + o, src + 1, (size_t)T * sizeof(int32_t));
        memset(r->mask + o, 1, (size_t)T);
    }
    r->rows += nrows;
    free(tok);
done:
    free(raw);
    fclose(f);
    return st;
}

/* ---- dataset ------------------------------------------------------------- */

static bool ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), m = strlen(suffix);
    return n > m && strcmp(s + n - m, suffix) == 0 && s[n - m - 1] != '/';
}

typedef struct {
    uint64_t key;
    int64_t e;
} pick_t;

static int by_key(const void *a, const void *b) {
    const pick_t *x = a, *y = b;
    return x->key < y->key ? -1 : x->key > y->key;
}

/* datasets[].weight w: the file's examples [first, ex->n) taken w times
 * an epoch, in file order: each floor(w) times, and round(frac(w) x n) of
 * them, drawn from the seed and the file's place, once more.  So w = 2
 * repeats a file, w = 0.25 keeps a quarter of it, the same quarter on a
 * rerun and a resume. */
static void apply_weight(eng_examples_t *ex, int64_t first, double w, uint64_t seed, int index) {
    const int64_t n = ex->n - first;
    if (w == 1.0 || n == 0) return;
    const int64_t whole = (int64_t)w, extra = llround((w - (double)whole) * (double)n);
    pick_t *picks = malloc((size_t)n * sizeof *picks);
    uint8_t *again = calloc((size_t)n, 1);
    eng_examples_t tail;
    eng_examples_init(&tail);
    MT_CHECK(picks && again, "out of host memory weighting a dataset");
    for (int64_t e = 0; e < n; e++) {
        uint64_t st = seed ^ ((uint64_t)index << 48) ^ (uint64_t)e * 0x9e3779b97f4a7c15ull;
        picks[e] = (pick_t){mt_splitmix64(&st), e};
        const int64_t b = ex->off[first + e];
        eng_examples_add(&tail, ex->ids + b, ex->labels + b, ex->mask + b, eng_example_len(ex, first + e),
                         ex->file[first + e], ex->line[first + e]);
    }
    qsort(picks, (size_t)n, sizeof *picks, by_key);
    for (int64_t k = 0; k < extra; k++) again[picks[k].e] = 1;
    ex->n = first; /* the tail is rebuilt from its copy */
    for (int64_t e = 0; e < n; e++)
        for (int64_t m = 0; m < whole + again[e]; m++) {
            const int64_t b = tail.off[e];
            eng_examples_add(ex, tail.ids + b, tail.labels + b, tail.mask + b, eng_example_len(&tail, e), tail.file[e],
                             tail.line[e]);
        }
    eng_examples_free(&tail);
    free(again);
    free(picks);
}

/* A JSONL file's examples from the prepared-data cache when it holds them
 * (prepared.h), else read and tokenized, and written there. */
static mt_status_t read_jsonl_cached(eng_examples_t *ex, const char *path, const eng_dataset_entry_t *d,
                                     const eng_data_opts_t *o, mt_error_t *err) {
    if (!o->prepared_dir) return load_jsonl(ex, path, d, o, err);
    eng_prep_key_t key;
    mt_status_t st = eng_prep_key_of(path, d, o->text, o->T, o->vocab_size, &key, err);
    if (st != MT_OK) return st;
    const int64_t first = ex->n, untrained = ex->untrained;
    char note[600];
    if (eng_prep_load(o->prepared_dir, &key, ex, eng_examples_file(ex, path), note, sizeof note)) {
        if (o->report) o->report->files_cached++;
        return MT_OK;
    }
    if (note[0] && o->report && !o->report->note[0]) snprintf(o->report->note, sizeof o->report->note, "%s", note);
    st = load_jsonl(ex, path, d, o, err);
    if (st == MT_OK) st = eng_prep_save(o->prepared_dir, &key, ex, first, ex->untrained - untrained, err);
    if (st == MT_OK && o->report) o->report->files_written++;
    return st;
}

/* The files' names, comma separated, for a message. */
static void file_names(char *names, size_t cap, const char *const *paths, int num_paths) {
    size_t n = 0;
    names[0] = '\0';
    for (int i = 0; i < num_paths && n < cap; i++)
        n += (size_t)snprintf(names + n, cap - n, "%s%s", i ? ", " : "", paths[i]);
}

/* Reads every file: JSONL into examples, turned into rows after each file
 * (padded, so rows keep the files' order) or after the last (packed, so
 * rows pack examples of all files); llm.c streams straight into rows. */
static mt_status_t read_files(eng_rows_t *r, const char *const *paths, int num_paths, const eng_data_opts_t *o,
                              mt_error_t *err) {
    mt_status_t st = MT_OK;
    eng_examples_t ex;
    eng_examples_init(&ex);
    for (int i = 0; i < num_paths && st == MT_OK; i++) {
        const char *p = paths[i];
        if (ends_with(p, ".jsonl") || ends_with(p, ".json")) {
            const int64_t first = ex.n;
            st = read_jsonl_cached(&ex, p, o->entries ? &o->entries[i] : NULL, o, err);
            if (st == MT_OK && o->entries) apply_weight(&ex, first, o->entries[i].weight, o->seed, i);
            if (st == MT_OK && !o->pack) {
                eng_rows_add_examples(r, &ex, false, 0);
                r->dropped += ex.untrained;
                eng_examples_free(&ex);
                eng_examples_init(&ex);
            }
        } else if (ends_with(p, ".bin")) {
            st = o->pack ? mt_error_set(err, MT_ERR_CONFIG,
                                        "%s: sample_packing: true needs example boundaries, and an llm.c .bin "
                                        "file is one token stream cut into rows (they are full already); set "
                                        "sample_packing: false or give tokenized .jsonl",
                                        p)
                         : load_llmc(r, p, o->vocab_size, err);
        } else {
            st = mt_error_set(err, MT_ERR_UNSUPPORTED,
                              "%s: unknown data format; expected tokenized .jsonl/.json lines or an llm.c .bin file", p);
        }
    }
    if (st == MT_OK && o->pack) eng_rows_add_examples(r, &ex, true, o->seed);
    r->dropped += ex.untrained;
    eng_examples_free(&ex);
    return st;
}

mt_status_t eng_dataset_load_opts(eng_dataset_t *ds, const char *const *paths, int num_paths,
                                  const eng_data_opts_t *o, mt_error_t *err) {
    memset(ds, 0, sizeof *ds);
    const int T = o->T;
    if (T < 1) return mt_error_set(err, MT_ERR_CONFIG, "sequence_len must be >= 1, got %d", T);
    if (num_paths < 1) return mt_error_set(err, MT_ERR_CONFIG, "no data files given");
    eng_rows_t r = {.T = T};
    mt_status_t st = read_files(&r, paths, num_paths, o, err);
    if (st != MT_OK) {
        eng_rows_free(&r);
        return st;
    }
    /* A data set without one trainable target would train on the aux loss
     * alone (or on nothing) and still exit 0: refuse it, naming the files. */
    int64_t counted = 0;
    for (int64_t i = 0; i < r.rows * (int64_t)T && counted == 0; i++) counted += r.targets[i] != IGNORE_INDEX;
    if (counted == 0) {
        char names[1024];
        file_names(names, sizeof names, paths, num_paths);
        eng_rows_free(&r);
        return mt_error_set(err, MT_ERR_DATA,
                            "%s: no example has a token to learn: every label is -100 or every example is "
                            "one token long (position t learns token t+1, so a 1-token example has no "
                            "target); training would see no language-model loss",
                            names);
    }
    ds->T = T;
    ds->num_rows = r.rows;
    ds->inputs = r.inputs;
    ds->targets = r.targets;
    ds->mask = r.mask;
    ds->seg_start = r.seg_start;
    ds->mask_holes = r.mask_holes;
    memcpy(ds->mask_holes_first, r.mask_holes_first, sizeof ds->mask_holes_first);
    ds->examples = r.examples;
    ds->truncated = r.truncated;
    ds->dropped = r.dropped;
    ds->real_tokens = r.real_tokens;
    return MT_OK;
}

mt_status_t eng_dataset_load(eng_dataset_t *ds, const char *const *paths, int num_paths, int T, int vocab_size,
                             mt_error_t *err) {
    const eng_data_opts_t o = {.T = T, .vocab_size = vocab_size};
    return eng_dataset_load_opts(ds, paths, num_paths, &o, err);
}

double eng_dataset_efficiency(const eng_dataset_t *ds) {
    const double slots = (double)ds->num_rows * ds->T;
    return slots > 0 ? (double)ds->real_tokens / slots : 0.0;
}

int eng_mask_kv_len(const uint8_t *mask, int T) {
    int n = T;
    while (n > 0 && !mask[n - 1]) n--;
    return n;
}

bool eng_dataset_mask_warning(const eng_dataset_t *ds, char *buf, size_t cap) {
    if (ds->mask_holes <= 0) return false;
    snprintf(buf, cap,
             "%" PRId64 " row(s) have attention_mask zeros before their last 1 (left padding or holes; the first "
             "at %s). Attention masks only the keys after a row's last 1; HF masks every 0 key, so those rows' "
             "logits and losses differ from HF's. Pad on the right to match it.",
             ds->mask_holes, ds->mask_holes_first);
    return true;
}

void eng_dataset_free(eng_dataset_t *ds) {
    if (!ds) return;
    free(ds->seg_start);
    free(ds->inputs);
    free(ds->targets);
    free(ds->mask);
    memset(ds, 0, sizeof *ds);
}

/* ---- loader -------------------------------------------------------------- */

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static uint64_t xoshiro256ss(uint64_t st[4]) {
    const uint64_t result = rotl(st[1] * 5, 7) * 9, t = st[1] << 17;
    st[2] ^= st[0];
    st[3] ^= st[1];
    st[1] ^= st[2];
    st[0] ^= st[3];
    st[2] ^= t;
    st[3] = rotl(st[3], 45);
    return result;
}

/* Uniform in [0, n) without modulo bias (Lemire's multiply-and-reject). */
static uint64_t below(uint64_t st[4], uint64_t n) {
    __uint128_t m = (__uint128_t)xoshiro256ss(st) * n;
    uint64_t lo = (uint64_t)m;
    if (lo < n) {
        const uint64_t threshold = (0 - n) % n;
        while (lo < threshold) {
            m = (__uint128_t)xoshiro256ss(st) * n;
            lo = (uint64_t)m;
        }
    }
    return (uint64_t)(m >> 64);
}

static void build_order(eng_loader_t *ld) {
    const int64_t n = ld->ds->num_rows;
    for (int64_t i = 0; i < n; i++) ld->order[i] = i;
    if (!ld->shuffle) return;
    /* The epoch is hashed into the seed (not added to it) so that streams
     * of (seed, e+1) and (seed+1, e) have nothing in common. */
    uint64_t e = (uint64_t)ld->epoch;
    uint64_t s = ld->seed ^ mt_splitmix64(&e);
    uint64_t st[4];
    for (int i = 0; i < 4; i++) st[i] = mt_splitmix64(&s);
    for (int64_t i = n - 1; i > 0; i--) {
        int64_t j = (int64_t)below(st, (uint64_t)i + 1);
        int64_t t = ld->order[i];
        ld->order[i] = ld->order[j];
        ld->order[j] = t;
    }
}

void eng_loader_init(eng_loader_t *ld, const eng_dataset_t *ds, int micro_batch, bool shuffle, uint64_t seed) {
    MT_CHECK(ds && ds->num_rows > 0, "eng_loader_init: empty dataset");
    MT_CHECK(micro_batch >= 1, "eng_loader_init: micro_batch %d < 1", micro_batch);
    memset(ld, 0, sizeof *ld);
    ld->ds = ds;
    ld->micro_batch = micro_batch;
    ld->shuffle = shuffle;
    ld->seed = seed;
    ld->order = malloc((size_t)ds->num_rows * sizeof *ld->order);
    MT_CHECK_ALLOC(ld->order, "loader order");
    size_t n = (size_t)micro_batch * (size_t)ds->T;
    ld->buf_inputs = malloc(n * sizeof *ld->buf_inputs);
    ld->buf_targets = malloc(n * sizeof *ld->buf_targets);
    ld->buf_mask = malloc(n * sizeof *ld->buf_mask);
    ld->buf_kv_len = malloc((size_t)micro_batch * sizeof *ld->buf_kv_len);
    MT_CHECK_ALLOC(ld->buf_inputs, "batch inputs");
    MT_CHECK_ALLOC(ld->buf_kv_len, "batch key lengths");
    MT_CHECK_ALLOC(ld->buf_targets, "batch targets");
    MT_CHECK_ALLOC(ld->buf_mask, "batch mask");
    if (ds->seg_start) {
        ld->buf_seg = malloc(n * sizeof *ld->buf_seg);
        ld->buf_pos = malloc(n * sizeof *ld->buf_pos);
        MT_CHECK(ld->buf_seg && ld->buf_pos, "out of host memory for a micro-batch's segments");
    }
    build_order(ld);
}

bool eng_loader_seek(eng_loader_t *ld, int epoch, int64_t cursor) {
    if (epoch < 0 || cursor < 0 || cursor > ld->ds->num_rows) return false;
    ld->epoch = epoch;
    ld->cursor = cursor;
    build_order(ld); /* a function of (seed, epoch) alone */
    return true;
}

void eng_loader_free(eng_loader_t *ld) {
    if (!ld) return;
    free(ld->order);
    free(ld->buf_inputs);
    free(ld->buf_targets);
    free(ld->buf_mask);
    free(ld->buf_kv_len);
    free(ld->buf_seg);
    free(ld->buf_pos);
    memset(ld, 0, sizeof *ld);
}

bool eng_loader_next(eng_loader_t *ld, eng_batch_t *batch) {
    const eng_dataset_t *ds = ld->ds;
    bool new_epoch = false;
    if (ld->cursor >= ds->num_rows) {
        ld->epoch++;
        ld->cursor = 0;
        build_order(ld);
        new_epoch = true;
    }
    int64_t left = ds->num_rows - ld->cursor;
    const int B = left < ld->micro_batch ? (int)left : ld->micro_batch;
    const int T = ds->T;
    int64_t counted = 0;
    bool padded = false;
    for (int b = 0; b < B; b++) {
        const int64_t row = ld->order[ld->cursor + b];
        memcpy(ld->buf_inputs + (size_t)b * T, ds->inputs + row * T, (size_t)T * sizeof(int32_t));
        memcpy(ld->buf_targets + (size_t)b * T, ds->targets + row * T, (size_t)T * sizeof(int32_t));
        memcpy(ld->buf_mask + (size_t)b * T, ds->mask + row * T, (size_t)T);
        ld->buf_kv_len[b] = eng_mask_kv_len(ds->mask + row * T, T);
        padded |= ld->buf_kv_len[b] < T;
        if (ds->seg_start) {
            const int32_t *sg = ds->seg_start + row * T;
            memcpy(ld->buf_seg + (size_t)b * T, sg, (size_t)T * sizeof(int32_t));
            for (int t = 0; t < T; t++) ld->buf_pos[(size_t)b * T + t] = t - sg[t];
        }
        for (int t = 0; t < T; t++) counted += ds->targets[row * T + t] != IGNORE_INDEX;
    }
    batch->serial = (uint64_t)ld->epoch * (uint64_t)eng_loader_batches_per_epoch(ld) +
                    (uint64_t)(ld->cursor / ld->micro_batch);
    ld->cursor += B;
    batch->B = B;
    batch->T = T;
    batch->inputs = ld->buf_inputs;
    batch->targets = ld->buf_targets;
    batch->mask = ld->buf_mask;
    batch->kv_len = ld->buf_kv_len;
    batch->seg_start = ds->seg_start ? ld->buf_seg : NULL;
    batch->pos = ds->seg_start ? ld->buf_pos : NULL;
    batch->padded = padded;
    batch->counted = counted;
    return new_epoch;
}

int64_t eng_loader_batches_per_epoch(const eng_loader_t *ld) {
    return (ld->ds->num_rows + ld->micro_batch - 1) / ld->micro_batch;
}

static void batch_copy(const eng_batch_t *src, eng_batch_t *dst) {
    const size_t n = (size_t)src->B * src->T;
    *dst = *src;
    dst->inputs = malloc(n * sizeof *dst->inputs);
    dst->targets = malloc(n * sizeof *dst->targets);
    dst->mask = malloc(n ? n : 1);
    dst->kv_len = src->kv_len ? malloc((size_t)src->B * sizeof *dst->kv_len) : NULL;
    MT_CHECK(dst->inputs && dst->targets && dst->mask && (dst->kv_len || !src->kv_len),
             "out of host memory for a micro-batch");
    memcpy(dst->inputs, src->inputs, n * sizeof *dst->inputs);
    memcpy(dst->targets, src->targets, n * sizeof *dst->targets);
    memcpy(dst->mask, src->mask, n);
    if (src->kv_len) memcpy(dst->kv_len, src->kv_len, (size_t)src->B * sizeof *dst->kv_len);
    dst->seg_start = dst->pos = NULL;
    if (src->seg_start) {
        dst->seg_start = malloc(n * sizeof *dst->seg_start);
        dst->pos = malloc(n * sizeof *dst->pos);
        MT_CHECK(dst->seg_start && dst->pos, "out of host memory for a micro-batch's segments");
        memcpy(dst->seg_start, src->seg_start, n * sizeof *dst->seg_start);
        memcpy(dst->pos, src->pos, n * sizeof *dst->pos);
    }
}

eng_batch_t *eng_loader_take(eng_loader_t *ld, int k) {
    eng_batch_t *bs = calloc((size_t)(k > 0 ? k : 1), sizeof *bs);
    MT_CHECK_ALLOC(bs, "micro-batches");
    for (int j = 0; j < k; j++) {
        eng_batch_t b;
        eng_loader_next(ld, &b);
        batch_copy(&b, &bs[j]);
    }
    return bs;
}

void eng_batches_free(eng_batch_t *bs, int k) {
    if (!bs) return;
    for (int j = 0; j < k; j++) {
        free(bs[j].inputs);
        free(bs[j].targets);
        free(bs[j].mask);
        free(bs[j].kv_len);
        free(bs[j].seg_start);
        free(bs[j].pos);
    }
    free(bs);
}
