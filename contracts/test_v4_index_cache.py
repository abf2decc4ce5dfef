"""V4's index-key cache quantization (``v4_index_cache_quant``): E4M3 rows with a power-of-two FP32 scale,
rounded up, no amax floor. Hand vectors separate each rule from its plausible port: a scale rounded down (the
payload would pass 448), an unrounded scale amax / 448, an amax floor, BF16 rounding of the input first,
round-to-nearest-even payload.

Spec: §8; docs/coverage.md, V4 section.
"""

from __future__ import annotations

import pytest
import torch

from kernels.errors import ContractInputError
from pto_pytest.defect import shared
from pto_pytest.plugin import op


def _pow2_scale(amax: torch.Tensor, mode: str, floor: float = 0.0) -> torch.Tensor:
    """A power-of-two scale for ``amax`` / 448 (FP64 log2), rounded up (the rule), down or to nearest; zero
    stays zero; ``floor`` an amax floor (the window cache's 1e-4; the index cache has none)."""
    a = amax.double().clamp_min(floor)
    e = {"ceil": torch.ceil, "floor": torch.floor, "round": torch.round}[mode](torch.log2(a / 448))
    return torch.where(a > 0, torch.exp2(e), torch.zeros_like(a)).float()


@pytest.mark.operators("v4_index_cache_quant")
def test_the_scale_is_the_power_of_two_at_or_above_amax_over_448(backend):
    """amax 448 -> scale 1 (exact power); amax 450 -> scale 2 (rounded up, not down: 450 would not fit E4M3);
    amax 0.875 -> 2^-9 (0.875 / 448 = 2^-9 exactly); amax 3 -> 2^-7 (3/448 lies between 2^-8 and 2^-7), where an
    unrounded scale 3/448 would store 448. Payload · scale reproduces each element within half an E4M3 step, and
    no payload exceeds 448. Spec: §8."""
    from contracts.separation import separates

    quant = op(backend, "v4_index_cache_quant")
    x = torch.tensor([[448.0, 1.0, -2.0, 0.0], [450.0, 3.0, 0.0, 0.0], [0.875, -0.5, 0.25, 0.0],
                      [3.0, 1.5, -0.75, 0.0]])
    amax = x.abs().amax(-1)
    want = separates("scale = 2^ceil(log2(amax / 448))", _pow2_scale(amax, "ceil"),
                     floor_power_of_two=_pow2_scale(amax, "floor"), nearest_power_of_two=_pow2_scale(amax, "round"),
                     unrounded_scale=amax / 448)
    payload, scale = quant(x)
    assert payload.dtype == torch.float8_e4m3fn and scale.dtype == torch.float32 and scale.shape == (4, 1)
    assert torch.equal(scale.flatten(), want) and want.tolist() == [1.0, 2.0, 2.0**-9, 2.0**-7], scale.flatten().tolist()
    p = payload.float()
    assert float(p.abs().max()) <= 448 and bool(torch.isfinite(p).all())
    assert p[3].tolist() == [384.0, 192.0, -96.0, 0.0], "3 / 2^-7 = 384, not 448 (an unrounded scale)"
    assert p[1, 0].item() == 224.0, "450 / 2 = 225 rounds to the E4M3 value 224 (steps of 16 there)"
    back = p * scale
    steps = torch.tensor([[32.0], [32.0], [2.0**-4], [2.0**-2]])
    assert bool(((back - x).abs() <= steps / 2 * 1.0001).all())


@pytest.mark.operators("v4_index_cache_quant")
def test_a_zero_row_has_zero_scale_and_the_input_is_rounded_to_bf16_first(backend):
    """A zero row: scale 0, payload 0 (no amax floor: a tiny row keeps its own tiny power-of-two scale); an
    FP32 input is rounded to BF16 before the amax (1 + 2^-9 is 1.0 in BF16, so amax 448·(1 + 2^-9) takes scale
    1, not 2). NaN or infinity is refused naming the row. Spec: §8."""
    quant = op(backend, "v4_index_cache_quant")
    payload, scale = quant(torch.zeros(2, 8))
    assert scale.flatten().tolist() == [0.0, 0.0] and payload.float().abs().sum().item() == 0
    from contracts.separation import separates

    tiny = torch.full((1, 4), 1e-30)
    payload, scale = quant(tiny)
    separates("no amax floor", scale.flatten(), window_amax_floor=_pow2_scale(torch.tensor([1e-30]), "ceil", 1e-4))
    assert 0 < scale.item() < 1e-30 and payload.float().max().item() > 0, "no amax floor"
    row = torch.tensor([[448.0 * (1 + 2.0**-9), 1.0]])
    want = separates("the amax of the BF16-rounded row", _pow2_scale(row.bfloat16().float().abs().amax(-1), "ceil"),
                     amax_of_the_fp32_row=_pow2_scale(row.abs().amax(-1), "ceil"))
    _, scale = quant(row)
    assert torch.equal(scale.flatten(), want) and scale.item() == 1.0, "the amax is taken after the BF16 rounding"
    bad = torch.ones(3, 4)
    bad[2, 1] = float("nan")
    with pytest.raises(ContractInputError, match=r"x\[2\]: expected finite values"):
        quant(bad)
    payload, scale = quant(torch.tensor([448.0, -1.0]))  # one row, 1-D
    assert scale.tolist() == [1.0] and payload.float().tolist() == [448.0, -1.0]
    payload, scale = quant(torch.zeros(2, 0, 4))  # no rows at all
    assert payload.shape == (2, 0, 4) and scale.shape == (2, 0, 1)
    for wrong in (torch.tensor(1.0), torch.zeros(3, 0), torch.ones(2, 4, dtype=torch.int32)):
        with pytest.raises(ContractInputError, match="x: expected floating"):
            quant(wrong)


@pytest.mark.operators("v4_index_cache_quant")
def test_rows_are_the_last_dim_and_the_amax_is_of_magnitudes(backend):
    """A [2, 3, 4] input is quantized per last-dim row (6 scales); a row whose largest magnitude is negative
    (-300 next to 1) takes the scale of 300 (1), not of 1. Spec: §8."""
    quant = op(backend, "v4_index_cache_quant")
    x = torch.arange(1, 25, dtype=torch.float32).reshape(2, 3, 4) * 10
    x[1, 2] = torch.tensor([-300.0, 1.0, 0.0, 2.0])
    payload, scale = quant(x)
    assert scale.shape == (2, 3, 1) and payload.shape == (2, 3, 4)
    for i in range(2):
        for j in range(3):
            amax = float(x[i, j].abs().max())
            want = 2.0 ** torch.ceil(torch.log2(torch.tensor(amax / 448, dtype=torch.float64))).item()
            assert scale[i, j].item() == want, (i, j, scale[i, j].item(), want)
    from contracts.separation import separates

    row = x[1, 2]
    separates("the amax of magnitudes", _pow2_scale(row.abs().amax(-1, keepdim=True), "ceil"),
              signed_max=_pow2_scale(row.amax(-1, keepdim=True), "ceil"))
    assert scale[1, 2].item() == 1.0 and payload[1, 2, 0].float().item() == -288.0  # E4M3 steps of 32 there


def _key_inputs(seed: int = 0, *, d: int = 32, rope: int = 16):
    g = torch.Generator().manual_seed(seed)
    pos = torch.tensor([2, 3, 6, 7, 126, 127, 300, 301])
    closes = (pos + 1) % 4 == 0
    slots = torch.tensor([-1, 5, -1, 130, -1, 7, -1, -1])  # position 301's boundary is uncommitted
    angle = torch.arange(302, dtype=torch.float32)[:, None] * torch.rand(rope // 2, generator=g)
    return dict(index_key=torch.randn(8, d, generator=g), closes=closes, position_ids=pos, idx_slot_mapping=slots,
                idx_kv_cache=torch.randint(-127, 128, (2, 128, 1, d), generator=g, dtype=torch.int8),
                idx_kv_scale=torch.rand(2, 128, 1, 1, generator=g),
                rope_cos=torch.cos(angle), rope_sin=torch.sin(angle),
                hadamard=((torch.rand(d, d, generator=g) - 0.5) * d**-0.5).to(torch.bfloat16))


@pytest.mark.operators("v4_publish_index_keys")
def test_an_index_key_is_rotated_rounded_transformed_rounded_and_coded(backend):
    """Each closed, committed window's key (rows 1, 3, 5 at slots 5, 130, 7): the last 16 dims rotated in FP32 at
    the window's first position, BF16, the Hadamard in FP32, BF16, then INT8 codes with quant = 127 / amax and
    the stored scale 1 / quant -- all equal, code for code and bit for bit, to the steps written here. A row
    whose amax is 0.01025390625 stores 1 / (127 / amax), which is not amax / 127 in FP32. Spec: §8."""
    i = _key_inputs()
    cache, scale = op(backend, "v4_publish_index_keys")(**i)  # ratio 4 by default
    d = i["index_key"].shape[1]
    for t, slot in ((1, 5), (3, 130), (5, 7)):
        start = int(i["position_ids"][t]) - 3
        row = i["index_key"][t].clone()
        a, b = row[d - 16::2].clone(), row[d - 15::2].clone()
        c, s = i["rope_cos"][start], i["rope_sin"][start]
        row[d - 16::2], row[d - 15::2] = a * c - b * s, a * s + b * c  # FP32, as the kernel rotates
        row = (row.to(torch.bfloat16).double() @ i["hadamard"].double()).float().to(torch.bfloat16).float()
        amax = row.abs().max().clamp_min(1e-4)
        quant = torch.tensor(127.0) / amax
        codes = torch.round(row * quant).to(torch.int8)
        got_codes, got_scale = cache.reshape(-1, d)[slot], scale.reshape(-1)[slot]
        assert torch.equal(got_codes, codes), f"row {t} (slot {slot}): codes {got_codes.tolist()} != {codes.tolist()}"
        assert got_scale.item() == (1.0 / quant).item(), f"row {t}: scale {got_scale.item()} != 1 / (127 / amax)"
    hand = dict(i, hadamard=torch.eye(d).to(torch.bfloat16), index_key=torch.zeros(8, d))
    hand["index_key"][1, 0], hand["index_key"][1, 1] = 0.01025390625, -0.005  # nope dims: no rotation
    hand["idx_slot_mapping"] = torch.tensor([-1, 5, -1, 0, -1, 7, -1, -1])  # row 3 (all zero) to slot 0
    cache, scale = op(backend, "v4_publish_index_keys")(**hand, ratio=4)
    from contracts.separation import separates

    amax = torch.tensor(0.01025390625)
    recip, divided = (1.0 / (torch.tensor(127.0) / amax)).item(), (amax / 127.0).item()
    separates("scale = 1 / (127 / amax) in FP32", torch.tensor(recip), amax_over_127=torch.tensor(divided))
    assert recip != divided and scale.reshape(-1)[5].item() == recip, \
        f"scale {scale.reshape(-1)[5].item()}: expected 1 / (127 / amax) = {recip}, not amax / 127 = {divided}"
    floor = (1.0 / (torch.tensor(127.0) / torch.tensor(1e-4))).item()
    separates("a zero key keeps the 1e-4 amax floor", torch.tensor(floor),
              no_amax_floor=1.0 / (torch.tensor(127.0) / torch.tensor(0.0)))
    assert scale.reshape(-1)[0].item() == floor and bool((cache.reshape(-1, d)[0] == 0).all()), \
        "a zero key (slot 0): codes 0 with the 1e-4 amax floor's scale"
    mixed = torch.zeros(d, d)
    mixed[0, 0] = mixed[1, 0] = mixed[2, 0] = 1.0  # column 0 sums 1 + 2^-8 + 2^-30: 1 + 2^-8 in FP32, a BF16 tie
    mixed[3, 1] = 1.0
    tie = dict(hand, hadamard=mixed.to(torch.bfloat16), index_key=torch.zeros(8, d))
    tie["index_key"][1, :4] = torch.tensor([1.0, 2.0**-8, 2.0**-30, 0.5])
    cache, _ = op(backend, "v4_publish_index_keys")(**tie)

    from contracts.separation import bf16_once as bf16_from_fp64  # one rounding, not torch's two

    def codes(column0: torch.Tensor, rounding=torch.round) -> torch.Tensor:  # BF16 Hadamard output -> 2 codes
        row = torch.stack([column0, torch.tensor(0.5, dtype=torch.float64)]).float().to(torch.bfloat16).float()
        return rounding(row * (127.0 / row.abs().max())).to(torch.int8)

    exact = torch.tensor(1 + 2.0**-8 + 2.0**-30, dtype=torch.float64)
    separates("the Hadamard output rounded to FP32, then BF16", codes(exact.float().double()),
              bf16_from_fp64=codes(bf16_from_fp64(exact).double()), codes_truncated=codes(exact, torch.trunc))
    got = cache.reshape(-1, d)[5, :2].tolist()
    assert got == [127, 64], f"codes {got}: the Hadamard output rounds to FP32 (a tie, to 1.0), then BF16 -> 0.5 " \
                             "codes 63.5 -> 64; rounded from FP64 directly it would be 1 + 2^-7 and 63"


@pytest.mark.operators("v4_publish_index_keys")
def test_only_closed_committed_windows_write_their_key(backend):
    """Rows that close no window, or whose slot is -1 (an uncommitted boundary), write nothing: every other
    code and scale keeps its bytes; the inputs are not modified; a slot past the cache, an FP32 cache and a
    BF16 key are refused naming the field. Spec: §8."""
    i = _key_inputs(1)
    before = {k: v.clone() for k, v in i.items()}
    cache, scale = op(backend, "v4_publish_index_keys")(**i, ratio=4)
    d = i["index_key"].shape[1]
    written = [5, 130, 7]
    keep = [r for r in range(256) if r not in written]
    assert torch.equal(cache.reshape(-1, d)[keep], i["idx_kv_cache"].reshape(-1, d)[keep]), "a code no key owns moved"
    assert torch.equal(scale.reshape(-1)[keep], i["idx_kv_scale"].reshape(-1)[keep]), "a scale no key owns moved"
    assert all(torch.equal(i[k], v) for k, v in before.items()), "an input was modified in place"
    past = i["idx_slot_mapping"].clone()
    past[1] = 256
    with pytest.raises(ContractInputError, match=r"idx_slot_mapping\[1\]"):
        op(backend, "v4_publish_index_keys")(**dict(i, idx_slot_mapping=past), ratio=4)
    with pytest.raises(ContractInputError, match="idx_kv_cache"):
        op(backend, "v4_publish_index_keys")(**dict(i, idx_kv_cache=i["idx_kv_cache"].float()), ratio=4)
    for name, value in (("index_key", i["index_key"].to(torch.bfloat16)), ("index_key", i["index_key"][0]),
                        ("idx_kv_scale", i["idx_kv_scale"].to(torch.bfloat16)), ("hadamard", i["hadamard"][:-1])):
        with pytest.raises(ContractInputError, match=name):
            op(backend, "v4_publish_index_keys")(**dict(i, **{name: value}), ratio=4)


# defects of tests/defects these contracts must catch (shared with other contract files)
SEEDED_DEFECTS = [
    shared("v4:KEY_SCALE_DIVIDED", "test_an_index_key_is_rotated_rounded_transformed_rounded_and_coded", "1 / (127 / amax)"),
    shared("v4:KEY_HADAMARD_BEFORE_ROPE", "test_an_index_key_is_rotated_rounded_transformed_rounded_and_coded", "codes"),
    shared("v4:KEY_UNROUNDED_BEFORE_HADAMARD", "test_an_index_key_is_rotated_rounded_transformed_rounded_and_coded", "codes"),
    shared("v4:SCALE_ROUNDED_DOWN", "test_the_scale_is_the_power_of_two_at_or_above_amax_over_448", "[1.0, 1.0,"),
]
