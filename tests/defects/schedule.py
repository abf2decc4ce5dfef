"""Seeded schedule defects."""

from dataclasses import replace

from backends import torch_backend


def _first_source_schedule(config):
    """Wrong: resolves each source to the FIRST same-ratio source instead of the last one <= layer."""
    out = []
    for layer in config.schedule:
        if layer.compress_ratio == 0:
            out.append(layer)
            continue
        kv = min(s for s in config.kv_source_layer_ids if config.compress_ratios[s] == layer.compress_ratio)
        idx = min(s for s in config.index_source_layer_ids if config.compress_ratios[s] == layer.compress_ratio)
        out.append(replace(layer, kv_source=kv, index_source=idx))
    return tuple(out)


def _no_reindex(config):
    """Wrong: index-source layers that are not KV sources resolve to REUSE (no REINDEX layers)."""
    from kernels.config import AttentionMode, LayerKind

    return tuple(replace(layer, mode=AttentionMode.REUSE, kind=LayerKind.C1A_REUSE)
                 if layer.kind == LayerKind.C1A_REINDEX else layer for layer in config.schedule)


# registrations: each defect is the torch backend with one operator replaced
_base = torch_backend()
FIRST_SOURCE = _base.derive("defect:first-source", resolve_schedule=_first_source_schedule)
NO_REINDEX = _base.derive("defect:no-reindex", resolve_schedule=_no_reindex)
