"""V4 decode metadata, lowered as upstream's V4 tree lowers it (spec §8; upstream decode_metadata.py).

V4 decodes ``decode_batch`` requests with MTP = 1, so ``decode_seq`` = 2 token rows per request. Unlike V4.1's
packed ForwardMetadata (variable query lengths, ``query_start_loc``, padding rows), the V4 decode batch is
dense and request-major: row t = b · seq + s holds request b's s-th token at position start[b] + s.

* ``position_ids`` [T] and ``kv_seq_lens`` [B] = start + committed tokens (all ``seq`` by default);
  starts must be >= 0 and start + seq must fit the kernel's maximum sequence length.
* ``ori_slot_mapping`` [T] INT64: the paged physical row table[b, pos // bs] · bs + pos % bs, -1 when the
  logical page lies past the table or is unmapped (-1): "-1 means no write".
* ``swa_indices`` [T, window] / ``swa_lens`` [T]: the visible window max(0, pos - window + 1) .. pos, oldest
  first; an unmapped page inside that range is a -1 hole, the columns past the length are -1.
* ``history_indices`` / ``history_lens``: the same window without the positions of this decode chunk up to
  and including the row's own (HCA / CSA attend those through their overlay), packed oldest first.
* ``cmp_slot_mapping`` {ratio: [T]}: a compressed row is written only when (pos + 1) % ratio == 0, at
  compressed column pos // ratio of the ratio's own paged table; ``commit_tokens`` masks the boundaries of
  uncommitted tokens to -1.
* ``state_slot_mapping`` {ratio: [T]}: the compressor state row of pos in the ratio's state pages (4 tokens a
  page for ratio 4, 8 for ratio 128).
* ``hca_topk``: HCA's deterministic compressed top-k: for row t, columns 0 .. valid-1 hold 0 .. valid-1 (the
  first, oldest compressed positions) and the rest -1, valid = min(limit, (pos + 1) // 128,
  kv_seq_len // 128), limit = min(max_seq_len // 128, index_topk).
* ``v4_prefill_swa_indices``: a prefill chunk's window (upstream prefill_attention_swa.py lowers it inside the
  stage): one request, a 1-D page table; row t < num_tokens at position p sees positions
  p + 1 - min(window, p + 1) .. p oldest first in columns 0 .., an unmapped page a -1 hole; padding rows all -1.

Spec: §8; the V4 section of docs/coverage.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch

from kernels.errors import ContractInputError, is_int
from kernels.operators import operator

SPEC = "§8"
ROUNDING_VERSION = "v4-decode-metadata-1"
RATIOS = (4, 128)


@dataclass(frozen=True)
class V4DecodeMetadata:
    position_ids: torch.Tensor  # [T] int32, row b * seq + s
    kv_seq_lens: torch.Tensor  # [B] int32
    ori_slot_mapping: torch.Tensor  # [T] int64
    swa_indices: torch.Tensor  # [T, window] int32
    swa_lens: torch.Tensor  # [T] int32
    history_indices: torch.Tensor  # [T, window] int32
    history_lens: torch.Tensor  # [T] int32
    cmp_slot_mapping: dict[int, torch.Tensor]  # ratio -> [T] int64
    state_slot_mapping: dict[int, torch.Tensor]  # ratio -> [T] int64


def _starts(starts: torch.Tensor, seq: int, max_seq_len: int) -> torch.Tensor:
    s = torch.as_tensor(starts)
    if s.ndim != 1 or s.numel() == 0 or s.is_floating_point():
        raise ContractInputError("starts", None, "integer [B] decode start positions", f"{s.dtype}{list(s.shape)}",
                                 SPEC)
    s = s.to(torch.int64)
    if bool((s < 0).any()):
        b = int((s < 0).nonzero()[0, 0])
        raise ContractInputError("starts", (b,), ">= 0", int(s[b]), SPEC)
    if bool((s + seq > max_seq_len).any()):
        b = int((s + seq > max_seq_len).nonzero()[0, 0])
        raise ContractInputError("starts", (b,), f"start + seq ({seq}) <= max_seq_len {max_seq_len}", int(s[b]), SPEC)
    return s


def paged_rows(positions: torch.Tensor, requests: torch.Tensor, table: torch.Tensor, block_size: int) -> torch.Tensor:
    """table[req, pos // bs] · bs + pos % bs, -1 past the table or on an unmapped (-1) page."""
    table = table.to(torch.int64)
    block = positions // block_size
    inside = block < table.shape[1]
    phys = table[requests, block.clamp(max=table.shape[1] - 1)]
    return torch.where(inside & (phys >= 0), phys * block_size + positions % block_size, -1)


def _windows(pos: torch.Tensor, req: torch.Tensor, seq: int, table: torch.Tensor, window: int, block_size: int,
             *, history: bool) -> tuple[torch.Tensor, torch.Tensor]:
    t = pos.numel()
    indices = torch.full((t, window), -1, dtype=torch.int64)
    lens = torch.zeros(t, dtype=torch.int64)
    for row in range(t):
        p, b = int(pos[row]), int(req[row])
        visible = torch.arange(max(0, p - window + 1), p + 1)
        if history:  # drop this chunk's positions up to the row's own: the overlay attends them
            chunk_first = p - row % seq
            visible = visible[visible < chunk_first]
        rows = paged_rows(visible, torch.full_like(visible, b), table, block_size)
        if history:
            rows = rows[rows >= 0]
        indices[row, :rows.numel()] = rows
        lens[row] = rows.numel()
    return indices.to(torch.int32), lens.to(torch.int32)


def check_tables(batch: int, ori_table: torch.Tensor, cmp_tables: Mapping[int, torch.Tensor],
                 state_tables: Mapping[int, torch.Tensor]) -> None:
    """The caller's side of the page tables: one row per request."""
    for name, table in (("ori_table", ori_table), *((f"cmp_tables[{r}]", t) for r, t in cmp_tables.items()),
                        *((f"state_tables[{r}]", t) for r, t in state_tables.items())):
        if table.ndim != 2 or table.shape[0] != batch:
            raise ContractInputError(name, None, f"[{batch}, pages] (one row per request)", list(table.shape), SPEC)


@operator(returns='V4DecodeMetadata (kernels.v4.decode_metadata): request-major MTP rows, slot '
                   'mappings, SWA and history windows',
          spec='§8')
def v4_decode_metadata(starts: torch.Tensor, ori_table: torch.Tensor, cmp_tables: Mapping[int, torch.Tensor],
                       state_tables: Mapping[int, torch.Tensor], *, config,
                       commit_tokens: int | None = None) -> V4DecodeMetadata:
    """Lower one V4 decode batch (see the module doc). ``config`` is a V4Config (its kernel preset's
    max_position bounds the starts). Spec: §8."""
    seq, bs, window = config.decode_seq, config.block_size, config.sliding_window
    s = _starts(starts, seq, config.max_position_embeddings)
    batch = s.numel()
    committed = seq if commit_tokens is None else commit_tokens
    if not is_int(committed) or not 0 <= committed <= seq:
        raise ContractInputError("commit_tokens", None, f"an int in [0, {seq}]", repr(commit_tokens), SPEC)
    check_tables(batch, ori_table, cmp_tables, state_tables)
    req = torch.arange(batch).repeat_interleave(seq)
    pos = s[req] + torch.arange(seq).repeat(batch)
    swa, swa_lens = _windows(pos, req, seq, ori_table, window, bs, history=False)
    hist, hist_lens = _windows(pos, req, seq, ori_table, window, bs, history=True)
    uncommitted = torch.arange(seq).repeat(batch) >= committed
    cmp, state = {}, {}
    for ratio, table in cmp_tables.items():
        boundary = (pos + 1) % ratio == 0
        rows = paged_rows(pos // ratio, req, table, bs)
        cmp[ratio] = torch.where(boundary & ~uncommitted, rows, -1)
    for ratio, table in state_tables.items():
        page = config.c4a_state_block_size if ratio == 4 else config.c128_state_block_size
        state[ratio] = paged_rows(pos, req, table, page)
    return V4DecodeMetadata(pos.to(torch.int32), (s + committed).to(torch.int32),
                            paged_rows(pos, req, ori_table, bs), swa, swa_lens, hist, hist_lens, cmp, state)


@operator(returns="[T, limit] INT32: HCA's deterministic compressed top-k (the first valid "
                   'positions, -1 after)',
          spec='§8')
def hca_topk(position_ids: torch.Tensor, kv_seq_lens: torch.Tensor, *, seq: int, limit: int,
             ratio: int = 128) -> torch.Tensor:
    """HCA's deterministic compressed top-k [T, limit] INT32: the first valid compressed positions, -1 after.
    Spec: §8."""
    if position_ids.ndim != 1 or position_ids.numel() != kv_seq_lens.numel() * seq:
        raise ContractInputError("position_ids", None, f"[{kv_seq_lens.numel() * seq}] (batch x seq rows)",
                                 list(position_ids.shape), SPEC)
    pos = position_ids.to(torch.int64)
    kv = kv_seq_lens.to(torch.int64).repeat_interleave(seq)
    valid = torch.minimum(torch.minimum((pos + 1) // ratio, kv // ratio), torch.tensor(limit))
    cols = torch.arange(limit)
    return torch.where(cols[None] < valid[:, None], cols[None], -1).to(torch.int32)


@operator(returns="[T, sliding_window] INT32: a prefill chunk's window, the last min(window, pos + "
                   '1) positions oldest first through the 1-D table (-1 holes), padding rows -1',
          spec='§8')
def v4_prefill_swa_indices(position_ids: torch.Tensor, block_table: torch.Tensor, num_tokens: int, *,
                           config) -> torch.Tensor:
    """A prefill chunk's SWA window [T, sliding_window] INT32 (see the module doc): one request's ``position_ids``
    [T], its 1-D ``block_table`` [pages] (-1: unmapped), rows from ``num_tokens`` on padding. Spec: §8."""
    window, bs = config.sliding_window, config.block_size
    if position_ids.ndim != 1 or position_ids.dtype not in (torch.int32, torch.int64):
        raise ContractInputError("position_ids", None, "a 1-D INT32/INT64 tensor",
                                 f"{position_ids.dtype}{list(position_ids.shape)}", SPEC)
    if block_table.ndim != 1 or block_table.dtype not in (torch.int32, torch.int64):
        raise ContractInputError("block_table", None, "a 1-D INT32/INT64 page table (one request)",
                                 f"{block_table.dtype}{list(block_table.shape)}", SPEC)
    tokens = position_ids.shape[0]
    if not is_int(num_tokens) or not 0 <= num_tokens <= tokens:
        raise ContractInputError("num_tokens", None, f"an int in [0, {tokens}]", repr(num_tokens), SPEC)
    pos = position_ids[:num_tokens].to(torch.int64)
    bad = (pos < 0) | (pos >= block_table.shape[0] * bs)
    if bool(bad.any()):
        t = int(bad.nonzero()[0])
        raise ContractInputError("position_ids", (t,), f"in [0, {block_table.shape[0] * bs}) (the table's pages)",
                                 int(pos[t]), SPEC)
    out = torch.full((tokens, window), -1, dtype=torch.int32)
    rows, _ = _windows(pos, torch.zeros_like(pos), num_tokens, block_table.reshape(1, -1), window, bs,
                       history=False)
    out[:num_tokens] = rows
    return out
