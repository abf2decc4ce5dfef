"""Seeded defects of the decode Block (upstream_checks HC-03, HC-04): realistic one-bug ports of the delayed
pre-mix order, each a backend built from the reference with the Block composition replaced."""

from __future__ import annotations

from contracts.backends import torch_backend
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
