/* Error messages and the fatal hook (see status.h). */
#include "base/status.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

mt_status_t mt_error_set(mt_error_t *err, mt_status_t code, const char *fmt, ...) {
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
        err->code = code;
    }
    return code;
}

mt_status_t mt_error_prefix(mt_error_t *err, const char *fmt, ...) {
    if (!err) return MT_OK;
    char prefix[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    char old[sizeof err->msg];
    memcpy(old, err->msg, sizeof old);
    /* prefix first, then as much of the old message as still fits */
    size_t np = strnlen(prefix, sizeof prefix);
    memcpy(err->msg, prefix, np);
    size_t room = sizeof err->msg - 1 - np;
    size_t no = strnlen(old, room);
    memcpy(err->msg + np, old, no);
    err->msg[np + no] = '\0';
    return err->code;
}

const char *mt_status_name(mt_status_t code) {
    switch (code) {
    case MT_OK: return "ok";
    case MT_ERR_IO: return "io error";
    case MT_ERR_FORMAT: return "format error";
    case MT_ERR_CONFIG: return "config error";
    case MT_ERR_UNSUPPORTED: return "unsupported";
    case MT_ERR_BUDGET: return "over budget";
    case MT_ERR_DEVICE: return "device error";
    case MT_ERR_NOMEM: return "out of memory";
    case MT_ERR_DATA: return "data error";
    case MT_ERR_INTERNAL: return "internal error";
    }
    return "unknown error";
}

static void default_fatal_hook(const char *msg) {
    fprintf(stderr, "moetune: fatal: %s\n", msg);
    fflush(stderr);
    abort();
}

static mt_fatal_hook_fn g_fatal_hook = default_fatal_hook;

void mt_set_fatal_hook(mt_fatal_hook_fn hook) { g_fatal_hook = hook ? hook : default_fatal_hook; }

void mt_fatal(const char *file, int line, const char *fmt, ...) {
    char msg[2048];
    int n = snprintf(msg, sizeof msg, "%s:%d: ", file, line);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg + n, sizeof msg - (size_t)n, fmt, ap);
    va_end(ap);
    g_fatal_hook(msg);
    abort(); /* a hook that returns still ends here */
}
