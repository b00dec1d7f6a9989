/* Every fixture (testdata/make_fixtures.py, made with the `tokenizers`
 * library) against this package: ids and byte offsets with and without
 * special tokens, ids with the text marked as user data, both decodes; on
 * fixtures marked "rt:", decode(encode(x)) == x.  Then the errors: invalid
 * UTF-8, unsupported component types, malformed files.
 *
 *     tokenizer_test [long:][rt:]FIXTURE_DIR ...
 *
 * long: also round-trips a 20 kB plain text (Prepend/Strip or byte-level). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "text/tokenizer/tokenizer.h"

static int failures;

#define EXPECT(cond, ...)                                      \
    do {                                                       \
        if (!(cond)) {                                         \
            failures++;                                        \
            printf("FAIL %s:%d: ", __FILE__, __LINE__);        \
            printf(__VA_ARGS__);                               \
            printf("\n");                                      \
        }                                                      \
    } while (0)

static void print_ids(const char *what, const int32_t *ids, size_t n, json_t *want) {
    printf("    %s got :", what);
    for (size_t i = 0; i < n && i < 40; i++) printf(" %d", ids[i]);
    printf("\n    %s want:", what);
    for (size_t i = 0; i < json_array_size(want) && i < 40; i++)
        printf(" %d", (int)json_integer_value(json_array_get(want, i)));
    printf("\n");
}

static bool same_ids(const text_tokens_t *t, json_t *want) {
    if (t->n != json_array_size(want)) return false;
    for (size_t i = 0; i < t->n; i++)
        if (t->ids[i] != json_integer_value(json_array_get(want, i))) return false;
    return true;
}

static bool same_offsets(const text_tokens_t *t, json_t *want) {
    if (t->n != json_array_size(want)) return false;
    for (size_t i = 0; i < t->n; i++) {
        json_t *p = json_array_get(want, i);
        if (t->start[i] != json_integer_value(json_array_get(p, 0)) ||
            t->end[i] != json_integer_value(json_array_get(p, 1)))
            return false;
    }
    return true;
}

/* One line of expected.jsonl; returns the number of mismatches. */
static int check_case(const text_tokenizer_t *tk, json_t *c, bool roundtrip, int line, const char *dir) {
    int bad = 0;
    const char *text = json_string_value(json_object_get(c, "text"));
    size_t len = json_string_length(json_object_get(c, "text"));
    mt_error_t err = {0};
    text_tokens_t t = {0};
    json_t *data = json_object_get(c, "data");
    if (data) {
        uint8_t *mask = calloc(len + 1, 1);
        for (json_int_t i = json_integer_value(json_array_get(data, 0)); i < json_integer_value(json_array_get(data, 1)); i++)
            mask[i] = 1;
        EXPECT(text_tokenizer_encode(tk, text, len, mask, false, &t, &err) == MT_OK, "%s", err.msg);
        if (!same_ids(&t, json_object_get(c, "ids_data"))) {
            bad++;
            printf("  %s:%d user-data ids differ for %s\n", dir, line, json_dumps(json_object_get(c, "text"), JSON_ENCODE_ANY));
            print_ids("ids", t.ids, t.n, json_object_get(c, "ids_data"));
        }
        free(mask);
        text_tokens_free(&t);
        return bad;
    }
    for (int special = 1; special >= 0; special--) {
        t.n = 0;
        EXPECT(text_tokenizer_encode(tk, text, len, NULL, special, &t, &err) == MT_OK, "%s", err.msg);
        json_t *ids = json_object_get(c, special ? "ids" : "ids_plain");
        json_t *offs = json_object_get(c, special ? "offsets" : "offsets_plain");
        if (!same_ids(&t, ids) || !same_offsets(&t, offs)) {
            bad++;
            char *js = json_dumps(json_object_get(c, "text"), JSON_ENCODE_ANY);
            printf("  %s:%d add_special=%d %s differ for %s\n", dir, line, special,
                   same_ids(&t, ids) ? "offsets" : "ids", js);
            free(js);
            print_ids("ids", t.ids, t.n, ids);
            for (size_t i = 0; i < t.n && i < 12; i++) {
                json_t *p = json_array_get(offs, i);
                printf("      [%u,%u] want [%d,%d]\n", t.start[i], t.end[i], (int)json_integer_value(json_array_get(p, 0)),
                       (int)json_integer_value(json_array_get(p, 1)));
            }
        }
        if (special) {
            for (int skip = 0; skip < 2; skip++) {
                char *out = NULL;
                size_t n = 0;
                EXPECT(text_tokenizer_decode(tk, t.ids, t.n, skip, &out, &n, &err) == MT_OK, "%s", err.msg);
                json_t *want = json_object_get(c, skip ? "decode_skip" : "decode");
                if (n != json_string_length(want) || memcmp(out, json_string_value(want), n)) {
                    bad++;
                    printf("  %s:%d decode(skip=%d) differs:\n    got  [%s]\n    want [%s]\n", dir, line, skip, out,
                           json_string_value(want));
                }
                free(out);
            }
        } else if (roundtrip) {
            char *out = NULL;
            size_t n = 0;
            text_tokenizer_decode(tk, t.ids, t.n, false, &out, &n, &err);
            if (n != len || memcmp(out, text, len)) {
                bad++;
                printf("  %s:%d decode(encode(x)) != x: [%s]\n", dir, line, out);
            }
            free(out);
        }
    }
    text_tokens_free(&t);
    return bad;
}

/* A long plain text round-trips (decoders like Strip see it whole after Fuse). */
static void check_long(const text_tokenizer_t *tk, const char *dir) {
    size_t n = 0;
    char *text = malloc(20000);
    while (n + 16 < 20000) n += (size_t)sprintf(text + n, "the model %zu, ", n % 7);
    text_tokens_t t = {0};
    mt_error_t err = {0};
    char *out = NULL;
    size_t len = 0;
    EXPECT(text_tokenizer_encode(tk, text, n, NULL, true, &t, &err) == MT_OK, "%s", err.msg);
    EXPECT(text_tokenizer_decode(tk, t.ids, t.n, true, &out, &len, &err) == MT_OK, "%s", err.msg);
    EXPECT(len == n && !memcmp(out, text, n), "%s: a %zu-byte text does not round-trip (%zu bytes back)", dir, n, len);
    free(out);
    free(text);
    text_tokens_free(&t);
}

static void check_fixture(const char *arg) {
    bool long_rt = !strncmp(arg, "long:", 5);
    if (long_rt) arg += 5;
    bool roundtrip = !strncmp(arg, "rt:", 3);
    const char *dir = roundtrip ? arg + 3 : arg;
    char path[1024];
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    text_tokenizer_t *tk;
    mt_error_t err = {0};
    if (text_tokenizer_load(path, &tk, &err) != MT_OK) {
        EXPECT(false, "load %s: %s", path, err.msg);
        return;
    }
    snprintf(path, sizeof path, "%s/expected.jsonl", dir);
    FILE *f = fopen(path, "r");
    EXPECT(f, "%s: cannot open", path);
    if (!f) {
        text_tokenizer_free(tk);
        return;
    }
    char *line = NULL;
    size_t cap = 0;
    int n = 0, bad = 0, cases = 0;
    while (getline(&line, &cap, f) > 0) {
        n++;
        json_error_t jerr;
        json_t *c = json_loads(line, JSON_ALLOW_NUL, &jerr);
        EXPECT(c, "%s:%d: %s", path, n, jerr.text);
        if (!c) continue;
        int b = check_case(tk, c, roundtrip, n, dir);
        if (b && bad < 1000) bad += b;
        cases++;
        json_decref(c);
    }
    free(line);
    fclose(f);
    if (long_rt) check_long(tk, dir);
    printf("%-40s %4d cases, %d mismatches\n", dir, cases, bad);
    failures += bad;
    text_tokenizer_free(tk);
}

static void check_errors(void) {
    const char *bpe = "\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1,\"ab\":2},\"merges\":[\"a b\"]}";
    char json[1024];
    text_tokenizer_t *tk = NULL;
    mt_error_t err = {0};
    snprintf(json, sizeof json, "{%s,\"pre_tokenizer\":{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":"
             "\"Whitespace\"}]}}", bpe);
    EXPECT(text_tokenizer_load_string(json, strlen(json), "t.json", &tk, &err) == MT_ERR_UNSUPPORTED && !tk, "%s", err.msg);
    EXPECT(strstr(err.msg, "pre_tokenizer.pretokenizers[0]") && strstr(err.msg, "Whitespace"), "%s", err.msg);
    snprintf(json, sizeof json, "{\"model\":{\"type\":\"WordPiece\",\"vocab\":{}}}");
    EXPECT(text_tokenizer_load_string(json, strlen(json), "t.json", &tk, &err) == MT_ERR_UNSUPPORTED, "%s", err.msg);
    EXPECT(strstr(err.msg, "WordPiece") && strstr(err.msg, "model"), "%s", err.msg);
    snprintf(json, sizeof json, "{%s,\"normalizer\":{\"type\":\"BertNormalizer\"}}", bpe);
    EXPECT(text_tokenizer_load_string(json, strlen(json), "t.json", &tk, &err) == MT_ERR_UNSUPPORTED, "%s", err.msg);
    EXPECT(strstr(err.msg, "normalizer") && strstr(err.msg, "BertNormalizer"), "%s", err.msg);
    snprintf(json, sizeof json, "{%s,\"decoder\":{\"type\":\"WordPiece\"}}", bpe);
    EXPECT(text_tokenizer_load_string(json, strlen(json), "t.json", &tk, &err) == MT_ERR_UNSUPPORTED, "%s", err.msg);
    EXPECT(strstr(err.msg, "decoder") && strstr(err.msg, "WordPiece"), "%s", err.msg);
    snprintf(json, sizeof json, "{%s,\"pre_tokenizer\":{\"type\":\"Split\",\"pattern\":{\"Regex\":\"(\"},"
             "\"behavior\":\"Isolated\"}}", bpe);
    EXPECT(text_tokenizer_load_string(json, strlen(json), "t.json", &tk, &err) == MT_ERR_UNSUPPORTED, "%s", err.msg);
    EXPECT(strstr(err.msg, "pre_tokenizer.pattern.Regex"), "%s", err.msg);
    snprintf(json, sizeof json, "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[\"a b\"]}}");
    EXPECT(text_tokenizer_load_string(json, strlen(json), "t.json", &tk, &err) == MT_ERR_FORMAT, "%s", err.msg);
    EXPECT(strstr(err.msg, "model.merges[0]"), "%s", err.msg);
    EXPECT(text_tokenizer_load_string("{", 1, "t.json", &tk, &err) == MT_ERR_FORMAT, "%s", err.msg);
    EXPECT(text_tokenizer_load("/nonexistent/tokenizer.json", &tk, &err) == MT_ERR_IO, "%s", err.msg);
    /* a working one: invalid UTF-8 names the offset; a character with no unk is an error */
    snprintf(json, sizeof json, "{%s}", bpe);
    EXPECT(text_tokenizer_load_string(json, strlen(json), "t.json", &tk, &err) == MT_OK, "%s", err.msg);
    if (!tk) return;
    text_tokens_t t = {0};
    EXPECT(text_tokenizer_encode(tk, "abab", 4, NULL, true, &t, &err) == MT_OK && t.n == 2 && t.ids[0] == 2 &&
           t.end[1] == 4, "%s", err.msg);
    EXPECT(text_tokenizer_encode(tk, "ab\xC3(", 4, NULL, true, &t, &err) == MT_ERR_DATA && t.n == 2, "%s", err.msg);
    EXPECT(strstr(err.msg, "byte 2"), "%s", err.msg);
    EXPECT(text_tokenizer_encode(tk, "abc", 3, NULL, true, &t, &err) == MT_ERR_DATA && t.n == 2, "%s", err.msg);
    EXPECT(text_tokenizer_token_id(tk, "ab") == 2 && text_tokenizer_token_id(tk, "zz") == -1, "%s", err.msg);
    EXPECT(!strcmp(text_tokenizer_token(tk, 1), "b") && !text_tokenizer_token(tk, 7), "%s", err.msg);
    EXPECT(text_tokenizer_vocab_size(tk) == 3 && !text_tokenizer_is_special(tk, 0), "%s", err.msg);
    text_tokens_free(&t);
    text_tokenizer_free(tk);
}

int main(int argc, char **argv) {
    for (int i = 1; i < argc; i++) check_fixture(argv[i]);
    check_errors();
    printf("%s: %d failure(s)\n", failures ? "FAIL" : "PASS", failures);
    return failures ? 1 : 0;
}
