/* HF checkpoint directories: open, load into fp32, save (see checkpoint.h).
 *
 * Which weights file wins follows transformers' loader: model.safetensors
 * if present, else model.safetensors.index.json.  Saving writes a whole new
 * checkpoint into a staging directory and switches it in through
 * engine/outdir (which also removes an earlier layout's weights files), and
 * opening first asks outdir whether the directory is a complete save, so a
 * mix of two saves is never loaded. */
#include "engine/model/io/checkpoint.h"

#include "base/quant.h"
#include "engine/model/io/outdir.h"

#include "base/fileio.h"

#include "base/finite.h"

#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char *path_join(const char *dir, const char *name) {
    size_t n = strlen(dir) + strlen(name) + 2;
    char *p = malloc(n);
    MT_CHECK_ALLOC(p, "path");
    snprintf(p, n, "%s/%s", dir, name);
    return p;
}

static bool file_exists(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0;
}

static void shape_to_str(char *buf, size_t cap, int ndim, const int64_t *s64, const uint64_t *su) {
    size_t n = (size_t)snprintf(buf, cap, "[");
    for (int i = 0; i < ndim && n < cap; i++)
        n += (size_t)snprintf(buf + n, cap - n, "%s%lld", i ? ", " : "",
                              s64 ? (long long)s64[i] : (long long)su[i]);
    if (n < cap) snprintf(buf + n, cap - n, "]");
}

static int cmp_entry(const void *a, const void *b) {
    return strcmp(((const eng_ckpt_entry_t *)a)->name, ((const eng_ckpt_entry_t *)b)->name);
}

/* A shard name from an index must be a plain file in the directory. */
static bool plain_file_name(const char *s) {
    return s[0] != '\0' && strchr(s, '/') == NULL && strcmp(s, ".") != 0 && strcmp(s, "..") != 0;
}

static mt_status_t open_sharded(eng_checkpoint_t *ck, const char *index_path, mt_error_t *err) {
    json_error_t jerr;
    FILE *ifp;
    mt_status_t ost = mt_fopen_regular(index_path, "checkpoint index", &ifp, err);
    if (ost != MT_OK) return ost;
    json_t *root = json_loadf(ifp, JSON_REJECT_DUPLICATES, &jerr);
    fclose(ifp);
    if (!root)
        return mt_error_set(err, MT_ERR_FORMAT, "%s: not valid JSON: %s (line %d)", index_path,
                            jerr.text, jerr.line);
    mt_status_t st = MT_OK;
    json_t *wm = json_is_object(root) ? json_object_get(root, "weight_map") : NULL;
    if (!json_is_object(wm)) {
        st = mt_error_set(err, MT_ERR_FORMAT, "%s: key 'weight_map' missing or not an object",
                          index_path);
        goto out;
    }
    /* Distinct shard names in first-seen order. */
    size_t n = json_object_size(wm);
    const char **shards = calloc(n ? n : 1, sizeof *shards);
    MT_CHECK_ALLOC(shards, "shard list");
    int nshards = 0;
    const char *key;
    json_t *val;
    json_object_foreach(wm, key, val) {
        if (!json_is_string(val) || !plain_file_name(json_string_value(val))) {
            st = mt_error_set(err, MT_ERR_FORMAT,
                              "%s: weight_map['%s'] is not a file name in the checkpoint directory",
                              index_path, key);
            free(shards);
            goto out;
        }
        const char *s = json_string_value(val);
        int k = 0;
        while (k < nshards && strcmp(shards[k], s) != 0) k++;
        if (k == nshards) shards[nshards++] = s;
    }
    ck->files = calloc(nshards ? (size_t)nshards : 1, sizeof *ck->files);
    MT_CHECK_ALLOC(ck->files, "shards");
    for (int k = 0; k < nshards; k++) {
        char *sp = path_join(ck->dir, shards[k]);
        if (!file_exists(sp)) {
            const char *example = "?";
            json_object_foreach(wm, key, val) {
                if (strcmp(json_string_value(val), shards[k]) == 0) {
                    example = key;
                    break;
                }
            }
            st = mt_error_set(err, MT_ERR_IO,
                              "%s: shard '%s' named in %s (for tensor '%s' and others) is missing",
                              ck->dir, shards[k], ENG_CKPT_INDEX_FILE, example);
            free(sp);
            free(shards);
            goto out;
        }
        st = eng_st_open(sp, &ck->files[k], err);
        free(sp);
        if (st != MT_OK) {
            free(shards);
            goto out;
        }
        ck->file_count = k + 1;
        ck->disk_bytes += ck->files[k].file_size;
    }
    ck->entries = calloc(n ? n : 1, sizeof *ck->entries);
    MT_CHECK_ALLOC(ck->entries, "checkpoint index");
    json_object_foreach(wm, key, val) {
        const char *s = json_string_value(val);
        int k = 0;
        while (strcmp(shards[k], s) != 0) k++;
        const eng_st_tensor_t *t = eng_st_find(&ck->files[k], key);
        if (!t) {
            st = mt_error_set(err, MT_ERR_FORMAT,
                              "%s: tensor '%s' is listed in %s under shard '%s' but that shard does "
                              "not contain it",
                              ck->dir, key, ENG_CKPT_INDEX_FILE, s);
            free(shards);
            goto out;
        }
        ck->entries[ck->count++] = (eng_ckpt_entry_t){t->name, k, t};
    }
    free(shards);
out:
    json_decref(root);
    return st;
}

static mt_status_t open_weights(const char *dir, eng_checkpoint_t *out, mt_error_t *err) {
    memset(out, 0, sizeof *out);
    out->dir = strdup(dir);
    MT_CHECK_ALLOC(out->dir, "path");
    mt_status_t st;
    char *single = path_join(dir, ENG_CKPT_SINGLE_FILE);
    char *index = path_join(dir, ENG_CKPT_INDEX_FILE);
    if (file_exists(single)) {
        out->files = calloc(1, sizeof *out->files);
        MT_CHECK_ALLOC(out->files, "checkpoint");
        st = eng_st_open(single, &out->files[0], err);
        if (st == MT_OK) {
            out->file_count = 1;
            out->disk_bytes = out->files[0].file_size;
            const eng_st_file_t *f = &out->files[0];
            out->entries = calloc(f->count ? (size_t)f->count : 1, sizeof *out->entries);
            MT_CHECK_ALLOC(out->entries, "checkpoint index");
            for (int i = 0; i < f->count; i++)
                out->entries[out->count++] = (eng_ckpt_entry_t){f->tensors[i].name, 0, &f->tensors[i]};
        }
    } else if (file_exists(index)) {
        st = open_sharded(out, index, err);
    } else {
        char *bin = path_join(dir, "pytorch_model.bin");
        bool has_bin = file_exists(bin);
        free(bin);
        st = has_bin ? mt_error_set(err, MT_ERR_UNSUPPORTED,
                                    "%s: only safetensors checkpoints are supported (found "
                                    "pytorch_model.bin); convert it with save_pretrained",
                                    dir)
                     : mt_error_set(err, MT_ERR_IO, "%s: no %s or %s in the directory", dir,
                                    ENG_CKPT_SINGLE_FILE, ENG_CKPT_INDEX_FILE);
    }
    free(single);
    free(index);
    if (st != MT_OK) {
        eng_checkpoint_close(out);
        return st;
    }
    qsort(out->entries, (size_t)out->count, sizeof *out->entries, cmp_entry);
    return MT_OK;
}

/* The files' own errors (a truncated shard, a missing one) say most about a
 * damaged directory, so they come first; a directory whose files all parse
 * is then checked as a whole against its completion manifest (engine/outdir),
 * which is what catches a mix of two saves. */
mt_status_t eng_checkpoint_open(const char *dir, eng_checkpoint_t *out, mt_error_t *err) {
    mt_error_t cerr = {0};
    const mt_status_t cst = eng_ckpt_dir_check(dir, &cerr);
    mt_status_t st = open_weights(dir, out, err);
    if (st != MT_OK) {
        if (cst != MT_OK) {
            size_t n = strlen(err->msg);
            snprintf(err->msg + n, sizeof err->msg - n, "; %s", cerr.msg);
        }
        return st;
    }
    if (cst != MT_OK) {
        eng_checkpoint_close(out);
        *err = cerr;
    }
    return cst;
}

void eng_checkpoint_close(eng_checkpoint_t *ck) {
    for (int i = 0; i < ck->file_count; i++) eng_st_close(&ck->files[i]);
    free(ck->files);
    free(ck->entries);
    free(ck->dir);
    free(ck->views);
    free(ck->view_names_);
    free(ck->view_shapes_);
    memset(ck, 0, sizeof *ck);
}

const eng_ckpt_entry_t *eng_checkpoint_find(const eng_checkpoint_t *ck, const char *name) {
    eng_ckpt_entry_t key = {.name = name};
    return bsearch(&key, ck->entries, (size_t)ck->count, sizeof key, cmp_entry);
}

/* An F8_E4M3 tensor, as DeepSeek-V3 and GLM ship their linear weights
 * (quant_method fp8), is only a weight with its block scales: the sibling
 * `<module>.weight_scale_inv`, fp32 (or BF16/F16), one scale per 128 x 128
 * block as the published quantization_config's weight_block_size says.
 * Read unscaled, the values would be thousands of times too large and still
 * train, so a weight without them, or with scales of another shape, is
 * refused here from the headers (eng_checkpoint_check calls it too, when the
 * run is planned), and their values when read. */
#define ENG_FP8_BLOCK 128
mt_status_t eng_checkpoint_fp8_scales(const eng_checkpoint_t *ck, const eng_ckpt_entry_t *e,
                                      const eng_ckpt_entry_t **scales, mt_error_t *err) {
    const eng_st_tensor_t *t = e->tensor;
    const char *path = ck->files[e->file].path;
    char sname[300];
    snprintf(sname, sizeof sname, "%s_scale_inv", e->name);
    const eng_ckpt_entry_t *se = eng_checkpoint_find(ck, sname);
    if (!se)
        return mt_error_set(err, MT_ERR_FORMAT,
                            "%s: FP8 tensor '%s' has no block scales '%s' in the checkpoint; an F8_E4M3 weight is "
                            "read with its weight_scale_inv (the checkpoint is incomplete)",
                            path, e->name, sname);
    const eng_st_tensor_t *s = se->tensor;
    if (s->dtype != ENG_ST_F32 && s->dtype != ENG_ST_BF16 && s->dtype != ENG_ST_F16)
        return mt_error_set(err, MT_ERR_FORMAT, "%s: block scales '%s' are %s; expected F32, BF16 or F16",
                            ck->files[se->file].path, sname, eng_st_dtype_name(s->dtype));
    if (t->ndim != 2 || s->ndim != 2)
        return mt_error_set(err, MT_ERR_FORMAT,
                            "%s: FP8 tensor '%s' (%d-D) with block scales '%s' (%d-D): both must be 2-D", path,
                            e->name, t->ndim, sname, s->ndim);
    const int64_t rows = (int64_t)t->shape[0], cols = (int64_t)t->shape[1];
    const int64_t want_r = (rows + ENG_FP8_BLOCK - 1) / ENG_FP8_BLOCK, want_c = (cols + ENG_FP8_BLOCK - 1) / ENG_FP8_BLOCK;
    if ((int64_t)s->shape[0] != want_r || (int64_t)s->shape[1] != want_c)
        return mt_error_set(err, MT_ERR_FORMAT,
                            "%s: block scales '%s' have shape [%lld, %lld]; the FP8 weight '%s' [%lld, %lld] in "
                            "blocks of %d x %d needs [%lld, %lld]",
                            ck->files[se->file].path, sname, (long long)s->shape[0], (long long)s->shape[1],
                            e->name, (long long)rows, (long long)cols, ENG_FP8_BLOCK, ENG_FP8_BLOCK,
                            (long long)want_r, (long long)want_c);
    *scales = se;
    return MT_OK;
}

static mt_status_t read_fp8(const eng_checkpoint_t *ck, const eng_ckpt_entry_t *e, float *dst, mt_error_t *err) {
    const eng_ckpt_entry_t *se;
    mt_status_t st = eng_checkpoint_fp8_scales(ck, e, &se, err);
    if (st != MT_OK) return st;
    const eng_st_tensor_t *t = e->tensor, *s = se->tensor;
    float *scale = malloc((s->numel ? s->numel : 1) * sizeof *scale);
    MT_CHECK_ALLOC(scale, se->name);
    st = eng_st_read_f32(&ck->files[se->file], s, scale, err);
    /* a scale of 0, a negative or a non-finite one: blamed on the scale, not the weight */
    const size_t bad = st == MT_OK ? mt_first_bad_scale(scale, s->numel) : SIZE_MAX;
    if (bad != SIZE_MAX)
        st = mt_error_set(err, MT_ERR_FORMAT,
                          "%s: block scales '%s' hold %g at [%zu, %zu]; expected finite, positive scales (the "
                          "checkpoint is damaged)",
                          ck->files[se->file].path, se->name, (double)scale[bad], bad / (size_t)s->shape[1],
                          bad % (size_t)s->shape[1]);
    if (st == MT_OK) {
        char what[400];
        snprintf(what, sizeof what, "%s: '%s'", ck->files[e->file].path, e->name);
        st = mt_dequant_fp8_e4m3_block(t->data, (int64_t)t->shape[0], (int64_t)t->shape[1], scale,
                                       (int64_t)s->shape[0], (int64_t)s->shape[1], ENG_FP8_BLOCK, ENG_FP8_BLOCK, dst,
                                       what, err);
    }
    free(scale);
    return st;
}

bool eng_checkpoint_find_mxfp4(const eng_checkpoint_t *ck, const char *name, const eng_ckpt_entry_t **blocks,
                               const eng_ckpt_entry_t **scales, int64_t shape[3]) {
    char bn[300], sn[300];
    snprintf(bn, sizeof bn, "%s_blocks", name);
    snprintf(sn, sizeof sn, "%s_scales", name);
    const eng_ckpt_entry_t *b = eng_checkpoint_find(ck, bn), *s = eng_checkpoint_find(ck, sn);
    if (!b || !s) return false;
    const eng_st_tensor_t *bt = b->tensor, *st = s->tensor;
    if (bt->dtype != ENG_ST_U8 || st->dtype != ENG_ST_U8 || bt->ndim != 4 || st->ndim != 3 || bt->shape[3] != 16)
        return false;
    for (int d = 0; d < 3; d++)
        if (bt->shape[d] != st->shape[d]) return false;
    *blocks = b;
    *scales = s;
    shape[0] = (int64_t)bt->shape[0];
    shape[1] = (int64_t)bt->shape[2] * 32;
    shape[2] = (int64_t)bt->shape[1];
    return true;
}

mt_status_t eng_checkpoint_mxfp4_check(const eng_checkpoint_t *ck, const char *name, mt_error_t *err) {
    char bn[300], sn[300];
    snprintf(bn, sizeof bn, "%s_blocks", name);
    snprintf(sn, sizeof sn, "%s_scales", name);
    const eng_ckpt_entry_t *b = eng_checkpoint_find(ck, bn), *s = eng_checkpoint_find(ck, sn);
    if (!b && !s) return MT_OK;
    if (!b || !s)
        return mt_error_set(err, MT_ERR_FORMAT, "%s: MXFP4 tensor '%s' has no partner '%s'; gpt-oss's experts are "
                            "stored as both",
                            ck->files[(b ? b : s)->file].path, b ? bn : sn, b ? sn : bn);
    const eng_st_tensor_t *bt = b->tensor, *st = s->tensor;
    char bs[128], ss[128];
    shape_to_str(bs, sizeof bs, bt->ndim, NULL, bt->shape);
    shape_to_str(ss, sizeof ss, st->ndim, NULL, st->shape);
    if (bt->dtype != ENG_ST_U8 || st->dtype != ENG_ST_U8)
        return mt_error_set(err, MT_ERR_FORMAT, "%s: MXFP4 tensors '%s' (%s) and '%s' (%s): both must be U8",
                            ck->files[b->file].path, bn, eng_st_dtype_name(bt->dtype), sn,
                            eng_st_dtype_name(st->dtype));
    bool ok = bt->ndim == 4 && st->ndim == 3 && bt->shape[3] == 16;
    for (int d = 0; ok && d < 3; d++) ok = bt->shape[d] == st->shape[d];
    if (!ok)
        return mt_error_set(err, MT_ERR_FORMAT,
                            "%s: MXFP4 tensors '%s' %s and '%s' %s do not fit; expected (E, R, G, 16) and (E, R, G)",
                            ck->files[b->file].path, bn, bs, sn, ss);
    return MT_OK;
}

/* A gpt-oss expert tensor from its MXFP4 blocks and scales, dequantised
 * into transformers' layout (E, C, R) and checked for non-finite values. */
static mt_status_t read_mxfp4(const eng_checkpoint_t *ck, const char *name, int ndim, const int64_t *expect_shape,
                              const eng_ckpt_entry_t *b, const eng_ckpt_entry_t *s, const int64_t shape[3],
                              float *dst, mt_error_t *err) {
    char want[128], got[128];
    shape_to_str(want, sizeof want, ndim, expect_shape, NULL);
    shape_to_str(got, sizeof got, 3, shape, NULL);
    if (ndim != 3 || shape[0] != expect_shape[0] || shape[1] != expect_shape[1] || shape[2] != expect_shape[2])
        return mt_error_set(err, MT_ERR_FORMAT,
                            "%s: MXFP4 tensor '%s_blocks' dequantises to %s but config.json implies %s",
                            ck->files[b->file].path, name, got, want);
    mt_dequant_mxfp4(b->tensor->data, s->tensor->data, shape[0], shape[2], shape[1] / 32, true, dst);
    const size_t n = (size_t)(shape[0] * shape[1] * shape[2]);
    const size_t bad = mt_first_nonfinite_f32(dst, n);
    if (bad != MT_ALL_FINITE)
        return mt_error_set(err, MT_ERR_FORMAT,
                            "%s: tensor '%s_scales' holds the NaN scale 0xFF, which makes element %zu of '%s' "
                            "non-finite; the checkpoint is damaged",
                            ck->files[s->file].path, name, bad, name);
    return MT_OK;
}

/* A bitsandbytes 4-bit weight dequantised as its dequantize_4bit does
 * (fp32): what full fine-tuning, and a LoRA run's modules that are not kept
 * quantised (a router transformers 4 quantised, a skipped module), train
 * from. */
static mt_status_t read_bnb4(const eng_checkpoint_t *ck, const eng_ckpt_entry_t *e, int ndim,
                             const int64_t *expect_shape, float *dst, mt_error_t *err) {
    eng_bnb4_t b;
    mt_status_t st = eng_checkpoint_bnb4_read(ck, e, ndim, expect_shape, true, &b, err);
    if (st != MT_OK) return st;
    mt_dequant(&b.view, dst, MT_F32);
    eng_bnb4_free(&b);
    return MT_OK; /* finite: mt_quant_check held the absmax finite, and every code is */
}

mt_status_t eng_checkpoint_read_f32(const eng_checkpoint_t *ck, const char *name, int ndim,
                                    const int64_t *expect_shape, float *dst, mt_error_t *err) {
    char want[128], got[128];
    shape_to_str(want, sizeof want, ndim, expect_shape, NULL);
    const eng_ckpt_entry_t *e = eng_checkpoint_find(ck, name);
    const eng_ckpt_entry_t *mb, *ms;
    int64_t mshape[3];
    if (!e && eng_checkpoint_find_mxfp4(ck, name, &mb, &ms, mshape))
        return read_mxfp4(ck, name, ndim, expect_shape, mb, ms, mshape, dst, err);
    const mt_status_t mst = e ? MT_OK : eng_checkpoint_mxfp4_check(ck, name, err);
    if (mst != MT_OK) return mst;
    if (!e)
        return mt_error_set(err, MT_ERR_FORMAT,
                            "%s: missing tensor '%s' (config.json implies shape %s)", ck->dir, name,
                            want);
    if (eng_checkpoint_is_bnb4(ck, e)) return read_bnb4(ck, e, ndim, expect_shape, dst, err);
    const eng_st_file_t *f = &ck->files[e->file];
    const eng_st_tensor_t *t = e->tensor;
    bool same = t->ndim == ndim;
    for (int d = 0; same && d < ndim; d++) same = (int64_t)t->shape[d] == expect_shape[d];
    if (!same) {
        shape_to_str(got, sizeof got, t->ndim, NULL, t->shape);
        return mt_error_set(err, MT_ERR_FORMAT,
                            "%s: tensor '%s' has shape %s but config.json implies %s", f->path,
                            name, got, want);
    }
    /* A NaN or Inf in a weight would otherwise surface steps later as a NaN
     * loss (or, in a weight the data never touches, be saved again as is):
     * refuse it here, where the file and tensor are known.  Converted and
     * checked a chunk at a time, so the check reads the chunk while it is
     * still in cache: it adds little to the load (see ckpt_load_timing). */
    const size_t chunk = (size_t)1 << 14; /* elements: 64 KiB of fp32, well inside L2 */
    const size_t es = (size_t)eng_st_dtype_bits(t->dtype) / 8;
    size_t bad = MT_ALL_FINITE;
    if (t->dtype == ENG_ST_F8_E4M3) {
        mt_status_t st = read_fp8(ck, e, dst, err);
        if (st != MT_OK) return st;
        bad = mt_first_nonfinite_f32(dst, t->numel);
    }
    for (size_t off = 0; off < t->numel && bad == MT_ALL_FINITE && t->dtype != ENG_ST_F8_E4M3; off += chunk) {
        eng_st_tensor_t part = *t;
        part.numel = t->numel - off < chunk ? t->numel - off : chunk;
        part.data = (const uint8_t *)t->data + off * es;
        mt_status_t st = eng_st_read_f32(f, &part, dst + off, err);
        if (st != MT_OK) return st;
        const size_t at = mt_first_nonfinite_f32(dst + off, part.numel);
        if (at != MT_ALL_FINITE) bad = off + at;
    }
    if (bad != MT_ALL_FINITE) {
        char at[128];
        mt_index_to_str(at, sizeof at, bad, ndim, expect_shape);
        return mt_error_set(err, MT_ERR_FORMAT,
                            "%s: tensor '%s' holds a non-finite value (%s) at index %s (element "
                            "%zu of %zu); the checkpoint is damaged or was saved from a diverged "
                            "run",
                            f->path, name, mt_nonfinite_name(dst[bad]), at, bad, (size_t)t->numel);
    }
    return MT_OK;
}

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* The index of the first of `suffixes` that n is NAME + suffix of, for a
 * NAME among the checkpoint's sorted names (written into base), or -1. */
static int described_base(const char **names, int count, const char *n, const char *const *suffixes,
                          int num_suffixes, char *base, size_t cap) {
    const size_t len = strlen(n);
    for (int k = 0; k < num_suffixes; k++) {
        const size_t sl = strlen(suffixes[k]);
        if (len <= sl || len - sl >= cap || strcmp(n + len - sl, suffixes[k]) != 0) continue;
        memcpy(base, n, len - sl);
        base[len - sl] = '\0';
        const char *key = base;
        if (bsearch(&key, names, (size_t)count, sizeof *names, cmp_str)) return k;
    }
    return -1;
}

bool eng_checkpoint_dequant_part(const eng_checkpoint_t *ck, const char **names, int count, const char *n) {
    /* bitsandbytes' companions of a 4-bit NAME */
    static const char *const k_bnb[] = {".absmax", ".quant_map", ".nested_absmax", ".nested_quant_map",
                                        ".quant_state.bitsandbytes__nf4", ".quant_state.bitsandbytes__fp4"};
    static const char *const k_scaled[] = {"_blocks", "_scales", "_scale_inv"};
    char base[512];
    if (described_base(names, count, n, k_bnb, (int)(sizeof k_bnb / sizeof *k_bnb), base, sizeof base) >= 0 &&
        eng_checkpoint_is_bnb4(ck, eng_checkpoint_find(ck, base)))
        return true;
    const int k =
        described_base(names, count, n, k_scaled, (int)(sizeof k_scaled / sizeof *k_scaled), base, sizeof base);
    if (k < 0) return false;
    const eng_ckpt_entry_t *plain = eng_checkpoint_find(ck, base), *mb, *ms;
    int64_t shape[3];
    if (k == 2) return plain && plain->tensor->dtype == ENG_ST_F8_E4M3; /* the scales of an FP8 weight */
    /* MXFP4: read only where the plain tensor is absent */
    return !plain && eng_checkpoint_find_mxfp4(ck, base, &mb, &ms, shape);
}

mt_status_t eng_checkpoint_load(const eng_checkpoint_t *ck, const eng_model_desc_t *spec,
                                float *const *dst, eng_ckpt_load_report_t *report, mt_error_t *err) {
    if (report) memset(report, 0, sizeof *report);
    for (int i = 0; i < spec->count; i++) {
        const eng_param_spec_t *p = &spec->params[i];
        if (!dst[i]) continue; /* the caller reads this one itself */
        mt_status_t st = eng_checkpoint_read_f32(ck, p->name, p->ndim, p->shape, dst[i], err);
        if (st != MT_OK) return st;
    }
    if (!report) return MT_OK;
    /* Unexpected tensors: a merge of two sorted name lists (a buffer is expected too). */
    const int described = spec->count + spec->num_buffers;
    const char **names = malloc((described ? (size_t)described : 1) * sizeof *names);
    MT_CHECK_ALLOC(names, "spec names");
    for (int i = 0; i < spec->count; i++) names[i] = spec->params[i].name;
    for (int i = 0; i < spec->num_buffers; i++) names[spec->count + i] = spec->buffers[i].name;
    qsort(names, (size_t)described, sizeof *names, cmp_str);
    report->unexpected = malloc((ck->count ? (size_t)ck->count : 1) * sizeof *report->unexpected);
    MT_CHECK_ALLOC(report->unexpected, "load report");
    int j = 0;
    for (int i = 0; i < ck->count; i++) {
        const char *n = ck->entries[i].name;
        while (j < described && strcmp(names[j], n) < 0) j++;
        if (j < described && strcmp(names[j], n) == 0) continue;
        if (eng_checkpoint_dequant_part(ck, names, described, n)) continue;
        report->unexpected[report->unexpected_count++] = n;
    }
    free(names);
    return MT_OK;
}

mt_status_t eng_checkpoint_load_buffers(const eng_checkpoint_t *ck, const eng_model_desc_t *spec, float *const *dst,
                                        mt_error_t *err) {
    for (int i = 0; i < spec->num_buffers; i++) {
        const eng_param_spec_t *p = &spec->buffers[i];
        mt_status_t st = eng_checkpoint_read_f32(ck, p->name, p->ndim, p->shape, dst[i], err);
        if (st != MT_OK) return st;
    }
    return MT_OK;
}

void eng_ckpt_load_report_free(eng_ckpt_load_report_t *report) {
    free(report->unexpected);
    memset(report, 0, sizeof *report);
}

/* ---- saving ----------------------------------------------------------- */

static uint64_t tensor_bytes(const eng_ckpt_tensor_t *t) {
    uint64_t n = mt_dtype_size(t->dtype);
    for (int d = 0; d < t->ndim; d++) n *= (uint64_t)t->shape[d];
    return n;
}

/* Writes one weights file into the save's staging directory and records it. */
static mt_status_t write_shard(eng_ckpt_dir_t *tx, const char *name, const eng_ckpt_tensor_t *ts,
                               const int *members, int nm, mt_error_t *err) {
    eng_st_write_tensor_t *w = calloc(nm ? (size_t)nm : 1, sizeof *w);
    MT_CHECK_ALLOC(w, "shard");
    for (int i = 0; i < nm; i++) {
        const eng_ckpt_tensor_t *t = &ts[members[i]];
        w[i] = (eng_st_write_tensor_t){.name = t->name,
                                       .dtype = eng_st_dtype_from_mt(t->dtype),
                                       .ndim = t->ndim,
                                       .shape = t->shape,
                                       .f32 = t->data};
    }
    /* torch's {"format": "pt"} plus the save id readers match against the manifest */
    const char *meta[] = {"format", "pt", ENG_CKPT_SAVE_ID_KEY, tx->save_id};
    char *path = eng_ckpt_dir_path(tx, name);
    mt_status_t st = eng_st_write(path, w, nm, meta, 2, err);
    free(path);
    free(w);
    if (st == MT_OK) eng_ckpt_dir_add(tx, name);
    return st;
}

/* The index and config.json: small text files, written whole. */
static mt_status_t write_text(eng_ckpt_dir_t *tx, const char *name, const char *text, mt_error_t *err) {
    char *p = eng_ckpt_dir_path(tx, name);
    mt_status_t st = eng_write_file_atomic(p, text, strlen(text), err);
    free(p);
    if (st == MT_OK) eng_ckpt_dir_add(tx, name);
    return st;
}

mt_status_t eng_checkpoint_write(eng_ckpt_dir_t *tx, const char *config_json,
                                 const eng_ckpt_tensor_t *tensors, int count, uint64_t max_shard_bytes,
                                 mt_error_t *err) {
    for (int i = 0; i < count; i++) {
        mt_dtype_t dt = tensors[i].dtype;
        if (dt != MT_F32 && dt != MT_BF16 && dt != MT_F16)
            return mt_error_set(err, MT_ERR_UNSUPPORTED, "tensor '%s': cannot save as %s",
                                tensors[i].name, mt_dtype_name(dt));
    }
    mt_status_t st = config_json ? write_text(tx, "config.json", config_json, err) : MT_OK;
    if (st != MT_OK) return st;

    /* Shard plan, as huggingface_hub's split_state_dict_into_shards_factory:
     * a tensor larger than the limit gets a shard of its own (placed before
     * the shard being filled); otherwise a new shard starts when the next
     * tensor would push the current one over the limit. */
    int *shard_of = malloc((count ? (size_t)count : 1) * sizeof *shard_of);
    int *order = malloc((count ? (size_t)count : 1) * sizeof *order);
    MT_CHECK_ALLOC(shard_of, "shard plan");
    MT_CHECK_ALLOC(order, "shard plan");
    uint64_t limit = max_shard_bytes ? max_shard_bytes : UINT64_MAX;
    uint64_t total_size = 0, cur_size = 0;
    int nshards = 0, open_from = -1; /* members of the open shard have shard_of == -1 */
    for (int i = 0; i <= count; i++) {
        uint64_t b = i < count ? tensor_bytes(&tensors[i]) : 0;
        bool close_open = open_from >= 0 && (i == count || (b <= limit && cur_size + b > limit));
        if (close_open) { /* the open shard gets its number when it is closed, as in HF */
            for (int j = open_from; j < i; j++)
                if (shard_of[j] == -1) shard_of[j] = nshards;
            nshards++;
            open_from = -1;
        }
        if (i == count) break;
        total_size += b;
        if (b > limit) {
            shard_of[i] = nshards++;
            continue;
        }
        if (open_from < 0) {
            open_from = i;
            cur_size = 0;
        }
        shard_of[i] = -1;
        cur_size += b;
    }
    if (nshards == 0) nshards = 1; /* an empty model still gets a (header-only) file */

    if (nshards == 1) {
        for (int i = 0; i < count; i++) order[i] = i;
        st = write_shard(tx, ENG_CKPT_SINGLE_FILE, tensors, order, count, err);
        free(shard_of);
        free(order);
        return st;
    }

    char (*fname)[48] = calloc((size_t)nshards, sizeof *fname);
    MT_CHECK_ALLOC(fname, "shard names");
    for (int s = 0; s < nshards && st == MT_OK; s++) {
        snprintf(fname[s], sizeof fname[s], "model-%05d-of-%05d.safetensors", s + 1, nshards);
        int nm = 0;
        for (int i = 0; i < count; i++)
            if (shard_of[i] == s) order[nm++] = i;
        st = write_shard(tx, fname[s], tensors, order, nm, err);
    }
    if (st == MT_OK) {
        /* Index as transformers writes it: json.dumps(index, indent=2, sort_keys=True) + "\n". */
        json_t *root = json_object(), *meta = json_object(), *wm = json_object();
        json_object_set_new(meta, "total_size", json_integer((json_int_t)total_size));
        for (int i = 0; i < count; i++)
            json_object_set_new(wm, tensors[i].name, json_string(fname[shard_of[i]]));
        json_object_set_new(root, "metadata", meta);
        json_object_set_new(root, "weight_map", wm);
        char *text = json_dumps(root, JSON_INDENT(2) | JSON_SORT_KEYS);
        json_decref(root);
        MT_CHECK_ALLOC(text, "index");
        size_t len = strlen(text);
        char *withnl = malloc(len + 2);
        MT_CHECK_ALLOC(withnl, "index");
        memcpy(withnl, text, len);
        withnl[len] = '\n';
        withnl[len + 1] = '\0';
        free(text);
        st = write_text(tx, ENG_CKPT_INDEX_FILE, withnl, err);
        free(withnl);
    }
    free(fname);
    free(shard_of);
    free(order);
    return st;
}

mt_status_t eng_checkpoint_save(const char *dir, const char *config_json,
                                const eng_ckpt_tensor_t *tensors, int count,
                                uint64_t max_shard_bytes, mt_error_t *err) {
    /* A directory that does not exist yet is the checkpoint's own (swapped in
     * whole); one that exists may hold other files and gets the files merged. */
    struct stat sb;
    const eng_ckpt_dir_mode_t mode = stat(dir, &sb) == 0 ? ENG_CKPT_DIR_MERGE : ENG_CKPT_DIR_SWAP;
    eng_ckpt_dir_t tx;
    mt_status_t st = eng_ckpt_dir_begin(&tx, dir, mode, err);
    if (st != MT_OK) return st;
    st = eng_checkpoint_write(&tx, config_json, tensors, count, max_shard_bytes, err);
    if (st != MT_OK) {
        eng_ckpt_dir_abort(&tx);
        return st;
    }
    return eng_ckpt_dir_commit(&tx, err);
}
