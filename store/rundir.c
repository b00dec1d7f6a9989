/* Run subdirectories and killed runs' leftovers (see rundir.h).  Liveness
 * is the lock's flock, not the pid in it: pids are reused, and the kernel
 * drops a killed process's flock for us, so a lock that can be taken
 * belongs to a run that is gone.  The pid is written for people reading
 * the directory. */
#include "store/rundir.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

static int is_run_name(const char *name) {
    const size_t np = strlen(STORE_RUN_PREFIX);
    if (strncmp(name, STORE_RUN_PREFIX, np) != 0 || strlen(name) != np + 16) return 0;
    for (const char *c = name + np; *c; c++)
        if (!((*c >= '0' && *c <= '9') || (*c >= 'a' && *c <= 'f'))) return 0;
    return 1;
}

void store_rundir_remove(const char *path) {
    DIR *d = opendir(path);
    if (d) {
        const int dfd = dirfd(d);
        struct dirent *e;
        while ((e = readdir(d)) != NULL) {
            if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
            unlinkat(dfd, e->d_name, 0); /* only files are made there; a directory stays and rmdir fails */
        }
        closedir(d);
    }
    rmdir(path);
}

/* 1: the run owning path is gone (its leftovers may go), 0: live or too young to tell. */
static int run_is_dead(const char *path) {
    char lock[4200];
    snprintf(lock, sizeof lock, "%s/%s", path, STORE_LOCK_NAME);
    const int fd = open(lock, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        struct stat st;
        return stat(path, &st) == 0 && time(NULL) - st.st_mtime > 60;
    }
    const int dead = flock(fd, LOCK_EX | LOCK_NB) == 0;
    close(fd); /* drops the lock taken just now */
    return dead;
}

mt_status_t store_rundir_sweep(const char *dir, int *removed, mt_error_t *err) {
    *removed = 0;
    DIR *d = opendir(dir);
    if (!d) return mt_error_set(err, MT_ERR_IO, "%s: cannot open the store directory: %s", dir, strerror(errno));
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (!is_run_name(e->d_name)) continue;
        char path[4096];
        if ((size_t)snprintf(path, sizeof path, "%s/%s", dir, e->d_name) >= sizeof path) continue;
        if (!run_is_dead(path)) continue;
        store_rundir_remove(path);
        (*removed)++;
    }
    closedir(d);
    return MT_OK;
}

mt_status_t store_rundir_make(const char *dir, uint64_t id, char *path, size_t cap, int *lock_fd, mt_error_t *err) {
    *lock_fd = -1;
    if ((size_t)snprintf(path, cap, "%s/%s%016" PRIx64, dir, STORE_RUN_PREFIX, id) >= cap)
        return mt_error_set(err, MT_ERR_CONFIG, "%s: store directory path too long", dir);
    if (mkdir(path, 0700) != 0)
        return mt_error_set(err, MT_ERR_IO, "%s: cannot make the run's store directory: %s", path, strerror(errno));
    /* made under another name and renamed once locked, so another run's
     * sweep never finds "lock" unlocked while this run is alive (a missing
     * lock counts only when the directory is over a minute old) */
    char lock[4200], tmp[4200];
    snprintf(lock, sizeof lock, "%s/%s", path, STORE_LOCK_NAME);
    snprintf(tmp, sizeof tmp, "%s/%s.new", path, STORE_LOCK_NAME);
    const int fd = open(tmp, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0 || flock(fd, LOCK_EX | LOCK_NB) != 0) {
        const int e = errno;
        if (fd >= 0) close(fd);
        store_rundir_remove(path);
        return mt_error_set(err, MT_ERR_IO, "%s: cannot make and lock the run's lock file: %s", lock, strerror(e));
    }
    char pid[32];
    const int n = snprintf(pid, sizeof pid, "%ld\n", (long)getpid());
    if (write(fd, pid, (size_t)n) != n || rename(tmp, lock) != 0) {
        const int e = errno;
        close(fd);
        store_rundir_remove(path);
        return mt_error_set(err, MT_ERR_IO, "%s: cannot write the lock file: %s", lock, strerror(e));
    }
    *lock_fd = fd;
    return MT_OK;
}

mt_status_t store_space_check(const char *dir, uint64_t planned, uint64_t budget, mt_error_t *err) {
    if (budget && planned > budget)
        return mt_error_set(err, MT_ERR_BUDGET,
                            "%s: the store needs %" PRIu64 " bytes (%.2f GiB) but its budget is %" PRIu64
                            " bytes (%.2f GiB)",
                            dir, planned, planned / 1073741824.0, budget, budget / 1073741824.0);
    struct statvfs vs;
    if (statvfs(dir, &vs) != 0)
        return mt_error_set(err, MT_ERR_IO, "%s: cannot read the free space: %s", dir, strerror(errno));
    const uint64_t avail = (uint64_t)vs.f_bavail * vs.f_frsize;
    if (planned > avail)
        return mt_error_set(err, MT_ERR_BUDGET,
                            "%s: the store needs %" PRIu64 " bytes (%.2f GiB) but the filesystem has %" PRIu64
                            " bytes (%.2f GiB) free",
                            dir, planned, planned / 1073741824.0, avail, avail / 1073741824.0);
    return MT_OK;
}
