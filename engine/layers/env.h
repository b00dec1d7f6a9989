/* What the block math of a layer sees of the device it runs on: the device,
 * the host model (config, description, parameter homes and their LoRA
 * pairing), this device's copies of the parameters, the RoPE tables on the
 * device, and which layers' experts are split between devices.
 *
 * It is a view the executor fills in and keeps current (engine/exec/exec.h);
 * the layers never see the executor itself, so the math of a block can be
 * read, and tested, apart from the scheduling around it. */
#ifndef MT_ENGINE_LAYERS_ENV_H
#define MT_ENGINE_LAYERS_ENV_H

#include "engine/layers/dparam.h"
#include "engine/model/model.h"
#include "kernels/device.h"
#include "moe/expert_parallel.h"
#include "scheduler/plan.h"

typedef struct {
    kern_device_t *dev;       /* not owned */
    eng_model_t *model;       /* not owned */
    eng_dparam_t *dp;         /* (model->num_params) this device's copies, not owned */
    float *rope_cos;          /* (T, rope dim / 2) device RoPE tables for the running */
    float *rope_sin;          /* micro-batch's sequence length, NULL before the first */
    int rope_T;               /* the sequence length they were built for */
    const sched_plan_t *plan; /* the plan being run: which MoE layers are expert parallel */
    const moe_ep_t *ep;       /* this device's place among the expert-parallel devices, NULL: none */
} eng_layer_env_t;

/* The expert-parallel place of layer `layer`'s MoE block, NULL when this
 * device runs all of the layer's experts itself. */
const moe_ep_t *eng_layer_ep(const eng_layer_env_t *env, int layer);

#endif
