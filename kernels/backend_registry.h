/* How a device backend joins the device layer (device.h) without the layer
 * naming it: the backend registers an entry (its kind, name, probe and
 * create function) and kern_device_create looks the kind up here.  The
 * layer itself links no backend; the program that links one chooses it.
 *
 * Registration happens on link.  Each backend's Bazel library is
 * `alwayslink = 1` and registers from a constructor function
 * (__attribute__((constructor)), run before main or when a shared object
 * that carries the backend is loaded), so linking the library is the whole
 * choice.  An explicit kern_<backend>_register() call was the alternative;
 * it would have to be made by every program and every test that opens a
 * device, including through layers that must not name a backend (the
 * engine opens devices by kind), and a forgotten call would only show when
 * the device is opened.  Binaries and tests above the kernels link
 * //kernels/backends:cpu, :cuda (or :all) to choose.
 *
 * One backend per kind: a second entry for a kind already taken is a fatal
 * error naming both (two copies of a backend linked into one program);
 * the same entry registered again is ignored. */
#ifndef MT_KERNELS_BACKEND_REGISTRY_H
#define MT_KERNELS_BACKEND_REGISTRY_H

#include <stdbool.h>
#include <stddef.h>

#include "base/status.h"
#include "kernels/device.h"

typedef struct {
    kern_backend_kind_t kind;
    const char *name; /* for messages; kern_backend_kind_name(kind) */
    /* Whether a device of this backend can be opened on this machine, with
     * the reason in `why` (truncated to why_len, always terminated) when
     * not; never aborts.  NULL: always. */
    bool (*probe)(char *why, size_t why_len);
    /* Opens a device: the backend's part of kern_device_create (device.c
     * then reserves the arena and sets up stream-ordered frees). */
    mt_status_t (*create)(const kern_device_opts_t *opts, kern_device_t **out, mt_error_t *err);
} kern_backend_t;

/* Adds `b` (which must outlive the program: a static const entry) to the
 * registry; called from the backend's constructor. */
void kern_backend_register(const kern_backend_t *b);

/* The backend registered for `kind`; NULL when none is linked. */
const kern_backend_t *kern_backend_find(kern_backend_kind_t kind);

/* "cpu" or "cuda" (the kinds' names in run configs and messages); "?" for
 * a value that is no kind. */
const char *kern_backend_kind_name(kern_backend_kind_t kind);

/* The names of the registered backends, comma separated ("cpu, cuda"), or
 * "none"; truncated to cap, always terminated. */
void kern_backend_names(char *buf, size_t cap);

#endif
