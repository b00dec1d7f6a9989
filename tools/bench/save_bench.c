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

int mt_bench_save_main(int argc, char **argv) {
    int scale = 1, repeats = 3;
    bool json = false;
    const char *dir_opt = NULL;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--scale") == 0 && i + 1 < argc) scale = atoi(argv[++i]);
        else if (strcmp(argv[i], "--repeats") == 0 && i + 1 < argc) repeats = atoi(argv[++i]);
        else if (strcmp(argv[i], "--dir") == 0 && i + 1 < argc) dir_opt = argv[++i];
        else if (strcmp(argv[i], "--json") == 0) json = true;
        else {
            fprintf(stderr, "usage: moetune bench save [--scale K] [--dir DIR] [--repeats R] [--json]\n");
            return 2;
        }
    }
    if (scale < 1 || scale > 64 || repeats < 1 || repeats > 100) {
        fprintf(stderr, "moetune bench save: --scale must be 1 to 64 and --repeats 1 to 100\n");
        return 2;
    }
    char root[800];
    if (dir_opt) {
        snprintf(root, sizeof root, "%.700s/moetune-bench-save-XXXXXX", dir_opt);
    } else {
        const char *tmp = getenv("TMPDIR");
        snprintf(root, sizeof root, "%.700s/moetune-bench-save-XXXXXX", tmp && tmp[0] ? tmp : "/tmp");
    }
    if (!mkdtemp(root)) {
        fprintf(stderr, "moetune bench save: cannot create a directory like %s: %s\n", root, strerror(errno));
        return 1;
    }
    mt_error_t err = {0};
    char base[900], out[900];
    snprintf(base, sizeof base, "%s/base", root);
    snprintf(out, sizeof out, "%s/out", root);
    char *cfg_text = model_config(scale);
    kern_device_t *dev = NULL;
    eng_exec_t *x = NULL;
    bool model_open = false;
    int rcode = 1;
    mt_status_t st = eng_checkpoint_init_random(base, cfg_text, 7, &err);
    if (st == MT_OK) st = kern_device_create(KERN_BACKEND_CPU, &(kern_device_opts_t){0}, &dev, &err);
    if (st == MT_OK) st = eng_exec_load(&x, dev, base, NULL, NULL, NULL, &err);
    model_open = st == MT_OK && dev;
    /* AdamW state for every parameter, as after a first step */
    size_t numel = 0;
    for (int i = 0; model_open && st == MT_OK && i < eng_exec_model(x)->spec.count; i++) {
        const size_t n = eng_exec_model(x)->spec.params[i].numel;
        numel += n;
        float *m1 = malloc(n * sizeof(float) + 1), *m2 = malloc(n * sizeof(float) + 1);
        MT_CHECK(m1 && m2, "out of memory");
        for (size_t k = 0; k < n; k++) {
            m1[k] = (float)((k * 2654435761u) % 1000) * 1e-6f;
            m2[k] = m1[k] * m1[k];
        }
        st = eng_exec_write_optim_state(x, i, NULL, m1, m2, 1, &err);
        free(m1);
        free(m2);
    }
    /* one row is enough for a data position */
    int32_t tok = 0;
    uint8_t mask = 1;
    eng_dataset_t ds = {.T = 1, .num_rows = 1, .inputs = &tok, .targets = &tok, .mask = &mask};
    eng_loader_t ld;
    memset(&ld, 0, sizeof ld);
    if (st == MT_OK) eng_loader_init(&ld, &ds, 1, false, 0);
    eng_run_config_t rc;
    eng_run_config_defaults(&rc);
    snprintf(rc.output_dir, sizeof rc.output_dir, "%s", out);
    snprintf(rc.source_path, sizeof rc.source_path, "bench save");
    eng_train_state_t ts;
    eng_train_state_init(&ts);
    double best_save = 1e30, best_disk = 1e30;
    uint64_t bytes = 0;
    char ckpt[1000];
    snprintf(ckpt, sizeof ckpt, "%s/checkpoint-1", out);
    for (int r = 0; r < repeats && st == MT_OK; r++) {
        const eng_train_state_save_t ss = {.exec = x, .rc = &rc, .ts = &ts, .loader = &ld,
                                           .total_steps = 1, .save_dtype = MT_F32};
        const double t0 = mt_now_s();
        st = eng_train_save_with(x, &rc, ckpt, ENG_CKPT_DIR_SWAP, MT_F32, eng_train_state_write, (void *)&ss,
                                 &err);
        const double dt = mt_now_s() - t0;
        if (st != MT_OK) break;
        if (dt < best_save) best_save = dt;
        bytes = tree_bytes(ckpt);
        const double dd = disk_write(out, bytes);
        if (dd < 0) {
            st = MT_ERR_IO;
            snprintf(err.msg, sizeof err.msg, "the disk probe failed");
            break;
        }
        if (dd < best_disk) best_disk = dd;
    }
    if (st == MT_OK) {
        const double save_gbs = (double)bytes / best_save / 1e9, disk_gbs = (double)bytes / best_disk / 1e9;
        char build[256];
        mt_build_info_line(build, sizeof build);
        if (json) {
            printf("{\"build\": \"%s\", \"scale\": %d, \"params\": %zu, \"bytes\": %llu, \"repeats\": %d, "
                   "\"save_s\": %.6g, \"save_gb_per_s\": %.6g, \"disk_s\": %.6g, \"disk_gb_per_s\": %.6g, "
                   "\"ratio_vs_disk\": %.4f, \"dir\": \"%s\"}\n",
                   build, scale, numel, (unsigned long long)bytes, repeats, best_save, save_gbs, best_disk, disk_gbs,
                   save_gbs / disk_gbs, dir_opt ? dir_opt : "tmp");
        } else {
            mt_build_info_print(stdout);
            printf("moetune bench save: the quick start model x%d (%zu params), checkpoint-N with optimizer state, "
                   "best of %d, in %s\n",
                   scale, numel, repeats, dir_opt ? dir_opt : root);
            printf("  checkpoint save      %12llu bytes %9.4f s %8.3f GB/s\n", (unsigned long long)bytes, best_save,
                   save_gbs);
            printf("  disk write + fsync   %12llu bytes %9.4f s %8.3f GB/s\n", (unsigned long long)bytes, best_disk,
                   disk_gbs);
            printf("  ratio (save / disk)  %.2f\n", save_gbs / disk_gbs);
        }
        rcode = 0;
    } else {
        fprintf(stderr, "moetune bench save: %s\n", err.msg);
    }
    eng_train_state_free(&ts);
    if (ld.order) eng_loader_free(&ld);
    eng_run_config_free(&rc);
    if (model_open) eng_exec_free(x);
    if (dev) kern_device_destroy(dev);
    free(cfg_text);
    nftw(root, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    return rcode;
}
