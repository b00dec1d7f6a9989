/* A run's set-up and tear-down, written once for every command that runs
 * training steps: `moetune train`, `moetune profile` and `moetune bench
 * step`.  They differ in what they open, not in how, so one function opens
 * the parts in their one order and one function frees whatever was opened:
 *
 *   ranks        the step's micro-batches must split over ranks x devices;
 *                ranks sharing a node take its devices in turn
 *   device       the run config's backend (eng_open_device), or the caller's
 *                device options
 *   plan         planned from config.json before any weight is read
 *                (engine/run/plan.h), or the caller's
 *   model        the model and an executor on each of `devices:`
 *                (engine/parallel/devices.h; one device: one executor), or
 *                none (profile opens one per staging mode itself)
 *   data         the run config's datasets, or the caller's, and with a
 *                model a loader over them
 *   resume       a checkpoint's training state (engine/run/state.h)
 *   training     signals (engine/run/signals.h), rank 0's metrics.jsonl
 *                header and trace.json
 *
 * The one cleanup pattern: eng_run_open leaves whatever it opened in the run
 * when a part fails, and eng_run_close frees whatever is there, so a caller
 * writes
 *     st = eng_run_open(&run, rc, &opts, err);
 *     if (st == MT_OK) st = work(&run, err);
 *     st = eng_run_close(&run, st, err);
 * The run holds its own copy of the run config, so the caller's may go
 * once eng_run_open returns; the run points into itself, so it stays where
 * eng_run_open put it until eng_run_close. */
#ifndef MT_ENGINE_RUN_SESSION_H
#define MT_ENGINE_RUN_SESSION_H

#include <stdbool.h>
#include <stdint.h>

#include "engine/config/config.h"
#include "engine/data/data.h"
#include "engine/exec/exec.h"
#include "engine/exec/optim_state.h"
#include "engine/exec/record/trace.h"
#include "engine/model/model.h"
#include "engine/parallel/devices.h"
#include "engine/parallel/ranks.h"
#include "engine/run/plan.h"
#include "engine/run/report.h"
#include "engine/run/state.h"
#include "kernels/device.h"
#include "scheduler/plan.h"

/* What eng_run_open opens beyond the run config, and what the caller
 * gives instead of it.  Zero is a training run's choice for every field. */
typedef struct {
    eng_ranks_t *ranks;                    /* the job this process is a rank of; NULL: this process alone */
    const kern_device_opts_t *device;      /* NULL: the run config's backend (eng_open_device) */
    kern_backend_kind_t backend;           /* with device */
    const sched_plan_t *plan;              /* NULL: planned from config.json (eng_train_plan); else copied
                                              by the executors, never planned nor read from config.json */
    bool without_model;                    /* device, plan and data only (no resume, not training) */
    const eng_staging_settings_t *staging; /* NULL: the run config's staging: (its timeline kept short
                                              unless trace: true) */
    const eng_lora_opts_t *lora;           /* NULL: full fine-tuning */
    eng_dataset_t *dataset;                /* taken over by eng_run_open, even when it fails (left zeroed);
                                              NULL: the run config's datasets */
    const char *resume_dir;                /* a checkpoint-N to resume from; NULL or "": none */
    bool training;                         /* a training run's own parts: the data's mask warning,
                                              signals, rank 0's metrics.jsonl header and trace.json */
} eng_run_opts_t;

typedef struct {
    const eng_run_config_t *rc; /* &rc_own: what every part reads */
    eng_run_config_t rc_own;    /* the caller's, copied (its model_config_json too), with several
                                   ranks with this rank's device ordinals */
    eng_ranks_t *ranks;         /* NULL: this process alone */
    int nranks;                 /* 1 alone */
    bool writes;                /* this process writes output_dir (rank 0, or alone) */
    kern_device_t *dev;         /* the (first) device */
    eng_train_plan_t tp;        /* what was planned (zero when the plan was given) */
    const sched_plan_t *plan;   /* the plan the executors run: &tp.plan or the caller's */
    int num_blocks, vocab_size; /* config.json's, when planned here (0 when the plan was given) */
    eng_multi_t multi;          /* the model and its executors (zero without a model) */
    eng_exec_t *x;              /* the primary executor: the optimizer step, saves, reports (NULL without a model) */
    eng_nvme_placed_t nvme;     /* what the NVMe tier holds (zero: no tier) */
    eng_model_t *model;         /* the one model (NULL without a model) */
    eng_dataset_t ds;           /* the training data (without the examples val_set_size holds out) */
    eng_dataset_t eval_ds;      /* a training run's evaluation set (engine/run/eval.h); empty: none */
    struct eng_text *text;      /* the tokenizer and chat template of text datasets, or NULL */
    eng_loader_t ld;            /* with a model (zero without) */
    int total_steps;            /* max_steps, or num_epochs over the loader as the HF Trainer counts
                                   (0 without a model) */
    eng_train_state_t ts;       /* the training state: a resumed checkpoint's, else step 0 */
    char last_checkpoint[2048]; /* the last complete checkpoint: the resumed one, then each saved; "" none */
    bool signals;               /* the signal handlers are installed */
    eng_reporter_t rep;         /* rank 0 of a training run: metrics.jsonl and progress (else zero: notes only) */
    eng_trace_t *trace;         /* trace: true, rank 0 of a training run */
    double t_trace;             /* when tracing started */
} eng_run_t;

/* Opens what a run of rc uses as opts says, in the order of the note at
 * the top; on failure the run holds what was opened (eng_run_close). */
mt_status_t eng_run_open(eng_run_t *run, const eng_run_config_t *rc, const eng_run_opts_t *opts, mt_error_t *err);
/* Writes trace.json (with the staging pool's counter tracks) and frees
 * whatever eng_run_open opened.  Returns st, or when st is MT_OK the
 * first failure of writing the trace. */
mt_status_t eng_run_close(eng_run_t *run, mt_status_t st, mt_error_t *err);

/* Chooses the backend as the config says (auto: CUDA when a GPU is found,
 * else the CPU with a one-line notice; cuda without a GPU is an error). */
mt_status_t eng_open_device(const eng_run_config_t *rc, kern_device_t **out, mt_error_t *err);

#endif
