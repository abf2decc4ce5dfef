"""One adapter per operator that upstream has a golden function for: it maps this project's call (argument
layout, dtypes, padding conventions, geometry) onto the golden's tensors dict and its outputs back. Upstream's
goldens do not validate their inputs, so each adapter first applies this project's input checks (the caller's
side of the ABI): the bad-call contracts judge those checks, not upstream.

``ADAPTERS``: operator -> Adapter. ``UNADAPTED``: operator -> why it has none yet (upstream's golden named where
one exists). Both are read by ``backends.upstream.backend`` for the per-operator summary.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

PRO = "deepseek_v4_pro"


@dataclass(frozen=True)
class Adapter:
    operator: str
    folder: str
    module: str
    function: str
    build: Callable  # (run, *args, **kwargs) -> outputs, where run(tensors, fields, constants) calls the golden

    @property
    def upstream(self) -> str:
        return f"models/{self.folder}/{self.module}.py::{self.function}"


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
          padding_codes="quantized", dequant_factor="reciprocal"):
    """v4_gate -> gate.py::golden_gate_core at T = x_mixed rows (MOE_TOKENS), the call's experts and vocabulary.
    Upstream has one padding rule (every row coded): the 'zero' variant is this project's only."""
    from contracts.backends import Unsupported
    from kernels.v4.gate import _check

    _check(x_mixed, norm_w, gate_w, gate_bias, layer_id, num_tokens, tid2eid, input_ids, config)  # the caller's side
    if padding_codes != "quantized":
        raise Unsupported(f"upstream's gate golden codes every row; padding_codes={padding_codes!r} is this "
                          "project's named variant only")
    if dequant_factor != "reciprocal":
        raise Unsupported(f"upstream's gate golden dequantizes by 1 / (127 / amax); dequant_factor={dequant_factor!r} "
                          "is upstream's kernel's rule, not its golden's")
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


ADAPTERS: dict[str, Adapter] = {a.operator: a for a in (
    Adapter("v4_gate", PRO, "gate", "golden_gate_core", _gate),
    Adapter("mtp_projection", PRO, "mtp_projection", "golden_mtp_projection", _mtp_projection),
)}

# Where upstream's golden follows a named variant of this project's rule rather than the default (the contracts
# pinning that rule judge this backend by it); see docs/upstream.md
VARIANTS: dict[str, dict[str, str]] = {
    # gate.py's golden dequantizes by 1 / (127 / amax); its kernel (and this project's default) by amax · (1/127)
    "v4_gate": {"dequant_factor": "reciprocal"},
}

# Operators upstream main has a golden for, not yet adapted (the golden named); every other operator: upstream
# main has no golden for it (V4.1-Flash's, the harness's own compositions, comparators).
PENDING: dict[str, str] = {
    "v4_expert": f"models/{PRO}/expert_routed.py::golden_expert_routed",
    "v4_moe": f"models/{PRO}/moe.py::golden_moe",
    "hc_pre": f"models/{PRO}/hc_pre.py::golden_hc_pre",
    "hc_post": f"models/{PRO}/hc_post.py::golden_hc_post",
    "hc_head": f"models/{PRO}/hc_head.py::golden_hc_head",
    "lm_head": f"models/{PRO}/lm_head.py::golden_lm_head",
    "v4_qkv_proj_rope": f"models/{PRO}/qkv_proj_rope.py::golden_qkv_proj_rope",
    "v4_compressor": f"models/{PRO}/decode_compressor_ratio4.py / decode_compressor_ratio128.py::golden_compressor",
    "v4_prefill_compressor": f"models/{PRO}/prefill_compressor_ratio4.py / _ratio128.py",
    "v4_indexer": f"models/{PRO}/decode_indexer.py::golden_indexer",
    "v4_prefill_indexer": f"models/{PRO}/prefill_indexer.py::golden_prefill_indexer",
    "v4_prefill_index_keys": f"models/{PRO}/prefill_indexer_compressor.py::golden_prefill_indexer_compressor",
    "v4_sparse_attention": f"models/{PRO}/decode_sparse_attn*.py::golden_sparse_attn",
    "v4_attention_stage": f"models/{PRO}/decode_attention_{{swa,csa,hca}}.py::golden_attention_*",
    "v4_decode_metadata": f"models/{PRO}/decode_metadata.py",
    "v4_mtp_layer": f"models/{PRO}/decode_mtp.py::golden_mtp_decode_layer",
    "v4_prefill_mtp_layer": f"models/{PRO}/prefill_mtp.py::golden_mtp_prefill_fwd",
}
