/* `moetune bench step`: training steps of a synthetic MoE under different
 * plans on the CPU backend, with the copy streams throttled to a link.
 *
 * It measures, in one run and on one machine:
 *   - the median step time of keep_all, offload_all and min_memory, and
 *     offload_all / keep_all (weights, gradients, optimizer state and
 *     activations all cross the link, so this is how well copies hide
 *     behind compute: MegaTrain reports near-zero overhead);
 *   - the host optimizer's share of the step with and without overlapping
 *     backward (offload_all, no clipping), the host AdamW overlap;
 *   - peak device bytes of each plan;
 *   - the staging pool: offload_all's step time with the compact
 *     pool against per_tensor (one pinned block and one copy per tensor), two
 *     models side by side with their steps alternating, the median of the
 *     per-pair ratios over --staging-rounds x --steps pairs (load from other
 *     processes hits both members of a pair); copies per step and pinned
 *     bytes beside it.
 * The link is either given (--link-gbps) or chosen so
 * that each layer's transfers under offload_all take no longer than its
 * compute, i.e. for every layer, phase (forward, backward) and direction,
 * the bytes it moves (the cost model's, for the synthetic model) over the
 * link take at most `--link-fraction` (default 0.9) of the layer's compute
 * time in that phase, as profiled in the keep_all run. */
#include "tools/bench/step_bench.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/model/io/init_random.h"
#include "scheduler/planner.h"
#include "tools/bench/step_bench_internal.h"
#include "tools/build_info.h"

static int parse(int argc, char **argv, opts_t *o) {
    *o = (opts_t){.layers = 8, .hidden = 256, .experts = 8, .topk = 2, .expert_width = 512, .vocab = 512,
                  .heads = 8, .kv_heads = 4, .seq = 128, .batch = 4, .steps = 5, .link_gbps = 0,
                  .link_latency_us = 10, .link_fraction = 0.9, .staging_rounds = 3, .compute_threads = 0};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
#define INT_OPT(name, field)                          \
    if (strcmp(a, name) == 0 && v) {                  \
        o->field = atoi(v);                           \
        i++;                                          \
        if (o->field <= 0) goto bad;                  \
        continue;                                     \
    }
#define DBL_OPT(name, field)                          \
    if (strcmp(a, name) == 0 && v) {                  \
        o->field = atof(v);                           \
        i++;                                          \
        if (o->field < 0) goto bad;                   \
        continue;                                     \
    }
        INT_OPT("--layers", layers)
        INT_OPT("--hidden", hidden)
        INT_OPT("--experts", experts)
        INT_OPT("--topk", topk)
        INT_OPT("--expert-width", expert_width)
        INT_OPT("--vocab", vocab)
        INT_OPT("--seq", seq)
        INT_OPT("--batch", batch)
        INT_OPT("--steps", steps)
        INT_OPT("--compute-threads", compute_threads)
        INT_OPT("--staging-rounds", staging_rounds)
        INT_OPT("--accum", accum)
        DBL_OPT("--link-gbps", link_gbps)
        DBL_OPT("--link-latency-us", link_latency_us)
        DBL_OPT("--link-fraction", link_fraction)
        if (strcmp(a, "--trace") == 0 && v) {
            o->trace = v;
            i++;
            continue;
        }
        if (strcmp(a, "--json") == 0) {
            o->json = true;
            continue;
        }
        if (strcmp(a, "--blocks") == 0) {
            o->blocks = true;
            continue;
        }
        if (strcmp(a, "--staging-only") == 0) {
            o->staging_only = true;
            continue;
        }
        if (strcmp(a, "--precision") == 0) {
            o->precision = true;
            continue;
        }
        if (strcmp(a, "--step-order") == 0) {
            o->step_order = true;
            continue;
        }
    bad:
        fprintf(stderr,
                "usage: moetune bench step [--layers N] [--hidden H] [--experts E] [--topk K]\n"
                "       [--expert-width I] [--vocab V] [--seq T] [--batch B] [--steps S]\n"
                "       [--link-gbps G | --link-fraction F] [--link-latency-us U] [--staging-rounds R]\n"
                "       [--staging-only | --precision | --step-order [--accum K]] [--blocks] [--trace FILE] [--json]\n"
                "bad or unknown option: %s\n",
                a);
        return 2;
    }
    if (o->topk > o->experts || o->hidden % o->heads) {
        fprintf(stderr, "bench step: need topk <= experts and hidden divisible by heads\n");
        return 2;
    }
    return 0;
}

/* bf16 mixed precision against fp32: keep_all and offload_all (overlapped)
 * in each, the four side by side, ratios paired per round. */
static int precision_report(const char *ckpt, const opts_t *o, double link_bps) {
    const int nb = o->layers + 2;
    sched_plan_t p_keep, p_off;
    sched_plan_init_uniform(&p_keep, nb, SCHED_POLICY_KEEP_ALL);
    sched_plan_init_uniform(&p_off, nb, SCHED_POLICY_OFFLOAD_ALL);
    const sched_plan_t *plans[] = {&p_keep, &p_keep, &p_off, &p_off};
    const bool overlaps[] = {false, false, true, true};
    const mt_dtype_t compute[] = {MT_F32, MT_BF16, MT_F32, MT_BF16};
    const char *const names[] = {"keep_all", "keep_all", "offload_all", "offload_all"};
    measure_t ms[4];
    double ratio[4], probe;
    measure_side_by_side_ex(ckpt, o, plans, overlaps, compute, 4, link_bps, -1, ms, ratio, &probe);
    sched_plan_free(&p_keep);
    sched_plan_free(&p_off);
    bool ok = true;
    for (int i = 0; i < 4; i++) ok &= ms[i].ok;
    if (ok && o->json) {
        printf("{\"link_gbps\": %.6g, \"runs\": [", link_bps / 1e9);
        for (int i = 0; i < 4; i++)
            printf("%s{\"plan\": \"%s\", \"compute\": \"%s\", \"step_s\": %.6g, \"ratio_to_keep_all_fp32\": %.6g,"
                   " \"h2d_bytes\": %llu, \"d2h_bytes\": %llu, \"peak_device_bytes\": %zu}",
                   i ? ", " : "", names[i], compute[i] == MT_BF16 ? "bf16" : "fp32",
                   ms[i].median_s, ratio[i], (unsigned long long)ms[i].h2d_bytes,
                   (unsigned long long)ms[i].d2h_bytes, ms[i].peak_device);
        printf("]}\n");
    } else if (ok) {
        printf("bf16 mixed precision against fp32 (%d steps each, side by side; link %.3f GB/s):\n", o->steps,
               link_bps / 1e9);
        printf("  %-12s %-5s %10s %9s %12s %12s %12s\n", "plan", "", "step ms", "vs fp32", "H2D MB/step",
               "D2H MB/step", "peak dev MB");
        for (int i = 0; i < 4; i++) {
            const double vs = i % 2 ? ratio[i] / ratio[i - 1] : 1.0;
            printf("  %-12s %-5s %10.2f %9.3f %12.3f %12.3f %12.3f\n", names[i],
                   compute[i] == MT_BF16 ? "bf16" : "fp32", ms[i].median_s * 1e3, vs, ms[i].h2d_bytes / 1e6,
                   ms[i].d2h_bytes / 1e6, ms[i].peak_device / 1e6);
        }
        printf("  (\"vs fp32\": bf16 over fp32 for the same plan, from the medians over rounds of each step over\n"
               "   keep_all fp32's in the same round)\n");
    }
    for (int i = 0; i < 4; i++) measure_free(&ms[i]);
    return ok ? 0 : 1;
}

int mt_bench_step_main(int argc, char **argv) {
    opts_t o;
    int rc = parse(argc, argv, &o);
    if (rc) return rc;
    if (!o.json) mt_build_info_print(stdout);
    /* a fresh directory: a pid alone is not unique across the PID
     * namespaces of tests running side by side over one /tmp */
    char ckpt[256];
    const char *tmp = getenv("TMPDIR");
    snprintf(ckpt, sizeof ckpt, "%s/moetune-bench-step-XXXXXX", tmp && tmp[0] ? tmp : "/tmp");
    if (!mkdtemp(ckpt)) {
        fprintf(stderr, "bench step: cannot create a directory under %s: %s\n", tmp && tmp[0] ? tmp : "/tmp",
                strerror(errno));
        return 1;
    }
    char config[1024];
    snprintf(config, sizeof config,
             "{\"model_type\": \"mixtral\", \"vocab_size\": %d, \"hidden_size\": %d, \"intermediate_size\": %d,"
             " \"num_hidden_layers\": %d, \"num_attention_heads\": %d, \"num_key_value_heads\": %d,"
             " \"num_local_experts\": %d, \"num_experts_per_tok\": %d, \"rms_norm_eps\": 1e-5,"
             " \"rope_theta\": 10000.0, \"tie_word_embeddings\": false, \"output_router_logits\": true}",
             o.vocab, o.hidden, o.expert_width, o.layers, o.heads, o.kv_heads, o.experts, o.topk);
    mt_error_t err = {0};
    if (eng_checkpoint_init_random(ckpt, config, 1, &err) != MT_OK) {
        fprintf(stderr, "bench step: %s\n", err.msg);
        return 1;
    }

    /* keep_all alone and unthrottled first: its block times size the link */
    measure_t keep;
    {
        sched_plan_t p_keep;
        sched_plan_init_uniform(&p_keep, o.layers + 2, SCHED_POLICY_KEEP_ALL);
        const sched_plan_t *one[] = {&p_keep};
        const bool no_overlap[] = {false};
        double unused_ratio, unused_probe;
        measure_side_by_side(ckpt, &o, one, no_overlap, 1, 0, -1, &keep, &unused_ratio, &unused_probe);
        sched_plan_free(&p_keep);
    }
    /* the planner's view of this run, on the profiled keep_all step */
    predictor_t pr = {0};
    double link_bps = o.link_gbps * 1e9;
    if (keep.ok) {
        predictor_init(&pr, ckpt, &o, link_bps > 0 ? link_bps : 1e9, &keep, keep.optim_s);
        if (link_bps == 0 && pr.ok)
            link_bps = layer_bound_link(&pr.w, &keep, o.link_fraction, o.link_latency_us * 1e-6);
        pr.w.h2d_bw = pr.w.d2h_bw = link_bps;
    }
    if (!keep.ok || !(link_bps > 0) || !isfinite(link_bps)) {
        if (keep.ok)
            fprintf(stderr,
                    "bench step: no link speed fits every layer's transfers in %.0f%% of its compute: the copies' "
                    "latency (%g us each) alone takes longer; give --link-gbps, a lower --link-latency-us or a "
                    "bigger model\n",
                    100 * o.link_fraction, o.link_latency_us);
        else
            fprintf(stderr, "bench step: keep_all failed, nothing to size the link on\n");
        measure_free(&keep);
        return 1;
    }
    if (o.staging_only) { /* just the staging comparison, on the link chosen as above */
        staging_cmp_t sc;
        if (keep.ok) measure_staging(ckpt, &o, link_bps, &sc);
        char cmd[300];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", ckpt);
        if (system(cmd) != 0) fprintf(stderr, "bench step: could not remove %s\n", ckpt);
        const bool ok = keep.ok && sc.ok;
        measure_free(&keep);
        predictor_free(&pr);
        if (!ok) return 1;
        printf("staging, offload_all on a %.3f GB/s + %.0f us link (%d paired steps, modes alternating A B B A):\n",
               link_bps / 1e9, o.link_latency_us, sc.pairs);
        for (int k = 0; k < 2; k++)
            printf("  %-10s  %8.2f ms per step, %llu H2D + %llu D2H copies per step, pinned peak %.2f MB\n",
                   k ? "per_tensor" : "compact", sc.step_s[k] * 1e3, (unsigned long long)sc.copies[k][0],
                   (unsigned long long)sc.copies[k][1], sc.pinned[k] / 1e6);
        printf("  compact throughput / per_tensor: %.3f (median of the pairs' ratios; goal >= 0.95)\n", sc.ratio);
        return 0;
    }
    if (o.step_order) { /* layer-major against micro-batch-major, on the link chosen as above */
        const int rc_o = step_order_report(ckpt, &o, link_bps, &keep);
        char cmd[300];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", ckpt);
        if (system(cmd) != 0) fprintf(stderr, "bench step: could not remove %s\n", ckpt);
        measure_free(&keep);
        predictor_free(&pr);
        return rc_o;
    }
    if (o.precision) { /* fp32 against bf16, on the link chosen as above */
        const int rc_p = precision_report(ckpt, &o, link_bps);
        char cmd[300];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", ckpt);
        if (system(cmd) != 0) fprintf(stderr, "bench step: could not remove %s\n", ckpt);
        measure_free(&keep);
        predictor_free(&pr);
        return rc_p;
    }
    /* auto: the planner's choice under a device budget of half keep_all's
     * peak, planned on the profiled workload */
    const int nb = o.layers + 2;
    size_t auto_budget = keep.peak_device / 2;
    sched_plan_t auto_plan = {0};
    bool have_auto = false;
    if (pr.ok) {
        sched_planner_opts_t po;
        sched_planner_opts_default(&po);
        po.policy = SCHED_POLICY_AUTO;
        po.budget[SCHED_MEM_DEVICE] = (double)auto_budget;
        sched_planner_result_t res;
        mt_error_t perr = {0};
        if (sched_plan_make(&pr.w, &po, &res, &perr) == MT_OK && res.feasible) {
            if (o.blocks && !o.json) { /* what the planner chose, block by block */
                printf("auto plan (window %d): block weights/grads/optimizer/activations:", res.plan.prefetch_window);
                for (int b = 0; b < res.plan.num_blocks; b++) {
                    const sched_block_plan_t *bp = &res.plan.blocks[b];
                    printf(" %d:%c%c%c%c", b, bp->weights == SCHED_WEIGHTS_STREAM ? 'S' : 'R',
                           bp->grads == SCHED_GRADS_HOST ? 'H' : 'D', bp->optim == SCHED_OPTIM_HOST ? 'H' : 'D',
                           "KOR"[bp->acts]);
                }
                printf("  (S stream, R resident; H host, D device; K keep, O offload, R recompute)\n");
            }
            auto_plan = res.plan; /* taken over */
            res.plan.blocks = NULL;
            have_auto = true;
        } else {
            fprintf(stderr, "bench step: auto plan under %zu bytes: %s\n", auto_budget, res.feasible ? perr.msg : res.why);
        }
        sched_planner_result_free(&res);
    }

    /* every plan side by side (see measure_side_by_side) */
    sched_plan_t p_keep, p_off, p_min;
    sched_plan_init_uniform(&p_keep, nb, SCHED_POLICY_KEEP_ALL);
    sched_plan_init_uniform(&p_off, nb, SCHED_POLICY_OFFLOAD_ALL);
    sched_plan_init_uniform(&p_min, nb, SCHED_POLICY_MIN_MEMORY);
    const sched_plan_t *plans[] = {&p_keep, &p_off, &p_off, &p_min, &auto_plan};
    const bool overlaps[] = {false, false, true, true, true};
    measure_t ms[5];
    double pair_ratio[5] = {0};
    measure_free(&keep);
    double run_probe = 0; /* the interference probe's median during the run (busy / idle) */
    measure_side_by_side(ckpt, &o, plans, overlaps, have_auto ? 5 : 4, link_bps, 2, ms, pair_ratio, &run_probe);
    measure_t keep2 = ms[0], off = ms[1], off_overlap = ms[2], minm = ms[3], autom = have_auto ? ms[4] : (measure_t){0};
    keep = keep2;
    sched_plan_free(&p_keep);
    sched_plan_free(&p_off);
    sched_plan_free(&p_min);

    /* the predictions, on this run's keep_all profile (the planner's view) */
    predictor_free(&pr);
    if (keep.ok) {
        predictor_init(&pr, ckpt, &o, link_bps, &keep, keep.optim_s);
        pr.w.h2d_bw = pr.w.d2h_bw = link_bps;
        if (pr.ok && run_probe > 0) /* the probe taken beside the run, rather than the calibration's own */
            pr.cal.compute_interference = pr.w.compute_interference = run_probe > 1 ? run_probe - 1 : 0;
    }
    /* A second view: block compute as profiled in the offload_all run, i.e.
     * under copy and host-optimizer traffic, so that the simulator's own job,
     * the overlap and the waits, is judged apart from what the traffic does
     * to compute on this backend. */
    predictor_t pr_traffic = {0};
    if (off_overlap.ok) {
        predictor_init(&pr_traffic, ckpt, &o, link_bps, &off_overlap, keep.optim_s);
        pr_traffic.w.h2d_bw = pr_traffic.w.d2h_bw = link_bps;
        pr_traffic.w.compute_interference = 0; /* already in these compute times */
    }
    const double pred_auto = have_auto ? predict(&pr, &auto_plan) : 0;
    const double pred_auto_traffic = have_auto ? predict(&pr_traffic, &auto_plan) : 0;
    if (have_auto) sched_plan_free(&auto_plan);
    staging_cmp_t sc;
    measure_staging(ckpt, &o, link_bps, &sc);
    const double staging_ratio = sc.ok ? sc.ratio : 0;
    const double pred_keep = predict_uniform(&pr, nb, SCHED_POLICY_KEEP_ALL);
    const double pred_off = predict_uniform(&pr, nb, SCHED_POLICY_OFFLOAD_ALL);
    const double pred_min = predict_uniform(&pr, nb, SCHED_POLICY_MIN_MEMORY);
    const double pred_off_traffic = predict_uniform(&pr_traffic, nb, SCHED_POLICY_OFFLOAD_ALL);
    const double pred_min_traffic = predict_uniform(&pr_traffic, nb, SCHED_POLICY_MIN_MEMORY);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", ckpt);
    if (system(cmd) != 0) fprintf(stderr, "bench step: could not remove %s\n", ckpt);
    if (!keep.ok || !off.ok || !off_overlap.ok || !minm.ok || !sc.ok) return 1;
    const double probe = pr.ok && pr.cal.compute_interference > 0 ? 1 + pr.cal.compute_interference : 0;
    predictor_free(&pr);
    predictor_free(&pr_traffic);

    const double ratio = pair_ratio[2]; /* offload_all (overlapped) over keep_all, paired */
    const double share_off = off.optim_s / off.median_s, share_on = off_overlap.optim_s / off_overlap.median_s;
    if (o.json) {
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
               build, link_bps, o.link_latency_us, (unsigned long long)off.h2d_bytes, (unsigned long long)off.d2h_bytes,
               keep.median_s, off_overlap.median_s, off.median_s, minm.median_s, ratio, share_off, share_on,
               keep.peak_device, off_overlap.peak_device, minm.peak_device, pred_keep, pred_off, pred_min,
               pred_off_traffic, pred_min_traffic, pred_auto_traffic, compute_s(&keep, nb), compute_s(&off_overlap, nb),
               compute_s(&minm, nb), compute_s(&autom, nb),
               (compute_s(&keep, nb) + off_overlap.median_s - compute_s(&off_overlap, nb)) / keep.median_s,
               probe, auto_budget,
               autom.median_s, pred_auto, autom.peak_device, sc.step_s[0], sc.step_s[1], staging_ratio, sc.pairs,
               (unsigned long long)sc.copies[0][0], (unsigned long long)sc.copies[0][1],
               (unsigned long long)sc.copies[1][0], (unsigned long long)sc.copies[1][1], sc.pinned[0], sc.pinned[1]);
        measure_free(&keep), measure_free(&off), measure_free(&off_overlap), measure_free(&minm), measure_free(&autom);
        return 0;
    }
    printf("synthetic mixtral: %d layers, hidden %d, %d experts (top-%d) of width %d, vocab %d; batch %d x %d tokens\n",
           o.layers, o.hidden, o.experts, o.topk, o.expert_width, o.vocab, o.batch, o.seq);
    printf("link: %.3f GB/s each way, %.0f us per copy (%s); offload_all moves %.1f MB H2D and %.1f MB D2H per step\n",
           link_bps / 1e9, o.link_latency_us, o.link_gbps > 0 ? "given" : "sized so each layer's transfers take <= --link-fraction of its compute",
           off.h2d_bytes / 1e6, off.d2h_bytes / 1e6);
    /* compute: the blocks' own forward and backward time, mean per step; its
     * growth over keep_all is what the copies cost the compute stream */
    printf("%-34s %12s %14s %14s %16s\n", "plan", "step (ms)", "compute (ms)", "optimizer (ms)", "peak device (MB)");
    const struct {
        const char *name;
        const measure_t *m;
    } rows[] = {{"keep_all", &keep},
                {"offload_all, optimizer after bwd", &off},
                {"offload_all, optimizer overlapped", &off_overlap},
                {"min_memory, optimizer overlapped", &minm},
                {"auto (device budget keep_all/2)", &autom}};
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++)
        if (rows[i].m->ok)
            printf("%-34s %12.2f %14.2f %14.2f %16.2f\n", rows[i].name, rows[i].m->median_s * 1e3,
                   compute_s(rows[i].m, nb) * 1e3, rows[i].m->optim_s * 1e3, rows[i].m->peak_device / 1e6);
    if (o.blocks) { /* where the compute time goes, block by block */
        printf("\nblock compute (ms, mean per step), forward / backward:\n%-8s", "block");
        for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++)
            if (rows[i].m->ok) printf(" %20.20s", rows[i].name);
        printf("\n");
        for (int b = 0; b < nb; b++) {
            printf("%-8d", b);
            for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++)
                if (rows[i].m->ok) printf("      %6.2f / %6.2f", rows[i].m->fwd_s[b] * 1e3, rows[i].m->bwd_s[b] * 1e3);
            printf("\n");
        }
        printf("\n");
    }
    printf("offload_all / keep_all step time: %.3f\n", ratio);
    /* The step splits into block compute and the rest (waits for copies,
     * the optimizer's share, bookkeeping).  On this backend the copies and
     * host AdamW run on cores that may share a physical core or the memory
     * system with compute, which stretches compute itself; the second ratio
     * is the step offload_all would take if its compute ran at keep_all's
     * speed, i.e. what the schedule alone adds. */
    const double keep_c = compute_s(&keep, nb), off_c = compute_s(&off_overlap, nb);
    printf("  block compute: keep_all %.2f ms, offload_all %.2f ms (x%.3f under copy and host-optimizer traffic)\n",
           keep_c * 1e3, off_c * 1e3, off_c / keep_c);
    printf("  the rest of the step: keep_all %.2f ms, offload_all %.2f ms\n", (keep.median_s - keep_c) * 1e3,
           (off_overlap.median_s - off_c) * 1e3);
    printf("  offload_all / keep_all with offload_all's compute at keep_all's speed: %.3f\n",
           (keep_c + off_overlap.median_s - off_c) / keep.median_s);
    if (probe > 0)
        printf("  probe: a 512^3 product on the compute core takes x%.3f as long while one memcpy loop runs on the\n"
               "  host core (median of pairs taken between the rounds; this machine's cores share more than a GPU\n"
               "  and its copy engines do)\n",
               probe);
    printf("\npredicted (simulator on the profiled keep_all step and the calibrated interference) vs measured median"
           " step time:\n");
    printf("  keep_all     %8.2f ms vs %8.2f ms  ratio %.3f\n", pred_keep * 1e3, keep.median_s * 1e3, pred_keep / keep.median_s);
    printf("  offload_all  %8.2f ms vs %8.2f ms  ratio %.3f\n", pred_off * 1e3, off_overlap.median_s * 1e3,
           pred_off / off_overlap.median_s);
    printf("  min_memory   %8.2f ms vs %8.2f ms  ratio %.3f\n", pred_min * 1e3, minm.median_s * 1e3, pred_min / minm.median_s);
    if (autom.ok)
        printf("  auto         %8.2f ms vs %8.2f ms  ratio %.3f  (budget %.1f MB, peak %.1f MB)\n", pred_auto * 1e3,
               autom.median_s * 1e3, pred_auto / autom.median_s, auto_budget / 1e6, autom.peak_device / 1e6);
    printf("\npredicted with block compute profiled under copy traffic (the offload_all run) vs measured:\n");
    printf("  offload_all  %8.2f ms vs %8.2f ms  ratio %.3f\n", pred_off_traffic * 1e3, off_overlap.median_s * 1e3,
           pred_off_traffic / off_overlap.median_s);
    printf("  min_memory   %8.2f ms vs %8.2f ms  ratio %.3f\n", pred_min_traffic * 1e3, minm.median_s * 1e3,
           pred_min_traffic / minm.median_s);
    if (autom.ok)
        printf("  auto         %8.2f ms vs %8.2f ms  ratio %.3f\n", pred_auto_traffic * 1e3, autom.median_s * 1e3,
               pred_auto_traffic / autom.median_s);
    printf("host optimizer share of the step (offload_all): %.1f%% after backward -> %.1f%% overlapped\n",
           100 * share_off, 100 * share_on);
    printf("\nstaging (offload_all, overlapped; %d paired steps, modes alternating A B B A; medians):\n", sc.pairs);
    printf("  compact     %8.2f ms per step, %llu H2D + %llu D2H copies per step, pinned peak %.2f MB\n",
           sc.step_s[0] * 1e3, (unsigned long long)sc.copies[0][0], (unsigned long long)sc.copies[0][1],
           sc.pinned[0] / 1e6);
    printf("  per_tensor  %8.2f ms per step, %llu H2D + %llu D2H copies per step, pinned peak %.2f MB\n",
           sc.step_s[1] * 1e3, (unsigned long long)sc.copies[1][0], (unsigned long long)sc.copies[1][1],
           sc.pinned[1] / 1e6);
    printf("  compact throughput / per_tensor: %.3f (median of the pairs' ratios; goal >= 0.95)\n", staging_ratio);
    measure_free(&keep), measure_free(&off), measure_free(&off_overlap), measure_free(&minm), measure_free(&autom);
    return 0;
}
