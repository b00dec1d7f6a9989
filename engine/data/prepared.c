/* The prepared-data cache (see prepared.h). */
#include "engine/data/prepared.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/fileio.h"

#define PREP_MAGIC "MTEXAMP1"
#define FNV_PRIME 0x100000001b3ull

eng_prep_key_t eng_prep_key_start(void) {
    return (eng_prep_key_t){{0xcbf29ce484222325ull, 0x84222325cbf29ce4ull}};
}

/* Two FNV-1a streams over the same bytes, the second fed each byte
 * rotated, so the 128 bits are not one 64-bit hash twice.  Feeding bytes
 * in pieces gives the same hash as all at once. */
void eng_prep_key_add(eng_prep_key_t *k, const void *data, size_t len) {
    const uint8_t *p = data;
    uint64_t a = k->h[0], b = k->h[1];
    for (size_t i = 0; i < len; i++) {
        a = (a ^ p[i]) * FNV_PRIME;
        b = (b ^ (uint8_t)((p[i] << 3) | (p[i] >> 5))) * FNV_PRIME;
    }
    k->h[0] = a;
    k->h[1] = b;
}

static void key_str(eng_prep_key_t *k, const char *s) { eng_prep_key_add(k, s, strlen(s) + 1); }

static void key_int(eng_prep_key_t *k, int64_t v) { eng_prep_key_add(k, &v, sizeof v); }

mt_status_t eng_prep_key_of(const char *path, const eng_dataset_entry_t *d, const eng_text_t *text, int T,
                            int vocab, eng_prep_key_t *out, mt_error_t *err) {
    eng_prep_key_t k = eng_prep_key_start();
    FILE *f;
    mt_status_t st = mt_fopen_regular(path, "data file", &f, err);
    if (st != MT_OK) return st;
    char buf[1 << 16];
    size_t got;
    while ((got = fread(buf, 1, sizeof buf, f)) > 0) eng_prep_key_add(&k, buf, got);
    const bool bad = ferror(f);
    fclose(f);
    if (bad) return mt_error_set(err, MT_ERR_IO, "%s: read error", path);
    key_str(&k, PREP_MAGIC);
    key_int(&k, T);
    key_int(&k, vocab);
    if (d) {
        key_int(&k, d->type);
        key_str(&k, d->field);
        key_str(&k, d->field_messages);
        key_str(&k, d->role_key);
        key_str(&k, d->content_key);
        for (int i = 0; i < d->num_roles_to_train; i++) key_str(&k, d->roles_to_train[i]);
        key_int(&k, d->train_on_eos);
    }
    if (text) eng_prep_key_add(&k, text->fingerprint, sizeof text->fingerprint);
    *out = k;
    return MT_OK;
}

static void file_of(char *out, size_t cap, const char *dir, const eng_prep_key_t *k) {
    snprintf(out, cap, "%s/%016" PRIx64 "%016" PRIx64 ".examples", dir, k->h[0], k->h[1]);
}

typedef struct {
    char magic[8];
    uint64_t key[2];
    int64_t n, ntok, untrained;
} prep_header_t;

/* Bytes of the arrays after the header: off (n+1), ids, labels (ntok
 * int32), mask (ntok), line (n int64), then the checksum. */
static size_t payload_bytes(int64_t n, int64_t ntok) {
    return (size_t)(n + 1) * 8 + (size_t)ntok * 9 + (size_t)n * 8;
}

bool eng_prep_load(const char *dir, const eng_prep_key_t *k, eng_examples_t *ex, int file, char *note, size_t cap) {
    char path[1400];
    file_of(path, sizeof path, dir, k);
    note[0] = '\0';
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return false;
    struct stat sb;
    prep_header_t h;
    const bool sized = fstat(fd, &sb) == 0 && (size_t)sb.st_size >= sizeof h + 8;
    void *map = sized ? mmap(NULL, (size_t)sb.st_size, PROT_READ, MAP_PRIVATE, fd, 0) : MAP_FAILED;
    close(fd);
    if (map == MAP_FAILED) {
        snprintf(note, cap, "%s: unreadable or too short; tokenizing again", path);
        return false;
    }
    memcpy(&h, map, sizeof h);
    const uint8_t *p = (const uint8_t *)map + sizeof h;
    bool ok = memcmp(h.magic, PREP_MAGIC, 8) == 0 && h.key[0] == k->h[0] && h.key[1] == k->h[1] && h.n >= 0 &&
              h.ntok >= 0 && h.n < (int64_t)1 << 40 && h.ntok < (int64_t)1 << 44 &&
              sizeof h + payload_bytes(h.n, h.ntok) + 8 == (size_t)sb.st_size;
    if (ok) {
        eng_prep_key_t c = eng_prep_key_start();
        eng_prep_key_add(&c, map, (size_t)sb.st_size - 8);
        uint64_t want;
        memcpy(&want, (const uint8_t *)map + sb.st_size - 8, 8);
        ok = want == (c.h[0] ^ c.h[1]);
    }
    const int64_t *off = (const int64_t *)(const void *)p;
    for (int64_t e = 0; ok && e < h.n; e++) ok = off[e] <= off[e + 1] && off[h.n] == h.ntok && off[0] == 0;
    if (ok) {
        const int32_t *ids = (const int32_t *)(const void *)(p + (size_t)(h.n + 1) * 8);
        const int32_t *labels = ids + h.ntok;
        const uint8_t *mask = (const uint8_t *)(labels + h.ntok);
        const uint8_t *lines = mask + h.ntok;
        for (int64_t e = 0; e < h.n; e++) {
            int64_t line;
            memcpy(&line, lines + (size_t)e * 8, 8);
            eng_examples_add(ex, ids + off[e], labels + off[e], mask + off[e], off[e + 1] - off[e], file, line);
        }
        ex->untrained += h.untrained;
    } else {
        snprintf(note, cap, "%s fails its checks (truncated or changed); tokenizing again", path);
    }
    munmap(map, (size_t)sb.st_size);
    return ok;
}

static bool write_all(FILE *f, const void *p, size_t n, eng_prep_key_t *sum) {
    eng_prep_key_add(sum, p, n);
    return fwrite(p, 1, n, f) == n;
}

mt_status_t eng_prep_save(const char *dir, const eng_prep_key_t *k, const eng_examples_t *ex, int64_t first,
                          int64_t untrained, mt_error_t *err) {
    mt_status_t st = mt_mkdirs(dir, err);
    if (st != MT_OK) return mt_error_prefix(err, "dataset_prepared_path: ");
    char path[1400], tmp[1500];
    file_of(path, sizeof path, dir, k);
    snprintf(tmp, sizeof tmp, "%s.tmp-%ld", path, (long)getpid());
    FILE *f = fopen(tmp, "wb");
    if (!f) return mt_error_set(err, MT_ERR_IO, "dataset_prepared_path: %s: %s", tmp, strerror(errno));
    const int64_t n = ex->n - first, base = ex->off[first], ntok = ex->off[ex->n] - base;
    prep_header_t h = {.key = {k->h[0], k->h[1]}, .n = n, .ntok = ntok, .untrained = untrained};
    memcpy(h.magic, PREP_MAGIC, 8);
    eng_prep_key_t sum = eng_prep_key_start();
    bool ok = write_all(f, &h, sizeof h, &sum);
    for (int64_t e = 0; ok && e <= n; e++) {
        const int64_t o = ex->off[first + e] - base;
        ok = write_all(f, &o, 8, &sum);
    }
    ok = ok && write_all(f, ex->ids + base, (size_t)ntok * 4, &sum) && write_all(f, ex->labels + base, (size_t)ntok * 4, &sum) &&
         write_all(f, ex->mask + base, (size_t)ntok, &sum) && write_all(f, ex->line + first, (size_t)n * 8, &sum);
    const uint64_t check = sum.h[0] ^ sum.h[1];
    ok = ok && fwrite(&check, 8, 1, f) == 1;
    ok = fflush(f) == 0 && ok && fsync(fileno(f)) == 0;
    const int saved_errno = errno;
    fclose(f);
    if (!ok || rename(tmp, path) != 0) {
        unlink(tmp);
        return mt_error_set(err, MT_ERR_IO, "dataset_prepared_path: writing %s: %s", path,
                            strerror(ok ? errno : saved_errno));
    }
    return MT_OK;
}
