/* Chat templates: the Jinja subset that Hub models' chat templates use,
 * rendered as transformers 5's apply_chat_template renders them.
 *
 * transformers compiles a template with jinja2's ImmutableSandboxedEnvironment
 * (trim_blocks, lstrip_blocks, loop controls, the `{% generation %}` tag) and
 * adds raise_exception, strftime_now, namespace, dict and its own tojson
 * (ensure_ascii=False).  This module lexes, parses and interprets that
 * language in C and gives the same text byte for byte; docs/chat-templates.md
 * lists what is supported and what is refused.
 *
 *     text_template_t *t;
 *     if (text_template_parse(src, len, "tokenizer_config.json", &t, &err)) ...
 *     text_render_t r;
 *     if (text_template_render(t, ctx, &r, &err)) ...   // r.text, r.len
 *     text_render_free(&r);
 *     text_template_free(t);
 *
 * Besides the text, a render says where each byte came from (two masks of
 * r.len bytes, 0 or 1):
 *   from_data      the byte was copied from a string of the render context
 *                  (a message's content, a tool's arguments...) rather than
 *                  from the template.  Context keys whose name ends in
 *                  "_token" (bos_token, eos_token...) are the tokenizer's
 *                  own and count as template text.  String operations carry
 *                  the mark on the bytes they copy; tojson and repr mark the
 *                  bytes they produce from a marked string.  A tokenizer uses
 *                  it so that a user's literal "<|im_end|>" never becomes a
 *                  special token.
 *   in_generation  the byte was rendered inside {% generation %} ... 
 *                  {% endgeneration %} (transformers' assistant mask).
 *
 * Hostile templates are bounded: macro recursion, expression nesting, loop
 * iterations, output size and the render's memory all have limits, past
 * which the render fails with a message instead of hanging or overflowing the
 * stack.  Errors name origin:line:col and what was expected or went wrong;
 * raise_exception(msg) fails the render with msg. */
#ifndef MT_TEXT_JINJA_H
#define MT_TEXT_JINJA_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include "base/status.h"

typedef struct text_template text_template_t;

/* Parses src (len bytes, UTF-8).  origin names the template in messages
 * (a file name).  Syntax errors are MT_ERR_FORMAT "origin:line:col: ...". */
mt_status_t text_template_parse(const char *src, size_t len, const char *origin,
                                text_template_t **out, mt_error_t *err);
void text_template_free(text_template_t *t);

typedef struct {
    char *text;             /* len bytes plus a NUL */
    size_t len;
    uint8_t *from_data;     /* (len): 1 where the byte came from the context's data */
    uint8_t *in_generation; /* (len): 1 where the byte was rendered inside {% generation %} */
} text_render_t;

/* ctx: a JSON object whose keys are the template's variables: messages,
 * tools, add_generation_prompt, bos_token, eos_token and any extra keyword
 * (enable_thinking, ...).  ctx is read, never changed.  On failure out is
 * left empty (nothing to free). */
mt_status_t text_template_render(const text_template_t *t, const json_t *ctx, text_render_t *out,
                                 mt_error_t *err);
/* The same with strftime_now() reading the clock at `now` (UTC) rather than
 * the current local time: reproducible renders. */
mt_status_t text_template_render_at(const text_template_t *t, const json_t *ctx, time_t now,
                                    text_render_t *out, mt_error_t *err);
void text_render_free(text_render_t *r);

/* transformers' preparation of a conversation before it renders one: drops
 * the keys of each message whose value is null, and copies a message's
 * reasoning (reasoning_content, thinking or reasoning) under both
 * "thinking" and "reasoning_content", as the templates read it.  Returns a
 * new reference; messages is unchanged. */
json_t *text_chat_messages_prepare(const json_t *messages);

/* A named template users select (`chat_template: chatml`): its source
 * text, or NULL when the name is unknown.  text_template_names lists them,
 * comma-separated, for messages. */
const char *text_template_named(const char *name);
const char *text_template_names(void);

#endif
