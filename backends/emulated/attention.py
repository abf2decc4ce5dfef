"""The C1A device arithmetic of sink-augmented sparse attention, written apart from the reference.

Per token: the window rows, then the compressed rows, in tiles of ``TILE`` = 32 keys; an online softmax in
FP32 that starts from a -1e30 running maximum and biases invalid keys by -1e30; the probabilities of each
tile go to the PV product as BF16, except the first 16 columns of the first head in every ``M_TILE`` = 16
heads, which the vector unit accumulates with FP32 probabilities; the sink joins at the end (a last
running-maximum update and one more denominator term); one cast of the output to the query dtype.

Spec: §5.3 (C1A tiled attention reference), upstream_checks AP-06.
"""

from __future__ import annotations

import math

import torch

from kernels.reference.attention import check_inputs  # validation is shared: same errors, same fields

TILE = 32
M_TILE = 16
PATCH_COLUMNS = 16
NEG = -1e30


def tiled_sparse_attention(query: torch.Tensor, window_kv: torch.Tensor, window_indices: torch.Tensor,
                           compressed_kv: torch.Tensor, compressed_indices: torch.Tensor,
                           sink: torch.Tensor) -> torch.Tensor:
    """Same signature and result layout as ``kernels.reference.attention.sparse_attention``."""
    check_inputs(query, window_kv, window_indices, compressed_kv, compressed_indices, sink)
    tokens, heads, dim = query.shape
    scale = 1.0 / math.sqrt(dim)
    sink32 = sink.to(torch.float32)
    out = torch.empty_like(query)
    for t in range(tokens):
        q = query[t].to(torch.float32)  # [H, D]
        running_max = torch.full((heads,), NEG)
        denom = torch.zeros(heads)
        acc = torch.zeros(heads, dim)
        for cache, indices in ((window_kv, window_indices), (compressed_kv, compressed_indices)):
            row_ids = indices[t].to(torch.int64)
            for start in range(0, row_ids.numel(), TILE):
                ids = row_ids[start:start + TILE]
                ok = ids >= 0
                if not bool(ok.any()):
                    continue
                kv = cache[ids.clamp_min(0)].to(torch.float32)  # [k, D]
                kv[~ok] = 0.0  # a -1 slot reads no cache row (zeroed, so a NaN row cannot leak)
                s = (q @ kv.T) * scale + (ok.to(torch.float32) - 1.0) * -NEG  # invalid keys: -1e30
                new_max = torch.maximum(running_max, s.max(dim=1).values)
                rescale = torch.exp(running_max - new_max)
                p = torch.exp(s - new_max.unsqueeze(1)) * ok  # [H, k]
                denom = denom * rescale + p.sum(dim=1)
                pv = p.to(torch.bfloat16).to(torch.float32) @ kv  # BF16 probability operand
                first = slice(0, heads, M_TILE)
                pv[first, :PATCH_COLUMNS] = p[first] @ kv[:, :PATCH_COLUMNS]  # FP32 vector-unit patch
                acc = acc * rescale.unsqueeze(1) + pv
                running_max = new_max
        final_max = torch.maximum(running_max, sink32)
        rescale = torch.exp(running_max - final_max)
        denom = denom * rescale + torch.exp(sink32 - final_max)
        out[t] = (acc * (rescale / denom).unsqueeze(1)).to(query.dtype)
    return out
