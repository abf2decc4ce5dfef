"""Checkpoint linear decoding and the released format policy (upstream_checks CQ-19, CQ-22): hand vectors that
separate the layout rules from their plausible alternatives, an independent evaluation of random blocks, and
every refusal as data. Spec: kernels/checkpoint.py."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from contracts.separation import separates
from kernels.checkpoint import decode_checkpoint_linear, linear_format
from kernels.errors import ContractInputError
from kernels.quant import pack_fp4

E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], dtype=torch.float64)


def _e8m0(codes) -> torch.Tensor:
    return torch.tensor(codes, dtype=torch.uint8).view(torch.float8_e8m0fnu)


def _fp4_values(codes: torch.Tensor) -> torch.Tensor:
    return torch.where(codes & 8 != 0, -1.0, 1.0).double() * E2M1[(codes & 7).long()]


def test_mxfp4_is_low_nibble_first_with_one_scale_per_32_input_columns():
    """Row 0 holds codes 2 (+1.0) and 9 (-0.5) in columns 0 and 1, row 1 code 7 (+6.0) in column 33; scales
    (127, 128) and (126, 130). The rule gives 1.0, -0.5 and 6.0 · 2^3 = 48. Computed alternatives: the high
    nibble first (columns 0 and 1 swap, column 33's code moves to 32), a bias of 128, one scale per 16 columns."""
    codes = torch.zeros(2, 64, dtype=torch.uint8)
    codes[0, 0], codes[0, 1], codes[1, 33] = 2, 9, 7
    scale = [[127, 128], [126, 130]]

    def decode(order=(0, 1), bias=127, group=32):
        c = codes.view(2, 32, 2)[..., list(order)].reshape(2, 64)
        per = torch.tensor(scale, dtype=torch.float64).repeat_interleave(group, 1)
        per = per.repeat(1, 64 // per.shape[1])[:, :64] if per.shape[1] < 64 else per[:, :64]
        return (_fp4_values(c) * torch.exp2(per - bias)).float()

    want = separates("MXFP4: low nibble first, 2^(s - 127) per 32 columns", decode(),
                     high_nibble_first=decode(order=(1, 0)), bias_128=decode(bias=128), scale_per_16=decode(group=16))
    got = decode_checkpoint_linear(pack_fp4(codes).view(torch.int8), _e8m0(scale))
    assert got.dtype == torch.float32 and got.shape == (2, 64)
    assert torch.equal(got, want), f"decoded {got[0, :2].tolist()}, {got[1, 32:34].tolist()}; want 1.0, -0.5 / 0, 48"
    assert got[1, 33].item() == 48.0


def test_mxfp8_scales_are_32_by_32_blocks_output_major():
    """A 64 x 64 FP8 weight of ones with block scales [[127, 128], [126, 129]]: block (r, c) covers rows
    32r..32r+31 and columns 32c..32c+31, so [0, 40] = 2, [40, 0] = 0.5, [40, 40] = 4. Computed alternatives:
    the scale grid transposed (input-major blocks), one scale per 32 rows only (per block row), a bias of 128."""
    weight = torch.ones(64, 64).to(torch.float8_e4m3fn)
    grid = torch.tensor([[127, 128], [126, 129]], dtype=torch.float64)

    def expand(g, bias=127):
        return torch.exp2(g.repeat_interleave(32, 0).repeat_interleave(32, 1) - bias).float()

    want = separates("MXFP8: 32 x 32 blocks, output-major", expand(grid), transposed_grid=expand(grid.T),
                     one_scale_per_block_row=expand(grid[:, :1].repeat(1, 2)), bias_128=expand(grid, 128))
    got = decode_checkpoint_linear(weight, _e8m0(grid.to(torch.uint8).tolist()))
    assert torch.equal(got, want), f"[0, 40] {got[0, 40].item()}, [40, 0] {got[40, 0].item()}"
    assert (got[0, 40].item(), got[40, 0].item(), got[40, 40].item()) == (2.0, 0.5, 4.0)


@given(seed=st.integers(0, 2**31), n_blocks=st.integers(1, 3), k_blocks=st.integers(1, 3), fp8=st.booleans())
def test_random_blocks_decode_to_code_times_scale(seed, n_blocks, k_blocks, fp8):
    """Any payload and finite scales: every element is its code's value times its scale, evaluated here in FP64
    from the bits (E4M3 through torch's own decode of the byte, E2M1 from the code table)."""
    g = torch.Generator().manual_seed(seed)
    n, k = 32 * n_blocks, 32 * k_blocks
    if fp8:
        raw = torch.randint(0, 256, (n, k), generator=g, dtype=torch.uint8)
        raw[(raw & 0x7F) == 0x7F] = 0x38  # NaN codes are the refusal test's
        weight = raw.view(torch.float8_e4m3fn)
        codes = torch.randint(110, 140, (n_blocks, k_blocks), generator=g, dtype=torch.uint8)
        want = weight.double() * torch.exp2(codes.double() - 127).repeat_interleave(32, 0).repeat_interleave(32, 1)
    else:
        nib = torch.randint(0, 16, (n, k), generator=g, dtype=torch.uint8)
        weight = pack_fp4(nib).view(torch.int8)
        codes = torch.randint(110, 140, (n, k_blocks), generator=g, dtype=torch.uint8)
        want = _fp4_values(nib) * torch.exp2(codes.double() - 127).repeat_interleave(32, 1)
    got = decode_checkpoint_linear(weight, codes.view(torch.float8_e8m0fnu))
    assert torch.equal(got, want.float()), f"first difference at {(got != want.float()).nonzero()[0].tolist()}"


def test_unquantized_weights_pass_through_as_fp32():
    """A BF16 weight is returned as its FP32 values (not kept BF16, not scaled by a default 2^0 block)."""
    w = torch.tensor([[1.5, -2.25]], dtype=torch.bfloat16)
    want = separates("unquantized: the values as FP32", w.float(), kept_bf16=w, halved_by_a_bias_128=w.float() / 2)
    got = decode_checkpoint_linear(w)
    assert torch.equal(got, want) and got.tolist() == [[1.5, -2.25]]


_FP8 = torch.ones(32, 32).to(torch.float8_e4m3fn)
_NAN_FP8 = torch.full((32, 32), 0x7F, dtype=torch.uint8).view(torch.float8_e4m3fn)
BAD_INPUTS = [
    # what, weight, scale, the field and words of the one-line error
    ("an F32 weight with a scale", torch.ones(2, 2), _e8m0([[127]]), "scale: expected no scale"),
    ("an FP8 weight without a scale", _FP8, None, "scale: expected E8M0"),
    ("an FP8 weight with FP32 scales", _FP8, torch.ones(1, 1), "scale: expected E8M0"),
    ("E8M0 code 255 (NaN)", _FP8, _e8m0([[255]]), "scale[0][0]: expected a finite E8M0 code"),
    ("an FP8 weight of 32 x 64 for one block", torch.ones(32, 64).to(torch.float8_e4m3fn), _e8m0([[127]]),
     "weight: expected [32, 32]"),
    ("an FP4 weight whose columns need two scales", torch.zeros(4, 32, dtype=torch.int8), _e8m0([[127]] * 4),
     "weight: expected [4, 16] packed"),
    ("an FP4 weight with other rows than its scale", torch.zeros(4, 16, dtype=torch.int8), _e8m0([[127]] * 3),
     "weight: expected [3, 16] packed"),
    ("an FP16 weight", torch.ones(2, 2, dtype=torch.float16), None, "weight: expected F32, BF16"),
    ("an E4M3 NaN payload", _NAN_FP8, _e8m0([[127]]), "weight[0][0]: expected finite decoded values"),
]


@pytest.mark.parametrize("what, weight, scale, words", BAD_INPUTS, ids=[b[0] for b in BAD_INPUTS])
def test_bad_checkpoint_linears_are_refused_naming_what(what, weight, scale, words):
    with pytest.raises(ContractInputError) as info:
        decode_checkpoint_linear(weight, scale)
    assert words in str(info.value), f"{what}: {info.value}"


FORMATS = [
    ("head", "BF16", "fp32"), ("layers.7.ffn.gate", "F8_E4M3", "fp32"), ("layers.7.attn.wo_a", "F8_E4M3", "bf16"),
    ("layers.2.attn.compressor.wkv", "F8_E4M3", "fp32"),  # ratio 2
    ("layers.20.attn.compressor.wkv", "F8_E4M3", "mxfp8"),  # ratio 1: its storage
    ("layers.7.attn.wq_a", "F8_E4M3", "mxfp8"), ("layers.7.ffn.experts.3.w1", "I8", "mxfp4"),
    ("layers.7.attn.wo_b", "BF16", "bf16"), ("layers.7.attn.indexer.weights_proj", "F32", "fp32"),
    ("layers.7.ffn.gate_proj", "I8", "mxfp4"),  # a name that merely starts like the gate: its storage
]


@pytest.mark.parametrize("stem, storage, fmt", FORMATS, ids=[f[0] for f in FORMATS])
def test_the_released_format_policy(stem, storage, fmt):
    """CQ-22: the LM head and MoE gates in FP32, WO-A in BF16, ratio-2 compressors in FP32, the rest as stored."""
    assert linear_format(stem, storage) == fmt


def test_the_format_policy_refuses_unknown_storage_and_layers():
    with pytest.raises(ContractInputError, match="storage"):
        linear_format("layers.1.attn.wq_a", "F16")
    with pytest.raises(ContractInputError, match="stem"):
        linear_format("layers.99.attn.compressor.wkv", "F8_E4M3")
