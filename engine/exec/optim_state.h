/* The optimizer state of a model on its executor, as host arrays (the fp32
 * master, the moments in their format's bytes), for checkpoints that
 * resume exactly (engine/run/state.h).
 *
 * Where the state lives depends on the plan of the parameter's block
 * (engine/model/model.h): the fp32 master in host_w, dev_master or the fp32
 * working copy; AdamW moments in host_mom or on the device, allocated
 * at the parameter's first step (torch creates state lazily the same way,
 * so a parameter never stepped, e.g. an expert that never got a token, has
 * step 0 and no m, v).  These functions hide the placement: a checkpoint
 * written under one plan resumes under another. */
#ifndef MT_ENGINE_OPTIM_STATE_H
#define MT_ENGINE_OPTIM_STATE_H

#include <stdbool.h>
#include <stdint.h>

#include "engine/exec/place/types.h"
#include "engine/model/model.h"
#include "engine/optim/nvme_state.h"
#include "kernels/adamw.h"
#include "base/status.h"

/* Parameter i's AdamW step count (0: never stepped, no m, v). */
int64_t eng_model_optim_step_count(const eng_model_t *m, int i);

/* The moments' format of every parameter of m (run config optimizer_state):
 * fmt, except that 8-bit leaves tensors under ENG_MOMENTS_8BIT_MIN_NUMEL
 * elements in fp32 as bitsandbytes does; seed (the run's) and each
 * parameter's name make its stochastic-rounding seed.  Before any state
 * exists (a first step, a resume, the NVMe tier's placement). */
#define ENG_MOMENTS_8BIT_MIN_NUMEL 4096
void eng_optim_set_moments(eng_model_t *m, kern_moments_fmt_t fmt, uint64_t seed);

/* Parameter p's moments: the bytes of their one allocation, and its view. */
size_t eng_param_moments_bytes(const eng_param_t *p);
kern_moments_t eng_param_moments_view(const eng_param_t *p, void *base);

/* Copies parameter i's fp32 master (numel floats) and AdamW moments (in
 * its format: eng_param_moments_bytes) into host memory (either may be
 * NULL).  Moments of a parameter never stepped read as 0.  Waits for
 * pending work first. */
void eng_exec_read_optim_state(eng_exec_t *x, int i, float *master, void *mom);

/* Sets parameter i's fp32 master (NULL: keep it), its AdamW moments (in
 * its format; NULL or step 0: none, as before its first step) and its step count, wherever
 * the plan keeps them.  A working copy on the device (bf16 or fp32) is
 * rewritten from the new master, so the next forward computes with it;
 * streamed weights are made from the host master when next fetched. */
mt_status_t eng_exec_write_optim_state(eng_exec_t *x, int i, const float *master, const void *mom, int64_t step,
                                        mt_error_t *err);

/* Every stepped parameter's AdamW moments are finite and exp_avg_sq is
 * never negative, as a checkpoint must hold them; else an error naming the
 * tensor (NAME.exp_avg or NAME.exp_avg_sq, as optimizer.safetensors names
 * it) and the element, or the NVMe tier's failure (eng_exec_nvme_drain).
 * Reads each parameter's moments once (waits for pending work first). */
mt_status_t eng_exec_check_optim_state(eng_exec_t *x, mt_error_t *err);

/* What eng_exec_place_optim_nvme placed. */
typedef struct {
    int params;             /* parameters whose AdamW moments the store holds */
    int masters;            /* of them, those whose fp32 master it holds too */
    int homes;              /* of them, those whose bf16 working copy (the weights' home) it holds too */
    int base_homes;         /* frozen parameters (a LoRA run's base) whose home it holds, with no state
                             * (params and base_homes 0: the plan keeps nothing on NVMe, no store opened) */
    int base_unpacked;      /* of them, quantised homes written straight from the checkpoint's mapping,
                             * never copied into host memory (eng_model_read_weights) */
    uint64_t bytes;         /* their disk bytes */
    const char *io;         /* "io_uring" or "pread/pwrite" */
    const char *run_dir;    /* this run's subdirectory (valid while the executor is open) */
    int leftovers_removed;  /* killed runs' subdirectories removed */
} eng_nvme_placed_t;

/* Puts the optimizer state of every trained parameter whose block the plan
 * keeps on NVMe (host AdamW with nvme_optim) into an NVMe store in dir
 * (engine/optim/nvme_state.h): its moments, and its fp32 master where a
 * bf16 working copy stays in host memory; and where the plan streams a
 * block's weights from NVMe (nvme_weights), their homes: trained bf16
 * working copies and a frozen base's homes, which every fetch then reads
 * from there.  Before any step or resume; budget 0: the free space limits
 * it.  No such block: nothing is opened (out->params and base_homes 0).
 * An error when the bytes do not fit or a plan keeps weights' homes on
 * NVMe that the executor does not read from there (a block trained in
 * full in fp32, or without its state on NVMe). */
mt_status_t eng_exec_place_optim_nvme(eng_exec_t *x, const char *dir, uint64_t budget, eng_nvme_placed_t *out,
                                      mt_error_t *err);

/* The NVMe tier's traffic so far (zeros without a tier). */
eng_nvme_io_t eng_exec_nvme_io(eng_exec_t *x);

/* Pending updates done and every write back of the NVMe tier waited for
 * (they run in the background, nvme_state.h); the tier's first failure,
 * naming its file, if one failed (MT_OK without a tier).  Before a save
 * reads the state, and at the end of a run. */
mt_status_t eng_exec_nvme_drain(eng_exec_t *x, mt_error_t *err);

/* Drops the gradients accumulated for a step that is not applied (a
 * skipped non-finite step), leaving every weight and moment as it was, so
 * the next step starts from zero gradients as after an update. */
void eng_optim_discard_step(eng_exec_t *x);

#endif
