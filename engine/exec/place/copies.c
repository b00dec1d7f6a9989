/* Sizes and sources of the executor's copies (see copies.h). */
#include "engine/exec/place/copies.h"

#include "base/arena.h"
#include "engine/layers/blocks.h"
#include "engine/model/desc/model_desc.h"

size_t exec_w_bytes(const eng_param_t *p) { return p->spec->numel * mt_dtype_size(p->w_dtype); }

size_t exec_f32_bytes(const eng_param_t *p) { return p->spec->numel * sizeof(float); }

void *exec_w_home(const eng_param_t *p) {
    if (p->home_bf16) return p->home_bf16;
    if (p->work_bf16) return p->work_bf16;
    return p->host_w;
}

moe_staging_op_t exec_w_upload_op(const eng_param_t *p) {
    if (p->work_pinned) return MOE_STAGING_PINNED;
    return p->w_dtype == MT_BF16 && !p->home_bf16 && !p->work_bf16 ? MOE_STAGING_F32_TO_BF16 : MOE_STAGING_COPY;
}

moe_staging_op_t exec_w_from_master_op(const eng_param_t *p) {
    return p->w_dtype == MT_BF16 ? MOE_STAGING_F32_TO_BF16 : MOE_STAGING_COPY;
}

moe_staging_xfer_t exec_w_refresh_item(const eng_param_t *p, void *w) {
    return (moe_staging_xfer_t){exec_w_home(p), w, exec_w_bytes(p), exec_w_upload_op(p)};
}

size_t exec_w_link_bytes(const eng_param_t *p) { return p->home_q ? p->home_q->nbytes : exec_w_bytes(p); }

static size_t w_aligned(const eng_param_t *p) {
    return (exec_w_bytes(p) + MT_ARENA_ALIGN - 1) / MT_ARENA_ALIGN * MT_ARENA_ALIGN;
}

size_t exec_w_span_bytes(const eng_param_t *p) {
    return p->home_q ? w_aligned(p) + p->home_q->nbytes : exec_w_bytes(p);
}

void *exec_w_landing(const eng_param_t *p, void *w) { return p->home_q ? (char *)w + w_aligned(p) : NULL; }

moe_staging_xfer_t exec_w_upload_item(const eng_param_t *p, void *w, void *landing) {
    if (p->home_q) {
        /* pending: left in the checkpoint's mapping for the NVMe tier (eng_exec_place) */
        MT_CHECK(!p->home_q->pending, "the quantised home of %s is fetched before the NVMe tier it waits for is placed",
                 p->spec->name);
        return (moe_staging_xfer_t){p->home_q->bytes, landing, p->home_q->nbytes, MOE_STAGING_COPY};
    }
    return (moe_staging_xfer_t){exec_w_home(p), w, exec_w_bytes(p), exec_w_upload_op(p)};
}

void exec_w_dequant(kern_device_t *dev, kern_stream_t *s, const eng_param_t *p, void *w, const void *landing) {
    if (!p->home_q) return;
    const mt_quant_view_t v = eng_quant_home_view_at(p->home_q, landing);
    dev->ops->dequant(s, w, p->w_dtype, &v);
}

moe_staging_op_t exec_grad_to_host_op(const eng_dparam_t *d) {
    if (d->acc_has_data) return MOE_STAGING_ADD_F32;
    return d->host_g_pinned ? MOE_STAGING_PINNED : MOE_STAGING_COPY;
}

float *exec_dev_master(const eng_param_t *p, const eng_dparam_t *d) {
    if (d->dev_master) return d->dev_master;
    return p->w_dtype == MT_F32 ? (float *)d->w : NULL;
}

size_t exec_layer_act_bytes(const eng_model_t *m, int l, int n) {
    return eng_model_desc_layer_act_bytes(&m->spec, l, n, eng_act_storage_dtype(m), MT_ARENA_ALIGN);
}
