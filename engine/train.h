/* `moetune train`: the whole run from a validated run config. */
#ifndef MT_ENGINE_TRAIN_H
#define MT_ENGINE_TRAIN_H

#include "engine/config.h"
#include "kernels/device.h"

typedef struct {
    int steps_done;
    double first_loss, last_loss;
    double seconds;
    double predicted_step_s; /* the planner's prediction for the chosen plan (0 if none) */
} eng_train_result_t;

/* Chooses the backend as the config says (auto: CUDA when a GPU is found,
 * else the CPU with a one-line notice; cuda without a GPU is an error). */
mt_status_t eng_open_device(const eng_run_config_t *rc, kern_device_t **out, mt_error_t *err);

mt_status_t eng_train(const eng_run_config_t *rc, eng_train_result_t *result, mt_error_t *err);

#endif
