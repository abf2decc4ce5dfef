"""V4's index-key cache (spec §8). Upstream keeps two formats, both kept here by name:

* ``v4_index_cache_quant`` -- the CANN cache-quant reference (upstream indexer_cache_quant.py): each row stored as
  E4M3 with one FP32 power-of-two scale (below);
* ``v4_publish_index_keys`` -- what the decode indexer's own compressor writes (upstream
  decode_indexer_compressor.py, the INT8 stand-in the tracked kernels use): each closed window's FP32 index
  key, its last ``rope`` dims rotated in FP32 at the window's first position (pos - ratio + 1), rounded to
  BF16, times the Hadamard [d, d] (BF16) in FP32, rounded to BF16 again, then one INT8 row: amax =
  max(|row|, 1e-4), quant = 127 / amax (FP32), codes = round-half-even(row · quant), scale = 1 / quant (FP32),
  at its slot of ``idx_slot_mapping`` (-1: no write). Other bytes are kept; the inputs are not modified.

E4M3 format:

values = the row rounded to BF16; scale = 2^ceil(log2(amax / 448)) (the power of two at or above amax / 448,
so no element exceeds the E4M3 maximum 448 after the division); payload = values / scale rounded to E4M3
(nearest even). No amax floor: an all-zero row has scale 0 and payload 0. (The query quantizer is a different
operator with an unrounded scale.)

Spec: §8; docs/coverage.md, V4 section.
"""

from __future__ import annotations

import torch

from kernels.errors import ContractInputError
from kernels.operators import operator
from kernels.reference.rope import rope_interleave
from kernels.v4.mtp import quantize_rows_int8

SPEC = "§8"
ROUNDING_VERSION = "v4-index-cache-1"
E4M3_MAX = 448.0


@operator(returns="(payload float8_e4m3fn [..., d], scale FP32 [..., 1]): V4's index-key cache row "
                   'quantization',
          spec='§8')
def v4_index_cache_quant(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[..., d] -> (payload float8_e4m3fn [..., d], scale FP32 [..., 1]). Spec: §8."""
    if x.ndim < 1 or x.shape[-1] == 0 or not x.is_floating_point():
        raise ContractInputError("x", None, "floating [..., d > 0]", f"{x.dtype}{list(x.shape)}", SPEC)
    values = x.to(torch.bfloat16).float()
    amax = values.abs().amax(dim=-1, keepdim=True)
    if not bool(torch.isfinite(amax).all()):
        row = int((~torch.isfinite(amax)).flatten().nonzero()[0, 0])
        raise ContractInputError("x", (row,), "finite values", "a NaN or infinity", SPEC)
    exponent = torch.ceil(torch.log2(amax.double() / E4M3_MAX))
    scale = torch.where(amax > 0, torch.exp2(exponent), torch.zeros_like(exponent)).float()
    payload = values / torch.where(scale > 0, scale, 1.0)  # a zero row stays zero
    return payload.to(torch.float8_e4m3fn), scale


@operator(returns="(new idx_kv_cache, new idx_kv_scale): each closed window's key rotated, BF16, "
                   'Hadamard, BF16, one INT8 row with scale 1 / (127 / amax)',
          spec='§8')
def v4_publish_index_keys(index_key: torch.Tensor, closes: torch.Tensor, position_ids: torch.Tensor,
                       idx_slot_mapping: torch.Tensor, idx_kv_cache: torch.Tensor, idx_kv_scale: torch.Tensor,
                       rope_cos: torch.Tensor, rope_sin: torch.Tensor, hadamard: torch.Tensor, *,
                       ratio: int = 4) -> tuple[torch.Tensor, torch.Tensor]:
    """index_key [T, d] FP32 (the inner compressor's rows), closes [T], position_ids [T], idx_slot_mapping [T]
    (-1: no write), idx_kv_cache INT8 [blocks, bs, 1, d], idx_kv_scale FP32 [blocks, bs, 1, 1], rope tables
    [positions, rope/2] (the compressed profile), hadamard [d, d] -> (new cache, new scales). Spec: §8."""
    if index_key.ndim != 2 or index_key.dtype != torch.float32:
        raise ContractInputError("index_key", None, "the FP32 [T, d] rows of the inner compressor",
                                 f"{index_key.dtype}{list(index_key.shape)}", SPEC)
    d = index_key.shape[1]
    if idx_kv_cache.dtype != torch.int8 or idx_kv_cache.ndim != 4 or idx_kv_cache.shape[2:] != (1, d):
        raise ContractInputError("idx_kv_cache", None, f"INT8 [blocks, bs, 1, {d}]",
                                 f"{idx_kv_cache.dtype}{list(idx_kv_cache.shape)}", SPEC)
    if idx_kv_scale.dtype != torch.float32 or idx_kv_scale.shape != (*idx_kv_cache.shape[:2], 1, 1):
        raise ContractInputError("idx_kv_scale", None, f"FP32 [{idx_kv_cache.shape[0]}, {idx_kv_cache.shape[1]}, 1, 1]",
                                 f"{idx_kv_scale.dtype}{list(idx_kv_scale.shape)}", SPEC)
    if hadamard.shape != (d, d):
        raise ContractInputError("hadamard", None, f"[{d}, {d}]", list(hadamard.shape), SPEC)
    cache, scale = idx_kv_cache.clone(), idx_kv_scale.clone()
    flat, flat_scale = cache.reshape(-1, d), scale.reshape(-1)
    for t in closes.nonzero().flatten().tolist():
        slot = int(idx_slot_mapping[t])
        if slot < 0:
            continue
        if slot >= flat.shape[0]:
            raise ContractInputError("idx_slot_mapping", (t,), f"a row in [0, {flat.shape[0]})", slot, SPEC)
        start = int(position_ids[t]) - ratio + 1
        row = rope_interleave(index_key[t:t + 1], rope_cos[start].float()[None], rope_sin[start].float()[None])
        row = (row.to(torch.bfloat16).double() @ hadamard.double()).float().to(torch.bfloat16).float()
        codes, factor = quantize_rows_int8(row, scale_max=127.0, amax_eps=1e-4)
        flat[slot], flat_scale[slot] = codes[0], factor[0, 0]
    return cache, scale
