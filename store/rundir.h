/* The run's subdirectory of a store directory, and the leftovers of killed
 * runs (internal to the store; see store.h for the rules). */
#ifndef MT_STORE_RUNDIR_H
#define MT_STORE_RUNDIR_H

#include <stddef.h>
#include <stdint.h>

#include "base/status.h"

#define STORE_RUN_PREFIX "moetune-"
#define STORE_LOCK_NAME "lock"

/* Removes every DIR/moetune-<hex>/ whose lock no live process holds (a
 * subdirectory without a lock file only when older than a minute: a run
 * may be making it right now); *removed counts them. */
mt_status_t store_rundir_sweep(const char *dir, int *removed, mt_error_t *err);
/* Makes DIR/moetune-<id>/ (path, cap) with its lock file held in *lock_fd. */
mt_status_t store_rundir_make(const char *dir, uint64_t id, char *path, size_t cap, int *lock_fd, mt_error_t *err);
/* Removes the regular files in path and path itself. */
void store_rundir_remove(const char *path);
/* planned bytes fit the budget (0: none) and the free space of dir. */
mt_status_t store_space_check(const char *dir, uint64_t planned, uint64_t budget, mt_error_t *err);

#endif
