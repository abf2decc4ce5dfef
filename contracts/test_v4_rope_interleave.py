"""V4-Flash's RoPE table expansion (``v4_rope_interleave``): half-width cos / sin rows widened to interleaved lanes,
the sine signed -, +, -, + so that ``x[j] * cos_il[j] + x[j ^ 1] * sin_signed[j]`` rotates the pairs (x[2i], x[2i+1])
by the row's angles. The expected lanes are worked out here lane by lane (Python floats, not the code under test)
and the rotation checked in FP64 against complex multiplication. Its golden case and bad calls come from its record
(``kernels/v4/rope_interleave.py``, judged by contracts/test_records.py). Spec: §4.2."""

from __future__ import annotations

import cmath
import struct

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from contracts.separation import separates
from kernels.errors import ContractInputError
from pto_pytest.defect import SeededDefect
from pto_pytest.plugin import op

pytestmark = pytest.mark.operators("v4_rope_interleave")

FP32 = st.floats(width=32, allow_nan=True, allow_infinity=True, allow_subnormal=True)


def _bits(x: float) -> int:
    return struct.unpack("<I", struct.pack("<f", x))[0]


def _expected_lanes(cos_half: list[list[float]], sin_half: list[list[float]]):
    """Lane by lane from the rule: lane j reads column j // 2; the sine is negated on even lanes (a sign-bit flip,
    so -0.0 for a +0 sine, a NaN's payload kept)."""
    cos_il = [[row[j // 2] for j in range(2 * len(row))] for row in cos_half]
    sin_signed = [[(-row[j // 2] if j % 2 == 0 else row[j // 2]) for j in range(2 * len(row))] for row in sin_half]
    return cos_il, sin_signed


def _first_bit_mismatch(got: torch.Tensor, want: list[list[float]]):
    for b, row in enumerate(want):
        for j, w in enumerate(row):
            g = float(got[b, j])
            same = (g != g and w != w) if (g != g or w != w) else _bits(g) == _bits(w)
            if not same:
                return (b, j), g, w
    return None


@given(data=st.data())
def test_every_lane_reads_its_pairs_angle_with_the_sine_signed(backend, data):
    """Any rows of any FP32 values (±0, ±inf, NaN, subnormals): lane j of each row is column j >> 1, the sine
    negated on even lanes, bit for bit (FP32, [B, 2 * width]); a NaN stays a NaN."""
    rows = data.draw(st.integers(1, 5), label="rows")
    half = data.draw(st.integers(1, 9), label="half width")
    cos = data.draw(st.lists(st.lists(FP32, min_size=half, max_size=half), min_size=rows, max_size=rows), label="cos")
    sin = data.draw(st.lists(st.lists(FP32, min_size=half, max_size=half), min_size=rows, max_size=rows), label="sin")
    cos_t, sin_t = torch.tensor(cos, dtype=torch.float32), torch.tensor(sin, dtype=torch.float32)
    cos_il, sin_signed = op(backend, "v4_rope_interleave")(cos_t, sin_t)
    for name, got in (("cos_il", cos_il), ("sin_signed", sin_signed)):
        assert got.dtype == torch.float32 and tuple(got.shape) == (rows, 2 * half), \
            f"{name}: {got.dtype}{list(got.shape)}, expected float32[{rows}, {2 * half}] (§4.2)"
    want_cos, want_sin = _expected_lanes(cos_t.tolist(), sin_t.tolist())
    for name, got, want in (("cos_il", cos_il, want_cos), ("sin_signed", sin_signed, want_sin)):
        bad = _first_bit_mismatch(got, want)
        assert bad is None, f"{name}{list(bad[0])} = {bad[1]!r}, expected {bad[2]!r} (lane {bad[0][1]} reads " \
                            f"column {bad[0][1] // 2}{', sine negated' if name == 'sin_signed' else ''}; §4.2)"


@given(data=st.data())
def test_the_expanded_rows_rotate_each_pair_by_its_angle(backend, data):
    """With the expanded rows, x[j] * cos_il[j] + x[j ^ 1] * sin_signed[j] is (x[2i] + i x[2i+1]) * e^(i theta_i)
    (FP64 complex multiplication from the spec, within 2 FP32 ulps of the pair's magnitude), and the conjugate
    form (a subtraction) undoes it."""
    half = data.draw(st.integers(1, 8), label="half width")
    angles = data.draw(st.lists(st.floats(-3.2, 3.2), min_size=half, max_size=half), label="angles")
    x = data.draw(st.lists(st.floats(-8, 8, width=32), min_size=2 * half, max_size=2 * half), label="x")
    cos_t = torch.tensor([[cmath.cos(a).real for a in angles]], dtype=torch.float32)
    sin_t = torch.tensor([[cmath.sin(a).real for a in angles]], dtype=torch.float32)
    cos_il, sin_signed = op(backend, "v4_rope_interleave")(cos_t, sin_t)
    xt = torch.tensor([x], dtype=torch.float32)
    swap = torch.arange(2 * half) ^ 1
    fwd = xt * cos_il + xt[:, swap] * sin_signed
    back = fwd * cos_il - fwd[:, swap] * sin_signed
    for i, a in enumerate(angles):
        c, s = float(cos_t[0, i]), float(sin_t[0, i])
        want = complex(x[2 * i], x[2 * i + 1]) * complex(c, s)
        bound = 2 * 2.0**-23 * (abs(complex(x[2 * i], x[2 * i + 1])) + 1e-30) * 2
        for lane, w in ((2 * i, want.real), (2 * i + 1, want.imag)):
            assert abs(float(fwd[0, lane]) - w) <= bound, \
                f"rotated lane {lane} = {float(fwd[0, lane])}, expected {w} (pair {i} by angle {a}; bound {bound})"
        for lane in (2 * i, 2 * i + 1):
            assert abs(float(back[0, lane]) - x[lane]) <= 2 * bound, \
                f"inverse rotation of lane {lane} = {float(back[0, lane])}, expected {x[lane]} (bound {2 * bound})"


def test_a_hand_row_separates_the_layout_and_the_sign_pattern(backend):
    """cos (1, 2, 3), sin (4, 5, 6): the interleaved, -+ signed lanes are separated from the half-split layout
    (lane j reads column j mod 3, V4-Pro's rotate-halves tables), from the +- sign pattern, from an unsigned sine,
    and from lanes read one column late."""
    cos, sin = torch.tensor([[1.0, 2.0, 3.0]]), torch.tensor([[4.0, 5.0, 6.0]])
    want_cos, want_sin = _expected_lanes(cos.tolist(), sin.tolist())
    want_cos, want_sin = torch.tensor(want_cos), torch.tensor(want_sin)
    halves = torch.arange(6) % 3
    separates("interleaved lanes j >> 1", want_cos, half_split_layout=cos[:, halves],
              one_column_late=cos[:, (torch.arange(6) // 2 + 1) % 3])
    separates("the sine signed -, +, -, +", want_sin,
              plus_minus=-want_sin, unsigned=sin.repeat_interleave(2, 1),
              half_split_signs=torch.cat((-sin, sin), 1))
    cos_il, sin_signed = op(backend, "v4_rope_interleave")(cos, sin)
    assert torch.equal(cos_il, want_cos), f"cos_il {cos_il.tolist()}, expected {want_cos.tolist()} (lane j >> 1)"
    assert torch.equal(sin_signed, want_sin), f"sin_signed {sin_signed.tolist()}, expected {want_sin.tolist()} " \
                                              "(-, +, -, + on lanes 0, 1, 2, 3)"


def test_a_zero_sine_on_an_even_lane_is_negative_zero(backend):
    """The sign is folded by a multiplication by -1 (upstream: ``sin * sign``), so a +0 sine on an even lane is -0
    and a -0 is +0: separated from a select that leaves a zero alone."""
    sin = torch.tensor([[0.0, -0.0]])
    want = torch.tensor([[-0.0, 0.0, 0.0, -0.0]])
    separates("a sign-bit flip on even lanes", want.view(torch.int32),
              zero_left_alone=torch.tensor([[0.0, 0.0, -0.0, -0.0]]).view(torch.int32))
    _, sin_signed = op(backend, "v4_rope_interleave")(torch.ones(1, 2), sin)
    assert torch.equal(sin_signed.view(torch.int32), want.view(torch.int32)), \
        f"sin_signed {sin_signed.tolist()} (sign bits {[_bits(v) >> 31 for v in sin_signed[0].tolist()]}), " \
        "expected [-0.0, 0.0, 0.0, -0.0]"


BAD_CALLS = {  # (cos_half, sin_half, the field the refusal names)
    "1-D tables": (torch.ones(4), torch.ones(4), "cos_half"),
    "zero columns": (torch.ones(2, 0), torch.ones(2, 0), "cos_half"),
    "tables of two widths": (torch.ones(2, 4), torch.ones(2, 3), "sin_half"),
    "tables of two row counts": (torch.ones(2, 4), torch.ones(3, 4), "sin_half"),
    "a BF16 sine": (torch.ones(2, 4), torch.ones(2, 4, dtype=torch.bfloat16), "sin_half"),
    "an FP64 cosine": (torch.ones(2, 4, dtype=torch.float64), torch.ones(2, 4), "cos_half"),
}


@pytest.mark.parametrize("case", sorted(BAD_CALLS))
def test_a_malformed_call_is_refused_naming_its_field(backend, case):
    """Two 2-D FP32 tables of one shape with at least one column; anything else is refused naming the table."""
    cos, sin, field = BAD_CALLS[case]
    with pytest.raises(ContractInputError) as exc:
        op(backend, "v4_rope_interleave")(cos, sin)
    assert exc.value.field == field, f"{case}: refused naming {exc.value.field!r}, not {field!r}: {exc.value}"


def _half_split(cos_half, sin_half):
    sign = torch.cat((-torch.ones_like(sin_half), torch.ones_like(sin_half)), 1)
    return torch.cat((cos_half, cos_half), 1), torch.cat((sin_half, sin_half), 1) * sign


def _plus_minus(cos_half, sin_half):
    cos_il = cos_half.repeat_interleave(2, dim=1)
    return cos_il, -sin_half.repeat_interleave(2, dim=1) * torch.tensor([-1.0, 1.0]).repeat(sin_half.shape[1])


def _select_sign(cos_half, sin_half):
    """The sign applied by a select (negating only nonzero values): a zero keeps its sign."""
    s = sin_half.repeat_interleave(2, dim=1)
    even = (torch.arange(s.shape[1]) % 2 == 0) & (s != 0)
    return cos_half.repeat_interleave(2, dim=1), torch.where(even, -s, s)


def _unchecked(cos_half, sin_half):
    return cos_half.float().repeat_interleave(2, dim=-1), sin_half.float().repeat_interleave(2, dim=-1) * \
        torch.tensor([-1.0, 1.0]).repeat(max(sin_half.shape[-1], 1))[: 2 * sin_half.shape[-1]]


SEEDED_DEFECTS = [
    SeededDefect("rope-interleave:half-split", "v4_rope_interleave", _half_split,
                 "test_a_hand_row_separates_the_layout_and_the_sign_pattern", "lane j >> 1"),
    SeededDefect("rope-interleave:plus-minus", "v4_rope_interleave", _plus_minus,
                 "test_the_expanded_rows_rotate_each_pair_by_its_angle", "expected"),
    SeededDefect("rope-interleave:select-sign", "v4_rope_interleave", _select_sign,
                 "test_a_zero_sine_on_an_even_lane_is_negative_zero", "expected [-0.0"),
    SeededDefect("rope-interleave:no-checks", "v4_rope_interleave", _unchecked,
                 "test_a_malformed_call_is_refused_naming_its_field", "DID NOT RAISE"),
]
