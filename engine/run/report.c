/* metrics.jsonl and progress output (see report.h). */
#include "engine/run/report.h"
#include "base/clock.h"
#include "base/fileio.h"

#include <errno.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

mt_status_t eng_reporter_open(eng_reporter_t *r, const char *output_dir, bool progress,
                              mt_error_t *err) {
    memset(r, 0, sizeof *r);
    mt_status_t st = mt_mkdirs(output_dir, err);
    if (st != MT_OK) return st;
    snprintf(r->metrics_path, sizeof r->metrics_path, "%s/metrics.jsonl", output_dir);
    const char *path = r->metrics_path;
    r->metrics = fopen(path, "a"); /* an earlier run's lines are the user's: never truncated */
    if (!r->metrics) return mt_error_set(err, MT_ERR_IO, "cannot write '%s': %s", path, strerror(errno));
    r->tty = isatty(STDERR_FILENO);
    r->progress = progress;
    r->start_s = mt_now_s();
    return MT_OK;
}

mt_status_t eng_reporter_run_start(eng_reporter_t *r, const eng_run_header_t *h, mt_error_t *err) {
    char when[40];
    time_t t = time(NULL);
    struct tm tm;
    gmtime_r(&t, &tm);
    strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", &tm);
    json_t *o = json_object();
    json_object_set_new(o, "run_start", json_string(when));
    json_object_set_new(o, "pid", json_integer((json_int_t)getpid()));
    json_object_set_new(o, "config", json_string(h->config_path ? h->config_path : ""));
    json_object_set_new(o, "base_model", json_string(h->base_model ? h->base_model : ""));
    json_object_set_new(o, "output_dir", json_string(h->output_dir ? h->output_dir : ""));
    json_object_set_new(o, "total_steps", json_integer(h->total_steps));
    json_object_set_new(o, "seed", json_integer((json_int_t)h->seed));
    char *line = json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(o);
    MT_CHECK_ALLOC(line, "metrics header");
    /* a line whose end an earlier run lost to a crash must not swallow this one */
    struct stat sb;
    bool ok = true;
    if (stat(r->metrics_path, &sb) == 0 && sb.st_size > 0) {
        FILE *rd = fopen(r->metrics_path, "rb");
        if (rd && fseek(rd, (long)sb.st_size - 1, SEEK_SET) == 0 && fgetc(rd) != '\n')
            ok = fputc('\n', r->metrics) != EOF;
        if (rd) fclose(rd);
    }
    ok = ok && fprintf(r->metrics, "%s\n", line) > 0 && fflush(r->metrics) == 0;
    free(line);
    if (!ok) return mt_error_set(err, MT_ERR_IO, "%s: cannot append: %s", r->metrics_path, strerror(errno));
    return MT_OK;
}

static void fmt_duration(char *buf, size_t n, double s) {
    if (s < 0 || s > 1e7) {
        snprintf(buf, n, "--:--");
        return;
    }
    int t = (int)(s + 0.5);
    if (t >= 3600) snprintf(buf, n, "%d:%02d:%02d", t / 3600, (t / 60) % 60, t % 60);
    else snprintf(buf, n, "%d:%02d", t / 60, t % 60);
}

void eng_reporter_step(eng_reporter_t *r, const eng_step_report_t *s, bool log_line) {
    if (log_line && r->metrics) {
        json_t *o = json_object();
        json_object_set_new(o, "step", json_integer(s->step));
        json_object_set_new(o, "loss", json_real(s->loss));
        json_object_set_new(o, "ce_loss", json_real(s->ce_loss));
        json_object_set_new(o, "aux_loss", json_real(s->aux_loss));
        json_object_set_new(o, "lr", json_real(s->lr));
        json_object_set_new(o, "grad_norm", json_real(s->grad_norm));
        json_object_set_new(o, "tokens_per_s", json_real(s->tokens_per_s));
        json_object_set_new(o, "step_time_s", json_real(s->step_time_s));
        json_object_set_new(o, "tokens", json_integer(s->tokens));
        json_object_set_new(o, "epoch", json_integer(s->epoch));
        json_object_set_new(o, "peak_device_bytes", json_integer((json_int_t)s->peak_device_bytes));
        json_object_set_new(o, "peak_pinned_bytes", json_integer((json_int_t)s->peak_pinned_bytes));
        json_object_set_new(o, "peak_host_bytes", json_integer((json_int_t)s->peak_host_bytes));
        json_object_set_new(o, "host_allocated_bytes", json_integer((json_int_t)s->host_allocated_bytes));
        if (s->has_staging) {
            json_object_set_new(o, "staging_peak_in_use_bytes", json_integer((json_int_t)s->staging_peak_in_use_bytes));
            json_object_set_new(o, "staging_h2d_copies", json_integer((json_int_t)s->staging_copies[0]));
            json_object_set_new(o, "staging_d2h_copies", json_integer((json_int_t)s->staging_copies[1]));
            json_object_set_new(o, "staging_h2d_mean_copy_bytes", json_real(s->staging_mean_copy_bytes[0]));
            json_object_set_new(o, "staging_d2h_mean_copy_bytes", json_real(s->staging_mean_copy_bytes[1]));
            json_object_set_new(o, "staging_experts_skipped", json_integer((json_int_t)s->staging_experts_skipped));
            json_object_set_new(o, "staging_wait_s", json_real(s->staging_wait_s));
            json_object_set_new(o, "weight_h2d_bytes", json_integer((json_int_t)s->weight_h2d_bytes));
            json_object_set_new(o, "grad_d2h_bytes", json_integer((json_int_t)s->grad_d2h_bytes));
            if (s->input_d2h_bytes || s->input_h2d_bytes) { /* only steps that offload block inputs */
                json_object_set_new(o, "block_input_d2h_bytes", json_integer((json_int_t)s->input_d2h_bytes));
                json_object_set_new(o, "block_input_h2d_bytes", json_integer((json_int_t)s->input_h2d_bytes));
            }
        }
        if (s->speculation) json_object_set_new(o, "optimizer_speculation", json_string(s->speculation));
        if (s->updates_taken_back > 0)
            json_object_set_new(o, "host_updates_taken_back", json_integer(s->updates_taken_back));
        char *line = json_dumps(o, JSON_COMPACT | JSON_REAL_PRECISION(17));
        fprintf(r->metrics, "%s\n", line);
        fflush(r->metrics);
        free(line);
        json_decref(o);
    }
    if (!r->progress) return;
    const double elapsed = mt_now_s() - r->start_s;
    const double eta = s->step > 0 ? elapsed / s->step * (s->total_steps - s->step) : -1;
    char eta_s[32];
    fmt_duration(eta_s, sizeof eta_s, eta);
    if (r->tty) {
        const int width = 24;
        int filled = s->total_steps > 0 ? (int)((double)width * s->step / s->total_steps) : 0;
        char bar[64];
        for (int i = 0; i < width; i++) bar[i] = i < filled ? '#' : '.';
        bar[width] = '\0';
        char ev[48] = "";
        if (r->has_eval) snprintf(ev, sizeof ev, "  eval %.4f", r->last_eval_loss);
        int len = fprintf(stderr, "\r[%s] step %d/%d  loss %.4f%s  lr %.2e  %.0f tok/s  ETA %s", bar,
                          s->step, s->total_steps, s->loss, ev, s->lr, s->tokens_per_s, eta_s);
        for (int i = len; i < r->last_len; i++) fputc(' ', stderr);
        r->last_len = len;
        if (s->step == s->total_steps) {
            fputc('\n', stderr);
            r->last_len = 0;
        }
        fflush(stderr);
    } else if (log_line) {
        char ev[48] = "";
        if (r->has_eval) snprintf(ev, sizeof ev, " eval_loss %.6f", r->last_eval_loss);
        fprintf(stderr, "step %d/%d loss %.6f%s lr %.3e grad_norm %.4f tokens/s %.1f step_time %.3fs ETA %s\n",
                s->step, s->total_steps, s->loss, ev, s->lr, s->grad_norm, s->tokens_per_s,
                s->step_time_s, eta_s);
    }
}

void eng_reporter_eval(eng_reporter_t *r, const eng_eval_report_t *e) {
    if (r->metrics) {
        json_t *o = json_object();
        json_object_set_new(o, "step", json_integer(e->step));
        json_object_set_new(o, "eval_loss", json_real(e->loss));
        json_object_set_new(o, "eval_ppl", json_real(e->ppl)); /* NULL (left out) if exp overflowed */
        json_object_set_new(o, "eval_tokens", json_integer((json_int_t)e->tokens));
        json_object_set_new(o, "eval_examples", json_integer((json_int_t)e->examples));
        json_object_set_new(o, "eval_seconds", json_real(e->seconds));
        json_object_set_new(o, "epoch", json_real(e->epoch));
        char *line = json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(17));
        fprintf(r->metrics, "%s\n", line);
        fflush(r->metrics);
        free(line);
        json_decref(o);
    }
    r->has_eval = true;
    r->last_eval_loss = e->loss;
    eng_reporter_note(r, "eval step %d: eval_loss %.6f eval_ppl %.4f over %lld tokens of %lld examples in %.3fs",
                      e->step, e->loss, e->ppl, (long long)e->tokens, (long long)e->examples, e->seconds);
}

void eng_reporter_note(eng_reporter_t *r, const char *fmt, ...) {
    if (r->tty && r->last_len > 0) {
        fputc('\n', stderr);
        r->last_len = 0;
    }
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
}

void eng_reporter_close(eng_reporter_t *r) {
    if (r->metrics) fclose(r->metrics);
    r->metrics = NULL;
}
