/* tokenize_bench: encodes a text file with a tokenizer.json on one core and
 * prints the rate, the token count and a hash of the ids, so that
 * tools/bench/tokenize_bench.py can put it beside the `tokenizers` library's
 * rate on the same text and check that both produced the same ids.
 *
 *     tokenize_bench TOKENIZER_JSON TEXT_FILE [REPEATS]
 *
 * The text is encoded line by line (each line with its newline, as one
 * document per line), REPEATS times; the best pass is reported. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "base/fileio.h"
#include "text/tokenizer/tokenizer.h"

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: tokenize_bench TOKENIZER_JSON TEXT_FILE [REPEATS]\n");
        return 2;
    }
    int repeats = argc > 3 ? atoi(argv[3]) : 3;
    mt_error_t err = {0};
    text_tokenizer_t *tk;
    char *text = NULL;
    size_t n = 0;
    if (text_tokenizer_load(argv[1], &tk, &err) != MT_OK ||
        mt_read_regular_file(argv[2], "text", (size_t)1 << 31, &text, &n, &err) != MT_OK) {
        fprintf(stderr, "tokenize_bench: %s\n", err.msg);
        return 1;
    }
    double best = 1e30;
    uint64_t hash = 1469598103934665603ull;
    size_t tokens = 0;
    for (int r = 0; r < (repeats > 0 ? repeats : 1); r++) {
        text_tokens_t t = {0};
        double t0 = mt_now_s();
        for (size_t at = 0; at < n;) {
            const char *nl = memchr(text + at, '\n', n - at);
            size_t end = nl ? (size_t)(nl - text) + 1 : n;
            t.n = 0;
            if (text_tokenizer_encode(tk, text + at, end - at, NULL, false, &t, &err) != MT_OK) {
                fprintf(stderr, "tokenize_bench: line at byte %zu: %s\n", at, err.msg);
                return 1;
            }
            if (r == 0) {
                for (size_t i = 0; i < t.n; i++) hash = (hash ^ (uint32_t)t.ids[i]) * 1099511628211ull;
                tokens += t.n;
            }
            at = end;
        }
        double dt = mt_now_s() - t0;
        if (dt < best) best = dt;
        text_tokens_free(&t);
    }
    printf("{\"bench\":\"tokenize\",\"impl\":\"moetune\",\"bytes\":%zu,\"tokens\":%zu,\"seconds\":%.4f,"
           "\"mb_per_s\":%.2f,\"ids_fnv\":\"%016llx\"}\n",
           n, tokens, best, (double)n / best / 1e6, (unsigned long long)hash);
    free(text);
    text_tokenizer_free(tk);
    return 0;
}
