/* YAML documents with limits (see yaml_doc.h).
 *
 * The document is built here from libyaml's events (yaml_parser_parse)
 * rather than by libyaml's loader (yaml_parser_load), so that the depth and
 * alias limits fire while reading, not after: libyaml's scanner spends time
 * in proportion to the open flow levels ('[', '{') on every token, so a
 * 200 KB "[[[[..." loaded whole before any check took minutes; read event
 * by event, the 65th level stops it at once.  An alias cannot be sized from
 * its event alone, so every anchor records how many nodes and levels it
 * stands for (its own aliases expanded) when its node ends; an alias then
 * adds that whole expansion to the count, and to the depth, the moment it
 * is read.  Anchors are found through a hash table: the loader searched a
 * list per anchor and per alias, which a file of many anchors makes
 * quadratic too.  What the loader did besides (default tags, node marks,
 * its messages for an undefined alias or a duplicate anchor) is done here
 * the same way, so the walkers see the same document.
 */
#include "base/yaml_doc.h"

#include <ctype.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "base/fileio.h"
#include "base/grow.h"

size_t mt_yaml_line(const yaml_node_t *n) {
    return n ? (size_t)n->start_mark.line + 1 : 0;
}

/* An anchor (&name) of the document being read. */
typedef struct {
    char *name;
    int node;         /* its node's id in the document */
    yaml_mark_t mark; /* where its node starts */
    long nodes;       /* nodes it stands for, aliases expanded; -1 while its node is open */
    int height;       /* levels below its node, aliases followed */
} anchor_t;

/* A list or mapping still open, and what its finished children add up to. */
typedef struct {
    int node;   /* its id in the document */
    int key;    /* a mapping's key still waiting for its value; 0: none */
    long nodes; /* nodes in it so far (itself included), aliases expanded */
    int height; /* levels below it so far, aliases followed */
    int anchor; /* its anchor's index, -1 for none */
} frame_t;

typedef struct {
    yaml_parser_t parser;
    yaml_document_t *doc;
    frame_t open[MT_YAML_MAX_DEPTH + 1]; /* nodes sit at depth 0 (the root) to MT_YAML_MAX_DEPTH */
    int depth;                           /* lists and mappings open */
    anchor_t *anchors;
    int n_anchors, cap_anchors;
    int *slots; /* hash of anchor names, open addressing: index + 1, 0 empty */
    size_t n_slots;
    uint64_t seed; /* of the hash */
    long alias_nodes; /* nodes reached once more through aliases */
    const char *name, *what;
    mt_status_t code;
    mt_error_t *err;
} reader_t;

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

/* An error of the kind libyaml's loader (its "composer") reports, worded as
 * the loader words it. */
static mt_status_t composer_error(reader_t *r, const char *context, yaml_mark_t context_mark, const char *problem,
                                  yaml_mark_t problem_mark) {
    r->parser.error = YAML_COMPOSER_ERROR;
    r->parser.context = context;
    r->parser.context_mark = context_mark;
    r->parser.problem = problem;
    r->parser.problem_mark = problem_mark;
    return syntax_error(&r->parser, r->name, r->what, r->code, r->err);
}

static mt_status_t out_of_memory(const reader_t *r) {
    return mt_error_set(r->err, MT_ERR_NOMEM, "%s: out of memory parsing YAML", r->name);
}

static mt_status_t next_event(reader_t *r, yaml_event_t *ev) {
    if (yaml_parser_parse(&r->parser, ev)) return MT_OK;
    return syntax_error(&r->parser, r->name, r->what, r->code, r->err);
}

static mt_status_t too_deep(const reader_t *r, yaml_mark_t at) {
    return mt_error_set(r->err, r->code, "%s:%zu: nesting deeper than %d levels", r->name, (size_t)at.line + 1,
                        MT_YAML_MAX_DEPTH);
}

/* FNV-1a from a seed that differs from one reading to the next, then
 * splitmix64's finalizer so that every bit of it decides the slot: anchor
 * names written to crowd one slot (and make each lookup a search through
 * all of them) cannot be chosen in advance. */
static uint64_t name_hash(uint64_t seed, const char *s) {
    uint64_t h = seed;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
    h = (h ^ (h >> 30)) * 0xbf58476d1ce4e5b9ull;
    h = (h ^ (h >> 27)) * 0x94d049bb133111ebull;
    return h ^ (h >> 31);
}

/* The slot holding name, or the empty slot where it would go. */
static size_t anchor_slot(const reader_t *r, const char *name) {
    const size_t mask = r->n_slots - 1;
    size_t i = (size_t)name_hash(r->seed, name) & mask;
    while (r->slots[i] && strcmp(r->anchors[r->slots[i] - 1].name, name) != 0) i = (i + 1) & mask;
    return i;
}

static anchor_t *anchor_find(const reader_t *r, const char *name) {
    if (!r->n_slots) return NULL;
    const int k = r->slots[anchor_slot(r, name)];
    return k ? &r->anchors[k - 1] : NULL;
}

/* Room for one more anchor with the table at most half full (so probes
 * stay short): doubles it and places every anchor again. */
static void slots_make_room(reader_t *r) {
    if (2 * ((size_t)r->n_anchors + 1) <= r->n_slots) return;
    const size_t n = r->n_slots ? 2 * r->n_slots : 64;
    free(r->slots);
    r->slots = calloc(n, sizeof *r->slots);
    MT_CHECK_ALLOC(r->slots, "YAML anchor table");
    r->n_slots = n;
    for (int k = 0; k < r->n_anchors; k++) r->slots[anchor_slot(r, r->anchors[k].name)] = k + 1;
}

/* Records &name (if any) for node id, which starts at mark; *index is the
 * anchor's index, -1 for none.  A name given twice is refused, as the
 * loader refused it. */
static mt_status_t anchor_add(reader_t *r, const yaml_char_t *name, int id, yaml_mark_t mark, int *index) {
    *index = -1;
    if (!name) return MT_OK;
    const anchor_t *first = anchor_find(r, (const char *)name);
    if (first)
        return composer_error(r, "found duplicate anchor; first occurrence", first->mark, "second occurrence", mark);
    slots_make_room(r);
    MT_GROW(r->anchors, r->cap_anchors, r->n_anchors + 1, "YAML anchors");
    char *copy = strdup((const char *)name);
    MT_CHECK_ALLOC(copy, "YAML anchor name");
    r->anchors[r->n_anchors] = (anchor_t){.name = copy, .node = id, .mark = mark, .nodes = -1};
    r->slots[anchor_slot(r, copy)] = r->n_anchors + 1;
    *index = r->n_anchors++;
    return MT_OK;
}

/* Hangs node id under the innermost open list or mapping (a mapping takes
 * a key, then its value); the root hangs under nothing. */
static mt_status_t node_attach(reader_t *r, int id) {
    if (!r->depth) return MT_OK;
    frame_t *f = &r->open[r->depth - 1];
    int ok = 1;
    if (yaml_document_get_node(r->doc, f->node)->type == YAML_SEQUENCE_NODE) {
        ok = yaml_document_append_sequence_item(r->doc, f->node, id);
    } else if (!f->key) {
        f->key = id;
    } else {
        ok = yaml_document_append_mapping_pair(r->doc, f->node, f->key, id);
        f->key = 0;
    }
    return ok ? MT_OK : out_of_memory(r);
}

/* A node read to its end: the nodes it stands for and the levels below it
 * go to its parent's account. */
static void node_done(reader_t *r, long nodes, int height) {
    if (!r->depth) return;
    frame_t *f = &r->open[r->depth - 1];
    f->nodes += nodes;
    if (height + 1 > f->height) f->height = height + 1;
}

/* No tag, or the non-specific "!", is the default tag of the node's kind
 * (what the loader gave; yaml_document_add_* take NULL for it). */
static const yaml_char_t *node_tag(const yaml_char_t *tag) {
    return tag && strcmp((const char *)tag, "!") != 0 ? tag : NULL;
}

/* Adds the node a scalar or a list or mapping start makes, with the event's
 * marks (yaml_document_add_* leave them zero), and hangs it in place.  A
 * list's or mapping's end mark is set at its end event. */
static mt_status_t node_add(reader_t *r, const yaml_event_t *ev, int *id) {
    if (ev->type == YAML_SCALAR_EVENT) {
        *id = yaml_document_add_scalar(r->doc, node_tag(ev->data.scalar.tag), ev->data.scalar.value,
                                       (int)ev->data.scalar.length, ev->data.scalar.style);
    } else if (ev->type == YAML_SEQUENCE_START_EVENT) {
        *id = yaml_document_add_sequence(r->doc, node_tag(ev->data.sequence_start.tag),
                                         ev->data.sequence_start.style);
    } else {
        *id = yaml_document_add_mapping(r->doc, node_tag(ev->data.mapping_start.tag), ev->data.mapping_start.style);
    }
    if (!*id) return out_of_memory(r);
    yaml_node_t *n = yaml_document_get_node(r->doc, *id);
    n->start_mark = ev->start_mark;
    n->end_mark = ev->end_mark;
    return node_attach(r, *id);
}

static mt_status_t on_scalar(reader_t *r, const yaml_event_t *ev) {
    if (r->depth > MT_YAML_MAX_DEPTH) return too_deep(r, ev->start_mark);
    int id, a;
    mt_status_t st = node_add(r, ev, &id);
    if (st == MT_OK) st = anchor_add(r, ev->data.scalar.anchor, id, ev->start_mark, &a);
    if (st != MT_OK) return st;
    if (a >= 0) r->anchors[a].nodes = 1;
    node_done(r, 1, 0);
    return MT_OK;
}

/* A list or mapping starts: refused past the depth limit, before libyaml
 * reads any further into it. */
static mt_status_t on_start(reader_t *r, const yaml_event_t *ev) {
    if (r->depth > MT_YAML_MAX_DEPTH) return too_deep(r, ev->start_mark);
    const yaml_char_t *anchor = ev->type == YAML_SEQUENCE_START_EVENT ? ev->data.sequence_start.anchor
                                                                      : ev->data.mapping_start.anchor;
    int id, a;
    mt_status_t st = node_add(r, ev, &id);
    if (st == MT_OK) st = anchor_add(r, anchor, id, ev->start_mark, &a);
    if (st != MT_OK) return st;
    r->open[r->depth++] = (frame_t){.node = id, .nodes = 1, .anchor = a};
    return MT_OK;
}

/* A list or mapping ends: its anchor now knows what an alias to it means. */
static void on_end(reader_t *r, const yaml_event_t *ev) {
    const frame_t f = r->open[--r->depth];
    yaml_document_get_node(r->doc, f.node)->end_mark = ev->end_mark;
    if (f.anchor >= 0) {
        r->anchors[f.anchor].nodes = f.nodes;
        r->anchors[f.anchor].height = f.height;
    }
    node_done(r, f.nodes, f.height);
}

/* An alias reaches its anchor's node once more, with everything under it:
 * that many nodes are counted, that many levels added to the depth here.
 * An alias inside the very node it names is a cycle, endless both ways. */
static mt_status_t on_alias(reader_t *r, const yaml_event_t *ev) {
    const anchor_t *a = anchor_find(r, (const char *)ev->data.alias.anchor);
    if (!a) return composer_error(r, NULL, ev->start_mark, "found undefined alias", ev->start_mark);
    const size_t line = (size_t)ev->start_mark.line + 1, target = (size_t)a->mark.line + 1;
    if (a->nodes < 0)
        return mt_error_set(r->err, r->code,
                            "%s:%zu: nesting deeper than %d levels (the alias here names the list or mapping of "
                            "line %zu, which holds it: a cycle)",
                            r->name, line, MT_YAML_MAX_DEPTH, target);
    if (r->depth + a->height > MT_YAML_MAX_DEPTH)
        return mt_error_set(r->err, r->code,
                            "%s:%zu: nesting deeper than %d levels (the alias here repeats the node of line %zu "
                            "and the %d levels under it)",
                            r->name, line, MT_YAML_MAX_DEPTH, target, a->height);
    if (r->alias_nodes + a->nodes > MT_YAML_MAX_ALIAS_NODES)
        return mt_error_set(r->err, r->code,
                            "%s:%zu: aliases expand to more than %d nodes (an alias here reaches the node "
                            "of line %zu once more; nested '*anchor' lists multiply); write the values out "
                            "instead",
                            r->name, line, MT_YAML_MAX_ALIAS_NODES, target);
    r->alias_nodes += a->nodes;
    node_done(r, a->nodes, a->height);
    return node_attach(r, a->node);
}

/* The document's nodes, from after its start event through its end event. */
static mt_status_t read_nodes(reader_t *r) {
    for (;;) {
        yaml_event_t ev;
        mt_status_t st = next_event(r, &ev);
        if (st != MT_OK) return st;
        const yaml_event_type_t type = ev.type;
        if (type == YAML_SCALAR_EVENT) {
            st = on_scalar(r, &ev);
        } else if (type == YAML_ALIAS_EVENT) {
            st = on_alias(r, &ev);
        } else if (type == YAML_SEQUENCE_START_EVENT || type == YAML_MAPPING_START_EVENT) {
            st = on_start(r, &ev);
        } else if (type == YAML_SEQUENCE_END_EVENT || type == YAML_MAPPING_END_EVENT) {
            on_end(r, &ev);
        } else if (type == YAML_DOCUMENT_END_EVENT) {
            r->doc->end_implicit = ev.data.document_end.implicit;
            r->doc->end_mark = ev.end_mark;
        }
        yaml_event_delete(&ev);
        if (st != MT_OK || type == YAML_DOCUMENT_END_EVENT) return st;
    }
}

/* A document, from its start event (ev) through its end event, into doc;
 * *made says whether doc was initialized (and is to be deleted), which it
 * is unless memory ran out at once.  Anchors and the alias count are the
 * document's own. */
static mt_status_t read_document(reader_t *r, const yaml_event_t *ev, yaml_document_t *doc, bool *made) {
    *made = yaml_document_initialize(doc, ev->data.document_start.version_directive,
                                     ev->data.document_start.tag_directives.start,
                                     ev->data.document_start.tag_directives.end, ev->data.document_start.implicit, 0);
    if (!*made) return out_of_memory(r);
    doc->start_mark = ev->start_mark;
    for (int k = 0; k < r->n_anchors; k++) free(r->anchors[k].name);
    r->n_anchors = 0;
    if (r->slots) memset(r->slots, 0, r->n_slots * sizeof *r->slots);
    r->alias_nodes = 0;
    r->depth = 0;
    r->doc = doc;
    return read_nodes(r);
}

/* After the document, the stream must end.  A second document is read as
 * the first (as libyaml's loader read it whole before): its syntax error, an
 * undefined alias or a duplicate anchor is reported as such; otherwise it is
 * refused naming the line of its first node, as soon as it is read through
 * or a limit stops reading it. */
static mt_status_t expect_stream_end(reader_t *r) {
    yaml_event_t ev;
    mt_status_t st = next_event(r, &ev);
    if (st != MT_OK) return st;
    if (ev.type != YAML_DOCUMENT_START_EVENT) {
        yaml_event_delete(&ev);
        return MT_OK;
    }
    yaml_document_t more;
    bool made;
    st = read_document(r, &ev, &more, &made);
    yaml_event_delete(&ev);
    if (!made) return st;
    const size_t line = mt_yaml_line(yaml_document_get_root_node(&more));
    yaml_document_delete(&more);
    if (st != MT_OK && (r->parser.error != YAML_NO_ERROR || st == MT_ERR_NOMEM)) return st;
    return mt_error_set(r->err, r->code, "%s:%zu: a second YAML document; a %s is one document", r->name, line,
                        r->what);
}

/* The stream: empty (a document without nodes, root NULL), or one document. */
static mt_status_t read_stream(reader_t *r, mt_yaml_doc_t *d) {
    yaml_event_t ev;
    mt_status_t st = next_event(r, &ev); /* the stream's start */
    if (st != MT_OK) return st;
    yaml_event_delete(&ev);
    if ((st = next_event(r, &ev)) != MT_OK) return st;
    if (ev.type == YAML_STREAM_END_EVENT) {
        yaml_event_delete(&ev);
        if (!yaml_document_initialize(&d->doc, NULL, NULL, NULL, 0, 0)) return out_of_memory(r);
        d->loaded = true;
        return MT_OK;
    }
    st = read_document(r, &ev, &d->doc, &d->loaded);
    yaml_event_delete(&ev);
    if (st != MT_OK) return st;
    d->root = yaml_document_get_root_node(&d->doc);
    return expect_stream_end(r);
}

/* The code unit at unit index i: a byte of UTF-8, or a UTF-16 unit (w 2)
 * in the byte order be says; 0 past the end. */
static unsigned text_unit(const unsigned char *s, size_t n, size_t i, int w, bool be) {
    if (w == 1) return i < n ? s[i] : 0;
    if (2 * i + 1 >= n) return 0;
    return be ? (unsigned)s[2 * i] << 8 | s[2 * i + 1] : (unsigned)s[2 * i + 1] << 8 | s[2 * i];
}

/* Units in the line break at unit i, as libyaml's scanner knows them (LF,
 * CR, CR LF, NEL, LS, PS; in UTF-8 the last three are several bytes); 0
 * for none. */
static size_t line_break(const unsigned char *s, size_t n, size_t i, int w, bool be) {
    const unsigned c = text_unit(s, n, i, w, be);
    if (c == '\r') return text_unit(s, n, i + 1, w, be) == '\n' ? 2 : 1;
    if (c == '\n') return 1;
    if (w == 2) return c == 0x85 || c == 0x2028 || c == 0x2029;
    if (c == 0xC2) return text_unit(s, n, i + 1, w, be) == 0x85 ? 2 : 0;
    if (c != 0xE2 || text_unit(s, n, i + 1, w, be) != 0x80) return 0;
    const unsigned c2 = text_unit(s, n, i + 2, w, be);
    return c2 == 0xA8 || c2 == 0xA9 ? 3 : 0;
}

/* libyaml's parser checks each %TAG directive against all before it, and
 * resolves every tag by a search through them: 80,000 of them, within the
 * size limit, took 5 to 50 s.  So they are counted before libyaml reads
 * anything: each line that starts "%TAG" and a blank, in the encoding
 * libyaml will read (UTF-16 after its byte-order mark, else UTF-8, after
 * one if there is one).  A line of a multi-line string that starts so
 * counts too, which errs on the safe side.  Returns the line of the first
 * directive past the limit, 0 if none. */
static size_t tag_directive_past_limit(const char *text, size_t len) {
    const unsigned char *s = (const unsigned char *)text;
    const bool utf16 = len >= 2 && ((s[0] == 0xFF && s[1] == 0xFE) || (s[0] == 0xFE && s[1] == 0xFF));
    const int w = utf16 ? 2 : 1;
    const bool be = utf16 && s[0] == 0xFE;
    const size_t n = len / (size_t)w;
    size_t line = 1, count = 0;
    const bool utf8_bom = len >= 3 && s[0] == 0xEF && s[1] == 0xBB && s[2] == 0xBF;
    for (size_t i = utf16 ? 1 : utf8_bom ? 3 : 0; i < n;) {
        const unsigned c4 = text_unit(s, len, i + 4, w, be);
        if (text_unit(s, len, i, w, be) == '%' && text_unit(s, len, i + 1, w, be) == 'T' &&
            text_unit(s, len, i + 2, w, be) == 'A' && text_unit(s, len, i + 3, w, be) == 'G' &&
            (c4 == ' ' || c4 == '\t') && ++count > MT_YAML_MAX_TAG_DIRECTIVES)
            return line;
        size_t b = 0;
        while (i < n && !(b = line_break(s, len, i, w, be))) i++;
        i += b;
        line++;
    }
    return 0;
}

mt_status_t mt_yaml_doc_parse(mt_yaml_doc_t *d, const char *text, size_t len, const char *name, const char *what,
                              mt_status_t code, mt_error_t *err) {
    memset(d, 0, sizeof *d);
    if (len > MT_YAML_MAX_BYTES)
        return mt_error_set(err, code, "%s: %s of %zu bytes is over the limit of %zu bytes", name, what, len,
                            MT_YAML_MAX_BYTES);
    const size_t tag_line = tag_directive_past_limit(text, len);
    if (tag_line)
        return mt_error_set(err, code, "%s:%zu: more than %d %%TAG directives; a %s needs none", name, tag_line,
                            MT_YAML_MAX_TAG_DIRECTIVES, what);
    reader_t *r = calloc(1, sizeof *r);
    MT_CHECK_ALLOC(r, "YAML reader");
    *r = (reader_t){.name = name, .what = what, .code = code, .err = err};
    r->seed = 14695981039346656037ull ^ (uint64_t)(uintptr_t)r ^ (uint64_t)(mt_now_s() * 1e9);
    MT_CHECK(yaml_parser_initialize(&r->parser), "yaml_parser_initialize: out of memory");
    yaml_parser_set_input_string(&r->parser, (const unsigned char *)text, len);
    mt_status_t st = read_stream(r, d);
    for (int k = 0; k < r->n_anchors; k++) free(r->anchors[k].name);
    free(r->anchors);
    free(r->slots);
    yaml_parser_delete(&r->parser);
    free(r);
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
