/* The device backends' registry (backend_registry.h) as a program sees it.
 * This test links the CPU backend only, so: the CPU kind is registered,
 * named and opens; the CUDA kind is absent and kern_device_create,
 * kern_cuda_available and kern_backend_names all say so; a kind that does
 * not exist is refused by number; registering an entry again changes
 * nothing; a second backend for a taken kind is a fatal error naming both;
 * and a backend registered for CUDA is what kern_cuda_available asks. */
#include <setjmp.h>
#include <stdio.h>
#include <string.h>

#include "kernels/backend_registry.h"
#include "kernels/device.h"

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

static jmp_buf g_fatal_jmp;
static char g_fatal_msg[512];
static void fatal_to_longjmp(const char *msg) {
    snprintf(g_fatal_msg, sizeof g_fatal_msg, "%s", msg);
    longjmp(g_fatal_jmp, 1);
}

static void test_linked(void) {
    const kern_backend_t *cpu = kern_backend_find(KERN_BACKEND_CPU);
    EXPECT(cpu != NULL && strcmp(cpu->name, "cpu") == 0, "the CPU backend registered as \"cpu\"");
    EXPECT(kern_backend_find(KERN_BACKEND_CUDA) == NULL, "no CUDA backend is linked into this test");
    EXPECT(kern_backend_find(KERN_BACKEND_COUNT) == NULL, "KERN_BACKEND_COUNT is no kind");
    char names[64];
    kern_backend_names(names, sizeof names);
    EXPECT(strcmp(names, "cpu") == 0, "backends linked: \"%s\", want \"cpu\"", names);
    char tiny[3];
    kern_backend_names(tiny, sizeof tiny);
    EXPECT(memchr(tiny, '\0', sizeof tiny) != NULL, "names not terminated in a 3-byte buffer");
    EXPECT(strcmp(kern_backend_kind_name(KERN_BACKEND_CUDA), "cuda") == 0, "kind name of CUDA");

    kern_device_opts_t o = {.device_budget_bytes = 1 << 20};
    kern_device_t *dev = NULL;
    mt_error_t err = {0};
    EXPECT(kern_device_create(KERN_BACKEND_CPU, &o, &dev, &err) == MT_OK && dev, "CPU device: %s", err.msg);
    kern_device_destroy(dev);
}

static void test_absent(void) {
    kern_device_opts_t o = {.device_budget_bytes = 1 << 20};
    kern_device_t *dev = NULL;
    mt_error_t err = {0};
    mt_status_t st = kern_device_create(KERN_BACKEND_CUDA, &o, &dev, &err);
    EXPECT(st == MT_ERR_DEVICE && dev == NULL, "a CUDA device without a CUDA backend: %s", mt_status_name(st));
    EXPECT(strstr(err.msg, "no cuda backend is linked") && strstr(err.msg, "backends linked: cpu") &&
               strstr(err.msg, "//kernels/backends:cuda"),
           "the message names the kind, what is linked and what to link: \"%s\"", err.msg);
    printf("CUDA without its backend: %s\n", err.msg);

    st = kern_device_create((kern_backend_kind_t)7, &o, &dev, &err);
    EXPECT(st == MT_ERR_DEVICE && dev == NULL && strstr(err.msg, "no such device kind 7"),
           "kind 7: %s \"%s\"", mt_status_name(st), err.msg);

    char why[128] = "";
    EXPECT(!kern_cuda_available(why, sizeof why) && strcmp(why, "no CUDA backend is linked into this program") == 0,
           "kern_cuda_available without the backend: \"%s\"", why);
}

static void test_register_twice(void) {
    const kern_backend_t *cpu = kern_backend_find(KERN_BACKEND_CPU);
    kern_backend_register(cpu); /* the same entry again: nothing changes */
    EXPECT(kern_backend_find(KERN_BACKEND_CPU) == cpu, "re-registering the CPU entry replaced it");

    static kern_backend_t second; /* registered entries outlive the call */
    second = (kern_backend_t){.kind = KERN_BACKEND_CPU, .name = "other-cpu", .create = cpu->create};
    volatile int fatal = 0;
    mt_set_fatal_hook(fatal_to_longjmp);
    if (setjmp(g_fatal_jmp) == 0) kern_backend_register(&second);
    else fatal = 1;
    mt_set_fatal_hook(NULL);
    EXPECT(fatal && strstr(g_fatal_msg, "two cpu backends") && strstr(g_fatal_msg, "other-cpu"),
           "a second CPU backend must be fatal, naming both: \"%s\"", g_fatal_msg);
    EXPECT(kern_backend_find(KERN_BACKEND_CPU) == cpu, "the first CPU entry stays");
}

/* A CUDA backend that finds no GPU: kern_cuda_available reports its reason. */
static bool no_gpu(char *why, size_t why_len) {
    snprintf(why, why_len, "stand-in: no GPU here");
    return false;
}

static mt_status_t refuse(const kern_device_opts_t *opts, kern_device_t **out, mt_error_t *err) {
    (void)opts;
    *out = NULL;
    return mt_error_set(err, MT_ERR_DEVICE, "stand-in: refused");
}

static void test_probe(void) {
    static const kern_backend_t stand_in = {
        .kind = KERN_BACKEND_CUDA, .name = "stand-in-cuda", .probe = no_gpu, .create = refuse};
    kern_backend_register(&stand_in);
    char why[128] = "";
    EXPECT(!kern_cuda_available(why, sizeof why) && strcmp(why, "stand-in: no GPU here") == 0,
           "kern_cuda_available asks the registered probe: \"%s\"", why);
    kern_device_t *dev = NULL;
    mt_error_t err = {0};
    EXPECT(kern_device_create(KERN_BACKEND_CUDA, NULL, &dev, &err) == MT_ERR_DEVICE && dev == NULL &&
               strcmp(err.msg, "stand-in: refused") == 0,
           "kern_device_create returns the backend's own error: \"%s\"", err.msg);
    char names[64];
    kern_backend_names(names, sizeof names);
    EXPECT(strcmp(names, "cpu, stand-in-cuda") == 0, "backends linked: \"%s\"", names);
}

int main(void) {
    test_linked();
    test_absent();
    test_register_twice();
    test_probe(); /* last: it leaves a CUDA entry registered */
    if (failures) {
        fprintf(stderr, "backend_registry_test: %d failure(s)\n", failures);
        return 1;
    }
    printf("backend_registry_test: all checks passed\n");
    return 0;
}
