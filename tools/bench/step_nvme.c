/* `moetune bench step --nvme DIR` (see step_bench.h): the NVMe tier on a
 * real directory against host memory.
 *
 * Runs of offload_all side by side (host AdamW overlapping the backward,
 * no clipping), one step of each in turn: every block's AdamW state in
 * host memory, and every block's on an NVMe tier in DIR (the moments; the
 * fp32 masters too in bf16); in bf16 a third with the streamed blocks'
 * bf16 working copies on the tier as well, which every fetch reads into
 * the staging pool's pinned buffers (moe/staging.h, MOE_STAGING_READ) and
 * every update writes back.  In the same run it measures
 * DIR's raw sequential O_DIRECT rates (store/sio_rate.h, what `--hw
 * calibrate` gives the planner) three times, before the runs, between the
 * runs and the prediction's profile, and after (a shared virtual disk's
 * rate moved 0.84-1.26 GB/s between single measurements, which moved the
 * prediction as much), and reports:
 *   - each run's median step against the simulator's prediction, with the
 *     array at the median raw rates, and the predictions at the slowest
 *     and fastest of the three;
 *   - the tier's traffic per step and the seconds the optimizer waited on
 *     it, each rate set against raw: reads are read ahead (a block's state
 *     while the block before it updates) and writes go out in the
 *     background (while the blocks after it update), so each wait is what
 *     was not hidden. */
#include <stdio.h>

#include "store/sio_rate.h"
#include "tools/bench/step_bench_internal.h"

enum { RAW_QD = 8 };
#define RAW_BYTES ((uint64_t)256 << 20)

static double rate(uint64_t bytes, double s) { return s > 0 ? (double)bytes / s : 0; }

/* DIR's raw rates, measured RAW_TIMES times over the bench: each
 * direction's median, slowest and fastest. */
enum { RAW_TIMES = 3 };
typedef struct {
    mt_sio_rates_t m[RAW_TIMES];
    int n;
    double read_med, read_min, read_max, write_med, write_min, write_max;
} raw_rates_t;

static bool raw_measure(const opts_t *o, raw_rates_t *r) {
    mt_error_t err = {0};
    if (mt_sio_measure_dir(o->nvme_dir, RAW_BYTES, RAW_QD, MT_SIO_AUTO, &r->m[r->n], &err) != MT_OK) {
        fprintf(stderr, "bench step: --nvme: %s\n", err.msg);
        return false;
    }
    r->n++;
    return true;
}

static double median3(double a, double b, double c) {
    return a > b ? (b > c ? b : a > c ? c : a) : (a > c ? a : b > c ? c : b);
}

static void raw_summarise(raw_rates_t *r) {
    const mt_sio_rates_t *m = r->m;
    r->read_med = median3(m[0].read_q, m[1].read_q, m[2].read_q);
    r->write_med = median3(m[0].write_q, m[1].write_q, m[2].write_q);
    r->read_min = r->read_max = m[0].read_q, r->write_min = r->write_max = m[0].write_q;
    for (int i = 1; i < RAW_TIMES; i++) {
        r->read_min = m[i].read_q < r->read_min ? m[i].read_q : r->read_min;
        r->read_max = m[i].read_q > r->read_max ? m[i].read_q : r->read_max;
        r->write_min = m[i].write_q < r->write_min ? m[i].write_q : r->write_min;
        r->write_max = m[i].write_q > r->write_max ? m[i].write_q : r->write_max;
    }
}

static void print_text(const opts_t *o, double link_bps, const raw_rates_t *raw, const measure_t *ms,
                       const double *pred, const double *pred_slow, const double *pred_fast, int runs) {
    static const char *const names[3] = {"host memory", "AdamW state on NVMe", "state and weights on NVMe"};
    printf("NVMe tier, offload_all in %s on a %.3f GB/s link (%d steps each, side by side), directory %s:\n",
           o->bf16 == 1 ? "bf16" : "fp32", link_bps / 1e9, o->steps, o->nvme_dir);
    printf("  raw O_DIRECT, 1 MiB requests at queue depth %d: read %.3f GB/s, write %.3f GB/s (the median of %d measurements; read "
           "%.3f-%.3f, write %.3f-%.3f)\n",
           RAW_QD, raw->read_med / 1e9, raw->write_med / 1e9, RAW_TIMES, raw->read_min / 1e9, raw->read_max / 1e9,
           raw->write_min / 1e9, raw->write_max / 1e9);
    printf("  %-26s %10s %12s %9s %22s\n", "AdamW state", "step ms", "predicted ms", "pred/meas",
           "at slowest-fastest raw");
    for (int i = 0; i < runs; i++)
        printf("  %-26s %10.2f %12.2f %9.3f %10.3f-%-11.3f\n", names[i], ms[i].median_s * 1e3, pred[i] * 1e3,
               ms[i].median_s > 0 ? pred[i] / ms[i].median_s : 0,
               ms[i].median_s > 0 ? pred_slow[i] / ms[i].median_s : 0,
               ms[i].median_s > 0 ? pred_fast[i] / ms[i].median_s : 0);
    const eng_nvme_io_t *io = &ms[1].nvme;
    const double r = rate(io->read_bytes, io->read_s), w = rate(io->write_bytes, io->write_s);
    printf("  the tier per step: %.2f MB read, the optimizer waiting %.2f ms for them (%.3f GB/s, %.2f of raw);\n"
           "                     %.2f MB written, waiting %.2f ms (%.3f GB/s, %.2f of raw)\n",
           io->read_bytes / 1e6, io->read_s * 1e3, r / 1e9, raw->read_med > 0 ? r / raw->read_med : 0,
           io->write_bytes / 1e6, io->write_s * 1e3, w / 1e9, raw->write_med > 0 ? w / raw->write_med : 0);
    printf("  block loads: %llu over the %d steps, %llu of them finding their state read ahead\n",
           (unsigned long long)io->loads, o->steps, (unsigned long long)io->loads_read_ahead);
    if (runs > 2) {
        const eng_nvme_io_t *wio = &ms[2].nvme;
        printf("  with the weights too: %.2f MB read per step (their fetches read into staging on the pack\n"
               "                       threads), %.2f MB written\n",
               wio->read_bytes / 1e6, wio->write_bytes / 1e6);
    }
    printf("  (a block's state is read ahead while the block before it updates and written back while the\n"
           "   blocks after it update, so the optimizer waits only for what is not done yet: above 1 of raw\n"
           "   means hidden; the prediction: the simulator with the array at the median raw rates above, and\n"
           "   at the slowest and the fastest of the measurements)\n");
}

static void print_json(double link_bps, const raw_rates_t *raw, const measure_t *ms, const double *pred,
                       int runs) {
    const eng_nvme_io_t *io = &ms[1].nvme;
    if (runs > 2)
        printf("{\"weights_step_s\": %.6g, \"weights_predicted_s\": %.6g, \"weights_read_bytes\": %llu, ",
               ms[2].median_s, pred[2], (unsigned long long)ms[2].nvme.read_bytes);
    else
        printf("{");
    printf("\"raw_read_min_bytes_per_s\": %.6g, \"raw_read_max_bytes_per_s\": %.6g, \"raw_write_min_bytes_per_s\": %.6g, "
           "\"raw_write_max_bytes_per_s\": %.6g, ",
           raw->read_min, raw->read_max, raw->write_min, raw->write_max);
    printf("\"link_gbps\": %.6g, \"raw_read_bytes_per_s\": %.6g, \"raw_write_bytes_per_s\": %.6g, "
           "\"host_step_s\": %.6g, \"host_predicted_s\": %.6g, \"nvme_step_s\": %.6g, \"nvme_predicted_s\": %.6g, "
           "\"tier_read_bytes\": %llu, \"tier_read_s\": %.6g, \"tier_write_bytes\": %llu, \"tier_write_s\": %.6g, "
           "\"tier_loads\": %llu, \"tier_loads_read_ahead\": %llu}\n",
           link_bps / 1e9, raw->read_med, raw->write_med, ms[0].median_s, pred[0], ms[1].median_s, pred[1],
           (unsigned long long)io->read_bytes, io->read_s, (unsigned long long)io->write_bytes, io->write_s,
           (unsigned long long)io->loads, (unsigned long long)io->loads_read_ahead);
}

/* keep_all alone, unthrottled, its optimizer after the backward, computing
 * in `dt`: the block times and the AdamW pass a prediction scales to. */
static measure_t keep_all_profile(const char *ckpt, const opts_t *o, mt_dtype_t dt) {
    sched_plan_t p_keep;
    sched_plan_init_uniform(&p_keep, o->layers + 2, SCHED_POLICY_KEEP_ALL);
    const sched_plan_t *one[] = {&p_keep};
    const step_mode_t no_overlap[] = {STEP_AFTER_BACKWARD};
    double unused_ratio, unused_probe;
    measure_t m;
    measure_side_by_side_ex(ckpt, o, one, no_overlap, &dt, 1, 0, -1, &m, &unused_ratio, &unused_probe);
    sched_plan_free(&p_keep);
    return m;
}

int nvme_report(const char *ckpt, const opts_t *o, double link_bps, const measure_t *keep) {
    raw_rates_t raw = {0};
    if (!raw_measure(o, &raw)) return 1;
    const int nb = o->layers + 2;
    const bool bf16 = o->bf16 == 1;
    /* --precision-dtype bf16: the masters go to the tier too, and a third
     * run puts the streamed blocks' bf16 working copies there as well (an
     * fp32 run's home is its master, which stays in host memory) */
    const int runs = bf16 ? 3 : 2;
    sched_plan_t p_host, p_nvme, p_weights;
    sched_plan_init_uniform(&p_host, nb, SCHED_POLICY_OFFLOAD_ALL);
    sched_plan_init_uniform(&p_nvme, nb, SCHED_POLICY_OFFLOAD_ALL);
    sched_plan_init_uniform(&p_weights, nb, SCHED_POLICY_OFFLOAD_ALL);
    for (int b = 0; b < nb; b++) {
        p_nvme.blocks[b].nvme_optim = p_weights.blocks[b].nvme_optim = true;
        /* the decoder layers' (the embedding and head keep fp32 homes in host memory) */
        p_weights.blocks[b].nvme_weights = b > 0 && b < nb - 1 && p_weights.blocks[b].weights == SCHED_WEIGHTS_STREAM;
    }
    const sched_plan_t *plans[] = {&p_host, &p_nvme, &p_weights};
    const step_mode_t modes[] = {STEP_OVERLAP, STEP_OVERLAP, STEP_OVERLAP};
    measure_t ms[3] = {0};
    double ratio[3], probe;
    const mt_dtype_t dt = bf16 ? MT_BF16 : MT_F32, compute[] = {dt, dt, dt};
    measure_side_by_side_ex(ckpt, o, plans, modes, compute, runs, link_bps, -1, ms, ratio, &probe);
    bool ok = raw_measure(o, &raw) && ms[0].ok && ms[1].ok && ms[1].nvme.read_bytes > 0;
    if (runs > 2) ok = ok && ms[2].ok && ms[2].nvme.read_bytes > ms[1].nvme.read_bytes;
    double pred[3] = {0, 0, 0};
    /* a bf16 step predicted from a keep_all step profiled in bf16 too */
    measure_t keep16 = {0};
    if (ok && bf16) keep16 = keep_all_profile(ckpt, o, MT_BF16);
    const measure_t *prof = bf16 ? &keep16 : keep;
    ok = ok && raw_measure(o, &raw);
    double pred_slow[3] = {0, 0, 0}, pred_fast[3] = {0, 0, 0};
    if (ok && prof->ok) {
        raw_summarise(&raw);
        predictor_t pr;
        predictor_init(&pr, ckpt, o, link_bps, prof, prof->optim_s, bf16);
        pr.w.h2d_bw = pr.w.d2h_bw = link_bps;
        const double rd[3] = {raw.read_med, raw.read_min, raw.read_max};
        const double wr[3] = {raw.write_med, raw.write_min, raw.write_max};
        double *out[3] = {pred, pred_slow, pred_fast};
        for (int k = 0; k < 3 && pr.ok; k++) {
            pr.w.nvme_read_bw = rd[k];
            pr.w.nvme_write_bw = wr[k];
            for (int i = 0; i < runs && pr.ok; i++) out[k][i] = predict(&pr, plans[i]);
        }
        predictor_free(&pr);
    }
    if (ok && o->json) print_json(link_bps, &raw, ms, pred, runs);
    else if (ok) print_text(o, link_bps, &raw, ms, pred, pred_slow, pred_fast, runs);
    else if (ms[0].ok && ms[1].ok) fprintf(stderr, "bench step: --nvme: the tier moved nothing\n");
    for (int i = 0; i < runs; i++) measure_free(&ms[i]);
    if (bf16) measure_free(&keep16);
    sched_plan_free(&p_host);
    sched_plan_free(&p_nvme);
    sched_plan_free(&p_weights);
    return ok ? 0 : 1;
}
