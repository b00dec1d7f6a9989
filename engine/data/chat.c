/* Conversations (datasets[].type chat_template, see text.h): a row's
 * messages rendered by the chat template, encoded, and labelled.
 *
 * Design notes:
 * - Rendering is transformers' apply_chat_template(tokenize=False): the
 *   messages prepared as it prepares them (text_chat_messages_prepare), the
 *   tokenizer's special tokens as variables, add_generation_prompt false,
 *   the row's tools when it has them.  Encoding adds no special tokens (the
 *   template writes BOS where the model wants it), as transformers does.
 * - Which bytes are trained.  A template that marks {% generation %} says it
 *   itself, and its mask is transformers' return_assistant_tokens_mask.
 *   Otherwise a trained message's bytes are found by rendering the
 *   conversation again with that message's content (and reasoning) replaced
 *   by a marker: the two texts agree before the message's text and after
 *   it, so the first and last difference bound it.  This holds for
 *   templates that render a turn differently by its position (Qwen3 drops
 *   the reasoning of turns before the last user message), where rendering
 *   prefixes of the conversation would not.
 * - The EOS that ends a turn is template text right after the turn's
 *   content: trained when train_on_eos says so and nothing but template
 *   text lies between.
 * - A token is trained when any of its bytes is (transformers' char_to_token
 *   over each trained span gives the same tokens). */
#include "engine/data/chat.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Stands in for a message's text in the second render: plain ASCII that no
 * template filter changes and no real message holds. */
#define TURN_MARKER "\x1fmoetune-turn-marker\x1f"

static const char *const k_roles[] = {"system", "user", "assistant", "tool", "developer", "function", "ipython"};

static bool known_role(const char *r) {
    for (size_t i = 0; i < sizeof k_roles / sizeof *k_roles; i++)
        if (strcmp(r, k_roles[i]) == 0) return true;
    return false;
}

static bool trains_role(const eng_dataset_entry_t *d, const char *role) {
    for (int i = 0; i < d->num_roles_to_train; i++)
        if (strcmp(d->roles_to_train[i], role) == 0) return true;
    return false;
}

/* The row's messages with role and content under their standard names,
 * every other key kept; checked: a list of objects with a known role. */
static mt_status_t messages_of(const eng_dataset_entry_t *d, const json_t *row, const char *where, json_t **out,
                               mt_error_t *err) {
    const json_t *in = json_object_get(row, d->field_messages);
    if (!json_is_array(in) || json_array_size(in) == 0)
        return mt_error_set(err, MT_ERR_DATA, "%s: \"%s\" is %s; expected a non-empty list of messages", where,
                            d->field_messages, !in ? "missing" : json_is_array(in) ? "empty" : "not a list");
    json_t *msgs = json_array();
    MT_CHECK_ALLOC(msgs, "messages");
    size_t i;
    const json_t *m;
    json_array_foreach(in, i, m) {
        const json_t *role = json_object_get(m, d->role_key), *content = json_object_get(m, d->content_key);
        mt_status_t st = MT_OK;
        if (!json_is_object(m)) st = mt_error_set(err, MT_ERR_DATA, "%s: message %zu is not an object", where, i);
        else if (!json_is_string(role))
            st = mt_error_set(err, MT_ERR_DATA, "%s: message %zu has no \"%s\" string", where, i, d->role_key);
        else if (!known_role(json_string_value(role)))
            st = mt_error_set(err, MT_ERR_DATA,
                              "%s: message %zu has role '%.100s'; expected system, user, assistant, tool or developer",
                              where, i, json_string_value(role));
        else if (content && !json_is_null(content) && !json_is_string(content) && !json_is_array(content))
            st = mt_error_set(err, MT_ERR_DATA, "%s: message %zu's \"%s\" is neither a string nor a list", where, i,
                              d->content_key);
        if (st != MT_OK) {
            json_decref(msgs);
            return st;
        }
        json_t *c = json_deep_copy(m);
        MT_CHECK_ALLOC(c, "message");
        if (strcmp(d->role_key, "role") != 0) {
            json_object_set(c, "role", (json_t *)role);
            json_object_del(c, d->role_key);
        }
        if (strcmp(d->content_key, "content") != 0 && content) {
            json_object_set(c, "content", (json_t *)content);
            json_object_del(c, d->content_key);
        }
        json_array_append_new(msgs, c);
    }
    *out = text_chat_messages_prepare(msgs);
    json_decref(msgs);
    return MT_OK;
}

static mt_status_t render(const eng_text_t *t, const json_t *msgs, const json_t *tools, const char *where,
                          text_render_t *r, mt_error_t *err) {
    json_t *ctx = json_deep_copy(t->special);
    MT_CHECK_ALLOC(ctx, "template variables");
    json_object_set(ctx, "messages", (json_t *)msgs);
    json_object_set_new(ctx, "add_generation_prompt", json_false());
    if (tools) json_object_set(ctx, "tools", (json_t *)tools);
    /* a fixed clock: strftime_now() must not make two renders differ */
    mt_status_t st = text_template_render_at(t->tmpl, ctx, 0, r, err);
    json_decref(ctx);
    return st == MT_OK ? MT_OK : mt_error_prefix(err, "%s: the chat template failed: ", where);
}

/* Marks the bytes of message i in r (see the file note) in trained[];
 * *end receives where its text ends. */
static mt_status_t mark_turn(const eng_text_t *t, const json_t *msgs, const json_t *tools, size_t i,
                             const text_render_t *r, uint8_t *trained, size_t *end, const char *where,
                             mt_error_t *err) {
    json_t *alt = json_deep_copy(msgs);
    MT_CHECK_ALLOC(alt, "messages");
    json_t *m = json_array_get(alt, i);
    static const char *const k_text_keys[] = {"reasoning_content", "thinking"};
    for (size_t k = 0; k < sizeof k_text_keys / sizeof *k_text_keys; k++)
        if (json_is_string(json_object_get(m, k_text_keys[k])))
            json_object_set_new(m, k_text_keys[k], json_string(TURN_MARKER));
    /* content always: an empty one (a tool-call turn) still has a place,
     * where its end-of-turn token follows */
    if (!json_is_array(json_object_get(m, "content"))) json_object_set_new(m, "content", json_string(TURN_MARKER));
    text_render_t r2;
    mt_status_t st = render(t, alt, tools, where, &r2, err);
    json_decref(alt);
    if (st != MT_OK) return st;
    size_t pre = 0, suf = 0;
    while (pre < r->len && pre < r2.len && r->text[pre] == r2.text[pre]) pre++;
    while (suf < r->len - pre && suf < r2.len - pre && r->text[r->len - 1 - suf] == r2.text[r2.len - 1 - suf]) suf++;
    /* the two renders differ only where the message's text goes: it spans
     * [pre, len - suf), empty for an empty content (pre == len - suf) */
    if (pre > r->len - suf) pre = r->len - suf;
    memset(trained + pre, 1, r->len - suf - pre);
    *end = r->len - suf;
    text_render_free(&r2);
    return MT_OK;
}

/* Marks the EOS after position `end` when only template text separates
 * them (train_on_eos turn / last). */
static void mark_eos_after(const eng_text_t *t, const text_render_t *r, size_t end, uint8_t *trained) {
    const size_t el = strlen(t->eos_text);
    if (!el || end > r->len) return;
    const char *at = strstr(r->text + end, t->eos_text);
    if (!at) return;
    const size_t pos = (size_t)(at - r->text);
    for (size_t b = end; b < pos + el; b++)
        if (r->from_data[b]) return;
    memset(trained + pos, 1, el);
}

/* Every EOS rendered as template text (train_on_eos: all). */
static void mark_every_eos(const eng_text_t *t, const text_render_t *r, uint8_t *trained) {
    const size_t el = strlen(t->eos_text);
    for (const char *at = el ? strstr(r->text, t->eos_text) : NULL; at; at = strstr(at + el, t->eos_text))
        if (!r->from_data[at - r->text]) memset(trained + (at - r->text), 1, el);
}

static mt_status_t mark_turns(const eng_text_t *t, const eng_dataset_entry_t *d, const json_t *msgs,
                              const json_t *tools, const text_render_t *r, uint8_t *trained, const char *where,
                              mt_error_t *err) {
    size_t last_end = (size_t)-1; /* none */
    for (size_t i = 0; i < json_array_size(msgs); i++) {
        const char *role = json_string_value(json_object_get(json_array_get(msgs, i), "role"));
        if (!trains_role(d, role)) continue;
        size_t end;
        mt_status_t st = mark_turn(t, msgs, tools, i, r, trained, &end, where, err);
        if (st != MT_OK) return st;
        if (d->train_on_eos == ENG_EOS_TURN) mark_eos_after(t, r, end, trained);
        last_end = end;
    }
    if (d->train_on_eos == ENG_EOS_LAST) mark_eos_after(t, r, last_end, trained);
    if (d->train_on_eos == ENG_EOS_ALL) mark_every_eos(t, r, trained);
    return MT_OK;
}

mt_status_t eng_text_chat_row(const eng_text_t *t, const eng_dataset_entry_t *d, const json_t *row,
                              const char *where, eng_text_example_t *ex, mt_error_t *err) {
    json_t *msgs = NULL;
    mt_status_t st = messages_of(d, row, where, &msgs, err);
    if (st != MT_OK) return st;
    const json_t *tools = json_object_get(row, "tools");
    text_render_t r;
    st = render(t, msgs, tools, where, &r, err);
    if (st != MT_OK) {
        json_decref(msgs);
        return st;
    }
    uint8_t *trained = calloc(r.len + 1, 1);
    MT_CHECK_ALLOC(trained, "label mask");
    bool generation = false;
    for (size_t b = 0; b < r.len && !generation; b++) generation = r.in_generation[b];
    if (generation) memcpy(trained, r.in_generation, r.len);
    else st = mark_turns(t, d, msgs, tools, &r, trained, where, err);
    if (st == MT_OK) st = eng_text_append(t, r.text, r.len, r.from_data, trained, false, false, ex, where, err);
    if (st == MT_OK) {
        ex->text = r.text;
        ex->text_len = r.len;
        r.text = NULL;
    }
    free(trained);
    text_render_free(&r);
    json_decref(msgs);
    return st;
}
