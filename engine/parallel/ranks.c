/* The processes of a multi-rank job (see ranks.h). */
#include "engine/parallel/ranks.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

bool eng_ranks_launched(void) { return kern_ranks_launched(); }

void eng_ranks_close(eng_ranks_t *r) {
    if (r->k) kern_ranks_destroy(r->k);
    memset(r, 0, sizeof *r);
}

/* A launcher's world-size variable that the job's ranks do not match:
 * OMPI_COMM_WORLD_SIZE=2 exported by hand (or left from another job) while
 * the process was started alone makes MPI a one-process world, and the run
 * would train alone on what the user meant as a share.  Refused naming the
 * variable, its value and how many processes there are. */
static mt_status_t world_size_vars(const eng_ranks_t *r, mt_error_t *err) {
    static const char *const k_vars[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "WORLD_SIZE"};
    for (size_t i = 0; i < sizeof k_vars / sizeof k_vars[0]; i++) {
        const char *v = getenv(k_vars[i]);
        if (!v || !v[0]) continue;
        char *end;
        const long n = strtol(v, &end, 10);
        if (*end == '\0' && n == r->size) continue;
        return mt_error_set(err, MT_ERR_CONFIG,
                            "environment variable %s=%s says %s processes, but only %d joined this job (a variable "
                            "exported by hand, or left from another job?); start every process with the launcher "
                            "(e.g. mpirun -np %s), or unset %s to train in one process",
                            k_vars[i], v, v, r->size, v, k_vars[i]);
    }
    return MT_OK;
}

mt_status_t eng_ranks_open(eng_ranks_t *r, mt_error_t *err) {
    memset(r, 0, sizeof *r);
    r->size = 1;
    mt_status_t st = kern_ranks_create(&r->k, err);
    if (st != MT_OK) return st;
    r->rank = kern_ranks_rank(r->k);
    r->size = kern_ranks_size(r->k);
    r->local_rank = kern_ranks_local_rank(r->k);
    r->launcher = kern_ranks_launcher(r->k);
    st = world_size_vars(r, err);
    if (st != MT_OK) eng_ranks_close(r); /* callers close only what opened */
    return st;
}

bool eng_ranks_writes(const eng_ranks_t *r) { return r->rank == 0; }

mt_status_t eng_ranks_check_accum(const eng_ranks_t *r, int accum, int devices, mt_error_t *err) {
    if (devices < 1) devices = 1;
    if (r->size == 1 || accum % (r->size * devices) == 0) return MT_OK;
    return mt_error_set(err, MT_ERR_CONFIG,
                        "gradient_accumulation_steps (%d) must be a multiple of the ranks (%d, from %s) "
                        "times devices (%d) = %d: each rank runs an equal share of a step's micro-batches and "
                        "each of its devices an equal share of that",
                        accum, r->size, r->launcher, devices, r->size * devices);
}

mt_status_t eng_ranks_bind_device(eng_ranks_t *r, kern_device_t *dev, mt_error_t *err) {
    if (r->size == 1) return MT_OK;
    return kern_ranks_bind_device(r->k, dev, err);
}

/* What every rank must agree on before summing: the same parameter list. */
typedef struct {
    int64_t n;
    uint64_t counts_hash; /* FNV-1a over the counts (placements may differ: each rank plans for itself) */
} grads_shape_t;

static grads_shape_t shape_of(const eng_rank_grad_t *g, int n) {
    grads_shape_t s = {.n = n, .counts_hash = 1469598103934665603ull};
    for (int i = 0; i < n; i++) {
        const uint64_t v = (uint64_t)g[i].count;
        const unsigned char *b = (const unsigned char *)&v;
        for (size_t j = 0; j < sizeof v; j++) s.counts_hash = (s.counts_hash ^ b[j]) * 1099511628211ull;
    }
    return s;
}

mt_status_t eng_ranks_sum_grads(eng_ranks_t *r, eng_rank_grad_t *g, int n, mt_error_t *err) {
    if (r->size == 1) return MT_OK;
    const int R = r->size;
    grads_shape_t mine = shape_of(g, n);
    grads_shape_t *all = malloc((size_t)R * sizeof *all);
    MT_CHECK_ALLOC(all, "the ranks' gradient lists");
    kern_ranks_allgather(r->k, &mine, all, sizeof mine);
    for (int q = 0; q < R; q++)
        if (all[q].n != mine.n || all[q].counts_hash != mine.counts_hash) {
            const int64_t theirs = all[q].n;
            free(all);
            return mt_error_set(err, MT_ERR_CONFIG,
                                "rank %d has %lld trained parameters, rank %d has %lld (or their sizes differ): "
                                "every rank must open the same model with the same run config",
                                r->rank, (long long)mine.n, q, (long long)theirs);
        }
    free(all);
    /* which rank has which gradient: one byte per parameter and rank */
    const size_t nb = n > 0 ? (size_t)n : 1;
    bool *has = malloc(nb * sizeof *has), *has_all = malloc((size_t)R * nb * sizeof *has_all);
    bool *contrib = malloc((size_t)R * sizeof *contrib);
    MT_CHECK(has && has_all && contrib, "out of host memory for the ranks' gradient flags");
    for (int i = 0; i < n; i++) has[i] = g[i].has;
    kern_ranks_allgather(r->k, has, has_all, nb * sizeof *has);
    for (int i = 0; i < n; i++) {
        bool any = false;
        for (int q = 0; q < R; q++) any |= contrib[q] = has_all[(size_t)q * nb + (size_t)i];
        if (!any) continue;
        MT_CHECK(g[i].buf || g[i].count == 0, "eng_ranks_sum_grads: %s has no gradient buffer",
                 g[i].name ? g[i].name : "a parameter");
        kern_ranks_sum_f32(r->k, g[i].buf, g[i].count, g[i].on_device, contrib);
        g[i].has = true;
    }
    free(has);
    free(has_all);
    free(contrib);
    return MT_OK;
}

void eng_ranks_gather_shares(eng_ranks_t *r, void *items, size_t item_bytes, int k_global) {
    if (r->size == 1) return;
    const size_t share = (size_t)(k_global / r->size) * item_bytes;
    unsigned char *mine = malloc(share > 0 ? share : 1);
    MT_CHECK_ALLOC(mine, "this rank's share of the step's statistics");
    memcpy(mine, (unsigned char *)items + (size_t)r->rank * share, share);
    kern_ranks_allgather(r->k, mine, items, share);
    free(mine);
}

int eng_ranks_agree_max(eng_ranks_t *r, int v) { return r->size == 1 ? v : kern_ranks_max_int(r->k, v); }

void eng_ranks_barrier(eng_ranks_t *r) {
    if (r->size > 1) kern_ranks_barrier(r->k);
}

_Noreturn void eng_ranks_abort(eng_ranks_t *r, const char *msg) {
    fprintf(stderr, "moetune: rank %d of %d: error: %s\n", r->rank, r->size, msg);
    fprintf(stderr, "moetune: rank %d of %d: stopping every rank of the job\n", r->rank, r->size);
    kern_ranks_abort(r->k, 1);
}
