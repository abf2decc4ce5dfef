"""V4's paged compressors (spec §8): ratio 128 (HCA, no overlap) and ratio 4 (CSA, overlapping windows), and
CSA's pair of them (the main compressor and the indexer's inner compressor, each with its own state pool).

For each token (in the order given; a decode chunk is each request's rows in position order):

* kv = x · wkv and score = x · wgate + ape[pos % ratio] (FP32, ``coff · d`` channels: coff = 2 with overlap);
* the pair is written to the token's state row: physical page table[req, pos // page] row pos % page of the
  state pool [pages, page, 2 · coff · d] (kv channels, then score channels); the block table realizes the ring
  (later logical blocks reuse the physical pages), so only rows of the last window(s) are ever read;
* when (pos + 1) % ratio == 0 the window closes: without overlap the rows of positions pos - ratio + 1 .. pos
  are pooled, per channel sum(kv · softmax(score)); with overlap (ratio 4) the previous window's positions
  pos - 2·ratio + 1 .. pos - ratio contribute their first d channels and the current window's positions their
  last d channels (8 rows pooled into d channels); positions before 0 take no part; the pooled row is RMS-
  normalised (FP32, times the weight) and **stays FP32**: the compressed value before its RoPE. V4 rounds it
  once, to the cache's BF16, after the rotation (``v4_publish_compressed``; upstream's decode_compressor_ratio4
  / ratio128 goldens rotate the FP32 row and round on the cache write).

Spec: §8 (C4A / C128 state pages 4 / 8, HCA / CSA paths); docs/coverage.md, V4 section.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kernels.errors import ContractInputError
from kernels.operators import operator
from kernels.reference.compressor import project

SPEC = "§8"
ROUNDING_VERSION = "v4-compressor-2"


@dataclass(frozen=True)
class V4CompressorWeights:
    """``wkv`` / ``wgate`` [hidden, coff·d], ``ape`` [ratio, coff·d] FP32, ``norm`` [d]."""

    wkv: torch.Tensor
    wgate: torch.Tensor
    ape: torch.Tensor
    norm: torch.Tensor


def _slot(table: torch.Tensor, req: int, pos: int, page: int, pages: int) -> int:
    if pos // page >= table.shape[1]:
        raise ContractInputError("state_block_table", (req,), f"a page for position {pos} (logical block "
                                 f"{pos // page})", f"{table.shape[1]} blocks", SPEC)
    phys = int(table[req, pos // page])
    if not 0 <= phys < pages:
        raise ContractInputError("state_block_table", (req, pos // page), f"a page in [0, {pages})", phys, SPEC)
    return phys * page + pos % page


def check_v4_compressor(state_pool: torch.Tensor, weights: V4CompressorWeights, *, ratio: int, overlap: bool) -> None:
    """The caller's side of ``v4_compressor``: weights and state pool shaped for the ratio and overlap."""
    coff = 2 if overlap else 1
    d = weights.norm.shape[0]
    if weights.wkv.shape[1] != coff * d or weights.ape.shape != (ratio, coff * d):
        raise ContractInputError("weights", None, f"wkv / wgate [hidden, {coff * d}] and ape [{ratio}, {coff * d}]",
                                 [list(weights.wkv.shape), list(weights.ape.shape)], SPEC)
    if state_pool.ndim != 3 or state_pool.shape[2] != 2 * coff * d or state_pool.dtype != torch.float32:
        raise ContractInputError("state_pool", None, f"FP32 [pages, page, {2 * coff * d}]",
                                 f"{state_pool.dtype}{list(state_pool.shape)}", SPEC)


@operator(returns='(compressed [T,d] FP32 (rounded once, after its RoPE, on publication), closes '
                   "[T] bool, new state pool): V4's ratio-128 / ratio-4 compressor",
          spec='§8')
def v4_compressor(x: torch.Tensor, position_ids: torch.Tensor, token_to_req: torch.Tensor,
                  state_block_table: torch.Tensor, state_pool: torch.Tensor, weights: V4CompressorWeights, *,
                  ratio: int, overlap: bool, eps: float = 1e-6) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x [T, hidden] -> (compressed [T, d] FP32, zero where no window closes; closes [T] bool; the new state
    pool). The input pool is not modified. Spec: §8."""
    check_v4_compressor(state_pool, weights, ratio=ratio, overlap=overlap)
    coff = 2 if overlap else 1
    d = weights.norm.shape[0]
    pages, page, _ = state_pool.shape
    pool = state_pool.clone().reshape(pages * page, 2 * coff * d)
    kv = project(x, weights.wkv)
    score = project(x, weights.wgate)
    out = torch.zeros(x.shape[0], d, dtype=torch.float32)
    closes = torch.zeros(x.shape[0], dtype=torch.bool)
    for t in range(x.shape[0]):
        p, b = int(position_ids[t]), int(token_to_req[t])
        if p < 0:
            continue
        pool[_slot(state_block_table, b, p, page, pages)] = torch.cat((kv[t], score[t] + weights.ape[p % ratio]))
        if (p + 1) % ratio:
            continue
        out[t] = pooled_window(pool, lambda q, b=b: _slot(state_block_table, b, q, page, pages), p, weights,
                               ratio=ratio, overlap=overlap, eps=eps)
        closes[t] = True
    return out, closes, pool.reshape(pages, page, 2 * coff * d)


def pooled_window(pool: torch.Tensor, slot, p: int, weights: V4CompressorWeights, *, ratio: int, overlap: bool,
                  eps: float) -> torch.Tensor:
    """The FP32 row of the window closing at position p, read from the state rows ``pool`` [rows, 2·coff·d]
    (``slot(q)``: position q's row): with overlap the previous window's first-half channels and this window's
    second-half ones (positions before 0 take no part), pooled per channel by softmax of the scores,
    RMS-normalised with ``eps`` times the norm weight. Spec: §8."""
    d = weights.norm.shape[0]
    w = (2 if overlap else 1) * d
    rows_kv, rows_score = [], []
    if overlap:
        for q in range(p - 2 * ratio + 1, p - ratio + 1):
            if q >= 0:
                row = pool[slot(q)]
                rows_kv.append(row[:d])
                rows_score.append(row[w:w + d])
    lo = d if overlap else 0
    for q in range(p - ratio + 1, p + 1):
        row = pool[slot(q)]
        rows_kv.append(row[lo:lo + d])
        rows_score.append(row[w + lo:w + lo + d])
    weight = torch.stack(rows_score).softmax(dim=0)
    pooled = (torch.stack(rows_kv) * weight).sum(dim=0)
    return pooled * torch.rsqrt(pooled.pow(2).mean() + eps) * weights.norm.float()


@operator(returns="{compressed, index_key, closes, main_pool, inner_pool}: CSA's main and inner "
                   'compressors',
          spec='§8')
def csa_compressors(x: torch.Tensor, position_ids: torch.Tensor, token_to_req: torch.Tensor,
                    main_table: torch.Tensor, main_pool: torch.Tensor, main: V4CompressorWeights,
                    inner_table: torch.Tensor, inner_pool: torch.Tensor, inner: V4CompressorWeights, *,
                    ratio: int = 4, eps: float = 1e-6, ops=None) -> dict[str, torch.Tensor]:
    """CSA's two ratio-4 overlapping compressors: the main one (the compressed KV) and the indexer's inner one
    (the index keys), each reading and writing only its own state pool through its own table. Spec: §8."""
    compress = (ops or {}).get("v4_compressor", v4_compressor)
    m_out, m_closes, m_pool = compress(x, position_ids, token_to_req, main_table, main_pool, main, ratio=ratio,
                                       overlap=True, eps=eps)
    i_out, _, i_pool = compress(x, position_ids, token_to_req, inner_table, inner_pool, inner, ratio=ratio,
                                overlap=True, eps=eps)
    return {"compressed": m_out, "index_key": i_out, "closes": m_closes, "main_pool": m_pool, "inner_pool": i_pool}


csa_compressors.composes_operators = True


def check_cmp_pool(cmp_pool: torch.Tensor, d: int) -> None:
    """The compressed KV pool a closed row is published into: [blocks, page, 1, d]."""
    if cmp_pool.ndim != 4 or cmp_pool.shape[2] != 1 or cmp_pool.shape[3] != d:
        raise ContractInputError("cmp_pool", None, f"[blocks, page, 1, {d}]", list(cmp_pool.shape), SPEC)


def cmp_slot(cmp_slot_mapping: torch.Tensor, t: int, rows: int) -> int:
    """Token t's compressed slot: -1 (no write) or a row of the pool's ``rows``; anything else is refused."""
    slot = int(cmp_slot_mapping[t])
    if slot >= rows:
        raise ContractInputError("cmp_slot_mapping", (t,), f"a row in [0, {rows})", slot, SPEC)
    return slot


@operator(returns="the new cmp pool: each closed window's row, RoPE'd at the window's first "
                   'position, at its slot',
          spec='§8')
def v4_publish_compressed(compressed: torch.Tensor, closes: torch.Tensor, position_ids: torch.Tensor,
                          cmp_slot_mapping: torch.Tensor, cmp_pool: torch.Tensor, rope_cos: torch.Tensor,
                          rope_sin: torch.Tensor, *, ratio: int) -> torch.Tensor:
    """Write each closed window's FP32 row into the compressed KV pool [blocks, page, 1, d] (BF16): its last rope
    dims rotated (adjacent pairs, FP32) by the compressed-profile table row of the window's first position
    pos - ratio + 1, then rounded once to the pool's dtype, at its slot of ``cmp_slot_mapping`` (-1: no write,
    e.g. an uncommitted token). Other bytes are kept; the input pool is not modified. Spec: §8."""
    from kernels.reference.rope import rope_interleave

    if compressed.dtype != torch.float32:
        raise ContractInputError("compressed", None, "the FP32 rows of v4_compressor (a BF16 row would round twice)",
                                 str(compressed.dtype), SPEC)
    check_cmp_pool(cmp_pool, compressed.shape[1])
    pool = cmp_pool.clone()
    flat = pool.reshape(-1, compressed.shape[1])
    for t in closes.nonzero().flatten().tolist():
        slot = cmp_slot(cmp_slot_mapping, t, flat.shape[0])
        if slot < 0:
            continue
        start = int(position_ids[t]) - ratio + 1
        row = rope_interleave(compressed[t:t + 1], rope_cos[start:start + 1], rope_sin[start:start + 1])
        flat[slot] = row[0].to(pool.dtype)
    return pool


@operator(returns="{closes [T] bool, state_pool, cmp_pool}: v4_compressor then v4_publish_compressed in one call "
                  "(each closed window's row RoPE'd at the window's first position, rounded once into the pool)",
          spec="§8")
def v4_compress_and_publish(x: torch.Tensor, position_ids: torch.Tensor, token_to_req: torch.Tensor,
                            state_block_table: torch.Tensor, state_pool: torch.Tensor, weights: V4CompressorWeights,
                            cmp_slot_mapping: torch.Tensor, cmp_pool: torch.Tensor, rope_cos: torch.Tensor,
                            rope_sin: torch.Tensor, *, ratio: int, overlap: bool, ops=None) -> dict[str, torch.Tensor]:
    """The decode compressor as upstream's goldens run it: pool, normalise, rotate and publish in one (its
    compressed rows are not an output: upstream's carry the rotation). Spec: §8."""
    ops = ops or {}
    compress = ops.get("v4_compressor", v4_compressor)
    publish = ops.get("v4_publish_compressed", v4_publish_compressed)
    out, closes, pool = compress(x, position_ids, token_to_req, state_block_table, state_pool, weights, ratio=ratio,
                                 overlap=overlap)  # the compressor's own epsilon
    new = publish(out, closes, position_ids, cmp_slot_mapping, cmp_pool, rope_cos, rope_sin, ratio=ratio)
    return {"closes": closes, "state_pool": pool, "cmp_pool": new}


v4_compress_and_publish.composes_operators = True
