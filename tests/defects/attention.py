"""Seeded defects of sparse attention (§5.3)."""

import torch

from backends import torch_backend
from kernels.reference import attention as ref
from kernels.reference import tp
from kernels.sequence_parallel import sp_bounds


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


def _cast_first(partials):
    """Wrong: each rank's partial is cast to BF16 before the sum."""
    return tp.tp_all_reduce([p.to(torch.bfloat16).float() for p in partials])


def _reversed_ranks(partials):
    """Wrong: the partials are summed in reverse rank order."""
    return tp.tp_all_reduce(list(reversed(partials)))


def _pairwise(partials):
    """Wrong: a tree reduction ((p0 + p1) + (p2 + p3)) instead of rank order."""
    level = list(partials)
    while len(level) > 1:
        level = [level[i] + level[i + 1] if i + 1 < len(level) else level[i] for i in range(0, len(level), 2)]
    return level[0].to(torch.bfloat16)


def _stale_padding(partials, *, active_tokens, capacity=None):
    """Wrong: padding rows of each slab keep the reduced values of the rows past the active prefix."""
    slabs = tp.tp_reduce_scatter(partials, active_tokens=active_tokens, capacity=capacity)
    full = tp.tp_all_reduce(partials)
    for slab, b in zip(slabs, sp_bounds(active_tokens, len(partials), capacity), strict=True):
        rows = full[b.first + b.count:b.first + b.width]
        slab[b.count:b.count + rows.shape[0]] = rows
    return slabs


CAST_FIRST = _base.derive("defect:tp-cast-first", tp_all_reduce=_cast_first)
REVERSED_RANKS = _base.derive("defect:tp-reversed", tp_all_reduce=_reversed_ranks)
PAIRWISE_TREE = _base.derive("defect:tp-pairwise", tp_all_reduce=_pairwise)
STALE_PADDING = _base.derive("defect:tp-stale-padding", tp_reduce_scatter=_stale_padding)
