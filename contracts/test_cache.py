"""Quantized cache ABI: layouts, publish touches only mapped rows, read decodes everything, comparators.
Spec: §2.1, §2.3, §6.
"""

from __future__ import annotations

import random

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from contracts.checks.cache import check_quantized_cache, check_state, check_unchanged
from contracts.separation import separates
from kernels import quant
from kernels.cache import QuantCache, empty_cache, layouts
from kernels.config import FLASH, FLASH_TINY
from pto_pytest.defect import shared
from pto_pytest.plugin import op

QUANTIZED = ("window", "compressed_r2", "compressed_r1", "index")


@pytest.mark.parametrize("config", [FLASH, FLASH_TINY], ids=lambda c: c.name)
def test_cache_layouts(config):
    """Shapes, dtypes, groups and owners of every cache kind. Spec: §2.1."""
    lay = layouts(config)
    d, di, b = config.head_dim, config.index_head_dim, 5
    e4m3, e8m0 = torch.float8_e4m3fn, torch.float8_e8m0fnu
    bs = config.block_size
    want = {
        "window": ((b, bs, 1, d), e4m3, (b, bs, 1, d // 32), e8m0, tuple(range(40))),
        "compressed_r2": ((b, bs, 1, d // 2), torch.uint8, (b, bs, 1, d // 16), e4m3, (2, 8, 14)),
        "compressed_r1": ((b, bs, 1, d // 2), torch.uint8, (b, bs, 1, d // 16), e4m3, (20,)),
        "index": ((b, bs, 1, di // 2), torch.uint8, (b, bs, 1, di // 32), e8m0, (2, 8, 14, 20)),
        "state_r2": ((b, 4, 2 * d), torch.float32, None, None, (2, 8, 14)),
    }
    for kind, (pshape, pdtype, sshape, sdtype, owners) in want.items():
        cache = empty_cache(lay[kind], b)
        assert tuple(cache.payload.shape) == pshape and cache.payload.dtype == pdtype, kind
        assert (None if cache.scale is None else (tuple(cache.scale.shape), cache.scale.dtype)) == (
            None if sshape is None else (sshape, sdtype)), kind
        assert lay[kind].owners == owners, f"{kind} owners {lay[kind].owners}"
    if config is FLASH:
        assert tuple(empty_cache(lay["window"], 1).payload.shape) == (1, 128, 1, 512)
        assert tuple(empty_cache(lay["index"], 1).scale.shape) == (1, 128, 1, 4)


def test_numpy_bit_views_are_zero_copy():
    g = torch.Generator().manual_seed(1)
    for kind, lay in layouts(FLASH_TINY).items():
        cache = empty_cache(lay, 3, generator=g)
        p, s = cache.numpy_bits()
        assert p.ctypes.data == cache.payload.data_ptr(), f"{kind}: payload view copied"
        if cache.scale is not None:
            assert s.ctypes.data == cache.scale.data_ptr(), f"{kind}: scale view copied"


def _slots(rows: int, n: int, rng: random.Random, holes: float) -> torch.Tensor:
    """n slots: distinct permuted physical rows (some spare rows never mapped), -1 for a fraction."""
    physical = rng.sample(range(rows), min(n, rows))
    out = [(-1 if rng.random() < holes else physical[i]) for i in range(n)]
    return torch.tensor(out, dtype=torch.int64)


@pytest.mark.parametrize("kind", QUANTIZED + ("state_r2",))
@given(seed=st.integers(0, 2**31), blocks=st.integers(1, 3), holes=st.sampled_from((0.0, 0.3, 1.0)),
       magnitude=st.sampled_from((1e-6, 1.0, 300.0)))
@pytest.mark.operators("cache_publish", "cache_read", "mx_quantize")
def test_publish_touches_only_mapped_rows(backend, kind, seed, blocks, holes, magnitude):
    """Random sentinel bytes outside the mapping survive byte for byte; published rows carry exactly the
    codec's bytes (scales byte-exact) and decode within the format budget. Spec: §2.3, §6."""
    lay = layouts(FLASH_TINY)[kind]
    g = torch.Generator().manual_seed(seed)
    rng = random.Random(seed)
    cache = empty_cache(lay, blocks, generator=g)
    rows = blocks * lay.rows_per_block
    n = max(1, rows - 3)  # leave spare rows unmapped
    values = torch.randn((n, lay.logical_width), generator=g) * magnitude
    slots = _slots(rows, n, rng, holes)
    before = cache.clone()
    after = op(backend, "cache_publish")(cache, values, slots)
    assert isinstance(after, QuantCache)
    mapped = torch.zeros(rows, dtype=torch.bool)
    mapped[slots[slots >= 0]] = True
    assert check_unchanged(f"{kind} input", before.payload.reshape(rows, -1), cache.payload.reshape(rows, -1)).ok, \
        "publish modified its input cache in place"
    expected = before.clone()
    live = slots >= 0
    if lay.rule is None:
        expected.payload.reshape(rows, -1)[slots[live]] = values[live]
        result = check_state(kind, after.payload.reshape(rows, -1), expected.payload.reshape(rows, -1), mapped)
        assert result.ok, result.message()
        return
    if bool(live.any()):
        q = quant.mx_quantize(values[live], lay.rule)
        expected.payload.view(torch.uint8).reshape(rows, -1)[slots[live]] = q.payload.view(torch.uint8)
        expected.scale.view(torch.uint8).reshape(rows, -1)[slots[live]] = q.scale.view(torch.uint8)
    read = op(backend, "cache_read")
    result = check_quantized_cache(
        kind, (after.payload, after.scale), (expected.payload, expected.scale), mapped,
        actual_values=read(after, dtype=torch.float32).reshape(rows, -1),
        expected_values=read(expected, dtype=torch.float32).reshape(rows, -1),
        fmt=quant.RULES[lay.rule].fmt)
    assert result.ok, result.message()
    ap, ep = after.payload.view(torch.uint8).reshape(rows, -1), expected.payload.view(torch.uint8).reshape(rows, -1)
    if not torch.equal(ap, ep):
        row = int((ap != ep).any(1).nonzero()[0, 0])
        raise AssertionError(f"{kind} row {row}: published payload bytes differ from the codec's")


@pytest.mark.parametrize("kind", QUANTIZED)
@pytest.mark.operators("cache_publish", "cache_read")
def test_read_decodes_the_whole_cache_to_bf16(backend, kind):
    lay = layouts(FLASH_TINY)[kind]
    cache = empty_cache(lay, 2)
    values = torch.randn((4, lay.logical_width))
    cache = op(backend, "cache_publish")(cache, values, torch.tensor([5, -1, 0, 17]))
    out = op(backend, "cache_read")(cache)
    assert out.dtype == torch.bfloat16 and tuple(out.shape) == (2, lay.rows_per_block, 1, lay.logical_width)
    flat = out.reshape(-1, lay.logical_width).float()
    want = quant.quant_dequant(values, lay.rule).bfloat16().float()
    blank = op(backend, "cache_read")(empty_cache(lay, 2)).reshape(-1, lay.logical_width).float()

    def placed(rows):  # the blank cache with value row i at physical row rows[i] (None: not written)
        full = blank.clone()
        for i, r in enumerate(rows):
            if r is not None:
                full[r] = want[i]
        return full

    # value row i lands at its slot, -1 writes nothing: separated from a -1 that wraps to the last row and from
    # rows written in value order
    separates("§2.3 read: rows at their slots", placed([5, None, 0, 17]), wraps_minus_one=placed([5, -1, 0, 17]),
              value_order=placed([0, None, 1, 2]))
    assert torch.equal(flat, placed([5, None, 0, 17]))


@pytest.mark.parametrize("kind", QUANTIZED)
@pytest.mark.operators("cache_publish")
def test_publish_rejects_bad_slots(backend, kind):
    lay = layouts(FLASH_TINY)[kind]
    cache = empty_cache(lay, 1)
    publish = op(backend, "cache_publish")
    v = torch.randn((3, lay.logical_width))
    with pytest.raises(ValueError, match=rf"{kind}\.slots\[2\].*already written by row 0"):
        publish(cache, v, torch.tensor([1, 4, 1]))
    with pytest.raises(ValueError, match=rf"{kind}\.slots\[2\]"):
        publish(cache, v, torch.tensor([1, 4, 10_000]))
    with pytest.raises(ValueError, match=rf"{kind}\.values"):
        publish(cache, v[:, :-1], torch.tensor([1, 4, 5]))


def test_cache_comparator_names_cache_row_and_byte():
    """One flipped byte outside the mapping fails naming the cache, row and byte; a scale byte too."""
    lay = layouts(FLASH_TINY)["index"]
    g = torch.Generator().manual_seed(3)
    a = empty_cache(lay, 1, generator=g)
    e = a.clone()
    rows = lay.rows_per_block
    mapped = torch.zeros(rows, dtype=torch.bool)
    mapped[2] = True
    vals = torch.zeros((rows, lay.logical_width))
    assert check_quantized_cache("index", (a.payload, a.scale), (e.payload, e.scale), mapped,
                                 actual_values=vals, expected_values=vals, fmt="mxfp4").ok
    a.payload.reshape(rows, -1)[7, 5] ^= 1
    r = check_quantized_cache("index", (a.payload, a.scale), (e.payload, e.scale), mapped,
                              actual_values=vals, expected_values=vals, fmt="mxfp4")
    assert not r.ok and "index.payload row[7]" in r.message() and "byte 5" in r.message(), r.message()
    a = e.clone()
    a.scale.view(torch.uint8).reshape(rows, -1)[2, 0] ^= 1
    r = check_quantized_cache("index", (a.payload, a.scale), (e.payload, e.scale), mapped,
                              actual_values=vals, expected_values=vals, fmt="mxfp4")
    assert not r.ok and "index.scale row[2]" in r.message(), r.message()


def test_state_comparator():
    """Untouched ring slots must be byte-exact (a one-bit change fails); touched ones within 0.5 % rel L2."""
    e = torch.randn((8, 16), generator=torch.Generator().manual_seed(0))
    touched = torch.zeros(8, dtype=torch.bool)
    touched[3] = True
    a = e.clone()
    a[3] *= 1.001
    assert check_state("state", a, e, touched).ok
    a.view(torch.int32)[5, 2] ^= 1  # lowest mantissa bit of an untouched slot
    r = check_state("state", a, e, touched)
    assert not r.ok and "row[5]" in r.message(), r.message()
    a = e.clone()
    a[3] *= 1.5
    assert not check_state("state", a, e, touched).ok


# defects of tests/defects these contracts must catch (shared with other contract files)
SEEDED_DEFECTS = [
    shared("quant:READ_FP32", "test_read_decodes_the_whole_cache_to_bf16", "assert"),
    shared("quant:LENIENT_SLOTS", "test_publish_rejects_bad_slots", "DID NOT RAISE"),
    shared("quant:PUBLISH_UNMAPPED", "test_publish_touches_only_mapped_rows", "unmapped row changed"),
]
