/* The lexer: template text into data and tag tokens, with jinja2's
 * whitespace rules as transformers configures them.
 *
 *   trim_blocks    the first newline after a block or comment tag (`%}`,
 *                  `#}`) is removed; `+%}` keeps it.
 *   lstrip_blocks  spaces and tabs between a line's start and a block or
 *                  comment tag are removed (not before `{{`); `{%+` keeps them.
 *                  "A line's start" is a newline in the text before the tag,
 *                  or the end of the previous tag when that ended a line.
 *   `{%-` `-%}`    strip all whitespace (newlines too) before / after the tag.
 *
 * Inside tags the lexer tracks bracket depth as jinja2 does, so `}}` closing
 * a dict literal is not mistaken for the end of `{{ ... }}`. */
#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/jinja/internal.h"

typedef struct {
    tj_pool_t *pool;
    const char *src;
    size_t len, pos;
    int line;
    size_t line_start;
    const char *origin;
    mt_error_t *err;
    jmp_buf *jb;
    tj_token_t *toks;
    int n, cap;
} lexer_t;

__attribute__((noreturn, format(printf, 3, 4))) static void lex_fail(lexer_t *lx, size_t at, const char *fmt, ...) {
    int line = 1;
    size_t ls = 0;
    for (size_t i = 0; i < at && i < lx->len; i++)
        if (lx->src[i] == '\n') line++, ls = i + 1;
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    mt_error_set(lx->err, MT_ERR_FORMAT, "%s:%d:%zu: %s", lx->origin, line, at - ls + 1, msg);
    longjmp(*lx->jb, 1);
}

static tj_token_t *push(lexer_t *lx, tj_tkind_t kind, size_t at) {
    if (lx->n == lx->cap) { /* grown inside the pool, so a failure leaks nothing */
        int cap = lx->cap ? lx->cap * 2 : 256;
        tj_token_t *bigger = tj_alloc(lx->pool, sizeof *bigger * (size_t)cap);
        if (lx->n) memcpy(bigger, lx->toks, sizeof *bigger * (size_t)lx->n);
        lx->toks = bigger;
        lx->cap = cap;
    }
    tj_token_t *t = &lx->toks[lx->n++];
    memset(t, 0, sizeof *t);
    t->kind = (uint8_t)kind;
    /* line/col of `at`: advance the running line count */
    while (lx->pos < at) {
        if (lx->src[lx->pos] == '\n') lx->line++, lx->line_start = lx->pos + 1;
        lx->pos++;
    }
    t->line = lx->line;
    t->col = (int)(at - lx->line_start + 1);
    return t;
}

static bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

static void emit_data(lexer_t *lx, size_t from, size_t to) {
    if (to <= from) return;
    tj_token_t *t = push(lx, T_DATA, from);
    t->s = tj_strdup(lx->pool, lx->src + from, to - from);
    t->n = to - from;
}

/* Python's unicode-escape decoding of a string literal's body. */
static size_t put_utf8(char *o, uint32_t cp) {
    if (cp < 0x80) { o[0] = (char)cp; return 1; }
    if (cp < 0x800) { o[0] = (char)(0xC0 | cp >> 6); o[1] = (char)(0x80 | (cp & 0x3F)); return 2; }
    if (cp < 0x10000) {
        o[0] = (char)(0xE0 | cp >> 12); o[1] = (char)(0x80 | (cp >> 6 & 0x3F)); o[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (char)(0xF0 | cp >> 18); o[1] = (char)(0x80 | (cp >> 12 & 0x3F));
    o[2] = (char)(0x80 | (cp >> 6 & 0x3F)); o[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

static size_t lex_string(lexer_t *lx, size_t at) {
    char q = lx->src[at];
    size_t i = at + 1;
    char *o = tj_alloc(lx->pool, (lx->len - at) * 2 + 8);
    size_t n = 0;
    for (;; i++) {
        if (i >= lx->len) lex_fail(lx, at, "unterminated string literal");
        char c = lx->src[i];
        if (c == q) break;
        if (c != '\\') { o[n++] = c; continue; }
        if (++i >= lx->len) lex_fail(lx, at, "unterminated string literal");
        c = lx->src[i];
        const char *simple = "n\nt\tr\r\\\\''\"\"a\ab\bf\fv\v0\0";
        const char *hit = NULL;
        for (const char *s = simple; *s; s += 2)
            if (*s == c) { hit = s; break; }
        if (c == '0' && i + 1 < lx->len && lx->src[i + 1] >= '0' && lx->src[i + 1] <= '7') hit = NULL;
        if (hit) { o[n++] = hit[1]; continue; }
        if (c >= '0' && c <= '7') {
            uint32_t cp = 0;
            for (int k = 0; k < 3 && i < lx->len && lx->src[i] >= '0' && lx->src[i] <= '7'; k++, i++)
                cp = cp * 8 + (uint32_t)(lx->src[i] - '0');
            i--;
            n += put_utf8(o + n, cp);
            continue;
        }
        int digits = c == 'x' ? 2 : c == 'u' ? 4 : c == 'U' ? 8 : 0;
        if (digits) {
            uint32_t cp = 0;
            for (int k = 1; k <= digits; k++) {
                char h = i + (size_t)k < lx->len ? lx->src[i + (size_t)k] : 0;
                if (!isxdigit((unsigned char)h)) lex_fail(lx, i - 1, "truncated \\%c escape in a string literal", c);
                cp = cp * 16 + (uint32_t)(isdigit((unsigned char)h) ? h - '0' : (tolower(h) - 'a' + 10));
            }
            if (cp > 0x10FFFF) lex_fail(lx, i - 1, "escape beyond U+10FFFF in a string literal");
            i += (size_t)digits;
            n += put_utf8(o + n, cp);
            continue;
        }
        o[n++] = '\\'; /* unknown escapes stay as written */
        o[n++] = c;
    }
    tj_token_t *t = push(lx, T_STRING, at);
    t->s = o;
    t->n = n;
    return i + 1;
}

static size_t lex_number(lexer_t *lx, size_t at) {
    size_t i = at;
    bool is_float = false;
    while (i < lx->len && (isdigit((unsigned char)lx->src[i]) || lx->src[i] == '_')) i++;
    if (i + 1 < lx->len && lx->src[i] == '.' && isdigit((unsigned char)lx->src[i + 1])) {
        is_float = true;
        i++;
        while (i < lx->len && (isdigit((unsigned char)lx->src[i]) || lx->src[i] == '_')) i++;
    }
    if (i < lx->len && (lx->src[i] == 'e' || lx->src[i] == 'E')) {
        size_t j = i + 1;
        if (j < lx->len && (lx->src[j] == '+' || lx->src[j] == '-')) j++;
        if (j < lx->len && isdigit((unsigned char)lx->src[j])) {
            is_float = true;
            i = j;
            while (i < lx->len && isdigit((unsigned char)lx->src[i])) i++;
        }
    }
    char buf[128];
    size_t k = 0;
    for (size_t j = at; j < i && k + 1 < sizeof buf; j++)
        if (lx->src[j] != '_') buf[k++] = lx->src[j];
    buf[k] = 0;
    tj_token_t *t = push(lx, is_float ? T_FLOAT : T_INT, at);
    if (is_float) {
        t->f = strtod(buf, NULL);
    } else {
        char *end;
        errno = 0;
        long long v = strtoll(buf, &end, 10);
        if (errno) lex_fail(lx, at, "integer literal %s does not fit 64 bits", buf);
        t->i = v;
    }
    return i;
}

static const char *const OPS[] = {"**", "//", "==", "!=", "<=", ">=", "+", "-", "*", "/", "%", "~", "<", ">",
                                  "=", ".", ",", ":", "|", "(", ")", "[", "]", "{", "}", NULL};

/* Lexes one tag's inside from at; returns the position after its end tag.
 * *line_ending says whether what the end tag consumed ended with a newline. */
static size_t lex_tag(lexer_t *lx, size_t at, bool is_block, bool *line_ending) {
    const char *end = is_block ? "%}" : "}}";
    int depth = 0;
    size_t i = at;
    for (;;) {
        while (i < lx->len && is_ws(lx->src[i])) i++;
        if (i >= lx->len) lex_fail(lx, at, "missing end of tag '%s'", end);
        const char *s = lx->src + i;
        size_t left = lx->len - i;
        if (depth == 0) {
            bool strip = left >= 3 && s[0] == '-' && memcmp(s + 1, end, 2) == 0;
            bool keep = is_block && left >= 3 && s[0] == '+' && memcmp(s + 1, end, 2) == 0;
            if (strip || keep || (left >= 2 && memcmp(s, end, 2) == 0)) {
                push(lx, is_block ? T_BLOCK_END : T_VAR_END, i);
                size_t j = i + 2 + (strip || keep);
                if (strip)
                    while (j < lx->len && is_ws(lx->src[j])) j++;
                else if (is_block && !keep && j < lx->len && lx->src[j] == '\n')
                    j++;
                *line_ending = j > 0 && lx->src[j - 1] == '\n';
                return j;
            }
        }
        char c = s[0];
        if (isalpha((unsigned char)c) || c == '_') {
            size_t j = i;
            while (j < lx->len && (isalnum((unsigned char)lx->src[j]) || lx->src[j] == '_')) j++;
            tj_token_t *t = push(lx, T_NAME, i);
            t->s = tj_strdup(lx->pool, s, j - i);
            t->n = j - i;
            i = j;
        } else if (isdigit((unsigned char)c)) {
            i = lex_number(lx, i);
        } else if (c == '\'' || c == '"') {
            i = lex_string(lx, i);
        } else {
            int k = 0;
            for (; OPS[k]; k++)
                if (strncmp(s, OPS[k], strlen(OPS[k])) == 0) break;
            if (!OPS[k]) lex_fail(lx, i, "unexpected character '%c' in a tag", c);
            if (c == '(' || c == '[' || c == '{') depth++;
            if (c == ')' || c == ']' || c == '}') {
                if (depth == 0) lex_fail(lx, i, "unexpected '%c'", c);
                depth--;
            }
            tj_token_t *t = push(lx, T_OP, i);
            t->s = OPS[k];
            t->n = strlen(OPS[k]);
            i += t->n;
        }
    }
}

/* Finds the next tag opener at or after from: returns its position and kind
 * ('{', '%', '#'), or len when none. */
static size_t next_tag(const lexer_t *lx, size_t from, char *kind) {
    for (size_t i = from; i + 1 < lx->len; i++) {
        if (lx->src[i] != '{') continue;
        char c = lx->src[i + 1];
        if (c == '{' || c == '%' || c == '#') {
            *kind = c;
            return i;
        }
    }
    return lx->len;
}

static size_t skip_comment(lexer_t *lx, size_t at, bool *line_ending) {
    const char *e = strstr(lx->src + at + 2, "#}");
    if (!e) lex_fail(lx, at, "missing end of comment tag '#}'");
    size_t q = (size_t)(e - lx->src), j = q + 2;
    char sign = q > at + 2 ? lx->src[q - 1] : 0;
    if (sign == '-')
        while (j < lx->len && is_ws(lx->src[j])) j++;
    else if (sign != '+' && j < lx->len && lx->src[j] == '\n')
        j++;
    *line_ending = j > 0 && lx->src[j - 1] == '\n';
    return j;
}

tj_token_t *tj_lex(tj_pool_t *p, const char *src, size_t len, const char *origin, int *ntok, mt_error_t *err,
                   jmp_buf *jb) {
    lexer_t lx = {.pool = p, .src = src, .len = len, .line = 1, .origin = origin, .err = err, .jb = jb};
    size_t pos = 0;
    bool line_starting = true;
    for (;;) {
        char kind = 0;
        size_t at = next_tag(&lx, pos, &kind);
        if (at >= len) {
            emit_data(&lx, pos, len);
            break;
        }
        char sign = at + 2 < len ? src[at + 2] : 0;
        size_t text_end = at;
        if (sign == '-') {
            while (text_end > pos && is_ws(src[text_end - 1])) text_end--;
        } else if (sign != '+' && kind != '{') {
            size_t l = text_end;
            while (l > pos && src[l - 1] != '\n') l--;
            bool only_ws = l < text_end;
            for (size_t k = l; k < text_end; k++)
                if (!is_ws(src[k])) only_ws = false;
            if ((l > pos || line_starting) && only_ws) text_end = l;
        }
        emit_data(&lx, pos, text_end);
        size_t body = at + 2 + (sign == '-' || sign == '+');
        if (kind == '#') {
            pos = skip_comment(&lx, at, &line_starting);
            continue;
        }
        push(&lx, kind == '%' ? T_BLOCK_BEGIN : T_VAR_BEGIN, at);
        pos = lex_tag(&lx, body, kind == '%', &line_starting);
    }
    push(&lx, T_EOF, len);
    *ntok = lx.n;
    return lx.toks;
}
