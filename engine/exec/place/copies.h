/* A parameter's copies and a layer's saved activations as the executor
 * places and moves them: their sizes in bytes, the host home a working copy
 * is made from and the staging op that makes it, and which device buffer a
 * device optimizer updates.
 *
 * Pure functions of the model's parameters and description, kept below
 * every concern that allocates or copies (spans, the staging pool,
 * residency, gradients, the optimizer) so that none of them asks another,
 * or the executor, how big a tensor is. */
#ifndef MT_ENGINE_EXEC_COPIES_H
#define MT_ENGINE_EXEC_COPIES_H

#include <stddef.h>

#include "engine/layers/dparam.h"
#include "engine/model/model.h"
#include "kernels/device.h"
#include "moe/staging.h"

/* Bytes of p's device working copy (w_dtype) and of its fp32 tensors
 * (master, gradient, AdamW state). */
size_t exec_w_bytes(const eng_param_t *p);
size_t exec_f32_bytes(const eng_param_t *p);

/* The host home the working copy is made from (a frozen weight's bf16
 * home, a trained weight's bf16 working copy, else the fp32 master), and
 * the staging op that makes it from there (a plain copy but from an fp32
 * master to a bf16 working copy; none for a pinned working copy, which is
 * copied from where it is).  exec_w_from_master_op: the op that makes
 * it from an fp32 master the caller holds.  exec_w_refresh_item: the copy
 * that makes a device working copy w again after the host home changed. */
void *exec_w_home(const eng_param_t *p);
moe_staging_op_t exec_w_upload_op(const eng_param_t *p);
moe_staging_op_t exec_w_from_master_op(const eng_param_t *p);
moe_staging_xfer_t exec_w_refresh_item(const eng_param_t *p, void *w);

/* A frozen matrix with a quantised home (eng_param_t.home_q) crosses the
 * link as its codes and scales, which land on the device beside the
 * working copy and are dequantised into it on the compute stream once it
 * has waited for the copy (exec_wait_block), so compute finds the working
 * copy as it would an unquantised one.
 *   exec_w_link_bytes: bytes p's working copy costs the link per fetch;
 *   exec_w_span_bytes: device bytes a streamed fetch allocates: the working
 *     copy, then (aligned) the landing area of its quantised bytes;
 *   exec_w_landing:    that area in a span whose working copy is at w (NULL
 *     without a quantised home);
 *   exec_w_upload_item: the staged copy that fills w (or the landing area);
 *     a home the NVMe tier holds has no host address (NULL), and the fetch
 *     points the copy at the bytes it read from there (residency.c);
 *   exec_w_dequant:    issues the dequantisation on s (nothing without a
 *     quantised home). */
size_t exec_w_link_bytes(const eng_param_t *p);
size_t exec_w_span_bytes(const eng_param_t *p);
void *exec_w_landing(const eng_param_t *p, void *w);
moe_staging_xfer_t exec_w_upload_item(const eng_param_t *p, void *w, void *landing);
void exec_w_dequant(kern_device_t *dev, kern_stream_t *s, const eng_param_t *p, void *w, const void *landing);

/* The staging op of a gradient copy into the host accumulator d->host_g:
 * an add into what an earlier micro-batch left there, else a copy (from
 * where it lands when the accumulator is pinned). */
moe_staging_op_t exec_grad_to_host_op(const eng_dparam_t *d);

/* The device fp32 master a device optimizer updates for p, whose copies on
 * this device are d: dev_master, or the working copy itself when it is
 * fp32; NULL when there is none. */
float *exec_dev_master(const eng_param_t *p, const eng_dparam_t *d);

/* Bytes of layer l's saved activations for n tokens, as the arena holds
 * them (blocks of MT_ARENA_ALIGN): the model description's list.  The
 * staging pool is sized with it before the first micro-batch; the step
 * program checks each buffer against the description when it offloads
 * (engine/exec/step.c), and staging_modes_test compares the total with what
 * the forward offloads. */
size_t exec_layer_act_bytes(const eng_model_t *m, int l, int n);

#endif
