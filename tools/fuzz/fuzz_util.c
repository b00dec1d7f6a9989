/* Scratch files for the harnesses (see fuzz_util.h). */
#include "tools/fuzz/fuzz_util.h"

#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char g_dir[256];

static int remove_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb, (void)flag, (void)ftw;
    return remove(path);
}

static void remove_scratch(void) {
    if (g_dir[0]) nftw(g_dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
}

const char *fz_scratch_dir(void) {
    if (g_dir[0]) return g_dir;
    struct stat sb;
    const char *base = stat("/dev/shm", &sb) == 0 && S_ISDIR(sb.st_mode) ? "/dev/shm" : getenv("TMPDIR");
    snprintf(g_dir, sizeof g_dir, "%s/moetune-fuzz-XXXXXX", base ? base : "/tmp");
    if (!mkdtemp(g_dir)) {
        perror(g_dir);
        abort();
    }
    atexit(remove_scratch);
    return g_dir;
}

void fz_write_file(const char *name, const uint8_t *data, size_t len, char *path, size_t cap) {
    snprintf(path, cap, "%s/%s", fz_scratch_dir(), name);
    FILE *f = fopen(path, "wb");
    if (!f || (len && fwrite(data, 1, len, f) != len) || fclose(f) != 0) {
        perror(path);
        abort();
    }
}

char *fz_strndup(const uint8_t *data, size_t len) {
    char *s = malloc(len + 1);
    if (!s) abort();
    if (len) memcpy(s, data, len);
    s[len] = '\0';
    return s;
}
