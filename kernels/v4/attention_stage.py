"""One V4 attention stage of a decode layer (spec §8; upstream decode_attention_swa.py, and the same chain in
decode_attention_hca.py / decode_attention_csa.py around their compressors):

    hc_mixes / hc_pre -> RMSNorm (attn_norm_w) -> v4_qkv_proj_rope -> write kv into the window cache
    -> v4_attention -> hc_post

* the streams x_hc [T, hc, D] FP32 are collapsed with the stage's pre mix (``kernels.reference.mhc``: the same
  inverse RMS over hc·D, sigmoid maps and Sinkhorn as V4.1, with V4's 20 iterations), rounded to BF16, then
  RMS-normalised with ``attn_norm_w`` (FP32, one BF16 rounding);
* the RoPE rows are the tables' rows at each token's position (``freqs_cos`` / ``freqs_sin``
  [positions, rope] BF16);
* each token's kv row is written at ``swa_slot_mapping[t]`` (-1: no write) **before** the attention reads
  the cache, so a token sees its own row and the earlier rows of its chunk;
* the attention output goes back through ``hc_post`` with the stage's post and residual mixes: x_out
  [T, hc, D] FP32.
* prefill form (``num_tokens`` given; upstream prefill_attention_swa.py): the chunk is one request of T rows,
  rows from ``num_tokens`` on are padding -- their position is not read, they write no kv row whatever their
  slot says, attend nothing, and their x_out, qr and qr_scale are exactly 0 (hc_post_prefill's zero tail).
  ``window_indices`` then comes from ``v4_prefill_swa_indices``.

Composed from the backend's operators (``hc_mixes``, ``hc_pre``, ``final_norm``, ``v4_qkv_proj_rope``,
``v4_attention``, ``hc_post``). For HCA / CSA, ``cmp_kv`` / ``cmp_block_table`` / ``compressed`` are the
compressed cache and slots the path's compressor and selector produced (``v4_attention``'s arguments).

Spec: §8; docs/coverage.md, V4 section (V4-21).
"""

from __future__ import annotations

from functools import partial

import torch

from kernels.errors import ContractInputError, is_int
from kernels.operators import operator

SPEC = "§8"


def stage_positions(position_ids: torch.Tensor, freqs_cos: torch.Tensor, *, tokens: int,
                    num_tokens: int | None) -> tuple[int, torch.Tensor]:
    """The caller's side of a stage's positions: (real rows, positions [T] INT64, padding rows' set to 0)."""
    prefill = num_tokens is not None
    if prefill and (not is_int(num_tokens) or not 0 <= num_tokens <= tokens):
        raise ContractInputError("num_tokens", None, f"an int in [0, {tokens}]", repr(num_tokens), SPEC)
    real = num_tokens if prefill else tokens
    pos = position_ids.reshape(-1).to(torch.int64)
    if prefill and pos.shape[0] == tokens:
        pos = torch.where(torch.arange(tokens) < real, pos, 0)  # a padding row's position is never read
    if pos.shape[0] != tokens or bool((pos < 0).any()) or bool((pos >= freqs_cos.shape[0]).any()):
        bad = int(((pos < 0) | (pos >= freqs_cos.shape[0])).nonzero()[0]) if pos.shape[0] == tokens else None
        raise ContractInputError("position_ids", (bad,) if bad is not None else None,
                                 f"{tokens} positions in [0, {freqs_cos.shape[0]}) (the RoPE table rows)",
                                 pos.tolist(), SPEC)
    return real, pos


@operator(returns='{x_out [T,hc,D] FP32, kv_cache, qr, qr_scale}: hc_pre, RMSNorm, Q/KV '
                   "projection, the kv write, v4_attention, hc_post -- composed from this backend's "
                   'operators',
          spec='§8')
def v4_attention_stage(path: str, x_hc: torch.Tensor, hc_fn: torch.Tensor, hc_scale: torch.Tensor,
                       hc_base: torch.Tensor, attn_norm_w: torch.Tensor, wq_a: torch.Tensor, wq_b: torch.Tensor,
                       wq_b_scale: torch.Tensor, wkv: torch.Tensor, gamma_cq: torch.Tensor, gamma_ckv: torch.Tensor,
                       freqs_cos: torch.Tensor, freqs_sin: torch.Tensor, kv_cache: torch.Tensor,
                       swa_slot_mapping: torch.Tensor, window_indices: torch.Tensor, position_ids: torch.Tensor,
                       attn_sink: torch.Tensor, wo_a: torch.Tensor, wo_b: torch.Tensor, wo_b_scale: torch.Tensor,
                       cmp_kv: torch.Tensor | None = None, cmp_block_table: torch.Tensor | None = None,
                       compressed: torch.Tensor | None = None, *, config, num_tokens: int | None = None,
                       ops=None) -> dict[str, torch.Tensor]:
    """-> {"x_out" [T, hc, D] FP32, "kv_cache" (the new window cache), "qr" [T, Q_LORA] INT8, "qr_scale"
    [T, 1] FP32}. The input cache is not modified. ``num_tokens``: the prefill form (module doc). Spec: §8."""
    from kernels.reference import lm_head, mhc
    from kernels.v4.qkv_proj import v4_qkv_proj_rope
    from kernels.v4.sparse_attention import v4_attention

    ops = ops or {}
    mixes_of = ops.get("hc_mixes", mhc.hc_mixes)
    collapse = ops.get("hc_pre", mhc.hc_pre)
    expand = ops.get("hc_post", mhc.hc_post)
    norm = ops.get("final_norm", lm_head.final_norm)
    project = ops.get("v4_qkv_proj_rope", v4_qkv_proj_rope)
    attend = ops.get("v4_attention", v4_attention)
    if getattr(attend, "composes_operators", False):
        attend = partial(attend, ops=ops)

    tokens = x_hc.shape[0]
    prefill = num_tokens is not None
    real, pos = stage_positions(position_ids, freqs_cos, tokens=tokens, num_tokens=num_tokens)
    mixes = mixes_of(x_hc, hc_fn, hc_scale, hc_base, config=config)
    x_normed = norm(collapse(x_hc, mixes.pre), attn_norm_w, config=config)
    rope_cos, rope_sin = freqs_cos[pos], freqs_sin[pos]
    proj = project(x_normed, wq_a, wq_b, wq_b_scale, wkv, rope_cos, rope_sin, gamma_cq, gamma_ckv, config=config)

    cache = kv_cache.clone()
    flat = cache.reshape(-1, cache.shape[-1])
    for t, slot in enumerate(swa_slot_mapping.reshape(-1).tolist()):
        if slot < 0 or t >= real:  # padding rows write nothing
            continue
        if slot >= flat.shape[0]:
            raise ContractInputError("swa_slot_mapping", (t,), f"a row in [0, {flat.shape[0]})", slot, SPEC)
        flat[slot] = proj["kv"][t].to(cache.dtype)  # written before the attention reads the cache

    if path == "SWA":  # no compressed slots: a placeholder the attention never reads
        cmp_kv = torch.zeros(1, cache.shape[1], 1, cache.shape[-1], dtype=cache.dtype)
        cmp_block_table = torch.zeros(1 if prefill else tokens // config.decode_seq, 1, dtype=torch.int32)
    elif cmp_kv is None or cmp_block_table is None:
        raise ContractInputError("cmp_kv", None, f"the {path} compressed cache and its block table", None, SPEC)
    chunk = {"seq": tokens, "num_tokens": real} if prefill else {}
    out = attend(path, proj["q"], cache, window_indices, cmp_kv, cmp_block_table, compressed, position_ids,
                 attn_sink, rope_cos, rope_sin, wo_a, wo_b, wo_b_scale, config=config, **chunk)
    x_out = expand(out, x_hc, mixes.post, mixes.residual)
    qr, qr_scale = proj["qr"], proj["qr_scale"]
    if prefill:  # the zero tail: padding rows leave nothing behind (the operators' outputs are this stage's own)
        x_out[real:], qr[real:], qr_scale[real:] = 0, 0, 0
    return {"x_out": x_out, "kv_cache": cache, "qr": qr, "qr_scale": qr_scale}


v4_attention_stage.composes_operators = True
