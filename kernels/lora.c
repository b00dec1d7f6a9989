/* LoRA on a linear layer (see lora.h). */
#include "kernels/lora.h"

#include "kernels/gemm.h"
#include "kernels/ops.h"

static void mm(kern_device_t *dev, mt_dtype_t compute, float *C, const void *A, mt_dtype_t a_dt, const void *B,
               mt_dtype_t b_dt, int M, int N, int K, bool ta, bool tb, float alpha, float beta) {
    const kern_mm_t p = kern_mm_make(C, A, a_dt, B, b_dt, M, N, K, ta, tb, alpha, beta, compute);
    dev->ops->mm(kern_stream(dev, KERN_STREAM_COMPUTE), &p);
}

/* The adapter's input: x itself, or dropout(x) in fp32 into a buffer the
 * caller frees (*owned). */
static mt_status_t lora_input(kern_device_t *dev, const kern_lora_t *l, const void *x, mt_dtype_t x_dt, int rows,
                              int in, const void **xd, mt_dtype_t *xd_dt, float **owned, mt_error_t *err) {
    *owned = NULL;
    *xd = x;
    *xd_dt = x_dt;
    if (l->dropout <= 0) return MT_OK;
    const size_t n = (size_t)rows * in;
    float *d = kern_alloc(dev, n * sizeof(float), "LoRA dropout(x)", err);
    if (!d) return err->code;
    kern_stream_t *s = kern_stream(dev, KERN_STREAM_COMPUTE);
    if (x_dt == MT_BF16) {
        dev->ops->bf16_to_f32(s, d, x, n);
        dev->ops->dropout(s, d, d, n, l->dropout, l->dropout_seed);
    } else {
        dev->ops->dropout(s, d, x, n, l->dropout, l->dropout_seed);
    }
    *owned = d;
    *xd = d;
    *xd_dt = MT_F32;
    return MT_OK;
}

mt_status_t kern_lora_fwd(kern_device_t *dev, mt_dtype_t compute, const kern_lora_t *l, float *y, const void *x,
                          mt_dtype_t x_dt, int rows, int in, int out, mt_error_t *err) {
    if (!l->a || rows == 0) return MT_OK;
    const void *xd;
    mt_dtype_t xd_dt;
    float *owned;
    mt_status_t st = lora_input(dev, l, x, x_dt, rows, in, &xd, &xd_dt, &owned, err);
    if (st != MT_OK) return st;
    float *t = kern_alloc(dev, (size_t)rows * l->r * sizeof(float), "LoRA x A^T", err);
    if (!t) {
        if (owned) kern_free(dev, owned);
        return err->code;
    }
    mm(dev, compute, t, xd, xd_dt, l->a, l->dtype, rows, l->r, in, false, true, 1.0f, 0.0f);
    mm(dev, compute, y, t, MT_F32, l->b, l->dtype, rows, out, l->r, false, true, l->scale, 1.0f);
    kern_free(dev, t);
    if (owned) kern_free(dev, owned);
    return MT_OK;
}

mt_status_t kern_lora_bwd(kern_device_t *dev, mt_dtype_t compute, const kern_lora_t *l, const float *dy,
                          const void *x, mt_dtype_t x_dt, float *dx, int rows, int in, int out, mt_error_t *err) {
    return kern_lora_bwd_typed(dev, compute, l, dy, MT_F32, x, x_dt, dx, rows, in, out, err);
}

mt_status_t kern_lora_bwd_typed(kern_device_t *dev, mt_dtype_t compute, const kern_lora_t *l, const void *dy,
                                mt_dtype_t dy_dt, const void *x, mt_dtype_t x_dt, float *dx, int rows, int in,
                                int out, mt_error_t *err) {
    if (!l->a || rows == 0) return MT_OK;
    const int r = l->r;
    const void *xd;
    mt_dtype_t xd_dt;
    float *owned = NULL, *t = NULL, *u = NULL, *dxd = NULL;
    mt_status_t st = lora_input(dev, l, x, x_dt, rows, in, &xd, &xd_dt, &owned, err);
    if (st != MT_OK) return st;
    t = kern_alloc(dev, (size_t)rows * r * sizeof(float), "LoRA x A^T (recomputed)", err);
    u = t ? kern_alloc(dev, (size_t)rows * r * sizeof(float), "LoRA dy B", err) : NULL;
    if (dx && u && l->dropout > 0) dxd = kern_alloc(dev, (size_t)rows * in * sizeof(float), "LoRA d(dropout(x))", err);
    if (!t || !u || (dx && l->dropout > 0 && !dxd)) {
        st = err->code;
        goto out;
    }
    mm(dev, compute, u, dy, dy_dt, l->b, l->dtype, rows, r, out, false, false, 1.0f, 0.0f);
    if (l->gb) {
        mm(dev, compute, t, xd, xd_dt, l->a, l->dtype, rows, r, in, false, true, 1.0f, 0.0f);
        mm(dev, compute, l->gb, dy, dy_dt, t, MT_F32, out, r, rows, true, false, l->scale, 1.0f);
    }
    if (l->ga) mm(dev, compute, l->ga, u, MT_F32, xd, xd_dt, r, in, rows, true, false, l->scale, 1.0f);
    if (dx && !dxd) {
        mm(dev, compute, dx, u, MT_F32, l->a, l->dtype, rows, in, r, false, false, l->scale, 1.0f);
    } else if (dx) { /* through the dropout: the forward's mask and scale */
        kern_stream_t *s = kern_stream(dev, KERN_STREAM_COMPUTE);
        mm(dev, compute, dxd, u, MT_F32, l->a, l->dtype, rows, in, r, false, false, l->scale, 0.0f);
        dev->ops->dropout(s, dxd, dxd, (size_t)rows * in, l->dropout, l->dropout_seed);
        dev->ops->add(s, dx, dx, dxd, (size_t)rows * in);
    }
out:
    if (dxd) kern_free(dev, dxd);
    if (u) kern_free(dev, u);
    if (t) kern_free(dev, t);
    if (owned) kern_free(dev, owned);
    return st;
}
