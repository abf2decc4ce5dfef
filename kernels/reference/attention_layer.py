"""The attention half-layer of every V4.1 mode, composed from the operators, simulated across TP ranks.

One call takes the normalized input rows, the layer's weights, its caches and the ForwardMetadata fields it
reads, and returns what the device entry returns: the attention output (every rank's replica in the
replicated wiring, every rank's owner slab in the sharded wiring) and every cache it owns, updated.

Per mode (spec §1, §2.3):

* every mode: ``qr = RMSNorm(x @ wq_a) * q_norm`` kept in FP32 (rule ``fp32-norm``; the older upstream rule
  ``bf16-proj`` rounds the projection to BF16 before the norm, selectable by name), ``q = qr @ wq_b`` -> BF16
  [T, H, D]; ``kv = RMSNorm(x @ wkv) * kv_norm`` -> BF16, the single 512-d head that is key and value; both
  get the adjacent-pair RoPE on their last ``qk_rope_head_dim`` dims with the **token** profile at
  ``position_ids``. The window KV is published into the MXFP8 window cache at ``window_slots`` and attention
  reads the whole cache back through the codec (BF16 values, §2.3), gathered by ``window_indices``.
* FULL (C2A at ratio 2 with the paged ring compressor, C1A at ratio 1): the compressed latent gets RoPE with
  the **compressed** profile at ``compressed_rope_position_ids`` and is published (MXFP4, g16 E4M3) with its
  index key (MXFP4, g32 E8M0) at ``compressed_slots`` (ratio 2: only the rows that close a pair).
* FULL and REINDEX score the index cache with the index query (``qr`` in BF16 @ ``index_wq_b``, token-profile
  RoPE) and take the Top-K physical rows; C1A FULL also derives the candidate-block mask from its scores, and
  REINDEX scores only inside the candidate mask it is given (layer 20's). REINDEX and REUSE never write the
  compressed or index caches; REUSE attends to the source layer's Top-K rows as given and owns no
  compressor or indexer weights. SWA has no compressed rows.
* Attention is the sink-augmented sparse attention of ``sparse_attention``; each rank holds ``H/TP`` heads,
  their ``wq_b`` columns and sinks, and ``G/TP`` output groups (``wo_a`` groups, ``wo_b`` rows) and produces
  an FP32 partial through ``o_proj``. ``wq_a``, ``wkv``, the compressor/indexer weights and every cache are
  replicated: they are computed once here, as every rank would compute the same bytes.
* Replicated wiring: ``tp_all_reduce`` (FP32 rank-order sum, one BF16 cast); every rank's replica is written to
  the active rows of a buffer the harness fills with the 13.0 sentinel, so inactive rows keep it.
  Sharded wiring: ``x`` arrives as owner slabs [TP, ceil(T/TP), hidden] and is all-gathered; the output is
  ``tp_reduce_scatter`` of the partials: owner slabs with inactive rows exactly zero (§7.1).

Prefill and decode run the same arithmetic; the phase sets the caller contract (capacities, the inactive
suffix only C2A REUSE decode accepts), checked by the backend's ``half_layer_call`` before anything runs.

The device weights ``wq_a``, ``wq_b``, ``wkv``, ``index_wq_b`` and ``wo_b`` are MXFP8 (E4M3 with E8M0 scales per
32 inputs) and the device quantizes activations for those matmuls; this reference takes decoded weight
values and multiplies in FP64 with FP32 outputs, so the MX weight codec is not part of it.

Every primitive is taken from ``ops`` (operator name -> callable, defaulting to the Torch references), so a
backend that replaces one operator -- the emulated tiled attention, a seeded defect -- is judged through the
whole layer.

Spec: §1, §2.3, §4, §5, §7.1, §7.2; upstream_checks AP-01..10, SP-05/09, CH-03/04, RR-09/12, IX-10/12.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch

from kernels import cache as cache_abi
from kernels.config import FLASH_TINY, LayerKind, V41Config
from kernels.errors import ContractInputError
from kernels.operators import operator
from kernels.reference.compressor import (
    CompressorWeights,
    compressor_ratio1,
    project,
    publish_compressed,
    rms_norm,
)
from kernels.reference.indexer import index_head_weights
from kernels.reference.rope import rope_interleave
from kernels.sequence_parallel import sp_bounds

SPEC = "§2.3"
ROUNDING_VERSION = "half-layer-1"
SENTINEL = 13.0  # the harness's initial value of attention_output (§6 "Sentinels")
WIRINGS = ("replicated", "sharded")
Q_LATENT_RULES = ("fp32-norm", "bf16-proj")  # current upstream rule first
REPRESENTATIVE_LAYER = {LayerKind.SWA: 0, LayerKind.C2A_FULL: 2, LayerKind.C2A_REUSE: 3, LayerKind.C1A_FULL: 20,
                        LayerKind.C1A_REINDEX: 24, LayerKind.C1A_REUSE: 21}  # §1
FULL = (LayerKind.C2A_FULL, LayerKind.C1A_FULL)
INDEXING = (LayerKind.C2A_FULL, LayerKind.C1A_FULL, LayerKind.C1A_REINDEX)
REUSE = (LayerKind.C2A_REUSE, LayerKind.C1A_REUSE)

Tensors = Mapping[str, torch.Tensor]


def ratio_of(kind: LayerKind, config: V41Config = FLASH_TINY) -> int:
    """The compression ratio of a mode, as the schedule gives it (§1)."""
    return next(layer.compress_ratio for layer in config.schedule if layer.kind is LayerKind(kind))


def required_inputs(kind: LayerKind) -> tuple[str, ...]:
    """The input names a half-layer of ``kind`` reads (weights, caches, metadata fields)."""
    names = ["x", "num_tokens", "query_start_loc", "position_ids", "token_to_req_indices", "rope_cos", "rope_sin",
             "window_slots", "window_indices", "window_payload", "window_scale", "wq_a", "q_norm", "wq_b", "wkv",
             "kv_norm", "sink", "wo_a", "wo_b"]
    if kind is not LayerKind.SWA:
        names += ["compressed_payload", "compressed_scale", "compressed_block_table", "compressed_lens"]
    if kind in FULL:
        names += ["index_payload", "index_scale", "compressed_slots", "compressed_rope_cos", "compressed_rope_sin",
                  "cmp_wkv", "cmp_norm", "index_wk", "index_norm"]
    if kind is LayerKind.C2A_FULL:
        names += ["cmp_wgate", "state_cache", "state_block_table"]
    if kind in INDEXING:
        names += ["index_wq_b", "index_weights_proj"]
    if kind is LayerKind.C1A_REINDEX:
        names += ["index_payload", "index_scale", "candidate_mask"]
    if kind in REUSE:
        names += ["topk_indices"]
    return tuple(names)


def _reference_ops() -> dict[str, Callable]:
    from kernels.half_layer import half_layer_call
    from kernels.reference import attention, indexer, o_proj, tp
    from kernels.reference.compressor import compressor_ratio2

    return {"half_layer_call": half_layer_call, "sparse_attention": attention.sparse_attention,
            "o_proj": o_proj.o_proj, "tp_all_reduce": tp.tp_all_reduce,
            "tp_reduce_scatter": tp.tp_reduce_scatter, "cache_publish": cache_abi.cache_publish,
            "cache_read": cache_abi.cache_read, "compressor_ratio2": compressor_ratio2,
            "index_scores": indexer.index_scores, "select_topk": indexer.select_topk,
            "candidate_blocks": indexer.candidate_blocks}


def _get(inputs: Tensors, name: str, where: str) -> torch.Tensor:
    try:
        return inputs[name]
    except KeyError:
        raise ContractInputError(name, None, f"an input of the {where} half-layer", "missing", SPEC) from None


def _cache(config: V41Config, kind: str, inputs: Tensors, prefix: str, where: str) -> cache_abi.QuantCache:
    layout = cache_abi.layouts(config)[kind]
    payload, scale = _get(inputs, f"{prefix}_payload", where), _get(inputs, f"{prefix}_scale", where)
    if payload.ndim != 4:
        raise ContractInputError(f"{prefix}_payload", None, f"[blocks, rows, 1, width] ({where})", list(payload.shape),
                                 SPEC)
    blocks = payload.shape[0]
    for name, t, shape, dtype in ((f"{prefix}_payload", payload, layout.payload_shape(blocks), layout.payload_dtype),
                                  (f"{prefix}_scale", scale, layout.scale_shape(blocks), layout.scale_dtype)):
        if tuple(t.shape) != shape or t.dtype != dtype:
            raise ContractInputError(name, None, f"{dtype}{list(shape)} ({where})", f"{t.dtype}{list(t.shape)}", SPEC)
    return cache_abi.QuantCache(layout, payload, scale)  # publish returns new tensors: the inputs are never written


def _rows(read: Callable, cache: cache_abi.QuantCache) -> torch.Tensor:
    """Every physical row of a cache decoded to BF16 values [rows, logical] (§2.3 read)."""
    values = read(cache, dtype=torch.bfloat16)
    return values.reshape(-1, values.shape[-1])


def _gather_slabs(x: torch.Tensor, tp: int, tokens: int, active: int, where: str) -> torch.Tensor:
    """AllGather of the sharded input: the owned rows of each rank's slab; padding rows must be zero."""
    bounds = sp_bounds(active, tp, tokens)
    width = bounds[0].width
    if x.ndim != 3 or x.shape[0] != tp or x.shape[1] != width:
        raise ContractInputError("x", None, f"[{tp}, {width}, hidden] owner slabs (sharded wiring, {where})",
                                 list(x.shape), "§7.1")
    rows = []
    for rank, b in enumerate(bounds):
        pad = x[rank, b.count:]
        nonzero = (pad != 0).any(dim=1)
        if bool(nonzero.any()):
            row = b.count + int(nonzero.nonzero()[0, 0])
            raise ContractInputError("x", (rank, row), "0 (a padding row of the slab)", "non-zero", "§7.1")
        rows.append(x[rank, :b.count])
    return torch.cat(rows)


def _scalar(inputs: Tensors, name: str, where: str) -> int:
    value = _get(inputs, name, where)
    return int(value) if isinstance(value, torch.Tensor) else value


def query_projection(x: torch.Tensor, wq_a: torch.Tensor, q_norm: torch.Tensor, wq_b: torch.Tensor, *, eps: float,
                     rule: str = "fp32-norm") -> tuple[torch.Tensor, torch.Tensor]:
    """(q [T, H*D] BF16 before RoPE, qr [T, q_lora] BF16 query latent). ``fp32-norm``: the FP32 projection is
    normalized in FP32 and multiplied into ``wq_b`` unrounded; ``bf16-proj``: the projection is rounded to BF16
    first and the BF16 latent feeds ``wq_b``."""
    if rule not in Q_LATENT_RULES:
        raise ContractInputError("q_latent", None, f"one of {Q_LATENT_RULES}", repr(rule), SPEC)
    if rule == "fp32-norm":
        qr_full = rms_norm(project(x, wq_a), q_norm, eps)
    else:
        qr_full = rms_norm(project(x, wq_a).to(x.dtype), q_norm, eps)
    q = project(qr_full, wq_b).to(torch.bfloat16)
    return q, qr_full.to(torch.bfloat16)


@operator(returns='{output, window_payload, window_scale, [compressed_/index_ payload+scale], '
                   '[topk_indices], [state_cache], [candidate_mask]}: one attention half-layer of '
                   "any mode, composed from this backend's operators unless the backend gives its "
                   'own',
          spec='§2.3/§7.1')
def attention_half_layer(inputs: Tensors, *, kind: LayerKind | str, phase: str, wiring: str, tp: int,
                         config: V41Config = FLASH_TINY, ops: Mapping[str, Callable] | None = None,
                         q_latent: str = "fp32-norm") -> dict[str, torch.Tensor]:
    """Run one attention half-layer; returns the output and every cache the layer owns (see module doc).

    Outputs: ``output`` ([TP, T, hidden] replicas, or [TP, ceil(T/TP), hidden] slabs; the sharded wiring adds
    ``gathered`` [T, hidden], the all-gathered input, rows past the active ones left at 13.0), ``window_payload``,
    ``window_scale``; compressed modes add ``compressed_payload``/``compressed_scale``/``index_payload``/
    ``index_scale`` (REUSE: only the compressed pair; a mode that must not write them returns the input bytes)
    and ``topk_indices``; C2A FULL adds ``state_cache``; C1A FULL adds ``candidate_mask``. Spec: §2.3, §7.1.
    """
    o = {**_reference_ops(), **(ops or {})}
    if wiring not in WIRINGS:
        raise ContractInputError("wiring", None, f"one of {WIRINGS}", repr(wiring), "§7.2")
    tokens = int(_get(inputs, "position_ids", str(kind)).shape[0])
    active = _scalar(inputs, "num_tokens", str(kind))
    requests = int(_get(inputs, "query_start_loc", str(kind)).shape[0]) - 1
    o["half_layer_call"](kind, phase=phase, tokens=tokens, active=active, requests=requests, tp=tp, config=config)
    kind = LayerKind(kind)
    where = f"{kind.value} {phase} {wiring} TP{tp}"
    for name in required_inputs(kind):
        _get(inputs, name, where)
    heads, dim, rope = config.num_attention_heads, config.head_dim, config.qk_rope_head_dim
    groups, eps = config.o_groups, config.rms_norm_eps
    if heads % tp or groups % tp:
        raise ContractInputError("tp", None, f"a divisor of {heads} heads and {groups} output groups", tp, "§1")
    x = inputs["x"]
    if wiring == "sharded":
        x = _gather_slabs(x, tp, tokens, active, where)
        gathered = torch.full((tokens, x.shape[1]), SENTINEL, dtype=x.dtype)  # the harness's initial bytes
        gathered[:active] = x
    else:
        x = x[:active]
    if x.ndim != 2 or x.shape != (active, config.hidden_size) or x.dtype != torch.bfloat16:
        raise ContractInputError("x", None, f"BF16 [{active}, {config.hidden_size}] active rows ({where})",
                                 f"{x.dtype}{list(x.shape)}", SPEC)
    cos, sin = inputs["rope_cos"][:active], inputs["rope_sin"][:active]
    if cos.ndim != 2 or cos.shape[0] != active or cos.shape[1] * 2 != rope:
        raise ContractInputError("rope_cos", None, f"[{tokens}, {rope}/2] token-profile rows", list(cos.shape), "§4.2")
    q_all, qr = query_projection(x, inputs["wq_a"], inputs["q_norm"], inputs["wq_b"], eps=eps, rule=q_latent)
    kv = rms_norm(project(x, inputs["wkv"]), inputs["kv_norm"], eps).to(torch.bfloat16)
    kv = rope_interleave(kv, cos, sin)
    window = o["cache_publish"](_cache(config, "window", inputs, "window", where), kv,
                                inputs["window_slots"][:active])
    out: dict[str, torch.Tensor] = {"window_payload": window.payload, "window_scale": window.scale}
    window_rows = _rows(o["cache_read"], window)
    window_indices = inputs["window_indices"][:active]
    topk = torch.full((active, 1), -1, dtype=torch.int32)
    compressed_rows = torch.zeros((1, dim), dtype=torch.bfloat16)
    if kind is not LayerKind.SWA:
        compressed_rows, topk = _compressed_part(o, kind, inputs, x, qr, cos, sin, config, where, out)
    q_heads = rope_interleave(q_all.reshape(active, heads, dim), cos.unsqueeze(1), sin.unsqueeze(1))
    partials = _rank_partials(o, inputs, q_heads, window_rows, window_indices, compressed_rows, topk, cos, sin,
                              tp=tp, config=config)
    if wiring == "replicated":
        reduced = o["tp_all_reduce"](partials)
        replica = torch.full((tokens, reduced.shape[1]), SENTINEL, dtype=torch.bfloat16)
        replica[:active] = reduced
        out["output"] = torch.stack([replica] * tp)  # every rank holds the same bytes
    else:
        out["output"] = torch.stack(o["tp_reduce_scatter"](partials, active_tokens=active, capacity=tokens))
        out["gathered"] = gathered
    return out


def _compressed_part(o, kind: LayerKind, inputs: Tensors, x, qr, cos, sin, config: V41Config, where: str,
                     out: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """A compressed mode's caches (compressed by the mode's compressor and published where it owns them, else
    passed through), its Top-K (scored by the indexer, or the source layer's as given), written into ``out`` ->
    (the compressed cache's rows, the selection)."""
    active, eps = x.shape[0], config.rms_norm_eps
    ratio = ratio_of(kind, config)
    ckind = "compressed_r2" if ratio == 2 else "compressed_r1"
    compressed = _cache(config, ckind, inputs, "compressed", where)
    index = _cache(config, "index", inputs, "index", where) if "index_payload" in inputs else None
    table = inputs["compressed_block_table"]
    request_ids = inputs["token_to_req_indices"][:active]
    lens = inputs["compressed_lens"][:active]
    if kind in FULL:
        if ratio == 2:
            latent, publish, state = o["compressor_ratio2"](
                x, inputs["query_start_loc"], inputs["position_ids"][:active], request_ids,
                inputs["state_block_table"], inputs["state_cache"],
                CompressorWeights(inputs["cmp_wkv"], inputs["cmp_wgate"], inputs["cmp_norm"]), eps=eps,
                num_tokens=active)
            out["state_cache"] = state
        else:
            latent = compressor_ratio1(x, CompressorWeights(inputs["cmp_wkv"], None, inputs["cmp_norm"]), eps=eps)
            publish = torch.ones(active, dtype=torch.bool)
        slots = inputs["compressed_slots"][:active].masked_fill(~publish, -1)
        compressed, index = publish_compressed(latent, inputs["compressed_rope_cos"][:active],
                                               inputs["compressed_rope_sin"][:active], slots, compressed, index,
                                               inputs["index_wk"], inputs["index_norm"], eps=eps)
    out["compressed_payload"], out["compressed_scale"] = compressed.payload, compressed.scale
    if index is not None:
        out["index_payload"], out["index_scale"] = index.payload, index.scale
    compressed_rows = _rows(o["cache_read"], compressed)
    if kind in INDEXING:
        ih, idim = config.index_n_heads, config.index_head_dim
        qi = project(qr, inputs["index_wq_b"]).to(torch.bfloat16).reshape(active, ih, idim)
        qi = rope_interleave(qi, cos.unsqueeze(1), sin.unsqueeze(1))
        weights = index_head_weights(x, inputs["index_weights_proj"], heads=ih, dim=idim)
        candidates = inputs["candidate_mask"][:active] if kind is LayerKind.C1A_REINDEX else None
        width = candidates.shape[1] if candidates is not None else max(int(lens.max()), 1)
        scores = o["index_scores"](qi, weights, _rows(o["cache_read"], index), table, request_ids, lens,
                                   block_size=config.block_size, width=width, candidates=candidates)
        topk = o["select_topk"](scores, table, request_ids, topk=config.index_topk, block_size=config.block_size)
        if kind is LayerKind.C1A_FULL:
            out["candidate_mask"] = o["candidate_blocks"](scores, lens, block=config.candidate_block_size,
                                                          topk_blocks=config.candidate_topk_blocks, width=width)
    else:
        topk = inputs["topk_indices"][:active]  # the source layer's physical rows, as given
    out["topk_indices"] = topk
    return compressed_rows, topk


def _rank_partials(o, inputs: Tensors, q_heads, window_rows, window_indices, compressed_rows, topk, cos, sin, *,
                   tp: int, config: V41Config) -> list[torch.Tensor]:
    """Each TP rank's heads attended and projected through its output groups: the partial sums to reduce."""
    heads, groups = config.num_attention_heads, config.o_groups
    partials = []
    per_head, per_group = heads // tp, groups // tp
    for rank in range(tp):
        h = slice(rank * per_head, (rank + 1) * per_head)
        g = slice(rank * per_group, (rank + 1) * per_group)
        lora = inputs["wo_a"].shape[1]
        attended = o["sparse_attention"](q_heads[:, h], window_rows, window_indices, compressed_rows, topk,
                                         inputs["sink"][h])
        partials.append(o["o_proj"](attended, cos, sin, inputs["wo_a"][g],
                                    inputs["wo_b"][g.start * lora:g.stop * lora]))
    return partials


def with_reference_scores(inputs: Tensors, **call) -> tuple[dict[str, torch.Tensor], torch.Tensor | None]:
    """The reference outputs and the index scores its Top-K was taken from (None for a mode without an
    indexer): what an alternative selection is judged with (§5.3)."""
    from kernels.reference.indexer import select_topk

    seen = []

    def capture(scores, *args, **kw):
        seen.append(scores)
        return select_topk(scores, *args, **kw)

    out = attention_half_layer(inputs, ops={"select_topk": capture}, **call)
    return out, (seen[0] if seen else None)


def for_selection(inputs: Tensors, selection: torch.Tensor, **call) -> dict[str, torch.Tensor]:
    """The reference outputs recomputed for a given Top-K selection, from the reference caches and the
    original weights (§5.3 accepted alternative selection)."""
    return attention_half_layer(inputs, ops={"select_topk": lambda *a, **k: selection.clone()}, **call)


attention_half_layer.composes_operators = True  # a backend binds ``ops`` to its own operators (contracts.operators.Backend.get)
