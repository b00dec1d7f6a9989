/* The work string of one encode call (tok_impl.h): growing it, its split
 * lists, and loading a piece of the input into it. */
#include <stdlib.h>
#include <string.h>

#include "text/tokenizer/tok_impl.h"

void tok_work_reserve(tok_work_t *w, size_t more) {
    if (w->n + more <= w->cap) return;
    size_t cap = w->cap ? w->cap : 1024;
    while (cap < w->n + more) cap *= 2;
    w->b = realloc(w->b, cap);
    w->o0 = realloc(w->o0, cap * sizeof *w->o0);
    w->o1 = realloc(w->o1, cap * sizeof *w->o1);
    w->data_mask = realloc(w->data_mask, cap);
    TOK_CHECK_ALLOC(w->b && w->o0 && w->o1 && w->data_mask, "tokenizer work buffer");
    w->cap = cap;
}

void tok_work_push_split(tok_work_t *w, uint32_t s, uint32_t e) {
    if (w->nsp2 == w->capsp2) {
        w->capsp2 = w->capsp2 ? w->capsp2 * 2 : 256;
        w->sp2 = realloc(w->sp2, w->capsp2 * sizeof *w->sp2);
        TOK_CHECK_ALLOC(w->sp2, "pre-tokens");
    }
    w->sp2[w->nsp2++] = (tok_range_t){s, e};
}

void tok_work_init(tok_work_t *w) {
    memset(w, 0, sizeof *w);
    w->md = pcre2_match_data_create(8, NULL);
    TOK_CHECK_ALLOC(w->md, "regex match data");
    w->capsp = 256;
    w->sp = malloc(w->capsp * sizeof *w->sp);
    TOK_CHECK_ALLOC(w->sp, "pre-tokens");
}

void tok_work_free(tok_work_t *w) {
    free(w->b);
    free(w->o0);
    free(w->o1);
    free(w->data_mask);
    free(w->sp);
    free(w->sp2);
    free(w->sym);
    free(w->heap);
    free(w->seg);
    free(w->seg_match);
    pcre2_match_data_free(w->md);
}

/* Loads text[s, e) into the (emptied) work buffer: each byte aligned to its
 * character's range, flagged when any byte of that character is user data. */
tok_range_t tok_work_load(tok_work_t *w, const char *text, uint32_t s, uint32_t e, const uint8_t *mask) {
    w->n = 0;
    tok_work_reserve(w, e - s);
    for (uint32_t i = s; i < e;) {
        int len = (uint8_t)text[i] < 0x80 ? 1 : tok_utf8_len((const uint8_t *)text + i, e - i);
        uint8_t data = 0;
        for (int k = 0; mask && k < len; k++) data |= mask[i + (uint32_t)k];
        for (int k = 0; k < len; k++) tok_work_put(w, text[i + (uint32_t)k], i, i + (uint32_t)len, data);
        i += (uint32_t)len;
    }
    return (tok_range_t){0, (uint32_t)w->n};
}
