/* How much the non-finite check adds to loading a checkpoint.
 *
 *   bazel run //tests:ckpt_load_timing -- CHECKPOINT_DIR [ROUNDS]
 *
 * Each round loads every tensor of the directory's model twice into the
 * same fp32 host buffers: with eng_checkpoint_load (conversion plus the
 * NaN/Inf check), and with the bare conversion (eng_st_read_f32, no
 * check); it prints both and what the check adds.  The first round reads
 * the file from disk or page cache; the best round of each is reported. */
#include <stdio.h>
#include <stdlib.h>

#include "base/clock.h"
#include "engine/model/io/checkpoint.h"
#include "engine/model/hf/model_config.h"
#include "engine/model/desc/model_desc.h"
#include "engine/model/io/safetensors.h"

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: ckpt_load_timing CHECKPOINT_DIR [ROUNDS]\n");
        return 2;
    }
    const int rounds = argc > 2 ? atoi(argv[2]) : 3;
    mt_error_t err = {0};
    eng_model_config_t cfg;
    eng_model_desc_t spec;
    eng_checkpoint_t ck;
    if (eng_model_config_load(argv[1], NULL, &cfg, &err) != MT_OK || eng_model_desc_build(&cfg, &spec, &err) != MT_OK ||
        eng_checkpoint_open(argv[1], &ck, &err) != MT_OK) {
        fprintf(stderr, "ckpt_load_timing: %s\n", err.msg);
        return 1;
    }
    float **dst = calloc((size_t)spec.count, sizeof *dst);
    size_t total = 0;
    for (int i = 0; i < spec.count; i++) {
        dst[i] = malloc(spec.params[i].numel * sizeof(float));
        if (!dst[i]) return 1;
        total += spec.params[i].numel;
    }
    double best_load = 1e30, best_bare = 1e30;
    for (int r = 0; r < rounds; r++) {
        double t0 = mt_now_s();
        if (eng_checkpoint_load(&ck, &spec, dst, NULL, &err) != MT_OK) {
            fprintf(stderr, "ckpt_load_timing: %s\n", err.msg);
            return 1;
        }
        double t1 = mt_now_s();
        for (int i = 0; i < spec.count; i++) {
            const eng_ckpt_entry_t *e = eng_checkpoint_find(&ck, spec.params[i].name);
            if (eng_st_read_f32(&ck.files[e->file], e->tensor, dst[i], &err) != MT_OK) return 1;
        }
        double t2 = mt_now_s();
        if (t1 - t0 < best_load) best_load = t1 - t0;
        if (t2 - t1 < best_bare) best_bare = t2 - t1;
        printf("round %d: load with the check %.3f s, without %.3f s\n", r + 1, t1 - t0, t2 - t1);
    }
    const double gb = (double)total * 4 / 1e9;
    printf("%d tensors, %.3f GB as fp32 (%.3f GB on disk): best load with the check %.3f s (%.2f GB/s), "
           "without %.3f s (%.2f GB/s): the check adds %+.1f%%\n",
           spec.count, gb, (double)ck.disk_bytes / 1e9, best_load, gb / best_load, best_bare, gb / best_bare,
           100.0 * (best_load - best_bare) / best_bare);
    return 0;
}
