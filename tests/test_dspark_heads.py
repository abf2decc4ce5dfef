"""The drafter attention's "fp32" probability rule (``kernels.v4.dspark_attention.fp32_heads``, the golden's: one
softmax, never rounded) on a worked-out vector, separated from the kernel's BF16 probabilities (disagreement 21)."""

from __future__ import annotations

import math

import torch

from contracts.separation import separates
from kernels.config import V4_FLASH_TINY as C
from kernels.v4.dspark_attention import fp32_heads


def test_one_unrounded_softmax_separated_from_bf16_probabilities():
    """One row, every head alike: two keys with scores 0 and -1/2 (q · k scaled by 1/sqrt(hd)), values +e0 and -e0,
    a sink of -20 (negligible). Head dim 0: o = (1 - e^-1/2) / (1 + e^-1/2) = 0.24491866 -> 0.2451171875 in BF16.
    With the second probability rounded to BF16 first (e^-1/2 = 0.60653 -> 0.60546875) it is 0.24579 ->
    0.24609375: separated."""
    hd, h = C.head_dim, C.num_attention_heads
    scale = hd ** 0.5
    k1, k2 = torch.zeros(hd), torch.zeros(hd)
    k1[0], k2[0] = 1.0, -1.0
    q = torch.zeros(1, h, hd)
    q[..., 1] = 1.0
    k1[1], k2[1] = 0.0, -0.5 * scale  # scores 0 and -1/2
    cache = torch.stack((k1, k2)).reshape(1, 2, 1, hd).to(torch.bfloat16)
    window = torch.tensor([[0, 1]], dtype=torch.int32)
    cos, sin = torch.ones(1, C.qk_rope_head_dim, dtype=torch.bfloat16), torch.zeros(1, C.qk_rope_head_dim,
                                                                                   dtype=torch.bfloat16)
    sink = torch.full((h,), -20.0)
    e = math.exp(-0.5)
    exact = torch.tensor((1 - e) / (1 + e + math.exp(-20)))
    p2 = torch.tensor(e).to(torch.bfloat16).double()
    rounded = (1 - p2) / (1 + p2 + math.exp(-20))
    want = exact.to(torch.bfloat16)
    separates("one unrounded softmax", want, bf16_probabilities=rounded.to(torch.bfloat16))
    got = fp32_heads("SWA", q.to(torch.bfloat16), cache, window, None, None, None, None, sink, cos, sin, config=C,
                     seq=1)
    assert float(got[0, 0, 0]) == float(want), f"heads[0][0][0] = {float(got[0, 0, 0])}, expected {float(want)}"
