#!/usr/bin/env python3
"""Reference values for moetune's quantised formats (tests/quant_ref_test.c).

Written from each format's definition with torch / numpy, independently of
moetune's C code (which indexes element by element; this script works on
whole arrays: torch's own float8 type, bucket searches instead of decision
trees, numpy shifts for the packed words):

  fp8     F8_E4M3 codes (torch.float8_e4m3fn) x weight_scale_inv per
          128 x 128 block (DeepSeek-V3 `quant_method: fp8`), partial edges.
  mxfp4   OCP Microscaling v1.0: E2M1 values {0, .5, 1, 1.5, 2, 3, 4, 6},
          E8M0 scale 2^(s-127), 32 values per scale, low nibble first
          (gpt-oss `_blocks` / `_scales`).
  nf4/fp4 bitsandbytes (functional.quantize_4bit / dequantize_4bit and
          csrc's kQuantizeBlockwise): flat blocks of 64, absmax = max |x|,
          x * (1 / absmax) coded by the strict `x > pivot` trees of
          dQuantizeNF4 / dQuantizeFP4 (here: searchsorted on the pivots),
          element 2j in the high nibble; NF4's table is bnb's
          get_4bit_type("nf4"); FP4's is [0, .0625, 8, 12, 4, 6, 2, 3] / 12
          with the sign bit 8.  Double quantisation: offset = mean(absmax)
          (summed in float64, rounded once), absmax - offset quantised in
          blocks of 256 to create_dynamic_map() by dQuantize<0>'s search.
  gptq    INT4 with group 128 along in_features: qweight int32
          (in/8, out), qzeros int32 (in/g, out/8) holding zero - 1, fp16
          scales (in/g, out); W[o][i] = scale * (q - (z + 1)).

Each case is written to tests/fixtures/quant/<case>.bin as records:
name (32 bytes, NUL padded), kind (1 byte: f=fp32 u=uint8 i=int32
h=uint16 q=int64), 7 pad bytes, count (uint64 LE), count elements.

Run: /work/venv/bin/python tests/reference/make_quant_fixtures.py
"""
import os
import struct
from fractions import Fraction

import numpy as np
import torch

OUT = os.path.join(os.path.dirname(__file__), "..", "fixtures", "quant")
KINDS = {"f": np.float32, "u": np.uint8, "i": np.int32, "h": np.uint16, "q": np.int64}


def write(case, records):
    with open(os.path.join(OUT, case + ".bin"), "wb") as f:
        for name, kind, arr in records:
            a = np.ascontiguousarray(np.asarray(arr).astype(KINDS[kind], copy=False)).reshape(-1)
            f.write(name.encode().ljust(32, b"\0") + kind.encode() + b"\0" * 7 + struct.pack("<Q", a.size))
            f.write(a.tobytes())


def bf16_bits(x):
    return torch.from_numpy(np.asarray(x, np.float32)).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)


def f32(x):
    return np.asarray(x, np.float32)


def case_fp8(rng):
    rows, cols, b = 130, 260, 128
    codes = rng.integers(0, 256, (rows, cols), dtype=np.uint8)
    codes[codes == 0x7F] = 0x7E  # E4M3FN's NaN encodings: not in a real weight
    codes[codes == 0xFF] = 0xFE
    vals = torch.from_numpy(codes).view(torch.float8_e4m3fn).to(torch.float32).numpy()
    sr, sc = -(-rows // b), -(-cols // b)
    scales = f32(np.exp2(rng.uniform(-12, -4, (sr, sc))))
    full = np.repeat(np.repeat(scales, b, 0), b, 1)[:rows, :cols]
    out = f32(vals * full)
    write("fp8", [("shape", "q", [rows, cols, b, b]), ("codes", "u", codes), ("scales", "f", scales),
                  ("out_f32", "f", out), ("out_bf16", "h", bf16_bits(out))])


E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


def case_mxfp4(rng):
    rows, cols = 6, 96
    nib = rng.integers(0, 16, (rows, cols), dtype=np.uint8)
    codes = (nib[:, 0::2] | (nib[:, 1::2] << 4)).astype(np.uint8)
    scales = rng.integers(110, 140, (rows, cols // 32), dtype=np.uint8)
    mag = f32(E2M1)[nib & 7] * np.where(nib & 8, -1.0, 1.0)
    out = f32(mag * np.ldexp(1.0, np.repeat(scales.astype(np.int32) - 127, 32, 1)))
    write("mxfp4", [("shape", "q", [rows, cols, 32, 0]), ("codes", "u", codes), ("scales_u8", "u", scales),
                    ("out_f32", "f", out), ("out_bf16", "h", bf16_bits(out))])


NF4 = f32([-1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453, -0.28444138169288635,
           -0.18477343022823334, -0.09105003625154495, 0.0, 0.07958029955625534, 0.16093020141124725,
           0.24611230194568634, 0.33791524171829224, 0.44070982933044434, 0.5626170039176941,
           0.7229568362236023, 1.0])


def f32_literal(text):
    """A C `<text>f` literal: the decimal rounded once to the nearest fp32
    (ties to even).  Going through a Python float would round twice, and
    several of bnb's pivots are midpoints where that changes the fp32."""
    exact = Fraction(text)
    d = np.float32(float(exact))
    cands = [np.nextafter(d, np.float32(-np.inf)), d, np.nextafter(d, np.float32(np.inf))]
    return min(cands, key=lambda c: (abs(Fraction(float(c)) - exact), int(c.view(np.uint32)) & 1))


# csrc dQuantizeNF4 / dQuantizeFP4 pivots as nvcc reads them (fp32 literals)
NF4_PIVOTS = f32([f32_literal(t) for t in (
    "-0.8480964004993439", "-0.6106329262256622", "-0.4599952697753906", "-0.33967943489551544",
    "-0.23460740596055984", "-0.13791173323988914", "-0.045525018125772476", "0.03979014977812767",
    "0.1202552504837513", "0.2035212516784668", "0.2920137718319893", "0.3893125355243683",
    "0.5016634166240692", "0.6427869200706482", "0.8614784181118011")])
FP4 = f32([0, 0.0625, 8, 12, 4, 6, 2, 3]) / np.float32(12)
FP4_TABLE = np.concatenate([FP4, -FP4])
FP4_PIVOTS = f32([f32_literal(t) for t in
                  ("0.00260417", "0.0859375", "0.20833333", "0.29166667", "0.4166667", "0.583333", "0.8333333")])
FP4_BY_RANK = np.array([0, 1, 6, 7, 4, 5, 2, 3], np.uint8)  # codes in increasing magnitude


def code_4bit(x, kind):
    x = f32(x)
    t = torch.from_numpy(x)
    if kind == "nf4":  # the number of pivots strictly below x; NaN -> 0 (all of bnb's tests fail)
        c = torch.searchsorted(torch.from_numpy(NF4_PIVOTS), t, right=False).numpy().astype(np.uint8)
    else:
        rank = torch.searchsorted(torch.from_numpy(FP4_PIVOTS), t.abs(), right=False).numpy()
        c = FP4_BY_RANK[rank] + np.where(x < 0, 8, 0).astype(np.uint8)
    c[np.isnan(x)] = 0
    return c.astype(np.uint8)


def dynamic_map():  # bitsandbytes functional.create_dynamic_map(signed=True, 7, 8), with this torch
    data = []
    for i in range(7):
        boundaries = torch.linspace(0.1, 1, 2 ** i + 1, dtype=torch.float32)
        means = (boundaries[:-1] + boundaries[1:]) / 2.0
        data += ((10 ** (-6 + i)) * means).tolist()
        data += (-(10 ** (-6 + i)) * means).tolist()
    data += [0, 1.0]
    data.sort()
    return f32(data)


def quant_8bit(code, x):  # dQuantize<0> of csrc, in fp32 scalars
    x = np.float32(x)
    pivot, up, lo = 127, 255, 0
    lower, upper, val = np.float32(-1), np.float32(1), code[127]
    i = 64
    while i > 0:
        if x > val:
            lo, lower, pivot = pivot, val, pivot + i
        else:
            up, upper, pivot = pivot, val, pivot - i
        val = code[pivot]
        i >>= 1
    if up == 255:
        upper = code[255]
    if lo == 0:
        lower = code[0]
    if x > val:
        return up if x > (upper + val) * np.float32(0.5) else pivot
    return lo if x < (lower + val) * np.float32(0.5) else pivot


def quantize_4bit(x, kind, block, nested):
    n = x.size
    nb = -(-n // block)
    pad = np.zeros(nb * block, np.float32)
    pad[:n] = x
    blocks = pad.reshape(nb, block)
    valid = (np.arange(nb * block) < n).reshape(nb, block)
    absmax = f32(np.where(valid, np.abs(blocks), 0).max(1))
    with np.errstate(divide="ignore", invalid="ignore"):
        scaled = blocks * (np.float32(1) / absmax)[:, None]
    codes = code_4bit(scaled.reshape(-1), kind)[: n + (n & 1)]
    packed = ((codes[0::2] << 4) | codes[1::2]).astype(np.uint8)
    recs = [("codes", "u", packed)]
    table = NF4 if kind == "nf4" else FP4_TABLE
    if not nested:
        recs.append(("absmax", "f", absmax))
        am = absmax
    else:
        code2 = dynamic_map()
        offset = np.float32(absmax.astype(np.float64).mean())
        centred = f32(absmax - offset)
        nb2 = -(-nb // 256)
        absmax2 = f32([np.abs(centred[k * 256:(k + 1) * 256]).max() for k in range(nb2)])
        q = np.array([quant_8bit(code2, centred[b] * (np.float32(1) / absmax2[b // 256])) for b in range(nb)],
                     np.uint8)
        recs += [("qabsmax", "u", q), ("absmax2", "f", absmax2), ("code2", "f", code2), ("offset", "f", [offset])]
        am = f32(code2[q] * np.repeat(absmax2, 256)[:nb]) + offset  # dequantize_blockwise, then += offset
    allc = np.stack([packed >> 4, packed & 15], 1).reshape(-1)[:n]
    out = f32(table[allc] * np.repeat(am, block)[:n])
    return recs, out


def case_bnb(rng, name, kind, rows, cols, nested):
    x = f32(rng.standard_normal(rows * cols) * 0.02)
    x[64:128] = 0  # an all-zero block: absmax 0, 0 * inf = NaN takes code 0
    scale = np.abs(x[128:192]).max()
    x[130] = NF4_PIVOTS[9] * scale  # values near the pivots after * (1 / absmax)
    x[131] = -NF4_PIVOTS[3] * scale
    recs, out = quantize_4bit(x, kind, 64, nested)
    write(name, [("shape", "q", [rows, cols, 64, 256 if nested else 0]), ("x", "f", x)] + recs +
          [("out_f32", "f", out), ("out_bf16", "h", bf16_bits(out))])


def case_ties(rng):  # exactly on each pivot and one ulp either side: NF4 and FP4 codes
    xs = []
    for p in list(NF4_PIVOTS) + list(FP4_PIVOTS) + list(-FP4_PIVOTS):
        xs += [np.nextafter(p, np.float32(-2)), p, np.nextafter(p, np.float32(2))]
    xs = f32(xs + [0.0, -0.0, 1.0, -1.0])
    write("ties", [("x", "f", xs), ("nf4", "u", code_4bit(xs, "nf4")), ("fp4", "u", code_4bit(xs, "fp4")),
                   ("code2", "f", dynamic_map())])


def case_gptq(rng):
    out_f, in_f, g = 16, 256, 128
    q = rng.integers(0, 16, (in_f, out_f), dtype=np.uint32)  # q[i][o]
    z = rng.integers(0, 16, (in_f // g, out_f), dtype=np.uint32)  # stored zero - 1
    qweight = np.zeros((in_f // 8, out_f), np.uint32)
    for k in range(8):
        qweight |= q[k::8] << np.uint32(4 * k)
    qzeros = np.zeros((in_f // g, out_f // 8), np.uint32)
    for k in range(8):
        qzeros |= z[:, k::8] << np.uint32(4 * k)
    scales16 = (rng.uniform(0.001, 0.05, (in_f // g, out_f))).astype(np.float16)
    s = scales16.astype(np.float32)
    deq = s[np.arange(in_f) // g] * (q.astype(np.float32) - (z[np.arange(in_f) // g] + 1).astype(np.float32))
    out = f32(deq.T)  # (out, in)
    write("gptq", [("shape", "q", [out_f, in_f, g, 0]), ("qweight", "i", qweight.view(np.int32)),
                   ("qzeros", "i", qzeros.view(np.int32)), ("scales", "f", s),
                   ("out_f32", "f", out), ("out_bf16", "h", bf16_bits(out))])


def main():
    os.makedirs(OUT, exist_ok=True)
    rng = np.random.default_rng(20261126)
    case_fp8(rng)
    case_mxfp4(rng)
    case_bnb(rng, "nf4", "nf4", 10, 77, False)
    case_bnb(rng, "fp4", "fp4", 8, 192, False)
    case_bnb(rng, "nf4_dq", "nf4", 150, 129, True)
    case_ties(rng)
    case_gptq(rng)


if __name__ == "__main__":
    main()
