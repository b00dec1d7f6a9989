/* Hardware profiles: YAML loader, --hw resolution, calibration -> profile
 * (see hw.h).
 *
 * Design notes: one key table per mapping level (as engine/config/config.c does
 * for run configs), each row naming the field it fills.  Numeric fields
 * start as NaN and a key left unset is found by walking the tables after
 * the parse, so "missing key" and "unknown key" both come from the tables.
 * Sizes and bandwidths carry their unit in the file ("80GiB", "25GB/s"):
 * a bare number would leave GB vs GiB, and bytes vs bits, to guesswork. */
#include "scheduler/hw.h"

#include "base/fileio.h"
#include "base/yaml_doc.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <yaml.h>

typedef enum {
    H_STR,     /* char[] */
    H_SIZE,    /* double, bytes: "80GiB" */
    H_BW,      /* double, bytes/s: "25GB/s" */
    H_TFLOPS,  /* double FLOP/s, written in TFLOP/s */
    H_FRAC,    /* double in (0, 1] */
    H_US,      /* double seconds, written in microseconds (>= 0) */
    H_INT,     /* int > 0 */
    H_GPARAMS, /* double parameters/s, written in G parameters/s */
    H_SECTION,
} hkind_t;

typedef struct hrow {
    const char *name;
    hkind_t kind;
    size_t offset, size;
    bool required;
    const struct hrow *section;
} hrow_t;

#define F(f) offsetof(sched_hw_t, f), sizeof(((sched_hw_t *)0)->f)
#define REQ(name, kind, f) {name, kind, F(f), true, NULL}
#define OPT(name, kind, f) {name, kind, F(f), false, NULL}
#define SEC(name, rows) {name, H_SECTION, 0, 0, true, rows}
/* a section that may be left out as a whole; given, its required keys are */
#define OPTSEC(name, rows) {name, H_SECTION, 0, 0, false, rows}

static const hrow_t k_peak_rows[] = {
    REQ("fp32", H_TFLOPS, peak_flops[SCHED_RATE_FP32]),
    REQ("tf32", H_TFLOPS, peak_flops[SCHED_RATE_TF32]),
    REQ("bf16", H_TFLOPS, peak_flops[SCHED_RATE_BF16]),
    {0},
};
static const hrow_t k_frac_rows[] = {
    REQ("fp32", H_FRAC, flops_frac[SCHED_RATE_FP32]),
    REQ("tf32", H_FRAC, flops_frac[SCHED_RATE_TF32]),
    REQ("bf16", H_FRAC, flops_frac[SCHED_RATE_BF16]),
    {0},
};
static const hrow_t k_attn_rows[] = {
    OPT("fwd_tflops", H_TFLOPS, attn_flops[SCHED_ATTN_KERNEL][SCHED_DIR_FWD]),
    OPT("bwd_tflops", H_TFLOPS, attn_flops[SCHED_ATTN_KERNEL][SCHED_DIR_BWD]),
    OPT("tc_fwd_tflops", H_TFLOPS, attn_flops[SCHED_ATTN_TC][SCHED_DIR_FWD]),
    OPT("tc_bwd_tflops", H_TFLOPS, attn_flops[SCHED_ATTN_TC][SCHED_DIR_BWD]),
    {0},
};
static const hrow_t k_device_rows[] = {
    OPT("name", H_STR, device_name),
    REQ("memory", H_SIZE, device_memory),
    REQ("memory_bandwidth", H_BW, device_bw_peak),
    REQ("memory_bandwidth_achievable", H_FRAC, device_bw_frac),
    SEC("peak_tflops", k_peak_rows),
    SEC("achievable", k_frac_rows),
    OPTSEC("attention", k_attn_rows),
    OPT("attention_tflops", H_TFLOPS, attention_legacy),
    {0},
};
static const hrow_t k_link_rows[] = {
    OPT("name", H_STR, link_name),
    REQ("peak_bandwidth", H_BW, link_bw_peak),
    REQ("h2d_achievable", H_FRAC, h2d_frac),
    REQ("d2h_achievable", H_FRAC, d2h_frac),
    REQ("copy_latency_us", H_US, copy_latency_s),
    OPT("peer_bandwidth", H_BW, peer_bw_peak),
    OPT("peer_achievable", H_FRAC, peer_frac),
    OPT("peer_latency_us", H_US, peer_latency_s),
    {0},
};
static const hrow_t k_host_rows[] = {
    OPT("name", H_STR, host_name),
    REQ("memory", H_SIZE, host_memory),
    REQ("pinned", H_SIZE, pinned_memory),
    REQ("memory_bandwidth", H_BW, host_bw_peak),
    REQ("memory_bandwidth_achievable", H_FRAC, host_bw_frac),
    REQ("cores", H_INT, host_cores),
    OPT("numa_nodes", H_INT, numa_nodes),
    OPT("adamw_bandwidth", H_BW, adamw_bw),
    OPT("adamw_bf16_gparams_per_core", H_GPARAMS, adamw_bf16_rate),
    OPT("adamw_8bit_gparams_per_core", H_GPARAMS, adamw_8bit_rate),
    OPT("pack_bandwidth", H_BW, pack_bw),
    OPT("unpack_bandwidth", H_BW, unpack_bw),
    {0},
};
static const hrow_t k_nvme_rows[] = {
    OPT("name", H_STR, nvme_name),
    REQ("read", H_BW, nvme_read_bw),
    REQ("write", H_BW, nvme_write_bw),
    REQ("queue_depth", H_INT, nvme_queue_depth),
    {0},
};
static const hrow_t k_top_rows[] = {
    REQ("name", H_STR, name),
    SEC("device", k_device_rows),
    SEC("link", k_link_rows),
    SEC("host", k_host_rows),
    OPTSEC("nvme", k_nvme_rows),
    {0},
};

static const char *const k_rate_names[SCHED_RATE_COUNT] = {"fp32", "tf32", "bf16"};

const char *sched_rate_name(sched_rate_t r) { return (unsigned)r < SCHED_RATE_COUNT ? k_rate_names[r] : "?"; }
double sched_hw_flops(const sched_hw_t *hw, sched_rate_t r) { return hw->peak_flops[r] * hw->flops_frac[r]; }
double sched_hw_device_bw(const sched_hw_t *hw) { return hw->device_bw_peak * hw->device_bw_frac; }
double sched_hw_h2d_bw(const sched_hw_t *hw) { return hw->link_bw_peak * hw->h2d_frac; }
double sched_hw_d2h_bw(const sched_hw_t *hw) { return hw->link_bw_peak * hw->d2h_frac; }
double sched_hw_host_bw(const sched_hw_t *hw) { return hw->host_bw_peak * hw->host_bw_frac; }
int sched_hw_numa_nodes(const sched_hw_t *hw) { return hw->numa_nodes > 1 ? hw->numa_nodes : 1; }
double sched_hw_adamw_bw(const sched_hw_t *hw) { return hw->adamw_bw * sched_hw_numa_nodes(hw); }
double sched_hw_nvme_read_bw(const sched_hw_t *hw) { return hw->has_nvme ? hw->nvme_read_bw : 0; }
double sched_hw_nvme_write_bw(const sched_hw_t *hw) { return hw->has_nvme ? hw->nvme_write_bw : 0; }

bool sched_hw_peer_via_host(const sched_hw_t *hw) { return !(hw->peer_bw_peak > 0); }

/* Through host memory a row crosses the sender's link D2H and then the
 * receiver's H2D; pipelined in chunks it moves at the slower direction's
 * rate and pays two copies' fixed cost. */
double sched_hw_peer_bw(const sched_hw_t *hw) {
    if (!sched_hw_peer_via_host(hw)) return hw->peer_bw_peak * hw->peer_frac;
    const double h = sched_hw_h2d_bw(hw), d = sched_hw_d2h_bw(hw);
    return h < d ? h : d;
}

double sched_hw_peer_latency(const sched_hw_t *hw) {
    if (sched_hw_peer_via_host(hw)) return 2.0 * hw->copy_latency_s;
    return hw->peer_latency_s >= 0 ? hw->peer_latency_s : hw->copy_latency_s;
}

/* ---- rates a profile leaves out ----------------------------------------------- */

static bool rate_unset(double v) { return !(v > 0); } /* 0 or NaN */

void sched_hw_fill_rates(sched_hw_t *hw) {
    const double legacy = hw->attention_legacy > 0 ? hw->attention_legacy : 0;
    for (int d = 0; d < SCHED_DIR_COUNT; d++) {
        double *k = &hw->attn_flops[SCHED_ATTN_KERNEL][d], *t = &hw->attn_flops[SCHED_ATTN_TC][d];
        if (rate_unset(*k) && legacy > 0) *k = legacy; /* an older profile's one rate: the fp32 kernel's */
        if (rate_unset(*k)) {
            *k = SCHED_ATTN_KERNEL_SHARE * sched_hw_flops(hw, SCHED_RATE_FP32);
            hw->assumed |= SCHED_HW_ASSUMED_ATTN_KERNEL;
        }
        if (rate_unset(*t)) {
            *t = SCHED_ATTN_TC_SHARE * sched_hw_flops(hw, SCHED_RATE_BF16);
            hw->assumed |= SCHED_HW_ASSUMED_ATTN_TC;
        }
    }
    if (hw->numa_nodes < 1) hw->numa_nodes = 1;
    const double host = sched_hw_host_bw(hw);
    if (rate_unset(hw->adamw_bw)) hw->adamw_bw = host, hw->assumed |= SCHED_HW_ASSUMED_ADAMW;
    if (rate_unset(hw->pack_bw)) hw->pack_bw = host / 2.0, hw->assumed |= SCHED_HW_ASSUMED_PACK;
    if (rate_unset(hw->unpack_bw)) hw->unpack_bw = host / 2.0, hw->assumed |= SCHED_HW_ASSUMED_UNPACK;
    if (rate_unset(hw->adamw_bf16_rate))
        hw->adamw_bf16_rate = SCHED_ADAMW_BF16_CORE_RATE, hw->assumed |= SCHED_HW_ASSUMED_ADAMW_LITE;
    if (rate_unset(hw->adamw_8bit_rate))
        hw->adamw_8bit_rate = SCHED_ADAMW_8BIT_CORE_RATE, hw->assumed |= SCHED_HW_ASSUMED_ADAMW_LITE;
}

void sched_hw_assumed_line(const sched_hw_t *hw, char *buf, size_t cap) {
    static const struct {
        unsigned bit;
        const char *rule;
    } rules[] = {
        {SCHED_HW_ASSUMED_ATTN_KERNEL, "fp32 attention kernel = 0.1 x the fp32 matmul rate"},
        {SCHED_HW_ASSUMED_ATTN_TC, "tensor-core attention = 0.5 x the bf16 matmul rate"},
        {SCHED_HW_ASSUMED_ADAMW, "host AdamW at host memory bandwidth"},
        {SCHED_HW_ASSUMED_PACK, "staging pack at half host memory bandwidth"},
        {SCHED_HW_ASSUMED_UNPACK, "gradient unpack at half host memory bandwidth"},
        {SCHED_HW_ASSUMED_ADAMW_LITE, "host AdamW with bf16 / 8-bit moments at 0.30 / 0.18 G parameters/s per core"},
    };
    size_t used = 0;
    if (cap) buf[0] = '\0';
    for (size_t i = 0; i < sizeof rules / sizeof rules[0]; i++) {
        if (!(hw->assumed & rules[i].bit) || used >= cap) continue;
        const int w = snprintf(buf + used, cap - used, "%s%s", used ? "; " : "", rules[i].rule);
        if (w > 0) used += (size_t)w;
    }
}

/* ---- values ----------------------------------------------------------------- */

/* "80GiB", "1.5 TB", "25GB/s" (per_second: the "/s" is required). */
static bool parse_quantity(const char *s, bool per_second, double *out) {
    static const struct {
        const char *unit;
        double mult;
    } units[] = {
        {"B", 1.0},           {"KB", 1e3},           {"MB", 1e6},  {"GB", 1e9}, {"TB", 1e12},
        {"KIB", 1024.0},      {"MIB", 1048576.0},    {"GIB", 1073741824.0}, {"TIB", 1099511627776.0},
    };
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || errno == ERANGE || !isfinite(v) || v < 0) return false;
    while (*end == ' ') end++;
    char unit[16];
    size_t n = 0;
    while (*end && *end != '/' && n + 1 < sizeof unit) unit[n++] = *end++;
    unit[n] = '\0';
    /* "Gb" reads as gigabits to some: only the byte spelling B is accepted */
    if (n >= 1 && unit[n - 1] == 'b') return false;
    for (size_t i = 0; i < n; i++) unit[i] = (char)toupper((unsigned char)unit[i]);
    if (per_second) {
        if (strcmp(end, "/s") != 0) return false;
    } else if (*end) {
        return false;
    }
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++)
        if (strcmp(unit, units[i].unit) == 0) {
            *out = v * units[i].mult;
            return true;
        }
    return false;
}

typedef struct {
    const char *file;
    yaml_document_t *doc;
    sched_hw_t *hw;
    mt_error_t *err;
} hctx_t;

static mt_status_t hfail(const hctx_t *c, const yaml_node_t *at, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static mt_status_t hfail(const hctx_t *c, const yaml_node_t *at, const char *fmt, ...) {
    char what[1200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    if (at) return mt_error_set(c->err, MT_ERR_CONFIG, "%.600s:%zu: %s", c->file, (size_t)at->start_mark.line + 1, what);
    return mt_error_set(c->err, MT_ERR_CONFIG, "%.600s: %s", c->file, what);
}

static void set_nan(sched_hw_t *hw, const hrow_t *rows) {
    for (const hrow_t *r = rows; r->name; r++) {
        if (r->kind == H_SECTION) set_nan(hw, r->section);
        else if (r->kind == H_INT) *(int *)((char *)hw + r->offset) = -1;
        else if (r->kind != H_STR) *(double *)((char *)hw + r->offset) = NAN;
    }
}

/* Whether any key of an optional section was set (set_nan's marks gone). */
static bool section_given(const sched_hw_t *hw, const hrow_t *rows) {
    for (const hrow_t *r = rows; r->name; r++) {
        const char *p = (const char *)hw + r->offset;
        if (r->kind == H_SECTION) {
            if (section_given(hw, r->section)) return true;
        } else if (r->kind == H_STR ? p[0] != '\0' : r->kind == H_INT ? *(const int *)p >= 0 : !isnan(*(const double *)p)) {
            return true;
        }
    }
    return false;
}

static mt_status_t check_required(const hctx_t *c, const hrow_t *rows, const char *prefix) {
    for (const hrow_t *r = rows; r->name; r++) {
        char key[128];
        snprintf(key, sizeof key, "%s%s", prefix, r->name);
        const char *p = (const char *)c->hw + r->offset;
        bool missing = false;
        if (r->kind == H_SECTION) {
            char sub[140];
            snprintf(sub, sizeof sub, "%s.", key);
            if (!r->required && !section_given(c->hw, r->section)) continue;
            mt_status_t st = check_required(c, r->section, sub);
            if (st != MT_OK) return st;
            continue;
        }
        if (!r->required) continue;
        if (r->kind == H_STR) missing = p[0] == '\0';
        else if (r->kind == H_INT) missing = *(const int *)p < 0;
        else missing = isnan(*(const double *)p);
        if (missing) return hfail(c, NULL, "missing key '%s'", key);
    }
    return MT_OK;
}

static mt_status_t walk(hctx_t *c, const hrow_t *rows, const char *prefix, yaml_node_t *map);

static mt_status_t apply(hctx_t *c, const hrow_t *row, const char *key, yaml_node_t *v) {
    char *dst = (char *)c->hw + row->offset;
    if (row->kind == H_SECTION) {
        if (!v || v->type != YAML_MAPPING_NODE) return hfail(c, v, "%s: expected a mapping", key);
        char prefix[160];
        snprintf(prefix, sizeof prefix, "%s.", key);
        return walk(c, row->section, prefix, v);
    }
    if (!v || v->type != YAML_SCALAR_NODE) return hfail(c, v, "%s: expected a single value", key);
    const char *s = (const char *)v->data.scalar.value;
    char *end;
    double d;
    switch (row->kind) {
    case H_STR:
        if (strlen(s) >= row->size) return hfail(c, v, "%s: longer than %zu characters", key, row->size - 1);
        snprintf(dst, row->size, "%s", s);
        return MT_OK;
    case H_SIZE:
        if (!parse_quantity(s, false, &d) || d <= 0)
            return hfail(c, v, "%s: expected a size such as 80GiB or 512GB, got '%.100s'", key, s);
        *(double *)dst = d;
        return MT_OK;
    case H_BW:
        if (!parse_quantity(s, true, &d) || d <= 0)
            return hfail(c, v, "%s: expected a bandwidth such as 25GB/s or 3.35TB/s, got '%.100s'", key, s);
        *(double *)dst = d;
        return MT_OK;
    case H_TFLOPS:
    case H_GPARAMS:
    case H_FRAC:
    case H_US:
        errno = 0;
        d = strtod(s, &end);
        if (end == s || *end || errno == ERANGE || !isfinite(d))
            return hfail(c, v, "%s: expected a number, got '%.100s'", key, s);
        if (row->kind == H_FRAC && !(d > 0 && d <= 1))
            return hfail(c, v, "%s: expected a fraction of peak in (0, 1], got %g", key, d);
        if (row->kind == H_TFLOPS && !(d > 0)) return hfail(c, v, "%s: expected TFLOP/s > 0, got %g", key, d);
        if (row->kind == H_GPARAMS && !(d > 0 && d < 1e6))
            return hfail(c, v, "%s: expected G parameters/s in (0, 10^6), got %g", key, d);
        if (row->kind == H_US && d < 0) return hfail(c, v, "%s: expected microseconds >= 0, got %g", key, d);
        *(double *)dst = row->kind == H_TFLOPS ? d * 1e12 : row->kind == H_GPARAMS ? d * 1e9 : row->kind == H_US ? d * 1e-6 : d;
        return MT_OK;
    case H_INT: {
        errno = 0;
        long x = strtol(s, &end, 10);
        if (end == s || *end || errno == ERANGE || x <= 0 || x > 1000000)
            return hfail(c, v, "%s: expected a positive integer, got '%.100s'", key, s);
        *(int *)dst = (int)x;
        return MT_OK;
    }
    case H_SECTION: break;
    }
    return hfail(c, v, "%s: internal error", key);
}

static mt_status_t walk(hctx_t *c, const hrow_t *rows, const char *prefix, yaml_node_t *map) {
    for (yaml_node_pair_t *p = map->data.mapping.pairs.start; p < map->data.mapping.pairs.top; p++) {
        yaml_node_t *k = yaml_document_get_node(c->doc, p->key);
        yaml_node_t *v = yaml_document_get_node(c->doc, p->value);
        if (!k || k->type != YAML_SCALAR_NODE) return hfail(c, k, "keys must be strings");
        const char *name = (const char *)k->data.scalar.value;
        for (yaml_node_pair_t *q = map->data.mapping.pairs.start; q < p; q++) {
            yaml_node_t *qk = yaml_document_get_node(c->doc, q->key);
            if (qk && qk->type == YAML_SCALAR_NODE && strcmp((const char *)qk->data.scalar.value, name) == 0)
                return hfail(c, k, "duplicate key '%s%.100s'", prefix, name);
        }
        const hrow_t *row = NULL;
        for (const hrow_t *r = rows; r->name; r++)
            if (strcmp(r->name, name) == 0) row = r;
        if (!row) {
            char list[512] = "";
            size_t used = 0;
            for (const hrow_t *r = rows; r->name && used < sizeof list; r++) {
                int w = snprintf(list + used, sizeof list - used, "%s%s%s", r == rows ? "" : ", ", prefix, r->name);
                if (w < 0) break;
                used += (size_t)w;
            }
            return hfail(c, k, "unknown key '%s%.100s'; valid keys here: %s", prefix, name, list);
        }
        char key[140];
        snprintf(key, sizeof key, "%s%s", prefix, row->name);
        mt_status_t st = apply(c, row, key, v);
        if (st != MT_OK) return st;
    }
    return MT_OK;
}

mt_status_t sched_hw_parse(const char *yaml_text, size_t len, const char *path, sched_hw_t *out, mt_error_t *err) {
    memset(out, 0, sizeof *out);
    set_nan(out, k_top_rows);
    const char *file = path ? path : "<hardware profile>";
    snprintf(out->source, sizeof out->source, "%s", file);
    hctx_t c = {.file = file, .hw = out, .err = err};
    mt_yaml_doc_t yd;
    mt_status_t pst = mt_yaml_doc_parse(&yd, yaml_text, len, file, "hardware profile", MT_ERR_CONFIG, err);
    if (pst != MT_OK) return pst;
    c.doc = &yd.doc;
    yaml_node_t *root = yd.root;
    mt_status_t st;
    if (!root || root->type != YAML_MAPPING_NODE) st = hfail(&c, root, "a hardware profile must be a mapping of keys");
    else st = walk(&c, k_top_rows, "", root);
    mt_yaml_doc_free(&yd);
    if (st == MT_OK) st = check_required(&c, k_top_rows, "");
    /* a direct peer link's achievable share has no safe default: a wrong
     * one decides expert parallel either way */
    if (st == MT_OK && out->peer_bw_peak > 0 && isnan(out->peer_frac))
        st = hfail(&c, NULL, "missing key 'link.peer_achievable' (required with link.peer_bandwidth: the share of "
                             "the peer link's peak an all-to-all achieves, in (0, 1])");
    if (st == MT_OK && !(out->peer_bw_peak > 0) && (!isnan(out->peer_frac) || !isnan(out->peer_latency_s)))
        st = hfail(&c, NULL, "link.peer_achievable and link.peer_latency_us need link.peer_bandwidth (without it the "
                             "devices exchange through host memory over their own links)");
    if (st == MT_OK) {
        /* absent: no direct link / the copy latency (NaN would poison the arithmetic) */
        if (isnan(out->peer_bw_peak)) out->peer_bw_peak = 0;
        if (isnan(out->peer_frac)) out->peer_frac = 0;
        if (isnan(out->peer_latency_s)) out->peer_latency_s = -1;
        out->has_nvme = section_given(out, k_nvme_rows);
        if (!out->has_nvme) out->nvme_read_bw = out->nvme_write_bw = 0, out->nvme_queue_depth = 0;
        sched_hw_fill_rates(out);
    }
    return st;
}

mt_status_t sched_hw_load(const char *path, sched_hw_t *out, mt_error_t *err) {
    memset(out, 0, sizeof *out);
    char *buf;
    size_t len;
    mt_status_t st = mt_read_regular_file(path, "hardware profile", MT_YAML_MAX_BYTES, &buf, &len, err);
    if (st != MT_OK) return st;
    st = sched_hw_parse(buf, len, path, out, err);
    free(buf);
    return st;
}

/* ---- --hw resolution ---------------------------------------------------------- */

static bool is_file(const char *p) {
    /* Any kind of file: a FIFO or directory found here is then refused by
     * sched_hw_load with what it is, rather than reported as missing. */
    struct stat sb;
    return stat(p, &sb) == 0;
}

static void dir_of(const char *path, char *out, size_t cap) {
    const char *slash = path ? strrchr(path, '/') : NULL;
    if (!slash) snprintf(out, cap, ".");
    else if (slash == path) snprintf(out, cap, "/");
    else snprintf(out, cap, "%.*s", (int)(slash - path), path);
}

mt_status_t sched_hw_resolve(const char *spec, const char *run_config, char *path, size_t cap, mt_error_t *err) {
    if (!spec || !spec[0]) return mt_error_set(err, MT_ERR_CONFIG, "no hardware profile given (--hw NAME|FILE|calibrate)");
    if (strcmp(spec, "calibrate") == 0) {
        snprintf(path, cap, "calibrate");
        return MT_OK;
    }
    char tried[1536] = "";
    size_t used = 0;
    char cand[1200], dir[1024];
    dir_of(run_config, dir, sizeof dir);
    const size_t sl = strlen(spec);
    const bool file = strchr(spec, '/') || (sl > 5 && strcmp(spec + sl - 5, ".yaml") == 0) ||
                      (sl > 4 && strcmp(spec + sl - 4, ".yml") == 0);
#define TRY_PATH(...)                                                                   \
    do {                                                                                \
        snprintf(cand, sizeof cand, __VA_ARGS__);                                       \
        if (is_file(cand)) {                                                            \
            if (strlen(cand) >= cap) return mt_error_set(err, MT_ERR_CONFIG, "hardware profile path too long"); \
            snprintf(path, cap, "%s", cand);                                            \
            return MT_OK;                                                               \
        }                                                                               \
        int w_ = snprintf(tried + used, sizeof tried - used, "%s%s", used ? ", " : "", cand); \
        if (w_ > 0 && (size_t)w_ < sizeof tried - used) used += (size_t)w_;             \
    } while (0)
    if (file) {
        TRY_PATH("%s", spec);
        if (spec[0] != '/' && run_config) TRY_PATH("%s/%s", dir, spec);
        return mt_error_set(err, MT_ERR_IO, "hardware profile '%s' not found (tried %s)", spec, tried);
    }
    for (size_t i = 0; i < sl; i++)
        if (!(isalnum((unsigned char)spec[i]) || spec[i] == '-' || spec[i] == '_' || spec[i] == '.'))
            return mt_error_set(err, MT_ERR_CONFIG, "hardware profile name '%s' has characters other than letters, digits, '-', '_', '.'",
                                spec);
    if (run_config) TRY_PATH("%s/../hw/%s.yaml", dir, spec);
    const char *env = getenv("MOETUNE_HW_DIR");
    if (env && env[0]) TRY_PATH("%s/%s.yaml", env, spec);
    env = getenv("BUILD_WORKSPACE_DIRECTORY");
    if (env && env[0]) TRY_PATH("%s/configs/hw/%s.yaml", env, spec);
    TRY_PATH("configs/hw/%s.yaml", spec);
#undef TRY_PATH
    return mt_error_set(err, MT_ERR_IO,
                        "hardware profile '%s' not found (tried %s); give a file, set MOETUNE_HW_DIR, or use "
                        "--hw calibrate",
                        spec, tried);
}

/* ---- calibration ------------------------------------------------------------------ */

static void from_device_calibration(const sched_calibration_t *c, sched_hw_t *out) {
    snprintf(out->name, sizeof out->name, "calibrated-gpu");
    snprintf(out->source, sizeof out->source, "calibrate");
    snprintf(out->device_name, sizeof out->device_name, "%s (measured)", c->device_name);
    snprintf(out->link_name, sizeof out->link_name, "pinned copies (measured)");
    snprintf(out->host_name, sizeof out->host_name, "%d cores (measured)", c->cores);
    /* tf32 is never asked for (fp32 products are true fp32) */
    out->peak_flops[SCHED_RATE_FP32] = out->peak_flops[SCHED_RATE_TF32] = c->sgemm_flops;
    out->peak_flops[SCHED_RATE_BF16] = c->bf16_gemm_flops > 0 ? c->bf16_gemm_flops : c->sgemm_flops;
    for (int r = 0; r < SCHED_RATE_COUNT; r++) out->flops_frac[r] = 1.0;
    out->device_memory = c->device_memory;
    out->device_bw_peak = c->device_bw;
    out->device_bw_frac = 1.0;
    out->link_bw_peak = c->link_bw;
    out->h2d_frac = 1.0;
    out->d2h_frac = c->link_bw > 0 && c->link_d2h_bw > 0 ? c->link_d2h_bw / c->link_bw : 1.0;
    out->copy_latency_s = c->link_latency_s;
    out->host_memory = c->host_memory;
    out->pinned_memory = c->host_memory;
    out->host_bw_peak = c->stream_bw;
    out->host_bw_frac = 1.0;
    out->host_cores = c->cores > 0 ? c->cores : 1;
    out->host_copy_s_per_byte = c->memcpy_bw > 0 ? 1.0 / c->memcpy_bw : 0;
}

/* The measured host and attention rates; what was not measured is left
 * to sched_hw_fill_rates's rules. */
static void measured_rates(const sched_calibration_t *c, sched_hw_t *out) {
    const sched_attn_path_t path = c->attn_tc ? SCHED_ATTN_TC : SCHED_ATTN_KERNEL;
    for (int d = 0; d < SCHED_DIR_COUNT; d++) out->attn_flops[path][d] = c->attn_flops[d];
    out->adamw_bw = c->adamw_bw;
    out->pack_bw = c->pack_bw;
    out->unpack_bw = c->unpack_bw;
    /* the calibration's rates are over the run's threads, one per core */
    const double cores = out->host_cores > 0 ? out->host_cores : 1;
    out->adamw_bf16_rate = c->adamw_bf16_rate / cores;
    out->adamw_8bit_rate = c->adamw_8bit_rate / cores;
    sched_hw_set_measured_nvme(c, out);
    sched_hw_fill_rates(out);
}

void sched_hw_set_measured_nvme(const sched_calibration_t *c, sched_hw_t *out) {
    if (c->nvme_read_bw > 0 && c->nvme_write_bw > 0) { /* the run's NVMe directory, measured */
        out->has_nvme = true;
        /* a long path's end names the directory best */
        const size_t len = strlen(c->nvme_path);
        snprintf(out->nvme_name, sizeof out->nvme_name, "%s%.100s (measured)", len > 100 ? "..." : "",
                 c->nvme_path + (len > 100 ? len - 100 : 0));
        out->nvme_read_bw = c->nvme_read_bw;
        out->nvme_write_bw = c->nvme_write_bw;
        out->nvme_queue_depth = c->nvme_queue_depth;
    }
}

void sched_hw_from_calibration(const sched_calibration_t *c, sched_hw_t *out) {
    memset(out, 0, sizeof *out);
    if (c->device_calibrated) {
        from_device_calibration(c, out);
        measured_rates(c, out);
        return;
    }
    snprintf(out->name, sizeof out->name, "calibrated-cpu");
    snprintf(out->source, sizeof out->source, "calibrate");
    snprintf(out->device_name, sizeof out->device_name, "CPU backend (measured)");
    snprintf(out->link_name, sizeof out->link_name, "%s", c->link_bw > 0 ? "throttled copy streams" : "memcpy");
    snprintf(out->host_name, sizeof out->host_name, "%d cores (measured)", c->cores);
    out->measured = true;
    /* measured rates are what is achieved: fraction 1 */
    for (int r = 0; r < SCHED_RATE_COUNT; r++) {
        /* tf32 is a GPU format: the CPU backend forms such products in fp32 */
        out->peak_flops[r] = r == SCHED_RATE_BF16 && c->bf16_gemm_flops > 0 ? c->bf16_gemm_flops : c->sgemm_flops;
        out->flops_frac[r] = 1.0;
    }
    out->device_memory = c->host_memory; /* the CPU backend's "device" arena is host memory */
    out->device_bw_peak = c->stream_bw;
    out->device_bw_frac = 1.0;
    out->link_bw_peak = c->link_bw > 0 ? c->link_bw : c->memcpy_bw;
    out->h2d_frac = out->d2h_frac = 1.0;
    out->copy_latency_s = c->link_latency_s;
    out->host_memory = c->host_memory;
    out->pinned_memory = c->host_memory;
    out->host_bw_peak = c->stream_bw;
    out->host_bw_frac = 1.0;
    out->host_cores = c->cores > 0 ? c->cores : 1;
    out->compute_interference = c->compute_interference;
    /* a transfer is two memcpys on the host cores: through the staging pool
     * and over the (emulated) link */
    out->host_copy_s_per_byte = c->memcpy_bw > 0 ? 2.0 / c->memcpy_bw : 0;
    measured_rates(c, out);
}
