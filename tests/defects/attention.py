"""Seeded defects of sparse attention (§5.3)."""

import torch

from contracts.backends import torch_backend
from kernels.reference import attention as ref


def _sink_ignored(query, window_kv, window_indices, compressed_kv, compressed_indices, sink):
    """Wrong: the sink is left out of the softmax denominator."""
    return ref.sparse_attention(query, window_kv, window_indices, compressed_kv, compressed_indices,
                                torch.full_like(sink, float("-inf")))


def _scale_576(query, window_kv, window_indices, compressed_kv, compressed_indices, sink):
    """Wrong: scores scaled by (D + 64)^-0.5, as if the RoPE dims were extra (an MLA habit)."""
    d = query.shape[-1]
    return ref.sparse_attention(query * ((d / (d + 64)) ** 0.5), window_kv, window_indices, compressed_kv,
                                compressed_indices, sink)


def _window_only(query, window_kv, window_indices, compressed_kv, compressed_indices, sink):
    """Wrong: the compressed rows are dropped (only the window is attended)."""
    return ref.sparse_attention(query, window_kv, window_indices, compressed_kv,
                                torch.full_like(compressed_indices, -1), sink)


_base = torch_backend()
SINK_IGNORED = _base.derive("defect:sink-ignored", sparse_attention=_sink_ignored)
SCALE_576 = _base.derive("defect:scale-576", sparse_attention=_scale_576)
WINDOW_ONLY = _base.derive("defect:window-only", sparse_attention=_window_only)
