"""One adapter per operator that upstream has a golden function for: it maps this project's call (argument
layout, dtypes, padding conventions, geometry) onto the golden's tensors dict and its outputs back. Upstream's
goldens do not validate their inputs, so each adapter first applies this project's input checks (the caller's
side of the ABI): the bad-call contracts judge those checks, not upstream.

``ADAPTERS``: operator -> Adapter; ``PENDING``: upstream goldens not adapted yet; ``FUSED``: operators upstream
computes only inside another's golden; ``VARIANTS`` / ``DEVIATIONS``: the named rules and deviations upstream's
goldens follow. Read by ``backends.upstream.backend`` (and the device binding, ``backends.pypto``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial

import torch

from kernels.record import FOLDERS  # upstream main's DeepSeek-V4 model folders (--model)

PRO, FLASH_MTP, FLASH_DSPARK = FOLDERS


@dataclass(frozen=True)
class Adapter:
    operator: str
    folder: str
    module: str
    function: str
    build: Callable  # (run, *args, **kwargs) -> outputs, where run(tensors, fields, constants) calls the golden
    also: tuple[str, ...] = ()  # other modules of the folder the adapter may call (run(..., module=...))
    renames: tuple[tuple[str, str], ...] = ()  # (V4-Pro's module name, this folder's) where the folder renamed one
    forms: tuple[tuple[str, str], ...] = ()  # (module, golden) the adapter calls itself for another path or form

    def module_of(self, module: str | None = None) -> str:
        """This folder's name for one of the adapter's modules (V4-Pro's name given; its own by default)."""
        name = module or self.module
        return dict(self.renames).get(name, name)

    @property
    def upstream(self) -> str:
        return f"models/{self.folder}/{self.module_of()}.py::{self.function}"


def _variant_fields(config) -> dict:
    """Upstream config fields for one of this project's V4 presets (its tiny twins included)."""
    name = "flash" if config.name.startswith("v4-flash") else "pro"
    keys = ("hidden_size", "num_attention_heads", "head_dim", "qk_rope_head_dim", "q_lora_rank", "o_lora_rank",
            "o_groups", "sliding_window", "rms_norm_eps", "vocab_size", "moe_intermediate_size", "n_routed_experts",
            "n_shared_experts", "num_experts_per_tok", "routed_scaling_factor", "swiglu_limit", "num_hidden_layers",
            "num_hash_layers", "index_n_heads", "index_head_dim", "index_topk", "hc_mult", "hc_sinkhorn_iters",
            "hc_eps", "max_position_embeddings", "rope_theta", "compress_rope_theta", "rope_factor", "beta_fast",
            "beta_slow", "original_max_position_embeddings", "compress_ratios")
    return {"name": name, **{k: getattr(config, k) for k in keys}}


def _gate(run, x_mixed, norm_w, gate_w, gate_bias, layer_id, num_tokens, tid2eid, input_ids, *, config,
          padding_codes="quantized", dequant_factor="reciprocal", golden_rule="reciprocal"):
    """v4_gate -> gate.py::golden_gate_core at T = x_mixed rows (MOE_TOKENS), the call's experts and vocabulary.
    Upstream has one padding rule (every row coded): the 'zero' variant is this project's only."""
    from contracts.operators import Unsupported
    from kernels.v4.gate import _check

    _check(x_mixed, norm_w, gate_w, gate_bias, layer_id, num_tokens, tid2eid, input_ids, config)  # the caller's side
    if padding_codes != "quantized":
        raise Unsupported(f"upstream's gate golden codes every row; padding_codes={padding_codes!r} is this "
                          "project's named variant only")
    if dequant_factor != golden_rule:
        raise Unsupported(f"this folder's gate golden follows dequant_factor={golden_rule!r}; "
                          f"dequant_factor={dequant_factor!r} is another named rule (kernels.v4.gate.DEQUANT_FACTOR)")
    tokens, d = x_mixed.shape
    k = config.num_experts_per_tok
    fields = dict(_variant_fields(config), vocab_size=int(tid2eid.shape[0]))
    tensors = {"x_mixed": x_mixed.to(torch.bfloat16).clone(), "norm_w": norm_w.to(torch.bfloat16).clone(),
               "gate_w": gate_w.float().clone(), "gate_bias": gate_bias.float().clone(), "layer_id": int(layer_id),
               "num_tokens": int(num_tokens), "tid2eid": tid2eid.to(torch.int32).clone(),
               "input_ids": input_ids.to(torch.int64).clone(),
               "x_norm_i8": torch.zeros(tokens, d, dtype=torch.int8),
               "x_norm_scale": torch.zeros(tokens, 1, dtype=torch.float32),
               "indices": torch.zeros(tokens, k, dtype=torch.int32),
               "weights": torch.zeros(tokens, k, dtype=torch.float32)}
    out = run(tensors, fields, {"MOE_TOKENS": tokens})
    return {name: out[name] for name in ("x_norm_i8", "x_norm_scale", "indices", "weights")}


def _mtp_projection(run, hidden, prev, enorm, hnorm, e_proj, e_scale, e_smooth, h_proj, h_scale, h_smooth, *,
                    config):
    """mtp_projection -> mtp_projection.py::golden_mtp_projection (T from the tensors, D and hc from the preset)."""
    from kernels.v4.mtp import check_mtp_projection

    check_mtp_projection(hidden, prev, e_proj, h_proj, config=config)
    t, hc, d = prev.shape
    tensors = {"hidden_states": hidden.to(torch.bfloat16).clone(), "prev_hidden_states": prev.float().clone(),
               "enorm_w": enorm.float().clone(), "hnorm_w": hnorm.float().clone(),
               "e_proj_w": e_proj.clone(), "e_proj_w_scale": e_scale.float().reshape(d).clone(),
               "e_proj_smooth": e_smooth.float().reshape(d).clone(), "h_proj_w": h_proj.clone(),
               "h_proj_w_scale": h_scale.float().reshape(d).clone(), "h_proj_smooth": h_smooth.float().reshape(d).clone(),
               "hidden_states_out": torch.zeros(t, hc, d, dtype=torch.float32)}
    return run(tensors, _variant_fields(config), {})["hidden_states_out"]


def _valid_prefix(window: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A window's valid slots first, in order, then -1, and their count: the layout the entries and goldens that read
    a valid prefix of ``swa_lens`` columns take (``swa_indices``, ``swa_lens``)."""
    order = torch.argsort((window < 0).to(torch.int8), dim=1, stable=True)
    return torch.gather(window, 1, order), (window >= 0).sum(1).to(torch.int32)


def _calls_goldens(run) -> bool:
    """Whether ``run`` calls the folder's goldens (the upstream backend), not a device's kernel entries
    (``backends.pypto`` marks its run ``calls_goldens = False``): a golden-only form or check -- another golden of
    the module, judged against this one -- runs only then."""
    return getattr(run, "calls_goldens", True)


def _hc_post(run, sublayer, x_hc, post_mix, residual_mix, *, rule="fp32"):
    """hc_post -> hc_post.py::golden_hc_post: x = the sublayer's output, residual = the streams, post, comb.
    Upstream's V4 streams are FP32 end to end, which is this project's ``rule="fp32"``. A call of two rows or more
    also judges the prefill form ``golden_hc_post_prefill`` against it (``_hc_post_prefill_judged``)."""
    from contracts.operators import Unsupported
    from kernels.reference.mhc import check_hc_post

    check_hc_post(sublayer, x_hc, post_mix, residual_mix, rule=rule)  # the caller's side
    if rule != "fp32":
        raise Unsupported(f"upstream's hc_post golden keeps the FP32 sum; rule={rule!r} is the older golden's")
    tokens, hc, d = x_hc.shape
    tensors = {"x": sublayer.clone(), "residual": x_hc.clone(), "post": post_mix.float().clone(),
               "comb": residual_mix.float().reshape(tokens, hc * hc).clone(),
               "y": torch.zeros(tokens, hc, d, dtype=torch.float32)}
    y = run(tensors, {"hidden_size": d, "hc_mult": hc}, {})["y"]
    if tokens > 1 and _calls_goldens(run):
        _hc_post_prefill_judged(run, tensors, y, hc=hc, d=d)
    return y


def _hc_post_prefill_judged(run, tensors, y, *, hc, d):
    """hc_post.py::golden_hc_post_prefill (the prefill stages' hc_post) on the same call with its last row padding
    (num_tokens T - 1): its real rows must be golden_hc_post's, byte for byte, and its padding row exactly 0, or the
    call fails naming both goldens."""
    from contracts.operators import BackendError

    tokens = y.shape[0]
    out = run({**tensors, "y": torch.zeros(tokens, hc, d, dtype=torch.float32), "num_tokens": tokens - 1},
              {"hidden_size": d, "hc_mult": hc}, {}, function="golden_hc_post_prefill")["y"]
    if not torch.equal(out[:-1], y[:-1]) or bool(out[-1].any()):
        raise BackendError("upstream hc_post.py: golden_hc_post_prefill with the last row padding is not "
                           "golden_hc_post on the real rows and 0 on the padding row")


def _hc_pre_fused(run, x_hc, function, scale, base, *, config, ops=None):
    """hc_pre_fused -> hc_pre.py::golden_hc_pre (x, hc_fn, hc_scale, hc_base -> x_mixed, post, comb): the call's
    streams as FP32 x, the folder's model object re-targeted at the call's width, stream count, Sinkhorn
    iterations and epsilons."""
    from kernels.reference.mhc import hc_mixes

    hc_mixes(x_hc, function, scale, base, config=config)  # the caller's side (raises on a bad call)
    tokens, hc, d = x_hc.shape
    tensors = {"x": x_hc.float().clone(), "hc_fn": function.float().clone(), "hc_scale": scale.float().clone(),
               "hc_base": base.float().clone(), "x_mixed": torch.zeros(tokens, d, dtype=torch.bfloat16),
               "post": torch.zeros(tokens, hc), "comb": torch.zeros(tokens, hc * hc)}
    fields = {"hidden_size": d, "hc_mult": hc, "hc_sinkhorn_iters": config.hc_sinkhorn_iters, "hc_eps": config.hc_eps,
              "rms_norm_eps": config.rms_norm_eps}
    out = run(tensors, fields, {})
    return {"x_mixed": out["x_mixed"], "post": out["post"], "comb": out["comb"]}


def _hc_head_fused(run, x_hc, fn, scale, base, *, config, ops=None, split_chunks=True, rows_port=False):
    """hc_head_fused -> hc_head.py::golden_hc_head (x_hc, hc_head_fn, hc_head_scale, hc_head_base -> y): the
    folder's model object at the call's width and streams, the module's rows (T) the call's; ``split_chunks``: V4-Pro's
    golden sums the head logits over 8 K splits in LINEAR_K_CHUNK chunks, one chunk per split at a tiny width (the
    Flash goldens slice their tiles, any width). ``rows_port`` (V4-Pro): its row-count-agnostic port
    ``golden_hc_head_rows`` (the prefill forward's, which reads the rows from x_hc) runs on the same call too and
    must give the same bytes, or the call fails naming both."""
    from kernels.v4.mtp_layer import v4_head_mix

    v4_head_mix(x_hc, fn, scale, base, config=config)  # the caller's side (raises on a bad call)
    tokens, hc, d = x_hc.shape
    tensors = {"x_hc": x_hc.float().clone(), "hc_head_fn": fn.float().clone(), "hc_head_scale": scale.float().clone(),
               "hc_head_base": base.float().clone(), "y": torch.zeros(tokens, d, dtype=torch.bfloat16)}
    fields = {"hidden_size": d, "hc_mult": hc, "hc_eps": config.hc_eps, "rms_norm_eps": config.rms_norm_eps}
    tiles = {"LINEAR_K_CHUNK": min(256, hc * d // 8)} if split_chunks else {}
    out = run(tensors, fields, {}, module_globals={"T": tokens, **tiles})
    if rows_port and _calls_goldens(run):
        from contracts.operators import BackendError

        port = run({**tensors, "y": torch.zeros(tokens, d, dtype=torch.bfloat16)}, fields, {},
                   function="golden_hc_head_rows", module_globals=tiles)
        if not torch.equal(port["y"], out["y"]):
            raise BackendError("upstream hc_head.py: golden_hc_head_rows differs from golden_hc_head on the same "
                               f"call ({int((port['y'] != out['y']).sum())} elements of y)")
    return {"y": out["y"]}


def _v4_embed_pack(run, input_ids, embed_weight, *, config):
    """v4_embed_pack -> input_pack.py::golden_pack_x_hc: ids clamped into the vocabulary, each row widened to FP32
    in every stream, at the call's width, streams and vocabulary."""
    from kernels.v4.input_pack import check_embed_pack_inputs

    check_embed_pack_inputs(input_ids, embed_weight, config=config)  # the caller's side
    tensors = {"input_ids": input_ids.to(torch.int64).clone(), "embed_weight": embed_weight.clone(),
               "x_hc": torch.zeros(input_ids.shape[0], config.hc_mult, config.hidden_size, dtype=torch.float32)}
    return run(tensors, _variant_fields(config), {})["x_hc"]


def _lookup_embedding(run, input_ids, embed_weight, *, config, streams: int = 0):
    """lookup_embedding -> lookup_embedding.py::golden_lookup_embedding_test: each id's BF16 row, at the call's width
    and vocabulary (ids as the entry's INT64). ``streams``: the dspark folder's golden also fills ``x_hc`` [T, hc, D]
    FP32 (the rows in every stream, V4-Pro's input pack without its clamp), which this operator does not return."""
    from kernels.v4.lookup_embedding import check_lookup_inputs

    check_lookup_inputs(input_ids, embed_weight, config=config)  # the caller's side
    t, d = input_ids.shape[0], embed_weight.shape[1]
    tensors = {"input_ids": input_ids.to(torch.int64).clone(), "embed_weight": embed_weight.clone(),
               "hidden_states": torch.zeros(t, d, dtype=torch.bfloat16)}
    fields = {"hidden_size": d}
    if streams:
        tensors["x_hc"] = torch.zeros(t, streams, d, dtype=torch.float32)
        fields["hc_mult"] = streams
    return run(tensors, fields, {})["hidden_states"]


def _dspark_lookup_embedding(run, input_ids, embed_weight, *, config):
    return _lookup_embedding(run, input_ids, embed_weight, config=config, streams=config.hc_mult)


def _final_norm(run, hidden, weight, *, config=None):
    """final_norm -> rmsnorm.py::golden_rms_norm_test (V4-Pro's RMSNorm: the FP32 sum of squares in 128-wide
    tiles, times 1/D, rsqrt, x · inv · w, one BF16 rounding) at the call's width and ``config``'s epsilon."""
    from kernels.reference.lm_head import FLASH

    if hidden.ndim != 2 or weight.shape != hidden.shape[1:]:
        from kernels.reference.lm_head import final_norm

        return final_norm(hidden, weight, config=config or FLASH)  # raises the caller-side error
    eps = (config or FLASH).rms_norm_eps
    tensors = {"x": hidden.clone(), "norm_w": weight.clone(),
               "x_normed": torch.zeros(hidden.shape, dtype=torch.bfloat16)}
    return run(tensors, {"hidden_size": hidden.shape[1], "rms_norm_eps": eps}, {})["x_normed"]


def _lm_head(run, hidden, weight, *, tp=1, card_owners=False, all_ranks=False):
    """lm_head -> lm_head.py::golden_lm_head with one DP owner holding every row (DP_SIZE 1, TP_SIZE tp,
    MAX_LOGIT_ROWS T, row indices 0..T-1); its [1, T, vocab] logits are cut back into tp shards.
    ``card_owners``: the Flash folders' golden takes every card as an owner (``WORLD_SIZE`` = TP x DP owners, not
    DP_SIZE), set to the one owner here. ``all_ranks`` (V4-Pro): a call at tp > 1 goes to
    ``golden_lm_head_all_ranks`` instead (``_lm_head_all_ranks``), the golden's only (a kernel entry keeps this
    layout)."""
    from kernels.reference.lm_head import lm_head_layout

    if hidden.ndim != 2 or weight.ndim != 2 or weight.shape[1] != hidden.shape[1]:
        from kernels.reference.lm_head import lm_head

        return lm_head(hidden, weight, tp=tp)  # raises the caller-side error
    rows = lm_head_layout(vocab=weight.shape[0], tp=tp, dp=tp)
    tokens, d = hidden.shape
    vocab = weight.shape[0]
    if all_ranks and tp > 1 and _calls_goldens(run):  # a kernel entry takes the one-owner layout
        return _lm_head_all_ranks(run, hidden, weight, tp=tp, rows=rows)
    tensors = {"hidden_states": hidden.reshape(1, tokens, d).clone(),
               "lm_head_weight": weight.reshape(tp, rows, d).clone(),
               "logit_row_indices": torch.arange(tokens, dtype=torch.int32).reshape(1, tokens),
               "logits": torch.zeros(1, tokens, vocab, dtype=torch.float32),
               "sampled_ids": torch.zeros(1, tokens, 8, dtype=torch.int32)}  # the entry's greedy ids (not judged)
    out = run(tensors, {"hidden_size": d, "vocab_size": vocab}, {},
              module_globals={"TP_SIZE": tp, "DP_SIZE": 1, "MAX_LOGIT_ROWS": tokens, "D": d, "VOCAB": vocab,
                              "VOCAB_PER_TP": rows, **({"WORLD_SIZE": 1} if card_owners else {})})
    logits = out["logits"][0]
    return [logits[:, r * rows:(r + 1) * rows].clone() for r in range(tp)]


def _lm_head_all_ranks(run, hidden, weight, *, tp, rows):
    """lm_head at tp > 1 -> lm_head.py::golden_lm_head_all_ranks with tp owners (n_ranks tp, card r holding vocab
    shard r). Every owner holds all T rows in its own order (owner r's slab rotated by r rows) and lists them back
    in call order in its logit_row_indices, so each owner's logits rows are the call's rows and an owner reading
    another owner's slab or indices shows; shard r is cut from owner r's logits."""
    tokens, d = hidden.shape
    vocab = weight.shape[0]
    order = [torch.roll(torch.arange(tokens), r) for r in range(tp)]  # slab row j of owner r holds call row order[r][j]
    slabs = torch.stack([hidden[o] for o in order])
    indices = torch.stack([torch.argsort(o) for o in order]).to(torch.int32)  # call row i sits at slab row indices[r, i]
    tensors = {"hidden_out": slabs.clone(), "lm_head_weight": weight.reshape(tp, rows, d).clone(),
               "logit_row_indices": indices, "logits": torch.zeros(tp, tokens, vocab, dtype=torch.float32),
               "sampled_ids": torch.zeros(tp, tokens, 8, dtype=torch.int32)}  # the greedy ids (not judged)
    out = run(tensors, {"hidden_size": d, "vocab_size": vocab}, {}, function="golden_lm_head_all_ranks",
              kwargs={"n_ranks": tp},
              module_globals={"TP_SIZE": tp, "D": d, "VOCAB": vocab, "VOCAB_PER_TP": rows})
    return [out["logits"][r][:, r * rows:(r + 1) * rows].clone() for r in range(tp)]


def _v4_expert(run, x_i8, x_scale, route_weight, weights, *, config):
    """v4_expert -> expert_routed.py::golden_expert_routed (one local expert receiving the N rows, their routing
    weights) or, for the shared expert (``route_weight`` None), expert_shared.py::golden_expert_shared."""
    from kernels.v4.moe import check_v4_expert

    check_v4_expert(x_i8, x_scale, weights)
    n, d = x_i8.shape
    inter = weights.w1.shape[0]
    fields = dict(_variant_fields(config), hidden_size=d, moe_intermediate_size=inter)
    w = {"w1": weights.w1.clone(), "w1_scale": weights.w1_scale.float().reshape(inter).clone(),
         "w3": weights.w3.clone(), "w3_scale": weights.w3_scale.float().reshape(inter).clone(),
         "w2": weights.w2.clone(), "w2_scale": weights.w2_scale.float().reshape(d).clone()}
    if route_weight is None:
        tensors = {"x_local_i8": x_i8.clone(), "x_local_scale_dq": x_scale.float().clone(),
                   **{f"shared_{k}": v for k, v in w.items()}, "sh": torch.zeros(n, d, dtype=torch.bfloat16)}
        return run(tensors, fields, {"MOE_TOKENS": n}, module="expert_shared", function="golden_expert_shared")["sh"]
    tensors = {"recv_x": x_i8.reshape(1, n, d).clone(), "recv_scale_dq": x_scale.float().reshape(1, n).clone(),
               "recv_weights": route_weight.float().reshape(1, n).clone(),
               "recv_expert_count": torch.tensor([[n]], dtype=torch.int32),
               **{f"routed_{k}": v.unsqueeze(0) for k, v in w.items()},
               "recv_y": torch.zeros(1, n, d, dtype=torch.bfloat16)}
    out = run(tensors, fields, {"RECV_MAX": n}, module_globals={"N_LOCAL_EXPERTS": 1, "RECV_MAX": n})
    return out["recv_y"][0]


def check_v4_moe_stage(x_hc, hc_fn, hc_scale, hc_base, norm_w, gate_w, gate_bias, layer_id, num_tokens, tid2eid,
                       input_ids, routed, shared, *, config) -> None:
    """The caller's side of ``v4_moe_stage``, as the reference's operators apply it (the stage's mixes, the
    router, the experts' count and shapes)."""
    from kernels.errors import ContractInputError
    from kernels.reference.mhc import hc_mixes
    from kernels.v4.gate import _check
    from kernels.v4.moe import SPEC, check_v4_expert

    hc, d = config.hc_mult, config.hidden_size
    if x_hc.ndim != 3 or tuple(x_hc.shape[1:]) != (hc, d):
        raise ContractInputError("x_hc", None, f"[T, {hc}, {d}]", list(x_hc.shape), SPEC)
    hc_mixes(x_hc[:0], hc_fn, hc_scale, hc_base, num_tokens=0, config=config)  # fn / scale / base shapes
    x_mixed = torch.zeros(x_hc.shape[0], d, dtype=torch.bfloat16)
    _check(x_mixed, norm_w, gate_w, gate_bias, layer_id, num_tokens, tid2eid, input_ids, config)
    if len(routed) != config.n_routed_experts:
        raise ContractInputError("routed", None, f"{config.n_routed_experts} experts", len(routed), SPEC)
    codes, scale = torch.zeros(1, d, dtype=torch.int8), torch.ones(1, 1)
    for w in (*routed, shared):
        check_v4_expert(codes, scale, w)


MOE_RANKS = 2  # moe.py's smallest EP world (its default)
MOE_UNWRITTEN = 13.0  # what a device's x_next holds before the MoE stage runs (no row of the stage is all 13.0)


def _both(t: torch.Tensor) -> torch.Tensor:
    """One tensor for each of the MOE_RANKS ranks, stacked (every rank gets the call's inputs)."""
    return torch.stack([t] * MOE_RANKS).clone()


def _rank1_reordered(tensors: dict, names, order: torch.Tensor) -> torch.Tensor:
    """Rank 1's rows of ``names`` (stacked per rank) put in ``order`` (the same rows, another order); returns the
    order that puts them back."""
    for name in names:
        tensors[name][1] = tensors[name][1][order]
    return torch.argsort(order)


def _ranks_agree(out: dict, names, back: torch.Tensor, where: str, *, unordered=()) -> None:
    """Rank 1 (its rows reordered, ``back`` restoring them) must give rank 0's rows of ``names`` (``unordered``:
    outputs not per row, equal as they are), or the call fails naming the output and row. Integer and BF16 outputs
    byte for byte; an FP32 output within UPSTREAM_RANK_ULPS (contracts.tolerances) ulps of its row's largest value: a
    golden's host matmul over the
    whole call rounds a row by where it sits in the batch (the named deviation batched-host-matmul, seen from 16
    rows on), while a rank reading another's rows is off by whole values."""
    from contracts.operators import BackendError
    from contracts.tolerances import UPSTREAM_RANK_ULPS as RANK_ULPS

    for name in (*names, *unordered):
        rank1, rank0 = (out[name][1] if name in unordered else out[name][1][back]), out[name][0]
        if rank1.dtype == torch.float32 and rank1.shape == rank0.shape and rank0.ndim >= 1:
            rows0 = rank0.reshape(rank0.shape[0], -1) if rank0.ndim > 1 else rank0.reshape(1, -1)
            rows1 = rank1.reshape(rows0.shape)
            top = rows0.abs().amax(1, keepdim=True)
            ulp = torch.nextafter(top, torch.tensor(float("inf"))) - top
            off = ~((rows1 - rows0).abs() <= RANK_ULPS * ulp) & ~((rows1 == rows0) | (rows1.isnan() & rows0.isnan()))
            if not bool(off.any()):
                continue
            row = int(off.any(1).nonzero()[0])
            raise BackendError(f"upstream {where}: rank 1 (the call's rows in another order) differs from rank 0 in "
                               f"{name} row {row} past {RANK_ULPS} FP32 ulps of the row: a rank's rows are not its own")
        if not torch.equal(rank1, rank0):
            raise BackendError(f"upstream {where}: rank 1 (the call's rows in another order) differs from rank 0 in "
                               f"{name}: a rank's rows are not its own")


def _moe_tensors(hc_fn, hc_scale, hc_base, norm_w, gate_w, gate_bias, tid2eid, input_ids, routed, shared, *,
                 config, preset_world=8) -> tuple[dict, dict]:
    """moe.py::golden_moe's weights (all but x_hc, x_next, layer_id, num_tokens) at EP MOE_RANKS, rank r holding
    experts r·E/R .. (r+1)·E/R - 1, and the config fields: moe.py re-derives the expert count from the EP8 preset
    at import (n_routed_experts // 8 · EP; dspark: // 16), so the preset given holds preset_world / R times this
    call's experts."""
    from contracts.operators import Unsupported

    experts, ranks = config.n_routed_experts, MOE_RANKS
    if experts % ranks:
        raise Unsupported(f"upstream's moe golden runs at EP >= 2: {experts} experts do not split over {ranks} ranks")
    local, d, inter = experts // ranks, config.hidden_size, shared.w1.shape[0]

    def shard(name):
        return torch.stack([torch.stack([getattr(w, name) for w in routed[r * local:(r + 1) * local]])
                            for r in range(ranks)]).clone()

    tensors = {"hc_ffn_fn": _both(hc_fn.float()), "hc_ffn_scale": _both(hc_scale.float()),
               "hc_ffn_base": _both(hc_base.float()), "norm_w": _both(norm_w.to(torch.bfloat16)),
               "gate_w": _both(gate_w.float()), "gate_bias": _both(gate_bias.float()),
               "tid2eid": _both(tid2eid.to(torch.int32)), "input_ids": _both(input_ids.to(torch.int64)),
               "routed_w1": shard("w1"), "routed_w3": shard("w3"), "routed_w2": shard("w2"),
               "routed_w1_scale": shard("w1_scale").float().reshape(ranks, local, inter),
               "routed_w3_scale": shard("w3_scale").float().reshape(ranks, local, inter),
               "routed_w2_scale": shard("w2_scale").float().reshape(ranks, local, d),
               "shared_w1": _both(shared.w1), "shared_w1_scale": _both(shared.w1_scale.float().reshape(inter)),
               "shared_w3": _both(shared.w3), "shared_w3_scale": _both(shared.w3_scale.float().reshape(inter)),
               "shared_w2": _both(shared.w2), "shared_w2_scale": _both(shared.w2_scale.float().reshape(d))}
    fields = dict(_variant_fields(config), vocab_size=int(tid2eid.shape[0]), n_routed_experts=experts * preset_world // ranks,
                  moe_intermediate_size=inter)
    return tensors, fields


def _v4_moe_stage(run, x_hc, hc_fn, hc_scale, hc_base, norm_w, gate_w, gate_bias, layer_id, num_tokens, tid2eid,
                  input_ids, routed, shared, *, config, padding_rows="residual", preset_world=8):
    """v4_moe_stage -> moe.py::golden_moe (hc_pre, gate, dispatch, routed and shared experts, combine, hc_post)
    at EP 2, its smallest world: rank 0 gets this call's inputs, rank 1 the same real rows reversed (the padding
    rows last) and must give rank 0's rows byte for byte; rank r holds experts r·E/2 .. (r+1)·E/2 - 1, and rank 0's x_next is
    x_out (the transport never changes a row, so rank 0 is this one-rank stage). The golden
    returns only x_next; ffn_out is what it hands to hc_post.py::golden_hc_post for rank 0 and indices / weights
    what gate.py::golden_gate_core returns for rank 0 (its own intermediates, observed, not recomputed).
    Upstream's decode stage mixes and post-mixes every row: padding rows carry hc_post(0, x_hc) (the
    ``padding_rows="residual"`` rule); ``"zero"`` is this project's older rule only. ``preset_world``: the EP world
    whose expert count the folder's moe.py divides by at import (8; dspark's 16)."""
    from contracts.operators import Unsupported

    check_v4_moe_stage(x_hc, hc_fn, hc_scale, hc_base, norm_w, gate_w, gate_bias, layer_id, num_tokens, tid2eid,
                       input_ids, routed, shared, config=config)
    if padding_rows != "residual":
        raise Unsupported(f"upstream's moe golden post-mixes every row; padding_rows={padding_rows!r} is this "
                          "project's older rule only")
    tokens = x_hc.shape[0]
    tensors, fields = _moe_tensors(hc_fn, hc_scale, hc_base, norm_w, gate_w, gate_bias, tid2eid, input_ids, routed,
                                   shared, config=config, preset_world=preset_world)
    tensors.update(x_hc=_both(x_hc.float()), x_next=torch.zeros(MOE_RANKS, *x_hc.shape), layer_id=int(layer_id),
                   num_tokens=int(num_tokens))
    # rank 1: the real rows reversed (the padding rows stay last), its x_next judged against rank 0's
    real = int(num_tokens)
    order = torch.cat((torch.arange(real).flip(0), torch.arange(real, tokens)))
    back = _rank1_reordered(tensors, ("x_hc", "input_ids"), order)
    if not _calls_goldens(run):  # the kernel entry (l3_moe, one rank a device) hands back x_next alone
        # x_next handed over full of MOE_UNWRITTEN, not upstream's zeros: MO-08 has the kernel zero-fill its output
        # first, so a padding row is its residual expansion whatever the buffer held; a skipped fill shows
        out = run(tensors, fields, {"MOE_TOKENS": tokens}, fill={"x_next": MOE_UNWRITTEN})
        _ranks_agree(out, ("x_next",), back, "moe.py")
        return {"x_out": out["x_next"][0]}
    out = run(tensors, fields, {"MOE_TOKENS": tokens}, taps={"hc_post.golden_hc_post": ["x"],
                                                             "gate.golden_gate_core": ["indices", "weights"]})
    _ranks_agree(out, ("x_next",), back, "moe.py")
    gate = out["gate.golden_gate_core"][0]
    return {"x_out": out["x_next"][0], "ffn_out": out["hc_post.golden_hc_post"][0]["x"],
            "indices": gate["indices"], "weights": gate["weights"]}


def _hc_head_tiling(config) -> dict:
    """hc_head.py's golden sums the head logits over LINEAR_OK = 8 disjoint K splits in chunks of LINEAR_K_CHUNK
    (256 at model geometry): at a tiny preset one chunk per split (hc·D / 8), so no chunk crosses a split."""
    per_split = config.hc_mult * config.hidden_size // 8
    return {"hc_head.LINEAR_K_CHUNK": min(256, per_split)}


def _mtp_common(hidden, prev, projection, moe, head, *, config) -> dict:
    """decode_mtp.py's and prefill_mtp.py's shared tensors (the projection, the MoE weights, the head) for
    MOE_RANKS replicated ranks, without the attention's."""
    from kernels.errors import ContractInputError
    from kernels.v4.mtp import check_mtp_projection
    from kernels.v4.mtp_layer import SPEC, _check_head

    _check_head(head)
    check_mtp_projection(hidden, prev, projection["e_proj"], projection["h_proj"], config=config)
    missing = {"hc_fn", "hc_scale", "hc_base", "norm_w", "gate_w", "gate_bias", "tid2eid", "input_ids", "routed",
               "shared"} - set(moe)
    if missing:
        raise ContractInputError("moe", None, "the MoE stage's arguments", sorted(missing), SPEC)
    p, d = projection, prev.shape[2]
    tensors, fields = _moe_tensors(moe["hc_fn"], moe["hc_scale"], moe["hc_base"], moe["norm_w"], moe["gate_w"],
                                   moe["gate_bias"], moe["tid2eid"], moe["input_ids"], moe["routed"], moe["shared"],
                                   config=config)
    tensors.update({
        "hidden_states": _both(hidden.to(torch.bfloat16)), "enorm_w": _both(p["enorm"].float()),
        "hnorm_w": _both(p["hnorm"].float()), "e_proj_w": _both(p["e_proj"]),
        "e_proj_w_scale": _both(p["e_scale"].float().reshape(d)), "e_proj_smooth": _both(p["e_smooth"].float().reshape(d)),
        "h_proj_w": _both(p["h_proj"]), "h_proj_w_scale": _both(p["h_scale"].float().reshape(d)),
        "h_proj_smooth": _both(p["h_smooth"].float().reshape(d)),
        "mtp_hc_head_fn": _both(head["fn"].float()), "mtp_hc_head_scale": _both(head["scale"].float().reshape(1)),
        "mtp_hc_head_base": _both(head["base"].float()), "mtp_norm_w": _both(head["norm_w"].to(torch.bfloat16)),
        "hidden_out": torch.zeros(MOE_RANKS, *hidden.shape, dtype=torch.bfloat16)})
    return tensors, fields


def _empty_lm_head(tensors: dict, tokens: int, d: int) -> dict:
    """The Flash-MTP layer goldens end in their LM head over hidden_out; the layer operators end at hidden_out, so
    the head gets a one-id vocabulary of zeros (its logits are not read: ``lm_head``'s own adapter judges that
    golden). Adds its tensors to ``tensors``; returns the lm_head module's globals at this call's size."""
    tensors.update(lm_head_weight=torch.zeros(MOE_RANKS, 1, d, dtype=torch.bfloat16),
                   logit_row_indices=_both(torch.arange(tokens, dtype=torch.int32)),
                   logits=torch.zeros(MOE_RANKS, tokens, 1),
                   sampled_ids=torch.zeros(MOE_RANKS, tokens, 8, dtype=torch.int32))
    return {"lm_head.TP_SIZE": 1, "lm_head.WORLD_SIZE": MOE_RANKS, "lm_head.MAX_LOGIT_ROWS": tokens, "lm_head.D": d}


def _v4_mtp_layer(run, hidden, prev, projection, attention, moe, head, *, config, fused_lm_head=False,
                  a5_tiling=True):
    """v4_mtp_layer -> decode_mtp.py::golden_mtp_decode_layer (mtp_projection, the SWA attention stage, the MoE
    stage at EP 2, hc_head, RMSNorm): rank 0 given this call's inputs, rank 1 the same requests in reverse order;
    rank 0's hidden_out and next_pre_hc_hidden, and its window cache (written in place by the stage golden), and
    rank 1's must be the same rows, byte for byte, or the call fails naming the output (a rank reading another's
    rows shows). ``fused_lm_head`` (Flash-MTP's ``golden_decode_mtp``): the same layer then its LM head over hidden_out; the
    operator ends at hidden_out, so the head gets a one-id vocabulary of zeros (its logits not read: ``lm_head``'s
    own adapter judges that golden). ``a5_tiling=False``: the Flash goldens' (no A5 split-K or lane tiling to size
    at a tiny preset: their qkv projection's one FP32 matmul, their hc_head's sliced tiles)."""
    from kernels.errors import ContractInputError
    from kernels.v4.mtp_layer import SPEC

    a = dict(attention)
    missing = {"hc_fn", "freqs_cos", "kv_cache", "swa_slot_mapping", "window_indices", "position_ids"} - set(a)
    if missing:
        raise ContractInputError("attention", None, "the SWA stage's arguments", sorted(missing), SPEC)
    tokens = hidden.shape[0]
    _check_swa_stage(a["position_ids"], a["freqs_cos"], a["kv_cache"], a["swa_slot_mapping"], tokens=tokens)
    check_v4_moe_stage(prev, **moe, layer_id=config.num_hidden_layers, config=config)
    tensors, fields = _mtp_common(hidden, prev, projection, moe, head, config=config)
    swa, constants, module_globals = _swa_stage_tensors(
        a["hc_fn"], a["hc_scale"], a["hc_base"], a["attn_norm_w"], a["wq_a"], a["wq_b"], a["wq_b_scale"], a["wkv"],
        a["gamma_cq"], a["gamma_ckv"], a["freqs_cos"], a["freqs_sin"], a["kv_cache"], a["swa_slot_mapping"],
        a["window_indices"], a["position_ids"], a["attn_sink"], a["wo_a"], a["wo_b"], a["wo_b_scale"], config=config)
    for name, value in swa.items():  # decode_mtp.py's tables carry a profile axis: [ranks, profiles, positions, rope]
        tensors[name] = _both(value).unsqueeze(1) if name in ("freqs_cos", "freqs_sin") else _both(value)
    tensors.update(prev_pre_hc_hidden=_both(prev.float()), num_tokens=int(moe["num_tokens"]),
                   next_pre_hc_hidden=torch.zeros(MOE_RANKS, *prev.shape))
    if not a5_tiling:
        module_globals = {k: v for k, v in module_globals.items() if not k.startswith("qkv_proj_rope.")}
    if fused_lm_head:
        module_globals = {**module_globals, **_empty_lm_head(tensors, tokens, hidden.shape[1])}
    seq = config.decode_seq
    order = torch.arange(tokens).reshape(-1, seq).flip(0).reshape(-1) if tokens % seq == 0 and \
        int(moe["num_tokens"]) == tokens else torch.arange(tokens)
    back = _rank1_reordered(tensors, ("hidden_states", "prev_pre_hc_hidden", "input_ids", "swa_slot_mapping",
                                      "swa_indices", "swa_lens", "position_ids"), order)  # the requests reversed
    out = run(tensors, fields, {**constants, "MOE_TOKENS": tokens}, module="decode_mtp",
              function="golden_decode_mtp" if fused_lm_head else "golden_mtp_decode_layer",
              module_globals={**module_globals, **(_hc_head_tiling(config) if a5_tiling else {})})
    _ranks_agree(out, ("hidden_out", "next_pre_hc_hidden"), back, "decode_mtp.py", unordered=("kv_cache",))
    return {"hidden_out": out["hidden_out"][0], "next_pre_hc_hidden": out["next_pre_hc_hidden"][0],
            "kv_cache": out["kv_cache"][0]}


def _v4_prefill_mtp_layer(run, hidden, prev, projection, attention, moe, head, num_tokens, *, config,
                          a5_tiling=True, fused_lm_head=False):
    """v4_prefill_mtp_layer -> prefill_mtp.py::golden_mtp_prefill_fwd (mtp_projection, the prefill SWA attention
    stage lowering its window from the chunk's positions and page table, the MoE stage at EP 2, hc_head, RMSNorm)
    on one request's chunk (PREFILL_BATCH 1, PREFILL_SEQ the chunk's rows): rank 0 given this call's inputs, rank 1
    the same real rows reversed (the padding rows last), whose outputs must be rank 0's rows byte for byte; rank 0's
    outputs and its window cache. ``a5_tiling=False``: the Flash goldens' (their qkv projection's one FP32
    matmul: no A5 lane tiling to size at a tiny preset); ``fused_lm_head``: Flash-MTP's, ending in its LM head
    (``_empty_lm_head``)."""
    from kernels.v4.mtp_layer import check_prefill_mtp_layer

    check_prefill_mtp_layer(hidden, attention, head, num_tokens)
    a = attention
    tokens = hidden.shape[0]
    _check_swa_stage(a["position_ids"], a["freqs_cos"][0], a["kv_cache"], a["swa_slot_mapping"], tokens=tokens,
                     num_tokens=num_tokens)
    check_v4_moe_stage(prev, **moe, layer_id=config.num_hidden_layers, num_tokens=num_tokens, config=config)
    tensors, fields = _mtp_common(hidden, prev, projection, moe, head, config=config)
    tensors.update({
        "prev_hidden_states": _both(prev.float()), "hc_attn_fn": _both(a["hc_fn"].float()),
        "hc_attn_scale": _both(a["hc_scale"].float()), "hc_attn_base": _both(a["hc_base"].float()),
        **{name: _both(a[name]) for name in ("attn_norm_w", "wq_a", "wq_b", "wkv", "gamma_cq", "gamma_ckv", "wo_a",
                                             "wo_b", "freqs_cos", "freqs_sin", "kv_cache")},
        "wq_b_scale": _both(a["wq_b_scale"].float()), "wo_b_scale": _both(a["wo_b_scale"].float()),
        "attn_sink": _both(a["attn_sink"].float()), "ori_block_table": _both(a["block_table"].to(torch.int32)),
        "ori_slot_mapping": _both(a["swa_slot_mapping"].reshape(-1).to(torch.int64)),
        "position_ids": _both(a["position_ids"].reshape(-1).to(torch.int32)), "num_tokens": int(num_tokens),
        "pre_hc_hidden_out": torch.zeros(MOE_RANKS, *prev.shape)})
    # PREFILL_TOKENS is derived in config.py at import; prefill_mtp.py sets MOE_TOKENS from it
    constants = {"PREFILL_BATCH": 1, "PREFILL_SEQ": tokens, "PREFILL_TOKENS": tokens,
                 "BLOCK_SIZE": int(a["kv_cache"].shape[1])}
    real = int(num_tokens)  # rank 1: the real rows reversed (each with its position and slot), the padding rows last
    order = torch.cat((torch.arange(real).flip(0), torch.arange(real, tokens)))
    back = _rank1_reordered(tensors, ("hidden_states", "prev_hidden_states", "input_ids", "ori_slot_mapping",
                                      "position_ids"), order)
    module_globals = _qkv_tiling(config, "qkv_proj_rope") if a5_tiling else {}
    if fused_lm_head:
        module_globals.update(_empty_lm_head(tensors, tokens, hidden.shape[1]))
    out = run(tensors, fields, constants, module="prefill_mtp", function="golden_mtp_prefill_fwd",
              module_globals=module_globals)
    _ranks_agree(out, ("hidden_out", "pre_hc_hidden_out"), back, "prefill_mtp.py", unordered=("kv_cache",))
    return {"hidden_out": out["hidden_out"][0], "next_pre_hc_hidden": out["pre_hc_hidden_out"][0],
            "kv_cache": out["kv_cache"][0]}


def _qkv_tiling(config, module: str = "") -> dict:
    """qkv_proj_rope.py's QR RMS chunk (256 at model geometry) and A5 TROWSUM lane count (64) must divide Q_LORA
    and head_dim: at a tiny preset, the largest divisor of each (the model geometry keeps upstream's values).
    ``module``: set them on that module of the folder (``"qkv_proj_rope"``) rather than the golden's own."""
    lora, dim = config.q_lora_rank, config.head_dim
    prefix = f"{module}." if module else ""
    return {f"{prefix}Q_LORA_TILE": math.gcd(256, lora), f"{prefix}_A5_FP32_VECTOR_LANES": math.gcd(64, lora, dim)}


def _v4_qkv_proj_rope(run, x, wq_a, wq_b, wq_b_scale, wkv, rope_cos, rope_sin, gamma_cq, gamma_ckv, *, config,
                      a5_tiling=True):
    """v4_qkv_proj_rope -> qkv_proj_rope.py::golden_qkv_proj_rope: the same layout (x [T, D], wq_a [D, Q_LORA],
    wq_b INT8 [Q_LORA, H*hd], wkv [D, hd], RoPE tables read up to rope/2 columns); no num_tokens (every row).
    ``a5_tiling=False``: the Flash folders' golden (one FP32 matmul of BF16 inputs, no A5 split-K or lane tiling
    to size at a tiny preset)."""
    from kernels.v4.qkv_proj import check_v4_qkv_proj_rope

    check_v4_qkv_proj_rope(x, wq_a, wq_b, wq_b_scale, wkv, rope_cos, rope_sin, gamma_cq, gamma_ckv, config=config)
    tokens = x.shape[0]
    heads, dim, lora = config.num_attention_heads, config.head_dim, config.q_lora_rank
    tensors = {"x": x.clone(), "wq_a": wq_a.clone(), "wq_b": wq_b.clone(), "wq_b_scale": wq_b_scale.float().clone(),
               "wkv": wkv.clone(), "rope_cos": rope_cos.clone(), "rope_sin": rope_sin.clone(),
               "gamma_cq": gamma_cq.clone(), "gamma_ckv": gamma_ckv.clone(),
               "q": torch.zeros(tokens, heads, dim, dtype=torch.bfloat16),
               "kv": torch.zeros(tokens, dim, dtype=torch.bfloat16),
               "qr": torch.zeros(tokens, lora, dtype=torch.int8),
               "qr_scale": torch.zeros(tokens, 1, dtype=torch.float32)}
    out = run(tensors, _variant_fields(config), {}, module_globals=_qkv_tiling(config) if a5_tiling else {})
    return {name: out[name] for name in ("q", "kv", "qr", "qr_scale")}


COMPRESSOR_MODULES = {(4, True): "decode_compressor_ratio4", (128, False): "decode_compressor_ratio128"}
ROPE_HEAD_DIM, CMP_PAGE, CMP_BLOCKS = 64, 128, 32  # V4's qk_rope_head_dim, compressed-cache page and pages (decode)
DSPARK_CMP_PAGE = 32  # dspark's compressed-cache page (its BLOCK_SIZE)


def _bf16_if_exact(t: torch.Tensor) -> torch.Tensor:
    """``t`` as BF16 when every value is one (the dtype the kernel entries declare for weights; the goldens read
    them with ``.float()``, so nothing moves), else a copy as is (a kernel then refuses the dtype, naming it)."""
    b = t.to(torch.bfloat16)
    return b.contiguous() if torch.equal(b.float(), t.float()) else t.clone().contiguous()


def _decode_step(position_ids: torch.Tensor, token_to_req: torch.Tensor) -> list[tuple[int, list[int]]] | None:
    """The call as [(request, [token index] * S)] * B when it is exactly one decode step of the model (V4's
    DECODE_BATCH requests, each DECODE_SEQ consecutive positions, in position order within the call), else None."""
    from kernels.config import V4_PRO

    b, s = V4_PRO.decode_batch, V4_PRO.decode_seq
    if position_ids.numel() != b * s:
        return None
    order: dict[int, list[int]] = {}
    for t in range(position_ids.numel()):
        order.setdefault(int(token_to_req[t]), []).append(t)
    if len(order) != b or any(len(r) != s for r in order.values()):
        return None
    for r in order.values():
        ps = [int(position_ids[t]) for t in r]
        if ps[0] < 0 or ps != list(range(ps[0], ps[0] + s)):
            return None
    return list(order.items())


def _v4_compressor_step(run, module, steps, x, position_ids, state_block_table, pool, weights, out, closes, *,
                        ratio, coff, eps, model_page=CMP_PAGE, flat_tokens=False, pages_per_ratio=False):
    """One decode step of B requests x S tokens through ``compressor_test`` / ``golden_compressor`` laid out as
    compiled (ratio 4's entry takes exactly DECODE_BATCH x DECODE_SEQ): every token's state row is written, and
    the closed row of a request whose window ends inside the step is kv[b, 0] (upstream writes the committed row
    there); the state pool is carried out."""
    from kernels.v4.compressor import _slot

    pages, page, _ = pool.shape
    d = weights.norm.shape[0]
    rd, cache_page = (ROPE_HEAD_DIM, model_page) if d >= ROPE_HEAD_DIM else (2, 1)
    b, s = len(steps), len(steps[0][1])
    flat = [t for _req, row in steps for t in row]
    table = torch.stack([state_block_table[req] for req, _row in steps]).to(torch.int32).contiguous()
    state_slots = torch.tensor([[_slot(state_block_table, req, int(position_ids[t]), page, pages) for t in row]
                                for req, row in steps], dtype=torch.int64)
    cache_blocks = CMP_BLOCKS if d >= ROPE_HEAD_DIM else b
    tensors = {
        "x": x[flat].reshape(b * s, -1).clone() if flat_tokens else x[flat].reshape(b, s, -1).clone(),
        "compress_state": pool, "compress_state_block_table": table,
        "wkv": _bf16_if_exact(weights.wkv.float().t()), "wgate": _bf16_if_exact(weights.wgate.float().t()),
        "ape": weights.ape.float().clone(), "norm_w": _bf16_if_exact(weights.norm),
        "cos": torch.ones(b, rd // 2), "sin": torch.zeros(b, rd // 2),
        "cmp_kv_cache": torch.zeros(cache_blocks, cache_page, 1, d, dtype=torch.bfloat16),
        "position_ids": position_ids[flat].reshape(b, s).to(torch.int32).contiguous(),
        # request i commits into cache slot i (block 0 row i at the model's page; block i at a page of 1)
        "cmp_slot_mapping": torch.arange(b, dtype=torch.int64)[:, None].expand(b, s).contiguous(),
        "state_slot_mapping": state_slots,
        "kv": torch.zeros(b * s, d, dtype=torch.float32) if flat_tokens else torch.zeros(b, s, d, dtype=torch.float32)}
    if flat_tokens:  # dspark's entries take positions and slot mappings token-major too ([T])
        for name in ("position_ids", "cmp_slot_mapping", "state_slot_mapping"):
            tensors[name] = tensors[name].reshape(-1).contiguous()
    module_globals = {"S": s, "B": b, "COMPRESS_STATE_BLOCK_SIZE": page, "HEAD_DIM": d, "OUT_DIM": coff * d,
                      "ROPE_HEAD_DIM": rd, "EPS": float(eps), "BLOCK_SIZE": cache_page, "D": int(x.shape[1])}
    if pages_per_ratio:  # Flash-MTP pages its compressed cache by its own global: the cache laid out here
        module_globals["CMP_STORAGE_BLOCK_SIZE"] = cache_page
    got = run(tensors, {}, {}, module=module, module_globals=module_globals)
    for i, (_req, row) in enumerate(steps):
        for t in row:
            if (int(position_ids[t]) + 1) % ratio == 0:  # the window this step closes
                out[t] = got["kv"][i * s] if flat_tokens else got["kv"][i, 0]
                closes[t] = True
    return out, closes, got["compress_state"]


def _compressor_module(state_pool, weights, *, ratio, overlap) -> tuple[str, int, int]:
    """(the decode compressor module upstream has for this ratio, 2 with overlap else 1, the row width), after the
    caller's side of the call is checked; another ratio / overlap is unsupported."""
    from contracts.operators import Unsupported
    from kernels.v4.compressor import check_v4_compressor

    module = COMPRESSOR_MODULES.get((int(ratio), bool(overlap)))
    if module is None:
        raise Unsupported(f"upstream has decode compressor goldens for ratio 4 with overlap and ratio 128 without; "
                          f"not ratio={ratio}, overlap={overlap}")
    check_v4_compressor(state_pool, weights, ratio=ratio, overlap=overlap)  # the caller's side
    return module, (2 if overlap else 1), weights.norm.shape[0]


def _v4_compressor(run, x, position_ids, token_to_req, state_block_table, state_pool, weights, *, ratio, overlap,
                   eps=1e-6, pages_per_ratio=False, flat_tokens=False):
    """v4_compressor -> decode_compressor_ratio4.py (ratio 4, overlap) / decode_compressor_ratio128.py (ratio 128)
    ::golden_compressor, one decode step per token in the call's order (B = S = 1), the state pool carried from
    step to step: upstream's decode golden handles one step of S tokens per request and at most one closing
    window, so a call of many tokens is that many steps. The golden rotates the closed row (RoPE) before writing
    it: it is called with the identity rotation (cos 1, sin 0, exact in FP32) to read the row before its RoPE,
    which is this operator's output (the rotation is ``v4_publish_compressed``'s). Tokens at a negative position
    are skipped (this project's padding convention; upstream's decode steps have none). ``pages_per_ratio``: the
    compressed cache's page holds 128 / ratio rows (Flash-MTP's CMP_STORAGE_BLOCK_SIZE) instead of 128;
    ``flat_tokens``: x and kv are token-major [B * S, ...] (dspark's goldens and entries), not [B, S, ...]."""
    from kernels.v4.compressor import _slot

    module, coff, d = _compressor_module(state_pool, weights, ratio=ratio, overlap=overlap)
    pages, page, _ = state_pool.shape
    pool = state_pool.clone()
    out = torch.zeros(x.shape[0], d, dtype=torch.float32)
    closes = torch.zeros(x.shape[0], dtype=torch.bool)
    # the folder's compressed-cache page at the model's geometry: V4-Pro's 128, Flash-MTP's 128 / ratio, dspark's 32
    model_page = CMP_PAGE // int(ratio) if pages_per_ratio else DSPARK_CMP_PAGE if flat_tokens else CMP_PAGE
    steps = _decode_step(position_ids, token_to_req)
    if steps is not None:  # the call is one decode step of the model's B requests x S tokens: one launch
        return _v4_compressor_step(run, module, steps, x, position_ids, state_block_table, pool, weights, out, closes,
                                   ratio=ratio, coff=coff, eps=eps, model_page=model_page, flat_tokens=flat_tokens,
                                   pages_per_ratio=pages_per_ratio)
    # the rotated width and the compressed-cache page: the model's (64, model_page) when the row is that wide, as a
    # kernel compiled at the model's geometry takes them; any even width is the identity rotation here
    rd, cache_page = (ROPE_HEAD_DIM, model_page) if d >= ROPE_HEAD_DIM else (2, 1)
    one = (lambda v, dtype: torch.tensor([v], dtype=dtype)) if flat_tokens else \
        (lambda v, dtype: torch.tensor([[v]], dtype=dtype))  # dspark's rows are token-major ([T])
    wkv_t, wgate_t = _bf16_if_exact(weights.wkv.float().t()), _bf16_if_exact(weights.wgate.float().t())
    module_globals = {"S": 1, "B": 1, "COMPRESS_STATE_BLOCK_SIZE": page, "HEAD_DIM": d, "OUT_DIM": coff * d,
                      "ROPE_HEAD_DIM": rd, "EPS": float(eps), "BLOCK_SIZE": cache_page, "D": int(x.shape[1])}
    for t in range(x.shape[0]):
        p, b = int(position_ids[t]), int(token_to_req[t])
        if p < 0:
            continue
        slot = _slot(state_block_table, b, p, page, pages)  # the caller's side: a page for this position
        tensors = {"x": x[t].reshape(1, -1).clone() if flat_tokens else x[t].reshape(1, 1, -1).clone(),
                   "compress_state": pool,
                   "compress_state_block_table": state_block_table[b:b + 1].to(torch.int32).clone(),
                   "wkv": wkv_t, "wgate": wgate_t, "ape": weights.ape.float().clone(),
                   "norm_w": _bf16_if_exact(weights.norm), "cos": torch.ones(1, rd // 2), "sin": torch.zeros(1, rd // 2),
                   "cmp_kv_cache": torch.zeros(1, cache_page, 1, d, dtype=torch.bfloat16),
                   "position_ids": one(p, torch.int32), "cmp_slot_mapping": one(0, torch.int64),
                   "state_slot_mapping": one(slot, torch.int64),
                   "kv": torch.zeros(1, d, dtype=torch.float32) if flat_tokens else
                   torch.zeros(1, 1, d, dtype=torch.float32)}
        got = run(tensors, {}, {}, module=module, module_globals=module_globals)
        pool = got["compress_state"]
        if (p + 1) % ratio == 0:  # upstream's boundary of a one-token step: the row it wrote to kv[:, 0]
            out[t] = got["kv"][0] if flat_tokens else got["kv"][0, 0]
            closes[t] = True
    return out, closes, pool


def _v4_compress_and_publish(run, x, position_ids, token_to_req, state_block_table, state_pool, weights,
                             cmp_slot_mapping, cmp_pool, rope_cos, rope_sin, *, ratio, overlap, eps=1e-6, ops=None,
                             pages_per_ratio=False, flat_tokens=False):
    """v4_compress_and_publish -> decode_compressor_ratio4.py (ratio 4, overlap) / decode_compressor_ratio128.py
    (ratio 128) ::golden_compressor with the call's RoPE rows: one decode step per token (B = S = 1), the state pool
    and the compressed cache carried from step to step. A closing token's step gets the rows of its window's first
    position (pos - ratio + 1), which the golden rotates the pooled row by before writing it at the token's
    compressed slot (its kv output, rotated too, is not this operator's); other steps get the identity rows. The
    module's rope width is the call's (2 x the rows' width), its compressed page the pool's. ``pages_per_ratio`` /
    ``flat_tokens``: Flash-MTP's page global / dspark's token-major rows (as ``_v4_compressor``)."""
    from kernels.v4.compressor import _slot, check_cmp_pool, cmp_slot

    module, coff, d = _compressor_module(state_pool, weights, ratio=ratio, overlap=overlap)
    check_cmp_pool(cmp_pool, d)
    pages, page, _ = state_pool.shape
    half = int(rope_cos.shape[1])
    pool, cmp = state_pool.clone(), cmp_pool.clone()
    closes = torch.zeros(x.shape[0], dtype=torch.bool)
    wkv_t, wgate_t = _bf16_if_exact(weights.wkv.float().t()), _bf16_if_exact(weights.wgate.float().t())
    module_globals = {"S": 1, "B": 1, "COMPRESS_STATE_BLOCK_SIZE": page, "HEAD_DIM": d, "OUT_DIM": coff * d,
                      "ROPE_HEAD_DIM": 2 * half, "EPS": float(eps), "BLOCK_SIZE": int(cmp.shape[1]),
                      "D": int(x.shape[1])}
    if pages_per_ratio:
        module_globals["CMP_STORAGE_BLOCK_SIZE"] = int(cmp.shape[1])
    for t in range(x.shape[0]):
        p, b = int(position_ids[t]), int(token_to_req[t])
        if p < 0:
            continue
        slot = _slot(state_block_table, b, p, page, pages)  # the caller's side: a page for this position
        closing = (p + 1) % ratio == 0
        row = cmp_slot(cmp_slot_mapping, t, cmp.shape[0] * cmp.shape[1]) if closing else -1
        start = p - ratio + 1
        cos = rope_cos[start:start + 1].float().clone() if closing else torch.ones(1, half)
        sin = rope_sin[start:start + 1].float().clone() if closing else torch.zeros(1, half)
        one = (lambda v: torch.tensor([v])) if flat_tokens else (lambda v: torch.tensor([[v]]))
        tensors = {"x": x[t].reshape(1, -1).clone() if flat_tokens else x[t].reshape(1, 1, -1).clone(),
                   "compress_state": pool, "compress_state_block_table": state_block_table[b:b + 1].to(torch.int32).clone(),
                   "wkv": wkv_t, "wgate": wgate_t, "ape": weights.ape.float().clone(),
                   "norm_w": _bf16_if_exact(weights.norm), "cos": cos, "sin": sin, "cmp_kv_cache": cmp,
                   "position_ids": one(p).to(torch.int32), "cmp_slot_mapping": one(row).to(torch.int64),
                   "state_slot_mapping": one(slot).to(torch.int64),
                   "kv": torch.zeros(1, d) if flat_tokens else torch.zeros(1, 1, d)}
        got = run(tensors, {}, {}, module=module, module_globals=module_globals)
        pool, cmp = got["compress_state"], got["cmp_kv_cache"]
        closes[t] = closing
    return {"closes": closes, "state_pool": pool, "cmp_pool": cmp}


FLASH_HCA_K_TILE = 128  # the Flash HCA attention's ATTN_K_TILE (its compressed tail is padded to whole tiles)
ATTENTION_MODULES = {"CSA": "decode_sparse_attn", "HCA": "decode_sparse_attn_hca", "SWA": "decode_sparse_attn_swa"}


def _checked_attention(path, q, ori_kv, window_indices, cmp_kv, cmp_block_table, compressed, position_ids,
                       attn_sink, freqs_cos, freqs_sin, wo_a, wo_b, wo_b_scale, *, config, seq, num_tokens):
    """The caller's side of v4_attention, both forms (every refusal the reference makes, with its fields) -> the
    window and the compressed slots as the attention reads them (CSA's raw top-k masked by position)."""
    from kernels.reference.attention import check_inputs
    from kernels.v4.sparse_attention import (
        attention_indices,
        check_output_projection,
        flat_pool,
        paged_compressed_rows,
    )

    window, cmp_indices = attention_indices(path, q, window_indices, compressed, position_ids, num_tokens=num_tokens,
                                            config=config)
    dim = q.shape[2]
    ori, cmp = flat_pool(ori_kv, "ori_kv", dim), flat_pool(cmp_kv, "cmp_kv", dim)
    rows = paged_compressed_rows(cmp_indices, cmp_block_table, seq=seq, block_size=cmp_kv.shape[1])
    check_inputs(q, ori, window, cmp, rows, attn_sink)
    check_output_projection(q.shape, freqs_cos, freqs_sin, wo_a, wo_b, wo_b_scale, config=config)
    return window, cmp_indices


def _prefill_sparse_attn(run, path, q, ori_kv, window_indices, cmp_kv, cmp_block_table, compressed, position_ids,
                         attn_sink, freqs_cos, freqs_sin, wo_a, wo_b, wo_b_scale, *, config, seq, num_tokens,
                         key_tiles=None, own_cmp_page=False):
    """v4_attention's prefill form -> prefill_sparse_attn.py::golden_prefill_sparse_attn: one request of T = seq
    rows (the module's T), its window rows and logical compressed slots as given (CSA's raw top-k masked by
    position first, as attention_indices does), its 1-D compressed table as wide as the call's (CMP_MAX_BLOCKS),
    the compressed page the call's (V4-Pro: BLOCK_SIZE; the Flash folders: ``cmp_storage_block_size``). The golden
    gathers each row's valid keys before tiling them, ``key_tiles="gathered"`` (disagreement 19)."""
    from contracts.operators import Unsupported

    window, cmp_indices = _checked_attention(path, q, ori_kv, window_indices, cmp_kv, cmp_block_table, compressed,
                                             position_ids, attn_sink, freqs_cos, freqs_sin, wo_a, wo_b, wo_b_scale,
                                             config=config, seq=seq, num_tokens=num_tokens)
    tokens = q.shape[0]
    if (key_tiles or "gathered") != "gathered":
        raise Unsupported(f"upstream's prefill attention golden gathers each row's valid keys before tiling them; "
                          f"key_tiles={key_tiles!r} is the decode goldens' rule")
    if seq != tokens or cmp_block_table.shape[0] != 1:
        raise Unsupported(f"upstream's prefill attention golden takes one request's chunk (seq {seq}, T {tokens}, "
                          f"{cmp_block_table.shape[0]} compressed tables)")
    table = cmp_block_table.reshape(-1).to(torch.int32)
    tensors = {"q": q.clone(), "ori_kv": ori_kv.clone(), "cmp_kv": cmp_kv.clone(), "cmp_block_table": table.clone(),
               "swa_indices": window.to(torch.int32).clone(), "cmp_indices": cmp_indices.to(torch.int32).clone(),
               "attn_sink": attn_sink.float().clone(), "num_tokens": int(num_tokens), "freqs_cos": freqs_cos.clone(),
               "freqs_sin": freqs_sin.clone(), "wo_a": wo_a.clone(), "wo_b": wo_b.clone(),
               "wo_b_scale": wo_b_scale.float().clone(),
               "attn_out": torch.zeros(tokens, config.hidden_size, dtype=torch.bfloat16)}
    constants = {"BLOCK_SIZE": int(cmp_kv.shape[1])}
    if own_cmp_page:  # the Flash goldens read the compressed page from the call, their BLOCK_SIZE stays the window's
        tensors["cmp_storage_block_size"] = int(cmp_kv.shape[1])
        constants = {}
    out = run(tensors, _variant_fields(config), constants, module="prefill_sparse_attn",
              function="golden_prefill_sparse_attn", module_globals={"T": tokens, "CMP_MAX_BLOCKS": int(table.numel())})
    return out["attn_out"]


def _v4_attention(run, path, q, ori_kv, window_indices, cmp_kv, cmp_block_table, compressed, position_ids,
                  attn_sink, freqs_cos, freqs_sin, wo_a, wo_b, wo_b_scale, *, config, seq=None, num_tokens=None,
                  key_tiles=None, own_cmp_page=False):
    """v4_attention -> decode_sparse_attn.py (CSA: the raw indexer top-k, masked by position inside the golden),
    decode_sparse_attn_hca.py (HCA: the compressed slots), decode_sparse_attn_swa.py (SWA: the window only)
    ::golden_sparse_attn, each the sparse attention fused with the grouped output projection. Geometry: B = T /
    seq requests of S = seq rows (DECODE_BATCH, DECODE_SEQ), the call's page size as BLOCK_SIZE. The window
    is upstream's WIN columns and HCA's slots its CMP_TOPK columns (a narrower call is padded with -1, which
    reads nothing; a wider one is unsupported: upstream's key tiles would drop the excess). ``own_cmp_page``: the
    folder's compressed cache has a page of its own (the Flash folders' CMP_STORAGE_BLOCK_SIZE, 128 / ratio rows),
    set to the call's compressed page. The prefill form (``num_tokens`` given): ``_prefill_sparse_attn``."""
    from contracts.operators import Unsupported

    seq = config.decode_seq if seq is None else seq
    if num_tokens is not None:
        return _prefill_sparse_attn(run, path, q, ori_kv, window_indices, cmp_kv, cmp_block_table, compressed,
                                    position_ids, attn_sink, freqs_cos, freqs_sin, wo_a, wo_b, wo_b_scale,
                                    config=config, seq=seq, num_tokens=num_tokens, key_tiles=key_tiles,
                                    own_cmp_page=own_cmp_page)
    if key_tiles not in (None, "columns"):
        raise Unsupported(f"upstream's decode attention goldens tile the key columns; key_tiles={key_tiles!r} is "
                          "the prefill goldens' rule")
    window, cmp_indices = _checked_attention(path, q, ori_kv, window_indices, cmp_kv, cmp_block_table, compressed,
                                             position_ids, attn_sink, freqs_cos, freqs_sin, wo_a, wo_b, wo_b_scale,
                                             config=config, seq=seq, num_tokens=num_tokens)
    tokens = q.shape[0]
    if ori_kv.shape[1] != cmp_kv.shape[1] and not own_cmp_page:
        raise Unsupported(f"upstream's decode attention goldens take one BLOCK_SIZE for both caches; the call's are "
                          f"{ori_kv.shape[1]} and {cmp_kv.shape[1]}")
    win = config.sliding_window
    cmp_topk = {"CSA": config.index_topk, "HCA": min(config.max_position_embeddings // 128, config.index_topk),
                "SWA": 0}[path]
    if own_cmp_page and path == "HCA":  # the Flash HCA tail: the whole compressed capacity in 128-wide key tiles
        cmp_topk = -(-config.max_position_embeddings // 128 // FLASH_HCA_K_TILE) * FLASH_HCA_K_TILE

    def widen(t, width, what):
        if t.shape[1] > width:
            raise Unsupported(f"upstream's {path} golden reads {width} {what} columns; the call has {t.shape[1]}")
        return torch.cat((t.to(torch.int32), torch.full((tokens, width - t.shape[1]), -1, dtype=torch.int32)), 1)

    tensors = {"q": q.clone(), "ori_kv": ori_kv.clone(), "attn_sink": attn_sink.float().clone(),
               "freqs_cos": freqs_cos.clone(), "freqs_sin": freqs_sin.clone(), "wo_a": wo_a.clone(),
               "wo_b": wo_b.clone(), "wo_b_scale": wo_b_scale.float().clone(),
               "attn_out": torch.zeros(tokens, config.hidden_size, dtype=torch.bfloat16)}
    if path == "SWA":
        # the SWA entry reads a valid prefix of swa_lens columns and masks by column alone (a -1 inside the prefix
        # is read as a row; its golden skips it): the call's valid slots first, in order, then -1, and their count
        tensors["swa_indices"], tensors["swa_lens"] = _valid_prefix(widen(window, win, "window"))
    else:
        # the compressed table as wide as the entries are compiled (KV_CMP_MAX_BLOCKS, the pool's 32 pages);
        # unread columns -1
        table = cmp_block_table.to(torch.int32)
        width = config.cmp_pool
        if own_cmp_page:
            # the Flash pages: CSA's hold the 32 compressed rows of one 128-token block (P / 4 of the call's P), HCA's
            # one row, its table one entry per slot; the call's pages laid out again, the table as wide as the
            # compressed capacity's pages (the entry's), never dropping a mapped page
            cmp_page = 1 if path == "HCA" else max(1, int(cmp_kv.shape[1]) // 4)
            cmp_kv, _, table = _repage(cmp_kv, None, table, cmp_page)
            # as wide as the entry's table (the compressed capacity's pages), and past it only as far as a slot
            # the call reads (a mapped page no slot reaches is never read)
            read = cmp_indices[cmp_indices >= 0]
            need = cmp_topk if path == "HCA" else -(-(config.max_position_embeddings // 4) // cmp_page)
            width = max(need, int(read.max()) // cmp_page + 1 if read.numel() else 0)
            table = table[:, :width]
        tensors.update(window_swa_indices=widen(window, win, "window"), cmp_kv=cmp_kv.clone(),
                       cmp_block_table=torch.nn.functional.pad(table, (0, max(0, width - table.shape[1])),
                                                               value=-1))
        if path == "CSA":  # the raw top-k: upstream masks it by position itself (as attention_indices did)
            raw = compressed.to(torch.int32).clone()
            if num_tokens is not None:
                raw[num_tokens:] = -1
            score_width = config.max_position_embeddings // 4 if own_cmp_page else cmp_topk  # Flash: the score row
            tensors.update(idx_topk=widen(raw[:, :cmp_topk], score_width, "top-k"),
                           position_ids=position_ids.reshape(tokens, 1).to(torch.int32).clone())
        else:
            tensors["cmp_sparse_indices"] = widen(cmp_indices, cmp_topk, "compressed")
    out = run(tensors, _variant_fields(config), {"DECODE_BATCH": tokens // seq, "DECODE_SEQ": seq,
                                                  "BLOCK_SIZE": int(ori_kv.shape[1])},
              module=ATTENTION_MODULES[path],
              module_globals={"ORI_BLOCK_NUM": int(ori_kv.shape[0])} if path == "SWA" else
              {"CMP_STORAGE_BLOCK_SIZE": int(tensors["cmp_kv"].shape[1])} if own_cmp_page and path == "CSA" else None)
    return out["attn_out"]


def _check_swa_stage(position_ids, freqs_cos, kv_cache, swa_slot_mapping, *, tokens, num_tokens=None) -> None:
    """The caller's side of the SWA attention stage: positions inside the RoPE table, slots inside the cache."""
    from kernels.errors import ContractInputError
    from kernels.v4.attention_stage import SPEC, stage_positions

    stage_positions(position_ids, freqs_cos, tokens=tokens, num_tokens=num_tokens)
    rows = kv_cache.shape[0] * kv_cache.shape[1]
    for t, slot in enumerate(swa_slot_mapping.reshape(-1).tolist()):
        if slot >= rows:
            raise ContractInputError("swa_slot_mapping", (t,), f"a row in [0, {rows})", slot, SPEC)


def _swa_stage_tensors(hc_fn, hc_scale, hc_base, attn_norm_w, wq_a, wq_b, wq_b_scale, wkv, gamma_cq, gamma_ckv,
                       freqs_cos, freqs_sin, kv_cache, swa_slot_mapping, window_indices, position_ids, attn_sink, wo_a,
                       wo_b, wo_b_scale, *, config, a5_tiling=True) -> tuple[dict, dict, dict]:
    """decode_attention_swa.py::golden_attention_swa's tensors (all but x_hc and x_out), config constants and
    module globals for one decode batch: the window padded with -1 to upstream's width."""
    from contracts.operators import Unsupported

    tokens = position_ids.reshape(-1).shape[0]
    seq, win = config.decode_seq, config.sliding_window
    if window_indices.shape[1] > win:
        raise Unsupported(f"upstream's SWA golden reads {win} window columns; the call has {window_indices.shape[1]}")
    swa = torch.cat((window_indices.to(torch.int32), torch.full((tokens, win - window_indices.shape[1]), -1,
                                                                 dtype=torch.int32)), 1)
    constants = {"DECODE_BATCH": tokens // seq, "DECODE_SEQ": seq, "BLOCK_SIZE": int(kv_cache.shape[1])}
    tensors = {"hc_attn_fn": hc_fn.float().clone(), "hc_attn_scale": hc_scale.float().clone(),
               "hc_attn_base": hc_base.float().clone(), "attn_norm_w": attn_norm_w.clone(), "wq_a": wq_a.clone(),
               "wq_b": wq_b.clone(), "wq_b_scale": wq_b_scale.float().clone(), "wkv": wkv.clone(),
               "gamma_cq": gamma_cq.clone(), "gamma_ckv": gamma_ckv.clone(), "freqs_cos": freqs_cos.clone(),
               "freqs_sin": freqs_sin.clone(), "kv_cache": kv_cache.clone(),
               "swa_slot_mapping": swa_slot_mapping.reshape(-1).to(torch.int64).clone(), "swa_indices": swa,
               "swa_lens": torch.full((tokens,), win, dtype=torch.int32),
               "position_ids": position_ids.reshape(-1).to(torch.int32).clone(), "attn_sink": attn_sink.float().clone(),
               "wo_a": wo_a.clone(), "wo_b": wo_b.clone(), "wo_b_scale": wo_b_scale.float().clone()}
    module_globals = {**(_qkv_tiling(config, "qkv_proj_rope") if a5_tiling else {}),
                      "decode_sparse_attn_swa.ORI_BLOCK_NUM": int(kv_cache.shape[0])}
    return tensors, constants, module_globals


def _table_of_window(window_indices, position_ids, num_tokens, *, window: int, block_size: int) -> torch.Tensor:
    """The 1-D page table a prefill chunk's window was lowered through, read back from it: upstream's prefill SWA
    stage takes a table and lowers the window itself (position p sees p + 1 - min(window, p + 1) .. p in columns
    0 ..), so a window that is not some table's lowering is unsupported. Pages no window reads are -1."""
    from contracts.operators import Unsupported

    pages: dict[int, int] = {}
    for t in range(int(num_tokens)):
        p = int(position_ids.reshape(-1)[t])
        valid = min(window, p + 1)
        row = window_indices[t].tolist()
        if len(row) < valid or any(v != -1 for v in row[valid:]):
            raise Unsupported(f"row {t}: upstream's prefill SWA stage lowers the window itself (the last {valid} "
                              f"positions oldest first, -1 after); the call's window is another layout")
        for k, phys in enumerate(row[:valid]):
            key = p + 1 - valid + k
            page = key // block_size
            want = -1 if phys < 0 else phys // block_size
            if phys >= 0 and phys % block_size != key % block_size or pages.setdefault(page, want) != want:
                raise Unsupported(f"row {t}: window column {k} (position {key}) is not one page table's row")
    table = torch.full((max(pages, default=-1) + 1,), -1, dtype=torch.int32)
    for page, phys in pages.items():
        table[page] = phys
    return table


def _stage_qr(run, x_hc, hc_fn, hc_scale, hc_base, attn_norm_w, wq_a, wq_b, wq_b_scale, wkv, gamma_cq, gamma_ckv,
              rope_cos, rope_sin, *, config, fields, constants, num_tokens=None, qkv_globals=None):
    """qr / qr_scale of a stage whose golden computes and drops them: the same chain of upstream goldens it runs
    (hc_pre.py::golden_hc_pre -> rmsnorm.py::golden_rms_norm_test -> qkv_proj_rope.py::golden_qkv_proj_rope)."""
    tokens, lora, dim = x_hc.shape[0], config.q_lora_rank, config.head_dim
    pre = run({"x": x_hc.float().clone(), "hc_fn": hc_fn.float().clone(), "hc_scale": hc_scale.float().clone(),
               "hc_base": hc_base.float().clone(),
               "x_mixed": torch.zeros(tokens, config.hidden_size, dtype=torch.bfloat16),
               "post": torch.zeros(tokens, config.hc_mult), "comb": torch.zeros(tokens, config.hc_mult ** 2)},
              fields, constants, module="hc_pre", function="golden_hc_pre")
    normed = run({"x": pre["x_mixed"], "norm_w": attn_norm_w.clone(),
                  "x_normed": torch.zeros(tokens, config.hidden_size, dtype=torch.bfloat16)},
                 fields, constants, module="rmsnorm", function="golden_rms_norm_test")
    proj = run({"x": normed["x_normed"], "wq_a": wq_a.clone(), "wq_b": wq_b.clone(),
                "wq_b_scale": wq_b_scale.float().clone(), "wkv": wkv.clone(), "rope_cos": rope_cos.clone(),
                "rope_sin": rope_sin.clone(), "gamma_cq": gamma_cq.clone(), "gamma_ckv": gamma_ckv.clone(),
                **({} if num_tokens is None else {"num_tokens": int(num_tokens)}),
                "q": torch.zeros(tokens, config.num_attention_heads, dim, dtype=torch.bfloat16),
                "kv": torch.zeros(tokens, dim, dtype=torch.bfloat16), "qr": torch.zeros(tokens, lora, dtype=torch.int8),
                "qr_scale": torch.zeros(tokens, 1)}, fields, constants, module="qkv_proj_rope",
               function="golden_qkv_proj_rope", module_globals=qkv_globals)
    return proj["qr"], proj["qr_scale"]


def _prefill_swa_stage(run, x_hc, hc_fn, hc_scale, hc_base, attn_norm_w, wq_a, wq_b, wq_b_scale, wkv, gamma_cq,
                       gamma_ckv, freqs_cos, freqs_sin, kv_cache, swa_slot_mapping, window_indices, position_ids,
                       attn_sink, wo_a, wo_b, wo_b_scale, *, config, num_tokens, a5_tiling=True, rows_from_x=False):
    """v4_attention_stage's SWA prefill form -> prefill_attention_swa.py (Flash: prefill_swa.py)
    ::golden_prefill_attention_swa: one request of T rows (B 1, S T), the page table read back from the call's
    window (``_table_of_window``), the slots as ori_slot_mapping; x_out and the cache from the golden, qr /
    qr_scale from the chain it runs (with num_tokens; the Flash folders' qkv golden takes none, so there the
    padding rows' qr / qr_scale are zeroed here and judge nothing of upstream). The padding rows' positions are
    never read. ``rows_from_x``: dspark's golden sizes the chunk by x_hc's rows (no num_tokens, no module-level
    T): only the real rows are handed over, and the padding rows' x_out is the adapter's zeros."""
    tokens = x_hc.shape[0]
    real = int(num_tokens)
    pos = position_ids.reshape(-1).to(torch.int64).clone()
    pos[real:] = 0
    table = _table_of_window(window_indices, pos, real, window=config.sliding_window,
                             block_size=int(kv_cache.shape[1]))
    fields = _variant_fields(config)
    constants = {"PREFILL_BATCH": 1, "PREFILL_SEQ": tokens, "BLOCK_SIZE": int(kv_cache.shape[1])}
    qkv_globals = _qkv_tiling(config) if a5_tiling else None
    tensors = {"x_hc": x_hc.float().clone(), "hc_attn_fn": hc_fn.float().clone(),
               "hc_attn_scale": hc_scale.float().clone(), "hc_attn_base": hc_base.float().clone(),
               "attn_norm_w": attn_norm_w.clone(), "wq_a": wq_a.clone(), "wq_b": wq_b.clone(),
               "wq_b_scale": wq_b_scale.float().clone(), "wkv": wkv.clone(), "gamma_cq": gamma_cq.clone(),
               "gamma_ckv": gamma_ckv.clone(), "freqs_cos": freqs_cos.clone(), "freqs_sin": freqs_sin.clone(),
               "kv_cache": kv_cache.clone(), "ori_slot_mapping": swa_slot_mapping.reshape(-1).to(torch.int64).clone(),
               "position_ids": pos.to(torch.int32), "block_table": table, "num_tokens": real,
               "attn_sink": attn_sink.float().clone(), "wo_a": wo_a.clone(), "wo_b": wo_b.clone(),
               "wo_b_scale": wo_b_scale.float().clone(),
               "x_out": torch.zeros(tokens, config.hc_mult, config.hidden_size, dtype=torch.float32)}
    module_globals = {**({f"qkv_proj_rope.{k}": v for k, v in qkv_globals.items()} if qkv_globals else {}),
                      "prefill_sparse_attn.T": tokens}
    if rows_from_x:
        for name in ("x_hc", "ori_slot_mapping", "position_ids", "x_out"):
            tensors[name] = tensors[name][:real].clone()
        del tensors["num_tokens"]
        module_globals = {"BLOCK_NUM": int(kv_cache.shape[0])}
    out = run(tensors, fields, constants, module="prefill_attention_swa", function="golden_prefill_attention_swa",
              module_globals=module_globals)
    if rows_from_x:
        out["x_out"] = torch.cat((out["x_out"], torch.zeros(tokens - real, *out["x_out"].shape[1:])))
    qr, qr_scale = _stage_qr(run, x_hc, hc_fn, hc_scale, hc_base, attn_norm_w, wq_a, wq_b, wq_b_scale, wkv, gamma_cq,
                             gamma_ckv, freqs_cos[pos], freqs_sin[pos], config=config, fields=fields,
                             constants=constants, num_tokens=real, qkv_globals=qkv_globals)
    if not a5_tiling:  # the Flash qkv golden takes no num_tokens: its padding rows' qr are the adapter's zeros
        qr, qr_scale = qr.clone(), qr_scale.clone()
        qr[real:], qr_scale[real:] = 0, 0
    return {"x_out": out["x_out"], "kv_cache": out["kv_cache"], "qr": qr, "qr_scale": qr_scale}


# Flash-MTP's prefill_layer.py's packed HCA / CSA pools and tables, which its golden slices per request whatever the
# layer's kind
_PREFILL_LAYER_OTHER_KINDS = ("hca_cmp_kv", "csa_cmp_kv", "hca_cmp_block_table", "csa_cmp_block_table", "idx_kv_cache",
                              "idx_kv_scale", "idx_block_table", "hca_compress_state", "hca_compress_state_block_table",
                              "csa_compress_state", "csa_compress_state_block_table", "csa_inner_compress_state",
                              "csa_inner_compress_state_block_table")


def _v4_prefill_layer(run, x_hc, chunk_lens, chunk_offsets, attention, moe, *, layer_id, tile, config):
    """v4_prefill_layer -> Flash-MTP's prefill_layer.py::golden_prefill_layer at an SWA layer: its child
    (prefill_swa.py) then moe.py::golden_moe over two replicated EP ranks, whose x_next and cache must agree byte
    for byte. The golden loops a fixed USER_BATCH over the same rows 0 .. T-1 with every row real, so its domain is
    one request of one whole tile at row 0 (``USER_BATCH`` 1, ``T`` the call's tile, ``ORI_TABLE_BLOCKS`` its
    pages); any other packing is unsupported, named."""
    from contracts.operators import Unsupported
    from kernels.v4.prefill_layer import check_v4_prefill_layer

    spans = check_v4_prefill_layer(x_hc, chunk_lens, chunk_offsets, attention, moe, layer_id=layer_id, tile=tile,
                                   config=config)
    if spans != [(0, tile)] or x_hc.shape[0] < tile:
        raise Unsupported(f"this folder's prefill_layer.py golden runs one request of one whole tile at row 0 "
                          f"(the call: chunks {spans} of {x_hc.shape[0]} packed rows, tile {tile})")
    a = attention
    ids = moe["input_ids"].reshape(-1)
    check_v4_moe_stage(x_hc, **{**moe, "input_ids": ids}, layer_id=layer_id, num_tokens=tile, config=config)
    tensors, fields = _moe_tensors(moe["hc_fn"], moe["hc_scale"], moe["hc_base"], moe["norm_w"], moe["gate_w"],
                                   moe["gate_bias"], moe["tid2eid"], ids, moe["routed"], moe["shared"], config=config)
    tensors.update({
        "x_hc": _both(x_hc.float()), "hc_attn_fn": _both(a["hc_fn"].float()),
        "hc_attn_scale": _both(a["hc_scale"].float()), "hc_attn_base": _both(a["hc_base"].float()),
        **{name: _both(a[name]) for name in ("attn_norm_w", "wq_a", "wq_b", "wkv", "gamma_cq", "gamma_ckv", "wo_a",
                                             "wo_b", "freqs_cos", "freqs_sin", "kv_cache")},
        "wq_b_scale": _both(a["wq_b_scale"].float()), "wo_b_scale": _both(a["wo_b_scale"].float()),
        "attn_sink": _both(a["attn_sink"].float()),
        "ori_block_table": _both(a["block_tables"].reshape(-1).to(torch.int32)),
        "ori_slot_mapping": _both(a["swa_slot_mapping"].reshape(-1).to(torch.int64)),
        "position_ids": _both(a["position_ids"].reshape(-1).to(torch.int32)), "input_ids": _both(ids.to(torch.int64)),
        "layer_id": int(layer_id), "x_next": torch.zeros(MOE_RANKS, *x_hc.shape),
        **{name: torch.zeros(MOE_RANKS, 1) for name in _PREFILL_LAYER_OTHER_KINDS}})  # an SWA layer reads none
    constants = {"PREFILL_BATCH": 1, "PREFILL_SEQ": tile, "PREFILL_TOKENS": tile, "MOE_TOKENS": tile,
                 "BLOCK_SIZE": int(a["kv_cache"].shape[1])}
    module_globals = {"ORI_TABLE_BLOCKS": a["block_tables"].shape[1], "T": tile, "prefill_sparse_attn.T": tile,
                      "USER_BATCH": 1}
    out = run(tensors, fields, constants, module="prefill_layer", function="golden_prefill_layer",
              module_globals=module_globals)
    _ranks_agree(out, (), None, "prefill_layer.py", unordered=("x_next", "kv_cache"))
    return {"x_next": out["x_next"][0], "kv_cache": out["kv_cache"][0]}


def _v4_prefill_layer_packed(run, x_hc, chunk_lens, chunk_offsets, attention, moe, *, layer_id, tile, config):
    """v4_prefill_layer -> V4-Pro's prefill_layer.py::golden_prefill_layer, a packed golden: each request's tiles
    of T (the call's tile) rows in order through the layer kind's attention child (at an SWA layer
    prefill_attention_swa.py) then moe.py::golden_moe, over two replicated EP ranks whose x_next and cache must
    agree byte for byte; ``chunk_lens`` / ``chunk_offsets`` as given, each request's page table laid end to end
    (``ORI_TABLE_BLOCKS`` pages each) over the one global cache. The golden reads T rows from each tile's start:
    the packed rows are extended with zero rows to the last tile's end (the operator's padding rows, which move
    nothing). The golden picks the layer's kind from its config's compress_ratios, which the worker sets from the
    call's preset (so under either of the folder's presets an SWA layer of the call runs its SWA child); the HCA /
    CSA kinds are not this operator's (it refuses a layer whose ratio is not 0)."""
    from kernels.v4.prefill_layer import check_v4_prefill_layer

    spans = check_v4_prefill_layer(x_hc, chunk_lens, chunk_offsets, attention, moe, layer_id=layer_id, tile=tile,
                                   config=config)
    n = x_hc.shape[0]
    end = max([n, *(off + -(-length // tile) * tile for off, length in spans)])
    a = attention

    def rows(t: torch.Tensor, dtype) -> torch.Tensor:
        flat = t.reshape(n, *t.shape[1:]) if t.ndim > 1 else t.reshape(-1)
        out = torch.zeros(end, *flat.shape[1:], dtype=dtype)
        out[:n] = flat.to(dtype)
        return out

    ids = moe["input_ids"].reshape(-1)
    check_v4_moe_stage(x_hc[:tile] if n >= tile else rows(x_hc, torch.float32)[:tile],
                       **{**moe, "input_ids": rows(ids, ids.dtype)[:tile]}, layer_id=layer_id, num_tokens=tile,
                       config=config)
    tensors, fields = _moe_tensors(moe["hc_fn"], moe["hc_scale"], moe["hc_base"], moe["norm_w"], moe["gate_w"],
                                   moe["gate_bias"], moe["tid2eid"], rows(ids, torch.int64), moe["routed"],
                                   moe["shared"], config=config)
    pages = a["block_tables"].shape[1]
    tensors.update({
        "x_hc": _both(rows(x_hc, torch.float32)), "hc_attn_fn": _both(a["hc_fn"].float()),
        "hc_attn_scale": _both(a["hc_scale"].float()), "hc_attn_base": _both(a["hc_base"].float()),
        **{name: _both(a[name]) for name in ("attn_norm_w", "wq_a", "wq_b", "wkv", "gamma_cq", "gamma_ckv", "wo_a",
                                             "wo_b", "freqs_cos", "freqs_sin", "kv_cache")},
        "wq_b_scale": _both(a["wq_b_scale"].float()), "wo_b_scale": _both(a["wo_b_scale"].float()),
        "attn_sink": _both(a["attn_sink"].float()),
        "ori_block_table": _both(a["block_tables"].reshape(-1).to(torch.int32)),
        "ori_slot_mapping": _both(rows(a["swa_slot_mapping"], torch.int64)),
        "position_ids": _both(rows(a["position_ids"], torch.int32)), "input_ids": _both(rows(ids, torch.int64)),
        "chunk_lens": chunk_lens.to(torch.int32).reshape(1, -1).clone(),
        "chunk_offsets": chunk_offsets.to(torch.int32).reshape(1, -1).clone(),
        "layer_id": int(layer_id), "x_next": torch.zeros(MOE_RANKS, end, *x_hc.shape[1:]),
        **{name: torch.zeros(MOE_RANKS, 1) for name in (*_PREFILL_LAYER_OTHER_KINDS, "cmp_kv", "cmp_block_table")}})
    # (an SWA layer reads none of the other kinds' pools; the golden only slices their tables per request)
    constants = {"PREFILL_BATCH": 1, "PREFILL_SEQ": tile, "PREFILL_TOKENS": tile, "MOE_TOKENS": tile,
                 "BLOCK_SIZE": int(a["kv_cache"].shape[1])}
    out = run(tensors, fields, constants, module="prefill_layer", function="golden_prefill_layer",
              module_globals={"ORI_TABLE_BLOCKS": pages, "T": tile, **_qkv_tiling(config, "qkv_proj_rope")})
    _ranks_agree(out, (), None, "prefill_layer.py", unordered=("x_next", "kv_cache"))
    return {"x_next": out["x_next"][0][:n], "kv_cache": out["kv_cache"][0]}


def _v4_attention_stage(run, path, x_hc, hc_fn, hc_scale, hc_base, attn_norm_w, wq_a, wq_b, wq_b_scale, wkv, gamma_cq,
                        gamma_ckv, freqs_cos, freqs_sin, kv_cache, swa_slot_mapping, window_indices, position_ids,
                        attn_sink, wo_a, wo_b, wo_b_scale, cmp_kv=None, cmp_block_table=None, compressed=None, *,
                        config, num_tokens=None, a5_tiling=True, decode=True, rows_from_x=False):
    """v4_attention_stage, SWA decode -> decode_attention_swa.py::golden_attention_swa (hc_pre, RMSNorm, Q/KV,
    the window-cache write, the SWA attention with its projection, hc_post): x_out and the new cache. That golden
    computes qr / qr_scale and drops them; they are read by running the same three goldens it chains
    (hc_pre.py::golden_hc_pre -> rmsnorm.py::golden_rms_norm_test -> qkv_proj_rope.py::golden_qkv_proj_rope).
    HCA / CSA: upstream's stage goldens also run the compressor (and the indexer), which this operator takes as
    inputs: unsupported here. The SWA prefill form: ``_prefill_swa_stage``. ``decode=False``: a folder whose decode
    stage golden is not adapted (its prefill one is)."""
    from contracts.operators import Unsupported

    tokens = x_hc.shape[0]
    _check_swa_stage(position_ids, freqs_cos, kv_cache, swa_slot_mapping, tokens=tokens, num_tokens=num_tokens)
    if path != "SWA":
        raise Unsupported(f"upstream's decode_attention_{path.lower()} golden runs the compressor{' and indexer' if path == 'CSA' else ''} "
                          "inside the stage; this operator takes the compressed cache and top-k as inputs")
    if num_tokens is not None:
        return _prefill_swa_stage(run, x_hc, hc_fn, hc_scale, hc_base, attn_norm_w, wq_a, wq_b, wq_b_scale, wkv,
                                  gamma_cq, gamma_ckv, freqs_cos, freqs_sin, kv_cache, swa_slot_mapping,
                                  window_indices, position_ids, attn_sink, wo_a, wo_b, wo_b_scale, config=config,
                                  num_tokens=num_tokens, a5_tiling=a5_tiling, rows_from_x=rows_from_x)
    if not decode:
        raise Unsupported("this folder's decode SWA stage golden is not adapted (see docs/upstream.md)")
    if rows_from_x:  # dspark: its TP1 decode stage golden
        return _dspark_decode_swa_stage(run, x_hc, hc_fn, hc_scale, hc_base, attn_norm_w, wq_a, wq_b, wq_b_scale, wkv,
                                        gamma_cq, gamma_ckv, freqs_cos, freqs_sin, kv_cache, swa_slot_mapping,
                                        window_indices, position_ids, attn_sink, wo_a, wo_b, wo_b_scale, config=config)
    tensors, constants, module_globals = _swa_stage_tensors(
        hc_fn, hc_scale, hc_base, attn_norm_w, wq_a, wq_b, wq_b_scale, wkv, gamma_cq, gamma_ckv, freqs_cos, freqs_sin,
        kv_cache, swa_slot_mapping, window_indices, position_ids, attn_sink, wo_a, wo_b, wo_b_scale, config=config,
        a5_tiling=a5_tiling)
    fields = _variant_fields(config)
    tensors.update(x_hc=x_hc.float().clone(),
                   x_out=torch.zeros(tokens, config.hc_mult, config.hidden_size, dtype=torch.float32))
    out = run(tensors, fields, constants, module="decode_attention_swa", function="golden_attention_swa",
              module_globals=module_globals)
    pos = position_ids.reshape(-1).to(torch.long)
    qr, qr_scale = _stage_qr(run, x_hc, hc_fn, hc_scale, hc_base, attn_norm_w, wq_a, wq_b, wq_b_scale, wkv, gamma_cq,
                             gamma_ckv, freqs_cos[pos], freqs_sin[pos], config=config, fields=fields,
                             constants=constants, qkv_globals=_qkv_tiling(config) if a5_tiling else None)
    return {"x_out": out["x_out"], "kv_cache": out["kv_cache"], "qr": qr, "qr_scale": qr_scale}


def _dspark_decode_swa_stage(run, x_hc, hc_fn, hc_scale, hc_base, attn_norm_w, wq_a, wq_b, wq_b_scale, wkv, gamma_cq,
                             gamma_ckv, freqs_cos, freqs_sin, kv_cache, swa_slot_mapping, window_indices, position_ids,
                             attn_sink, wo_a, wo_b, wo_b_scale, *, config):
    """v4_attention_stage, SWA decode, on dspark -> decode_swa.py::golden_decode_swa_tp1 (hc_pre, RMSNorm, Q/KV, the
    window-cache write, its sparse attention into heads packed by output group, its TP1 output projection,
    hc_post), T = the call's rows: the RoPE rows token-local (the table read at each row's position), the window's
    valid slots first with their count in ``swa_lens`` (its attention reads a valid prefix). ``decode_o_proj.py``
    checks the model's tiling at import, so it is imported at dspark's own geometry first and handed the call's
    widths; the packed heads' row padding (``T_PAD``, the rows' 16-row ceiling) is set alike on the three modules
    that share it. qr / qr_scale, which the golden drops, from the chain of goldens it runs. A call of whole
    requests in two equal parts also runs the TP golden (``_dspark_tp_judged``), judged against this one."""
    tokens = x_hc.shape[0]
    pos = position_ids.reshape(-1).to(torch.long)
    win = config.sliding_window
    w = torch.cat((window_indices.to(torch.int32), torch.full((tokens, win - window_indices.shape[1]), -1,
                                                               dtype=torch.int32)), 1)
    swa_indices, swa_lens = _valid_prefix(w)
    tensors = {"x_hc": x_hc.float().clone(), "hc_attn_fn": hc_fn.float().clone(),
               "hc_attn_scale": hc_scale.float().clone(), "hc_attn_base": hc_base.float().clone(),
               "attn_norm_w": attn_norm_w.clone(), "wq_a": wq_a.clone(), "wq_b": wq_b.clone(),
               "wq_b_scale": wq_b_scale.float().clone(), "wkv": wkv.clone(), "gamma_cq": gamma_cq.clone(),
               "gamma_ckv": gamma_ckv.clone(), "freqs_cos": freqs_cos[pos].clone(), "freqs_sin": freqs_sin[pos].clone(),
               "kv_cache": kv_cache.clone(), "swa_slot_mapping": swa_slot_mapping.reshape(-1).to(torch.int64).clone(),
               "swa_indices": swa_indices, "swa_lens": swa_lens,
               "attn_sink": attn_sink.float().clone(), "wo_a": wo_a.clone(), "wo_b": wo_b.clone(),
               "wo_b_scale": wo_b_scale.float().clone(),
               "x_out": torch.zeros(tokens, config.hc_mult, config.hidden_size, dtype=torch.float32)}
    module_globals = {**_dspark_o_proj_globals(config, tokens, "decode_sparse_attn_swa"),
                      "decode_sparse_attn_swa.ORI_BLOCK_NUM": int(kv_cache.shape[0])}
    fields = _variant_fields(config)
    constants = {"BLOCK_SIZE": int(kv_cache.shape[1])}
    out = run(tensors, fields, constants, module="decode_attention_swa", function="golden_decode_swa_tp1",
              module_globals=module_globals, native=("decode_o_proj",))
    seq = config.decode_seq
    if tokens % (2 * seq) == 0:  # whole requests on each of two ranks: the TP golden judged against the TP1 one
        _dspark_tp_judged(run, tensors, module="decode_attention_swa", tp_function="golden_decode_swa",
                          tp1_function="golden_decode_swa_tp1", per_token=_TOKEN_ROWS, per_request=(),
                          outputs=("x_out", "kv_cache"), seq=seq, fields=fields, constants=constants,
                          module_globals=module_globals)
    qr, qr_scale = _stage_qr(run, x_hc, hc_fn, hc_scale, hc_base, attn_norm_w, wq_a, wq_b, wq_b_scale, wkv, gamma_cq,
                             gamma_ckv, freqs_cos[pos], freqs_sin[pos], config=config, fields=fields,
                             constants=constants, qkv_globals=None)
    return {"x_out": out["x_out"], "kv_cache": out["kv_cache"], "qr": qr, "qr_scale": qr_scale}


def _dspark_tp_judged(run, tensors, *, module, tp_function, tp1_function, per_token, per_request, outputs, seq,
                      fields, constants, module_globals, ranks=2):
    """One of dspark's TP decode stage goldens (``tp_function``: its TP world of ``ranks``): the call's requests
    dealt to the ranks in equal parts (each rank its own rows ``per_token``, its requests' ``per_request`` rows, and
    a copy of every cache), the output projection's wo_b in its TP layout ([ranks, D, groups · o_lora / ranks], which
    its permute reads back as the TP1 golden's [D, groups · o_lora]). Each rank's ``outputs`` must be the TP1
    golden's over that rank's rows alone, byte for byte, or the call fails naming both (over the whole call they
    are an FP32 ulp apart in some rows: upstream's host matmuls depend on how many rows share them, the deviation
    ``batched-host-matmul``)."""
    from contracts.operators import BackendError

    if not _calls_goldens(run):
        return
    tokens = tensors["x_hc"].shape[0]
    local = tokens // ranks

    def own(name, value, r=None):
        part = local if name in per_token else local // seq if name in per_request else None
        if part is None:
            return value.clone() if r is not None else torch.stack([value] * ranks)
        return value[r * part:(r + 1) * part].clone() if r is not None else \
            value.reshape(ranks, part, *value.shape[1:]).clone()

    tp = {name: own(name, value) for name, value in tensors.items() if name not in ("wo_a", "wo_b")}
    d = tensors["wo_b"].shape[0]
    tp.update(wo_a=tensors["wo_a"].clone(), wo_b=tensors["wo_b"].reshape(d, ranks, -1).permute(1, 0, 2).contiguous(),
              local_t=local)
    out = run(tp, fields, constants, module=module, function=tp_function,
              module_globals={**module_globals, "TP_SIZE": ranks}, native=("decode_o_proj",))
    for r in range(ranks):
        want = run({name: own(name, value, r) for name, value in tensors.items()}, fields, constants, module=module,
                   function=tp1_function, module_globals=module_globals, native=("decode_o_proj",))
        for name in outputs:
            if not torch.equal(out[name][r], want[name]):
                raise BackendError(f"upstream dspark {module}: {tp_function}'s rank {r} of {ranks} differs from "
                                   f"{tp1_function} over the same rows in {name}")


def _hca_stage_tensors(x_hc, attention, compressor, *, config, a5_tiling=True, own_cmp_page=False,
                       cmp_page_rows=1) -> tuple[dict, dict, dict]:
    """decode_attention_hca.py (Flash-MTP: decode_hca.py) ::golden_attention_hca's tensors, config constants and
    module globals for one decode batch: the SWA stage's tensors under the HCA golden's names (its window
    ``window_swa_indices``, its kv slots ``ori_slot_mapping``), the ratio-128 compressor's weights transposed as
    upstream stores them, each token's state slot worked out from the call's state table (upstream's metadata
    hands them over), the compressed table as wide as the entries are compiled (KV_CMP_MAX_BLOCKS).
    ``own_cmp_page``: the Flash compressed page (BLOCK_SIZE / ratio rows: ``cmp_page_rows`` at the tiny block of
    128, 1 for HCA), the call's pages laid out again in it (the same flat rows, so the compressed slots stay)."""
    from kernels.v4.compressor import _slot
    from kernels.v4.layer import check_hca_stage

    check_hca_stage(x_hc, attention, compressor, config=config)
    a, c = attention, compressor
    tokens, seq = x_hc.shape[0], config.decode_seq
    _check_swa_stage(a["position_ids"], a["freqs_cos"], a["kv_cache"], a["swa_slot_mapping"], tokens=tokens)
    swa, constants, module_globals = _swa_stage_tensors(
        a["hc_fn"], a["hc_scale"], a["hc_base"], a["attn_norm_w"], a["wq_a"], a["wq_b"], a["wq_b_scale"], a["wkv"],
        a["gamma_cq"], a["gamma_ckv"], a["freqs_cos"], a["freqs_sin"], a["kv_cache"], a["swa_slot_mapping"],
        a["window_indices"], a["position_ids"], a["attn_sink"], a["wo_a"], a["wo_b"], a["wo_b_scale"], config=config,
        a5_tiling=a5_tiling)
    pool, weights = c["state_pool"], c["weights"]
    pages, page, _ = pool.shape
    pos = a["position_ids"].reshape(-1).to(torch.int64)
    state_slots = torch.tensor([_slot(c["state_block_table"], t // seq, int(pos[t]), page, pages)
                                for t in range(tokens)], dtype=torch.int64)
    cmp_kv, table = a["cmp_kv"], a["cmp_block_table"].to(torch.int32)
    width = config.cmp_pool
    if own_cmp_page:
        cmp_kv, _, table = _repage(cmp_kv, None, table, max(1, config.block_size * cmp_page_rows // 128))
        width = table.shape[1]
    swa.update(x_hc=x_hc.float().clone(), window_swa_indices=swa.pop("swa_indices"),
               window_swa_lens=swa.pop("swa_lens"), ori_slot_mapping=swa.pop("swa_slot_mapping"),
               kv_seq_lens=c["kv_seq_lens"].to(torch.int32).clone(), cmp_kv=cmp_kv.clone(),
               cmp_block_table=torch.nn.functional.pad(table, (0, max(0, width - table.shape[1])), value=-1),
               compress_state=pool.clone(), compress_state_block_table=c["state_block_table"].to(torch.int32).clone(),
               cmp_wkv=_bf16_if_exact(weights.wkv.float().t()), cmp_wgate=_bf16_if_exact(weights.wgate.float().t()),
               cmp_ape=weights.ape.float().clone(), cmp_norm_w=_bf16_if_exact(weights.norm),
               cmp_slot_mapping=c["cmp_slot_mapping"].reshape(-1).to(torch.int64).clone(),
               state_slot_mapping=state_slots,
               x_out=torch.zeros(tokens, config.hc_mult, config.hidden_size, dtype=torch.float32))
    constants = {**constants, "C128_COMPRESSOR_BLOCK_SIZE": int(page)}
    return swa, constants, module_globals


def _csa_stage_tensors(x_hc, attention, compressor, indexer, *, config, index_key_rope, a5_tiling=True,
                       own_cmp_page=False) -> tuple[dict, dict, dict]:
    """decode_attention_csa.py (Flash-MTP: decode_csa.py) ::golden_attention_csa's tensors: the HCA stage's (the
    main compressor's under the same names) and the indexer's, its inner compressor's state slots worked out from
    the call's inner state table, the index table as wide as the index pool. ``own_cmp_page``: the Flash pages (32
    compressed rows and 32 index keys per page at the tiny block of 128), the call's laid out again."""
    from contracts.operators import Unsupported
    from kernels.v4.compressor import _slot
    from kernels.v4.layer import check_csa_stage

    check_csa_stage(x_hc, attention, compressor, indexer, config=config, index_key_rope=index_key_rope)
    if index_key_rope != "step":
        raise Unsupported("upstream's decode CSA stage rotates each index key at the decode step's first position "
                          f"(index_key_rope='step'); {index_key_rope!r} is not its rule")
    a, c, i = attention, compressor, indexer
    tensors, constants, module_globals = _hca_stage_tensors(x_hc, a, c, config=config, a5_tiling=a5_tiling,
                                                            own_cmp_page=own_cmp_page, cmp_page_rows=32)
    tokens, seq = x_hc.shape[0], config.decode_seq
    pool, weights = c["inner_state_pool"], c["inner_weights"]
    pages, page, _ = pool.shape
    pos = a["position_ids"].reshape(-1).to(torch.int64)
    inner_slots = torch.tensor([_slot(c["inner_state_block_table"], t // seq, int(pos[t]), page, pages)
                                for t in range(tokens)], dtype=torch.int64)
    idx_cache, idx_scale, idx_table = i["idx_kv_cache"], i["idx_kv_scale"].float(), i["idx_block_table"].to(torch.int32)
    width = config.idx_pool
    if own_cmp_page:
        idx_cache, idx_scale, idx_table = _repage(idx_cache, idx_scale, idx_table, max(1, config.block_size // 4))
        width = idx_table.shape[1]
        module_globals = {**module_globals, "decode_indexer.REDUCE_TILE": max(1, config.block_size // 4),
                          "decode_indexer.IDX_STORAGE_BLOCK_SIZE": max(1, config.block_size // 4)}
    tensors.update(
        idx_wq_b=i["wq_b"].clone(), idx_wq_b_scale=i["wq_b_scale"].float().clone(),
        weights_proj=i["weights_proj"].clone(), hadamard_idx=i["hadamard"].clone(),
        inner_wkv=_bf16_if_exact(weights.wkv.float().t()), inner_wgate=_bf16_if_exact(weights.wgate.float().t()),
        inner_ape=weights.ape.float().clone(), inner_norm_w=_bf16_if_exact(weights.norm),
        inner_compress_state=pool.clone(),
        inner_compress_state_block_table=c["inner_state_block_table"].to(torch.int32).clone(),
        idx_kv_cache=idx_cache.clone(), idx_kv_scale=idx_scale.clone(),
        idx_block_table=torch.nn.functional.pad(idx_table, (0, max(0, width - idx_table.shape[1])), value=-1),
        idx_slot_mapping=c["idx_slot_mapping"].reshape(-1).to(torch.int64).clone(), inner_state_slot_mapping=inner_slots)
    constants = {**constants, "C4A_COMPRESSOR_BLOCK_SIZE": int(c["state_pool"].shape[1])}
    constants.pop("C128_COMPRESSOR_BLOCK_SIZE", None)
    return tensors, constants, module_globals


def _v4_csa_stage(run, x_hc, attention, compressor, indexer, *, config, index_key_rope="step",
                  module="decode_attention_csa", a5_tiling=True, own_cmp_page=False):
    """v4_csa_stage -> decode_attention_csa.py (Flash-MTP: decode_csa.py) ::golden_attention_csa: hc_pre, RMSNorm,
    Q/KV, the ratio-4 main compressor writing the compressed cache, the indexer with its inner compressor writing
    the index cache then scoring it, the window-cache write, the CSA attention over the raw top-k, hc_post. Every
    cache and state from the golden (written in place); qr / qr_scale from the chain of goldens it runs."""
    tensors, constants, module_globals = _csa_stage_tensors(x_hc, attention, compressor, indexer, config=config,
                                                            index_key_rope=index_key_rope, a5_tiling=a5_tiling,
                                                            own_cmp_page=own_cmp_page)
    a = attention
    out = run(tensors, _variant_fields(config), constants, module=module, function="golden_attention_csa",
              module_globals=module_globals)
    qr, qr_scale = _chain_qr(run, x_hc, a, a["position_ids"].reshape(-1).to(torch.long), config=config,
                             constants=constants, a5_tiling=a5_tiling)
    i = indexer
    return {"x_out": out["x_out"], "kv_cache": out["kv_cache"], "qr": qr, "qr_scale": qr_scale,
            "cmp_kv": out["cmp_kv"].reshape(a["cmp_kv"].shape), "state_pool": out["compress_state"],
            "inner_state_pool": out["inner_compress_state"],
            "idx_kv_cache": out["idx_kv_cache"].reshape(i["idx_kv_cache"].shape),
            "idx_kv_scale": out["idx_kv_scale"].reshape(i["idx_kv_scale"].shape)}


def _prefill_stage_tensors(x_hc, attention, compressor, num_tokens, *, config, a5_tiling, ratio):
    """The tensors, constants and module globals every prefill compressed-stage golden (prefill_attention_{hca,csa}.py,
    Flash-MTP's prefill_{hca,csa}.py) takes: one request of T rows (B 1, S T), num_tokens real, the SWA stage's
    weights, the window's 1-D page table, the main compressor's state, weights (transposed as upstream stores them)
    and slots, the compressed cache and its 1-D table."""
    a, c = attention, compressor
    tokens, real = x_hc.shape[0], int(num_tokens)
    _check_swa_stage(a["position_ids"], a["freqs_cos"], a["kv_cache"], a["swa_slot_mapping"], tokens=tokens,
                     num_tokens=real)
    pos = a["position_ids"].reshape(-1).to(torch.int64).clone()
    pos[real:] = 0
    weights, pool = c["weights"], c["state_pool"]
    constants = {"PREFILL_BATCH": 1, "PREFILL_SEQ": tokens, "BLOCK_SIZE": int(a["kv_cache"].shape[1])}
    qkv_globals = _qkv_tiling(config) if a5_tiling else None
    tensors = {"x_hc": x_hc.float().clone(), "hc_attn_fn": a["hc_fn"].float().clone(),
               "hc_attn_scale": a["hc_scale"].float().clone(), "hc_attn_base": a["hc_base"].float().clone(),
               **{name: a[name].clone() for name in ("attn_norm_w", "wq_a", "wq_b", "wkv", "gamma_cq", "gamma_ckv",
                                                      "freqs_cos", "freqs_sin", "kv_cache", "wo_a", "wo_b")},
               "wq_b_scale": a["wq_b_scale"].float().clone(), "wo_b_scale": a["wo_b_scale"].float().clone(),
               "attn_sink": a["attn_sink"].float().clone(), "position_ids": pos.to(torch.int32), "num_tokens": real,
               "ori_slot_mapping": a["swa_slot_mapping"].reshape(-1).to(torch.int64).clone(),
               "ori_block_table": a["block_table"].reshape(-1).to(torch.int32).clone(),
               "compress_state": pool.clone(),
               "compress_state_block_table": c["state_block_table"].reshape(-1).to(torch.int32).clone(),
               "cmp_wkv": weights.wkv.float().t().contiguous(), "cmp_wgate": weights.wgate.float().t().contiguous(),
               "cmp_ape": weights.ape.float().clone(), "cmp_norm_w": weights.norm.clone(),
               "cmp_kv": a["cmp_kv"].clone(), "cmp_block_table": a["cmp_block_table"].reshape(-1).to(torch.int32).clone(),
               "cmp_slot_mapping": c["cmp_slot_mapping"].reshape(-1).to(torch.int64).clone(),
               "state_slot_mapping": c["state_slot_mapping"].reshape(-1).to(torch.int64).clone(),
               "x_out": torch.zeros(tokens, config.hc_mult, config.hidden_size, dtype=torch.float32)}
    module, page_name = PREFILL_COMPRESSOR[ratio][0], PREFILL_COMPRESSOR[ratio][2]
    module_globals = {**({f"qkv_proj_rope.{k}": v for k, v in qkv_globals.items()} if qkv_globals else {}),
                      "prefill_sparse_attn.T": tokens, f"{module}.T": tokens, page_name: int(pool.shape[1]),
                      f"{module}.{page_name}": int(pool.shape[1])}
    return tensors, constants, module_globals, pos


def _chain_qr(run, x_hc, attention, pos, *, config, constants, a5_tiling, real=None):
    """qr / qr_scale of a compressed stage golden (which computes and drops them), from the chain of goldens it runs
    (``_stage_qr``); a prefill chunk's (``real`` rows of it real): the Flash qkv golden takes no num_tokens, so
    there its padding rows are the adapter's zeros."""
    a = attention
    qr, qr_scale = _stage_qr(run, x_hc, a["hc_fn"], a["hc_scale"], a["hc_base"], a["attn_norm_w"], a["wq_a"],
                             a["wq_b"], a["wq_b_scale"], a["wkv"], a["gamma_cq"], a["gamma_ckv"], a["freqs_cos"][pos],
                             a["freqs_sin"][pos], config=config, fields=_variant_fields(config), constants=constants,
                             num_tokens=real, qkv_globals=_qkv_tiling(config) if a5_tiling else None)
    if real is not None and not a5_tiling:
        qr, qr_scale = qr.clone(), qr_scale.clone()
        qr[real:], qr_scale[real:] = 0, 0
    return qr, qr_scale


def _v4_prefill_hca_stage(run, x_hc, attention, compressor, num_tokens, *, config, module="prefill_attention_hca",
                          a5_tiling=True, module_pools=False, rows_from_x=False):
    """v4_prefill_hca_stage -> prefill_attention_hca.py (Flash-MTP: prefill_hca.py) ::golden_prefill_attention_hca:
    one request of T rows (B 1, S T), num_tokens real: hc_pre, RMSNorm, Q/KV, the window-cache write, the ratio-128
    prefill compressor publishing into the compressed cache, the window lowered from the 1-D page table, HCA's
    top-k (the first min((pos + 1) // 128, index_topk) compressed positions), the prefill sparse attention, the
    prefill hc_post. x_out and the caches from the golden; qr / qr_scale from the chain of goldens it runs.
    ``module_pools``: Flash-MTP views its pools by module-level sizes, its compressed cache in pages of one row.
    ``rows_from_x``: dspark's golden takes the chunk's rows from x_hc (no num_tokens, no module-level T): only the
    real rows are handed over, and the padding rows' x_out, qr and qr_scale are the adapter's zeros."""
    from kernels.v4.layer import check_prefill_hca_stage

    check_prefill_hca_stage(x_hc, attention, compressor, num_tokens)
    a, real = attention, int(num_tokens)
    if not module_pools and int(a["cmp_kv"].shape[1]) != int(a["kv_cache"].shape[1]):
        from contracts.operators import Unsupported

        raise Unsupported(f"this folder's prefill HCA golden pages its compressed cache by the block size "
                          f"({int(a['kv_cache'].shape[1])} rows); the call's page is {int(a['cmp_kv'].shape[1])}")
    tensors, constants, module_globals, pos = _prefill_stage_tensors(x_hc, a, compressor, real, config=config,
                                                                     a5_tiling=a5_tiling, ratio=128)
    if rows_from_x:
        for name in ("x_hc", "position_ids", "ori_slot_mapping", "cmp_slot_mapping", "state_slot_mapping", "x_out"):
            tensors[name] = tensors[name][:real].clone()
        del tensors["num_tokens"]
        pools = {"HCA_STATE_BLOCK_NUM": int(compressor["state_pool"].shape[0]),
                 "HCA_CMP_BLOCK_NUM": int(a["cmp_kv"].shape[0])}  # its pools by module-level sizes, V4-Pro's page
        module_globals = {**{k: v for k, v in module_globals.items() if not k.endswith(".T")},
                          "HCA_ORI_BLOCK_NUM": int(a["kv_cache"].shape[0]), **pools,
                          **{f"prefill_compressor_ratio128.{k}": v for k, v in pools.items()}}
    if module_pools:
        page = max(1, config.block_size // 128)
        cmp_kv, _, table = _repage(a["cmp_kv"], None, a["cmp_block_table"].reshape(1, -1).to(torch.int32), page)
        tensors.update(cmp_kv=cmp_kv.clone(), cmp_block_table=table.reshape(-1).contiguous())
        pools = {"HCA_STATE_BLOCK_NUM": int(compressor["state_pool"].shape[0]), "HCA_CMP_BLOCK_NUM": int(cmp_kv.shape[0]),
                 "CMP_STORAGE_BLOCK_SIZE": page}
        module_globals.update({"HCA_ORI_BLOCK_NUM": int(a["kv_cache"].shape[0]), **pools,
                               **{f"prefill_compressor_ratio128.{k}": v for k, v in pools.items()}})
    out = run(tensors, _variant_fields(config), constants, module=module, function="golden_prefill_attention_hca",
              module_globals=module_globals)
    qr, qr_scale = _chain_qr(run, x_hc, a, pos, real=real, config=config, constants=constants, a5_tiling=a5_tiling)
    x_out = out["x_out"]
    if rows_from_x:
        x_out = torch.cat((x_out, torch.zeros(x_hc.shape[0] - real, *x_out.shape[1:], dtype=x_out.dtype)))
    return {"x_out": x_out, "kv_cache": out["kv_cache"], "qr": qr, "qr_scale": qr_scale,
            "cmp_kv": out["cmp_kv"].reshape(a["cmp_kv"].shape), "state_pool": out["compress_state"]}


def _v4_prefill_csa_stage(run, x_hc, attention, compressor, indexer, num_tokens, *, config,
                          module="prefill_attention_csa", a5_tiling=True, flash_pages=False, rows_from_x=False,
                          query_staging="bf16"):
    """v4_prefill_csa_stage -> prefill_attention_csa.py (Flash-MTP: prefill_csa.py) ::golden_prefill_attention_csa:
    as the HCA prefill stage with the ratio-4 prefill compressor, the indexer's compressor publishing the index
    keys and its scoring (prefill_indexer.py::golden_prefill_indexer_core), the attention over the raw picks.
    Every cache and state from the golden; qr / qr_scale from the chain of goldens it runs. ``flash_pages``: Flash-MTP
    pages its compressed and index caches by the 32 rows of one 128-token block and views its pools by module-level
    sizes (the call's laid out again, the same flat rows); its golden checks its indexer's picks as if every visible
    compressed position were picked (each row's first min((pos + 1) // 4, INDEXER_TOPK_CAP) picks inside
    [0, that count)), which holds only while (pos + 1) // 4 <= INDEXER_TOPK_CAP: a call past it is unsupported.
    ``rows_from_x``: dspark's golden (V4-Pro's pages, the same check of its picks) sizes the chunk by x_hc's rows:
    only the real rows are handed over, and the padding rows' x_out is the adapter's zeros."""
    if query_staging != "bf16":
        from contracts.operators import Unsupported

        raise Unsupported(f"this golden rounds its whole index query to BF16 before the Hadamard; "
                          f"query_staging={query_staging!r} is another named rule (disagreement 25)")
    from kernels.v4.layer import check_prefill_csa_stage
    from kernels.v4.prefill_indexer import score_cap

    check_prefill_csa_stage(x_hc, attention, compressor, indexer, num_tokens)
    a, c, i, real = attention, compressor, indexer, int(num_tokens)
    tokens = x_hc.shape[0]
    tensors, constants, module_globals, pos = _prefill_stage_tensors(x_hc, a, c, real, config=config,
                                                                     a5_tiling=a5_tiling, ratio=4)
    inner = c["inner_weights"]
    idx_cache, idx_scale, idx_table = i["idx_kv_cache"], i["idx_kv_scale"].float(), i["idx_block_table"].to(torch.int32)
    cap, writes = score_cap(config), max(1, tokens // 4)
    if flash_pages or rows_from_x:
        from contracts.operators import Unsupported

        topk_cap = min(config.index_topk, cap)
        if real and int(((pos[:real] + 1) // 4).max()) > topk_cap:
            raise Unsupported(f"the Flash folders' prefill CSA goldens check their indexer's picks as if every visible "
                              f"compressed position were picked: a row more than {topk_cap} compressed positions in "
                              "fails its own check (docs/upstream.md)")
    if flash_pages:
        page = max(1, config.block_size // 4)
        cmp_kv, _, table = _repage(a["cmp_kv"], None, a["cmp_block_table"].reshape(1, -1).to(torch.int32), page)
        idx_cache, idx_scale, idx_table = _repage(idx_cache, idx_scale, idx_table.reshape(1, -1), page)
        idx_table = idx_table.reshape(-1)
        tensors.update(cmp_kv=cmp_kv.clone(), cmp_block_table=table.reshape(-1).contiguous())
        module_globals.update({"CSA_ORI_BLOCK_NUM": int(a["kv_cache"].shape[0]), "CSA_CMP_BLOCK_NUM": int(cmp_kv.shape[0]),
                               "CMP_STORAGE_BLOCK_SIZE": page,
                               "prefill_compressor_ratio4.CSA_STATE_BLOCK_NUM": int(c["state_pool"].shape[0]),
                               "prefill_compressor_ratio4.CMP_STORAGE_BLOCK_SIZE": page,
                               "prefill_indexer.CACHE_TILE": page, "prefill_indexer.IDX_STORAGE_BLOCK_SIZE": page,
                               "prefill_indexer.PREFILL_IDX_BLOCK_NUM": int(idx_cache.shape[0]),
                               "prefill_indexer_compressor.INNER_STATE_BLOCK_NUM": int(c["inner_state_pool"].shape[0]),
                               "prefill_indexer_compressor.IDX_STORAGE_BLOCK_SIZE": page})
    tensors.update(
        idx_wq_b=i["wq_b"].clone(), idx_wq_b_scale=i["wq_b_scale"].float().clone(),
        idx_weights_proj=i["weights_proj"].clone(), hadamard_idx=i["hadamard"].clone(),
        inner_compress_state=c["inner_state_pool"].clone(),
        inner_compress_state_block_table=c["inner_state_block_table"].reshape(-1).to(torch.int32).clone(),
        inner_wkv=inner.wkv.float().t().contiguous(), inner_wgate=inner.wgate.float().t().contiguous(),
        inner_ape=inner.ape.float().clone(), inner_norm_w=inner.norm.clone(),
        idx_kv_cache=idx_cache.clone(), idx_kv_scale=idx_scale.clone(),
        idx_block_table=torch.nn.functional.pad(idx_table, (0, max(0, config.idx_pool - idx_table.shape[0])), value=-1),
        idx_slot_mapping=c["idx_slot_mapping"].reshape(-1).to(torch.int64).clone(),
        inner_state_slot_mapping=c["inner_state_slot_mapping"].reshape(-1).to(torch.int64).clone())
    module_globals.update({"prefill_indexer.T": tokens, "prefill_indexer.MAX_CMP_WRITES": writes,
                           "prefill_indexer.INDEXER_SCORE_CAP": cap,
                           "prefill_indexer.INDEXER_TOPK_CAP": min(config.index_topk, cap),
                           "prefill_indexer_compressor.T": tokens, "prefill_indexer_compressor.MAX_CMP_WRITES": writes})
    if rows_from_x:
        for name in ("x_hc", "position_ids", "ori_slot_mapping", "cmp_slot_mapping", "state_slot_mapping",
                     "idx_slot_mapping", "inner_state_slot_mapping", "x_out"):
            tensors[name] = tensors[name][:real].clone()
        del tensors["num_tokens"]
        page = int(c["inner_state_pool"].shape[1])
        module_globals = {"CSA_ORI_BLOCK_NUM": int(a["kv_cache"].shape[0]),
                          "prefill_indexer.INDEXER_SCORE_CAP": cap,
                          "prefill_indexer.INDEXER_TOPK_CAP": min(config.index_topk, cap),
                          "prefill_indexer.IDX_CACHE_BLOCK_NUM": int(idx_cache.shape[0]),
                          "prefill_indexer_compressor.INNER_STATE_BLOCK_SIZE": page,
                          "prefill_compressor_ratio4.CSA_STATE_BLOCK_SIZE": int(c["state_pool"].shape[1]),
                          "prefill_compressor_ratio4.CSA_STATE_BLOCK_NUM": int(c["state_pool"].shape[0])}
    out = run(tensors, _variant_fields(config), constants, module=module, function="golden_prefill_attention_csa",
              module_globals=module_globals)
    qr, qr_scale = _chain_qr(run, x_hc, a, pos, real=real, config=config, constants=constants, a5_tiling=a5_tiling)
    if rows_from_x:
        out["x_out"] = torch.cat((out["x_out"], torch.zeros(tokens - real, *out["x_out"].shape[1:])))
    return {"x_out": out["x_out"], "kv_cache": out["kv_cache"], "qr": qr, "qr_scale": qr_scale,
            "cmp_kv": out["cmp_kv"].reshape(a["cmp_kv"].shape), "state_pool": out["compress_state"],
            "inner_state_pool": out["inner_compress_state"],
            "idx_kv_cache": out["idx_kv_cache"].reshape(i["idx_kv_cache"].shape),
            "idx_kv_scale": out["idx_kv_scale"].reshape(i["idx_kv_scale"].shape)}


def _check_hca_limit(given: str, folder_rule: str) -> None:
    from contracts.operators import Unsupported
    from kernels.errors import ContractInputError
    from kernels.v4.layer import HCA_TOPK_LIMITS, SPEC

    if given not in HCA_TOPK_LIMITS:
        raise ContractInputError("hca_topk_limit", None, f"one of {HCA_TOPK_LIMITS}", repr(given), SPEC)
    if given != folder_rule:
        raise Unsupported(f"this folder's HCA decode stage limits its top-k by the {folder_rule!r} rule; "
                          f"hca_topk_limit={given!r} is another folder's")


def _v4_hca_stage(run, x_hc, attention, compressor, *, config, module="decode_attention_hca", a5_tiling=True,
                  own_cmp_page=False, hca_topk_limit="index_topk", folder_rule="index_topk"):
    """v4_hca_stage -> decode_attention_hca.py (Flash-MTP: decode_hca.py) ::golden_attention_hca: hc_pre,
    RMSNorm, Q/KV, the ratio-128 compressor writing the compressed cache and its state, the window-cache write,
    HCA's deterministic top-k, the HCA attention with its projection, hc_post. x_out and the three caches from the
    golden (written in place); qr / qr_scale, which it computes and drops, from the chain of goldens it runs."""
    tensors, constants, module_globals = _hca_stage_tensors(x_hc, attention, compressor, config=config,
                                                            a5_tiling=a5_tiling, own_cmp_page=own_cmp_page)
    _check_hca_limit(hca_topk_limit, folder_rule)
    a = attention
    out = run(tensors, _variant_fields(config), constants, module=module, function="golden_attention_hca",
              module_globals=module_globals)
    qr, qr_scale = _chain_qr(run, x_hc, a, a["position_ids"].reshape(-1).to(torch.long), config=config,
                             constants=constants, a5_tiling=a5_tiling)
    return {"x_out": out["x_out"], "kv_cache": out["kv_cache"], "qr": qr, "qr_scale": qr_scale,
            "cmp_kv": out["cmp_kv"].reshape(a["cmp_kv"].shape), "state_pool": out["compress_state"]}


# the decode stage goldens' per-token and per-request tensors (what dspark's TP goldens deal to each rank, and
# what the rank checks reorder)
_TOKEN_ROWS = ("x_hc", "freqs_cos", "freqs_sin", "swa_slot_mapping", "swa_indices", "swa_lens", "position_ids",
                      "x_out", "ori_slot_mapping", "window_swa_indices", "cmp_slot_mapping", "state_slot_mapping",
                      "idx_slot_mapping", "inner_state_slot_mapping")
_REQUEST_ROWS = ("cmp_freqs_cos", "cmp_freqs_sin", "kv_seq_lens", "compress_state_block_table",
                        "cmp_block_table", "inner_compress_state_block_table", "idx_block_table")


def _dspark_stage_tensors(tensors: dict, a: dict, *, config, ratio: int) -> dict:
    """dspark's decode stage goldens' layout of a V4-Pro stage golden's tensors: the RoPE rows token-local (the
    table read at each row's position), the compressor's rows of each request's first window start
    (``cmp_freqs_cos`` [B, rope / 2] FP32, as Flash-MTP's golden reads them from the table itself), no window
    lengths (its attention reads the window's columns as given)."""
    pos = a["position_ids"].reshape(-1).to(torch.long)
    half = config.qk_rope_head_dim // 2
    first = pos[::config.decode_seq]
    start = first - first % ratio
    tensors = dict(tensors)
    tensors.pop("window_swa_lens", None)
    tensors.update(freqs_cos=a["freqs_cos"][pos].clone(), freqs_sin=a["freqs_sin"][pos].clone(),
                   cmp_freqs_cos=a["freqs_cos"][start, :half].float().clone(),
                   cmp_freqs_sin=a["freqs_sin"][start, :half].float().clone())
    return tensors


def _dspark_o_proj_globals(config, tokens: int, attention_module: str) -> dict:
    """The module globals dspark's decode stage goldens need at the call's width: its packed heads' row padding
    (``T_PAD``, the rows' 16-row ceiling) on the stage's module, its sparse attention's and ``decode_o_proj.py``'s
    (imported at dspark's own geometry: ``native``), the latter's widths the call's."""
    groups, pad = config.o_groups, -(-tokens // 16) * 16
    heads_in = config.num_attention_heads // groups * config.head_dim
    return {"T_PAD": pad, f"{attention_module}.T": tokens, f"{attention_module}.T_PAD": pad,
            **{f"decode_o_proj.{k}": v for k, v in _o_proj_widths(config, T_PAD=pad, O_GROUPS=groups,
                                                                  O_GROUP_IN=heads_in).items()}}


def _dspark_hca_stage(run, x_hc, attention, compressor, *, config, hca_topk_limit="all"):
    """v4_hca_stage -> dspark's decode_hca.py::golden_decode_hca_tp1: V4-Pro's stage tensors (its pages) in dspark's
    layout (``_dspark_stage_tensors``), the compressor token-major, the attention's packed heads through its TP1
    output projection (``_dspark_o_proj_globals``). Its attention attends every compressed position the request
    holds (min((pos + 1) // 128, kv_len // 128), no index_topk limit): the rule "all". A call of whole requests in
    two equal parts also runs its TP golden (``golden_decode_hca``), judged against the TP1 one."""
    from contracts.operators import Unsupported

    _check_hca_limit(hca_topk_limit, "all")
    a = attention
    tensors, constants, module_globals = _hca_stage_tensors(x_hc, attention, compressor, config=config,
                                                            a5_tiling=False)
    if int(a["position_ids"].max()) >= config.max_position_embeddings:  # after the caller's side is checked
        raise Unsupported(f"dspark's HCA attention golden caps the compressed positions at the model's capacity "
                          f"(max_position_embeddings {config.max_position_embeddings} // 128): a position past it "
                          "is outside its domain")
    tensors = _dspark_stage_tensors(tensors, a, config=config, ratio=128)
    # its token capacity is checked against decode_o_proj's at import: the decode batch stays dspark's own, the rows
    # per request (S) the call's
    constants = {k: v for k, v in constants.items() if k not in ("DECODE_BATCH", "DECODE_SEQ")}
    module_globals = {**_dspark_o_proj_globals(config, x_hc.shape[0], "decode_sparse_attn_hca"),
                      "decode_sparse_attn_hca.ORI_BLOCK_NUM": int(a["kv_cache"].shape[0]),
                      **{f"{m}S": config.decode_seq for m in ("", "decode_sparse_attn_hca.", "decode_compressor_ratio128.")}}
    fields = _variant_fields(config)
    out = run(tensors, fields, constants, module="decode_attention_hca", function="golden_decode_hca_tp1",
              module_globals=module_globals, native=("decode_o_proj",))
    if x_hc.shape[0] % (2 * config.decode_seq) == 0:  # the TP golden on two ranks, judged against the TP1 one
        _dspark_tp_judged(run, tensors, module="decode_attention_hca", tp_function="golden_decode_hca",
                          tp1_function="golden_decode_hca_tp1", per_token=_TOKEN_ROWS,
                          per_request=_REQUEST_ROWS, outputs=("x_out", "kv_cache", "cmp_kv", "compress_state"),
                          seq=config.decode_seq, fields=fields, constants=constants, module_globals=module_globals)
    qr, qr_scale = _chain_qr(run, x_hc, a, a["position_ids"].reshape(-1).to(torch.long), config=config,
                             constants=constants, a5_tiling=False)
    return {"x_out": out["x_out"], "kv_cache": out["kv_cache"], "qr": qr, "qr_scale": qr_scale,
            "cmp_kv": out["cmp_kv"].reshape(a["cmp_kv"].shape), "state_pool": out["compress_state"]}


def _dspark_csa_stage(run, x_hc, attention, compressor, indexer, *, config, index_key_rope="step"):
    """v4_csa_stage -> dspark's decode_csa.py::golden_decode_csa_tp1: V4-Pro's stage tensors (its pages, one
    BLOCK_SIZE for both caches) without the window lengths, the RoPE tables whole (it reads each row's, the step's
    and the compressor's rows itself, as Flash-MTP's), the call's rows per request (``S``) on the stage, its
    compressor, indexer and attention, its attention's packed heads through its TP1 output projection
    (``_dspark_o_proj_globals``). A call of whole requests in two equal parts also runs its TP golden
    (``golden_decode_csa``), judged against the TP1 one."""
    tensors, constants, module_globals = _csa_stage_tensors(x_hc, attention, compressor, indexer, config=config,
                                                            index_key_rope=index_key_rope, a5_tiling=False)
    a, i, seq = attention, indexer, config.decode_seq
    tensors.pop("window_swa_lens")
    constants = {k: v for k, v in constants.items() if k not in ("DECODE_BATCH", "DECODE_SEQ")}
    module_globals = {**module_globals, **_dspark_o_proj_globals(config, x_hc.shape[0], "decode_sparse_attn_csa"),
                      "decode_sparse_attn_csa.ORI_BLOCK_NUM": int(a["kv_cache"].shape[0]),
                      **{f"{m}S": seq for m in ("", "decode_sparse_attn_csa.", "decode_compressor_ratio4.",
                                                "decode_indexer.", "decode_indexer_compressor.")}}
    fields = _variant_fields(config)
    out = run(tensors, fields, constants, module="decode_attention_csa", function="golden_decode_csa_tp1",
              module_globals=module_globals, native=("decode_o_proj",))
    if x_hc.shape[0] % (2 * seq) == 0:
        _dspark_tp_judged(run, tensors, module="decode_attention_csa", tp_function="golden_decode_csa",
                          tp1_function="golden_decode_csa_tp1",
                          per_token=tuple(n for n in _TOKEN_ROWS if n not in ("freqs_cos", "freqs_sin")),
                          per_request=_REQUEST_ROWS,
                          outputs=("x_out", "kv_cache", "cmp_kv", "compress_state", "inner_compress_state",
                                   "idx_kv_cache", "idx_kv_scale"),
                          seq=seq, fields=fields, constants=constants, module_globals=module_globals)
    qr, qr_scale = _chain_qr(run, x_hc, a, a["position_ids"].reshape(-1).to(torch.long), config=config,
                             constants=constants, a5_tiling=False)
    return {"x_out": out["x_out"], "kv_cache": out["kv_cache"], "qr": qr, "qr_scale": qr_scale,
            "cmp_kv": out["cmp_kv"].reshape(a["cmp_kv"].shape), "state_pool": out["compress_state"],
            "inner_state_pool": out["inner_compress_state"],
            "idx_kv_cache": out["idx_kv_cache"].reshape(i["idx_kv_cache"].shape),
            "idx_kv_scale": out["idx_kv_scale"].reshape(i["idx_kv_scale"].shape)}


LAYER_GOLDENS = {"SWA": "golden_decode_layer_swa", "HCA": "golden_decode_layer_hca", "CSA": "golden_decode_layer_csa"}
FLASH_LAYER_GOLDENS = {**LAYER_GOLDENS, "SWA": "golden_decode_layer"}
AUTO_RATIOS = {"SWA": 0, "HCA": 128, "CSA": 4}  # the compress ratio golden_decode_layer_auto dispatches to each path
_AUTO_MAIN = ("cmp_wkv", "cmp_wgate", "cmp_ape", "cmp_norm_w", "compress_state", "compress_state_block_table",
              "cmp_slot_mapping", "state_slot_mapping")
# the tensors golden_decode_layer_auto hands a path under its prefix (Flash-MTP's cmp_kv too)
AUTO_NAMES = {"HCA": _AUTO_MAIN, "CSA": (*_AUTO_MAIN, "idx_wq_b", "idx_wq_b_scale", "weights_proj", "hadamard_idx",
                                         "inner_wkv", "inner_wgate", "inner_ape", "inner_norm_w", "inner_compress_state",
                                         "inner_compress_state_block_table", "idx_slot_mapping",
                                         "inner_state_slot_mapping")}


def _flash_layer_names(stage: dict, path: str, tokens: int) -> dict:
    """The names Flash-MTP's decode_layer.py goldens read beside the stage's: HCA's table as
    ``hca_cmp_block_table``; on SWA the other paths' metadata, which its SWA stage golden is handed and never
    reads (placeholders: the window again, one empty compressed page)."""
    if path != "SWA":
        return {f"{path.lower()}_cmp_block_table": stage["cmp_block_table"]}
    kv = stage["kv_cache"]
    return {"block_table": torch.zeros(tokens, 1, dtype=torch.int32), "ori_slot_mapping": stage["swa_slot_mapping"],
            "window_swa_indices": stage["swa_indices"], "window_swa_lens": stage["swa_lens"],
            "cmp_kv": torch.zeros(1, kv.shape[1], 1, kv.shape[-1], dtype=kv.dtype),
            "csa_cmp_block_table": torch.zeros(tokens, 1, dtype=torch.int32)}


def _v4_decode_layer(run, path, x_hc, attention, moe, compressor=None, indexer=None, *, config, goldens=None,
                     a5_tiling=True, own_cmp_page=False, hca_topk_limit="index_topk", folder_rule="index_topk"):
    """v4_decode_layer -> decode_layer.py::golden_decode_layer_{swa,hca} (Flash-MTP: golden_decode_layer for SWA):
    the attention stage golden on each of the MoE's EP 2 ranks, rank 0 given this call's inputs and rank 1 its
    requests in reverse order (which must give rank 0's rows and caches byte for byte), then moe.py's golden on their
    streams with num_tokens = T: rank 0's x_next and caches (written in place). When the call's layer_id
    has the path's compress ratio in the model's config (0 SWA, 128 HCA), golden_decode_layer_auto instead, which
    picks the path from layer_id itself (so its dispatch is judged too)."""
    from kernels.errors import ContractInputError
    from kernels.v4.layer import SPEC, _check_parts

    _check_parts(attention, compressor, path, indexer)
    if "x_hc" in moe or "num_tokens" in moe:
        raise ContractInputError("moe", None, "the MoE stage's arguments without x_hc and num_tokens",
                                 sorted(set(moe) & {"x_hc", "num_tokens"}), SPEC)
    tokens = x_hc.shape[0]
    check_v4_moe_stage(x_hc, **moe, num_tokens=tokens, config=config)
    a = attention
    if path == "CSA":
        stage, constants, module_globals = _csa_stage_tensors(x_hc, a, compressor, indexer, config=config,
                                                              index_key_rope="step", a5_tiling=a5_tiling,
                                                              own_cmp_page=own_cmp_page)
    elif path == "HCA":
        _check_hca_limit(hca_topk_limit, folder_rule)
        stage, constants, module_globals = _hca_stage_tensors(x_hc, a, compressor, config=config, a5_tiling=a5_tiling,
                                                              own_cmp_page=own_cmp_page)
    else:
        _check_swa_stage(a["position_ids"], a["freqs_cos"], a["kv_cache"], a["swa_slot_mapping"], tokens=tokens)
        stage, constants, module_globals = _swa_stage_tensors(
            a["hc_fn"], a["hc_scale"], a["hc_base"], a["attn_norm_w"], a["wq_a"], a["wq_b"], a["wq_b_scale"],
            a["wkv"], a["gamma_cq"], a["gamma_ckv"], a["freqs_cos"], a["freqs_sin"], a["kv_cache"],
            a["swa_slot_mapping"], a["window_indices"], a["position_ids"], a["attn_sink"], a["wo_a"], a["wo_b"],
            a["wo_b_scale"], config=config, a5_tiling=a5_tiling)
        stage["x_hc"] = x_hc.float().clone()
    stage.pop("x_out", None)
    if own_cmp_page:  # Flash-MTP's layer goldens hand every path's metadata by its own names (read or not)
        stage.update(_flash_layer_names(stage, path, tokens))
    tensors, fields = _moe_tensors(moe["hc_fn"], moe["hc_scale"], moe["hc_base"], moe["norm_w"], moe["gate_w"],
                                   moe["gate_bias"], moe["tid2eid"], moe["input_ids"], moe["routed"], moe["shared"],
                                   config=config)
    # a layer whose compress ratio is the call's path goes through golden_decode_layer_auto, which dispatches by
    # layer_id and hands HCA's compressor its tensors under hca_ names (Flash-MTP's cmp_kv too)
    auto = AUTO_RATIOS[path] == config.compress_ratios[int(moe["layer_id"])]
    prefix = {name: f"{path.lower()}_{name}" if auto and path != "SWA" and (
        name in AUTO_NAMES[path] or (own_cmp_page and name == "cmp_kv")) else name for name in stage}
    tensors.update({prefix[name]: _both(value) for name, value in stage.items()})
    tensors.update(x_next=torch.zeros(MOE_RANKS, *x_hc.shape), layer_id=int(moe["layer_id"]), num_tokens=tokens)
    # rank 1: the call's requests in reverse order (each row with its own slots, positions and id, each request with
    # its own tables and kv length); its x_next and caches must be rank 0's
    seq = config.decode_seq
    requests = torch.arange(tokens // seq).flip(0)
    order = (requests[:, None] * seq + torch.arange(seq)).reshape(-1)
    per_token = {prefix.get(n, n) for n in (*_TOKEN_ROWS, "input_ids")} - {"freqs_cos", "freqs_sin"}
    per_request = {prefix.get(n, n) for n in _REQUEST_ROWS} | {"hca_cmp_block_table", "csa_cmp_block_table"}
    back = _rank1_reordered(tensors, sorted(n for n in per_token if n in tensors and
                                            tensors[n].shape[1:2] == (tokens,)), order)
    _rank1_reordered(tensors, sorted(n for n in per_request if n in tensors and
                                     tensors[n].shape[1:2] == (tokens // seq,)), requests)
    out = run(tensors, fields, {**constants, "MOE_TOKENS": tokens}, module="decode_layer",
              function="golden_decode_layer_auto" if auto else (goldens or LAYER_GOLDENS)[path],
              module_globals=module_globals)
    caches = [n for n in ("kv_cache", prefix.get("cmp_kv", "cmp_kv"), prefix.get("compress_state", "compress_state"),
                          prefix.get("inner_compress_state", "inner_compress_state"), "idx_kv_cache", "idx_kv_scale")
              if n in out and isinstance(out[n], torch.Tensor) and out[n].ndim > 1]
    _ranks_agree(out, ("x_next",), back, "decode_layer.py", unordered=tuple(dict.fromkeys(caches)))
    kept = {"kv_cache": out["kv_cache"][0]}
    if path != "SWA":
        kept.update(cmp_kv=out[prefix["cmp_kv"]][0].reshape(a["cmp_kv"].shape),
                    state_pool=out[prefix["compress_state"]][0])
    if path == "CSA":
        kept.update(inner_state_pool=out[prefix["inner_compress_state"]][0],
                    idx_kv_cache=out["idx_kv_cache"][0].reshape(indexer["idx_kv_cache"].shape),
                    idx_kv_scale=out["idx_kv_scale"][0].reshape(indexer["idx_kv_scale"].shape))
    return {"x_out": out["x_next"][0], **kept}


def _repage(cache: torch.Tensor, scale: torch.Tensor | None, table: torch.Tensor, page: int):
    """A paged cache (and its per-row scales, or None) of pages of P rows laid out again in pages of ``page`` rows
    (P a multiple of it): physical page q becomes pages q * P / page .., the table spelled out per new page (-1
    stays)."""
    old = int(cache.shape[1])
    k = old // page
    cols = torch.arange(table.shape[1] * k)
    phys = table[:, cols // k].to(torch.int64)
    new_table = torch.where(phys >= 0, phys * k + cols % k, -1).to(torch.int32)
    return (cache.reshape(-1, page, *cache.shape[2:]).contiguous(),
            None if scale is None else scale.reshape(-1, page, *scale.shape[2:]).contiguous(), new_table)


def _v4_indexer(run, x, qr, qr_scale, wq_b, wq_b_scale, weights_proj, cos, sin, hadamard, idx_kv_cache, idx_kv_scale,
                idx_block_table, position_ids, kv_seq_lens, *, offset, config, flash_pages=False, flat_tokens=False):
    """v4_indexer -> decode_indexer.py::golden_indexer on B = T / decode_seq requests of decode_seq rows. That
    golden first runs the indexer's inner compressor (decode_indexer_compressor.py), which would publish a closing
    window's key into the index cache; this operator is the indexer after that publication, so the inner
    compressor is given no slot to write (state and index slot mappings -1, an unmapped state table) and the call's
    cache is scored as it is. SCORE_LEN is the call's score width (kernel_max_seq_len / 4). The state pool, the
    state table and the index table are laid out as wide as the kernel entry is compiled (unread pages -1).
    ``flash_pages``: the index cache is paged by the keys of one 128-token block (BLOCK_SIZE / 4, the Flash folders'
    REDUCE_TILE), so the call's pages are laid out again at that page; ``flat_tokens``: x, positions, slot
    mappings and outputs are token-major ([T, ...], dspark's layout)."""
    from kernels.v4.indexer import (
        check_index_cache,
        head_weights,
        score_len,
        v4_indexer_query,
        visible_lengths,
        visible_pages,
    )

    seq = config.decode_seq
    head_weights(x, weights_proj, config=config)  # the caller's side (these raise on a bad call)
    v4_indexer_query(qr, qr_scale, wq_b, wq_b_scale, cos, sin, hadamard, config=config)
    check_index_cache(idx_kv_cache, idx_kv_scale, config=config)
    width = score_len(config)
    visible = visible_lengths(position_ids, kv_seq_lens, seq=seq, limit=width)
    for t in range(x.shape[0]):
        if int(visible[t]):
            visible_pages(idx_block_table[t // seq], (t // seq,), int(visible[t]), block_size=config.block_size)
    tokens, d = x.shape
    b = tokens // seq
    inner = config.index_head_dim
    # the inner compressor's state as indexer_test is compiled (its pool, a page per 4 positions up to the kernel's
    # sequence length), every page unmapped; the index table as wide as the index pool (unread columns -1)
    page = config.c4a_state_block_size
    state_cols = max(config.kernel_max_seq_len // page, int(position_ids.max()) // page + 2)
    tensors = {"x": x.reshape(b, seq, d).clone(), "qr": qr.clone(), "qr_scale": qr_scale.float().clone(),
               "wq_b": wq_b.clone(), "wq_b_scale": wq_b_scale.float().clone(), "weights_proj": weights_proj.clone(),
               "cos": cos.float().clone(), "sin": sin.float().clone(), "hadamard": hadamard.clone(),
               "inner_kv": torch.zeros(b, seq, inner),
               "inner_compress_state": torch.zeros(config.csa_inner_state_pool, page, 4 * inner),
               "inner_compress_state_block_table": torch.full((b, state_cols), -1, dtype=torch.int32),  # unmapped
               "inner_wkv": torch.zeros(2 * inner, d, dtype=torch.bfloat16),
               "inner_wgate": torch.zeros(2 * inner, d, dtype=torch.bfloat16),
               "inner_ape": torch.zeros(4, 2 * inner), "inner_norm_w": torch.ones(inner, dtype=torch.bfloat16),
               "idx_kv_cache": idx_kv_cache.clone(), "idx_kv_scale": idx_kv_scale.float().clone(),
               "idx_block_table": torch.nn.functional.pad(idx_block_table.to(torch.int32),
                                                          (0, max(0, config.idx_pool - idx_block_table.shape[1])),
                                                          value=-1),
               "position_ids": position_ids.reshape(b, seq).to(torch.int32).clone(),
               "idx_slot_mapping": torch.full((b, seq), -1, dtype=torch.int64),
               "inner_state_slot_mapping": torch.full((b, seq), -1, dtype=torch.int64),
               "kv_seq_lens": kv_seq_lens.to(torch.int32).clone(), "offset": int(offset),
               "score": torch.zeros(b, seq, width), "topk_idxs": torch.zeros(b, seq, width, dtype=torch.int32)}
    module_globals = {"SCORE_LEN": width}
    if flat_tokens:
        tensors.update(x=x.clone(), inner_kv=torch.zeros(tokens, inner),
                       position_ids=position_ids.to(torch.int32).clone(),
                       idx_slot_mapping=torch.full((tokens,), -1, dtype=torch.int64),
                       inner_state_slot_mapping=torch.full((tokens,), -1, dtype=torch.int64),
                       score=torch.zeros(tokens, width), topk_idxs=torch.zeros(tokens, width, dtype=torch.int32))
        module_globals["D"] = d
        # dspark's inner compressor pages its state by 2 positions: a table of that many pages (unmapped)
        tensors["inner_compress_state_block_table"] = torch.full(
            (b, max(config.kernel_max_seq_len // 2, int(position_ids.max()) // 2 + 2)), -1, dtype=torch.int32)
    if flash_pages:
        page = max(1, int(idx_kv_cache.shape[1]) // 4)
        cache, scale, table = _repage(tensors["idx_kv_cache"], tensors["idx_kv_scale"], tensors["idx_block_table"],
                                      page)
        # the table as wide as the score row's pages (what the entry is compiled for), never dropping a mapped page
        mapped = (table >= 0).any(0).nonzero()
        table = table[:, :max(-(-width // page), int(mapped.max()) + 1 if mapped.numel() else 0)].contiguous()
        tensors.update(idx_kv_cache=cache, idx_kv_scale=scale, idx_block_table=table)
        module_globals.update(REDUCE_TILE=page, IDX_STORAGE_BLOCK_SIZE=page)
    out = run(tensors, _variant_fields(config), {"DECODE_BATCH": b, "DECODE_SEQ": seq,
                                                  "BLOCK_SIZE": int(idx_kv_cache.shape[1])},
              module_globals=module_globals)
    return {"score": out["score"].reshape(tokens, width), "topk_idxs": out["topk_idxs"].reshape(tokens, width)}


def _v4_decode_metadata(run, starts, ori_table, cmp_tables, state_tables, *, config, commit_tokens=None):
    """v4_decode_metadata -> decode_metadata.py's host lowering, function by function (upstream has no golden_*
    for it: these functions are what its kernels' tests build their metadata with): position_ids_from_starts,
    kv_seq_lens_from_starts, ori_slot_mapping, swa_indices_and_lens, history_window_swa_indices_and_lens,
    compressed_slot_mapping + mask_uncommitted_compressed_boundaries per ratio, state_slot_mapping per ratio;
    [B, S] results flattened request-major."""
    from kernels.errors import is_int
    from kernels.v4.decode_metadata import V4DecodeMetadata, _starts, check_tables

    seq, bs, window = config.decode_seq, config.block_size, config.sliding_window
    s = _starts(starts, seq, config.max_position_embeddings)  # the caller's side
    check_tables(s.numel(), ori_table, cmp_tables, state_tables)
    committed = seq if commit_tokens is None else commit_tokens
    if not is_int(committed) or not 0 <= committed <= seq:
        from kernels.errors import ContractInputError
        from kernels.v4.decode_metadata import SPEC

        raise ContractInputError("commit_tokens", None, f"an int in [0, {seq}]", repr(commit_tokens), SPEC)
    fields, constants = _variant_fields(config), {"DECODE_SEQ": seq, "BLOCK_SIZE": bs}

    def call(function, *args, **kwargs):
        return run({}, fields, constants, function=function, args=args, kwargs=kwargs)["result"]

    pos = call("position_ids_from_starts", s.to(torch.int32), seq=seq)
    lens = call("kv_seq_lens_from_starts", s.to(torch.int32), seq=seq, commit_tokens=commit_tokens)
    ori = call("ori_slot_mapping", pos, ori_table, block_size=bs)
    swa, swa_lens = call("swa_indices_and_lens", pos, ori_table, block_size=bs, window=window)
    hist, hist_lens = call("history_window_swa_indices_and_lens", pos, ori_table, block_size=bs, window=window)
    cmp, state = {}, {}
    for ratio, table in cmp_tables.items():
        mapping = call("compressed_slot_mapping", pos, table, compress_ratio=ratio, block_size=bs)
        cmp[ratio] = call("mask_uncommitted_compressed_boundaries", mapping, pos, compress_ratio=ratio,
                          commit_tokens=commit_tokens).reshape(-1).to(torch.int64)
    for ratio, table in state_tables.items():
        page = config.c4a_state_block_size if ratio == 4 else config.c128_state_block_size
        state[ratio] = call("state_slot_mapping", pos, table, state_block_size=page).reshape(-1).to(torch.int64)
    tokens = s.numel() * seq
    rows = lambda t, dt: t.reshape(tokens).to(dt)  # noqa: E731 ([B, S] or [T] -> [T])
    windows = lambda t: t.reshape(tokens, -1).to(torch.int32)  # noqa: E731 ([B, S, W] or [T, W] -> [T, W])
    return V4DecodeMetadata(rows(pos, torch.int32), lens.to(torch.int32), rows(ori, torch.int64), windows(swa),
                            rows(swa_lens, torch.int32), windows(hist), rows(hist_lens, torch.int32), cmp, state)


PREFILL_COMPRESSOR = {4: ("prefill_compressor_ratio4", "golden_prefill_compressor_ratio4", "CSA_STATE_BLOCK_SIZE"),
                      128: ("prefill_compressor_ratio128", "golden_prefill_compressor_ratio128",
                            "HCA_STATE_BLOCK_SIZE")}


def _golden_unpersisted(unpersisted, rows_from_x) -> None:
    """The prefill compressor goldens' rule for an unpersisted row: dspark's (``rows_from_x``) read the window back
    from the state ("state"), V4-Pro's and Flash-MTP's pool the chunk's projection ("pooled"); another is refused."""
    from contracts.operators import Unsupported

    rule = "state" if rows_from_x else "pooled"
    if unpersisted not in (None, rule):
        raise Unsupported(f"upstream's prefill compressor goldens of this folder follow unpersisted={rule!r}; "
                          f"unpersisted={unpersisted!r} is another named rule")


def _v4_prefill_compressor(run, x, position_ids, num_tokens, state_block_table, state_pool, weights,
                           cmp_slot_mapping, state_slot_mapping, cmp_pool, rope_cos, rope_sin, *, ratio,
                           rope_head_dim, eps=1e-6, unpersisted=None, module_pools=False, rows_from_x=False):
    """v4_prefill_compressor -> prefill_compressor_ratio4.py / prefill_compressor_ratio128.py
    ::golden_prefill_compressor_ratio*: the packed token-major chunk (T = the call's rows), its closed windows
    pooled, normalised, rotated and written to the cmp pool, its mapped state rows written. Geometry from the
    call (hidden, head_dim = the norm's width, rope_head_dim, eps); the state page must be upstream's (4 / 8).
    ``module_pools``: the Flash-MTP goldens view the state pool and the compressed cache by module-level pool sizes
    and the Flash page (``*_STATE_BLOCK_NUM``, ``HCA_CMP_BLOCK_NUM``, ``CMP_STORAGE_BLOCK_SIZE``), set to the call's
    pools (the rows are addressed flat through the slot mappings, so the page is the call's). ``rows_from_x``:
    dspark's goldens take the token count from x (no module-level ``T``, no ``num_tokens``: its chunk holds only
    real rows, so the call's padding rows are not handed over), and they read each window back from the state rows
    after the chunk's scatter (the named rule ``unpersisted="state"``; V4-Pro's and Flash-MTP's: "pooled")."""
    from contracts.operators import Unsupported
    from kernels.v4.prefill_compressor import _check, rope_half_rows

    _check(x, position_ids, num_tokens, state_block_table, state_pool, cmp_slot_mapping, state_slot_mapping, ratio)
    rope_half_rows(rope_cos, rope_sin, rope_head_dim, weights.norm.shape[0])  # the caller's side
    _golden_unpersisted(unpersisted, rows_from_x)
    module, function, page_name = PREFILL_COMPRESSOR[int(ratio)]
    page = {4: 4, 128: 8}[int(ratio)]
    if state_pool.shape[1] != page:
        raise Unsupported(f"upstream's ratio-{ratio} prefill compressor golden pages its state by {page} rows; the "
                          f"call's pool has {state_pool.shape[1]}")
    tokens, hidden = x.shape
    d = weights.norm.shape[0]
    fields = {"hidden_size": hidden, "head_dim": d, "qk_rope_head_dim": rope_head_dim, "rms_norm_eps": float(eps),
              "max_position_embeddings": int(rope_cos.shape[0])}
    tensors = {"x": x.clone(), "compress_state": state_pool.clone(),
               "compress_state_block_table": state_block_table.reshape(-1).to(torch.int32).clone(),
               "wkv": weights.wkv.float().t().contiguous(), "wgate": weights.wgate.float().t().contiguous(),
               "ape": weights.ape.float().clone(), "norm_w": weights.norm.clone(), "freqs_cos": rope_cos.clone(),
               "freqs_sin": rope_sin.clone(), "cmp_kv": cmp_pool.clone(),
               "position_ids": position_ids.to(torch.int32).clone(), "num_tokens": int(num_tokens),
               "cmp_slot_mapping": cmp_slot_mapping.to(torch.int64).clone(),
               "state_slot_mapping": state_slot_mapping.to(torch.int64).clone()}
    if rows_from_x:
        real = int(num_tokens)
        tensors.update(x=x[:real].clone(), position_ids=tensors["position_ids"][:real].clone(),
                       cmp_slot_mapping=tensors["cmp_slot_mapping"][:real].clone(),
                       state_slot_mapping=tensors["state_slot_mapping"][:real].clone())
    pools = {page_name.replace("_SIZE", "_NUM"): int(state_pool.shape[0]),
             **({"HCA_CMP_BLOCK_NUM": int(cmp_pool.shape[0])} if int(ratio) == 128 else {}),
             **({} if rows_from_x else {"CMP_STORAGE_BLOCK_SIZE": int(cmp_pool.shape[1])})} if module_pools else {}
    out = run(tensors, fields, {"BLOCK_SIZE": int(cmp_pool.shape[1])}, module=module, function=function,
              module_globals={**({} if rows_from_x else {"T": tokens}), page_name: page, **pools})
    return {"cmp_pool": out["cmp_kv"], "state_pool": out["compress_state"]}


def _v4_prefill_indexer(run, x, qr, qr_scale, wq_b, wq_b_scale, weights_proj, cos, sin, hadamard, idx_kv_cache,
                        idx_kv_scale, idx_block_table, position_ids, num_tokens, *, config,
                        padding_rows=None, flash_pages=False, rows_from_x=False, query_staging="bf16"):
    """v4_prefill_indexer -> prefill_indexer.py::golden_prefill_indexer on the packed chunk (T = the call's rows).
    Its inner compressor (prefill_indexer_compressor.py) would publish the chunk's closing keys first; this
    operator is the indexer after that publication, so the compressor is given no slot to write. Upstream's
    golden scores every row of the chunk, padding rows included, over the real rows' widest visible range: the
    named variant ``padding_rows="scored_capped"``. ``flash_pages``: the Flash-MTP golden pages its index cache by
    the 32 keys of one 128-token block (``CACHE_TILE`` / ``IDX_STORAGE_BLOCK_SIZE``) in a pool of a module-level size
    (``PREFILL_IDX_BLOCK_NUM``), so the call's pages are laid out again at that page (as ``_v4_indexer``).
    ``rows_from_x``: dspark's golden sizes the chunk by x's rows and has no padding rows: only the real rows are
    handed over (V4-Pro's pages, the pool size ``IDX_CACHE_BLOCK_NUM`` the call's), and the padding rows' outputs
    are this adapter's, unscored (so the padding contracts judge nothing of dspark there)."""
    if query_staging != "bf16":
        from contracts.operators import Unsupported

        raise Unsupported(f"this golden rounds its whole index query to BF16 before the Hadamard; "
                          f"query_staging={query_staging!r} is another named rule (disagreement 25)")
    from contracts.operators import Unsupported
    from kernels.v4.indexer import head_weights, visible_pages
    from kernels.v4.prefill_indexer import check_prefill_indexer, score_cap

    head_weights(x, weights_proj, config=config)
    tokens, visible = check_prefill_indexer(qr, qr_scale, wq_b, wq_b_scale, cos, sin, hadamard, idx_kv_cache,
                                            idx_kv_scale, idx_block_table, position_ids, num_tokens, config=config,
                                            padding_rows=padding_rows or "scored_capped")  # the caller's side
    for t in range(tokens):
        if int(visible[t]):
            visible_pages(idx_block_table, (), int(visible[t]), block_size=config.block_size)
    own = "unscored" if rows_from_x else "scored_capped"
    if padding_rows not in (None, own):
        raise Unsupported(f"upstream's prefill indexer golden of this folder follows padding_rows={own!r}; "
                          f"padding_rows={padding_rows!r} is another named rule")
    cap, hidden, inner = score_cap(config), x.shape[1], config.index_head_dim
    writes = max(1, tokens // 4)
    # laid out as wide as prefill_indexer_test is compiled: the inner state's pool and its page table (a page per
    # 4 positions up to the kernel's sequence length, all unmapped), RoPE tables of that many rows, the index
    # table as wide as the index pool (unread entries -1)
    page = config.c4a_state_block_size
    state_cols = max(config.kernel_max_seq_len // page, int(position_ids.max()) // page + 2)
    rows = max(config.kernel_max_seq_len, int(position_ids.max()) + 1)
    tensors = {"x": x.clone(), "qr": qr.clone(), "qr_scale": qr_scale.float().clone(), "wq_b": wq_b.clone(),
               "wq_b_scale": wq_b_scale.float().clone(), "weights_proj": weights_proj.clone(),
               "cos": cos.float().clone(), "sin": sin.float().clone(), "hadamard": hadamard.clone(),
               "idx_kv_cache": idx_kv_cache.clone(), "idx_kv_scale": idx_kv_scale.float().clone(),
               "idx_block_table": torch.nn.functional.pad(idx_block_table.to(torch.int32),
                                                          (0, max(0, config.idx_pool - idx_block_table.shape[0])),
                                                          value=-1),
               "position_ids": position_ids.to(torch.int32).clone(), "num_tokens": int(num_tokens),
               "inner_compress_state": torch.zeros(config.csa_inner_state_pool, page, 4 * inner),
               "inner_compress_state_block_table": torch.full((state_cols,), -1, dtype=torch.int32),
               "inner_wkv": torch.zeros(2 * inner, hidden, dtype=torch.bfloat16),
               "inner_wgate": torch.zeros(2 * inner, hidden, dtype=torch.bfloat16),
               "inner_ape": torch.zeros(4, 2 * inner), "inner_norm_w": torch.ones(inner, dtype=torch.bfloat16),
               "freqs_cos": torch.ones(rows, config.qk_rope_head_dim, dtype=torch.bfloat16),
               "freqs_sin": torch.zeros(rows, config.qk_rope_head_dim, dtype=torch.bfloat16),
               "idx_slot_mapping": torch.full((tokens,), -1, dtype=torch.int64),
               "inner_state_slot_mapping": torch.full((tokens,), -1, dtype=torch.int64),
               "score": torch.zeros(tokens, cap), "topk_idxs": torch.zeros(tokens, cap, dtype=torch.int32)}
    module_globals = {"T": tokens, "MAX_CMP_WRITES": writes, "INDEXER_SCORE_CAP": cap,
                      "INDEXER_TOPK_CAP": min(config.index_topk, cap), "prefill_indexer_compressor.T": tokens,
                      "prefill_indexer_compressor.MAX_CMP_WRITES": writes}
    if flash_pages:
        page = max(1, int(idx_kv_cache.shape[1]) // 4)
        cache, scale, table = _repage(tensors["idx_kv_cache"], tensors["idx_kv_scale"],
                                      tensors["idx_block_table"].reshape(1, -1), page)
        tensors.update(idx_kv_cache=cache, idx_kv_scale=scale, idx_block_table=table.reshape(-1).contiguous())
        module_globals.update(CACHE_TILE=page, IDX_STORAGE_BLOCK_SIZE=page, PREFILL_IDX_BLOCK_NUM=int(cache.shape[0]))
        # its top-k output is only as wide as the picks (INDEXER_TOPK_CAP); V4-Pro's pads the score width with -1
        tensors["topk_idxs"] = torch.zeros(tokens, min(config.index_topk, cap), dtype=torch.int32)
    if rows_from_x:
        real = int(num_tokens)
        for name in ("x", "qr", "qr_scale", "cos", "sin", "position_ids", "idx_slot_mapping",
                     "inner_state_slot_mapping", "score"):
            tensors[name] = tensors[name][:real].clone()
        tensors["topk_idxs"] = torch.zeros(real, min(config.index_topk, cap), dtype=torch.int32)
        module_globals = {"INDEXER_SCORE_CAP": cap, "INDEXER_TOPK_CAP": min(config.index_topk, cap),
                          "IDX_CACHE_BLOCK_NUM": int(idx_kv_cache.shape[0]),
                          "prefill_indexer_compressor.INNER_STATE_BLOCK_SIZE": page}
        if real == 0:  # nothing to hand over: every row padding, unscored
            return {"score": torch.full((tokens, cap), float(torch.finfo(torch.float32).min)), "topk_idxs": torch.full((tokens, cap), -1,
                                                                                                 dtype=torch.int32)}
    out = run(tensors, _variant_fields(config), {"BLOCK_SIZE": config.block_size}, module_globals=module_globals)
    picks = out["topk_idxs"]
    if rows_from_x:  # the padding rows, unscored (dspark's chunk has none)
        pad = tokens - picks.shape[0]
        out["score"] = torch.cat((out["score"], torch.full((pad, cap), float(torch.finfo(torch.float32).min))))
        picks = torch.cat((picks, torch.full((pad, picks.shape[1]), -1, dtype=torch.int32)))
    if picks.shape[1] < cap:
        picks = torch.nn.functional.pad(picks, (0, cap - picks.shape[1]), value=-1)
    return {"score": out["score"], "topk_idxs": picks}


def _v4_prefill_index_keys(run, x, position_ids, num_tokens, state_block_table, state_pool, weights,
                           idx_slot_mapping, state_slot_mapping, idx_kv_cache, idx_kv_scale, rope_cos, rope_sin,
                           hadamard, *, rope_head_dim, eps=1e-6, unpersisted=None, module_pools=False,
                           rows_from_x=False):
    """v4_prefill_index_keys -> prefill_indexer_compressor.py::golden_prefill_indexer_compressor (the packed chunk,
    T = the call's rows): the inner ratio-4 compressor's closed windows written as INT8 index keys with their
    scales, and the mapped state rows. Geometry from the call (hidden, index head_dim = the norm's width,
    rope_head_dim, eps); the state page must be upstream's 4. ``module_pools``: the Flash-MTP golden views the state
    pool by a module-level pool size and the index cache by the Flash page (``INNER_STATE_BLOCK_NUM``,
    ``IDX_STORAGE_BLOCK_SIZE``), set to the call's (rows addressed flat through the slot mappings). ``rows_from_x``:
    dspark's golden sizes the chunk by x's rows (only the real ones handed over) and reads each window back from
    the state rows after the scatter (``unpersisted="state"``, as ``_v4_prefill_compressor``)."""
    from contracts.operators import Unsupported
    from kernels.v4.prefill_compressor import _check, rope_half_rows

    _check(x, position_ids, num_tokens, state_block_table, state_pool, idx_slot_mapping, state_slot_mapping, 4,
           "idx_slot_mapping")
    rope_half_rows(rope_cos, rope_sin, rope_head_dim, weights.norm.shape[0])  # the caller's side
    _golden_unpersisted(unpersisted, rows_from_x)
    if state_pool.shape[1] != 4:
        raise Unsupported(f"upstream's prefill indexer compressor golden pages its state by 4 rows; the call's pool "
                          f"has {state_pool.shape[1]}")
    tokens, hidden = x.shape
    d = weights.norm.shape[0]
    fields = {"hidden_size": hidden, "index_head_dim": d, "qk_rope_head_dim": rope_head_dim,
              "rms_norm_eps": float(eps), "max_position_embeddings": int(rope_cos.shape[0])}
    tensors = {"x": x.clone(), "kv": torch.zeros(max(1, tokens // 4), d, dtype=torch.bfloat16),
               "compress_state": state_pool.clone(),
               "inner_compress_state_block_table": state_block_table.reshape(-1).to(torch.int32).clone(),
               "wkv": weights.wkv.float().t().contiguous(), "wgate": weights.wgate.float().t().contiguous(),
               "ape": weights.ape.float().clone(), "norm_w": weights.norm.clone(), "freqs_cos": rope_cos.clone(),
               "freqs_sin": rope_sin.clone(), "hadamard": hadamard.clone(), "idx_kv_cache": idx_kv_cache.clone(),
               "idx_kv_scale": idx_kv_scale.float().clone(), "idx_block_table": torch.zeros(1, dtype=torch.int32),
               "position_ids": position_ids.to(torch.int32).clone(), "num_tokens": int(num_tokens),
               "idx_slot_mapping": idx_slot_mapping.to(torch.int64).clone(),
               "inner_state_slot_mapping": state_slot_mapping.to(torch.int64).clone()}
    pools = {"INNER_STATE_BLOCK_NUM": int(state_pool.shape[0]),
             "IDX_STORAGE_BLOCK_SIZE": int(idx_kv_cache.shape[1])} if module_pools else {}
    sizes = {"T": tokens, "MAX_CMP_WRITES": max(1, tokens // 4)}
    if rows_from_x:
        real = int(num_tokens)
        tensors.update({name: tensors[name][:real].clone() for name in
                        ("x", "position_ids", "idx_slot_mapping", "inner_state_slot_mapping")})
        sizes = {"INNER_STATE_BLOCK_SIZE": 4}
    out = run(tensors, fields, {"BLOCK_SIZE": int(idx_kv_cache.shape[1])}, module_globals={**sizes, **pools})
    return {"idx_kv_cache": out["idx_kv_cache"], "idx_kv_scale": out["idx_kv_scale"],
            "state_pool": out["compress_state"]}


ADAPTERS: dict[str, Adapter] = {a.operator: a for a in (
    Adapter("v4_gate", PRO, "gate", "golden_gate_core", _gate),
    Adapter("mtp_projection", PRO, "mtp_projection", "golden_mtp_projection", _mtp_projection),
    Adapter("hc_post", PRO, "hc_post", "golden_hc_post", _hc_post, forms=(("hc_post", "golden_hc_post_prefill"),)),
    Adapter("lm_head", PRO, "lm_head", "golden_lm_head", partial(_lm_head, all_ranks=True),
            forms=(("lm_head", "golden_lm_head_all_ranks"),)),
    Adapter("final_norm", PRO, "rmsnorm", "golden_rms_norm_test", _final_norm),
    Adapter("v4_embed_pack", PRO, "input_pack", "golden_pack_x_hc", _v4_embed_pack),
    Adapter("v4_expert", PRO, "expert_routed", "golden_expert_routed", _v4_expert, also=("expert_shared",),
            forms=(("expert_shared", "golden_expert_shared"),)),
    Adapter("v4_qkv_proj_rope", PRO, "qkv_proj_rope", "golden_qkv_proj_rope", _v4_qkv_proj_rope),
    Adapter("v4_attention", PRO, "decode_sparse_attn", "golden_sparse_attn", _v4_attention,
            also=("decode_sparse_attn_hca", "decode_sparse_attn_swa", "prefill_sparse_attn"),
            forms=(("decode_sparse_attn_hca", "golden_sparse_attn"), ("decode_sparse_attn_swa", "golden_sparse_attn"),
                   ("prefill_sparse_attn", "golden_prefill_sparse_attn"))),
    Adapter("v4_attention_stage", PRO, "decode_attention_swa", "golden_attention_swa", _v4_attention_stage,
            also=("hc_pre", "rmsnorm", "qkv_proj_rope", "prefill_attention_swa"),
            forms=(("prefill_attention_swa", "golden_prefill_attention_swa"),)),
    Adapter("v4_indexer", PRO, "decode_indexer", "golden_indexer", _v4_indexer, also=("decode_indexer_compressor",)),
    Adapter("v4_decode_metadata", PRO, "decode_metadata", "(host lowering)", _v4_decode_metadata),
    Adapter("v4_prefill_compressor", PRO, "prefill_compressor_ratio4", "golden_prefill_compressor_ratio4",
            _v4_prefill_compressor, also=("prefill_compressor_ratio128",),
            forms=(("prefill_compressor_ratio128", "golden_prefill_compressor_ratio128"),)),
    Adapter("v4_prefill_indexer", PRO, "prefill_indexer", "golden_prefill_indexer", _v4_prefill_indexer,
            also=("prefill_indexer_compressor",)),
    Adapter("v4_prefill_index_keys", PRO, "prefill_indexer_compressor", "golden_prefill_indexer_compressor",
            _v4_prefill_index_keys),
    Adapter("v4_moe_stage", PRO, "moe", "golden_moe", _v4_moe_stage,
            also=("hc_pre", "gate", "expert_routed", "expert_shared", "hc_post")),
    Adapter("v4_mtp_layer", PRO, "decode_mtp", "golden_mtp_decode_layer", _v4_mtp_layer,
            also=("mtp_projection", "decode_attention_swa", "moe", "hc_head", "rmsnorm")),
    Adapter("v4_prefill_mtp_layer", PRO, "prefill_mtp", "golden_mtp_prefill_fwd", _v4_prefill_mtp_layer,
            also=("mtp_projection", "prefill_attention_swa", "moe", "rmsnorm")),
    Adapter("v4_compressor", PRO, "decode_compressor_ratio4", "golden_compressor", _v4_compressor,
            also=("decode_compressor_ratio128",), forms=(("decode_compressor_ratio128", "golden_compressor"),)),
    Adapter("v4_compress_and_publish", PRO, "decode_compressor_ratio4", "golden_compressor",
            _v4_compress_and_publish, also=("decode_compressor_ratio128",),
            forms=(("decode_compressor_ratio128", "golden_compressor"),)),
    Adapter("hc_pre_fused", PRO, "hc_pre", "golden_hc_pre", _hc_pre_fused),
    Adapter("hc_head_fused", PRO, "hc_head", "golden_hc_head", partial(_hc_head_fused, rows_port=True),
            forms=(("hc_head", "golden_hc_head_rows"),)),
    Adapter("v4_hca_stage", PRO, "decode_attention_hca", "golden_attention_hca", _v4_hca_stage),
    Adapter("v4_prefill_hca_stage", PRO, "prefill_attention_hca", "golden_prefill_attention_hca",
            _v4_prefill_hca_stage, also=("prefill_compressor_ratio128", "prefill_sparse_attn")),
    Adapter("v4_prefill_csa_stage", PRO, "prefill_attention_csa", "golden_prefill_attention_csa",
            _v4_prefill_csa_stage, also=("prefill_compressor_ratio4", "prefill_indexer", "prefill_indexer_compressor",
                                         "prefill_sparse_attn")),
    Adapter("v4_csa_stage", PRO, "decode_attention_csa", "golden_attention_csa", _v4_csa_stage,
            also=("decode_indexer", "decode_indexer_compressor", "decode_compressor_ratio4")),
    Adapter("v4_decode_layer", PRO, "decode_layer", "golden_decode_layer_swa", _v4_decode_layer,
            forms=(("decode_layer", "golden_decode_layer_hca"), ("decode_layer", "golden_decode_layer_csa"),
                   ("decode_layer", "golden_decode_layer_auto"))),
    Adapter("v4_prefill_layer", PRO, "prefill_layer", "golden_prefill_layer", _v4_prefill_layer_packed,
            also=("prefill_attention_swa", "moe")),
)}


def _cp_zigzag_tail_exchange(run, local_kv_tail, segment_lens):
    """cp_zigzag_tail_exchange -> Flash-MTP's prefill_cp_zigzag.py::golden_prefill_cp_zigzag_kv_tail_exchange. That
    golden ignores the tails it is handed: it writes the exchange of its own fixture, 2cp full segments whose rows
    carry their positions (``position_markers``), at its module's CP world, tail and width (set to the call's). So
    only that call is its domain: any other is unsupported, named."""
    from contracts.operators import Unsupported
    from kernels.v4.cp_zigzag import check_tail_exchange, position_markers

    check_tail_exchange(local_kv_tail, segment_lens)  # the caller's side
    cp, rows, dim = local_kv_tail.shape
    tail = rows // 2
    if dim < 3 or segment_lens.tolist() != [tail] * (2 * cp) or \
            not torch.equal(local_kv_tail.view(torch.int16), position_markers(cp, tail, dim).view(torch.int16)):
        raise Unsupported("upstream's zigzag tail-exchange golden writes the exchange of its own fixture (2cp full "
                          "segments of position markers) whatever it is handed; the call's tails are not that "
                          "fixture")
    segments = 2 * cp
    tensors = {"local_kv_tail": local_kv_tail.clone(),
               "reverse_index": torch.zeros(segments, dtype=torch.int32),  # the kernel's tables: not read by it
               "owner_rank_table": torch.zeros(segments, dtype=torch.int32),
               "final_win_seg_src": torch.zeros(tail, dtype=torch.int32),
               "final_win_row_src": torch.zeros(tail, dtype=torch.int32),
               "logical_tails_out": torch.zeros(cp, segments * tail, dim, dtype=torch.bfloat16),
               "decode_raw_window_out": torch.zeros(cp, tail, dim, dtype=torch.bfloat16)}
    out = run(tensors, {}, {}, module_globals={"CP_SIZE": cp, "NUM_SEGMENTS": segments, "TAIL_ROWS": tail,
                                               "HEAD_DIM": dim, "CP_TAIL_WINDOW_ROWS": segments * tail})
    return {"logical_tails": out["logical_tails_out"], "decode_window": out["decode_raw_window_out"]}


def _tp_reduce_scatter(run, partials, *, active_tokens, capacity=None):
    """tp_reduce_scatter -> dspark's decode_o_proj.py::golden_decode_attention_collectives_fixture, its third
    collective (the reduce-scatter of the ranks' FP32 output-projection partials: the sum over the ranks, each
    rank's ``local_t`` rows cast to BF16), the fixture's module imported at dspark's own geometry and its widths set
    to the call's: TP the partials' count, ``local_t`` rows per rank, one output group per rank of width 1 for the
    all-to-all it also runs (its all-gather and all-to-all outputs are not this operator's). Its domain: every row
    active and the rows an equal share per rank (it writes no padding rows: a call with any is unsupported)."""
    from contracts.operators import Unsupported
    from kernels.reference.tp import tp_reduce_scatter

    tp = len(partials) if isinstance(partials, (list, tuple)) else 0
    rows = int(partials[0].shape[0]) if tp and isinstance(partials[0], torch.Tensor) and partials[0].ndim == 2 else -1
    if rows < 0 or any(not isinstance(p, torch.Tensor) or p.dtype != torch.float32 or p.shape != partials[0].shape
                       for p in partials) or not 0 <= active_tokens <= rows:
        return tp_reduce_scatter(partials, active_tokens=active_tokens, capacity=capacity)  # raises the caller-side error
    cap = rows if capacity is None else int(capacity)
    if active_tokens != rows or cap != rows or rows % tp or not rows:
        raise Unsupported(f"dspark's collectives fixture reduce-scatters every row in equal shares and writes no padding "
                          f"rows: the call has {active_tokens} active of {rows} rows (capacity {cap}) over TP {tp}")
    local, d = rows // tp, int(partials[0].shape[1])
    tensors = {"kv_local": torch.zeros(tp, local, d, dtype=torch.bfloat16),
               "attention_grouped": torch.zeros(tp, tp * local, 1, dtype=torch.bfloat16),
               "o_partial": torch.stack([p.clone() for p in partials]),
               "kv_group": torch.zeros(tp, tp * local, d, dtype=torch.bfloat16),
               "attention_local_groups": torch.zeros(tp, tp * local, 1, dtype=torch.bfloat16),
               "o_local": torch.zeros(tp, local, d, dtype=torch.bfloat16), "local_t": local}
    widths = {"TP_SIZE": tp, "D": d, "O_GROUPS": tp, "LOCAL_O_GROUPS": 1, "O_GROUP_IN": 1, "LOCAL_T_PAD": local,
              "GROUP_T_PAD": tp * local}
    out = run(tensors, {}, {}, module_globals=widths)
    return [out["o_local"][r].clone() for r in range(tp)]


def _prefill_kv_allgather(run, hidden_local):
    """prefill_kv_allgather -> dspark's prefill_kv_allgather.py::golden_prefill_kv_allgather: the call's slabs as
    hidden_local [tp, local_t, D]; group_out [tp, tp * local_t, D]."""
    from kernels.v4.kv_allgather import check_kv_allgather

    check_kv_allgather(hidden_local)  # the caller's side
    tp, local_t, d = hidden_local.shape
    tensors = {"hidden_local": hidden_local.clone(), "group_out": torch.zeros(tp, tp * local_t, d,
                                                                              dtype=torch.bfloat16)}
    # the module is imported at its own width (its decode_o_proj import checks the model's tiling); the golden
    # reshapes by its module-level D, set to the call's
    return run(tensors, {}, {}, module_globals={"D": d})["group_out"]


def _markov_head(run, token_ids, markov_w1, markov_w2):
    """markov_head -> dspark's markov_head.py::golden_markov_head: the call's ids (INT64) and tables as they are (the
    golden and the entry take any token count, vocabulary and rank-256 tables)."""
    from kernels.v4.markov_head import check_markov_head

    check_markov_head(token_ids, markov_w1, markov_w2)  # the caller's side
    t, (vocab, rank) = token_ids.shape[0], markov_w1.shape
    tensors = {"token_ids": token_ids.to(torch.int64).clone(), "markov_w1": markov_w1.clone(),
               "markov_w2": markov_w2.clone(), "logits_bias": torch.zeros(t, vocab),
               "markov_embed": torch.zeros(t, rank, dtype=torch.bfloat16)}
    out = run(tensors, {}, {})
    return {"markov_embed": out["markov_embed"], "logits_bias": out["logits_bias"]}


def _dspark_proj(run, main_hidden, main_proj_w, main_norm_w, *, config, ops=None):
    """dspark_proj -> dspark's dspark_proj.py::golden_dspark_proj at the call's width and ``config``'s epsilon (the
    golden is shape-generic: its FP32 matmul, the BF16 staging, then rmsnorm.py's golden_rms_norm)."""
    from kernels.v4.dspark_proj import check_dspark_proj

    check_dspark_proj(main_hidden, main_proj_w, main_norm_w)  # the caller's side
    tensors = {"main_hidden": main_hidden.clone(), "main_proj_w": main_proj_w.clone(),
               "main_norm_w": main_norm_w.clone(),
               "main_x": torch.zeros(main_hidden.shape[0], main_norm_w.shape[0], dtype=torch.bfloat16)}
    return run(tensors, {"hidden_size": main_norm_w.shape[0], "rms_norm_eps": config.rms_norm_eps}, {})["main_x"]


def _dspark_markov_sample(run, head_hidden, final_norm_weight, lm_head_weight, anchor_token_ids, markov_w1,
                          markov_w2, *, config, ops=None):
    """dspark_markov_sample -> dspark's dspark_markov.py::golden_nonzero_markov (DSPARK_QUERY_WIDTH the call's W,
    ``config``'s epsilon). The golden scores only the first 8 vocabulary ids (its fixture's support) and asserts
    that each step's best score is positive: a call with a nonzero head or w2 row past them, or a step whose best
    score is not positive (evaluated by this project's scores), is unsupported."""
    from contracts.operators import Unsupported
    from kernels.reference.lm_head import final_norm, greedy_pick
    from kernels.v4.dspark_markov import SUPPORT, base_logits, check_dspark_markov
    from kernels.v4.markov_head import markov_head

    check_dspark_markov(head_hidden, final_norm_weight, lm_head_weight, anchor_token_ids, markov_w1, markov_w2)
    markov_head(anchor_token_ids, markov_w1, markov_w2)  # the caller's side: the anchors inside the vocabulary
    for name, t in (("lm_head_weight", lm_head_weight), ("markov_w2", markov_w2)):
        if bool(t[SUPPORT:].any()):
            raise Unsupported(f"upstream's golden_nonzero_markov scores only the first {SUPPORT} vocabulary ids; the "
                              f"call's {name} has a nonzero row past them")
    batch, width, d = head_hidden.shape
    tensors = {"head_hidden": head_hidden.clone(), "final_norm_weight": final_norm_weight.clone(),
               "lm_head_weight": lm_head_weight.clone(), "anchor_token_ids": anchor_token_ids.to(torch.int64).clone(),
               "markov_w1": markov_w1.clone(), "markov_w2": markov_w2.clone(),
               "draft_token_ids": torch.zeros(batch, width, dtype=torch.int32)}
    # the golden's assertion, checked first on this project's scores (its reference pieces) so that a call outside
    # the golden's domain is a named skip, not an error
    normed = final_norm(head_hidden.reshape(-1, d), final_norm_weight, config=config)
    base = base_logits(normed, lm_head_weight).reshape(batch, width, -1)
    prev = anchor_token_ids.to(torch.int64)
    for s in range(width):
        scores = base[:, s] + markov_head(prev, markov_w1, markov_w2)["logits_bias"]
        if not bool((scores.max(dim=-1).values > 0).all()):
            raise Unsupported(f"upstream's golden_nonzero_markov asserts a positive best score at every step; "
                              f"step {s} of the call has none")
        prev = greedy_pick(scores).to(torch.int64)
    return run(tensors, {"hidden_size": d, "rms_norm_eps": config.rms_norm_eps}, {},
               module_globals={"DSPARK_QUERY_WIDTH": width})["draft_token_ids"]


def _dspark_pages(kv_cache: torch.Tensor, dim: int) -> torch.Tensor:
    """A paged cache [blocks, page, (1,) hd] as [blocks', 32, 1, hd]: dspark's page of 32 rows (its entries compile
    BLOCK_SIZE 32), the flat rows -- what a slot names -- unchanged; a page that is not a multiple of 32 stays."""
    from kernels.config import V4_FLASH_DSPARK

    page = V4_FLASH_DSPARK.block_size
    rows = kv_cache.shape[0] * kv_cache.shape[1]
    if kv_cache.shape[1] % page:
        return kv_cache.reshape(kv_cache.shape[0], kv_cache.shape[1], 1, dim)
    return kv_cache.reshape(rows // page, page, 1, dim)


def _dspark_context_kv(run, main_x, wkv, gamma_ckv, freqs_cos, freqs_sin, position_ids, slot_mapping, kv_cache, *,
                       config):
    """dspark_context_kv -> dspark's dspark_context_kv.py::golden_dspark_context_kv: the call's tensors as they are,
    the cache laid out at dspark's page (``_dspark_pages``: the same flat rows), NOPE_DIM / HEAD_DIM / ROPE_HALF and
    the epsilon set to the call's preset."""
    from kernels.v4.dspark_context_kv import check_dspark_context_kv

    check_dspark_context_kv(main_x, wkv, gamma_ckv, freqs_cos, freqs_sin, position_ids, slot_mapping, kv_cache,
                            config=config)  # the caller's side
    dim, rope = config.head_dim, config.qk_rope_head_dim
    tensors = {"main_x": main_x.clone(), "wkv": wkv.clone(), "gamma_ckv": gamma_ckv.clone(),
               "freqs_cos": freqs_cos.clone(), "freqs_sin": freqs_sin.clone(),
               "position_ids": position_ids.to(torch.int32).clone(), "slot_mapping": slot_mapping.to(torch.int64).clone(),
               "kv_cache": _dspark_pages(kv_cache, dim).clone()}
    out = run(tensors, {}, {}, module_globals={"HEAD_DIM": dim, "NOPE_DIM": dim - rope, "ROPE_HALF": rope // 2,
                                               "EPS": config.rms_norm_eps})
    return out["kv_cache"].reshape(kv_cache.shape)


def _dspark_attention(run, x, wq_a, wq_b, wq_b_scale, wkv, gamma_cq, gamma_ckv, freqs_cos, freqs_sin, position_ids,
                      kv_cache, slot_mapping, swa_indices, swa_lens, attn_sink, wo_a, wo_b, wo_b_scale, *, config,
                      probabilities=None, ops=None):
    """dspark_attention -> dspark's dspark_attention.py::golden_dspark_attention: B, S, T and INDEX_WIDTH set to the
    call's requests, rows per request, rows and list width; the model fields to ``config``'s (the golden runs
    qkv_proj_rope.py's golden_qkv_proj_rope for the projection). The golden follows the "fp32" probability rule
    (DSPARK_VARIANTS); a call that asks for the kernel's "bf16" rule by name is unsupported."""
    from contracts.operators import Unsupported
    from kernels.v4.dspark_attention import check_dspark_attention

    if probabilities not in (None, "fp32"):
        raise Unsupported(f"dspark's golden_dspark_attention keeps its probabilities in FP32; the call asks for "
                          f"probabilities={probabilities!r} (its kernel's rule: disagreement 21)")

    seq = check_dspark_attention(x, freqs_cos, position_ids, kv_cache, slot_mapping, swa_indices,
                                 swa_lens)  # the caller's side
    batch, width = swa_indices.shape
    tensors = {"x": x.clone(), "wq_a": wq_a.clone(), "wq_b": wq_b.clone(), "wq_b_scale": wq_b_scale.float().clone(),
               "wkv": wkv.clone(), "gamma_cq": gamma_cq.clone(), "gamma_ckv": gamma_ckv.clone(),
               "freqs_cos": freqs_cos.clone(), "freqs_sin": freqs_sin.clone(),
               "position_ids": position_ids.to(torch.int32).clone(), "kv_cache": kv_cache.clone(),
               "slot_mapping": slot_mapping.to(torch.int64).clone(), "swa_indices": swa_indices.to(torch.int32).clone(),
               "swa_lens": swa_lens.to(torch.int32).clone(), "attn_sink": attn_sink.float().clone(),
               "wo_a": wo_a.clone(), "wo_b": wo_b.clone(), "wo_b_scale": wo_b_scale.float().clone(),
               "x_out": torch.zeros(x.shape, dtype=torch.bfloat16)}
    out = run(tensors, _variant_fields(config), {"BLOCK_SIZE": int(kv_cache.shape[1])},
              module_globals={"B": batch, "S": seq, "T": batch * seq, "INDEX_WIDTH": width})
    return {"x_out": out["x_out"], "kv_cache": out["kv_cache"]}


def _drafter_domain(i: dict, *, config) -> str | None:
    """What golden_dspark_drafter assumes of the weights and is not so in the call (None: its domain). The golden
    evaluates no layer: it writes what its fixture's weights give (every hc mix function and base 0, the identity
    projection of the first D target columns and unit norm, identity wkv with unit gamma and no rotation at the
    positions read, attention and expert outputs 0)."""
    d, hd = config.hidden_size, config.head_dim

    def zero(t):
        return not bool(t.any())

    def ones(t):
        return bool((t.float() == 1).all())

    proj = i["main_proj_w"].float()
    if proj.shape[1] < d or not torch.equal(proj[:, :d], torch.eye(d)) or bool(proj[:, d:].any()):
        return "main_proj_w is not the identity of the first D target columns (its projection assumed as main_x = " \
               "RMSNorm(target_hidden[:, :D]))"
    if not ones(i["main_norm_w"]):
        return "main_norm_w is not 1"
    from kernels.v4.dspark_drafter import QUERY_WIDTH

    anchors = i["anchor_positions"].long()
    read = torch.cat((i["context_position_ids"].long(),
                      (anchors[:, None] + torch.arange(1, QUERY_WIDTH + 1)).reshape(-1)))
    if not ones(i["freqs_cos"][read]) or not zero(i["freqs_sin"][read]):
        return "the RoPE rows read are not cos 1 / sin 0 (the golden's KV has no rotation)"
    for name in ("hc_head_fn", "hc_head_base"):
        if not zero(i[name]):
            return f"{name} is not 0 (the golden's head mix is sigmoid(0) + eps)"
    eye = torch.zeros(d, hd)
    eye[:hd, :hd] = torch.eye(hd)
    for index, layer in enumerate(i["layers"]):
        a, m = layer["attention"], layer["moe"]
        for part, name in (("attention", "hc_fn"), ("attention", "hc_base"), ("moe", "hc_fn"), ("moe", "hc_base")):
            if not zero(layer[part][name]):
                return f"layers[{index}].{part}.{name} is not 0 (the golden's mixes are sigmoid(0) + eps, " \
                       "2·sigmoid(0) and the Sinkhorn of a uniform matrix)"
        if not torch.equal(a["wkv"].float(), eye) or not ones(a["gamma_ckv"]) or not ones(a["attn_norm_w"]):
            return f"layers[{index}].attention: wkv is not the identity of the first head_dim columns, or " \
                   "gamma_ckv / attn_norm_w not 1 (the golden's KV is RMSNorm(x[:, :head_dim]))"
        if not any(zero(a[n]) for n in ("wo_a", "wo_b", "wo_b_scale")):
            return f"layers[{index}].attention's output projection is not 0 (the golden adds no attention output)"
        for e, expert in enumerate([*m["routed"], m["shared"]]):
            if not any(zero(getattr(expert, f)) for f in ("w1", "w1_scale", "w3", "w3_scale", "w2", "w2_scale")):
                which = "the shared expert" if e == len(m["routed"]) else f"routed expert {e}"
                return f"layers[{index}].moe: {which} gives an output (the golden adds no expert output)"
    if bool((i["context_slot_mapping"] < 0).any()):
        return "a context slot is -1 (the golden pairs the valid slots with the first context rows)"
    if config.hc_mult != 4:
        return f"hc_mult {config.hc_mult} (the golden's head sums four streams by name)"
    return None


def _dspark_drafter(run, target_hidden, main_proj_w, main_norm_w, anchor_token_ids, anchor_positions,
                    embedding_weight, context_position_ids, context_slot_mapping, block_tables, kv_caches, freqs_cos,
                    freqs_sin, layers, hc_head_fn, hc_head_scale, hc_head_base, *, config, noise_token_id=None,
                    probabilities=None, ops=None):
    """dspark_drafter -> dspark's dspark_drafter.py::golden_dspark_drafter on one rank (N_RANKS 1), its module-level
    widths the call's (D, HEAD_DIM, HC_MULT, BLOCK_SIZE, DECODE_SEQ the target rows per request, DSPARK_MAX_BATCH the
    requests, DSPARK_DRAFT_LAYERS the layers, the noise id). The golden evaluates no layer (``_drafter_domain``): a
    call outside its fixture's weights is unsupported, naming the first weight that is not."""
    from contracts.operators import Unsupported
    from kernels.v4.dspark_drafter import NOISE_TOKEN_ID, QUERY_WIDTH, check_dspark_drafter, query_ids
    from kernels.v4.lookup_embedding import check_lookup_inputs

    noise = NOISE_TOKEN_ID if noise_token_id is None else noise_token_id
    batch, rows = check_dspark_drafter(target_hidden, anchor_token_ids, anchor_positions, context_position_ids,
                                       context_slot_mapping, block_tables, kv_caches, freqs_cos, layers,
                                       config=config, noise_token_id=noise)  # the caller's side
    check_lookup_inputs(query_ids(anchor_token_ids, noise), embedding_weight, config=config)  # ids in the vocabulary
    why = _drafter_domain(dict(main_proj_w=main_proj_w, main_norm_w=main_norm_w, anchor_positions=anchor_positions,
                               context_position_ids=context_position_ids, freqs_cos=freqs_cos, freqs_sin=freqs_sin,
                               hc_head_fn=hc_head_fn, hc_head_base=hc_head_base, layers=layers,
                               context_slot_mapping=context_slot_mapping), config=config)
    if why:
        raise Unsupported(f"upstream's golden_dspark_drafter writes its fixture's closed form, not the layers: {why}")
    depth, d, hc = len(layers), config.hidden_size, config.hc_mult
    padded = batch * 8  # the golden's MoE tile: DSPARK_MAX_BATCH x DSPARK_QUERY_PAD rows
    tensors = {"target_hidden": target_hidden[None].clone(), "anchor_positions": anchor_positions.to(torch.int32)[None],
               "anchor_token_ids": anchor_token_ids.to(torch.int64)[None],
               "embedding_weight": embedding_weight[None].clone(),
               "context_position_ids": context_position_ids.to(torch.int32)[None],
               "context_slot_mapping": context_slot_mapping.to(torch.int64)[None],
               "block_tables": block_tables.to(torch.int32)[None], "kv_caches": kv_caches[None].clone(),
               "head_hidden": torch.zeros(1, batch, QUERY_WIDTH, d, dtype=torch.bfloat16),
               "initial_hidden": torch.zeros(1, padded, hc, d),
               "intermediate_hidden": torch.zeros(1, depth, padded, hc, d)}
    out = run(tensors, _variant_fields(config), {},
              module_globals={"N_RANKS": 1, "D": d, "HEAD_DIM": config.head_dim, "HC_MULT": hc,
                              "BLOCK_SIZE": int(kv_caches.shape[2]), "DECODE_SEQ": rows, "DSPARK_MAX_BATCH": batch,
                              "DSPARK_DRAFT_LAYERS": depth, "DSPARK_NOISE_TOKEN_ID": int(noise)})
    n = batch * QUERY_WIDTH
    return {"head_hidden": out["head_hidden"][0], "initial_hidden": out["initial_hidden"][0, :n],
            "intermediate_hidden": out["intermediate_hidden"][0, :, :n], "kv_caches": out["kv_caches"][0]}


def _o_proj_widths(config, **more) -> dict:
    """decode_o_proj.py's module-level widths set to ``config``'s (the module is imported at its own width: it
    checks the model's tiling at import), and ``more``."""
    return {"D": config.hidden_size, "O_LORA": config.o_lora_rank, "INT8_AMAX_EPS": config.int8_amax_eps,
            "INT8_SCALE_MAX": config.int8_scale_max, **more}


def _heads_projection(run, heads, wo_a, wo_b, wo_b_scale, *, config):
    """v4_heads_projection -> dspark's decode_o_proj.py::golden_decode_o_proj_tp1 (a plain function): the heads packed
    by output group as its o_packed_heads [G, T_PAD, H/G·hd] (T_PAD the rows' 16-row ceiling, the padding rows
    zero), its module-level widths the call's preset's."""
    from kernels.v4.heads_projection import check_heads_projection

    check_heads_projection(heads, wo_a, wo_b, wo_b_scale, config=config)  # the caller's side
    tokens, groups = heads.shape[0], config.o_groups
    pad = -(-tokens // 16) * 16
    packed = torch.zeros(groups, pad, heads.shape[1] // groups * heads.shape[2], dtype=torch.bfloat16)
    packed[:, :tokens] = heads.reshape(tokens, groups, -1).transpose(0, 1)
    # the module is imported at its own width (it checks the model's tiling at import); the golden reads its
    # module-level widths, set to the call's
    widths = _o_proj_widths(config, T_PAD=pad, O_GROUPS=groups, O_GROUP_IN=packed.shape[2])
    out = run({}, {}, {}, module="decode_o_proj", function="golden_decode_o_proj_tp1", module_globals=widths,
              args=[packed, wo_a.clone(), wo_b.clone(), wo_b_scale.float().clone(), tokens])
    return out["result"]


def _heads_projection_partial(run, heads, wo_a, wo_b, wo_b_scale, *, config):
    """v4_heads_projection_partial -> dspark's decode_o_proj.py::golden_decode_o_proj: one rank's receive-side
    projection of its groups (``attention_local_groups`` [G_r, T, H/G·hd]), TP_SIZE 1 and ``local_t`` the call's rows
    so that every row is judged; imported at its own width, its module-level widths the call's."""
    from kernels.v4.heads_projection import check_heads_projection_partial

    check_heads_projection_partial(heads, wo_a, wo_b, wo_b_scale, config=config)  # the caller's side
    local, tokens, d = heads.shape[0], heads.shape[1], config.hidden_size
    tensors = {"attention_local_groups": heads.clone(), "wo_a": wo_a.clone(), "wo_b": wo_b.clone(),
               "wo_b_scale": wo_b_scale.float().clone(), "local_t": tokens,
               "o_partial": torch.zeros(tokens, d)}
    return run(tensors, {}, {}, module="decode_o_proj", function="golden_decode_o_proj",
               module_globals=_o_proj_widths(config, TP_SIZE=1, LOCAL_O_GROUPS=local))["o_partial"]


def _dspark_decode_metadata(run, position_ids, *tables_and_counts, seq, block_size, window, hca_state_page=8,
                            csa_state_page=2):
    """dspark_decode_metadata -> dspark's decode_metadata.py::golden_decode_metadata: the call's positions, six
    tables and counts as they are; its module-level step (``B``, ``S``, ``T``), ``WIN``, page and state pages set to
    the call's; the outputs zero-initialised as its entry's."""
    from kernels.v4.dspark_metadata import OUTPUTS, TABLES, dspark_decode_metadata

    *tables, counts = tables_and_counts
    # the caller's side: every page the step reads mapped and inside its table (the golden would index past it)
    dspark_decode_metadata(position_ids, *tables, counts, seq=seq, block_size=block_size, window=window,
                           hca_state_page=hca_state_page, csa_state_page=csa_state_page)
    n = position_ids.numel()
    tensors = {"position_ids": position_ids.to(torch.int32).clone(), "block_counts": counts.to(torch.int32).clone(),
               **{name: t.to(torch.int32).clone() for name, t in zip(TABLES, tables, strict=True)},
               **{name: torch.zeros(n, dtype=torch.int64) for name in OUTPUTS},
               "swa_indices": torch.zeros(n, window, dtype=torch.int32), "swa_lens": torch.zeros(n, dtype=torch.int32)}
    out = run(tensors, {}, {}, module_globals={"B": n // seq, "S": seq, "T": n, "WIN": window, "BLOCK_SIZE": block_size,
                                               "C128_COMPRESSOR_BLOCK_SIZE": hca_state_page,
                                               "C4A_COMPRESSOR_BLOCK_SIZE": csa_state_page})
    return {name: out[name] for name in OUTPUTS}


# The Flash folders renamed some of V4-Pro's modules (same golden function inside)
FLASH_RENAMES: tuple[tuple[str, str], ...] = (
    ("decode_sparse_attn", "decode_sparse_attn_csa"), ("decode_attention_swa", "decode_swa"),
    ("decode_attention_hca", "decode_hca"), ("decode_attention_csa", "decode_csa"),
    ("prefill_attention_swa", "prefill_swa"), ("prefill_attention_hca", "prefill_hca"),
    ("prefill_attention_csa", "prefill_csa"))


def _in(folder: str, adapters) -> dict[str, Adapter]:
    renames = FLASH_RENAMES if folder != PRO else ()
    return {a.operator: replace(a, folder=folder, renames=renames) for a in adapters}


# The adapters of each model folder (--model). The Flash folders' goldens adapted so far: the ones whose tensors
# and rule are V4-Pro's (checked against a checkout: tests/test_record_bindings.py, and the contracts on
# --backend upstream --model ...), and what only Flash has.
def _cp_swa_tensors(x_hc, weights, kv_cache, tail, plan) -> tuple[dict, dict]:
    """The CP SWA goldens' tensors under upstream's names (the plan's tables among them) and the context their
    fixtures install on the golden (each rank's two segments, the segments' starts and lengths, the prefix)."""
    hc_fn, hc_scale, hc_base, attn_norm_w, wq_a, wq_b, wq_b_scale, wkv, gamma_cq, gamma_ckv, freqs_cos, freqs_sin = \
        weights
    attn_sink, wo_a, wo_b, wo_b_scale = tail
    cp = x_hc.shape[0]
    owners = [[int(v) for v in row] for row in plan["owner_segments"].tolist()]
    lengths = [0] * (2 * cp)
    for rank, segs in enumerate(owners):
        for part, seg in enumerate(segs):
            lengths[seg] = int(plan["overlay_active_lengths"][rank, part, :, 1].sum())
    ctx = {"owner_segments": owners, "prefix": int(plan["segment_starts"][0]), "lengths": lengths,
           "starts": [int(v) for v in plan["segment_starts"].tolist()]}
    tensors = {"x_hc": x_hc.clone(), "hc_attn_fn": hc_fn.float().clone(), "hc_attn_scale": hc_scale.float().clone(),
               "hc_attn_base": hc_base.float().clone(), "attn_norm_w": attn_norm_w.clone(), "wq_a": wq_a.clone(),
               "wq_b": wq_b.clone(), "wq_b_scale": wq_b_scale.float().clone(), "wkv": wkv.clone(),
               "gamma_cq": gamma_cq.clone(), "gamma_ckv": gamma_ckv.clone(), "freqs_cos": freqs_cos.clone(),
               "freqs_sin": freqs_sin.clone(), "kv_cache": kv_cache.clone(), "attn_sink": attn_sink.float().clone(),
               "wo_a": wo_a.clone(), "wo_b": wo_b.clone(), "wo_b_scale": wo_b_scale.float().clone(),
               **{name: plan[name].to(torch.int32).clone() for name in (
                   "predecessor_segments", "query_position_ids", "query_token_to_request", "overlay_position_ids",
                   "overlay_token_to_request", "overlay_active_lengths", "swa_indices", "final_win_seg_src",
                   "final_win_row_src", "final_slot_mapping")},
               "x_out": torch.zeros_like(x_hc)}
    return tensors, ctx


def _prefill_cp_swa(run, x_hc, hc_fn, hc_scale, hc_base, attn_norm_w, wq_a, wq_b, wq_b_scale, wkv, gamma_cq,
                    gamma_ckv, freqs_cos, freqs_sin, kv_cache, attn_sink, wo_a, wo_b, wo_b_scale, plan, *, config,
                    ops=None):
    """prefill_cp_swa -> prefill_cp_swa.py::golden_prefill_cp_swa: the plan's tables under upstream's names, the
    ring's page count as PREFILL_ORI_MAX_BLOCKS, and the context its fixture installs on the golden (it computes
    with the first only)."""
    from kernels.v4.cp_swa import check_prefill_cp_swa

    check_prefill_cp_swa(x_hc, kv_cache, plan, config)  # the caller's side
    tensors, ctx = _cp_swa_tensors(x_hc, (hc_fn, hc_scale, hc_base, attn_norm_w, wq_a, wq_b, wq_b_scale, wkv, gamma_cq,
                                          gamma_ckv, freqs_cos, freqs_sin), kv_cache,
                                   (attn_sink, wo_a, wo_b, wo_b_scale), plan)
    out = run(tensors, _variant_fields(config), {"PREFILL_ORI_MAX_BLOCKS": int(kv_cache.shape[1]),
                                                  "BLOCK_SIZE": int(kv_cache.shape[2])},
              module_globals={"golden_prefill_cp_swa._ctx": ctx})
    return {"x_out": out["x_out"], "kv_cache": out["kv_cache"]}


def _state_tables_to(tables: torch.Tensor, config) -> torch.Tensor:
    """Each rank's state table padded with unmapped pages (-1) to every position the model holds: the CP HCA
    golden looks up the state row of every segment's snapshot, an empty segment's (past the chunk) included, and
    skips an unmapped page."""
    blocks = -(-config.max_position_embeddings // config.c128_state_block_size)
    out = torch.full((tables.shape[0], max(blocks, tables.shape[1])), -1, dtype=torch.int32)
    out[:, :tables.shape[1]] = tables
    return out


def _prefill_cp_hca(run, x_hc, hc_fn, hc_scale, hc_base, attn_norm_w, wq_a, wq_b, wq_b_scale, wkv, gamma_cq,
                    gamma_ckv, freqs_cos, freqs_sin, kv_cache, attn_sink, wo_a, wo_b, wo_b_scale, compressor, plan, *,
                    config, ops=None):
    """prefill_cp_hca -> prefill_cp_hca.py::golden_prefill_cp_hca: CP SWA's tensors and context, the compressor's
    weights (wkv / wgate transposed, as upstream stores them), each rank's state pool and compressed cache with
    their tables, the plan's HCA tables, and the fields of the context the HCA fixture adds (the world, the final
    segment). The golden pages the compressed cache by its module's CMP_STORAGE_BLOCK_SIZE (the Flash page, 128 /
    128 = 1 row), views each leaf's publication and the compressor's pools by module-level pool sizes, and sizes
    its segment loops by NUM_SEGMENTS (the compiled CP_SIZE's): all set to the call's."""
    from kernels.v4.cp_hca import check_prefill_cp_hca

    cp = check_prefill_cp_hca(x_hc, kv_cache, compressor, plan, config)  # the caller's side
    tensors, ctx = _cp_swa_tensors(x_hc, (hc_fn, hc_scale, hc_base, attn_norm_w, wq_a, wq_b, wq_b_scale, wkv, gamma_cq,
                                          gamma_ckv, freqs_cos, freqs_sin), kv_cache,
                                   (attn_sink, wo_a, wo_b, wo_b_scale), plan)
    cpage = int(compressor["cmp_kv"].shape[2])
    tensors.update({
        "cmp_wkv": compressor["cmp_wkv"].float().t().contiguous(),
        "cmp_wgate": compressor["cmp_wgate"].float().t().contiguous(),
        "cmp_ape": compressor["cmp_ape"].float().clone(), "cmp_norm_w": compressor["cmp_norm_w"].clone(),
        "compress_state": compressor["state_pool"].clone(),
        "compress_state_block_table": _state_tables_to(compressor["state_block_table"], config),
        "cmp_kv": compressor["cmp_kv"].clone(), "cmp_block_table": compressor["cmp_block_table"].to(torch.int32).clone(),
        **{name: plan[name].to(torch.int32).clone() for name in (
            "cmp_indices", "segment_tail_positions", "snapshot_positions", "snapshot_valid")},
        "query_positions": plan["query_position_ids"].to(torch.int32).clone()})
    ctx = {"cp_size": cp, "prefix": ctx["prefix"], "lengths": ctx["lengths"], "starts": ctx["starts"],
           "owners": ctx["owner_segments"], "final_segment": int(plan["final_segment"][0])}
    ratio128 = "prefill_compressor_ratio128."
    out = run(tensors, _variant_fields(config), {"PREFILL_ORI_MAX_BLOCKS": int(kv_cache.shape[1]),
                                                  "BLOCK_SIZE": int(kv_cache.shape[2])},
              module_globals={"golden_prefill_cp_hca._ctx": ctx, "NUM_SEGMENTS": 2 * cp,
                              "CMP_STORAGE_BLOCK_SIZE": cpage, "LEAF_CMP_BLOCKS": 1,
                              ratio128 + "CMP_STORAGE_BLOCK_SIZE": cpage, ratio128 + "HCA_CMP_BLOCK_NUM": 1,
                              ratio128 + "HCA_STATE_BLOCK_NUM": int(compressor["state_pool"].shape[1])})
    return {name: out[name] for name in ("x_out", "kv_cache")} | {"cmp_kv": out["cmp_kv"],
                                                                 "state_pool": out["compress_state"]}


def _prefill_cp_csa(run, x_hc, hc_fn, hc_scale, hc_base, attn_norm_w, wq_a, wq_b, wq_b_scale, wkv, gamma_cq,
                    gamma_ckv, freqs_cos, freqs_sin, kv_cache, attn_sink, wo_a, wo_b, wo_b_scale, compressor, plan, *,
                    config, ops=None, query_staging="bf16"):
    """prefill_cp_csa -> prefill_cp_csa.py::golden_prefill_cp_csa: CP SWA's tensors and context, both ratio-4
    compressors' weights (wkv / wgate transposed, as upstream stores them), each rank's states, compressed and index
    caches with their tables, the indexer's query weights, the rank-major places of the segments (reverse_index)
    and the context fields the CSA fixture adds (the world, the final segment). The golden pages its compressed and
    index caches alike by its module's CMP_STORAGE_BLOCK_SIZE (the Flash page, 128 / 4 = 32 rows): the call's must
    share one page, which is set there, in its compressors' leaf caches (one block each) and in the two compressor
    goldens' views (their state pools' sizes, T and their write buffers the CP tile's); its indexer scores at most
    CP_CANDIDATE_CAPACITY compressed positions and picks SPARSE_SELECTED_WIDTH of them: this project's score row
    (two cache blocks) and index_topk; its segment loops run over NUM_SEGMENTS, set to the call's world."""
    from contracts.operators import Unsupported
    from kernels.v4.cp_csa import check_prefill_cp_csa
    from kernels.v4.prefill_indexer import score_cap

    cp = check_prefill_cp_csa(x_hc, kv_cache, compressor, plan, config)  # the caller's side
    if query_staging != "rope-bf16":
        raise Unsupported("this golden's inline indexer rounds only the rope dims of its index query to BF16 "
                          f"(FLASH_VARIANTS: query_staging='rope-bf16'); query_staging={query_staging!r} is another "
                          "named rule (disagreement 25)")
    c = compressor
    page = int(c["idx_kv_cache"].shape[2])
    if int(c["cmp_kv"].shape[2]) != page:
        raise Unsupported(f"upstream's CP CSA golden pages its compressed and index caches alike; the call's pages "
                          f"are {int(c['cmp_kv'].shape[2])} and {page} rows")
    tensors, ctx = _cp_swa_tensors(x_hc, (hc_fn, hc_scale, hc_base, attn_norm_w, wq_a, wq_b, wq_b_scale, wkv, gamma_cq,
                                          gamma_ckv, freqs_cos, freqs_sin), kv_cache,
                                   (attn_sink, wo_a, wo_b, wo_b_scale), plan)
    owners = plan["owner_segments"]
    reverse = torch.zeros(2 * cp, dtype=torch.int32)
    for rank in range(cp):
        for part in range(2):
            reverse[int(owners[rank, part])] = 2 * rank + part
    tensors.update({
        **{f"{w}_{k}": c[f"{w}_{k}"].float().t().contiguous() for w in ("cmp", "inner") for k in ("wkv", "wgate")},
        **{f"{w}_{k}": c[f"{w}_{k}"].float().clone() for w in ("cmp", "inner") for k in ("ape", "norm_w")},
        "compress_state": c["state_pool"].clone(),
        "compress_state_block_table": c["state_block_table"].to(torch.int32).clone(),
        "inner_compress_state": c["inner_state_pool"].clone(),
        "inner_compress_state_block_table": c["inner_state_block_table"].to(torch.int32).clone(),
        "cmp_kv": c["cmp_kv"].clone(), "cmp_block_table": c["cmp_block_table"].to(torch.int32).clone(),
        "idx_kv_cache": c["idx_kv_cache"].clone(), "idx_kv_scale": c["idx_kv_scale"].float().clone(),
        "idx_block_table": c["idx_block_table"].to(torch.int32).clone(),
        "idx_wq_b": c["idx_wq_b"].clone(), "idx_wq_b_scale": c["idx_wq_b_scale"].float().clone(),
        "idx_weights_proj": c["weights_proj"].clone(), "hadamard_idx": c["hadamard"].clone(),
        "reverse_index": reverse, "query_positions": plan["query_position_ids"].to(torch.int32).clone(),
        "query_requests": plan["query_token_to_request"].to(torch.int32).clone(),
        "overlay_positions": plan["overlay_position_ids"].to(torch.int32).clone(),
        "overlay_requests": plan["overlay_token_to_request"].to(torch.int32).clone()})
    ctx = {"cp_size": cp, "starts": ctx["starts"], "lengths": ctx["lengths"], "owners": ctx["owner_segments"],
           "final_segment": int(plan["final_segment"][0])}
    tile = config.sliding_window
    leaf = {"T": tile, "MAX_CMP_WRITES": tile // 4}
    ratio4, inner = "prefill_compressor_ratio4.", "prefill_indexer_compressor."
    out = run(tensors, _variant_fields(config), {"PREFILL_ORI_MAX_BLOCKS": int(kv_cache.shape[1]),
                                                  "BLOCK_SIZE": int(kv_cache.shape[2])},
              module_globals={"golden_prefill_cp_csa._ctx": ctx, "NUM_SEGMENTS": 2 * cp,
                              "CMP_STORAGE_BLOCK_SIZE": page, "MAIN_LEAF_CACHE_BLOCKS": 1,
                              "IDX_LEAF_CACHE_BLOCKS": 1, "CP_CANDIDATE_CAPACITY": score_cap(config),
                              "SPARSE_SELECTED_WIDTH": config.index_topk,
                              **{ratio4 + k: v for k, v in leaf.items()}, **{inner + k: v for k, v in leaf.items()},
                              ratio4 + "CMP_STORAGE_BLOCK_SIZE": page, inner + "IDX_STORAGE_BLOCK_SIZE": page,
                              ratio4 + "CSA_STATE_BLOCK_NUM": int(c["state_pool"].shape[1]),
                              inner + "INNER_STATE_BLOCK_NUM": int(c["inner_state_pool"].shape[1])})
    return {"x_out": out["x_out"], "kv_cache": out["kv_cache"], "cmp_kv": out["cmp_kv"],
            "state_pool": out["compress_state"], "inner_state_pool": out["inner_compress_state"],
            "idx_kv_cache": out["idx_kv_cache"], "idx_kv_scale": out["idx_kv_scale"].to(c["idx_kv_scale"].dtype)}


class _Captured(Exception):
    """What a CP sublayer's adapter would hand the worker (captured, not run)."""

    def __init__(self, tensors, fields, constants, module_globals):
        super().__init__("captured")
        self.call = (tensors, fields, constants, module_globals)


def _capture(tensors, fields, constants, *, module_globals=None, **_):
    raise _Captured(tensors, fields, constants, module_globals or {})


def _prefill_cp_layer(run, x_hc, hc_fn, hc_scale, hc_base, attn_norm_w, wq_a, wq_b, wq_b_scale, wkv, gamma_cq,
                      gamma_ckv, freqs_cos, freqs_sin, kv_cache, attn_sink, wo_a, wo_b, wo_b_scale, moe, compressor,
                      plan, *, layer_id, config, ops=None, query_staging="bf16"):
    """prefill_cp_layer -> prefill_cp_layer.py::golden_prefill_layer_cp: the layer kind's CP sublayer tensors, laid
    out by that sublayer's adapter (its module-level settings aimed at its own module, its fixture context on its
    golden), and moe.py::golden_moe's weights; the golden dispatches on its SWA / CSA / HCA layer ids (set to the
    call's layer for its kind) and runs the MoE as one wave per (part, tile) over the CP ranks as EP ranks, so its
    domain is a world of MOE_RANKS ranks whose waves each hold one row count on every rank (its fixture's equal
    segments); any other call is unsupported, named."""
    from contracts.operators import Unsupported
    from kernels.v4.cp_layer import check_prefill_cp_layer

    kind = check_prefill_cp_layer(x_hc, moe, compressor, layer_id=layer_id, config=config,
                                  query_staging=query_staging)
    cp = x_hc.shape[0]
    if cp != MOE_RANKS:
        raise Unsupported(f"this golden runs its MoE over the {cp} CP ranks as EP ranks; its MoE golden is adapted at "
                          f"EP {MOE_RANKS}")
    active = plan["overlay_active_lengths"][..., 1]
    for part in range(2):
        for tile in range(2):
            counts = active[:, part, tile].tolist()
            if len(set(counts)) > 1:
                raise Unsupported(f"this golden runs one MoE wave per (part, tile) over the ranks, each holding one row "
                                  f"count: wave ({part}, {tile}) holds {counts} rows (equal segments only)")
    args = (x_hc, hc_fn, hc_scale, hc_base, attn_norm_w, wq_a, wq_b, wq_b_scale, wkv, gamma_cq, gamma_ckv, freqs_cos,
            freqs_sin, kv_cache, attn_sink, wo_a, wo_b, wo_b_scale)
    sub = {"prefill_cp_swa": lambda: _prefill_cp_swa(_capture, *args, plan, config=config),
           "prefill_cp_hca": lambda: _prefill_cp_hca(_capture, *args, compressor, plan, config=config),
           "prefill_cp_csa": lambda: _prefill_cp_csa(_capture, *args, compressor, plan, config=config,
                                                     query_staging=query_staging)}[kind]
    try:
        sub()
    except _Captured as got:
        tensors, _fields, constants, sub_globals = got.call
    module = kind  # the sublayer golden's module: its module-level settings are aimed there
    module_globals = {(k if "." in k else f"{module}.{k}"): v for k, v in sub_globals.items()}
    ids = moe["input_ids"]
    moe_tensors, fields = _moe_tensors(moe["hc_fn"], moe["hc_scale"], moe["hc_base"], moe["norm_w"], moe["gate_w"],
                                       moe["gate_bias"], moe["tid2eid"], ids.reshape(cp, -1)[0], moe["routed"],
                                       moe["shared"], config=config)
    tensors.update({**moe_tensors, "input_ids": ids.to(torch.int64).clone(), "layer_id": int(layer_id),
                    "x_next": torch.zeros_like(x_hc)})
    ids_name = {"prefill_cp_swa": "SWA_LAYER_ID", "prefill_cp_hca": "HCA_LAYER_ID", "prefill_cp_csa": "CSA_LAYER_ID"}
    module_globals[ids_name[kind]] = int(layer_id)
    constants = {**constants, "MOE_TOKENS": config.sliding_window}
    out = run(tensors, fields, constants, module="prefill_cp_layer", function="golden_prefill_layer_cp",
              module_globals=module_globals)
    names = {"prefill_cp_swa": ("kv_cache",), "prefill_cp_hca": ("kv_cache", "cmp_kv", "compress_state"),
             "prefill_cp_csa": ("kv_cache", "cmp_kv", "compress_state", "inner_compress_state", "idx_kv_cache",
                                "idx_kv_scale")}[kind]
    ours = {"compress_state": "state_pool", "inner_compress_state": "inner_state_pool"}
    result = {"x_next": out["x_next"], **{ours.get(n, n): out[n] for n in names}}
    if "idx_kv_scale" in result:
        result["idx_kv_scale"] = result["idx_kv_scale"].to(compressor["idx_kv_scale"].dtype)
    return result


def _q_kv_split(run, x_local, x_full, wq_a, wq_b, wq_b_scale, wkv, rope_cos_local, rope_sin_local, rope_cos_full,
                rope_sin_full, gamma_cq, gamma_ckv, *, config, ops=None):
    """v4_q_kv_split -> dspark's qkv_proj_rope.py::golden_q_kv_split (SPLIT_T_LOCAL / SPLIT_T_FULL the call's rows).
    The golden projects x_full once and slices the queries of its first SPLIT_T_LOCAL rows: it never reads x_local,
    so a call whose local rows (or RoPE rows) are not the chunk's first rows is unsupported."""
    from contracts.operators import Unsupported
    from kernels.v4.q_kv_split import check_q_kv_split
    from kernels.v4.qkv_proj import check_v4_qkv_proj_rope

    check_q_kv_split(x_local, x_full, rope_cos_local, rope_cos_full)
    weights = dict(wq_a=wq_a, wq_b=wq_b, wq_b_scale=wq_b_scale, wkv=wkv, gamma_cq=gamma_cq, gamma_ckv=gamma_ckv)
    check_v4_qkv_proj_rope(x_local, rope_cos=rope_cos_local, rope_sin=rope_sin_local, **weights, config=config)
    check_v4_qkv_proj_rope(x_full, rope_cos=rope_cos_full, rope_sin=rope_sin_full, **weights, config=config)
    n, t = x_local.shape[0], x_full.shape[0]
    if not all(torch.equal(a, b[:n]) for a, b in ((x_local, x_full), (rope_cos_local, rope_cos_full),
                                                   (rope_sin_local, rope_sin_full))):
        raise Unsupported("upstream's golden_q_kv_split takes the queries of the chunk's first rows (it never reads "
                          "x_local); the call's local rows are another share")
    heads, dim, lora = config.num_attention_heads, config.head_dim, config.q_lora_rank
    tensors = {"x_local": x_local.clone(), "x_full": x_full.clone(), "rope_cos_local": rope_cos_local.clone(),
               "rope_sin_local": rope_sin_local.clone(), "rope_cos_full": rope_cos_full.clone(),
               "rope_sin_full": rope_sin_full.clone(), **{k: v.clone() for k, v in weights.items()},
               "q": torch.zeros(n, heads, dim, dtype=torch.bfloat16), "qr": torch.zeros(n, lora, dtype=torch.int8),
               "qr_scale": torch.zeros(n, 1), "kv": torch.zeros(t, dim, dtype=torch.bfloat16)}
    out = run(tensors, _variant_fields(config), {}, function="golden_q_kv_split",
              module_globals={"SPLIT_T_LOCAL": n, "SPLIT_T_FULL": t})
    return {name: out[name] for name in ("q", "qr", "qr_scale", "kv")}


def _dspark_attention_heads(run, path, q, ori_kv, window_indices, cmp_kv, cmp_block_table, compressed, position_ids,
                            attn_sink, freqs_cos, freqs_sin, *, config, seq=None, num_tokens=None, key_tiles=None,
                            ops=None):
    """v4_attention_heads, decode -> dspark's decode_sparse_attn_{swa,hca}.py::golden_sparse_attn, T = the call's rows
    (``T_PAD`` its 16-row floor), the heads read back from ``o_packed_heads`` [groups, T_PAD, heads per group, hd].
    SWA: the window's valid slots first with their count in ``swa_lens`` (its golden reads a valid prefix). HCA: the
    golden attends each row's first min((pos + 1) // 128, K) compressed positions itself (HCA's deterministic
    top-k), so the call's slots must be those (each request's kv length its last position + 1). CSA: the indexer's
    raw top-k as it is (the golden keeps a slot where 0 <= raw < (pos + 1) // 4), both caches paged alike (its one
    BLOCK_SIZE), the window's columns and the top-k's tiled as the module's SPARSE_BLOCKS. The prefill form is not
    adapted."""
    from contracts.operators import Unsupported
    from kernels.v4.sparse_attention import attention_indices

    if num_tokens is not None or key_tiles not in (None, "columns"):
        raise Unsupported("dspark's attention-heads goldens are decode goldens (column key tiles): the prefill form "
                          "has none")
    window, cmp = attention_indices(path, q, window_indices, compressed, position_ids, num_tokens=None,
                                    config=config)
    tokens, heads, dim = q.shape
    seq = config.decode_seq if seq is None else seq
    if window.shape[1] > config.sliding_window:
        raise Unsupported(f"dspark's SWA golden reads {config.sliding_window} window columns; the call has "
                          f"{window.shape[1]}")
    if freqs_cos.shape[0] != tokens or freqs_sin.shape != freqs_cos.shape:
        from kernels.errors import ContractInputError
        from kernels.v4.attention_heads import SPEC

        raise ContractInputError("freqs_cos", None, f"one RoPE row per token ([{tokens}, rope])", list(freqs_cos.shape),
                                 SPEC)
    w = torch.cat((window.to(torch.int32), torch.full((tokens, config.sliding_window - window.shape[1]), -1,
                                                      dtype=torch.int32)), 1)
    groups, pad = config.o_groups, -(-tokens // 16) * 16
    tensors = {"q": q.clone(), "ori_kv": ori_kv.clone(), "attn_sink": attn_sink.float().clone(),
               "freqs_cos": freqs_cos.clone(), "freqs_sin": freqs_sin.clone(),
               "o_packed_heads": torch.zeros(groups, pad, heads // groups * dim, dtype=torch.bfloat16)}
    module_globals = {"T": tokens, "T_PAD": pad}
    if path == "SWA":
        tensors["swa_indices"], tensors["swa_lens"] = _valid_prefix(w)
        module_globals["ORI_BLOCK_NUM"] = int(ori_kv.shape[0])
    elif path == "CSA":  # the raw top-k: the golden keeps a slot where 0 <= raw < (pos + 1) // 4 itself
        if cmp_kv.shape[1] != ori_kv.shape[1]:
            raise Unsupported(f"dspark's CSA golden pages both caches by one BLOCK_SIZE; the call's pages are "
                              f"{ori_kv.shape[1]} (window) and {cmp_kv.shape[1]} (compressed)")
        topk = config.index_topk
        width = config.sliding_window + topk
        tensors.update(window_swa_indices=w, cmp_kv=cmp_kv.clone(), cmp_block_table=cmp_block_table.to(torch.int32),
                       idx_topk=compressed.to(torch.int32).clone(),
                       position_ids=position_ids.reshape(-1, 1).to(torch.int32))
        blocks = max(2, -(-width // 128))
        module_globals.update(S=seq, CMP_TOPK=topk, TOPK=width, SPARSE_BLOCKS=blocks, PADDED_TOPK=blocks * 128)
    else:  # HCA: the golden reads the first compressed positions itself, up to (pos + 1) // 128 of each row
        pos = position_ids.reshape(-1).to(torch.int64)
        kv_lens = pos.reshape(-1, seq).amax(1) + 1
        width = cmp.shape[1]
        for t in range(tokens):
            v = min(int(pos[t] + 1) // 128, width)
            if cmp[t, :v].tolist() != list(range(v)) or bool((cmp[t, v:] != -1).any()):
                raise Unsupported(f"row {t}: dspark's HCA golden attends the first {v} compressed positions itself "
                                  "(HCA's deterministic top-k); the call's slots are others")
        tensors.update(window_swa_indices=w, cmp_kv=cmp_kv.clone(), cmp_block_table=cmp_block_table.to(torch.int32),
                       position_ids=pos.to(torch.int32), kv_seq_lens=kv_lens.to(torch.int32))
        module_globals.update(S=seq, HCA_MAX_COMPRESSED_ROWS=width)
    out = run(tensors, _variant_fields(config), {"BLOCK_SIZE": int(ori_kv.shape[1])},
              module=f"decode_sparse_attn_{path.lower()}", module_globals=module_globals)
    packed = out["o_packed_heads"].reshape(groups, pad, heads // groups, dim)[:, :tokens]
    return packed.permute(1, 0, 2, 3).reshape(tokens, heads, dim).contiguous()


def _flash_gate(run, *args, **kwargs):
    """v4_gate -> the Flash folders' gate.py::golden_gate_core: V4-Pro's tensors and routing; its quantization factor
    is ``INT8_SCALE_MAX / amax`` with a Python float (torch: reciprocal(amax) · 127), the 'rounded-reciprocal' rule."""
    kwargs.setdefault("dequant_factor", "rounded-reciprocal")
    return _gate(run, *args, golden_rule="rounded-reciprocal", **kwargs)


def _laid_out(name: str, **layout) -> Adapter:
    """V4-Pro's adapter of ``name`` with one of the folders' layouts (its build's keyword arguments)."""
    pro = ADAPTERS[name]
    return replace(pro, build=partial(pro.build, **layout))


# V4-Pro's adapters whose goldens the Flash folders share (every contract of theirs passes on both Flash folders on
# 634e77bd), hc_head with the Flash goldens' sliced tiles (split_chunks=False); mtp_projection is Flash-MTP's alone
# (dspark has no mtp_projection.py). v4_expert: its contracts pass, though the Flash expert golden dequantizes the
# weights before an FP32 matmul, a BF16 ulp off V4-Pro's exact INT32 accumulate at some ties (docs/upstream.md,
# disagreement 15: V4-Pro's up- trees are not judged on a Flash folder). Not yet: v4_qkv_proj_rope (its golden
# differs), lm_head (its golden's DP layout).
_FLASH_SHARED: list[Adapter] = [*(ADAPTERS[n] for n in ("hc_post", "final_norm", "v4_expert", "hc_pre_fused")),
                                replace(_laid_out("hc_head_fused", split_chunks=False, rows_port=False), forms=()),
                                _laid_out("v4_qkv_proj_rope", a5_tiling=False),
                                replace(_laid_out("lm_head", card_owners=True, all_ranks=False), forms=())]
_FLASH_OWN = [Adapter("lookup_embedding", FLASH_MTP, "lookup_embedding", "golden_lookup_embedding_test",
                      _lookup_embedding),
              Adapter("v4_gate", FLASH_MTP, "gate", "golden_gate_core", _flash_gate)]
BY_FOLDER: dict[str, dict[str, Adapter]] = {
    PRO: dict(ADAPTERS),
    # Flash-MTP pages its compressed and index caches by the rows of one 128-token block (disagreement 17): the
    # compressor's and its publication's page 128 / ratio, the attention's own compressed page, the indexer's 32 keys
    FLASH_MTP: _in(FLASH_MTP, [*_FLASH_SHARED, *(ADAPTERS[n] for n in ("mtp_projection", "v4_moe_stage")),
                               _laid_out("v4_compressor", pages_per_ratio=True),
                               _laid_out("v4_attention", own_cmp_page=True),
                               _laid_out("v4_indexer", flash_pages=True),
                               _laid_out("v4_compress_and_publish", pages_per_ratio=True),
                               _laid_out("v4_prefill_compressor", module_pools=True),
                               _laid_out("v4_prefill_index_keys", module_pools=True),
                               _laid_out("v4_prefill_indexer", flash_pages=True),
                               Adapter("cp_zigzag_tail_exchange", FLASH_MTP, "prefill_cp_zigzag",
                                       "golden_prefill_cp_zigzag_kv_tail_exchange", _cp_zigzag_tail_exchange),
                               Adapter("prefill_cp_swa", FLASH_MTP, "prefill_cp_swa", "golden_prefill_cp_swa",
                                       _prefill_cp_swa),
                               Adapter("prefill_cp_hca", FLASH_MTP, "prefill_cp_hca", "golden_prefill_cp_hca",
                                       _prefill_cp_hca),
                               Adapter("prefill_cp_csa", FLASH_MTP, "prefill_cp_csa", "golden_prefill_cp_csa",
                                       _prefill_cp_csa),
                               Adapter("prefill_cp_layer", FLASH_MTP, "prefill_cp_layer", "golden_prefill_layer_cp",
                                       _prefill_cp_layer, also=("prefill_cp_swa", "prefill_cp_hca", "prefill_cp_csa",
                                                                "moe")),
                               _laid_out("v4_attention_stage", a5_tiling=False),
                               replace(_laid_out("v4_mtp_layer", a5_tiling=False, fused_lm_head=True),
                                       function="golden_decode_mtp"),
                               _laid_out("v4_prefill_mtp_layer", a5_tiling=False, fused_lm_head=True),
                               Adapter("v4_prefill_layer", FLASH_MTP, "prefill_layer", "golden_prefill_layer",
                                       _v4_prefill_layer,
                                       also=("prefill_swa", "moe")),
                               _laid_out("v4_hca_stage", a5_tiling=False, own_cmp_page=True, folder_rule="all"),
                               _laid_out("v4_csa_stage", a5_tiling=False, own_cmp_page=True),
                               _laid_out("v4_prefill_hca_stage", a5_tiling=False, module_pools=True),
                               _laid_out("v4_prefill_csa_stage", a5_tiling=False, flash_pages=True),
                               replace(_laid_out("v4_decode_layer", a5_tiling=False, own_cmp_page=True,
                                                 goldens=FLASH_LAYER_GOLDENS, folder_rule="all"),
                                       function="golden_decode_layer"),
                               *_FLASH_OWN]),
    # dspark keeps V4-Pro's pages (its own page of 32 on the device) and takes its rows token-major; its moe.py
    # divides the expert count by 16 at import
    FLASH_DSPARK: {**_in(FLASH_DSPARK, [*_FLASH_SHARED, *_FLASH_OWN,
                                        _laid_out("v4_compressor", flat_tokens=True),
                                        _laid_out("v4_moe_stage", preset_world=16),
                                        _laid_out("v4_indexer", flat_tokens=True),
                                        _laid_out("v4_compress_and_publish", flat_tokens=True),
                                        _laid_out("v4_prefill_compressor", rows_from_x=True, module_pools=True),
                                        _laid_out("v4_prefill_index_keys", rows_from_x=True),
                                        _laid_out("v4_prefill_indexer", rows_from_x=True),
                                        _laid_out("v4_prefill_hca_stage", a5_tiling=False, rows_from_x=True),
                                        replace(_laid_out("v4_attention_stage", a5_tiling=False,
                                                          rows_from_x=True),
                                                module="prefill_attention_swa",
                                                function="golden_prefill_attention_swa",
                                                also=("decode_attention_swa", "decode_o_proj"),
                                                forms=(("decode_attention_swa", "golden_decode_swa_tp1"),
                                                       ("decode_attention_swa", "golden_decode_swa"))),
                                        _laid_out("v4_prefill_csa_stage", a5_tiling=False, rows_from_x=True),
                                        replace(ADAPTERS["v4_hca_stage"], build=_dspark_hca_stage,
                                                function="golden_decode_hca_tp1",
                                                also=(*ADAPTERS["v4_hca_stage"].also, "decode_o_proj"),
                                                forms=(("decode_attention_hca", "golden_decode_hca"),)),
                                        replace(ADAPTERS["v4_csa_stage"], build=_dspark_csa_stage,
                                                function="golden_decode_csa_tp1",
                                                also=(*ADAPTERS["v4_csa_stage"].also, "decode_o_proj"),
                                                forms=(("decode_attention_csa", "golden_decode_csa"),)),
                                        Adapter("tp_reduce_scatter", FLASH_DSPARK, "decode_o_proj",
                                                "golden_decode_attention_collectives_fixture", _tp_reduce_scatter),
                                        Adapter("prefill_kv_allgather", FLASH_DSPARK, "prefill_kv_allgather",
                                                "golden_prefill_kv_allgather", _prefill_kv_allgather),
                                        Adapter("markov_head", FLASH_DSPARK, "markov_head", "golden_markov_head",
                                                _markov_head),
                                        Adapter("dspark_proj", FLASH_DSPARK, "dspark_proj", "golden_dspark_proj",
                                                _dspark_proj),
                                        Adapter("dspark_markov_sample", FLASH_DSPARK, "dspark_markov",
                                                "golden_nonzero_markov", _dspark_markov_sample),
                                        Adapter("dspark_context_kv", FLASH_DSPARK, "dspark_context_kv",
                                                "golden_dspark_context_kv", _dspark_context_kv),
                                        Adapter("dspark_attention", FLASH_DSPARK, "dspark_attention",
                                                "golden_dspark_attention", _dspark_attention),
                                        Adapter("dspark_drafter", FLASH_DSPARK, "dspark_drafter",
                                                "golden_dspark_drafter", _dspark_drafter),
                                        Adapter("v4_heads_projection", FLASH_DSPARK, "decode_o_proj",
                                                "golden_decode_o_proj_tp1", _heads_projection),
                                        Adapter("v4_heads_projection_partial", FLASH_DSPARK, "decode_o_proj",
                                                "golden_decode_o_proj", _heads_projection_partial),
                                        Adapter("dspark_decode_metadata", FLASH_DSPARK, "decode_metadata",
                                                "golden_decode_metadata", _dspark_decode_metadata),
                                        Adapter("v4_q_kv_split", FLASH_DSPARK, "qkv_proj_rope", "golden_q_kv_split",
                                                _q_kv_split),
                                        Adapter("v4_attention_heads", FLASH_DSPARK, "decode_sparse_attn_swa",
                                                "golden_sparse_attn", _dspark_attention_heads,
                                                also=("decode_sparse_attn_hca", "decode_sparse_attn_csa"),
                                                forms=(("decode_sparse_attn_hca", "golden_sparse_attn"),
                                                       ("decode_sparse_attn_csa", "golden_sparse_attn")))]),
                   "lookup_embedding": Adapter("lookup_embedding", FLASH_DSPARK, "lookup_embedding",
                                               "golden_lookup_embedding_test", _dspark_lookup_embedding)},
}


def adapters_for(model: str) -> dict[str, Adapter]:
    """operator -> Adapter of one model (``MODELS``: a folder, or a folder with a preset, whose adapters are the
    folder's); a model not known is a usage error."""
    from kernels.record import MODELS, folder_of

    if model not in MODELS:
        from contracts.operators import BackendError

        raise BackendError(f"--model {model}: expected one of {', '.join(MODELS)}")
    return BY_FOLDER[folder_of(model)]


PRESET_ENV = {"flash": {"DEEPSEEK_V4_VARIANT": "flash"}}  # what a folder preset sets in the upstream worker


def preset_environment(model: str) -> dict[str, str]:
    """The environment the upstream worker needs for ``model``'s preset (``deepseek_v4_pro:flash``:
    DEEPSEEK_V4_VARIANT=flash, read by V4-Pro's config.py at import); empty for a folder's default."""
    from kernels.record import preset_of

    return dict(PRESET_ENV.get(preset_of(model), {}))


def variants_for(folder: str) -> dict[str, dict[str, str]]:
    """The named rules one folder's goldens follow (``VARIANTS``, then the folder's own where it differs)."""
    own = {FLASH_MTP: FLASH_VARIANTS, FLASH_DSPARK: DSPARK_VARIANTS}.get(folder, {})
    return {**VARIANTS, **own}


# Where upstream's golden follows a named variant of this project's rule rather than the default (the contracts
# pinning that rule judge this backend by it); see docs/upstream.md
VARIANTS: dict[str, dict[str, str]] = {
    # gate.py's golden dequantizes by 1 / (127 / amax); its kernel (and this project's default) by amax · (1/127)
    "v4_gate": {"dequant_factor": "reciprocal"},
    # prefill_indexer.py's golden scores every row of the chunk, padding rows up to the real rows' widest range
    "v4_prefill_indexer": {"padding_rows": "scored_capped"},
}
# The Flash folders' gate golden takes its quantization factor as reciprocal(amax) · 127 (see _flash_gate)
FLASH_VARIANTS: dict[str, dict[str, str]] = {"v4_gate": {"dequant_factor": "rounded-reciprocal"},
                                             # Flash-MTP's decode HCA stage attends every compressed position the
                                             # model holds (no index_topk limit): disagreement 23
                                             "v4_hca_stage": {"hca_topk_limit": "all"},
                                             "v4_decode_layer": {"hca_topk_limit": "all"},
                                             # Flash-MTP's CP CSA golden keeps its index query's nope dims in FP32
                                             # (its kernel rounds the whole query to BF16): disagreement 25
                                             "prefill_cp_csa": {"query_staging": "rope-bf16"},
                                             "prefill_cp_layer": {"query_staging": "rope-bf16"}}
# dspark's prefill compressors scatter the chunk's state first and read each window back from it; its prefill chunk
# holds only real rows
DSPARK_VARIANTS: dict[str, dict[str, str]] = {**FLASH_VARIANTS, "v4_prefill_compressor": {"unpersisted": "state"},
                                              "v4_prefill_index_keys": {"unpersisted": "state"},
                                              # its chunk has no padding rows (the adapter's are unscored)
                                              "v4_prefill_indexer": {"padding_rows": "unscored"},
                                              # the drafter attention's golden keeps its probabilities in FP32
                                              # (its kernel rounds them to BF16): disagreement 21
                                              "dspark_attention": {"probabilities": "fp32"}}

# Named ways upstream's goldens depart from a property a contract pins, not a rule of the kernel (docs/upstream.md)
DEVIATIONS: dict[str, str] = {
    "cp-csa-seed-state": "Flash-MTP's CP CSA golden compresses a segment over only the last start % 4 + 4 rows of "
                         "its predecessor (what its first overlapping window reads) and then hands every rank the "
                         "final segment's states of the chunk's last 8 positions: when the final segment holds fewer "
                         "than 4 - start % 4 rows, the earliest of those positions precede that seed and their rows "
                         "are written as 0; the next step's windows never read them (found 2026-12-04: a final "
                         "segment of one row at 130, position 123's rows 0 on every rank)",
    "topk-tie-order": "upstream's goldens pick an indexer's top-k with torch.topk, whose order among equal scores is "
                      "unspecified; the ABI takes the lower position first. Scores tie exactly where a candidate's "
                      "every head is cut by the relu (a score of 0), so a row whose k-th and (k + 1)-th scores are "
                      "equal may pick other candidates (found 2026-12-04 on Flash-MTP's prefill_cp_csa.py golden: every "
                      "pick that differed from this project's, under the golden's own query rule, was such a tie at 0)",
    "batched-host-matmul": "upstream's goldens project a whole chunk with one FP32 host matmul (x @ w.t()), whose "
                           "rows depend on how many rows share the call by an ulp on this CPU; a kernel's rows do "
                           "not, and the contracts pin that (chunk-split invariance)",
    "fp32-layer-chain": "upstream's whole-layer goldens run every stage in their own FP32 order; through the MoE "
                        "stage's INT8 requantization and experts, a prefill MTP layer's outputs then land past "
                        "upstream's own kernel bound (ratio_reldiff 0.02, 5 %) against this project's FP64 reference "
                        "on some inputs and not others, on both folders (seeds 0-5 and 17: V4-Pro past at seed 3, "
                        "15.6 %; Flash-MTP at seed 17, 6.7 %), with every stage inside its own contract's bound; the "
                        "layer is judged by its contracts (each stage against the reference, the layer against its "
                        "stages in order)",
}

# Operators upstream main has a golden for, not yet adapted (the golden named); every other operator: upstream
# main has no golden for it (V4.1-Flash's, the harness's own compositions, comparators).
PENDING: dict[str, str] = {
}

# Operators whose arithmetic upstream's goldens cover only fused with another operator's: no golden of the
# operator alone, so no adapter (the fused golden is adapted where this project has the fused operator)
_PRE = f"upstream's models/{PRO}/hc_pre.py::golden_hc_pre fuses hc_mixes and hc_pre (x_hc, fn, scale, base -> " \
       "x_mixed, post, comb; its pre mix is never an output): adapted as hc_pre_fused, whose contract judges both"
_HEAD = f"upstream's models/{PRO}/hc_head.py::golden_hc_head fuses v4_head_mix and hc_head (its pre mix is never an " \
        "output): adapted as hc_head_fused, whose contract judges both"
FUSED: dict[str, str] = {
    "hc_mixes": _PRE,
    "hc_pre": _PRE,
    "v4_head_mix": _HEAD,
    "hc_head": _HEAD,
    "v4_publish_compressed": f"upstream's models/{PRO}/decode_compressor_ratio*.py goldens pool, rotate and write the "
                             "cache in one call (v4_compressor is adapted through them with the identity rotation)",
    "v4_sparse_attention": f"upstream's models/{PRO}/decode_sparse_attn*.py::golden_sparse_attn fuse the sparse "
                           "attention with the output projection (v4_attention is adapted through them)",
    "v4_output_projection": f"upstream's models/{PRO}/decode_sparse_attn*.py::golden_sparse_attn fuse the output "
                            "projection with the sparse attention (v4_attention is adapted through them)",
    "v4_moe": f"upstream's models/{PRO}/moe.py::golden_moe is the whole stage (hc_pre, gate, experts, combine, "
              "hc_post: v4_moe_stage)",
}
