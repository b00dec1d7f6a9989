/* NCCL across the processes of a multi-rank job (see comm_nccl_ranks.h). */
#include "kernels/cuda/comm_nccl_ranks.h"

#include <nccl.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/backend_cuda_internal.h"
#include "kernels/cuda/cuda_check.h"

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
