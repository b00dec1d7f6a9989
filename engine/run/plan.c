/* Planning a training run (see plan.h). */
#include "engine/run/plan.h"
#include "engine/run/plan_tiers.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/run/calibrate.h"
#include "engine/model/io/checkpoint.h"
#include "engine/model/desc/model_desc.h"
#include "engine/model/desc/program.h"
#include "scheduler/costmodel.h"
#include "scheduler/data_parallel.h"
#include "kernels/host/numa.h"
#include "scheduler/hw.h"
#include "scheduler/planner.h"
#include "scheduler/registry.h"

static void summarize(const sched_plan_t *p, char *buf, size_t n) {
    int stream = 0, off = 0, rec = 0, hostopt = 0, ep = 0, nvme = 0, nvme_w = 0, pinned = 0;
    for (int b = 0; b < p->num_blocks; b++) {
        ep += p->blocks[b].expert_parallel;
        stream += p->blocks[b].weights == SCHED_WEIGHTS_STREAM;
        off += p->blocks[b].acts == SCHED_ACTS_OFFLOAD;
        rec += p->blocks[b].acts == SCHED_ACTS_RECOMPUTE;
        hostopt += p->blocks[b].optim == SCHED_OPTIM_HOST;
        nvme += sched_block_nvme_optim(&p->blocks[b]);
        nvme_w += sched_block_nvme_weights(&p->blocks[b]);
        pinned += sched_block_pinned_home(&p->blocks[b]) || sched_block_pinned_grads(&p->blocks[b]);
    }
    snprintf(buf, n,
             "plan %s: %d of %d blocks stream their weights, %d offload and %d recompute activations, %d "
             "keep the optimizer on the host; prefetch window %d; %s order",
             sched_policy_name(p->policy), stream, p->num_blocks, off, rec, hostopt, p->prefetch_window,
             p->layer_major ? "layer-major" : "micro-batch-major");
    if (nvme > 0) {
        const size_t len = strlen(buf);
        snprintf(buf + len, n - len, "; %d keep optimizer state on NVMe, %d their weights' home", nvme, nvme_w);
    }
    if (pinned > 0) {
        const size_t len = strlen(buf);
        snprintf(buf + len, n - len, "; %d pin working copies or gradient accumulators", pinned);
    }
    const kern_numa_t *numa = kern_numa_host();
    if (hostopt > 0 && numa->nodes > 1) { /* engine/optim/host_optim.h */
        const size_t len = strlen(buf);
        snprintf(buf + len, n - len, "; host AdamW on %d NUMA nodes%s, each block's host state split between them",
                 numa->nodes, numa->pretend ? " (MOETUNE_NUMA_NODES)" : "");
    }
    if (ep > 0) {
        const size_t len = strlen(buf);
        snprintf(buf + len, n - len, "; %d MoE layer(s) expert parallel", ep);
    }
}

/* The checkpoint's headers against config.json, before any budget is
 * judged: wrong sizes in config.json would otherwise read as a memory
 * budget they do not fit.  A directory without weights is left to the
 * loader to report. */
static mt_status_t check_checkpoint(const eng_run_config_t *rc, const eng_model_config_t *mc, mt_error_t *err) {
    eng_checkpoint_t ck;
    mt_error_t open_err = {0};
    if (eng_checkpoint_open(rc->base_model, &ck, &open_err) != MT_OK) {
        if (open_err.code == MT_ERR_IO) return MT_OK; /* no weights file: the load says so */
        *err = open_err;
        return open_err.code;
    }
    eng_model_desc_t spec;
    mt_status_t st = eng_model_desc_build(mc, &spec, err);
    if (st == MT_OK) {
        char path[1100];
        snprintf(path, sizeof path, "%s/config.json", rc->base_model);
        st = eng_checkpoint_resolve(&ck, &spec, err);
        if (st == MT_OK) st = eng_checkpoint_check(&ck, mc, &spec, path, rc->allow_unused_tensors, err);
        eng_model_desc_free(&spec);
    }
    eng_checkpoint_close(&ck);
    return st;
}

mt_dtype_t eng_compute_dtype(const eng_run_config_t *rc, kern_device_t *dev) {
    switch (rc->bf16) {
    case ENG_BF16_ON: return MT_BF16;
    case ENG_BF16_AUTO: return kern_device_caps(dev).bf16_compute ? MT_BF16 : MT_F32;
    case ENG_BF16_OFF:
    default: return MT_F32;
    }
}

mt_status_t eng_train_plan(const eng_run_config_t *rc, const eng_model_config_t *mc, kern_device_t *dev,
                           eng_train_plan_t *out, mt_error_t *err) {
    memset(out, 0, sizeof *out);
    mt_status_t cst = check_checkpoint(rc, mc, err);
    if (cst != MT_OK) return cst;
    sched_hw_t hw;
    char path[1200];
    const char *spec = rc->hardware[0] ? rc->hardware : "calibrate";
    mt_status_t st = sched_hw_resolve(spec, rc->source_path, path, sizeof path, err);
    if (st != MT_OK) return st;
    if (strcmp(path, "calibrate") == 0) {
        /* a GPU is measured through the device the run will use */
        sched_calibration_t cal;
        const bool gpu = kern_device_caps(dev).kernels_async;
        eng_calibrate_attn_t attn; /* bf16 working copies on a GPU only */
        eng_calibrate_attn_of(mc, rc, gpu && eng_compute_dtype(rc, dev) == MT_BF16, &attn);
        st = gpu ? eng_calibrate_device(dev, rc, &attn, &cal, err) : eng_calibrate(rc, &attn, NULL, &cal, err);
        if (st != MT_OK) return st;
        sched_hw_from_calibration(&cal, &hw);
    } else {
        st = sched_hw_load(path, &hw, err);
        if (st != MT_OK) return st;
    }
    sched_workload_t w;
    sched_planner_opts_t opts;
    sched_planner_result_t res;
    memset(&res, 0, sizeof res);
    sched_base_quant_t quant;
    st = eng_plan_base_quant_held(rc, mc->config_json, "config.json", &quant, err);
    if (st != MT_OK) return st;
    st = eng_program_workload(mc, rc, &hw, eng_compute_dtype(rc, dev) == MT_BF16, &quant, &w, err);
    if (st == MT_OK) st = eng_program_planner_opts(rc, &hw, &opts, err);
    if (st == MT_OK) st = eng_plan_nvme_for_training(rc, eng_compute_dtype(rc, dev) == MT_BF16, &hw, &w, &opts, err);
    if (st == MT_OK) st = eng_program_parallel_opts(mc, rc, &opts, err);
    if (st == MT_OK && opts.devices == SCHED_EP_DEVICES) {
        /* two devices: data or expert parallel per MoE layer; the plan is
         * one device's share, the prediction the whole step */
        sched_parallel_result_t par;
        st = sched_parallel_plan(&w, &opts, sched_hw_host_bw(&hw), &par, err);
        const int k = par.chosen;
        if (st == MT_OK && !par.feasible[k])
            st = mt_error_set(err, MT_ERR_BUDGET,
                              "%s: no %s plan fits each device's budgets (predicted device peak %.1f MiB); lower "
                              "micro_batch_size or sequence_len, or raise memory.device",
                              rc->source_path, k == SCHED_LAYOUT_DATA ? "data parallel" : "expert parallel",
                              par.dp[k].peak_device[0] / 1048576.0);
        if (st == MT_OK) {
            out->plan = par.plan[k];
            par.plan[k].blocks = NULL; /* moved */
            out->predicted_step_s = par.dp[k].step_s;
            out->predicted_peak_device = par.dp[k].peak_device[0];
            summarize(&out->plan, out->summary, sizeof out->summary);
        }
        sched_parallel_result_free(&par);
        sched_workload_free(&w);
        return st;
    }
    if (st == MT_OK) st = sched_plan_make(&w, &opts, &res, err);
    if (st == MT_OK && !res.feasible) st = mt_error_set(err, MT_ERR_BUDGET, "%s: %s", rc->source_path, res.why);
    if (st == MT_OK) {
        out->plan = res.plan;
        out->plan.blocks = malloc((size_t)res.plan.num_blocks * sizeof *out->plan.blocks);
        MT_CHECK_ALLOC(out->plan.blocks, "plan");
        memcpy(out->plan.blocks, res.plan.blocks, (size_t)res.plan.num_blocks * sizeof *out->plan.blocks);
        out->predicted_step_s = res.sim.step_time;
        out->predicted_peak_device = res.sim.peak[SCHED_MEM_DEVICE];
        summarize(&out->plan, out->summary, sizeof out->summary);
    }
    sched_planner_result_free(&res);
    sched_workload_free(&w);
    return st;
}

void eng_train_plan_free(eng_train_plan_t *p) { sched_plan_free(&p->plan); }
