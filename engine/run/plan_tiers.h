/* What a plan counts beyond the working dtype and two memory tiers: a
 * frozen base kept quantized (scheduler/basequant.h) and the NVMe tier
 * (memory.nvme with a profile's nvme: section), from the run config and
 * config.json.  `moetune plan` applies both; training plans the base as
 * the executor holds it (eng_plan_base_quant_held). */
#ifndef MT_ENGINE_RUN_PLAN_TIERS_H
#define MT_ENGINE_RUN_PLAN_TIERS_H

#include <stddef.h>

#include "base/status.h"
#include "engine/config/config.h"
#include "scheduler/basequant.h"
#include "scheduler/hw.h"
#include "scheduler/planner.h"

/* The base's quantized format for a LoRA run: as config.json's
 * quantization_config stores it (quant_method fp8 with a square
 * weight_block_size, mxfp4, bitsandbytes 4-bit), else as load_in_4bit
 * quantizes it on load (bnb_4bit_quant_type, bnb_4bit_use_double_quant,
 * blocks of 64).  Full fine-tuning, or neither: q->on false (planned in the
 * working dtype).  config_json: the model's config.json.  Errors name the
 * file and key (a block size that is not two equal positive integers, an
 * unknown quant_method). */
mt_status_t eng_plan_base_quant(const eng_run_config_t *rc, const char *config_json, sched_base_quant_t *q,
                                mt_error_t *err);

/* The same from config.json's text (name for messages), for a training
 * plan: the base as the executor holds it (FP8 and gpt-oss's MXFP4
 * experts as stored, load_in_4bit's NF4/FP4). */
mt_status_t eng_plan_base_quant_held(const eng_run_config_t *rc, const char *text, const char *name,
                                     sched_base_quant_t *q, mt_error_t *err);

/* The NVMe tier of a plan: with memory.nvme.path set, the workload takes the
 * profile's NVMe rates and the planner may use the tier within
 * memory.nvme.budget (0: no limit).  A path with a profile that has no
 * nvme: section is an error naming both. */
mt_status_t eng_plan_nvme(const eng_run_config_t *rc, const sched_hw_t *hw, sched_workload_t *w,
                          sched_planner_opts_t *o, mt_error_t *err);

/* eng_plan_nvme for a training run's plan: a profile without an nvme:
 * section gets memory.nvme.path measured (eng_calibrate_nvme) as its
 * array; the planner moves optimizer state, and streamed weights' homes
 * only in a bf16 run or a LoRA run (bf16: the executor streams a trained
 * block's bf16 working copy from NVMe; LoRA: a frozen base's homes, in
 * whatever form the host keeps them; a full fine-tuning fp32 run's home is
 * its master, which stays). */
mt_status_t eng_plan_nvme_for_training(const eng_run_config_t *rc, bool bf16, sched_hw_t *hw, sched_workload_t *w,
                                       sched_planner_opts_t *o, mt_error_t *err);

#endif
