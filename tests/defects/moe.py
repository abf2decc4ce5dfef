"""Seeded defects of the MoE FFN (spec §1; upstream_checks MO-01, MO-02, MO-09): realistic one-bug ports,
each a backend built from the reference with one operator replaced."""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F

from backends import torch_backend
from kernels.reference import moe
from kernels.reference.rowwise import rowwise_matmul

_base = torch_backend()


def _bias_in_weights(x, weight, bias, *, config=moe.FLASH, rule="stable"):
    """Wrong: the correction bias is added to the weights as well as to the selection scores."""
    _w, ids = moe.moe_gate(x, weight, bias, config=config, rule=rule)
    scores = F.softplus((x.double() @ weight.double().T).float() / config.gate_temperature).sqrt() + bias.float()
    chosen = scores.gather(-1, ids.long())
    return chosen / (chosen.sum(-1, keepdim=True) + 1e-20) * config.routed_scaling_factor, ids


def _ties_to_last(x, weight, bias, *, config=moe.FLASH, rule="stable"):
    """Wrong: equal scores go to the higher expert id (a descending sort that is not stable)."""
    flipped = moe.moe_gate(x, weight.flip(0), bias.flip(0), config=config, rule=rule)
    return flipped[0], (weight.shape[0] - 1 - flipped[1]).to(torch.int32)


def _route_after_down(x, weights, route_weight=None, *, config=moe.FLASH, rule="fp32-proj"):
    """Wrong: the route weight scales the expert's output after the down projection."""
    out = moe.moe_expert(x, weights, None, config=config, rule=rule)
    return out if route_weight is None else out * route_weight.float()[:, None]


def _symmetric_gate_clamp(x, weights, route_weight=None, *, config=moe.FLASH, rule="fp32-proj"):
    """Wrong: the gate projection is clamped on both sides (like up), not only above."""
    limit = config.swiglu_limit
    gate = rowwise_matmul(x, weights.w1).clamp(-limit, limit)
    up = rowwise_matmul(x, weights.w3).clamp(-limit, limit)
    hidden = F.silu(gate) * up
    if route_weight is not None:
        hidden = hidden * route_weight.float()[:, None]
    return rowwise_matmul(hidden.to(torch.bfloat16), weights.w2)


def _clamp_after_silu(x, weights, route_weight=None, *, config=moe.FLASH, rule="fp32-proj"):
    """Wrong: the gate's limit is applied to the SiLU's output instead of its input."""
    limit = config.swiglu_limit
    gate = rowwise_matmul(x, weights.w1)
    up = rowwise_matmul(x, weights.w3).clamp(-limit, limit)
    hidden = F.silu(gate).clamp(max=limit) * up
    if route_weight is not None:
        hidden = hidden * route_weight.float()[:, None]
    return rowwise_matmul(hidden.to(torch.bfloat16), weights.w2)


def _neighbour_rank(xs, gates, experts, shared, *, ep, **kw):
    """Wrong: an expert's tokens go to the next rank, which runs them through its own expert of the same
    local index (expert id + n_local)."""
    n_local = len(experts) // ep
    shifted = [(w, ((ids.long() + n_local) % len(experts)).to(torch.int32)) for w, ids in gates]
    return moe.moe_ep(xs, shifted, experts, shared, ep=ep, **kw)


def _combine_in_bf16(xs, gates, experts, shared, *, ep, num_tokens, config=moe.FLASH, rule="fp32-proj", **kw):
    """Wrong: the combine accumulates the shared and routed contributions in BF16."""
    res = moe.moe_ep(xs, gates, experts, shared, ep=ep, num_tokens=num_tokens, config=config, rule=rule, **kw)
    counts = [num_tokens] * ep if isinstance(num_tokens, int) else list(num_tokens)
    outputs = []
    for src, (x, (w, ids)) in enumerate(zip(xs, gates, strict=True)):
        out = torch.zeros_like(res.outputs[src])
        n = counts[src]
        if n:
            total = moe.moe_expert(x[:n], shared, None, config=config, rule=rule).to(torch.bfloat16)
            for k in range(ids.shape[1]):
                rows = [moe.moe_expert(x[t:t + 1], experts[int(ids[t, k])], w[t, k:k + 1], config=config,
                                       rule=rule)[0] for t in range(n)]
                total = total + torch.stack(rows).to(torch.bfloat16)
            out[:n] = total
        outputs.append(out)
    return dataclasses.replace(res, outputs=outputs)


BIAS_IN_WEIGHTS = _base.derive("defect:gate-bias-in-weights", moe_gate=_bias_in_weights)
TIES_TO_LAST = _base.derive("defect:gate-ties-to-last", moe_gate=_ties_to_last)
ROUTE_AFTER_DOWN = _base.derive("defect:route-weight-after-w2", moe_expert=_route_after_down)
SYMMETRIC_GATE_CLAMP = _base.derive("defect:gate-clamped-both-sides", moe_expert=_symmetric_gate_clamp)
CLAMP_AFTER_SILU = _base.derive("defect:gate-clamp-after-silu", moe_expert=_clamp_after_silu)
NEIGHBOUR_RANK = _base.derive("defect:ep-neighbour-rank", moe_ep=_neighbour_rank)
COMBINE_IN_BF16 = _base.derive("defect:combine-in-bf16", moe_ep=_combine_in_bf16)


def _recv_unchecked(xs, gates, experts, shared, *, ep, recv_max=None, **kw):
    """Wrong: the receive capacity is never checked (a destination may overflow its buffer)."""
    return moe.moe_ep(xs, gates, experts, shared, ep=ep, recv_max=None, **kw)


RECV_UNCHECKED = _base.derive("defect:ep-receive-capacity-unchecked", moe_ep=_recv_unchecked)


def _count_first_source(xs, gates, experts, shared, *, ep, **kw):
    """Wrong: recv_expert_count counts the rows of the first source rank only."""
    res = moe.moe_ep(xs, gates, experts, shared, ep=ep, **kw)
    return dataclasses.replace(res, recv_expert_count=[res.send_counts[0, dst].clone() for dst in range(ep)])


COUNT_FIRST_SOURCE = _base.derive("defect:recv-count-first-source", moe_ep=_count_first_source)
