/* safetensors reading and writing (see safetensors.h).
 *
 * Validation follows the reference reader step by step, in its order:
 * file >= 8 bytes; N <= 100,000,000; 8 + N within the file; header is
 * UTF-8; header is JSON (an object of tensor infos plus an optional
 * "__metadata__" string map; unknown fields inside a tensor info are
 * ignored as serde does); tensors sorted by data_offsets must tile the data
 * buffer from 0 with no gap or overlap, each holding exactly
 * prod(shape) * bits / 8 bytes (checked arithmetic); the last tensor must
 * end exactly at end of file.  Duplicate tensor names are refused (jansson's
 * JSON_REJECT_DUPLICATES) rather than letting one silently win. */
#include "engine/model/io/safetensors.h"

#include "base/fileio.h"
#include "base/grow.h"

#include <errno.h>
#include <stdatomic.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

static const struct {
    const char *name;
    int bits;
} k_dtypes[ENG_ST_DTYPE_COUNT] = {
    [ENG_ST_BOOL] = {"BOOL", 8},       [ENG_ST_F4] = {"F4", 4},
    [ENG_ST_F6_E2M3] = {"F6_E2M3", 6}, [ENG_ST_F6_E3M2] = {"F6_E3M2", 6},
    [ENG_ST_U8] = {"U8", 8},           [ENG_ST_I8] = {"I8", 8},
    [ENG_ST_F8_E5M2] = {"F8_E5M2", 8}, [ENG_ST_F8_E4M3] = {"F8_E4M3", 8},
    [ENG_ST_F8_E8M0] = {"F8_E8M0", 8}, [ENG_ST_I16] = {"I16", 16},
    [ENG_ST_U16] = {"U16", 16},        [ENG_ST_F16] = {"F16", 16},
    [ENG_ST_BF16] = {"BF16", 16},      [ENG_ST_I32] = {"I32", 32},
    [ENG_ST_U32] = {"U32", 32},        [ENG_ST_F32] = {"F32", 32},
    [ENG_ST_C64] = {"C64", 64},        [ENG_ST_F64] = {"F64", 64},
    [ENG_ST_I64] = {"I64", 64},        [ENG_ST_U64] = {"U64", 64},
};

const char *eng_st_dtype_name(eng_st_dtype_t dt) {
    return (unsigned)dt < ENG_ST_DTYPE_COUNT ? k_dtypes[dt].name : "?";
}

int eng_st_dtype_bits(eng_st_dtype_t dt) {
    return (unsigned)dt < ENG_ST_DTYPE_COUNT ? k_dtypes[dt].bits : 0;
}

bool eng_st_dtype_parse(const char *name, eng_st_dtype_t *out) {
    for (int i = 0; i < ENG_ST_DTYPE_COUNT; i++) {
        if (strcmp(name, k_dtypes[i].name) == 0) {
            *out = (eng_st_dtype_t)i;
            return true;
        }
    }
    return false;
}

bool eng_st_dtype_to_mt(eng_st_dtype_t dt, mt_dtype_t *out) {
    switch (dt) {
    case ENG_ST_F32: *out = MT_F32; return true;
    case ENG_ST_BF16: *out = MT_BF16; return true;
    case ENG_ST_F16: *out = MT_F16; return true;
    case ENG_ST_I32: *out = MT_I32; return true;
    case ENG_ST_I64: *out = MT_I64; return true;
    default: return false;
    }
}

eng_st_dtype_t eng_st_dtype_from_mt(mt_dtype_t dt) {
    switch (dt) {
    case MT_BF16: return ENG_ST_BF16;
    case MT_F16: return ENG_ST_F16;
    case MT_I32: return ENG_ST_I32;
    case MT_I64: return ENG_ST_I64;
    default: return ENG_ST_F32;
    }
}

/* ---- reading ---------------------------------------------------------- */

/* Offset of the first byte that is not valid UTF-8 (Rust's str::from_utf8
 * rules: no overlongs, no surrogates, nothing above U+10FFFF), or -1. */
static long long utf8_invalid_at(const uint8_t *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        uint8_t c = s[i];
        if (c < 0x80) { i++; continue; }
        int len;
        uint8_t lo = 0x80, hi = 0xbf;
        if (c >= 0xc2 && c <= 0xdf) len = 2;
        else if (c == 0xe0) { len = 3; lo = 0xa0; }
        else if (c >= 0xe1 && c <= 0xec) len = 3;
        else if (c == 0xed) { len = 3; hi = 0x9f; }
        else if (c >= 0xee && c <= 0xef) len = 3;
        else if (c == 0xf0) { len = 4; lo = 0x90; }
        else if (c >= 0xf1 && c <= 0xf3) len = 4;
        else if (c == 0xf4) { len = 4; hi = 0x8f; }
        else return (long long)i;
        if (i + (size_t)len > n) return (long long)i;
        if (s[i + 1] < lo || s[i + 1] > hi) return (long long)i;
        for (int k = 2; k < len; k++)
            if (s[i + k] < 0x80 || s[i + k] > 0xbf) return (long long)i;
        i += (size_t)len;
    }
    return -1;
}

typedef struct {
    const char *name; /* into the json object while parsing */
    eng_st_dtype_t dtype;
    json_t *shape;
    uint64_t begin, end;
} raw_info_t;

static int cmp_offsets(const void *a, const void *b) {
    const raw_info_t *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return 0;
}

typedef struct {
    const char *name;
    int idx;
} name_idx_t;

static int cmp_names(const void *a, const void *b) {
    return strcmp(((const name_idx_t *)a)->name, ((const name_idx_t *)b)->name);
}

/* A JSON integer >= 0 (serde's usize): false otherwise. */
static bool get_usize(const json_t *v, uint64_t *out) {
    if (!json_is_integer(v) || json_integer_value(v) < 0) return false;
    *out = (uint64_t)json_integer_value(v);
    return true;
}

static mt_status_t parse_tensor_info(const char *path, const char *name, json_t *v, raw_info_t *ri,
                                     mt_error_t *err) {
    if (!json_is_object(v))
        return mt_error_set(err, MT_ERR_FORMAT, "%s: tensor '%s': header entry is not an object",
                            path, name);
    json_t *dt = json_object_get(v, "dtype");
    json_t *shape = json_object_get(v, "shape");
    json_t *offs = json_object_get(v, "data_offsets");
    if (!dt || !shape || !offs)
        return mt_error_set(err, MT_ERR_FORMAT, "%s: tensor '%s': header entry lacks '%s'", path,
                            name, !dt ? "dtype" : !shape ? "shape" : "data_offsets");
    if (!json_is_string(dt) || !eng_st_dtype_parse(json_string_value(dt), &ri->dtype))
        return mt_error_set(err, MT_ERR_FORMAT,
                            "%s: tensor '%s': unknown dtype %s%s%s (expected one of BOOL U8 I8 "
                            "F8_E5M2 F8_E4M3 F8_E8M0 F4 F6_E2M3 F6_E3M2 I16 U16 F16 BF16 I32 U32 "
                            "F32 C64 F64 I64 U64)",
                            path, name, json_is_string(dt) ? "'" : "",
                            json_is_string(dt) ? json_string_value(dt) : "(not a string)",
                            json_is_string(dt) ? "'" : "");
    if (!json_is_array(shape))
        return mt_error_set(err, MT_ERR_FORMAT, "%s: tensor '%s': shape is not an array", path, name);
    for (size_t i = 0; i < json_array_size(shape); i++) {
        uint64_t d;
        if (!get_usize(json_array_get(shape, i), &d))
            return mt_error_set(err, MT_ERR_FORMAT,
                                "%s: tensor '%s': shape[%zu] is not a non-negative integer", path,
                                name, i);
    }
    if (!json_is_array(offs) || json_array_size(offs) != 2 ||
        !get_usize(json_array_get(offs, 0), &ri->begin) ||
        !get_usize(json_array_get(offs, 1), &ri->end))
        return mt_error_set(err, MT_ERR_FORMAT,
                            "%s: tensor '%s': data_offsets is not a pair of non-negative integers",
                            path, name);
    ri->name = name;
    ri->shape = shape;
    return MT_OK;
}

static void shape_str(char *buf, size_t cap, const uint64_t *shape, int ndim) {
    size_t n = (size_t)snprintf(buf, cap, "[");
    for (int i = 0; i < ndim && n < cap; i++)
        n += (size_t)snprintf(buf + n, cap - n, "%s%llu", i ? ", " : "", (unsigned long long)shape[i]);
    if (n < cap) snprintf(buf + n, cap - n, "]");
}

/* The header's entries: every tensor's info into ri (*count of them) and
 * the optional __metadata__ string map into *meta, with the bytes their
 * names, shapes and strings take in the file's one pool (*pool_bytes). */
static mt_status_t parse_header(const char *path, json_t *root, raw_info_t *ri, int *count, json_t **meta,
                                size_t *pool_bytes, mt_error_t *err) {
    const char *key;
    json_t *val;
    json_object_foreach(root, key, val) {
        if (strcmp(key, "__metadata__") == 0) {
            if (json_is_null(val)) continue;
            if (!json_is_object(val))
                return mt_error_set(err, MT_ERR_FORMAT, "%s: __metadata__ is not an object", path);
            const char *mk;
            json_t *mv;
            json_object_foreach(val, mk, mv) {
                if (!json_is_string(mv))
                    return mt_error_set(err, MT_ERR_FORMAT, "%s: __metadata__ key '%s': value is not a string", path,
                                        mk);
                *pool_bytes += strlen(mk) + strlen(json_string_value(mv)) + 2;
            }
            *meta = val;
            continue;
        }
        mt_status_t st = parse_tensor_info(path, key, val, &ri[*count], err);
        if (st != MT_OK) return st;
        *pool_bytes += strlen(key) + 1 + json_array_size(ri[*count].shape) * sizeof(uint64_t) + 8;
        (*count)++;
    }
    return MT_OK;
}

/* Tensor t (from r) starts where the data before it ends (`start`), and
 * its data_offsets hold exactly its shape of its dtype; sets t->numel.
 * `prev` names the tensor before it, for the overlap message. */
static mt_status_t check_extent(const char *path, eng_st_tensor_t *t, const raw_info_t *r, uint64_t start,
                                const char *prev, mt_error_t *err) {
    if (r->end < r->begin)
        return mt_error_set(err, MT_ERR_FORMAT, "%s: tensor '%s': data_offsets [%llu, %llu] end before they begin",
                            path, t->name, (unsigned long long)r->begin, (unsigned long long)r->end);
    if (r->begin < start)
        return mt_error_set(err, MT_ERR_FORMAT,
                            "%s: tensor '%s': data_offsets [%llu, %llu] overlap tensor '%s', "
                            "which ends at %llu",
                            path, t->name, (unsigned long long)r->begin, (unsigned long long)r->end, prev,
                            (unsigned long long)start);
    if (r->begin > start)
        return mt_error_set(err, MT_ERR_FORMAT,
                            "%s: tensor '%s': data_offsets [%llu, %llu] leave a gap: the data "
                            "before it ends at %llu",
                            path, t->name, (unsigned long long)r->begin, (unsigned long long)r->end,
                            (unsigned long long)start);
    uint64_t numel = 1, nbits;
    bool ovf = false;
    for (int d = 0; d < t->ndim; d++) ovf |= __builtin_mul_overflow(numel, t->shape[d], &numel);
    ovf |= __builtin_mul_overflow(numel, (uint64_t)eng_st_dtype_bits(t->dtype), &nbits);
    char sh[256];
    shape_str(sh, sizeof sh, t->shape, t->ndim);
    if (ovf)
        return mt_error_set(err, MT_ERR_FORMAT, "%s: tensor '%s': shape %s of %s overflows", path, t->name, sh,
                            eng_st_dtype_name(t->dtype));
    if (nbits % 8 != 0)
        return mt_error_set(err, MT_ERR_FORMAT, "%s: tensor '%s': shape %s of %s is not a whole number of bytes",
                            path, t->name, sh, eng_st_dtype_name(t->dtype));
    t->numel = numel;
    if (r->end - r->begin != nbits / 8)
        return mt_error_set(err, MT_ERR_FORMAT,
                            "%s: tensor '%s': data_offsets [%llu, %llu] hold %llu bytes but shape "
                            "%s of %s needs %llu",
                            path, t->name, (unsigned long long)r->begin, (unsigned long long)r->end,
                            (unsigned long long)(r->end - r->begin), sh, eng_st_dtype_name(t->dtype),
                            (unsigned long long)(nbits / 8));
    return MT_OK;
}

/* f->tensors from the infos sorted by offset, their shapes and names
 * copied into the pool (f->storage_; *names_end: where its next string
 * goes), each checked to continue the data where the one before ended and
 * the last to end the file. */
static mt_status_t index_tensors(eng_st_file_t *f, const raw_info_t *ri, int count, size_t pool_bytes,
                                 char **names_end, mt_error_t *err) {
    /* One allocation holds every name and shape: shapes first (aligned), names after. */
    f->storage_ = malloc(pool_bytes + 8);
    MT_CHECK_ALLOC(f->storage_, "safetensors names");
    f->tensors = calloc(count ? (size_t)count : 1, sizeof *f->tensors);
    MT_CHECK_ALLOC(f->tensors, "safetensors tensors");
    size_t nshape = 0;
    for (int i = 0; i < count; i++) nshape += json_array_size(ri[i].shape);
    uint64_t *shapes = f->storage_;
    char *names = (char *)(shapes + nshape);
    *names_end = names;

    uint64_t start = 0;
    for (int i = 0; i < count; i++) {
        eng_st_tensor_t *t = &f->tensors[i];
        const raw_info_t *r = &ri[i];
        t->ndim = (int)json_array_size(r->shape);
        for (int d = 0; d < t->ndim; d++) get_usize(json_array_get(r->shape, (size_t)d), &shapes[d]);
        t->shape = shapes;
        shapes += t->ndim;
        size_t nl = strlen(r->name) + 1;
        memcpy(names, r->name, nl);
        t->name = names;
        names += nl;
        *names_end = names;
        t->dtype = r->dtype;
        t->begin = r->begin;
        t->end = r->end;
        f->count = i + 1;
        mt_status_t st = check_extent(f->path, t, r, start, i ? f->tensors[i - 1].name : "?", err);
        if (st != MT_OK) return st;
        start = r->end;
    }
    if (start + 8 + f->header_len != f->file_size)
        return mt_error_set(err, MT_ERR_FORMAT,
                            "%s: tensor data ends at byte %llu (after tensor '%s') but the file has "
                            "%zu bytes",
                            f->path, (unsigned long long)(start + 8 + f->header_len),
                            count ? f->tensors[count - 1].name : "", f->file_size);
    f->data_len = start;
    for (int i = 0; i < count; i++) f->tensors[i].data = f->data + f->tensors[i].begin;
    return MT_OK;
}

/* Name index for O(log n) lookup: sharded checkpoints have ~10^4 tensors. */
static void index_names(eng_st_file_t *f) {
    const size_t count = f->count > 0 ? (size_t)f->count : 0;
    name_idx_t *ni = malloc((count ? count : 1) * sizeof *ni);
    MT_CHECK_ALLOC(ni, "safetensors name index");
    for (size_t i = 0; i < count; i++) ni[i] = (name_idx_t){f->tensors[i].name, (int)i};
    qsort(ni, count, sizeof *ni, cmp_names);
    f->by_name = malloc((count ? count : 1) * sizeof *f->by_name);
    MT_CHECK_ALLOC(f->by_name, "safetensors name index");
    for (size_t i = 0; i < count; i++) f->by_name[i] = ni[i].idx;
    free(ni);
}

/* The __metadata__ strings into the pool from `names` on, and f->meta_*. */
static void copy_metadata(eng_st_file_t *f, json_t *meta, char *names) {
    size_t mc = json_object_size(meta);
    f->meta_keys = calloc(mc ? mc : 1, sizeof(char *));
    f->meta_values = calloc(mc ? mc : 1, sizeof(char *));
    MT_CHECK_ALLOC(f->meta_keys, "safetensors metadata");
    MT_CHECK_ALLOC(f->meta_values, "safetensors metadata");
    const char *mk;
    json_t *mv;
    json_object_foreach(meta, mk, mv) {
        size_t kl = strlen(mk) + 1, vl = strlen(json_string_value(mv)) + 1;
        memcpy(names, mk, kl);
        f->meta_keys[f->meta_count] = names;
        names += kl;
        memcpy(names, json_string_value(mv), vl);
        f->meta_values[f->meta_count++] = names;
        names += vl;
    }
}

/* Validates the parsed header and fills f->tensors / f->meta_*. */
static mt_status_t build_index(eng_st_file_t *f, json_t *root, mt_error_t *err) {
    size_t nkeys = json_object_size(root);
    raw_info_t *ri = calloc(nkeys ? nkeys : 1, sizeof *ri);
    MT_CHECK_ALLOC(ri, "safetensors header");
    int count = 0;
    json_t *meta = NULL;
    size_t pool_bytes = 0;
    char *names = NULL;
    mt_status_t st = parse_header(f->path, root, ri, &count, &meta, &pool_bytes, err);
    if (st == MT_OK) {
        qsort(ri, (size_t)count, sizeof *ri, cmp_offsets);
        st = index_tensors(f, ri, count, pool_bytes, &names, err);
    }
    if (st == MT_OK) {
        index_names(f);
        if (meta) copy_metadata(f, meta, names);
    }
    free(ri);
    return st;
}

/* The first top-level key of a JSON object text that occurs twice (raw,
 * escapes as written), to name it: jansson's duplicate-key message
 * truncates long keys, and tensor names are long.  A small scanner over
 * strings and nesting, enough for text jansson has already tokenised.
 * Quadratic in the number of keys, which only runs on this error path. */
static bool first_duplicate_key(const char *t, size_t n, char *out, size_t cap) {
    size_t (*keys)[2] = NULL;
    int nk = 0, ck = 0, depth = 0;
    bool found = false;
    for (size_t i = 0; i < n && !found; i++) {
        const char c = t[i];
        if (c == '{' || c == '[') depth++;
        else if (c == '}' || c == ']') depth--;
        else if (c == '"') {
            const size_t s0 = i + 1;
            for (i = s0; i < n && t[i] != '"'; i++)
                if (t[i] == '\\') i++;
            if (i >= n) break;
            size_t j = i + 1;
            while (j < n && (t[j] == ' ' || t[j] == '\t' || t[j] == '\n' || t[j] == '\r')) j++;
            if (depth != 1 || j >= n || t[j] != ':') continue;
            const size_t len = i - s0;
            for (int k = 0; k < nk && !found; k++)
                if (keys[k][1] == len && memcmp(t + keys[k][0], t + s0, len) == 0) {
                    snprintf(out, cap, "%.*s", (int)len, t + s0);
                    found = true;
                }
            MT_GROW(keys, ck, nk + 1, "duplicate-key scan");
            keys[nk][0] = s0;
            keys[nk][1] = len;
            nk++;
        }
    }
    free(keys);
    return found;
}

mt_status_t eng_st_open(const char *path, eng_st_file_t *out, mt_error_t *err) {
    memset(out, 0, sizeof *out);
    out->fd = -1;
    out->path = strdup(path);
    MT_CHECK_ALLOC(out->path, "path");
    mt_status_t st = MT_OK;
    json_t *root = NULL;
    int fd;
    st = mt_open_regular(path, "checkpoint file", &fd, err);
    if (st != MT_OK) goto fail;
    out->fd = fd;
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        st = mt_error_set(err, MT_ERR_IO, "%s: not a regular file", path);
        goto fail;
    }
    out->file_size = (size_t)sb.st_size;
    if (out->file_size < 8) {
        st = mt_error_set(err, MT_ERR_FORMAT,
                          "%s: file is %zu bytes, too small for the 8-byte header length", path,
                          out->file_size);
        goto fail;
    }
    out->map = mmap(NULL, out->file_size, PROT_READ, MAP_SHARED, fd, 0);
    if (out->map == MAP_FAILED) {
        out->map = NULL;
        st = mt_error_set(err, MT_ERR_IO, "%s: cannot mmap %zu bytes: %s", path, out->file_size,
                          strerror(errno));
        goto fail;
    }
    const uint8_t *p = out->map;
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = (n << 8) | p[i];
    out->header_len = n;
    if (n > ENG_ST_MAX_HEADER_BYTES) {
        st = mt_error_set(err, MT_ERR_FORMAT, "%s: header length %llu exceeds the limit of %llu bytes",
                          path, (unsigned long long)n, ENG_ST_MAX_HEADER_BYTES);
        goto fail;
    }
    if (8 + n > out->file_size) {
        st = mt_error_set(err, MT_ERR_FORMAT,
                          "%s: header of %llu bytes runs past the end of the file (%zu bytes)", path,
                          (unsigned long long)n, out->file_size);
        goto fail;
    }
    long long bad = utf8_invalid_at(p + 8, n);
    if (bad >= 0) {
        st = mt_error_set(err, MT_ERR_FORMAT, "%s: header is not valid UTF-8 (byte %lld of the header)",
                          path, bad);
        goto fail;
    }
    json_error_t jerr;
    root = json_loadb((const char *)p + 8, n, JSON_REJECT_DUPLICATES, &jerr);
    if (!root) {
        char dup[256];
        if (json_error_code(&jerr) == json_error_duplicate_key && first_duplicate_key((const char *)p + 8, n, dup, sizeof dup))
            st = mt_error_set(err, MT_ERR_FORMAT, "%s: header names tensor '%s' twice", path, dup);
        else if (json_error_code(&jerr) == json_error_duplicate_key)
            st = mt_error_set(err, MT_ERR_FORMAT, "%s: header names a tensor twice: %s", path,
                              jerr.text);
        else
            st = mt_error_set(err, MT_ERR_FORMAT, "%s: header is not valid JSON: %s (at byte %d)",
                              path, jerr.text, jerr.position);
        goto fail;
    }
    if (!json_is_object(root)) {
        st = mt_error_set(err, MT_ERR_FORMAT, "%s: header is not a JSON object", path);
        goto fail;
    }
    out->data = p + 8 + n;
    st = build_index(out, root, err);
    if (st != MT_OK) goto fail;
    json_decref(root);
    return MT_OK;
fail:
    json_decref(root);
    eng_st_close(out);
    return st;
}

void eng_st_close(eng_st_file_t *f) {
    if (f->map) munmap(f->map, f->file_size);
    if (f->fd >= 0) close(f->fd);
    free(f->path);
    free(f->tensors);
    free(f->by_name);
    free(f->meta_keys);
    free(f->meta_values);
    free(f->storage_);
    memset(f, 0, sizeof *f);
    f->fd = -1;
}

const eng_st_tensor_t *eng_st_find(const eng_st_file_t *f, const char *name) {
    int lo = 0, hi = f->count - 1;
    while (lo <= hi) {
        int mid = lo + (hi - lo) / 2;
        const eng_st_tensor_t *t = &f->tensors[f->by_name[mid]];
        int c = strcmp(name, t->name);
        if (c == 0) return t;
        if (c < 0) hi = mid - 1;
        else lo = mid + 1;
    }
    return NULL;
}

const char *eng_st_metadata_get(const eng_st_file_t *f, const char *key) {
    for (int i = 0; i < f->meta_count; i++)
        if (strcmp(f->meta_keys[i], key) == 0) return f->meta_values[i];
    return NULL;
}

mt_status_t eng_st_read_f32(const eng_st_file_t *f, const eng_st_tensor_t *t, float *dst,
                            mt_error_t *err) {
    mt_dtype_t mdt;
    if (!eng_st_dtype_to_mt(t->dtype, &mdt) || (mdt != MT_F32 && mdt != MT_BF16 && mdt != MT_F16))
        return mt_error_set(err, MT_ERR_UNSUPPORTED,
                            "%s: tensor '%s' has dtype %s; only F32, BF16 and F16 can be loaded",
                            f->path, t->name, eng_st_dtype_name(t->dtype));
    size_t es = mt_dtype_size(mdt);
    if ((uintptr_t)t->data % es == 0) {
        mt_convert_to_f32(dst, t->data, mdt, t->numel);
        return MT_OK;
    }
    /* A header length that is not a multiple of the element size leaves the
     * data misaligned (legal, though no writer we know does it): bounce it. */
    uint32_t bounce[4096];
    const uint8_t *src = t->data;
    size_t per = sizeof bounce / es;
    for (size_t i = 0; i < t->numel; i += per) {
        size_t m = t->numel - i < per ? t->numel - i : per;
        memcpy(bounce, src + i * es, m * es);
        mt_convert_to_f32(dst + i, bounce, mdt, m);
    }
    return MT_OK;
}

/* ---- writing ---------------------------------------------------------- */

mt_status_t eng_st_tensor_nbytes(const eng_st_write_tensor_t *t, uint64_t *out, mt_error_t *err) {
    *out = 0;
    if ((unsigned)t->dtype >= ENG_ST_DTYPE_COUNT)
        return mt_error_set(err, MT_ERR_INTERNAL, "tensor '%s': invalid dtype %d", t->name, (int)t->dtype);
    uint64_t numel = 1, nbits;
    bool ovf = false;
    for (int d = 0; d < t->ndim; d++) {
        if (t->shape[d] < 0)
            return mt_error_set(err, MT_ERR_INTERNAL, "tensor '%s': negative dimension %lld",
                                t->name, (long long)t->shape[d]);
        ovf |= __builtin_mul_overflow(numel, (uint64_t)t->shape[d], &numel);
    }
    ovf |= __builtin_mul_overflow(numel, (uint64_t)eng_st_dtype_bits(t->dtype), &nbits);
    if (ovf || nbits % 8)
        return mt_error_set(err, MT_ERR_INTERNAL, "tensor '%s': size overflows or is not whole bytes",
                            t->name);
    *out = nbits / 8;
    return MT_OK;
}

static void fsync_parent_dir(const char *path) {
    char *dir = strdup(path);
    if (!dir) return;
    char *slash = strrchr(dir, '/');
    if (slash == dir) slash[1] = '\0';
    else if (slash) *slash = '\0';
    else strcpy(dir, ".");
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd >= 0) {
        (void)fsync(fd); /* durability only: a failure here loses nothing already renamed */
        close(fd);
    }
    free(dir);
}

/* Opens "<path>.tmp-<pid>-<n>" for writing; *tmp_out is malloc'ed.  The name
 * is unique per process and call, so two writers never share a temp file. */
static mt_status_t open_tmp(const char *path, char **tmp_out, FILE **fp, mt_error_t *err) {
    static atomic_uint counter;
    size_t n = strlen(path) + 40;
    char *tmp = malloc(n);
    MT_CHECK_ALLOC(tmp, "path");
    snprintf(tmp, n, "%s.tmp-%d-%u", path, (int)getpid(), atomic_fetch_add(&counter, 1) + 1);
    *fp = fopen(tmp, "wb");
    if (!*fp) {
        mt_status_t st = mt_error_set(err, MT_ERR_IO, "%s: cannot create: %s", tmp, strerror(errno));
        free(tmp);
        return st;
    }
    *tmp_out = tmp;
    return MT_OK;
}

/* Flushes, fsyncs and closes fp, then renames tmp over path; removes tmp on failure. */
static mt_status_t commit_tmp(FILE *fp, char *tmp, const char *path, bool ok, mt_error_t *err) {
    mt_status_t st = MT_OK;
    if (ok && (fflush(fp) != 0 || fsync(fileno(fp)) != 0))
        st = mt_error_set(err, MT_ERR_IO, "%s: write failed: %s", tmp, strerror(errno));
    if (fclose(fp) != 0 && ok && st == MT_OK)
        st = mt_error_set(err, MT_ERR_IO, "%s: close failed: %s", tmp, strerror(errno));
    if (ok && st == MT_OK && rename(tmp, path) != 0)
        st = mt_error_set(err, MT_ERR_IO, "%s: cannot rename to %s: %s", tmp, path, strerror(errno));
    if (!ok || st != MT_OK) unlink(tmp);
    else fsync_parent_dir(path);
    free(tmp);
    return st;
}

mt_status_t eng_write_file_atomic(const char *path, const void *bytes, size_t len, mt_error_t *err) {
    char *tmp;
    FILE *fp;
    mt_status_t st = open_tmp(path, &tmp, &fp, err);
    if (st != MT_OK) return st;
    bool ok = fwrite(bytes, 1, len, fp) == len;
    if (!ok) st = mt_error_set(err, MT_ERR_IO, "%s: write failed: %s", tmp, strerror(errno));
    mt_status_t st2 = commit_tmp(fp, tmp, path, ok, err);
    return st != MT_OK ? st : st2;
}

/* Builds the padded header: {"__metadata__":{...},"name":{...},...} + spaces. */
static mt_status_t build_header(const char *path, const eng_st_write_tensor_t *ts, int count,
                                const uint64_t *nbytes, const char *const *meta_kv, int meta_count,
                                char **out, size_t *out_len, mt_error_t *err) {
    json_t *root = json_object();
    json_t *meta = json_object();
    MT_CHECK_ALLOC(root, "json");
    MT_CHECK_ALLOC(meta, "json");
    if (meta_kv && meta_count > 0) {
        for (int i = 0; i < meta_count; i++)
            json_object_set_new(meta, meta_kv[2 * i], json_string(meta_kv[2 * i + 1]));
    } else {
        json_object_set_new(meta, "format", json_string("pt"));
    }
    json_object_set_new(root, "__metadata__", meta);
    uint64_t off = 0;
    for (int i = 0; i < count; i++) {
        const eng_st_write_tensor_t *t = &ts[i];
        if (!t->name || json_object_get(root, t->name)) {
            json_decref(root);
            return mt_error_set(err, MT_ERR_INTERNAL, "%s: tensor name '%s' is %s", path,
                                t->name ? t->name : "(null)",
                                t->name && strcmp(t->name, "__metadata__") == 0 ? "reserved"
                                                                                : "given twice");
        }
        json_t *info = json_object();
        json_t *shape = json_array();
        json_t *offs = json_array();
        for (int d = 0; d < t->ndim; d++) json_array_append_new(shape, json_integer(t->shape[d]));
        json_array_append_new(offs, json_integer((json_int_t)off));
        json_array_append_new(offs, json_integer((json_int_t)(off + nbytes[i])));
        json_object_set_new(info, "dtype", json_string(eng_st_dtype_name(t->dtype)));
        json_object_set_new(info, "shape", shape);
        json_object_set_new(info, "data_offsets", offs);
        if (json_object_set_new(root, t->name, info) != 0) {
            json_decref(root);
            return mt_error_set(err, MT_ERR_INTERNAL, "%s: tensor name '%s' is not valid UTF-8",
                                path, t->name);
        }
        off += nbytes[i];
    }
    char *s = json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(root);
    MT_CHECK_ALLOC(s, "safetensors header");
    size_t len = strlen(s), padded = (len + 7) / 8 * 8;
    char *buf = malloc(padded + 1);
    MT_CHECK_ALLOC(buf, "safetensors header");
    memcpy(buf, s, len);
    memset(buf + len, ' ', padded - len);
    buf[padded] = '\0';
    free(s);
    *out = buf;
    *out_len = padded;
    return MT_OK;
}

static bool write_converted(FILE *fp, const float *src, eng_st_dtype_t dt, uint64_t numel) {
    if (dt == ENG_ST_F32) return fwrite(src, sizeof(float), numel, fp) == numel;
    uint16_t buf[8192];
    const mt_dtype_t mdt = dt == ENG_ST_BF16 ? MT_BF16 : MT_F16;
    for (uint64_t i = 0; i < numel; i += 8192) {
        size_t m = numel - i < 8192 ? (size_t)(numel - i) : 8192;
        mt_convert_from_f32(buf, mdt, src + i, m);
        if (fwrite(buf, sizeof(uint16_t), m, fp) != m) return false;
    }
    return true;
}

mt_status_t eng_st_write(const char *path, const eng_st_write_tensor_t *tensors, int count,
                         const char *const *meta_kv, int meta_count, mt_error_t *err) {
    return eng_st_write_filled(path, tensors, NULL, count, meta_kv, meta_count, err);
}

mt_status_t eng_st_write_filled(const char *path, const eng_st_write_tensor_t *tensors, const eng_st_fill_t *fills,
                                int count, const char *const *meta_kv, int meta_count, mt_error_t *err) {
    uint64_t *nbytes = calloc(count > 0 ? (size_t)count : 1, sizeof *nbytes);
    MT_CHECK_ALLOC(nbytes, "safetensors writer");
    mt_status_t st = MT_OK;
    for (int i = 0; i < count && st == MT_OK; i++) {
        const eng_st_write_tensor_t *t = &tensors[i];
        st = eng_st_tensor_nbytes(t, &nbytes[i], err);
        if (st != MT_OK) break;
        const bool filled = fills && fills[i].fn;
        bool has_f32 = t->f32 != NULL || filled, has_raw = t->data != NULL;
        if ((has_f32 && has_raw) || (t->f32 && filled))
            st = mt_error_set(err, MT_ERR_INTERNAL, "%s: tensor '%s': more than one of data, f32, fill given",
                              path, t->name);
        else if (!has_f32 && !has_raw && nbytes[i] > 0)
            st = mt_error_set(err, MT_ERR_INTERNAL, "%s: tensor '%s': no data given", path, t->name);
        else if (has_f32 && t->dtype != ENG_ST_F32 && t->dtype != ENG_ST_BF16 && t->dtype != ENG_ST_F16)
            st = mt_error_set(err, MT_ERR_INTERNAL, "%s: tensor '%s': cannot convert fp32 to %s", path,
                              t->name, eng_st_dtype_name(t->dtype));
    }
    char *hdr = NULL;
    size_t hlen = 0;
    if (st == MT_OK) st = build_header(path, tensors, count, nbytes, meta_kv, meta_count, &hdr, &hlen, err);
    if (st != MT_OK) {
        free(nbytes);
        return st;
    }
    char *tmp;
    FILE *fp;
    st = open_tmp(path, &tmp, &fp, err);
    if (st != MT_OK) {
        free(hdr);
        free(nbytes);
        return st;
    }
    char *iobuf = malloc(1 << 20);
    MT_CHECK_ALLOC(iobuf, "write buffer");
    setvbuf(fp, iobuf, _IOFBF, 1 << 20);
    uint8_t lenbytes[8];
    for (int i = 0; i < 8; i++) lenbytes[i] = (uint8_t)((uint64_t)hlen >> (8 * i));
    bool ok = fwrite(lenbytes, 1, 8, fp) == 8 && fwrite(hdr, 1, hlen, fp) == hlen;
    float *buf = NULL; /* one buffer for every filled tensor, as large as the largest */
    uint64_t buf_cap = 0;
    for (int i = 0; i < count && ok; i++) {
        const eng_st_write_tensor_t *t = &tensors[i];
        if (nbytes[i] == 0) continue;
        const uint64_t numel = nbytes[i] * 8 / (uint64_t)eng_st_dtype_bits(t->dtype);
        if (fills && fills[i].fn) {
            if (numel > buf_cap) {
                free(buf);
                buf = malloc(numel * sizeof(float));
                MT_CHECK_ALLOC(buf, t->name);
                buf_cap = numel;
            }
            fills[i].fn(fills[i].ctx, buf);
            ok = write_converted(fp, buf, t->dtype, numel);
        } else if (t->f32) {
            ok = write_converted(fp, t->f32, t->dtype, numel);
        } else {
            ok = fwrite(t->data, 1, nbytes[i], fp) == nbytes[i];
        }
    }
    free(buf);
    if (!ok) st = mt_error_set(err, MT_ERR_IO, "%s: write failed: %s", tmp, strerror(errno));
    mt_status_t st2 = commit_tmp(fp, tmp, path, ok, err);
    free(iobuf);
    free(hdr);
    free(nbytes);
    return st != MT_OK ? st : st2;
}
