"""Ratio-2 paged compressor with the G2 state ring, the ratio-1 path, and publication of compressed
values and index keys through the quantized cache ABI.

Spec: §4.1 (ring contract), §2.3 (publish), §3 (metadata inputs).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kernels import cache as cache_abi
from kernels.errors import ContractInputError
from kernels.operators import operator
from kernels.reference.rope import rope_interleave

SPEC = "§4.1"
# Bump when the arithmetic or a rounding rule changes on purpose: goldens recorded before go stale.
ROUNDING_VERSION = "ring-g2-1"


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-20) -> torch.Tensor:
    """FP32 RMSNorm times weight, returned in x's dtype."""
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * weight.float()).to(x.dtype)


def project(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """FP32 ``x @ weight`` accumulated in FP64, so a row's result does not depend on how many rows share
    the call (chunked and unchunked runs agree bit for bit)."""
    return (x.double() @ weight.double()).float()


@dataclass(frozen=True)
class CompressorWeights:
    """``wkv``/``wgate`` [hidden, head_dim], ``norm`` [head_dim]."""

    wkv: torch.Tensor
    wgate: torch.Tensor
    norm: torch.Tensor


SHARED_BLOCK = ("refuse", "in_place")  # named rules for two requests of one call on one state block


@operator(returns='(latent [T,D], publish [T] bool, new state_cache)', spec='§4.1')
def compressor_ratio2(
    x: torch.Tensor,
    query_start_loc: torch.Tensor,
    position_ids: torch.Tensor,
    token_to_req_indices: torch.Tensor,
    state_block_table: torch.Tensor,
    state_cache: torch.Tensor,
    weights: CompressorWeights,
    *,
    eps: float = 1e-20,
    num_tokens: int | None = None,
    shared_block: str = "refuse",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One ratio-2 compressor call -> (latent [T, D] in x's dtype, publish [T] bool, new state cache).

    ``x`` [T, hidden] (T may include trailing padding; ``num_tokens`` defaults to qsl[-1]);
    ``state_cache`` [blocks, capacity, 2*D] FP32, returned updated (the input is not modified).
    Odd positions close a pair with the previous chunk row or ring slot ``block*cap + (p-1)%cap``;
    pooled = sum(kv * softmax(score)) per channel in FP32, rounded to x's dtype, RMSNorm * w, rounded.
    All reads precede the writes of the last min(chunk, capacity) rows to ``p % cap``. Requests with
    an empty span or a block outside [0, blocks) and tokens of another request or with p < 0 are
    skipped.

    Two requests with tokens in this call on one state block (``shared_block``, named variants of
    ``SHARED_BLOCK``): ``"refuse"`` (default) raises, naming both requests; ``"in_place"`` is upstream's
    kernel, which updates the ring in place request by request, so a later request's first odd position reads
    what an earlier request of the call wrote there. Spec: §4.1; docs/upstream.md.
    """
    head_dim, total = _check_ratio2(x, query_start_loc, state_block_table, state_cache, weights, num_tokens,
                                    shared_block)
    state = state_cache.clone()
    latent = torch.zeros((x.shape[0], head_dim), dtype=x.dtype)
    publish = torch.zeros(x.shape[0], dtype=torch.bool)
    if total == 0:
        return latent, publish, state
    qsl = [int(v) for v in query_start_loc.tolist()]
    req_of = token_to_req_indices.tolist()
    pos_of = position_ids.tolist()
    kv = project(x[:total], weights.wkv)
    score = project(x[:total], weights.wgate)
    # each request's writes land before the next request reads: upstream's in-place ring. With one request per
    # block (the "refuse" rule) a request reads only its own block, so this equals every read before any write.
    for r in range(state_block_table.shape[0]):
        start, end = qsl[r], min(qsl[r + 1], total)
        block = int(state_block_table[r, 0])
        if start >= end or not 0 <= block < state.shape[0]:
            continue
        span = [t for t in range(start, end) if int(req_of[t]) == r and int(pos_of[t]) >= 0]
        for t in span:
            p = int(pos_of[t])
            if p % 2 == 1:
                latent[t] = _pooled_pair(x.dtype, kv, score, state[block], t, p, t > start, weights.norm, eps)
                publish[t] = True
        capacity = state.shape[1]
        for t in (t for t in span if t >= end - capacity):  # after this request's reads
            p = int(pos_of[t])
            state[block, p % capacity, :head_dim] = kv[t]
            state[block, p % capacity, head_dim:] = score[t]
    return latent, publish, state


def _check_ratio2(x, query_start_loc, state_block_table, state_cache, weights, num_tokens, shared_block):
    """``compressor_ratio2``'s input checks -> (head_dim, the call's real token count)."""
    if shared_block not in SHARED_BLOCK:
        raise ContractInputError("shared_block", None, f"one of {SHARED_BLOCK}", repr(shared_block), SPEC)
    if state_cache.ndim != 3 or state_cache.dtype != torch.float32 or state_cache.shape[1] < 1:
        raise ContractInputError("state_cache", None, "FP32 [blocks, capacity >= 1, 2*head_dim]",
                                 f"{state_cache.dtype}{list(state_cache.shape)}", SPEC)
    head_dim = weights.wkv.shape[1]
    if state_cache.shape[2] != 2 * head_dim:
        raise ContractInputError("state_cache", None, f"last dim 2*head_dim = {2 * head_dim}",
                                 state_cache.shape[2], SPEC)
    qsl = [int(v) for v in query_start_loc.tolist()]
    total = qsl[-1] if num_tokens is None else int(num_tokens)
    if not 0 <= total <= x.shape[0]:
        raise ContractInputError("num_tokens", None, f"in [0, {x.shape[0]}]", total, SPEC)
    owner: dict[int, int] = {}
    for r in range(state_block_table.shape[0]):
        start, end = qsl[r], min(qsl[r + 1], total)
        block = int(state_block_table[r, 0])
        if start < end and 0 <= block < state_cache.shape[0]:
            if block in owner and shared_block == "refuse":
                raise ContractInputError("state_block_table", (r, 0), f"a state block no other request of the call "
                                         f"uses (request {owner[block]} has block {block}; upstream would update it "
                                         "in place request by request: shared_block='in_place')", block, SPEC)
            owner.setdefault(block, r)
    return head_dim, total


def _pooled_pair(dtype, kv, score, ring, t: int, p: int, previous_in_chunk: bool, norm, eps: float):
    """The latent an odd position ``p`` closes: its pair with the previous chunk row, or else with the ring slot
    ``(p - 1) % capacity``; Σ kv · softmax(score) per channel in FP32, rounded to ``dtype``, RMSNorm · w."""
    head_dim = kv.shape[1]
    if previous_in_chunk:
        prev_kv, prev_score = kv[t - 1], score[t - 1]
    else:
        slot = ring[(p - 1) % ring.shape[0]]
        prev_kv, prev_score = slot[:head_dim], slot[head_dim:]
    pair_kv = torch.stack((prev_kv, kv[t]))
    weight = torch.stack((prev_score, score[t])).softmax(dim=0)
    pooled = (pair_kv * weight).sum(dim=0)
    return rms_norm(pooled.to(dtype), norm, eps)


def compressor_ratio1(x: torch.Tensor, weights: CompressorWeights, *, eps: float = 1e-20,
                      num_tokens: int | None = None) -> torch.Tensor:
    """Ratio 1: latent = RMSNorm(x @ wkv) * w for active rows (padding rows zero). Spec: §2.3."""
    total = x.shape[0] if num_tokens is None else int(num_tokens)
    out = torch.zeros((x.shape[0], weights.wkv.shape[1]), dtype=x.dtype)
    if total:
        out[:total] = rms_norm(project(x[:total], weights.wkv).to(x.dtype), weights.norm, eps)
    return out


def publish_compressed(latent: torch.Tensor, rope_cos: torch.Tensor, rope_sin: torch.Tensor, slots: torch.Tensor,
                       compressed: cache_abi.QuantCache, index: cache_abi.QuantCache, index_wk: torch.Tensor,
                       index_norm: torch.Tensor, *, eps: float = 1e-20
                       ) -> tuple[cache_abi.QuantCache, cache_abi.QuantCache]:
    """Publish compressed values (latent with compressed RoPE on its last dims, g16 E4M3) and index keys
    (RMSNorm(unrotated latent @ index_wk) * w, then compressed RoPE, g32 E8M0) at ``slots`` (-1 skips).
    ``rope_cos``/``rope_sin`` [T, rope/2] are the compressed-profile rows. Spec: §2.3, RR-11.
    """
    value = rope_interleave(latent, rope_cos, rope_sin)
    key = rms_norm(project(latent, index_wk).to(latent.dtype), index_norm, eps)
    key = rope_interleave(key, rope_cos, rope_sin)
    return (cache_abi.cache_publish(compressed, value.float(), slots),
            cache_abi.cache_publish(index, key.float(), slots))
