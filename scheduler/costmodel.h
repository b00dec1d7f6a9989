/* Cost model: registry + hardware profile -> per-block times and bytes
 * (a workload the simulator runs under a plan).
 *
 *   op time        = max(FLOPs / achievable FLOP/s, bytes / device bandwidth)
 *                    (matmul-class ops at the run's matmul rate: bf16 with
 *                    bf16 working copies, fp32 otherwise; the attention core
 *                    at the profile's rate for its path, tensor-core or the
 *                    fp32 kernel, and direction; other ops at fp32)
 *   transfer time  = bytes / link bandwidth of its direction
 *                    + copies x per-copy latency (one copy per tensor moved)
 *   host AdamW     = bytes touched / the profile's host AdamW rate
 *   pack           = weight bytes copied into staging (every host home is
 *                    in its working dtype already) / the profile's pack
 *                    rate, before each weight H2D; a fetch read from NVMe
 *                    lands in staging without one, a pinned working copy
 *                    is copied from where it is (sched_block_pack_frac)
 *   unpack         = gradient bytes / the profile's unpack rate, on the
 *                    pack threads behind each gradient D2H (a copy; a later
 *                    micro-batch's add costs SCHED_UNPACK_ADD_COST times as
 *                    much; none for a copy into a pinned accumulator)
 *   device AdamW   = bytes touched / device memory bandwidth
 *   exchange       = per all-to-all: the busier direction's rows x row bytes
 *                    / peer bandwidth + peer latency (expert parallel)
 *
 * The workload is plain numbers so that tests can write one by hand. */
#ifndef MT_SCHEDULER_COSTMODEL_H
#define MT_SCHEDULER_COSTMODEL_H

#include <stdbool.h>

#include "base/quant_elem.h"
#include "base/status.h"
#include "scheduler/hw.h"
#include "scheduler/plan.h"
#include "scheduler/registry.h"

typedef struct {
    /* compute stream, seconds per micro-batch */
    double fwd_s;            /* forward */
    double bwd_s;            /* backward, without recomputation */
    double recompute_s;      /* the forward again before the backward (acts RECOMPUTE) */
    /* weights */
    double w_resident_bytes; /* device footprint when RESIDENT (all experts) */
    double w_fetch_bytes;    /* one H2D fetch when STREAM (experts with tokens only) */
    double w_fetch_copies;
    double w_home_bytes;     /* host home copy when STREAM */
    double w_fetch_step_bytes; /* one fetch for all of a step's micro-batches (layer-major): experts any of them hit */
    double w_fetch_step_copies;
    double w_pack_frac;      /* share of a fetch's bytes copied into staging on the pack threads (1 with a
                                pack rate: every host home is a copy away from the link, in its working
                                dtype; a fetch from NVMe is read straight into staging instead) */
    /* trainable state */
    double grad_bytes;       /* device footprint of DEVICE grads; size of the host grad buffer */
    double grad_mb_bytes;    /* gradients one micro-batch produces (experts with tokens) */
    double grad_mb_copies;
    double grad_step_bytes;  /* gradients of a step (DEVICE grads sent once to a HOST optimizer) */
    double grad_step_copies;
    double optim_bytes;      /* master (bf16 runs) + m + v */
    double host_weight_bytes;/* fp32 host copy host AdamW needs when weights are RESIDENT and the
                                working copy is the fp32 master itself (fp32 runs, LoRA adapters) */
    double w_update_bytes;   /* H2D of updated working copies after host AdamW (RESIDENT weights) */
    double w_update_copies;
    double w_work_bytes;     /* of w_home_bytes, the trained weights' working copies (a pinned home) */
    double w_update_pack_frac; /* share of w_update_bytes packed on the pack threads (as w_pack_frac) */
    double adam_device_s, adam_host_s;
    double grad_add_host_s;  /* micro-batches after the first: add the staged gradients into the host
                                buffer (SCHED_UNPACK_ADD_COST times the first one's copy at unpack_bw) */
    double grad_add_device_s;/* ... or into the device accumulator */
    double norm_device_s, norm_host_s; /* reading gradients for the global norm (clipping) */
    double spec_copy_bytes;  /* the speculative host optimizer's spare state (master, m, v: 12 B per
                                trainable parameter in fp32, kept from step to step: the update writes
                                there out of place) */
    double adam_spec_host_s; /* what a speculative (out of place) host update takes beyond adam_host_s:
                                the write-allocate reads of lighter moments' spares (fp32 state is
                                streamed past the cache: none); an update deferred past the norm runs
                                in place */
    /* activations (device bytes) */
    double act_saved_bytes;  /* KEEP / OFFLOAD */
    double act_input_bytes;  /* RECOMPUTE keeps only this */
    double act_copies;
    double fwd_temp_bytes, bwd_temp_bytes;
    /* Expert parallel (sched_workload_t.ep_blocks; all 0 in a data parallel
     * block's costs): the device's own experts and the token exchange.
     * fwd_s, bwd_s and recompute_s already hold the exchange: the layer's
     * compute cannot go on until its rows are back (critical path). */
    double owned_w_update_bytes; /* working-copy bytes of its own experts a step updates: updated by
                                    their owner, never refreshed from device 0 */
    double owned_grad_bytes;  /* gradients of its own experts: one owner, no reduction between devices */
    double owned_adam_host_s; /* host AdamW of its own experts per step; every device's share runs on
                                 the one host */
    double other_host_bytes;  /* the other device's experts' optimizer state and host gradients: on
                                 the one host too when the block's optimizer is there */
    double xchg_fwd_bytes;    /* routed rows this device sends the other per micro-batch, forward:
                                 tokens to the other's experts, then the other's tokens' expert outputs */
    double xchg_bwd_bytes;    /* ... backward: output gradients out, input gradients back */
} sched_block_cost_t;

/* Expert parallel splits a MoE layer's routed experts between this many
 * devices (the one count the cost model and the planner handle). */
#define SCHED_EP_DEVICES 2

typedef struct {
    int num_blocks;
    int grad_accum;
    bool clip;               /* max_grad_norm > 0 and not speculative: host AdamW waits for the global norm */
    bool speculative;        /* max_grad_norm > 0, speculative: host AdamW overlaps the backward out of place
                                (modelled as every speculation standing, the common case) */
    bool tied_head;          /* the last block reads block 0's weights */
    bool has_trainable;      /* false: nothing to optimize (no optimizer tasks) */
    double h2d_bw, d2h_bw;   /* bytes/s, achievable */
    double latency_s;        /* per copy */
    double compute_interference, host_copy_s_per_byte; /* see sched_hw_t */
    /* Host work on the copy path (sched_hw_t.pack_bw, unpack_bw), bytes/s;
     * 0: not modelled (hand-made workloads) */
    double pack_bw, unpack_bw;
    /* Host AdamW (sched_hw_t): its memory traffic's rate, bytes/s, and its
     * arithmetic's with bf16 and 8-bit moments over all the host's cores,
     * parameters/s (sched_workload_set_moments); 0: not modelled */
    double adamw_bw, adamw_bf16_rate, adamw_8bit_rate;
    sched_block_cost_t *blocks; /* (num_blocks), owned */
    /* (num_blocks), owned, or NULL (no MoE block): a block's costs on one of
     * SCHED_EP_DEVICES devices when its routed experts are split between them
     * (the plan's expert_parallel); moe[b] false: a copy of blocks[b], never
     * used (the plan check refuses expert parallel there) */
    sched_block_cost_t *ep_blocks;
    bool *moe;               /* (num_blocks) or NULL: blocks with routed experts */
    /* the token exchange between devices: per direction; via host: the rows
     * also cross each device's own link (D2H out, H2D in) */
    double peer_bw, peer_latency_s;
    bool peer_via_host;
    /* for reports */
    double model_flops;      /* one step's useful FLOPs */
    double peak_flops;       /* datasheet peak of the matmul dtype (MFU denominator) */
    double tokens_per_step;
    /* A frozen base kept quantized (scheduler/basequant.h); the byte counts
     * above already hold it.  For reports: the covered tensors' bytes as
     * stored and in the working dtype. */
    bool base_quantized;
    mt_quant_format_t base_quant_format;
    double base_quant_bytes, base_quant_work_bytes;
    /* The NVMe tier (sched_workload_set_nvme): the array's sustained rates,
     * bytes/s; 0: no tier (plans never put anything there) */
    double nvme_read_bw, nvme_write_bw;
} sched_workload_t;

/* The rate matmul-class ops run at for this run. */
sched_rate_t sched_matmul_rate(const sched_registry_t *reg);
double sched_op_time(const sched_op_t *op, const sched_hw_t *hw, sched_rate_t matmul_rate);
double sched_transfer_time(const sched_workload_t *w, bool h2d, double bytes, double copies);
/* A later micro-batch's gradients are added into the host buffer, not
 * copied there: 12 B of memory traffic per 4 B landed against 8. */
#define SCHED_UNPACK_ADD_COST 1.5

/* Host time packing `bytes` into staging / unpacking them from it (0 when
 * the workload does not model it). */
double sched_pack_time(const sched_workload_t *w, double bytes);
double sched_unpack_time(const sched_workload_t *w, double bytes);

mt_status_t sched_workload_build(const sched_registry_t *reg, const sched_hw_t *hw, sched_workload_t *out,
                                 mt_error_t *err);
/* An empty workload of n blocks (tests fill it by hand). */
void sched_workload_init(sched_workload_t *w, int num_blocks);
/* The costs block b runs at under plan flag expert_parallel. */
const sched_block_cost_t *sched_block_cost(const sched_workload_t *w, int b, bool expert_parallel);

/* Whether host AdamW waits for the global gradient norm under this plan:
 * clipping without speculation, or speculation with the NVMe tier (which
 * the executor runs without it). */
bool sched_waits_for_norm(const sched_workload_t *w, const sched_plan_t *plan);

/* AdamW's moments in format fmt (0 fp32, 1 bf16, 2 8-bit: a code per
 * element and an fp32 absmax per 256 per moment; run config
 * optimizer_state) counted in w's optimizer bytes and AdamW times, which
 * the registry counts with fp32 moments (8 bytes per trainable parameter,
 * each read and written by an update).  A lighter format's host update
 * moves fewer bytes but does more arithmetic (expanding, rounding or
 * quantizing): it takes the slower of its traffic at adamw_bw and its
 * parameters at the format's rate.  Returns the moments' bytes per
 * trainable parameter.  Call once, after building w. */
double sched_workload_set_moments(sched_workload_t *w, int fmt);

/* Host bytes a block holds for the whole step under plan p, in three parts:
 * home, its weights' home copies (the host model keeps every weight's,
 * resident or streamed: a save writes them and device copies come from
 * them); optim, with the optimizer on the host its state, the other
 * device's share, and the fp32 copy host AdamW updates beyond the home (none
 * when the home is that fp32 copy); grads, its host gradients.  What the
 * plan puts on NVMe (sched_block_nvme_bytes) is not counted. */
void sched_block_host_bytes(const sched_block_cost_t *c, const sched_block_plan_t *p, double *home, double *optim,
                            double *grads);
/* The NVMe tier's rates from hw (sched_hw_nvme_read_bw ...); a profile
 * without an nvme: section leaves the workload without a tier. */
void sched_workload_set_nvme(sched_workload_t *w, const sched_hw_t *hw);
/* NVMe time of bytes read / written (0 bytes: 0). */
double sched_nvme_read_time(const sched_workload_t *w, double bytes);
double sched_nvme_write_time(const sched_workload_t *w, double bytes);
/* Share of block b's fetched (update: refreshed) bytes packed into
 * staging under plan p: w_pack_frac (w_update_pack_frac), less the share
 * its trained working copies take when they are pinned (copied straight
 * from there); none when its weights' homes are on the NVMe tier (read
 * straight into staging, moe/staging.h MOE_STAGING_READ). */
double sched_block_pack_frac(const sched_block_cost_t *c, const sched_block_plan_t *p, bool update);
/* Bytes block b keeps on NVMe under plan p: its weights' home (nvme_weights
 * with weights STREAM) and optimizer state (nvme_optim with optimizer HOST). */
double sched_block_nvme_bytes(const sched_block_cost_t *c, const sched_block_plan_t *p);
/* Gives a hand-made workload expert parallel costs (tests): ep_blocks
 * copied from blocks, moe[] false; the caller edits them. */
void sched_workload_alloc_ep(sched_workload_t *w);
void sched_workload_free(sched_workload_t *w);

#endif
