"""V4's MoE experts and the combine at decode (spec §8; upstream expert_routed.py / expert_shared.py, the INT8
W8A8 stand-in of the MXFP4 routed and MXFP8 shared experts, and moe.py's combine).

``v4_expert``: one expert over rows already coded by the router (``v4_gate``'s INT8 x_norm_i8 and its factor):

1. gate = FP32(x_i8 · w1_i8, exact integers) · x_scale[row] · w1_scale[col]; up likewise with w3;
2. gate clamped above at ``swiglu_limit``, up to ±limit; h = (gate · 1 / (e^-gate + 1)) · up in FP32;
3. h re-coded per row: amax = max(|h|, 1e-4), codes = round-half-even(h · (127 / amax)), factor 1 / (127 / amax);
4. y = FP32(h_i8 · w2_i8) · (factor · route_weight)[row] · w2_scale[col], rounded once to BF16. The routing
   weight rides the row factor *before* the BF16 rounding (the shared expert has none: weight 1).

``v4_moe`` composes one rank's MoE after its hc_pre (EP folded: every expert local): the router
(``v4_gate``), each route's expert row, the shared expert, and the combine
``ffn_out = BF16(FP32(shared) + Σ_k FP32(routed_k))`` in route order k = 0 .. K-1; padding rows are 0.

Spec: §8; docs/coverage.md, V4 section (V4-15).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kernels.errors import ContractInputError, is_int
from kernels.operators import operator
from kernels.record import BadCall, CaseSpec, Record, generator, in_all_folders, int8_codes, is_tiny, replaced
from kernels.v4.gate import v4_gate
from kernels.v4.mtp import int8_matmul, quantize_rows_int8

SPEC = "§8"
ROUNDING_VERSION = "v4-moe-2"  # 2: the MoE stage's padding rows carry their residual mix (upstream's rule)
PADDING_ROWS = ("residual", "zero")


@dataclass(frozen=True)
class V4ExpertWeights:
    """INT8 ``w1`` / ``w3`` [inter, D] and ``w2`` [D, inter] with per-output-channel FP32 scales."""

    w1: torch.Tensor
    w1_scale: torch.Tensor
    w3: torch.Tensor
    w3_scale: torch.Tensor
    w2: torch.Tensor
    w2_scale: torch.Tensor


def check_v4_expert(x_i8: torch.Tensor, x_scale: torch.Tensor, weights: V4ExpertWeights) -> None:
    """The caller's side of ``v4_expert``: INT8 rows with [N, 1] scales, INT8 weights of matching shapes."""
    n, d = x_i8.shape
    inter = weights.w1.shape[0]
    if x_i8.dtype != torch.int8 or x_scale.shape != (n, 1):
        raise ContractInputError("x_i8/x_scale", None, f"INT8 [N, {d}] / [N, 1]",
                                 [f"{x_i8.dtype}{list(x_i8.shape)}", list(x_scale.shape)], SPEC)
    for name, w, shape in (("w1", weights.w1, (inter, d)), ("w3", weights.w3, (inter, d)),
                           ("w2", weights.w2, (d, inter))):
        if w.dtype != torch.int8 or tuple(w.shape) != shape:
            raise ContractInputError(name, None, f"INT8 {list(shape)}", f"{w.dtype}{list(w.shape)}", SPEC)


@operator(returns='y [N, D] BF16: W8A8 SwiGLU expert with its hidden row re-coded to INT8, the '
                   'routing weight on the row factor before the BF16 rounding',
          spec='§8')
def v4_expert(x_i8: torch.Tensor, x_scale: torch.Tensor, route_weight: torch.Tensor | None,
              weights: V4ExpertWeights, *, config) -> torch.Tensor:
    """x_i8 [N, D] INT8, x_scale [N, 1] FP32, route_weight [N] FP32 or None (the shared expert) -> y [N, D] BF16.
    Spec: §8."""
    check_v4_expert(x_i8, x_scale, weights)
    n = x_i8.shape[0]
    limit = config.swiglu_limit
    xs = x_scale.float()
    gate = int8_matmul(x_i8, weights.w1) * xs * weights.w1_scale.float()
    up = int8_matmul(x_i8, weights.w3) * xs * weights.w3_scale.float()
    gate = gate.clamp(max=limit)
    up = up.clamp(-limit, limit)
    h = (gate * torch.reciprocal(torch.exp(-gate) + 1.0)) * up
    codes, row = quantize_rows_int8(h, scale_max=config.int8_scale_max, amax_eps=config.int8_amax_eps)
    if route_weight is not None:
        row = row * route_weight.float().reshape(n, 1)
    y = int8_matmul(codes, weights.w2) * row * weights.w2_scale.float()
    return y.to(torch.bfloat16)


@operator(returns="{ffn_out [T,D] BF16, indices, weights}: one rank's MoE, composed from v4_gate "
                   'and v4_expert (combine: one FP32 sum, shared first, rounded once)',
          spec='§8')
def v4_moe(x_mixed: torch.Tensor, norm_w: torch.Tensor, gate_w: torch.Tensor, gate_bias: torch.Tensor,
           layer_id: int, num_tokens: int, tid2eid: torch.Tensor, input_ids: torch.Tensor,
           routed: list[V4ExpertWeights], shared: V4ExpertWeights, *, config, ops=None) -> dict[str, torch.Tensor]:
    """One rank's MoE (every expert local) -> {"ffn_out" [T, D] BF16, "indices", "weights"}; composed from the
    backend's ``v4_gate`` and ``v4_expert`` (``v4_moe_ep`` at one rank). Spec: §8."""
    ops = ops or {}
    gate = ops.get("v4_gate", v4_gate)
    g = gate(x_mixed, norm_w, gate_w, gate_bias, layer_id, num_tokens, tid2eid, input_ids, config=config)
    out = v4_moe_ep([g], [num_tokens], routed, shared, ep=1, config=config, ops=ops)  # every expert local
    return {"ffn_out": out["ffn_out"][0], "indices": g["indices"], "weights": g["weights"]}


v4_moe.composes_operators = True


@operator(returns='{x_out [T,hc,D] FP32, ffn_out, indices, weights}: hc_mixes / hc_pre -> v4_moe '
                   "-> hc_post (padding rows: their streams' residual mix, or 0 by name)",
          spec='§8')
def v4_moe_stage(x_hc: torch.Tensor, hc_fn: torch.Tensor, hc_scale: torch.Tensor, hc_base: torch.Tensor,
                 norm_w: torch.Tensor, gate_w: torch.Tensor, gate_bias: torch.Tensor, layer_id: int,
                 num_tokens: int, tid2eid: torch.Tensor, input_ids: torch.Tensor, routed: list[V4ExpertWeights],
                 shared: V4ExpertWeights, *, config, ops=None, padding_rows: str = "residual"
                 ) -> dict[str, torch.Tensor]:
    """One V4 MoE stage of a decode layer (upstream moe.py around its experts): hc_mixes / hc_pre (the stage's own
    ffn mixes) -> v4_moe (its router does the FFN RMSNorm) -> hc_post -> {"x_out" [T, hc, D] FP32, "ffn_out",
    "indices", "weights"}. Rows from num_tokens on route nowhere (ffn_out 0 there); ``padding_rows`` names what
    x_out holds on them (``PADDING_ROWS``): ``"residual"`` (upstream's moe.py, kernel and golden: the stage mixes
    and post-mixes every row, so a padding row carries hc_post(0, x_hc), its streams' residual mix) or
    ``"zero"`` (this project's former rule: mixes 0 from num_tokens on, so x_out 0). Composed from the backend's
    operators. Spec: §8; docs/upstream.md."""
    from functools import partial

    from kernels.reference import mhc

    if padding_rows not in PADDING_ROWS:
        raise ContractInputError("padding_rows", None, f"one of {PADDING_ROWS}", repr(padding_rows), SPEC)
    ops = ops or {}
    mixes_of = ops.get("hc_mixes", mhc.hc_mixes)
    collapse = ops.get("hc_pre", mhc.hc_pre)
    expand = ops.get("hc_post", mhc.hc_post)
    moe = ops.get("v4_moe", v4_moe)
    if getattr(moe, "composes_operators", False):
        moe = partial(moe, ops=ops)
    mixed_rows = None if padding_rows == "residual" else num_tokens  # None: every row
    mixes = mixes_of(x_hc, hc_fn, hc_scale, hc_base, num_tokens=mixed_rows, config=config)
    out = moe(collapse(x_hc, mixes.pre), norm_w, gate_w, gate_bias, layer_id, num_tokens, tid2eid, input_ids, routed,
              shared, config=config)
    return {"x_out": expand(out["ffn_out"], x_hc, mixes.post, mixes.residual), **out}


v4_moe_stage.composes_operators = True


@operator(returns='{ffn_out per rank, send_counts [ep,ep,n_local], recv_counts, recv_x INT8 lanes, '
                   "recv_y}: V4's MoE across EP ranks (source-major lanes, one FP32 combine)",
          spec='§8')
def v4_moe_ep(gates: list[dict[str, torch.Tensor]], num_tokens: list[int], routed: list[V4ExpertWeights],
              shared: V4ExpertWeights, *, ep: int, config, ops=None) -> dict[str, list[torch.Tensor]]:
    """V4's MoE across ``ep`` expert-parallel ranks (upstream moe.py's dispatch, experts and combine): ``gates``
    per rank the ``v4_gate`` outputs over its T rows, ``num_tokens`` its real rows; rank r holds experts
    r·n_local .. (r+1)·n_local - 1.

    Dispatch: each real (token, route) sends its INT8 row, its factor and its routing weight to the expert's
    rank; on the receiving rank each local expert's lanes are packed source rank by source rank, tokens in order
    within a source, routes in order within a token (upstream's per-source lane cumsum), at most ep · T rows
    an expert. Each lane is computed by ``v4_expert``; the combine returns every route's row to its token and
    sums ``FP32(shared) + Σ_k FP32(routed_k)``, rounded once to BF16, exactly as ``v4_moe`` on one rank.

    -> {"ffn_out": [T, D] BF16 per rank, "send_counts": [ep, ep, n_local] INT32 (src, dst, local expert),
    "recv_counts": [n_local] INT32 per rank, "recv_x": [n_local, ep·T, D] INT8 per rank (lanes, zero tail),
    "recv_y": [n_local, ep·T, D] BF16 per rank}. Spec: §8."""
    n_experts = config.n_routed_experts
    if ep < 1 or n_experts % ep or len(gates) != ep or len(num_tokens) != ep:
        raise ContractInputError("ep", None, f"a divisor of {n_experts} with one gate and one count per rank",
                                 [ep, len(gates), len(num_tokens)], SPEC)
    if len(routed) != n_experts:
        raise ContractInputError("routed", None, f"{n_experts} experts", len(routed), SPEC)
    expert = (ops or {}).get("v4_expert", v4_expert)
    n_local, k = n_experts // ep, config.num_experts_per_tok
    tokens, d = gates[0]["x_norm_i8"].shape
    cap = ep * tokens
    for r, n in enumerate(num_tokens):
        if not is_int(n) or not 0 <= n <= tokens:
            raise ContractInputError("num_tokens", (r,), f"an int in [0, {tokens}]", n, SPEC)
    send = torch.zeros(ep, ep, n_local, dtype=torch.int32)
    lanes: list[list[list[tuple[int, int, int]]]] = [[[] for _ in range(n_local)] for _ in range(ep)]
    for src in range(ep):  # appended source by source: each expert's lanes come out source-major
        for t in range(num_tokens[src]):
            for j in range(k):
                e = int(gates[src]["indices"][t, j])
                lanes[e // n_local][e % n_local].append((src, t, j))
                send[src, e // n_local, e % n_local] += 1
    back: dict[tuple[int, int, int], torch.Tensor] = {}
    recv_x, recv_y, recv_counts = [], [], []
    for dst in range(ep):
        rx = torch.zeros(n_local, cap, d, dtype=torch.int8)
        ry = torch.zeros(n_local, cap, d, dtype=torch.bfloat16)
        for loc in range(n_local):
            slots = lanes[dst][loc]
            if not slots:
                continue
            rows = torch.stack([gates[s]["x_norm_i8"][t] for s, t, _ in slots])
            scale = torch.stack([gates[s]["x_norm_scale"][t] for s, t, _ in slots])
            weight = torch.stack([gates[s]["weights"][t, j] for s, t, j in slots])
            y = expert(rows, scale, weight, routed[dst * n_local + loc], config=config)
            rx[loc, :len(slots)], ry[loc, :len(slots)] = rows, y
            back.update(zip(slots, y, strict=True))
        recv_x.append(rx)
        recv_y.append(ry)
        recv_counts.append(torch.tensor([len(lanes[dst][loc]) for loc in range(n_local)], dtype=torch.int32))
    outs = []
    for src in range(ep):
        out = torch.zeros(tokens, d, dtype=torch.bfloat16)
        n = num_tokens[src]
        if n:
            acc = expert(gates[src]["x_norm_i8"][:n], gates[src]["x_norm_scale"][:n], None, shared, config=config).float()
            for j in range(k):
                acc = acc + torch.stack([back[(src, t, j)] for t in range(n)]).float()
            out[:n] = acc.to(torch.bfloat16)
        outs.append(out)
    return {"ffn_out": outs, "send_counts": send, "recv_counts": recv_counts, "recv_x": recv_x, "recv_y": recv_y}


v4_moe_ep.composes_operators = True


# --- the records ---------------------------------------------------------------------------------------------

def _expert_inputs(routed: bool):
    """A tiny tree's 9 rows, or the 8 rows a Pro entry takes (MOE_TOKENS), one of zero codes (h is 0, its re-code
    takes the amax floor); weight scales small enough at Pro's 7168-term sums to keep h inside BF16's range."""
    def build(seed: int, wiring: str, config) -> dict[str, torch.Tensor]:
        g = generator(seed)
        d, inter = config.hidden_size, config.moe_intermediate_size
        n, lo, span = (9, 0.005, 0.02) if is_tiny(config) else (config.decode_tokens, 5e-5, 2e-4)
        x = int8_codes((n, d), g)
        x[3] = 0
        out = {"x_i8": x, "x_scale": torch.rand(n, 1, generator=g) * 0.02 + 1e-3,
               "w1": int8_codes((inter, d), g), "w1_scale": torch.rand(inter, generator=g) * span + lo,
               "w3": int8_codes((inter, d), g), "w3_scale": torch.rand(inter, generator=g) * span + lo,
               "w2": int8_codes((d, inter), g), "w2_scale": torch.rand(d, generator=g) * span + lo}
        if routed:
            out["route_weight"] = torch.rand(n, generator=g)
        return out
    return build


def _expert_call(fn, i, config):
    w = V4ExpertWeights(i["w1"], i["w1_scale"], i["w3"], i["w3_scale"], i["w2"], i["w2_scale"])
    return {"y": fn(i["x_i8"], i["x_scale"], i.get("route_weight"), w, config=config)}


def _expert_weights(inter: int, d: int, g, lead: tuple = ()) -> dict[str, torch.Tensor]:
    return {"w1": int8_codes((*lead, inter, d), g), "w1_scale": torch.rand(*lead, inter, generator=g) * 0.02 + 0.005,
            "w3": int8_codes((*lead, inter, d), g), "w3_scale": torch.rand(*lead, inter, generator=g) * 0.02 + 0.005,
            "w2": int8_codes((*lead, d, inter), g), "w2_scale": torch.rand(*lead, d, generator=g) * 0.02 + 0.005}


def _hash_table(ids: int, e: int, k: int, g) -> torch.Tensor:
    """A hash layer's token -> experts table: ``k`` distinct experts per id (a table of the model's whole vocabulary
    at a model geometry, where the entry is compiled for it; the ids drawn stay below 32)."""
    if ids == 32:  # the tiny cases' table, drawn as the sample store's trees were
        return torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(ids)]).to(torch.int32)
    return torch.rand(ids, e, generator=g).argsort(1)[:, :k].to(torch.int32)


def _moe_stage_inputs(seed: int, wiring: str, config) -> dict[str, torch.Tensor]:
    """One decode batch (8 rows, 6 real: two padding rows that route nowhere but carry their residual mix) on the
    MTP layer (scored routing); the routed experts' weights stacked [E, ...]; a 32-id hash table (at a model
    geometry the vocabulary's, the ids below 32)."""
    g = generator(seed)
    t, hc, d, e, k, inter = (config.decode_tokens, config.hc_mult, config.hidden_size, config.n_routed_experts,
                             config.num_experts_per_tok, config.moe_intermediate_size)
    mix = (2 + hc) * hc
    head = {"x_hc": torch.randn(t, hc, d, generator=g), "hc_fn": torch.randn(mix, hc * d, generator=g) * 0.05,
            "hc_scale": torch.tensor([2.0, 0.02, 0.25]), "hc_base": torch.randn(mix, generator=g),
            "norm_w": (1 + 0.2 * torch.randn(d, generator=g)).to(torch.bfloat16),
            "gate_w": torch.randn(e, d, generator=g) / d**0.5, "gate_bias": torch.randn(e, generator=g) * 0.1,
            "layer_id": torch.tensor(config.num_hidden_layers), "num_tokens": torch.tensor(6),
            "tid2eid": _hash_table(32 if config.shrunk else config.vocab_size, e, k, g),
            "input_ids": torch.randint(0, 32, (t,), generator=g)}
    routed = {f"routed_{n}": v for n, v in _expert_weights(inter, d, g, (e,)).items()}
    return {**head, **routed, **{f"shared_{n}": v for n, v in _expert_weights(inter, d, g).items()}}


_WEIGHTS = ("w1", "w1_scale", "w3", "w3_scale", "w2", "w2_scale")


def _moe_stage_call(fn, i, config):
    routed = [V4ExpertWeights(*(i[f"routed_{n}"][j] for n in _WEIGHTS)) for j in range(i["routed_w1"].shape[0])]
    shared = V4ExpertWeights(*(i[f"shared_{n}"] for n in _WEIGHTS))
    out = fn(i["x_hc"], i["hc_fn"], i["hc_scale"], i["hc_base"], i["norm_w"], i["gate_w"], i["gate_bias"],
             int(i["layer_id"]), int(i["num_tokens"]), i["tid2eid"], i["input_ids"], routed, shared, config=config)
    # not the routing weights: the stage's mixes are summed in another FP32 order upstream, and a BF16 rounding of
    # x_mixed that flips moves them by ~50 FP32 ulps (the v4_gate trees judge the router on a given x_mixed)
    # (a kernel entry may hand back x_out alone: main's l3_moe; the outputs missing are then reported missing)
    return {name: out[name] for name in ("x_out", "ffn_out", "indices") if name in out}


EXPERT_RECORD = Record(
    operator="v4_expert",
    call=_expert_call,
    outputs={"y": "exact"},
    cases=(CaseSpec("v4_expert_routed", "V4 routed expert: W8A8 SwiGLU with the routing weight on the row factor, a "
                    "row of zero codes", _expert_inputs(True)),
           CaseSpec("v4_expert_shared", "V4 shared expert (no routing weight), a row of zero codes (at Pro: D 7168, "
                    "inter 3072, the 8 rows expert_shared_test takes)", _expert_inputs(False),
                    geometries=("tiny", "pro", "v4-flash", "dspark"))),
    bad_calls=(BadCall("x_scale of another row count", "v4_expert_shared",
                       replaced(x_scale=lambda i: i["x_scale"][:-1]), "x_scale"),
               BadCall("w2 of another width", "v4_expert_routed", replaced(w2=lambda i: i["w2"][:, :-1]), "w2")),
    bindings=in_all_folders(golden="expert_routed.py::golden_expert_routed",
                             entry="expert_shared.py::expert_shared_test"),
)

MOE_STAGE_RECORD = Record(
    operator="v4_moe_stage",
    call=_moe_stage_call,
    outputs={"x_out": "fp32_ulps", "ffn_out": "exact", "indices": "exact"},
    modules=("kernels.v4.gate", "kernels.reference.mhc"),
    cases=(CaseSpec("v4_moe_stage", "V4 MoE sublayer at decode: hc_pre, the router, every routed expert local and the "
                    "shared one, the FP32 combine, hc_post; 6 real rows and 2 padding rows", _moe_stage_inputs,
                    geometries=("tiny", "v4-flash-ep2")),),
    # main's l3_moe (Flash-MTP, 2 devices) hands back x_next alone: the router's and the experts' outputs are
    # judged at tiny on the goldens; on the device x_out, padding rows included (MO-08)
    outputs_at={"v4-flash-ep2": {"ffn_out": None, "indices": None}},
    bindings=in_all_folders(golden="moe.py::golden_moe", entry="moe.py::l3_moe"),
)
