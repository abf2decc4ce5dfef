"""Golden paged indexer scoring, Top-K selection and hierarchical candidate blocks.

Spec: §5.1 (scoring and rounding steps), §5.2 (candidate blocks), §2.1 (physical rows).
"""

from __future__ import annotations

import torch

from kernels.errors import ContractInputError
from kernels.operators import operator

SPEC = "§5"
# Bump when the arithmetic or a rounding rule changes on purpose: goldens recorded before go stale.
ROUNDING_VERSION = "indexer-1"


def _bf16(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.bfloat16).float()


def index_head_weights(x: torch.Tensor, weights_proj: torch.Tensor, *, heads: int, dim: int) -> torch.Tensor:
    """Per-head weights [T, heads]: (x @ weights_proj) in FP32 -> BF16, then * dim^-0.5 * heads^-0.5 -> BF16.
    Spec: §5.1 step 2."""
    w = _bf16((x.double() @ weights_proj.double()).float())
    return _bf16(w * (dim ** -0.5) * (heads ** -0.5))


def logical_to_physical(block_table: torch.Tensor, request_ids: torch.Tensor, positions: torch.Tensor,
                        block_size: int) -> torch.Tensor:
    """Physical flattened rows ``table[req, pos//bs]*bs + pos%bs`` (positions [T, L] >= 0). Spec: §2.1."""
    req = request_ids.to(torch.long).unsqueeze(-1).expand_as(positions)
    page = torch.div(positions, block_size, rounding_mode="floor").clamp(max=block_table.shape[1] - 1)
    return block_table.to(torch.long)[req, page] * block_size + positions % block_size


@operator(returns='scores [T, L] FP32, -inf where masked', spec='§5.1')
def index_scores(q: torch.Tensor, head_weights: torch.Tensor, keys: torch.Tensor, block_table: torch.Tensor,
                       request_ids: torch.Tensor, compressed_lens: torch.Tensor, *, block_size: int,
                       width: int | None = None, candidates: torch.Tensor | None = None) -> torch.Tensor:
    """Scores [T, width] FP32 over request-local compressed positions; masked positions are -inf.

    ``q`` [T, H, Dk] (BF16, RoPE applied), ``head_weights`` [T, H], ``keys`` [rows, Dk] (the dequantized
    index cache, BF16). dots -> BF16; relu(dots) * w -> BF16; head sum -> BF16 -> FP32. Positions
    >= compressed_lens[t] and (REINDEX) outside ``candidates`` are -inf. Spec: §5.1.
    """
    if compressed_lens.ndim != 1 or compressed_lens.shape[0] != q.shape[0]:
        raise ContractInputError("compressed_lens", None, f"1-D with one entry per query token ({q.shape[0]})",
                                 f"shape {tuple(compressed_lens.shape)}", SPEC)
    lens = compressed_lens.to(torch.long)
    width = int(lens.max()) if width is None and lens.numel() else (width or 0)
    tokens = q.shape[0]
    if width == 0 or tokens == 0:
        return torch.full((tokens, width), float("-inf"))
    pos = torch.arange(width).expand(tokens, width)
    valid = pos < lens.unsqueeze(-1)
    rows = torch.where(valid, logical_to_physical(block_table, request_ids, pos, block_size), 0)
    k = _bf16(keys.float())[rows]  # [T, L, Dk]
    dots = _bf16(torch.einsum("thd,tld->thl", _bf16(q.float()).double(), k.double()).float())
    weighted = _bf16(torch.relu(dots) * head_weights.float().unsqueeze(-1))
    scores = _bf16(weighted.double().sum(1).float())
    mask = valid if candidates is None else valid & candidates[:, :width].to(torch.bool)
    return scores.masked_fill(~mask, float("-inf"))


@operator(returns='[T, topk] INT32 physical rows, logical order, -1 padded', spec='§5.1')
def select_topk(scores: torch.Tensor, block_table: torch.Tensor, request_ids: torch.Tensor, *, topk: int,
                block_size: int) -> torch.Tensor:
    """Top-K [T, topk] INT32 physical rows: the best min(topk, L) finite scores (ties to the lower logical
    position), sorted by logical position, left-compacted, -1 padded. Spec: §5.1 step 7."""
    tokens, width = scores.shape
    out = torch.full((tokens, topk), -1, dtype=torch.int32)
    k = min(topk, width)
    if k == 0 or tokens == 0:
        return out
    order = torch.sort(-scores, dim=-1, stable=True).indices[:, :k]
    chosen = torch.sort(order, dim=-1).values
    finite = torch.isfinite(scores.gather(-1, chosen))
    phys = logical_to_physical(block_table, request_ids, chosen, block_size)
    for t in range(tokens):
        rows = phys[t][finite[t]]
        out[t, : rows.numel()] = rows.to(torch.int32)
    return out


@operator(returns='U8 mask [T, width]', spec='§5.2')
def candidate_blocks(scores: torch.Tensor, compressed_lens: torch.Tensor, *, block: int, topk_blocks: int,
                            width: int | None = None) -> torch.Tensor:
    """U8 mask [T, width]: blocks of ``block`` positions ranked by their max score, the block holding
    position compressed_len-1 always kept, the best min(topk_blocks, nblocks) finite blocks expanded
    and cropped. Spec: §5.2."""
    tokens, length = scores.shape
    width = length if width is None else width
    nblocks = -(-length // block)
    padded = torch.full((tokens, nblocks * block), float("-inf"))
    padded[:, :length] = scores
    best = padded.unflatten(-1, (nblocks, block)).amax(-1)
    lens = compressed_lens.to(torch.long)
    has = lens > 0
    last = torch.div((lens - 1).clamp_min(0), block, rounding_mode="floor").clamp(max=max(nblocks - 1, 0))
    if nblocks:
        forced = best.clone()
        forced[has, last[has]] = float("inf")
        best = forced
    k = min(topk_blocks, nblocks)
    mask = torch.zeros((tokens, nblocks * block), dtype=torch.uint8)
    if k:
        vals, idx = torch.sort(-best, dim=-1, stable=True)
        keep_idx, keep_val = idx[:, :k], -vals[:, :k]
        for t in range(tokens):
            for b, v in zip(keep_idx[t].tolist(), keep_val[t].tolist(), strict=True):
                if v > float("-inf"):
                    mask[t, b * block:(b + 1) * block] = 1
    out = torch.zeros((tokens, width), dtype=torch.uint8)
    n = min(width, mask.shape[1])
    out[:, :n] = mask[:, :n]
    return out


def reuse_topk(source_topk: torch.Tensor) -> torch.Tensor:
    """REUSE layers take the source layer's Top-K as given (a copy). Spec: §2.3."""
    return source_topk.clone()
