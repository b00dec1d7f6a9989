/* NCCL across the processes of a multi-rank job (see comm_nccl_ranks.h),
 * and the device sum entry through which comm_ranks.c reaches it:
 * registered when this library is linked (kernels/ranks_registry.h). */
#include "kernels/cuda/comm_nccl_ranks.h"

#include <nccl.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/backend_cuda_internal.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/ranks_registry.h"

struct kern_nccl_ranks {
    ncclComm_t comm;
    kern_stream_t *stream; /* this rank's device's compute stream: the gradients' */
};

_Static_assert(sizeof(ncclUniqueId) == KERN_NCCL_ID_BYTES, "KERN_NCCL_ID_BYTES is NCCL's unique id size");

mt_status_t kern_nccl_ranks_unique_id(unsigned char out[KERN_NCCL_ID_BYTES], mt_error_t *err) {
    ncclUniqueId id;
    const ncclResult_t r = ncclGetUniqueId(&id);
    if (r != ncclSuccess)
        return mt_error_set(err, MT_ERR_DEVICE, "NCCL: ncclGetUniqueId on rank 0 failed: %s", ncclGetErrorString(r));
    memcpy(out, &id, sizeof id);
    return MT_OK;
}

mt_status_t kern_nccl_ranks_create(kern_device_t *dev, int rank, int size, const unsigned char id_bytes[KERN_NCCL_ID_BYTES],
                                   kern_nccl_ranks_t **out, mt_error_t *err) {
    *out = NULL;
    ncclUniqueId id;
    memcpy(&id, id_bytes, sizeof id);
    kern_nccl_ranks_t *nr = calloc(1, sizeof *nr);
    MT_CHECK_ALLOC(nr, "NCCL communicator across ranks");
    nr->stream = kern_stream(dev, KERN_STREAM_COMPUTE);
    (void)kern_cuda_stream_begin(nr->stream); /* ncclCommInitRank binds the current device */
    const ncclResult_t r = ncclCommInitRank(&nr->comm, size, id, rank);
    if (r != ncclSuccess) {
        free(nr);
        return mt_error_set(err, MT_ERR_DEVICE, "NCCL: ncclCommInitRank (rank %d of %d) failed: %s", rank, size,
                            ncclGetErrorString(r));
    }
    *out = nr;
    return MT_OK;
}

void kern_nccl_ranks_destroy(kern_nccl_ranks_t *nr) {
    if (!nr) return;
    MT_NCCL_CHECK(ncclCommDestroy(nr->comm));
    free(nr);
}

void kern_nccl_ranks_sum_f32(kern_nccl_ranks_t *nr, float *buf, size_t count) {
    int size = 0;
    MT_NCCL_CHECK(ncclCommCount(nr->comm, &size));
    MT_CHECK(size == 2, "kern_nccl_ranks_sum_f32: %d ranks; NCCL's sum is in rank order for 2 only", size);
    const cudaStream_t cs = kern_cuda_stream_begin(nr->stream);
    MT_NCCL_CHECK(ncclAllReduce(buf, buf, count, ncclFloat32, ncclSum, nr->comm, cs));
    MT_CUDA_CHECK(cudaStreamSynchronize(cs));
}

/* ---- the device sum entry (ranks_registry.h) ------------------------------- */

static mt_status_t nccl_unique_id(void *id, mt_error_t *err) { return kern_nccl_ranks_unique_id(id, err); }

static mt_status_t nccl_create(kern_device_t *dev, int rank, int size, const void *id, void **state, mt_error_t *err) {
    kern_nccl_ranks_t *nr = NULL;
    const mt_status_t st = kern_nccl_ranks_create(dev, rank, size, id, &nr, err);
    if (st == MT_OK) *state = nr;
    return st;
}

static void nccl_destroy(void *state) { kern_nccl_ranks_destroy(state); }

static void nccl_sum_f32(void *state, float *buf, size_t count) { kern_nccl_ranks_sum_f32(state, buf, count); }

static const kern_ranks_device_sum_t k_nccl_sum = {
    .name = "NCCL",
    .kind = KERN_BACKEND_CUDA,
    .ranks = 2, /* a + b: one rounding, commutative; rings of three or more are not rank order */
    .id_bytes = KERN_NCCL_ID_BYTES,
    .unique_id = nccl_unique_id,
    .create = nccl_create,
    .destroy = nccl_destroy,
    .sum_f32 = nccl_sum_f32,
};

__attribute__((constructor)) static void register_nccl_sum(void) { kern_ranks_register_device_sum(&k_nccl_sum); }
