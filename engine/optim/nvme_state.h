/* Host AdamW state on the NVMe tier: the optimizer state of the parameters
 * whose block the plan keeps there (sched_block_plan_t.nvme_optim) kept in
 * the store (store/store.h) instead of host memory, and streamed in and out
 * around each update: the AdamW moments m and v, and the fp32 master too
 * where the host keeps a bf16 working copy beside it (eng_param_t.work_bf16,
 * what the device computes with; a run in fp32 streams its master as the
 * weights' home, which stays in host memory).  Where the plan streams a
 * block's weights from NVMe (nvme_weights), their homes live there too:
 * trained parameters' bf16 working copies, and a LoRA run's frozen base.
 *
 * A parameter's state is one extent: its master (fp32, padded to 64 bytes)
 * when the store holds it, then its moments' one allocation in the run's
 * moment format (kern_moments_bytes: fp32, bf16 or 8-bit, m | v | scales,
 * each part 64-byte aligned).  The host worker reads a block's extents as
 * one batch before the block's update and writes them back as one after
 * it, every request of the batch in flight together.  While one block
 * updates, the next queued block's batch is read in the background
 * (eng_optim_nvme_prefetch) and the blocks before it are written back in
 * the background: an unload hands its buffers to the tier with the write
 * and returns at once; the tier frees them when the write is waited for.
 * While loaded, the parameter's host_mom (and host_w, for a master in the
 * store) point into one aligned buffer; unloading sets them to NULL again.
 * Host memory so holds the state of at most ENG_NVME_MAX_WRITES + 2
 * blocks: the one updating, the one read ahead, and those being written
 * (the simulator's host AdamW keeps a block's state until its write ends
 * too, scheduler/simulate_core.c).  The arithmetic is the host optimizer's
 * own, on the same values: a run trains bit-identically with or without
 * the tier.
 *
 * Ordering: the store refuses a read of an extent a batch in flight writes,
 * and counts a write as done only once it is waited for (store/store.h),
 * so every read of a parameter (a load, a read ahead, a fetch's working
 * copies) first waits for the write in flight of that parameter
 * (eng_optim_nvme_t.pending), and a write of parameters a read ahead
 * covers first drops that read.  Writes in flight are bounded: the store
 * takes MT_STORE_MAX_BATCHES at once, one of them the read ahead and one a
 * synchronous read, and an unload that finds ENG_NVME_MAX_WRITES in flight
 * first waits for the oldest.
 *
 * A frozen parameter (a LoRA run's base) has no state, only a home where
 * the plan streams its block's weights from NVMe: written once when the
 * store opens (base.bin), its host copy then let go, read by every fetch
 * and never written back.
 *
 * A master is written to its extent when the store opens, and host_w freed.
 * A parameter without one, never stepped, has no extent written: loading it
 * gives zero moments, as torch's lazily created state.  The host worker and the executor's
 * thread both use the state (updates, checkpoint reads and writes), one at
 * a time under its lock; the worker cannot return a status, so its first
 * failure is kept (eng_optim_nvme_error) and the next optimizer step
 * reports it.  A write back fails where it is waited for: the call that
 * waits returns the failure and the tier keeps it; its parameters count
 * as lost (what the store holds of them is older), so a later load of one
 * is that failure too, never stale state.  eng_optim_nvme_drain waits for
 * every write (before a save reads the state, at the end of a run); the
 * files are scratch, so nothing durable waits on them otherwise. */
#ifndef MT_ENGINE_OPTIM_NVME_STATE_H
#define MT_ENGINE_OPTIM_NVME_STATE_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "base/status.h"
#include "engine/model/model.h"
#include "store/store.h"

/* What the store moved for the tier so far: bytes (a write's once it
 * succeeded), and seconds its callers spent waiting on reads and on
 * writes (submitting them, and waiting for a read ahead or a write back
 * that had not ended yet: what the background did not hide). */
typedef struct {
    uint64_t read_bytes, write_bytes;
    double read_s, write_s;
    uint64_t loads, loads_read_ahead; /* block loads, and those that found their state read ahead */
} eng_nvme_io_t;

/* Writes of the tier's state in flight at once: the store's batches less
 * the read ahead and one synchronous read (a load that found nothing read
 * ahead, a fetch's working copies). */
enum { ENG_NVME_MAX_WRITES = MT_STORE_MAX_BATCHES - 2 };

/* One block's state being written back (eng_optim_nvme_unload_many): the
 * batch in flight and the buffers it writes from, the tier's until the
 * batch is waited for, then freed. */
typedef struct {
    int *idx, n;              /* the parameters it writes */
    void **buf;               /* nbuf: each one's state buffer, and its working copy's */
    int nbuf;
    uint64_t bytes;           /* the extents' bytes, counted in eng_nvme_io_t once written */
    mt_store_ticket_t ticket; /* the store's batch (0: the slot is free) */
} eng_nvme_write_t;

/* One block's state read ahead (eng_optim_nvme_prefetch): the batch in
 * flight and the buffers it lands in, handed to the load that asks for
 * exactly these parameters. */
typedef struct {
    int *idx, n;            /* the parameters, in the order the load will ask for them */
    char **buf, **home;     /* per entry: the state's buffer, the working copy's (NULL: none) */
    uint64_t ticket;        /* the store's batch (0: nothing in flight) */
} eng_nvme_prefetch_t;

typedef struct eng_optim_nvme {
    mt_store_t *store;
    int num_params;
    int *extent;          /* per parameter: its [master |] m | v extent, -1: not in the store */
    bool *master;         /* per parameter: its extent starts with the fp32 master */
    int *home;            /* per parameter: the extent of its weights' home, a trained one's bf16 working
                           * copy or a frozen one's home (-1: in host memory) */
    pthread_mutex_t lock; /* one user of the store at a time */
    mt_status_t failed;   /* the first failure of the worker or of a write back (MT_OK: none), its message in err */
    mt_error_t err;
    eng_nvme_io_t io;     /* under lock */
    eng_nvme_prefetch_t pf; /* under lock */
    eng_nvme_write_t wr[ENG_NVME_MAX_WRITES]; /* under lock */
    mt_store_ticket_t *pending; /* per parameter: the write in flight of its extents (0: none); under lock */
    bool *lost;           /* per parameter: its last write back failed, the store holds older state; under lock */
} eng_optim_nvme_t;

/* A store in dir (budget bytes, 0: the free space) holding parameter i's
 * moments where in_store[i], its master too where with_master[i] (NULL:
 * none; each needs in_store and a work_bf16): written there now, host_w
 * freed; and where with_home[i] (NULL: none) the weights' home a fetch
 * streams from, written to an extent of its own: a trained parameter's
 * bf16 working copy (needs with_master; work_bf16 freed, written back by
 * every update), or a frozen one's home as the base keeps it (without
 * in_store: its quantised bytes, bf16 home or fp32 weights, freed or, in
 * the checkpoint's mapping, let go; never written again).  The planned
 * bytes are checked against the budget and the disk before anything is
 * reserved.  On failure every master, working copy and frozen home is
 * back in host memory. */
mt_status_t eng_optim_nvme_open(eng_optim_nvme_t **out, eng_model_t *m, const bool *in_store, const bool *with_master,
                                const bool *with_home, const char *dir, uint64_t budget, mt_error_t *err);
/* Waits for the writes in flight (a failure is dropped with the files), then closes the store. */
void eng_optim_nvme_free(eng_optim_nvme_t *nv);

/* The bytes of disk the state of in_store's parameters takes. */
uint64_t eng_optim_nvme_planned_bytes(const eng_model_t *m, const bool *in_store, const bool *with_master,
                                      const bool *with_home);
bool eng_optim_nvme_holds(const eng_optim_nvme_t *nv, int i);
bool eng_optim_nvme_holds_master(const eng_optim_nvme_t *nv, int i);
bool eng_optim_nvme_holds_home(const eng_optim_nvme_t *nv, int i);
/* Of those, a frozen parameter's home (a LoRA run's base): read, never written back. */
bool eng_optim_nvme_holds_base_home(const eng_optim_nvme_t *nv, int i);

/* A fetch of weights whose home is on the tier: the bytes of parameter
 * i's home, as the fetch copies them to the device unconverted (a bf16
 * working copy, a frozen home in its working dtype, a quantised base's
 * packed bytes); its share of the caller's buffer (4 KiB aligned,
 * mt_sio_buffer_alloc); and the homes of idx[0..n) read into consecutive
 * shares of buf, one batch (after their writes in flight), every read
 * checked.  Loading a trained parameter (below) loads its working copy
 * too, into work_bf16, and unloading writes it back with the state. */
size_t eng_optim_nvme_home_bytes(const eng_model_t *m, int i);
size_t eng_optim_nvme_home_buffer_bytes(const eng_model_t *m, int i);
void *eng_optim_nvme_buffer_alloc(size_t bytes); /* aligned for the store, zeroed; NULL: out of memory */
void eng_optim_nvme_buffer_free(void *buf);
mt_status_t eng_optim_nvme_read_homes(eng_optim_nvme_t *nv, const eng_model_t *m, const int *idx, int n, char *buf,
                                      mt_error_t *err);

/* The state of parameters idx[0..n) into their host_mom (zeros before a
 * first step) and, for a master in the store, host_w, read as one batch:
 * every request in flight together, after their writes in flight. */
mt_status_t eng_optim_nvme_load_many(eng_optim_nvme_t *nv, eng_model_t *m, const int *idx, int n, mt_error_t *err);
/* Starts reading the state of parameters idx[0..n) in the background, as
 * eng_optim_nvme_load_many will ask for it next; one read ahead at a time
 * (a second while one is pending is ignored).  A load of other parameters
 * first waits for it and drops it.  Failures surface at that load. */
void eng_optim_nvme_prefetch(eng_optim_nvme_t *nv, const eng_model_t *m, const int *idx, int n);

/* Writes them back as one batch in the background when write (the
 * buffers go with it, the tier frees them once it is waited for), else
 * frees them; either way host_mom, and host_w of a master in the store,
 * are NULL after.  Returns at once, after waiting for the oldest write
 * when ENG_NVME_MAX_WRITES are in flight: a failure returned is that one's
 * (or a refused submit); err may be NULL when !write. */
mt_status_t eng_optim_nvme_unload_many(eng_optim_nvme_t *nv, eng_model_t *m, const int *idx, int n, bool write,
                                       mt_error_t *err);
/* The same for one parameter i. */
mt_status_t eng_optim_nvme_load(eng_optim_nvme_t *nv, eng_model_t *m, int i, mt_error_t *err);
mt_status_t eng_optim_nvme_unload(eng_optim_nvme_t *nv, eng_model_t *m, int i, bool write, mt_error_t *err);

/* Waits for every write in flight; returns the tier's kept failure
 * (eng_optim_nvme_error), theirs included.  MT_OK for NULL. */
mt_status_t eng_optim_nvme_drain(eng_optim_nvme_t *nv, mt_error_t *err);

/* The tier's traffic so far (zeros for NULL). */
eng_nvme_io_t eng_optim_nvme_io(eng_optim_nvme_t *nv);

/* Records a failure in the background, the worker's or a fetch's read into
 * staging (kept unless one is already; MT_OK records nothing); returns st. */
mt_status_t eng_optim_nvme_note(eng_optim_nvme_t *nv, mt_status_t st, const mt_error_t *err);
/* The recorded failure, copied into err (MT_OK: none). */
mt_status_t eng_optim_nvme_error(eng_optim_nvme_t *nv, mt_error_t *err);

#endif
