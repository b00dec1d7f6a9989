/* Rotary position embedding, HF's rotate_half convention (Llama, Mixtral,
 * Qwen): for pair (i, i + hd/2) of each head at position t,
 *   out[i]      = x[i] * cos[t,i] - x[i+hd/2] * sin[t,i]
 *   out[i+hd/2] = x[i+hd/2] * cos[t,i] + x[i] * sin[t,i]
 * in place on x (B, T, heads, hd); position t is pos[b, t] when pos (B, T)
 * int32 (device memory) is given, the row's index in its sequence when pos
 * is NULL.  Packed rows (engine/data/pack.h) restart positions at 0 for
 * each example, HF's position_ids; the tables are the same, read at pos
 * (clamped to [0, T - 1], the table's rows).  Backward is the same rotation by -angle (kern_rope_bwd), applied
 * in place to the gradient.
 *
 * cos, sin (T, hd/2) come from kern_rope_table, computed as HF does in fp32:
 *   inv_freq[i] = 1 / theta^(2i/hd),  angle = (float)t * inv_freq[i]. */
#ifndef MT_KERNELS_ROPE_H
#define MT_KERNELS_ROPE_H

#include <stdint.h>

typedef struct kern_stream kern_stream_t;

/* Host function: fills cos/sin (T, hd/2) in host memory. */
void kern_rope_table(float *cos_out, float *sin_out, int T, int hd, float theta);

typedef void (*kern_rope_fn)(kern_stream_t *s, float *x, const float *cos_tab,
                             const float *sin_tab, const int32_t *pos, int B, int T, int heads, int hd);
void kern_rope_fwd_cpu(kern_stream_t *s, float *x, const float *cos_tab, const float *sin_tab,
                       const int32_t *pos, int B, int T, int heads, int hd);
void kern_rope_bwd_cpu(kern_stream_t *s, float *x, const float *cos_tab, const float *sin_tab,
                       const int32_t *pos, int B, int T, int heads, int hd);
void kern_rope_fwd_cuda(kern_stream_t *s, float *x, const float *cos_tab, const float *sin_tab,
                        const int32_t *pos, int B, int T, int heads, int hd);
void kern_rope_bwd_cuda(kern_stream_t *s, float *x, const float *cos_tab, const float *sin_tab,
                        const int32_t *pos, int B, int T, int heads, int hd);

#endif
