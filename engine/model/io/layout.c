/* A checkpoint's routed-expert layout (see eng_ckpt_layout_t in
 * checkpoint.h): transformers 5's fused tensors seen under the Hub's
 * per-expert names.
 *
 * The rest of moetune (loading, the header check, inspect, the LoRA base)
 * knows one layout, the Hub's, which is also moetune's own: one parameter
 * per expert and projection, so that an expert without tokens is neither
 * moved nor touched by the optimizer.  Rather than teach each of them a
 * second one, the fused layout is resolved here, once, into entries with the
 * Hub's names.  Expert e's slice of a fused tensor is contiguous in the
 * file (gate rows [e, 0:I, :], up rows [e, I:2I, :], down [e, :, :]), so an
 * entry is a view into the mapping: nothing is copied, and reading it
 * converts dtype and checks finiteness exactly as for any tensor. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/model/io/checkpoint.h"

#define NAME_CAP 160

const char *eng_ckpt_layout_name(eng_ckpt_layout_t layout) {
    return layout == ENG_CKPT_LAYOUT_FUSED ? "fused" : "per_expert";
}

static int cmp_entry(const void *a, const void *b) {
    return strcmp(((const eng_ckpt_entry_t *)a)->name, ((const eng_ckpt_entry_t *)b)->name);
}

static void shape_str(char *buf, size_t cap, int ndim, const uint64_t *s) {
    size_t n = (size_t)snprintf(buf, cap, "[");
    for (int i = 0; i < ndim && n < cap; i++) n += (size_t)snprintf(buf + n, cap - n, "%s%llu", i ? ", " : "", (unsigned long long)s[i]);
    if (n < cap) snprintf(buf + n, cap - n, "]");
}

/* name with its first `from` replaced by `to` (false when absent or too long). */
static bool replaced(const char *name, const char *from, const char *to, char *out, size_t cap) {
    const char *at = strstr(name, from);
    if (!at) return false;
    const int n = snprintf(out, cap, "%.*s%s%s", (int)(at - name), name, to, at + strlen(from));
    return n > 0 && (size_t)n < cap;
}

/* transformers 5's name for a tensor whose Hub name is `name`: Mixtral's
 * sparse block is `mlp` there. */
static const eng_ckpt_entry_t *find_renamed(const eng_checkpoint_t *ck, const char *name) {
    char alt[NAME_CAP];
    return replaced(name, ".block_sparse_moe.", ".mlp.", alt, sizeof alt) ? eng_checkpoint_find(ck, alt) : NULL;
}

/* The fused tensor holding expert parameter p: `<block>.experts.gate_up_proj`
 * for gate and up, `<block>.experts.down_proj` for down, under the block's
 * Hub name or transformers 5's. */
static const eng_ckpt_entry_t *find_fused(const eng_checkpoint_t *ck, const eng_param_spec_t *p, char *fused,
                                          size_t cap) {
    const char *at = strstr(p->name, ".experts.");
    if (!at) return NULL;
    const char *leaf = p->role == ENG_P_EXP_DOWN ? "down_proj" : "gate_up_proj";
    char hub[NAME_CAP];
    snprintf(hub, sizeof hub, "%.*s.experts.%s", (int)(at - p->name), p->name, leaf);
    const eng_ckpt_entry_t *e = eng_checkpoint_find(ck, hub);
    if (e || !replaced(hub, ".block_sparse_moe.", ".mlp.", fused, cap)) {
        snprintf(fused, cap, "%s", hub);
        return e;
    }
    return eng_checkpoint_find(ck, fused);
}

mt_status_t eng_checkpoint_resolve(eng_checkpoint_t *ck, const eng_model_desc_t *spec, mt_error_t *err) {
    const int described = spec->count + spec->num_buffers;
    if (ck->views || described == 0) return MT_OK;
    ck->views = calloc((size_t)described, sizeof *ck->views);
    ck->view_names_ = calloc((size_t)described, NAME_CAP);
    ck->view_shapes_ = calloc((size_t)described * 2, sizeof *ck->view_shapes_);
    bool *consumed = calloc(ck->count ? (size_t)ck->count : 1, sizeof *consumed);
    eng_ckpt_entry_t *added = calloc((size_t)described, sizeof *added);
    MT_CHECK(ck->views && ck->view_names_ && ck->view_shapes_ && consumed && added,
             "out of host memory resolving %s's expert layout", ck->dir);
    mt_status_t st = MT_OK;
    int nadded = 0;
    for (int i = 0; i < described && st == MT_OK; i++) {
        const eng_param_spec_t *p = i < spec->count ? &spec->params[i] : &spec->buffers[i - spec->count];
        if (eng_checkpoint_find(ck, p->name)) continue;
        eng_st_tensor_t *v = &ck->views[ck->view_count];
        char *vname = ck->view_names_ + (size_t)ck->view_count * NAME_CAP;
        uint64_t *vshape = ck->view_shapes_ + (size_t)ck->view_count * 2;
        const eng_ckpt_entry_t *e = find_renamed(ck, p->name);
        if (e) { /* the same tensor under transformers 5's block name */
            *v = *e->tensor;
        } else if (p->expert >= 0 && p->ndim == 2) {
            char fused[NAME_CAP];
            e = find_fused(ck, p, fused, sizeof fused);
            if (!e) continue; /* missing in either layout: the loader or check names it */
            const eng_st_tensor_t *t = e->tensor;
            const bool down = p->role == ENG_P_EXP_DOWN;
            const uint64_t E = (uint64_t)spec->num_experts, r = (uint64_t)p->shape[0], c = (uint64_t)p->shape[1];
            const uint64_t want[3] = {E, down ? r : 2 * r, c};
            bool same = t->ndim == 3;
            for (int d = 0; same && d < 3; d++) same = t->shape[d] == want[d];
            if (!same) {
                char got[96], exp[96];
                shape_str(got, sizeof got, t->ndim, t->shape);
                shape_str(exp, sizeof exp, 3, want);
                st = mt_error_set(err, MT_ERR_FORMAT,
                                  "%s: fused expert tensor '%s' has shape %s but config.json implies %s "
                                  "(%llu experts x %s; '%s' is its slice [%d%s])",
                                  ck->files[e->file].path, fused, got, exp, (unsigned long long)E,
                                  down ? "(hidden, expert width)" : "(2 x expert width: gate rows then up rows, hidden)",
                                  p->name, p->expert, down ? "" : p->role == ENG_P_EXP_GATE ? ", :I" : ", I:");
                break;
            }
            const uint64_t numel = r * c;
            const uint64_t first = (uint64_t)p->expert * (down ? 1 : 2) * numel + (p->role == ENG_P_EXP_UP ? numel : 0);
            const uint64_t bits = (uint64_t)eng_st_dtype_bits(t->dtype);
            *v = *t;
            v->ndim = 2;
            vshape[0] = r;
            vshape[1] = c;
            v->shape = vshape;
            v->numel = numel;
            v->begin = t->begin + first * bits / 8;
            v->end = v->begin + numel * bits / 8;
            v->data = (const uint8_t *)t->data + first * bits / 8;
            ck->layout = ENG_CKPT_LAYOUT_FUSED;
        } else {
            continue;
        }
        snprintf(vname, NAME_CAP, "%s", p->name);
        v->name = vname;
        consumed[e - ck->entries] = true;
        added[nadded++] = (eng_ckpt_entry_t){v->name, e->file, v};
        ck->view_count++;
    }
    if (st == MT_OK && nadded > 0) {
        int kept = 0;
        for (int i = 0; i < ck->count; i++)
            if (!consumed[i]) ck->entries[kept++] = ck->entries[i];
        eng_ckpt_entry_t *grown = realloc(ck->entries, (size_t)(kept + nadded) * sizeof *grown);
        MT_CHECK_ALLOC(grown, "checkpoint index");
        memcpy(grown + kept, added, (size_t)nadded * sizeof *added);
        ck->entries = grown;
        ck->count = kept + nadded;
        qsort(ck->entries, (size_t)ck->count, sizeof *ck->entries, cmp_entry);
    }
    free(consumed);
    free(added);
    return st;
}

/* ---- writing the fused layout ---------------------------------------------- */

void eng_ckpt_fuse_experts(const eng_model_desc_t *spec, const eng_ckpt_tensor_t *in, eng_ckpt_fused_t *out) {
    memset(out, 0, sizeof *out);
    const int n = spec->count;
    const int L = spec->num_layers, E = spec->num_experts;
    out->tensors = calloc(n ? (size_t)n : 1, sizeof *out->tensors);
    out->names_ = calloc(n ? (size_t)n : 1, NAME_CAP);
    out->shapes_ = calloc(n ? (size_t)n * 3 : 1, sizeof *out->shapes_);
    out->owned_ = calloc(L > 0 ? (size_t)L * 2 : 1, sizeof *out->owned_);
    bool *done = calloc(L > 0 ? (size_t)L : 1, sizeof *done);
    MT_CHECK(out->tensors && out->names_ && out->shapes_ && out->owned_ && done,
             "out of host memory laying out experts for saving");
    for (int i = 0; i < n; i++) {
        const eng_param_spec_t *p = &spec->params[i];
        char *name = out->names_ + (size_t)out->count * NAME_CAP;
        const bool expert = p->expert >= 0 && p->layer >= 0 &&
                            (p->role == ENG_P_EXP_GATE || p->role == ENG_P_EXP_UP || p->role == ENG_P_EXP_DOWN);
        if (!expert) {
            eng_ckpt_tensor_t t = in[i];
            if (replaced(t.name, ".block_sparse_moe.", ".mlp.", name, NAME_CAP)) t.name = name;
            out->tensors[out->count++] = t;
            continue;
        }
        if (done[p->layer]) continue;
        done[p->layer] = true;
        /* Both fused tensors of the layer, where its first expert tensor stands. */
        const int l = p->layer;
        const int g0 = eng_model_desc_find_role(spec, l, ENG_P_EXP_GATE, 0);
        const int d0 = eng_model_desc_find_role(spec, l, ENG_P_EXP_DOWN, 0);
        MT_CHECK(g0 >= 0 && d0 >= 0, "layer %d: expert tensors without expert 0 in the description", l);
        const int64_t I = spec->params[g0].shape[0], H = spec->params[g0].shape[1];
        const size_t per = (size_t)I * (size_t)H;
        const char *at = strstr(spec->params[g0].name, ".experts.");
        MT_CHECK(at != NULL, "expert tensor '%s' has no '.experts.' in its name", spec->params[g0].name);
        char block[128]; /* a spec name's prefix: leaves room for the leaf below */
        snprintf(block, sizeof block, "%.*s", (int)(at - spec->params[g0].name), spec->params[g0].name);
        char mlp[128];
        const char *prefix = replaced(block, ".block_sparse_moe", ".mlp", mlp, sizeof mlp) ? mlp : block;
        for (int which = 0; which < 2; which++) { /* 0: gate_up_proj, 1: down_proj */
            float *data = malloc((which == 0 ? 2 : 1) * (size_t)E * per * sizeof *data);
            MT_CHECK_ALLOC(data, "fused expert tensor");
            out->owned_[out->owned_count_++] = data;
            for (int e = 0; e < E; e++) {
                if (which == 0) {
                    const int g = eng_model_desc_find_role(spec, l, ENG_P_EXP_GATE, e);
                    const int u = eng_model_desc_find_role(spec, l, ENG_P_EXP_UP, e);
                    MT_CHECK(g >= 0 && u >= 0, "layer %d expert %d: no gate or up tensor", l, e);
                    memcpy(data + (size_t)e * 2 * per, in[g].data, per * sizeof *data);
                    memcpy(data + (size_t)e * 2 * per + per, in[u].data, per * sizeof *data);
                } else {
                    const int d = eng_model_desc_find_role(spec, l, ENG_P_EXP_DOWN, e);
                    MT_CHECK(d >= 0, "layer %d expert %d: no down tensor", l, e);
                    memcpy(data + (size_t)e * per, in[d].data, per * sizeof *data);
                }
            }
            name = out->names_ + (size_t)out->count * NAME_CAP;
            snprintf(name, NAME_CAP, "%s.experts.%s", prefix, which == 0 ? "gate_up_proj" : "down_proj");
            int64_t *shape = out->shapes_ + (size_t)out->count * 3;
            shape[0] = E;
            shape[1] = which == 0 ? 2 * I : H;
            shape[2] = which == 0 ? H : I;
            out->tensors[out->count++] =
                (eng_ckpt_tensor_t){.name = name, .dtype = in[g0].dtype, .ndim = 3, .shape = shape, .data = data};
        }
    }
    free(done);
}

void eng_ckpt_fused_free(eng_ckpt_fused_t *f) {
    for (int i = 0; i < f->owned_count_; i++) free(f->owned_[i]);
    free(f->owned_);
    free(f->tensors);
    free(f->names_);
    free(f->shapes_);
    memset(f, 0, sizeof *f);
}
