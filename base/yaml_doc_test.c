/* mt_yaml_doc: a plain document parses with node lines; the billion-laughs
 * alias bomb, a self-referencing alias, nesting past the depth limit, a
 * text over the size limit, a second document and a syntax error are each
 * refused with the given status and a message naming name:line; a file
 * that is not regular is refused by mt_yaml_doc_load without hanging. */
#include "base/yaml_doc.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static int failures;
#define EXPECT(c, ...)                                                                   \
    do {                                                                                 \
        if (!(c)) {                                                                      \
            fprintf(stderr, "%s:%d: expectation failed: %s: ", __FILE__, __LINE__, #c); \
            fprintf(stderr, __VA_ARGS__);                                                \
            fprintf(stderr, "\n");                                                       \
            failures++;                                                                  \
        }                                                                                \
    } while (0)

static void expect_refused(const char *text, size_t len, const char *needle) {
    mt_yaml_doc_t d;
    mt_error_t err = {0};
    mt_status_t st = mt_yaml_doc_parse(&d, text, len, "t.yaml", "test config", MT_ERR_CONFIG, &err);
    EXPECT(st == MT_ERR_CONFIG && strstr(err.msg, needle) && strstr(err.msg, "t.yaml"),
           "want a refusal naming '%s', got %d: %s", needle, (int)st, err.msg);
    EXPECT(!d.loaded, "document left loaded after a refusal");
    if (st == MT_OK) mt_yaml_doc_free(&d);
}

int main(void) {
    mt_yaml_doc_t d;
    mt_error_t err = {0};
    const char *ok = "a: 1\nb:\n  - &x {c: 2}\n  - *x\n  - *x\n";
    EXPECT(mt_yaml_doc_parse(&d, ok, strlen(ok), "t.yaml", "test config", MT_ERR_CONFIG, &err) == MT_OK, "%s",
           err.msg);
    EXPECT(d.root && d.root->type == YAML_MAPPING_NODE, "root");
    if (d.root) {
        yaml_node_pair_t *p = d.root->data.mapping.pairs.start + 1;
        EXPECT(mt_yaml_line(yaml_document_get_node(&d.doc, p->key)) == 2, "line of key b");
    }
    mt_yaml_doc_free(&d);

    /* nine levels of ten aliases each: 10^9 nodes once expanded, in 11 lines */
    char bomb[2048];
    size_t n = (size_t)snprintf(bomb, sizeof bomb, "model_config:\n  a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n");
    for (int l = 1; l <= 9; l++) {
        n += (size_t)snprintf(bomb + n, sizeof bomb - n, "  a%d: &a%d [", l, l);
        for (int k = 0; k < 10; k++) n += (size_t)snprintf(bomb + n, sizeof bomb - n, "%s*a%d", k ? ", " : "", l - 1);
        n += (size_t)snprintf(bomb + n, sizeof bomb - n, "]\n");
    }
    expect_refused(bomb, n, "aliases expand to more than 10000 nodes");
    expect_refused(bomb, n, "t.yaml:");
    /* an anchored sequence holding an alias to itself is a cycle */
    const char *cycle = "a: &s [1, *s]\n";
    expect_refused(cycle, strlen(cycle), "t.yaml:1");
    char deep[512];
    n = 0;
    for (int i = 0; i < 70; i++) deep[n++] = '[';
    for (int i = 0; i < 70; i++) deep[n++] = ']';
    expect_refused(deep, n, "nesting deeper than 64");
    char *big = malloc(MT_YAML_MAX_BYTES + 2);
    if (!big) return 2;
    memset(big, '#', MT_YAML_MAX_BYTES + 1);
    big[MT_YAML_MAX_BYTES + 1] = '\0';
    expect_refused(big, MT_YAML_MAX_BYTES + 1, "over the limit");
    free(big);
    expect_refused("a: 1\n---\nb: 2\n", 14, "t.yaml:3: a second YAML document");
    expect_refused("a: [1, 2\nb: 3\n", 14, "invalid YAML");

    const char *tmp = getenv("TEST_TMPDIR");
    char fifo[1024];
    snprintf(fifo, sizeof fifo, "%s/fifo.yaml", tmp ? tmp : "/tmp");
    unlink(fifo);
    EXPECT(mkfifo(fifo, 0600) == 0, "mkfifo");
    EXPECT(mt_yaml_doc_load(&d, fifo, "test config", MT_ERR_CONFIG, &err) == MT_ERR_IO && strstr(err.msg, "FIFO") &&
               strstr(err.msg, "fifo.yaml"),
           "%s", err.msg);
    unlink(fifo);
    if (failures) {
        fprintf(stderr, "yaml_doc_test: %d failure(s)\n", failures);
        return 1;
    }
    printf("yaml_doc_test: all passed\n");
    return 0;
}
