"""CSA's learned indexer on a prefill chunk: index scores over the INT8 index cache and each row's compressed
top-k (spec §8; upstream prefill_indexer.py, after its compressor has written the cache).

A prefill chunk is one request of T rows (``num_tokens`` real, the rest padding). It differs from the decode
indexer (``kernels.v4.indexer``) in four rules, and shares everything else -- the INT8 query (qr · wq_b,
rotation, BF16, Hadamard, one INT8 row per (token, head)), the FP32 head weights, the per-head ReLU before the
weighting, the INT8 index cache with one FP32 scale per row:

1. **RoPE per row**: ``cos`` / ``sin`` are [T, rope/2], one table row per token (the decode indexer uses one
   row per request);
2. **visible range**: ``visible[t] = min((position[t] + 1) // 4, score_cap)`` with ``score_cap = 2 · block_size``
   (upstream's INDEXER_SCORE_CAP, 256 at block size 128) -- no kv-length term (the chunk's own compressor wrote
   the cache up to its last row), and the score row is ``score_cap`` wide, not kernel max / 4;
3. **no window offset**: the top-k holds raw compressed positions 0 .. visible - 1, best first (ties to the
   lower position), -1 after (the prefill attention takes them as given);
4. **padding rows**: rows from ``num_tokens`` on are never scored -- their score row is the lowest FP32 number
   throughout and their top-k is -1 (``padding_rows="unscored"``, upstream's kernel: it initialises the rows
   and scores only t < num_tokens). Upstream's Torch golden instead scores a padding row from its own position
   and still writes a -1 top-k; that variant is ``padding_rows="scored"``.

Spec: §8; docs/coverage.md, V4 section (V4-13).
"""

from __future__ import annotations

import torch

from kernels.errors import ContractInputError, is_int
from kernels.operators import operator
from kernels.v4.indexer import (
    RATIO,
    check_index_cache,
    check_query_inputs,
    head_weights,
    index_query,
    score_rows,
    v4_indexer_topk,
)

SPEC = "§8"
ROUNDING_VERSION = "v4-prefill-indexer-1"
SCORE_BLOCKS = 2  # INDEXER_SCORE_MAX_BLOCKS: the score row spans two cache blocks
PADDING_RULES = ("unscored", "scored", "scored_capped")


def score_cap(config) -> int:
    """INDEXER_SCORE_CAP: the prefill score row's width, two cache blocks."""
    return SCORE_BLOCKS * config.block_size


def prefill_visible(position_ids: torch.Tensor, num_tokens: int, *, cap: int, padding_rows: str) -> torch.Tensor:
    """[T]: min((position + 1) // 4, cap) for each real row; a padding row 0 ("unscored", upstream's kernel), its
    own ("scored"), or its own capped at the widest real row's ("scored_capped", upstream's golden, which scores
    the whole chunk over the real rows' columns). Spec: §8."""
    pos = position_ids.reshape(-1).to(torch.int64)
    if bool((pos < 0).any()):
        i = int((pos < 0).nonzero()[0])
        raise ContractInputError("position_ids", (i,), ">= 0", int(pos[i]), SPEC)
    visible = torch.clamp((pos + 1) // RATIO, max=cap)
    if padding_rows == "unscored":
        visible[num_tokens:] = 0
    elif padding_rows == "scored_capped":
        widest = int(visible[:num_tokens].max()) if num_tokens else 0
        visible[num_tokens:] = torch.clamp(visible[num_tokens:], max=widest)
    return visible


def check_prefill_indexer(qr, qr_scale, wq_b, wq_b_scale, cos, sin, hadamard, idx_kv_cache, idx_kv_scale,
                          idx_block_table, position_ids, num_tokens, *, config, padding_rows: str = "unscored"
                          ) -> tuple[int, torch.Tensor]:
    """The caller's side of ``v4_prefill_indexer`` -> (T, each row's visible compressed positions)."""
    if padding_rows not in PADDING_RULES:
        raise ContractInputError("padding_rows", None, f"one of {PADDING_RULES}", padding_rows, SPEC)
    tokens = check_query_inputs(qr, qr_scale, wq_b, wq_b_scale, hadamard, config=config)
    rope = config.qk_rope_head_dim
    for name, table in (("cos", cos), ("sin", sin)):
        if table.shape != (tokens, rope // 2):
            raise ContractInputError(name, None, f"[{tokens} rows, {rope // 2}] (one table row per token)",
                                     list(table.shape), SPEC)
    if position_ids.shape != (tokens,):
        raise ContractInputError("position_ids", None, f"[{tokens}]", list(position_ids.shape), SPEC)
    if not is_int(num_tokens) or not 0 <= num_tokens <= tokens:
        raise ContractInputError("num_tokens", None, f"an int in [0, {tokens}]", num_tokens, SPEC)
    if idx_block_table.ndim != 1:
        raise ContractInputError("idx_block_table", None, "[P] (the one request's pages)",
                                 list(idx_block_table.shape), SPEC)
    check_index_cache(idx_kv_cache, idx_kv_scale, config=config)
    cap = score_cap(config)
    visible = prefill_visible(position_ids, num_tokens, cap=cap, padding_rows=padding_rows)
    return tokens, visible


@operator(returns='{score [T, 2*bs] FP32 (lowest FP32 past visible and on padding rows), topk_idxs '
                   "[T, 2*bs] INT32 (raw positions best first, -1 after)}: CSA's indexer on a "
                   'prefill chunk',
          spec='§8')
def v4_prefill_indexer(x: torch.Tensor, qr: torch.Tensor, qr_scale: torch.Tensor, wq_b: torch.Tensor,
                       wq_b_scale: torch.Tensor, weights_proj: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                       hadamard: torch.Tensor, idx_kv_cache: torch.Tensor, idx_kv_scale: torch.Tensor,
                       idx_block_table: torch.Tensor, position_ids: torch.Tensor, num_tokens: int, *, config,
                       padding_rows: str = "unscored", query_staging: str = "bf16") -> dict[str, torch.Tensor]:
    """One request's prefill chunk -> {"score" [T, score_cap] FP32, "topk_idxs" [T, score_cap] INT32}. x [T, hidden]
    BF16; cos / sin [T, rope/2] FP32 (a row each); idx_block_table [P] (the request's pages); num_tokens: rows
    from it on are padding; ``query_staging``: ``kernels.v4.indexer.index_query``'s named rules. Spec: §8."""
    weights = head_weights(x, weights_proj, config=config)
    tokens, visible = check_prefill_indexer(qr, qr_scale, wq_b, wq_b_scale, cos, sin, hadamard, idx_kv_cache,
                                            idx_kv_scale, idx_block_table, position_ids, num_tokens, config=config,
                                            padding_rows=padding_rows)
    cap = score_cap(config)
    q_i8, q_scale = index_query(qr, qr_scale, wq_b, wq_b_scale, cos, sin, hadamard, config=config,
                                staging=query_staging)
    scores = score_rows(q_i8, q_scale, weights, idx_kv_cache, idx_kv_scale,
                        [(idx_block_table, ())] * tokens, visible, width=cap, block_size=config.block_size)
    visible[num_tokens:] = 0  # a padding row's top-k is -1 under both rules
    return {"score": scores, "topk_idxs": v4_indexer_topk(scores, visible, topk=config.index_topk, offset=0)}
