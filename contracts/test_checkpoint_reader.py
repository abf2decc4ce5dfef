"""Reading the released checkpoint (upstream_checks CQ-20, CQ-21, CQ-23): a checkpoint directory written here
byte by byte, every refusal as data, and hand vectors that separate the layout rules from their plausible
alternatives. Spec: kernels/checkpoint_reader.py."""

from __future__ import annotations

import json
import struct

import pytest
import torch

from contracts.separation import separates
from kernels.checkpoint_reader import (
    HEADER_LIMIT,
    CheckpointReader,
    required_text_config,
    resident_fp4_blocks,
    resident_fp8_blocks,
    resident_plan,
    to_mx_b,
)
from kernels.config import FLASH_TINY
from kernels.errors import ContractInputError
from kernels.reference.quant_linear import unpack_mx_b_scale

C = FLASH_TINY
NAMES = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float8_e4m3fn: "F8_E4M3",
         torch.float8_e8m0fnu: "F8_E8M0", torch.int8: "I8"}


def _write(root, tensors: dict[str, torch.Tensor], *, shard="model-00001-of-00001.safetensors", config=None,
           text=None, quant=None, edit=None):
    """A checkpoint directory: config.json, the index, one safetensors shard. ``edit(header)`` tampers."""
    header, body = {}, bytearray()
    for name, t in tensors.items():
        raw = t.contiguous().view(torch.uint8).flatten().tolist() if t.numel() else []
        header[name] = {"dtype": NAMES[t.dtype], "shape": list(t.shape), "data_offsets": [len(body), len(body) + len(raw)]}
        body.extend(bytes(raw))
    if edit:
        edit(header)
    encoded = json.dumps(header).encode()
    (root / shard).write_bytes(struct.pack("<Q", len(encoded)) + encoded + body)
    (root / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {n: shard for n in tensors}}))
    (root / "config.json").write_text(json.dumps({
        "text_config": {**required_text_config(config or C), **(text or {})},
        "quantization_config": quant or {"quant_method": "fp8", "weight_block_size": [32, 32]}}))
    return root


def _e8m0(codes) -> torch.Tensor:
    return torch.tensor(codes, dtype=torch.uint8).view(torch.float8_e8m0fnu)


def _e4m3(n: int, k: int) -> torch.Tensor:
    """Every byte distinct enough to show where it went: (row * 7 + col) mod 120 as E4M3 bit patterns."""
    r, c = torch.meshgrid(torch.arange(n), torch.arange(k), indexing="ij")
    return ((r * 7 + c) % 120).to(torch.uint8).view(torch.float8_e4m3fn)


def test_mx_linear_transposes_the_blocks_and_spreads_each_scale_over_its_output_columns(tmp_path):
    """Weight [64, 64] output-major with block codes [[127, 128], [129, 130]]: the device reads [K, N] input-major
    (byte [k, n] = stored [n, k]) and per 32 inputs and output column the code of block (n // 32, k // 32), in
    MX_B_NN order. Computed alternatives: the weight kept output-major; the block codes not transposed (the
    [N/32, K/32] grid read as [K/32, N/32]); the codes spread over input rows instead of output columns; the
    logical order without the MX_B_NN packing."""
    w, s = _e4m3(64, 64), _e8m0([[127, 128], [129, 130]])
    reader = CheckpointReader(_write(tmp_path, {"layers.0.attn.wq_a.weight": w, "layers.0.attn.wq_a.scale": s}),
                              config=C)
    got_w, got_s = reader.mx_linear("layers.0.attn.wq_a")
    codes = s.view(torch.uint8)
    separates("CQ-21 weight input-major", w.view(torch.uint8).t(), output_major=w.view(torch.uint8))
    assert torch.equal(got_w.view(torch.uint8), w.view(torch.uint8).t())
    logical = unpack_mx_b_scale(got_s.view(torch.uint8))
    separates("CQ-21 block code per output column", codes.t().repeat_interleave(32, dim=1),
              untransposed=codes.repeat_interleave(32, dim=1),
              over_input_rows=codes.t().repeat_interleave(32, dim=0)[:2].contiguous(),
              unpacked=got_s.view(torch.uint8))
    for k in range(2):
        for n in range(64):
            assert int(logical[k, n]) == int(codes[n // 32, k]), (k, n)


def test_mx_linear_slices_whole_blocks_and_refuses_partial_ones():
    """Weight [64, 128], block codes [[127..130], [131..134]]: output rows 32..63 and input columns 64..127 take
    blocks (1, 2) and (1, 3) alone (codes 133, 134, one per 32 inputs); a range that splits a block or leaves the
    matrix is refused naming the range."""
    w, s = _e4m3(64, 128), _e8m0([[127, 128, 129, 130], [131, 132, 133, 134]])
    got_w, got_s = to_mx_b(w, s, output_range=(32, 64), input_range=(64, 128))
    assert torch.equal(got_w.view(torch.uint8), w.view(torch.uint8)[32:, 64:].t())
    assert unpack_mx_b_scale(got_s.view(torch.uint8)).tolist() == [[133] * 32, [134] * 32]
    for bad in ({"output_range": (16, 48)}, {"input_range": (0, 160)}, {"output_range": (32, 32)}):
        with pytest.raises(ContractInputError, match=next(iter(bad))):
            to_mx_b(w, s, **bad)
    with pytest.raises(ContractInputError, match="E4M3 weight with E8M0"):
        to_mx_b(w.view(torch.uint8).view(torch.int8), s)
    with pytest.raises(ContractInputError, match=r"scale \[N/32, K/32\]"):
        to_mx_b(w, _e8m0([[127, 128]]))


def test_the_reader_returns_stored_bytes_and_table_rows(tmp_path):
    """A BF16 tensor comes back as stored; rows [3, 0, 3] of a [5, 4] E4M3 table are those rows' bytes, in that
    order, repeated rows included, in the shape of the ids."""
    dense = torch.randn(3, 5, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    table = _e4m3(5, 4)
    reader = CheckpointReader(_write(tmp_path, {"norm.weight": dense, "embed.weight": table}), config=C)
    assert torch.equal(reader.tensor("norm.weight").view(torch.int16), dense.view(torch.int16))
    got = reader.rows("embed.weight", torch.tensor([[3, 0, 3]], dtype=torch.int32))
    assert got.shape == (1, 3, 4) and got.dtype == torch.float8_e4m3fn
    raw = table.view(torch.uint8)
    # the rows in the order asked, repeats kept: separated from the rows sorted (the order they are read in) and
    # from the unique rows only
    separates("CQ-20 table rows in the order of the ids", raw[[3, 0, 3]], sorted_rows=raw[[0, 3, 3]],
              unique_rows=raw[[0, 3]])
    assert torch.equal(got[0].view(torch.uint8), raw[[3, 0, 3]])


@pytest.mark.parametrize("case,match", [
    ("quant_method", "quantization_config"), ("block", "quantization_config"),
    ("hidden_size", "text_config.hidden_size"), ("kv_sources", "text_config.kv_source_layer_ids"),
    ("window", "text_config.sliding_window"), ("escape", "weight_map"), ("header", "header"),
    ("range_length", "data_offsets"), ("range_past_file", "data_offsets"), ("dtype", "dtype"),
    ("missing_shard", "a readable shard"), ("short_file", "8-byte header length"), ("bad_json", "a JSON header"),
    ("row_high", r"ids\[1\]"), ("row_negative", r"ids\[0\]"), ("row_float", "integer row ids"),
    ("unknown", "weight_map"),
])
def test_the_reader_refuses_naming_what(tmp_path, case, match):
    """CQ-20: each bad checkpoint or request is one ContractInputError naming the field."""
    t = {"embed.weight": _e4m3(4, 4)}
    ids = torch.tensor([0, 1])
    name = "embed.weight"
    if case == "quant_method":
        _write(tmp_path, t, quant={"quant_method": "bf16", "weight_block_size": [32, 32]})
    elif case == "block":
        _write(tmp_path, t, quant={"quant_method": "fp8", "weight_block_size": [128, 128]})
    elif case == "hidden_size":
        _write(tmp_path, t, text={"hidden_size": C.hidden_size * 2})
    elif case == "kv_sources":
        _write(tmp_path, t, text={"kv_source_layer_ids": list(C.kv_source_layer_ids)[:-1]})
    elif case == "window":
        _write(tmp_path, t, text={"sliding_window": C.sliding_window + 1})
    elif case == "escape":
        _write(tmp_path, t)
        (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {name: "../outside"}}))
    elif case == "header":
        _write(tmp_path, t)
        shard = tmp_path / "model-00001-of-00001.safetensors"
        shard.write_bytes(struct.pack("<Q", HEADER_LIMIT + 1) + shard.read_bytes()[8:])
    elif case == "range_length":
        _write(tmp_path, t, edit=lambda h: h[name].update(data_offsets=[0, 15]))
    elif case == "range_past_file":
        _write(tmp_path, t, edit=lambda h: h[name].update(data_offsets=[8, 24]))
    elif case == "dtype":
        _write(tmp_path, t, edit=lambda h: h[name].update(dtype="F16"))
    elif case == "missing_shard":
        _write(tmp_path, t)
        (tmp_path / "model-00001-of-00001.safetensors").unlink()
    elif case == "short_file":
        _write(tmp_path, t)
        (tmp_path / "model-00001-of-00001.safetensors").write_bytes(b"\x01\x02")
    elif case == "bad_json":
        _write(tmp_path, t)
        (tmp_path / "model-00001-of-00001.safetensors").write_bytes(struct.pack("<Q", 3) + b"{x}")
    elif case == "row_high":
        _write(tmp_path, t)
        ids = torch.tensor([0, 4])
    elif case == "row_negative":
        _write(tmp_path, t)
        ids = torch.tensor([-1, 0])
    elif case == "row_float":
        _write(tmp_path, t)
        ids = torch.tensor([0.0])
    elif case == "unknown":
        _write(tmp_path, t)
        name = "embed.nothing"
    with pytest.raises(ContractInputError, match=match):
        reader = CheckpointReader(tmp_path, config=C)
        reader.rows(name, ids) if case.startswith("row") else reader.tensor(name)


def test_resident_fp8_blocks_are_output_block_major_and_row_major_inside():
    """Weight [64, 64]: block 1 is output block 0, input block 1 (rows 0..31, columns 32..63), its first byte
    stored [0, 32], its 33rd [1, 32]. Computed alternatives: input block first (block 1 would be output block 1,
    input block 0), column-major inside a block; the scale count must be the block count."""
    w = _e4m3(64, 64)
    s = _e8m0([[127, 128], [129, 130]])
    blocks, codes = resident_fp8_blocks(w, s)
    raw = w.view(torch.uint8)
    separates("CQ-23 FP8 block order", raw[:32, 32:].reshape(-1),
              input_block_first=raw[32:, :32].reshape(-1),
              column_major=raw[:32, 32:].t().reshape(-1))
    assert torch.equal(blocks[1], raw[:32, 32:].reshape(-1)) and codes.tolist() == [127, 128, 129, 130]
    with pytest.raises(ContractInputError, match="4 codes"):
        resident_fp8_blocks(w, _e8m0([[127, 128, 129]]))
    with pytest.raises(ContractInputError, match="N % 32 == K % 32 == 0"):
        resident_fp8_blocks(w[:48], s)


def test_resident_fp4_blocks_keep_32_rows_of_16_packed_bytes_with_their_row_codes():
    """Expert [64, 32] packed bytes (K = 64), codes [64, 2]: block 1 is rows 0..31, packed columns 16..31; its
    scales are the 32 rows' codes of group 1. Computed alternatives: group-major (block 1 = rows 32..63, group
    0); the codes of a block taken across groups of one row."""
    raw = ((torch.arange(64)[:, None] * 3 + torch.arange(32)[None]) % 256).to(torch.uint8)
    codes = (torch.arange(64)[:, None] * 2 + torch.arange(2)[None]).to(torch.uint8) % 200 + 20
    blocks, scales = resident_fp4_blocks(raw.view(torch.int8), codes.view(torch.float8_e8m0fnu))
    separates("CQ-23 FP4 block order", raw[:32, 16:].reshape(-1), group_major=raw[32:, :16].reshape(-1))
    assert torch.equal(blocks[1], raw[:32, 16:].reshape(-1))
    separates("CQ-23 FP4 block codes", codes[:32, 1], across_groups=codes[:16].reshape(-1))
    assert torch.equal(scales[1], codes[:32, 1])
    with pytest.raises(ContractInputError, match="K/2 % 16 == 0"):
        resident_fp4_blocks(raw[:, :24].contiguous().view(torch.int8), codes.view(torch.float8_e8m0fnu))
    with pytest.raises(ContractInputError, match=r"\[64, 2\]"):
        resident_fp4_blocks(raw.view(torch.int8), codes[:, :1].contiguous().view(torch.float8_e8m0fnu))
    # CQ-23: the packed expert is INT8 (not its uint8 bytes) with rows % 32 (48 rows refused, 32 taken)
    with pytest.raises(ContractInputError, match="INT8 packed FP4"):
        resident_fp4_blocks(raw, codes.view(torch.float8_e8m0fnu))
    with pytest.raises(ContractInputError, match="N % 32 == 0"):
        resident_fp4_blocks(raw[:48].contiguous().view(torch.int8), codes[:48].contiguous().view(torch.float8_e8m0fnu))
    assert resident_fp4_blocks(raw[:32].contiguous().view(torch.int8),
                               codes[:32].contiguous().view(torch.float8_e8m0fnu))[0].shape == (2, 512)


def test_the_resident_plan_offsets_follow_the_layers_and_refuse_bad_layouts(tmp_path):
    """Layer 0 wq_a [64, 32] (2 blocks) then wkv [32, 32] (1 block); layer 1 wq_a (2 blocks): offsets 0, 2, 3.
    Dense: layer 0 attn_norm (5 values) then attn_sink (3), layer 1 attn_norm: 0, 5, 8. A BF16 FP8-slot weight, an
    E4M3 dense tensor, a [48, 32] projection and a rank of 4 are refused."""
    f = {"layers.0.attn.wq_a.weight": _e4m3(64, 32), "layers.0.attn.wkv.weight": _e4m3(32, 32),
         "layers.1.attn.wq_a.weight": _e4m3(64, 32), "layers.0.attn_norm.weight": torch.ones(5),
         "layers.0.attn.attn_sink": torch.ones(3), "layers.1.attn_norm.weight": torch.ones(5, dtype=torch.bfloat16)}
    plan = resident_plan(CheckpointReader(_write(tmp_path, f), config=C))
    assert plan.fp8_offsets[0, [0, 2]].tolist() == [0, 2] and int(plan.fp8_offsets[1, 0]) == 3
    assert plan.fp8_blocks == 5 and plan.dense_values == 13
    assert plan.dense_offsets[0, [3, 6]].tolist() == [0, 5] and int(plan.dense_offsets[1, 3]) == 8
    per_expert = C.hidden_size * C.moe_intermediate_size // 1024
    assert plan.expert_offsets[1, 0].tolist() == [(plan.local_experts * 3 + k) * per_expert for k in range(3)]
    assert plan.experts_of(3)[-1] == C.n_routed_experts - 1
    with pytest.raises(ContractInputError, match="rank"):
        plan.experts_of(4)
    # CQ-23: offsets are INT32: a bank of 2^31 entries or more is refused (from the headers' sizes alone: an FP4 bank
    # of the preset's layers x 64 local experts x 3 projections of 2^16 x 2^16 is far past it); a smaller one is taken
    from dataclasses import replace as _replace

    (tmp_path / "big").mkdir()
    (tmp_path / "small").mkdir()
    big = _replace(C, hidden_size=2**16, moe_intermediate_size=2**16, n_routed_experts=4 * 64)
    with pytest.raises(ContractInputError, match=r"fp4 bank.*2\^31"):
        resident_plan(CheckpointReader(_write(tmp_path / "big", f, config=big), config=big))
    small = _replace(big, hidden_size=2**12, moe_intermediate_size=2**12)  # 2^14 blocks an expert: under 2^31
    taken = resident_plan(CheckpointReader(_write(tmp_path / "small", f, config=small), config=small)).fp4_blocks
    assert taken == C.num_hidden_layers * 64 * 3 * 2**14 < 2**31, taken
    for name, value, match in (("layers.0.attn.wq_a.weight", torch.ones(32, 32, dtype=torch.bfloat16), "E4M3"),
                               ("layers.0.attn_norm.weight", _e4m3(1, 5), "dense F32 or BF16"),
                               ("layers.0.attn.wkv.weight", _e4m3(48, 32), "N % 32")):
        d = tmp_path / name.replace(".", "_")
        d.mkdir()
        with pytest.raises(ContractInputError, match=match):
            resident_plan(CheckpointReader(_write(d, {**f, name: value}), config=C))
