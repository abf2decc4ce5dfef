"""Sink-augmented sparse attention, the core of every V4.1 attention mode (Torch reference).

Each token attends, with all its heads, to one shared 512-d KV row per selected position (the same row is
key and value), gathered from the window cache by ``window_indices`` and from the compressed cache by
``compressed_indices`` (physical rows, -1 = no row). Scores are ``q . kv * D^-0.5``; the softmax runs over
the valid rows of both sources together plus one learned sink logit per head, which adds to the
denominator and carries no value. A token with no valid row therefore outputs exactly zero.

This reference computes the softmax in FP64 in one pass (no tiling) and rounds the output once to the query
dtype. The device's tiled arithmetic (32-key online-softmax tiles, BF16 probabilities for PV, an FP32 patch
of the first 16 columns of the first head in every 16-head group) is a separate implementation,
``kernels.emulated.attention``, judged against this one by the per-row bound.

Spec: §5.3 (C1A tiled attention reference, the output reference for an accepted selection), §6 (per-row
bound), upstream_checks AP-06, AP-07.
"""

from __future__ import annotations

import torch

from kernels.errors import ContractInputError
from kernels.operators import operator

SPEC = "§5.3"
ROUNDING_VERSION = "attn-1"


def _check_indices(indices: torch.Tensor, name: str, rows: int) -> None:
    if indices.ndim != 2 or indices.dtype not in (torch.int32, torch.int64):
        raise ContractInputError(name, None, "an INT32/INT64 [T, K] index tensor",
                                 f"{indices.dtype}{list(indices.shape)}", SPEC)
    idx = indices.to(torch.int64)
    bad = (idx < -1) | (idx >= rows)
    if bool(bad.any()):
        t, k = (int(v) for v in bad.nonzero()[0])
        raise ContractInputError(name, (t, k), f"-1 or a row in [0, {rows})", int(idx[t, k]), SPEC)


def _gather(cache: torch.Tensor, indices: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows [T, K, D] (FP64, zero where invalid; unselected cache rows are never read) and the validity mask."""
    valid = indices >= 0
    rows = torch.zeros((*indices.shape, cache.shape[1]), dtype=torch.float64)
    rows[valid] = cache[indices[valid].to(torch.int64)].to(torch.float64)
    return rows, valid


def check_inputs(query: torch.Tensor, window_kv: torch.Tensor, window_indices: torch.Tensor,
                 compressed_kv: torch.Tensor, compressed_indices: torch.Tensor, sink: torch.Tensor) -> None:
    """Raise a ContractInputError naming the field (and token, slot) of a malformed attention input."""
    if query.ndim != 3:
        raise ContractInputError("query", None, "[T, H, D]", f"shape {tuple(query.shape)}", SPEC)
    tokens, heads, dim = query.shape
    for name, kv in (("window_kv", window_kv), ("compressed_kv", compressed_kv)):
        if kv.ndim != 2 or kv.shape[1] != dim:
            raise ContractInputError(name, None, f"[rows, {dim}]", f"shape {tuple(kv.shape)}", SPEC)
    for name, idx in (("window_indices", window_indices), ("compressed_indices", compressed_indices)):
        if idx.shape[0] != tokens:
            raise ContractInputError(name, None, f"{tokens} rows (one per token)", idx.shape[0], SPEC)
    if sink.shape != (heads,):
        raise ContractInputError("sink", None, f"[{heads}] (one logit per head)", tuple(sink.shape), SPEC)
    _check_indices(window_indices, "window_indices", window_kv.shape[0])
    _check_indices(compressed_indices, "compressed_indices", compressed_kv.shape[0])


@operator(returns='[T,H,D] in the query dtype: softmax over the valid rows of both sources plus '
                   'the sink',
          spec='§5.3')
def sparse_attention(query: torch.Tensor, window_kv: torch.Tensor, window_indices: torch.Tensor,
                     compressed_kv: torch.Tensor, compressed_indices: torch.Tensor,
                     sink: torch.Tensor) -> torch.Tensor:
    """``query`` [T, H, D]; ``window_kv`` / ``compressed_kv`` [rows, D] (decoded cache values); index tensors
    [T, W] / [T, K] (-1 = none); ``sink`` [H] FP32 logits. Returns [T, H, D] in the query dtype. Spec: §5.3."""
    check_inputs(query, window_kv, window_indices, compressed_kv, compressed_indices, sink)
    tokens, heads, dim = query.shape
    w_rows, w_valid = _gather(window_kv, window_indices)
    c_rows, c_valid = _gather(compressed_kv, compressed_indices)
    rows = torch.cat((w_rows, c_rows), dim=1)  # [T, K, D]
    valid = torch.cat((w_valid, c_valid), dim=1)  # [T, K]
    q = query.to(torch.float64)
    scores = torch.einsum("thd,tkd->thk", q, rows) * dim**-0.5
    scores = scores.masked_fill(~valid.unsqueeze(1), float("-inf"))
    logits = torch.cat((scores, sink.to(torch.float64).expand(tokens, heads).unsqueeze(-1)), dim=-1)
    probs = torch.softmax(logits, dim=-1)[..., :-1]  # the sink takes its share and carries no value
    out = torch.einsum("thk,tkd->thd", probs, rows)
    return out.to(query.dtype)
