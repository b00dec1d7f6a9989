/* See save_bench.h.  The model gets AdamW state for every parameter (step
 * 1, random moments) so the checkpoint is as large as a real run's; the
 * best of R repeats is reported for both the save and the disk, as both
 * are disturbed by neighbours in the same way. */
#include "tools/bench/save_bench.h"

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine/data/data.h"
#include "engine/exec/exec.h"
#include "engine/model/io/init_random.h"
#include "engine/exec/optim_state.h"
#include "engine/run/save.h"
#include "engine/run/state.h"
#include "base/clock.h"
#include "kernels/host/adamw_host.h"
#include "tools/build_info.h"

/* The quick start's model (configs/models/tiny-mixtral.json), scaled. */
static char *model_config(int scale) {
    json_t *c = json_pack("{s:s, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:f, s:f, s:b, s:b, s:f}",
                          "model_type", "mixtral", "vocab_size", 128, "hidden_size", 64 * scale, "intermediate_size",
                          96 * scale, "num_hidden_layers", 2, "num_attention_heads", 4, "num_key_value_heads", 2,
                          "head_dim", 16 * scale, "num_local_experts", 8, "num_experts_per_tok", 2,
                          "max_position_embeddings", 512, "rms_norm_eps", 1e-5, "rope_theta", 10000.0,
                          "tie_word_embeddings", 0, "output_router_logits", 1, "router_aux_loss_coef", 0.02);
    json_object_set_new(c, "torch_dtype", json_string("float32"));
    char *text = json_dumps(c, JSON_INDENT(2));
    json_decref(c);
    return text;
}

static int rm_entry(const char *p, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb;
    (void)flag;
    (void)ftw;
    remove(p);
    return 0;
}

static uint64_t tree_bytes_of;
static int add_size(const char *p, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)p;
    (void)ftw;
    if (flag == FTW_F) tree_bytes_of += (uint64_t)sb->st_size;
    return 0;
}

static uint64_t tree_bytes(const char *dir) {
    tree_bytes_of = 0;
    nftw(dir, add_size, 16, FTW_PHYS);
    return tree_bytes_of;
}

/* Writes bytes to a new file in dir in 4 MiB writes, fsyncs it and the
 * directory: what the disk gives a save that does nothing else.  Seconds,
 * or -1 with a message. */
static double disk_write(const char *dir, uint64_t bytes) {
    char path[2048];
    snprintf(path, sizeof path, "%s/disk-probe.bin", dir);
    const size_t chunk = (size_t)4 << 20;
    unsigned char *buf = malloc(chunk);
    if (!buf) return -1;
    for (size_t i = 0; i < chunk; i++) buf[i] = (unsigned char)(i * 131u + 7u); /* not all zeros */
    const double t0 = mt_now_s();
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) {
        fprintf(stderr, "moetune bench save: %s: %s\n", path, strerror(errno));
        free(buf);
        return -1;
    }
    uint64_t left = bytes;
    bool ok = true;
    while (left > 0 && ok) {
        const size_t n = left < chunk ? (size_t)left : chunk;
        ok = write(fd, buf, n) == (ssize_t)n;
        left -= n;
    }
    ok = ok && fsync(fd) == 0;
    close(fd);
    int dfd = open(dir, O_RDONLY | O_DIRECTORY);
    if (dfd >= 0) {
        fsync(dfd);
        close(dfd);
    }
    const double dt = mt_now_s() - t0;
    unlink(path);
    free(buf);
    if (!ok) fprintf(stderr, "moetune bench save: writing %s failed: %s\n", path, strerror(errno));
    return ok ? dt : -1;
}

typedef struct {
    int scale, repeats;
    bool json;
    const char *dir; /* --dir; NULL: under $TMPDIR or /tmp */
} save_opts_t;

/* One run of the benchmark: its directories, the model with its optimizer
 * state, what a save writes beside them, and the best times. */
typedef struct {
    char root[800], base[900], out[900], ckpt[1000];
    kern_device_t *dev;
    eng_exec_t *x;
    bool model_open;
    size_t numel;        /* parameters */
    int32_t tok;         /* one row is enough for a data position */
    uint8_t mask;
    eng_dataset_t ds;
    eng_loader_t ld;
    eng_run_config_t rc;
    eng_train_state_t ts;
    double best_save, best_disk;
    uint64_t bytes;      /* the checkpoint's, as written */
} save_run_t;

static int parse_save_opts(int argc, char **argv, save_opts_t *o) {
    *o = (save_opts_t){.scale = 1, .repeats = 3};
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--scale") == 0 && i + 1 < argc) o->scale = atoi(argv[++i]);
        else if (strcmp(argv[i], "--repeats") == 0 && i + 1 < argc) o->repeats = atoi(argv[++i]);
        else if (strcmp(argv[i], "--dir") == 0 && i + 1 < argc) o->dir = argv[++i];
        else if (strcmp(argv[i], "--json") == 0) o->json = true;
        else {
            fprintf(stderr, "usage: moetune bench save [--scale K] [--dir DIR] [--repeats R] [--json]\n");
            return 2;
        }
    }
    if (o->scale < 1 || o->scale > 64 || o->repeats < 1 || o->repeats > 100) {
        fprintf(stderr, "moetune bench save: --scale must be 1 to 64 and --repeats 1 to 100\n");
        return 2;
    }
    return 0;
}

/* A fresh directory under --dir (or $TMPDIR, or /tmp) for the run's files. */
static bool make_root(const save_opts_t *o, save_run_t *r) {
    if (o->dir) {
        snprintf(r->root, sizeof r->root, "%.700s/moetune-bench-save-XXXXXX", o->dir);
    } else {
        const char *tmp = getenv("TMPDIR");
        snprintf(r->root, sizeof r->root, "%.700s/moetune-bench-save-XXXXXX", tmp && tmp[0] ? tmp : "/tmp");
    }
    if (!mkdtemp(r->root)) {
        fprintf(stderr, "moetune bench save: cannot create a directory like %s: %s\n", r->root, strerror(errno));
        return false;
    }
    snprintf(r->base, sizeof r->base, "%s/base", r->root);
    snprintf(r->out, sizeof r->out, "%s/out", r->root);
    snprintf(r->ckpt, sizeof r->ckpt, "%s/checkpoint-1", r->out);
    return true;
}

/* The scaled model, created under base and loaded on a CPU device. */
static mt_status_t open_model(save_run_t *r, int scale, mt_error_t *err) {
    char *cfg_text = model_config(scale);
    mt_status_t st = eng_checkpoint_init_random(r->base, cfg_text, 7, err);
    if (st == MT_OK) st = kern_device_create(KERN_BACKEND_CPU, &(kern_device_opts_t){0}, &r->dev, err);
    if (st == MT_OK) st = eng_exec_load(&r->x, r->dev, r->base, NULL, NULL, NULL, err);
    r->model_open = st == MT_OK && r->dev;
    free(cfg_text);
    return st;
}

/* AdamW state for every parameter, as after a first step. */
static mt_status_t add_optim_state(save_run_t *r, mt_error_t *err) {
    mt_status_t st = MT_OK;
    for (int i = 0; r->model_open && st == MT_OK && i < eng_exec_model(r->x)->spec.count; i++) {
        const size_t n = eng_exec_model(r->x)->spec.params[i].numel;
        r->numel += n;
        float *m1 = malloc(n * sizeof(float) + 1), *m2 = malloc(n * sizeof(float) + 1);
        MT_CHECK(m1 && m2, "out of memory");
        for (size_t k = 0; k < n; k++) {
            m1[k] = (float)((k * 2654435761u) % 1000) * 1e-6f;
            m2[k] = m1[k] * m1[k];
        }
        const eng_param_t *p = &eng_exec_model(r->x)->params[i];
        void *raw = malloc(eng_param_moments_bytes(p));
        MT_CHECK(raw, "out of memory");
        const kern_moments_t mv = eng_param_moments_view(p, raw);
        kern_moments_from_f32(&mv, n, m1, m2);
        st = eng_exec_write_optim_state(r->x, i, NULL, raw, 1, err);
        free(raw);
        free(m1);
        free(m2);
    }
    return st;
}

/* What a save writes beside the model: the data position (a loader over
 * one row), the run config and the trainer state. */
static void init_train_state(save_run_t *r, bool loader) {
    r->ds = (eng_dataset_t){.T = 1, .num_rows = 1, .inputs = &r->tok, .targets = &r->tok, .mask = &r->mask};
    memset(&r->ld, 0, sizeof r->ld);
    if (loader) eng_loader_init(&r->ld, &r->ds, 1, false, 0);
    eng_run_config_defaults(&r->rc);
    snprintf(r->rc.output_dir, sizeof r->rc.output_dir, "%s", r->out);
    snprintf(r->rc.source_path, sizeof r->rc.source_path, "bench save");
    eng_train_state_init(&r->ts);
}

/* `repeats` saves of checkpoint-1, each followed by the disk probe of the
 * same size; the best of each. */
static mt_status_t time_saves(save_run_t *r, int repeats, mt_error_t *err) {
    r->best_save = r->best_disk = 1e30;
    for (int i = 0; i < repeats; i++) {
        const eng_train_state_save_t ss = {.exec = r->x, .rc = &r->rc, .ts = &r->ts, .loader = &r->ld,
                                           .total_steps = 1, .save_dtype = MT_F32};
        const double t0 = mt_now_s();
        const mt_status_t st = eng_train_save_with(r->x, &r->rc, r->ckpt, ENG_CKPT_DIR_SWAP, MT_F32,
                                                   eng_train_state_write, (void *)&ss, err);
        const double dt = mt_now_s() - t0;
        if (st != MT_OK) return st;
        if (dt < r->best_save) r->best_save = dt;
        r->bytes = tree_bytes(r->ckpt);
        const double dd = disk_write(r->out, r->bytes);
        if (dd < 0) {
            snprintf(err->msg, sizeof err->msg, "the disk probe failed");
            return MT_ERR_IO;
        }
        if (dd < r->best_disk) r->best_disk = dd;
    }
    return MT_OK;
}

static void print_result(const save_opts_t *o, const save_run_t *r) {
    const double save_gbs = (double)r->bytes / r->best_save / 1e9, disk_gbs = (double)r->bytes / r->best_disk / 1e9;
    char build[256];
    mt_build_info_line(build, sizeof build);
    if (o->json) {
        printf("{\"build\": \"%s\", \"scale\": %d, \"params\": %zu, \"bytes\": %llu, \"repeats\": %d, "
               "\"save_s\": %.6g, \"save_gb_per_s\": %.6g, \"disk_s\": %.6g, \"disk_gb_per_s\": %.6g, "
               "\"ratio_vs_disk\": %.4f, \"dir\": \"%s\"}\n",
               build, o->scale, r->numel, (unsigned long long)r->bytes, o->repeats, r->best_save, save_gbs,
               r->best_disk, disk_gbs, save_gbs / disk_gbs, o->dir ? o->dir : "tmp");
        return;
    }
    mt_build_info_print(stdout);
    printf("moetune bench save: the quick start model x%d (%zu params), checkpoint-N with optimizer state, "
           "best of %d, in %s\n",
           o->scale, r->numel, o->repeats, o->dir ? o->dir : r->root);
    printf("  checkpoint save      %12llu bytes %9.4f s %8.3f GB/s\n", (unsigned long long)r->bytes, r->best_save,
           save_gbs);
    printf("  disk write + fsync   %12llu bytes %9.4f s %8.3f GB/s\n", (unsigned long long)r->bytes, r->best_disk,
           disk_gbs);
    printf("  ratio (save / disk)  %.2f\n", save_gbs / disk_gbs);
}

static void close_run(save_run_t *r) {
    eng_train_state_free(&r->ts);
    if (r->ld.order) eng_loader_free(&r->ld);
    eng_run_config_free(&r->rc);
    if (r->model_open) eng_exec_free(r->x);
    if (r->dev) kern_device_destroy(r->dev);
    nftw(r->root, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}

int mt_bench_save_main(int argc, char **argv) {
    save_opts_t o;
    const int bad = parse_save_opts(argc, argv, &o);
    if (bad) return bad;
    save_run_t r = {0};
    if (!make_root(&o, &r)) return 1;
    mt_error_t err = {0};
    mt_status_t st = open_model(&r, o.scale, &err);
    if (st == MT_OK) st = add_optim_state(&r, &err);
    init_train_state(&r, st == MT_OK);
    if (st == MT_OK) st = time_saves(&r, o.repeats, &err);
    if (st == MT_OK) print_result(&o, &r);
    else fprintf(stderr, "moetune bench save: %s\n", err.msg);
    close_run(&r);
    return st == MT_OK ? 0 : 1;
}
