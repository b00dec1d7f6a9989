/* Safe opening of input files (see fileio.h). */
#include "base/fileio.h"

#include <errno.h>
#include <limits.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

const char *mt_file_kind(unsigned mode) {
    switch (mode & S_IFMT) {
    case S_IFREG: return "a regular file";
    case S_IFDIR: return "a directory";
    case S_IFIFO: return "a FIFO (named pipe)";
    case S_IFCHR: return "a character device";
    case S_IFBLK: return "a block device";
    case S_IFSOCK: return "a socket";
    default: return "not a regular file";
    }
}

static mt_status_t not_regular(const char *path, const char *what, unsigned mode, mt_error_t *err) {
    return mt_error_set(err, MT_ERR_IO, "%s %s is %s, not a regular file", what, path,
                        mt_file_kind(mode));
}

mt_status_t mt_open_regular(const char *path, const char *what, int *fd_out, mt_error_t *err) {
    *fd_out = -1;
    struct stat sb;
    if (stat(path, &sb) != 0)
        return mt_error_set(err, MT_ERR_IO, "%s %s: cannot open: %s", what, path, strerror(errno));
    if (!S_ISREG(sb.st_mode)) return not_regular(path, what, (unsigned)sb.st_mode, err);
    const int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0)
        return mt_error_set(err, MT_ERR_IO, "%s %s: cannot open: %s", what, path, strerror(errno));
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        const unsigned mode = (unsigned)sb.st_mode;
        close(fd);
        return not_regular(path, what, mode, err);
    }
    /* Regular files ignore O_NONBLOCK, but clear it so stdio sees a plain descriptor. */
    const int fl = fcntl(fd, F_GETFL);
    if (fl >= 0) (void)fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
    *fd_out = fd;
    return MT_OK;
}

mt_status_t mt_fopen_regular(const char *path, const char *what, FILE **fp_out, mt_error_t *err) {
    *fp_out = NULL;
    int fd;
    mt_status_t st = mt_open_regular(path, what, &fd, err);
    if (st != MT_OK) return st;
    FILE *fp = fdopen(fd, "rb");
    if (!fp) {
        const int e = errno;
        close(fd);
        return mt_error_set(err, MT_ERR_IO, "%s %s: cannot open: %s", what, path, strerror(e));
    }
    *fp_out = fp;
    return MT_OK;
}

mt_status_t mt_read_regular_file(const char *path, const char *what, size_t max_bytes, char **buf_out,
                                 size_t *len_out, mt_error_t *err) {
    *buf_out = NULL;
    *len_out = 0;
    int fd;
    mt_status_t st = mt_open_regular(path, what, &fd, err);
    if (st != MT_OK) return st;
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        close(fd);
        return mt_error_set(err, MT_ERR_IO, "%s %s: cannot stat: %s", what, path, strerror(errno));
    }
    if ((unsigned long long)sb.st_size > max_bytes) {
        close(fd);
        return mt_error_set(err, MT_ERR_IO, "%s %s is %lld bytes, over the limit of %zu bytes", what, path,
                            (long long)sb.st_size, max_bytes);
    }
    /* read up to one byte past the limit: a file that grew since the fstat is refused too */
    size_t cap = (size_t)sb.st_size + 1, len = 0;
    char *buf = malloc(cap + 1);
    MT_CHECK_ALLOC(buf, path);
    for (;;) {
        const ssize_t got = read(fd, buf + len, cap - len);
        if (got < 0) {
            const int e = errno;
            free(buf);
            close(fd);
            return mt_error_set(err, MT_ERR_IO, "%s %s: read error: %s", what, path, strerror(e));
        }
        if (got == 0) break;
        len += (size_t)got;
        if (len == cap) {
            if (cap > max_bytes) {
                free(buf);
                close(fd);
                return mt_error_set(err, MT_ERR_IO, "%s %s grew past the limit of %zu bytes while being read",
                                    what, path, max_bytes);
            }
            cap = cap * 2 < max_bytes + 1 ? cap * 2 : max_bytes + 1;
            buf = realloc(buf, cap + 1);
            MT_CHECK_ALLOC(buf, path);
        }
    }
    close(fd);
    buf[len] = '\0';
    *buf_out = buf;
    *len_out = len;
    return MT_OK;
}

mt_status_t mt_mkdirs(const char *path, mt_error_t *err) {
    char buf[PATH_MAX];
    size_t len = strlen(path);
    if (len == 0 || len >= sizeof buf) return mt_error_set(err, MT_ERR_IO, "bad directory path '%s'", path);
    memcpy(buf, path, len + 1);
    for (size_t i = 1; i <= len; i++) {
        if (buf[i] != '/' && buf[i] != '\0') continue;
        char saved = buf[i];
        buf[i] = '\0';
        if (mkdir(buf, 0755) != 0 && errno != EEXIST)
            return mt_error_set(err, MT_ERR_IO, "cannot create directory '%s': %s", buf, strerror(errno));
        buf[i] = saved;
    }
    struct stat st;
    if (stat(path, &st) != 0 || !S_ISDIR(st.st_mode))
        return mt_error_set(err, MT_ERR_IO, "'%s' exists and is not a directory", path);
    return MT_OK;
}
