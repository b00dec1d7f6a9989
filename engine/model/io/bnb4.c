/* Linear weights bitsandbytes stored in 4 bits (see checkpoint.h,
 * eng_bnb4_t), read as stored: the codes stay the mapping's bytes and the
 * absmax (fp32, or 8-bit codes with their nested state) is kept as
 * bitsandbytes wrote it, so a LoRA run's quantised home holds exactly the
 * checkpoint's bits and dequantises as bitsandbytes' dequantize_4bit does
 * (quant_map[code] * absmax[block] in fp32; base/quant_elem.h).
 *
 * The quant_state JSON carries what the tensors alone cannot say (the
 * original shape, the block size, the nested offset), so every field used is
 * checked against the tensors and against config.json's shape: a piece
 * missing or disagreeing is refused naming the tensor and what was expected,
 * never guessed. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/model/io/checkpoint.h"

static const char *const k_state_suffix[2] = {".quant_state.bitsandbytes__nf4", ".quant_state.bitsandbytes__fp4"};

static int cmp_entry(const void *a, const void *b) {
    return strcmp(((const eng_ckpt_entry_t *)a)->name, ((const eng_ckpt_entry_t *)b)->name);
}

/* Entry name + suffix, or NULL.  The entries' own search (sorted by name),
 * not eng_checkpoint_find: checkpoint.c reads through this file, so this
 * file does not call back into it. */
static const eng_ckpt_entry_t *part(const eng_checkpoint_t *ck, const char *name, const char *suffix) {
    char n[600];
    if ((size_t)snprintf(n, sizeof n, "%s%s", name, suffix) >= sizeof n) return NULL;
    const eng_ckpt_entry_t key = {.name = n};
    return bsearch(&key, ck->entries, (size_t)ck->count, sizeof key, cmp_entry);
}

bool eng_checkpoint_is_bnb4(const eng_checkpoint_t *ck, const eng_ckpt_entry_t *e) {
    if (!e || e->tensor->dtype != ENG_ST_U8) return false;
    return part(ck, e->name, k_state_suffix[0]) || part(ck, e->name, k_state_suffix[1]) ||
           part(ck, e->name, ".absmax");
}

int eng_checkpoint_bnb4_parts(const eng_checkpoint_t *ck, const eng_ckpt_entry_t *e) {
    static const char *const k_part[] = {".absmax", ".quant_map", ".nested_absmax", ".nested_quant_map",
                                         ".quant_state.bitsandbytes__nf4", ".quant_state.bitsandbytes__fp4"};
    int n = 0;
    for (size_t k = 0; k < sizeof k_part / sizeof k_part[0]; k++) n += part(ck, e->name, k_part[k]) != NULL;
    return n;
}

static void shape_text(char *buf, size_t cap, int ndim, const int64_t *s) {
    size_t n = (size_t)snprintf(buf, cap, "[");
    for (int i = 0; i < ndim && n < cap; i++) n += (size_t)snprintf(buf + n, cap - n, "%s%lld", i ? ", " : "", (long long)s[i]);
    if (n < cap) snprintf(buf + n, cap - n, "]");
}

/* The parsed quant_state: what the tensors are checked against. */
typedef struct {
    mt_quant_format_t format;
    int64_t block, nested_block;
    bool nested;
    float offset;
} bnb_state_t;

static bool json_int(json_t *v, int64_t *out) {
    if (!json_is_integer(v)) return false;
    *out = (int64_t)json_integer_value(v);
    return true;
}

/* The quant_state tensor of e, parsed and checked against (ndim, shape). */
static mt_status_t read_state(const eng_checkpoint_t *ck, const eng_ckpt_entry_t *e, int ndim, const int64_t *shape,
                              bnb_state_t *s, mt_error_t *err) {
    const char *path = ck->files[e->file].path;
    const eng_ckpt_entry_t *qs = NULL;
    int which = -1;
    for (int k = 0; k < 2; k++) {
        const eng_ckpt_entry_t *c = part(ck, e->name, k_state_suffix[k]);
        if (c && qs)
            return mt_error_set(err, MT_ERR_FORMAT, "%s: 4-bit weight '%s' has both an nf4 and an fp4 quant_state; "
                                "expected one", path, e->name);
        if (c) qs = c, which = k;
    }
    if (!qs)
        return mt_error_set(err, MT_ERR_FORMAT,
                            "%s: 4-bit weight '%s' (U8) has no '%s.quant_state.bitsandbytes__nf4' (or __fp4); "
                            "bitsandbytes stores its shape, block size and type there (the checkpoint is incomplete)",
                            path, e->name, e->name);
    const eng_st_tensor_t *t = qs->tensor;
    const char *qpath = ck->files[qs->file].path;
    if (t->dtype != ENG_ST_U8 || t->ndim != 1)
        return mt_error_set(err, MT_ERR_FORMAT, "%s: '%s' is %s %d-D; expected the U8 bytes of a JSON object", qpath,
                            qs->name, eng_st_dtype_name(t->dtype), t->ndim);
    json_error_t je;
    json_t *j = json_loadb(t->data, (size_t)t->numel, 0, &je);
    if (!json_is_object(j)) {
        json_decref(j);
        return mt_error_set(err, MT_ERR_FORMAT, "%s: '%s' is not a JSON object (%s)", qpath, qs->name, je.text);
    }
    mt_status_t st = MT_OK;
    const char *type = json_string_value(json_object_get(j, "quant_type"));
    const char *want_type = which == 0 ? "nf4" : "fp4";
    int64_t blk = 0, nb = 0, dims[8];
    json_t *sh = json_object_get(j, "shape");
    json_t *off = json_object_get(j, "nested_offset");
    s->nested = json_object_get(j, "nested_blocksize") != NULL;
    if (!type || strcmp(type, want_type) != 0)
        st = mt_error_set(err, MT_ERR_FORMAT, "%s: '%s' has quant_type %s%s%s; expected \"%s\" (moetune reads "
                          "bitsandbytes' nf4 and fp4)", qpath, qs->name, type ? "\"" : "", type ? type : "(none)",
                          type ? "\"" : "", want_type);
    else if (!json_int(json_object_get(j, "blocksize"), &blk) || blk < 32 || blk > 4096 || (blk & (blk - 1)))
        st = mt_error_set(err, MT_ERR_FORMAT, "%s: '%s' has blocksize %lld; expected a power of two from 32 to 4096 "
                          "(the block sizes bitsandbytes has)", qpath, qs->name, (long long)blk);
    else if (s->nested && (!json_int(json_object_get(j, "nested_blocksize"), &nb) || nb != 256))
        st = mt_error_set(err, MT_ERR_FORMAT, "%s: '%s' has nested_blocksize %lld; expected 256 (bitsandbytes' "
                          "double quantisation)", qpath, qs->name, (long long)nb);
    else if (s->nested && (!json_is_number(off) || !isfinite(json_number_value(off))))
        st = mt_error_set(err, MT_ERR_FORMAT, "%s: '%s' has no finite nested_offset; double quantisation needs it",
                          qpath, qs->name);
    if (st == MT_OK) {
        bool same = json_is_array(sh) && (int)json_array_size(sh) == ndim && ndim <= 8;
        for (int d = 0; same && d < ndim; d++) same = json_int(json_array_get(sh, (size_t)d), &dims[d]) && dims[d] == shape[d];
        if (!same) {
            char want[128], *got = sh ? json_dumps(sh, JSON_COMPACT) : NULL;
            shape_text(want, sizeof want, ndim, shape);
            st = mt_error_set(err, MT_ERR_FORMAT, "%s: '%s' says shape %s but config.json implies %s for '%s'. Use "
                              "the config.json that came with these weights", qpath, qs->name, got ? got : "(none)",
                              want, e->name);
            free(got);
        }
    }
    *s = (bnb_state_t){.format = which == 0 ? MT_QUANT_NF4 : MT_QUANT_FP4, .block = blk, .nested_block = nb,
                       .nested = s->nested, .offset = s->nested ? (float)json_number_value(off) : 0.0f};
    json_decref(j);
    return st;
}

/* Companion `suffix` of e: present, of dtype dt and `n` elements. */
static mt_status_t need(const eng_checkpoint_t *ck, const eng_ckpt_entry_t *e, const char *suffix, eng_st_dtype_t dt,
                        int64_t n, const char *why, const eng_ckpt_entry_t **out, mt_error_t *err) {
    *out = part(ck, e->name, suffix);
    if (!*out)
        return mt_error_set(err, MT_ERR_FORMAT, "%s: 4-bit weight '%s' has no '%s%s' (%s); the checkpoint is "
                            "incomplete", ck->files[e->file].path, e->name, e->name, suffix, why);
    const eng_st_tensor_t *t = (*out)->tensor;
    if (t->dtype != dt || (int64_t)t->numel != n)
        return mt_error_set(err, MT_ERR_FORMAT, "%s: '%s' is %s with %llu values; expected %s with %lld (%s)",
                            ck->files[(*out)->file].path, (*out)->name, eng_st_dtype_name(t->dtype),
                            (unsigned long long)t->numel, eng_st_dtype_name(dt), (long long)n, why);
    return MT_OK;
}

static float *read_floats(const eng_checkpoint_t *ck, const eng_ckpt_entry_t *c, mt_status_t *st, mt_error_t *err) {
    float *x = malloc((c->tensor->numel ? c->tensor->numel : 1) * sizeof *x);
    MT_CHECK_ALLOC(x, c->name);
    if (*st == MT_OK) *st = eng_st_read_f32(&ck->files[c->file], c->tensor, x, err);
    return x;
}

/* quant_map must be the table mt_quant_value decodes with: the codes mean
 * nothing else.  Compared as values: bitsandbytes' get_4bit_type("fp4")
 * writes code 8 as +0 (its Python table's `-0` is an integer zero) where
 * moetune's table, like bitsandbytes' kernels, has -0. */
static mt_status_t check_map(const eng_checkpoint_t *ck, const eng_ckpt_entry_t *c, const float *map,
                             mt_quant_format_t f, mt_error_t *err) {
    for (int q = 0; q < 16; q++) {
        const float want = f == MT_QUANT_NF4 ? mt_q_nf4((uint8_t)q) : mt_q_fp4((uint8_t)q);
        if (!(want == map[q]))
            return mt_error_set(err, MT_ERR_FORMAT, "%s: '%s' holds %.9g for code %d; bitsandbytes' %s table has %.9g",
                                ck->files[c->file].path, c->name, (double)map[q], q, mt_quant_format_name(f),
                                (double)want);
    }
    return MT_OK;
}

mt_status_t eng_checkpoint_bnb4_read(const eng_checkpoint_t *ck, const eng_ckpt_entry_t *e, int ndim,
                                     const int64_t *shape, bool values, eng_bnb4_t *out, mt_error_t *err) {
    memset(out, 0, sizeof *out);
    bnb_state_t s = {.format = MT_QUANT_NF4};
    mt_status_t st = read_state(ck, e, ndim, shape, &s, err);
    if (st != MT_OK) return st;
    int64_t n = 1;
    for (int d = 0; d < ndim; d++) n *= shape[d];
    const int64_t nbytes = (n + 1) / 2, nblocks = (n + s.block - 1) / s.block;
    const eng_st_tensor_t *w = e->tensor;
    if ((int64_t)w->numel != nbytes || !(w->ndim == 1 || (w->ndim == 2 && w->shape[1] == 1)))
        return mt_error_set(err, MT_ERR_FORMAT, "%s: 4-bit weight '%s' holds %llu bytes in %d dimension(s); a %lld-value "
                            "tensor needs U8 [%lld, 1] (two codes a byte)", ck->files[e->file].path, e->name,
                            (unsigned long long)w->numel, w->ndim, (long long)n, (long long)nbytes);
    const eng_ckpt_entry_t *am, *qm, *na = NULL, *nm = NULL;
    st = need(ck, e, ".absmax", s.nested ? ENG_ST_U8 : ENG_ST_F32, nblocks,
              s.nested ? "one 8-bit absmax code per block" : "one fp32 absmax per block", &am, err);
    if (st == MT_OK) st = need(ck, e, ".quant_map", ENG_ST_F32, 16, "the 16-entry code table", &qm, err);
    if (st == MT_OK && s.nested)
        st = need(ck, e, ".nested_absmax", ENG_ST_F32, (nblocks + 255) / 256, "one fp32 per 256 absmax codes", &na,
                  err);
    if (st == MT_OK && s.nested)
        st = need(ck, e, ".nested_quant_map", ENG_ST_F32, 256, "the 256-entry absmax map", &nm, err);
    if (st != MT_OK) return st;
    const int64_t cols = shape[ndim - 1];
    out->view = (mt_quant_view_t){.format = s.format, .rows = n / cols, .cols = cols, .block = s.block,
                                  .codes = w->data};
    out->have = (mt_quant_sizes_t){.codes = nbytes};
    if (!values) return MT_OK;
    float *map = read_floats(ck, qm, &st, err);
    if (st == MT_OK) st = check_map(ck, qm, map, s.format, err);
    free(map);
    if (s.nested) {
        out->absmax2_ = read_floats(ck, na, &st, err);
        out->code2_ = read_floats(ck, nm, &st, err);
        out->view.scales_u8 = am->tensor->data;
        out->view.absmax2 = out->absmax2_;
        out->view.code2 = out->code2_;
        out->view.block2 = 256;
        out->view.offset = s.offset;
        out->have.scales_u8 = nblocks;
        out->have.absmax2 = (nblocks + 255) / 256;
        out->have.code2 = 256;
    } else {
        out->absmax_ = read_floats(ck, am, &st, err);
        out->view.scales = out->absmax_;
        out->have.scales = nblocks;
    }
    if (st == MT_OK) {
        char what[600];
        snprintf(what, sizeof what, "%s: '%s'", ck->files[e->file].path, e->name);
        st = mt_quant_check(&out->view, &out->have, what, err); /* absmax finite and not negative, maps finite */
    }
    if (st != MT_OK) eng_bnb4_free(out);
    return st;
}

void eng_bnb4_free(eng_bnb4_t *b) {
    if (!b) return;
    free(b->absmax_);
    free(b->absmax2_);
    free(b->code2_);
    memset(b, 0, sizeof *b);
}
