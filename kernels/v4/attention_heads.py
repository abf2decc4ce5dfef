"""V4 attention heads (spec §8; upstream models/deepseek_v4_flash_dspark/decode_sparse_attn_{swa,hca,csa}.py, whose
goldens stop before the output projection): the sparse attention and the projection's first step -- each token's
heads with the last ``qk_rope_head_dim`` dims inversely rotated in FP32 and every dim rounded to BF16 once -- which
dspark then packs by output group for its all-to-all (``decode_o_proj.py``) instead of projecting them at once.

``v4_attention_heads(path, ...)`` takes ``v4_attention``'s arguments without the projection's weights and returns
heads [T, H, hd] BF16 (``kernels.v4.sparse_attention.output_heads`` of ``v4_sparse_attention``'s o); a padding row
(prefill form, ``num_tokens``) is exactly 0. Composed from the backend's ``v4_sparse_attention``.
"""

from __future__ import annotations

import torch

from kernels.errors import ContractInputError
from kernels.operators import operator
from kernels.record import CaseSpec, Record, Upstream, generator

SPEC = "§8"


@operator(returns="heads [T,H,hd] BF16: v4_sparse_attention's o inversely rotated on the rope dims and rounded "
                  "once -- composed from this backend's operators", spec=SPEC)
def v4_attention_heads(path: str, q: torch.Tensor, ori_kv: torch.Tensor, window_indices: torch.Tensor,
                       cmp_kv: torch.Tensor, cmp_block_table: torch.Tensor, compressed: torch.Tensor | None,
                       position_ids: torch.Tensor, attn_sink: torch.Tensor, freqs_cos: torch.Tensor,
                       freqs_sin: torch.Tensor, *, config, seq: int | None = None, num_tokens: int | None = None,
                       key_tiles: str | None = None, ops=None) -> torch.Tensor:
    """The attention's heads before the output projection (module docstring)."""
    from kernels.v4.sparse_attention import KEY_TILES, attention_indices, output_heads, v4_sparse_attention

    window, cmp = attention_indices(path, q, window_indices, compressed, position_ids, num_tokens=num_tokens,
                                    config=config)
    tiles = key_tiles or ("columns" if num_tokens is None else "gathered")
    if tiles not in KEY_TILES:
        raise ContractInputError("key_tiles", None, f"one of {KEY_TILES}", repr(key_tiles), SPEC)
    if freqs_cos.shape[0] != q.shape[0] or freqs_sin.shape != freqs_cos.shape:
        raise ContractInputError("freqs_cos", None, f"one RoPE row per token ([{q.shape[0]}, rope])",
                                 list(freqs_cos.shape), SPEC)
    attend = (ops or {}).get("v4_sparse_attention", v4_sparse_attention)
    o = attend(q, ori_kv, window, cmp_kv, cmp_block_table, cmp, attn_sink,
               seq=config.decode_seq if seq is None else seq, **({"key_tiles": tiles} if tiles != "columns" else {}))
    heads = output_heads(o, freqs_cos, freqs_sin, config=config)
    if num_tokens is not None:
        heads[num_tokens:] = 0
    return heads


v4_attention_heads.composes_operators = True


def _heads_inputs(seed: int, wiring: str, config) -> dict[str, torch.Tensor]:
    """A decode batch's SWA step: each row's valid window slots first (random rows of a 3-page cache, every third
    row with a short window), RoPE rows of angles up to 6 radians."""
    g = generator(seed)
    t, h, d, bs, w = config.decode_tokens, config.num_attention_heads, config.head_dim, config.block_size, \
        config.sliding_window
    win = torch.randint(0, 3 * bs, (t, w), generator=g, dtype=torch.int32)
    for r in range(0, t, 3):
        win[r, 1 + r:] = -1
    angle = torch.rand(t, config.qk_rope_head_dim, generator=g) * 6
    return {"q": (torch.rand(t, h, d, generator=g) - 0.5).to(torch.bfloat16),
            "ori_kv": (torch.rand(3, bs, 1, d, generator=g) - 0.5).to(torch.bfloat16), "window_indices": win,
            "cmp_kv": torch.zeros(1, bs, 1, d, dtype=torch.bfloat16),
            "cmp_block_table": torch.zeros(t // config.decode_seq, 1, dtype=torch.int32),
            "position_ids": torch.arange(t, dtype=torch.int32) * 5 + 200, "attn_sink": torch.randn(h, generator=g),
            "freqs_cos": torch.cos(angle).to(torch.bfloat16), "freqs_sin": torch.sin(angle).to(torch.bfloat16)}


RECORD = Record(
    operator="v4_attention_heads",
    call=lambda fn, i, config: {"heads": fn("SWA", i["q"], i["ori_kv"], i["window_indices"], i["cmp_kv"],
                                            i["cmp_block_table"], None, i["position_ids"], i["attn_sink"],
                                            i["freqs_cos"], i["freqs_sin"], config=config)},
    outputs={"heads": "attn_out_v4"},  # upstream's compare_fn for o_packed_heads: ratio_allclose(1e-4, 1/128)
    cases=(CaseSpec("v4_attention_heads", "V4 SWA decode attention heads before the output projection (dspark's "
                    "decode attention goldens)", _heads_inputs, geometries=("flash-tiny",)),),
    bindings=(
        Upstream("deepseek_v4_pro", none="V4-Pro's attention goldens fuse the output projection (v4_attention)"),
        Upstream("deepseek_v4_flash_mtp", none="Flash-MTP's attention goldens fuse the output projection "
                                               "(v4_attention)"),
        Upstream("deepseek_v4_flash_dspark", golden="decode_sparse_attn_swa.py::golden_sparse_attn",
                 entry="decode_sparse_attn_swa.py::sparse_attn_swa_test"),  # HCA: decode_sparse_attn_hca.py
    ),
)
