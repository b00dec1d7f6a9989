/* Test helper: a digest of the tensors in a checkpoint directory as
 * moetune's loader takes them (eng_checkpoint_open, which refuses partial
 * and mixed saves), so a shell test can ask "would moetune load this, and
 * whose weights are they?".
 *
 *   ckpt_digest DIR   prints "<16 hex digits> <tensor count>" and exits 0,
 *                     or prints the loader's refusal on stderr and exits 1.
 *
 * The digest covers each tensor's name, dtype, shape and bytes (FNV-1a 64),
 * in name order; the save id in the file headers is not part of it. */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "engine/model/io/checkpoint.h"

static uint64_t fnv(uint64_t h, const void *p, size_t n) {
    const uint8_t *b = p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: ckpt_digest DIR\n");
        return 2;
    }
    eng_checkpoint_t ck;
    mt_error_t err = {0};
    if (eng_checkpoint_open(argv[1], &ck, &err) != MT_OK) {
        fprintf(stderr, "refused: %s\n", err.msg);
        return 1;
    }
    uint64_t h = 1469598103934665603ull;
    for (int i = 0; i < ck.count; i++) {
        const eng_st_tensor_t *t = ck.entries[i].tensor;
        h = fnv(h, ck.entries[i].name, strlen(ck.entries[i].name) + 1);
        int dt = (int)t->dtype;
        h = fnv(h, &dt, sizeof dt);
        h = fnv(h, t->shape, (size_t)t->ndim * sizeof *t->shape);
        h = fnv(h, t->data, (size_t)(t->end - t->begin));
    }
    printf("%016llx %d\n", (unsigned long long)h, ck.count);
    eng_checkpoint_close(&ck);
    return 0;
}
