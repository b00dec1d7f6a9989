/* LoRA on a linear layer (see lora.h). */
#include "kernels/lora.h"

#include "kernels/gemm.h"
#include "kernels/ops.h"

static void mm(kern_device_t *dev, mt_dtype_t compute, float *C, const void *A, mt_dtype_t a_dt, const void *B,
               mt_dtype_t b_dt, int M, int N, int K, bool ta, bool tb, float alpha, float beta) {
    const kern_mm_t p = kern_mm_make(C, A, a_dt, B, b_dt, M, N, K, ta, tb, alpha, beta, compute);
    dev->ops->mm(kern_stream(dev, KERN_STREAM_COMPUTE), &p);
}

mt_status_t kern_lora_fwd(kern_device_t *dev, mt_dtype_t compute, const kern_lora_t *l, float *y, const void *x,
                          mt_dtype_t x_dt, int rows, int in, int out, mt_error_t *err) {
    if (!l->a || rows == 0) return MT_OK;
    float *t = kern_alloc(dev, (size_t)rows * l->r * sizeof(float), "LoRA x A^T", err);
    if (!t) return err->code;
    mm(dev, compute, t, x, x_dt, l->a, l->dtype, rows, l->r, in, false, true, 1.0f, 0.0f);
    mm(dev, compute, y, t, MT_F32, l->b, l->dtype, rows, out, l->r, false, true, l->scale, 1.0f);
    kern_free(dev, t);
    return MT_OK;
}

mt_status_t kern_lora_bwd(kern_device_t *dev, mt_dtype_t compute, const kern_lora_t *l, const float *dy,
                          const void *x, mt_dtype_t x_dt, float *dx, int rows, int in, int out, mt_error_t *err) {
    if (!l->a || rows == 0) return MT_OK;
    const int r = l->r;
    float *t = kern_alloc(dev, (size_t)rows * r * sizeof(float), "LoRA x A^T (recomputed)", err);
    if (!t) return err->code;
    float *u = kern_alloc(dev, (size_t)rows * r * sizeof(float), "LoRA dy B", err);
    if (!u) {
        kern_free(dev, t);
        return err->code;
    }
    mm(dev, compute, u, dy, MT_F32, l->b, l->dtype, rows, r, out, false, false, 1.0f, 0.0f);
    if (l->gb) {
        mm(dev, compute, t, x, x_dt, l->a, l->dtype, rows, r, in, false, true, 1.0f, 0.0f);
        mm(dev, compute, l->gb, dy, MT_F32, t, MT_F32, out, r, rows, true, false, l->scale, 1.0f);
    }
    if (l->ga) mm(dev, compute, l->ga, u, MT_F32, x, x_dt, r, in, rows, true, false, l->scale, 1.0f);
    if (dx) mm(dev, compute, dx, u, MT_F32, l->a, l->dtype, rows, in, r, false, false, l->scale, 1.0f);
    kern_free(dev, u);
    kern_free(dev, t);
    return MT_OK;
}
