/* Which moetune this is: version, git commit, build kind, backends and the
 * CPU features the CPU backend dispatches to on this machine.
 *
 * `moetune --version` prints it, and every benchmark prints the same line
 * (`mt_build_info_line`) at the top of its report, so a number can always be
 * traced to the code and the machine that produced it. */
#ifndef MOETUNE_TOOLS_BUILD_INFO_H
#define MOETUNE_TOOLS_BUILD_INFO_H

#include <stddef.h>
#include <stdio.h>

/* The one place the version number is written. */
#define MT_VERSION "0.3.0"

/* The git commit the binary was built from (stamped by Bazel's
 * --workspace_status_command), "unknown" when built without git. */
const char *mt_build_commit(void);

/* "optimised", or "sanitised (ASan+UBSan)" when built with --config=asan. */
const char *mt_build_kind(void);

/* The backends compiled into the binary, e.g. "CPU, CUDA". */
const char *mt_build_backends(void);

/* Writes the CPU features detected at run time that the CPU backend's
 * kernels choose between, e.g. "AVX2 AVX-512F AVX512_BF16", or "none". */
void mt_build_cpu_features(char *buf, size_t cap);

/* The whole line, without a newline:
 * "moetune 0.3.0 (commit 1a2b3c, optimised; backends CPU, CUDA; CPU AVX2 AVX-512F)". */
void mt_build_info_line(char *buf, size_t cap);

/* Prints the line and a newline to f. */
void mt_build_info_print(FILE *f);

#endif
