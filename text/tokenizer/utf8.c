/* UTF-8 and the character classes the library's Rust code uses.
 *
 * Validation follows Unicode's "maximal subpart" rule, which is also how
 * Rust's from_utf8_lossy decides how many bytes one U+FFFD replaces. */
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "base/status.h"
#include "text/tokenizer/tok_impl.h"

/* Bytes of the longest valid prefix of a character starting at s (at least
 * 1); *full is set when that prefix is a whole character. */
static int utf8_prefix(const uint8_t *s, size_t n, bool *full) {
    uint8_t c = s[0];
    int need;
    uint8_t lo = 0x80, hi = 0xBF;
    *full = false;
    if (c < 0x80) { *full = true; return 1; }
    if (c >= 0xC2 && c <= 0xDF) need = 1;
    else if (c >= 0xE0 && c <= 0xEF) {
        need = 2;
        if (c == 0xE0) lo = 0xA0;
        if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        need = 3;
        if (c == 0xF0) lo = 0x90;
        if (c == 0xF4) hi = 0x8F;
    } else return 1;
    int i = 1;
    for (; i <= need; i++) {
        if ((size_t)i >= n) return i;
        uint8_t b = s[i];
        if (b < lo || b > hi) return i;
        lo = 0x80;
        hi = 0xBF;
    }
    *full = true;
    return i;
}

int tok_utf8_len(const uint8_t *s, size_t n) {
    bool full;
    int k = utf8_prefix(s, n, &full);
    return full ? k : 0;
}

size_t tok_utf8_check(const uint8_t *s, size_t len) {
    size_t i = 0;
    while (i < len) {
        if (s[i] < 0x80) { i++; continue; }
        int k = tok_utf8_len(s + i, len - i);
        if (!k) return i;
        i += (size_t)k;
    }
    return len;
}

uint32_t tok_utf8_decode(const uint8_t *s, int *len) {
    uint8_t c = s[0];
    if (c < 0x80) { *len = 1; return c; }
    if (c < 0xE0) { *len = 2; return ((uint32_t)(c & 0x1F) << 6) | (s[1] & 0x3F); }
    if (c < 0xF0) {
        *len = 3;
        return ((uint32_t)(c & 0x0F) << 12) | ((uint32_t)(s[1] & 0x3F) << 6) | (s[2] & 0x3F);
    }
    *len = 4;
    return ((uint32_t)(c & 0x07) << 18) | ((uint32_t)(s[1] & 0x3F) << 12) | ((uint32_t)(s[2] & 0x3F) << 6) |
           (s[3] & 0x3F);
}

int tok_utf8_encode(uint32_t c, char *out) {
    return (int)utf8proc_encode_char((utf8proc_int32_t)c, (utf8proc_uint8_t *)out);
}

bool tok_is_white_space(uint32_t c) {
    if (c < 0x80) return (c >= 9 && c <= 13) || c == 0x20;
    return c == 0x85 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 ||
           c == 0x202F || c == 0x205F || c == 0x3000;
}

bool tok_is_word(uint32_t c) {
    if (c < 0x80) return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
    if (c == 0x200C || c == 0x200D) return true;
    switch (utf8proc_category((utf8proc_int32_t)c)) {
    case UTF8PROC_CATEGORY_LU: case UTF8PROC_CATEGORY_LL: case UTF8PROC_CATEGORY_LT: case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO: case UTF8PROC_CATEGORY_MN: case UTF8PROC_CATEGORY_MC: case UTF8PROC_CATEGORY_ME:
    case UTF8PROC_CATEGORY_ND: case UTF8PROC_CATEGORY_NL: case UTF8PROC_CATEGORY_PC: return true;
    default: return false;
    }
}

bool tok_is_numeric(uint32_t c) {
    if (c < 0x80) return c >= '0' && c <= '9';
    utf8proc_category_t k = utf8proc_category((utf8proc_int32_t)c);
    return k == UTF8PROC_CATEGORY_ND || k == UTF8PROC_CATEGORY_NL || k == UTF8PROC_CATEGORY_NO;
}

/* GPT-2's table: printable bytes stand for themselves, the 68 others
 * (0x00-0x20, 0x7F-0xA0, 0xAD) become U+0100 onwards in byte order. */
uint32_t tok_byte_char(uint8_t b) {
    if ((b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE) return b;
    if (b <= 0x20) return 256u + b;
    if (b <= 0xA0) return 256u + 33u + (uint32_t)(b - 0x7F);
    return 256u + 67u;
}

int tok_char_byte(uint32_t c) {
    if ((c >= 0x21 && c <= 0x7E) || (c >= 0xA1 && c <= 0xAC) || (c >= 0xAE && c <= 0xFF)) return (int)c;
    if (c >= 256 && c < 289) return (int)(c - 256);
    if (c >= 289 && c < 323) return (int)(0x7F + (c - 289));
    if (c == 323) return 0xAD;
    return -1;
}

bool tok_bytelevel_unmap(const char *s, size_t n, char *out, size_t *outn) {
    size_t k = 0;
    for (size_t i = 0; i < n;) {
        int len;
        int b = tok_char_byte(tok_utf8_decode((const uint8_t *)s + i, &len));
        if (b < 0) return false;
        out[k++] = (char)b;
        i += (size_t)len;
    }
    *outn = k;
    return true;
}

static void put_bytes(char **dst, size_t *dn, size_t *dcap, const char *s, size_t n) {
    if (*dn + n + 1 > *dcap) {
        size_t cap = *dcap ? *dcap : 64;
        while (cap < *dn + n + 1) cap *= 2;
        *dst = realloc(*dst, cap);
        TOK_CHECK_ALLOC(*dst, "decoded text");
        *dcap = cap;
    }
    memcpy(*dst + *dn, s, n);
    *dn += n;
}

void tok_utf8_lossy(const char *src, size_t n, char **dst, size_t *dn, size_t *dcap) {
    const uint8_t *s = (const uint8_t *)src;
    size_t i = 0, run = 0;
    while (i < n) {
        bool full;
        int k = utf8_prefix(s + i, n - i, &full);
        if (full) { i += (size_t)k; continue; }
        put_bytes(dst, dn, dcap, src + run, i - run);
        put_bytes(dst, dn, dcap, "\xEF\xBF\xBD", 3);
        i += (size_t)k;
        run = i;
    }
    put_bytes(dst, dn, dcap, src + run, n - run);
}
