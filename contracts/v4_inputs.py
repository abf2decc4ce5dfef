"""Input builders of the V4 contracts (spec §8): small decode batches at a V4 preset's (tiny) geometry."""

from __future__ import annotations

import torch

from kernels.v4.moe import V4ExpertWeights


def attention_inputs(config, seed: int = 0, *, tables=None) -> dict:
    """Two-request decode batch (4 x 2 rows), window rows with -1 holes, compressed pages in a shuffled order."""
    g = torch.Generator().manual_seed(seed)
    t, h, d, bs = config.decode_tokens, config.num_attention_heads, config.head_dim, config.block_size
    groups, lora, hidden = config.o_groups, config.o_lora_rank, config.hidden_size
    win = torch.randint(0, 3 * bs, (t, config.sliding_window), generator=g, dtype=torch.int32)
    win[torch.rand(win.shape, generator=g) < 0.3] = -1
    if tables is None:
        tables = torch.tensor([[3, 1], [0, 2], [2, 3], [1, 0]], dtype=torch.int32)
    pos = (torch.arange(t, dtype=torch.int32) * 5 + 20).reshape(-1)
    return dict(
        q=(torch.rand(t, h, d, generator=g) - 0.5).to(torch.bfloat16),
        ori_kv=(torch.rand(3, bs, 1, d, generator=g) - 0.5).to(torch.bfloat16),
        window_indices=win,
        cmp_kv=(torch.rand(4, bs, 1, d, generator=g) - 0.5).to(torch.bfloat16),
        cmp_block_table=tables,
        position_ids=pos,
        attn_sink=torch.randn(h, generator=g),
        freqs_cos=torch.cos(torch.rand(t, config.qk_rope_head_dim, generator=g) * 6).to(torch.bfloat16),
        freqs_sin=torch.sin(torch.rand(t, config.qk_rope_head_dim, generator=g) * 6).to(torch.bfloat16),
        wo_a=((torch.rand(groups, lora, h * d // groups, generator=g) - 0.5) / 4).to(torch.bfloat16),
        wo_b=torch.randint(-127, 128, (hidden, groups * lora), generator=g, dtype=torch.int8),
        wo_b_scale=torch.rand(hidden, generator=g) / 500,
    )


def compressed_topk(path: str, config, inputs: dict, seed: int = 1) -> torch.Tensor | None:
    """The path's compressed argument: None (SWA); HCA's top-k with its second half -1; a raw CSA indexer
    top-k wider than index_topk, column 0 the last existing compressed row, column 1 the first not written."""
    g = torch.Generator().manual_seed(seed)
    t = config.decode_tokens
    if path == "SWA":
        return None
    if path == "HCA":
        k = min(config.kernel_max_seq_len // 128, config.index_topk)
        out = torch.randint(0, 2 * config.block_size, (t, k), generator=g, dtype=torch.int32)
        out[:, k // 2:] = -1
        return out
    bound = (inputs["position_ids"].to(torch.int64) + 1) // 4
    raw = torch.randint(-1, int(bound.max()) + 3, (t, config.index_topk + 3), generator=g, dtype=torch.int32)
    raw[:, 0] = (bound - 1).to(torch.int32)  # the last existing compressed row: kept
    raw[:, 1] = bound.to(torch.int32)  # the first not yet written: dropped
    return raw


def _index_query_operands(config, g: torch.Generator, rows: int) -> dict:
    """The indexer's query operands, drawn in this order: x, INT8 qr / wq_b with per-row / per-column scales,
    the head projection, a random BF16 Hadamard."""
    heads, dim = config.index_n_heads, config.index_head_dim
    return dict(
        x=(torch.randn(rows, config.hidden_size, generator=g) * 0.5).to(torch.bfloat16),
        qr=torch.randint(-127, 128, (rows, config.q_lora_rank), generator=g, dtype=torch.int8),
        qr_scale=torch.rand(rows, 1, generator=g) / 127 + 1e-3,
        wq_b=torch.randint(-127, 128, (config.q_lora_rank, heads * dim), generator=g, dtype=torch.int8),
        wq_b_scale=torch.rand(heads * dim, generator=g) / 127 / config.q_lora_rank**0.5 + 1e-4,
        weights_proj=(torch.randn(config.hidden_size, heads, generator=g) * 0.25).to(torch.bfloat16),
        hadamard=((torch.rand(dim, dim, generator=g) - 0.5) * dim**-0.5).to(torch.bfloat16),
    )


def indexer_inputs(config, seed: int = 0, *, starts=(300, 127, 255, 7)) -> dict:
    """A decode batch for CSA's indexer: requests at upstream's start regimes (two visible ranges past
    index_topk, one at a block edge, one short), INT8 qr / wq_b with per-row / per-column scales, an INT8 index
    cache in shuffled pages with per-row scales, per-request RoPE rows at each request's first position."""
    g = torch.Generator().manual_seed(seed)
    b, seq = len(starts), config.decode_seq
    t, dim, rope = b * seq, config.index_head_dim, config.qk_rope_head_dim
    bs = config.block_size
    pos = torch.tensor([s + j for s in starts for j in range(seq)], dtype=torch.int32)
    lens = torch.tensor([s + seq for s in starts], dtype=torch.int32)
    pages = -(-(config.kernel_max_seq_len // 4) // bs)
    table = torch.randperm(b * pages, generator=g).reshape(b, pages).to(torch.int32)
    angle = torch.tensor(starts, dtype=torch.float32)[:, None] * torch.rand(rope // 2, generator=g)
    q = _index_query_operands(config, g, t)
    hadamard = q.pop("hadamard")  # the argument order: x .. weights_proj, cos, sin, hadamard, caches
    return dict(
        **q, cos=torch.cos(angle), sin=torch.sin(angle), hadamard=hadamard,
        idx_kv_cache=torch.randint(-127, 128, (b * pages, bs, 1, dim), generator=g, dtype=torch.int8),
        idx_kv_scale=(torch.rand(b * pages, bs, 1, 1, generator=g) + 0.5) * 2.0,
        idx_block_table=table, position_ids=pos, kv_seq_lens=lens,
    )


def prefill_indexer_inputs(config, seed: int = 0, *, rows: int = 128, start: int = 0) -> dict:
    """One request's prefill chunk for CSA's indexer: ``rows`` rows at positions start .. start + rows - 1, all
    real (``num_tokens`` = rows; a case sets fewer), INT8 qr / wq_b with per-row / per-column scales, a RoPE row
    per token at its position, the request's two index-cache pages shuffled among three."""
    g = torch.Generator().manual_seed(seed)
    dim, rope, bs = config.index_head_dim, config.qk_rope_head_dim, config.block_size
    pos = torch.arange(start, start + rows, dtype=torch.int32)
    angle = pos.float()[:, None] * torch.rand(rope // 2, generator=g)
    q = _index_query_operands(config, g, rows)
    hadamard = q.pop("hadamard")  # the argument order: x .. weights_proj, cos, sin, hadamard, caches
    return dict(
        **q, cos=torch.cos(angle), sin=torch.sin(angle), hadamard=hadamard,
        idx_kv_cache=torch.randint(-127, 128, (3, bs, 1, dim), generator=g, dtype=torch.int8),
        idx_kv_scale=(torch.rand(3, bs, 1, 1, generator=g) + 0.5) * 2.0,
        idx_block_table=torch.tensor([2, 0], dtype=torch.int32), position_ids=pos,
        num_tokens=torch.tensor(rows, dtype=torch.int32),
    )


PREFILL_COMPRESSOR_HIDDEN, PREFILL_COMPRESSOR_D, PREFILL_COMPRESSOR_ROPE = 32, 8, 4  # tiny: 4 nope + 4 rope dims


def prefill_compressor_inputs(ratio: int, seed: int = 0, *, start: int = 0, rows: int = 16,
                              num_tokens: int | None = None, state_pages: int | None = None) -> dict:
    """One request's prefill chunk for a V4 compressor (ratio 4 overlapping, or 128): rows at positions
    start .. start + rows - 1 (``num_tokens`` real, default all); the state pool paged by absolute position
    through a reversed table (no page is its own block) with random FP32 rows before ``start`` (an earlier
    chunk's state) and a constant 7.0 elsewhere; every real row's state_slot_mapping its table row; a
    compressed row for each closing position through a reversed compressed table of 8-row pages, over a pool of
    BF16 3.0; the compressed-profile RoPE rows [positions, rope/2]."""
    g = torch.Generator().manual_seed(seed)
    overlap = ratio == 4
    page = {4: 4, 128: 8}[ratio]
    d, hidden, rope = PREFILL_COMPRESSOR_D, PREFILL_COMPRESSOR_HIDDEN, PREFILL_COMPRESSOR_ROPE
    c = (2 if overlap else 1) * d
    real = rows if num_tokens is None else num_tokens
    end = start + rows
    blocks = state_pages or -(-end // page)
    table = torch.arange(blocks - 1, -1, -1, dtype=torch.int32)
    pool = torch.full((blocks + 1, page, 2 * c), 7.0)
    flat = pool.reshape(-1, 2 * c)
    for p in range(max(0, start - 2 * ratio), start):
        flat[int(table[p // page]) * page + p % page] = torch.randn(2 * c, generator=g)
    pos = torch.arange(start, end)
    state_slots = torch.tensor([int(table[p // page]) * page + p % page for p in pos.tolist()])
    state_slots[real:] = -1
    cmp_pages = max(1, -(-(end // ratio) // 8))
    cmp_table = torch.arange(cmp_pages, 0, -1)
    cmp_slots = torch.full((rows,), -1, dtype=torch.int64)
    for t, p in enumerate(pos.tolist()):
        if (p + 1) % ratio == 0 and t < real:
            k = (p + 1) // ratio - 1
            cmp_slots[t] = int(cmp_table[k // 8]) * 8 + k % 8
    angle = torch.arange(end, dtype=torch.float32)[:, None] * torch.rand(rope // 2, generator=g)
    return dict(
        x=torch.randn(rows, hidden, generator=g).to(torch.bfloat16), position_ids=pos,
        num_tokens=torch.tensor(real, dtype=torch.int32), state_block_table=table, state_pool=pool,
        wkv=torch.randn(hidden, c, generator=g) / hidden**0.5, wgate=torch.randn(hidden, c, generator=g) / hidden**0.5,
        ape=torch.randn(ratio, c, generator=g) * 0.5, norm=torch.rand(d, generator=g) + 0.5,
        cmp_slot_mapping=cmp_slots, state_slot_mapping=state_slots,
        cmp_pool=torch.full((cmp_pages + 1, 8, 1, d), 3.0).to(torch.bfloat16),
        rope_cos=torch.cos(angle), rope_sin=torch.sin(angle),
    )


def prefill_attention_inputs(config, seed: int = 0, *, rows: int = 128, start: int = 100) -> dict:
    """One request's prefill chunk of ``rows`` rows at positions start .. start + rows - 1: each row's window
    of the last ``sliding_window`` positions (physical rows through a shuffled page table), and its compressed
    slots -- the compressed rows that exist at its position ((pos + 1) // 4), best-first from an indexer, -1
    after -- in logical slots through the request's compressed table."""
    g = torch.Generator().manual_seed(seed)
    h, d, bs, win = config.num_attention_heads, config.head_dim, config.block_size, config.sliding_window
    groups, lora, hidden = config.o_groups, config.o_lora_rank, config.hidden_size
    pos = torch.arange(start, start + rows, dtype=torch.int32)
    pages = -(-(start + rows) // bs)
    ori_table = torch.randperm(pages + 1, generator=g)[:pages]
    window = torch.full((rows, win), -1, dtype=torch.int32)
    for t, p in enumerate(pos.tolist()):
        first = max(0, p - win + 1)
        logical = torch.arange(first, p + 1)
        window[t, : logical.numel()] = (ori_table[logical // bs] * bs + logical % bs).to(torch.int32)
    k = config.index_topk
    cmp = torch.full((rows, k), -1, dtype=torch.int32)
    for t, p in enumerate(pos.tolist()):
        n = (p + 1) // 4
        pick = torch.randperm(n, generator=g)[:k]
        cmp[t, : pick.numel()] = pick.to(torch.int32)
    cmp_pages = -(-((start + rows) // 4) // bs)
    return dict(
        q=(torch.rand(rows, h, d, generator=g) - 0.5).to(torch.bfloat16),
        ori_kv=(torch.rand(pages + 1, bs, 1, d, generator=g) - 0.5).to(torch.bfloat16),
        window_indices=window,
        cmp_kv=(torch.rand(cmp_pages + 1, bs, 1, d, generator=g) - 0.5).to(torch.bfloat16),
        cmp_block_table=torch.randperm(cmp_pages + 1, generator=g)[:cmp_pages].reshape(1, -1).to(torch.int32),
        compressed=cmp, position_ids=pos,
        attn_sink=torch.randn(h, generator=g),
        freqs_cos=torch.cos(pos[:, None] * torch.rand(config.qk_rope_head_dim, generator=g)).to(torch.bfloat16),
        freqs_sin=torch.sin(pos[:, None] * torch.rand(config.qk_rope_head_dim, generator=g)).to(torch.bfloat16),
        wo_a=((torch.rand(groups, lora, h * d // groups, generator=g) - 0.5) / 4).to(torch.bfloat16),
        wo_b=torch.randint(-127, 128, (hidden, groups * lora), generator=g, dtype=torch.int8),
        wo_b_scale=torch.rand(hidden, generator=g) / 500,
    )


def stage_inputs(config, seed: int = 0) -> dict:
    """Four requests at positions 40.., their windows over the 8 rows before them and their own rows (the rows
    this stage writes), the current rows at slots 200 + t."""
    g = torch.Generator().manual_seed(seed)
    t, hc, dm = config.decode_tokens, config.hc_mult, config.hidden_size
    h, d, lora, rope = config.num_attention_heads, config.head_dim, config.q_lora_rank, config.qk_rope_head_dim
    groups, o_lora, bs = config.o_groups, config.o_lora_rank, config.block_size
    mix = (2 + hc) * hc
    pos = torch.tensor([40 + 2 * (r // 2) * 10 + r % 2 for r in range(t)], dtype=torch.int32)
    slots = torch.arange(200, 200 + t)
    window = torch.full((t, config.sliding_window), -1, dtype=torch.int32)
    for r in range(t):
        req_first = r - r % config.decode_seq
        past = torch.arange(8 * (r // 2), 8 * (r // 2) + 8)  # the request's 8 earlier rows
        own = slots[req_first:r + 1]  # this chunk's rows up to the token itself
        rows = torch.cat((past, own)).to(torch.int32)
        window[r, : rows.numel()] = rows
    angle = torch.arange(512, dtype=torch.float32)[:, None] * torch.rand(rope, generator=g) * 0.05
    return dict(
        x_hc=torch.randn(t, hc, dm, generator=g), hc_fn=torch.randn(mix, hc * dm, generator=g) * 0.05,
        hc_scale=torch.tensor([2.0, 0.02, 0.25]), hc_base=torch.randn(mix, generator=g),
        attn_norm_w=(torch.rand(dm, generator=g) + 0.5).to(torch.bfloat16),
        wq_a=(torch.randn(dm, lora, generator=g) / dm**0.5).to(torch.bfloat16),
        wq_b=torch.randint(-127, 128, (lora, h * d), generator=g, dtype=torch.int8),
        wq_b_scale=torch.rand(h * d, generator=g) / 127 + 1e-3,
        wkv=(torch.randn(dm, d, generator=g) / dm**0.5).to(torch.bfloat16),
        gamma_cq=(torch.rand(lora, generator=g) + 0.5).to(torch.bfloat16),
        gamma_ckv=(torch.rand(d, generator=g) + 0.5).to(torch.bfloat16),
        freqs_cos=torch.cos(angle).to(torch.bfloat16), freqs_sin=torch.sin(angle).to(torch.bfloat16),
        kv_cache=(torch.rand(2, bs, 1, d, generator=g) - 0.5).to(torch.bfloat16),
        swa_slot_mapping=slots, window_indices=window, position_ids=pos,
        attn_sink=torch.randn(h, generator=g),
        wo_a=((torch.rand(groups, o_lora, h * d // groups, generator=g) - 0.5) / 4).to(torch.bfloat16),
        wo_b=torch.randint(-127, 128, (dm, groups * o_lora), generator=g, dtype=torch.int8),
        wo_b_scale=torch.rand(dm, generator=g) / 500,
    )


def prefill_stage_inputs(config, seed: int = 0, *, rows: int = 32, num_tokens: int = 28, start: int = 200,
                         table: list[int] | None = None) -> dict:
    """One request's prefill chunk for the SWA stage: ``rows`` rows at positions start .., ``num_tokens`` real.
    The window pages go through a shuffled 1-D ``block_table`` (in place of ``window_indices``) whose first page
    is unmapped (-1: holes in the early rows' windows), or the ``table`` given (one physical page more than it
    maps); the padding rows carry real-looking positions and the slot of real row 0, which they must not write."""
    g = torch.Generator().manual_seed(seed + 100)
    i = stage_inputs(config, seed)
    hc, d, bs = config.hc_mult, config.hidden_size, config.block_size
    pos = torch.arange(start, start + rows, dtype=torch.int32)
    pages = -(-(start + rows) // bs)
    shuffled = torch.randperm(pages + 1, generator=g)[:pages].to(torch.int32)
    shuffled[0] = -1
    table = shuffled if table is None else torch.tensor(table, dtype=torch.int32)
    if table.numel() != pages:
        raise ValueError(f"table: {pages} pages for positions {start} .. {start + rows - 1}, got {table.numel()}")
    logical = pos.long()
    slots = torch.where(table[logical // bs] >= 0, table[logical // bs].long() * bs + logical % bs, -1)
    slots[num_tokens:] = slots[0]
    del i["window_indices"]
    i.update(x_hc=torch.randn(rows, hc, d, generator=g), block_table=table, swa_slot_mapping=slots, position_ids=pos,
             kv_cache=(torch.rand(pages + 1, bs, 1, config.head_dim, generator=g) - 0.5).to(torch.bfloat16))
    return i


def v4_expert_weights(config, g, scale=0.02):
    d, inter = config.hidden_size, config.moe_intermediate_size

    def w(shape):
        return torch.randint(-127, 128, shape, generator=g, dtype=torch.int8)

    return V4ExpertWeights(w((inter, d)), torch.rand(inter, generator=g) * scale + scale / 4,
                           w((inter, d)), torch.rand(inter, generator=g) * scale + scale / 4,
                           w((d, inter)), torch.rand(d, generator=g) * scale + scale / 4)


def int8_rows(config, g, n=8):
    x = torch.randn(n, config.hidden_size, generator=g)
    amax = x.abs().amax(1, keepdim=True)
    return torch.round(x * 127 / amax).to(torch.int8), (amax / 127 * 0.05).float()


def moe_inputs(config, seed=3, num_tokens=6, rows=8):
    g = torch.Generator().manual_seed(seed)
    d, e, k = config.hidden_size, config.n_routed_experts, config.num_experts_per_tok
    return dict(
        x_mixed=torch.randn(rows, d, generator=g).to(torch.bfloat16),
        norm_w=(1 + 0.2 * torch.randn(d, generator=g)).to(torch.bfloat16),
        gate_w=torch.randn(e, d, generator=g) / d**0.5, gate_bias=torch.randn(e, generator=g) * 0.1,
        num_tokens=num_tokens,
        tid2eid=torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(16)]).to(torch.int32),
        input_ids=torch.randint(0, 16, (rows,), generator=g),
        routed=[v4_expert_weights(config, g) for _ in range(e)], shared=v4_expert_weights(config, g),
    )


def mtp_layer_inputs(config, seed=0):
    g = torch.Generator().manual_seed(seed)
    t, hc, d = config.decode_tokens, config.hc_mult, config.hidden_size
    mix = (2 + hc) * hc

    def w():
        return torch.randint(-127, 128, (d, d), generator=g, dtype=torch.int8), torch.rand(d, generator=g) * 1e-3

    (ep, es), (hp, hs) = w(), w()
    projection = dict(enorm=torch.rand(d, generator=g) + 0.5, hnorm=torch.rand(d, generator=g) + 0.5, e_proj=ep,
                      e_scale=es, e_smooth=torch.rand(d, generator=g) + 0.5, h_proj=hp, h_scale=hs,
                      h_smooth=torch.rand(d, generator=g) + 0.5)
    attention = stage_inputs(config, seed)
    del attention["x_hc"]
    m = moe_inputs(config, seed, num_tokens=t)
    moe = dict(hc_fn=torch.randn(mix, hc * d, generator=g) * 0.05, hc_scale=torch.tensor([2.0, 0.02, 0.25]),
               hc_base=torch.randn(mix, generator=g), norm_w=m["norm_w"], gate_w=m["gate_w"],
               gate_bias=m["gate_bias"], num_tokens=t, tid2eid=m["tid2eid"], input_ids=m["input_ids"],
               routed=m["routed"], shared=m["shared"])
    head = dict(fn=torch.randn(hc, hc * d, generator=g) * 0.05, scale=torch.tensor([0.5]),
                base=torch.randn(hc, generator=g), norm_w=(torch.rand(d, generator=g) + 0.5).to(torch.bfloat16))
    return dict(hidden=torch.randn(t, d, generator=g).to(torch.bfloat16), prev=torch.randn(t, hc, d, generator=g),
                projection=projection, attention=attention, moe=moe, head=head)


def prefill_mtp_layer_inputs(config, seed=0, *, rows=32, num_tokens=28, start=200):
    """One request's prefill chunk (``prefill_stage_inputs``) with the layer's
    two-profile RoPE tables [2, positions, rope]: profile 0 (the sliding-window one) and a different profile 1."""
    base = mtp_layer_inputs(config, seed)
    stage = prefill_stage_inputs(config, seed, rows=rows, num_tokens=num_tokens, start=start)
    x_hc = stage.pop("x_hc")
    g = torch.Generator().manual_seed(seed + 200)
    angle = torch.arange(config.max_position_embeddings, dtype=torch.float32)[:, None] \
        * torch.rand(config.qk_rope_head_dim, generator=g) * 0.9
    stage["freqs_cos"] = torch.stack((stage["freqs_cos"], torch.cos(angle).to(torch.bfloat16)))
    stage["freqs_sin"] = torch.stack((stage["freqs_sin"], torch.sin(angle).to(torch.bfloat16)))
    m = moe_inputs(config, seed, num_tokens=num_tokens, rows=rows)
    moe = {**base["moe"], "tid2eid": m["tid2eid"], "input_ids": m["input_ids"]}
    del moe["num_tokens"]
    return dict(hidden=torch.randn(rows, config.hidden_size, generator=g).to(torch.bfloat16), prev=x_hc,
                projection=base["projection"], attention=stage, moe=moe, head=base["head"], num_tokens=num_tokens)


def hca_stage_inputs(config, seed: int = 0, *, far: bool = False) -> tuple[torch.Tensor, dict, dict]:
    """(x_hc, attention, compressor) of one HCA decode step: ``stage_inputs``' batch moved to positions (126, 127),
    (254, 255), (300, 301), (40, 41): request 0's second row closes window 0, request 1's second row closes window 1
    (window 0 already in the cache), requests 2 and 3 close nothing (2 attends two compressed rows, 3 none).
    ``far``: request 2 at (p, p + 1) instead, p = 128 · (limit + 1) + 60, one compressed position past HCA's limit
    min(max_position_embeddings // 128, index_topk) (700 at the kernel presets' 512 positions, limit 4; 2236 at
    V4-Flash's tiny preset, limit 16), the RoPE tables then 64 rows past it. The ratio-128 compressor's state pool holds the earlier tokens' rows (random) on a ring
    of 16 pages of 8 positions per request; each request's compressed rows on one page of ``cmp_block_table``. The
    last request's first row writes window-cache slot 0."""
    from kernels.v4.compressor import V4CompressorWeights

    g = torch.Generator().manual_seed(100 + seed)
    attention = stage_inputs(config, seed)
    x_hc = attention.pop("x_hc")
    t, d, dm, bs, seq = config.decode_tokens, config.head_dim, config.hidden_size, config.block_size, config.decode_seq
    from kernels.v4.layer import hca_limit

    far_at = 128 * (hca_limit(config) + 1) + 60
    firsts = (126, 254, far_at if far else 300, 40)
    positions = -(-(far_at + 64) // 256) * 256 if far else 512
    if far:
        angle = torch.arange(positions, dtype=torch.float32)[:, None] * torch.rand(config.qk_rope_head_dim,
                                                                                   generator=g) * 0.05
        attention.update(freqs_cos=torch.cos(angle).to(torch.bfloat16), freqs_sin=torch.sin(angle).to(torch.bfloat16))
    pos = torch.tensor([firsts[r // seq] + r % seq for r in range(t)], dtype=torch.int32)
    page, ring = config.c128_state_block_size, 16
    requests = t // seq
    table = torch.tensor([[3], [1], [0], [2]], dtype=torch.int32)[:requests]
    slots = torch.full((t,), -1, dtype=torch.int64)
    for r in range(t):
        p = int(pos[r])
        if (p + 1) % 128 == 0:
            index = (p + 1) // 128 - 1
            slots[r] = int(table[r // seq, 0]) * bs + index
    # the last request's first row writes window slot 0 (an ordinary slot); request 0 reads row 100 in its place
    swa, window, first = attention["swa_slot_mapping"].clone(), attention["window_indices"].clone(), t - seq
    window[window == 0] = 100
    window[window == int(swa[first])] = 0
    swa[first] = 0
    attention.update(position_ids=pos, swa_slot_mapping=swa, window_indices=window, cmp_kv=(torch.rand(4, bs, 1, d, generator=g) - 0.5).to(torch.bfloat16),
                     cmp_block_table=table)
    compressor = dict(
        state_block_table=torch.tensor([[q * ring + k % ring for k in range(positions // page)]
                                        for q in range(requests)],
                                       dtype=torch.int32),
        state_pool=torch.randn(requests * ring, page, 2 * d, generator=g),
        weights=V4CompressorWeights(torch.randn(dm, d, generator=g) / dm**0.5, torch.randn(dm, d, generator=g) / dm**0.5,
                                    torch.randn(128, d, generator=g) * 0.5, torch.rand(d, generator=g) + 0.5),
        cmp_slot_mapping=slots, kv_seq_lens=pos.reshape(requests, seq)[:, -1].to(torch.int64) + 1)
    return x_hc, attention, compressor


def decode_layer_moe(config, seed: int = 0, *, layer_id: int = 3) -> dict:
    """The MoE stage's arguments of a decode layer (``mtp_layer_inputs``' weights) routing as layer ``layer_id``."""
    moe = dict(mtp_layer_inputs(config, seed)["moe"])
    del moe["num_tokens"]
    return dict(moe, layer_id=layer_id)


def csa_stage_inputs(config, seed: int = 0) -> tuple[torch.Tensor, dict, dict, dict]:
    """(x_hc, attention, compressor, indexer) of one CSA decode step on ``hca_stage_inputs``' batch: request 0's
    position 127 and request 1's 255 close a ratio-4 window (compressed positions 31 and 63, each one step after
    its request's first position 126 / 254, three after the window's first 124 / 252); the main and inner
    compressors' states on rings of 4 pages of 4 positions per request, earlier rows random; the index cache
    random INT8 rows with scales, each request's compressed rows and index keys on one page of its tables."""
    from kernels.v4.compressor import V4CompressorWeights

    g = torch.Generator().manual_seed(200 + seed)
    x_hc, attention, _hca = hca_stage_inputs(config, seed)
    t, d, dm, bs, seq = config.decode_tokens, config.head_dim, config.hidden_size, config.block_size, config.decode_seq
    idx_d, page, ring, requests = config.index_head_dim, config.c4a_state_block_size, 4, t // seq
    pos = attention["position_ids"].long()
    table = attention["cmp_block_table"]
    slots = torch.tensor([int(table[r // seq, 0]) * bs + (int(pos[r]) + 1) // 4 - 1 if (int(pos[r]) + 1) % 4 == 0
                          else -1 for r in range(t)], dtype=torch.int64)

    def weights(width):
        return V4CompressorWeights(torch.randn(dm, 2 * width, generator=g) / dm**0.5,
                                   torch.randn(dm, 2 * width, generator=g) / dm**0.5,
                                   torch.randn(4, 2 * width, generator=g) * 0.5, torch.rand(width, generator=g) + 0.5)

    rings = torch.tensor([[q * ring + k % ring for k in range(512 // page)] for q in range(requests)],
                         dtype=torch.int32)
    compressor = dict(state_block_table=rings, state_pool=torch.randn(requests * ring, page, 4 * d, generator=g),
                      weights=weights(d), cmp_slot_mapping=slots,
                      kv_seq_lens=pos.reshape(requests, seq)[:, -1] + 1,
                      inner_state_block_table=rings.clone(),
                      inner_state_pool=torch.randn(requests * ring, page, 4 * idx_d, generator=g),
                      inner_weights=weights(idx_d), idx_slot_mapping=slots.clone())
    q = _index_query_operands(config, g, t)
    indexer = dict(wq_b=q["wq_b"], wq_b_scale=q["wq_b_scale"], weights_proj=q["weights_proj"],
                   hadamard=q["hadamard"],
                   idx_kv_cache=torch.randint(-127, 128, (4, bs, 1, idx_d), generator=g, dtype=torch.int8),
                   idx_kv_scale=(torch.rand(4, bs, 1, 1, generator=g) + 0.5) * 2.0, idx_block_table=table.clone())
    attention["cmp_kv"] = (torch.rand(4, bs, 1, d, generator=g) - 0.5).to(torch.bfloat16)
    return x_hc, attention, compressor, indexer


def prefill_hca_stage_inputs(config, seed: int = 0, *, rows: int = 32, num_tokens: int = 28, start: int = 240
                             ) -> tuple[torch.Tensor, dict, dict, int]:
    """(x_hc, attention, compressor, num_tokens) of one request's prefill chunk through the HCA stage: rows at
    positions start .. (28 of 32 real), row 15 closing a compressed window (start = 240: window 1, window 0 already
    in the cache; start = 2288: window 17, past index_topk 16 at V4-Flash's tiny preset, whose RoPE tables the
    chunk then reaches); the window cache paged through a 1-D table mapping the chunk's two pages to physical pages
    3 and 0 (row 16 writes slot 0, an ordinary slot; the padding rows carry real row 0's slot); the ratio-128
    compressor's state paged by 8 positions through a reversed 1-D table with random rows before the chunk (an
    earlier chunk's), every real row's state slot its table row; the request's compressed rows on page 2 of a
    4-page cache of the block size (BF16 random)."""
    from kernels.v4.compressor import V4CompressorWeights

    g = torch.Generator().manual_seed(300 + seed)
    attention = stage_inputs(config, seed)
    del attention["x_hc"], attention["window_indices"]
    hc, d, dm, bs, page = config.hc_mult, config.head_dim, config.hidden_size, config.block_size, \
        config.c128_state_block_size
    pos = torch.arange(start, start + rows, dtype=torch.int32)
    logical = pos.long()
    table = torch.full((-(-(start + rows) // bs),), -1, dtype=torch.int32)
    table[start // bs], table[(start + rows - 1) // bs] = 3, 0
    slots = torch.where(table[logical // bs] >= 0, table[logical // bs].long() * bs + logical % bs, -1)
    slots[num_tokens:] = slots[0]
    angle = torch.arange(-(-(start + rows) // 256) * 256, dtype=torch.float32)[:, None] * \
        torch.rand(config.qk_rope_head_dim, generator=g) * 0.05
    blocks = -(-(start + rows) // page)
    state_table = torch.arange(blocks - 1, -1, -1, dtype=torch.int32)
    state_slots = torch.tensor([int(state_table[p // page]) * page + p % page for p in logical.tolist()])
    state_slots[num_tokens:] = -1
    cmp_slots = torch.tensor([2 * bs + (p + 1) // 128 - 1 if (p + 1) % 128 == 0 and t < num_tokens else -1
                              for t, p in enumerate(logical.tolist())], dtype=torch.int64)
    attention.update(block_table=table, swa_slot_mapping=slots, position_ids=pos,
                     freqs_cos=torch.cos(angle).to(torch.bfloat16), freqs_sin=torch.sin(angle).to(torch.bfloat16),
                     kv_cache=(torch.rand(4, bs, 1, d, generator=g) - 0.5).to(torch.bfloat16),
                     cmp_kv=(torch.rand(4, bs, 1, d, generator=g) - 0.5).to(torch.bfloat16),
                     cmp_block_table=torch.tensor([[2]], dtype=torch.int32))
    compressor = dict(state_block_table=state_table, state_pool=torch.randn(blocks + 1, page, 2 * d, generator=g),
                      weights=V4CompressorWeights(torch.randn(dm, d, generator=g) / dm**0.5,
                                                  torch.randn(dm, d, generator=g) / dm**0.5,
                                                  torch.randn(128, d, generator=g) * 0.5, torch.rand(d, generator=g) + 0.5),
                      cmp_slot_mapping=cmp_slots, state_slot_mapping=state_slots)
    return torch.randn(rows, hc, dm, generator=g), attention, compressor, num_tokens


def prefill_csa_stage_inputs(config, seed: int = 0, *, rows: int = 32, num_tokens: int = 28, start: int = 240
                             ) -> tuple[torch.Tensor, dict, dict, dict, int]:
    """(x_hc, attention, compressor, indexer, num_tokens) of one request's prefill chunk through the CSA stage:
    ``prefill_hca_stage_inputs``' chunk and window cache; every real row at a position 3 mod 4 closes a ratio-4
    window (compressed position (pos + 1) // 4 - 1 on page 2 of the compressed cache and of the index cache);
    the main and inner compressors' states paged by 4 positions through reversed 1-D tables with random rows
    before the chunk; the index cache random INT8 rows with scales; the indexer's query operands."""
    from kernels.v4.compressor import V4CompressorWeights

    g = torch.Generator().manual_seed(400 + seed)
    x_hc, attention, _hca, _ = prefill_hca_stage_inputs(config, seed, rows=rows, num_tokens=num_tokens, start=start)
    d, dm, bs, idx_d, page = config.head_dim, config.hidden_size, config.block_size, config.index_head_dim, \
        config.c4a_state_block_size
    pos = attention["position_ids"].long().tolist()
    blocks = -(-(start + rows) // page)
    table = torch.arange(blocks - 1, -1, -1, dtype=torch.int32)
    state_slots = torch.tensor([int(table[p // page]) * page + p % page if t < num_tokens else -1
                                for t, p in enumerate(pos)])
    slots = torch.tensor([2 * bs + (p + 1) // 4 - 1 if (p + 1) % 4 == 0 and t < num_tokens else -1
                          for t, p in enumerate(pos)], dtype=torch.int64)

    def weights(width):
        return V4CompressorWeights(torch.randn(dm, 2 * width, generator=g) / dm**0.5,
                                   torch.randn(dm, 2 * width, generator=g) / dm**0.5,
                                   torch.randn(4, 2 * width, generator=g) * 0.5, torch.rand(width, generator=g) + 0.5)

    compressor = dict(state_block_table=table, state_pool=torch.randn(blocks + 1, page, 4 * d, generator=g),
                      weights=weights(d), cmp_slot_mapping=slots, state_slot_mapping=state_slots,
                      inner_state_block_table=table.clone(),
                      inner_state_pool=torch.randn(blocks + 1, page, 4 * idx_d, generator=g),
                      inner_weights=weights(idx_d), idx_slot_mapping=slots.clone(),
                      inner_state_slot_mapping=state_slots.clone())
    q = _index_query_operands(config, g, rows)
    indexer = dict(wq_b=q["wq_b"], wq_b_scale=q["wq_b_scale"], weights_proj=q["weights_proj"], hadamard=q["hadamard"],
                   idx_kv_cache=torch.randint(-127, 128, (4, bs, 1, idx_d), generator=g, dtype=torch.int8),
                   idx_kv_scale=(torch.rand(4, bs, 1, 1, generator=g) + 0.5) * 2.0,
                   idx_block_table=torch.tensor([2], dtype=torch.int32))
    return x_hc, attention, compressor, indexer, num_tokens


def prefill_layer_inputs(config, seed: int = 0) -> dict:
    """Two requests packed into 40 rows for the model's first SWA layer (tile 16): request 0's 24 rows at positions
    120 .. 143 (rows 0 .. 23: two tiles, its window crossing its page boundary at 128 into the random rows it holds
    before 120), a gap row (24), request 1's 8 rows at positions 130 .. 137 (rows 25 .. 32, its one tile running
    past the packed end; the same positions as request 0's, on other pages), rows 33 .. 39 after. Request-local
    page tables over a pool of 4 pages: request 0 on physical pages 2 then 0, request 1 on 3 then 1. The rows outside both chunks (``outside``) carry
    position 0, slot -1 and token id 0. Weights: ``prefill_stage_inputs``' SWA stage and ``mtp_layer_inputs``'
    MoE stage (score-routed at this layer)."""
    g = torch.Generator().manual_seed(seed + 300)
    hc, d, bs = config.hc_mult, config.hidden_size, config.block_size
    stage = prefill_stage_inputs(config, seed)
    for name in ("x_hc", "block_table", "swa_slot_mapping", "position_ids", "kv_cache", "num_tokens"):
        stage.pop(name, None)
    moe = dict(mtp_layer_inputs(config, seed)["moe"])
    del moe["num_tokens"]
    n, offsets, lens = 40, torch.tensor([0, 25], dtype=torch.int32), torch.tensor([24, 8], dtype=torch.int32)
    tables = torch.tensor([[2, 0], [3, 1]], dtype=torch.int32)
    pos = torch.zeros(n, dtype=torch.int32)
    slots = torch.full((n,), -1, dtype=torch.int64)
    for b, start in enumerate((120, 130)):
        off, length = int(offsets[b]), int(lens[b])
        p = torch.arange(start, start + length)
        pos[off:off + length] = p.to(torch.int32)
        slots[off:off + length] = tables[b][p // bs].long() * bs + p % bs
    outside = [r for r in range(n) if not any(int(o) <= r < int(o) + int(ln) for o, ln in zip(offsets, lens, strict=True))]
    ids = torch.randint(0, moe["tid2eid"].shape[0], (n,), generator=g)
    ids[outside] = 0
    stage.update(block_tables=tables, swa_slot_mapping=slots, position_ids=pos,
                 kv_cache=(torch.rand(4, bs, 1, config.head_dim, generator=g) - 0.5).to(torch.bfloat16))
    return dict(x_hc=torch.randn(n, hc, d, generator=g), chunk_lens=lens, chunk_offsets=offsets, attention=stage,
                moe={**moe, "input_ids": ids}, layer_id=config.compress_ratios.index(0), tile=16, outside=outside)


def cp_unsplit_window(i: dict, n: int, prefix: int, config) -> tuple[torch.Tensor, torch.Tensor, int]:
    """The unsplit prefill's window cache for a CP chunk's inputs ``i`` (``kernels.v4.cp_swa.chunk_inputs``): the
    prefix's last R positions read from rank 0's ring (page ``(p % ring) // bs`` of its table, row ``p % bs``, the
    ring's rule written here) into a cache of identity pages for positions 0 .. prefix + n - 1 -> (cache, the
    chunk's positions INT32, the pages)."""
    bs, hd, r = config.block_size, config.head_dim, config.sliding_window
    total = prefix + n
    pages = -(-total // bs)
    cache = torch.zeros(pages, bs, 1, hd, dtype=torch.bfloat16)
    ring, tl = i["kv_cache"][0].reshape(-1, hd), i["block_table"].tolist()
    for p in range(max(0, prefix - r), prefix):
        cache.reshape(-1, hd)[p] = ring[tl[(p % len(ring)) // bs] * bs + p % bs]
    return cache, torch.arange(prefix, total, dtype=torch.int32), pages
