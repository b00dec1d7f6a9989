/* What a run tells its user: metrics.jsonl and progress on the terminal (a
 * live bar when stderr is a TTY, plain log lines otherwise).
 *
 * metrics.jsonl is appended to, never truncated: each run first writes a
 * header line {"run_start": ISO-8601 UTC time, "pid", "config",
 * "base_model", "output_dir", "total_steps", "seed"}, then one JSON object
 * per logged step, so the lines after a header are that run's, and one per
 * evaluation: {"step", "eval_loss", "eval_ppl", "eval_tokens",
 * "eval_examples", "eval_seconds", "epoch"} (engine/run/eval.h). */
#ifndef MT_ENGINE_REPORT_H
#define MT_ENGINE_REPORT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "base/status.h"

typedef struct {
    int step;              /* 1-based */
    int total_steps;
    double loss;           /* mean over the step's micro-batches, before the update */
    double ce_loss, aux_loss;
    double lr;
    double grad_norm;
    double tokens_per_s;
    double step_time_s;
    int64_t tokens;
    int epoch;
    size_t peak_device_bytes, peak_pinned_bytes, peak_host_bytes;
    size_t host_allocated_bytes; /* jemalloc stats.allocated */
    /* the staging pool this step (engine/exec/exec.h; extra metrics keys when has_staging) */
    bool has_staging;
    uint64_t staging_copies[2];        /* H2D, D2H copies through the pool */
    double staging_mean_copy_bytes[2];
    uint64_t staging_experts_skipped;  /* expert transfers not made: the expert got no token */
    uint64_t weight_h2d_bytes;         /* weight working-copy bytes host -> device this step */
    uint64_t input_d2h_bytes, input_h2d_bytes; /* layer-major block inputs offloaded / fetched back this step */
    uint64_t grad_d2h_bytes;           /* gradient bytes device -> host this step */
    const char *speculation;           /* the speculative host AdamW: "kept", "redone", or NULL (none ran) */
    int updates_taken_back;            /* blocks whose overlapped host update was deferred into the next step */
    double staging_wait_s;             /* time transfers waited for pinned space */
    size_t staging_peak_in_use_bytes;  /* of the peak_pinned_bytes reserved */
} eng_step_report_t;

/* An evaluation after optimizer step `step` (engine/run/eval.h). */
typedef struct {
    int step;
    double loss, ppl;
    int64_t tokens;   /* trained targets the loss is the mean over */
    int64_t examples;
    double seconds;
    double epoch;     /* HF Trainer's fractional epoch */
} eng_eval_report_t;

typedef struct {
    FILE *metrics;   /* output_dir/metrics.jsonl, appended to */
    char metrics_path[1100];
    bool tty;        /* live progress bar */
    bool progress;
    double start_s;
    int last_len;
    bool has_eval;   /* progress lines show the last eval loss */
    double last_eval_loss;
} eng_reporter_t;

/* The run a header line describes. */
typedef struct {
    const char *config_path;
    const char *base_model;
    const char *output_dir;
    int total_steps;
    uint64_t seed;
} eng_run_header_t;

/* Opens output_dir/metrics.jsonl for appending (mkdir -p output_dir). */
mt_status_t eng_reporter_open(eng_reporter_t *r, const char *output_dir, bool progress,
                              mt_error_t *err);
/* Appends the run's header line; call once, before the first step. */
mt_status_t eng_reporter_run_start(eng_reporter_t *r, const eng_run_header_t *h, mt_error_t *err);
/* Appends a metrics line and prints progress. */
void eng_reporter_step(eng_reporter_t *r, const eng_step_report_t *s, bool log_line);
/* Appends an evaluation's metrics line and prints it; later progress lines
 * show its loss. */
void eng_reporter_eval(eng_reporter_t *r, const eng_eval_report_t *e);
/* A message on its own line (keeps the bar intact). */
void eng_reporter_note(eng_reporter_t *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void eng_reporter_close(eng_reporter_t *r);

double eng_now_s(void);

#endif
