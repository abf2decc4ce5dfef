"""V4-Flash dspark's drafter attention (spec §8; upstream models/deepseek_v4_flash_dspark/dspark_attention.py): one
anchor-first query block of S draft rows per request attends the request's trailing window and the whole block.

``x`` [B·S, D] BF16 are the blocks' attention-normalised rows (request-major), ``position_ids`` [B·S] their
positions, ``slot_mapping`` [B·S] INT64 their cache rows (-1: padding, no write), ``kv_cache`` [blocks, page, 1, hd]
BF16 the drafter's sliding-window cache, ``swa_indices`` [B, K] INT32 and ``swa_lens`` [B] each request's visible
list: the first ``swa_lens[b]`` columns are cache rows (the window, then the block's own rows), the rest are not
read. Then:

1. the block is projected as any attention input (the backend's ``v4_qkv_proj_rope``, RoPE rows of its positions);
2. its KV rows are committed to the cache at ``slot_mapping`` **before** anything is read (``written``: token order,
   -1 writes nothing), so the list can name the block's own rows;
3. every draft row of request b attends the same list -- no causal mask inside the block: row 0 sees row S-1's key
   when the list names its slot -- through the backend's ``v4_attention_heads`` (SWA path, the list repeated per
   row, columns past ``swa_lens[b]`` as -1, ``seq`` = S: the sparse attention and the inverse RoPE);
4. the drafter's own output projection (the backend's ``dspark_output_projection``: a BF16 latent, one INT8 row
   per token -- not V4's decode projection).

-> {"x_out" [B·S, D] BF16, "kv_cache" (the committed cache)}. A -1 inside a request's first ``swa_lens`` columns
is refused (upstream's kernel would read it as a zero key with score 0). Composed from the backend's operators.
Upstream compiles S = 7 (DSPARK_SPEC_TOKENS) and B = 16 / TP; this reference takes any.
"""

from __future__ import annotations

from functools import partial

import torch

from kernels.errors import ContractInputError
from kernels.operators import operator
from kernels.record import (
    BadCall,
    CaseSpec,
    Record,
    dspark_only,
    generator,
    int8_codes,
    is_tiny,
    replaced,
)

SPEC = "§8"


def check_dspark_attention(x: torch.Tensor, freqs_cos: torch.Tensor, position_ids: torch.Tensor,
                           kv_cache: torch.Tensor, slot_mapping: torch.Tensor, swa_indices: torch.Tensor,
                           swa_lens: torch.Tensor) -> int:
    """The caller's side beyond the composed operators' own -> S, the rows per request."""
    if swa_indices.ndim != 2 or swa_indices.shape[0] < 1 or swa_indices.is_floating_point():
        raise ContractInputError("swa_indices", None, "integer [B >= 1, K]",
                                 f"{swa_indices.dtype}{list(swa_indices.shape)}", SPEC)
    batch, width = swa_indices.shape
    if x.ndim != 2 or x.shape[0] < 1 or x.shape[0] % batch:
        raise ContractInputError("x", None, f"[B·S, D] rows, a multiple of the {batch} requests", list(x.shape), SPEC)
    tokens = x.shape[0]
    for name, ids in (("position_ids", position_ids), ("slot_mapping", slot_mapping)):
        if ids.ndim != 1 or ids.shape[0] != tokens or ids.is_floating_point():
            raise ContractInputError(name, None, f"integer [{tokens}]", f"{ids.dtype}{list(ids.shape)}", SPEC)
    bad = (position_ids < 0) | (position_ids >= freqs_cos.shape[0])
    if bool(bad.any()):
        t = int(bad.nonzero()[0])
        raise ContractInputError("position_ids", (t,), f"a position in [0, {freqs_cos.shape[0]})",
                                 int(position_ids[t]), SPEC)
    if kv_cache.ndim != 4 or kv_cache.shape[2] != 1:
        raise ContractInputError("kv_cache", None, "[blocks, page, 1, head_dim]", list(kv_cache.shape), SPEC)
    rows = kv_cache.shape[0] * kv_cache.shape[1]
    bad = (slot_mapping < -1) | (slot_mapping >= rows)
    if bool(bad.any()):
        t = int(bad.nonzero()[0])
        raise ContractInputError("slot_mapping", (t,), f"-1 or a cache row in [0, {rows})", int(slot_mapping[t]), SPEC)
    if swa_lens.ndim != 1 or swa_lens.shape[0] != batch or swa_lens.is_floating_point():
        raise ContractInputError("swa_lens", None, f"integer [{batch}]", f"{swa_lens.dtype}{list(swa_lens.shape)}",
                                 SPEC)
    bad = (swa_lens < 0) | (swa_lens > width)
    if bool(bad.any()):
        b = int(bad.nonzero()[0])
        raise ContractInputError("swa_lens", (b,), f"a count in [0, {width}]", int(swa_lens[b]), SPEC)
    listed = torch.arange(width)[None, :] < swa_lens[:, None]
    bad = listed & ((swa_indices < 0) | (swa_indices >= rows))
    if bool(bad.any()):
        b, c = (int(v) for v in bad.nonzero()[0])
        raise ContractInputError("swa_indices", (b, c), f"a cache row in [0, {rows}) inside the first "
                                 f"{int(swa_lens[b])} columns", int(swa_indices[b, c]), SPEC)
    return tokens // batch


PROBABILITIES = ("bf16", "fp32")  # disagreement 21: the drafter kernel's BF16 probabilities, its golden's FP32


def fp32_heads(path: str, q: torch.Tensor, cache: torch.Tensor, window: torch.Tensor, cmp_kv, cmp_block_table,
               compressed, position_ids, attn_sink: torch.Tensor, rope_cos: torch.Tensor, rope_sin: torch.Tensor, *,
               config, seq: int) -> torch.Tensor:
    """The "fp32" rule (dspark_attention.py's golden): each row's softmax over its window's keys and the sink in one
    piece, the probabilities never rounded (FP64 here), then the inverse RoPE and one BF16 rounding
    (``output_heads``). SWA only; the compressed arguments are placeholders."""
    from kernels.reference.attention import _gather
    from kernels.v4.sparse_attention import output_heads

    rows, valid = _gather(cache.reshape(-1, cache.shape[-1]), window)  # [T, K, hd], [T, K]
    scores = torch.einsum("thd,tkd->thk", q.double(), rows.double()) * q.shape[-1] ** -0.5
    scores = scores.masked_fill(~valid.unsqueeze(1), -torch.inf)
    top = torch.maximum(scores.amax(-1, keepdim=True), attn_sink.double().view(1, -1, 1))
    p = torch.exp(scores - top)
    o = torch.einsum("thk,tkd->thd", p, rows.double()) / (p.sum(-1, keepdim=True)
                                                           + torch.exp(attn_sink.double().view(1, -1, 1) - top))
    return output_heads(o.float(), rope_cos, rope_sin, config=config)


def visible_window(swa_indices: torch.Tensor, swa_lens: torch.Tensor, *, seq: int) -> torch.Tensor:
    """Each request's list repeated for its ``seq`` rows, columns past its count as -1: [B·seq, K] INT32."""
    listed = torch.arange(swa_indices.shape[1])[None, :] < swa_lens[:, None]
    window = torch.where(listed, swa_indices.to(torch.int32), torch.full_like(swa_indices, -1, dtype=torch.int32))
    return window.repeat_interleave(seq, dim=0)


@operator(returns="{x_out [B·S, D] BF16, kv_cache}: the block projected, its KV committed, every row attending its "
                  "request's list -- composed from this backend's v4_qkv_proj_rope, v4_attention_heads and "
                  "dspark_output_projection", spec=SPEC)
def dspark_attention(x: torch.Tensor, wq_a: torch.Tensor, wq_b: torch.Tensor, wq_b_scale: torch.Tensor,
                     wkv: torch.Tensor, gamma_cq: torch.Tensor, gamma_ckv: torch.Tensor, freqs_cos: torch.Tensor,
                     freqs_sin: torch.Tensor, position_ids: torch.Tensor, kv_cache: torch.Tensor,
                     slot_mapping: torch.Tensor, swa_indices: torch.Tensor, swa_lens: torch.Tensor,
                     attn_sink: torch.Tensor, wo_a: torch.Tensor, wo_b: torch.Tensor, wo_b_scale: torch.Tensor, *,
                     config, probabilities: str = "bf16", ops=None) -> dict[str, torch.Tensor]:
    """The drafter's attention (module docstring). ``probabilities`` (``PROBABILITIES``): "bf16", the kernel's
    (the probabilities rounded to BF16 per key tile before they weigh the values: ``v4_attention_heads``), or
    "fp32", the golden's (one softmax over the list, never rounded: ``fp32_heads``)."""
    from kernels.v4.attention_heads import v4_attention_heads
    from kernels.v4.dspark_context_kv import written
    from kernels.v4.heads_projection import dspark_output_projection
    from kernels.v4.qkv_proj import v4_qkv_proj_rope

    ops = ops or {}
    if probabilities not in PROBABILITIES:
        raise ContractInputError("probabilities", None, f"one of {PROBABILITIES}", repr(probabilities), SPEC)
    seq = check_dspark_attention(x, freqs_cos, position_ids, kv_cache, slot_mapping, swa_indices, swa_lens)
    pos = position_ids.to(torch.int64)
    rope_cos, rope_sin = freqs_cos[pos], freqs_sin[pos]
    proj = ops.get("v4_qkv_proj_rope", v4_qkv_proj_rope)(x, wq_a, wq_b, wq_b_scale, wkv, rope_cos, rope_sin, gamma_cq,
                                                          gamma_ckv, config=config)
    cache = written(kv_cache, proj["kv"].to(kv_cache.dtype), slot_mapping)  # committed before the reads
    attend = ops.get("v4_attention_heads", v4_attention_heads) if probabilities == "bf16" else fp32_heads
    if getattr(attend, "composes_operators", False):
        attend = partial(attend, ops=ops)
    batch = swa_indices.shape[0]
    placeholder = torch.zeros(1, cache.shape[1], 1, cache.shape[-1], dtype=cache.dtype)  # SWA reads no compressed
    heads = attend("SWA", proj["q"], cache, visible_window(swa_indices, swa_lens, seq=seq), placeholder,
                   torch.zeros(batch, 1, dtype=torch.int32), None, position_ids, attn_sink, rope_cos, rope_sin,
                   config=config, seq=seq)
    x_out = ops.get("dspark_output_projection", dspark_output_projection)(heads, wo_a, wo_b, wo_b_scale,
                                                                          config=config)
    return {"x_out": x_out, "kv_cache": cache}


dspark_attention.composes_operators = True


# --- the record ----------------------------------------------------------------------------------------------

SPEC_TOKENS = 7  # upstream's DSPARK_SPEC_TOKENS: the block's rows per request


def block_call(seed: int, config, *, starts, seq: int, sink: float = 0.5) -> dict[str, torch.Tensor]:
    """A drafter attention call: one request per start, ``seq`` draft rows from it, each request's pages a random
    permutation of a shared pool, the visible list = the window (clamped at position 0) then the block, as upstream's
    build_dspark_swa_indices lays it (columns past the count -1), padded to a multiple of 64 columns; a unit-RMS
    cache; weights as upstream's fixture (W8A8 wq_b / wo_b, per-channel scales); RoPE angles over 512 positions (tiny)
    or the entry's compiled ``kernel_max_seq_len``."""
    from kernels.v4.qkv_proj import _qkv_inputs

    g = generator(seed)
    page, win = config.block_size, config.sliding_window
    d, h, hd, lora = config.hidden_size, config.num_attention_heads, config.head_dim, config.o_lora_rank
    groups, batch = config.o_groups, len(starts)
    pages_per = -(-(max(starts) + seq) // page)
    table = torch.randperm(batch * pages_per, generator=g).reshape(batch, pages_per)

    def slot(b, p):
        return int(table[b, p // page]) * page + p % page

    pos = torch.tensor([p for st in starts for p in range(st, st + seq)], dtype=torch.int32)
    slots = torch.tensor([slot(t // seq, int(pos[t])) for t in range(batch * seq)], dtype=torch.int64)
    width = -(-(win + seq) // 64) * 64
    idx = torch.full((batch, width), -1, dtype=torch.int32)
    lens = torch.zeros(batch, dtype=torch.int32)
    for b, st in enumerate(starts):
        visible = [slot(b, p) for p in range(max(st - win, 0), st + seq)]
        idx[b, : len(visible)] = torch.tensor(visible, dtype=torch.int32)
        lens[b] = len(visible)
    q = _qkv_inputs(seed, "replicated", config)
    cache = torch.randn(batch * pages_per, page, 1, hd, generator=g)
    cache = cache / cache.pow(2).mean(-1, keepdim=True).sqrt()
    positions = 512 if is_tiny(config) else config.kernel_max_seq_len  # the entry's compiled table (16384)
    angle = torch.arange(positions, dtype=torch.float32)[:, None] * torch.rand(config.qk_rope_head_dim, generator=g) * 0.5
    return {"x": (torch.randn(batch * seq, d, generator=g) * 0.05).to(torch.bfloat16), "wq_a": q["wq_a"],
            "wq_b": q["wq_b"], "wq_b_scale": q["wq_b_scale"], "wkv": q["wkv"], "gamma_cq": q["gamma_cq"],
            "gamma_ckv": q["gamma_ckv"], "freqs_cos": torch.cos(angle).to(torch.bfloat16),
            "freqs_sin": torch.sin(angle).to(torch.bfloat16), "position_ids": pos, "kv_cache": cache.to(torch.bfloat16),
            "slot_mapping": slots, "swa_indices": idx, "swa_lens": lens, "attn_sink": torch.full((h,), sink),
            "wo_a": (torch.randn(groups, lora, h // groups * hd, generator=g) / (h // groups * hd) ** 0.5)
            .to(torch.bfloat16),
            "wo_b": int8_codes((d, groups * lora), g), "wo_b_scale": torch.rand(d, generator=g) / 127 / 4 + 1e-4}


def _attention_inputs(seed: int, wiring: str, config) -> dict[str, torch.Tensor]:
    """2 requests x 7 draft rows (upstream's block) from positions 3 and 200: the first window clamped at position
    0, the second a full window of ``sliding_window`` keys (``block_call``). At dspark's deployment (its entry is
    compiled for 16 requests): 16 requests from positions 3, 100, 197, ... (windows clamped and full)."""
    if is_tiny(config):
        return block_call(seed, config, starts=(3, 200), seq=SPEC_TOKENS)
    return block_call(seed, config, starts=tuple(3 + 97 * r for r in range(config.decode_batch)), seq=SPEC_TOKENS)



RECORD = Record(
    operator="dspark_attention",
    call=lambda fn, i, config: dict(fn(**i, config=config)),
    outputs={"x_out": "dspark_x_out", "kv_cache": "v4_kv_pool"},
    cases=(CaseSpec("dspark_attention", "dspark's drafter attention: 2 requests x 7 draft rows (a window clamped at "
                    "0, a full window), committed to a paged cache and attending window + block without a causal "
                    "mask, then the W8A8 output projection", _attention_inputs,
                    geometries=("flash-tiny", "dspark")),),
    bad_calls=(
        BadCall("a -1 inside a request's list", "dspark_attention",
                replaced(swa_indices=lambda i: i["swa_indices"].index_fill(1, torch.tensor([0]), -1)), "swa_indices"),
        BadCall("a count past the list", "dspark_attention",
                replaced(swa_lens=lambda i: i["swa_lens"] + i["swa_indices"].shape[1]), "swa_lens"),
        BadCall("rows not a multiple of the requests", "dspark_attention",
                replaced(swa_indices=lambda i: torch.cat((i["swa_indices"], i["swa_indices"][:1])),
                         swa_lens=lambda i: torch.cat((i["swa_lens"], i["swa_lens"][:1]))), "x"),
    ),
    bindings=dspark_only("the drafter's attention", golden="dspark_attention.py::golden_dspark_attention",
                 entry="dspark_attention.py::dspark_attention_test"),
)
