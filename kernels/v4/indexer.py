"""CSA's learned indexer at decode: index scores over the INT8 index cache and the top-k compressed positions
(spec §8; upstream decode_indexer.py, the INT8 stand-in the tracked kernels use).

``v4_indexer_query`` (qr [T, Q_LORA] INT8 with its per-row scale, wq_b [Q_LORA, H·d] INT8 with per-column
scales):

1. q = ((FP32(qr · wq_b) · qr_scale[t]) · wq_b_scale[c]), viewed [T, H, d]: the exact integer sums cast to
   FP32, then the row scale, then the column scale, each product rounded to FP32 (the kernel's INT32 -> FP32
   cast, ``row_expand_mul``, ``col_expand_mul``; upstream's golden stages it the same way). One rounding of
   the exact product instead lands a BF16 tie of step 2 on the other side about once per 10^5 elements, and the
   INT8 codes of step 4 carry that into whole score rows;
2. the last ``qk_rope_head_dim`` dims get the forward adjacent-pair rotation with the **request's** table row
   (``cos`` / ``sin`` [B, rope/2]: both MTP rows of request b = t // seq use row b, as upstream's decode
   indexer takes them), then every element is rounded to BF16;
3. q = BF16(q) · hadamard [d, d] (BF16) in FP32;
4. one INT8 row per (token, head): amax = max(|row|, 1e-4), codes = round-half-even(row · 127 / amax),
   dequantization factor amax / 127.

``v4_indexer_scores``: for token t of request b, the visible compressed positions are
``visible = min(kv_seq_len[b] // 4, (position + 1) // 4, score_len)`` (``score_len`` = kernel max / 4); at
visible position j, read through the request's index block table, the INT8 key row k_j and its FP32 scale
s_j give ``score = s_j · Σ_h w[t, h] · relu(q_scale[t, h] · (q_i8[t, h] · k_j))`` -- the ReLU per head,
**before** the head weighting, and the head weights ``w = (x · weights_proj) · d^-0.5 · H^-0.5`` kept in FP32
(V4.1 rounds its head weights to BF16 twice: ``kernels.reference.indexer.index_head_weights``). Positions
past ``visible`` hold the lowest FP32 number. Arithmetic is FP64 around the INT8 codes; scores are rounded to
FP32 once.

``v4_indexer_topk``: the ``min(index_topk, visible)`` best visible positions in descending score order (ties
to the lower position), each plus ``offset`` (the window width the attention places the compressed keys
after), then -1 to the end of the ``score_len`` row. The order inside the prefix is not part of the ABI (the
attention reads a set; upstream's comparator judges the set with score bounds).

Spec: §8; docs/coverage.md, V4 section (V4-13).
"""

from __future__ import annotations

import torch

from kernels.errors import ContractInputError
from kernels.operators import operator
from kernels.reference.rope import rope_interleave
from kernels.v4.mtp import quantize_rows_int8

SPEC = "§8"
ROUNDING_VERSION = "v4-indexer-2"  # 2: the query dequantization staged in FP32 (step 1)
RATIO = 4
LOWEST = torch.finfo(torch.float32).min  # FP32_NEG_INF: the score of a position past the visible range


def score_len(config) -> int:
    """SCORE_LEN: the kernel's maximum sequence length over the ratio (one column per compressed position)."""
    return config.kernel_max_seq_len // RATIO


def _int8(name: str, t: torch.Tensor, shape: tuple[int, ...]) -> None:
    if t.dtype != torch.int8 or tuple(t.shape) != shape:
        raise ContractInputError(name, None, f"INT8 {list(shape)}", f"{t.dtype}{list(t.shape)}", SPEC)


def check_query_inputs(qr: torch.Tensor, qr_scale: torch.Tensor, wq_b: torch.Tensor, wq_b_scale: torch.Tensor,
                       hadamard: torch.Tensor, *, config) -> int:
    """The index query's operands (decode and prefill alike) -> T, or the field that is wrong. Spec: §8."""
    heads, dim = config.index_n_heads, config.index_head_dim
    if qr.ndim != 2:
        raise ContractInputError("qr", None, f"INT8 [T, {config.q_lora_rank}]", f"{qr.dtype}{list(qr.shape)}", SPEC)
    tokens = qr.shape[0]
    _int8("qr", qr, (tokens, config.q_lora_rank))
    _int8("wq_b", wq_b, (config.q_lora_rank, heads * dim))
    if qr_scale.shape != (tokens, 1) or wq_b_scale.shape != (heads * dim,):
        raise ContractInputError("qr_scale/wq_b_scale", None, f"[{tokens}, 1] / [{heads * dim}]",
                                 [list(qr_scale.shape), list(wq_b_scale.shape)], SPEC)
    for name, t in (("qr_scale", qr_scale), ("wq_b_scale", wq_b_scale)):  # the dequantization is staged in FP32
        if t.dtype != torch.float32:
            raise ContractInputError(name, None, "FP32", str(t.dtype).removeprefix("torch."), SPEC)
    if hadamard.shape != (dim, dim):
        raise ContractInputError("hadamard", None, f"[{dim}, {dim}]", list(hadamard.shape), SPEC)
    return tokens


QUERY_STAGING = ("bf16", "rope-bf16")  # the index query before the Hadamard (``index_query``)


def index_query(qr: torch.Tensor, qr_scale: torch.Tensor, wq_b: torch.Tensor, wq_b_scale: torch.Tensor,
                row_cos: torch.Tensor, row_sin: torch.Tensor, hadamard: torch.Tensor, *,
                config, staging: str = "bf16") -> tuple[torch.Tensor, torch.Tensor]:
    """Steps 1-4 with each row's own table row (``row_cos`` / ``row_sin`` [T, rope/2]; operands checked by
    ``check_query_inputs``) -> (q_i8 [T, H, d] INT8, q_scale [T, H, 1] FP32). ``staging``, the named rules for the
    query the Hadamard rotates: "bf16" (the whole rotated query rounded to BF16: the kernels, and every indexer
    golden but one) or "rope-bf16" (only its rotated rope dims rounded, the nope dims kept in FP32: Flash-MTP's
    prefill_cp_csa.py golden; disagreement 25 of docs/upstream.md). Spec: §8."""
    if staging not in QUERY_STAGING:
        raise ContractInputError("query_staging", None, f"one of {QUERY_STAGING}", repr(staging), SPEC)
    tokens, heads, dim = qr.shape[0], config.index_n_heads, config.index_head_dim
    acc = qr.to(torch.int64) @ wq_b.to(torch.int64)  # exact (|sum| <= 127 · 127 · Q_LORA < 2^31)
    q = (acc.to(torch.float32) * qr_scale.float()) * wq_b_scale.float()  # three FP32 roundings, in this order
    q = q.reshape(tokens, heads, dim)
    q = rope_interleave(q, row_cos.float().unsqueeze(1), row_sin.float().unsqueeze(1))
    if staging == "bf16":
        q = q.to(torch.bfloat16)
    else:
        rope = config.qk_rope_head_dim
        q = torch.cat((q[..., :-rope], q[..., -rope:].to(torch.bfloat16).float()), dim=-1)
    q = (q.double() @ hadamard.double()).float()
    return quantize_rows_int8(q, scale_max=config.int8_scale_max, amax_eps=config.int8_amax_eps)


def v4_indexer_query(qr: torch.Tensor, qr_scale: torch.Tensor, wq_b: torch.Tensor, wq_b_scale: torch.Tensor,
                     cos: torch.Tensor, sin: torch.Tensor, hadamard: torch.Tensor, *,
                     config) -> tuple[torch.Tensor, torch.Tensor]:
    """-> (q_i8 [T, H, d] INT8, q_scale [T, H, 1] FP32): the index query of every (token, head), each row rotated
    with its request's table row. Spec: §8."""
    rope, seq = config.qk_rope_head_dim, config.decode_seq
    tokens = check_query_inputs(qr, qr_scale, wq_b, wq_b_scale, hadamard, config=config)
    if tokens % seq:
        raise ContractInputError("qr", None, f"a multiple of decode_seq={seq} rows (request-major)", tokens, SPEC)
    for name, table in (("cos", cos), ("sin", sin)):
        if table.shape != (tokens // seq, rope // 2):
            raise ContractInputError(name, None, f"[{tokens // seq} requests, {rope // 2}]", list(table.shape), SPEC)
    req = torch.arange(tokens) // seq
    return index_query(qr, qr_scale, wq_b, wq_b_scale, cos[req], sin[req], hadamard, config=config)


def head_weights(x: torch.Tensor, weights_proj: torch.Tensor, *, config) -> torch.Tensor:
    """[T, H] FP64 holding FP32 products: (x · weights_proj) rounded to FP32 once, times d^-0.5 · H^-0.5 (kept
    in FP32 arithmetic, not rounded to BF16 as V4.1 does). Spec: §8."""
    heads, dim = config.index_n_heads, config.index_head_dim
    if x.ndim != 2 or weights_proj.shape != (x.shape[1], heads):
        raise ContractInputError("weights_proj", None, f"[{x.shape[-1]}, {heads}]", list(weights_proj.shape), SPEC)
    return (x.double() @ weights_proj.double()).float().double() * (dim**-0.5 * heads**-0.5)


def visible_lengths(position_ids: torch.Tensor, kv_seq_lens: torch.Tensor, *, seq: int, limit: int) -> torch.Tensor:
    """[T]: min(kv_seq_len // 4, (position + 1) // 4, limit) for each request-major row. Spec: §8."""
    pos = position_ids.reshape(-1).to(torch.int64)
    lens = kv_seq_lens.reshape(-1).to(torch.int64)
    if lens.shape[0] * seq != pos.shape[0]:
        raise ContractInputError("kv_seq_lens", None, f"{pos.shape[0] // seq} requests ({pos.shape[0]} rows / {seq})",
                                 lens.shape[0], SPEC)
    for name, values in (("position_ids", pos), ("kv_seq_lens", lens)):
        if bool((values < 0).any()):
            i = int((values < 0).nonzero()[0])
            raise ContractInputError(name, (i,), ">= 0", int(values[i]), SPEC)
    return torch.minimum(torch.minimum(lens.repeat_interleave(seq) // RATIO, (pos + 1) // RATIO), torch.tensor(limit))


def check_index_cache(idx_kv_cache: torch.Tensor, idx_kv_scale: torch.Tensor, *, config) -> None:
    bs, dim = config.block_size, config.index_head_dim
    if idx_kv_cache.dtype != torch.int8 or idx_kv_cache.ndim != 4 or idx_kv_cache.shape[1:] != (bs, 1, dim):
        raise ContractInputError("idx_kv_cache", None, f"INT8 [blocks, {bs}, 1, {dim}]",
                                 f"{idx_kv_cache.dtype}{list(idx_kv_cache.shape)}", SPEC)
    if idx_kv_scale.shape != (idx_kv_cache.shape[0], bs, 1, 1):
        raise ContractInputError("idx_kv_scale", None, f"[{idx_kv_cache.shape[0]}, {bs}, 1, 1]",
                                 list(idx_kv_scale.shape), SPEC)


def visible_pages(pages: torch.Tensor, where: tuple, n: int, *, block_size: int) -> torch.Tensor:
    """The caller's side of reading ``n`` visible positions through one page table: every page they fall on is
    mapped (>= 0) and inside the table, else the table (``where``: its index) is refused. -> pages INT64."""
    pages = pages.to(torch.int64)
    if n > pages.numel() * block_size or bool((pages[: (n + block_size - 1) // block_size] < 0).any()):
        raise ContractInputError("idx_block_table", where, f"mapped pages for {n} visible positions", pages.tolist(),
                                 SPEC)
    return pages


def score_rows(q_i8: torch.Tensor, q_scale: torch.Tensor, weights: torch.Tensor, idx_kv_cache: torch.Tensor,
               idx_kv_scale: torch.Tensor, tables: list[tuple[torch.Tensor, tuple]], visible: torch.Tensor, *,
               width: int, block_size: int) -> torch.Tensor:
    """The score rule over each row's first ``visible[t]`` compressed positions, read through its page table
    ``tables[t]`` = (pages, the table's index for an error) -> [T, width] FP32, the lowest FP32 number past
    ``visible``. Spec: §8."""
    tokens, _heads, dim = q_i8.shape
    keys = idx_kv_cache.reshape(-1, dim).to(torch.int64)
    key_scale = idx_kv_scale.reshape(-1).double()
    out = torch.full((tokens, width), LOWEST, dtype=torch.float32)
    for t in range(tokens):
        n = int(visible[t])
        if n == 0:
            continue
        j = torch.arange(n)
        pages = visible_pages(*tables[t], n, block_size=block_size)
        rows = pages[j // block_size] * block_size + j % block_size
        dots = q_i8[t].to(torch.int64) @ keys[rows].T  # [H, n] exact
        per_head = torch.relu(dots.double() * q_scale[t].double())  # the ReLU per head, before the weights
        score = (per_head * weights[t].double().unsqueeze(1)).sum(0) * key_scale[rows]
        out[t, :n] = score.float()
    return out


def v4_indexer_scores(q_i8: torch.Tensor, q_scale: torch.Tensor, weights: torch.Tensor, idx_kv_cache: torch.Tensor,
                      idx_kv_scale: torch.Tensor, idx_block_table: torch.Tensor, position_ids: torch.Tensor,
                      kv_seq_lens: torch.Tensor, *, config) -> torch.Tensor:
    """q_i8 [T, H, d], q_scale [T, H, 1], weights [T, H] (from ``v4_indexer_query`` and the head projection)
    -> scores [T, score_len] FP32 (the lowest FP32 number past each row's visible length). Spec: §8."""
    seq, width = config.decode_seq, score_len(config)
    check_index_cache(idx_kv_cache, idx_kv_scale, config=config)
    visible = visible_lengths(position_ids, kv_seq_lens, seq=seq, limit=width)
    tables = [(idx_block_table[t // seq], (t // seq,)) for t in range(q_i8.shape[0])]
    return score_rows(q_i8, q_scale, weights, idx_kv_cache, idx_kv_scale, tables, visible, width=width,
                      block_size=config.block_size)


def v4_indexer_topk(scores: torch.Tensor, visible: torch.Tensor, *, topk: int, offset: int) -> torch.Tensor:
    """-> [T, score_len] INT32: the min(topk, visible) best visible positions, best first (ties to the lower
    position), plus ``offset``; -1 after. Spec: §8."""
    tokens, width = scores.shape
    out = torch.full((tokens, width), -1, dtype=torch.int32)
    for t in range(tokens):
        n = int(visible[t])
        k = min(topk, n)
        if k == 0:
            continue
        order = torch.sort(-scores[t, :n].double(), stable=True).indices[:k]
        out[t, :k] = (order + offset).to(torch.int32)
    return out


@operator(returns='{score [T, kernel_max/4] FP32 (lowest FP32 past visible), topk_idxs [T, '
                   "kernel_max/4] INT32 (best first, + offset, -1 after)}: CSA's decode indexer",
          spec='§8')
def v4_indexer(x: torch.Tensor, qr: torch.Tensor, qr_scale: torch.Tensor, wq_b: torch.Tensor,
               wq_b_scale: torch.Tensor, weights_proj: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
               hadamard: torch.Tensor, idx_kv_cache: torch.Tensor, idx_kv_scale: torch.Tensor,
               idx_block_table: torch.Tensor, position_ids: torch.Tensor, kv_seq_lens: torch.Tensor, *, offset: int,
               config) -> dict[str, torch.Tensor]:
    """The decode indexer after its compressor has written the index cache: -> {"score" [T, score_len] FP32,
    "topk_idxs" [T, score_len] INT32}. x [T, hidden] BF16; weights_proj [hidden, H] BF16. Spec: §8."""
    weights = head_weights(x, weights_proj, config=config)
    q_i8, q_scale = v4_indexer_query(qr, qr_scale, wq_b, wq_b_scale, cos, sin, hadamard, config=config)
    scores = v4_indexer_scores(q_i8, q_scale, weights, idx_kv_cache, idx_kv_scale, idx_block_table, position_ids,
                               kv_seq_lens, config=config)
    visible = visible_lengths(position_ids, kv_seq_lens, seq=config.decode_seq, limit=score_len(config))
    return {"score": scores, "topk_idxs": v4_indexer_topk(scores, visible, topk=config.index_topk, offset=offset)}
