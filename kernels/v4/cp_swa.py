"""V4-Flash's context-parallel SWA prefill (spec §7.1, §8; upstream models/deepseek_v4_flash_mtp/prefill_cp_swa.py):
one prefill chunk's sliding-window attention sublayer computed by ``cp`` ranks, each on the two zigzag segments it
owns (``kernels.v4.cp_zigzag``), with the KV rows a window needs from another rank handed over as segment tails.

**The plan** (``cp_swa_plan``). ``R`` = the sliding window (upstream's ``TAIL_ROWS`` = ``WIN``). The chunk of
``num_tokens`` tokens after ``prefix`` cached ones is cut into ``2 * cp`` segments of ``span`` positions
(``R <= span <= 2R``: a segment is one or two query tiles of ``R`` rows, and the window of a segment's first row
reaches back at most ``R - 1`` positions, which the predecessor's tail holds). Rank r's part p is segment
``owner_segments[r][p]``; its tile t holds the segment's positions ``start + t*R ..`` (``query_position_ids``, 0 on
an empty row; ``query_token_to_request`` 0 / -1). Each tile attends over a *fake cache*: the rank's persistent
window ring (``ori_rows`` = pages x block rows of ``block_table``) followed by ``2R`` overlay rows starting at
``OVERLAY_BASE = ori_rows``:

* overlay rows 0 .. R-1 ("pred"): tile 0: the predecessor segment's (s - 1) last ``min(R, len)`` KV rows, first row
  first; tile 1: the segment's own tile 0;
* overlay rows R .. 2R-1 ("cur"): the tile's own KV rows.

``overlay_position_ids`` names each overlay row's position (-1 unused), ``overlay_active_lengths`` [.., 2] the rows
of each source. ``swa_indices`` [cp, 2, 2, R, WIN]: for a query at position q, column c is the key at position
``q - WIN + 1 + c`` (so the token's own key is the last column), lowered to a fake-cache row: a key before the chunk
to its ring row (``block_table[(p % ori_rows) // bs] * bs + p % bs``), a key of the tile to the cur overlay, an
earlier key of the chunk to the pred overlay, a key before position 0 (or out of reach) -1.

After the chunk the ring must hold the first decode step's window: ``final_win_seg_src`` / ``final_win_row_src``
[R] name the segment and tail row holding position ``prefix + num_tokens - R + j`` (``kernels.v4.cp_zigzag``'s
``window_sources``), ``final_slot_mapping`` its ring row (-1 before the chunk).

**The sublayer** (``prefill_cp_swa``). Every rank projects its tiles (hc_pre, RMSNorm, ``v4_qkv_proj_rope`` at the
query positions' RoPE rows) and sends its segments' tails (their last ``min(R, len)`` KV rows); then each tile
attends (``v4_attention``, SWA, prefill form: ``num_tokens`` = the tile's active rows) over its rank's ring, the
pred overlay and its own KV rows in the cur overlay, and goes through ``hc_post`` with its mixes -- the SWA prefill
stage, spelled out as upstream's CP golden spells it. x_out [cp, 2, 2, R, hc, D] FP32 holds each tile's output
(0 on empty rows); every rank's ring then gets the decode window at ``final_slot_mapping`` and nothing else.
Composed from the backend's operators. What upstream distributes (a window buffer with ready / consumed epochs) is
data movement only.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import partial

import torch

from kernels.errors import ContractInputError, is_int
from kernels.operators import operator
from kernels.record import BadCall, CaseSpec, Record, Upstream, generator, int8_codes, replaced
from kernels.v4.cp_zigzag import check_cp, cp_zigzag_plan, window_sources

SPEC = "§7.1"
PARTS = 2  # upstream's LOCAL_PARTS: the zigzag's two segments per rank
TILES = 2  # upstream's MAX_SEGMENT_TILES: a segment holds at most two query tiles of R rows
PLAN_NAMES = ("segment_starts", "owner_segments", "predecessor_segments", "query_position_ids",
              "query_token_to_request", "overlay_position_ids", "overlay_token_to_request", "overlay_active_lengths",
              "swa_indices", "final_win_seg_src", "final_win_row_src", "final_slot_mapping")


def _check_table(block_table: torch.Tensor, bs: int, window: int) -> int:
    if block_table.ndim != 1 or block_table.is_floating_point() or block_table.numel() == 0:
        raise ContractInputError("block_table", None, "a 1-D integer page table of the window ring",
                                 f"{block_table.dtype}{list(block_table.shape)}", SPEC)
    if bool((block_table < 0).any()):
        bad = int((block_table < 0).nonzero()[0])
        raise ContractInputError("block_table", (bad,), "a mapped page (>= 0): every ring page holds rows",
                                 int(block_table[bad]), SPEC)
    rows = block_table.numel() * bs
    if rows < window:
        raise ContractInputError("block_table", None, f">= {-(-window // bs)} pages (the ring holds a window of "
                                 f"{window})", block_table.numel(), SPEC)
    return rows


def ring_rows(positions: torch.Tensor, block_table: torch.Tensor, bs: int) -> torch.Tensor:
    """The ring row of each position: page ``(p % ring) // bs`` of the table, row ``p % bs`` (INT64)."""
    ring = block_table.numel() * bs
    p = positions.to(torch.int64) % ring
    return block_table.to(torch.int64)[p // bs] * bs + p % bs


@operator(returns="{segment_starts, owner_segments, predecessor_segments, query_position_ids, "
                  "query_token_to_request, overlay_position_ids, overlay_token_to_request, overlay_active_lengths, "
                  "swa_indices, final_win_seg_src, final_win_row_src, final_slot_mapping} INT32: the CP SWA "
                  "prefill's per-rank tiles, overlays and lowered windows", spec=SPEC)
def cp_swa_plan(num_tokens: int, cp: int, span: int, block_table: torch.Tensor, *, prefix: int = 0,
                config) -> dict[str, torch.Tensor]:
    """The metadata of one CP SWA prefill chunk (module docstring): ``num_tokens`` after ``prefix``, ``cp`` ranks,
    segments of ``span`` positions, the window ring's ``block_table`` [pages]."""
    win = config.sliding_window
    r_rows, bs = win, config.block_size
    check_cp(cp)
    if not is_int(span) or not r_rows <= span <= TILES * r_rows:
        raise ContractInputError("span", None, f"{r_rows} .. {TILES * r_rows} positions (one or two tiles of the "
                                 f"window {r_rows}: a segment's first row reaches back into its predecessor's tail "
                                 "only)", span, SPEC)
    ring = _check_table(block_table, bs, win)
    zz = cp_zigzag_plan(num_tokens, cp, span, prefix=prefix)
    starts, lens = zz["segment_starts"].tolist(), zz["segment_lens"].tolist()
    owners = torch.full((cp, PARTS), -1, dtype=torch.int32)
    for s in range(2 * cp):
        owners[int(zz["owner_rank"][s]), int(zz["owner_part"][s])] = s
    base = ring
    q_pos = torch.zeros(cp, PARTS, TILES, r_rows, dtype=torch.int32)
    q_req = torch.full_like(q_pos, -1)
    ov_pos = torch.full((cp, PARTS, TILES, 2 * r_rows), -1, dtype=torch.int32)
    ov_len = torch.zeros(cp, PARTS, TILES, 2, dtype=torch.int32)
    swa = torch.full((cp, PARTS, TILES, r_rows, win), -1, dtype=torch.int32)
    preds = torch.full((cp, PARTS), -1, dtype=torch.int32)
    cols = torch.arange(win)
    for rank in range(cp):
        for part in range(PARTS):
            s = int(owners[rank, part])
            preds[rank, part] = s - 1
            for tile in range(TILES):
                cur = starts[s] + tile * r_rows
                active = max(0, min(lens[s] - tile * r_rows, r_rows))
                if tile == 0 and s > 0:  # the predecessor segment's tail
                    pred_len = min(r_rows, lens[s - 1])
                    pred_start = starts[s - 1] + max(0, lens[s - 1] - r_rows)
                else:  # segment 0's tile 0: none; tile 1: the segment's own tile 0
                    pred_len, pred_start = (min(lens[s], r_rows) if tile else 0), starts[s]
                ov_len[rank, part, tile] = torch.tensor([pred_len, active])
                ov_pos[rank, part, tile, :pred_len] = torch.arange(pred_start, pred_start + pred_len)
                ov_pos[rank, part, tile, r_rows:r_rows + active] = torch.arange(cur, cur + active)
                q_pos[rank, part, tile, :active] = torch.arange(cur, cur + active)
                q_req[rank, part, tile, :active] = 0
                q = torch.arange(cur, cur + active)[:, None]
                key = q - win + 1 + cols[None, :]
                row = torch.full(key.shape, -1, dtype=torch.int64)
                before = (key >= 0) & (key < prefix)
                row = torch.where(before, ring_rows(key, block_table, bs), row)
                own = (key >= cur) & (key <= q)
                row = torch.where(own, base + r_rows + key - cur, row)
                pred = (key >= pred_start) & (key < pred_start + pred_len)  # the pred source ends at cur
                row = torch.where(pred, base + key - pred_start, row)
                swa[rank, part, tile, :active] = row.to(torch.int32)
    sources = window_sources(lens, r_rows)
    total = sum(lens)
    final = [prefix + total - r_rows + j for j in range(r_rows)]
    slots = ring_rows(torch.tensor(final), block_table, bs)  # a position before the chunk: -1 below
    return {"segment_starts": zz["segment_starts"], "owner_segments": owners, "predecessor_segments": preds,
            "query_position_ids": q_pos, "query_token_to_request": q_req, "overlay_position_ids": ov_pos,
            "overlay_token_to_request": torch.where(ov_pos >= 0, 0, -1).to(torch.int32),
            "overlay_active_lengths": ov_len, "swa_indices": swa,
            "final_win_seg_src": torch.tensor([s for s, _ in sources], dtype=torch.int32),
            "final_win_row_src": torch.tensor([r for _, r in sources], dtype=torch.int32),
            "final_slot_mapping": torch.tensor([int(v) if p >= prefix else -1 for p, v in
                                                zip(final, slots.tolist(), strict=True)], dtype=torch.int32)}


def check_prefill_cp_swa(x_hc: torch.Tensor, kv_cache: torch.Tensor, plan: Mapping[str, torch.Tensor],
                         config) -> tuple[int, int]:
    """The caller's side: x_hc [cp, 2, 2, R, hc, D] FP32, kv_cache [cp, pages, bs, 1, head_dim] BF16 and the
    plan's tables at the same cp and R -> (cp, ring rows)."""
    r_rows, hc, d = config.sliding_window, config.hc_mult, config.hidden_size
    if x_hc.ndim != 6 or tuple(x_hc.shape[1:]) != (PARTS, TILES, r_rows, hc, d) or x_hc.dtype != torch.float32:
        raise ContractInputError("x_hc", None, f"[cp, {PARTS}, {TILES}, {r_rows}, {hc}, {d}] FP32 (each rank's two "
                                 f"segments in tiles of the window {r_rows})", f"{x_hc.dtype}{list(x_hc.shape)}",
                                 SPEC)
    cp = x_hc.shape[0]
    check_cp(cp)
    bs, hd = config.block_size, config.head_dim
    if kv_cache.ndim != 5 or kv_cache.shape[0] != cp or tuple(kv_cache.shape[2:]) != (bs, 1, hd) \
            or kv_cache.dtype != torch.bfloat16:
        raise ContractInputError("kv_cache", None, f"[{cp}, pages, {bs}, 1, {hd}] BF16 (each rank's window ring)",
                                 f"{kv_cache.dtype}{list(kv_cache.shape)}", SPEC)
    missing = [n for n in PLAN_NAMES if n not in plan]
    if missing:
        raise ContractInputError("plan", None, f"cp_swa_plan's tables {PLAN_NAMES}", f"missing {missing}", SPEC)
    shapes = {"owner_segments": (cp, PARTS), "predecessor_segments": (cp, PARTS),
              "query_position_ids": (cp, PARTS, TILES, r_rows), "overlay_active_lengths": (cp, PARTS, TILES, 2),
              "swa_indices": (cp, PARTS, TILES, r_rows, config.sliding_window), "final_win_seg_src": (r_rows,),
              "final_win_row_src": (r_rows,), "final_slot_mapping": (r_rows,)}
    for name, shape in shapes.items():
        t = plan[name]
        if tuple(t.shape) != shape or t.is_floating_point():
            raise ContractInputError(f"plan.{name}", None, f"{list(shape)} integers (cp {cp}, R {r_rows})",
                                     f"{t.dtype}{list(t.shape)}", SPEC)
    segs = sorted(plan["owner_segments"].reshape(-1).tolist())
    if segs != list(range(2 * cp)):
        raise ContractInputError("plan.owner_segments", None, f"each of the {2 * cp} segments once", segs, SPEC)
    ring = kv_cache.shape[1] * bs
    lens = plan["overlay_active_lengths"]
    if bool(((lens < 0) | (lens > r_rows)).any()):
        bad = tuple(int(v) for v in ((lens < 0) | (lens > r_rows)).nonzero()[0])
        raise ContractInputError("plan.overlay_active_lengths", bad, f"0 .. {r_rows}", int(lens[bad]), SPEC)
    idx = plan["swa_indices"]
    out = (idx < -1) | (idx >= ring + 2 * r_rows)
    if bool(out.any()):
        bad = tuple(int(v) for v in out.nonzero()[0])
        raise ContractInputError("plan.swa_indices", bad, f"-1 or a fake-cache row < {ring + 2 * r_rows} (the ring "
                                 f"of {ring} rows and 2 x {r_rows} overlay rows)", int(idx[bad]), SPEC)
    slots = plan["final_slot_mapping"]
    if bool(((slots < -1) | (slots >= ring)).any()):
        j = int(((slots < -1) | (slots >= ring)).nonzero()[0])
        raise ContractInputError("plan.final_slot_mapping", (j,), f"-1 or a ring row < {ring}", int(slots[j]), SPEC)
    return cp, ring  # the overlays' 2R rows fill whole pages: R is a multiple of the page in every preset


def _bound(ops: Mapping, name: str, default):
    fn = ops.get(name, default)
    return partial(fn, ops=ops) if getattr(fn, "composes_operators", False) else fn


@operator(returns="{x_out [cp,2,2,R,hc,D] FP32, kv_cache [cp,pages,bs,1,hd] BF16}: each rank's tiles through "
                  "hc_pre, RMSNorm, Q/KV, the SWA attention over its ring and the exchanged overlays and hc_post, "
                  "every ring given the decode window "
                  "-- composed from this backend's operators", spec=SPEC)
def prefill_cp_swa(x_hc: torch.Tensor, hc_fn: torch.Tensor, hc_scale: torch.Tensor, hc_base: torch.Tensor,
                   attn_norm_w: torch.Tensor, wq_a: torch.Tensor, wq_b: torch.Tensor, wq_b_scale: torch.Tensor,
                   wkv: torch.Tensor, gamma_cq: torch.Tensor, gamma_ckv: torch.Tensor, freqs_cos: torch.Tensor,
                   freqs_sin: torch.Tensor, kv_cache: torch.Tensor, attn_sink: torch.Tensor, wo_a: torch.Tensor,
                   wo_b: torch.Tensor, wo_b_scale: torch.Tensor, plan: Mapping[str, torch.Tensor], *, config,
                   ops=None) -> dict[str, torch.Tensor]:
    """The CP SWA prefill sublayer (module docstring); ``plan`` is ``cp_swa_plan``'s tables. The input cache is not
    modified."""
    ops = ops or {}
    check_prefill_cp_swa(x_hc, kv_cache, plan, config)
    weights = (hc_fn, hc_scale, hc_base, attn_norm_w, wq_a, wq_b, wq_b_scale, wkv, gamma_cq, gamma_ckv)
    tiles = active_tiles(plan)
    local_kv, _, projected = project_tiles(x_hc, weights, freqs_cos, freqs_sin, plan, tiles, config=config, ops=ops)
    logical = exchange_tails(local_kv, plan)
    x_out = attend_tiles("SWA", x_hc, kv_cache, local_kv, logical, projected, plan, tiles,
                         (attn_sink, freqs_cos, freqs_sin, wo_a, wo_b, wo_b_scale), config=config, ops=ops)
    return {"x_out": x_out, "kv_cache": publish_window(kv_cache, logical, plan)}


def active_tiles(plan: Mapping[str, torch.Tensor]) -> list[tuple[int, int, int]]:
    """Every (rank, part, tile) holding at least one query row."""
    active = plan["overlay_active_lengths"][..., 1]
    cp = active.shape[0]
    return [(rank, part, tile) for rank in range(cp) for part in range(PARTS) for tile in range(TILES)
            if int(active[rank, part, tile])]


def project_tiles(x_hc, weights, freqs_cos, freqs_sin, plan, tiles, *, config, ops):
    """Step 1, every rank on its own tiles: hc_pre, RMSNorm, Q/KV at the query positions' RoPE rows -> (local_kv
    [cp, 2, 2, R, hd] BF16, local_norm [cp, 2, 2, R, D] (the normalised rows, their dtype), {tile: (mixes, the
    Q/KV projection's outputs (q, kv, qr, qr_scale), RoPE rows)})."""
    from kernels.reference import lm_head, mhc
    from kernels.v4.attention_stage import stage_positions
    from kernels.v4.qkv_proj import v4_qkv_proj_rope

    hc_fn, hc_scale, hc_base, attn_norm_w, wq_a, wq_b, wq_b_scale, wkv, gamma_cq, gamma_ckv = weights
    cp, r_rows, hd = x_hc.shape[0], config.sliding_window, config.head_dim
    active = plan["overlay_active_lengths"][..., 1]
    local_kv = torch.zeros(cp, PARTS, TILES, r_rows, hd, dtype=torch.bfloat16)
    local_norm = None
    projected = {}
    for rank, part, tile in tiles:
        n = int(active[rank, part, tile])
        x = x_hc[rank, part, tile]
        _, pos = stage_positions(plan["query_position_ids"][rank, part, tile], freqs_cos, tokens=r_rows,
                                 num_tokens=n)
        mixes = _bound(ops, "hc_mixes", mhc.hc_mixes)(x, hc_fn, hc_scale, hc_base, config=config)
        normed = _bound(ops, "final_norm", lm_head.final_norm)(_bound(ops, "hc_pre", mhc.hc_pre)(x, mixes.pre),
                                                               attn_norm_w, config=config)
        if local_norm is None:
            local_norm = torch.zeros(cp, PARTS, TILES, r_rows, normed.shape[-1], dtype=normed.dtype)
        local_norm[rank, part, tile, :n] = normed[:n]
        proj = _bound(ops, "v4_qkv_proj_rope", v4_qkv_proj_rope)(
            normed, wq_a, wq_b, wq_b_scale, wkv, freqs_cos[pos], freqs_sin[pos], gamma_cq, gamma_ckv, config=config)
        local_kv[rank, part, tile, :n] = proj["kv"][:n].to(torch.bfloat16)
        projected[rank, part, tile] = (mixes, proj, pos)
    return local_kv, local_norm, projected


def exchange_tails(local: torch.Tensor, plan: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """Step 2, the exchange: each segment's tail (its last min(R, len) rows of ``local`` [cp, 2, 2, R, ...], first
    row first), in logical order -> [2cp, R, ...]."""
    cp, r_rows = local.shape[0], local.shape[3]
    active = plan["overlay_active_lengths"][..., 1]
    logical = torch.zeros(2 * cp, *local.shape[3:], dtype=local.dtype)
    for rank in range(cp):
        for part in range(PARTS):
            rows = torch.cat([local[rank, part, t, :int(active[rank, part, t])] for t in range(TILES)])
            tail = rows[max(0, rows.shape[0] - r_rows):]
            logical[int(plan["owner_segments"][rank, part]), :tail.shape[0]] = tail
    return logical


def attend_tiles(path, x_hc, kv_cache, local_kv, logical, projected, plan, tiles, tail, *, config, ops,
                 compressed=None):
    """Step 3: each tile attends over its rank's ring, the pred overlay and its own rows (the cur overlay), then
    hc_post -> x_out [cp, 2, 2, R, hc, D] FP32 (0 on empty rows). ``compressed`` (HCA / CSA): a function of (rank,
    part, tile) -> (cmp_kv, cmp_block_table [1, pages], the tile's compressed slots)."""
    from kernels.reference import mhc
    from kernels.v4.sparse_attention import v4_attention

    attn_sink, freqs_cos, freqs_sin, wo_a, wo_b, wo_b_scale = tail
    r_rows, hd, bs = config.sliding_window, config.head_dim, config.block_size
    ring = kv_cache.shape[1] * bs
    active = plan["overlay_active_lengths"][..., 1]
    attend = _bound(ops, "v4_attention", v4_attention)
    expand = _bound(ops, "hc_post", mhc.hc_post)
    x_out = torch.zeros_like(x_hc)
    no_cmp = torch.zeros(1, bs, 1, hd, dtype=torch.bfloat16), torch.zeros(1, 1, dtype=torch.int32), None
    for rank, part, tile in tiles:
        n = int(active[rank, part, tile])
        mixes, proj, pos = projected[rank, part, tile]
        fake = torch.zeros(ring + 2 * r_rows, hd, dtype=torch.bfloat16)
        fake[:ring] = kv_cache[rank].reshape(ring, hd)
        pred = int(plan["predecessor_segments"][rank, part])
        if tile == 0 and pred >= 0:
            fake[ring:ring + r_rows] = logical[pred]
        elif tile == 1:
            fake[ring:ring + r_rows] = local_kv[rank, part, 0]
        fake[ring + r_rows:] = local_kv[rank, part, tile]
        cmp = no_cmp if compressed is None else compressed(rank, part, tile)
        out = attend(path, proj["q"], fake.reshape(-1, bs, 1, hd), plan["swa_indices"][rank, part, tile], *cmp,
                     plan["query_position_ids"][rank, part, tile], attn_sink, freqs_cos[pos], freqs_sin[pos], wo_a,
                     wo_b, wo_b_scale, config=config, seq=r_rows, num_tokens=n)
        y = expand(out, x_hc[rank, part, tile], mixes.post, mixes.residual)
        y[n:] = 0  # hc_post_prefill's zero tail
        x_out[rank, part, tile] = y
    return x_out


def publish_window(kv_cache: torch.Tensor, logical: torch.Tensor, plan: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """Step 4: every rank's ring gets the first decode step's window (the input cache is not modified)."""
    cache = kv_cache.clone()
    cp, r_rows, hd = kv_cache.shape[0], logical.shape[1], kv_cache.shape[-1]
    flat = cache.reshape(cp, -1, hd)
    for j in range(r_rows):
        seg, row, dst = (int(plan[n][j]) for n in ("final_win_seg_src", "final_win_row_src", "final_slot_mapping"))
        if seg >= 0 and row >= 0 and dst >= 0:
            flat[:, dst] = logical[seg, row]
    return cache


prefill_cp_swa.composes_operators = True


# --- the record ----------------------------------------------------------------------------------------------

WEIGHT_NAMES = ("hc_fn", "hc_scale", "hc_base", "attn_norm_w", "wq_a", "wq_b", "wq_b_scale", "wkv", "gamma_cq",
                "gamma_ckv", "freqs_cos", "freqs_sin")
TAIL_NAMES = ("attn_sink", "wo_a", "wo_b", "wo_b_scale")


def stage_weights(config, g: torch.Generator, positions: int) -> dict[str, torch.Tensor]:
    """The SWA sublayer's weights and RoPE tables (``positions`` rows), at the preset's dims."""
    c = config
    hc, dm, h, d, lora, rope = (c.hc_mult, c.hidden_size, c.num_attention_heads, c.head_dim, c.q_lora_rank,
                                c.qk_rope_head_dim)
    mix = (2 + hc) * hc
    angle = torch.arange(positions, dtype=torch.float32)[:, None] * torch.rand(rope, generator=g) * 0.05
    return {"hc_fn": torch.randn(mix, hc * dm, generator=g) * 0.05, "hc_scale": torch.tensor([2.0, 0.02, 0.25]),
            "hc_base": torch.randn(mix, generator=g),
            "attn_norm_w": (torch.rand(dm, generator=g) + 0.5).to(torch.bfloat16),
            "wq_a": (torch.randn(dm, lora, generator=g) / dm**0.5).to(torch.bfloat16),
            "wq_b": int8_codes((lora, h * d), g), "wq_b_scale": torch.rand(h * d, generator=g) / 127 + 1e-3,
            "wkv": (torch.randn(dm, d, generator=g) / dm**0.5).to(torch.bfloat16),
            "gamma_cq": (torch.rand(lora, generator=g) + 0.5).to(torch.bfloat16),
            "gamma_ckv": (torch.rand(d, generator=g) + 0.5).to(torch.bfloat16),
            "freqs_cos": torch.cos(angle).to(torch.bfloat16), "freqs_sin": torch.sin(angle).to(torch.bfloat16),
            "attn_sink": torch.randn(h, generator=g),
            "wo_a": ((torch.rand(c.o_groups, c.o_lora_rank, h * d // c.o_groups, generator=g) - 0.5) / 4
                     ).to(torch.bfloat16),
            "wo_b": int8_codes((dm, c.o_groups * c.o_lora_rank), g), "wo_b_scale": torch.rand(dm, generator=g) / 500}


def chunk_inputs(config, seed: int, *, cp: int, span: int, num_tokens: int, prefix: int, pages: int = 2,
                 noisy_padding: bool = False) -> dict[str, torch.Tensor]:
    """One CP SWA chunk: the weights, every position's streams ``x_all`` [prefix + num_tokens, hc, D] (the rank
    tiles hold the chunk's rows; an empty row holds 0, or streams of its own with ``noisy_padding``, which no output
    may show), each rank's ring (a shuffled table of ``pages`` pages, random rows: the prefix's), and the plan's
    tables."""
    g = generator(seed)
    hc, dm, hd, bs = config.hc_mult, config.hidden_size, config.head_dim, config.block_size
    i = stage_weights(config, g, prefix + num_tokens + 1)
    table = torch.randperm(pages, generator=g).to(torch.int32)
    plan = cp_swa_plan(num_tokens, cp, span, table, prefix=prefix, config=config)
    x_all = torch.randn(prefix + num_tokens, hc, dm, generator=g)
    pos = plan["query_position_ids"].long()
    real = plan["query_token_to_request"] >= 0
    pad = torch.randn(pos.shape + x_all.shape[1:], generator=g) if noisy_padding else torch.zeros(())
    x_hc = torch.where(real[..., None, None], x_all[pos], pad)
    ring = (torch.rand(pages, bs, 1, hd, generator=g) - 0.5).to(torch.bfloat16)
    return {**i, "x_hc": x_hc, "kv_cache": ring.unsqueeze(0).expand(cp, -1, -1, -1, -1).contiguous(),
            "block_table": table, "x_all": x_all, **plan}


def cp_only(*, golden: str = "", entry: str = "", none: str = "") -> tuple[Upstream, ...]:
    """An operator of the context-parallel prefill, which Flash-MTP's folder alone has."""
    return (Upstream("deepseek_v4_pro", none="V4-Pro has no context-parallel prefill"),
            Upstream("deepseek_v4_flash_mtp", golden=golden, entry=entry, none=none),
            Upstream("deepseek_v4_flash_dspark", none="dspark has no context-parallel prefill"))


def plan_call(fn, i: dict[str, torch.Tensor], config) -> dict[str, torch.Tensor]:
    """A CP plan record's call: (num_tokens, cp, span, block_table, prefix) from the case's tensors."""
    return dict(fn(int(i["num_tokens"]), int(i["cp"]), int(i["span"]), i["block_table"], prefix=int(i["prefix"]),
                   config=config))


def plan_case(seed: int, wiring: str, config) -> dict[str, torch.Tensor]:
    """The CP plans' case: CP 4, span 1.5R, 700 tokens after 61 cached, a shuffled ring of 3 pages."""
    return {"num_tokens": torch.tensor(700), "cp": torch.tensor(4),
            "span": torch.tensor(3 * config.sliding_window // 2), "prefix": torch.tensor(61),
            "block_table": torch.randperm(3, generator=generator(seed)).to(torch.int32)}


def _tree(seed: int, wiring: str, config) -> dict[str, torch.Tensor]:
    """CP 2, segments of one tile (span R), R + 6 tokens after a prefix of 5: segment 0 (rank 0) full, its first
    rows' windows in the ring; segment 1 (rank 1) 6 rows whose windows reach into segment 0's tail, handed over
    from rank 0; segments 2 and 3 empty (the contracts reach the second tile; the sample store's budget)."""
    r = config.sliding_window
    i = chunk_inputs(config, seed, cp=2, span=r, num_tokens=r + 6, prefix=5)
    del i["x_all"], i["block_table"]
    return i


def _call(fn, i: dict[str, torch.Tensor], config) -> dict[str, torch.Tensor]:
    return dict(fn(*(i[n] for n in ("x_hc", *WEIGHT_NAMES, "kv_cache", *TAIL_NAMES)),
                   {n: i[n] for n in PLAN_NAMES}, config=config))


RECORD = Record(
    operator="prefill_cp_swa",
    call=_call,
    outputs={"x_out": "v4_cp_x_out", "kv_cache": "v4_cp_kv_cache"},
    cases=(CaseSpec("prefill_cp_swa", "V4-Flash CP SWA prefill, CP 2: each rank's zigzag segments in tiles of the "
                    "window through hc_pre, RMSNorm, Q/KV, the SWA attention over its ring and the exchanged tails, "
                    "hc_post; every ring given the decode window", _tree, geometries=("flash-tiny",)),),
    bad_calls=(
        BadCall("a tile of R - 1 rows", "prefill_cp_swa", replaced(x_hc=lambda i: i["x_hc"][:, :, :, 1:]), "x_hc"),
        BadCall("a CP world of 3", "prefill_cp_swa",
                replaced(x_hc=lambda i: torch.cat((i["x_hc"], i["x_hc"][:1]))), "cp"),
        BadCall("one ring for all ranks", "prefill_cp_swa", replaced(kv_cache=lambda i: i["kv_cache"][:1]),
                "kv_cache"),
        BadCall("a window row past the overlays", "prefill_cp_swa",
                replaced(swa_indices=lambda i: torch.where(i["swa_indices"] >= 0, i["swa_indices"] + 10**6, -1)),
                "plan.swa_indices"),
        BadCall("a segment owned twice", "prefill_cp_swa",
                replaced(owner_segments=lambda i: torch.zeros_like(i["owner_segments"])), "plan.owner_segments"),
    ),
    bindings=cp_only(golden="prefill_cp_swa.py::golden_prefill_cp_swa", entry="prefill_cp_swa.py::prefill_cp_swa_test"),
)

PLAN_RECORD = Record(
    operator="cp_swa_plan",
    call=plan_call,
    outputs={n: "exact" for n in PLAN_NAMES},
    cases=(CaseSpec("cp_swa_plan", "V4-Flash CP SWA prefill metadata, CP 4, span 1.5R, 700 tokens after 61 cached: "
                    "the zigzag tiles, the overlays and every window lowered to ring or overlay rows", plan_case,
                    geometries=("flash-tiny",)),),
    bad_calls=(
        BadCall("a span shorter than the window", "cp_swa_plan", replaced(span=torch.tensor(5)), "span"),
        BadCall("an unmapped ring page", "cp_swa_plan",
                replaced(block_table=torch.tensor([0, -1, 1], dtype=torch.int32)), "block_table"),
        BadCall("more tokens than the segments hold", "cp_swa_plan", replaced(num_tokens=torch.tensor(10**4)),
                "num_tokens"),
    ),
    bindings=cp_only(none="built by the test fixture (prefill_cp_swa.py::build_metadata, zero history, equal "
                          "segments), not a golden; the host lowers it"),
)
