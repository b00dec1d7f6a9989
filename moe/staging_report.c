/* The staging profiler's writers (see staging_report.h).
 *
 * The SVG is meant to be read at a glance: one colour per mode, in-use as
 * a solid line over a faint min-max band and reserved as a dashed line of
 * the same colour, so a mode whose dashed line sits far above its solid
 * line is wasting pinned memory.  Lines show the time-weighted mean over
 * buckets of a few pixels (a pool that fills and drains every few
 * microseconds would otherwise paint a solid block); the band keeps every
 * extreme visible and the legend prints the exact peaks.  Time runs in ms
 * (s for runs over 10 s), bytes in the binary unit that suits the peak. */
#include "moe/staging_report.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

const char *moe_staging_fmt_bytes(double b, char *buf, size_t cap) {
    static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int u = 0;
    while (fabs(b) >= 1024.0 && u < 4) b /= 1024.0, u++;
    snprintf(buf, cap, u ? "%.2f %s" : "%.0f %s", b, units[u]);
    return buf;
}

/* ---- CSV ------------------------------------------------------------------ */

void moe_staging_timeline_csv(FILE *f, const moe_staging_timeline_t *tl, bool header) {
    if (header) fprintf(f, "mode,t_ms,reserved_bytes,in_use_bytes,payload_bytes,waiting,step\n");
    for (size_t i = 0; i < tl->n; i++) {
        const moe_staging_sample_t *s = &tl->s[i];
        fprintf(f, "%s,%.4f,%zu,%zu,%zu,%d,%d\n", tl->label, s->t_s * 1e3, s->reserved, s->in_use, s->payload,
                s->waiting, (int)s->step);
    }
}

static FILE *open_out(const char *path, mt_error_t *err) {
    FILE *f = fopen(path, "w");
    if (!f) mt_error_set(err, MT_ERR_IO, "%s: cannot write (%s)", path, strerror(errno));
    return f;
}

static mt_status_t close_out(FILE *f, const char *path, mt_error_t *err) {
    const bool bad = ferror(f) != 0;
    if (fclose(f) != 0 || bad) return mt_error_set(err, MT_ERR_IO, "%s: write failed", path);
    return MT_OK;
}

mt_status_t moe_staging_write_csv_timelines(const moe_staging_timeline_t *const *tl, int n, const char *path,
                                            mt_error_t *err) {
    FILE *f = open_out(path, err);
    if (!f) return err->code;
    for (int k = 0; k < n; k++) moe_staging_timeline_csv(f, tl[k], k == 0);
    if (n == 0) fprintf(f, "mode,t_ms,reserved_bytes,in_use_bytes,payload_bytes,waiting,step\n");
    return close_out(f, path, err);
}

mt_status_t moe_staging_write_csv(const moe_staging_t *pool, const char *path, mt_error_t *err) {
    const moe_staging_timeline_t *tl = moe_staging_timeline(pool);
    return moe_staging_write_csv_timelines(&tl, 1, path, err);
}

/* ---- SVG ------------------------------------------------------------------ */

enum { W = 1000, H = 590, ML = 96, MR = 280, MT = 66, MB = 100 };
static const char *const k_colors[] = {"#1b7837", "#d6604d", "#2166ac", "#762a83", "#e08214", "#4d4d4d"};

static void xml_text(FILE *f, const char *s) {
    for (; *s; s++) {
        switch (*s) {
        case '&': fputs("&amp;", f); break;
        case '<': fputs("&lt;", f); break;
        case '>': fputs("&gt;", f); break;
        case '"': fputs("&quot;", f); break;
        default: fputc(*s, f);
        }
    }
}

/* A step of 1, 2 or 5 times a power of ten giving about `want` ticks. */
static double nice_step(double range, int want) {
    if (range <= 0) return 1;
    const double raw = range / want, mag = pow(10.0, floor(log10(raw))), r = raw / mag;
    return (r <= 1 ? 1 : r <= 2 ? 2 : r <= 5 ? 5 : 10) * mag;
}

typedef struct {
    double x0, x1, y0, y1; /* data ranges */
    double px0, px1, py0, py1;
} frame_t;

static double fx(const frame_t *fr, double x) { return fr->px0 + (x - fr->x0) / (fr->x1 - fr->x0) * (fr->px1 - fr->px0); }
static double fy(const frame_t *fr, double y) { return fr->py0 - (y - fr->y0) / (fr->y1 - fr->y0) * (fr->py0 - fr->py1); }

/* One series (field: 0 reserved, 1 in use) reduced to buckets of BUCKET_PX
 * pixels: the time-weighted mean of the step function in each bucket, and
 * its minimum and maximum.  A pool that fills and drains every few
 * microseconds would otherwise paint a solid block. */
enum { BUCKET_PX = 3 };

typedef struct {
    double sum, min, max, covered;
} bucket_t;

static size_t sample_value(const moe_staging_sample_t *s, int field) { return field ? s->in_use : s->reserved; }

static int bucketize(const frame_t *fr, const moe_staging_timeline_t *tl, int field, double tscale, double uscale,
                     bucket_t *b, int nb) {
    for (int k = 0; k < nb; k++) b[k] = (bucket_t){0, 1e300, -1e300, 0};
    const double span = (fr->x1 - fr->x0) / nb; /* data units per bucket */
    int last = -1;
    for (size_t i = 0; i + 1 < tl->n; i++) {
        const double v = (double)sample_value(&tl->s[i], field) / uscale;
        double t0 = tl->s[i].t_s * tscale, t1 = tl->s[i + 1].t_s * tscale;
        int k = (int)((t0 - fr->x0) / span);
        if (k >= nb) k = nb - 1;
        if (k < 0) k = 0;
        do { /* spread [t0, t1) over the buckets it covers */
            const double bend = fr->x0 + (k + 1) * span, piece = (t1 < bend ? t1 : bend) - t0;
            if (piece >= 0) {
                b[k].sum += v * piece;
                b[k].covered += piece;
                if (v < b[k].min) b[k].min = v;
                if (v > b[k].max) b[k].max = v;
                if (k > last) last = k;
            }
            t0 = bend;
            k++;
        } while (t0 < t1 && k < nb);
    }
    return last + 1;
}

static void series(FILE *f, const frame_t *fr, const moe_staging_timeline_t *tl, int field, double tscale,
                   double uscale, const char *color, bool dashed) {
    if (tl->n < 2) return;
    const int nb = (int)((fr->px1 - fr->px0) / BUCKET_PX);
    bucket_t *b = malloc((size_t)nb * sizeof *b);
    MT_CHECK_ALLOC(b, "svg buckets");
    const int used = bucketize(fr, tl, field, tscale, uscale, b, nb);
    const double w = (fr->px1 - fr->px0) / nb;
    if (!dashed) { /* the min..max band behind the in-use line */
        fprintf(f, "<polygon fill=\"%s\" fill-opacity=\"0.15\" stroke=\"none\" points=\"", color);
        for (int k = 0; k < used; k++)
            if (b[k].covered > 0)
                fprintf(f, "%.1f,%.1f %.1f,%.1f ", fr->px0 + k * w, fy(fr, b[k].max), fr->px0 + (k + 1) * w,
                        fy(fr, b[k].max));
        for (int k = used - 1; k >= 0; k--)
            if (b[k].covered > 0)
                fprintf(f, "%.1f,%.1f %.1f,%.1f ", fr->px0 + (k + 1) * w, fy(fr, b[k].min), fr->px0 + k * w,
                        fy(fr, b[k].min));
        fprintf(f, "\"/>\n");
    }
    fprintf(f, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"%s\"%s points=\"", color,
            dashed ? "1.8" : "2.2", dashed ? " stroke-dasharray=\"8 4\"" : "");
    for (int k = 0; k < used; k++)
        if (b[k].covered > 0) {
            const double mean = b[k].sum / b[k].covered;
            fprintf(f, "%.1f,%.1f %.1f,%.1f ", fr->px0 + k * w, fy(fr, mean), fr->px0 + (k + 1) * w, fy(fr, mean));
        }
    fprintf(f, "\"/>\n");
    free(b);
}

mt_status_t moe_staging_write_svg(const moe_staging_timeline_t *const *tl, int n, const char *path,
                                  mt_error_t *err) {
    double tmax = 0, ymax = 0;
    for (int k = 0; k < n; k++)
        for (size_t i = 0; i < tl[k]->n; i++) {
            const moe_staging_sample_t *s = &tl[k]->s[i];
            if (s->t_s > tmax) tmax = s->t_s;
            if ((double)s->reserved > ymax) ymax = (double)s->reserved;
            if ((double)s->in_use > ymax) ymax = (double)s->in_use;
        }
    if (tmax <= 0) tmax = 1e-3;
    if (ymax <= 0) ymax = 1;
    const bool secs = tmax > 10;
    const double tscale = secs ? 1 : 1e3;
    static const char *const unames[] = {"bytes", "KiB", "MiB", "GiB", "TiB"};
    int u = 0;
    double uscale = 1;
    while (ymax / uscale >= 1024 && u < 4) uscale *= 1024, u++;
    const double ystep = nice_step(ymax / uscale * 1.05, 5), xstep = nice_step(tmax * tscale, 8);
    frame_t fr = {0, tmax * tscale, 0, ceil(ymax / uscale * 1.05 / ystep) * ystep, ML, W - MR, H - MB, MT};

    FILE *f = open_out(path, err);
    if (!f) return err->code;
    fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\" "
               "font-family=\"sans-serif\" font-size=\"13\">\n", W, H, W, H);
    fprintf(f, "<rect width=\"%d\" height=\"%d\" fill=\"white\"/>\n", W, H);
    fprintf(f, "<text x=\"%d\" y=\"28\" font-size=\"17\" font-weight=\"bold\">Pinned staging memory over time"
               "%s</text>\n", ML, n > 1 ? ": staging modes compared" : "");
    fprintf(f, "<text x=\"%d\" y=\"46\" font-size=\"12\" fill=\"#555\">solid: bytes in live staging regions; "
               "dashed: pinned bytes the pool holds; each run ends where its lines end</text>\n", ML);
    /* grid and ticks */
    for (double y = 0; y <= fr.y1 + ystep * 1e-9; y += ystep) {
        fprintf(f, "<line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\" stroke=\"#e5e5e5\"/>\n", ML, fy(&fr, y), W - MR,
                fy(&fr, y));
        fprintf(f, "<text x=\"%d\" y=\"%.1f\" text-anchor=\"end\">%g</text>\n", ML - 8, fy(&fr, y) + 4, y);
    }
    for (double x = 0; x <= fr.x1 + xstep * 1e-9; x += xstep) {
        fprintf(f, "<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\" stroke=\"#f0f0f0\"/>\n", fx(&fr, x), MT,
                fx(&fr, x), H - MB);
        fprintf(f, "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\">%g</text>\n", fx(&fr, x), H - MB + 18, x);
    }
    fprintf(f, "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"black\"/>\n", ML, H - MB, W - MR, H - MB);
    fprintf(f, "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"black\"/>\n", ML, MT, ML, H - MB);
    fprintf(f, "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\">time (%s)</text>\n", (ML + W - MR) / 2, H - MB + 72,
            secs ? "s" : "ms");
    fprintf(f, "<text transform=\"translate(24 %d) rotate(-90)\" text-anchor=\"middle\">pinned host memory (%s)"
               "</text>\n", (MT + H - MB) / 2, unames[u]);
    /* waiting marks: one thin row per mode under the tick labels */
    fprintf(f, "<text x=\"%d\" y=\"%d\" text-anchor=\"end\" font-size=\"11\">waiting</text>\n", ML - 8,
            H - MB + 30 + 3 * n + 2);
    for (int k = 0; k < n; k++) {
        const char *c = k_colors[k % 6];
        const double y = H - MB + 30 + 6.0 * k;
        double xa = -1, xb = -1; /* the current mark; waits less than a pixel apart merge into it */
        for (size_t i = 0; i + 1 <= tl[k]->n; i++) {
            const bool last = i + 1 == tl[k]->n;
            if (!last && tl[k]->s[i].waiting) {
                const double a = fx(&fr, tl[k]->s[i].t_s * tscale), b = fx(&fr, tl[k]->s[i + 1].t_s * tscale);
                if (xa >= 0 && a <= xb + 1.0) {
                    if (b > xb) xb = b;
                    continue;
                }
                if (xa >= 0)
                    fprintf(f, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"3\" fill=\"%s\"/>\n", xa, y,
                            xb - xa > 0.8 ? xb - xa : 0.8, c);
                xa = a, xb = b;
            }
            if (last && xa >= 0)
                fprintf(f, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"3\" fill=\"%s\"/>\n", xa, y,
                        xb - xa > 0.8 ? xb - xa : 0.8, c);
        }
    }
    for (int k = 0; k < n; k++) {
        series(f, &fr, tl[k], 0, tscale, uscale, k_colors[k % 6], true);
        series(f, &fr, tl[k], 1, tscale, uscale, k_colors[k % 6], false);
    }
    /* legend */
    const int lx = W - MR + 18;
    int ly = MT + 4;
    fprintf(f, "<text x=\"%d\" y=\"%d\" font-weight=\"bold\">Legend</text>\n", lx, ly);
    ly += 20;
    fprintf(f, "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"black\" stroke-width=\"2.2\"/>"
               "<text x=\"%d\" y=\"%d\">in use (mean; band: min-max)</text>\n", lx, ly - 4, lx + 28, ly - 4, lx + 36, ly);
    ly += 18;
    fprintf(f, "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"black\" stroke-width=\"1.6\" "
               "stroke-dasharray=\"7 4\"/><text x=\"%d\" y=\"%d\">reserved (pinned)</text>\n",
            lx, ly - 4, lx + 28, ly - 4, lx + 36, ly);
    ly += 18;
    fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"28\" height=\"3\" fill=\"black\"/><text x=\"%d\" y=\"%d\">"
               "waiting for space (under the axis)</text>\n", lx, ly - 6, lx + 36, ly);
    ly += 28;
    for (int k = 0; k < n; k++) {
        size_t pr = 0, pu = 0;
        double waited = 0;
        for (size_t i = 0; i < tl[k]->n; i++) {
            if (tl[k]->s[i].reserved > pr) pr = tl[k]->s[i].reserved;
            if (tl[k]->s[i].in_use > pu) pu = tl[k]->s[i].in_use;
            if (tl[k]->s[i].waiting && i + 1 < tl[k]->n) waited += tl[k]->s[i + 1].t_s - tl[k]->s[i].t_s;
        }
        char b1[32], b2[32];
        fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"14\" height=\"14\" fill=\"%s\"/><text x=\"%d\" y=\"%d\" "
                   "font-weight=\"bold\">", lx, ly - 11, k_colors[k % 6], lx + 20, ly);
        xml_text(f, tl[k]->label);
        fprintf(f, "</text>\n<text x=\"%d\" y=\"%d\" font-size=\"12\">peak reserved %s</text>\n", lx + 20, ly + 16,
                moe_staging_fmt_bytes((double)pr, b1, sizeof b1));
        fprintf(f, "<text x=\"%d\" y=\"%d\" font-size=\"12\">peak in use %s, waited %.1f ms</text>\n", lx + 20,
                ly + 31, moe_staging_fmt_bytes((double)pu, b2, sizeof b2), waited * 1e3);
        ly += 52;
    }
    fprintf(f, "</svg>\n");
    return close_out(f, path, err);
}

/* ---- Chrome trace --------------------------------------------------------- */

size_t moe_staging_trace_counter_event(char *buf, size_t cap, const moe_staging_timeline_t *tl, size_t i, int pid,
                                       double off_us) {
    const moe_staging_sample_t *s = &tl->s[i];
    const int n = snprintf(buf, cap,
                           "{\"ph\":\"C\",\"name\":\"staging %s\",\"ts\":%.3f,\"pid\":%d,"
                           "\"args\":{\"reserved\":%zu,\"in_use\":%zu}}",
                           tl->label, s->t_s * 1e6 + off_us, pid, s->reserved, s->in_use);
    return n < 0 ? 0 : (size_t)n;
}

size_t moe_staging_trace_counters(FILE *f, const moe_staging_timeline_t *tl, int pid, double off_us,
                                  bool leading_comma) {
    size_t events = 0;
    char buf[512];
    int prev_wait = 0;
    for (size_t i = 0; i < tl->n; i++) {
        moe_staging_trace_counter_event(buf, sizeof buf, tl, i, pid, off_us);
        fprintf(f, "%s%s", events || leading_comma ? ",\n" : "", buf);
        events++;
        if (tl->s[i].waiting != prev_wait) {
            fprintf(f, ",\n{\"ph\":\"C\",\"name\":\"staging %s waiting\",\"ts\":%.3f,\"pid\":%d,"
                       "\"args\":{\"waiting\":%d}}",
                    tl->label, tl->s[i].t_s * 1e6 + off_us, pid, tl->s[i].waiting);
            events++;
            prev_wait = tl->s[i].waiting;
        }
    }
    return events;
}

/* ---- text summaries ------------------------------------------------------- */

void moe_staging_print_stats(FILE *f, const char *label, const moe_staging_stats_t *s) {
    char a[32], b[32], c[32], d[32], e[32];
    fprintf(f, "%-11s pinned reserved %s (peak), in use %s, payload %s, waste %.1f%% | capacity %s\n", label,
            moe_staging_fmt_bytes((double)s->peak_reserved, a, sizeof a),
            moe_staging_fmt_bytes((double)s->peak_in_use, b, sizeof b),
            moe_staging_fmt_bytes((double)s->peak_payload, c, sizeof c), s->waste_pct,
            moe_staging_fmt_bytes((double)s->capacity, d, sizeof d));
    fprintf(f, "%-11s H2D %llu copies (mean %s), D2H %llu copies (mean %s), %llu+%llu tensors, experts skipped "
               "%llu, waited %llu times for %.1f ms, packing %.1f ms\n",
            "", (unsigned long long)s->copies[0], moe_staging_fmt_bytes(s->mean_copy_bytes[0], e, sizeof e),
            (unsigned long long)s->copies[1], moe_staging_fmt_bytes(s->mean_copy_bytes[1], a, sizeof a),
            (unsigned long long)s->tensors[0], (unsigned long long)s->tensors[1],
            (unsigned long long)s->experts_skipped, (unsigned long long)s->waits, s->wait_s * 1e3, s->pack_s * 1e3);
}

void moe_staging_print_stats_json(FILE *f, const char *label, const moe_staging_stats_t *s) {
    fprintf(f,
            "{\"mode\": \"%s\", \"peak_reserved_bytes\": %zu, \"peak_in_use_bytes\": %zu, "
            "\"peak_payload_bytes\": %zu, \"waste_pct\": %.3f, \"capacity_bytes\": %zu, "
            "\"h2d_copies\": %llu, \"h2d_bytes\": %llu, \"h2d_mean_copy_bytes\": %.1f, "
            "\"d2h_copies\": %llu, \"d2h_bytes\": %llu, \"d2h_mean_copy_bytes\": %.1f, "
            "\"h2d_tensors\": %llu, \"d2h_tensors\": %llu, \"experts_skipped\": %llu, \"waits\": %llu, "
            "\"wait_s\": %.6f, \"pack_s\": %.6f}",
            label, s->peak_reserved, s->peak_in_use, s->peak_payload, s->waste_pct, s->capacity,
            (unsigned long long)s->copies[0], (unsigned long long)s->bytes[0], s->mean_copy_bytes[0],
            (unsigned long long)s->copies[1], (unsigned long long)s->bytes[1], s->mean_copy_bytes[1],
            (unsigned long long)s->tensors[0], (unsigned long long)s->tensors[1],
            (unsigned long long)s->experts_skipped, (unsigned long long)s->waits, s->wait_s, s->pack_s);
}

void moe_staging_plan_print(FILE *f, const char *what, const moe_staging_plan_t *p) {
    char a[32], b[32], c[32];
    const double pay = p->payload ? (double)p->payload : 1;
    fprintf(f, "pinned staging for %s: window of %d tensors, payload %s (largest in window %s, largest tensor %s)\n",
            what, p->tensors, moe_staging_fmt_bytes((double)p->payload, a, sizeof a),
            moe_staging_fmt_bytes((double)p->largest_in_window, b, sizeof b),
            moe_staging_fmt_bytes((double)p->largest_tensor, c, sizeof c));
    fprintf(f, "  compact     %12s  %6.2fx payload\n", moe_staging_fmt_bytes((double)p->compact, a, sizeof a),
            (double)p->compact / pay);
    fprintf(f, "  per_tensor  %12s  %6.2fx payload (page-rounded; %s = %.2fx with PyTorch's power-of-two rounding)\n",
            moe_staging_fmt_bytes((double)p->per_tensor, a, sizeof a), (double)p->per_tensor / pay,
            moe_staging_fmt_bytes((double)p->per_tensor_pow2, b, sizeof b), (double)p->per_tensor_pow2 / pay);
    fprintf(f, "  max_slot    %12s  %6.2fx payload (%d slots of %s), %.1fx compact\n",
            moe_staging_fmt_bytes((double)p->max_slot, a, sizeof a), (double)p->max_slot / pay, p->max_slot_slots,
            moe_staging_fmt_bytes((double)p->largest_tensor, b, sizeof b),
            p->compact ? (double)p->max_slot / (double)p->compact : 0);
}
