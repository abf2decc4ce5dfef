"""V4's compressors on a prefill chunk (spec §8; upstream prefill_compressor_ratio4.py and
prefill_compressor_ratio128.py, the packed single-request token-major layout).

A prefill chunk is one request of T rows, ``num_tokens`` real (the rest padding, never read or written). Its
state pool is paged by absolute position through one table ``state_block_table`` [P] (pages of 4 rows at
ratio 4, 8 at ratio 128: no ring within a request), and the chunk's writes are given by two slot mappings:

* ``state_slot_mapping[t]``: the state row token t's projections go to (kv = x · wkv, score = x · wgate +
  ape[pos % ratio], FP32), or -1 for none. It must be the row the table gives the token's position (the state
  of a position has one home), or -1;
* ``cmp_slot_mapping[t]``: the compressed-pool row [blocks, block_size, 1, d] of the window closing at token t,
  or -1. Only a closing position ((pos + 1) % ratio == 0) may carry one.

The compressed row of a window closing at t is the decode compressor's (``kernels.v4.compressor``): the
window's positions pooled per channel by softmax of their scores -- with overlap (ratio 4) the previous
window's first-half channels and the current window's second-half channels, positions before 0 taking no part
-- RMS-normalised in FP32 times the weight, rotated at the window's first position pos - ratio + 1 and rounded
once to the pool's BF16 (``v4_publish_compressed``). A window position inside the chunk uses the chunk's own
projection; one before the chunk is read from the state pool through the table (an unmapped page there is
refused). The state rows of the chunk's tokens are persisted only where ``state_slot_mapping`` says so.

Upstream's kernels reach this rule differently: V4-Pro's and Flash-MTP's ratio-4 kernels overlay the chunk's
projections on the state they read, dspark's goldens (and V4-Pro's ratio-128 kernel) scatter the chunk's state
first and read the window back. They agree whenever ``state_slot_mapping`` is the table's row (the only mapping
accepted besides -1); with -1 on a token of a window closing inside the chunk they differ, and both rules are
named (``unpersisted``):

* ``"pooled"`` (the default; V4-Pro's and Flash-MTP's ratio-4 goldens): an unpersisted row's projection takes part
  in its windows, its state row keeps its bytes;
* ``"state"`` (dspark's goldens, both ratios): the window is read back from the state rows after the chunk's
  scatter, so an unpersisted position contributes the bytes its state row already held.

The RoPE tables: ``rope_head_dim`` (the rotated width, qk_rope_head_dim) is required, and the tables are taken
in either of two layouts, told apart by their width: this project's half-width rows [positions, rope_head_dim/2],
or upstream's full-width rows [positions, rope_head_dim] (upstream's prefill compressors take ``freqs_cos``
[MAX_SEQ_LEN, ROPE_HEAD_DIM] and read its first ROPE_HEAD_DIM/2 columns), which are sliced the same way. Any other
width is refused: a full-width table used as half-width rows would rotate twice the rope dims.

Composed from the backend's ``v4_compressor`` and ``v4_publish_compressed``. Spec: §8; docs/coverage.md, V4
section (V4-11, V4-12); docs/upstream.md (the prefill compressor's RoPE width).
"""

from __future__ import annotations

import torch

from kernels.errors import ContractInputError, first_true, is_int
from kernels.operators import operator
from kernels.v4.compressor import V4CompressorWeights, v4_compressor, v4_publish_compressed

SPEC = "§8"
ROUNDING_VERSION = "v4-prefill-compressor-1"
STATE_PAGE = {4: 4, 128: 8}  # CSA_STATE_BLOCK_SIZE, HCA_STATE_BLOCK_SIZE: state rows per page
UNPERSISTED = ("pooled", "state")  # the named rules for a row whose state_slot_mapping is -1 (module docstring)


def _unpersisted_rule(unpersisted) -> str:
    if unpersisted not in UNPERSISTED:
        raise ContractInputError("unpersisted", None, f"one of {UNPERSISTED}", repr(unpersisted), SPEC)
    return unpersisted


def _check(x, position_ids, num_tokens, state_block_table, state_pool, cmp_slot_mapping, state_slot_mapping,
           ratio, slot_name: str = "cmp_slot_mapping") -> int:
    tokens = x.shape[0]
    if ratio not in STATE_PAGE:
        raise ContractInputError("ratio", None, f"one of {sorted(STATE_PAGE)}", ratio, SPEC)
    if not is_int(num_tokens) or not 0 <= num_tokens <= tokens:
        raise ContractInputError("num_tokens", None, f"an int in [0, {tokens}]", num_tokens, SPEC)
    for name, t in (("position_ids", position_ids), (slot_name, cmp_slot_mapping),
                    ("state_slot_mapping", state_slot_mapping)):
        if t.shape != (tokens,):
            raise ContractInputError(name, None, f"[{tokens}] (one per row)", list(t.shape), SPEC)
    if state_block_table.ndim != 1:
        raise ContractInputError("state_block_table", None, "[P] (the one request's pages)",
                                 list(state_block_table.shape), SPEC)
    page = STATE_PAGE[ratio]
    if state_pool.ndim != 3 or state_pool.shape[1] != page:
        raise ContractInputError("state_pool", None, f"[pages, {page}, 2 · coff · d] (ratio {ratio})",
                                 list(state_pool.shape), SPEC)
    pos = position_ids[:num_tokens].to(torch.int64)
    first = int(pos[0]) if num_tokens else 0
    if first < 0:
        raise ContractInputError("position_ids", (0,), ">= 0", first, SPEC)
    gap = pos != first + torch.arange(num_tokens)
    if bool(gap.any()):
        i = first_true(gap)
        raise ContractInputError("position_ids", (i,), f"{first + i} (consecutive from the chunk's first position)",
                                 int(pos[i]), SPEC)
    for t in range(num_tokens):
        p = int(pos[t])
        if int(cmp_slot_mapping[t]) >= 0 and (p + 1) % ratio:
            raise ContractInputError(slot_name, (t,), f"-1 (position {p} closes no ratio-{ratio} window)",
                                     int(cmp_slot_mapping[t]), SPEC)
        row = int(state_slot_mapping[t])
        if row < 0:
            continue
        if p // page >= state_block_table.numel():
            raise ContractInputError("state_block_table", None, f"a page for position {p} (block {p // page})",
                                     f"{state_block_table.numel()} blocks", SPEC)
        home = int(state_block_table[p // page]) * page + p % page
        if row != home:
            raise ContractInputError("state_slot_mapping", (t,), f"-1 or {home} (the table's row for position {p})",
                                     row, SPEC)
    return tokens


def rope_half_rows(rope_cos: torch.Tensor, rope_sin: torch.Tensor, rope_head_dim: int, d: int
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """The [positions, rope_head_dim/2] rows of either table layout (see the module's docstring), else refuse."""
    if not is_int(rope_head_dim) or rope_head_dim <= 0 or \
            rope_head_dim % 2 or rope_head_dim > d:
        raise ContractInputError("rope_head_dim", None, f"an even int in [2, {d}] (qk_rope_head_dim)",
                                 repr(rope_head_dim), SPEC)
    half = rope_head_dim // 2
    if rope_cos.ndim != 2 or rope_cos.shape != rope_sin.shape or rope_cos.shape[1] not in (half, rope_head_dim):
        raise ContractInputError("rope_cos/rope_sin", None, f"[positions, {half}] (half-width rows) or "
                                 f"[positions, {rope_head_dim}] (upstream's full-width freqs, first {half} columns "
                                 "read)", f"{list(rope_cos.shape)} / {list(rope_sin.shape)}", SPEC)
    return rope_cos[:, :half], rope_sin[:, :half]


@operator(returns="{cmp_pool, state_pool}: a prefill chunk's closed windows published and its "
                   'mapped state rows written, composed from v4_compressor and v4_publish_compressed',
          spec='§8')
def v4_prefill_compressor(x: torch.Tensor, position_ids: torch.Tensor, num_tokens: int,
                          state_block_table: torch.Tensor, state_pool: torch.Tensor, weights: V4CompressorWeights,
                          cmp_slot_mapping: torch.Tensor, state_slot_mapping: torch.Tensor, cmp_pool: torch.Tensor,
                          rope_cos: torch.Tensor, rope_sin: torch.Tensor, *, ratio: int, rope_head_dim: int,
                          eps: float = 1e-6, unpersisted: str = "pooled", ops=None) -> dict[str, torch.Tensor]:
    """One request's prefill chunk -> {"cmp_pool": the compressed pool with the closed windows written (BF16),
    "state_pool": the state pool with the mapped rows written}; x [T, hidden] BF16; ratio 4 (overlapping) or 128;
    the RoPE tables in either layout of the module's docstring; ``unpersisted`` one of the named rules there. The
    inputs are not modified. Spec: §8."""
    rule = _unpersisted_rule(unpersisted)
    _check(x, position_ids, num_tokens, state_block_table, state_pool, cmp_slot_mapping, state_slot_mapping, ratio)
    rope_cos, rope_sin = rope_half_rows(rope_cos, rope_sin, rope_head_dim, weights.norm.shape[0])
    ops = ops or {}
    publish = ops.get("v4_publish_compressed", v4_publish_compressed)
    compressed, closes, pool = _chunk_rows(x, position_ids, num_tokens, state_block_table, state_pool, weights,
                                           state_slot_mapping, ratio=ratio, eps=eps,
                                           compress=ops.get("v4_compressor", v4_compressor), unpersisted=rule)
    n = num_tokens
    cmp = publish(compressed, closes, position_ids[:n], cmp_slot_mapping[:n], cmp_pool, rope_cos, rope_sin,
                  ratio=ratio)
    return {"cmp_pool": cmp, "state_pool": pool}


def _chunk_rows(x, position_ids, num_tokens, state_block_table, state_pool, weights, state_slot_mapping, *, ratio,
                eps, compress, unpersisted="pooled"):
    """The chunk's closed windows (FP32 rows, closes) and its state pool with only the mapped rows persisted; under
    ``unpersisted="state"`` a window holding an unpersisted position is read back from the state rows."""
    n = num_tokens
    table = state_block_table.reshape(1, -1)
    compressed, closes, pool = compress(x[:n], position_ids[:n], torch.zeros(n, dtype=torch.int64), table,
                                        state_pool, weights, ratio=ratio, overlap=ratio == 4, eps=eps)
    page = state_pool.shape[1]
    flat, before = pool.reshape(-1, pool.shape[2]), state_pool.reshape(-1, state_pool.shape[2])
    home = lambda p: int(state_block_table[p // page]) * page + p % page  # noqa: E731 (position -> state row)
    kept = [int(position_ids[t]) for t in range(n) if int(state_slot_mapping[t]) < 0]
    for p in kept:  # the chunk's projection not persisted
        flat[home(p)] = before[home(p)]
    if unpersisted == "state" and kept:
        from kernels.v4.compressor import pooled_window

        for t in closes.nonzero().flatten().tolist():  # every window read back from the state rows
            compressed[t] = pooled_window(flat, home, int(position_ids[t]), weights, ratio=ratio, overlap=ratio == 4,
                                          eps=eps)
    return compressed, closes, pool


v4_prefill_compressor.composes_operators = True


@operator(returns="{idx_kv_cache, idx_kv_scale, state_pool}: CSA's indexer compressor on a prefill "
                   'chunk, composed from v4_compressor and v4_publish_index_keys',
          spec='§8')
def v4_prefill_index_keys(x: torch.Tensor, position_ids: torch.Tensor, num_tokens: int,
                          state_block_table: torch.Tensor, state_pool: torch.Tensor, weights: V4CompressorWeights,
                          idx_slot_mapping: torch.Tensor, state_slot_mapping: torch.Tensor, idx_kv_cache: torch.Tensor,
                          idx_kv_scale: torch.Tensor, rope_cos: torch.Tensor, rope_sin: torch.Tensor,
                          hadamard: torch.Tensor, *, rope_head_dim: int, eps: float = 1e-6,
                          unpersisted: str = "pooled", ops=None) -> dict[str, torch.Tensor]:
    """CSA's indexer compressor on a prefill chunk (upstream prefill_indexer_compressor.py): the inner ratio-4
    compressor's closed windows, as ``v4_prefill_compressor`` pools them (the same mappings and padding rules,
    ``idx_slot_mapping`` in place of the compressed slots, the same ``unpersisted`` rules), each written as an INT8 index key by
    ``v4_publish_index_keys`` (rotated at the window's first position, BF16, Hadamard, BF16, INT8 with its FP32
    scale) -> {"idx_kv_cache", "idx_kv_scale", "state_pool"}; RoPE tables as ``v4_prefill_compressor`` takes them.
    Composed from the backend's operators.
    Spec: §8."""
    from kernels.v4.index_cache import v4_publish_index_keys

    rule = _unpersisted_rule(unpersisted)
    _check(x, position_ids, num_tokens, state_block_table, state_pool, idx_slot_mapping, state_slot_mapping, 4,
           "idx_slot_mapping")
    rope_cos, rope_sin = rope_half_rows(rope_cos, rope_sin, rope_head_dim, weights.norm.shape[0])
    ops = ops or {}
    publish = ops.get("v4_publish_index_keys", v4_publish_index_keys)
    keys, closes, pool = _chunk_rows(x, position_ids, num_tokens, state_block_table, state_pool, weights,
                                     state_slot_mapping, ratio=4, eps=eps,
                                     compress=ops.get("v4_compressor", v4_compressor), unpersisted=rule)
    n = num_tokens
    cache, scale = publish(keys, closes, position_ids[:n], idx_slot_mapping[:n], idx_kv_cache, idx_kv_scale,
                           rope_cos, rope_sin, hadamard, ratio=4)
    return {"idx_kv_cache": cache, "idx_kv_scale": scale, "state_pool": pool}


v4_prefill_index_keys.composes_operators = True
