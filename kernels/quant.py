"""MX quantization codecs of the V4.1 caches (vectorized torch).

Formats: MXFP8 E4M3 payload with E8M0 group-32 scales (window KV); packed MXFP4 E2M1 with E4M3
group-16 scales (compressed KV) or E8M0 group-32 scales (index keys). Every upstream rounding
variant is a named ``QuantRule`` (``RULES``); the cache defaults are ``window`` (device rule),
``compressed`` and ``index`` (ties toward zero).

Non-finite inputs: a NaN or +-Inf anywhere in a group poisons the whole group: its scale is the
NaN code (E8M0 0xFF, E4M3 0x7F) and every element decodes to NaN. No NaN becomes a finite code.
Zero groups get the floor scale and zero payload (-0.0 keeps its sign bit). Finite values beyond
the format saturate (E4M3 +-448; E2M1 +-6 after the E4M3 scale clamp at 448).

Spec: §2.2 (codecs, tie rules, nibble order), upstream_checks §15 C-6.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kernels import workers
from kernels.errors import ContractInputError
from kernels.operators import operator
from kernels.tables import WatchedTable

SPEC = "§2.2"
# Bump when the arithmetic or a rounding rule changes on purpose: goldens recorded before go stale.
ROUNDING_VERSION = "mx-2"
FP4_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
FP4_MIDPOINTS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)
E4M3_MAX = 448.0
E8M0_NAN = 0xFF
E4M3_NAN = 0x7F


class CodecError(ContractInputError):
    """Bad codec input (width not a multiple of the group, unknown rule, wrong dtype)."""


@dataclass(frozen=True)
class QuantRule:
    """One named rounding variant.

    ``scale_floor`` floors amax/qmax before the power-of-two ceiling (E8M0); ``amax_floor`` floors
    amax first (device/CED 1e-4); ``tie`` is ``toward_zero`` or ``even`` (E2M1 midpoints);
    ``bf16_io`` rounds the input to BF16 first and the decoded output back to BF16 (CED).
    """

    name: str
    fmt: str  # "mxfp8" | "mxfp4"
    group: int
    scale_format: str  # "e8m0" | "e4m3"
    amax_floor: float = 0.0
    scale_floor: float = 2.0**-127
    tie: str = "toward_zero"
    e4m3_scale_max: float = E4M3_MAX
    bf16_io: bool = False
    # the E8M0 power-of-two ceiling: "frexp" (exact: the smallest 2^e >= v), "bits" (the device's
    # (bits + 0x7FFFFF) >> 23, also exact) or "log2" (upstream's host goldens: ceil(log2(v)) in FP32 torch, which
    # rounds log2 of 2^k·(1 + 2^-23) to k for k >= 4 and k <= -5, so that value keeps the scale 2^k, one FP32 ulp
    # short of covering it, and its largest element saturates at the format's max)
    pow2: str = "frexp"

    @property
    def qmax(self) -> float:
        return E4M3_MAX if self.fmt == "mxfp8" else 6.0


# a WatchedTable: a golden tree depends on the entries its reference looked up, not on the whole table
RULES: dict[str, QuantRule] = WatchedTable("kernels.quant.RULES", {r.name: r for r in (
    # window KV: device publish_window (1e-4 amax floor, bit-trick ceiling) is the cache default
    QuantRule("window", "mxfp8", 32, "e8m0", amax_floor=1e-4, pow2="bits"),
    # upstream's quantize_mxfp8_cache: 2^-127 floor, FP32 log2 ceiling (the exact ceiling kept by name)
    QuantRule("window_host", "mxfp8", 32, "e8m0", pow2="log2"),
    QuantRule("window_host_exact", "mxfp8", 32, "e8m0"),
    QuantRule("compressed", "mxfp4", 16, "e4m3", scale_floor=2.0**-9),  # argmin: ties toward zero
    # upstream's E8M0 index path: FP32 log2 ceiling (the exact ceiling kept by name)
    QuantRule("index", "mxfp4", 32, "e8m0", scale_floor=2.0**-9, pow2="log2"),
    QuantRule("index_exact", "mxfp4", 32, "e8m0", scale_floor=2.0**-9),
    QuantRule("ced_mxfp8", "mxfp8", 32, "e8m0", amax_floor=1e-4, bf16_io=True),
    QuantRule("ced_kv_fp4", "mxfp4", 16, "e4m3", scale_floor=2.0**-9, tie="even", bf16_io=True),
    QuantRule("ced_index_fp4", "mxfp4", 32, "e8m0", scale_floor=2.0**-126, tie="even", bf16_io=True),
    QuantRule("compressed_even", "mxfp4", 16, "e4m3", scale_floor=2.0**-9, tie="even"),
    QuantRule("index_even", "mxfp4", 32, "e8m0", scale_floor=2.0**-9, tie="even", pow2="log2"),
)})


def rule(name: str | QuantRule) -> QuantRule:
    if isinstance(name, QuantRule):
        return name
    try:
        return RULES[name]
    except KeyError:
        raise CodecError("rule", None, f"one of {sorted(RULES)}", repr(name), SPEC) from None


@dataclass(frozen=True)
class MXTensor:
    """A quantized tensor: ``payload`` [..., D] float8_e4m3fn (MXFP8) or [..., D/2] uint8 (packed E2M1);
    ``scale`` [..., D/group] float8_e8m0fnu or float8_e4m3fn."""

    payload: torch.Tensor
    scale: torch.Tensor
    rule: str


# ---------------------------------------------------------------------------
# E8M0


def e8m0_decode(code: torch.Tensor, *, device: bool = False) -> torch.Tensor:
    """E8M0 code -> FP32 scale. Host: ``2^(code-127)`` with 255 = NaN. Device: reinterpret
    ``max(code << 23, 0x00400000)`` as FP32 (code 0 -> 2^-127, 255 -> +inf). Spec: §2.2."""
    c = code.view(torch.uint8).to(torch.int32) if code.dtype != torch.uint8 else code.to(torch.int32)
    if device:
        return torch.clamp_min(c << 23, 0x00400000).view(torch.float32)
    value = torch.ldexp(torch.ones_like(c, dtype=torch.float32), c - 127)
    return torch.where(c == E8M0_NAN, torch.full_like(value, float("nan")), value)


def e8m0_encode(scale: torch.Tensor) -> torch.Tensor:
    """Power-of-two FP32 scale -> E8M0 code (uint8): ``round(log2 s).clamp(-127, 127) + 127``; NaN/Inf -> 255."""
    s = scale.to(torch.float32)
    exp = torch.round(torch.log2(s.clamp_min(2.0**-149))).clamp(-127, 127).to(torch.int32) + 127
    return torch.where(torch.isfinite(s), exp, E8M0_NAN).to(torch.uint8)


def _ceil_pow2_exponent(v: torch.Tensor, method: str) -> torch.Tensor:
    """Exponent e of the E8M0 scale 2^e for v (v > 0, finite, FP32): the smallest power of two >= v for "frexp"
    and "bits"; ceil(log2(v)) evaluated in FP32 for "log2" (one below that for v = 2^k·(1 + 2^-23), k >= 4 or
    k <= -5; see QuantRule.pow2)."""
    if method == "log2":
        return torch.ceil(torch.log2(v.to(torch.float32))).to(torch.int64)
    if method == "bits":
        bits = v.to(torch.float32).view(torch.int32).to(torch.int64)
        return ((bits + 0x7FFFFF) >> 23) - 127
    mant, exp = torch.frexp(v.to(torch.float32))
    return exp.to(torch.int64) - (mant == 0.5).to(torch.int64)


# ---------------------------------------------------------------------------
# E2M1


def e2m1_encode(normalized: torch.Tensor, tie: str = "toward_zero") -> torch.Tensor:
    """Normalized values (already divided by the scale) -> 4-bit codes (uint8 0..15).

    Magnitude code = number of midpoints strictly below |v| (an exact midpoint goes toward
    zero); ``tie="even"`` moves an exact midpoint to the even code. Sign = signbit (bit 3),
    so -0 encodes as 8. Values beyond 6 saturate. Spec: §2.2, CQ-14.
    """
    if tie not in ("toward_zero", "even"):
        raise CodecError("tie", None, "'toward_zero' or 'even'", repr(tie), SPEC)
    v = normalized.to(torch.float32)
    mag = v.abs().clamp(max=6.0)
    mids = torch.tensor(FP4_MIDPOINTS, dtype=torch.float32)
    # bucketize(right=False) counts the midpoints strictly below |v|: exact midpoints stay low.
    code = torch.bucketize(mag, mids, out_int32=True)
    if tie == "even":
        on_mid = mids[code.clamp(max=len(FP4_MIDPOINTS) - 1)] == mag
        code = code + (on_mid & (code % 2 == 1)).to(code.dtype)
    return (code | (torch.signbit(v).to(code.dtype) << 3)).to(torch.uint8)


def e2m1_decode(codes: torch.Tensor) -> torch.Tensor:
    table = torch.tensor(FP4_VALUES + tuple(-x for x in FP4_VALUES), dtype=torch.float32)
    return table[codes.to(torch.long)]


def pack_fp4(codes: torch.Tensor) -> torch.Tensor:
    """[..., D] codes -> [..., D/2] bytes, even element in the low nibble. Spec: §2.2."""
    c = codes.to(torch.uint8)
    return c[..., 0::2] | (c[..., 1::2] << 4)


def unpack_fp4(packed: torch.Tensor) -> torch.Tensor:
    """[..., D/2] bytes -> [..., D] codes."""
    p = packed.to(torch.uint8)
    return torch.stack((p & 0xF, p >> 4), dim=-1).flatten(-2)


# ---------------------------------------------------------------------------
# quantize / dequantize


def _groups(x: torch.Tensor, r: QuantRule) -> torch.Tensor:
    if x.ndim == 0 or x.shape[-1] % r.group:
        raise CodecError("x", None, f"a last dim divisible by the group size {r.group} (rule {r.name})",
                         f"shape {tuple(x.shape)}", SPEC)
    if not x.dtype.is_floating_point:
        raise CodecError("x", None, "a floating-point tensor", x.dtype, SPEC)
    if r.bf16_io and x.dtype != torch.bfloat16:
        x = x.to(torch.bfloat16)
    elif x.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        x = x.to(torch.float32)
    return x.unflatten(-1, (-1, r.group))


J_MAX = 36  # largest ceil(4|v|) a table holds: 4 * 6 * (amax/6) / E4M3(amax/6) stays below it


def _fp4_luts() -> dict[str, torch.Tensor]:
    """Packed-byte tables for pairs of E2M1 elements, derived from ``e2m1_encode`` (the one statement of
    the rounding rule).

    An element scaled by 4 (``s = 4*v``) is reduced to ``j = ceil(|s|)`` (0..J_MAX; values past 24
    saturate to code 7), its sign and, for the to-even rule, ``exact = (|s| == j)``. The E2M1 midpoints
    times 4 are integers, so every value of a class (j, exact, sign) gets the same code: the class is
    encoded through a representative, ``j/4`` when exact, ``(j - 0.5)/4`` otherwise. With N = J_MAX + 1,
    element index ``e`` is N + j (positive) or N - 1 - j (sign bit set, -0 included), times 2 plus
    ``exact`` for to-even. A pair (even element a, odd element b) maps to ``code(a) | code(b) << 4`` at
    ``e_a + K*e_b`` (K = 2N or 4N), so one gather both encodes and packs.
    """
    n = J_MAX + 1
    out = {}
    for tie, exact_flags in (("toward_zero", (None,)), ("even", (0, 1))):
        single = []
        for e in range(2 * n):
            neg, j = (e < n), (n - 1 - e if e < n else e - n)
            for exact in exact_flags:
                magnitude = j / 4 if exact in (None, 1) or j == 0 else (j - 0.5) / 4
                value = torch.tensor([-magnitude if neg else magnitude])  # -0.0 for the negative j = 0
                single.append(int(e2m1_encode(value, tie)[0]))
        t = torch.tensor(single, dtype=torch.int32)
        k = len(single)
        out[tie] = (t.repeat(k) | (t.repeat_interleave(k) << 4)).to(torch.uint8)
    return out


_FP4_PAIR = _fp4_luts()


def _e2m1_pack(y4: torch.Tensor, tie: str, sign_of: torch.Tensor | None = None) -> torch.Tensor:
    """Scaled-by-4 FP32 values [..., D] (|y4| <= J_MAX) -> packed E2M1 bytes [..., D/2]. Spec: §2.2.

    ``y4`` is consumed (modified in place). ``sign_of`` (default ``y4``) supplies the signs, so -0.0
    keeps its sign bit: ``copysign(j + 0.5, sign) + N - 0.5`` is the element index of ``_fp4_luts``.
    """
    sign_of = y4.clone() if sign_of is None else sign_of
    n = J_MAX + 1
    if tie == "even":
        quad = y4.abs_()
        j = quad.ceil()
        exact = torch.eq(quad, j).to(j.dtype)
        e = j.add_(0.5).copysign_(sign_of).add_(n - 0.5).mul_(2.0).add_(exact)
        k = 4.0 * n
        pairs = e.unflatten(-1, (-1, 2))
        flat = pairs[..., 0].add(pairs[..., 1], alpha=k).to(torch.int32)
    else:
        e = y4.abs_().ceil_().add_(0.5).copysign_(sign_of)  # +-(j + 0.5), in place
        k = 2.0 * n
        pairs = e.unflatten(-1, (-1, 2))
        # (a + N - 0.5) + K (b + N - 0.5) is a non-negative integer
        flat = pairs[..., 0].add(pairs[..., 1], alpha=k).add_((n - 0.5) * (1 + k)).to(torch.int32)
    return _FP4_PAIR[tie].index_select(0, flat.reshape(-1)).reshape(flat.shape)


BLOCK_ELEMENTS = 1 << 19  # rows are quantized in blocks of about this many elements (cache-sized temporaries)


@operator(returns='MXTensor(payload, scale, rule)', spec='§2.2')
def mx_quantize(x: torch.Tensor, rule_name: str | QuantRule) -> MXTensor:
    """Quantize ``x`` [..., D] with the named rule. Spec: §2.2.

    Groups never cross rows, so large inputs are split into row blocks that are quantized concurrently
    (torch releases the GIL) with cache-sized temporaries; the result is identical to one pass.
    """
    r = rule(rule_name)
    _groups(x, r)  # validate the whole input before splitting it
    width = x.shape[-1]
    rows = x.reshape(-1, width) if x.numel() else x.reshape(0, width)
    per_block = max(1, BLOCK_ELEMENTS // max(width, 1))
    if rows.shape[0] < 2 * per_block:
        return _quantize_rows(x, r)
    blocks = list(workers.pool().map(lambda i: _quantize_rows(rows[i:i + per_block], r),
                              range(0, rows.shape[0], per_block)))
    lead = tuple(x.shape[:-1])
    payload = torch.cat([b.payload for b in blocks]).reshape(*lead, -1)
    scale = torch.cat([b.scale for b in blocks]).reshape(*lead, -1)
    return MXTensor(payload, scale, r.name)


def _quantize_rows(x: torch.Tensor, r: QuantRule) -> MXTensor:
    g = _groups(x, r).float()
    amax = g.abs().amax(-1, keepdim=True)  # NaN propagates; +-Inf gives inf (vector_norm(inf) is ~20x slower)
    poisoned = ~torch.isfinite(amax)
    any_poison = bool(poisoned.any())
    if any_poison:
        amax = torch.where(poisoned, torch.zeros_like(amax), amax)
        g = torch.where(poisoned, torch.zeros((), dtype=g.dtype), g)
    amax = amax.clamp_min(r.amax_floor)
    if r.scale_format == "e8m0":
        raw = torch.maximum(amax / r.qmax, torch.tensor(r.scale_floor, dtype=torch.float32))
        exp = _ceil_pow2_exponent(raw, r.pow2).clamp(-127, 127)
        # E2M1 is encoded from 4*v (see _e2m1_pack): fold the 4 into the exact power-of-two reciprocal
        # unless 2^(2-exp) would overflow FP32 (only the CED 2^-126 floor gets there)
        shift = 2 if r.fmt == "mxfp4" and bool((exp > -126).all()) else 0
        inv = torch.ldexp(torch.ones_like(raw), (shift - exp).to(torch.int32))
        scale_code = (exp + 127).to(torch.uint8)
        if any_poison:
            scale_code = torch.where(poisoned, E8M0_NAN, scale_code).to(torch.uint8)
        scale = scale_code.squeeze(-1).view(torch.float8_e8m0fnu)
        # a covering power-of-two scale: |y| <= qmax, no clamp needed; log2's one-ulp-short scale lets |y| pass qmax
        # by a few ulps, where the FP32 -> E4M3 cast saturates (448) and the E2M1 tables saturate (6), as upstream's
        # clamp does
        y = g * inv
        if r.fmt == "mxfp4" and not shift:
            y.mul_(4.0)
    else:
        raw = (amax / r.qmax).clamp_min(r.scale_floor).clamp(max=r.e4m3_scale_max)
        stored = raw.to(torch.float8_e4m3fn)
        bits = stored.view(torch.uint8)
        if any_poison:
            bits = torch.where(poisoned, E4M3_NAN, bits.to(torch.int32)).to(torch.uint8)
        scale = bits.squeeze(-1).view(torch.float8_e4m3fn)
        # E4M3 may round below amax/qmax, so values saturate at +-6. g / (s/4) == 4 * (g/s) exactly
        # (s >= 2^-9, so s/4 stays normal), which folds the 4*v of _e2m1_pack into the division.
        k = 4.0 if r.fmt == "mxfp4" else 1.0
        y = g / (stored.to(torch.float32) / k)
        # Saturate at +-qmax. FP4 codes saturate in the tables up to J_MAX, so the clamp pass is needed
        # only when some group's |y| could pass it (the 448 scale clamp, or E4M3 rounding far below raw).
        unclamped = (amax / r.qmax).clamp_min(r.scale_floor)
        if r.fmt != "mxfp4" or bool((k * r.qmax * unclamped / stored.to(torch.float32) > J_MAX).any()):
            y.clamp_(-k * r.qmax, k * r.qmax)
    if y.dtype != torch.float32:
        y = y.float()
    if r.fmt == "mxfp8":
        qb = y.to(torch.float8_e4m3fn).view(torch.uint8)
        if any_poison:
            qb = torch.where(poisoned, torch.tensor(E4M3_NAN, dtype=torch.uint8), qb)
        payload = qb.flatten(-2).view(torch.float8_e4m3fn)
    else:
        payload = _e2m1_pack(y, r.tie, sign_of=g).flatten(-2)  # g and y share signs (scale > 0)
    return MXTensor(payload.contiguous(), scale.contiguous(), r.name)


def scale_values(q: MXTensor, *, device: bool = True) -> torch.Tensor:
    """Per-group FP32 scales [..., D/group] (E8M0 decoded with the device rule by default)."""
    r = rule(q.rule)
    if r.scale_format == "e8m0":
        return e8m0_decode(q.scale.view(torch.uint8), device=device)
    return q.scale.to(torch.float32)


@operator(returns='[..., D] decoded values', spec='§2.2')
def mx_dequantize(q: MXTensor, *, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Decode to ``dtype``: element = payload value * its group scale; NaN groups decode to NaN."""
    r = rule(q.rule)
    scale = scale_values(q)
    if r.scale_format == "e8m0":
        scale = torch.where(q.scale.view(torch.uint8) == E8M0_NAN, torch.full_like(scale, float("nan")), scale)
    values = q.payload.to(torch.float32) if r.fmt == "mxfp8" else e2m1_decode(unpack_fp4(q.payload))
    out = (values.unflatten(-1, (-1, r.group)) * scale.unsqueeze(-1)).flatten(-2)
    if r.bf16_io:
        out = out.to(torch.bfloat16)
    return out.to(dtype)


def quant_dequant(x: torch.Tensor, rule_name: str | QuantRule, *, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return mx_dequantize(mx_quantize(x, rule_name), dtype=dtype)


def half_step(normalized_q: torch.Tensor, fmt: str) -> torch.Tensor:
    """Half the quantization step around a decoded payload value (in units of the scale)."""
    m = normalized_q.abs().to(torch.float32)
    if fmt == "mxfp4":
        return torch.where(m < 2.0, 0.25, torch.where(m < 4.0, 0.5, 1.0))
    # E4M3: 3 mantissa bits; subnormal step 2^-9 below 2^-6
    exp = torch.floor(torch.log2(m.clamp_min(2.0**-6)))
    return torch.ldexp(torch.ones_like(m), (exp - 4).to(torch.int32))
