"""RoPE tables and rows. Spec: §4.2."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from kernels.config import FLASH, FLASH_TINY, V4_FLASH, V4_PRO, V4_PRO_TINY
from kernels.reference.rope import precompute_rope_tables, rope_frequencies, rope_interleave
from pto_pytest.defect import shared
from pto_pytest.plugin import counterexample, op

SENTINEL_COS, SENTINEL_SIN = 17.0, 19.0


def _independent_freqs(compressed: bool, c) -> list[float]:
    """FP64 transcription of the spec formula (not the code under test)."""
    dim = c.qk_rope_head_dim
    base = c.compress_rope_theta if compressed else c.rope_theta
    freqs = [base ** (-(2 * i) / dim) for i in range(dim // 2)]
    if not compressed:
        return freqs

    def corr(rot):
        return dim * math.log(c.original_max_position_embeddings / (rot * 2 * math.pi)) / (2 * math.log(base))

    low, high = max(math.floor(corr(c.beta_fast)), 0), min(math.ceil(corr(c.beta_slow)), dim - 1)
    out = []
    for i, f in enumerate(freqs):
        ramp = min(max((i - low) / max(high - low, 1e-3), 0.0), 1.0)
        smooth = 1 - ramp
        out.append(f / c.rope_factor * (1 - smooth) + f * smooth)
    return out


@pytest.mark.parametrize("length", [0, -1, 2.0, True])
def test_rope_tables_refuse_a_length_that_is_not_a_positive_int(length):
    """RR-01: the table's sequence length must be a positive int (0, -1, a float and a bool are refused naming
    ``length``); a length of one is a table of one row (position 0: cos 1, sin 0)."""
    from kernels.errors import ContractInputError

    with pytest.raises(ContractInputError) as exc:
        precompute_rope_tables(length, False, FLASH_TINY)
    assert exc.value.field == "length", f"length {length!r} refused naming {exc.value.field!r}"
    cos, sin = precompute_rope_tables(1, False, FLASH_TINY)
    assert cos.shape == (1, FLASH_TINY.qk_rope_head_dim // 2) and bool((cos == 1).all()) and not bool(sin.any())


@pytest.mark.parametrize("compressed", [False, True], ids=["plain", "compressed"])
@pytest.mark.parametrize("config", [FLASH, FLASH_TINY, V4_PRO, V4_PRO_TINY, V4_FLASH], ids=lambda c: c.name)
def test_rope_tables_match_the_spec_formula(compressed, config):
    """Plain: theta 1e4; compressed: theta 1.6e5 with YaRN (factor 16, beta 32/1, orig 65536) -- the same on
    V4.1-Flash, V4-Pro and V4-Flash (rope dim 64; the tiny twins 16). Spec: §4.2, §8."""
    got = rope_frequencies(compressed, config).double()
    want = torch.tensor(_independent_freqs(compressed, config), dtype=torch.float64)
    assert torch.allclose(got, want, rtol=2e-6, atol=0), f"max rel {float(((got - want) / want).abs().max())}"
    cos, sin = precompute_rope_tables(300, compressed, config)
    assert cos.dtype == torch.float32 and cos.shape == (300, config.qk_rope_head_dim // 2)
    assert torch.equal(cos[0], torch.ones_like(cos[0])) and torch.equal(sin[0], torch.zeros_like(sin[0]))
    if compressed:  # YaRN slows the low-frequency end by the factor
        plain_base = _independent_freqs(False, config)
        assert got[-1] < plain_base[-1]


def test_rope_interleave_rotates_adjacent_pairs():
    x = torch.zeros(1, 8)
    x[0, 4], x[0, 5] = 1.0, 0.0
    cos, sin = torch.tensor([[1.0, 0.0]]), torch.tensor([[0.0, 1.0]])
    y = rope_interleave(x, cos, sin)
    assert y[0, 4:].tolist() == [1.0, 0.0, 0.0, 0.0]  # pair 0 identity, pair 1 (zeros) rotated by 90 degrees
    x[0, 6] = 1.0
    from contracts.separation import separates

    def rotate(v, pairs, sign=1.0):  # the last 4 dims as (i, j) pairs, each by its angle (cos, sin)
        out = v.clone()
        for k, (i, j) in enumerate(pairs):
            c, s_ = cos[0, k], sign * sin[0, k]
            out[0, i], out[0, j] = v[0, i] * c - v[0, j] * s_, v[0, i] * s_ + v[0, j] * c
        return out

    want = separates("interleaved pairs (x[2i], x[2i+1]), rotated forward", rotate(x, [(4, 5), (6, 7)]),
                     half_split_pairs=rotate(x, [(4, 6), (5, 7)]), inverse_rotation=rotate(x, [(4, 5), (6, 7)], -1.0))
    y = rope_interleave(x, cos, sin)
    assert torch.equal(y, want) and y[0, 6:].tolist() == [0.0, 1.0], \
        "(x[2i], x[2i+1]) rotation by 90 degrees maps (1, 0) to (0, 1)"
    assert torch.allclose(rope_interleave(y, cos, sin, inverse=True), x)


@pytest.mark.parametrize("config", (FLASH_TINY, FLASH, V4_PRO_TINY), ids=lambda c: c.name)  # one per geometry: a
@given(capacity=st.sampled_from((1, 17, 257)), tokens=st.integers(0, 70), data=st.data(),  # device compiled at one
       compressed=st.booleans())  # geometry runs that one and skips the others by name
@pytest.mark.operators("materialize_rope_rows")
def test_rope_rows_exact_identity_and_untouched(backend, capacity, tokens, data, compressed, config):
    """t < num_tokens: table row p exactly (p >= 0) or identity (p < 0); rows >= num_tokens keep the 17/19
    sentinels; num_tokens = 0 writes nothing. Spec: §4.2 (RR-04, RR-06)."""
    materialize = op(backend, "materialize_rope_rows")
    cos, sin = precompute_rope_tables(capacity, compressed, config)
    count = data.draw(st.integers(0, tokens), label='count')
    edge = [p for p in (capacity - 1, 0, -1, -9, 3, 129, 256) if p < capacity]
    positions = torch.tensor(data.draw(st.lists(st.one_of(st.integers(-20, capacity - 1), st.sampled_from(edge)),
                                                min_size=tokens, max_size=tokens), label='positions'), dtype=torch.int32)
    positions[count:] = capacity + 7 * torch.arange(tokens - count, dtype=torch.int32)  # beyond count and capacity
    rc = torch.full((tokens, cos.shape[1]), SENTINEL_COS)
    rs = torch.full((tokens, cos.shape[1]), SENTINEL_SIN)
    inputs = {"freqs_cos": cos, "freqs_sin": sin, "position_ids": positions,
              "num_tokens": torch.tensor(count, dtype=torch.int32), "rope_cos": rc, "rope_sin": rs}
    with counterexample("rope_rows", inputs):  # --record-counterexamples keeps a failing example as a tree
        materialize(cos, sin, positions, count, rc, rs)
        for t in range(tokens):
            p = int(positions[t])
            if t >= count:
                assert bool((rc[t] == SENTINEL_COS).all() and (rs[t] == SENTINEL_SIN).all()), \
                    f"row {t} >= num_tokens {count} was written (sentinels 17/19 lost)"
            elif p >= 0:
                assert torch.equal(rc[t], cos[p]) and torch.equal(rs[t], sin[p]), f"row {t}: not table row {p}"
            else:
                assert bool((rc[t] == 1).all() and (rs[t] == 0).all()), f"row {t} (position {p}): not identity"


@pytest.mark.operators("materialize_rope_rows")
def test_rope_rows_reject_position_beyond_capacity(backend):
    materialize = op(backend, "materialize_rope_rows")
    cos, sin = precompute_rope_tables(8, False, FLASH_TINY)
    rc, rs = torch.zeros(3, cos.shape[1]), torch.zeros(3, cos.shape[1])
    with pytest.raises(ValueError, match=r"position_ids\[1\].*capacity 8.*got 8"):
        materialize(cos, sin, torch.tensor([0, 8, 1], dtype=torch.int32), 3, rc, rs)
    with pytest.raises(ValueError, match="num_tokens"):
        materialize(cos, sin, torch.tensor([0, 1, 1], dtype=torch.int32), 4, rc, rs)
    with pytest.raises(ValueError, match="position_ids"):
        materialize(cos, sin, torch.tensor([0.0, 1.0, 1.0]), 3, rc, rs)


# defects of tests/defects these contracts must catch (shared with other contract files)
SEEDED_DEFECTS = [
    shared("reference:ROPE_CLAMPS_POSITIONS", "test_rope_rows_reject_position_beyond_capacity", "DID NOT RAISE"),
    shared("reference:ROPE_INTO_PADDING", "test_rope_rows_exact_identity_and_untouched", "sentinels 17/19 lost"),
]


def test_a_compiled_table_dtype_refuses_another():
    """check_rope_rows with ``dtype`` (the device binding's compiled table dtype, FP32): FP32 tables pass, BF16 tables
    of the same shape are refused naming freqs_cos/freqs_sin; without ``dtype`` (the reference) both pass. Spec:
    §4.2."""
    from kernels.errors import ContractInputError
    from kernels.reference.rope import check_rope_rows

    cos, sin = torch.ones(8, 2), torch.zeros(8, 2)
    pos = torch.arange(3, dtype=torch.int32)
    out_cos, out_sin = torch.empty(3, 2), torch.empty(3, 2)
    check_rope_rows(cos, sin, pos, 3, out_cos, out_sin, dtype=torch.float32)
    check_rope_rows(cos.bfloat16(), sin.bfloat16(), pos, 3, out_cos.bfloat16(), out_sin.bfloat16())
    with pytest.raises(ContractInputError, match="freqs_cos/freqs_sin"):
        check_rope_rows(cos.bfloat16(), sin.bfloat16(), pos, 3, out_cos.bfloat16(), out_sin.bfloat16(),
                        dtype=torch.float32)
