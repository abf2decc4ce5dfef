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
from kernels.record import CaseSpec, Record, Upstream, generator, int8_codes

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


# --- the record ----------------------------------------------------------------------------------------------

_STAGE_NAMES = ("x_hc", "hc_fn", "hc_scale", "hc_base", "attn_norm_w", "wq_a", "wq_b", "wq_b_scale", "wkv", "gamma_cq",
                "gamma_ckv", "freqs_cos", "freqs_sin", "kv_cache", "swa_slot_mapping", "window_indices",
                "position_ids", "attn_sink", "wo_a", "wo_b", "wo_b_scale")


def _swa_window(config, slots: torch.Tensor) -> torch.Tensor:
    """Each row's window: 8 earlier cache rows of its request, then this chunk's rows up to the token; -1 after."""
    t = config.decode_tokens
    window = torch.full((t, config.sliding_window - 1), -1, dtype=torch.int32)
    for r in range(t):
        first = r - r % config.decode_seq
        rows = torch.cat((torch.arange(8 * (r // 2), 8 * (r // 2) + 8), slots[first:r + 1])).to(torch.int32)
        window[r, : rows.numel()] = rows
    return window


def _swa_stage_inputs(seed: int, wiring: str, config) -> dict[str, torch.Tensor]:
    """The decode batch's requests at positions 40.. (two rows each), windows over 8 earlier cache rows of their
    own plus this chunk's rows up to the token, the current rows written at slots 200 + t (the attention reads
    them after the write), one window column short of the full width."""
    g = generator(seed)
    c = config
    t, hc, dm = c.decode_tokens, c.hc_mult, c.hidden_size
    h, d, lora, rope = c.num_attention_heads, c.head_dim, c.q_lora_rank, c.qk_rope_head_dim
    mix = (2 + hc) * hc
    pos = torch.tensor([40 + 20 * (r // 2) + r % 2 for r in range(t)], dtype=torch.int32)
    slots = torch.arange(200, 200 + t)
    angle = torch.arange(512, dtype=torch.float32)[:, None] * torch.rand(rope, generator=g) * 0.05
    return {"x_hc": torch.randn(t, hc, dm, generator=g), "hc_fn": torch.randn(mix, hc * dm, generator=g) * 0.05,
            "hc_scale": torch.tensor([2.0, 0.02, 0.25]), "hc_base": torch.randn(mix, generator=g),
            "attn_norm_w": (torch.rand(dm, generator=g) + 0.5).to(torch.bfloat16),
            "wq_a": (torch.randn(dm, lora, generator=g) / dm**0.5).to(torch.bfloat16),
            "wq_b": int8_codes((lora, h * d), g), "wq_b_scale": torch.rand(h * d, generator=g) / 127 + 1e-3,
            "wkv": (torch.randn(dm, d, generator=g) / dm**0.5).to(torch.bfloat16),
            "gamma_cq": (torch.rand(lora, generator=g) + 0.5).to(torch.bfloat16),
            "gamma_ckv": (torch.rand(d, generator=g) + 0.5).to(torch.bfloat16),
            "freqs_cos": torch.cos(angle).to(torch.bfloat16), "freqs_sin": torch.sin(angle).to(torch.bfloat16),
            "kv_cache": (torch.rand(2, c.block_size, 1, d, generator=g) - 0.5).to(torch.bfloat16),
            "swa_slot_mapping": slots, "window_indices": _swa_window(c, slots), "position_ids": pos,
            "attn_sink": torch.randn(h, generator=g),
            "wo_a": ((torch.rand(c.o_groups, c.o_lora_rank, h * d // c.o_groups, generator=g) - 0.5) / 4
                     ).to(torch.bfloat16),
            "wo_b": int8_codes((dm, c.o_groups * c.o_lora_rank), g), "wo_b_scale": torch.rand(dm, generator=g) / 500}


RECORD = Record(
    operator="v4_attention_stage",
    call=lambda fn, i, config: fn("SWA", *(i[n] for n in _STAGE_NAMES), config=config),
    outputs={"x_out": "fp32_ulps", "kv_cache": "exact", "qr": "exact", "qr_scale": "qr_scale"},
    cases=(CaseSpec("v4_attention_stage_swa", "V4 SWA attention sublayer at decode: hc_pre, RMSNorm, Q/KV, the "
                    "window-cache write read back by the attention, SWA attention with the grouped output "
                    "projection, hc_post", _swa_stage_inputs),),
    bindings=(Upstream("deepseek_v4_pro", golden="decode_attention_swa.py::golden_attention_swa",
                       entry="decode_attention_swa.py::attention_swa_test"),
              Upstream("deepseek_v4_flash_mtp", golden="decode_swa.py::golden_attention_swa",
                       entry="decode_swa.py::attention_swa_test"),
              # dspark: the prefill form's golden; its decode form's (decode_swa.py::golden_decode_swa_tp1, through
              # dspark's TP1 output projection) is a form of the same adapter
              Upstream("deepseek_v4_flash_dspark", golden="prefill_swa.py::golden_prefill_attention_swa",
                       entry="prefill_swa.py::prefill_attention_swa_test")),
)
