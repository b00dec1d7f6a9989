/* Private to the config library: YAML 1.1 scalar typing (as PyYAML, which
 * axolotl reads its configs with, types plain scalars) and YAML -> JSON for
 * the `model_config:` mapping.  See values.c for the rules. */
#ifndef MT_ENGINE_CONFIG_VALUES_H
#define MT_ENGINE_CONFIG_VALUES_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <yaml.h>

/* Plain `~`, `null`, `Null`, `NULL` or empty. */
bool eng_yaml_is_null(const yaml_node_t *n);
/* Plain scalar that is a YAML 1.1 integer (decimal, 0x, 0b, leading-0
 * octal, `_` separators) fitting int64 / uint64. */
bool eng_yaml_int(const yaml_node_t *n, int64_t *v);
bool eng_yaml_u64(const yaml_node_t *n, uint64_t *v);
/* Plain scalar that is an integer or a float (.inf, .nan included). */
bool eng_yaml_number(const yaml_node_t *n, double *v);
/* Plain true/false/yes/no/on/off in PyYAML's spellings. */
bool eng_yaml_bool(const yaml_node_t *n, bool *v);
/* Node (mapping, list or scalar) -> new JSON value; NULL with a message in
 * msg and the offending node in *bad when it cannot be represented. */
json_t *eng_yaml_to_json(yaml_document_t *doc, const yaml_node_t *n, char *msg, size_t cap,
                         const yaml_node_t **bad);

#endif
