"""The quantized linears: the MX_B_NN scale order, the MXFP8 linear's output dtype, and the official CED
quantized linear's sequential FP32 group-32 partial sums -- each rule against a hand vector that separates
it from the plausible alternative.

Spec: §2.2; upstream_checks CQ-15, CQ-16, CQ-18.
"""

from __future__ import annotations

import pytest
import torch

from kernels.errors import ContractInputError
from kernels.reference.quant_linear import (
    mx_linear,
    official_linear,
    pack_mx_a_scale,
    pack_mx_b_scale,
    unpack_mx_a_scale,
    unpack_mx_b_scale,
)


def test_the_mx_b_nn_order_interleaves_k_group_pairs_within_16_column_blocks():
    """Logical scales s[g, n] = 100·g + n, 4 k-groups x 32 columns: physical row 0 holds, for columns 0..15,
    s[0, n] then s[1, n]; row 1 the next k-group pair of the same 16 columns; rows 2-3 columns 16..31. Unpack
    inverts pack on any leading dims. Spec: CQ-15."""
    g, n = torch.meshgrid(torch.arange(4), torch.arange(32), indexing="ij")
    logical = 100 * g + n
    packed = pack_mx_b_scale(logical)
    assert packed[0, :6].tolist() == [0, 100, 1, 101, 2, 102] and packed[0, 30:].tolist() == [15, 115]
    assert packed[1, :4].tolist() == [200, 300, 201, 301] and packed[2, :2].tolist() == [16, 116]
    batch = torch.stack([logical, logical + 7])
    assert torch.equal(unpack_mx_b_scale(pack_mx_b_scale(batch)), batch)
    for bad in (torch.zeros(3, 32), torch.zeros(4, 24)):
        with pytest.raises(ContractInputError, match="even K-group count and N % 16"):
            pack_mx_b_scale(bad)


def test_the_mx_a_zz_order_puts_k_group_pairs_outside_16_row_blocks():
    """Logical activation scales s[m, g] = 100·m + g, 32 rows x 4 k-groups: the physical block of rows 0..15
    holds first k-groups 0-1 of every row (s[0,0], s[0,1], s[1,0], s[1,1], ...), then k-groups 2-3 of the same
    16 rows; rows 16..31 follow. A row-major or MX_B-like order differs on the second physical row. Unpack
    inverts pack; M % 16 and an even group count are required. Spec: CQ-15."""
    m, g = torch.meshgrid(torch.arange(32), torch.arange(4), indexing="ij")
    logical = 100 * m + g
    flat = pack_mx_a_scale(logical).flatten().tolist()
    assert flat[:6] == [0, 1, 100, 101, 200, 201]
    assert flat[32:36] == [2, 3, 102, 103] and flat[64:66] == [1600, 1601]
    assert pack_mx_a_scale(logical)[1].tolist() == [200, 201, 300, 301]
    assert torch.equal(unpack_mx_a_scale(pack_mx_a_scale(logical)), logical)
    for bad in (torch.zeros(24, 4), torch.zeros(16, 3), torch.zeros(2, 16, 4)):
        with pytest.raises(ContractInputError, match="M % 16 == 0 and an even K-group count"):
            pack_mx_a_scale(bad)
    with pytest.raises(ContractInputError, match="M % 16"):
        unpack_mx_a_scale(torch.zeros(8, 2))


def test_the_mx_linear_keeps_an_fp32_partial_only_when_asked():
    """x = 1 (exact in MXFP8), one weight 1 + 1/256: the FP32 output keeps 1 + 1/256, the default BF16 output
    rounds it to 1. Spec: CQ-16."""
    x = torch.zeros(1, 32)
    x[0, 0] = 1.0
    w = torch.zeros(32, 16)
    w[0, 0] = 1 + 1 / 256
    assert mx_linear(x, w, output_dtype=torch.float32)[0, 0].item() == 1 + 1 / 256
    out = mx_linear(x, w)
    assert out.dtype == torch.bfloat16 and out[0, 0].item() == 1.0
    with pytest.raises(ContractInputError, match="K % 32"):
        mx_linear(torch.zeros(1, 40), torch.zeros(40, 16))


def test_the_official_linear_adds_group_partials_sequentially_in_fp32():
    """Group 0's partial is 1 + 2^-8 (a BF16 midpoint), groups 1-3 add 2^-25 each: added one by one in FP32,
    each is under half an FP32 step and lost, and the tie rounds to even, 1.0; one sum of all products (then
    FP32, then BF16) keeps 3·2^-25, lands above the midpoint and rounds up to 1 + 2^-7. A weight set whose
    partials are exact in FP32 gives the exact product. No bias, K % 32. Spec: CQ-18."""
    x = torch.ones(2, 128)
    w = torch.zeros(3, 128)
    w[0, 0] = 1 + 2.0**-8
    w[0, 32] = w[0, 64] = w[0, 96] = 2.0**-25
    w[1, 0], w[1, 33] = 0.5, 0.25
    out = official_linear(x, w)
    assert out.dtype == torch.float32 and out[0].tolist() == [1.0, 0.75, 0.0], out[0].tolist()
    one_sum = (x.double() @ w.double().T).float().to(torch.bfloat16)
    assert one_sum[0, 0].item() == 1 + 2.0**-7, "the input separates the two sums"
    with pytest.raises(ContractInputError, match="bias"):
        official_linear(x, w, torch.zeros(3))
    with pytest.raises(ContractInputError, match="K % 32"):
        official_linear(torch.ones(2, 48), torch.zeros(3, 48))
