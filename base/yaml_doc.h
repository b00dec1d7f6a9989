/* One YAML document, parsed with limits (the one YAML reader of moetune).
 *
 * The run config (engine/config/config.c) and the hardware profiles
 * (scheduler/hw.c) both read YAML into libyaml's document API, whose nodes
 * carry their position, and then walk it with their own key tables.  The
 * parsing and the limits live here, once:
 *  - input size (MT_YAML_MAX_BYTES): a config is a few KiB; a larger file is
 *    a mistake, not a config, and is refused before it is read whole;
 *  - nesting depth (MT_YAML_MAX_DEPTH): walkers recurse, and follow
 *    aliases, so the levels an alias repeats count where it stands;
 *  - alias expansion (MT_YAML_MAX_ALIAS_NODES): an alias is a reference to
 *    an earlier node, so a handful of lines can name 10^9 nodes (the
 *    "billion laughs" bomb) and a walker that follows them (converting
 *    model_config: to JSON, say) would grow without bound.  Every node
 *    reached again through an alias is counted; past the limit the
 *    document is refused, naming file:line of the alias that crossed it;
 *  - %TAG directives (MT_YAML_MAX_TAG_DIRECTIVES): libyaml checks each
 *    against all before it, so 80,000 of them (within the size limit) took
 *    5 to 50 s; no config needs any.  They are counted on the text before
 *    libyaml reads it;
 *  - exactly one document in the stream.
 * Both limits are checked while the text is read, so reading stops at the
 * first node past one: a text nested 100,000 deep is refused at its 65th
 * level in milliseconds (libyaml's own loader, reading it whole first,
 * took minutes).
 * Messages name "FILE:LINE" (mt_yaml_line). */
#ifndef MT_BASE_YAML_DOC_H
#define MT_BASE_YAML_DOC_H

#include <stdbool.h>
#include <stddef.h>
#include <yaml.h>

#include "base/status.h"

#define MT_YAML_MAX_BYTES ((size_t)1 << 20)
#define MT_YAML_MAX_DEPTH 64
#define MT_YAML_MAX_ALIAS_NODES 10000
#define MT_YAML_MAX_TAG_DIRECTIVES 64

typedef struct {
    yaml_document_t doc;
    bool loaded;
    yaml_node_t *root; /* NULL for an empty document */
} mt_yaml_doc_t;

/* Parses text (len bytes) into d.  name ("cfgs/run.yaml", "--set 'a=b'")
 * leads every message; what ("run config") says what the text is.  Every
 * failure (syntax, limits, a second document) is `code`. */
mt_status_t mt_yaml_doc_parse(mt_yaml_doc_t *d, const char *text, size_t len, const char *name, const char *what,
                              mt_status_t code, mt_error_t *err);

/* Reads path (a regular file, at most MT_YAML_MAX_BYTES) and parses it.
 * Failing to read is MT_ERR_IO; everything else is `code`. */
mt_status_t mt_yaml_doc_load(mt_yaml_doc_t *d, const char *path, const char *what, mt_status_t code,
                             mt_error_t *err);

void mt_yaml_doc_free(mt_yaml_doc_t *d);

/* 1-based line of a node (0 for NULL). */
size_t mt_yaml_line(const yaml_node_t *n);

/* What a node is, for "expected X, got Y" messages: "a mapping", "a list",
 * 'value', the quoted string "value", or "nothing" for NULL. */
void mt_yaml_describe(const yaml_node_t *n, char *out, size_t cap);

/* How far a misspelled key is from a valid one ("did you mean"): the
 * optimal-string-alignment distance (Levenshtein plus adjacent swaps),
 * case-insensitive; (size_t)-1 for keys over 126 characters. */
size_t mt_yaml_key_distance(const char *a, const char *b);

#endif
