/* Expert parallelism for a sparse MoE block (moe_layer.h) over the devices
 * of a communicator (kernels/device.h's kern_comm).
 *
 * Rank d of N owns the routed experts [d*E/N, (d+1)*E/N) (moe_ep_range):
 * only the owner holds their weights, runs their products and accumulates
 * their gradients.  Everything else of the block -- router, permutation,
 * combine, shared expert -- runs on the token's own device, as in data
 * parallelism.  Forward, after routing:
 *   1. tokens per owned expert go to each owner (a fixed-size exchange of
 *      counts, so every rank knows what it will receive);
 *   2. each device sends its gathered rows of the owner's experts (xp, in
 *      its stored dtype, bf16 in a bf16 run) -- a contiguous slice, as xp
 *      is sorted by expert and an owner's experts are contiguous;
 *   3. the owner runs its experts on the rows of each source device in
 *      turn, rank 0 first: for every (source, expert) the product is the
 *      one the source would have run alone (same rows, same order, same
 *      shape), so results are bit-identical to the single-device block;
 *   4. the outputs go back to their source, into its expert-output buffer,
 *      and the combine over the top-k runs there unchanged.
 * Backward mirrors it: output gradients to the owner, the owner's expert
 * backward per source in rank order (weight gradients accumulate source 0's
 * rows, then source 1's: with one micro-batch per device that is the
 * single-device micro-batch order), input gradients back.  Expert weight
 * gradients need no reduction across devices: each has one owner.
 *
 * Every rank must run every expert-parallel layer's forward and backward,
 * in the same order (they are collectives).  A rank that fails inside the
 * block aborts the communicator so that its peers return an error instead
 * of waiting for it.  Not supported (refused by name): LoRA on routed
 * experts. */
#ifndef MT_MOE_EXPERT_PARALLEL_H
#define MT_MOE_EXPERT_PARALLEL_H

#include "kernels/device.h"

/* A device's place in expert parallelism; moe_layer_params_t.ep points at
 * one (NULL: the block runs every expert itself). */
typedef struct moe_ep {
    kern_comm_t *comm; /* one rank per device, shared by all expert-parallel layers */
    int rank;          /* this device's rank in comm */
} moe_ep_t;

/* The routed experts rank `rank` of `nranks` owns: [*lo, *hi). */
void moe_ep_range(int E, int nranks, int rank, int *lo, int *hi);

#endif
