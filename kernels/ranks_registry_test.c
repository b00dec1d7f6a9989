/* The rank transports' and device sums' registry (ranks_registry.h) and
 * comm_ranks.c over it, with stand-ins in this one process (no launcher, no
 * second process: the stand-in transport plays rank 1 of 2 and makes up
 * rank 0's part of every gather).
 *
 * - With no transport linked the program is one rank, whatever launcher
 *   variables are set: only a linked transport knows its launcher.
 * - Transports are asked in their order and the first launched one carries
 *   the job; every collective reaches it with the state its init made, and
 *   kern_ranks_destroy hands that state back.
 * - A device sum registered for the bound device's kind and the job's rank
 *   count is set up with rank 0's id and sums device buffers; rank 0 failing
 *   to make the id fails every rank naming the sum; a device sum for
 *   another rank count is left alone. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/comm_ranks.h"
#include "kernels/ranks_registry.h"

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

/* ---- a stand-in transport: rank 1 of `size`, rank 0's gather part made up */

typedef struct {
    const char *name;
    bool launched;
    int size;
    int inits, destroys, gathers, barriers;
    void *state_given; /* what init handed out */
    void *state_seen;  /* what the last call received */
    unsigned char rank0[64]; /* rank 0's bytes in every gather */
} fake_t;

static fake_t g_late = {.name = "late", .size = 2};  /* order 5 */
static fake_t g_early = {.name = "early", .size = 2}; /* order 1 */

static bool late_launched(void) { return g_late.launched; }
static bool early_launched(void) { return g_early.launched; }

static mt_status_t fake_init(fake_t *f, void **state, int *rank, int *size, int *local_rank) {
    f->inits++;
    f->state_given = f;
    *state = f;
    *rank = 1;
    *size = f->size;
    *local_rank = 1;
    return MT_OK;
}
static mt_status_t late_init(void **s, int *r, int *n, int *l, mt_error_t *e) {
    (void)e;
    return fake_init(&g_late, s, r, n, l);
}
static mt_status_t early_init(void **s, int *r, int *n, int *l, mt_error_t *e) {
    (void)e;
    return fake_init(&g_early, s, r, n, l);
}

static void fake_destroy(void *state) {
    fake_t *f = state;
    f->destroys++;
    f->state_seen = state;
}

static void fake_allgather(void *state, const void *send, void *recv, size_t bytes) {
    fake_t *f = state;
    f->gathers++;
    f->state_seen = state;
    for (int q = 0; q < f->size; q++) {
        unsigned char *slot = (unsigned char *)recv + (size_t)q * bytes;
        if (q == 1) memcpy(slot, send, bytes);
        else memcpy(slot, f->rank0, bytes < sizeof f->rank0 ? bytes : sizeof f->rank0);
    }
}

static void fake_barrier(void *state) {
    ((fake_t *)state)->barriers++;
    ((fake_t *)state)->state_seen = state;
}

static void fake_abort(void *state, int code) {
    (void)state;
    exit(code);
}

static const kern_ranks_transport_t k_late = {
    .name = "late", .launcher = "the late stand-in", .order = 5, .launched = late_launched, .init = late_init,
    .destroy = fake_destroy, .allgather = fake_allgather, .barrier = fake_barrier, .abort = fake_abort};
static const kern_ranks_transport_t k_early = {
    .name = "early", .launcher = "the early stand-in", .order = 1, .launched = early_launched, .init = early_init,
    .destroy = fake_destroy, .allgather = fake_allgather, .barrier = fake_barrier, .abort = fake_abort};

/* ---- a stand-in device sum on CPU devices, for two ranks ----------------- */

enum { ID_BYTES = 4 };

static struct {
    int ids, creates, destroys, sums;
    unsigned char id_seen[ID_BYTES];
    int rank_seen, size_seen;
    float *buf_seen;
    size_t count_seen;
} g_sum;

static mt_status_t sum_unique_id(void *id, mt_error_t *err) {
    (void)err;
    g_sum.ids++;
    memset(id, 0x5a, ID_BYTES);
    return MT_OK;
}

static mt_status_t sum_create(kern_device_t *dev, int rank, int size, const void *id, void **state,
                              mt_error_t *err) {
    (void)dev;
    (void)err;
    g_sum.creates++;
    g_sum.rank_seen = rank;
    g_sum.size_seen = size;
    memcpy(g_sum.id_seen, id, ID_BYTES);
    *state = &g_sum;
    return MT_OK;
}

static void sum_destroy(void *state) {
    (void)state;
    g_sum.destroys++;
}

static void sum_f32(void *state, float *buf, size_t count) {
    (void)state;
    g_sum.sums++;
    g_sum.buf_seen = buf;
    g_sum.count_seen = count;
}

static const kern_ranks_device_sum_t k_sum = {.name = "stand-in sum",
                                              .kind = KERN_BACKEND_CPU,
                                              .ranks = 2,
                                              .id_bytes = ID_BYTES,
                                              .unique_id = sum_unique_id,
                                              .create = sum_create,
                                              .destroy = sum_destroy,
                                              .sum_f32 = sum_f32};

/* ---- the cases ----------------------------------------------------------- */

static void test_no_transport(void) {
    setenv("OMPI_COMM_WORLD_SIZE", "2", 1); /* mpirun's, but no MPI transport is linked */
    setenv("WORLD_SIZE", "2", 1);
    EXPECT(!kern_ranks_launched(), "no transport linked, yet launched");
    kern_ranks_t *r = NULL;
    mt_error_t err = {0};
    EXPECT(kern_ranks_create(&r, &err) == MT_OK && r, "%s", err.msg);
    if (!r) return;
    EXPECT(kern_ranks_size(r) == 1 && kern_ranks_rank(r) == 0 && strcmp(kern_ranks_launcher(r), "one process") == 0,
           "one process: size %d rank %d launcher %s", kern_ranks_size(r), kern_ranks_rank(r), kern_ranks_launcher(r));
    int v = 7, got = 0;
    kern_ranks_allgather(r, &v, &got, sizeof v);
    EXPECT(got == 7, "a gather of one rank is a copy");
    kern_ranks_barrier(r);
    kern_ranks_destroy(r);
    unsetenv("OMPI_COMM_WORLD_SIZE");
    unsetenv("WORLD_SIZE");
}

static void test_order(void) {
    kern_ranks_register_transport(&k_late);
    kern_ranks_register_transport(&k_early);
    kern_ranks_register_transport(&k_late); /* again: ignored */
    EXPECT(kern_ranks_launched_transport() == NULL, "neither stand-in launched yet");
    g_late.launched = true;
    EXPECT(kern_ranks_launched_transport() == &k_late, "only the late one launched");
    g_early.launched = true;
    EXPECT(kern_ranks_launched_transport() == &k_early, "both launched: the earlier order carries the job");
    EXPECT(kern_ranks_launched(), "launched");

    kern_ranks_t *r = NULL;
    mt_error_t err = {0};
    EXPECT(kern_ranks_create(&r, &err) == MT_OK && r, "%s", err.msg);
    if (!r) return;
    EXPECT(g_early.inits == 1 && g_late.inits == 0, "init: early %d, late %d", g_early.inits, g_late.inits);
    EXPECT(kern_ranks_size(r) == 2 && kern_ranks_rank(r) == 1 && kern_ranks_local_rank(r) == 1,
           "the transport's rank and size");
    EXPECT(strcmp(kern_ranks_launcher(r), "the early stand-in") == 0, "launcher %s", kern_ranks_launcher(r));
    g_early.rank0[0] = 9;
    EXPECT(kern_ranks_max_int(r, 4) == 9, "max over rank 0's 9 and this rank's 4");
    kern_ranks_barrier(r);
    EXPECT(g_early.gathers == 1 && g_early.barriers == 1 && g_early.state_seen == g_early.state_given,
           "every call reaches the transport with its state");
    kern_ranks_destroy(r);
    EXPECT(g_early.destroys == 1 && g_late.destroys == 0, "destroy: early %d, late %d", g_early.destroys,
           g_late.destroys);
    g_early.rank0[0] = 0;
}

static kern_device_t *cpu_device(void) {
    kern_device_opts_t o = {.device_budget_bytes = 1 << 20};
    kern_device_t *dev = NULL;
    mt_error_t err = {0};
    if (kern_device_create(KERN_BACKEND_CPU, &o, &dev, &err) != MT_OK) {
        fprintf(stderr, "cannot create a CPU device: %s\n", err.msg);
        exit(2);
    }
    return dev;
}

static void test_device_sum(void) {
    kern_ranks_register_device_sum(&k_sum);
    EXPECT(kern_ranks_find_device_sum(KERN_BACKEND_CPU) == &k_sum, "registered for CPU devices");
    EXPECT(kern_ranks_find_device_sum(KERN_BACKEND_CUDA) == NULL, "none for CUDA devices");
    kern_device_t *dev = cpu_device();
    mt_error_t err = {0};

    /* two ranks: rank 0's id reaches create, device sums go to it */
    kern_ranks_t *r = NULL;
    EXPECT(kern_ranks_create(&r, &err) == MT_OK && r, "%s", err.msg);
    if (!r) return;
    const unsigned char rank0[1 + ID_BYTES] = {1, 0xde, 0xad, 0xbe, 0xef};
    memcpy(g_early.rank0, rank0, sizeof rank0);
    EXPECT(kern_ranks_bind_device(r, dev, &err) == MT_OK, "%s", err.msg);
    EXPECT(g_sum.ids == 0 && g_sum.creates == 1 && g_sum.rank_seen == 1 && g_sum.size_seen == 2 &&
               memcmp(g_sum.id_seen, rank0 + 1, ID_BYTES) == 0,
           "create once, on rank 1 of 2, with rank 0's id (ids made here: %d)", g_sum.ids);
    float *buf = kern_alloc(dev, 16 * sizeof(float), "summed", &err);
    const bool contrib[2] = {true, true};
    kern_ranks_sum_f32(r, buf, 16, true, contrib);
    EXPECT(g_sum.sums == 1 && g_sum.buf_seen == buf && g_sum.count_seen == 16, "a device buffer goes to the sum");
    kern_free(dev, buf);
    kern_ranks_destroy(r);
    EXPECT(g_sum.destroys == 1, "the sum is destroyed with the ranks");

    /* rank 0 could not make the id: this rank fails too, naming the sum */
    EXPECT(kern_ranks_create(&r, &err) == MT_OK && r, "%s", err.msg);
    if (!r) return;
    g_early.rank0[0] = 0;
    const mt_status_t st = kern_ranks_bind_device(r, dev, &err);
    EXPECT(st == MT_ERR_DEVICE && strstr(err.msg, "stand-in sum: rank 0 could not create"),
           "%s \"%s\"", mt_status_name(st), err.msg);
    EXPECT(g_sum.creates == 1, "no create without rank 0's id");
    kern_ranks_destroy(r);

    /* three ranks: the sum only serves two, so it is left alone */
    g_early.size = 3;
    EXPECT(kern_ranks_create(&r, &err) == MT_OK && r, "%s", err.msg);
    if (!r) return;
    const int gathers = g_early.gathers;
    EXPECT(kern_ranks_bind_device(r, dev, &err) == MT_OK, "%s", err.msg);
    EXPECT(g_sum.creates == 1 && g_early.gathers == gathers, "three ranks: no id gathered, no sum created");
    kern_ranks_destroy(r);
    EXPECT(g_sum.destroys == 1, "nothing to destroy");
    g_early.size = 2;
    kern_device_destroy(dev);
}

int main(void) {
    test_no_transport(); /* first: before any stand-in registers */
    test_order();
    test_device_sum();
    if (failures) {
        fprintf(stderr, "ranks_registry_test: %d failure(s)\n", failures);
        return 1;
    }
    printf("ranks_registry_test: all checks passed\n");
    return 0;
}
