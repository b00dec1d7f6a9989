/* Speculation by pointer swap (speculate.h), driven as exec_host_adamw
 * drives it: a speculative update written out of place into the spare and
 * swapped in must leave the in-place update's state; undo must give back
 * the old state in the very buffers it was in (nothing copied), a lazily
 * made first state must go again, the bf16 working copy must be rounded
 * again from the old master; keep must leave the spare for the next step. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/dtype.h"
#include "engine/optim/speculate.h"
#include "kernels/host/adamw_host.h"

static int failures;
#define EXPECT(c, ...)                                                   \
    do {                                                                 \
        if (!(c)) {                                                      \
            fprintf(stderr, "%s:%d: expected %s: ", __FILE__, __LINE__, #c); \
            fprintf(stderr, __VA_ARGS__);                                \
            fprintf(stderr, "\n");                                       \
            failures++;                                                  \
        }                                                                \
    } while (0)

enum { N = 1000 }; /* not a multiple of 256: a partial 8-bit block */

static kern_adamw_params_t hparams(int64_t step) {
    return (kern_adamw_params_t){.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .weight_decay = 0.1f,
                                 .grad_scale = 1.0f, .step = step};
}

static void grad_of(float *g, int step) {
    for (int i = 0; i < N; i++) g[i] = sinf(0.37f * (float)i + (float)step) * 0.01f;
}

/* exec_host_adamw's speculative path */
static void spec_update(eng_spec_t *s, eng_param_t *p, const float *g) {
    const eng_spec_copy_t *spare = eng_spec_begin(s, p, 0);
    const kern_moments_fmt_t fmt = (kern_moments_fmt_t)p->mom_fmt;
    if (!p->host_mom) p->host_mom = calloc(1, kern_moments_bytes(fmt, N));
    const kern_adamw_params_t hp = hparams(++p->step);
    const kern_moments_t cur = kern_moments_view(fmt, p->host_mom, N, p->mom_seed);
    const kern_moments_t next = kern_moments_view(fmt, spare->mom, N, p->mom_seed);
    kern_adamw_cpu_pool_from(NULL, p->host_w, &cur, spare->w, &next, g, NULL, p->work_bf16, N, &hp);
    eng_spec_swap_in(s, p, 0);
}

/* the same step in place on copies: the reference */
typedef struct {
    float w[N];
    void *mom;
    uint16_t bf[N];
} ref_t;

static void ref_update(ref_t *r, kern_moments_fmt_t fmt, uint64_t seed, const float *g, int64_t step) {
    const kern_moments_t mv = kern_moments_view(fmt, r->mom, N, seed);
    const kern_adamw_params_t hp = hparams(step);
    kern_adamw_cpu_pool(NULL, r->w, &mv, g, NULL, r->bf, N, &hp);
}

static void run_format(kern_moments_fmt_t fmt) {
    const char *fn = kern_moments_fmt_name(fmt);
    const size_t mb = kern_moments_bytes(fmt, N);
    eng_param_spec_t ps = {.numel = N};
    snprintf(ps.name, sizeof ps.name, "layers.0.w (%s)", fn);
    eng_param_t p = {.spec = &ps, .mom_fmt = fmt, .mom_seed = 5};
    p.host_w = malloc(N * sizeof(float));
    p.work_bf16 = malloc(N * sizeof(uint16_t));
    for (int i = 0; i < N; i++) p.host_w[i] = cosf((float)i) * 0.1f;
    kern_threadpool_to_bf16(NULL, p.work_bf16, p.host_w, N);
    static ref_t ref;
    memcpy(ref.w, p.host_w, sizeof ref.w);
    ref.mom = calloc(1, mb);
    float w0[N];
    memcpy(w0, p.host_w, sizeof w0);
    float *const w0_buf = p.host_w;
    eng_spec_t s;
    eng_spec_init(&s, 1);
    float g[N];

    /* step 1, undone: back to the original master in its own buffer, no moments, step 0 */
    grad_of(g, 1);
    spec_update(&s, &p, g);
    EXPECT(p.host_w != w0_buf && s.copy[0].w == w0_buf, "%s: the new master is swapped in", fn);
    EXPECT(memcmp(w0_buf, w0, sizeof w0) == 0, "%s: the speculative update left the old master untouched", fn);
    EXPECT(eng_spec_undo(&s, &p, 0, NULL), "%s: undo of a saved update", fn);
    EXPECT(p.host_w == w0_buf && memcmp(p.host_w, w0, sizeof w0) == 0, "%s: undo gives back the old master", fn);
    EXPECT(p.host_mom == NULL && p.step == 0, "%s: undo of a first update leaves no state (step %lld)", fn,
           (long long)p.step);
    int rounded = 1;
    for (int i = 0; i < N; i++) rounded &= p.work_bf16[i] == mt_f32_to_bf16(w0[i]);
    EXPECT(rounded, "%s: undo rounds the working copy again from the old master", fn);
    EXPECT(!eng_spec_undo(&s, &p, 0, NULL), "%s: nothing left to undo", fn);

    /* steps 1 and 2, kept: the in-place update's bits */
    for (int t = 1; t <= 2; t++) {
        grad_of(g, t);
        spec_update(&s, &p, g);
        ref_update(&ref, fmt, p.mom_seed, g, t);
        eng_spec_keep(&s, 0);
    }
    const kern_moments_t got = kern_moments_view(fmt, p.host_mom, N, 5), want = kern_moments_view(fmt, ref.mom, N, 5);
    const size_t eb = fmt == KERN_MOMENTS_F32 ? 4 : fmt == KERN_MOMENTS_BF16 ? 2 : 1;
    EXPECT(p.step == 2 && memcmp(p.host_w, ref.w, sizeof ref.w) == 0 && memcmp(p.work_bf16, ref.bf, sizeof ref.bf) == 0,
           "%s: two kept speculative steps give the in-place master and working copy", fn);
    EXPECT(memcmp(got.m, want.m, N * eb) == 0 && memcmp(got.v, want.v, N * eb) == 0,
           "%s: two kept speculative steps give the in-place moments", fn);

    /* step 3, undone: the state after step 2, in the buffers it was in */
    float w2[N];
    memcpy(w2, p.host_w, sizeof w2);
    void *mom2 = malloc(mb);
    memcpy(mom2, p.host_mom, mb);
    float *const w2_buf = p.host_w;
    void *const mom2_buf = p.host_mom;
    grad_of(g, 3);
    spec_update(&s, &p, g);
    EXPECT(p.step == 3 && p.host_mom != mom2_buf, "%s: step 3 swapped in", fn);
    EXPECT(eng_spec_undo(&s, &p, 0, NULL), "%s: undo of step 3", fn);
    EXPECT(p.step == 2 && p.host_w == w2_buf && p.host_mom == mom2_buf, "%s: undo swaps the old buffers back", fn);
    EXPECT(memcmp(p.host_w, w2, sizeof w2) == 0 && memcmp(p.host_mom, mom2, mb) == 0,
           "%s: undo gives back step 2's master and moments bit for bit", fn);
    EXPECT(memcmp(p.work_bf16, ref.bf, sizeof ref.bf) == 0, "%s: undo gives back step 2's working copy", fn);
    EXPECT(s.bytes == N * sizeof(float) + mb, "%s: one spare held (%llu bytes)", fn, (unsigned long long)s.bytes);

    eng_spec_free(&s);
    free(p.host_w), free(p.host_mom), free(p.work_bf16), free(ref.mom), free(mom2);
}

int main(void) {
    for (int f = KERN_MOMENTS_F32; f <= KERN_MOMENTS_8BIT; f++) run_format((kern_moments_fmt_t)f);
    if (failures) {
        fprintf(stderr, "%d failure(s)\n", failures);
        return 1;
    }
    printf("speculate_test: ok\n");
    return 0;
}
