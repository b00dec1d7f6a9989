/* engine/outdir on its own, in $TEST_TMPDIR: path resolution and overlap in
 * every spelling, the run lock against another process, SWAP and MERGE
 * transactions (what a reader sees at each step), a mix of two saves
 * refused, a leftover staging directory refused, and recovery finishing an
 * interrupted MERGE switch. */
#include "engine/model/io/outdir.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

typedef struct {
    int failures;
    char root[512];
} tctx_t;

#define EXPECT(t, cond, ...)                                                \
    do {                                                                    \
        if (!(cond)) {                                                      \
            fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond); \
            fprintf(stderr, __VA_ARGS__);                                   \
            fprintf(stderr, "\n");                                          \
            (t)->failures++;                                                \
        }                                                                   \
    } while (0)

static void put(const char *path, const char *text) {
    FILE *f = fopen(path, "wb");
    if (!f) {
        perror(path);
        exit(2);
    }
    fputs(text, f);
    fclose(f);
}

static char *get(const char *path) {
    static char buf[4096];
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    return buf;
}

/* A minimal safetensors file: one F32 scalar, with the save id in its metadata. */
static void put_st(const char *path, const char *save_id, float v) {
    char hdr[256];
    int n = snprintf(hdr, sizeof hdr,
                     "{\"__metadata__\":{\"format\":\"pt\",\"" ENG_CKPT_SAVE_ID_KEY "\":\"%s\"},"
                     "\"w\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,4]}}",
                     save_id);
    while (n % 8) hdr[n++] = ' ';
    FILE *f = fopen(path, "wb");
    unsigned char len[8] = {0};
    for (int i = 0; i < 8; i++) len[i] = (unsigned char)((unsigned long long)n >> (8 * i));
    fwrite(len, 1, 8, f);
    fwrite(hdr, 1, (size_t)n, f);
    fwrite(&v, 4, 1, f);
    fclose(f);
}

/* One transaction: config.json and model.safetensors holding v. */
static mt_status_t save(const char *dir, eng_ckpt_dir_mode_t mode, float v, mt_error_t *err) {
    eng_ckpt_dir_t tx;
    mt_status_t st = eng_ckpt_dir_begin(&tx, dir, mode, err);
    if (st != MT_OK) return st;
    char *p = eng_ckpt_dir_path(&tx, "config.json");
    put(p, "{\"model_type\": \"mixtral\"}\n");
    free(p);
    eng_ckpt_dir_add(&tx, "config.json");
    p = eng_ckpt_dir_path(&tx, "model.safetensors");
    put_st(p, tx.save_id, v);
    free(p);
    eng_ckpt_dir_add(&tx, "model.safetensors");
    return eng_ckpt_dir_commit(&tx, err);
}

static void test_paths(tctx_t *t) {
    char base[700], p[2400], r1[4096], r2[4096];
    mt_error_t err = {0};
    snprintf(base, sizeof base, "%s/paths/model", t->root);
    snprintf(p, sizeof p, "mkdir -p %s && ln -sfn %s %s/paths/link", base, base, t->root);
    EXPECT(t, system(p) == 0, "%s", p);
    EXPECT(t, eng_path_resolve(base, r1, sizeof r1, &err) == MT_OK, "%s", err.msg);
    const char *same[] = {"%s/paths/model/.", "%s/paths/model/", "%s/paths/./model",
                          "%s/paths/x/../model", "%s/paths/link", "%s/paths/nothere/../model"};
    for (size_t i = 0; i < sizeof same / sizeof *same; i++) {
        snprintf(p, sizeof p, same[i], t->root);
        EXPECT(t, eng_path_resolve(p, r2, sizeof r2, &err) == MT_OK && strcmp(r1, r2) == 0,
               "%s resolves to %s, not %s", p, r2, r1);
        EXPECT(t, eng_outdir_check_apart("run.yaml", "output_dir", p, "base_model", base, &err) == MT_ERR_CONFIG &&
                      strstr(err.msg, "is the same path as") && strstr(err.msg, base) && strstr(err.msg, "run.yaml"),
               "%s vs %s: %s", p, base, err.msg);
    }
    /* not yet existing below a symlink: the existing part is resolved */
    snprintf(p, sizeof p, "%s/paths/link/new/deeper", t->root);
    EXPECT(t, eng_path_resolve(p, r2, sizeof r2, &err) == MT_OK, "%s", err.msg);
    EXPECT(t, strncmp(r2, r1, strlen(r1)) == 0 && strcmp(r2 + strlen(r1), "/new/deeper") == 0, "%s", r2);
    EXPECT(t, eng_outdir_check_apart("r", "output_dir", p, "base_model", base, &err) == MT_ERR_CONFIG &&
                  strstr(err.msg, "lies inside"),
           "%s", err.msg);
    snprintf(p, sizeof p, "%s/paths", t->root);
    EXPECT(t, eng_outdir_check_apart("r", "output_dir", p, "base_model", base, &err) == MT_ERR_CONFIG &&
                  strstr(err.msg, "contains"),
           "%s", err.msg);
    /* siblings and a name that only shares a prefix are apart */
    snprintf(p, sizeof p, "%s/paths/model2", t->root);
    EXPECT(t, eng_outdir_check_apart("r", "output_dir", p, "base_model", base, &err) == MT_OK, "%s", err.msg);
    snprintf(p, sizeof p, "%s/paths/out", t->root);
    EXPECT(t, eng_outdir_check_apart("r", "output_dir", p, "base_model", base, &err) == MT_OK, "%s", err.msg);
    /* relative paths are taken from the current directory */
    char cwd[4096];
    EXPECT(t, getcwd(cwd, sizeof cwd) != NULL, "getcwd");
    snprintf(p, sizeof p, "%s/paths", t->root);
    EXPECT(t, chdir(p) == 0, "chdir");
    EXPECT(t, eng_outdir_check_apart("r", "output_dir", "model", "base_model", base, &err) == MT_ERR_CONFIG, "relative");
    EXPECT(t, eng_outdir_check_apart("r", "output_dir", "link/..", "base_model", base, &err) == MT_ERR_CONFIG,
           "link/.. is the parent of model's real directory");
    EXPECT(t, chdir(cwd) == 0, "chdir back");
}

static void test_lock(tctx_t *t) {
    char dir[700];
    snprintf(dir, sizeof dir, "%s/locked/out", t->root);
    eng_outdir_lock_t l;
    mt_error_t err = {0};
    EXPECT(t, eng_outdir_lock(&l, dir, &err) == MT_OK, "%s", err.msg);
    char pidtxt[64];
    snprintf(pidtxt, sizeof pidtxt, "pid %d,", (int)getpid());
    char lp[800];
    snprintf(lp, sizeof lp, "%s/" ENG_OUTDIR_LOCK_FILE, dir);
    const char *txt = get(lp);
    EXPECT(t, txt && strstr(txt, pidtxt), "lock file: %s", txt ? txt : "(none)");
    /* another process: refused, naming us; it exits 0 when the message is right */
    pid_t c = fork();
    if (c == 0) {
        eng_outdir_lock_t l2;
        mt_error_t e2 = {0};
        mt_status_t st = eng_outdir_lock(&l2, dir, &e2);
        _exit(st != MT_OK && strstr(e2.msg, pidtxt) && strstr(e2.msg, "in use by another moetune run") ? 0 : 1);
    }
    int ws = 0;
    waitpid(c, &ws, 0);
    EXPECT(t, WIFEXITED(ws) && WEXITSTATUS(ws) == 0, "a second process got the lock or no pid");
    eng_outdir_unlock(&l);
    c = fork();
    if (c == 0) {
        eng_outdir_lock_t l2;
        mt_error_t e2 = {0};
        mt_status_t st = eng_outdir_lock(&l2, dir, &e2);
        _exit(st == MT_OK ? 0 : 1);
    }
    waitpid(c, &ws, 0);
    EXPECT(t, WIFEXITED(ws) && WEXITSTATUS(ws) == 0, "released lock not available to another process");
}

static void test_swap(tctx_t *t) {
    char dir[700], p[800];
    mt_error_t err = {0};
    snprintf(dir, sizeof dir, "%s/swap/checkpoint-2", t->root);
    EXPECT(t, save(dir, ENG_CKPT_DIR_SWAP, 1.0f, &err) == MT_OK, "%s", err.msg);
    EXPECT(t, eng_ckpt_dir_check(dir, &err) == MT_OK, "%s", err.msg);
    snprintf(p, sizeof p, "%s/" ENG_CKPT_MANIFEST_FILE, dir);
    EXPECT(t, get(p) && strstr(get(p), "model.safetensors"), "manifest lists the weights");
    EXPECT(t, save(dir, ENG_CKPT_DIR_SWAP, 2.0f, &err) == MT_OK, "%s", err.msg);
    EXPECT(t, eng_ckpt_dir_check(dir, &err) == MT_OK, "%s", err.msg);
    /* nothing left beside it: the previous one was deleted after the switch */
    snprintf(p, sizeof p, "ls -a %s/swap | grep -q moetune-tmp", t->root);
    EXPECT(t, system(p) != 0, "leftovers in %s/swap", t->root);

    /* a staging directory abandoned mid-write is refused, naming the writer */
    eng_ckpt_dir_t tx;
    EXPECT(t, eng_ckpt_dir_begin(&tx, dir, ENG_CKPT_DIR_SWAP, &err) == MT_OK, "%s", err.msg);
    char *sp = eng_ckpt_dir_path(&tx, "model.safetensors");
    put_st(sp, tx.save_id, 3.0f);
    free(sp);
    char staging[800];
    snprintf(staging, sizeof staging, "%s", tx.staging);
    mt_status_t st = eng_ckpt_dir_check(staging, &err);
    EXPECT(t, st == MT_ERR_FORMAT && strstr(err.msg, "was writing this checkpoint and did not finish") &&
                  strstr(err.msg, dir),
           "%s", err.msg);
    eng_ckpt_dir_abort(&tx);
    struct stat sb;
    EXPECT(t, stat(staging, &sb) != 0, "abort left %s", staging);
}

static void test_merge(tctx_t *t) {
    char dir[700], p[800], q[800];
    mt_error_t err = {0};
    snprintf(dir, sizeof dir, "%s/merge/out", t->root);
    snprintf(p, sizeof p, "mkdir -p %s", dir);
    EXPECT(t, system(p) == 0, "%s", p);
    snprintf(p, sizeof p, "%s/metrics.jsonl", dir);
    put(p, "{\"step\": 1}\n");
    /* an earlier sharded layout is replaced; other files stay */
    snprintf(p, sizeof p, "%s/model-00001-of-00002.safetensors", dir);
    put_st(p, "old", 0.0f);
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", dir);
    put(p, "{}");
    EXPECT(t, save(dir, ENG_CKPT_DIR_MERGE, 1.0f, &err) == MT_OK, "%s", err.msg);
    EXPECT(t, eng_ckpt_dir_check(dir, &err) == MT_OK, "%s", err.msg);
    snprintf(p, sizeof p, "%s/metrics.jsonl", dir);
    EXPECT(t, get(p) && strcmp(get(p), "{\"step\": 1}\n") == 0, "metrics.jsonl changed");
    snprintf(p, sizeof p, "%s/model-00001-of-00002.safetensors", dir);
    snprintf(q, sizeof q, "%s/model.safetensors.index.json", dir);
    struct stat sb;
    EXPECT(t, stat(p, &sb) != 0 && stat(q, &sb) != 0, "the earlier layout's weights files remain");

    /* a weights file from another save under the manifest: refused, naming it */
    char keep[800];
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    snprintf(keep, sizeof keep, "%s/keep.bin", dir);
    EXPECT(t, rename(p, keep) == 0, "rename");
    /* same size, other id: only the save id tells them apart */
    char mpath[800], other[64] = "";
    snprintf(mpath, sizeof mpath, "%s/" ENG_CKPT_MANIFEST_FILE, dir);
    const char *m = get(mpath), *id = m ? strstr(m, "\"save_id\": \"") : NULL;
    if (id) sscanf(id + 12, "%63[^\"]", other);
    other[0] = other[0] == '9' ? '8' : '9';
    put_st(p, other, 1.0f);
    mt_status_t st = eng_ckpt_dir_check(dir, &err);
    EXPECT(t, st == MT_ERR_FORMAT && strstr(err.msg, "is from another save") && strstr(err.msg, p), "%s", err.msg);
    EXPECT(t, rename(keep, p) == 0, "rename back");
    EXPECT(t, eng_ckpt_dir_check(dir, &err) == MT_OK, "%s", err.msg);
    /* config.json edited by hand (another size) is still this save */
    snprintf(p, sizeof p, "%s/config.json", dir);
    put(p, "{\"model_type\": \"mixtral\", \"rope_theta\": 500000.0}\n");
    EXPECT(t, eng_ckpt_dir_check(dir, &err) == MT_OK, "an edited config.json: %s", err.msg);
    /* a weights file listed in the manifest but gone */
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    EXPECT(t, rename(p, keep) == 0, "rename");
    st = eng_ckpt_dir_check(dir, &err);
    EXPECT(t, st == MT_ERR_FORMAT && strstr(err.msg, "is listed but missing") && strstr(err.msg, p), "%s", err.msg);
    EXPECT(t, rename(keep, p) == 0, "rename back");

    /* an ordinary HF directory (no manifest, no mark) passes */
    char hf[700];
    snprintf(hf, sizeof hf, "%s/merge/hf", t->root);
    snprintf(p, sizeof p, "mkdir -p %s", hf);
    EXPECT(t, system(p) == 0, "%s", p);
    snprintf(p, sizeof p, "%s/model.safetensors", hf);
    put_st(p, "", 1.0f);
    EXPECT(t, eng_ckpt_dir_check(hf, &err) == MT_OK, "%s", err.msg);
}

/* A MERGE switch stopped after some files moved: refused until a run takes
 * the lock and recovers, which finishes it. */
static void test_recover(tctx_t *t) {
    char dir[700], p[800];
    mt_error_t err = {0};
    snprintf(dir, sizeof dir, "%s/recover/out", t->root);
    EXPECT(t, save(dir, ENG_CKPT_DIR_MERGE, 1.0f, &err) == MT_OK, "%s", err.msg);
    /* replay a switch by hand up to the mark and one file: what a kill leaves */
    eng_ckpt_dir_t tx;
    EXPECT(t, eng_ckpt_dir_begin(&tx, dir, ENG_CKPT_DIR_MERGE, &err) == MT_OK, "%s", err.msg);
    char *cp = eng_ckpt_dir_path(&tx, "config.json");
    put(cp, "{\"model_type\": \"mixtral\", \"x\": 1}\n");
    free(cp);
    eng_ckpt_dir_add(&tx, "config.json");
    char *wp = eng_ckpt_dir_path(&tx, "model.safetensors");
    put_st(wp, tx.save_id, 2.0f);
    eng_ckpt_dir_add(&tx, "model.safetensors");
    char staging[800], name[300];
    snprintf(staging, sizeof staging, "%s", tx.staging);
    snprintf(name, sizeof name, "%s", strrchr(staging, '/') + 1);
    /* the manifest as commit writes it, then stop: commit's own switch is what the
     * crash loop in tests/outputs_test.sh interrupts on the real binary */
    struct stat sb, sc;
    char cpath[900];
    snprintf(cpath, sizeof cpath, "%s/config.json", staging);
    EXPECT(t, stat(wp, &sb) == 0 && stat(cpath, &sc) == 0, "staged files");
    snprintf(p, sizeof p,
             "{\"save_id\": \"%s\", \"files\": [{\"name\": \"config.json\", \"bytes\": %lld}, "
             "{\"name\": \"model.safetensors\", \"bytes\": %lld}]}",
             tx.save_id, (long long)sc.st_size, (long long)sb.st_size);
    char mp[900];
    snprintf(mp, sizeof mp, "%s/" ENG_CKPT_MANIFEST_FILE, staging);
    put(mp, p);
    snprintf(mp, sizeof mp, "%s/" ENG_CKPT_WRITING_FILE, dir);
    snprintf(p, sizeof p, "{\"pid\": 1, \"staging\": \"%s\"}", name);
    put(mp, p);
    char to[800];
    snprintf(to, sizeof to, "%s/model.safetensors", dir);
    EXPECT(t, rename(wp, to) == 0, "rename");
    free(wp);
    mt_status_t st = eng_ckpt_dir_check(dir, &err);
    EXPECT(t, st == MT_ERR_FORMAT && strstr(err.msg, "was switching a new save in") && strstr(err.msg, name),
           "%s", err.msg);
    /* the process is gone: free its bookkeeping without touching the files */
    for (int i = 0; i < tx.file_count; i++) free(tx.files[i]);
    free(tx.files);
    free(tx.target);
    free(tx.staging);
    char note[1200];
    EXPECT(t, eng_outdir_recover(dir, note, sizeof note, &err) == MT_OK, "%s", err.msg);
    EXPECT(t, strstr(note, "finished switching"), "note: %s", note);
    EXPECT(t, eng_ckpt_dir_check(dir, &err) == MT_OK, "after recovery: %s", err.msg);
    snprintf(p, sizeof p, "%s/config.json", dir);
    EXPECT(t, get(p) && strstr(get(p), "\"x\": 1"), "the new config.json was switched in");
    EXPECT(t, stat(staging, &sb) != 0 && stat(mp, &sb) != 0, "staging or mark left after recovery");
}

/* A SWAP stopped between moving the previous checkpoint aside and renaming
 * the new one in (file systems without an atomic exchange): recovery puts a
 * complete one back under its name and deletes an incomplete staging dir. */
static void test_recover_swap(tctx_t *t) {
    char root[700], dir[800], aside[800], partial[800], p[1700];
    mt_error_t err = {0};
    snprintf(root, sizeof root, "%s/recover_swap", t->root);
    snprintf(dir, sizeof dir, "%s/checkpoint-3", root);
    EXPECT(t, save(dir, ENG_CKPT_DIR_SWAP, 1.0f, &err) == MT_OK, "%s", err.msg);
    snprintf(aside, sizeof aside, "%s/.checkpoint-3" ENG_OUTDIR_TMP_TAG "99999-1", root);
    EXPECT(t, rename(dir, aside) == 0, "rename");
    eng_ckpt_dir_t tx; /* a second save that never finished */
    EXPECT(t, eng_ckpt_dir_begin(&tx, dir, ENG_CKPT_DIR_SWAP, &err) == MT_OK, "%s", err.msg);
    snprintf(partial, sizeof partial, "%s", tx.staging);
    for (int i = 0; i < tx.file_count; i++) free(tx.files[i]);
    free(tx.files);
    free(tx.target);
    free(tx.staging);
    char note[1200];
    EXPECT(t, eng_outdir_recover(root, note, sizeof note, &err) == MT_OK, "%s", err.msg);
    EXPECT(t, eng_ckpt_dir_check(dir, &err) == MT_OK, "%s", err.msg);
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    struct stat sb;
    EXPECT(t, stat(p, &sb) == 0 && stat(aside, &sb) != 0 && stat(partial, &sb) != 0,
           "restored checkpoint-3, removed the partial staging dir");
    EXPECT(t, strstr(note, "restored"), "note: %s", note);
}

int main(void) {
    tctx_t t = {0};
    const char *base = getenv("TEST_TMPDIR");
    snprintf(t.root, sizeof t.root, "%s/outdir_test_%d", base ? base : "/tmp", (int)getpid());
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "rm -rf %s && mkdir -p %s", t.root, t.root);
    if (system(cmd) != 0) return 2;
    test_paths(&t);
    test_lock(&t);
    test_swap(&t);
    test_merge(&t);
    test_recover(&t);
    test_recover_swap(&t);
    if (t.failures) {
        fprintf(stderr, "outdir_test: %d failures\n", t.failures);
        return 1;
    }
    printf("outdir_test: all ok\n");
    return 0;
}
