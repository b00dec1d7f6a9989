/* Errors, the two kinds the house style names.
 *
 * Recoverable errors (bad config, bad checkpoint, over budget, bad data) are
 * returned as an mt_status_t with a message in an mt_error_t that the caller
 * owns: the user sees what and where, nothing crashes.  Library code never
 * calls exit().
 *
 * Fatal errors (a broken invariant, a failed CUDA/cuBLAS/NCCL call, an
 * allocation the OS refused) go through MT_CHECK / mt_fatal, which print
 * file:line and the failing call, then abort through one settable hook. */
#ifndef MT_BASE_STATUS_H
#define MT_BASE_STATUS_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" { /* included by the .cu files too */
#endif

typedef enum {
    MT_OK = 0,
    MT_ERR_IO,          /* a file could not be opened, read or written */
    MT_ERR_FORMAT,      /* a file's contents are malformed (safetensors, JSON, YAML, data) */
    MT_ERR_CONFIG,      /* a run config or model config is invalid */
    MT_ERR_UNSUPPORTED, /* valid input we do not support (model_type, dtype, feature) */
    MT_ERR_BUDGET,      /* a memory budget is too small */
    MT_ERR_DEVICE,      /* the requested device/backend is not usable */
    MT_ERR_NOMEM,       /* host memory exhausted */
    MT_ERR_DATA,        /* training data out of range (token ids, lengths) */
    MT_ERR_INTERNAL,
} mt_status_t;

typedef struct {
    mt_status_t code;
    char msg[2048];
} mt_error_t;

/* Sets err (if non-NULL) and returns code, so callers can write
 * `return mt_error_set(err, MT_ERR_IO, "%s: cannot open", path);` */
mt_status_t mt_error_set(mt_error_t *err, mt_status_t code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Prepends context ("while loading X: ") to an existing message. */
mt_status_t mt_error_prefix(mt_error_t *err, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

const char *mt_status_name(mt_status_t code);

/* Fatal path. The hook is called with the formatted message; the default
 * prints it to stderr and aborts. Tests may install a hook that longjmps. */
typedef void (*mt_fatal_hook_fn)(const char *msg);
void mt_set_fatal_hook(mt_fatal_hook_fn hook);
void mt_fatal(const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 3, 4), noreturn));

#define MT_CHECK(cond, ...)                                   \
    do {                                                      \
        if (!(cond)) mt_fatal(__FILE__, __LINE__, __VA_ARGS__); \
    } while (0)

/* Allocation that cannot fail silently: aborts through the hook naming what. */
#define MT_CHECK_ALLOC(ptr, what) \
    MT_CHECK((ptr) != NULL, "out of host memory allocating %s", (what))

#ifdef __cplusplus
}
#endif

#endif
