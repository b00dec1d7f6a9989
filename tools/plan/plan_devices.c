/* `moetune plan --devices N` (see plan_devices.h). */
#include "tools/plan/plan_devices.h"

#include <string.h>

#include "engine/program.h"

mt_status_t plan_devices_make(const plan_ctx_t *c, int n, plan_devices_t *out, mt_error_t *err) {
    memset(out, 0, sizeof *out);
    out->single_step_s = c->res.sim.step_time;
    const int K = c->rc.gradient_accumulation_steps;
    if (n < 1 || K % n != 0)
        return mt_error_set(err, MT_ERR_CONFIG,
                            "%s: gradient_accumulation_steps (%d) must be a multiple of devices (%d): each device "
                            "runs an equal share of a step's micro-batches",
                            c->rc.source_path, K, n);
    /* one device's share: the same run with K / n micro-batches per step */
    eng_run_config_t rc = c->rc;
    rc.gradient_accumulation_steps = K / n;
    const bool bf16 = c->rc.bf16 == ENG_BF16_ON || (c->rc.bf16 == ENG_BF16_AUTO && !c->hw.measured);
    sched_workload_t w;
    sched_planner_opts_t opts;
    sched_planner_result_t res;
    memset(&res, 0, sizeof res);
    mt_status_t st = eng_program_workload(&c->mc, &rc, &c->hw, bf16, &w, err);
    if (st == MT_OK) st = eng_program_planner_opts(&rc, &c->hw, &opts, err);
    if (st == MT_OK) st = sched_plan_make(&w, &opts, &res, err);
    if (st == MT_OK) {
        out->feasible = res.feasible;
        st = sched_dp_predict(&w, &res.plan, n, sched_hw_host_bw(&c->hw), &out->dp, err);
        out->plan = res.plan;
        res.plan.blocks = NULL; /* moved */
    }
    sched_planner_result_free(&res);
    sched_workload_free(&w);
    return st;
}

void plan_devices_free(plan_devices_t *d) { sched_plan_free(&d->plan); }

static const char *gb(double bytes, char *buf, size_t cap) {
    snprintf(buf, cap, "%.2f GB", bytes / 1e9);
    return buf;
}

void plan_devices_text(FILE *f, const plan_ctx_t *c, const plan_devices_t *d) {
    const sched_dp_result_t *p = &d->dp;
    char a[32], b[32], e[32], g[32];
    (void)c;
    fprintf(f, "\ndata parallel on %d devices (one host copy of the model and optimizer state; each device its own link):\n",
            p->devices);
    if (!d->feasible) fprintf(f, "  note: one device's share does not fit the budgets; numbers are for the plan the planner came closest with\n");
    fprintf(f, "  per device: %d micro-batches, forward+backward %.3f s\n", p->micro_per_device, p->fwd_bwd_s);
    fprintf(f, "    device 0:        H2D %s, D2H %s (runs the optimizer)\n", gb(p->h2d_bytes[0], a, sizeof a),
            gb(p->d2h_bytes[0], b, sizeof b));
    fprintf(f, "    each other:      H2D %s, D2H %s\n", gb(p->h2d_bytes[1], e, sizeof e), gb(p->d2h_bytes[1], g, sizeof g));
    fprintf(f, "  gradient reduction %.3f s (%s between devices, %s added on the host)\n", p->reduce_s,
            gb(p->reduce_device_bytes, a, sizeof a), gb(p->reduce_host_bytes, b, sizeof b));
    fprintf(f, "  optimizer (device 0) %.3f s, refresh of the other devices' resident weights %.3f s\n", p->optim_s,
            p->refresh_s);
    fprintf(f, "  total: step %.3f s, %.0f tokens/s; H2D %s over %d links", p->step_s, p->tokens_per_s,
            gb(p->h2d_bytes[0] + (p->devices - 1) * p->h2d_bytes[1], a, sizeof a), p->devices);
    if (d->single_step_s > 0)
        fprintf(f, "; one device %.3f s per step: %.2fx\n", d->single_step_s,
                p->step_s > 0 ? d->single_step_s / p->step_s : 0.0);
    else
        fprintf(f, "\n");
}

json_t *plan_devices_json(const plan_devices_t *d) {
    const sched_dp_result_t *p = &d->dp;
    json_t *o = json_object();
    json_object_set_new(o, "devices", json_integer(p->devices));
    json_object_set_new(o, "feasible", json_boolean(d->feasible));
    json_object_set_new(o, "micro_batches_per_device", json_integer(p->micro_per_device));
    json_object_set_new(o, "fwd_bwd_s", json_real(p->fwd_bwd_s));
    json_object_set_new(o, "reduce_s", json_real(p->reduce_s));
    json_object_set_new(o, "optim_s", json_real(p->optim_s));
    json_object_set_new(o, "refresh_s", json_real(p->refresh_s));
    json_object_set_new(o, "step_time_s", json_real(p->step_s));
    json_object_set_new(o, "tokens_per_s", json_real(p->tokens_per_s));
    json_object_set_new(o, "single_device_step_time_s", json_real(d->single_step_s));
    json_object_set_new(o, "reduce_device_bytes", json_real(p->reduce_device_bytes));
    json_object_set_new(o, "reduce_host_bytes", json_real(p->reduce_host_bytes));
    json_t *per = json_array();
    for (int dv = 0; dv < p->devices; dv++) {
        json_t *x = json_object();
        const int k = dv == 0 ? 0 : 1;
        json_object_set_new(x, "device", json_integer(dv));
        json_object_set_new(x, "h2d_bytes", json_real(p->h2d_bytes[k]));
        json_object_set_new(x, "d2h_bytes", json_real(p->d2h_bytes[k]));
        json_array_append_new(per, x);
    }
    json_object_set_new(o, "per_device", per);
    json_object_set_new(o, "h2d_bytes_total", json_real(p->h2d_bytes[0] + (p->devices - 1) * p->h2d_bytes[1]));
    return o;
}
