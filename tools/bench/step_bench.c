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
 * time in that phase, as profiled in the keep_all run.
 *
 * This file holds the options, the synthetic checkpoint, the link and the
 * order each comparison runs in, one step per function; the runs
 * themselves are step_measure.c's, the predictions step_predict.c's, the
 * step-order comparison step_order.c's and the full report's text and
 * JSON step_report.c's. */
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
                  .link_latency_us = 10, .link_fraction = 0.9, .staging_rounds = 3, .compute_threads = 0,
                  .model_type = "mixtral", .hw = "h100-sxm", .bf16 = -1};
    /* a preset first, so that the options given beside it override it */
    for (int i = 1; i + 1 < argc; i++)
        if (strcmp(argv[i], "--geometry") == 0 && mfu_apply_geometry(o, argv[i + 1])) return 2;
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
        const int used = mfu_parse_opt(o, a, v);
        if (used < 0) goto bad;
        if (used > 0) {
            i += used - 1;
            continue;
        }
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
        if (strcmp(a, "--speculative") == 0) {
            o->speculative = true;
            continue;
        }
        if (strcmp(a, "--nvme") == 0 && v) {
            o->nvme_dir = v;
            i++;
            continue;
        }
    bad:
        fprintf(stderr,
                "usage: moetune bench step [--layers N] [--hidden H] [--experts E] [--topk K]\n"
                "       [--expert-width I] [--vocab V] [--seq T] [--batch B] [--steps S]\n"
                "       [--link-gbps G | --link-fraction F] [--link-latency-us U] [--staging-rounds R]\n"
                "       [--staging-only | --precision | --speculative | --step-order [--accum K] | --nvme DIR]\n"
                "       [--blocks] [--trace FILE]\n"
                "       [--json]\n"
                "       MFU report: [--mfu] [--backend cpu|cuda] [--geometry qwen3-30b-a3b|mixtral-8x7b]\n"
                "       [--head-dim D] [--hw NAME] [--precision-dtype fp32|bf16] [--budget-gib G] [--accum K]\n"
                "       [--keep-all-only]\n"
                "bad or unknown option: %s\n",
                a);
        return 2;
    }
    if (o->topk > o->experts || (o->head_dim == 0 && o->hidden % o->heads) || o->heads % o->kv_heads) {
        fprintf(stderr, "bench step: need topk <= experts, hidden divisible by heads (or --head-dim) and heads by"
                        " kv heads\n");
        return 2;
    }
    if (o->cuda) o->mfu = true; /* on a GPU the plans are measured for their MFU */
    if (o->bf16 < 0) o->bf16 = o->cuda;
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
    const step_mode_t overlaps[] = {STEP_AFTER_BACKWARD, STEP_AFTER_BACKWARD, STEP_OVERLAP, STEP_OVERLAP};
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

/* The synthetic Mixtral's checkpoint, in a fresh directory whose path goes
 * to ckpt: a pid alone is not unique across the PID namespaces of tests
 * running side by side over one /tmp.  0, or 1 with a message. */
static int make_checkpoint(const opts_t *o, char *ckpt, size_t cap) {
    const char *tmp = getenv("TMPDIR");
    snprintf(ckpt, cap, "%s/moetune-bench-step-XXXXXX", tmp && tmp[0] ? tmp : "/tmp");
    if (!mkdtemp(ckpt)) {
        fprintf(stderr, "bench step: cannot create a directory under %s: %s\n", tmp && tmp[0] ? tmp : "/tmp",
                strerror(errno));
        return 1;
    }
    char config[2048];
    /* bf16 on disk for a bf16 run: half the bytes to write and read */
    const char *dtype = o->bf16 == 1 ? "bfloat16" : "float32";
    const int hd = o->head_dim ? o->head_dim : o->hidden / o->heads;
    if (strcmp(o->model_type, "qwen3_moe") == 0)
        snprintf(config, sizeof config,
                 "{\"architectures\": [\"Qwen3MoeForCausalLM\"], \"model_type\": \"qwen3_moe\", \"vocab_size\": %d,"
                 " \"hidden_size\": %d, \"intermediate_size\": %d, \"moe_intermediate_size\": %d,"
                 " \"num_hidden_layers\": %d, \"num_attention_heads\": %d, \"num_key_value_heads\": %d,"
                 " \"head_dim\": %d, \"num_experts\": %d, \"num_experts_per_tok\": %d, \"norm_topk_prob\": true,"
                 " \"decoder_sparse_step\": 1, \"mlp_only_layers\": [], \"attention_bias\": false,"
                 " \"hidden_act\": \"silu\", \"rms_norm_eps\": 1e-6, \"rope_theta\": 1000000.0,"
                 " \"rope_scaling\": null, \"max_position_embeddings\": %d, \"sliding_window\": null,"
                 " \"use_sliding_window\": false, \"router_aux_loss_coef\": 0.001, \"output_router_logits\": true,"
                 " \"tie_word_embeddings\": false, \"initializer_range\": 0.02, \"torch_dtype\": \"%s\"}",
                 o->vocab, o->hidden, o->expert_width * 8, o->expert_width, o->layers, o->heads, o->kv_heads, hd,
                 o->experts, o->topk, o->seq > 4096 ? o->seq : 4096, dtype);
    else
        snprintf(config, sizeof config,
                 "{\"model_type\": \"mixtral\", \"vocab_size\": %d, \"hidden_size\": %d, \"intermediate_size\": %d,"
                 " \"num_hidden_layers\": %d, \"num_attention_heads\": %d, \"num_key_value_heads\": %d,"
                 " \"head_dim\": %d, \"num_local_experts\": %d, \"num_experts_per_tok\": %d, \"rms_norm_eps\": 1e-5,"
                 " \"rope_theta\": 10000.0, \"tie_word_embeddings\": false, \"output_router_logits\": true,"
                 " \"torch_dtype\": \"%s\"}",
                 o->vocab, o->hidden, o->expert_width, o->layers, o->heads, o->kv_heads, hd, o->experts, o->topk,
                 dtype);
    mt_error_t err = {0};
    if (eng_checkpoint_init_random(ckpt, config, 1, &err) != MT_OK) {
        fprintf(stderr, "bench step: %s\n", err.msg);
        return 1;
    }
    return 0;
}

static void remove_checkpoint(const char *ckpt) {
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", ckpt);
    if (system(cmd) != 0) fprintf(stderr, "bench step: could not remove %s\n", ckpt);
}

/* keep_all alone and unthrottled: its block times size the link. */
static void measure_keep_alone(const char *ckpt, const opts_t *o, measure_t *keep) {
    sched_plan_t p_keep;
    sched_plan_init_uniform(&p_keep, o->layers + 2, SCHED_POLICY_KEEP_ALL);
    const sched_plan_t *one[] = {&p_keep};
    const step_mode_t no_overlap[] = {STEP_AFTER_BACKWARD};
    double unused_ratio, unused_probe;
    measure_side_by_side(ckpt, o, one, no_overlap, 1, 0, -1, keep, &unused_ratio, &unused_probe);
    sched_plan_free(&p_keep);
}

/* The planner's view of this run on the profiled keep_all step, and the
 * link: as given, or the slowest under which every layer's transfers fit
 * in --link-fraction of its compute.  False, with a message, when keep_all
 * failed or no link fits. */
static bool size_link(const char *ckpt, const opts_t *o, const measure_t *keep, predictor_t *pr, double *link_bps) {
    *link_bps = o->link_gbps * 1e9;
    if (keep->ok) {
        predictor_init(pr, ckpt, o, *link_bps > 0 ? *link_bps : 1e9, keep, keep->optim_s, false);
        if (*link_bps == 0 && pr->ok)
            *link_bps = layer_bound_link(&pr->w, keep, o->link_fraction, o->link_latency_us * 1e-6);
        pr->w.h2d_bw = pr->w.d2h_bw = *link_bps;
    }
    if (keep->ok && *link_bps > 0 && isfinite(*link_bps)) return true;
    if (keep->ok)
        fprintf(stderr,
                "bench step: no link speed fits every layer's transfers in %.0f%% of its compute: the copies' "
                "latency (%g us each) alone takes longer; give --link-gbps, a lower --link-latency-us or a "
                "bigger model\n",
                100 * o->link_fraction, o->link_latency_us);
    else
        fprintf(stderr, "bench step: keep_all failed, nothing to size the link on\n");
    return false;
}

/* --staging-only, --step-order, --precision, --speculative or --nvme: that comparison alone, on
 * the link chosen; removes the checkpoint. */
static int one_comparison(const char *ckpt, const opts_t *o, double link_bps, const measure_t *keep) {
    if (o->staging_only) {
        staging_cmp_t sc;
        measure_staging(ckpt, o, link_bps, &sc);
        remove_checkpoint(ckpt);
        if (!sc.ok) return 1;
        printf("staging, offload_all on a %.3f GB/s + %.0f us link (%d paired steps, modes alternating A B B A):\n",
               link_bps / 1e9, o->link_latency_us, sc.pairs);
        for (int k = 0; k < 2; k++)
            printf("  %-10s  %8.2f ms per step, %llu H2D + %llu D2H copies per step, pinned peak %.2f MB\n",
                   k ? "per_tensor" : "compact", sc.step_s[k] * 1e3, (unsigned long long)sc.copies[k][0],
                   (unsigned long long)sc.copies[k][1], sc.pinned[k] / 1e6);
        printf("  compact throughput / per_tensor: %.3f (median of the pairs' ratios; goal >= 0.95)\n", sc.ratio);
        return 0;
    }
    /* layer-major against micro-batch-major, speculative against waiting, or fp32 against bf16 */
    const int rc = o->step_order    ? step_order_report(ckpt, o, link_bps, keep)
                   : o->speculative ? speculative_report(ckpt, o, link_bps)
                   : o->nvme_dir    ? nvme_report(ckpt, o, link_bps, keep)
                                    : precision_report(ckpt, o, link_bps);
    remove_checkpoint(ckpt);
    return rc;
}

/* auto: the planner's choice under a device budget of r->auto_budget,
 * planned on the profiled workload (printed block by block with --blocks).
 * False when there is no such plan. */
static bool make_auto_plan(const predictor_t *pr, const opts_t *o, const step_report_t *r, sched_plan_t *auto_plan) {
    if (!pr->ok) return false;
    sched_planner_opts_t po;
    sched_planner_opts_default(&po);
    po.policy = SCHED_POLICY_AUTO;
    po.budget[SCHED_MEM_DEVICE] = (double)r->auto_budget;
    sched_planner_result_t res;
    mt_error_t perr = {0};
    bool have = false;
    if (sched_plan_make(&pr->w, &po, &res, &perr) == MT_OK && res.feasible) {
        if (o->blocks && !o->json) { /* what the planner chose, block by block */
            printf("auto plan (window %d): block weights/grads/optimizer/activations:", res.plan.prefetch_window);
            for (int b = 0; b < res.plan.num_blocks; b++) {
                const sched_block_plan_t *bp = &res.plan.blocks[b];
                printf(" %d:%c%c%c%c", b, bp->weights == SCHED_WEIGHTS_STREAM ? 'S' : 'R',
                       bp->grads == SCHED_GRADS_HOST ? 'H' : 'D', bp->optim == SCHED_OPTIM_HOST ? 'H' : 'D',
                       "KOR"[bp->acts]);
            }
            printf("  (S stream, R resident; H host, D device; K keep, O offload, R recompute)\n");
        }
        *auto_plan = res.plan; /* taken over */
        res.plan.blocks = NULL;
        have = true;
    } else {
        fprintf(stderr, "bench step: auto plan under %zu bytes: %s\n", r->auto_budget,
                res.feasible ? perr.msg : res.why);
    }
    sched_planner_result_free(&res);
    return have;
}

/* Every plan side by side (see measure_side_by_side): keep_all,
 * offload_all with the optimizer after the backward and overlapped,
 * min_memory, and auto when there is one. */
static void measure_plans(const char *ckpt, const opts_t *o, const sched_plan_t *auto_plan, bool have_auto,
                          step_report_t *r) {
    sched_plan_t p_keep, p_off, p_min;
    sched_plan_init_uniform(&p_keep, r->nb, SCHED_POLICY_KEEP_ALL);
    sched_plan_init_uniform(&p_off, r->nb, SCHED_POLICY_OFFLOAD_ALL);
    sched_plan_init_uniform(&p_min, r->nb, SCHED_POLICY_MIN_MEMORY);
    const sched_plan_t *plans[] = {&p_keep, &p_off, &p_off, &p_min, auto_plan};
    const step_mode_t overlaps[] = {STEP_AFTER_BACKWARD, STEP_AFTER_BACKWARD, STEP_OVERLAP, STEP_OVERLAP, STEP_OVERLAP};
    measure_t ms[5];
    measure_side_by_side(ckpt, o, plans, overlaps, have_auto ? 5 : 4, r->link_bps, 2, ms, r->pair_ratio,
                         &r->run_probe);
    r->keep = ms[0], r->off = ms[1], r->off_overlap = ms[2], r->minm = ms[3];
    r->autom = have_auto ? ms[4] : (measure_t){0};
    sched_plan_free(&p_keep);
    sched_plan_free(&p_off);
    sched_plan_free(&p_min);
}

/* The planner's views of this run for the predictions: pr on this run's
 * keep_all profile (with the interference probe taken beside the run
 * rather than the calibration's own), and traffic on block compute as
 * profiled in the offload_all run, i.e. under copy and host-optimizer
 * traffic, so that the simulator's own job, the overlap and the waits, is
 * judged apart from what the traffic does to compute on this backend. */
static void predictors_on_run(const char *ckpt, const opts_t *o, const step_report_t *r, predictor_t *pr,
                              predictor_t *traffic) {
    predictor_free(pr);
    if (r->keep.ok) {
        predictor_init(pr, ckpt, o, r->link_bps, &r->keep, r->keep.optim_s, false);
        pr->w.h2d_bw = pr->w.d2h_bw = r->link_bps;
        if (pr->ok && r->run_probe > 0)
            pr->cal.compute_interference = pr->w.compute_interference = r->run_probe > 1 ? r->run_probe - 1 : 0;
    }
    if (r->off_overlap.ok) {
        predictor_init(traffic, ckpt, o, r->link_bps, &r->off_overlap, r->keep.optim_s, false);
        traffic->w.h2d_bw = traffic->w.d2h_bw = r->link_bps;
        traffic->w.compute_interference = 0; /* already in these compute times */
    }
}

static void predict_uniform_plans(const predictor_t *pr, const predictor_t *traffic, step_report_t *r) {
    r->pred_keep = predict_uniform(pr, r->nb, SCHED_POLICY_KEEP_ALL);
    r->pred_off = predict_uniform(pr, r->nb, SCHED_POLICY_OFFLOAD_ALL);
    r->pred_min = predict_uniform(pr, r->nb, SCHED_POLICY_MIN_MEMORY);
    r->pred_off_traffic = predict_uniform(traffic, r->nb, SCHED_POLICY_OFFLOAD_ALL);
    r->pred_min_traffic = predict_uniform(traffic, r->nb, SCHED_POLICY_MIN_MEMORY);
}

static void report_free(step_report_t *r) {
    measure_free(&r->keep), measure_free(&r->off), measure_free(&r->off_overlap), measure_free(&r->minm),
        measure_free(&r->autom);
}

/* The full comparison: every plan side by side, the predictions, the
 * staging pool; removes the checkpoint.  Takes keep (the keep_all run
 * alone) and pr over. */
static int full_comparison(const char *ckpt, const opts_t *o, double link_bps, measure_t *keep, predictor_t *pr) {
    step_report_t r = {.nb = o->layers + 2, .link_bps = link_bps, .auto_budget = keep->peak_device / 2};
    sched_plan_t auto_plan = {0};
    const bool have_auto = make_auto_plan(pr, o, &r, &auto_plan);
    measure_free(keep);
    measure_plans(ckpt, o, &auto_plan, have_auto, &r);
    predictor_t traffic = {0};
    predictors_on_run(ckpt, o, &r, pr, &traffic);
    r.pred_auto = have_auto ? predict(pr, &auto_plan) : 0;
    r.pred_auto_traffic = have_auto ? predict(&traffic, &auto_plan) : 0;
    if (have_auto) sched_plan_free(&auto_plan);
    measure_staging(ckpt, o, link_bps, &r.sc);
    predict_uniform_plans(pr, &traffic, &r);
    remove_checkpoint(ckpt);
    const bool ok = r.keep.ok && r.off.ok && r.off_overlap.ok && r.minm.ok && r.sc.ok;
    r.probe = pr->ok && pr->cal.compute_interference > 0 ? 1 + pr->cal.compute_interference : 0;
    predictor_free(pr);
    predictor_free(&traffic);
    if (ok && o->json) step_report_json(o, &r);
    else if (ok) step_report_text(o, &r);
    report_free(&r);
    return ok ? 0 : 1;
}

int mt_bench_step_main(int argc, char **argv) {
    opts_t o;
    int rc = parse(argc, argv, &o);
    if (rc) return rc;
    char why[256];
    if (o.cuda && !kern_cuda_available(why, sizeof why)) {
        fprintf(stderr, "bench step: --backend cuda needs a usable GPU: %s\n", why);
        return 1;
    }
    if (!o.json) mt_build_info_print(stdout);
    char ckpt[256];
    if (make_checkpoint(&o, ckpt, sizeof ckpt)) return 1;
    if (o.mfu) {
        rc = mfu_report(ckpt, &o);
        remove_checkpoint(ckpt);
        return rc;
    }
    measure_t keep;
    measure_keep_alone(ckpt, &o, &keep);
    predictor_t pr = {0};
    double link_bps;
    if (!size_link(ckpt, &o, &keep, &pr, &link_bps)) {
        measure_free(&keep);
        return 1;
    }
    if (o.staging_only || o.step_order || o.precision || o.speculative || o.nvme_dir) {
        rc = one_comparison(ckpt, &o, link_bps, &keep);
        measure_free(&keep);
        predictor_free(&pr);
        return rc;
    }
    return full_comparison(ckpt, &o, link_bps, &keep, &pr);
}
