/* Random input never crashes the tokenizer: random bytes (mostly invalid
 * UTF-8) are refused with the offending byte named or encoded with offsets
 * inside the text; random user-data masks and ids out of range are fine;
 * tokenizer.json cut short or with bytes flipped loads or fails cleanly.
 * Run under ASan+UBSan for the "never crashes" half.
 *
 *     tokenizer_fuzz_test FIXTURE_DIR ... */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/fileio.h"
#include "text/tokenizer/tokenizer.h"

static int failures;

#define EXPECT(cond, ...)                                    \
    do {                                                     \
        if (!(cond)) {                                       \
            failures++;                                      \
            printf("FAIL %s:%d: ", __FILE__, __LINE__);      \
            printf(__VA_ARGS__);                             \
            printf("\n");                                    \
        }                                                    \
    } while (0)

static uint64_t next(uint64_t *s) { /* splitmix64 */
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static const char *const PIECES[] = {"<|im_end|>", "<s>", "</s>", "<mask>", " ", "  ", "\n", "é", "e\xCC\x81", "한",
                                     "\xE1\x84\x80", "\xF0\x9F\x98\x80", "\xE2\x80\x8D", "abc", "123", "'s", "\xE2\x96\x81",
                                     "\xEF\xAC\x81", "\xC2\x85", "\xE3\x80\x80", "<0x41>", "<think>", "[sep]"};

static size_t random_text(uint64_t *s, char *buf, size_t cap, bool valid) {
    size_t n = 0, want = next(s) % (cap / 2);
    while (n < want) {
        if (!valid && next(s) % 4 == 0) {
            buf[n++] = (char)(next(s) & 0xFF);
            continue;
        }
        const char *p = PIECES[next(s) % (sizeof PIECES / sizeof *PIECES)];
        size_t k = strlen(p);
        if (n + k >= cap) break;
        memcpy(buf + n, p, k);
        n += k;
    }
    return n;
}

static void fuzz_encode(const text_tokenizer_t *tk, uint64_t *s) {
    char buf[512];
    uint8_t mask[512];
    for (int it = 0; it < 3000; it++) {
        bool valid = it % 2 == 0;
        size_t n = random_text(s, buf, sizeof buf, valid);
        for (size_t i = 0; i < n; i++) mask[i] = (uint8_t)(next(s) % 3 == 0);
        text_tokens_t t = {0};
        mt_error_t err = {0};
        mt_status_t st = text_tokenizer_encode(tk, buf, n, it % 3 ? mask : NULL, it % 5 == 0, &t, &err);
        EXPECT(st == MT_OK || (st == MT_ERR_DATA && strstr(err.msg, "byte")), "%s", err.msg);
        if (valid) EXPECT(st == MT_OK, "valid UTF-8 refused: %s", err.msg);
        for (size_t i = 0; st == MT_OK && i < t.n; i++)
            EXPECT(t.start[i] <= t.end[i] && t.end[i] <= n && t.ids[i] >= 0 &&
                       t.ids[i] < text_tokenizer_vocab_size(tk),
                   "token %zu: id %d [%u, %u) in %zu bytes", i, t.ids[i], t.start[i], t.end[i], n);
        int32_t ids[64];
        for (int k = 0; k < 64; k++) ids[k] = (int32_t)(next(s) % (uint64_t)(text_tokenizer_vocab_size(tk) + 8)) - 4;
        char *out = NULL;
        size_t len = 0;
        EXPECT(text_tokenizer_decode(tk, ids, 64, it % 2, &out, &len, &err) == MT_OK, "%s", err.msg);
        EXPECT(out && strlen(out) <= len, "decode result");
        free(out);
        text_tokens_free(&t);
    }
}

static void fuzz_load(const char *json, size_t n, uint64_t *s) {
    char *copy = malloc(n);
    for (int it = 0; it < 40; it++) {
        memcpy(copy, json, n);
        size_t len = it % 2 ? next(s) % n : n;
        for (int k = 0; k < 4 && len; k++) copy[next(s) % len] = "{}[]\",:0aZ\\"[next(s) % 11];
        text_tokenizer_t *tk = NULL;
        mt_error_t err = {0};
        mt_status_t st = text_tokenizer_load_string(copy, len, "fuzzed.json", &tk, &err);
        EXPECT(st == MT_OK ? tk != NULL : (tk == NULL && err.msg[0]), "status %d", st);
        if (tk) {
            text_tokens_t t = {0};
            text_tokenizer_encode(tk, "hello <s> world", 15, NULL, true, &t, &err);
            text_tokens_free(&t);
        }
        text_tokenizer_free(tk);
    }
    free(copy);
}

int main(int argc, char **argv) {
    uint64_t s = 12345;
    for (int i = 1; i < argc; i++) {
        char path[1024];
        snprintf(path, sizeof path, "%s/tokenizer.json", argv[i]);
        text_tokenizer_t *tk;
        mt_error_t err = {0};
        if (text_tokenizer_load(path, &tk, &err) != MT_OK) {
            EXPECT(false, "%s", err.msg);
            continue;
        }
        fuzz_encode(tk, &s);
        text_tokenizer_free(tk);
        char *json = NULL;
        size_t n = 0;
        if (mt_read_regular_file(path, "tokenizer.json", 1 << 26, &json, &n, &err) == MT_OK) fuzz_load(json, n, &s);
        free(json);
        printf("%s: fuzzed\n", argv[i]);
    }
    printf("%s: %d failure(s)\n", failures ? "FAIL" : "PASS", failures);
    return failures ? 1 : 0;
}
