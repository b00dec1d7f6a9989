/* Safe opening of input files (see fileio.h). */
#include "base/fileio.h"

#include <errno.h>
#include <fcntl.h>
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
