/* libFuzzer harness: adapter_config.json's reader (engine/model/lora/config.c),
 * the PEFT settings a LoRA run or resume reads beside an adapter.
 *
 * The input is the file's text.  A config the reader accepts is then used
 * as a run uses it: the selection, the scale, the rank and alpha of a few
 * module names under PEFT's pattern matching (with and without the fused
 * gate_up rewrite), and written back and read again, which must give the
 * same rank, alpha and scale (a saved adapter's config is read by resume). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/model/lora/config.h"
#include "tools/fuzz/fuzz_util.h"

static const char *const k_names[] = {
    "model.layers.0.self_attn.q_proj",
    "model.layers.1.mlp.experts.gate_up_proj",
    "model.layers.12.mlp.experts.3.w1",
    "model.layers.0.mlp.gate",
};

static void use(const eng_lora_config_t *c) {
    eng_lora_select_t sel;
    eng_lora_config_select(c, &sel);
    if (!(eng_lora_scale(c) > 0) || !isfinite(eng_lora_scale(c))) abort();
    for (size_t i = 0; i < sizeof k_names / sizeof *k_names; i++)
        for (int rw = 0; rw < 2; rw++) {
            int r;
            double alpha;
            const char *key;
            eng_lora_config_lookup(c, k_names[i], rw, &r, &alpha, &key);
            if (r < 1 || !isfinite(alpha)) abort(); /* every accepted rank is usable */
        }
    const char *probes[] = {k_names[1], k_names[2]};
    (void)eng_lora_config_names(c, "gate_proj", probes, 2);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char path[512], back[512];
    fz_write_file("adapter_config.json", data, size, path, sizeof path);
    eng_lora_config_t c;
    mt_error_t err = {0};
    if (eng_lora_config_read(path, &c, &err) != MT_OK) {
        if (!strstr(err.msg, "adapter_config.json")) abort(); /* every refusal names the file */
        return 0;
    }
    use(&c);
    snprintf(back, sizeof back, "%s/written_config.json", fz_scratch_dir());
    if (eng_lora_config_write(back, &c, &err) != MT_OK) abort(); /* what was read can be written */
    eng_lora_config_t again;
    if (eng_lora_config_read(back, &again, &err) != MT_OK) abort(); /* and read back */
    if (again.r != c.r || again.lora_alpha != c.lora_alpha || again.use_rslora != c.use_rslora ||
        again.num_rank_pattern != c.num_rank_pattern || again.num_alpha_pattern != c.num_alpha_pattern)
        abort();
    eng_lora_config_free(&again);
    eng_lora_config_free(&c);
    return 0;
}
