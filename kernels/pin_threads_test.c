/* kern_device_opts_t.pin_threads on the CPU backend: compute keeps its
 * cores, copy streams and host threads get the others, and the creating
 * thread's cores come back when the device is destroyed.
 *
 * On a machine (or cgroup) with a single usable core there is nothing to
 * split: the test then checks that pinning leaves every mask alone. */
#include "kernels/device.h"

#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/backend_cpu.h"

static int failures;
#define EXPECT(c, ...)                                                        \
    do {                                                                      \
        if (!(c)) {                                                           \
            fprintf(stderr, "%s:%d: FAIL: %s: ", __FILE__, __LINE__, #c);     \
            fprintf(stderr, __VA_ARGS__);                                     \
            fprintf(stderr, "\n");                                            \
            failures++;                                                       \
        }                                                                     \
    } while (0)

static cpu_set_t mask_of_self(void) {
    cpu_set_t s;
    CPU_ZERO(&s);
    if (pthread_getaffinity_np(pthread_self(), sizeof s, &s) != 0) {
        fprintf(stderr, "pthread_getaffinity_np failed\n");
        exit(2);
    }
    return s;
}

static kern_device_t *make(bool pin, int threads) {
    kern_device_opts_t o = {.device_budget_bytes = 1 << 20, .host_threads = threads, .pin_threads = pin};
    kern_device_t *dev = NULL;
    mt_error_t err = {0};
    if (kern_device_create(KERN_BACKEND_CPU, &o, &dev, &err) != MT_OK) {
        fprintf(stderr, "cannot create CPU device: %s\n", err.msg);
        exit(2);
    }
    return dev;
}

/* Records the affinity of whatever thread runs it. */
static void record_mask(void *arg) { *(cpu_set_t *)arg = mask_of_self(); }

static void *host_thread(void *arg) {
    kern_device_t *dev = arg;
    kern_device_pin_host_thread(dev);
    cpu_set_t *out = malloc(sizeof *out);
    *out = mask_of_self();
    return out;
}

static cpu_set_t mask_of_new_host_thread(kern_device_t *dev) {
    pthread_t t;
    void *r = NULL;
    if (pthread_create(&t, NULL, host_thread, dev) != 0 || pthread_join(t, &r) != 0 || !r) exit(2);
    cpu_set_t s = *(cpu_set_t *)r;
    free(r);
    return s;
}

static cpu_set_t mask_of_copy_stream(kern_device_t *dev) {
    cpu_set_t s;
    CPU_ZERO(&s);
    kern_stream_t *h2d = kern_stream(dev, KERN_STREAM_H2D);
    kern_launch_host_fn(dev, h2d, record_mask, &s);
    kern_stream_sync(dev, h2d);
    return s;
}

int main(void) {
    const cpu_set_t all = mask_of_self();
    const int n = CPU_COUNT(&all);

    /* without pin_threads nothing moves */
    kern_device_t *dev = make(false, 1);
    cpu_set_t m = mask_of_self();
    EXPECT(CPU_EQUAL(&m, &all), "unpinned device changed the creator's cores");
    EXPECT(kern_cpu_host_cores(dev) == 0, "unpinned device reports %d host cores", kern_cpu_host_cores(dev));
    EXPECT(kern_device_caps(dev).host_cores == 0, "unpinned device's caps report %d host cores",
           kern_device_caps(dev).host_cores);
    m = mask_of_copy_stream(dev);
    EXPECT(CPU_EQUAL(&m, &all), "unpinned copy stream was pinned");
    kern_device_destroy(dev);

    /* compute threads as many as the cores: nothing left for the host, no pinning */
    dev = make(true, n);
    m = mask_of_self();
    EXPECT(CPU_EQUAL(&m, &all) && kern_cpu_host_cores(dev) == 0, "all cores to compute must not pin");
    kern_device_destroy(dev);

    if (n >= 2) {
        dev = make(true, 1);
        const cpu_set_t compute = mask_of_self();
        EXPECT(CPU_COUNT(&compute) == 1, "the creator runs on %d cores, want 1", CPU_COUNT(&compute));
        EXPECT(kern_cpu_host_cores(dev) == n - 1, "host cores %d, want %d", kern_cpu_host_cores(dev), n - 1);
        EXPECT(kern_device_caps(dev).host_cores == n - 1, "caps: host cores %d, want %d",
               kern_device_caps(dev).host_cores, n - 1);
        const cpu_set_t copy = mask_of_copy_stream(dev), host = mask_of_new_host_thread(dev);
        cpu_set_t both;
        CPU_AND(&both, &copy, &compute);
        EXPECT(CPU_COUNT(&copy) == n - 1 && CPU_COUNT(&both) == 0, "the copy stream shares the compute core");
        EXPECT(CPU_EQUAL(&host, &copy), "a host thread and the copy stream differ");
        cpu_set_t u;
        CPU_OR(&u, &copy, &compute);
        EXPECT(CPU_EQUAL(&u, &all), "compute and host cores do not cover the process's cores");
        kern_device_destroy(dev);
        m = mask_of_self();
        EXPECT(CPU_EQUAL(&m, &all), "destroy did not give the creator its cores back");

        /* two pinned devices alive at once, destroyed in creation order:
         * the second splits the same cores, and the creator gets them back
         * only when the last one goes */
        kern_device_t *d1 = make(true, 1), *d2 = make(true, 1);
        EXPECT(kern_cpu_host_cores(d2) == n - 1, "second device: %d host cores, want %d", kern_cpu_host_cores(d2), n - 1);
        const cpu_set_t copy2 = mask_of_copy_stream(d2);
        EXPECT(CPU_EQUAL(&copy2, &copy), "the second device's copy stream is not on the host cores");
        kern_device_destroy(d1);
        m = mask_of_self();
        EXPECT(CPU_EQUAL(&m, &compute), "the creator left the compute cores while a pinned device lives");
        kern_device_destroy(d2);
        m = mask_of_self();
        EXPECT(CPU_EQUAL(&m, &all), "the last pinned device did not give the creator its cores back");
    } else {
        dev = make(true, 1);
        m = mask_of_self();
        EXPECT(CPU_EQUAL(&m, &all) && kern_cpu_host_cores(dev) == 0, "one core: nothing to split, nothing pinned");
        kern_device_destroy(dev);
        printf("one usable core: checked that pin_threads leaves it alone\n");
    }
    if (failures) {
        fprintf(stderr, "pin_threads_test: %d failure(s)\n", failures);
        return 1;
    }
    printf("pin_threads_test: ok (%d cores)\n", n);
    return 0;
}
