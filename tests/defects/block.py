"""Seeded defects of the decode Block (upstream_checks HC-03, HC-04): realistic one-bug ports of the delayed
pre-mix order, each a backend built from the reference with the Block composition replaced."""

from __future__ import annotations

from backends import torch_backend
from kernels.reference import block, mhc

_base = torch_backend()


def _next_mix_from_attention(x_hc, incoming, attention_inputs, attention_mhc, ffn_mhc, *args, config, **kw):
    """Wrong: the Block hands on the attention sublayer's pre mix instead of the FFN's."""
    out = block.decode_block(x_hc, incoming, attention_inputs, attention_mhc, ffn_mhc, *args, config=config, **kw)
    attn = mhc.hc_mixes(x_hc, attention_mhc.function, attention_mhc.scale, attention_mhc.base, config=config)
    return {**out, "next_pre_mix": attn.pre}


def _attention_with_own_mix(x_hc, incoming, attention_inputs, attention_mhc, *args, config, **kw):
    """Wrong: the attention collapses with its own (just computed) pre mix instead of the incoming one."""
    attn = mhc.hc_mixes(x_hc, attention_mhc.function, attention_mhc.scale, attention_mhc.base, config=config)
    return block.decode_block(x_hc, attn.pre, attention_inputs, attention_mhc, *args, config=config, **kw)


for _fn in (_next_mix_from_attention, _attention_with_own_mix):
    _fn.composes_operators = True

NEXT_MIX_FROM_ATTENTION = _base.derive("defect:block-next-mix-from-attention", decode_block=_next_mix_from_attention)
ATTENTION_WITH_OWN_MIX = _base.derive("defect:block-attention-own-mix", decode_block=_attention_with_own_mix)


def _accepts_inactive(x_hc, incoming, attention_inputs, *args, **kw):
    """Wrong: a Block golden is computed although some capacity rows are inactive (num_tokens < rows)."""
    inputs = {**attention_inputs, "num_tokens": attention_inputs["x"].new_tensor(x_hc.shape[0]).to(
        attention_inputs["num_tokens"].dtype)}
    return block.decode_block(x_hc, incoming, inputs, *args, **kw)


_accepts_inactive.composes_operators = True
ACCEPTS_INACTIVE = _base.derive("defect:block-accepts-inactive-rows", decode_block=_accepts_inactive)


class _FirstSourceConfig:
    """The config with every REUSE layer's KV source reported as the first source (layer 2)."""

    def __init__(self, config):
        self._config = config

    def __getattr__(self, name):
        return getattr(self._config, name)

    @property
    def schedule(self):
        import dataclasses

        from kernels.config import LayerKind

        first = self._config.kv_source_layer_ids[0]
        return tuple(dataclasses.replace(layer, kv_source=first) if layer.kind is LayerKind.C2A_REUSE else layer
                     for layer in self._config.schedule)


def _reuse_first_source(x_hc, layer_inputs, *args, config=block.FLASH_TINY, **kw):
    """Wrong: every REUSE layer of the causal encoder reads the first source's cache and Top-K (layer 2's)."""
    out = block.causal_encoder(x_hc, layer_inputs, *args, config=_FirstSourceConfig(config), **kw)
    sources = out["reused_from"].tolist()
    true = [layer.kv_source if s >= 0 else -1 for s, layer in zip(sources, config.schedule, strict=False)]
    return {**out, "reused_from": out["reused_from"].new_tensor(true)}  # it even reports the right sources


_reuse_first_source.composes_operators = True
REUSE_FIRST_SOURCE = _base.derive("defect:causal-encoder-reuse-first-source", causal_encoder=_reuse_first_source)


def _padding_mix(x_hc, incoming, attention_inputs, attention_mhc, ffn_mhc, *args, config=block.FLASH_TINY, **kw):
    """Wrong: the FFN mixes run over the whole slab, so padding rows hand on the mix of a zero row."""
    out = block.decode_block_sharded(x_hc, incoming, attention_inputs, attention_mhc, ffn_mhc, *args, config=config,
                                     **kw)
    pad = mhc.hc_mixes(out["attention_hidden"][0, :1] * 0, ffn_mhc.function, ffn_mhc.scale, ffn_mhc.base,
                       config=config).pre[0]
    mix = out["next_pre_mix"].clone()
    tp, width = mix.shape[:2]
    active = int(attention_inputs["num_tokens"])
    for r in range(tp):
        mix[r, max(0, min(width, active - r * width)):] = pad
    return {**out, "next_pre_mix": mix}


_padding_mix.composes_operators = True
PADDING_MIX = _base.derive("defect:sharded-block-padding-mix", decode_block_sharded=_padding_mix)
