"""V4's index-key cache quantization (``v4_index_cache_quant``): E4M3 rows with a power-of-two FP32 scale,
rounded up, no amax floor. Hand vectors separate each rule from its plausible port: a scale rounded down (the
payload would pass 448), an unrounded scale amax / 448, an amax floor, BF16 rounding of the input first,
round-to-nearest-even payload.

Spec: §8; docs/coverage.md, V4 section.
"""

from __future__ import annotations

import pytest
import torch

from contracts.plugin import op
from kernels.errors import ContractInputError


def test_the_scale_is_the_power_of_two_at_or_above_amax_over_448(backend):
    """amax 448 -> scale 1 (exact power); amax 450 -> scale 2 (rounded up, not down: 450 would not fit E4M3);
    amax 0.875 -> 2^-9 (0.875 / 448 = 2^-9 exactly); amax 3 -> 2^-7 (3/448 lies between 2^-8 and 2^-7), where an
    unrounded scale 3/448 would store 448. Payload · scale reproduces each element within half an E4M3 step, and
    no payload exceeds 448. Spec: §8."""
    quant = op(backend, "v4_index_cache_quant")
    x = torch.tensor([[448.0, 1.0, -2.0, 0.0], [450.0, 3.0, 0.0, 0.0], [0.875, -0.5, 0.25, 0.0],
                      [3.0, 1.5, -0.75, 0.0]])
    payload, scale = quant(x)
    assert payload.dtype == torch.float8_e4m3fn and scale.dtype == torch.float32 and scale.shape == (4, 1)
    assert scale.flatten().tolist() == [1.0, 2.0, 2.0**-9, 2.0**-7], scale.flatten().tolist()
    p = payload.float()
    assert float(p.abs().max()) <= 448 and bool(torch.isfinite(p).all())
    assert p[3].tolist() == [384.0, 192.0, -96.0, 0.0], "3 / 2^-7 = 384, not 448 (an unrounded scale)"
    assert p[1, 0].item() == 224.0, "450 / 2 = 225 rounds to the E4M3 value 224 (steps of 16 there)"
    back = p * scale
    steps = torch.tensor([[32.0], [32.0], [2.0**-4], [2.0**-2]])
    assert bool(((back - x).abs() <= steps / 2 * 1.0001).all())


def test_a_zero_row_has_zero_scale_and_the_input_is_rounded_to_bf16_first(backend):
    """A zero row: scale 0, payload 0 (no amax floor: a tiny row keeps its own tiny power-of-two scale); an
    FP32 input is rounded to BF16 before the amax (1 + 2^-9 is 1.0 in BF16, so amax 448·(1 + 2^-9) takes scale
    1, not 2). NaN or infinity is refused naming the row. Spec: §8."""
    quant = op(backend, "v4_index_cache_quant")
    payload, scale = quant(torch.zeros(2, 8))
    assert scale.flatten().tolist() == [0.0, 0.0] and payload.float().abs().sum().item() == 0
    tiny = torch.full((1, 4), 1e-30)
    payload, scale = quant(tiny)
    assert 0 < scale.item() < 1e-30 and payload.float().max().item() > 0, "no amax floor"
    _, scale = quant(torch.tensor([[448.0 * (1 + 2.0**-9), 1.0]]))
    assert scale.item() == 1.0, "the amax is taken after the BF16 rounding"
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
    assert scale[1, 2].item() == 1.0 and payload[1, 2, 0].float().item() == -288.0  # E4M3 steps of 32 there
