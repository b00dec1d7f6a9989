/* YAML documents with limits (see yaml_doc.h). */
#include "base/yaml_doc.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/fileio.h"

size_t mt_yaml_line(const yaml_node_t *n) {
    return n ? (size_t)n->start_mark.line + 1 : 0;
}

typedef struct {
    yaml_document_t *doc;
    unsigned char *seen; /* per node: reached once already */
    long repeats;        /* visits of nodes already seen: what aliases add */
    const char *name;
    mt_status_t code;
    mt_error_t *err;
} walk_t;

/* Depth-first over the graph as a walker sees it, aliases followed. */
static mt_status_t walk(walk_t *w, const yaml_node_t *n, const yaml_node_t *parent, int depth) {
    if (!n) return MT_OK;
    if (depth > MT_YAML_MAX_DEPTH)
        return mt_error_set(w->err, w->code, "%s:%zu: nesting deeper than %d levels", w->name, mt_yaml_line(n),
                            MT_YAML_MAX_DEPTH);
    const size_t i = (size_t)(n - w->doc->nodes.start);
    if (w->seen[i]) {
        if (++w->repeats > MT_YAML_MAX_ALIAS_NODES)
            return mt_error_set(w->err, w->code,
                                "%s:%zu: aliases expand to more than %d nodes (an alias here reaches the node "
                                "of line %zu once more; nested '*anchor' lists multiply); write the values out "
                                "instead",
                                w->name, mt_yaml_line(parent ? parent : n), MT_YAML_MAX_ALIAS_NODES,
                                mt_yaml_line(n));
    }
    w->seen[i] = 1;
    if (n->type == YAML_SEQUENCE_NODE) {
        for (yaml_node_item_t *it = n->data.sequence.items.start; it < n->data.sequence.items.top; it++) {
            mt_status_t st = walk(w, yaml_document_get_node(w->doc, *it), n, depth + 1);
            if (st != MT_OK) return st;
        }
    } else if (n->type == YAML_MAPPING_NODE) {
        for (yaml_node_pair_t *p = n->data.mapping.pairs.start; p < n->data.mapping.pairs.top; p++) {
            mt_status_t st = walk(w, yaml_document_get_node(w->doc, p->key), n, depth + 1);
            if (st == MT_OK) st = walk(w, yaml_document_get_node(w->doc, p->value), n, depth + 1);
            if (st != MT_OK) return st;
        }
    }
    return MT_OK;
}

/* libyaml's own description of a syntax error, with line and column. */
static mt_status_t syntax_error(const yaml_parser_t *p, const char *where, const char *what, mt_status_t code,
                                mt_error_t *err) {
    (void)what;
    if (p->error == YAML_MEMORY_ERROR) return mt_error_set(err, MT_ERR_NOMEM, "%s: out of memory parsing YAML", where);
    const char *problem = p->problem ? p->problem : "unknown error";
    if (p->error == YAML_READER_ERROR)
        return mt_error_set(err, code, "%s: invalid YAML: %s at byte %zu", where, problem, (size_t)p->problem_offset);
    size_t line = p->problem_mark.line + 1, col = p->problem_mark.column + 1;
    if (p->context)
        return mt_error_set(err, code, "%s:%zu:%zu: invalid YAML: %s (%s at line %zu, column %zu)", where, line, col,
                            problem, p->context, (size_t)p->context_mark.line + 1, (size_t)p->context_mark.column + 1);
    return mt_error_set(err, code, "%s:%zu:%zu: invalid YAML: %s", where, line, col, problem);
}

mt_status_t mt_yaml_doc_parse(mt_yaml_doc_t *d, const char *text, size_t len, const char *name, const char *what,
                              mt_status_t code, mt_error_t *err) {
    memset(d, 0, sizeof *d);
    if (len > MT_YAML_MAX_BYTES)
        return mt_error_set(err, code, "%s: %s of %zu bytes is over the limit of %zu bytes", name, what, len,
                            MT_YAML_MAX_BYTES);
    yaml_parser_t parser;
    MT_CHECK(yaml_parser_initialize(&parser), "yaml_parser_initialize: out of memory");
    yaml_parser_set_input_string(&parser, (const unsigned char *)text, len);
    if (!yaml_parser_load(&parser, &d->doc)) {
        mt_status_t st = syntax_error(&parser, name, what, code, err);
        yaml_parser_delete(&parser);
        return st;
    }
    d->loaded = true;
    d->root = yaml_document_get_root_node(&d->doc);
    mt_status_t st = MT_OK;
    if (d->root) {
        yaml_document_t more;
        if (!yaml_parser_load(&parser, &more)) {
            st = syntax_error(&parser, name, what, code, err);
        } else {
            const yaml_node_t *r2 = yaml_document_get_root_node(&more);
            if (r2)
                st = mt_error_set(err, code, "%s:%zu: a second YAML document; a %s is one document", name,
                                  mt_yaml_line(r2), what);
            yaml_document_delete(&more);
        }
    }
    yaml_parser_delete(&parser);
    if (st == MT_OK && d->root) {
        const size_t count = (size_t)(d->doc.nodes.top - d->doc.nodes.start);
        walk_t w = {.doc = &d->doc, .seen = calloc(count ? count : 1, 1), .name = name, .code = code, .err = err};
        MT_CHECK_ALLOC(w.seen, "YAML node marks");
        st = walk(&w, d->root, NULL, 0);
        free(w.seen);
    }
    if (st != MT_OK) mt_yaml_doc_free(d);
    return st;
}

mt_status_t mt_yaml_doc_load(mt_yaml_doc_t *d, const char *path, const char *what, mt_status_t code,
                             mt_error_t *err) {
    memset(d, 0, sizeof *d);
    char *buf;
    size_t len;
    mt_status_t st = mt_read_regular_file(path, what, MT_YAML_MAX_BYTES, &buf, &len, err);
    if (st != MT_OK) return st;
    st = mt_yaml_doc_parse(d, buf, len, path, what, code, err);
    free(buf);
    return st;
}

void mt_yaml_doc_free(mt_yaml_doc_t *d) {
    if (d->loaded) yaml_document_delete(&d->doc);
    memset(d, 0, sizeof *d);
}

/* Optimal-string-alignment distance (Levenshtein plus adjacent swaps),
 * case-insensitive: typos and transposed letters both count as one edit. */
size_t mt_yaml_key_distance(const char *a, const char *b) {
    size_t n = strlen(a), m = strlen(b);
    if (n > 126 || m > 126) return (size_t)-1;
    size_t d[128][128];
    for (size_t i = 0; i <= n; i++) d[i][0] = i;
    for (size_t j = 0; j <= m; j++) d[0][j] = j;
    for (size_t i = 1; i <= n; i++) {
        for (size_t j = 1; j <= m; j++) {
            int ca = tolower((unsigned char)a[i - 1]), cb = tolower((unsigned char)b[j - 1]);
            size_t cost = ca != cb;
            size_t v = d[i - 1][j] + 1;
            if (d[i][j - 1] + 1 < v) v = d[i][j - 1] + 1;
            if (d[i - 1][j - 1] + cost < v) v = d[i - 1][j - 1] + cost;
            if (i > 1 && j > 1 && ca == tolower((unsigned char)b[j - 2]) &&
                tolower((unsigned char)a[i - 2]) == cb && d[i - 2][j - 2] + 1 < v)
                v = d[i - 2][j - 2] + 1;
            d[i][j] = v;
        }
    }
    return d[n][m];
}

void mt_yaml_describe(const yaml_node_t *n, char *out, size_t cap) {
    if (!n) {
        snprintf(out, cap, "nothing");
    } else if (n->type == YAML_MAPPING_NODE) {
        snprintf(out, cap, "a mapping");
    } else if (n->type == YAML_SEQUENCE_NODE) {
        snprintf(out, cap, "a list");
    } else if (n->data.scalar.style == YAML_PLAIN_SCALAR_STYLE) {
        snprintf(out, cap, "'%.200s'", (const char *)n->data.scalar.value);
    } else {
        snprintf(out, cap, "the quoted string \"%.200s\"", (const char *)n->data.scalar.value);
    }
}
