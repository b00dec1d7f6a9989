/* The tables of the rank transports and device sums linked into this
 * program (ranks_registry.h).
 *
 * Globals because a registry is one: constructors write them (before main,
 * or while a shared object loads, possibly on another thread) and
 * comm_ranks.c reads them, so every access holds k_lock.  Transports are
 * kept sorted by their order, so the lookup asks them in that order. */
#include "kernels/ranks_registry.h"

#include <pthread.h>

/* More than the transports there are (MPI, TCP), with room for one more. */
enum { MAX_TRANSPORTS = 8 };

static pthread_mutex_t k_lock = PTHREAD_MUTEX_INITIALIZER;
static const kern_ranks_transport_t *k_transports[MAX_TRANSPORTS]; /* by order */
static int k_ntransports;
static const kern_ranks_device_sum_t *k_device_sums[KERN_BACKEND_COUNT]; /* by kind */

void kern_ranks_register_transport(const kern_ranks_transport_t *t) {
    MT_CHECK(t != NULL && t->name != NULL && t->launched && t->init && t->destroy && t->allgather && t->barrier &&
                 t->abort,
             "kern_ranks_register_transport: a transport entry needs a name and every function");
    pthread_mutex_lock(&k_lock);
    bool known = false;
    for (int i = 0; i < k_ntransports; i++) known = known || k_transports[i] == t;
    const bool full = !known && k_ntransports == MAX_TRANSPORTS;
    if (!known && !full) {
        int i = k_ntransports++;
        for (; i > 0 && k_transports[i - 1]->order > t->order; i--) k_transports[i] = k_transports[i - 1];
        k_transports[i] = t;
    }
    pthread_mutex_unlock(&k_lock);
    MT_CHECK(!full, "kern_ranks_register_transport: %s is a transport too many (at most %d)", t->name,
             MAX_TRANSPORTS);
}

void kern_ranks_register_device_sum(const kern_ranks_device_sum_t *d) {
    MT_CHECK(d != NULL && d->name != NULL && d->unique_id && d->create && d->destroy && d->sum_f32,
             "kern_ranks_register_device_sum: a device sum entry needs a name and every function");
    MT_CHECK((unsigned)d->kind < KERN_BACKEND_COUNT, "kern_ranks_register_device_sum: %s has kind %d (no such kind)",
             d->name, (int)d->kind);
    pthread_mutex_lock(&k_lock);
    const kern_ranks_device_sum_t *had = k_device_sums[d->kind];
    if (!had) k_device_sums[d->kind] = d;
    pthread_mutex_unlock(&k_lock);
    MT_CHECK(had == NULL || had == d, "kern_ranks_register_device_sum: two device sums for one kind (%s and %s)",
             had ? had->name : "", d->name);
}

const kern_ranks_transport_t *kern_ranks_launched_transport(void) {
    pthread_mutex_lock(&k_lock);
    const kern_ranks_transport_t *found = NULL;
    for (int i = 0; i < k_ntransports && !found; i++)
        if (k_transports[i]->launched()) found = k_transports[i];
    pthread_mutex_unlock(&k_lock);
    return found;
}

const kern_ranks_device_sum_t *kern_ranks_find_device_sum(kern_backend_kind_t kind) {
    if ((unsigned)kind >= KERN_BACKEND_COUNT) return NULL;
    pthread_mutex_lock(&k_lock);
    const kern_ranks_device_sum_t *d = k_device_sums[kind];
    pthread_mutex_unlock(&k_lock);
    return d;
}
