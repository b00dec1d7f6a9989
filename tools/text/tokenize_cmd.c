/* `moetune tokenize` (see tokenize_cmd.h).
 *
 * Text mode: each stdin line (without its newline) is encoded as the
 * completion dataset type encodes a text (the tokenizer's special tokens
 * unless --no-special; no EOS added: this shows the tokenizer, not a
 * format) and printed as {"ids": [...], "tokens": [...]}.
 * --chat: each line is a row of a chat_template dataset ({"messages":
 * [...]}, the run's defaults) and is printed as {"text": the rendered
 * conversation, "ids": [...], "labels": [...]}, labels -100 where not
 * trained: exactly the example training builds from that row.
 * --format TYPE (chat_template, alpaca, input_output, completion): each
 * line is a row of a dataset of that type, printed as {"ids", "labels"}
 * (and "text" for chat_template); --chat is --format chat_template.
 * A bad line prints {"line": N, "error": "..."} and the command goes on;
 * the exit status is 1 when any line failed. */
#include "tools/text/tokenize_cmd.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/config/config.h"
#include "engine/data/text.h"

static void usage(void) {
    fprintf(stderr,
            "usage: moetune tokenize MODEL_DIR [--chat | --format TYPE] [--no-special] [--chat-template NAME]\n"
            "  reads text lines (or JSONL rows of a dataset TYPE: chat_template, alpaca, input_output,\n"
            "  completion; --chat = --format chat_template) on stdin and prints one JSON line per input:\n"
            "  the token ids (with a TYPE the labels training uses, and a conversation's rendered text)\n");
}

static json_t *int_array(const int32_t *v, size_t n) {
    json_t *a = json_array();
    MT_CHECK_ALLOC(a, "ids");
    for (size_t i = 0; i < n; i++) json_array_append_new(a, json_integer(v[i]));
    return a;
}

/* One input line -> one output object (or an error object). */
static json_t *one_line(const eng_text_t *t, const eng_dataset_entry_t *d, bool special, const char *line, size_t len,
                        long lineno, mt_error_t *err) {
    char where[64];
    snprintf(where, sizeof where, "stdin:%ld", lineno);
    eng_text_example_t ex = {0};
    mt_status_t st;
    if (d->type != ENG_DATA_TOKENIZED) {
        json_error_t je;
        json_t *row = json_loadb(line, len, 0, &je);
        st = row ? eng_text_row(t, d, row, where, &ex, err)
                 : mt_error_set(err, MT_ERR_DATA, "%s: invalid JSON at column %d: %s", where, je.column, je.text);
        json_decref(row);
    } else {
        st = eng_text_encode(t, line, len, special, where, &ex, err);
    }
    json_t *out;
    if (st != MT_OK) {
        out = json_pack("{s:I,s:s}", "line", (json_int_t)lineno, "error", err->msg);
    } else if (d->type == ENG_DATA_CHAT_TEMPLATE) {
        out = json_pack("{s:s%,s:o,s:o}", "text", ex.text ? ex.text : "", ex.text_len, "ids", int_array(ex.ids, ex.n),
                        "labels", int_array(ex.labels, ex.n));
    } else if (d->type != ENG_DATA_TOKENIZED) {
        out = json_pack("{s:o,s:o}", "ids", int_array(ex.ids, ex.n), "labels", int_array(ex.labels, ex.n));
    } else {
        json_t *toks = json_array();
        MT_CHECK_ALLOC(toks, "tokens");
        for (size_t i = 0; i < ex.n; i++) {
            const char *tk = eng_text_token(t, ex.ids[i]);
            json_array_append_new(toks, tk ? json_string(tk) : json_null());
        }
        out = json_pack("{s:o,s:o}", "ids", int_array(ex.ids, ex.n), "tokens", toks);
    }
    eng_text_example_free(&ex);
    MT_CHECK_ALLOC(out, "output line");
    return out;
}

int mt_tokenize_main(int argc, char **argv) {
    const char *dir = NULL, *tmpl = "tokenizer_default";
    bool special = true;
    eng_data_type_t type = ENG_DATA_TOKENIZED; /* here: plain text lines */
    for (int i = 0; i < argc; i++) {
        if (strcmp(argv[i], "--chat") == 0) type = ENG_DATA_CHAT_TEMPLATE;
        else if (strcmp(argv[i], "--format") == 0 && i + 1 < argc) {
            const char *f = argv[++i];
            type = strcmp(f, "chat_template") == 0  ? ENG_DATA_CHAT_TEMPLATE
                   : strcmp(f, "alpaca") == 0       ? ENG_DATA_ALPACA
                   : strcmp(f, "input_output") == 0 ? ENG_DATA_INPUT_OUTPUT
                   : strcmp(f, "completion") == 0   ? ENG_DATA_COMPLETION
                                                    : ENG_DATA_TOKENIZED;
            if (type == ENG_DATA_TOKENIZED) {
                fprintf(stderr, "moetune tokenize: --format %s: expected chat_template, alpaca, input_output or "
                                "completion\n", f);
                return 2;
            }
        }
        else if (strcmp(argv[i], "--no-special") == 0) special = false;
        else if (strcmp(argv[i], "--chat-template") == 0 && i + 1 < argc) tmpl = argv[++i];
        else if (argv[i][0] != '-' && !dir) dir = argv[i];
        else {
            usage();
            return 2;
        }
    }
    if (!dir) {
        usage();
        return 2;
    }
    eng_text_opts_t o = {.tokenizer_dir = dir, .chat_template = tmpl, .need_template = type == ENG_DATA_CHAT_TEMPLATE};
    eng_text_t *t;
    mt_error_t err = {0};
    if (eng_text_open(&o, &t, &err) != MT_OK) {
        fprintf(stderr, "moetune tokenize: error: %s\n", err.msg);
        return 1;
    }
    eng_dataset_entry_t d;
    eng_dataset_entry_defaults(&d);
    d.type = type;
    char *line = NULL;
    size_t cap = 0;
    ssize_t got;
    long lineno = 0;
    int status = 0;
    while ((got = getline(&line, &cap, stdin)) != -1) {
        lineno++;
        size_t len = (size_t)got;
        if (len && line[len - 1] == '\n') len--;
        if (len && line[len - 1] == '\r') len--;
        json_t *out = one_line(t, &d, special, line, len, lineno, &err);
        if (json_object_get(out, "error")) status = 1;
        char *s = json_dumps(out, JSON_COMPACT | JSON_ENSURE_ASCII);
        MT_CHECK_ALLOC(s, "output line");
        puts(s);
        free(s);
        json_decref(out);
    }
    free(line);
    eng_text_free(t);
    return status;
}
