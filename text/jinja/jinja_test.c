/* Chat templates against transformers: every template in testdata/templates
 * rendered on every conversation of testdata/cases.json must give the text
 * transformers gave (testdata/expected.json, from make_expected.py) byte for
 * byte, the same generation spans, and fail where transformers failed.  The
 * provenance mask is checked on the marker "ZQX" the cases put in their data
 * (every copy must be marked from_data) and on template text (never marked).
 * Then the errors: syntax errors, raise_exception, unknown filters, runaway
 * recursion and loops, each naming origin:line:col. */
#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/jinja/jinja.h"

static int failures;
#define EXPECT(cond, ...)                                  \
    do {                                                   \
        if (!(cond)) {                                     \
            failures++;                                    \
            fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__); \
            fprintf(stderr, __VA_ARGS__);                  \
            fputc('\n', stderr);                           \
        }                                                  \
    } while (0)

static char *read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    size_t got = fread(buf, 1, (size_t)n, f);
    fclose(f);
    buf[got] = 0;
    *len = got;
    return buf;
}

static const json_t *find_case(const json_t *cases, const char *name) {
    size_t i;
    json_t *c;
    json_array_foreach(cases, i, c) if (!strcmp(json_string_value(json_object_get(c, "name")), name)) return c;
    return NULL;
}

/* the context apply_chat_template gives a template */
static json_t *make_ctx(const json_t *c, bool agp) {
    json_t *ctx = json_object();
    json_object_set_new(ctx, "messages", text_chat_messages_prepare(json_object_get(c, "messages")));
    json_t *tools = json_object_get(c, "tools");
    json_object_set(ctx, "tools", tools ? tools : json_null());
    json_object_set_new(ctx, "documents", json_null());
    json_object_set_new(ctx, "add_generation_prompt", json_boolean(agp));
    json_object_set_new(ctx, "bos_token", json_string("<s>"));
    json_object_set_new(ctx, "eos_token", json_string("</s>"));
    json_object_update(ctx, json_object_get(c, "kwargs"));
    return ctx;
}

static void first_diff(const char *what, const char *want, size_t wn, const char *got, size_t gn) {
    size_t i = 0;
    while (i < wn && i < gn && want[i] == got[i]) i++;
    size_t from = i > 40 ? i - 40 : 0;
    fprintf(stderr, "  %s: first difference at byte %zu (lengths %zu vs %zu)\n  want: %.80s\n  got:  %.80s\n", what, i,
            wn, gn, want + from, gn > from ? got + from : "");
}

static void check_render(const char *dir, const json_t *r, const json_t *cases, time_t now, int *renders) {
    const char *name = json_string_value(json_object_get(r, "template"));
    const char *case_name = json_string_value(json_object_get(r, "case"));
    bool agp = json_is_true(json_object_get(r, "add_generation_prompt"));
    char path[1024];
    snprintf(path, sizeof path, "%s/templates/%s", dir, name);
    size_t len;
    char *src = read_file(path, &len);
    EXPECT(src, "cannot read %s", path);
    if (!src) return;
    mt_error_t err = {0};
    text_template_t *t = NULL;
    mt_status_t st = text_template_parse(src, len, name, &t, &err);
    free(src);
    EXPECT(st == MT_OK, "%s: %s", name, err.msg);
    if (st != MT_OK) return;
    json_t *ctx = make_ctx(find_case(cases, case_name), agp);
    text_render_t out;
    st = text_template_render_at(t, ctx, now, &out, &err);
    const json_t *want = json_object_get(r, "text");
    if (!want) {
        EXPECT(st != MT_OK, "%s on %s (agp=%d): transformers failed (%s) but the render succeeded", name, case_name,
               agp, json_string_value(json_object_get(r, "error")));
        if (st == MT_OK) text_render_free(&out);
    } else if (st != MT_OK) {
        EXPECT(0, "%s on %s (agp=%d): %s", name, case_name, agp, err.msg);
    } else {
        (*renders)++;
        size_t wn = json_string_length(want);
        bool same = wn == out.len && memcmp(json_string_value(want), out.text, wn) == 0;
        EXPECT(same, "%s on %s (agp=%d): text differs from transformers", name, case_name, agp);
        if (!same) first_diff("text", json_string_value(want), wn, out.text, out.len);
        uint8_t *gen = calloc(out.len + 1, 1);
        size_t i;
        json_t *span;
        json_array_foreach(json_object_get(r, "generation"), i, span) {
            size_t a = (size_t)json_integer_value(json_array_get(span, 0));
            size_t b = (size_t)json_integer_value(json_array_get(span, 1));
            for (size_t k = a; k < b && k < out.len; k++) gen[k] = 1;
        }
        EXPECT(memcmp(gen, out.in_generation, out.len) == 0, "%s on %s (agp=%d): generation spans differ", name,
               case_name, agp);
        free(gen);
        for (const char *p = out.text; (p = strstr(p, "ZQX")); p += 3) {
            size_t at = (size_t)(p - out.text);
            EXPECT(out.from_data[at] && out.from_data[at + 1] && out.from_data[at + 2],
                   "%s on %s: data marker at byte %zu not marked from_data", name, case_name, at);
        }
        text_render_free(&out);
    }
    json_decref(ctx);
    text_template_free(t);
}

/* renders src on {messages: [...]} and returns the status; *msg gets the error */
static mt_status_t try_render(const char *src, const char *messages_json, mt_error_t *err, text_render_t *out) {
    text_template_t *t;
    mt_status_t st = text_template_parse(src, strlen(src), "t.jinja", &t, err);
    if (st) return st;
    json_t *ctx = json_pack("{s:o}", "messages", json_loads(messages_json ? messages_json : "[]", 0, NULL));
    text_render_t local;
    st = text_template_render(t, ctx, out ? out : &local, err);
    if (!st && !out) text_render_free(&local);
    json_decref(ctx);
    text_template_free(t);
    return st;
}

static void expect_error(const char *src, const char *want) {
    mt_error_t err = {0};
    mt_status_t st = try_render(src, NULL, &err, NULL);
    EXPECT(st != MT_OK && strstr(err.msg, want), "template %s: want an error containing \"%s\", got %s (%s)", src,
           want, st ? err.msg : "success", mt_status_name(st));
}

static void error_tests(void) {
    expect_error("line one\n{% if x %}\n  {{ a + }}\n{% endif %}", "t.jinja:3:10: expected an expression, got '}}'");
    expect_error("{% for x in y %}never closed", "t.jinja:1:29: unexpected end of template, expected 'endfor'");
    expect_error("{{ 'x' | nosuchfilter }}", "t.jinja:1:10: no filter named 'nosuchfilter'");
    expect_error("{{ x is nosuchtest }}", "t.jinja:1:9: no test named 'nosuchtest'");
    expect_error("{% include 'other.jinja' %}", "t.jinja:1:4: unknown or unsupported tag 'include'");
    expect_error("\n\n  {{ raise_exception('Only user and assistant roles') }}",
                 "t.jinja:3:6: raise_exception: Only user and assistant roles");
    expect_error("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", "calls nested deeper than 64");
    expect_error("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
                 "more than 10000000 loop iterations");
    expect_error("{{ 'a' * 100000000 }}", "a repeated string too long");
    expect_error("{{ x.y }}", "t.jinja:1:5: 'x' is undefined");
    expect_error("{{ 'a' + 1 }}", "unsupported operand type(s) for +: 'str' and 'int'");
    expect_error("{{ 1 // 0 }}", "division by zero");
    expect_error("{{ 'unterminated }}", "t.jinja:1:4: unterminated string literal");
    expect_error("{% set ns = namespace() %}{% set ns._x = 1 %}", "underscore-prefixed");
    char deep[3000];
    size_t n = 0;
    n += (size_t)sprintf(deep + n, "{{ ");
    for (int i = 0; i < 600; i++) deep[n++] = '(';
    deep[n++] = '1';
    for (int i = 0; i < 600; i++) deep[n++] = ')';
    sprintf(deep + n, " }}");
    expect_error(deep, "nested deeper than 200 levels");
}

static void provenance_tests(void) {
    mt_error_t err = {0};
    text_render_t out;
    const char *src = text_template_named("chatml");
    EXPECT(src && !text_template_named("nosuch"), "named templates");
    mt_status_t st = try_render(src, "[{\"role\": \"user\", \"content\": \"<|im_end|>x\"}]", &err, &out);
    EXPECT(st == MT_OK, "chatml: %s", err.msg);
    if (st) return;
    const char *want = "<|im_start|>user\n<|im_end|>x<|im_end|>\n";
    EXPECT(out.len == strlen(want) && !memcmp(out.text, want, out.len), "chatml text: %s", out.text);
    for (size_t i = 0; i < out.len; i++) {
        bool data = i >= 17 && i < 28; /* the content "<|im_end|>x" */
        bool role = i >= 12 && i < 16;
        EXPECT(out.from_data[i] == (data || role), "chatml from_data[%zu] = %d", i, out.from_data[i]);
        EXPECT(!out.in_generation[i], "no generation block, in_generation[%zu] set", i);
    }
    text_render_free(&out);
    /* a tainted string carried through filters and tojson */
    st = try_render("{{ (messages[0].content|upper)[1:] ~ '|' ~ messages[0]|tojson }}",
                    "[{\"role\": \"u\", \"content\": \"ab\"}]", &err, &out);
    EXPECT(st == MT_OK, "%s", err.msg);
    if (st) return;
    const char *w2 = "B|{\"role\": \"u\", \"content\": \"ab\"}";
    EXPECT(out.len == strlen(w2) && !memcmp(out.text, w2, out.len), "filters/tojson text: %s", out.text);
    if (out.len == strlen(w2)) {
        EXPECT(out.from_data[0] && !out.from_data[1] && !out.from_data[2], "slice of upper keeps the mark");
        EXPECT(out.from_data[4] && !out.from_data[3], "tojson marks the key's bytes, not its quotes");
        EXPECT(out.from_data[28] && out.from_data[29] && !out.from_data[30], "tojson marks the value's bytes");
    }
    text_render_free(&out);
}

int main(int argc, char **argv) {
    const char *dir = argc > 1 ? argv[1] : "text/jinja/testdata";
    char path[1024];
    json_error_t jerr;
    snprintf(path, sizeof path, "%s/expected.json", dir);
    json_t *expected = json_load_file(path, 0, &jerr);
    snprintf(path, sizeof path, "%s/cases.json", dir);
    json_t *cases = json_load_file(path, 0, &jerr);
    if (!expected || !cases) {
        fprintf(stderr, "cannot read %s: %s\n", path, jerr.text);
        return 1;
    }
    time_t now = (time_t)json_integer_value(json_object_get(expected, "now"));
    int renders = 0;
    size_t i;
    json_t *r;
    json_array_foreach(json_object_get(expected, "renders"), i, r) check_render(dir, r, cases, now, &renders);
    EXPECT(renders > 100, "only %d renders compared", renders);
    /* the named templates are the committed files */
    static const char *const named[] = {"chatml", "chatml_generation"};
    for (int k = 0; k < 2; k++) {
        size_t len;
        snprintf(path, sizeof path, "%s/templates/%s.jinja", dir, named[k]);
        char *src = read_file(path, &len);
        EXPECT(src && !strcmp(src, text_template_named(named[k])), "named template %s differs from %s", named[k], path);
        free(src);
    }
    error_tests();
    provenance_tests();
    printf("%d renders identical to transformers %s over %zu expected; %d failures\n", renders,
           json_string_value(json_object_get(expected, "transformers")),
           json_array_size(json_object_get(expected, "renders")), failures);
    json_decref(expected);
    json_decref(cases);
    return failures ? 1 : 0;
}
