/* The table of the device backends linked into this program
 * (backend_registry.h).
 *
 * The table is the device layer's one global, which is what a registry is
 * for: backends' constructors write it (before main, or while a shared
 * object loads, possibly on another thread) and kern_device_create reads it
 * from any thread, so every access holds k_lock. */
#include "kernels/backend_registry.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>

static pthread_mutex_t k_lock = PTHREAD_MUTEX_INITIALIZER;
static const kern_backend_t *k_backends[KERN_BACKEND_COUNT]; /* by kind; NULL: none linked */

const char *kern_backend_kind_name(kern_backend_kind_t kind) {
    switch (kind) {
    case KERN_BACKEND_CPU: return "cpu";
    case KERN_BACKEND_CUDA: return "cuda";
    default: return "?";
    }
}

void kern_backend_register(const kern_backend_t *b) {
    MT_CHECK(b != NULL && b->name != NULL && b->create != NULL,
             "kern_backend_register: a backend entry needs a name and a create function");
    MT_CHECK((unsigned)b->kind < KERN_BACKEND_COUNT, "kern_backend_register: backend %s has kind %d (no such kind)",
             b->name, (int)b->kind);
    pthread_mutex_lock(&k_lock);
    const kern_backend_t *had = k_backends[b->kind];
    if (!had) k_backends[b->kind] = b;
    pthread_mutex_unlock(&k_lock);
    MT_CHECK(had == NULL || had == b,
             "kern_backend_register: two %s backends are linked into this program (%s and %s): link one "
             "backend library per kind",
             kern_backend_kind_name(b->kind), had ? had->name : "", b->name);
}

const kern_backend_t *kern_backend_find(kern_backend_kind_t kind) {
    if ((unsigned)kind >= KERN_BACKEND_COUNT) return NULL;
    pthread_mutex_lock(&k_lock);
    const kern_backend_t *b = k_backends[kind];
    pthread_mutex_unlock(&k_lock);
    return b;
}

void kern_backend_names(char *buf, size_t cap) {
    if (cap == 0) return;
    buf[0] = '\0';
    size_t n = 0;
    for (int k = 0; k < KERN_BACKEND_COUNT; k++) {
        const kern_backend_t *b = kern_backend_find((kern_backend_kind_t)k);
        if (!b) continue;
        const int w = snprintf(buf + n, cap - n, "%s%s", n ? ", " : "", b->name);
        if (w < 0 || (size_t)w >= cap - n) return; /* truncated, terminated by snprintf */
        n += (size_t)w;
    }
    if (n == 0) snprintf(buf, cap, "none");
}
