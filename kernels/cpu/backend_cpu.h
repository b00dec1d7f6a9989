/* What CPU kernels and the CPU kernel tests may ask of the CPU backend (the
 * device layer reaches it through the entry backend_cpu.c registers,
 * backend_registry.h). */
#ifndef MT_KERNELS_CPU_BACKEND_CPU_H
#define MT_KERNELS_CPU_BACKEND_CPU_H

#include "kernels/host/threadpool.h"
#include "kernels/device.h"

/* The backend's pool for bandwidth-bound kernels; NULL means run inline. */
kern_threadpool_t *kern_cpu_stream_threadpool(kern_stream_t *s);

/* How many host cores a pinned device leaves (0 when it does not pin). */
int kern_cpu_host_cores(kern_device_t *dev);

/* Collectives between CPU devices of this process (comm_cpu.c). */
mt_status_t kern_cpu_comm_create(kern_device_t *const *devs, int n, kern_comm_t **out,
                                 mt_error_t *err);

mt_status_t kern_cpu_device_create(const kern_device_opts_t *opts, kern_device_t **out,
                                   mt_error_t *err);

#endif
