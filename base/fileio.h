/* Opening input files safely.
 *
 * Everything moetune reads (run configs, hardware profiles, config.json,
 * checkpoint shards and their index, data files) goes through these, so
 * that a path naming a FIFO, a device, a socket or a directory is an error
 * that says what it is instead of a hang in open() (a FIFO with no writer)
 * or a read error later.  The path is checked with stat() before opening,
 * opened with O_NONBLOCK (so even a FIFO swapped in after the stat cannot
 * block), and checked again with fstat() on the open descriptor, which is
 * what is actually read. */
#ifndef MT_BASE_FILEIO_H
#define MT_BASE_FILEIO_H

#include <stdio.h>

#include "base/status.h"

/* Opens path read-only; *fd_out is a blocking descriptor of a regular file.
 * what ("run config", "data file", ...) leads the error message. */
mt_status_t mt_open_regular(const char *path, const char *what, int *fd_out, mt_error_t *err);

/* The same as a stdio stream ("rb"). */
mt_status_t mt_fopen_regular(const char *path, const char *what, FILE **fp_out, mt_error_t *err);

/* Reads the whole regular file path into *buf_out (NUL-terminated, caller
 * frees) and *len_out; a file over max_bytes is refused before it is read,
 * naming its size and the limit. */
mt_status_t mt_read_regular_file(const char *path, const char *what, size_t max_bytes, char **buf_out,
                                 size_t *len_out, mt_error_t *err);

/* "a directory", "a FIFO (named pipe)", ... for a stat mode that is not a
 * regular file. */
const char *mt_file_kind(unsigned mode);

/* mkdir -p: creates path and its missing parents (0755); an error names
 * the first one that cannot be made, or a path that exists as a file. */
mt_status_t mt_mkdirs(const char *path, mt_error_t *err);

#endif
