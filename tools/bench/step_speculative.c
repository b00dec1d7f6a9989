/* `moetune bench step --speculative` (see step_bench.h): the speculative
 * host optimizer against waiting for the gradient norm, with clipping on.
 *
 * Three runs of offload_all (gradients and AdamW on the host, so the host
 * optimizer is on the step's path) side by side, one step of each in turn:
 * host AdamW after the backward, waiting for the norm (clipping that never
 * fires); speculative, every update standing (the same clipping); and
 * speculative with clipping that always fires, every update undone and
 * redone after the backward: the price of a wrong guess. */
#include <stdio.h>

#include "tools/bench/step_bench_internal.h"

int speculative_report(const char *ckpt, const opts_t *o, double link_bps) {
    sched_plan_t p_off;
    sched_plan_init_uniform(&p_off, o->layers + 2, SCHED_POLICY_OFFLOAD_ALL);
    const sched_plan_t *plans[] = {&p_off, &p_off, &p_off};
    const step_mode_t modes[] = {STEP_CLIP_WAIT, STEP_CLIP_SPEC_KEPT, STEP_CLIP_SPEC_REDO};
    const char *const names[] = {"waits for the norm", "speculative, kept", "speculative, redone"};
    measure_t ms[3];
    double ratio[3], probe;
    measure_side_by_side(ckpt, o, plans, modes, 3, link_bps, -1, ms, ratio, &probe);
    sched_plan_free(&p_off);
    const bool ok = ms[0].ok && ms[1].ok && ms[2].ok;
    if (ok && o->json) {
        printf("{\"link_gbps\": %.6g, \"runs\": [", link_bps / 1e9);
        for (int i = 0; i < 3; i++)
            printf("%s{\"host_optimizer\": \"%s\", \"step_s\": %.6g, \"optimizer_s\": %.6g, \"ratio_to_wait\": %.6g,"
                   " \"updated_during_backward\": %d, \"steps_redone\": %d}",
                   i ? ", " : "", names[i], ms[i].median_s, ms[i].optim_s, ratio[i], ms[i].overlapped, ms[i].redone);
        printf("]}\n");
    } else if (ok) {
        printf("host AdamW with clipping on, offload_all (%d steps each, side by side; link %.3f GB/s):\n", o->steps,
               link_bps / 1e9);
        printf("  %-22s %10s %14s %9s %12s\n", "host optimizer", "step ms", "optimizer ms", "vs wait", "redone");
        for (int i = 0; i < 3; i++)
            printf("  %-22s %10.2f %14.2f %9.3f %8d/%d\n", names[i], ms[i].median_s * 1e3, ms[i].optim_s * 1e3,
                   ratio[i], ms[i].redone, o->steps);
        printf("  (\"optimizer ms\": the optimizer step's time after the backward, medians; \"vs wait\": the\n"
               "   median over rounds of each step over the waiting run's in the same round)\n");
    }
    for (int i = 0; i < 3; i++) measure_free(&ms[i]);
    return ok ? 0 : 1;
}
