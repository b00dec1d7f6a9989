/* Pre-tokenizers over the work string's splits, as the library's
 * NormalizedString::split and each pre-tokenizer do it.
 *
 * A split is cut into alternating gaps and matches (the pattern's find_matches);
 * the behaviour then keeps, drops or glues the matches:
 *   Isolated            every piece;
 *   Removed             only the gaps;
 *   MergedWithPrevious  a match (not following a match) joins the piece before;
 *   MergedWithNext      a match (not preceding a match) joins the piece after;
 *   Contiguous          runs of pieces of one kind are joined.
 * invert swaps matches and gaps.  Empty pieces are dropped. */
#include <stdlib.h>
#include <string.h>

#include "text/tokenizer/tok_impl.h"

static void seg_push(tok_work_t *w, uint32_t s, uint32_t e, bool match) {
    if (w->nseg == w->seg_cap) {
        w->seg_cap = w->seg_cap ? w->seg_cap * 2 : 64;
        w->seg = realloc(w->seg, w->seg_cap * sizeof *w->seg);
        w->seg_match = realloc(w->seg_match, w->seg_cap);
        TOK_CHECK_ALLOC(w->seg && w->seg_match, "pre-token pieces");
    }
    w->seg[w->nseg] = (tok_range_t){s, e};
    w->seg_match[w->nseg++] = match;
}

/* Matches and gaps of split r: a regex/literal pattern, or (digits) every
 * numeric character on its own. */
static void find_segments(tok_work_t *w, tok_range_t r, const tok_pattern_t *p, bool digits) {
    w->nseg = 0;
    const char *b = w->b + r.s;
    size_t n = r.e - r.s, prev = 0, ms, me;
    if (digits) {
        for (size_t i = 0; i < n;) {
            int len;
            uint32_t c = tok_utf8_decode((const uint8_t *)b + i, &len);
            if (tok_is_numeric(c)) {
                if (prev < i) seg_push(w, r.s + (uint32_t)prev, r.s + (uint32_t)i, false);
                seg_push(w, r.s + (uint32_t)i, r.s + (uint32_t)(i + (size_t)len), true);
                prev = i + (size_t)len;
            }
            i += (size_t)len;
        }
    } else {
        while (prev <= n && tok_find(p, w->md, b, n, prev, &ms, &me)) {
            if (prev != ms) seg_push(w, r.s + (uint32_t)prev, r.s + (uint32_t)ms, false);
            seg_push(w, r.s + (uint32_t)ms, r.s + (uint32_t)me, true);
            prev = me;
        }
    }
    if (prev != n) seg_push(w, r.s + (uint32_t)prev, r.e, false);
}

/* Applies behaviour to w->seg and pushes the kept pieces onto sp2. */
static void apply_behavior(tok_work_t *w, tok_behavior_t behavior, bool invert) {
    size_t n = w->nseg, k = 0; /* k: pieces kept so far, compacted into seg */
    bool prev = false;
    if (invert)
        for (size_t i = 0; i < n; i++) w->seg_match[i] = !w->seg_match[i];
    if (behavior == TOK_MERGED_NEXT) {
        /* the library folds from the end; keep pieces in reverse in seg[n-1-k] order */
        size_t out = n;
        for (size_t i = n; i-- > 0;) {
            bool m = w->seg_match[i];
            if (m && !prev && out < n) w->seg[out].s = w->seg[i].s;
            else w->seg[--out] = w->seg[i];
            prev = m;
        }
        for (size_t i = out; i < n; i++)
            if (w->seg[i].e > w->seg[i].s) tok_work_push_split(w, w->seg[i].s, w->seg[i].e);
        return;
    }
    for (size_t i = 0; i < n; i++) {
        bool m = w->seg_match[i];
        bool glue = (behavior == TOK_CONTIGUOUS && m == prev) || (behavior == TOK_MERGED_PREV && m && !prev);
        if (behavior == TOK_REMOVED && m) {
            prev = m;
            continue;
        }
        if (glue && k > 0) w->seg[k - 1].e = w->seg[i].e;
        else {
            w->seg_match[k] = m;
            w->seg[k++] = w->seg[i];
        }
        prev = m;
    }
    for (size_t i = 0; i < k; i++)
        if (w->seg[i].e > w->seg[i].s) tok_work_push_split(w, w->seg[i].s, w->seg[i].e);
}

void tok_split_pattern(tok_work_t *w, const tok_pattern_t *p, tok_behavior_t behavior, bool invert) {
    w->nsp2 = 0;
    for (size_t i = 0; i < w->nsp; i++) {
        find_segments(w, w->sp[i], p, false);
        apply_behavior(w, behavior, invert);
    }
}

static void split_digits(tok_work_t *w, bool individual) {
    w->nsp2 = 0;
    for (size_t i = 0; i < w->nsp; i++) {
        find_segments(w, w->sp[i], NULL, true);
        apply_behavior(w, individual ? TOK_ISOLATED : TOK_CONTIGUOUS, false);
    }
}

static void swap_splits(tok_work_t *w) {
    tok_range_t *t = w->sp;
    size_t c = w->capsp;
    w->sp = w->sp2;
    w->capsp = w->capsp2;
    w->nsp = w->nsp2;
    w->sp2 = t;
    w->capsp2 = c;
    w->nsp2 = 0;
}

/* Rewrites split r with every space replaced by rep (each taking the
 * space's range) and, when prefix, rep prepended (the first character's
 * range); returns the new range. */
static tok_range_t rewrite(tok_work_t *w, tok_range_t r, bool spaces, const char *rep, size_t rep_n, bool prefix) {
    if (r.e == r.s) return r;
    uint32_t out = (uint32_t)w->n;
    tok_work_reserve(w, (r.e - r.s) * (rep_n > 1 ? rep_n : 1) + rep_n);
    if (prefix)
        for (size_t k = 0; k < rep_n; k++) tok_work_put(w, rep[k], w->o0[r.s], w->o1[r.s], w->data_mask[r.s]);
    for (uint32_t i = r.s; i < r.e; i++) {
        if (spaces && w->b[i] == ' ') {
            for (size_t k = 0; k < rep_n; k++) tok_work_put(w, rep[k], w->o0[i], w->o1[i], w->data_mask[i]);
        } else {
            tok_work_put(w, w->b[i], w->o0[i], w->o1[i], w->data_mask[i]);
        }
    }
    return (tok_range_t){out, (uint32_t)w->n};
}

static void metaspace(tok_work_t *w, const tok_pretok_t *p) {
    for (size_t i = 0; i < w->nsp; i++) {
        tok_range_t r = rewrite(w, w->sp[i], true, p->repl, p->repl_n, false);
        bool starts = r.e - r.s >= p->repl_n && memcmp(w->b + r.s, p->repl, p->repl_n) == 0;
        bool prefix = !starts && r.e > r.s &&
                      (p->prepend_scheme == TOK_PREPEND_ALWAYS ||
                       (p->prepend_scheme == TOK_PREPEND_FIRST && w->o0[r.s] == 0));
        if (prefix) r = rewrite(w, r, false, p->repl, p->repl_n, true);
        w->sp[i] = r;
    }
    if (p->split) {
        tok_pattern_t lit = {.lit = (char *)p->repl, .lit_n = p->repl_n, .re = NULL};
        tok_split_pattern(w, &lit, TOK_MERGED_NEXT, false);
        swap_splits(w);
    }
}

static void bytelevel(tok_work_t *w, const tok_pretok_t *p) {
    if (p->add_prefix_space)
        for (size_t i = 0; i < w->nsp; i++)
            if (w->b[w->sp[i].s] != ' ') w->sp[i] = rewrite(w, w->sp[i], false, " ", 1, true);
    if (p->pat.re) {
        tok_split_pattern(w, &p->pat, TOK_ISOLATED, false);
        swap_splits(w);
    }
}

void tok_pretokenize(const text_tokenizer_t *t, tok_work_t *w) {
    for (size_t k = 0; k < t->n_pretok; k++) {
        const tok_pretok_t *p = &t->pretok[k];
        switch (p->kind) {
        case TOK_P_SPLIT:
            tok_split_pattern(w, &p->pat, p->behavior, p->invert);
            swap_splits(w);
            break;
        case TOK_P_DIGITS:
            split_digits(w, p->individual_digits);
            swap_splits(w);
            break;
        case TOK_P_METASPACE: metaspace(w, p); break;
        case TOK_P_BYTELEVEL: bytelevel(w, p); break;
        }
    }
}
