/* safetensors reader/writer tests.  Every malformed file the reference
 * reader refuses is built here byte by byte in $TEST_TMPDIR, and each case
 * checks the status code and that the message names the file and the
 * tensor or key at fault. */
#include "engine/model/io/safetensors.h"

#include <dirent.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

typedef struct {
    int failures;
    char dir[512];
} tctx_t;

#define EXPECT(t, cond, ...)                                              \
    do {                                                                  \
        if (!(cond)) {                                                    \
            fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond); \
            fprintf(stderr, __VA_ARGS__);                                 \
            fprintf(stderr, "\n");                                        \
            (t)->failures++;                                              \
        }                                                                 \
    } while (0)

static void tpath(tctx_t *t, char *buf, size_t cap, const char *name) {
    snprintf(buf, cap, "%s/%s", t->dir, name);
}

/* Writes [N][header][data] with N = header length unless n_override >= 0. */
static void write_raw(const char *path, const char *header, long long n_override, const void *data,
                      size_t data_len) {
    FILE *fp = fopen(path, "wb");
    if (!fp) {
        perror(path);
        exit(2);
    }
    uint64_t n = n_override >= 0 ? (uint64_t)n_override : strlen(header);
    uint8_t nb[8];
    for (int i = 0; i < 8; i++) nb[i] = (uint8_t)(n >> (8 * i));
    fwrite(nb, 1, 8, fp);
    fwrite(header, 1, strlen(header), fp);
    if (data_len) fwrite(data, 1, data_len, fp);
    fclose(fp);
}

/* Opens path expecting failure with `code` and a message containing every
 * string of the NULL-terminated list. */
static void expect_open_fails(tctx_t *t, int line, const char *path, mt_status_t code, ...) {
    eng_st_file_t f;
    mt_error_t err = {0};
    mt_status_t st = eng_st_open(path, &f, &err);
    if (st == MT_OK) {
        fprintf(stderr, "FAIL line %d: %s opened but should have failed\n", line, path);
        t->failures++;
        eng_st_close(&f);
        return;
    }
    if (st != code) {
        fprintf(stderr, "FAIL line %d: %s: got %s, want %s (%s)\n", line, path, mt_status_name(st),
                mt_status_name(code), err.msg);
        t->failures++;
    }
    if (!strstr(err.msg, path)) {
        fprintf(stderr, "FAIL line %d: message does not name the file: %s\n", line, err.msg);
        t->failures++;
    }
    va_list ap;
    va_start(ap, code);
    for (const char *s; (s = va_arg(ap, const char *)) != NULL;) {
        if (!strstr(err.msg, s)) {
            fprintf(stderr, "FAIL line %d: message lacks '%s': %s\n", line, s, err.msg);
            t->failures++;
        }
    }
    va_end(ap);
}

static void test_bad_files(tctx_t *t) {
    char p[600];
    uint8_t zeros[64] = {0};

    tpath(t, p, sizeof p, "tiny.safetensors");
    FILE *fp = fopen(p, "wb");
    fwrite("\x05\0\0", 1, 3, fp);
    fclose(fp);
    expect_open_fails(t, __LINE__, p, MT_ERR_FORMAT, "too small", NULL);

    tpath(t, p, sizeof p, "huge_header.safetensors");
    write_raw(p, "{}", 100000001, NULL, 0);
    expect_open_fails(t, __LINE__, p, MT_ERR_FORMAT, "100000001", "exceeds", NULL);

    tpath(t, p, sizeof p, "past_eof.safetensors");
    write_raw(p, "{}", 1000, NULL, 0);
    expect_open_fails(t, __LINE__, p, MT_ERR_FORMAT, "runs past the end", NULL);

    tpath(t, p, sizeof p, "bad_json.safetensors");
    write_raw(p, "{\"a\": {\"dtype\": ", -1, NULL, 0);
    expect_open_fails(t, __LINE__, p, MT_ERR_FORMAT, "not valid JSON", NULL);

    tpath(t, p, sizeof p, "not_object.safetensors");
    write_raw(p, "[1, 2]  ", -1, NULL, 0);
    expect_open_fails(t, __LINE__, p, MT_ERR_FORMAT, "not a JSON object", NULL);

    tpath(t, p, sizeof p, "bad_utf8.safetensors");
    write_raw(p, "{\"a\xc3\x28\":{}}", -1, NULL, 0);
    expect_open_fails(t, __LINE__, p, MT_ERR_FORMAT, "UTF-8", NULL);

    tpath(t, p, sizeof p, "dup.safetensors");
    write_raw(p,
              "{\"w.dup\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
              "\"w.dup\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
              -1, zeros, 8);
    expect_open_fails(t, __LINE__, p, MT_ERR_FORMAT, "w.dup", NULL);

    tpath(t, p, sizeof p, "overlap.safetensors");
    write_raw(p,
              "{\"first\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
              "\"second\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
              -1, zeros, 12);
    expect_open_fails(t, __LINE__, p, MT_ERR_FORMAT, "'second'", "overlap", "'first'", NULL);

    tpath(t, p, sizeof p, "gap.safetensors");
    write_raw(p,
              "{\"first\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
              "\"second\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,12]}}",
              -1, zeros, 12);
    expect_open_fails(t, __LINE__, p, MT_ERR_FORMAT, "'second'", "gap", NULL);

    tpath(t, p, sizeof p, "not_from_zero.safetensors");
    write_raw(p, "{\"only\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", -1, zeros, 8);
    expect_open_fails(t, __LINE__, p, MT_ERR_FORMAT, "'only'", "gap", NULL);

    tpath(t, p, sizeof p, "trailing.safetensors");
    write_raw(p, "{\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", -1, zeros, 6);
    expect_open_fails(t, __LINE__, p, MT_ERR_FORMAT, "the file has", "'x'", NULL);

    tpath(t, p, sizeof p, "truncated_data.safetensors");
    write_raw(p, "{\"x\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", -1, zeros, 10);
    expect_open_fails(t, __LINE__, p, MT_ERR_FORMAT, "the file has", "'x'", NULL);

    tpath(t, p, sizeof p, "count.safetensors");
    write_raw(p, "{\"w.bytes\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", -1, zeros, 8);
    expect_open_fails(t, __LINE__, p, MT_ERR_FORMAT, "'w.bytes'", "needs 12", NULL);

    tpath(t, p, sizeof p, "dtype.safetensors");
    write_raw(p, "{\"w.q\":{\"dtype\":\"Q8\",\"shape\":[1],\"data_offsets\":[0,1]}}", -1, zeros, 1);
    expect_open_fails(t, __LINE__, p, MT_ERR_FORMAT, "'w.q'", "Q8", NULL);

    tpath(t, p, sizeof p, "subbyte.safetensors");
    write_raw(p, "{\"w.f4\":{\"dtype\":\"F4\",\"shape\":[3],\"data_offsets\":[0,2]}}", -1, zeros, 2);
    expect_open_fails(t, __LINE__, p, MT_ERR_FORMAT, "'w.f4'", "whole number of bytes", NULL);

    tpath(t, p, sizeof p, "overflow.safetensors");
    write_raw(p,
              "{\"w.big\":{\"dtype\":\"F32\",\"shape\":[4611686018427387904,8],"
              "\"data_offsets\":[0,4]}}",
              -1, zeros, 4);
    expect_open_fails(t, __LINE__, p, MT_ERR_FORMAT, "'w.big'", "overflow", NULL);

    tpath(t, p, sizeof p, "reversed.safetensors");
    write_raw(p, "{\"w.rev\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[0,0]},"
                 "\"w.r2\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[4,0]}}",
              -1, zeros, 4);
    expect_open_fails(t, __LINE__, p, MT_ERR_FORMAT, "'w.r2'", NULL);

    tpath(t, p, sizeof p, "no_offsets.safetensors");
    write_raw(p, "{\"w.n\":{\"dtype\":\"F32\",\"shape\":[1]}}", -1, NULL, 0);
    expect_open_fails(t, __LINE__, p, MT_ERR_FORMAT, "'w.n'", "data_offsets", NULL);

    tpath(t, p, sizeof p, "neg_shape.safetensors");
    write_raw(p, "{\"w.neg\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,0]}}", -1, NULL, 0);
    expect_open_fails(t, __LINE__, p, MT_ERR_FORMAT, "'w.neg'", "shape", NULL);

    tpath(t, p, sizeof p, "meta.safetensors");
    write_raw(p, "{\"__metadata__\":{\"format\":\"pt\",\"step\":5}}", -1, NULL, 0);
    expect_open_fails(t, __LINE__, p, MT_ERR_FORMAT, "__metadata__", "'step'", NULL);

    tpath(t, p, sizeof p, "does_not_exist.safetensors");
    expect_open_fails(t, __LINE__, p, MT_ERR_IO, "cannot open", NULL);
}

/* Everything the reference reader accepts: all dtypes, scalars, zero-size
 * dims, tensors listed out of offset order, null metadata, extra fields. */
static void test_accepts(tctx_t *t) {
    char p[600];
    const char *names[] = {"BOOL", "U8", "I8", "F8_E5M2", "F8_E4M3", "F8_E8M0", "I16", "U16",
                           "F16", "BF16", "I32", "U32", "F32", "C64", "F64", "I64", "U64"};
    char header[8192];
    size_t n = (size_t)snprintf(header, sizeof header, "{");
    uint64_t off = 0;
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        eng_st_dtype_t dt;
        EXPECT(t, eng_st_dtype_parse(names[i], &dt), "%s", names[i]);
        uint64_t sz = (uint64_t)eng_st_dtype_bits(dt) / 8 * 2;
        n += (size_t)snprintf(header + n, sizeof header - n,
                              "\"t.%s\":{\"dtype\":\"%s\",\"shape\":[2],\"data_offsets\":[%llu,%llu]},",
                              names[i], names[i], (unsigned long long)off,
                              (unsigned long long)(off + sz));
        off += sz;
    }
    /* sub-byte dtypes: 2 x F4 = 1 byte, 4 x F6 = 3 bytes */
    n += (size_t)snprintf(header + n, sizeof header - n,
                          "\"t.F4\":{\"dtype\":\"F4\",\"shape\":[2],\"data_offsets\":[%llu,%llu]},"
                          "\"t.F6\":{\"dtype\":\"F6_E2M3\",\"shape\":[2,2],\"data_offsets\":[%llu,%llu]},",
                          (unsigned long long)off, (unsigned long long)off + 1,
                          (unsigned long long)off + 1, (unsigned long long)off + 4);
    off += 4;
    /* a scalar and a zero-size tensor, listed before the others */
    n += (size_t)snprintf(header + n, sizeof header - n,
                          "\"t.scalar\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[%llu,%llu],"
                          "\"extra\":1},"
                          "\"t.empty\":{\"dtype\":\"F32\",\"shape\":[3,0],\"data_offsets\":[%llu,%llu]},"
                          "\"__metadata__\":null}",
                          (unsigned long long)off, (unsigned long long)off + 4,
                          (unsigned long long)off + 4, (unsigned long long)off + 4);
    off += 4;
    uint8_t *data = calloc(1, off);
    tpath(t, p, sizeof p, "all_dtypes.safetensors");
    write_raw(p, header, -1, data, off);
    free(data);
    eng_st_file_t f;
    mt_error_t err = {0};
    mt_status_t st = eng_st_open(p, &f, &err);
    EXPECT(t, st == MT_OK, "%s", err.msg);
    if (st != MT_OK) return;
    EXPECT(t, f.count == 21, "count %d", f.count);
    const eng_st_tensor_t *s = eng_st_find(&f, "t.scalar");
    EXPECT(t, s && s->ndim == 0 && s->numel == 1, "scalar");
    const eng_st_tensor_t *e = eng_st_find(&f, "t.empty");
    EXPECT(t, e && e->ndim == 2 && e->numel == 0, "empty");
    EXPECT(t, eng_st_find(&f, "t.nope") == NULL, "find of a missing name");
    EXPECT(t, f.meta_count == 0, "null metadata");
    /* file order is offset order */
    for (int i = 1; i < f.count; i++) EXPECT(t, f.tensors[i].begin >= f.tensors[i - 1].end, "order");
    eng_st_close(&f);
}

static void test_write_read(tctx_t *t) {
    char p[600];
    tpath(t, p, sizeof p, "rt.safetensors");
    float a[6] = {1.0f, -2.5f, 3.25f, 1e-8f, -0.0f, 65504.0f};
    int64_t i64[3] = {-1, 0, 1LL << 40};
    float scalar = 42.0f;
    const int64_t sa[2] = {2, 3}, si[1] = {3}, sz[2] = {4, 0};
    eng_st_write_tensor_t ts[] = {
        {"model.a_f32", ENG_ST_F32, 2, sa, NULL, a},
        {"model.a_bf16", ENG_ST_BF16, 2, sa, NULL, a},
        {"model.a_f16", ENG_ST_F16, 2, sa, NULL, a},
        {"ids", ENG_ST_I64, 1, si, i64, NULL},
        {"scalar", ENG_ST_F32, 0, NULL, NULL, &scalar},
        {"empty", ENG_ST_F32, 2, sz, NULL, NULL},
    };
    mt_error_t err = {0};
    mt_status_t st = eng_st_write(p, ts, 6, NULL, 0, &err);
    EXPECT(t, st == MT_OK, "%s", err.msg);
    /* the temporary name is unique per process and call: look for any */
    DIR *dir = opendir(t->dir);
    EXPECT(t, dir != NULL, "cannot list %s", t->dir);
    for (struct dirent *de; dir && (de = readdir(dir)) != NULL;)
        EXPECT(t, strncmp(de->d_name, "rt.safetensors.tmp", 18) != 0, "temp file left behind: %s", de->d_name);
    if (dir) closedir(dir);

    eng_st_file_t f;
    st = eng_st_open(p, &f, &err);
    EXPECT(t, st == MT_OK, "%s", err.msg);
    if (st != MT_OK) return;
    EXPECT(t, f.header_len % 8 == 0, "header length %llu not padded", (unsigned long long)f.header_len);
    EXPECT(t, ((const char *)f.map)[8] == '{', "header starts with {");
    const char *fmt = eng_st_metadata_get(&f, "format");
    EXPECT(t, fmt && strcmp(fmt, "pt") == 0, "format metadata");
    for (int i = 0; i < 6; i++)
        EXPECT(t, strcmp(f.tensors[i].name, ts[i].name) == 0, "order: %s", f.tensors[i].name);
    float out[6];
    st = eng_st_read_f32(&f, eng_st_find(&f, "model.a_f32"), out, &err);
    EXPECT(t, st == MT_OK && memcmp(out, a, sizeof a) == 0, "f32 round trip");
    /* bf16: the stored bits are round-to-nearest-even of the fp32 value */
    st = eng_st_read_f32(&f, eng_st_find(&f, "model.a_bf16"), out, &err);
    for (int i = 0; i < 6; i++) {
        float want = mt_bf16_to_f32(mt_f32_to_bf16(a[i]));
        EXPECT(t, memcmp(&out[i], &want, 4) == 0, "bf16[%d] %g vs %g", i, out[i], want);
    }
    EXPECT(t, out[0] == 1.0f && out[1] == -2.5f && out[2] == 3.25f, "bf16 exact values");
    st = eng_st_read_f32(&f, eng_st_find(&f, "model.a_f16"), out, &err);
    EXPECT(t, out[0] == 1.0f && out[1] == -2.5f && out[2] == 3.25f && out[5] == 65504.0f,
           "f16 exact values");
    EXPECT(t, out[3] == 0.0f || out[3] == 5.9604644775390625e-8f, "f16 tiny: %g", out[3]);
    const eng_st_tensor_t *ids = eng_st_find(&f, "ids");
    EXPECT(t, ids && ids->dtype == ENG_ST_I64 && memcmp(ids->data, i64, sizeof i64) == 0, "raw i64");
    st = eng_st_read_f32(&f, ids, out, &err);
    EXPECT(t, st == MT_ERR_UNSUPPORTED && strstr(err.msg, "'ids'") && strstr(err.msg, p),
           "I64 to fp32 must be refused naming tensor and file: %s", err.msg);
    const eng_st_tensor_t *sc = eng_st_find(&f, "scalar");
    st = eng_st_read_f32(&f, sc, out, &err);
    EXPECT(t, st == MT_OK && sc->ndim == 0 && out[0] == 42.0f, "scalar");
    eng_st_close(&f);

    /* duplicate names are refused by the writer, leaving no file */
    char p2[600];
    tpath(t, p2, sizeof p2, "dup_written.safetensors");
    eng_st_write_tensor_t dup[] = {{"x", ENG_ST_F32, 1, si, NULL, a}, {"x", ENG_ST_F32, 1, si, NULL, a}};
    st = eng_st_write(p2, dup, 2, NULL, 0, &err);
    EXPECT(t, st != MT_OK && strstr(err.msg, "'x'") && access(p2, F_OK) != 0, "dup write: %s", err.msg);

    /* unwritable destination: an I/O error, nothing created */
    tpath(t, p2, sizeof p2, "no/such/dir/x.safetensors");
    st = eng_st_write(p2, ts, 1, NULL, 0, &err);
    EXPECT(t, st == MT_ERR_IO && strstr(err.msg, "no/such/dir"), "unwritable: %s", err.msg);
}

/* Known bit patterns, and data misaligned by an odd header length. */
/* Filled tensors: values produced as each is written, converted like f32
 * ones, beside plain tensors in the same file. */
static void fill_ramp(void *ctx, float *dst) {
    const int *n = ctx;
    for (int i = 0; i < *n; i++) dst[i] = (float)i * 0.5f - 1.0f;
}

static void test_write_filled(tctx_t *t) {
    char p[600];
    tpath(t, p, sizeof p, "filled.safetensors");
    int n6 = 6, n2 = 2;
    float plain[2] = {7.0f, 8.0f};
    const int64_t s6[2] = {2, 3}, s2[1] = {2};
    eng_st_write_tensor_t ts[] = {
        {"big", ENG_ST_F32, 2, s6, NULL, NULL},
        {"plain", ENG_ST_F32, 1, s2, NULL, plain},
        {"small_bf16", ENG_ST_BF16, 1, s2, NULL, NULL},
    };
    const eng_st_fill_t fills[] = {{fill_ramp, &n6}, {NULL, NULL}, {fill_ramp, &n2}};
    mt_error_t err = {0};
    mt_status_t st = eng_st_write_filled(p, ts, fills, 3, NULL, 0, &err);
    EXPECT(t, st == MT_OK, "%s", err.msg);
    eng_st_file_t f;
    if (st != MT_OK || eng_st_open(p, &f, &err) != MT_OK) return;
    float got[6];
    const char *names[] = {"big", "plain", "small_bf16"};
    const float want[3][6] = {{-1.0f, -0.5f, 0.0f, 0.5f, 1.0f, 1.5f}, {7.0f, 8.0f}, {-1.0f, -0.5f}};
    const int len[3] = {6, 2, 2};
    for (int k = 0; k < 3; k++) {
        const eng_st_tensor_t *x = eng_st_find(&f, names[k]);
        EXPECT(t, x && eng_st_read_f32(&f, x, got, &err) == MT_OK, "%s: %s", names[k], err.msg);
        for (int i = 0; x && i < len[k]; i++) EXPECT(t, got[i] == want[k][i], "%s[%d] = %g", names[k], i, got[i]);
    }
    eng_st_close(&f);
    /* a filled tensor that also has f32 values is a caller's bug, refused */
    ts[0].f32 = plain;
    EXPECT(t, eng_st_write_filled(p, ts, fills, 1, NULL, 0, &err) == MT_ERR_INTERNAL, "f32 and fill accepted");
}

static void test_conversions(tctx_t *t) {
    char p[600];
    tpath(t, p, sizeof p, "bits.safetensors");
    /* bf16: 1.0, -2.5, smallest normal 2^-126, +inf, 0x7fc0 NaN */
    const uint16_t bf[5] = {0x3f80, 0xc020, 0x0080, 0x7f80, 0x7fc0};
    /* f16: 1.0, 65504 (max), 2^-24 (smallest subnormal), -0.0, 2^-14 (smallest normal) */
    const uint16_t hf[5] = {0x3c00, 0x7bff, 0x0001, 0x8000, 0x0400};
    uint8_t data[20];
    memcpy(data, bf, 10);
    memcpy(data + 10, hf, 10);
    /* header of odd length: the data starts at an odd address in the mapping */
    const char *hdr = "{\"b\":{\"dtype\":\"BF16\",\"shape\":[5],\"data_offsets\":[0,10]},"
                      "\"h\":{\"dtype\":\"F16\",\"shape\":[5],\"data_offsets\":[10,20]}}";
    EXPECT(t, strlen(hdr) % 2 == 1, "test header must be odd-length (%zu)", strlen(hdr));
    write_raw(p, hdr, -1, data, 20);
    eng_st_file_t f;
    mt_error_t err = {0};
    mt_status_t st = eng_st_open(p, &f, &err);
    EXPECT(t, st == MT_OK, "%s", err.msg);
    if (st != MT_OK) return;
    float out[5];
    eng_st_read_f32(&f, eng_st_find(&f, "b"), out, &err);
    EXPECT(t, out[0] == 1.0f && out[1] == -2.5f && out[2] == 0x1p-126f && out[3] > 3e38f &&
                  out[4] != out[4],
           "bf16 bits: %g %g %g %g %g", out[0], out[1], out[2], out[3], out[4]);
    eng_st_read_f32(&f, eng_st_find(&f, "h"), out, &err);
    EXPECT(t, out[0] == 1.0f && out[1] == 65504.0f && out[2] == 0x1p-24f && out[3] == 0.0f &&
                  signbit(out[3]) && out[4] == 0x1p-14f,
           "f16 bits: %g %g %g %g %g", out[0], out[1], out[2], out[3], out[4]);
    eng_st_close(&f);
}

int main(void) {
    tctx_t t = {0};
    const char *base = getenv("TEST_TMPDIR");
    snprintf(t.dir, sizeof t.dir, "%s/st_test_%d", base ? base : "/tmp", (int)getpid());
    if (mkdir(t.dir, 0755) != 0) {
        perror(t.dir);
        return 2;
    }
    test_bad_files(&t);
    test_accepts(&t);
    test_write_read(&t);
    test_write_filled(&t);
    test_conversions(&t);
    if (t.failures) {
        fprintf(stderr, "safetensors_test: %d failure(s)\n", t.failures);
        return 1;
    }
    printf("safetensors_test: all passed\n");
    return 0;
}
