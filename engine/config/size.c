/* Sizes in the run config ("80GiB", "512MB", "4096"; see config.h): read
 * exactly as written, decimal and binary units told apart, an ambiguous
 * "Gb" refused rather than guessed.
 *
 * Its own file, beside the YAML scalar typing (values.c), which does not
 * know the run config: that keeps values.c below config.c, which calls it. */
#include "engine/config/config.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

mt_status_t eng_parse_size(const char *text, size_t *out, mt_error_t *err) {
    static const struct {
        const char *unit;
        double mult;
    } units[] = {
        {"", 1.0},          {"B", 1.0},           {"KB", 1e3},           {"MB", 1e6},
        {"GB", 1e9},        {"TB", 1e12},         {"KIB", 1024.0},       {"MIB", 1048576.0},
        {"GIB", 1073741824.0}, {"TIB", 1099511627776.0},
    };
    const char *s = text;
    while (isspace((unsigned char)*s)) s++;
    if (!*s) return mt_error_set(err, MT_ERR_CONFIG, "bad size '%.200s': empty", text);
    if (*s == '-') return mt_error_set(err, MT_ERR_CONFIG, "bad size '%.200s': negative", text);
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    bool decimal = end > s;
    for (const char *q = s; q < end; q++) decimal &= strchr("0123456789.eE+-", *q) != NULL; /* no hex, inf */
    if (!decimal || errno == ERANGE || !isfinite(v))
        return mt_error_set(err, MT_ERR_CONFIG, "bad size '%.200s': expected a number such as 80GiB", text);
    while (isspace((unsigned char)*end)) end++;
    char unit[8];
    size_t ul = strlen(end);
    while (ul > 0 && isspace((unsigned char)end[ul - 1])) ul--;
    if (ul >= sizeof unit)
        return mt_error_set(err, MT_ERR_CONFIG, "bad size '%.200s': unknown unit (use B, KB, MB, GB, TB, KiB, MiB, GiB, TiB)",
                            text);
    bool has_upper = false;
    for (size_t i = 0; i < ul; i++) {
        has_upper |= isupper((unsigned char)end[i]) != 0;
        unit[i] = (char)toupper((unsigned char)end[i]);
    }
    unit[ul] = '\0';
    /* "5Gb" reads as gigabits to some people (HF divides by 8); refuse the guess. */
    if (ul >= 2 && end[ul - 1] == 'b' && has_upper)
        return mt_error_set(err, MT_ERR_CONFIG, "bad size '%.200s': ambiguous unit '%.*s' (bits?); write %s", text,
                            (int)ul, end, unit);
    double mult = 0;
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++)
        if (strcmp(unit, units[i].unit) == 0) mult = units[i].mult;
    if (mult == 0)
        return mt_error_set(err, MT_ERR_CONFIG,
                            "bad size '%.200s': unknown unit '%.*s' (use B, KB, MB, GB, TB, KiB, MiB, GiB, TiB)", text,
                            (int)ul, end);
    /* Whole numbers without a unit are read exactly (doubles lose precision above 2^53). */
    bool plain_int = true;
    for (const char *q = s; q < end && !isspace((unsigned char)*q); q++)
        if (!isdigit((unsigned char)*q)) plain_int = false;
    if (plain_int && mult == 1.0) {
        errno = 0;
        unsigned long long iv = strtoull(s, NULL, 10);
        if (errno == ERANGE || iv > (unsigned long long)SIZE_MAX)
            return mt_error_set(err, MT_ERR_CONFIG, "bad size '%.200s': too large", text);
        *out = (size_t)iv;
        return MT_OK;
    }
    double bytes = v * mult;
    if (bytes >= 18446744073709551616.0 || bytes >= (double)SIZE_MAX)
        return mt_error_set(err, MT_ERR_CONFIG, "bad size '%.200s': too large", text);
    /* "1.1GiB" is not a whole number of bytes; round to the nearest. */
    *out = (size_t)floor(bytes + 0.5);
    return MT_OK;
}
