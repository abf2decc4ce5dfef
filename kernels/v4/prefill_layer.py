"""V4's packed chunked prefill of one SWA layer (spec §8; upstream prefill_layer.py), composed:

    packed x_hc [N, hc, D] FP32, requests b = 0 .. B-1 at rows chunk_offsets[b] .. + chunk_lens[b]
    -> for each request, for each tile of ``tile`` rows of it, in order:
         v4_prefill_swa_indices (the tile's window, lowered from its positions and the request's own page table)
         -> v4_attention_stage (SWA, prefill form: the tile's real rows write their kv rows, then read)
         -> v4_moe_stage (the same real rows)
       -> the tile's real rows of x_next

* every packed row outside a request's chunk is untouched: x_next there is 0, and no kv row is written for it;
* a request's later tile reads the kv rows its earlier tiles wrote (one global window cache, written in place);
  a request never reads another's rows (each lowers its window through its own page table);
* a tile's rows past the request's chunk are padding (``num_tokens`` of both stages is the tile's real rows):
  whatever rows of the packed buffer follow are handed over, and must leave no trace.

Upstream's golden feeds its children one fixed [T, ...] tile at a time: ``tile`` is that T.
Spec: §8; docs/coverage.md, V4 section (V4-36).
"""

from __future__ import annotations

import torch

from kernels.errors import ContractInputError, is_int
from kernels.operators import operator

SPEC = "§8"
ROUNDING_VERSION = "v4-prefill-layer-1"

_PACKED = ("swa_slot_mapping", "position_ids")  # packed [N] per-row attention arguments


def check_v4_prefill_layer(x_hc: torch.Tensor, chunk_lens: torch.Tensor, chunk_offsets: torch.Tensor,
                           attention: dict, moe: dict, *, layer_id: int, tile: int, config) -> list[tuple[int, int]]:
    """The layer's own arguments (its stages check theirs): -> each request's (offset, length). ``layer_id`` a layer
    of the model whose compress ratio is 0 (SWA); the chunks inside the packed rows without overlapping; ``tile`` a
    positive int; one page table per request."""
    ratios = config.compress_ratios[:config.num_hidden_layers]
    if not is_int(layer_id) or not 0 <= layer_id < len(ratios) or ratios[layer_id] != 0:
        raise ContractInputError("layer_id", None, "a layer of the model whose compress ratio is 0 (SWA): "
                                 f"{[k for k, r in enumerate(ratios) if r == 0]}", repr(layer_id), SPEC)
    if x_hc.ndim != 3:
        raise ContractInputError("x_hc", None, "[N, hc, D] packed rows", list(x_hc.shape), SPEC)
    n = x_hc.shape[0]
    if not is_int(tile) or tile <= 0:
        raise ContractInputError("tile", None, "a positive int (the children's token tile)", repr(tile), SPEC)
    for name, t in (("chunk_lens", chunk_lens), ("chunk_offsets", chunk_offsets)):
        if t.ndim != 1 or t.dtype not in (torch.int32, torch.int64):
            raise ContractInputError(name, None, "[B] INT32 / INT64", f"{t.dtype}{list(t.shape)}", SPEC)
    if chunk_lens.shape != chunk_offsets.shape:
        raise ContractInputError("chunk_offsets", None, f"one per request ({chunk_lens.numel()})",
                                 list(chunk_offsets.shape), SPEC)
    missing = {"block_tables", "kv_cache", "freqs_cos", "freqs_sin", *_PACKED} - set(attention)
    if missing:
        raise ContractInputError("attention", None, "the SWA stage's arguments with block_tables [B, pages]",
                                 sorted(missing), SPEC)
    tables = attention["block_tables"]
    if tables.ndim != 2 or tables.shape[0] != chunk_lens.numel():
        raise ContractInputError("block_tables", None, f"[B={chunk_lens.numel()}, pages]", list(tables.shape), SPEC)
    for name in _PACKED:
        if attention[name].reshape(-1).numel() != n:
            raise ContractInputError(name, None, f"one per packed row ({n})", list(attention[name].shape), SPEC)
    if "input_ids" not in moe or moe["input_ids"].reshape(-1).numel() != n:
        raise ContractInputError("moe.input_ids", None, f"one per packed row ({n})",
                                 list(moe["input_ids"].shape) if "input_ids" in moe else "missing", SPEC)
    spans = []
    taken = torch.zeros(n, dtype=torch.bool)
    for b, (off, length) in enumerate(zip(chunk_offsets.tolist(), chunk_lens.tolist(), strict=True)):
        if length < 0 or off < 0 or off + length > n:
            raise ContractInputError("chunk_offsets", (b,), f"a chunk inside the {n} packed rows",
                                     f"rows {off} .. {off + length - 1}", SPEC)
        if bool(taken[off:off + length].any()):
            raise ContractInputError("chunk_offsets", (b,), "chunks that do not overlap",
                                     f"rows {off} .. {off + length - 1} overlap an earlier request", SPEC)
        taken[off:off + length] = True
        spans.append((int(off), int(length)))
    return spans


def _tile_rows(t: torch.Tensor, base: int, tile: int) -> torch.Tensor:
    """Rows base .. base + tile of a packed tensor, zero rows past its end (the padding rows handed over)."""
    rows = t[base:base + tile]
    if rows.shape[0] == tile:
        return rows.clone()
    return torch.cat((rows, torch.zeros(tile - rows.shape[0], *t.shape[1:], dtype=t.dtype)))


@operator(returns="{x_next [N, hc, D] FP32, kv_cache}: packed chunked prefill of one SWA layer, each request's "
                   "tiles in order through v4_prefill_swa_indices, v4_attention_stage (SWA, prefill form) and "
                   "v4_moe_stage; rows outside every chunk 0",
          spec='§8')
def v4_prefill_layer(x_hc: torch.Tensor, chunk_lens: torch.Tensor, chunk_offsets: torch.Tensor, attention: dict,
                     moe: dict, *, layer_id: int, tile: int, config, ops=None) -> dict[str, torch.Tensor]:
    """Packed rows x_hc [N, hc, D] FP32 of B requests (``chunk_lens`` / ``chunk_offsets`` [B]); ``attention`` the
    SWA stage's arguments with ``block_tables`` [B, pages] (request-local, -1 unmapped) in place of
    ``window_indices``, ``swa_slot_mapping`` / ``position_ids`` packed [N], one global ``kv_cache``; ``moe`` the
    MoE stage's arguments with ``input_ids`` packed [N], without num_tokens -> {"x_next", "kv_cache"} (module
    doc). Spec: §8."""
    from kernels.v4.attention_stage import v4_attention_stage
    from kernels.v4.decode_metadata import v4_prefill_swa_indices
    from kernels.v4.layer import _binder
    from kernels.v4.moe import v4_moe_stage

    spans = check_v4_prefill_layer(x_hc, chunk_lens, chunk_offsets, attention, moe, layer_id=layer_id, tile=tile,
                                   config=config)
    bound = _binder(ops or {})
    stage = {k: v for k, v in attention.items() if k not in ("block_tables", *_PACKED)}
    kv = attention["kv_cache"]
    x_next = torch.zeros_like(x_hc, dtype=torch.float32)
    slots, positions = (attention[name].reshape(-1) for name in _PACKED)
    ids = moe["input_ids"].reshape(-1)
    for b, (off, length) in enumerate(spans):
        for p0 in range(0, length, tile):
            base, valid = off + p0, min(tile, length - p0)
            pos = _tile_rows(positions, base, tile)
            window = bound("v4_prefill_swa_indices", v4_prefill_swa_indices)(
                pos, attention["block_tables"][b], valid, config=config)
            att = bound("v4_attention_stage", v4_attention_stage)(
                "SWA", _tile_rows(x_hc, base, tile), **{**stage, "kv_cache": kv}, window_indices=window,
                swa_slot_mapping=_tile_rows(slots, base, tile), position_ids=pos, num_tokens=valid, config=config)
            kv = att["kv_cache"]
            out = bound("v4_moe_stage", v4_moe_stage)(att["x_out"], **{**moe, "input_ids": _tile_rows(ids, base, tile)},
                                                       layer_id=layer_id, num_tokens=valid, config=config)
            x_next[base:base + valid] = out["x_out"][:valid]
    return {"x_next": x_next, "kv_cache": kv}


v4_prefill_layer.composes_operators = True
