/* HF checkpoint directories: config.json plus model.safetensors, or
 * model.safetensors.index.json plus the shards its weight_map names.
 *
 * Loading converts every parameter of a model description to fp32 in buffers the
 * caller owns (the caller decides where host tensors live), checking each
 * tensor's shape against what config.json implies.  Tensors the spec does
 * not know are ignored and reported, as HF's "unexpected keys" warning does.
 *
 * Saving writes the HF layout (save_pretrained's file names, shard split and
 * index format) into a staging directory and switches the whole checkpoint
 * in at once (engine/model/io/outdir.h): a crash leaves the previous checkpoint or
 * the new one, and anything in between is refused by eng_checkpoint_open. */
#ifndef MT_ENGINE_CHECKPOINT_H
#define MT_ENGINE_CHECKPOINT_H

#include <stddef.h>
#include <stdint.h>

#include "engine/model/hf/model_config.h"
#include "engine/model/desc/model_desc.h"
#include "engine/model/io/outdir.h"
#include "engine/model/io/safetensors.h"
#include "base/dtype.h"
#include "base/quant.h"
#include "base/status.h"

#define ENG_CKPT_SINGLE_FILE "model.safetensors"
#define ENG_CKPT_INDEX_FILE "model.safetensors.index.json"
/* save_pretrained's default max_shard_size ("5GB", decimal). */
#define ENG_CKPT_DEFAULT_MAX_SHARD_BYTES 5000000000ull

typedef struct {
    const char *name;  /* owned by the file that holds it */
    int file;          /* index into files */
    const eng_st_tensor_t *tensor;
} eng_ckpt_entry_t;

/* How a checkpoint stores routed experts.  PER_EXPERT is the Hub's layout
 * (`…experts.E.w1.weight`, `…experts.E.gate_proj.weight`): what
 * save_pretrained writes by default.  FUSED is transformers 5's in-memory
 * layout, which save_pretrained writes with save_original_format=False and
 * whenever a PEFT adapter is attached: per MoE layer
 * `model.layers.N.mlp.experts.gate_up_proj` (E, 2I, H), expert e's gate
 * rows then its up rows, and `…mlp.experts.down_proj` (E, H, I); Mixtral's
 * block is named `mlp` there rather than `block_sparse_moe`. */
typedef enum { ENG_CKPT_LAYOUT_PER_EXPERT = 0, ENG_CKPT_LAYOUT_FUSED } eng_ckpt_layout_t;

const char *eng_ckpt_layout_name(eng_ckpt_layout_t layout); /* "per_expert", "fused" */

typedef struct eng_checkpoint {
    char *dir;
    eng_st_file_t *files; /* (file_count) mapped shards */
    int file_count;
    eng_ckpt_entry_t *entries; /* (count) every tensor, sorted by name */
    int count;
    uint64_t disk_bytes;   /* sum of the shard file sizes */
    /* Set by eng_checkpoint_resolve: the layout found, and the per-expert
     * views of fused tensors (slices of the mapping) the entries point to. */
    eng_ckpt_layout_t layout;
    eng_st_tensor_t *views;   /* (view_count) */
    int view_count;
    char *view_names_;        /* internal: the views' names and shapes */
    uint64_t *view_shapes_;
} eng_checkpoint_t;

/* Opens (maps and validates) the weights of DIR.  Errors name the directory
 * and the file: neither weights file present (MT_ERR_IO), a shard named in
 * the index missing (MT_ERR_IO, naming shard and index), a tensor listed in
 * the index but absent from its shard (MT_ERR_FORMAT, naming both), and any
 * safetensors format error. */
mt_status_t eng_checkpoint_open(const char *dir, eng_checkpoint_t *out, mt_error_t *err);
void eng_checkpoint_close(eng_checkpoint_t *ck);
/* The entry for a tensor name, or NULL.  O(log count). */
const eng_ckpt_entry_t *eng_checkpoint_find(const eng_checkpoint_t *ck, const char *name);

/* Makes the checkpoint answer to spec's names whatever layout it was saved
 * in: every spec tensor the checkpoint lacks under its Hub name but holds
 * in transformers 5's fused layout (see eng_ckpt_layout_t) becomes an entry
 * under the Hub name, a view of its slice of the fused tensor (no copy: a
 * slice of expert e is contiguous), and the fused entries leave the list, so
 * loading, checking and inspecting see one layout.  A fused tensor whose
 * shape disagrees with config.json is an error naming it, its shape and the
 * shape config.json implies.  Call once, after eng_checkpoint_open. */
mt_status_t eng_checkpoint_resolve(eng_checkpoint_t *ck, const eng_model_desc_t *spec, mt_error_t *err);

/* gpt-oss's MXFP4 experts (the Hub's openai/gpt-oss-*): a described tensor
 * NAME of shape (E, C, R), fused over E, that the checkpoint holds as
 * NAME_blocks (E, R, C/32, 16) and NAME_scales (E, R, C/32), both U8 (see
 * base/quant.h).  True when both are there with those dtypes and agreeing
 * shapes; *shape gets (E, C, R), the dequantised shape to compare with the
 * description.  eng_checkpoint_read_f32 dequantises such a tensor. */
bool eng_checkpoint_find_mxfp4(const eng_checkpoint_t *ck, const char *name, const eng_ckpt_entry_t **blocks,
                               const eng_ckpt_entry_t **scales, int64_t shape[3]);

/* Where NAME_blocks or NAME_scales is there but the pair is not the MXFP4
 * layout above: an error naming them, what they are and what was expected
 * (MT_OK when neither is there, or the pair is right). */
mt_status_t eng_checkpoint_mxfp4_check(const eng_checkpoint_t *ck, const char *name, mt_error_t *err);

/* An F8_E4M3 tensor's block scales, `<name>_scale_inv`, from the headers:
 * an error naming both when they are missing, not fp32/bf16/fp16, or not
 * (ceil(rows/128), ceil(cols/128)); *scales gets their entry. */
mt_status_t eng_checkpoint_fp8_scales(const eng_checkpoint_t *ck, const eng_ckpt_entry_t *e,
                                      const eng_ckpt_entry_t **scales, mt_error_t *err);

/* A Linear weight bitsandbytes stored in 4 bits (transformers'
 * save_pretrained of a load_in_4bit model): `NAME` U8 [ceil(n/2), 1] (two
 * codes a byte, high nibble first, over the flattened weight), with
 * `NAME.absmax` (F32 per block; under double quantisation U8 codes plus
 * `NAME.nested_absmax` F32 and `NAME.nested_quant_map` F32 [256]),
 * `NAME.quant_map` F32 [16] and `NAME.quant_state.bitsandbytes__nf4` (or
 * `__fp4`): U8 bytes of a JSON object (quant_type, blocksize, dtype, shape,
 * nested_blocksize, nested_offset).  Read into a quantised view whose codes
 * point into the mapping and whose fp32 buffers are owned here. */
typedef struct {
    mt_quant_view_t view;  /* codes and scales_u8 in the mapping; scales / absmax2 / code2 owned */
    mt_quant_sizes_t have; /* each buffer's element count, for mt_quant_check / eng_quant_home_pack */
    float *absmax_, *absmax2_, *code2_;
} eng_bnb4_t;

/* Whether the checkpoint holds name as a bitsandbytes 4-bit weight: a U8
 * tensor with a quant_state or an absmax beside it (either alone is enough
 * to say the weight is meant as such, so that a missing piece is reported
 * as that). */
bool eng_checkpoint_is_bnb4(const eng_checkpoint_t *ck, const eng_ckpt_entry_t *e);

/* Reads e (eng_checkpoint_is_bnb4) as a view of the (ndim, shape) tensor
 * config.json describes, checking every piece: quant_state present, its
 * JSON well formed, quant_type nf4/fp4 agreeing with its name, blocksize
 * one bitsandbytes has (a power of two, 32 to 4096), shape equal to the
 * description's; the weight's and absmax's dtypes and byte counts; under
 * double quantisation nested_blocksize 256 and nested_offset finite;
 * quant_map equal to the format's table.  values false: headers and the
 * quant_state only (nothing large is read; the fp32 buffers stay NULL);
 * true: the absmax and maps read too, then mt_quant_check.  Each refusal
 * names the file, the tensor and what was expected. */
mt_status_t eng_checkpoint_bnb4_read(const eng_checkpoint_t *ck, const eng_ckpt_entry_t *e, int ndim,
                                     const int64_t *shape, bool values, eng_bnb4_t *out, mt_error_t *err);
void eng_bnb4_free(eng_bnb4_t *b);
/* How many of e's bitsandbytes companions (absmax, quant_map, nested_*,
 * quant_state) the checkpoint holds. */
int eng_checkpoint_bnb4_parts(const eng_checkpoint_t *ck, const eng_ckpt_entry_t *e);

/* True when tensor n is the second half of a quantised weight NAME that
 * names[count] (sorted) describes and that is read through it: the
 * `_scale_inv` of an F8_E4M3 NAME, the `_blocks` / `_scales` of an MXFP4
 * NAME the checkpoint holds no plain tensor of, or the `.absmax`,
 * `.quant_map`, `.nested_*` and `.quant_state.*` of a bitsandbytes 4-bit
 * NAME.  Anything else with those
 * suffixes is an unused tensor like any other. */
bool eng_checkpoint_dequant_part(const eng_checkpoint_t *ck, const char **names, int count, const char *n);

/* Reads one tensor as fp32 into dst (numel floats), checking its shape
 * against expect_shape (ndim dims; a spec's 1-D params use ndim 1). */
mt_status_t eng_checkpoint_read_f32(const eng_checkpoint_t *ck, const char *name, int ndim,
                                    const int64_t *expect_shape, float *dst, mt_error_t *err);

/* Every tensor spec names is present with the shape config.json implies,
 * and every tensor of the checkpoint is one spec names, from the headers
 * alone (nothing is read).  A shape that disagrees is an error naming
 * config_path, the key(s) that set the dimension, the tensor and both
 * shapes; tensors the config does not explain are an error naming the first
 * (and why: an expert or layer past the config's count) unless allow_unused
 * or transformers itself ignores them for this family. */
mt_status_t eng_checkpoint_check(const eng_checkpoint_t *ck, const eng_model_config_t *cfg,
                                 const eng_model_desc_t *spec, const char *config_path, bool allow_unused,
                                 mt_error_t *err);

typedef struct {
    int unexpected_count;     /* tensors in the checkpoint that the spec does not name */
    const char **unexpected;  /* (unexpected_count) names, valid while the checkpoint is open */
} eng_ckpt_load_report_t;

/* Loads every parameter of spec: dst[i] receives spec->params[i].numel
 * floats (dst[i] NULL: skipped, for a caller that reads it otherwise).  Missing tensor, wrong shape or a dtype other than F32/BF16/F16
 * are errors naming the tensor (and the directory / expected shape).
 * report may be NULL; otherwise free it with eng_ckpt_load_report_free. */
mt_status_t eng_checkpoint_load(const eng_checkpoint_t *ck, const eng_model_desc_t *spec,
                                float *const *dst, eng_ckpt_load_report_t *report, mt_error_t *err);
void eng_ckpt_load_report_free(eng_ckpt_load_report_t *report);
/* Loads the description's non-trainable buffers (spec->buffers, e.g. a
 * router's score correction bias): dst[i] receives spec->buffers[i].numel
 * floats, with the same checks as eng_checkpoint_load.  Saving writes them
 * like any tensor (eng_checkpoint_save's list). */
mt_status_t eng_checkpoint_load_buffers(const eng_checkpoint_t *ck, const eng_model_desc_t *spec, float *const *dst,
                                        mt_error_t *err);

/* One tensor to save, from fp32 host memory. */
typedef struct {
    const char *name;
    mt_dtype_t dtype;      /* on disk: MT_F32, MT_BF16 or MT_F16 */
    int ndim;
    const int64_t *shape;  /* (ndim) */
    const float *data;     /* prod(shape) floats */
} eng_ckpt_tensor_t;

/* A tensor list in transformers 5's fused layout, made from one in the Hub's
 * (eng_ckpt_fuse_experts). */
typedef struct {
    eng_ckpt_tensor_t *tensors; /* (count) */
    int count;
    float **owned_;             /* internal: the fused tensors' data */
    int owned_count_;
    char *names_;
    int64_t *shapes_;
} eng_ckpt_fused_t;

/* in holds one tensor per spec parameter, in spec order, with spec's names
 * and shapes.  out gets the same tensors in the fused layout: each MoE
 * layer's experts as `…mlp.experts.gate_up_proj` (E, 2I, H) and
 * `…mlp.experts.down_proj` (E, H, I) where its first expert tensor stood,
 * Mixtral's `block_sparse_moe` renamed `mlp`; other tensors are shared with
 * in, not copied.  Free with eng_ckpt_fused_free. */
void eng_ckpt_fuse_experts(const eng_model_desc_t *spec, const eng_ckpt_tensor_t *in, eng_ckpt_fused_t *out);
void eng_ckpt_fused_free(eng_ckpt_fused_t *f);

/* Writes config.json (config_json, if non-NULL) and the weights into the
 * save's staging directory: model.safetensors when everything fits in
 * max_shard_bytes (0 = never shard), else model-0000i-of-0000n.safetensors
 * + index, split like save_pretrained.  Every safetensors file carries
 * tx->save_id in its metadata.  The caller commits or aborts tx. */
mt_status_t eng_checkpoint_write(eng_ckpt_dir_t *tx, const char *config_json,
                                 const eng_ckpt_tensor_t *tensors, int count, uint64_t max_shard_bytes,
                                 mt_error_t *err);

/* eng_checkpoint_write as one transaction: DIR not existing yet becomes the
 * checkpoint whole (ENG_CKPT_DIR_SWAP); an existing DIR gets the files
 * merged in (ENG_CKPT_DIR_MERGE: weights files of an earlier save that the
 * new one does not use are removed, other files are kept). */
mt_status_t eng_checkpoint_save(const char *dir, const char *config_json,
                                const eng_ckpt_tensor_t *tensors, int count,
                                uint64_t max_shard_bytes, mt_error_t *err);

#endif
