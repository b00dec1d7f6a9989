/* SIGINT / SIGTERM during `moetune train`: the first asks the loop to stop
 * after the optimizer step it is in, save a checkpoint and exit with
 * 128 + the signal (130, 143), as shells report a process killed by it; a
 * second one exits at once (_exit), which corrupts nothing because every
 * save switches in atomically (engine/model/io/outdir.h).
 *
 * A signal handler can only set a flag, so the state is one process-wide
 * sig_atomic_t: the one global of the engine, owned here. */
#ifndef MT_ENGINE_SIGNALS_H
#define MT_ENGINE_SIGNALS_H

/* Installs the handlers (idempotent) and clears any earlier request. */
void eng_signals_install(void);
/* Puts the previous handlers back. */
void eng_signals_restore(void);
/* The signal that asked the run to stop (SIGINT or SIGTERM), or 0. */
int eng_signals_pending(void);
/* "SIGINT", "SIGTERM", or "signal N". */
const char *eng_signal_name(int sig);

#endif
