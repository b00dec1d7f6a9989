"""Independent PyTorch reference for moetune's three MoE families.

Mixtral, Qwen2-MoE and Qwen3-MoE written in plain torch, following the
HuggingFace transformers modeling code line by line (modeling_mixtral.py,
modeling_qwen2_moe.py, modeling_qwen3_moe.py, modeling_olmoe.py, load_balancing_loss_func and
loss_utils.ForCausalLMLoss), so that the golden fixtures under
tests/fixtures/ref_*/ do not depend on transformers being installed and do
not share code with the C engine they check.

Parameter names (state_dict keys) are exactly the HF checkpoint names,
because the module attribute names are the same as HF's.

Everything is dtype-generic: the fixtures are computed in float32 (as HF
does with fp32 weights); the self-check runs the same code in float64.
Where HF upcasts to float32 (RMSNorm variance, router softmax, attention
softmax, RoPE tables) we upcast to max(dtype, float32), which is a no-op in
float32 and keeps float64 runs in float64.

Also here: a tiny safetensors writer/reader (stdlib + numpy only) that
follows the format in docs/formats.md ("safetensors").

Run with Debian's python: /usr/bin/python3 (torch 1.13).
"""

import json
import math
import struct
from collections import OrderedDict

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

IGNORE_INDEX = -100

# ---------------------------------------------------------------------------
# safetensors
# ---------------------------------------------------------------------------

_ST_DTYPES = {
    # name: (numpy little-endian dtype, element size)
    "F64": ("<f8", 8), "F32": ("<f4", 4), "F16": ("<f2", 2),
    "I64": ("<i8", 8), "I32": ("<i4", 4), "I16": ("<i2", 2), "I8": ("i1", 1),
    "U64": ("<u8", 8), "U32": ("<u4", 4), "U16": ("<u2", 2), "U8": ("u1", 1),
    "BOOL": ("?", 1),
}
_NP_TO_ST = {np.dtype("float64"): "F64", np.dtype("float32"): "F32", np.dtype("float16"): "F16",
             np.dtype("int64"): "I64", np.dtype("int32"): "I32", np.dtype("int16"): "I16",
             np.dtype("int8"): "I8", np.dtype("uint64"): "U64", np.dtype("uint32"): "U32",
             np.dtype("uint16"): "U16", np.dtype("uint8"): "U8", np.dtype("bool"): "BOOL"}


def _to_numpy(t):
    if isinstance(t, torch.Tensor):
        return t.detach().cpu().contiguous().numpy()
    return np.ascontiguousarray(np.asarray(t))


def save_safetensors(path, tensors, metadata=None):
    """tensors: ordered mapping name -> torch tensor / numpy array.
    Writes them in the given order; header padded with spaces so that the
    data starts at a multiple of 8 bytes; metadata {"format": "pt"}."""
    meta = {"format": "pt"}
    if metadata:
        meta.update({str(k): str(v) for k, v in metadata.items()})
    header = OrderedDict()
    header["__metadata__"] = meta
    blobs = []
    offset = 0
    for name, t in tensors.items():
        a = _to_numpy(t)
        st = _NP_TO_ST.get(a.dtype)
        if st is None:
            raise ValueError(f"safetensors: tensor {name}: unsupported dtype {a.dtype}")
        raw = a.astype(_ST_DTYPES[st][0], copy=False).tobytes(order="C")
        header[name] = {"dtype": st, "shape": list(a.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    hjson = json.dumps(header, separators=(",", ":")).encode("utf-8")
    hjson += b" " * ((8 - len(hjson) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hjson)))
        f.write(hjson)
        for b in blobs:
            f.write(b)


def load_safetensors(path):
    """Returns (OrderedDict name -> torch tensor, metadata dict). Checks the
    rules the reference reader enforces (conventions.md)."""
    with open(path, "rb") as f:
        buf = f.read()
    if len(buf) < 8:
        raise ValueError(f"{path}: shorter than the 8-byte header length")
    (n,) = struct.unpack("<Q", buf[:8])
    if n > 100_000_000 or 8 + n > len(buf):
        raise ValueError(f"{path}: header length {n} invalid for file of {len(buf)} bytes")
    header = json.loads(buf[8:8 + n].decode("utf-8"),
                        object_pairs_hook=_no_duplicates(path))
    meta = header.pop("__metadata__", {}) or {}
    data = buf[8 + n:]
    spans = []
    out = OrderedDict()
    for name, info in header.items():
        st = info["dtype"]
        if st not in _ST_DTYPES:
            raise ValueError(f"{path}: tensor {name}: dtype {st} not supported by this reader")
        npdt, size = _ST_DTYPES[st]
        shape = [int(s) for s in info["shape"]]
        b, e = info["data_offsets"]
        if not (0 <= b <= e <= len(data)):
            raise ValueError(f"{path}: tensor {name}: offsets {b},{e} out of range")
        if (e - b) != int(np.prod(shape, dtype=np.int64)) * size:
            raise ValueError(f"{path}: tensor {name}: {e - b} bytes for shape {shape} {st}")
        spans.append((b, e, name))
        arr = np.frombuffer(data[b:e], dtype=npdt).reshape(shape).copy()
        out[name] = torch.from_numpy(arr)
    pos = 0
    for b, e, name in sorted(spans):
        if b != pos:
            raise ValueError(f"{path}: tensor {name}: gap or overlap at byte {b} (expected {pos})")
        pos = e
    if pos != len(data):
        raise ValueError(f"{path}: data ends at {pos}, file data is {len(data)} bytes")
    return out, meta


def _no_duplicates(path):
    def hook(pairs):
        d = OrderedDict()
        for k, v in pairs:
            if k in d:
                raise ValueError(f"{path}: duplicate tensor name {k}")
            d[k] = v
        return d
    return hook


# ---------------------------------------------------------------------------
# config
# ---------------------------------------------------------------------------

class Config:
    """The fields the three HF config classes define, with HF's defaults for
    what a config.json may leave out."""

    def __init__(self, d):
        self.raw = dict(d)
        mt = d["model_type"]
        if mt not in ("mixtral", "qwen2_moe", "qwen3_moe", "olmoe"):
            raise ValueError(f"unsupported model_type {mt}")
        self.model_type = mt
        g = d.get
        self.vocab_size = d["vocab_size"]
        self.hidden_size = d["hidden_size"]
        self.intermediate_size = d["intermediate_size"]
        self.num_hidden_layers = d["num_hidden_layers"]
        self.num_attention_heads = d["num_attention_heads"]
        self.num_key_value_heads = g("num_key_value_heads") or self.num_attention_heads
        self.head_dim = g("head_dim") or self.hidden_size // self.num_attention_heads
        self.rms_norm_eps = g("rms_norm_eps", 1e-5 if mt == "olmoe" else 1e-6)
        self.qk_norm_whole = False  # OLMoE: q/k RMSNorm over the whole projection
        self.clip_qkv = None        # OLMoE: clamp q, k, v to [-clip_qkv, clip_qkv] after the q/k norm
        self.rope_theta = g("rope_theta", 1e6 if mt == "mixtral" else 10000.0)
        if g("rope_scaling"):
            raise ValueError("rope_scaling is not modelled by this reference")
        self.hidden_act = g("hidden_act", "silu")
        if self.hidden_act != "silu":
            raise ValueError("only silu is modelled")
        self.tie_word_embeddings = g("tie_word_embeddings", False)
        if self.tie_word_embeddings:
            raise ValueError("tied embeddings are not modelled")
        self.output_router_logits = g("output_router_logits", False)
        self.router_aux_loss_coef = g("router_aux_loss_coef",
                                      {"mixtral": 0.02, "olmoe": 0.01}.get(mt, 0.001))
        self.num_experts_per_tok = d["num_experts_per_tok"]
        if mt == "mixtral":
            self.num_experts = d["num_local_experts"]
            self.moe_intermediate_size = self.intermediate_size
            self.norm_topk_prob = True
            self.qkv_bias = False
            self.qk_norm = False
            self.shared_expert_intermediate_size = 0
            self.layer_is_moe = [True] * self.num_hidden_layers
            if g("router_jitter_noise", 0.0):
                raise ValueError("router jitter is not modelled")
        elif mt == "olmoe":
            # OlmoeConfig / modeling_olmoe.py: every layer sparse, experts of
            # intermediate_size, softmax -> top-k -> renormalise only if
            # norm_topk_prob; q_norm RMSNorm(hidden_size) over q_proj's whole
            # output, k_norm RMSNorm((H / nh) * nkv) over k_proj's; o_proj
            # biased like q/k/v when attention_bias.
            self.num_experts = g("num_experts", g("num_local_experts", 64))
            self.moe_intermediate_size = self.intermediate_size
            self.norm_topk_prob = g("norm_topk_prob", False)
            self.qkv_bias = g("attention_bias", False)
            self.o_bias = self.qkv_bias
            self.qk_norm = True
            self.qk_norm_whole = True
            self.clip_qkv = g("clip_qkv")
            self.shared_expert_intermediate_size = 0
            self.layer_is_moe = [True] * self.num_hidden_layers
        else:
            self.num_experts = d["num_experts"]
            self.moe_intermediate_size = d["moe_intermediate_size"]
            self.norm_topk_prob = g("norm_topk_prob", False)
            step = g("decoder_sparse_step", 1)
            only = g("mlp_only_layers", []) or []
            self.layer_is_moe = [(i not in only) and self.num_experts > 0 and (i + 1) % step == 0
                                 for i in range(self.num_hidden_layers)]
            if mt == "qwen2_moe":
                self.qkv_bias = True            # HF: q/k/v Linear(bias=True), o_proj no bias
                self.o_bias = False
                self.qk_norm = False
                self.shared_expert_intermediate_size = d["shared_expert_intermediate_size"]
            else:
                self.qkv_bias = g("attention_bias", False)
                self.o_bias = self.qkv_bias   # Qwen3: o_proj also takes attention_bias
                self.qk_norm = True
                self.shared_expert_intermediate_size = 0
        if mt == "mixtral":
            self.o_bias = False


# ---------------------------------------------------------------------------
# modules (names = HF names)
# ---------------------------------------------------------------------------

def _up(dtype):
    """HF computes these in float32; never downcast a float64 check run."""
    return torch.promote_types(dtype, torch.float32)


class RMSNorm(nn.Module):
    def __init__(self, n, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))
        self.variance_epsilon = eps

    def forward(self, x):
        in_dtype = x.dtype
        x = x.to(_up(in_dtype))
        var = x.pow(2).mean(-1, keepdim=True)
        x = x * torch.rsqrt(var + self.variance_epsilon)
        return self.weight * x.to(in_dtype)


def rope_cos_sin(cfg, T, dtype):
    """HF default RoPE: inv_freq = 1 / theta^(arange(0, hd, 2) / hd) in
    float32, freqs = pos x inv_freq, emb = cat(freqs, freqs)."""
    ct = _up(dtype)
    hd = cfg.head_dim
    inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, hd, 2, dtype=torch.int64).to(ct) / hd))
    pos = torch.arange(T, dtype=torch.int64).to(ct)
    freqs = (inv_freq[None, :, None] @ pos[None, None, :]).transpose(1, 2)  # (1, T, hd/2)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def rotate_half(x):
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def repeat_kv(x, n_rep):
    b, nkv, t, hd = x.shape
    if n_rep == 1:
        return x
    return x[:, :, None, :, :].expand(b, nkv, n_rep, t, hd).reshape(b, nkv * n_rep, t, hd)


class Attention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        H, nh, nkv, hd = cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        self.head_dim = hd
        self.n_rep = nh // nkv
        self.scaling = hd ** -0.5
        self.q_proj = nn.Linear(H, nh * hd, bias=cfg.qkv_bias)
        self.k_proj = nn.Linear(H, nkv * hd, bias=cfg.qkv_bias)
        self.v_proj = nn.Linear(H, nkv * hd, bias=cfg.qkv_bias)
        self.o_proj = nn.Linear(nh * hd, H, bias=cfg.o_bias)
        if cfg.qk_norm_whole:
            self.q_norm = RMSNorm(nh * hd, cfg.rms_norm_eps)
            self.k_norm = RMSNorm(nkv * hd, cfg.rms_norm_eps)
        elif cfg.qk_norm:
            self.q_norm = RMSNorm(hd, cfg.rms_norm_eps)
            self.k_norm = RMSNorm(hd, cfg.rms_norm_eps)

    def forward(self, x, cos, sin, mask4d):
        B, T, _ = x.shape
        shp = (B, T, -1, self.head_dim)
        if self.cfg.qk_norm_whole:  # OLMoE: norm the whole projection, then clip, then split heads
            q = self.q_norm(self.q_proj(x))
            k = self.k_norm(self.k_proj(x))
            v = self.v_proj(x)
            c = self.cfg.clip_qkv
            if c is not None:  # HF: clamp_ in place; the gradient passes where -c <= x <= c
                q, k, v = q.clamp(-c, c), k.clamp(-c, c), v.clamp(-c, c)
            q, k, v = q.view(shp), k.view(shp), v.view(shp).transpose(1, 2)
        else:
            q = self.q_proj(x).view(shp)
            k = self.k_proj(x).view(shp)
            v = self.v_proj(x).view(shp).transpose(1, 2)
        if self.cfg.qk_norm and not self.cfg.qk_norm_whole:  # Qwen3: per-head RMSNorm over head_dim, before RoPE
            q = self.q_norm(q)
            k = self.k_norm(k)
        q = q.transpose(1, 2)
        k = k.transpose(1, 2)
        c, s = cos.unsqueeze(1), sin.unsqueeze(1)
        q = (q * c) + (rotate_half(q) * s)
        k = (k * c) + (rotate_half(k) * s)
        k = repeat_kv(k, self.n_rep)
        v = repeat_kv(v, self.n_rep)
        w = torch.matmul(q, k.transpose(2, 3)) * self.scaling
        w = w + mask4d
        w = F.softmax(w, dim=-1, dtype=_up(q.dtype)).to(q.dtype)
        o = torch.matmul(w, v).transpose(1, 2).contiguous().reshape(B, T, -1)
        return self.o_proj(o)


class MLP(nn.Module):
    """Qwen dense MLP / Qwen expert / shared expert: down(silu(gate(x)) * up(x))."""

    def __init__(self, H, I):
        super().__init__()
        self.gate_proj = nn.Linear(H, I, bias=False)
        self.up_proj = nn.Linear(H, I, bias=False)
        self.down_proj = nn.Linear(I, H, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class MixtralExpert(nn.Module):
    """MixtralBlockSparseTop2MLP: w2(silu(w1(x)) * w3(x))."""

    def __init__(self, H, I):
        super().__init__()
        self.w1 = nn.Linear(H, I, bias=False)
        self.w2 = nn.Linear(I, H, bias=False)
        self.w3 = nn.Linear(H, I, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class SparseMoeBlock(nn.Module):
    """Mixtral / Qwen2-MoE / Qwen3-MoE sparse block. The per-expert loop and
    index_add_ follow HF, so an expert that gets no token is never called
    and its parameters end with grad None."""

    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        H, E = cfg.hidden_size, cfg.num_experts
        self.num_experts = E
        self.top_k = cfg.num_experts_per_tok
        self.gate = nn.Linear(H, E, bias=False)
        mk = MixtralExpert if cfg.model_type == "mixtral" else MLP
        self.experts = nn.ModuleList([mk(H, cfg.moe_intermediate_size) for _ in range(E)])
        if cfg.shared_expert_intermediate_size:
            self.shared_expert = MLP(H, cfg.shared_expert_intermediate_size)
            self.shared_expert_gate = nn.Linear(H, 1, bias=False)
        self.last = None  # routing record of the last forward (for fixtures / checks)

    def forward(self, x):
        B, T, H = x.shape
        x = x.view(-1, H)
        router_logits = self.gate(x)
        rw = F.softmax(router_logits, dim=1, dtype=_up(x.dtype))
        probs = rw
        rw, sel = torch.topk(rw, self.top_k, dim=-1)
        if self.cfg.norm_topk_prob:  # Mixtral: always
            rw = rw / rw.sum(dim=-1, keepdim=True)
        rw = rw.to(x.dtype)
        out = torch.zeros((B * T, H), dtype=x.dtype, device=x.device)
        emask = F.one_hot(sel, num_classes=self.num_experts).permute(2, 1, 0)  # (E, k, n)
        hit = torch.greater(emask.sum(dim=(-1, -2)), 0).nonzero()
        for e in hit:
            e = int(e)
            idx, top_x = torch.where(emask[e])
            cur = x[None, top_x].reshape(-1, H)
            cur = self.experts[e](cur) * rw[top_x, idx, None]
            out.index_add_(0, top_x, cur.to(x.dtype))
        if self.cfg.shared_expert_intermediate_size:
            sh = self.shared_expert(x)
            sh = torch.sigmoid(self.shared_expert_gate(x)) * sh
            out = out + sh
        with torch.no_grad():
            p_sorted = torch.sort(probs.detach(), dim=-1, descending=True).values
            margin = (p_sorted[:, self.top_k - 1] - p_sorted[:, self.top_k]).min().item()
        self.last = {"router_logits": router_logits.detach(), "selected": sel.detach(),
                     "weights": rw.detach(), "hit": sorted(int(e) for e in hit.flatten()),
                     "topk_margin": margin}
        return out.view(B, T, H), router_logits


class DecoderLayer(nn.Module):
    def __init__(self, cfg, i):
        super().__init__()
        self.self_attn = Attention(cfg)
        self.is_moe = cfg.layer_is_moe[i]
        if cfg.model_type == "mixtral":
            self.block_sparse_moe = SparseMoeBlock(cfg)
        elif self.is_moe:
            self.mlp = SparseMoeBlock(cfg)
        else:
            self.mlp = MLP(cfg.hidden_size, cfg.intermediate_size)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def moe(self):
        if hasattr(self, "block_sparse_moe"):
            return self.block_sparse_moe
        return self.mlp if self.is_moe else None

    def forward(self, h, cos, sin, mask4d):
        r = h
        h = self.input_layernorm(h)
        h = r + self.self_attn(h, cos, sin, mask4d)
        r = h
        h = self.post_attention_layernorm(h)
        ff = self.block_sparse_moe if hasattr(self, "block_sparse_moe") else self.mlp
        out = ff(h)
        logits = None
        if isinstance(out, tuple):
            out, logits = out
        return r + out, logits


class Backbone(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        # padding_idx = config.pad_token_id, as every HF family here builds it:
        # that row's gradient is zero (None when the config has none: ref_olmoe
        # has 1, a token its data uses)
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size, cfg.raw.get("pad_token_id"))
        self.layers = nn.ModuleList([DecoderLayer(cfg, i) for i in range(cfg.num_hidden_layers)])
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


def causal_mask_4d(attention_mask, T, dtype, pad_mask_in_attention=True):
    """HF's 4-D additive mask: finfo.min above the diagonal and (when an
    attention_mask is given, as HF does) on padded keys."""
    B = attention_mask.shape[0]
    mn = torch.finfo(dtype).min
    m = torch.full((T, T), mn, dtype=dtype)
    m = m * (torch.arange(T)[None, :] > torch.arange(T)[:, None])
    m = m[None, None].expand(B, 1, T, T).clone()
    if pad_mask_in_attention:
        pad = (m + attention_mask[:, None, None, :].to(dtype)) == 0
        m = m.masked_fill(pad, mn)
    return m


def load_balancing_loss(gate_logits, num_experts, top_k, attention_mask):
    """transformers' load_balancing_loss_func, masked version."""
    cat = torch.cat(list(gate_logits), dim=0)
    rw = F.softmax(cat, dim=-1)
    _, sel = torch.topk(rw, top_k, dim=-1)
    emask = F.one_hot(sel, num_experts)
    if attention_mask is None:
        tpe = torch.mean(emask.to(cat.dtype), dim=0)
        ppe = torch.mean(rw, dim=0)
    else:
        B, T = attention_mask.shape
        L = cat.shape[0] // (B * T)
        am = attention_mask.to(cat.dtype)
        eam = am[None, :, :, None, None].expand((L, B, T, top_k, num_experts)).reshape(-1, top_k, num_experts)
        tpe = torch.sum(emask.to(cat.dtype) * eam, dim=0) / torch.sum(eam, dim=0)
        ram = am[None, :, :, None].expand((L, B, T, num_experts)).reshape(-1, num_experts)
        ppe = torch.sum(rw * ram, dim=0) / torch.sum(ram, dim=0)
    return torch.sum(tpe * ppe.unsqueeze(0)) * num_experts


def causal_lm_loss(logits, labels):
    """transformers ForCausalLMLoss without num_items_in_batch: upcast,
    pad labels by one -100 on the right, shift, mean over counted tokens."""
    logits = logits.to(_up(logits.dtype))
    labels = F.pad(labels, (0, 1), value=IGNORE_INDEX)
    shift = labels[..., 1:].contiguous()
    V = logits.shape[-1]
    return F.cross_entropy(logits.view(-1, V), shift.view(-1), ignore_index=IGNORE_INDEX,
                           reduction="mean")


class MoeForCausalLM(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.model = Backbone(cfg)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

    def moe_blocks(self):
        return [(i, l.moe()) for i, l in enumerate(self.model.layers) if l.moe() is not None]

    def forward(self, input_ids, attention_mask, labels=None, pad_mask_in_attention=True):
        cfg = self.cfg
        B, T = input_ids.shape
        h = self.model.embed_tokens(input_ids)
        dtype = h.dtype
        cos, sin = rope_cos_sin(cfg, T, dtype)
        mask4d = causal_mask_4d(attention_mask, T, dtype, pad_mask_in_attention)
        router_logits = []
        for layer in self.model.layers:
            h, rl = layer(h, cos, sin, mask4d)
            if rl is not None:
                router_logits.append(rl)
        h = self.model.norm(h)
        logits = self.lm_head(h)
        out = {"logits": logits, "router_logits": router_logits}
        aux = None
        if cfg.output_router_logits:
            aux = load_balancing_loss(router_logits, cfg.num_experts, cfg.num_experts_per_tok,
                                      attention_mask)
        out["aux_loss"] = aux
        if labels is not None:
            ce = causal_lm_loss(logits, labels)
            out["ce_loss"] = ce
            loss = ce
            if aux is not None:
                loss = ce + cfg.router_aux_loss_coef * aux
            out["loss"] = loss
        return out


def expert_param_index(name):
    """(layer, expert) for an expert parameter name, else None."""
    parts = name.split(".")
    if "experts" in parts and parts[0] == "model":
        i = parts.index("experts")
        return int(parts[2]), int(parts[i + 1])
    return None
