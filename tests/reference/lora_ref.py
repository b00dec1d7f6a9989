"""Independent PyTorch reference of PEFT LoRA on the three MoE families.

Extends hf_moe_ref.py's models (Mixtral, Qwen2-MoE, Qwen3-MoE in plain
torch) with LoRA written from PEFT's lora.Linear (peft/tuners/lora/layer.py),
without importing peft:

    y = W x (+ bias) + s * B(A(dropout(x))),  s = alpha / r, or alpha / sqrt(r) with rsLoRA

A (r, in) and B (out, r) are nn.Linear weights named as PEFT names them, so
the state-dict keys of the adapted model, prefixed with "base_model.model.",
are exactly the keys of a PEFT adapter_model.safetensors
(`base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight`).  Routed
experts get one adapter per expert (classic PEFT on per-expert nn.Linear),
so an expert that receives no token leaves its adapter's grad None, as HF's
per-expert loop does for the base weights.

Target matching follows PEFT's check_target_module_exists: a list entry
matches a module whose name equals it or ends with "." + entry; a string is
a regex matched against the whole name; "all-linear" is every nn.Linear but
the output head, and moetune (like lora_target_linear here) also leaves out
the router `gate` and `shared_expert_gate` unless named.

Also here: PEFT's fused-expert layout for transformers 5 (ParamWrapper over
a 3-D parameter stored (E, out, in)), to write fused fixtures and check that
they reproduce each expert's delta through PEFT's own formula.
"""

import math
import re

import torch
import torch.nn as nn

import hf_moe_ref as ref

PEFT_PREFIX = "base_model.model."


class LoraLinear(nn.Module):
    """PEFT's lora.Linear for one adapter, dropout 0 (the fixtures' case;
    dropout p is applied to x before A as PEFT does when p > 0)."""

    def __init__(self, base, r, alpha, use_rslora=False, dropout=0.0):
        super().__init__()
        self.base_layer = base
        self.r = r
        self.scaling = alpha / math.sqrt(r) if use_rslora else alpha / r
        self.lora_A = nn.Linear(base.in_features, r, bias=False)
        self.lora_B = nn.Linear(r, base.out_features, bias=False)
        self.dropout = nn.Dropout(dropout) if dropout > 0 else nn.Identity()
        for p in base.parameters():
            p.requires_grad_(False)

    @property
    def in_features(self):
        return self.base_layer.in_features

    @property
    def out_features(self):
        return self.base_layer.out_features

    def forward(self, x):
        return self.base_layer(x) + self.lora_B(self.lora_A(self.dropout(x))) * self.scaling

    def delta_weight(self):
        return (self.lora_B.weight @ self.lora_A.weight) * self.scaling


def _linear_kind(name, model):
    """'head', 'router', 'shared_gate' or 'linear' for an nn.Linear's name."""
    if name == "lm_head":
        return "head"
    if name.endswith(".gate") and isinstance(model.get_submodule(name.rsplit(".", 1)[0]), ref.SparseMoeBlock):
        return "router"
    if name.endswith(".shared_expert_gate"):
        return "shared_gate"
    return "linear"


def matches(name, target_modules):
    """PEFT's rule for a list or a regex string."""
    if isinstance(target_modules, str):
        return re.fullmatch(target_modules, name) is not None
    return any(name == t or name.endswith("." + t) for t in target_modules)


def select_targets(model, target_modules=None, target_linear=False):
    names = []
    for name, mod in model.named_modules():
        if not isinstance(mod, nn.Linear):
            continue
        kind = _linear_kind(name, model)
        hit = target_modules is not None and matches(name, target_modules)
        if target_linear and kind == "linear":
            hit = True
        if hit:
            names.append(name)
    if isinstance(target_modules, list):
        for t in target_modules:
            if not any(n == t or n.endswith("." + t) for n in names):
                raise ValueError(f"target {t!r} matches no linear module")
    return names


def apply_lora(model, targets, r, alpha, use_rslora=False, dropout=0.0):
    """Freezes the model and wraps each target in a LoraLinear."""
    for p in model.parameters():
        p.requires_grad_(False)
    for name in targets:
        parent_name, leaf = name.rsplit(".", 1) if "." in name else ("", name)
        parent = model.get_submodule(parent_name) if parent_name else model
        base = getattr(parent, leaf)
        if base.weight.shape[0] < r or base.weight.shape[1] < r:
            raise ValueError(f"rank {r} exceeds {name} {tuple(base.weight.shape)}")
        setattr(parent, leaf, LoraLinear(base, r, alpha, use_rslora, dropout))
    return model


def lora_modules(model):
    return [(n, m) for n, m in model.named_modules() if isinstance(m, LoraLinear)]


def init_adapter(model, seed, b_std):
    """A: Kaiming-uniform with a=sqrt(5) (PEFT's, i.e. nn.Linear's default
    bound 1/sqrt(in)) from a fixed generator; B: small NON-zero normals, so
    the adapter changes the logits at step 0 and A gets gradients then."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, m in lora_modules(model):
            fan_in = m.lora_A.weight.shape[1]
            gain = math.sqrt(2.0 / (1 + 5.0))           # kaiming_uniform_(a=sqrt(5))
            bound = gain * math.sqrt(3.0 / fan_in)
            m.lora_A.weight.copy_((torch.rand(m.lora_A.weight.shape, generator=g) * 2 - 1) * bound)
            m.lora_B.weight.copy_(b_std * torch.randn(m.lora_B.weight.shape, generator=g))


def adapter_state(model):
    """PEFT's adapter_model.safetensors content, per-expert keys, module order."""
    out = {}
    for n, m in lora_modules(model):
        out[f"{PEFT_PREFIX}{n}.lora_A.weight"] = m.lora_A.weight.detach().clone()
        out[f"{PEFT_PREFIX}{n}.lora_B.weight"] = m.lora_B.weight.detach().clone()
    return out


def load_adapter_state(model, state):
    with torch.no_grad():
        for n, m in lora_modules(model):
            m.lora_A.weight.copy_(state[f"{PEFT_PREFIX}{n}.lora_A.weight"])
            m.lora_B.weight.copy_(state[f"{PEFT_PREFIX}{n}.lora_B.weight"])


def merged_copy(model):
    """The base model with every adapter merged into W (W + s B A): the
    independent check of the wrapper's forward."""
    import copy
    m = copy.deepcopy(model)
    for name, lm in lora_modules(m):
        parent_name, leaf = name.rsplit(".", 1)
        parent = m.get_submodule(parent_name)
        base = lm.base_layer
        with torch.no_grad():
            base.weight += lm.delta_weight()
        setattr(parent, leaf, base)
    return m


# ---------------------------------------------------------------------------
# PEFT's fused expert layout (transformers 5 ParamWrapper)
# ---------------------------------------------------------------------------

def to_fused(a_list, b_list):
    """Per-expert pairs A_e (r, in), B_e (out, r) of a parameter stored
    (E, out, in) -> PEFT's ParamWrapper lora_A (E*r, in), lora_B (out, E*r):
    get_delta_factors views A as (E, r, in) and B as (out, r, E)."""
    E = len(a_list)
    r = a_list[0].shape[0]
    out_f = b_list[0].shape[0]
    A = torch.stack(list(a_list), 0)                        # (E, r, in)
    Bf = torch.stack(list(b_list), -1)                      # (out, r, E)
    return A.reshape(E * r, -1), Bf.reshape(out_f, r * E)


def gate_up_fused(a_gate, b_gate, a_up, b_up):
    """How PEFT fuses per-expert gate and up adapters into gate_up_proj's
    (peft.utils.transformers_weight_conversion): A's stacked along the rank
    (rank 2r), B block-diagonal (gate rows then up rows)."""
    a = [torch.cat([g, u], 0) for g, u in zip(a_gate, a_up)]
    b = [torch.block_diag(g, u) for g, u in zip(b_gate, b_up)]
    return to_fused(a, b)


def fused_delta(A, B, E, scaling):
    """PEFT 0.21 ParamWrapper.get_delta_weight, (E, out, in) storage
    (_did_swap_in_out_features): einsum("o r e, e r i -> e o i")."""
    wa = A.reshape(E, -1, A.shape[-1])
    wb = B.reshape(B.shape[0], -1, E)
    return torch.einsum("o r e, e r i -> e o i", wb, wa) * scaling
