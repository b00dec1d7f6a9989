/* `moetune plan --devices N` (see plan_devices.h). */
#include "tools/plan/plan_devices.h"

#include <string.h>

#include "engine/model/desc/program.h"

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
    mt_status_t st = eng_program_workload(&c->mc, &rc, &c->hw, bf16, &c->quant, &w, err);
    if (st == MT_OK) st = eng_program_planner_opts(&rc, &c->hw, &opts, err);
    if (st == MT_OK) st = eng_program_parallel_opts(&c->mc, &rc, &opts, err);
    out->ep_refused = eng_program_expert_parallel_refusal(&c->mc, &rc);
    if (st == MT_OK && n == SCHED_EP_DEVICES) {
        out->layouts = true;
        out->parallel = opts.parallel;
        out->peer_via_host = w.peer_via_host;
        st = sched_parallel_plan(&w, &opts, sched_hw_host_bw(&c->hw), &out->par, err);
        if (st == MT_OK) {
            const int k = out->par.chosen;
            out->feasible = out->par.feasible[k];
            out->dp = out->par.dp[k];
            out->plan = out->par.plan[k];
            out->par.plan[k].blocks = NULL; /* moved */
        }
        sched_workload_free(&w);
        return st;
    }
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

void plan_devices_free(plan_devices_t *d) {
    sched_plan_free(&d->plan);
    sched_parallel_result_free(&d->par);
}

static const char *const k_layout_names[SCHED_LAYOUT_COUNT] = {"data", "mix", "expert"};

/* "layers 0-31 expert, 32 data": runs of MoE layers with one choice */
static void layer_runs(const plan_ctx_t *c, const sched_plan_t *p, FILE *f) {
    const int N = p->num_blocks;
    int first = -1;
    bool cur = false, any = false;
    for (int b = 0; b <= N; b++) {
        const bool moe = b < N && c->w.moe && c->w.moe[b];
        if (first >= 0 && (!moe || p->blocks[b].expert_parallel != cur)) {
            fprintf(f, "%s%s %d", any ? ", " : "", first == b - 1 ? "layer" : "layers", first - 1);
            if (first < b - 1) fprintf(f, "-%d", b - 2);
            fprintf(f, " %s", cur ? "expert" : "data");
            any = true;
            first = -1;
        }
        if (moe && first < 0) first = b, cur = p->blocks[b].expert_parallel;
    }
    fprintf(f, "%s\n", any ? "" : "(no MoE layers)");
}

static const char *gb(double bytes, char *buf, size_t cap) {
    snprintf(buf, cap, "%.2f GB", bytes / 1e9);
    return buf;
}

static void layouts_text(FILE *f, const plan_ctx_t *c, const plan_devices_t *d) {
    const sched_parallel_result_t *r = &d->par;
    static const char *const what[SCHED_LAYOUT_COUNT] = {"all data parallel", "planner's per-layer mix",
                                                         "all expert parallel"};
    char a[32], b[32];
    fprintf(f, "\nMoE layers on 2 devices, data or expert parallel (parallel: %s; exchange %s, %.1f GB/s):\n",
            sched_parallel_name(d->parallel), d->peer_via_host ? "through host memory over each device's link"
                                                               : "over the direct peer link",
            c->w.peer_bw / 1e9);
    if (d->ep_refused)
        fprintf(f, "  training runs these layers data parallel: %s; expert parallel shown for comparison only\n",
                d->ep_refused);
    for (int k = 0; k < SCHED_LAYOUT_COUNT; k++) {
        if (!r->planned[k]) {
            fprintf(f, "  %-24s  (no MoE layers)\n", what[k]);
            continue;
        }
        const sched_dp_result_t *p = &r->dp[k];
        fprintf(f, "  %-24s  step %.3f s, %.0f tokens/s, %d MoE layers expert parallel, %s order, link H2D %s per device%s%s\n",
                what[k], p->step_s, p->tokens_per_s, p->expert_parallel_blocks,
                r->plan[k].layer_major ? "layer" : "micro-batch", gb(p->h2d_bytes[0], a, sizeof a),
                r->feasible[k] ? "" : " (does not fit)", k == r->chosen ? "  <- used" : "");
    }
    fprintf(f, "  choice per MoE layer: ");
    layer_runs(c, &d->plan, f);
    const sched_dp_result_t *p = &d->dp;
    for (int dv = 0; dv < 2; dv++)
        fprintf(f, "  device %d: link H2D %s, D2H %s per step; peak device memory %.2f GiB\n", dv,
                gb(p->h2d_bytes[dv], a, sizeof a), gb(p->d2h_bytes[dv], b, sizeof b), p->peak_device[dv] / 1073741824.0);
    fprintf(f, "  peer exchange: %s per step each way%s\n", gb(p->peer_bytes, a, sizeof a),
            d->peer_via_host && p->peer_bytes > 0 ? " (in the link bytes above)" : "");
}

void plan_devices_text(FILE *f, const plan_ctx_t *c, const plan_devices_t *d) {
    const sched_dp_result_t *p = &d->dp;
    char a[32], b[32], e[32], g[32];
    if (d->layouts) layouts_text(f, c, d);
    if (p->expert_parallel_blocks > 0)
        fprintf(f, "\nthe step on %d devices, %d MoE layers expert parallel and the rest data parallel (one host copy of "
                   "the model and optimizer state; each device its own link):\n",
                p->devices, p->expert_parallel_blocks);
    else
        fprintf(f, "\ndata parallel on %d devices (one host copy of the model and optimizer state; each device its own "
                   "link):\n",
                p->devices);
    if (!d->feasible) fprintf(f, "  note: one device's share does not fit the budgets; numbers are for the plan the planner came closest with\n");
    fprintf(f, "  per device: %d micro-batches, forward+backward %.3f s\n", p->micro_per_device, p->fwd_bwd_s);
    fprintf(f, "    device 0:        H2D %s, D2H %s (runs the optimizer)\n", gb(p->h2d_bytes[0], a, sizeof a),
            gb(p->d2h_bytes[0], b, sizeof b));
    fprintf(f, "    each other:      H2D %s, D2H %s\n", gb(p->h2d_bytes[1], e, sizeof e), gb(p->d2h_bytes[1], g, sizeof g));
    fprintf(f, "  gradient reduction %.3f s (%s between devices, %s added on the host%s)\n", p->reduce_s,
            gb(p->reduce_device_bytes, a, sizeof a), gb(p->reduce_host_bytes, b, sizeof b),
            p->expert_parallel_blocks > 0 ? "; split experts have one owner and are not summed" : "");
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

/* One device's entry of a "per_device" array. */
static json_t *device_bytes_json(int device, double h2d, double d2h, double peak) {
    json_t *x = json_object();
    json_object_set_new(x, "device", json_integer(device));
    json_object_set_new(x, "h2d_bytes", json_real(h2d));
    json_object_set_new(x, "d2h_bytes", json_real(d2h));
    json_object_set_new(x, "peak_device_bytes", json_real(peak));
    return x;
}

json_t *plan_devices_json(const plan_ctx_t *c, const plan_devices_t *d) {
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
        const int k = dv == 0 ? 0 : 1; /* device 0, then every other device alike */
        json_array_append_new(per, device_bytes_json(dv, p->h2d_bytes[k], p->d2h_bytes[k], p->peak_device[k]));
    }
    json_object_set_new(o, "per_device", per);
    json_object_set_new(o, "h2d_bytes_total", json_real(p->h2d_bytes[0] + (p->devices - 1) * p->h2d_bytes[1]));
    json_object_set_new(o, "peer_bytes", json_real(p->peer_bytes));
    if (!d->layouts) return o;
    const sched_parallel_result_t *r = &d->par;
    json_object_set_new(o, "parallel", json_string(sched_parallel_name(d->parallel)));
    json_object_set_new(o, "expert_parallel_refused", d->ep_refused ? json_string(d->ep_refused) : json_null());
    json_object_set_new(o, "layout", json_string(k_layout_names[r->chosen]));
    json_object_set_new(o, "peer_via_host", json_boolean(d->peer_via_host));
    json_t *lay = json_object();
    for (int k = 0; k < SCHED_LAYOUT_COUNT; k++) {
        if (!r->planned[k]) {
            json_object_set_new(lay, k_layout_names[k], json_null());
            continue;
        }
        const sched_dp_result_t *q = &r->dp[k];
        json_t *x = json_object();
        json_object_set_new(x, "feasible", json_boolean(r->feasible[k]));
        json_object_set_new(x, "step_time_s", json_real(q->step_s));
        json_object_set_new(x, "tokens_per_s", json_real(q->tokens_per_s));
        json_object_set_new(x, "expert_parallel_layers", json_integer(q->expert_parallel_blocks));
        json_object_set_new(x, "peer_bytes", json_real(q->peer_bytes));
        json_object_set_new(x, "reduce_device_bytes", json_real(q->reduce_device_bytes));
        json_t *pd = json_array();
        for (int dv = 0; dv < 2; dv++)
            json_array_append_new(pd, device_bytes_json(dv, q->h2d_bytes[dv], q->d2h_bytes[dv], q->peak_device[dv]));
        json_object_set_new(x, "per_device", pd);
        json_object_set_new(lay, k_layout_names[k], x);
    }
    json_object_set_new(o, "layouts", lay);
    json_t *moe = json_array();
    for (int b = 0; b < d->plan.num_blocks; b++) {
        if (!c->w.moe || !c->w.moe[b]) continue;
        json_t *x = json_object();
        json_object_set_new(x, "block", json_integer(b));
        json_object_set_new(x, "layer", json_integer(b - 1));
        json_object_set_new(x, "expert_parallel", json_boolean(d->plan.blocks[b].expert_parallel));
        json_array_append_new(moe, x);
    }
    json_object_set_new(o, "moe_layers", moe);
    return o;
}
