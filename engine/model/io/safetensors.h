/* safetensors files: validated reading (mmap, read-only) and atomic writing.
 *
 * The reader accepts exactly what the reference Rust reader
 * (huggingface/safetensors, safetensors/src/tensor.rs) accepts, so a file
 * moetune loads is one every other tool loads, and a broken file is refused
 * here with a message naming the file and the tensor or key at fault rather
 * than crashing later in a kernel.  Layout: 8-byte little-endian header
 * length N, N bytes of UTF-8 JSON, then the data buffer; offsets in the
 * header are relative to the start of the data buffer.
 *
 * The writer pads the header with spaces to a multiple of 8 (so every tensor
 * of a file whose tensors are multiples of 8 bytes is naturally aligned),
 * stores {"format":"pt"} metadata as torch's save_file does, keeps the
 * caller's tensor order, and writes "<path>.tmp-<pid>-<n>" then renames it, so the
 * final name never holds a half-written file. */
#ifndef MT_ENGINE_SAFETENSORS_H
#define MT_ENGINE_SAFETENSORS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/dtype.h"
#include "base/status.h"

/* The reference reader's header size limit (MAX_HEADER_SIZE). */
#define ENG_ST_MAX_HEADER_BYTES 100000000ull

/* Every dtype the reference reader knows, in its order (increasing alignment). */
typedef enum {
    ENG_ST_BOOL = 0,
    ENG_ST_F4,
    ENG_ST_F6_E2M3,
    ENG_ST_F6_E3M2,
    ENG_ST_U8,
    ENG_ST_I8,
    ENG_ST_F8_E5M2,
    ENG_ST_F8_E4M3,
    ENG_ST_F8_E8M0,
    ENG_ST_I16,
    ENG_ST_U16,
    ENG_ST_F16,
    ENG_ST_BF16,
    ENG_ST_I32,
    ENG_ST_U32,
    ENG_ST_F32,
    ENG_ST_C64,
    ENG_ST_F64,
    ENG_ST_I64,
    ENG_ST_U64,
    ENG_ST_DTYPE_COUNT,
} eng_st_dtype_t;

const char *eng_st_dtype_name(eng_st_dtype_t dt); /* "BF16", ... */
int eng_st_dtype_bits(eng_st_dtype_t dt);         /* 4, 6, 8, 16, 32 or 64 */
/* Returns false when `name` is not a safetensors dtype string. */
bool eng_st_dtype_parse(const char *name, eng_st_dtype_t *out);
/* The kernels' dtype for F32/BF16/F16/I32/I64; false for the others. */
bool eng_st_dtype_to_mt(eng_st_dtype_t dt, mt_dtype_t *out);
eng_st_dtype_t eng_st_dtype_from_mt(mt_dtype_t dt);

typedef struct {
    const char *name;     /* owned by the file */
    eng_st_dtype_t dtype;
    int ndim;             /* 0 for a scalar */
    const uint64_t *shape; /* (ndim), owned by the file */
    uint64_t numel;       /* product of shape (1 for a scalar) */
    uint64_t begin, end;  /* byte offsets within the data buffer */
    const void *data;     /* points into the mapping; NOT necessarily aligned to the element size */
} eng_st_tensor_t;

typedef struct {
    char *path;
    int fd;
    void *map;            /* whole file, PROT_READ, MAP_SHARED */
    size_t file_size;
    uint64_t header_len;  /* N */
    const uint8_t *data;  /* map + 8 + N */
    uint64_t data_len;
    eng_st_tensor_t *tensors; /* (count), sorted by data offset (file order) */
    int count;
    int *by_name;         /* (count) indices into tensors, sorted by name */
    char **meta_keys, **meta_values; /* __metadata__ (meta_count), in file order */
    int meta_count;
    void *storage_;       /* names and shapes; internal */
} eng_st_file_t;

/* Maps and validates a file.  Errors: MT_ERR_IO (cannot open / map),
 * MT_ERR_FORMAT (any violation of the format; the message names the file
 * and the tensor or key). */
mt_status_t eng_st_open(const char *path, eng_st_file_t *out, mt_error_t *err);
void eng_st_close(eng_st_file_t *f);
/* The tensor with this name, or NULL.  O(log count). */
const eng_st_tensor_t *eng_st_find(const eng_st_file_t *f, const char *name);
/* The __metadata__ value for key, or NULL. */
const char *eng_st_metadata_get(const eng_st_file_t *f, const char *key);
/* Converts a F32/BF16/F16 tensor to fp32 (handles unaligned data).  Other
 * dtypes: MT_ERR_UNSUPPORTED naming the tensor and the file. */
mt_status_t eng_st_read_f32(const eng_st_file_t *f, const eng_st_tensor_t *t, float *dst,
                            mt_error_t *err);

/* One tensor to write.  Exactly one of `data` (raw little-endian bytes in
 * `dtype`, numel * size bytes) and `f32` (converted to `dtype` while
 * writing; dtype must then be F32, BF16 or F16) is non-NULL, except for
 * tensors with zero elements, where both may be NULL. */
typedef struct {
    const char *name;
    eng_st_dtype_t dtype;
    int ndim;
    const int64_t *shape; /* (ndim) */
    const void *data;
    const float *f32;
} eng_st_write_tensor_t;

/* Bytes a tensor takes in a file (numel * dtype bits / 8); 0 with an error
 * on overflow, a negative dim, or a sub-byte total. */
mt_status_t eng_st_tensor_nbytes(const eng_st_write_tensor_t *t, uint64_t *out, mt_error_t *err);

/* Writes tensors (in this order) to a temporary name unique to this process and call, fsyncs it and renames it
 * to `path`.  meta_kv holds meta_count (key, value) pairs; NULL/0 writes
 * {"format":"pt"}.  On error the temp file is removed and `path` is left
 * as it was. */
mt_status_t eng_st_write(const char *path, const eng_st_write_tensor_t *tensors, int count,
                         const char *const *meta_kv, int meta_count, mt_error_t *err);

/* Produces a tensor's fp32 values into dst (numel floats, the writer's
 * buffer) just before they are written. */
typedef struct {
    void (*fn)(void *ctx, float *dst);
    void *ctx;
} eng_st_fill_t;

/* eng_st_write where tensor i with fills[i].fn set (its data and f32 NULL,
 * dtype F32, BF16 or F16) gets its values from fills[i] as it is written:
 * a file larger than memory (a model's optimizer state) needs one tensor's
 * buffer at a time.  fills may be NULL. */
mt_status_t eng_st_write_filled(const char *path, const eng_st_write_tensor_t *tensors, const eng_st_fill_t *fills,
                                int count, const char *const *meta_kv, int meta_count, mt_error_t *err);

/* Writes text to a unique temporary name, fsyncs and renames it: the helper every
 * checkpoint file goes through. */
mt_status_t eng_write_file_atomic(const char *path, const void *bytes, size_t len, mt_error_t *err);

#endif
