"""Inputs of one attention half-layer call: a mixed batch lowered through ForwardMetadata, caches with
history, weights, RoPE rows and (per mode) the Top-K or candidate mask a source layer left behind.

Fixtures are aimed at what separates rules (§15 S-7): permuted physical pages with spare unmapped pages full
of random bytes, history in every mapped cache row, windows that wrap page edges, compressed lengths past
``index_topk`` (so the Top-K selects), a request with an odd resume (the ratio-2 ring partner comes from the
state), trailing padding rows in prefill and the C2A REUSE decode inactive suffix (32 tokens / 24 active in
the validated upstream case; a scaled-down 8 / 6 here), and per-rank different slab data in the sharded wiring.

``cancel`` builds a TP fixture whose rank partials cancel: every rank computes the same heads and the Wo-B
rows of rank r are scaled by ``CANCEL[cancel][r]`` -- "cast" leaves a 2^-12 remainder that one BF16 cast per
partial destroys, "order" (TP4) leaves a 2^-30 remainder that a different summation order destroys.

Spec: §3 (metadata), §2.1/§2.3 (caches), §4.2 (RoPE profiles), §7.1 (slabs, decode caller contract).
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, replace

import torch

from contracts.strategies import BatchCase, materialize
from kernels import cache as cache_abi
from kernels.config import FLASH_TINY, LayerKind, V41Config
from kernels.metadata import build_forward_metadata
from kernels.reference.attention_layer import FULL, INDEXING, REPRESENTATIVE_LAYER, REUSE, SENTINEL, ratio_of
from kernels.reference.rope import materialize_rope_rows, precompute_rope_tables
from kernels.sequence_parallel import sp_bounds

KINDS = tuple(LayerKind)
PHASES = ("prefill", "decode")
TPS = (1, 2, 4)
CANCEL = {"cast": (1.0, -(1.0 - 2.0**-12), 0.0, 0.0), "order": (1.0, -1.0, 2.0**-30, 2.0**-30)}

# FLASH head geometry (64 heads of 512 with 64 RoPE dims, 8 output groups) around a small model width, for the
# few small-T cases that exercise the real head and tile shapes.
FLASH_HEADS = replace(FLASH_TINY, name="flash-heads", num_attention_heads=64, head_dim=512, qk_rope_head_dim=64,
                      o_lora_rank=32, hidden_size=128, index_head_dim=64, index_n_heads=8)


@dataclass(frozen=True)
class HalfLayerCase:
    kind: LayerKind
    phase: str
    wiring: str = "replicated"
    tp: int = 1
    seed: int = 0
    config: V41Config = FLASH_TINY
    padding: int | None = None  # trailing inactive rows (default: 3 in prefill, 2 for C2A REUSE decode, else 0)
    cancel: str | None = None
    request_order: tuple[int, ...] | None = None  # a permutation of the batch's requests
    page_seed: int | None = None  # physical page layout (default: seed)
    batch: tuple[tuple[int, ...], tuple[int, ...]] | None = None  # (query lens, kv lens) instead of the default

    @property
    def layer(self) -> int:
        return REPRESENTATIVE_LAYER[self.kind]

    @property
    def label(self) -> str:
        extra = "" if self.batch is None else f"-q{'.'.join(map(str, self.batch[0]))}-kv{'.'.join(map(str, self.batch[1]))}"
        return f"{self.kind.value}-{self.phase}-TP{self.tp}-{self.wiring}{extra}"


def _batch(case: HalfLayerCase) -> tuple[tuple[int, ...], tuple[int, ...], int]:
    if case.phase == "decode":
        qlens, kvs = (1, 2, 3), (29, 40, 9)  # 2 < DECODE_ROWS_PER_REQUEST; history across pages; odd resumes
        padding = 2 if case.kind is LayerKind.C2A_REUSE else 0
    else:
        qlens, kvs = (11, 1, 6), (0, 37, 18)  # a new request, a decode-like row, a chunk resuming at an even pos
        padding = 3
    if case.batch is not None:
        qlens, kvs = case.batch
    if case.request_order is not None:
        qlens = tuple(qlens[i] for i in case.request_order)
        kvs = tuple(kvs[i] for i in case.request_order)
    return qlens, kvs, padding if case.padding is None else case.padding


def _gen(seed: int, tag: str, *key: int) -> torch.Generator:
    """A generator for one (tag, request, ...) so values follow the logical request, not its batch slot."""
    return torch.Generator().manual_seed(zlib.crc32(repr((seed, tag, *key)).encode()))  # stable across processes


def _history(cache: cache_abi.QuantCache, table: torch.Tensor, lengths: list[int], canon: list[int], seed: int,
             tag: str) -> cache_abi.QuantCache:
    """Publish history: logical row p of request r holds values drawn for (canonical request, p), wherever its
    page sits; unmapped pages keep their random bytes."""
    bs = cache.layout.rows_per_block
    slots, values = [], []
    for r, n in enumerate(lengths):
        v = torch.randn((n, cache.layout.logical_width), generator=_gen(seed, tag, canon[r]))
        for p in range(n):
            page = int(table[r, p // bs]) if p // bs < table.shape[1] else -1
            if page >= 0:
                slots.append(page * bs + p % bs)
                values.append(v[p])
    if not slots:
        return cache
    return cache_abi.cache_publish(cache, torch.stack(values), torch.tensor(slots, dtype=torch.int64))


def _rope_rows(table: tuple[torch.Tensor, torch.Tensor], positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    cos = torch.full((positions.shape[0], table[0].shape[1]), 17.0)
    sin = torch.full_like(cos, 19.0)
    materialize_rope_rows(table[0], table[1], positions, positions.shape[0], cos, sin)
    return cos, sin


def build(case: HalfLayerCase) -> dict[str, torch.Tensor]:
    """Every input the half-layer of ``case.kind`` reads (plus a few the invariance contracts use)."""
    c = case.config
    g = torch.Generator().manual_seed(case.seed)  # weights
    qlens, kvs, padding = _batch(case)
    canon = list(case.request_order or range(len(qlens)))
    page_seed = case.seed if case.page_seed is None else case.page_seed
    batch = BatchCase(config=c, query_lens=qlens, kv_lens=kvs, padding=padding, tp=case.tp,
                      inactive_state=(False,) * len(qlens), spare_pages=2, free_behind_window=True, seed=page_seed)
    kw = materialize(batch)
    meta = build_forward_metadata(**kw)
    gb = _gen(page_seed, "bytes")  # bytes of unmapped pages and blocks (never read)
    tokens, active = meta.capacity, meta.num_tokens
    hidden, heads, dim, lora = c.hidden_size, c.num_attention_heads, c.head_dim, c.q_lora_rank
    x = torch.full((tokens, hidden), SENTINEL, dtype=torch.bfloat16)  # inactive normalized rows: the 13.0 sentinel
    for r, n in enumerate(qlens):
        first = int(meta.query_start_loc[r])
        x[first:first + n] = torch.randn((n, hidden), generator=_gen(case.seed, "x", canon[r])).to(torch.bfloat16)
    new_kv = [k + q for k, q in zip(kvs, qlens, strict=True)]
    positions = meta.position_ids
    max_pos = int(kw["kv_seq_lens"].max()) + max(qlens) + 1
    token_table = precompute_rope_tables(max_pos, False, c)
    rope_cos, rope_sin = _rope_rows(token_table, positions)
    lay = cache_abi.layouts(c)
    wtable = kw["window_block_table"]
    wblocks = int(wtable.max()) + 3
    window = _history(cache_abi.empty_cache(lay["window"], wblocks, generator=gb), wtable, new_kv, canon, case.seed, "w")
    inputs: dict[str, torch.Tensor] = {
        "num_tokens": torch.tensor(active, dtype=torch.int32), "query_start_loc": meta.query_start_loc,
        "position_ids": positions, "token_to_req_indices": meta.token_to_req_indices,
        "rope_cos": rope_cos, "rope_sin": rope_sin, "window_block_table": wtable,
        "window_slots": meta.window_slots, "window_indices": meta.window_indices,
        "window_payload": window.payload, "window_scale": window.scale,
        "wq_a": torch.randn((hidden, lora), generator=g) / hidden**0.5,
        "q_norm": torch.rand(lora, generator=g) + 0.5,
        "wq_b": torch.randn((lora, heads * dim), generator=g) / lora**0.5,
        "wkv": torch.randn((hidden, dim), generator=g) / hidden**0.5,
        "kv_norm": torch.rand(dim, generator=g) + 0.5,
        "sink": torch.randn(heads, generator=g),
        "wo_a": (torch.randn((c.o_groups, c.o_lora_rank, heads * dim // c.o_groups), generator=g)
                 / (heads * dim // c.o_groups) ** 0.5).to(torch.bfloat16),
        "wo_b": torch.randn((c.o_groups * c.o_lora_rank, hidden), generator=g) / (c.o_groups * c.o_lora_rank) ** 0.5,
    }
    if case.kind is not LayerKind.SWA:
        inputs.update(_compressed_inputs(case, meta, kw, g, gb, new_kv, canon, max_pos))
    if case.cancel is not None:
        _cancel(inputs, case)
    if case.wiring == "sharded":
        bounds = sp_bounds(active, case.tp, tokens)
        slabs = torch.zeros((case.tp, bounds[0].width, hidden), dtype=torch.bfloat16)  # padding rows: exact zeros
        for rank, b in enumerate(bounds):
            slabs[rank, :b.count] = x[b.first:b.first + b.count]
        inputs["x"] = slabs
    else:
        inputs["x"] = x
    return inputs


def _compressed_inputs(case: HalfLayerCase, meta, kw: dict, g: torch.Generator, gb: torch.Generator,
                       new_kv: list[int], canon: list[int], max_pos: int) -> dict[str, torch.Tensor]:
    """The compressed / index caches, their tables, the compressor's and the indexer's weights (drawn from ``g``
    after the dense weights, in this order), the candidate mask or the reused selection of a non-SWA layer."""
    c = case.config
    src = c.schedule[case.layer].kv_source
    hidden, dim, lora = c.hidden_size, c.head_dim, c.q_lora_rank
    qlens = [int(n) for n in _batch(case)[0]]
    lay = cache_abi.layouts(c)
    inputs: dict[str, torch.Tensor] = {}
    ctable = kw["compressed_block_tables"][src]
    cblocks = int(ctable.max()) + 3
    ckind = "compressed_r2" if ratio_of(case.kind, c) == 2 else "compressed_r1"
    clens = [n // ratio_of(case.kind, c) for n in new_kv]
    compressed = _history(cache_abi.empty_cache(lay[ckind], cblocks, generator=gb), ctable, clens, canon,
                          case.seed, "c")
    index = _history(cache_abi.empty_cache(lay["index"], cblocks, generator=gb), ctable, clens, canon, case.seed,
                     "i")
    lens = meta.compressed_lens[src]
    inputs.update({"compressed_payload": compressed.payload, "compressed_scale": compressed.scale,
                   "compressed_block_table": ctable, "compressed_lens": lens})
    if case.kind not in REUSE:
        inputs.update({"index_payload": index.payload, "index_scale": index.scale})
    if case.kind in FULL:
        cmp_table = precompute_rope_tables(max_pos, True, c)
        ccos, csin = _rope_rows(cmp_table, meta.compressed_rope_position_ids[src])
        inputs.update({"compressed_slots": meta.compressed_slots[src], "compressed_rope_cos": ccos,
                       "compressed_rope_sin": csin,
                       "cmp_wkv": torch.randn((hidden, dim), generator=g) / hidden**0.5,
                       "cmp_norm": torch.rand(dim, generator=g) + 0.5,
                       "index_wk": torch.randn((dim, c.index_head_dim), generator=g) / dim**0.5,
                       "index_norm": torch.rand(c.index_head_dim, generator=g) + 0.5})
    if case.kind is LayerKind.C2A_FULL:
        stable = meta.state_block_tables[src]
        state = torch.rand((int(stable.max()) + 2, c.state_capacity, 2 * dim), generator=gb) * 8 - 4
        for r in range(len(qlens)):  # each request's ring holds values drawn for that request
            if int(stable[r, 0]) >= 0:
                state[int(stable[r, 0])] = torch.randn((c.state_capacity, 2 * dim),
                                                       generator=_gen(case.seed, "ring", canon[r]))
        inputs.update({"cmp_wgate": torch.randn((hidden, dim), generator=g) / hidden**0.5,
                       "state_cache": state, "state_block_table": stable})
    if case.kind in INDEXING:
        inputs.update({"index_wq_b": torch.randn((lora, c.index_n_heads * c.index_head_dim), generator=g)
                       / lora**0.5,
                       "index_weights_proj": torch.randn((hidden, c.index_n_heads), generator=g) / hidden**0.5})
    width = max(int(lens.max()), 1)
    if case.kind is LayerKind.C1A_REINDEX:
        inputs["candidate_mask"] = _candidates(lens, width, c, meta.token_to_req_indices, meta.position_ids,
                                               canon, case.seed)
    if case.kind in REUSE:
        inputs["topk_indices"] = _selection(lens, ctable, meta.token_to_req_indices, meta.position_ids, c, canon,
                                            case.seed)
    return inputs


def _candidates(lens: torch.Tensor, width: int, c: V41Config, req: torch.Tensor, pos: torch.Tensor, canon: list[int],
                seed: int) -> torch.Tensor:
    """Layer 20's candidate mask: random whole blocks of ``candidate_block_size`` plus the block of the last
    visible position (always kept, §5.2), drawn per (request, position)."""
    bs = c.candidate_block_size
    nblocks = -(-width // bs)
    mask = torch.zeros((lens.shape[0], nblocks * bs), dtype=torch.uint8)
    for t, n in enumerate(lens.tolist()):
        if n <= 0:
            continue
        draw = torch.rand(nblocks, generator=_gen(seed, "m", canon[int(req[t])], int(pos[t])))
        keep = {(n - 1) // bs} | {b for b in range(nblocks) if float(draw[b]) < 0.5}
        for b in keep:
            mask[t, b * bs:(b + 1) * bs] = 1
    return mask[:, :width].contiguous()


def _selection(lens: torch.Tensor, table: torch.Tensor, req: torch.Tensor, pos: torch.Tensor, c: V41Config,
               canon: list[int], seed: int) -> torch.Tensor:
    """A source layer's Top-K: min(topk, len) distinct visible positions in logical order, physical rows, -1
    padded (§5.1 step 7), drawn per (request, position)."""
    out = torch.full((lens.shape[0], c.index_topk), -1, dtype=torch.int32)
    bs = c.block_size
    for t, n in enumerate(lens.tolist()):
        if n <= 0:
            continue
        r = int(req[t])
        order = torch.randperm(n, generator=_gen(seed, "s", canon[r], int(pos[t])))
        chosen = sorted(order[:min(c.index_topk, n)].tolist())
        out[t, :len(chosen)] = torch.tensor([int(table[r, p // bs]) * bs + p % bs for p in chosen], dtype=torch.int32)
    return out


def _cancel(inputs: dict[str, torch.Tensor], case: HalfLayerCase) -> None:
    c, tp = case.config, case.tp
    per_head, per_group = c.num_attention_heads // tp, c.o_groups // tp
    dim, lora = c.head_dim, c.o_lora_rank
    factors = CANCEL[case.cancel]
    wq_b, sink, wo_a, wo_b = (inputs[k].clone() for k in ("wq_b", "sink", "wo_a", "wo_b"))
    cols = per_head * dim
    rows = per_group * lora
    for rank in range(1, tp):
        wq_b[:, rank * cols:(rank + 1) * cols] = wq_b[:, :cols]
        sink[rank * per_head:(rank + 1) * per_head] = sink[:per_head]
        wo_a[rank * per_group:(rank + 1) * per_group] = wo_a[:per_group]
    base = wo_b[:rows].clone()
    for rank in range(tp):
        wo_b[rank * rows:(rank + 1) * rows] = base * factors[rank]
    inputs.update({"wq_b": wq_b, "sink": sink, "wo_a": wo_a, "wo_b": wo_b})
