/* One key of a run config's dataset entry (datasets:, test_datasets:):
 * its type, fields, message mappings, trained roles, EOS rule and weight.
 * The walk over the entries is config.c's. */
#include <stdio.h>
#include <string.h>

#include "engine/config/config.h"
#include "engine/config/config_rows.h"
#include "engine/config/values.h"

static const enum_name_t k_data_type_names[] = {
    {"completion", ENG_DATA_COMPLETION},       {"pretrain", ENG_DATA_COMPLETION},
    {"chat_template", ENG_DATA_CHAT_TEMPLATE}, {"alpaca", ENG_DATA_ALPACA},
    {"input_output", ENG_DATA_INPUT_OUTPUT},   {NULL, 0},
};
static const enum_name_t k_train_on_eos_names[] = {
    {"turn", ENG_EOS_TURN}, {"all", ENG_EOS_ALL}, {"last", ENG_EOS_LAST}, {"none", ENG_EOS_NONE}, {NULL, 0},
};

/* A dataset entry's string key that names one of a set. */
static mt_status_t dataset_enum(pctx_t *c, yaml_node_t *v, const char *key, const enum_name_t *names, int *out) {
    if (!v || v->type != YAML_SCALAR_NODE) return eng_cfg_expected(c, v, key, "a string");
    const char *t = (const char *)v->data.scalar.value;
    char list[256] = "";
    size_t used = 0;
    for (const enum_name_t *e = names; e->name; e++) {
        if (strcmp(t, e->name) == 0) {
            *out = e->value;
            return MT_OK;
        }
        used += (size_t)snprintf(list + used, sizeof list - used, "%s%s", e == names ? "" : ", ", e->name);
    }
    return eng_cfg_fail(c, v, "%s: '%.200s' is not accepted; expected one of %s%s", key, t, list,
                        names == k_data_type_names ? ", or leave type out for tokenized rows (input_ids)" : "");
}

/* message_property_mappings: {role: KEY, content: KEY}, the message keys a
 * conversation's rows use instead of role and content. */
static mt_status_t dataset_mappings(pctx_t *c, yaml_node_t *v, const char *key, eng_dataset_entry_t *d) {
    if (!v || v->type != YAML_MAPPING_NODE) return eng_cfg_expected(c, v, key, "a mapping {role: KEY, content: KEY}");
    for (yaml_node_pair_t *p = v->data.mapping.pairs.start; p < v->data.mapping.pairs.top; p++) {
        yaml_node_t *k = yaml_document_get_node(c->doc, p->key);
        yaml_node_t *val = yaml_document_get_node(c->doc, p->value);
        const char *name = k && k->type == YAML_SCALAR_NODE ? (const char *)k->data.scalar.value : "";
        char sub[320];
        snprintf(sub, sizeof sub, "%s.%.100s", key, name);
        mt_status_t st;
        if (strcmp(name, "role") == 0) st = eng_cfg_take_string(c, val, sub, false, d->role_key, sizeof d->role_key);
        else if (strcmp(name, "content") == 0) st = eng_cfg_take_string(c, val, sub, false, d->content_key, sizeof d->content_key);
        else st = eng_cfg_fail(c, k, "%s: unknown key '%.100s'; expected role or content", key, name);
        if (st != MT_OK) return st;
    }
    return MT_OK;
}

static mt_status_t dataset_roles(pctx_t *c, yaml_node_t *v, const char *key, eng_dataset_entry_t *d) {
    if (!v || v->type != YAML_SEQUENCE_NODE) return eng_cfg_expected(c, v, key, "a list of role names");
    d->num_roles_to_train = 0;
    for (yaml_node_item_t *it = v->data.sequence.items.start; it < v->data.sequence.items.top; it++) {
        if (d->num_roles_to_train == ENG_MAX_TRAIN_ROLES)
            return eng_cfg_fail(c, v, "%s: more than %d roles", key, ENG_MAX_TRAIN_ROLES);
        yaml_node_t *e = yaml_document_get_node(c->doc, *it);
        char *dst = d->roles_to_train[d->num_roles_to_train++];
        mt_status_t st = eng_cfg_take_string(c, e, key, false, dst, sizeof d->roles_to_train[0]);
        if (st != MT_OK) return st;
    }
    return MT_OK;
}

/* One key of a dataset entry (the table k_dataset_rows names them). */
mt_status_t eng_cfg_dataset_key(pctx_t *c, const char *list, const char *name, yaml_node_t *v, int index,
                               eng_dataset_entry_t *d) {
    char key[192];
    snprintf(key, sizeof key, "%.120s[%d].%s", list, index, name);
    int e;
    mt_status_t st;
    if (strcmp(name, "path") == 0) return eng_cfg_take_string(c, v, key, true, d->path, sizeof d->path);
    if (strcmp(name, "field") == 0) return eng_cfg_take_string(c, v, key, false, d->field, sizeof d->field);
    if (strcmp(name, "field_messages") == 0)
        return eng_cfg_take_string(c, v, key, false, d->field_messages, sizeof d->field_messages);
    if (strcmp(name, "message_property_mappings") == 0) return dataset_mappings(c, v, key, d);
    if (strcmp(name, "roles_to_train") == 0) return dataset_roles(c, v, key, d);
    if (strcmp(name, "weight") == 0) {
        /* up to 1000: a bigger one repeats a file's examples a thousand times an epoch, surely a typo */
        if (!v || !eng_yaml_number(v, &d->weight) || !(d->weight > 0 && d->weight <= 1000))
            return eng_cfg_fail(c, v, "%s: expected a number in (0, 1000]", key);
        return MT_OK;
    }
    if (strcmp(name, "type") == 0) {
        if ((st = dataset_enum(c, v, key, k_data_type_names, &e)) == MT_OK) d->type = (eng_data_type_t)e;
        return st;
    }
    if ((st = dataset_enum(c, v, key, k_train_on_eos_names, &e)) == MT_OK) d->train_on_eos = (eng_train_on_eos_t)e;
    return st;
}

