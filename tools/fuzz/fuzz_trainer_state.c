/* libFuzzer harness: trainer_state.json's reader (engine/run/state_json.c).
 *
 * The input is one settings byte, then the file's text.  The byte is the N
 * of the checkpoint-N directory the file lies in (255: a directory not so
 * named, so global_step is not compared), since that comparison is part
 * of what the reader decides.  A document the reader accepts is then used
 * as a resume uses it: every field read, every log entry walked, and the
 * directory-name parser fed the text too. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/run/state_json.h"
#include "tools/fuzz/fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    const int dir_n = data[0] == 255 ? -1 : data[0];
    char *text = fz_strndup(data + 1, size - 1);
    (void)eng_state_dir_number(text);
    eng_state_doc_t doc;
    mt_error_t err = {0};
    if (eng_state_doc_parse("trainer_state.json", text, size - 1, dir_n, &doc, &err) == MT_OK) {
        /* what a resume relies on having been checked */
        if (doc.global_step < 0 || (dir_n >= 0 && doc.global_step != dir_n) || doc.epoch < 0 || doc.cursor < 0 ||
            doc.rows < 0 || doc.nonfinite_skipped < 0 || doc.nonfinite_skipped > doc.global_step)
            abort();
        double sum = 0;
        for (int i = 0; i < doc.log_count; i++) {
            if (doc.log[i].step < 1 || doc.log[i].step > doc.global_step) abort();
            sum += doc.log[i].loss + doc.log[i].lr + doc.log[i].grad_norm;
        }
        (void)json_object_get(doc.root, "params");
        eng_state_doc_free(&doc);
        (void)sum;
    } else if (!strstr(err.msg, "trainer_state.json")) {
        abort(); /* every refusal names the file */
    }
    free(text);
    return 0;
}
