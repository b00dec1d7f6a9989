/* The full comparison's report (`moetune bench step` without a single
 * comparison flag), as text or as one JSON line: only writers here, so
 * that what is measured and predicted (step_bench.c) reads apart from how
 * it is shown, and the format stays in one place. */
#include <stdio.h>

#include "tools/bench/step_bench_internal.h"
#include "tools/build_info.h"

void step_report_json(const opts_t *o, const step_report_t *r) {
    const int nb = r->nb;
    const measure_t *keep = &r->keep, *off = &r->off, *off_overlap = &r->off_overlap, *minm = &r->minm,
                    *autom = &r->autom;
    const staging_cmp_t *sc = &r->sc;
    const double ratio = r->pair_ratio[2]; /* offload_all (overlapped) over keep_all, paired */
    const double share_off = off->optim_s / off->median_s, share_on = off_overlap->optim_s / off_overlap->median_s;
    char build[256];
    mt_build_info_line(build, sizeof build);
    printf("{\"build\": \"%s\", \"link_bytes_per_s\": %.6g, \"link_latency_us\": %g, \"h2d_bytes_per_step\": %llu,"
           " \"d2h_bytes_per_step\": %llu,"
           " \"keep_all_step_s\": %.6g, \"offload_all_step_s\": %.6g, \"offload_all_no_overlap_step_s\": %.6g,"
           " \"min_memory_step_s\": %.6g, \"offload_over_keep\": %.4f,"
           " \"optimizer_share_no_overlap\": %.4f, \"optimizer_share_overlap\": %.4f,"
           " \"peak_device_keep_all\": %zu, \"peak_device_offload_all\": %zu, \"peak_device_min_memory\": %zu,"
           " \"predicted_keep_all_s\": %.6g, \"predicted_offload_all_s\": %.6g, \"predicted_min_memory_s\": %.6g,"
           " \"predicted_under_traffic\": {\"offload_all_s\": %.6g, \"min_memory_s\": %.6g, \"auto_s\": %.6g},"
           " \"compute_s\": {\"keep_all\": %.6g, \"offload_all\": %.6g, \"min_memory\": %.6g, \"auto\": %.6g},"
           " \"offload_over_keep_at_keep_compute\": %.4f, \"compute_interference_probe\": %.4f,"
           " \"auto_budget_bytes\": %zu, \"auto_step_s\": %.6g, \"predicted_auto_s\": %.6g, \"peak_device_auto\": %zu,"
           " \"staging_compact_step_s\": %.6g, \"staging_per_tensor_step_s\": %.6g,"
           " \"staging_compact_vs_per_tensor_throughput\": %.4f, \"staging_pairs\": %d,"
           " \"staging_copies_per_step\": {\"compact\": [%llu, %llu], \"per_tensor\": [%llu, %llu]},"
           " \"staging_pinned_peak\": {\"compact\": %zu, \"per_tensor\": %zu}}\n",
           build, r->link_bps, o->link_latency_us, (unsigned long long)off->h2d_bytes,
           (unsigned long long)off->d2h_bytes, keep->median_s, off_overlap->median_s, off->median_s, minm->median_s,
           ratio, share_off, share_on, keep->peak_device, off_overlap->peak_device, minm->peak_device, r->pred_keep,
           r->pred_off, r->pred_min, r->pred_off_traffic, r->pred_min_traffic, r->pred_auto_traffic,
           compute_s(keep, nb), compute_s(off_overlap, nb), compute_s(minm, nb), compute_s(autom, nb),
           (compute_s(keep, nb) + off_overlap->median_s - compute_s(off_overlap, nb)) / keep->median_s, r->probe,
           r->auto_budget, autom->median_s, r->pred_auto, autom->peak_device, sc->step_s[0], sc->step_s[1],
           sc->ok ? sc->ratio : 0, sc->pairs, (unsigned long long)sc->copies[0][0],
           (unsigned long long)sc->copies[0][1], (unsigned long long)sc->copies[1][0],
           (unsigned long long)sc->copies[1][1], sc->pinned[0], sc->pinned[1]);
}

/* The plans the text report's table and block listing show, in order. */
typedef struct {
    const char *name;
    const measure_t *m;
} row_t;

enum { N_ROWS = 5 };

static void text_rows(const step_report_t *r, row_t rows[N_ROWS]) {
    rows[0] = (row_t){"keep_all", &r->keep};
    rows[1] = (row_t){"offload_all, optimizer after bwd", &r->off};
    rows[2] = (row_t){"offload_all, optimizer overlapped", &r->off_overlap};
    rows[3] = (row_t){"min_memory, optimizer overlapped", &r->minm};
    rows[4] = (row_t){"auto (device budget keep_all/2)", &r->autom};
}

/* The model, the link and one row per plan; compute is the blocks' own
 * forward and backward time, mean per step, whose growth over keep_all is
 * what the copies cost the compute stream. */
static void text_plans(const opts_t *o, const step_report_t *r, const row_t rows[N_ROWS]) {
    printf("synthetic mixtral: %d layers, hidden %d, %d experts (top-%d) of width %d, vocab %d; batch %d x %d tokens\n",
           o->layers, o->hidden, o->experts, o->topk, o->expert_width, o->vocab, o->batch, o->seq);
    printf("link: %.3f GB/s each way, %.0f us per copy (%s); offload_all moves %.1f MB H2D and %.1f MB D2H per step\n",
           r->link_bps / 1e9, o->link_latency_us,
           o->link_gbps > 0 ? "given" : "sized so each layer's transfers take <= --link-fraction of its compute",
           r->off.h2d_bytes / 1e6, r->off.d2h_bytes / 1e6);
    printf("%-34s %12s %14s %14s %16s\n", "plan", "step (ms)", "compute (ms)", "optimizer (ms)", "peak device (MB)");
    for (int i = 0; i < N_ROWS; i++)
        if (rows[i].m->ok)
            printf("%-34s %12.2f %14.2f %14.2f %16.2f\n", rows[i].name, rows[i].m->median_s * 1e3,
                   compute_s(rows[i].m, r->nb) * 1e3, rows[i].m->optim_s * 1e3, rows[i].m->peak_device / 1e6);
}

/* --blocks: where the compute time goes, block by block. */
static void text_blocks(const step_report_t *r, const row_t rows[N_ROWS]) {
    printf("\nblock compute (ms, mean per step), forward / backward:\n%-8s", "block");
    for (int i = 0; i < N_ROWS; i++)
        if (rows[i].m->ok) printf(" %20.20s", rows[i].name);
    printf("\n");
    for (int b = 0; b < r->nb; b++) {
        printf("%-8d", b);
        for (int i = 0; i < N_ROWS; i++)
            if (rows[i].m->ok) printf("      %6.2f / %6.2f", rows[i].m->fwd_s[b] * 1e3, rows[i].m->bwd_s[b] * 1e3);
        printf("\n");
    }
    printf("\n");
}

/* offload_all over keep_all.  The step splits into block compute and the
 * rest (waits for copies, the optimizer's share, bookkeeping).  On this
 * backend the copies and host AdamW run on cores that may share a physical
 * core or the memory system with compute, which stretches compute itself;
 * the second ratio is the step offload_all would take if its compute ran
 * at keep_all's speed, i.e. what the schedule alone adds. */
static void text_overhead(const step_report_t *r) {
    const measure_t *keep = &r->keep, *off_overlap = &r->off_overlap;
    printf("offload_all / keep_all step time: %.3f\n", r->pair_ratio[2]);
    const double keep_c = compute_s(keep, r->nb), off_c = compute_s(off_overlap, r->nb);
    printf("  block compute: keep_all %.2f ms, offload_all %.2f ms (x%.3f under copy and host-optimizer traffic)\n",
           keep_c * 1e3, off_c * 1e3, off_c / keep_c);
    printf("  the rest of the step: keep_all %.2f ms, offload_all %.2f ms\n", (keep->median_s - keep_c) * 1e3,
           (off_overlap->median_s - off_c) * 1e3);
    printf("  offload_all / keep_all with offload_all's compute at keep_all's speed: %.3f\n",
           (keep_c + off_overlap->median_s - off_c) / keep->median_s);
    if (r->probe > 0)
        printf("  probe: a 512^3 product on the compute core takes x%.3f as long while one memcpy loop runs on the\n"
               "  host core (median of pairs taken between the rounds; this machine's cores share more than a GPU\n"
               "  and its copy engines do)\n",
               r->probe);
}

static void text_predictions(const step_report_t *r) {
    const measure_t *keep = &r->keep, *off_overlap = &r->off_overlap, *minm = &r->minm, *autom = &r->autom;
    printf("\npredicted (simulator on the profiled keep_all step and the calibrated interference) vs measured median"
           " step time:\n");
    printf("  keep_all     %8.2f ms vs %8.2f ms  ratio %.3f\n", r->pred_keep * 1e3, keep->median_s * 1e3,
           r->pred_keep / keep->median_s);
    printf("  offload_all  %8.2f ms vs %8.2f ms  ratio %.3f\n", r->pred_off * 1e3, off_overlap->median_s * 1e3,
           r->pred_off / off_overlap->median_s);
    printf("  min_memory   %8.2f ms vs %8.2f ms  ratio %.3f\n", r->pred_min * 1e3, minm->median_s * 1e3,
           r->pred_min / minm->median_s);
    if (autom->ok)
        printf("  auto         %8.2f ms vs %8.2f ms  ratio %.3f  (budget %.1f MB, peak %.1f MB)\n", r->pred_auto * 1e3,
               autom->median_s * 1e3, r->pred_auto / autom->median_s, r->auto_budget / 1e6, autom->peak_device / 1e6);
    printf("\npredicted with block compute profiled under copy traffic (the offload_all run) vs measured:\n");
    printf("  offload_all  %8.2f ms vs %8.2f ms  ratio %.3f\n", r->pred_off_traffic * 1e3, off_overlap->median_s * 1e3,
           r->pred_off_traffic / off_overlap->median_s);
    printf("  min_memory   %8.2f ms vs %8.2f ms  ratio %.3f\n", r->pred_min_traffic * 1e3, minm->median_s * 1e3,
           r->pred_min_traffic / minm->median_s);
    if (autom->ok)
        printf("  auto         %8.2f ms vs %8.2f ms  ratio %.3f\n", r->pred_auto_traffic * 1e3, autom->median_s * 1e3,
               r->pred_auto_traffic / autom->median_s);
}

/* The host optimizer's share and the staging pool's comparison. */
static void text_optimizer_and_staging(const step_report_t *r) {
    const measure_t *off = &r->off, *off_overlap = &r->off_overlap;
    const staging_cmp_t *sc = &r->sc;
    const double share_off = off->optim_s / off->median_s, share_on = off_overlap->optim_s / off_overlap->median_s;
    printf("host optimizer share of the step (offload_all): %.1f%% after backward -> %.1f%% overlapped\n",
           100 * share_off, 100 * share_on);
    printf("\nstaging (offload_all, overlapped; %d paired steps, modes alternating A B B A; medians):\n", sc->pairs);
    printf("  compact     %8.2f ms per step, %llu H2D + %llu D2H copies per step, pinned peak %.2f MB\n",
           sc->step_s[0] * 1e3, (unsigned long long)sc->copies[0][0], (unsigned long long)sc->copies[0][1],
           sc->pinned[0] / 1e6);
    printf("  per_tensor  %8.2f ms per step, %llu H2D + %llu D2H copies per step, pinned peak %.2f MB\n",
           sc->step_s[1] * 1e3, (unsigned long long)sc->copies[1][0], (unsigned long long)sc->copies[1][1],
           sc->pinned[1] / 1e6);
    printf("  compact throughput / per_tensor: %.3f (median of the pairs' ratios; goal >= 0.95)\n",
           sc->ok ? sc->ratio : 0);
}

void step_report_text(const opts_t *o, const step_report_t *r) {
    row_t rows[N_ROWS];
    text_rows(r, rows);
    text_plans(o, r, rows);
    if (o->blocks) text_blocks(r, rows);
    text_overhead(r);
    text_predictions(r);
    text_optimizer_and_staging(r);
}
