"""One comparison pipeline for replayed outputs: a comparator is named, takes the output under test,
its expected value and the case context, and returns a CheckResult. The golden CLI, the pytest replay
and the contracts share it.

Spec: §6 (comparators), §5.3 (Top-K), §4.1 (state), §7.3 (compare_fn receives actual, expected and
the inputs/outputs).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial

import torch

from contracts import tolerances as bounds
from contracts.checks import attention as attention_checks
from contracts.checks import cache as cache_checks
from contracts.checks import moe as moe_checks
from contracts.checks import precision, quant_ties, topk
from contracts.checks.topk import TopKContext, check_topk_validity
from contracts.result import Bound, CheckResult, Violation, bounds_by_name, failed, first_failure, passed
from contracts.tensors import byte_rows


@dataclass(frozen=True)
class Context:
    """Everything a comparator may look at besides the pair it compares."""

    inputs: Mapping[str, torch.Tensor]
    actual_outputs: Mapping[str, torch.Tensor]
    expected_outputs: Mapping[str, torch.Tensor]
    params: Mapping[str, object]
    wiring: str = "replicated"


Comparator = Callable[[str, torch.Tensor, torch.Tensor, Context], CheckResult]


def _layout(name: str, a: torch.Tensor, e: torch.Tensor) -> CheckResult | None:
    if a.dtype != e.dtype or tuple(a.shape) != tuple(e.shape):
        return failed("layout", "§7.3", 1, 1, Violation(f"{name}.layout", (), f"{a.dtype}{list(a.shape)}",
                                                          f"{e.dtype}{list(e.shape)}"))
    return None


def gate_codes(name: str, a: torch.Tensor, e: torch.Tensor, ctx: Context) -> CheckResult:
    """The gate's x_norm_i8 as upstream judges it: byte identity on the rows of the M-tiles the real rows occupy
    (num_tokens rounded up to GATE_M_TILE, capped at T: padding rows inside them hold their codes); the rows past
    them are never coded by the kernel and not judged."""
    from kernels.v4.gate import GATE_M_TILE

    n = int(ctx.inputs["num_tokens"])
    tile = min(e.shape[0], -(-n // GATE_M_TILE) * GATE_M_TILE)
    if a.shape != e.shape:
        return exact(name, a, e, ctx)
    return exact(name, a[:tile], e[:tile], ctx)


def exact(name: str, a: torch.Tensor, e: torch.Tensor, ctx: Context) -> CheckResult:
    """Byte identity (metadata, masks, RoPE rows, slabs)."""
    bad = _layout(name, a, e)
    if bad is not None:
        return bad
    if a.numel() == 0:
        return passed("exact", "§7.3", 0)
    diff = (byte_rows(a) != byte_rows(e)).any(1)
    if not bool(diff.any()):
        return passed("exact", "§7.3", int(diff.numel()))
    row = int(diff.nonzero()[0, 0])
    rows = diff.numel()
    av, ev = a.reshape(rows, -1)[row], e.reshape(rows, -1)[row]
    col = int((av != ev).nonzero()[0, 0]) if bool((av != ev).any()) else 0
    return failed("exact", "§7.3", int(diff.numel()), int(diff.sum()),
                  Violation(f"{name} row", (row, col), av[col].item(), ev[col].item()))


def fp32_ulps(name: str, a: torch.Tensor, e: torch.Tensor, ctx: Context) -> CheckResult:
    """FP32 values within ``bounds.FP32_ULPS`` units in the last place of their row's largest expected magnitude (rows
    along the last dim): what one FP32 summation order gives against another over terms of the row's size (a
    router's weight normalisation, an RMS over chunks, an mHC expansion, a projection), where an element
    cancelled to near zero may move many of its own ulps. A changed rule moves far more (a rule that differs by
    one ulp is pinned by its contract, not here). Non-finite values must be identical."""
    bad = _layout(name, a, e)
    if bad is not None:
        return bad
    if a.numel() == 0:
        return passed("fp32_ulps", "§7.3", 0)
    af, ef = a.float(), e.float()
    finite = torch.isfinite(ef)
    row_max = torch.where(finite, ef.abs(), torch.zeros_like(ef)).amax(-1, keepdim=True)
    ulp = (torch.nextafter(row_max, torch.tensor(float("inf"))) - row_max).expand_as(ef)
    same_bits = byte_rows(af.reshape(-1, 1)).eq(byte_rows(ef.reshape(-1, 1))).all(1).reshape(ef.shape)
    off = torch.where(finite, ~((af - ef).abs() <= bounds.FP32_ULPS * ulp), ~same_bits)
    if not bool(off.any()):
        return passed("fp32_ulps", "§7.3", af.numel())
    score = torch.where(off, ((af - ef).abs() / ulp).nan_to_num(float("inf")), torch.zeros_like(ef))
    i = int(score.reshape(-1).argmax())
    idx = tuple(int(v) for v in torch.unravel_index(torch.tensor(i), a.shape))
    return failed("fp32_ulps", "§7.3", af.numel(), int(off.sum()),
                  Violation(name, idx, af.reshape(-1)[i].item(), ef.reshape(-1)[i].item(),
                            f"{bounds.FP32_ULPS} ulp of the row's largest |expected| ({bounds.FP32_ULPS * ulp.reshape(-1)[i].item():.3g})"))


def qr_scale(name: str, a: torch.Tensor, e: torch.Tensor, ctx: Context) -> CheckResult:
    """The Q LoRA activation scale after a chain of FP32 sums (hc_pre, RMSNorm, the split-K projection, the
    chunked RMS): ratio_allclose(2.5e-5, 5e-3), the bound upstream judges it by; the INT8 codes it scales are
    judged exact on their own."""
    bad = _layout(name, a, e)
    if bad is not None:
        return bad
    atol, rtol = bounds.QR_SCALE_TOL
    return precision.check_ratio_allclose(a.float(), e.float(), atol=atol, rtol=rtol, max_error_ratio=0.0, name=name)


def row_rms_peak(name: str, a: torch.Tensor, e: torch.Tensor, ctx: Context) -> CheckResult:
    return precision.check_row_precision(a, e, name=name)


def fp8_budget(name: str, a: torch.Tensor, e: torch.Tensor, ctx: Context) -> CheckResult:
    return precision.check_output_budget(a, e, name=name)


def masked_scores(name: str, a: torch.Tensor, e: torch.Tensor, ctx: Context) -> CheckResult:
    """Indexer scores: the -inf mask must match exactly; finite scores per row within the row rule."""
    bad = _layout(name, a, e)
    if bad is not None:
        return bad
    fa, fe = torch.isfinite(a), torch.isfinite(e)
    if not torch.equal(fa, fe):
        r, c = (int(v) for v in (fa != fe).nonzero()[0])
        return failed("masked_scores", "§5.1", a.numel(), int((fa != fe).sum()),
                      Violation(f"{name} mask", (r, c), float(a[r, c]), float(e[r, c])))
    return precision.check_row_precision(torch.where(fe, a, 0.0), torch.where(fe, e, 0.0), name=name)


def topk_validity(name: str, a: torch.Tensor, e: torch.Tensor, ctx: Context) -> CheckResult:
    """§5.3 validity with the *reference* scores (expected outputs), never the device's."""
    i = ctx.inputs
    tctx = TopKContext(i["block_table"], i["request_ids"], i["compressed_lens"], int(i["block_size"]))
    return check_topk_validity(a, e, tctx, ctx.expected_outputs["scores"], name=name)


def state_ring(name: str, a: torch.Tensor, e: torch.Tensor, ctx: Context) -> CheckResult:
    """Ring slots the reference did not touch stay byte-identical to the input; whole state within 0.5 %."""
    bad = _layout(name, a, e)
    if bad is not None:
        return bad
    before = ctx.inputs[name]
    rows = a.shape[0] * a.shape[1]
    touched = (byte_rows(e.reshape(rows, -1)) != byte_rows(before.reshape(rows, -1))).any(1)
    return cache_checks.check_state(name, a.reshape(rows, -1), e.reshape(rows, -1), touched)


def cache_payload(name: str, a: torch.Tensor, e: torch.Tensor, ctx: Context) -> CheckResult:
    """Quantized cache: unmapped rows byte-exact in payload and scale, scales exact on mapped rows,
    mapped rows decoded within the format budget (MXFP8 1 %, MXFP4 4 %)."""
    from kernels import quant  # the decoder of the stored format

    bad = _layout(name, a, e)
    if bad is not None:
        return bad
    rule = str(ctx.params["rule"])
    slots = ctx.inputs["slots"].to(torch.long)
    rows = a.shape[0] * a.shape[1]
    mapped = torch.zeros(rows, dtype=torch.bool)
    mapped[slots[slots >= 0]] = True
    sa, se = ctx.actual_outputs["scale"], ctx.expected_outputs["scale"]

    def decode(payload, scale):
        return quant.mx_dequantize(quant.MXTensor(payload.reshape(rows, -1), scale.reshape(rows, -1), rule))

    return cache_checks.check_quantized_cache(name, (a, sa), (e, se), mapped, actual_values=decode(a, sa),
                                              expected_values=decode(e, se), fmt=quant.RULES[rule].fmt)


def cache_scale(name: str, a: torch.Tensor, e: torch.Tensor, ctx: Context) -> CheckResult:
    """Scale tensors are byte-exact everywhere (published rows and untouched rows alike)."""
    return exact(name, a, e, ctx)



def hc_mix(name: str, a: torch.Tensor, e: torch.Tensor, ctx: Context) -> CheckResult:
    """mHC coefficients: rows >= num_tokens exactly +0.0 (the zero tail, HC-11), the active rows within
    ratio_allclose(2.5e-5, 5e-3) (HC-07); a tree without num_tokens has the active rows its expected output
    names (the last non-zero row ends them, SP-04), never all its rows."""
    bad = _layout(name, a, e)
    if bad is not None:
        return bad
    from contracts.checks.attention import owner_active_rows

    n, _source = owner_active_rows(e.reshape(1, e.shape[0], -1), inputs=ctx.inputs)  # never the capacity (SP-04)
    tail = a[n:].reshape(-1)
    nonzero = tail.view(torch.int32) != 0
    if bool(nonzero.any()):
        i = int(nonzero.nonzero()[0, 0])
        idx = tuple(int(v) for v in torch.unravel_index(torch.tensor(i), a[n:].shape))
        return failed("hc_mix", "HC-11", tail.numel(), int(nonzero.sum()),
                      Violation(f"{name} padding row", (n + idx[0], *idx[1:]), float(tail[i]), 0.0))
    atol, rtol = bounds.HC_MIX_TOL
    return precision.check_ratio_allclose(a[:n], e[:n], atol=atol, rtol=rtol, name=name)


def hc_out(name: str, a: torch.Tensor, e: torch.Tensor, ctx: Context) -> CheckResult:
    """mHC collapsed / expanded / head outputs: ratio_allclose(1e-4, 1/128) (HC-08)."""
    bad = _layout(name, a, e)
    if bad is not None:
        return bad
    atol, rtol = bounds.HC_OUT_TOL
    return precision.check_ratio_allclose(a.float(), e.float(), atol=atol, rtol=rtol, name=name)


def engram(name: str, a: torch.Tensor, e: torch.Tensor, ctx: Context) -> CheckResult:
    """Engram output (HC-14): ratio_allclose(1e-3, 1e-2); a stack of TP ranks must hold the same output on
    every rank (bitwise) and each is judged."""
    bad = _layout(name, a, e)
    if bad is not None:
        return bad
    atol, rtol = bounds.ENGRAM_TOL
    if ctx.wiring == "sharded":
        same = precision.check_replicas_identical(list(a), name=name)
        if not same.ok:
            return same
    return precision.check_ratio_allclose(a.float(), e.float(), atol=atol, rtol=rtol, name=name)


def bf16_stage(name: str, a: torch.Tensor, e: torch.Tensor, ctx: Context) -> CheckResult:
    """A BF16-ending stage (the collapsed attention input): ratio_allclose(1e-4, 1/128), then every token row
    within 2^-8 relative L2 (AP-14)."""
    bad = _layout(name, a, e)
    if bad is not None:
        return bad
    return precision.check_bf16_stage(a.float(), e.float(), name=name)


def _router_scores(ctx: Context) -> tuple[torch.Tensor, torch.Tensor]:
    """The reference router's (unbiased, biased) scores for every rank's rows: [ep, T, E] each."""
    import torch.nn.functional as F

    from kernels.config import preset
    from kernels.reference.rowwise import rowwise_matmul

    c = preset(str(ctx.params.get("preset", "flash-tiny")))
    xs, w, b = ctx.inputs["xs"], ctx.inputs["router"], ctx.inputs["bias"]
    logits = rowwise_matmul(xs, w)
    scores = F.softplus(logits / c.gate_temperature).sqrt()
    return scores, scores + b.float()


def gate_ids(name: str, a: torch.Tensor, e: torch.Tensor, ctx: Context) -> CheckResult:
    """Router ids per rank (MO-03): valid, unique, and the reference's set unless the scores cannot order
    the swapped experts; only the rank's active rows are judged."""
    from contracts.checks.moe import check_gate_ids

    bad = _layout(name, a, e)
    if bad is not None:
        return bad
    _scores, biased = _router_scores(ctx)
    counts = ctx.inputs["num_tokens"].tolist()
    return first_failure([check_gate_ids(a[r, :n], e[r, :n], biased[r, :n], n_experts=biased.shape[-1],
                                         name=f"{name}.rank{r}") for r, n in enumerate(counts)])


def gate_weights(name: str, a: torch.Tensor, e: torch.Tensor, ctx: Context) -> CheckResult:
    """Router weights per rank (MO-04) at the backend's own ids."""
    from contracts.checks.moe import check_gate_weights
    from kernels.config import preset

    bad = _layout(name, a, e)
    if bad is not None:
        return bad
    scores, _biased = _router_scores(ctx)
    ids = ctx.actual_outputs.get("ids", ctx.expected_outputs["ids"])
    scale = preset(str(ctx.params.get("preset", "flash-tiny"))).routed_scaling_factor
    counts = ctx.inputs["num_tokens"].tolist()
    return first_failure([check_gate_weights(a[r, :n], ids[r, :n], scores[r, :n], scale=scale,
                                             name=f"{name}.rank{r}") for r, n in enumerate(counts)])


def moe_out(name: str, a: torch.Tensor, e: torch.Tensor, ctx: Context) -> CheckResult:
    """Combined MoE output per rank (MO-05, MO-06): padding rows bitwise, the active prefix by ratio_reldiff and
    the worst |Δ|."""
    from contracts.checks.moe import check_moe_rows

    bad = _layout(name, a, e)
    if bad is not None:
        return bad
    counts = ctx.inputs["num_tokens"].tolist()
    return first_failure([check_moe_rows(a[r], e[r], n, name=f"{name}.rank{r}") for r, n in enumerate(counts)])


def recv_y(name: str, a: torch.Tensor, e: torch.Tensor, ctx: Context) -> CheckResult:
    """Routed-expert outputs per destination [ep, n_local, recv_max, D] (MO-05): the recv_expert_count of the
    backend (same tree) per expert in [0, recv_max] and equal to the expected, unused slots exactly zero, the
    used slots within the MO-06 budget."""
    from contracts.checks.moe import check_recv_y

    bad = _layout(name, a, e)
    if bad is not None:
        return bad
    got = ctx.actual_outputs.get("recv_expert_count")
    want = ctx.expected_outputs["recv_expert_count"]
    if got is None:
        return failed("recv_y", "MO-05", 1, 1, Violation("recv_expert_count", (), "missing", list(want.shape)))
    return first_failure([check_recv_y(a[r], e[r], got[r], want[r], recv_max=a.shape[2], name=f"{name}.rank{r}")
                          for r in range(a.shape[0])])


def logits(name: str, a: torch.Tensor, e: torch.Tensor, ctx: Context) -> CheckResult:
    """LM-head logits, full [T, V] or vocab shards [tp, T, V/tp]: every element within 1e-3 + 1e-3·|e| (AP-17)."""
    bad = _layout(name, a, e)
    if bad is not None:
        return bad
    if a.ndim == 3:  # shards in rank order
        tp = a.shape[0]
        return precision.check_logits(torch.cat(list(a), dim=1), torch.cat(list(e), dim=1), tp=tp, name=name)
    return precision.check_logits(a, e, tp=int(ctx.params.get("tp", 1)), name=name)


def greedy(name: str, a: torch.Tensor, e: torch.Tensor, ctx: Context) -> CheckResult:
    """Greedy ids against the first maximum of the backend's own logits (AP-18: self-consistency)."""
    own = ctx.actual_outputs.get("logits")
    if own is None and "logit_shards" in ctx.actual_outputs:
        own = torch.cat(list(ctx.actual_outputs["logit_shards"]), dim=1)
    if own is None:
        return failed("greedy", "AP-18", 1, 1, Violation(name, (), "no logits to judge the ids by", "logits"))
    return precision.check_greedy(a, own, name=name)


def _block_attention_mixes(ctx: Context):
    """The reference attention mixes of a Block tree, from its stored streams and attention mHC weights."""
    from kernels.config import preset
    from kernels.reference.mhc import hc_mixes

    i = ctx.inputs
    return hc_mixes(i["x_hc"], i["attn_function"], i["attn_scale"], i["attn_base"],
                    config=preset(str(ctx.params.get("preset", "flash-tiny"))))


def ffn_input(name: str, a: torch.Tensor, e: torch.Tensor, ctx: Context) -> CheckResult:
    """A Block's FFN input (HC-03/04): the collapse of the backend's own attention_hidden with the attention's
    pre mix -- recomputed here from the stored mHC weights with the reference hc_mixes, so it is judged within
    the mHC output budget (HC-08); on the references it is exact. Judging it against the expected FFN input
    instead would charge the attention's own rounding to the collapse."""
    from kernels.reference.mhc import hc_pre

    bad = _layout(name, a, e)
    if bad is not None:
        return bad
    want = hc_pre(ctx.actual_outputs["attention_hidden"], _block_attention_mixes(ctx).pre)
    atol, rtol = bounds.HC_OUT_TOL
    return precision.check_ratio_allclose(a.float(), want.float(), atol=atol, rtol=rtol, name=name)


def attention_forced(name: str, a: torch.Tensor, e: torch.Tensor, ctx: Context) -> CheckResult:
    """A Block's ``attention_hidden`` (AP-12, teacher forcing): the attention half-layer re-run on the backend's
    own ``attention_input`` from the stored pre-run caches and weights, expanded with the reference mixes of the
    stored streams, is what the output is held to (the FP8 output budget); the backend's attention input itself
    is judged by ``bf16_stage``. Judged against the chain, one BF16 step of the collapse could move an MXFP8 code
    and be charged to the attention. The end-to-end difference is reported on failure, not gated."""
    from contracts.checks.teacher import check_stage_forced
    from kernels.config import preset
    from kernels.reference.attention_layer import attention_half_layer
    from kernels.reference.mhc import hc_post

    bad = _layout(name, a, e)
    if bad is not None:
        return bad
    i, p = ctx.inputs, ctx.params
    config = preset(str(p.get("preset", "flash-tiny")))
    attn = _block_attention_mixes(ctx)

    def rerun(x: torch.Tensor) -> torch.Tensor:
        out = attention_half_layer({**i, "x": x}, kind=str(p["kind"]), phase=str(p["phase"]), wiring="replicated",
                                   tp=int(p["tp"]), config=config)
        return hc_post(out["output"][0], i["x_hc"], attn.post, attn.residual)

    return check_stage_forced(a, ctx.actual_outputs["attention_input"], rerun,
                              lambda got, want: precision.check_output_budget(got, want, name=name), chain_expected=e)


def half_layer(name: str, a: torch.Tensor, e: torch.Tensor, ctx: Context) -> CheckResult:
    """One output of an attention half-layer tree, judged with the whole call in view (contracts.checks.attention):
    the output bound of the mode, cache ownership, the Top-K rule, and an accepted alternative selection judged
    against the reference recomputed for it from the stored inputs (reference caches, original weights)."""
    from contracts.checks.attention import judge_half_layer
    from contracts.checks.teacher import forced_index_input
    from kernels.config import preset
    from kernels.reference.attention_layer import for_selection, with_reference_scores

    p = ctx.params
    call = dict(kind=str(p["kind"]), phase=str(p["phase"]), wiring=ctx.wiring, tp=int(p["tp"]),
                config=preset(str(p["preset"])))
    # IX-13: a differing selection is judged by the scores of what the device gathered (sharded wiring)
    scored = forced_index_input(ctx.inputs, ctx.actual_outputs, wiring=ctx.wiring, tp=call["tp"])
    return judge_half_layer(ctx.actual_outputs, ctx.expected_outputs, ctx.inputs,
                            block_size=call["config"].block_size,
                            scores=lambda: with_reference_scores(scored, **call)[1],
                            reference_for=lambda selection: for_selection(ctx.inputs, selection, **call),
                            only=name, **{k: v for k, v in call.items() if k != "config"})


def v4_index_score(name: str, a: torch.Tensor, e: torch.Tensor, ctx: Context) -> CheckResult:
    """V4 decode index scores (§8): every score finite, the visible ones within ratio_allclose(1e-4, 1/128) and
    each within max(4·(1e-4 + |s|/128), 5e-3), the row past the visible range not judged (upstream's
    score_valid_compare; its kernel leaves that part of the row unwritten)."""
    from contracts.checks.topk import V4_DECODE_TAIL, check_v4_index_scores

    return check_v4_index_scores(a, e, name=name, tail=V4_DECODE_TAIL)


def v4_index_score_lowest_tail(name: str, a: torch.Tensor, e: torch.Tensor, ctx: Context) -> CheckResult:
    """``v4_index_score`` with the row past the visible range held to the lowest FP32 number, as upstream's
    decode golden writes it (a named variant for a kernel that promises the whole row)."""
    from contracts.checks.topk import check_v4_index_scores

    return check_v4_index_scores(a, e, name=name, tail="lowest")


def v4_index_topk(name: str, a: torch.Tensor, e: torch.Tensor, ctx: Context) -> CheckResult:
    """V4 top-k (§8): count, range [offset, offset + visible), distinct, -1 tail; a differing row judged by
    the actual and the reference scores (upstream's decode_topk_compare). ``visible`` from the stored
    positions and kv lengths; ``topk``, ``offset`` and ``seq`` from the case parameters."""
    from contracts.checks.topk import check_v4_topk
    from kernels.v4.indexer import visible_lengths

    p = ctx.params
    visible = visible_lengths(ctx.inputs["position_ids"], ctx.inputs["kv_seq_lens"], seq=int(p["seq"]),
                              limit=a.shape[-1])
    return check_v4_topk(a, e, ctx.actual_outputs["score"], ctx.expected_outputs["score"], visible,
                         topk=int(p["topk"]), offset=int(p["offset"]), name=name)


def attn_out_v4(name: str, a: torch.Tensor, e: torch.Tensor, ctx: Context) -> CheckResult:
    """V4 attention output (the sparse attention with its W8A8 output projection): upstream's compare_fn for
    ``attn_out``, ratio_allclose(1e-4, 1/128) with the 0.5 % quota (§8). A tree that names its ``path`` and
    ``preset`` (the V4-Pro geometry trees) is judged around the reference's output shifted by what a BF16 head
    value on the other side of its rounding can do through the INT8 latent codes, and nothing else
    (contracts.checks.quant_ties.attention_output_slack): at that width one such value moves whole rows."""
    bad = _layout(name, a, e)
    if bad is not None:
        return bad
    atol, rtol = bounds.V4_ATTN_OUT_TOL
    if ctx is None or "path" not in ctx.params:
        return precision.check_ratio_allclose(a.float(), e.float(), atol=atol, rtol=rtol, name=name)
    from contracts.checks.quant_ties import attention_code_flips, explain_rows
    from kernels.config import preset
    from kernels.v4.sparse_attention import attention_indices, v4_sparse_attention

    c, i = preset(str(ctx.params["preset"])), ctx.inputs
    path = str(ctx.params["path"])
    num_tokens = int(i["num_tokens"]) if "num_tokens" in i else None
    seq = c.decode_seq if num_tokens is None else i["q"].shape[0]
    window, cmp = attention_indices(path, i["q"], i["window_indices"], i.get("compressed"), i["position_ids"],
                                    num_tokens=num_tokens, config=c)
    o = v4_sparse_attention(i["q"], i["ori_kv"], window, i["cmp_kv"], i["cmp_block_table"], cmp, i["attn_sink"],
                            seq=seq)
    y, moves = attention_code_flips(o, i["freqs_cos"], i["freqs_sin"], i["wo_a"], i["wo_b"], i["wo_b_scale"],
                                    config=c)
    bad, used = explain_rows(a, y, moves, lambda ev: atol + rtol * ev.abs())
    n_bad, n = int(bad.sum()), a.numel()
    if n_bad <= bounds.V4_ATTN_OUT_QUOTA * n:
        return passed("attn_out_v4", "§8", n)
    a64, e64 = a.double(), e.double()
    excess = torch.where(bad, (a64 - e64).abs() - (atol + rtol * e64.abs()), torch.full_like(a64, -math.inf))
    k = int(excess.reshape(-1).argmax())
    idx = tuple(int(v) for v in torch.unravel_index(torch.tensor(k), a.shape))
    return failed("attn_out_v4", "§8", n, n_bad,
                  Violation(name, idx, float(a64[idx]), float(e64[idx]), atol + rtol * abs(float(e64[idx])),
                            note=f"{n_bad} of {n} elements outside ratio_allclose({atol:g}, 1/128) (quota 0.5 %) "
                                 f"after explaining each row by at most 8 INT8 latent codes that a BF16 head value "
                                 f"on the other side of its rounding can flip ({sum(used)} taken; candidates per "
                                 f"row {[m.shape[0] for m in moves]})"))


def v4_prefill_index_score(name: str, a: torch.Tensor, e: torch.Tensor, ctx: Context) -> CheckResult:
    """V4 prefill index scores (§8): as ``v4_index_score`` with upstream's prefill hard floor 7e-3
    (PREFILL_SCORE_HARD_ATOL), and the row past the visible range (a padding row whole) the lowest FP32 number,
    exactly (upstream's prefill_score_compare)."""
    from contracts.checks.topk import V4_PREFILL_TAIL, check_v4_index_scores
    from contracts.tolerances import V4_PREFILL_HARD_ATOL

    return check_v4_index_scores(a, e, name=name, hard_floor=V4_PREFILL_HARD_ATOL, tail=V4_PREFILL_TAIL)


def v4_prefill_index_topk(name: str, a: torch.Tensor, e: torch.Tensor, ctx: Context) -> CheckResult:
    """V4 prefill top-k (§8): raw compressed positions (no offset), min(topk, visible) of them with
    visible = min((pos + 1) // 4, the row width) for the first ``num_tokens`` rows and 0 (all -1) for the
    padding rows; a differing row judged by both score rows with the prefill hard floor (upstream's
    prefill_topk_compare). ``topk`` from the case parameters."""
    from contracts.checks.topk import check_v4_topk
    from contracts.tolerances import V4_PREFILL_HARD_ATOL
    from kernels.v4.prefill_indexer import prefill_visible

    visible = prefill_visible(ctx.inputs["position_ids"], int(ctx.inputs["num_tokens"]), cap=a.shape[-1],
                              padding_rows="unscored")
    return check_v4_topk(a, e, ctx.actual_outputs["score"], ctx.expected_outputs["score"], visible,
                         topk=int(ctx.params["topk"]), offset=0, name=name, hard_floor=V4_PREFILL_HARD_ATOL)


def v4_cmp_pool(name: str, a: torch.Tensor, e: torch.Tensor, ctx: Context) -> CheckResult:
    """A V4 compressed pool written in place (§8): the rows the reference published within ratio_allclose(1e-4,
    1/128) with no quota (upstream's cmp_kv compare_fn), every other row kept byte for byte (the input of the
    same name)."""
    return precision.check_owned_rows(a, e, ctx.inputs[name], atol=bounds.V4_CMP_POOL_TOL[0], rtol=bounds.V4_CMP_POOL_TOL[1],
                                      name=name)


def v4_state_pool(name: str, a: torch.Tensor, e: torch.Tensor, ctx: Context) -> CheckResult:
    """A V4 compressor state pool written in place (§8): the rows the reference wrote within ratio_allclose(1e-3,
    1e-3) with no quota (upstream's compress_state compare_fn), every other row kept byte for byte."""
    return precision.check_owned_rows(a, e, ctx.inputs[name], atol=bounds.V4_STATE_POOL_TOL[0],
                                      rtol=bounds.V4_STATE_POOL_TOL[1], name=name)




def v4_prefill_mtp_out(name: str, a: torch.Tensor, e: torch.Tensor, ctx: Context) -> CheckResult:
    """A V4 prefill MTP output [T, ...] (§8): the first ``num_tokens`` token rows within upstream's
    ratio_reldiff(0.02, 5 %) and the padding rows exactly 0 (the zero tail the stages leave)."""
    bad = _layout(name, a, e)
    if bad is not None:
        return bad
    diff_thd, pct_thd = bounds.V4_PREFILL_MTP_RELDIFF
    return precision.check_ratio_reldiff(a, e, diff_thd=diff_thd, pct_thd=pct_thd,
                                         valid_rows=int(ctx.inputs["num_tokens"]), zero_tail=True, name=name)


MTP_OUT_INPUTS = ("hidden", "prev", "enorm", "hnorm", "e_proj", "e_scale", "e_smooth", "h_proj", "h_scale", "h_smooth")


def mtp_out(name: str, a: torch.Tensor, e: torch.Tensor, ctx: Context) -> CheckResult:
    """mtp_projection's FP32 streams [T, hc, D] (§8): ``fp32_ulps``, plus at each element the move of one INT8
    code step at every input element of its rows (the embedding row, the stream's row) whose exact scaled value
    lies within a hair of a rounding tie (contracts.checks.quant_ties): another FP32 order of the RMS may round
    those to the neighbouring code, nothing else may move."""
    from contracts.checks.quant_ties import int8_linear_slack
    from kernels.config import preset
    from kernels.v4.mtp import _rms, quantize_rows_int8

    bad = _layout(name, a, e)
    if bad is not None:
        return bad
    missing = [k for k in MTP_OUT_INPUTS if k not in ctx.inputs]
    if missing:
        return failed("mtp_out", "§8", a.numel(), a.numel(),
                      Violation(name, (), None, None, f"the tree has no input {missing[0]!r} (not an MTP tree?)"))
    c = preset(str(ctx.params.get("preset", "v4-pro-tiny")))
    i, eps, smax, aeps = ctx.inputs, c.rms_norm_eps, c.int8_scale_max, c.int8_amax_eps

    def rows(x, w, smooth, weight, scale):
        x64 = x.double()
        exact = x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + eps) * w.double() * smooth.double()
        codes, _ = quantize_rows_int8(_rms(x, w, eps) * smooth.float(), scale_max=smax, amax_eps=aeps)
        return int8_linear_slack(exact, codes, weight, scale, scale_max=smax, amax_eps=aeps)

    lo_e, hi_e, near_e = rows(i["hidden"], i["enorm"], i["e_smooth"], i["e_proj"], i["e_scale"])
    lo_h, hi_h, near_h = rows(i["prev"], i["hnorm"], i["h_smooth"], i["h_proj"], i["h_scale"])
    lo, hi = lo_e[:, None, :] + lo_h, hi_e[:, None, :] + hi_h
    af, ef = a.float(), e.float()
    finite = torch.isfinite(ef)
    row_max = torch.where(finite, ef.abs(), torch.zeros_like(ef)).amax(-1, keepdim=True)
    tol = bounds.FP32_ULPS * (torch.nextafter(row_max, torch.tensor(float("inf"))) - row_max).expand_as(ef).double()
    diff = af.double() - ef.double()
    lo, hi = lo * (1 + 2.0 ** -20) - tol, hi * (1 + 2.0 ** -20) + tol
    off = torch.where(finite, ~((diff >= lo) & (diff <= hi)), ~(af == ef) & ~(af.isnan() & ef.isnan()))
    if not bool(off.any()):
        return passed("mtp_out", "§8", af.numel())
    over = torch.where(diff > hi, diff - hi, lo - diff) / tol
    score = torch.where(off, over.nan_to_num(float("inf")), torch.zeros_like(diff))
    k = int(score.reshape(-1).argmax())
    idx = tuple(int(v) for v in torch.unravel_index(torch.tensor(k), a.shape))
    ties = int(near_e[idx[0]].sum()) + int(near_h[idx[0], idx[1]].sum())
    return failed("mtp_out", "§8", af.numel(), int(off.sum()),
                  Violation(name, idx, af.reshape(-1)[k].item(), ef.reshape(-1)[k].item(),
                            f"{bounds.FP32_ULPS} ulp of the row's largest |expected| plus one code step toward the tie's "
                            f"other side at the {ties} near-tie input element(s) of its rows "
                            f"([{lo.reshape(-1)[k].item():.3g}, {hi.reshape(-1)[k].item():.3g}] around expected)"))


def rms_scale(name: str, a: torch.Tensor, e: torch.Tensor, ctx: Context) -> CheckResult:
    """A per-row FP32 scale that is exact factors times rsqrt(mean of D squares + eps) (v4_gate's x_norm_scale,
    D the last dim of the input ``x_mixed``), §8: ``fp32_ulps`` plus the worst-case FP32 error of a sum of D
    non-negative terms in any order, (D - 1)·2^-24 relative, halved by the square root. A kernel sums the squares in
    its own tile order (measured on a5sim: the V4-Pro gate's scales 5 to 6 ulps from the FP64-summed reference at
    D 7168); at D 64 the bound is 16 ulps, and a rule change (a mean over D - 1, a missing eps) is pinned by the
    tiny contracts, where it moves the scale far more."""
    bad = _layout(name, a, e)
    if bad is not None:
        return bad
    if "x_mixed" not in ctx.inputs:
        return failed("rms_scale", "§8", a.numel(), a.numel(),
                      Violation(name, (), None, None, "the tree has no input 'x_mixed' (the reduction's length)"))
    d = int(ctx.inputs["x_mixed"].shape[-1])
    af, ef = a.float().double(), e.float().double()
    ulp = (torch.nextafter(e.float().abs(), torch.tensor(float("inf"))) - e.float().abs()).double()
    bound = bounds.FP32_ULPS * ulp + ef.abs() * (d - 1) * bounds.RMS_SUM_REL_PER_TERM / 2
    off = ~((af - ef).abs() <= bound) & ~(a.float() == e.float())
    if not bool(off.any()):
        return passed("rms_scale", "§8", a.numel())
    k = int(((af - ef).abs() / bound).masked_fill(~off, 0).reshape(-1).argmax())
    idx = tuple(int(v) for v in torch.unravel_index(torch.tensor(k), a.shape))
    return failed("rms_scale", "§8", a.numel(), int(off.sum()),
                  Violation(name, idx, a.reshape(-1)[k].item(), e.reshape(-1)[k].item(),
                            f"{bounds.FP32_ULPS} ulp plus (D - 1)·2^-24 / 2 relative, D = {d} "
                            f"({bound.reshape(-1)[k].item():.3g})"))


Q_BF16_INPUTS = ("wq_b", "wq_b_scale", "rope_cos", "rope_sin")


def q_bf16(name: str, a: torch.Tensor, e: torch.Tensor, ctx: Context) -> CheckResult:
    """v4_qkv_proj_rope's q [T, H, head_dim] BF16 (§8): the reference's bytes, except the other BF16 neighbour of
    the reference's FP32 value where the reference's FP32 value before the rounding (``kernels.v4.qkv_proj.q_before_rounding`` of the
    expected qr codes and scale, which their own comparators pin) lies within 32 FP32 ulps of a BF16 midpoint
    (contracts.checks.quant_ties.bf16_near_midpoints): another FP32 order of a head's RMS may land there on the
    other side, nothing else may move."""
    from kernels.config import preset
    from kernels.v4.qkv_proj import q_before_rounding

    bad = _layout(name, a, e)
    if bad is not None:
        return bad
    missing = [k for k in Q_BF16_INPUTS if k not in ctx.inputs] + \
        [k for k in ("qr", "qr_scale") if k not in ctx.expected_outputs]
    if missing:
        return failed("q_bf16", "§8", a.numel(), a.numel(),
                      Violation(name, (), None, None, f"the tree has no {missing[0]!r} (not a Q/KV projection tree?)"))
    c = preset(str(ctx.params.get("preset", "v4-pro-tiny")))
    i = ctx.inputs
    pre = q_before_rounding(ctx.expected_outputs["qr"], ctx.expected_outputs["qr_scale"], i["wq_b"], i["wq_b_scale"],
                            i["rope_cos"], i["rope_sin"], config=c)
    return _bf16_either_side("q_bf16", name, a, e, pre)


def _bf16_either_side(check: str, name: str, a: torch.Tensor, e: torch.Tensor, pre: torch.Tensor) -> CheckResult:
    """BF16 ``a`` against the reference's bytes ``e``: equal, or the other BF16 neighbour of the reference's FP32
    value ``pre`` where ``pre`` lies within 32 FP32 ulps of a BF16 midpoint (quant_ties.bf16_near_midpoints)."""
    from contracts.checks.quant_ties import bf16_near_midpoints, bf16_neighbours

    ab, eb = a.contiguous().view(torch.int16).int(), e.contiguous().view(torch.int16).int()
    down, up = bf16_neighbours(pre)
    step = (ab == down) | (ab == up)  # the reference's FP32 value rounded either way
    off = ~(ab == eb) & ~(step & bf16_near_midpoints(pre))
    if not bool(off.any()):
        return passed(check, "§8", a.numel())
    k = int(off.reshape(-1).to(torch.uint8).argmax())
    idx = tuple(int(v) for v in torch.unravel_index(torch.tensor(k), a.shape))
    why = ("the other BF16 neighbour, but the reference's FP32 value is not near a BF16 midpoint"
           if bool(step.reshape(-1)[k]) else "not a BF16 neighbour of the reference's FP32 value")
    return failed(check, "§8", a.numel(), int(off.sum()),
                  Violation(name, idx, a.reshape(-1)[k].item(), e.reshape(-1)[k].item(),
                            f"{why} (FP32 before rounding {pre.reshape(-1)[k].item():.9g})"))


def norm_bf16(name: str, a: torch.Tensor, e: torch.Tensor, ctx: Context) -> CheckResult:
    """final_norm's BF16 rows [T, D] (§8): the reference's bytes, except the other BF16 neighbour where the
    reference's FP32 value before the rounding (x · rsqrt(mean(x²) + eps) · w of the tree's ``hidden`` and
    ``weight``) lies within 32 FP32 ulps of a BF16 midpoint: a kernel sums the D squares in another FP32 order
    (upstream's V4-Pro rms_norm: 128-wide tiles, then times 1/D), which lands there on either side; nothing else
    may move."""
    from kernels.config import preset
    from kernels.reference.compressor import rms_norm

    bad = _layout(name, a, e)
    if bad is not None:
        return bad
    missing = [k for k in ("hidden", "weight") if k not in ctx.inputs]
    if missing:
        return failed("norm_bf16", "§8", a.numel(), a.numel(),
                      Violation(name, (), None, None, f"the tree has no input {missing[0]!r} (not a norm tree?)"))
    eps = preset(str(ctx.params.get("preset", "v4-pro"))).rms_norm_eps
    pre = rms_norm(ctx.inputs["hidden"].float(), ctx.inputs["weight"], eps).float()
    return _bf16_either_side("norm_bf16", name, a, e, pre)


def v4_kv_pool(name: str, a: torch.Tensor, e: torch.Tensor, ctx: Context) -> CheckResult:
    """A V4 window cache written in place (§8): the rows the reference wrote within upstream's
    mapped_pool_ratio_reldiff(0.01, 5 %), every other row kept byte for byte (the input of the same name)."""
    diff_thd, pct_thd = bounds.V4_KV_POOL_RELDIFF
    leaf = partial(precision.check_ratio_reldiff, diff_thd=diff_thd, pct_thd=pct_thd)
    return precision.check_owned_rows(a, e, ctx.inputs[name], leaf=leaf, name=name)


def v4_cp_x_out(name: str, a: torch.Tensor, e: torch.Tensor, ctx: Context) -> CheckResult:
    """A CP prefill sublayer's streams [cp, 2, 2, R, hc, D] (§7.1): the rows that hold a query within upstream's
    ratio_reldiff(3e-3, 0.5 %, max_diff 1) (prefill_cp_swa.py's compare_fn), every other row exactly 0."""
    bad = _layout(name, a, e)
    if bad is not None:
        return bad
    real = ctx.inputs["query_token_to_request"] >= 0
    empty = a[~real]
    if bool((empty != 0).any()):
        row = tuple(int(v) for v in (~real).nonzero()[int((empty != 0).flatten(1).any(1).nonzero()[0])])
        return failed("v4_cp_x_out", "§7.1", int((~real).sum()), int((empty != 0).flatten(1).any(1).sum()),
                      Violation(f"{name} row without a query", row, float(a[row].abs().max()), 0.0,
                                note="a tile row past the segment's tokens must stay exactly 0"))
    diff_thd, pct_thd, max_diff = bounds.V4_CP_X_OUT_RELDIFF
    return precision.check_ratio_reldiff(a[real], e[real], diff_thd=diff_thd, pct_thd=pct_thd, max_diff=max_diff,
                                         name=name)


def dspark_x_out(name: str, a: torch.Tensor, e: torch.Tensor, ctx: Context) -> CheckResult:
    """The drafter attention's and output projection's x_out [T, D] BF16 (§8): upstream dspark_attention.py's
    compare_fn, ratio_allclose(1e-2, 1e-2) with a 5 % quota; NaN fails."""
    bad = _layout(name, a, e)
    if bad is not None:
        return bad
    atol, rtol = bounds.DSPARK_X_OUT_TOL
    return precision.check_ratio_allclose(a.float(), e.float(), atol=atol, rtol=rtol,
                                          max_error_ratio=bounds.DSPARK_X_OUT_QUOTA, name=name)


def v4_cp_kv_cache(name: str, a: torch.Tensor, e: torch.Tensor, ctx: Context) -> CheckResult:
    """Every rank's window ring after a CP prefill (§7.1): the rows the reference wrote (the decode window) within
    upstream's ratio_allclose(1e-4, 1e-2) and its 0.5 % quota, every other row kept byte for byte (the input of
    the same name)."""
    atol, rtol = bounds.V4_CP_KV_TOL
    leaf = partial(precision.check_ratio_allclose, atol=atol, rtol=rtol, max_error_ratio=bounds.V4_CP_KV_QUOTA)
    return precision.check_owned_rows(a, e, ctx.inputs[name], leaf=leaf, name=name)


def _nan_guarded(fn: Comparator) -> Comparator:
    """``fn``, first failing an actual output that is not NaN where the expected one is (a judge that masks or
    skips the expected side's NaN positions would pass a finite value there: #47's wrong-input table). A NaN the
    actual side holds where the expected one does not is each judge's own business (a tail it does not judge may
    hold anything)."""
    from functools import wraps

    @wraps(fn)
    def judge(name: str, a, e, ctx):
        if isinstance(e, torch.Tensor) and isinstance(a, torch.Tensor) and e.is_floating_point() \
                and tuple(a.shape) == tuple(e.shape):
            lost = torch.isnan(e.float()) & ~(torch.isnan(a.float()) if a.is_floating_point()
                                              else torch.zeros_like(e, dtype=torch.bool))
            if bool(lost.any()):
                k = int(lost.reshape(-1).to(torch.uint8).argmax())
                idx = tuple(int(v) for v in torch.unravel_index(torch.tensor(k), e.shape))
                return failed(fn.__name__, "§7.3", e.numel(), int(lost.sum()),
                              Violation(name, idx, float(a.reshape(-1)[k]), float("nan"),
                                        note="the expected output is NaN there; a finite value is not it"))
        return fn(name, a, e, ctx)

    return judge


COMPARATORS: dict[str, Comparator] = {
    "exact": exact, "gate_codes": gate_codes, "fp32_ulps": fp32_ulps, "norm_bf16": norm_bf16, "qr_scale": qr_scale, "row_rms_peak": row_rms_peak, "fp8_budget": fp8_budget, "masked_scores": masked_scores,
    "topk_validity": topk_validity, "state_ring": state_ring, "cache_payload": cache_payload,
    "cache_scale": cache_scale, "half_layer": half_layer, "hc_mix": hc_mix, "hc_out": hc_out, "bf16_stage": bf16_stage, "engram": engram, "recv_y": recv_y,
    "gate_ids": gate_ids, "gate_weights": gate_weights, "moe_out": moe_out, "logits": logits, "greedy": greedy,
    "ffn_input": ffn_input, "attention_forced": attention_forced, "attn_out_v4": attn_out_v4,
    "v4_index_score": v4_index_score, "v4_index_score_lowest_tail": v4_index_score_lowest_tail,
    "v4_index_topk": v4_index_topk,
    "v4_prefill_index_score": v4_prefill_index_score, "v4_prefill_index_topk": v4_prefill_index_topk,
    "v4_cmp_pool": v4_cmp_pool, "v4_state_pool": v4_state_pool,
    "v4_prefill_mtp_out": v4_prefill_mtp_out, "v4_cp_x_out": v4_cp_x_out, "v4_cp_kv_cache": v4_cp_kv_cache, "dspark_x_out": dspark_x_out, "v4_kv_pool": v4_kv_pool, "mtp_out": mtp_out, "q_bf16": q_bf16, "rms_scale": rms_scale,
}
COMPARATORS = {name: _nan_guarded(fn) for name, fn in COMPARATORS.items()}
# the other actual outputs a comparator reads (a chain judge: a wrong one of those can fail it too)
READS_ACTUAL: dict[str, tuple[str, ...]] = {
    "cache_payload": ("scale",), "greedy": ("logits", "logit_shards"), "ffn_input": ("attention_hidden",),
    "attention_forced": ("attention_input",), "v4_index_topk": ("score",), "v4_prefill_index_topk": ("score",),
    "gate_weights": ("ids",), "recv_y": ("recv_expert_count",),
    "half_layer": ("*",),  # the whole layer's actual outputs (judge_half_layer)
}


def compare(name: str, comparator: str, actual: torch.Tensor, expected: torch.Tensor, ctx: Context) -> CheckResult:
    try:
        fn = COMPARATORS[comparator]
    except KeyError:
        return failed("compare", "§7.3", 1, 1, Violation(f"{name}.comparator", (), comparator,
                                                           f"one of {sorted(COMPARATORS)}"))
    return fn(name, actual, expected, ctx)


def compare_all(comparators: Mapping[str, str], ctx: Context) -> dict[str, CheckResult]:
    """Every expected output compared; a missing actual output fails naming it."""
    out = {}
    for name, comp in comparators.items():
        if name not in ctx.actual_outputs:
            out[name] = failed("compare", "§7.3", 1, 1, Violation(name, (), "missing", "an output"))
            continue
        result = compare(name, comp, ctx.actual_outputs[name], ctx.expected_outputs[name], ctx)
        if not result.ok and not result.evidence:
            result = with_evidence(name, result, ctx)
        out[name] = result
    return out


def with_evidence(name: str, result: CheckResult, ctx: Context) -> CheckResult:
    """A failed result with its first mismatches and, where the bytes show one, its cause. A quantized cache
    payload (``payload`` / ``<cache>_payload``) stored as uint8 is packed FP4 (MXFP8 payloads are
    float8_e4m3fn); its scale is the output of the same name with ``scale``."""
    from dataclasses import replace

    from contracts.evidence import cause, is_packed_fp4, is_payload, mismatches

    a, e = ctx.actual_outputs[name], ctx.expected_outputs[name]
    codec = "fp4x2" if is_packed_fp4(name, a) else None
    partner = name[: -len("payload")] + "scale" if is_payload(name) else None
    scales = ((ctx.actual_outputs[partner], ctx.expected_outputs[partner])
              if partner in ctx.actual_outputs and partner in ctx.expected_outputs else None)
    return replace(result, evidence=mismatches(a, e, codec=codec),
                   cause=result.cause or cause(a, e, codec=codec, scales=scales))


def verdict(results: Mapping[str, CheckResult]) -> CheckResult:
    return first_failure(list(results.values())) if results else passed("compare", "§7.3", 0)


# Every comparator's bound, from the check modules that declare them: a comparator without a bound, or a bound
# without a comparator, fails tests/test_comparator_bounds.py.
BOUNDS: dict[str, Bound] = bounds_by_name(precision.BOUNDS, cache_checks.BOUNDS, topk.BOUNDS, moe_checks.BOUNDS,
                                          attention_checks.BOUNDS, quant_ties.BOUNDS)
# The numbers each tree record stores for its comparators, and the report prints.
TOLERANCES: dict[str, dict[str, float]] = {name: dict(b.values) for name, b in BOUNDS.items()}
