/* mt_yaml_doc: a plain document parses with node lines; the billion-laughs
 * alias bomb, a self-referencing alias, nesting past the depth limit, a
 * text over the size limit, a second document and a syntax error are each
 * refused with the given status and a message naming name:line; a file
 * that is not regular is refused by mt_yaml_doc_load without hanging.
 *
 * The limits fire while reading, not after: documents nested 100,000 levels
 * deep (flow lists and mappings, block lists; block mappings as deep as fit
 * in 1 MiB), the alias bomb, a deep second document and a file of many
 * anchors and aliases are each settled in under a second (libyaml's loader,
 * reading such a document whole before any check, took minutes); a document
 * exactly at the depth limit, also through an alias, is accepted.  So is one
 * with 64 %TAG directives; a 1 MiB flood of them is refused at the 65th. */
#include "base/yaml_doc.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/clock.h"

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

/* Refuses text as expect_refused does, within a second: the limits stop
 * libyaml's reading, so the size of what follows does not matter. */
static void expect_refused_fast(const char *label, const char *text, size_t len, const char *needle) {
    const double t0 = mt_now_s();
    expect_refused(text, len, needle);
    const double s = mt_now_s() - t0;
    EXPECT(s < 1.0, "%s (%zu bytes) took %.2f s to refuse", label, len, s);
}

/* text repeated n times, between head and tail, in a new string of *len bytes. */
static char *repeat(const char *head, const char *text, size_t n, const char *tail, size_t *len) {
    const size_t h = strlen(head), t = strlen(text), e = strlen(tail);
    char *s = malloc(h + n * t + e + 1);
    if (!s) exit(2);
    memcpy(s, head, h);
    for (size_t i = 0; i < n; i++) memcpy(s + h + i * t, text, t);
    memcpy(s + h + n * t, tail, e + 1);
    *len = h + n * t + e;
    return s;
}

/* "[" 100,000 deep and back: 200 KB, refused naming the line it starts on. */
static void deep_flow_lists(void) {
    size_t n, m;
    char *closing = repeat("", "]", 100000, "\n", &m);
    char *s = repeat("seed: 1\nmodel_config:\n  layers: ", "[", 100000, closing, &n);
    EXPECT(n <= MT_YAML_MAX_BYTES, "%zu bytes", n);
    expect_refused_fast("flow lists 100,000 deep", s, n, "t.yaml:3: nesting deeper than 64 levels");
    free(s);
    free(closing);
}

/* "{a:" 100,000 deep, one a line: the key under the 64th mapping, on line
 * 65, is the first node past the limit. */
static void deep_flow_mappings(void) {
    size_t n, m;
    char *closing = repeat("1", "}", 100000, "\n", &m);
    char *s = repeat("", "{a:\n", 100000, closing, &n);
    EXPECT(n <= MT_YAML_MAX_BYTES, "%zu bytes", n);
    expect_refused_fast("flow mappings 100,000 deep", s, n, "t.yaml:65: nesting deeper than 64 levels");
    free(s);
    free(closing);
}

/* Block lists 100,000 deep ("- - - ... x"), and block mappings as deep as
 * 1 MiB holds ("a:" indented one more space a line: about 1,400 levels). */
static void deep_block(void) {
    size_t n;
    char *s = repeat("", "- ", 100000, "x\n", &n);
    expect_refused_fast("block lists 100,000 deep", s, n, "t.yaml:1: nesting deeper than 64 levels");
    free(s);
    s = malloc(MT_YAML_MAX_BYTES);
    if (!s) exit(2);
    n = 0;
    for (size_t level = 0; n + level + 3 <= MT_YAML_MAX_BYTES; level++) {
        memset(s + n, ' ', level);
        memcpy(s + n + level, "a:\n", 3);
        n += level + 3;
    }
    expect_refused_fast("block mappings 1 MiB deep", s, n, "t.yaml:65: nesting deeper than 64 levels");
    free(s);
}

/* Exactly at the limit is accepted: nodes at depth 0 (the root) to 64, in
 * a document or reached through an alias; one more level is refused, at
 * the list that goes past or at the alias that does. */
static void depth_limit_edge(void) {
    char t[512];
    size_t n = 0;
    for (int i = 0; i <= MT_YAML_MAX_DEPTH; i++) t[n++] = '[';
    for (int i = 0; i <= MT_YAML_MAX_DEPTH; i++) t[n++] = ']';
    mt_yaml_doc_t d;
    mt_error_t err = {0};
    EXPECT(mt_yaml_doc_parse(&d, t, n, "t.yaml", "test config", MT_ERR_CONFIG, &err) == MT_OK, "%s", err.msg);
    mt_yaml_doc_free(&d);
    /* an anchored list with 62 levels under it, aliased at depth 2 (in a
     * list under the root mapping), reaches depth 64; one list deeper, 65 */
    char *a = repeat("a: &deep ", "[", 63, "", &n);
    char *b = repeat(a, "]", 63, "\nb: [*deep]\nc: [[*deep]]\n", &n);
    mt_status_t st = mt_yaml_doc_parse(&d, b, (size_t)(strstr(b, "c:") - b), "t.yaml", "test config", MT_ERR_CONFIG,
                                       &err);
    EXPECT(st == MT_OK, "%s", err.msg);
    if (st == MT_OK) mt_yaml_doc_free(&d);
    expect_refused(b, n, "t.yaml:3: nesting deeper than 64 levels");
    free(a);
    free(b);
}

/* The alias bomb of main, refused fast and naming the line of the alias
 * that crosses the limit (a3's: 110 + 1110 nodes from a1 and a2, then 1111
 * per *a2 until the 8th passes 10000). */
static void alias_bomb_fast(const char *bomb, size_t n) {
    expect_refused_fast("alias bomb", bomb, n, "t.yaml:5: aliases expand to more than 10000 nodes");
}

/* Many anchors, each aliased: the loader searched all anchors for each
 * new anchor and each alias (minutes for this file); a hash is linear. */
static void many_anchors(void) {
    const int anchors = 40000, aliases = 9000;
    char *s = malloc(MT_YAML_MAX_BYTES);
    if (!s) exit(2);
    size_t n = (size_t)snprintf(s, MT_YAML_MAX_BYTES, "a:\n");
    for (int i = 0; i < anchors; i++) n += (size_t)snprintf(s + n, MT_YAML_MAX_BYTES - n, "  - &a%d x\n", i);
    for (int i = 0; i < aliases; i++) n += (size_t)snprintf(s + n, MT_YAML_MAX_BYTES - n, "  - *a%d\n", i * 4);
    mt_yaml_doc_t d;
    mt_error_t err = {0};
    const double t0 = mt_now_s();
    mt_status_t st = mt_yaml_doc_parse(&d, s, n, "t.yaml", "test config", MT_ERR_CONFIG, &err);
    const double took = mt_now_s() - t0;
    EXPECT(st == MT_OK, "%s", err.msg);
    EXPECT(took < 1.0, "%d anchors and %d aliases took %.2f s", anchors, aliases, took);
    if (st == MT_OK) {
        const yaml_node_t *list = yaml_document_get_node(&d.doc, d.root->data.mapping.pairs.start->value);
        const int items = (int)(list->data.sequence.items.top - list->data.sequence.items.start);
        EXPECT(items == anchors + aliases, "%d items", items);
        const yaml_node_t *last = yaml_document_get_node(&d.doc, list->data.sequence.items.top[-1]);
        EXPECT(last && mt_yaml_line(last) == (size_t)(2 + 4 * (aliases - 1)), "the last alias names the node of line %zu",
               mt_yaml_line(last));
        mt_yaml_doc_free(&d);
    }
    free(s);
}

/* A second document is refused as such, however deep it goes. */
static void deep_second_document(void) {
    size_t n, m;
    char *closing = repeat("", "]", 100000, "\n", &m);
    char *s = repeat("a: 1\n---\n", "[", 100000, closing, &n);
    expect_refused_fast("a deep second document", s, n, "t.yaml:3: a second YAML document");
    free(s);
    free(closing);
}

/* %TAG directives: 64 are read as before; past that the text is refused
 * before libyaml checks each against all the others (a 1 MiB flood of them
 * took 5 to 50 s), naming the line of the 65th, in UTF-8 or UTF-16. */
static void tag_directives(void) {
    char *s = malloc(MT_YAML_MAX_BYTES);
    if (!s) exit(2);
    size_t n = 0;
    for (int i = 0; i < MT_YAML_MAX_TAG_DIRECTIVES; i++)
        n += (size_t)snprintf(s + n, MT_YAML_MAX_BYTES - n, "%%TAG !t%d! tag:example.com,2000:%d/\n", i, i);
    n += (size_t)snprintf(s + n, MT_YAML_MAX_BYTES - n, "---\na: !t7!x 1\n");
    mt_yaml_doc_t d;
    mt_error_t err = {0};
    mt_status_t st = mt_yaml_doc_parse(&d, s, n, "t.yaml", "test config", MT_ERR_CONFIG, &err);
    EXPECT(st == MT_OK, "%s", err.msg);
    if (st == MT_OK) {
        const yaml_node_t *v = yaml_document_get_node(&d.doc, d.root->data.mapping.pairs.start->value);
        EXPECT(!strcmp((const char *)v->tag, "tag:example.com,2000:7/x"), "tag %s", (const char *)v->tag);
        mt_yaml_doc_free(&d);
    }
    n = 0;
    for (int i = 0; n < MT_YAML_MAX_BYTES - 64; i++)
        n += (size_t)snprintf(s + n, MT_YAML_MAX_BYTES - n, "%%TAG !t%d! tag:x,%d:\n", i, i);
    n += (size_t)snprintf(s + n, MT_YAML_MAX_BYTES - n, "---\na: 1\n");
    expect_refused_fast("a 1 MiB flood of %TAG", s, n, "t.yaml:65: more than 64 %TAG directives");
    /* the same in UTF-16LE, lines ending CR LF */
    size_t u = 0;
    s[u++] = (char)0xFF;
    s[u++] = (char)0xFE;
    for (int i = 0; i < 100; i++) {
        char line[64];
        const int k = snprintf(line, sizeof line, "%%TAG !t%d! tag:x,%d:\r\n", i, i);
        for (int j = 0; j < k; j++) {
            s[u++] = line[j];
            s[u++] = 0;
        }
    }
    expect_refused(s, u, "t.yaml:65: more than 64 %TAG directives");
    free(s);
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
    alias_bomb_fast(bomb, n);
    /* an anchored sequence holding an alias to itself is a cycle */
    const char *cycle = "a: &s [1, *s]\n";
    expect_refused(cycle, strlen(cycle), "t.yaml:1");
    char deep[512];
    n = 0;
    for (int i = 0; i < 70; i++) deep[n++] = '[';
    for (int i = 0; i < 70; i++) deep[n++] = ']';
    expect_refused(deep, n, "nesting deeper than 64");
    deep_flow_lists();
    deep_flow_mappings();
    deep_block();
    depth_limit_edge();
    many_anchors();
    deep_second_document();
    tag_directives();
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
