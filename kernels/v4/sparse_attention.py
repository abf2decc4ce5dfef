"""V4 decode sparse attention with the fused grouped output projection (spec §8; upstream
decode_sparse_attn.py (CSA), decode_sparse_attn_hca.py (HCA), decode_sparse_attn_swa.py (SWA)).

The three V4 paths share one kernel shape and differ only in where the compressed positions come from:

* **SWA** attends the sliding window only (no compressed positions).
* **HCA** takes ``cmp_indices`` as given: HCA's deterministic top-k (``hca_topk``), already bounded.
* **CSA** takes the indexer's raw top-k ``idx_topk`` [T, >= index_topk] (its first ``index_topk`` columns)
  and keeps a raw slot only when ``0 <= raw < (position + 1) // 4`` -- the causal bound of a ratio-4 cache;
  everything else is -1 (``csa_compressed_indices``).

Compressed positions are *logical* slots of the request's compressed cache: row t (request b = t // seq)
reads physical row ``cmp_block_table[b, slot // block_size] · block_size + slot % block_size`` of ``cmp_kv``
(``paged_compressed_rows``). Window indices are physical rows of ``ori_kv``. Both caches are
[blocks, block_size, 1, head_dim] BF16.

The attention (``v4_sparse_attention``) uses one shared KV row per position (key = value), scores
``q . kv · head_dim^-0.5`` with invalid keys at -1e20, and V4's rounding rule, which differs from V4.1's
one-pass reference (``kernels.reference.attention``; the input checks and the row gather are shared): the keys
-- the window first, then the compressed slots -- are cut into tiles of 128 (``ATTN_K_TILE``; the window is
exactly one tile); in each tile the probabilities exp(s - tile max) are summed unrounded and **rounded to BF16**
for the product with the BF16 rows (a decode row's tiles are its columns; a prefill row's valid keys are gathered
first and then cut, ``key_tiles``); the tiles merge by their maxima; the sink logit adds exp(sink - max) to the
denominator and carries no value; a token with no valid key outputs exactly zero. Arithmetic is FP64 around
that one rounding; the output stays FP32, because V4 rounds after the inverse RoPE:

``v4_output_projection`` (o [T, H, head_dim] FP32 -> [T, hidden] BF16):

1. the nope dims are rounded to BF16; the last ``qk_rope_head_dim`` dims get the inverse adjacent-pair rotation
   in FP32 with the token's table (the first rope/2 columns of ``freqs_cos`` / ``freqs_sin`` [T, rope]), then
   one BF16 rounding;
2. heads are cut into ``o_groups`` consecutive groups; group g times ``wo_a[g]`` [O_LORA, group_in] (BF16)
   accumulates in FP32 and **stays FP32** (V4.1 rounds this latent to BF16; V4 does not);
3. each (token, group) latent row is quantized to INT8 on its own -- amax = max(|row|, 1e-4), codes =
   round-half-even(row · 127 / amax) -- and multiplied by the group's INT8 columns of ``wo_b`` [hidden,
   G·O_LORA] in exact integers;
4. the groups' integer partials, each times its own amax / 127, are summed in FP32 in group order, times the
   per-output-channel ``wo_b_scale`` [hidden], and rounded once to BF16.

No tensor parallelism: the output is the whole hidden row (attention is DP-only on V4).

Spec: §8; docs/coverage.md, V4 section (V4-14).
"""

from __future__ import annotations

import torch

from kernels.errors import ContractInputError, is_int
from kernels.operators import operator
from kernels.reference.attention import _gather, check_inputs
from kernels.reference.rope import rope_interleave

SPEC = "§8"
ROUNDING_VERSION = "v4-sparse-attn-1"
PATHS = ("HCA", "CSA", "SWA")
KEY_TILE = 128  # ATTN_K_TILE: one tile is the window, the compressed keys follow in tiles of 128
# How the keys are cut into tiles (docs/upstream.md, disagreement 19): "columns", the decode goldens' (the window's
# columns one tile, the compressed columns after, an invalid column keeping its place); "gathered", the prefill
# goldens' (prefill_sparse_attn.py: the valid keys gathered first, window then compressed, then cut into tiles)
KEY_TILES = ("columns", "gathered")
NEG_INF = -1.0e20  # the additive mask of an invalid key


def csa_compressed_indices(idx_topk: torch.Tensor, position_ids: torch.Tensor, *, topk: int,
                           ratio: int = 4) -> torch.Tensor:
    """The CSA slots the attention reads: the first ``topk`` raw indexer slots, each kept only when
    ``0 <= raw < (position + 1) // ratio`` (the compressed rows that exist at that position), else -1.
    -> [T, topk] INT32. Spec: §8."""
    if idx_topk.ndim != 2 or idx_topk.shape[1] < topk or idx_topk.dtype not in (torch.int32, torch.int64):
        raise ContractInputError("idx_topk", None, f"INT32 [T, >= {topk}]", f"{idx_topk.dtype}{list(idx_topk.shape)}",
                                 SPEC)
    pos = position_ids.reshape(-1).to(torch.int64)
    if pos.shape[0] != idx_topk.shape[0]:
        raise ContractInputError("position_ids", None, f"{idx_topk.shape[0]} rows (one per token)", pos.shape[0], SPEC)
    raw = idx_topk[:, :topk].to(torch.int64)
    bound = ((pos + 1) // ratio).unsqueeze(1)
    keep = (raw >= 0) & (raw < bound)
    return torch.where(keep, raw, torch.full_like(raw, -1)).to(torch.int32)


def paged_compressed_rows(cmp_indices: torch.Tensor, cmp_block_table: torch.Tensor, *, seq: int,
                          block_size: int) -> torch.Tensor:
    """Logical compressed slots [T, K] (-1 = none) -> physical rows of the flattened cmp pool, through the
    table row of each token's request (row t -> request t // seq). An unmapped page (-1) or a slot past the
    table is refused, naming the (token, column). Spec: §8."""
    tokens = cmp_indices.shape[0]
    if cmp_block_table.ndim != 2 or cmp_block_table.shape[0] * seq != tokens:
        raise ContractInputError("cmp_block_table", None, f"[{tokens} // {seq} requests, pages]",
                                 list(cmp_block_table.shape), SPEC)
    slots = cmp_indices.to(torch.int64)
    valid = slots >= 0
    req = (torch.arange(tokens) // seq).unsqueeze(1).expand_as(slots)
    page = torch.where(valid, slots // block_size, 0)
    past = valid & (page >= cmp_block_table.shape[1])
    if bool(past.any()):
        t, k = (int(v) for v in past.nonzero()[0])
        raise ContractInputError("cmp_indices", (t, k), f"a slot below {cmp_block_table.shape[1] * block_size} "
                                 "(the table's pages)", int(slots[t, k]), SPEC)
    block = cmp_block_table.to(torch.int64)[req, page]
    unmapped = valid & (block < 0)
    if bool(unmapped.any()):
        t, k = (int(v) for v in unmapped.nonzero()[0])
        raise ContractInputError("cmp_block_table", (t // seq, int(page[t, k])), "a mapped page (>= 0) for slot "
                                 f"{int(slots[t, k])} of token {t}", int(block[t, k]), SPEC)
    return torch.where(valid, block * block_size + slots % block_size, -1)


def flat_pool(pool: torch.Tensor, name: str, dim: int) -> torch.Tensor:
    if pool.ndim != 4 or pool.shape[2] != 1 or pool.shape[3] != dim:
        raise ContractInputError(name, None, f"[blocks, block_size, 1, {dim}]", list(pool.shape), SPEC)
    return pool.reshape(-1, dim)


def check_sparse_attention_inputs(q: torch.Tensor, ori_kv: torch.Tensor, window_indices: torch.Tensor,
                                  cmp_kv: torch.Tensor, cmp_block_table: torch.Tensor, cmp_indices: torch.Tensor,
                                  attn_sink: torch.Tensor, *, seq: int) -> None:
    """``v4_sparse_attention``'s input validation alone (every refusal it makes, with the same fields), for a
    second implementation that must refuse exactly what the reference refuses. Spec: §8."""
    if q.ndim != 3:
        raise ContractInputError("q", None, "[T, H, head_dim]", list(q.shape), SPEC)
    dim = q.shape[2]
    ori, cmp = flat_pool(ori_kv, "ori_kv", dim), flat_pool(cmp_kv, "cmp_kv", dim)
    rows = paged_compressed_rows(cmp_indices, cmp_block_table, seq=seq, block_size=cmp_kv.shape[1])
    check_inputs(q, ori, window_indices, cmp, rows, attn_sink)


@operator(returns="o [T, H, hd] FP32: V4's sparse attention, compressed slots paged per request", spec='§8')
def v4_sparse_attention(q: torch.Tensor, ori_kv: torch.Tensor, window_indices: torch.Tensor, cmp_kv: torch.Tensor,
                        cmp_block_table: torch.Tensor, cmp_indices: torch.Tensor, attn_sink: torch.Tensor, *,
                        seq: int, key_tiles: str = "columns") -> torch.Tensor:
    """q [T, H, head_dim] BF16; caches [blocks, bs, 1, head_dim]; window_indices [T, W] physical ori rows;
    cmp_indices [T, K] logical compressed slots (K may be 0: SWA) -> o [T, H, head_dim] FP32, by the 128-key
    tile rule of the module docstring; ``key_tiles`` (``KEY_TILES``): which keys share a tile. Spec: §8."""
    if key_tiles not in KEY_TILES:
        raise ContractInputError("key_tiles", None, f"one of {KEY_TILES}", repr(key_tiles), SPEC)
    if q.ndim != 3:
        raise ContractInputError("q", None, "[T, H, head_dim]", list(q.shape), SPEC)
    tokens, heads, dim = q.shape
    ori, cmp = flat_pool(ori_kv, "ori_kv", dim), flat_pool(cmp_kv, "cmp_kv", dim)
    rows = paged_compressed_rows(cmp_indices, cmp_block_table, seq=seq, block_size=cmp_kv.shape[1])
    check_inputs(q, ori, window_indices, cmp, rows, attn_sink)
    w_rows, w_valid = _gather(ori, window_indices)
    c_rows, c_valid = _gather(cmp, rows)
    kv, valid = torch.cat((w_rows, c_rows), dim=1), torch.cat((w_valid, c_valid), dim=1)  # [T, K, D], [T, K]
    if key_tiles == "gathered":  # each token's valid keys first, in column order
        order = torch.argsort((~valid).to(torch.int8), dim=1, stable=True)
        kv, valid = torch.gather(kv, 1, order[..., None].expand_as(kv)), torch.gather(valid, 1, order)
    pad = -kv.shape[1] % KEY_TILE
    kv = torch.nn.functional.pad(kv, (0, 0, 0, pad))
    valid = torch.nn.functional.pad(valid, (0, pad), value=False)
    scores = torch.einsum("thd,tkd->thk", q.to(torch.float64), kv) * dim**-0.5
    scores = scores.masked_fill(~valid.unsqueeze(1), NEG_INF)
    tiles = kv.shape[1] // KEY_TILE
    s = scores.unflatten(-1, (tiles, KEY_TILE))  # [T, H, tiles, 128]
    ok = valid.unflatten(-1, (tiles, KEY_TILE)).unsqueeze(1)  # [T, 1, tiles, 128]
    tile_max = s.amax(dim=-1, keepdim=True)  # over the tile, invalid keys at -1e20
    p = torch.exp(s - tile_max) * ok  # FP64, relative to the tile's own maximum
    tile_sum = p.sum(dim=-1)  # [T, H, tiles], unrounded
    p_bf16 = p.to(torch.bfloat16).to(torch.float64)  # the one rounding: probabilities for PV
    tile_out = torch.einsum("thjk,tjkd->thjd", p_bf16, kv.unflatten(1, (tiles, KEY_TILE)))
    run_max = tile_max.squeeze(-1).amax(dim=-1)  # [T, H]
    weight = torch.exp(tile_max.squeeze(-1) - run_max.unsqueeze(-1))  # [T, H, tiles]
    numer = (tile_out * weight.unsqueeze(-1)).sum(dim=2)
    denom = (tile_sum * weight).sum(dim=-1) + torch.exp(attn_sink.to(torch.float64) - run_max)
    out = numer / denom.unsqueeze(-1)
    out[~valid.any(dim=1)] = 0.0  # nothing to attend: exactly zero
    return out.to(torch.float32)




def check_output_projection(o_shape, freqs_cos: torch.Tensor, freqs_sin: torch.Tensor, wo_a: torch.Tensor,
                            wo_b: torch.Tensor, wo_b_scale: torch.Tensor, *, config) -> None:
    """The caller's side of ``v4_output_projection`` (and of ``v4_attention``'s projection)."""
    tokens, heads, dim = o_shape
    groups, lora, rope = config.o_groups, config.o_lora_rank, config.qk_rope_head_dim
    group_in = heads * dim // groups
    if (heads, dim) != (config.num_attention_heads, config.head_dim):
        raise ContractInputError("o", None, f"[T, {config.num_attention_heads}, {config.head_dim}]", list(o_shape),
                                 SPEC)
    for name, table in (("freqs_cos", freqs_cos), ("freqs_sin", freqs_sin)):
        if table.ndim != 2 or table.shape[0] != tokens or table.shape[1] < rope // 2:
            raise ContractInputError(name, None, f"[{tokens}, {rope}]", list(table.shape), SPEC)
    if wo_a.shape != (groups, lora, group_in):
        raise ContractInputError("wo_a", None, f"[{groups}, {lora}, {group_in}]", list(wo_a.shape), SPEC)
    hidden = config.hidden_size
    if wo_b.dtype != torch.int8 or wo_b.shape != (hidden, groups * lora):
        raise ContractInputError("wo_b", None, f"INT8 [{hidden}, {groups * lora}]", f"{wo_b.dtype}{list(wo_b.shape)}",
                                 SPEC)
    if wo_b_scale.shape != (hidden,):
        raise ContractInputError("wo_b_scale", None, f"[{hidden}]", list(wo_b_scale.shape), SPEC)


def output_heads(o: torch.Tensor, freqs_cos: torch.Tensor, freqs_sin: torch.Tensor, *, config) -> torch.Tensor:
    """The projection's first step (module docstring, 1.): o [T, H, hd] FP32 -> the heads [T, H, hd] BF16, the nope
    dims rounded, the last ``qk_rope_head_dim`` dims inversely rotated in FP32 with each token's table row, then
    rounded once."""
    rope = config.qk_rope_head_dim
    cos = freqs_cos[:, : rope // 2].float().unsqueeze(1)
    sin = freqs_sin[:, : rope // 2].float().unsqueeze(1)
    return rope_interleave(o.float(), cos, sin, inverse=True).to(torch.bfloat16)


@operator(returns='attn_out [T, hidden] BF16: inverse RoPE, FP32 grouped latent, per-(token, '
                   'group) INT8 W8A8',
          spec='§8')
def v4_output_projection(o: torch.Tensor, freqs_cos: torch.Tensor, freqs_sin: torch.Tensor, wo_a: torch.Tensor,
                         wo_b: torch.Tensor, wo_b_scale: torch.Tensor, *, config) -> torch.Tensor:
    """o [T, H, head_dim] FP32 -> attn_out [T, hidden] BF16: inverse RoPE, grouped wo_a kept FP32, per-(token,
    group) INT8 activation times the INT8 ``wo_b``, group scales summed in FP32, channel scale, one BF16 cast.
    Spec: §8."""
    check_output_projection(o.shape, freqs_cos, freqs_sin, wo_a, wo_b, wo_b_scale, config=config)
    from kernels.v4.heads_projection import project_heads

    return project_heads(output_heads(o, freqs_cos, freqs_sin, config=config), wo_a, wo_b, wo_b_scale, config=config)


def attention_indices(path: str, q: torch.Tensor, window_indices: torch.Tensor, compressed: torch.Tensor | None,
                      position_ids: torch.Tensor, *, num_tokens: int | None, config) -> tuple[torch.Tensor, torch.Tensor]:
    """The caller's side of ``v4_attention`` and the indices it attends: (window_indices, compressed slots
    [T, K]) with padding rows (from ``num_tokens``) reading nothing. Spec: §8."""
    if path not in PATHS:
        raise ContractInputError("path", None, f"one of {PATHS}", path, SPEC)
    tokens = q.shape[0]
    if num_tokens is not None:
        if not is_int(num_tokens) or not 0 <= num_tokens <= tokens:
            raise ContractInputError("num_tokens", None, f"an int in [0, {tokens}]", num_tokens, SPEC)
        window_indices = window_indices.clone()
        window_indices[num_tokens:] = -1  # padding rows read nothing
    if path == "SWA":
        cmp_indices = torch.zeros((tokens, 0), dtype=torch.int32)
    elif compressed is None:
        raise ContractInputError("compressed", None, f"the {path} compressed top-k", None, SPEC)
    elif path == "CSA":
        cmp_indices = csa_compressed_indices(compressed, position_ids, topk=config.index_topk)
    else:
        cmp_indices = compressed
    if num_tokens is not None and cmp_indices.shape[0] == tokens:
        cmp_indices = cmp_indices.clone()
        cmp_indices[num_tokens:] = -1
    return window_indices, cmp_indices


@operator(returns='attn_out [T, hidden] BF16, composed from v4_sparse_attention and '
                   'v4_output_projection',
          spec='§8')
def v4_attention(path: str, q: torch.Tensor, ori_kv: torch.Tensor, window_indices: torch.Tensor,
                 cmp_kv: torch.Tensor, cmp_block_table: torch.Tensor, compressed: torch.Tensor | None,
                 position_ids: torch.Tensor, attn_sink: torch.Tensor, freqs_cos: torch.Tensor, freqs_sin: torch.Tensor,
                 wo_a: torch.Tensor, wo_b: torch.Tensor, wo_b_scale: torch.Tensor, *, config,
                 seq: int | None = None, num_tokens: int | None = None, key_tiles: str | None = None,
                 ops=None) -> torch.Tensor:
    """One V4 attention stage -> attn_out [T, hidden] BF16. ``compressed``: HCA's top-k [T, K] (HCA), the
    indexer's raw top-k [T, >= index_topk] (CSA), ignored for SWA. ``seq``: rows per request (default the
    decode batch's ``decode_seq``; a prefill chunk is one request of T rows, upstream prefill_sparse_attn.py,
    which takes HCA's and CSA's compressed slots as given: path "HCA" here). ``num_tokens``: rows from
    ``num_tokens`` on are padding -- their indices are not read and their attn_out is exactly 0. ``key_tiles``:
    the decode form's "columns" by default, the prefill form's (``num_tokens`` given) "gathered", as upstream's
    decode and prefill goldens tile them. Composed from the backend's ``v4_sparse_attention`` and
    ``v4_output_projection``. Spec: §8."""
    window_indices, cmp_indices = attention_indices(path, q, window_indices, compressed, position_ids,
                                                    num_tokens=num_tokens, config=config)
    tiles = key_tiles or ("columns" if num_tokens is None else "gathered")
    if tiles not in KEY_TILES:
        raise ContractInputError("key_tiles", None, f"one of {KEY_TILES}", repr(key_tiles), SPEC)
    ops = ops or {}
    attend = ops.get("v4_sparse_attention", v4_sparse_attention)
    project = ops.get("v4_output_projection", v4_output_projection)
    o = attend(q, ori_kv, window_indices, cmp_kv, cmp_block_table, cmp_indices, attn_sink,
               seq=config.decode_seq if seq is None else seq, **({"key_tiles": tiles} if tiles != "columns" else {}))
    return project(o, freqs_cos, freqs_sin, wo_a, wo_b, wo_b_scale, config=config)


v4_attention.composes_operators = True
