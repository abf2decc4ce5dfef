"""V4's MoE router at decode (spec §8; upstream gate.py, the deferred-RMSNorm form): the FFN RMSNorm, the INT8
activation the experts are dispatched with, the router scores and the top-k routes.

For each real row t (t < num_tokens) of x_mixed [T, D] BF16:

1. xg = x · γ in FP32 (γ = norm_w, BF16) -- the row is *not* divided by its RMS here;
   inv_rms = 1 / sqrt(Σ x² / D + eps) of the raw row;
2. the dispatched activation: amax = max(|xg|, 1e-4), codes = round-half-even(xg · (127 / amax)) (INT8; the
   positive inv_rms would cancel in a symmetric code, so it is left out), and the dequantization factor
   ``x_norm_scale = (amax · (1/127)) · inv_rms`` -- amax times the FP32 constant 1/127, as upstream's kernel computes
   it, not the reciprocal of the quantization factor (V4's other INT8 rows, ``kernels.v4.mtp.quantize_rows_int8``,
   store that reciprocal; so does upstream's gate *golden*, kept as ``dequant_factor="reciprocal"``);
3. logits = inv_rms · (xg · gate_wᵀ) in FP32; score = sqrt(softplus(logit)) with softplus kept alive in the
   negative tail (log1p(exp(-|l|)) + max(l, 0): a naive log(1 + exp(l)) is 0 in FP32 below about -17);
4. routes: a hash layer (layer_id < num_hash_layers) takes tid2eid[input_ids[t]]; a score layer the top-k of
   score + gate_bias, best first, ties to the lower expert id;
5. weights = score[routes] / Σ score[routes] · routed_scaling_factor -- the *unbiased* scores, the bias only
   chooses.

Rows from num_tokens on are padding: scale 0, routes 0 and weights 0. Their codes follow ``padding_codes``:

- ``"quantized"`` (default, upstream's rule): every row is coded by step 2, padding rows included, as upstream's
  kernel codes every row of the active 16-row M-tile and upstream's golden codes every row; upstream's comparator
  checks ``x_norm_i8`` on the rows below ``gate_active_rows(num_tokens)`` (num_tokens rounded up to the M-tile),
  so a faithful kernel's padding rows inside the tile hold their codes and the rows past it are unchecked;
- ``"zero"``: padding rows' codes are 0 (this project's rule before 2026-12; kept by name).

Spec: §8; docs/coverage.md, V4 section (V4-15); docs/upstream.md (the x_norm_i8 padding rows).
"""

from __future__ import annotations

import torch

from kernels.errors import ContractInputError, is_int
from kernels.operators import operator
from kernels.record import BadCall, CaseSpec, Record, in_all_folders, replaced

SPEC = "§8"
ROUNDING_VERSION = "v4-gate-2"
PADDING_CODES = ("quantized", "zero")  # named variants of the padding rows' x_norm_i8 (see above)
GATE_M_TILE = 16  # upstream gate.py: the Cube M-tile the kernel codes whole
# named variants of the dispatch factor: "product" amax · (1/127) (upstream's kernel, gate.py's ffn_norm stage),
# "reciprocal" 1 / (127 / amax) (V4-Pro's golden, _per_token_int8_quant: a true division) and "rounded-reciprocal"
# 1 / (fl(1/amax) · 127) (the V4-Flash folders' golden: ``INT8_SCALE_MAX / amax`` with a Python float, which torch
# computes as reciprocal(amax) · 127, two roundings -- the codes are then taken with that quantization factor too);
# they differ by an FP32 ulp or two on some rows
DEQUANT_FACTOR = ("product", "reciprocal", "rounded-reciprocal")


def _check(x_mixed, norm_w, gate_w, gate_bias, layer_id, num_tokens, tid2eid, input_ids, config) -> None:
    tokens, d = x_mixed.shape
    experts, k = config.n_routed_experts, config.num_experts_per_tok
    if d != config.hidden_size or norm_w.shape != (d,):
        raise ContractInputError("x_mixed/norm_w", None, f"[T, {config.hidden_size}] / [{config.hidden_size}]",
                                 [list(x_mixed.shape), list(norm_w.shape)], SPEC)
    if gate_w.shape != (experts, d) or gate_bias.shape != (experts,):
        raise ContractInputError("gate_w/gate_bias", None, f"[{experts}, {d}] / [{experts}]",
                                 [list(gate_w.shape), list(gate_bias.shape)], SPEC)
    if not is_int(num_tokens) or not 0 <= num_tokens <= tokens:
        raise ContractInputError("num_tokens", None, f"an int in [0, {tokens}]", num_tokens, SPEC)
    if not is_int(layer_id) or not 0 <= layer_id <= config.num_hidden_layers:
        raise ContractInputError("layer_id", None, f"an int in [0, {config.num_hidden_layers}] (the MTP layer last)",
                                 layer_id, SPEC)
    if layer_id < config.num_hash_layers:
        if tid2eid.ndim != 2 or tid2eid.shape[1] != k or input_ids.shape != (tokens,):
            raise ContractInputError("tid2eid/input_ids", None, f"[vocab, {k}] / [{tokens}]",
                                     [list(tid2eid.shape), list(input_ids.shape)], SPEC)
        ids = input_ids[:num_tokens].to(torch.int64)
        bad = (ids < 0) | (ids >= tid2eid.shape[0])
        if bool(bad.any()):
            t = int(bad.nonzero()[0])
            raise ContractInputError("input_ids", (t,), f"a token id in [0, {tid2eid.shape[0]})", int(ids[t]), SPEC)
        routes = tid2eid[ids].to(torch.int64)
        bad = (routes < 0) | (routes >= experts)
        if bool(bad.any()):
            t = int(bad.any(1).nonzero()[0])
            raise ContractInputError("tid2eid", (int(ids[t]),), f"expert ids in [0, {experts})", routes[t].tolist(),
                                     SPEC)


@operator(returns='{x_norm_i8 [T,D] INT8, x_norm_scale [T,1] (amax/127 · inv_rms), indices [T,K] '
                   "INT32, weights [T,K]}: V4's MoE router (hash layers by token id, else biased "
                   'top-k; unbiased weights)',
          spec='§8')
def v4_gate(x_mixed: torch.Tensor, norm_w: torch.Tensor, gate_w: torch.Tensor, gate_bias: torch.Tensor,
            layer_id: int, num_tokens: int, tid2eid: torch.Tensor, input_ids: torch.Tensor, *,
            config, padding_codes: str = "quantized", dequant_factor: str = "product") -> dict[str, torch.Tensor]:
    """-> {"x_norm_i8" [T, D] INT8, "x_norm_scale" [T, 1] FP32, "indices" [T, K] INT32, "weights" [T, K] FP32}.
    ``padding_codes`` names the padding rows' x_norm_i8 rule (``PADDING_CODES``), ``dequant_factor`` the dispatch
    factor's (``DEQUANT_FACTOR``). Spec: §8."""
    if padding_codes not in PADDING_CODES:
        raise ContractInputError("padding_codes", None, f"one of {PADDING_CODES}", repr(padding_codes), SPEC)
    if dequant_factor not in DEQUANT_FACTOR:
        raise ContractInputError("dequant_factor", None, f"one of {DEQUANT_FACTOR}", repr(dequant_factor), SPEC)
    _check(x_mixed, norm_w, gate_w, gate_bias, layer_id, num_tokens, tid2eid, input_ids, config)
    tokens, d = x_mixed.shape
    k, n = config.num_experts_per_tok, num_tokens
    coded = tokens if padding_codes == "quantized" else n
    x = x_mixed[:coded].float()
    xg = x * norm_w.float()
    inv_rms = torch.rsqrt((x.double().pow(2).sum(-1, keepdim=True) / d).float() + config.rms_norm_eps)
    amax = xg.abs().amax(-1, keepdim=True).clamp_min(config.int8_amax_eps)
    if dequant_factor == "rounded-reciprocal":
        quant = torch.reciprocal(amax) * config.int8_scale_max
    else:
        quant = torch.full_like(amax, config.int8_scale_max) / amax
    codes = torch.clamp(torch.round(xg * quant), -config.int8_scale_max, config.int8_scale_max)
    if dequant_factor == "product":
        factor = amax * torch.tensor(1.0 / config.int8_scale_max, dtype=torch.float32)
    else:
        factor = 1.0 / quant
    scale = (factor * inv_rms)[:n]
    xg, inv_rms = xg[:n], inv_rms[:n]
    logits = inv_rms * (xg.double() @ gate_w.double().T).float()
    softplus = logits.clamp(min=0) + torch.log1p(torch.exp(-logits.abs()))
    scores = softplus.sqrt()
    if layer_id < config.num_hash_layers:
        routes = tid2eid[input_ids[:n].to(torch.int64)].to(torch.int64)
    else:
        routes = torch.argsort(-(scores + gate_bias.float()), dim=-1, stable=True)[:, :k]
    picked = torch.gather(scores, 1, routes)
    weights = picked / picked.sum(-1, keepdim=True) * config.routed_scaling_factor
    out = {"x_norm_i8": torch.zeros(tokens, d, dtype=torch.int8),
           "x_norm_scale": torch.zeros(tokens, 1, dtype=torch.float32),
           "indices": torch.zeros(tokens, k, dtype=torch.int32),
           "weights": torch.zeros(tokens, k, dtype=torch.float32)}
    out["x_norm_i8"][:coded] = codes.to(torch.int8)
    out["x_norm_scale"][:n] = scale
    out["indices"][:n] = routes.to(torch.int32)
    out["weights"][:n] = weights.float()
    return out


# --- the record ----------------------------------------------------------------------------------------------

def _gate_inputs(layer: str):
    """Inputs at ``config``'s dims: 6 real rows and the rest padding (a tiny tree spans the gate's whole 16-row
    M-tile; Pro's entry is compiled for ``decode_tokens`` rows), a zero row (the amax floor), a 1000x row (inv_rms
    small, codes still span ±127), and row 0's logit for expert 3 near 128 (|RMSNorm(x)| = √d: exp overflows, only
    a stable softplus stays finite), routed there on a hash layer (``layer`` "hash") and a scored one alike."""
    def build(seed: int, wiring: str, config) -> dict[str, torch.Tensor]:
        g = torch.Generator().manual_seed(seed)
        tiny = config.name.endswith("tiny")
        rows, vocab = (GATE_M_TILE, 32) if tiny else (config.decode_tokens, config.vocab_size)
        d, e, k = config.hidden_size, config.n_routed_experts, config.num_experts_per_tok
        x = torch.randn(rows, d, generator=g)
        x[1] = 0.0
        x[2] *= 1e3
        gate_w = torch.randn(e, d, generator=g) / d**0.5
        gate_w[3] = x[0] / x[0].norm() * 128 / d**0.5
        if tiny:
            tid2eid = torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(vocab)]).to(torch.int32)
        else:
            tid2eid = torch.argsort(torch.rand(vocab, e, generator=g), dim=1)[:, :k].to(torch.int32)
        input_ids = torch.randint(0, vocab, (rows,), generator=g)
        hashed = tid2eid[int(input_ids[0])]
        if not bool((hashed == 3).any()):
            hashed[0] = 3
        layer_id = 0 if layer == "hash" else config.num_hidden_layers - 1
        return {"x_mixed": x.to(torch.bfloat16), "norm_w": (1 + 0.2 * torch.randn(d, generator=g)).to(torch.bfloat16),
                "gate_w": gate_w, "gate_bias": torch.randn(e, generator=g) * 0.1, "layer_id": torch.tensor(layer_id),
                "num_tokens": torch.tensor(6), "tid2eid": tid2eid, "input_ids": input_ids}
    return build


def _gate_call(fn, i: dict[str, torch.Tensor], config) -> dict[str, torch.Tensor]:
    return fn(i["x_mixed"], i["norm_w"], i["gate_w"], i["gate_bias"], int(i["layer_id"]), int(i["num_tokens"]),
              i["tid2eid"], i["input_ids"], config=config)


RECORD = Record(
    operator="v4_gate",
    call=_gate_call,
    # exact where one rule gives one byte pattern; fp32_ulps where upstream sums the RMS and the weight
    # normalisation in another FP32 order
    outputs={"x_norm_i8": "exact", "x_norm_scale": "fp32_ulps", "indices": "exact", "weights": "fp32_ulps"},
    outputs_at={**{g: {"x_norm_scale": "rms_scale"} for g in ("pro", "v4-flash")},
                # 128 rows: the kernel codes only the real rows' M-tiles (upstream's comparator checks those)
                "dspark": {"x_norm_scale": "rms_scale", "x_norm_i8": "gate_codes"}},  # a D-term FP32 sum of squares in the kernel's order
    cases=(
        CaseSpec("v4_gate_hash", "V4 router on a hash layer (layer 0): ids from tid2eid by token id, 6 real rows and "
                 "the rest padding inside the tile, a zero row, a 1000x row and row 0's logit for expert 3 near 128 "
                 "(routed there on both layers)", _gate_inputs("hash"),
                 geometries=("tiny", "pro", "v4-flash", "dspark")),
        CaseSpec("v4_gate_scored", "V4 router on a scored layer: biased top-k, unbiased weights, 6 real rows and the "
                 "rest padding inside the tile, a zero row, a 1000x row and row 0's logit for expert 3 near 128 "
                 "(routed there on both layers)", _gate_inputs("scored"),
                 geometries=("tiny", "pro", "v4-flash", "dspark")),
    ),
    bad_calls=(
        BadCall("num_tokens past the rows", "v4_gate_scored", replaced(num_tokens=torch.tensor(17)), "num_tokens"),
        BadCall("an id past tid2eid", "v4_gate_hash", replaced(input_ids=lambda i: i["input_ids"] * 0 + 32),
                "input_ids"),
        BadCall("gate_w of another width", "v4_gate_scored", replaced(gate_w=lambda i: i["gate_w"][:, :-1]),
                "gate_w/gate_bias"),
        BadCall("layer past the MTP layer", "v4_gate_scored", replaced(layer_id=torch.tensor(62)), "layer_id"),
    ),
    bindings=in_all_folders(golden="gate.py::golden_gate_core", entry="gate.py::gate_test"),
)
