"""The MoE FFN of a V4.1 layer: the router (gate), the clamped-SwiGLU experts, and dispatch/combine across
expert-parallel (EP) ranks, simulated on the CPU.

* ``moe_gate``: scores = sqrt(softplus(logits / gate_temperature)) with logits = x·Wᵀ in FP32. The
  correction bias changes the **selection** only: the top ``num_experts_per_tok`` of scores + bias, ties to
  the lower expert id (a stable sort -- rule ``stable``, the CED reference's; ``topk`` keeps
  ``torch.topk``'s order, the decode golden's, selectable by name). The weights are the **unbiased** scores of
  the selected experts, normalised to sum 1 (denominator + 1e-20) and scaled by ``routed_scaling_factor``;
  ids are INT32, in selection order.
* ``moe_expert``: gate = x·W1ᵀ clamped above at ``swiglu_limit``, up = x·W3ᵀ clamped to ±limit, hidden =
  silu(gate)·up, multiplied by the route weight **before** the down projection, rounded to BF16 (the hidden
  boundary), then ·W2ᵀ: an FP32 [N, D] contribution. Projections accumulate in FP64 and round once to FP32
  (rule ``fp32-proj``, the CED reference); ``bf16-proj`` (the decode golden) rounds each projection to BF16
  first and the contribution too (its recv_y and shared output are BF16 tensors), selectable by name. The
  shared expert is the same function without a route weight.
* ``moe_ep``: every EP rank holds its own token rows (``num_tokens`` active per rank, the rest padding) and
  ``n_routed_experts / ep`` experts (expert e lives on rank e // n_local). Dispatch sends each active
  (token, k) pair to the owner of expert ids[t, k]; at a destination the rows of one local expert are laid out
  by source rank, then in source order, and ``send_counts[src, dst, local expert]`` counts them; a local
  expert receiving more than ``recv_max`` rows (default ep · MOE_TOKENS, upstream's RECV_MAX) is an error.
  Each destination's ``recv_y`` [n_local, recv_max, D] holds every local expert's outputs in slot order, the
  unused slots exact zeros, and ``recv_expert_count`` [n_local] how many slots each uses. Combine returns each routed contribution to
  its token and sums shared + Σ_k routed in FP32 (k in selection order), one BF16 cast; padding rows of the
  output are exact zeros. The result is independent of the EP size and of the order of the tokens.

Expert weights are given decoded (any float dtype): the routed experts' MXFP4 payload with E8M0 scales is
decoded by ``expert_weights`` (``kernels.quant``), or the INT8 stand-in (int8 values × one FP32 scale per
output row).

Spec: §1 (experts 384/1/top-6, sqrtsoftplus, routed_scaling 1.5, swiglu_limit 10, moe_inter 2304, EP);
upstream_checks MO-01, MO-02, MO-05, MO-09, MD-32.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from kernels.config import FLASH, V41Config
from kernels.errors import ContractInputError
from kernels.operators import operator
from kernels.reference.rowwise import rowwise_matmul

SPEC = "§1"
ROUNDING_VERSION = "moe-1"
GATE_RULES = ("stable", "topk")
EXPERT_RULES = ("fp32-proj", "bf16-proj")
MOE_TOKENS = 16  # per EP rank and call (MD-32)


@operator(returns='(weights [T,k] FP32 summing to routed_scaling_factor, ids [T,k] INT32)', spec='§1')
def moe_gate(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, *, config: V41Config = FLASH,
             rule: str = "stable") -> tuple[torch.Tensor, torch.Tensor]:
    """[T, D], [E, D], [E] -> (weights [T, k] FP32, ids [T, k] INT32). Spec: MO-01."""
    if rule not in GATE_RULES:
        raise ContractInputError("rule", None, f"one of {GATE_RULES}", rule, SPEC)
    experts, k = config.n_routed_experts, config.num_experts_per_tok
    if x.ndim != 2 or weight.shape != (experts, x.shape[1]) or bias.shape != (experts,):
        raise ContractInputError("gate", None, f"x [T, D], weight [{experts}, D], bias [{experts}]",
                                 [list(x.shape), list(weight.shape), list(bias.shape)], SPEC)
    logits = rowwise_matmul(x, weight)
    scores = F.softplus(logits / config.gate_temperature).sqrt()
    biased = scores + bias.float()
    if rule == "stable":
        ids = torch.argsort(-biased, dim=-1, stable=True)[:, :k]
    else:
        ids = biased.topk(k, dim=-1).indices
    chosen = scores.gather(-1, ids)
    weights = chosen / (chosen.sum(dim=-1, keepdim=True) + 1e-20) * config.routed_scaling_factor
    return weights, ids.to(torch.int32)


@dataclass(frozen=True)
class ExpertWeights:
    """One expert's decoded weights: ``w1``/``w3`` [I, D] (gate/up), ``w2`` [D, I] (down)."""

    w1: torch.Tensor
    w3: torch.Tensor
    w2: torch.Tensor


def _project(x: torch.Tensor, w: torch.Tensor, rule: str) -> torch.Tensor:
    y = rowwise_matmul(x, w)
    return y.to(torch.bfloat16).float() if rule == "bf16-proj" else y


@operator(returns='[N, D] FP32 contribution (route weight before W2, BF16 hidden)', spec='§1')
def moe_expert(x: torch.Tensor, weights: ExpertWeights, route_weight: torch.Tensor | None = None, *,
               config: V41Config = FLASH, rule: str = "fp32-proj") -> torch.Tensor:
    """[N, D] BF16 rows -> their FP32 [N, D] contribution; ``route_weight`` [N] multiplies the hidden before
    the down projection. Spec: MO-02."""
    if rule not in EXPERT_RULES:
        raise ContractInputError("rule", None, f"one of {EXPERT_RULES}", rule, SPEC)
    if x.ndim != 2 or weights.w1.shape[1] != x.shape[1] or weights.w3.shape != weights.w1.shape \
            or weights.w2.shape != (x.shape[1], weights.w1.shape[0]):
        raise ContractInputError("expert", None, "x [N, D], w1/w3 [I, D], w2 [D, I]",
                                 [list(t.shape) for t in (x, weights.w1, weights.w3, weights.w2)], SPEC)
    limit = config.swiglu_limit
    gate = _project(x, weights.w1, rule).clamp(max=limit)
    up = _project(x, weights.w3, rule).clamp(-limit, limit)
    hidden = F.silu(gate) * up
    if route_weight is not None:
        if route_weight.shape != (x.shape[0],):
            raise ContractInputError("route_weight", None, f"[{x.shape[0]}]", list(route_weight.shape), SPEC)
        hidden = hidden * route_weight.float()[:, None]
    out = rowwise_matmul(hidden.to(torch.bfloat16), weights.w2)
    # the decode golden keeps every expert output in BF16 (recv_y and the shared output are BF16 tensors)
    return out.to(torch.bfloat16).float() if rule == "bf16-proj" else out


def expert_weights(fmt: str, w1: torch.Tensor, w3: torch.Tensor, w2: torch.Tensor,
                   scales: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None) -> ExpertWeights:
    """Decoded weights of one routed expert stored as ``fmt``: ``decoded`` (float tensors as given),
    ``mxfp4`` (packed E2M1 payload [rows, cols/2] uint8 with E8M0 scales [rows, cols/32], spec §2.2, low
    nibble first) or ``int8`` (int8 [rows, cols] with one FP32 scale per row). Spec: MO-02, §2.2."""
    from kernels import quant

    mats = (w1, w3, w2)
    if fmt == "decoded":
        return ExpertWeights(*mats)
    if scales is None:
        raise ContractInputError("scales", None, f"the scales of {fmt} weights", None, SPEC)
    if fmt == "mxfp4":
        out = []
        for name, p, s in zip(("w1", "w3", "w2"), mats, scales, strict=True):
            if p.dtype != torch.uint8 or s.shape != (p.shape[0], p.shape[1] * 2 // 32):
                raise ContractInputError(name, None, "uint8 [rows, cols/2] with E8M0 scales [rows, cols/32]",
                                         f"{p.dtype}{list(p.shape)} scale {list(s.shape)}", SPEC)
            codes = quant.e2m1_decode(quant.unpack_fp4(p)).reshape(p.shape[0], -1, 32)
            out.append((codes * quant.e8m0_decode(s.view(torch.uint8))[..., None]).reshape(p.shape[0], -1))
        return ExpertWeights(*out)
    if fmt == "int8":
        for name, m, s in zip(("w1", "w3", "w2"), mats, scales, strict=True):
            if m.dtype != torch.int8 or s.shape != (m.shape[0],):
                raise ContractInputError(name, None, "int8 [rows, cols] with an FP32 scale per row",
                                         f"{m.dtype}{list(m.shape)} scale {list(s.shape)}", SPEC)
        return ExpertWeights(*(m.float() * s.float()[:, None] for m, s in zip(mats, scales, strict=True)))
    raise ContractInputError("fmt", None, "one of ('decoded', 'mxfp4', 'int8')", fmt, SPEC)


@dataclass(frozen=True)
class EPResult:
    outputs: list[torch.Tensor]  # per rank [T_r, D] BF16, padding rows zero
    send_counts: torch.Tensor  # [ep, ep, n_local] INT32: rows sent from src to dst for each local expert
    recv_rows: list[torch.Tensor]  # per dst [R, 3] INT32 (src, token, k) in slot order
    recv_y: list[torch.Tensor] = ()  # per dst [n_local, recv_max, D] FP32: expert outputs by slot, rest zero
    recv_expert_count: list[torch.Tensor] = ()  # per dst [n_local] INT32: slots used per local expert


def _num_tokens(num_tokens: int | Sequence[int], ep: int, rows: Sequence[int]) -> list[int]:
    counts = [int(num_tokens)] * ep if isinstance(num_tokens, int) else [int(n) for n in num_tokens]
    if len(counts) != ep:
        raise ContractInputError("num_tokens", None, f"one count or exactly {ep} (one per EP rank)", len(counts),
                                 "MD-32")
    for r, n in enumerate(counts):
        if not 0 <= n <= min(MOE_TOKENS, rows[r]):
            raise ContractInputError("num_tokens", (r,), f"0..{min(MOE_TOKENS, rows[r])}", n, "MD-32")
    return counts


@operator(returns='EPResult(outputs per rank [T_r,D] BF16, send_counts [ep,ep,n_local], recv_rows '
                   'per rank [R,3], recv_y per rank [n_local,recv_max,D], recv_expert_count per '
                   'rank [n_local] INT32)',
          spec='§1')
def moe_ep(xs: Sequence[torch.Tensor], gates: Sequence[tuple[torch.Tensor, torch.Tensor]],
           experts: Sequence[ExpertWeights], shared: ExpertWeights, *, ep: int,
           num_tokens: int | Sequence[int], recv_max: int | None = None, config: V41Config = FLASH,
           rule: str = "fp32-proj") -> EPResult:
    """``xs`` per EP rank [T_r, D] BF16; ``gates`` per rank (weights [T_r, k], ids [T_r, k]) from
    ``moe_gate``; ``experts`` every routed expert (global id order); ``shared`` the shared expert.
    Spec: MO-09, MD-32."""
    if len(xs) != ep or len(gates) != ep:
        raise ContractInputError("xs/gates", None, f"one per EP rank ({ep})", [len(xs), len(gates)], SPEC)
    n_experts = len(experts)
    if n_experts != config.n_routed_experts or n_experts % ep:
        raise ContractInputError("experts", None, f"{config.n_routed_experts}, divisible by ep={ep}", n_experts,
                                 SPEC)
    n_local = n_experts // ep
    counts = _num_tokens(num_tokens, ep, [x.shape[0] for x in xs])
    recv: list[list[tuple[int, int, int]]] = [[] for _ in range(ep)]
    send = torch.zeros((ep, ep, n_local), dtype=torch.int32)
    for dst in range(ep):
        for local in range(n_local):
            e = dst * n_local + local
            for src in range(ep):
                ids = gates[src][1]
                for t in range(counts[src]):
                    for k in range(ids.shape[1]):
                        if int(ids[t, k]) == e:
                            recv[dst].append((src, t, k))
                            send[src, dst, local] += 1
    for src in range(ep):
        ids = gates[src][1][: counts[src]]
        bad = (ids < 0) | (ids >= n_experts)
        if bool(bad.any()):
            t, k = (int(v) for v in bad.nonzero()[0])
            raise ContractInputError("ids", (src, t, k), f"an expert id in [0, {n_experts})", int(ids[t, k]),
                                     "MO-03")
    limit = recv_max if recv_max is not None else ep * MOE_TOKENS
    per_expert = send.sum(0).to(torch.int32)  # [dst, local]
    if bool((per_expert > limit).any()):
        dst, local = (int(v) for v in (per_expert > limit).nonzero()[0])
        raise ContractInputError("recv_max", (dst, local), f"<= {limit} rows received by local expert {local}",
                                 int(per_expert[dst, local]), "MO-05")
    routed: dict[tuple[int, int, int], torch.Tensor] = {}
    d = xs[0].shape[1] if xs else 0
    recv_y = [torch.zeros(n_local, limit, d) for _ in range(ep)]
    for dst in range(ep):
        for local in range(n_local):
            slots = [s for s in recv[dst] if int(gates[s[0]][1][s[1], s[2]]) == dst * n_local + local]
            if not slots:
                continue
            rows = torch.stack([xs[src][t] for src, t, _k in slots])
            route = torch.stack([gates[src][0][t, k].float() for src, t, k in slots])
            y = moe_expert(rows, experts[dst * n_local + local], route, config=config, rule=rule)
            recv_y[dst][local, :len(slots)] = y
            for slot, value in zip(slots, y, strict=True):
                routed[slot] = value
    outputs = []
    for src in range(ep):
        x = xs[src]
        out = torch.zeros_like(x, dtype=torch.bfloat16)
        n = counts[src]
        if n:
            total = moe_expert(x[:n], shared, None, config=config, rule=rule)
            for k in range(gates[src][1].shape[1]):
                total = total + torch.stack([routed[(src, t, k)] for t in range(n)])
            out[:n] = total.to(torch.bfloat16)
        outputs.append(out)
    recv_rows = [torch.tensor(r, dtype=torch.int32).reshape(-1, 3) for r in recv]
    return EPResult(outputs, send, recv_rows, recv_y, [per_expert[dst].clone() for dst in range(ep)])


def prefill_token_owners(tokens: int, *, rank: int, tp: int) -> torch.Tensor:
    """The prefill layer's MoE owner of each replicated token row: one card of ``rank``'s TP group per row,
    group_base + t % tp (global card ids, INT32). Spec: upstream_checks MO-11."""
    if isinstance(tp, bool) or tp not in (1, 2, 4, 8) or isinstance(rank, bool) or rank < 0 or tokens < 0:
        raise ContractInputError("token owners", None, "tokens >= 0, rank >= 0, tp in (1, 2, 4, 8)",
                                 (tokens, rank, tp), "MO-11")
    base = rank // tp * tp
    return (torch.arange(tokens) % tp + base).to(torch.int32)


def owned_rows(full: torch.Tensor, owners: torch.Tensor, *, group_base: int, tp: int) -> torch.Tensor:
    """Each card of a TP group keeps the MoE rows it owns and zeros the rest: [tp, T, D] from the full routed
    result [T, D]; the group's FP32 sum, cast once, is the full result again. Spec: MO-11."""
    keep = owners[None, :].to(torch.int64) == (group_base + torch.arange(tp))[:, None]
    return torch.where(keep[..., None], full[None], torch.zeros((), dtype=full.dtype))


def group_sum(owned: torch.Tensor) -> torch.Tensor:
    """The TP group's restore of the owned rows: FP32 sum over the cards, one BF16 cast. Spec: MO-11."""
    return owned.float().sum(0).to(torch.bfloat16)
