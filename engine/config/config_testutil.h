/* What the run-config tests share: the failure count, EXPECT, and checks
 * that a YAML text, a --set or a validation fails naming what it should.
 * Each test binary includes it once (its own failure count). */
#ifndef MT_ENGINE_CONFIG_CONFIG_TESTUTIL_H
#define MT_ENGINE_CONFIG_CONFIG_TESTUTIL_H

#include <stdio.h>
#include <string.h>

#include "engine/config/config.h"

static int failures;
#define EXPECT(c)                                                                       \
    do {                                                                                \
        if (!(c)) {                                                                     \
            fprintf(stderr, "%s:%d: expectation failed: %s\n", __FILE__, __LINE__, #c); \
            failures++;                                                                 \
        }                                                                               \
    } while (0)

/* Parses text; expects failure with `code` and every needle in the message. */
static inline void expect_error(const char *yaml, mt_status_t code, const char *n1, const char *n2, int line) {
    eng_run_config_t cfg;
    mt_error_t err = {0};
    mt_status_t st = eng_run_config_parse(yaml, strlen(yaml), "cfgs/run.yaml", &cfg, &err);
    bool ok = st == code && (!n1 || strstr(err.msg, n1)) && (!n2 || strstr(err.msg, n2));
    if (!ok) {
        fprintf(stderr, "line %d: for YAML\n%s\nexpected %s with '%s' and '%s', got %s: %s\n", line, yaml,
                mt_status_name(code), n1 ? n1 : "", n2 ? n2 : "", mt_status_name(st), err.msg);
        failures++;
    }
    eng_run_config_free(&cfg);
}
#define EXPECT_ERROR(yaml, code, n1, n2) expect_error(yaml, code, n1, n2, __LINE__)

static inline void expect_set_error(eng_run_config_t *cfg, const char *assignment, const char *n1, const char *n2,
                             int line) {
    mt_error_t err = {0};
    mt_status_t st = eng_run_config_set(cfg, assignment, &err);
    bool ok = st == MT_ERR_CONFIG && strstr(err.msg, "--set") && (!n1 || strstr(err.msg, n1)) &&
              (!n2 || strstr(err.msg, n2));
    if (!ok) {
        fprintf(stderr, "line %d: --set %s: expected a config error with '%s' and '%s', got %s: %s\n", line,
                assignment, n1 ? n1 : "", n2 ? n2 : "", mt_status_name(st), err.msg);
        failures++;
    }
}
#define EXPECT_SET_ERROR(cfg, a, n1, n2) expect_set_error(cfg, a, n1, n2, __LINE__)

static inline bool set_ok(eng_run_config_t *cfg, const char *a) {
    mt_error_t err = {0};
    if (eng_run_config_set(cfg, a, &err) == MT_OK) return true;
    fprintf(stderr, "--set %s failed: %s\n", a, err.msg);
    return false;
}


/* A valid config with one field broken must fail naming that field. */
static inline void expect_invalid(const char *assignment, const char *needle, int line) {
    eng_run_config_t c;
    mt_error_t err = {0};
    const char *y = "base_model: m\ndatasets: [{path: d.jsonl}]\n";
    if (eng_run_config_parse(y, strlen(y), "v.yaml", &c, &err) != MT_OK) {
        failures++;
        return;
    }
    /* A key's own range is checked as it is set (naming the key and the
     * range); what needs other keys is checked by validate. */
    if (eng_run_config_set(&c, assignment, &err) != MT_OK) {
        if (!strstr(err.msg, needle) || !strstr(err.msg, "out of range")) {
            fprintf(stderr, "line %d: --set %s refused without naming '%s': %s\n", line, assignment,
                    needle, err.msg);
            failures++;
        }
        eng_run_config_free(&c);
        return;
    }
    mt_status_t st = eng_run_config_validate(&c, &err);
    if (st != MT_ERR_CONFIG || !strstr(err.msg, needle) || !strstr(err.msg, "v.yaml")) {
        fprintf(stderr, "line %d: validate after %s: expected an error naming '%s', got %s: %s\n", line,
                assignment, needle, mt_status_name(st), err.msg);
        failures++;
    }
    eng_run_config_free(&c);
}
#define EXPECT_INVALID(a, needle) expect_invalid(a, needle, __LINE__)

#endif
