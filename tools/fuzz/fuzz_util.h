/* Scratch files for the harnesses whose reader takes a path, not bytes.
 *
 * Each fuzzing process gets its own directory (in /dev/shm when there is
 * one, so that writing an input costs a memcpy, not a disk write), removed
 * when the process exits normally. */
#ifndef MOETUNE_TOOLS_FUZZ_UTIL_H
#define MOETUNE_TOOLS_FUZZ_UTIL_H

#include <stddef.h>
#include <stdint.h>

/* The process's scratch directory, created on first use; aborts if it
 * cannot be created (the harness cannot run at all then). */
const char *fz_scratch_dir(void);

/* Writes len bytes to DIR/name (replacing it) and returns the full path in
 * path (cap bytes). Aborts on failure: a full /dev/shm is not a finding. */
void fz_write_file(const char *name, const uint8_t *data, size_t len, char *path, size_t cap);

/* A NUL-terminated copy of data (malloc'd; the caller frees it). */
char *fz_strndup(const uint8_t *data, size_t len);

#endif
