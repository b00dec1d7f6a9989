/* What the store's tests use to queue batches behind each other and see
 * the order the I/O thread ran them in, deterministically rather than by
 * timing.  Not for the store's users. */
#ifndef MT_STORE_STORE_TESTING_H
#define MT_STORE_STORE_TESTING_H

#include <stdbool.h>
#include <stdint.h>

#include "store/store.h"

/* While held, the store's I/O thread starts no batch (one it started goes
 * on); mt_store_close releases it. */
void mt_store_hold_io(mt_store_t *s, bool hold);
/* mt_store_wait, also giving when the I/O thread started the batch (its
 * first request handed to the disk) and finished it (its last completed),
 * as numbers of one count of such events. */
mt_status_t mt_store_wait_traced(mt_store_t *s, mt_store_ticket_t ticket, uint64_t *started, uint64_t *finished,
                                 mt_error_t *err);

#endif
