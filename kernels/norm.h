/* RMSNorm as HF's LlamaRMSNorm / MixtralRMSNorm (fp32):
 *   rstd[r] = 1 / sqrt(mean_j x[r,j]^2 + eps)
 *   y[r,j]  = w[j] * (x[r,j] * rstd[r])
 * Also used for Qwen3's per-head q_norm/k_norm (rows = tokens*heads, dim = head_dim).
 *
 * Backward, with xhat = x * rstd:
 *   dx[r,j] = rstd[r] * (dy[r,j]*w[j] - xhat[r,j] * mean_j(dy*w*xhat))   (overwrite)
 *   dw[j]  += sum_r dy[r,j] * xhat[r,j]                                 (accumulate)  */
#ifndef MT_KERNELS_NORM_H
#define MT_KERNELS_NORM_H

typedef struct kern_stream kern_stream_t;

/* x, y (rows, dim); w (dim); rstd (rows) saved for backward. y may not alias x. */
typedef void (*kern_rmsnorm_fwd_fn)(kern_stream_t *s, float *y, float *rstd, const float *x,
                                    const float *w, int rows, int dim, float eps);
void kern_rmsnorm_fwd_cpu(kern_stream_t *s, float *y, float *rstd, const float *x, const float *w,
                          int rows, int dim, float eps);
void kern_rmsnorm_fwd_cuda(kern_stream_t *s, float *y, float *rstd, const float *x,
                           const float *w, int rows, int dim, float eps);

typedef void (*kern_rmsnorm_bwd_fn)(kern_stream_t *s, float *dx, float *dw, const float *dy,
                                    const float *x, const float *w, const float *rstd, int rows,
                                    int dim);
void kern_rmsnorm_bwd_cpu(kern_stream_t *s, float *dx, float *dw, const float *dy, const float *x,
                          const float *w, const float *rstd, int rows, int dim);
void kern_rmsnorm_bwd_cuda(kern_stream_t *s, float *dx, float *dw, const float *dy,
                           const float *x, const float *w, const float *rstd, int rows, int dim);

#endif
