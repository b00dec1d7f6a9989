/* Safe outputs: paths, the run lock, atomic checkpoint directories (see
 * outdir.h).
 *
 * Durability order everywhere: a file's bytes are fsync'd before its name
 * is switched in, and the directory is fsync'd after each switch, so after
 * a power cut a name never points at missing bytes.  The manifest is the
 * last thing written into a checkpoint and the first thing a reader checks.
 *
 * MOETUNE_TEST_CRASH_AT=N (tests only) sends the process SIGKILL at the Nth
 * point of a save: after each file is complete in staging, after the
 * manifest, and after each rename of the switch, so a test can stop a save
 * at every moment that matters, deterministically; points are counted over
 * all saves of the process. */
#include "engine/model/io/outdir.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/fileio.h"

/* ---- paths -------------------------------------------------------------- */

mt_status_t eng_path_resolve(const char *path, char *out, size_t cap, mt_error_t *err) {
    char cur[PATH_MAX];
    if (path[0] == '/') {
        strcpy(cur, "/");
    } else if (!getcwd(cur, sizeof cur)) {
        return mt_error_set(err, MT_ERR_IO, "cannot read the current directory: %s", strerror(errno));
    }
    bool exists = true; /* cur is a physical path that exists */
    const char *p = path;
    while (*p) {
        while (*p == '/') p++;
        size_t l = strcspn(p, "/");
        if (l == 0) break;
        char comp[NAME_MAX + 1];
        if (l > NAME_MAX) return mt_error_set(err, MT_ERR_IO, "'%s': a path component is too long", path);
        memcpy(comp, p, l);
        comp[l] = '\0';
        p += l;
        if (strcmp(comp, ".") == 0) continue;
        if (strcmp(comp, "..") == 0) { /* cur is physical, so its parent is too */
            char *slash = strrchr(cur, '/');
            if (slash == cur) cur[1] = '\0';
            else if (slash) *slash = '\0';
            continue;
        }
        size_t n = strlen(cur);
        if (n + 1 + l + 1 > sizeof cur) return mt_error_set(err, MT_ERR_IO, "'%s': path too long", path);
        if (!(n == 1 && cur[0] == '/')) cur[n++] = '/';
        memcpy(cur + n, comp, l + 1);
        if (!exists) continue;
        struct stat sb;
        if (lstat(cur, &sb) != 0) {
            if (errno != ENOENT && errno != ENOTDIR)
                return mt_error_set(err, MT_ERR_IO, "'%s': cannot examine '%s': %s", path, cur, strerror(errno));
            exists = false; /* the rest does not exist either: appended as written */
            continue;
        }
        char real[PATH_MAX];
        if (!realpath(cur, real))
            return mt_error_set(err, MT_ERR_IO, "'%s': cannot resolve '%s': %s", path, cur, strerror(errno));
        strcpy(cur, real);
    }
    if (strlen(cur) + 1 > cap) return mt_error_set(err, MT_ERR_IO, "'%s': path too long", path);
    strcpy(out, cur);
    return MT_OK;
}

/* a == b or a is a directory above b (both resolved). */
static bool path_at_or_above(const char *a, const char *b) {
    size_t n = strlen(a);
    if (n == 1 && a[0] == '/') return true;
    return strncmp(a, b, n) == 0 && (b[n] == '\0' || b[n] == '/');
}

mt_status_t eng_outdir_check_apart(const char *source, const char *out_key, const char *out_path,
                                   const char *in_key, const char *in_path, mt_error_t *err) {
    char ro[PATH_MAX], ri[PATH_MAX];
    mt_status_t st = eng_path_resolve(out_path, ro, sizeof ro, err);
    if (st == MT_OK) st = eng_path_resolve(in_path, ri, sizeof ri, err);
    if (st != MT_OK) {
        mt_error_prefix(err, "%s: %s: ", source, out_key);
        return st;
    }
    const char *how = NULL;
    if (strcmp(ro, ri) == 0) how = "is the same path as";
    else if (path_at_or_above(ri, ro)) how = "lies inside";
    else if (path_at_or_above(ro, ri)) how = "contains";
    if (!how) return MT_OK;
    return mt_error_set(err, MT_ERR_CONFIG,
                        "%s: %s '%s' (%s) %s %s '%s' (%s): moetune never writes where its inputs are; "
                        "choose an %s outside it",
                        source, out_key, out_path, ro, how, in_key, in_path, ri, out_key);
}

/* ---- small file-system helpers -------------------------------------------- */

static char *join(const char *dir, const char *name) {
    size_t n = strlen(dir) + strlen(name) + 2;
    char *p = malloc(n);
    MT_CHECK_ALLOC(p, "path");
    snprintf(p, n, "%s/%s", dir, name);
    return p;
}

static bool exists(const char *path) {
    struct stat sb;
    return lstat(path, &sb) == 0;
}

static mt_status_t fsync_path(const char *path, bool dir, mt_error_t *err) {
    int fd = open(path, (dir ? O_RDONLY | O_DIRECTORY : O_RDONLY) | O_CLOEXEC);
    if (fd < 0) return mt_error_set(err, MT_ERR_IO, "%s: cannot open to sync: %s", path, strerror(errno));
    int r = fsync(fd);
    int e = errno;
    close(fd);
    if (r != 0) return mt_error_set(err, MT_ERR_IO, "%s: fsync failed: %s", path, strerror(e));
    return MT_OK;
}

/* rm -rf of a directory moetune made (no symlinks followed: unlinkat on them). */
static void remove_tree(const char *path) {
    DIR *d = opendir(path);
    if (!d) {
        unlink(path);
        return;
    }
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0) continue;
        char *p = join(path, de->d_name);
        struct stat sb;
        if (lstat(p, &sb) == 0 && S_ISDIR(sb.st_mode)) remove_tree(p);
        else unlink(p);
        free(p);
    }
    closedir(d);
    rmdir(path);
}

static char *parent_of(const char *path) {
    char *d = strdup(path);
    MT_CHECK_ALLOC(d, "path");
    size_t n = strlen(d);
    while (n > 1 && d[n - 1] == '/') d[--n] = '\0';
    char *slash = strrchr(d, '/');
    if (!slash) strcpy(d, ".");
    else if (slash == d) d[1] = '\0';
    else *slash = '\0';
    return d;
}

static const char *base_of(const char *path, char *buf, size_t cap) {
    size_t n = strlen(path);
    while (n > 1 && path[n - 1] == '/') n--;
    size_t b = n;
    while (b > 0 && path[b - 1] != '/') b--;
    snprintf(buf, cap, "%.*s", (int)(n - b), path + b);
    return buf;
}

static atomic_uint g_tmp_counter; /* with the pid: names no other process or call uses */

void eng_outdir_tmp_name(char *out, size_t cap, const char *dir, const char *stem) {
    unsigned n = atomic_fetch_add(&g_tmp_counter, 1) + 1;
    snprintf(out, cap, "%s/.%s%s%d-%u", dir, stem, ENG_OUTDIR_TMP_TAG, (int)getpid(), n);
}

/* Writes text to a unique temporary name in dir, fsyncs it, renames it to dir/name. */
static mt_status_t write_small_file(const char *dir, const char *name, const char *text, mt_error_t *err) {
    char tmp[PATH_MAX];
    eng_outdir_tmp_name(tmp, sizeof tmp, dir, name);
    char *path = join(dir, name);
    mt_status_t st = MT_OK;
    FILE *f = fopen(tmp, "wb");
    if (!f) {
        st = mt_error_set(err, MT_ERR_IO, "%s: cannot create: %s", tmp, strerror(errno));
    } else {
        size_t len = strlen(text);
        bool ok = fwrite(text, 1, len, f) == len && fflush(f) == 0 && fsync(fileno(f)) == 0;
        int e = errno;
        if (fclose(f) != 0) ok = false;
        if (!ok) st = mt_error_set(err, MT_ERR_IO, "%s: write failed: %s", tmp, strerror(e));
        else if (rename(tmp, path) != 0)
            st = mt_error_set(err, MT_ERR_IO, "%s: cannot rename to %s: %s", tmp, path, strerror(errno));
        if (st != MT_OK) unlink(tmp);
    }
    free(path);
    return st;
}

/* ---- the run lock ------------------------------------------------------- */

static void own_command_line(char *buf, size_t cap) {
    buf[0] = '\0';
    FILE *f = fopen("/proc/self/cmdline", "rb");
    if (!f) return;
    size_t n = fread(buf, 1, cap - 1, f);
    fclose(f);
    buf[n] = '\0';
    for (size_t i = 0; i + 1 < n; i++)
        if (buf[i] == '\0') buf[i] = ' ';
}

static void iso_now(char *buf, size_t cap) {
    time_t t = time(NULL);
    struct tm tm;
    gmtime_r(&t, &tm);
    strftime(buf, cap, "%Y-%m-%dT%H:%M:%SZ", &tm);
}

mt_status_t eng_outdir_lock(eng_outdir_lock_t *l, const char *dir, mt_error_t *err) {
    l->fd = -1;
    mt_status_t st = mt_mkdirs(dir, err);
    if (st != MT_OK) return st;
    char *path = join(dir, ENG_OUTDIR_LOCK_FILE);
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) {
        st = mt_error_set(err, MT_ERR_IO, "%s: cannot open the run lock: %s", path, strerror(errno));
        free(path);
        return st;
    }
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        int e = errno;
        char holder[1024] = "";
        /* the holder writes its line right after locking: give it a moment */
        for (int tries = 0; e == EWOULDBLOCK && tries < 100 && holder[0] == '\0'; tries++) {
            ssize_t n = pread(fd, holder, sizeof holder - 1, 0);
            holder[n > 0 ? n : 0] = '\0';
            if (holder[0] == '\0') nanosleep(&(struct timespec){0, 10 * 1000 * 1000}, NULL);
        }
        size_t hl = strlen(holder);
        while (hl > 0 && holder[hl - 1] == '\n') holder[--hl] = '\0';
        for (char *c = holder; *c; c++)
            if (*c == '\n') *c = ';';
        close(fd);
        st = e == EWOULDBLOCK
                 ? mt_error_set(err, MT_ERR_IO,
                                "output_dir '%s' is in use by another moetune run (%s); wait for it to "
                                "finish or choose another output_dir",
                                dir, holder[0] ? holder : "its pid is not written yet")
                 : mt_error_set(err, MT_ERR_IO, "%s: cannot lock: %s", path, strerror(e));
        free(path);
        return st;
    }
    char cmd[700], when[40], line[900];
    own_command_line(cmd, sizeof cmd);
    iso_now(when, sizeof when);
    int n = snprintf(line, sizeof line, "pid %d, since %s: %s\n", (int)getpid(), when, cmd);
    if (ftruncate(fd, 0) != 0 || pwrite(fd, line, (size_t)n, 0) != n) {
        st = mt_error_set(err, MT_ERR_IO, "%s: cannot write the run lock: %s", path, strerror(errno));
        close(fd);
        free(path);
        return st;
    }
    free(path);
    l->fd = fd;
    return MT_OK;
}

void eng_outdir_unlock(eng_outdir_lock_t *l) {
    if (l->fd < 0) return;
    /* emptied first: a holder line is only ever read while its holder lives */
    if (ftruncate(l->fd, 0) != 0) { /* harmless: the line is stale, the lock is what counts */
    }
    close(l->fd);
    l->fd = -1;
}

/* ---- the manifest --------------------------------------------------------- */

/* The id a safetensors file carries in __metadata__, or "" (header only is read). */
static void st_save_id(const char *path, char *id, size_t cap) {
    id[0] = '\0';
    FILE *f = fopen(path, "rb");
    if (!f) return;
    uint8_t lb[8];
    uint64_t hl = 0;
    if (fread(lb, 1, 8, f) == 8) {
        for (int i = 0; i < 8; i++) hl |= (uint64_t)lb[i] << (8 * i);
    }
    if (hl > 0 && hl <= 100000000ull) {
        char *h = malloc(hl + 1);
        MT_CHECK_ALLOC(h, "safetensors header");
        if (fread(h, 1, hl, f) == hl) {
            h[hl] = '\0';
            json_t *root = json_loads(h, 0, NULL);
            json_t *v = json_object_get(json_object_get(root, "__metadata__"), ENG_CKPT_SAVE_ID_KEY);
            if (json_is_string(v)) snprintf(id, cap, "%s", json_string_value(v));
            json_decref(root);
        }
        free(h);
    }
    fclose(f);
}

static bool is_safetensors(const char *name) {
    size_t n = strlen(name);
    return n > 12 && strcmp(name + n - 12, ".safetensors") == 0;
}

/* Files a Hugging Face loader may take as the weights of a directory. */
static bool is_weights_file(const char *name) {
    return strcmp(name, "model.safetensors.index.json") == 0 ||
           (strncmp(name, "model", 5) == 0 && is_safetensors(name));
}

static mt_status_t write_manifest(eng_ckpt_dir_t *tx, mt_error_t *err) {
    json_t *root = json_object(), *files = json_array();
    MT_CHECK_ALLOC(root, "manifest");
    json_object_set_new(root, "format", json_string("moetune-checkpoint"));
    json_object_set_new(root, "version", json_integer(1));
    json_object_set_new(root, "save_id", json_string(tx->save_id));
    char when[40];
    iso_now(when, sizeof when);
    json_object_set_new(root, "saved_at", json_string(when));
    mt_status_t st = MT_OK;
    for (int i = 0; i < tx->file_count && st == MT_OK; i++) {
        char *p = eng_ckpt_dir_path(tx, tx->files[i]);
        struct stat sb;
        if (stat(p, &sb) != 0) st = mt_error_set(err, MT_ERR_IO, "%s: missing after writing: %s", p, strerror(errno));
        else st = fsync_path(p, false, err);
        free(p);
        json_t *e = json_object();
        json_object_set_new(e, "name", json_string(tx->files[i]));
        json_object_set_new(e, "bytes", json_integer((json_int_t)sb.st_size));
        json_array_append_new(files, e);
    }
    json_object_set_new(root, "files", files);
    char *text = json_dumps(root, JSON_INDENT(2));
    json_decref(root);
    MT_CHECK_ALLOC(text, "manifest");
    size_t len = strlen(text);
    char *withnl = realloc(text, len + 2);
    MT_CHECK_ALLOC(withnl, "manifest");
    memcpy(withnl + len, "\n", 2);
    if (st == MT_OK) st = write_small_file(tx->staging, ENG_CKPT_MANIFEST_FILE, withnl, err);
    free(withnl);
    return st;
}

/* Verifies dir against its manifest; sets why (cap bytes) when it does not match. */
static bool manifest_matches(const char *dir, json_t *man, char *why, size_t cap) {
    const char *id = json_string_value(json_object_get(man, "save_id"));
    json_t *files = json_object_get(man, "files");
    if (!id || !json_is_array(files)) {
        snprintf(why, cap, "%s has no save_id or files list", ENG_CKPT_MANIFEST_FILE);
        return false;
    }
    bool lists_single = false;
    size_t i;
    json_t *e;
    json_array_foreach(files, i, e) {
        const char *name = json_string_value(json_object_get(e, "name"));
        json_t *bytes = json_object_get(e, "bytes");
        if (!name || strchr(name, '/') || !json_is_integer(bytes)) {
            snprintf(why, cap, "%s: entry %zu is not {name, bytes}", ENG_CKPT_MANIFEST_FILE, i);
            return false;
        }
        if (strcmp(name, "model.safetensors") == 0) lists_single = true;
        char *p = join(dir, name);
        struct stat sb;
        char got[64];
        bool ok = stat(p, &sb) == 0;
        /* Only weights files are held to the save: they are switched in after
         * config.json and before the index, so a mix always shows in them, and
         * a user may edit config.json by hand afterwards, as with any HF model. */
        if (!ok) snprintf(why, cap, "%s is listed but missing", p);
        else if (!is_safetensors(name)) ok = true;
        else if ((json_int_t)sb.st_size != json_integer_value(bytes))
            snprintf(why, cap, "%s has %lld bytes, the manifest says %lld", p, (long long)sb.st_size,
                     (long long)json_integer_value(bytes)), ok = false;
        else if (is_safetensors(name) && (st_save_id(p, got, sizeof got), strcmp(got, id) != 0))
            snprintf(why, cap, "%s is from another save (%s, the manifest's is %s)", p,
                     got[0] ? got : "no save id", id), ok = false;
        free(p);
        if (!ok) return false;
    }
    /* the loader takes model.safetensors over an index: it must be this save's */
    char *single = join(dir, "model.safetensors");
    bool stray = !lists_single && exists(single);
    free(single);
    if (stray) {
        snprintf(why, cap, "%s/model.safetensors is not part of the save the manifest lists", dir);
        return false;
    }
    return true;
}

mt_status_t eng_ckpt_dir_check(const char *dir, mt_error_t *err) {
    char *mp = join(dir, ENG_CKPT_MANIFEST_FILE), *wp = join(dir, ENG_CKPT_WRITING_FILE);
    const bool marked = exists(wp);
    json_t *writing = marked ? json_load_file(wp, 0, NULL) : NULL;
    const char *staging = json_string_value(json_object_get(writing, "staging")); /* a name in dir */
    const char *target = json_string_value(json_object_get(writing, "target"));   /* of a staging dir */
    const long long pid = (long long)json_integer_value(json_object_get(writing, "pid"));
    mt_status_t st = MT_OK;
    char why[600] = "";
    if (exists(mp)) {
        json_error_t je;
        json_t *man = json_load_file(mp, 0, &je);
        bool ok = man && manifest_matches(dir, man, why, sizeof why);
        if (!man) snprintf(why, sizeof why, "%s is not valid JSON: %s", ENG_CKPT_MANIFEST_FILE, je.text);
        json_decref(man);
        if (!ok && marked)
            st = mt_error_set(err, MT_ERR_FORMAT,
                              "%s: not a complete checkpoint: %s; moetune (pid %lld) was switching a new "
                              "save in from %s/%s and was interrupted, so it is refused rather than loaded "
                              "mixed; the next `moetune train` with this output_dir finishes the switch",
                              dir, why, pid, dir, staging ? staging : "?");
        else if (!ok)
            st = mt_error_set(err, MT_ERR_FORMAT,
                              "%s: not a complete checkpoint: %s; its files no longer match the %s moetune "
                              "wrote with them, so it is refused rather than loaded mixed",
                              dir, why, ENG_CKPT_MANIFEST_FILE);
    } else if (marked) {
        st = mt_error_set(err, MT_ERR_FORMAT,
                          "%s: moetune (pid %lld) was writing this checkpoint and did not finish (%s is "
                          "present, %s is not): it is a leftover partial save, not a checkpoint%s%s%s",
                          dir, pid, ENG_CKPT_WRITING_FILE, ENG_CKPT_MANIFEST_FILE,
                          target ? "; the complete one, if any, is " : "",
                          target ? target : staging ? "; the next `moetune train` with this output_dir "
                                                      "finishes the switch from " : "",
                          !target && staging ? staging : "");
    }
    json_decref(writing);
    free(mp);
    free(wp);
    return st;
}

/* ---- checkpoint directories ---------------------------------------------------- */

/* The stem of a MERGE staging directory (".save.moetune-tmp-<pid>-<n>" in target). */
#define MERGE_STEM "save"

/* Counted over the whole process, so a test can reach every point of every
 * save a run makes (checkpoint-N, then the final model) with one number. */
static atomic_long g_crash_points;

static void crash_point(eng_ckpt_dir_t *tx) {
    if (tx->crash_at > 0 && atomic_fetch_add(&g_crash_points, 1) + 1 == tx->crash_at) raise(SIGKILL);
}

static void tx_free(eng_ckpt_dir_t *tx) {
    for (int i = 0; i < tx->file_count; i++) free(tx->files[i]);
    free(tx->files);
    free(tx->target);
    free(tx->staging);
    memset(tx, 0, sizeof *tx);
}

mt_status_t eng_ckpt_dir_begin(eng_ckpt_dir_t *tx, const char *target, eng_ckpt_dir_mode_t mode,
                               mt_error_t *err) {
    memset(tx, 0, sizeof *tx);
    static atomic_uint ids;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    snprintf(tx->save_id, sizeof tx->save_id, "%lld.%09ld-%d-%u", (long long)ts.tv_sec, ts.tv_nsec,
             (int)getpid(), atomic_fetch_add(&ids, 1) + 1);
    const char *ca = getenv("MOETUNE_TEST_CRASH_AT");
    tx->crash_at = ca ? strtol(ca, NULL, 10) : 0;
    tx->mode = mode;
    tx->target = strdup(target);
    MT_CHECK_ALLOC(tx->target, "path");
    char tmp[PATH_MAX], name[NAME_MAX + 1];
    mt_status_t st;
    if (mode == ENG_CKPT_DIR_MERGE) {
        st = mt_mkdirs(target, err);
        eng_outdir_tmp_name(tmp, sizeof tmp, target, MERGE_STEM);
    } else {
        char *parent = parent_of(target);
        st = mt_mkdirs(parent, err);
        eng_outdir_tmp_name(tmp, sizeof tmp, parent, base_of(target, name, sizeof name));
        free(parent);
    }
    if (st == MT_OK && mkdir(tmp, 0755) != 0)
        st = mt_error_set(err, MT_ERR_IO, "%s: cannot create the staging directory: %s", tmp, strerror(errno));
    if (st != MT_OK) {
        tx_free(tx);
        return st;
    }
    tx->staging = strdup(tmp);
    MT_CHECK_ALLOC(tx->staging, "path");
    /* a leftover staging directory is refused by readers */
    json_t *w = json_pack("{s:i, s:s}", "pid", (int)getpid(), "target", target);
    char *wt = json_dumps(w, JSON_COMPACT);
    json_decref(w);
    MT_CHECK_ALLOC(wt, "writing mark");
    st = write_small_file(tx->staging, ENG_CKPT_WRITING_FILE, wt, err);
    free(wt);
    if (st != MT_OK) eng_ckpt_dir_abort(tx);
    return st;
}

char *eng_ckpt_dir_path(const eng_ckpt_dir_t *tx, const char *name) { return join(tx->staging, name); }

void eng_ckpt_dir_add(eng_ckpt_dir_t *tx, const char *name) {
    char **f = realloc(tx->files, (size_t)(tx->file_count + 1) * sizeof *f);
    MT_CHECK_ALLOC(f, "file list");
    tx->files = f;
    tx->files[tx->file_count] = strdup(name);
    MT_CHECK_ALLOC(tx->files[tx->file_count], "file list");
    tx->file_count++;
    crash_point(tx);
}

void eng_ckpt_dir_abort(eng_ckpt_dir_t *tx) {
    if (tx->staging) remove_tree(tx->staging);
    tx_free(tx);
}

/* SWAP: staging (with its manifest, unmarked) takes target's place. */
static mt_status_t swap_in(eng_ckpt_dir_t *tx, mt_error_t *err) {
    char *parent = parent_of(tx->target);
    mt_status_t st = MT_OK;
    if (!exists(tx->target)) {
        if (rename(tx->staging, tx->target) != 0)
            st = mt_error_set(err, MT_ERR_IO, "cannot rename %s to %s: %s", tx->staging, tx->target, strerror(errno));
        else free(tx->staging), tx->staging = NULL;
    } else if (renameat2(AT_FDCWD, tx->staging, AT_FDCWD, tx->target, RENAME_EXCHANGE) == 0) {
        /* staging now holds the previous checkpoint: removed once the switch is durable */
    } else {
        /* no atomic exchange on this file system: move the previous one aside first */
        char aside[PATH_MAX], name[NAME_MAX + 1];
        eng_outdir_tmp_name(aside, sizeof aside, parent, base_of(tx->target, name, sizeof name));
        bool moved = rename(tx->target, aside) == 0;
        if (!moved) st = mt_error_set(err, MT_ERR_IO, "cannot move %s aside: %s", tx->target, strerror(errno));
        if (moved) crash_point(tx);
        if (moved && rename(tx->staging, tx->target) != 0) {
            st = mt_error_set(err, MT_ERR_IO, "cannot rename %s to %s: %s", tx->staging, tx->target, strerror(errno));
            if (rename(aside, tx->target) != 0) /* the previous one stays under `aside`: say where */
                mt_error_prefix(err, "previous checkpoint left in %s: ", aside);
        } else if (moved) {
            free(tx->staging);
            tx->staging = strdup(aside);
            MT_CHECK_ALLOC(tx->staging, "path");
        }
    }
    if (st == MT_OK) {
        crash_point(tx);
        st = fsync_path(parent, true, err);
    }
    free(parent);
    return st;
}

/* MERGE, steps after the manifest is in staging: also what recovery runs. */
static mt_status_t merge_in(const char *target, const char *staging, eng_ckpt_dir_t *tx, mt_error_t *err) {
    char *man_path = join(staging, ENG_CKPT_MANIFEST_FILE);
    json_t *man = json_load_file(man_path, 0, NULL);
    free(man_path);
    if (!man) return mt_error_set(err, MT_ERR_IO, "%s: no readable %s to switch in", staging, ENG_CKPT_MANIFEST_FILE);
    char sname[NAME_MAX + 1]; /* a name inside target: the mark stays valid wherever target is reached from */
    json_t *w = json_pack("{s:i, s:s}", "pid", (int)getpid(), "staging", base_of(staging, sname, sizeof sname));
    char *wt = json_dumps(w, JSON_COMPACT);
    json_decref(w);
    MT_CHECK_ALLOC(wt, "writing mark");
    mt_status_t st = write_small_file(target, ENG_CKPT_WRITING_FILE, wt, err);
    free(wt);
    if (st == MT_OK) st = fsync_path(target, true, err);
    if (tx && st == MT_OK) crash_point(tx);
    json_t *files = json_object_get(man, "files");
    size_t i;
    json_t *e;
    json_array_foreach(files, i, e) {
        if (st != MT_OK) break;
        const char *name = json_string_value(json_object_get(e, "name"));
        if (!name || strchr(name, '/')) continue;
        char *from = join(staging, name), *to = join(target, name);
        if (exists(from) && rename(from, to) != 0) /* absent: moved in before an interruption */
            st = mt_error_set(err, MT_ERR_IO, "cannot rename %s to %s: %s", from, to, strerror(errno));
        free(from);
        free(to);
        if (tx && st == MT_OK) crash_point(tx);
    }
    /* weights files of an earlier layout would shadow or confuse the new ones */
    DIR *d = st == MT_OK ? opendir(target) : NULL;
    struct dirent *de;
    while (d && (de = readdir(d)) != NULL) {
        if (!is_weights_file(de->d_name)) continue;
        bool listed = false;
        json_array_foreach(files, i, e) {
            const char *name = json_string_value(json_object_get(e, "name"));
            listed |= name && strcmp(name, de->d_name) == 0;
        }
        if (listed) continue;
        char *p = join(target, de->d_name);
        if (unlink(p) != 0 && errno != ENOENT)
            st = mt_error_set(err, MT_ERR_IO, "%s: cannot remove the earlier save's file: %s", p, strerror(errno));
        free(p);
    }
    if (d) closedir(d);
    if (st == MT_OK) st = fsync_path(target, true, err);
    if (st == MT_OK) {
        char *from = join(staging, ENG_CKPT_MANIFEST_FILE), *to = join(target, ENG_CKPT_MANIFEST_FILE);
        if (rename(from, to) != 0)
            st = mt_error_set(err, MT_ERR_IO, "cannot rename %s to %s: %s", from, to, strerror(errno));
        free(from);
        free(to);
    }
    if (st == MT_OK) st = fsync_path(target, true, err);
    if (tx && st == MT_OK) crash_point(tx);
    if (st == MT_OK) {
        char *wp = join(target, ENG_CKPT_WRITING_FILE);
        unlink(wp);
        free(wp);
        st = fsync_path(target, true, err);
    }
    json_decref(man);
    return st;
}

mt_status_t eng_ckpt_dir_commit(eng_ckpt_dir_t *tx, mt_error_t *err) {
    mt_status_t st = write_manifest(tx, err);
    if (st == MT_OK) st = fsync_path(tx->staging, true, err);
    if (st == MT_OK) crash_point(tx);
    if (st == MT_OK && tx->mode == ENG_CKPT_DIR_SWAP) {
        /* from here the staging directory is a complete checkpoint */
        char *wp = join(tx->staging, ENG_CKPT_WRITING_FILE);
        unlink(wp);
        free(wp);
        st = fsync_path(tx->staging, true, err);
        if (st == MT_OK) st = swap_in(tx, err);
    } else if (st == MT_OK) {
        st = merge_in(tx->target, tx->staging, tx, err);
    }
    if (st != MT_OK) mt_error_prefix(err, "saving %s: ", tx->target);
    /* after a failed MERGE switch the staging files are what recovery needs */
    if (st == MT_OK || tx->mode == ENG_CKPT_DIR_SWAP) eng_ckpt_dir_abort(tx);
    else tx_free(tx);
    return st;
}

/* ---- recovery ------------------------------------------------------------- */

mt_status_t eng_outdir_recover(const char *dir, char *note, size_t note_cap, mt_error_t *err) {
    if (note && note_cap) note[0] = '\0';
    mt_status_t st = MT_OK;
    char *wp = join(dir, ENG_CKPT_WRITING_FILE);
    json_t *w = exists(wp) ? json_load_file(wp, 0, NULL) : NULL;
    const char *sname = json_string_value(json_object_get(w, "staging"));
    char *staging = sname && !strchr(sname, '/') && strstr(sname, ENG_OUTDIR_TMP_TAG) ? join(dir, sname) : NULL;
    char *keep = NULL; /* the staging directory being finished is not swept below */
    if (staging) {
        char *man = join(staging, ENG_CKPT_MANIFEST_FILE);
        bool complete = exists(man);
        free(man);
        if (complete) {
            st = merge_in(dir, staging, NULL, err);
            if (st == MT_OK && note)
                snprintf(note, note_cap, "moetune: finished switching in the save an interrupted run left in %s",
                         staging);
        } else if (note) {
            snprintf(note, note_cap, "moetune: %s marks an unfinished save without its files; removing the mark", wp);
        }
        if (st == MT_OK && !complete) unlink(wp);
        if (st != MT_OK) keep = strdup(staging);
    } else if (w || exists(wp)) {
        unlink(wp); /* a mark without a staging directory guards nothing */
    }
    json_decref(w);
    free(wp);
    free(staging);
    DIR *d = opendir(dir);
    struct dirent *de;
    while (d && (de = readdir(d)) != NULL) {
        const char *tag = strstr(de->d_name, ENG_OUTDIR_TMP_TAG);
        if (!tag) continue;
        char *p = join(dir, de->d_name);
        /* A SWAP killed between its two renames (file systems without an atomic
         * exchange) leaves NAME missing and complete checkpoints beside it: one
         * goes back to NAME instead of being deleted with the rest. */
        char name[NAME_MAX + 1];
        snprintf(name, sizeof name, "%.*s", (int)(tag - de->d_name - 1), de->d_name + 1);
        char *np = de->d_name[0] == '.' && name[0] && strcmp(name, MERGE_STEM) != 0 ? join(dir, name) : NULL;
        mt_error_t cerr = {0};
        char *man = join(p, ENG_CKPT_MANIFEST_FILE);
        if (np && !exists(np) && exists(man) && eng_ckpt_dir_check(p, &cerr) == MT_OK && rename(p, np) == 0) {
            if (note) snprintf(note, note_cap, "moetune: restored %s from %s, left by an interrupted save", np, p);
        } else if (!keep || strcmp(keep, p) != 0) {
            remove_tree(p); /* ours, and no run but us writes here */
        }
        free(man);
        free(np);
        free(p);
    }
    if (d) closedir(d);
    free(keep);
    return st;
}
