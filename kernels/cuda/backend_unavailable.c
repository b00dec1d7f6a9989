/* Stand-in used until the CUDA backend is built: says so. */
#include <stdio.h>

#include "kernels/cuda/backend_cuda.h"

mt_status_t kern_cuda_device_create(const kern_device_opts_t *opts, kern_device_t **out,
                                    mt_error_t *err) {
    (void)opts;
    *out = NULL;
    return mt_error_set(err, MT_ERR_DEVICE, "this build of moetune has no CUDA backend");
}

bool kern_cuda_probe(char *why, size_t why_len) {
    snprintf(why, why_len, "this build of moetune has no CUDA backend");
    return false;
}
