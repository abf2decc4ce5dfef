"""MX codec contracts: scales, rounding bounds, re-quantization, nibble order, tie rules and special
values, against the backend's ``mx_quantize`` / ``mx_dequantize``. Spec: §2.2.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from contracts.separation import separates
from contracts.strategies import mx_cases
from kernels.quant import FP4_MIDPOINTS, RULES, e8m0_decode, half_step, unpack_fp4
from pto_pytest.defect import SeededDefect, shared
from pto_pytest.plugin import op

RULE_NAMES = sorted(RULES)
CACHE_RULES = ("window", "window_host", "compressed", "index")


def _scales(q, r) -> torch.Tensor:
    if r.scale_format == "e8m0":
        return e8m0_decode(q.scale.view(torch.uint8), device=True)
    return q.scale.to(torch.float32)


def test_e8m0_host_and_device_decode_agree():
    """Codes 0..254 decode to 2^(code-127) on both paths (code 0 = 2^-127 on the device); 255 is NaN/inf."""
    codes = torch.arange(256, dtype=torch.uint8)
    host, dev = e8m0_decode(codes), e8m0_decode(codes, device=True)
    from contracts.separation import separates

    want = separates("E8M0 code c decodes to 2^(c - 127)",
                     torch.tensor([math.ldexp(1.0, c - 127) for c in range(255)], dtype=torch.float32),
                     bias_128=torch.tensor([math.ldexp(1.0, c - 128) for c in range(255)], dtype=torch.float32),
                     code_0_as_zero=torch.tensor([0.0] + [math.ldexp(1.0, c - 127) for c in range(1, 255)]))
    assert torch.equal(host[:255], want) and torch.equal(dev[:255], want)
    assert float(dev[0]) == 2.0**-127 and math.isnan(float(host[255])) and math.isinf(float(dev[255]))


# Hand-computed from spec §2.2 (not produced by the code): first payload byte of a group whose last
# element is 6.0 (so the scale is exactly 1) and whose first two elements are (a, b):
# byte = code(a) | code(b) << 4, sign in bit 3, E2M1 codes 0..7 = 0, .5, 1, 1.5, 2, 3, 4, 6.
NIBBLE_VECTORS = [
    ((0.5, -1.0), "index", 0xA1),  # 1 | (8|2)<<4
    ((-0.0, 0.0), "index", 0x08),  # -0 encodes as 8 in the low nibble
    ((1.5, 3.0), "index", 0x53),
    ((6.0, -6.0), "compressed", 0xF7),
    ((0.75, 1.75), "index", 0x31),  # midpoints toward zero: codes 1, 3
    ((0.75, 1.75), "index_even", 0x42),  # midpoints to even: codes 2, 4
    ((3.5, -0.75), "compressed", 0x95),  # 5 | (8|1)<<4
    ((3.5, -0.75), "compressed_even", 0xA6),  # 6 | (8|2)<<4
    ((2.5, -5.0), "index", 0xE4),  # 2.5 -> code 4 and 5.0 -> code 6 under both rules
]


@pytest.mark.parametrize("pair, rule_name, byte", NIBBLE_VECTORS, ids=[f"{p}-{r}" for p, r, _ in NIBBLE_VECTORS])
@pytest.mark.operators("mx_quantize")
def test_fp4_nibble_order_hand_vectors(backend, pair, rule_name, byte):
    r = RULES[rule_name]
    x = torch.zeros((1, r.group))
    x[0, 0], x[0, 1], x[0, -1] = pair[0], pair[1], 6.0
    q = op(backend, "mx_quantize")(x, rule_name)
    got = int(q.payload.view(torch.uint8)[0, 0])
    assert got == byte, f"{rule_name} {pair}: payload[0][0] = 0x{got:02x}, expected 0x{byte:02x} (§2.2 nibble order)"
    last = int(q.payload.view(torch.uint8)[0, -1])
    assert last == 0x70, f"{rule_name}: last byte 0x{last:02x}, expected 0x70 (6.0 in the high nibble)"


@pytest.mark.operators("mx_quantize")
def test_mxfp8_hand_vector(backend):
    """[1, -2, 448, 0...]: amax 448 -> scale 2^0 (E8M0 127); E4M3 bytes 0x38, 0xC0, 0x7E."""
    from contracts.separation import separates

    x = torch.zeros((1, 32))
    x[0, :3] = torch.tensor([1.0, -2.0, 448.0])
    v = x[0, :3]
    separates("E4M3 (fn) payload bytes", v.to(torch.float8_e4m3fn).view(torch.uint8),
              e5m2=v.to(torch.float8_e5m2).view(torch.uint8), e4m3_fnuz=v.to(torch.float8_e4m3fnuz).view(torch.uint8),
              scale_one_power_up=(v / 2).to(torch.float8_e4m3fn).view(torch.uint8))
    for name in ("window", "window_host"):
        q = op(backend, "mx_quantize")(x, name)
        assert q.payload.view(torch.uint8)[0, :3].tolist() == [0x38, 0xC0, 0x7E], name
        assert q.scale.view(torch.uint8).tolist() == [[127]], name


@pytest.mark.parametrize("rule_name", RULE_NAMES)
@given(case=st.data())
@pytest.mark.operators("mx_quantize")
def test_scales_are_powers_of_two_and_cover_amax(backend, rule_name, case):
    """E8M0 scales are powers of two with scale*qmax >= amax (floors aside); E4M3 scales are the nearest
    E4M3 of clamp(max(amax/6, 2^-9), 448). Spec: §2.2."""
    r = RULES[rule_name]
    x = case.draw(mx_cases(group=r.group)).tensor()
    q = op(backend, "mx_quantize")(x, rule_name)
    xs = (x.to(torch.bfloat16) if r.bf16_io else x).float().unflatten(-1, (-1, r.group))
    amax = xs.abs().amax(-1)
    s = _scales(q, r)
    if r.scale_format == "e8m0":
        mant, _ = torch.frexp(s)
        # the log2 rules (upstream's host goldens) may fall short by the FP32 rounding of log2 (see RULE_VECTORS E/F)
        cover = amax * (1 - 2.0**-16) if r.pow2 == "log2" else amax
        bad = (mant != 0.5) | ~(s * r.qmax >= cover)
        if bool(bad.any()):
            i = tuple(int(v) for v in bad.nonzero()[0])
            raise AssertionError(f"{rule_name} scale{list(i)} = {float(s[i])!r} does not cover amax {float(amax[i])!r}"
                                 f" (needs a power of two >= amax/{r.qmax})")
    else:
        raw = (amax / 6).clamp_min(r.scale_floor).clamp(max=448.0)
        want = raw.to(torch.float8_e4m3fn).float()
        bad = s != want
        if bool(bad.any()):
            i = tuple(int(v) for v in bad.nonzero()[0])
            raise AssertionError(f"{rule_name} scale{list(i)} = {float(s[i])}, expected E4M3({float(raw[i])}) = "
                                 f"{float(want[i])}")


@pytest.mark.parametrize("rule_name", RULE_NAMES)
@given(case=st.data())
@pytest.mark.operators("mx_dequantize", "mx_quantize")
def test_dequantized_within_half_step(backend, rule_name, case):
    """Every decoded element is within half a quantization step (times its group scale) of the input;
    only E4M3-scaled groups may saturate, at 6 x the spec's E4M3 scale. Spec: §2.2."""
    r = RULES[rule_name]
    x = case.draw(mx_cases(group=r.group)).tensor()
    q = op(backend, "mx_quantize")(x, rule_name)
    d = op(backend, "mx_dequantize")(q).float()
    xs = (x.to(torch.bfloat16) if r.bf16_io else x).float().unflatten(-1, (-1, r.group))
    s = _scales(q, r).unsqueeze(-1)
    dq = d.unflatten(-1, (-1, r.group))
    if r.scale_format == "e8m0":
        clamped = xs  # a covering power-of-two scale never saturates
    else:  # the spec's E4M3 scale may round below amax/6: saturation at 6*E4M3(clamp(amax/6, 2^-9, 448))
        raw = (xs.abs().amax(-1, keepdim=True) / 6).clamp_min(r.scale_floor).clamp(max=448.0)
        limit = 6 * raw.to(torch.float8_e4m3fn).float()
        clamped = torch.maximum(torch.minimum(xs, limit), -limit)
    bound = half_step(dq / s, r.fmt) * s
    if r.bf16_io:
        bound = bound + dq.abs() * 2.0**-8  # output rounded back to BF16
    err = (dq.double() - clamped.double()).abs()
    bad = ~(err <= bound.double())
    if bool(bad.any()):
        i = tuple(int(v) for v in bad.nonzero()[0])
        raise AssertionError(f"{rule_name} element [{i[0]}][{i[1] * r.group + i[2]}]: decoded {float(dq[i])!r}, input "
                             f"{float(xs[i])!r}, error {float(err[i]):.6g} > half step {float(bound[i]):.6g} "
                             f"(scale {float(s[i[:-1]][0]):.6g})")


E8M0_RULES = sorted(n for n, r in RULES.items() if r.scale_format == "e8m0")


@pytest.mark.parametrize("rule_name", E8M0_RULES)
@given(case=st.data())
@pytest.mark.operators("mx_dequantize", "mx_quantize")
def test_requantization_is_stable(backend, rule_name, case):
    """quant(dequant(quant(x))) decodes to exactly dequant(quant(x)); its bytes equal quant(x) except in
    groups where the re-encoding picks a smaller scale (amax landed on a power-of-two boundary after
    rounding), never a larger one. E8M0 rules only: with E4M3 scales (compressed KV) the re-derived
    scale amax'/6 need not divide the decoded values, so re-publishing a decoded compressed cache is
    lossy (bounded by the half-step contract). Spec: §2.2."""
    r = RULES[rule_name]
    x = case.draw(mx_cases(group=r.group)).tensor()
    quantize, dequantize = op(backend, "mx_quantize"), op(backend, "mx_dequantize")
    q1 = quantize(x, rule_name)
    v1 = dequantize(q1).float()
    q2 = quantize(v1, rule_name)
    v2 = dequantize(q2).float()
    same = (v1 == v2) | (v1.isnan() & v2.isnan())
    if not bool(same.all()):
        i = tuple(int(v) for v in (~same).nonzero()[0])
        raise AssertionError(f"{rule_name} element {list(i)}: re-quantized value {float(v2[i])} != {float(v1[i])}")
    s1, s2 = _scales(q1, r), _scales(q2, r)
    p1 = q1.payload.view(torch.uint8).unflatten(-1, (s1.shape[-1], -1))
    p2 = q2.payload.view(torch.uint8).unflatten(-1, (s1.shape[-1], -1))
    changed = (p1 != p2).any(-1) | (q1.scale.view(torch.uint8) != q2.scale.view(torch.uint8))
    grew = changed & ~(s2 < s1)
    if bool(grew.any()):
        i = tuple(int(v) for v in grew.nonzero()[0])
        raise AssertionError(f"{rule_name} group {list(i)}: bytes changed on re-quantization without a smaller "
                             f"scale ({float(s1[i])} -> {float(s2[i])})")


@pytest.mark.parametrize("fmt_rules", [("index", "index_even"), ("compressed", "compressed_even")], ids=str)
@given(exp=st.integers(-8, 8), data=st.data())
@pytest.mark.operators("mx_quantize")
def test_tie_rules_differ_exactly_on_midpoints(backend, fmt_rules, exp, data):
    """Toward-zero and to-even agree everywhere except exact midpoints 0.75, 1.75 and 3.5 (x scale),
    where to-even takes the next code. Spec: §2.2, upstream_checks CQ-14 / C-6."""
    tz, ev = fmt_rules
    group = RULES[tz].group
    scale = 2.0**exp if RULES[tz].scale_format == "e8m0" else 1.0
    off_grid = data.draw(st.lists(st.floats(0, 6, allow_nan=False, width=32), min_size=group - 1, max_size=group - 1), label='off_grid')
    mids = list(FP4_MIDPOINTS) + [-m for m in FP4_MIDPOINTS]
    values = torch.tensor(mids + off_grid, dtype=torch.float32)[: 2 * group - 1]
    rows = []
    for start in range(0, values.numel(), group - 1):
        row = torch.zeros(group)
        chunk = values[start:start + group - 1]
        row[: chunk.numel()] = chunk
        row[-1] = 6.0
        rows.append(row)
    x = torch.stack(rows) * scale
    quantize = op(backend, "mx_quantize")
    ct = unpack_fp4(quantize(x, tz).payload)
    ce = unpack_fp4(quantize(x, ev).payload)
    mag = (x / scale).abs()
    expect_diff = (mag == 0.75) | (mag == 1.75) | (mag == 3.5)
    got_diff = ct != ce
    if not torch.equal(got_diff, expect_diff):
        i = tuple(int(v) for v in (got_diff != expect_diff).nonzero()[0])
        raise AssertionError(f"value {float(x[i])} (= {float(mag[i])} x scale): codes {int(ct[i])} (toward zero) vs "
                             f"{int(ce[i])} (even); they must differ exactly on the midpoints 0.75, 1.75, 3.5")
    assert torch.equal((ce - ct)[expect_diff], torch.ones_like(ce[expect_diff])), "to-even must take the next code"
    want_tz = {0.25: 0, 0.75: 1, 1.25: 2, 1.75: 3, 2.5: 4, 3.5: 5, 5.0: 6}
    for m, code in want_tz.items():
        pos = (mag == m) & (x > 0)
        assert bool((ct[pos] == code).all()), f"{tz}: midpoint {m} -> {ct[pos].tolist()}, expected code {code}"


@pytest.mark.parametrize("rule_name", CACHE_RULES)
@pytest.mark.parametrize("special", ["nan", "inf", "-inf"])
@pytest.mark.operators("mx_dequantize", "mx_quantize")
def test_non_finite_poisons_its_group_only(backend, rule_name, special):
    """NaN/Inf never becomes a finite code: its group's scale is the NaN code and decodes to NaN; the
    other groups are unaffected."""
    r = RULES[rule_name]
    x = torch.randn((2, 2 * r.group))
    x[1, r.group + 3] = float(special)
    q = op(backend, "mx_quantize")(x, rule_name)
    d = op(backend, "mx_dequantize")(q)
    assert bool(d[1, r.group:].isnan().all()), f"{rule_name}: group with {special} decodes to finite values"
    nan_code = 0xFF if r.scale_format == "e8m0" else 0x7F
    assert int(q.scale.view(torch.uint8)[1, 1]) == nan_code
    assert bool(torch.isfinite(d[0]).all()) and bool(torch.isfinite(d[1, : r.group]).all())


@pytest.mark.parametrize("rule_name", CACHE_RULES)
@pytest.mark.operators("mx_dequantize", "mx_quantize")
def test_zero_subnormal_and_huge_groups(backend, rule_name):
    """Zero groups decode to (signed) zeros; subnormal and huge (1e37) finite groups decode finite.
    (Above ~2^127 an E8M0 group can decode past FP32: 4 x 2^126 = 2^128 -> inf; see the next test.)"""
    r = RULES[rule_name]
    x = torch.zeros((3, r.group))
    x[0, 1] = -0.0
    x[1] = torch.linspace(-1, 1, r.group) * 1e-40
    x[2] = torch.linspace(-1, 1, r.group) * 1e37
    q = op(backend, "mx_quantize")(x, rule_name)
    d = op(backend, "mx_dequantize")(q)
    assert bool((d[0] == 0).all()) and bool(torch.signbit(d[0, 1])), f"{rule_name}: -0.0 lost its sign"
    assert bool(torch.isfinite(d).all()), f"{rule_name}: finite input decoded to non-finite"
    if r.fmt == "mxfp8":
        rel = float((d[2].double() - x[2].double()).norm() / x[2].double().norm())
        assert rel < 0.05, f"{rule_name}: huge group relative error {rel}"


@pytest.mark.operators("mx_dequantize", "mx_quantize")
def test_e8m0_fp4_decode_can_overflow_fp32(backend):
    """Documented edge: +-3e38 in an index group gets scale 2^126 and code 4.0, decoding to -inf in FP32."""
    x = torch.linspace(-1, 1, 32).reshape(1, 32) * 3e38
    q = op(backend, "mx_quantize")(x, "index")
    d = op(backend, "mx_dequantize")(q)
    assert int(q.scale.view(torch.uint8)[0, 0]) == 126 + 127
    assert float(d[0, 0]) == float("-inf") and float(d[0, -1]) == float("inf")
    assert bool(torch.isfinite(d[0, 1:-1]).all())


@pytest.mark.parametrize("rule_name", CACHE_RULES)
@pytest.mark.operators("mx_quantize")
def test_codec_rejects_bad_input(backend, rule_name):
    """A width not divisible by the group, an integer tensor or an unknown rule raise a ValueError naming it."""
    r = RULES[rule_name]
    quantize = op(backend, "mx_quantize")
    with pytest.raises(ValueError, match=rf"divisible by the group size {r.group}"):
        quantize(torch.randn(2, r.group + 1), rule_name)
    with pytest.raises(ValueError, match="floating-point"):
        quantize(torch.ones(2, r.group, dtype=torch.int32), rule_name)
    with pytest.raises(ValueError, match="rule"):
        quantize(torch.randn(2, r.group), rule_name + "_nope")


def test_e8m0_encode_inverts_decode():
    """encode(2^(c-127)) = c for every finite code; NaN and Inf encode as the NaN code 255. Spec: §2.2."""
    from kernels.quant import e8m0_encode

    codes = torch.arange(255, dtype=torch.uint8)
    assert torch.equal(e8m0_encode(e8m0_decode(codes)), codes)
    special = e8m0_encode(torch.tensor([float("nan"), float("inf"), float("-inf")]))
    assert special.tolist() == [255, 255, 255]
    # non-finite -> the NaN code, separated from an Inf that saturates to the largest finite code (254) and from a
    # sign-aware reading that sends -Inf to the smallest code (0); the round trip above is an identity, not a rule
    separates("§2.2 E8M0 encodes every non-finite as NaN", torch.tensor([255, 255, 255], dtype=special.dtype),
              inf_saturates=torch.tensor([255, 254, 254], dtype=special.dtype),
              negative_inf_to_zero_code=torch.tensor([255, 255, 0], dtype=special.dtype))


@pytest.mark.parametrize("rule_name", RULE_NAMES)
@pytest.mark.operators("mx_quantize")
def test_blocked_quantization_equals_one_pass(rule_name, monkeypatch):
    """Large inputs are quantized in concurrent row blocks; the bytes equal a single pass."""
    from kernels import quant

    r = RULES[rule_name]
    g = torch.Generator().manual_seed(3)
    # 210 rows in blocks of 4 rows: 53 blocks, the last one short (2 rows), a NaN and a -0 in middle blocks
    x = (torch.randn((3, 70, 2 * r.group), generator=g) * 3).to(torch.bfloat16)
    x[1, 5, 0], x[2, 9, 1] = float("nan"), -0.0
    monkeypatch.setattr(quant, "BLOCK_ELEMENTS", 4 * r.group * 2)  # many small blocks
    blocked = quant.mx_quantize(x, rule_name)
    monkeypatch.setattr(quant, "BLOCK_ELEMENTS", 1 << 40)
    whole = quant.mx_quantize(x, rule_name)
    assert blocked.payload.shape == whole.payload.shape and blocked.scale.shape == whole.scale.shape
    assert torch.equal(blocked.payload.view(torch.uint8), whole.payload.view(torch.uint8))
    assert torch.equal(blocked.scale.view(torch.uint8), whole.scale.view(torch.uint8))


# ---------------------------------------------------------------------------
# Every rounding variant of RULES pinned by hand (spec §2.2; not produced by the code). Each probe is one
# group: element values, then the expected scale byte and the leading payload bytes (the rest are 0x00).
#   A  [2^-20, 0...]         the 1e-4 amax floor: window/ced_mxfp8 raw = 1e-4/448 -> 2^-22 (E8M0 105 = 0x69),
#                            payload 2^-20/2^-22 = 4.0 -> E4M3 0x48; window_host raw = 2^-20/448 -> 2^-28
#                            (0x63), payload 256 -> E4M3 0x78.
#   B  [1.0625+2^-12, 448..] BF16 double rounding: FP32 input rounds up to E4M3 1.125 (0x39); the CED rules
#                            first round to BF16 1.0625, an exact E4M3 midpoint, which goes to even 1.0 (0x38).
#                            448 -> 0x7E; amax 448 -> scale 2^0 (0x7F).
#   C  [0.75, 1.25+2^-10, 6, 0...] E2M1 ties: 0.75 is a midpoint (toward zero: code 1, even: code 2);
#                            1.25+2^-10 is above the 1.25 midpoint (code 3) unless BF16 input rounding moves it
#                            onto it, where to-even gives code 2. 6 -> code 7. Low nibble first: toward zero
#                            0x31 0x07, even 0x32 0x07, CED 0x22 0x07. amax 6: E4M3 scale 1.0 (0x38) or E8M0 0x7F.
#   D  [2^-20, 0...]         the FP4 scale floor: index/index_even raw = max(2^-20/6, 2^-9) = 2^-9 (0x76), payload
#                            2^-11 -> code 0; ced_index_fp4 floors at 6*2^-126/6: raw 2^-20/6 -> 2^-22 (0x69),
#                            payload 4.0 -> code 6 (0x06).
#   E  [7 + 2^-21, 0...]     one FP32 ulp above a power of two: amax/448 = 2^-6·(1 + 2^-23). Upstream's host
#                            rule ceil(log2(.)) in FP32 gives -6 (log2 rounds to -6.0): scale 2^-6 (0x79),
#                            payload 448.00003 saturates to 448 (0x7E). The exact ceiling (window_host_exact, the
#                            device's bit trick) gives 2^-5 (0x7A), payload 224 (0x76). The CED rules round the
#                            input to BF16 first (7.0): amax/448 = 2^-6 exactly, 0x79 and 0x7E.
#   F  [0.1875 + 2^-26, 0...] the same for the E8M0 FP4 index path: amax/6 = 2^-5·(1 + 2^-23). log2 ceiling: scale
#                            2^-5 (0x7A), normalized 6.0000005 saturates to 6 (code 7); exact ceiling: 2^-4
#                            (0x7B), normalized 3.0000002 -> code 5; CED (BF16 input 0.1875): 0x7A, code 7.
#   G  [5·2^-12, 0...]       the FP4 scale floor of the E4M3 rules (CQ-13 2^-9; CQ-17 kv_fp4's amax floor 6·2^-9):
#                            raw = max(5·2^-12/6, 2^-9) = 2^-9, the smallest E4M3 subnormal (0x01); payload
#                            0.625 -> code 1 (0.5; not a tie). A floor of 2^-7 gives scale 0x04 and code 0 (0.156);
#                            no floor, a raw scale below every E4M3 value.
_A, _B = [2.0**-20], [1.0625 + 2.0**-12, 448.0]
_C, _D = [0.75, 1.25 + 2.0**-10, 6.0], [2.0**-20]
_E, _F = [7.0 + 2.0**-21], [0.1875 + 2.0**-26]
_G = [5 * 2.0**-12]
RULE_VECTORS: dict[str, list[tuple[list[float], int, list[int]]]] = {
    "window": [(_A, 0x69, [0x48]), (_B, 0x7F, [0x39, 0x7E]), (_E, 0x7A, [0x76])],
    "window_host": [(_A, 0x63, [0x78]), (_B, 0x7F, [0x39, 0x7E]), (_E, 0x79, [0x7E])],
    "window_host_exact": [(_A, 0x63, [0x78]), (_B, 0x7F, [0x39, 0x7E]), (_E, 0x7A, [0x76])],
    "ced_mxfp8": [(_A, 0x69, [0x48]), (_B, 0x7F, [0x38, 0x7E]), (_E, 0x79, [0x7E])],
    "compressed": [(_C, 0x38, [0x31, 0x07]), (_G, 0x01, [0x01])],
    "compressed_even": [(_C, 0x38, [0x32, 0x07]), (_G, 0x01, [0x01])],
    "ced_kv_fp4": [(_C, 0x38, [0x22, 0x07]), (_G, 0x01, [0x01])],
    "index": [(_C, 0x7F, [0x31, 0x07]), (_D, 0x76, [0x00]), (_F, 0x7A, [0x07])],
    "index_exact": [(_C, 0x7F, [0x31, 0x07]), (_D, 0x76, [0x00]), (_F, 0x7B, [0x05])],
    "index_even": [(_C, 0x7F, [0x32, 0x07]), (_D, 0x76, [0x00]), (_F, 0x7A, [0x07])],
    "ced_index_fp4": [(_C, 0x7F, [0x22, 0x07]), (_D, 0x69, [0x06]), (_F, 0x7A, [0x07])],
}


def rule_probe(rule_name: str) -> tuple[torch.Tensor, list[int], list[list[int]]]:
    """(probe rows [n, group], expected scale byte per row, expected payload bytes per row) of a rule."""
    r = RULES[rule_name]
    rows, scales, payloads = [], [], []
    width = r.group if r.fmt == "mxfp8" else r.group // 2
    for values, scale, lead in RULE_VECTORS[rule_name]:
        row = torch.zeros(r.group)
        row[: len(values)] = torch.tensor(values, dtype=torch.float64).float()
        rows.append(row)
        scales.append(scale)
        payloads.append(lead + [0] * (width - len(lead)))
    return torch.stack(rows), scales, payloads


def test_rule_vectors_cover_every_rule_and_separate_each_pair():
    """The hand vectors name every rule, and for every pair of rules some probe's expected bytes differ
    (so swapping the two rules fails ``test_each_rule_matches_its_hand_vectors``)."""
    assert set(RULE_VECTORS) == set(RULES), f"rules without hand vectors: {sorted(set(RULES) - set(RULE_VECTORS))}"
    for a in RULES:
        for b in RULES:
            if a == b:
                continue
            xa, sa, pa = rule_probe(a)
            q = RULE_VECTORS[b]
            same_shape = RULES[a].fmt == RULES[b].fmt and RULES[a].group == RULES[b].group
            if same_shape:  # the same probes apply to both rules: some expected byte must differ
                _xb, sb, pb = rule_probe(b)
                assert len(q) == len(RULE_VECTORS[a]) and (sa != sb or pa != pb), f"{a} and {b} are not separated"


@pytest.mark.parametrize("rule_name", RULE_NAMES)
@pytest.mark.operators("mx_quantize")
def test_each_rule_matches_its_hand_vectors(backend, rule_name):
    """The backend's bytes for each rule equal the hand-computed probes that separate it from every other
    rule: the amax floor (window vs window_host), BF16 double rounding (CED vs device/host), E2M1 ties
    (toward zero vs even) and the FP4 scale floor (index vs ced_index_fp4). Spec: §2.2, CQ-12/13/14/17."""
    x, scales, payloads = rule_probe(rule_name)
    q = op(backend, "mx_quantize")(x, rule_name)
    got_p = q.payload.view(torch.uint8).reshape(x.shape[0], -1).tolist()
    got_s = q.scale.view(torch.uint8).reshape(x.shape[0], -1)[:, 0].tolist()
    for i in range(x.shape[0]):
        assert got_s[i] == scales[i] and got_p[i] == payloads[i], (
            f"{rule_name} probe {i} {RULE_VECTORS[rule_name][i][0]}: scale 0x{got_s[i]:02x}, payload "
            f"{[f'0x{b:02x}' for b in got_p[i][:3]]}; expected scale 0x{scales[i]:02x}, payload "
            f"{[f'0x{b:02x}' for b in payloads[i][:3]]} (§2.2)")


@pytest.mark.parametrize("probe, qmax, rules", [(_E, 448.0, ("window_host", "window_host_exact")),
                                               (_F, 6.0, ("index", "index_exact"))], ids=["E-mxfp8", "F-fp4-index"])
def test_the_ulp_probes_separate_the_log2_ceiling_from_the_exact_one(probe, qmax, rules):
    """Probes E and F, computed here apart from the code: amax/qmax in FP32 is 2^k·(1 + 2^-23); the exact
    power-of-two ceiling (a Fraction) is 2^(k+1), upstream's ceil(log2(.)) evaluated in FP32 (log2 correctly
    rounded to FP32, here from float64 through numpy's float32) is 2^k. The two rules' hand-vector scale bytes are
    127 + each exponent, so the probe separates them. Spec: §2.2; docs/upstream.md."""
    import math
    from fractions import Fraction

    import numpy as np

    raw = np.float32(np.float32(probe[0]) / np.float32(qmax))
    k = math.floor(math.log2(float(raw)))
    assert Fraction(float(raw)) == Fraction(2) ** k * (1 + Fraction(1, 2**23)), "not one ulp above a power of two"
    exact = k + 1  # the smallest 2^e >= raw
    log2_fp32 = math.ceil(float(np.float32(math.log2(float(raw)))))
    assert (log2_fp32, exact) == (k, k + 1), (log2_fp32, exact)
    log2_rule, exact_rule = rules
    from contracts.separation import separates

    separates(f"{log2_rule}: ceil(log2) in FP32", torch.tensor(127 + log2_fp32), exact_ceiling=torch.tensor(127 + exact))
    assert RULE_VECTORS[log2_rule][-1][1] == 127 + log2_fp32 and RULE_VECTORS[exact_rule][-1][1] == 127 + exact


def _floor_moved(rule: str):
    """mx_quantize with one E4M3 FP4 rule's scale floor at 2^-7 instead of 2^-9 (the rule-table edit #47 names)."""
    from dataclasses import replace

    from kernels.quant import RULES, mx_quantize

    def run(x, rule_name):
        name = rule_name if isinstance(rule_name, str) else rule_name.name
        return mx_quantize(x, replace(RULES[name], scale_floor=2.0**-7) if name == rule else rule_name)
    return run


# defects of tests/defects these contracts must catch (shared with other contract files)
SEEDED_DEFECTS = [
    shared("quant:SWAPPED_NIBBLES", "test_fp4_nibble_order_hand_vectors", "nibble order"),
    shared("quant:ROUND_HALF_UP", "test_tie_rules_differ_exactly_on_midpoints", "midpoint"),
    shared("quant:ROUND_HALF_UP", "test_fp4_nibble_order_hand_vectors", "payload[0][0]"),
    shared("quant:SCALE_FLOOR", "test_scales_are_powers_of_two_and_cover_amax", "does not cover amax"),
    shared("quant:OFF_BY_ONE_GROUP", "test_dequantized_within_half_step", "half step"),
    shared("quant:E4M3_CLAMP_240", "test_scales_are_powers_of_two_and_cover_amax", "expected E4M3"),
    shared("quant:E4M3_CLAMP_240", "test_dequantized_within_half_step", "half step"),
    shared("quant:E8M0_BIAS_128", "test_mxfp8_hand_vector", "assert"),
    shared("quant:DEQUANT_HALF_SCALE", "test_requantization_is_stable", "re-quantized value"),
    shared("quant:HOST_EXACT_CEILING", "test_each_rule_matches_its_hand_vectors", "probe 2"),
    shared("quant:DEQUANT_HALF_SCALE", "test_dequantized_within_half_step", "half step"),
    shared("quant:NAN_TO_ZERO", "test_non_finite_poisons_its_group_only", "decodes to finite values"),
    shared("quant:SIGNLESS_ZERO", "test_zero_subnormal_and_huge_groups", "lost its sign"),
    shared("quant:DEQUANT_SATURATES", "test_e8m0_fp4_decode_can_overflow_fp32", "assert"),
    shared("quant:PAD_TO_GROUP", "test_codec_rejects_bad_input", "DID NOT RAISE"),
    *(SeededDefect(f"quant:{rule}-floor-2^-7", "mx_quantize", _floor_moved(rule), "test_each_rule_matches_its_hand_vectors",
                   "probe 1") for rule in ("compressed", "compressed_even", "ced_kv_fp4")),
]
