"""V4-Flash's context-parallel CSA prefill (spec §7.1, §8; upstream models/deepseek_v4_flash_mtp/prefill_cp_csa.py):
the CP SWA prefill (``kernels.v4.cp_swa``) with CSA's ratio-4 compressors and indexer inside. A CSA window is 4
positions and overlaps the one before it (a close at c pools positions c - 7 .. c), so a segment's first windows
reach into its predecessor, and its owner, whenever they exist.

**The plan** is ``cp_hca_plan``'s (``kernels.v4.cp_hca``): CSA reads its SWA tables, each segment's tail positions
and the final segment (its compressed picks are the indexer's, made here).

**The sublayer** (``prefill_cp_csa``). Steps 1-2 as CP HCA: every rank projects its tiles (keeping each tile's
normalised rows and its indexer query operands qr / qr_scale); each segment's KV tail and normalised tail are
exchanged. Then, segment by segment in logical order, the owner runs both ratio-4 compressors over its
predecessor's normalised tail followed by its own rows -- the main one (``v4_prefill_compressor``) and the index
keys' (``v4_prefill_index_keys``) -- into state pools of its own that start empty (segment 0: the rank's input
states, which hold the prefix's rows); the tail's positions only fill the states, the segment's own closing
positions publish a compressed row and an index key. Every published row and key (with its scale) goes to every
rank, at its slot through that rank's ``cmp_block_table`` / ``idx_block_table``; after the chunk every rank's two
state pools get the final segment's rows of the chunk's last 2 x 4 positions (the overlapping window the next step
closes reads them; through its own tables) and keep every other byte. Each tile then scores its rows
(``v4_prefill_indexer`` over its rank's complete index cache, each row's query rotated at its own position), and
attends as CP SWA plus the indexer's picks over its rank's compressed cache (``v4_attention``, CSA), then
``hc_post``; every ring gets the decode window. Composed from the backend's operators.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from kernels.errors import ContractInputError
from kernels.operators import operator
from kernels.record import BadCall, CaseSpec, Record, generator, replaced
from kernels.v4.cp_hca import PLAN_NAMES, _home, compressor_call, cp_hca_plan, paged_states, windows_mapped
from kernels.v4.cp_swa import (
    PARTS,
    TILES,
    _bound,
    active_tiles,
    attend_tiles,
    check_prefill_cp_swa,
    cp_only,
    exchange_tails,
    project_tiles,
    publish_window,
)

SPEC = "§7.1"
RATIO = 4  # CSA's compress ratio
STATE_ROWS = 2 * RATIO  # the state rows the next step's overlapping windows read
MAIN_WEIGHTS = ("cmp_wkv", "cmp_wgate", "cmp_ape", "cmp_norm_w")
INNER_WEIGHTS = ("inner_wkv", "inner_wgate", "inner_ape", "inner_norm_w")
POOLS = ("state_pool", "state_block_table", "cmp_kv", "cmp_block_table", "inner_state_pool",
         "inner_state_block_table", "idx_kv_cache", "idx_kv_scale", "idx_block_table")
INDEXER_NAMES = ("idx_wq_b", "idx_wq_b_scale", "weights_proj", "hadamard")
COMPRESSOR_NAMES = (*MAIN_WEIGHTS, *INNER_WEIGHTS, *POOLS, *INDEXER_NAMES)


def check_prefill_cp_csa(x_hc: torch.Tensor, kv_cache: torch.Tensor, compressor: Mapping[str, torch.Tensor],
                         plan: Mapping[str, torch.Tensor], config) -> int:
    """The caller's side: CP SWA's, the compressors' and the index cache's per-rank pools and tables, the plan's
    tails and final segment -> cp. Every rank's tables map every page the chunk's windows, compressed slots and
    index keys touch (each rank holds the states and caches after the chunk)."""
    cp, _ = check_prefill_cp_swa(x_hc, kv_cache, plan, config)
    missing = [n for n in COMPRESSOR_NAMES if n not in compressor]
    if missing:
        raise ContractInputError("compressor", None, f"{COMPRESSOR_NAMES}", f"missing {missing}", SPEC)
    missing = [n for n in ("segment_tail_positions", "final_segment") if n not in plan]
    if missing:
        raise ContractInputError("plan", None, f"cp_hca_plan's tables {PLAN_NAMES}", f"missing {missing}", SPEC)
    hd, idx_d, page, bs = config.head_dim, config.index_head_dim, config.c4a_state_block_size, config.block_size
    c = compressor
    for name, width in (("state_pool", 4 * hd), ("inner_state_pool", 4 * idx_d)):
        t = c[name]
        if t.ndim != 4 or t.shape[0] != cp or t.shape[2] != page or t.shape[3] != width or t.dtype != torch.float32:
            raise ContractInputError(name, None, f"[{cp}, pages, {page}, {width}] FP32 (each rank's ratio-4 "
                                     "compressor state)", f"{t.dtype}{list(t.shape)}", SPEC)
    cmp = c["cmp_kv"]
    if cmp.ndim != 5 or cmp.shape[0] != cp or tuple(cmp.shape[3:]) != (1, hd) or cmp.dtype != torch.bfloat16:
        raise ContractInputError("cmp_kv", None, f"[{cp}, blocks, page, 1, {hd}] BF16 (each rank's compressed cache)",
                                 f"{cmp.dtype}{list(cmp.shape)}", SPEC)
    idx, scale = c["idx_kv_cache"], c["idx_kv_scale"]
    if idx.ndim != 5 or idx.shape[0] != cp or tuple(idx.shape[2:]) != (bs, 1, idx_d) or idx.dtype != torch.int8:
        raise ContractInputError("idx_kv_cache", None, f"[{cp}, blocks, {bs}, 1, {idx_d}] INT8 (each rank's index "
                                 "cache)", f"{idx.dtype}{list(idx.shape)}", SPEC)
    if tuple(scale.shape) != (*idx.shape[:2], bs, 1, 1) or not scale.is_floating_point():
        raise ContractInputError("idx_kv_scale", None, f"[{cp}, {idx.shape[1]}, {bs}, 1, 1] floats (a scale per "
                                 "index key)", f"{scale.dtype}{list(scale.shape)}", SPEC)
    for name in ("state_block_table", "inner_state_block_table", "cmp_block_table", "idx_block_table"):
        t = c[name]
        if t.ndim != 2 or t.shape[0] != cp or t.is_floating_point() or t.shape[1] == 0:
            raise ContractInputError(name, None, f"[{cp}, pages] integers (one page table per rank)",
                                     f"{t.dtype}{list(t.shape)}", SPEC)
    tails = plan["segment_tail_positions"]
    if tuple(tails.shape) != (2 * cp, config.sliding_window) or tails.is_floating_point():
        raise ContractInputError("plan.segment_tail_positions", None, f"[{2 * cp}, {config.sliding_window}] integers",
                                 f"{tails.dtype}{list(tails.shape)}", SPEC)
    final = int(plan["final_segment"][0])
    if not 0 <= final < 2 * cp:
        raise ContractInputError("plan.final_segment", (0,), f"a segment in [0, {2 * cp})", final, SPEC)
    first = int(plan["segment_starts"][0])
    end = max(int(p) for p in plan["query_position_ids"][plan["query_token_to_request"] >= 0].tolist()) + 1
    windows = range(max(0, first - first % RATIO - RATIO), end)  # the first close's overlapping window starts here
    closed = range(first // RATIO, end // RATIO)  # every slot the chunk closes (at 4k + 3 >= first)
    for rank in range(cp):
        for name in ("state_block_table", "inner_state_block_table"):
            windows_mapped(name, c[name][rank], rank, windows, page)
        windows_mapped("cmp_block_table", c["cmp_block_table"][rank], rank, closed, cmp.shape[2])
        windows_mapped("idx_block_table", c["idx_block_table"][rank], rank, range(0, end // RATIO), bs)
    return cp


def compress_segments(local_norm, logical_norm, plan, compressor, freqs_cos, freqs_sin, *, config, ops):
    """Step 3 (module docstring) -> ({slot: compressed BF16 row}, {slot: (INT8 key, scale)}, the final segment's
    [(position, main state row, inner state row)])."""
    from kernels.v4.compressor import V4CompressorWeights
    from kernels.v4.prefill_compressor import v4_prefill_compressor, v4_prefill_index_keys

    c = compressor
    cp, hd, idx_d = local_norm.shape[0], config.head_dim, config.index_head_dim
    page, bs, rope = config.c4a_state_block_size, config.block_size, config.qk_rope_head_dim
    main_w = V4CompressorWeights(*(c[n] for n in MAIN_WEIGHTS))
    inner_w = V4CompressorWeights(*(c[n] for n in INNER_WEIGHTS))
    compress = _bound(ops, "v4_prefill_compressor", v4_prefill_compressor)
    keys_of = _bound(ops, "v4_prefill_index_keys", v4_prefill_index_keys)
    active, qpos = plan["overlay_active_lengths"][..., 1], plan["query_position_ids"]
    owners = {int(plan["owner_segments"][r, p]): (r, p) for r in range(cp) for p in range(PARTS)}
    final = int(plan["final_segment"][0])
    published, keys, snapshot = {}, {}, []
    for s in range(2 * cp):
        rank, part = owners[s]
        counts = [int(active[rank, part, t]) for t in range(TILES)]
        own = sum(counts)
        if not own:
            continue
        rows = [local_norm[rank, part, t, :counts[t]] for t in range(TILES)]
        pos = [qpos[rank, part, t, :counts[t]].to(torch.int64) for t in range(TILES)]
        if s > 0:
            tail = plan["segment_tail_positions"][s - 1]
            k = int((tail >= 0).sum())
            rows.insert(0, logical_norm[s - 1, :k])
            pos.insert(0, tail[:k].to(torch.int64))
        x, pos = torch.cat(rows), torch.cat(pos)
        n = x.shape[0]
        main_t, inner_t = c["state_block_table"][rank], c["inner_state_block_table"][rank]
        main_s, inner_s = ((c["state_pool"][rank], c["inner_state_pool"][rank]) if s == 0 else
                           (torch.zeros_like(c["state_pool"][rank]), torch.zeros_like(c["inner_state_pool"][rank])))
        closing = [(t, (int(p) + 1) // RATIO - 1) for t, p in enumerate(pos.tolist())
                   if t >= n - own and (int(p) + 1) % RATIO == 0]
        slots = torch.full((n,), -1, dtype=torch.int64)
        for j, (t, _) in enumerate(closing):
            slots[t] = j
        main = compress(x, pos, n, main_t, main_s, main_w, slots,
                        torch.tensor([_home(main_t, p, page) for p in pos.tolist()]),
                        torch.zeros(len(closing) or 1, 1, 1, hd, dtype=torch.bfloat16), freqs_cos, freqs_sin,
                        ratio=RATIO, rope_head_dim=rope)
        blocks = -(-max(len(closing), 1) // bs)
        inner = keys_of(x, pos, n, inner_t, inner_s, inner_w, slots,
                        torch.tensor([_home(inner_t, p, page) for p in pos.tolist()]),
                        torch.zeros(blocks, bs, 1, idx_d, dtype=torch.int8), torch.zeros(blocks, bs, 1, 1), freqs_cos,
                        freqs_sin, c["hadamard"], rope_head_dim=rope)
        for j, (_, slot) in enumerate(closing):
            published[slot] = main["cmp_pool"].reshape(-1, hd)[j]
            keys[slot] = (inner["idx_kv_cache"].reshape(-1, idx_d)[j], inner["idx_kv_scale"].reshape(-1)[j])
        if s == final:
            end = int(pos[-1]) + 1
            flat_m = main["state_pool"].reshape(-1, main["state_pool"].shape[-1])
            flat_i = inner["state_pool"].reshape(-1, inner["state_pool"].shape[-1])
            snapshot = [(p, flat_m[_home(main_t, p, page)], flat_i[_home(inner_t, p, page)])
                        for p in range(max(0, end - STATE_ROWS), end)]
    return published, keys, snapshot


@operator(returns="{x_out [cp,2,2,R,hc,D] FP32, kv_cache, cmp_kv, state_pool, inner_state_pool, idx_kv_cache, "
                  "idx_kv_scale (each [cp, ...])}: the CP SWA prefill with CSA's compressors and indexer: each segment "
                  "compressed by its owner over its predecessor's exchanged tail, every compressed row, index key "
                  "and the final states given to every rank, each tile attending its window and its indexer's picks "
                  "-- composed from this backend's operators", spec=SPEC)
def prefill_cp_csa(x_hc: torch.Tensor, hc_fn: torch.Tensor, hc_scale: torch.Tensor, hc_base: torch.Tensor,
                   attn_norm_w: torch.Tensor, wq_a: torch.Tensor, wq_b: torch.Tensor, wq_b_scale: torch.Tensor,
                   wkv: torch.Tensor, gamma_cq: torch.Tensor, gamma_ckv: torch.Tensor, freqs_cos: torch.Tensor,
                   freqs_sin: torch.Tensor, kv_cache: torch.Tensor, attn_sink: torch.Tensor, wo_a: torch.Tensor,
                   wo_b: torch.Tensor, wo_b_scale: torch.Tensor, compressor: Mapping[str, torch.Tensor],
                   plan: Mapping[str, torch.Tensor], *, config, ops=None, query_staging: str = "bf16"
                   ) -> dict[str, torch.Tensor]:
    """The CP CSA prefill sublayer (module docstring); ``compressor`` {the main and inner ratio-4 compressors'
    weights (``MAIN_WEIGHTS``, ``INNER_WEIGHTS``), each rank's pools and tables (``POOLS``: states [cp, pages, 4,
    4 x width] FP32, cmp_kv [cp, blocks, page, 1, hd] BF16, idx_kv_cache [cp, blocks, bs, 1, index_head_dim] INT8
    with its scales), the indexer's query weights (``INDEXER_NAMES``)}; ``plan`` is ``cp_hca_plan``'s tables;
    ``query_staging``: the indexer's named rules (``kernels.v4.indexer.index_query``). No input is modified."""
    from kernels.v4.indexer import QUERY_STAGING
    from kernels.v4.prefill_indexer import v4_prefill_indexer

    if query_staging not in QUERY_STAGING:
        raise ContractInputError("query_staging", None, f"one of {QUERY_STAGING}", repr(query_staging), SPEC)
    ops = ops or {}
    cp = check_prefill_cp_csa(x_hc, kv_cache, compressor, plan, config)
    c = compressor
    hd, idx_d, page, bs = config.head_dim, config.index_head_dim, config.c4a_state_block_size, config.block_size
    weights = (hc_fn, hc_scale, hc_base, attn_norm_w, wq_a, wq_b, wq_b_scale, wkv, gamma_cq, gamma_ckv)
    tiles = active_tiles(plan)
    local_kv, local_norm, projected = project_tiles(x_hc, weights, freqs_cos, freqs_sin, plan, tiles, config=config,
                                                    ops=ops)
    logical_kv, logical_norm = exchange_tails(local_kv, plan), exchange_tails(local_norm, plan)
    published, keys, snapshot = compress_segments(local_norm, logical_norm, plan, c, freqs_cos, freqs_sin,
                                                  config=config, ops=ops)
    out = {name: c[name].clone() for name in ("cmp_kv", "state_pool", "inner_state_pool", "idx_kv_cache",
                                              "idx_kv_scale")}
    cpage = out["cmp_kv"].shape[2]
    for rank in range(cp):
        cmp, idx = out["cmp_kv"][rank].reshape(-1, hd), out["idx_kv_cache"][rank].reshape(-1, idx_d)
        scale = out["idx_kv_scale"][rank].reshape(-1)
        for slot, row in published.items():
            cmp[_home(c["cmp_block_table"][rank], slot, cpage)] = row
        for slot, (key, s) in keys.items():
            r = _home(c["idx_block_table"][rank], slot, bs)
            idx[r], scale[r] = key, s
        main = out["state_pool"][rank].reshape(-1, out["state_pool"].shape[-1])
        inner = out["inner_state_pool"][rank].reshape(-1, out["inner_state_pool"].shape[-1])
        for p, m, i in snapshot:
            main[_home(c["state_block_table"][rank], p, page)] = m
            inner[_home(c["inner_state_block_table"][rank], p, page)] = i

    index = _bound(ops, "v4_prefill_indexer", v4_prefill_indexer)
    active, rope = plan["overlay_active_lengths"][..., 1], config.qk_rope_head_dim
    picks = {}
    for rank, part, tile in tiles:
        mixes, proj, pos = projected[rank, part, tile]
        n = int(active[rank, part, tile])
        picks[rank, part, tile] = index(
            local_norm[rank, part, tile], proj["qr"], proj["qr_scale"], c["idx_wq_b"], c["idx_wq_b_scale"],
            c["weights_proj"], freqs_cos[pos][:, :rope // 2].float(), freqs_sin[pos][:, :rope // 2].float(),
            c["hadamard"], out["idx_kv_cache"][rank], out["idx_kv_scale"][rank], c["idx_block_table"][rank],
            plan["query_position_ids"][rank, part, tile], n, config=config,
            **({"query_staging": query_staging} if query_staging != "bf16" else {}))["topk_idxs"]

    def compressed(rank, part, tile):
        return out["cmp_kv"][rank], c["cmp_block_table"][rank][None], picks[rank, part, tile]

    x_out = attend_tiles("CSA", x_hc, kv_cache, local_kv, logical_kv, projected, plan, tiles,
                         (attn_sink, freqs_cos, freqs_sin, wo_a, wo_b, wo_b_scale), config=config, ops=ops,
                         compressed=compressed)
    return {"x_out": x_out, "kv_cache": publish_window(kv_cache, logical_kv, plan), **out}


prefill_cp_csa.composes_operators = True


# --- the record ----------------------------------------------------------------------------------------------

def chunk_inputs(config, seed: int, *, cp: int, span: int, num_tokens: int, prefix: int, pages: int = 2,
                 noisy_padding: bool = False) -> dict[str, torch.Tensor]:
    """One CP CSA chunk: CP SWA's inputs (``kernels.v4.cp_swa.chunk_inputs``, the same draws) with ``cp_hca_plan``'s
    tables; the two ratio-4 compressors' weights (BF16 values held in FP32); each rank's two state pools (random
    rows: an earlier chunk's, the same logical rows on every rank) through shuffled tables of pages of 4 positions;
    each rank's compressed cache and index cache (pages of the block size: upstream's CP golden pages both alike),
    the prefix's closed windows the same on every rank, other rows random, through shuffled tables of their own per
    rank; the indexer's query weights. The streams and the index heads' weights are positive, so every head weight
    is and no index score is negative: scores tie only at 0, where every head's product is cut (the top-k's order
    among ties is the ABI's; see contracts/test_cp_csa.py)."""
    from kernels.v4.cp_swa import chunk_inputs as swa_inputs

    i = swa_inputs(config, seed, cp=cp, span=span, num_tokens=num_tokens, prefix=prefix, pages=pages,
                   noisy_padding=noisy_padding)
    for name in ("x_hc", "x_all"):  # positive streams: with positive head weights no index score is negative
        i[name] = i[name].abs()
    g = generator(seed + 11)
    hd, dm, page, bs, idx_d = (config.head_dim, config.hidden_size, config.c4a_state_block_size, config.block_size,
                               config.index_head_dim)
    heads, lora = config.index_n_heads, config.q_lora_rank
    plan = cp_hca_plan(num_tokens, cp, span, i["block_table"], prefix=prefix, config=config)
    end = prefix + num_tokens
    blocks = -(-end // page)
    bf16 = lambda t: t.to(torch.bfloat16).float()  # noqa: E731

    def weights(prefix_name, width):
        return {f"{prefix_name}_wkv": bf16(torch.randn(dm, 2 * width, generator=g) / dm**0.5),
                f"{prefix_name}_wgate": bf16(torch.randn(dm, 2 * width, generator=g) / dm**0.5),
                f"{prefix_name}_ape": bf16(torch.randn(RATIO, 2 * width, generator=g) * 0.5),
                f"{prefix_name}_norm_w": bf16(torch.rand(width, generator=g) + 0.5)}

    state, state_table = paged_states(g, cp, blocks, page, 4 * hd)
    inner, inner_table = paged_states(g, cp, blocks, page, 4 * idx_d)
    slots = end // RATIO + 1
    cpage = bs
    cblocks = -(-slots // cpage)
    cphys = cblocks + 2
    cmp_table = torch.stack([torch.randperm(cphys, generator=g)[:cblocks] for _ in range(cp)]).to(torch.int32)
    iblocks = -(-slots // bs)
    iphys = iblocks + 1
    idx_table = torch.stack([torch.randperm(iphys, generator=g)[:iblocks] for _ in range(cp)]).to(torch.int32)
    cmp = (torch.rand(cp, cphys, cpage, 1, hd, generator=g) - 0.5).to(torch.bfloat16)
    idx = torch.randint(-127, 128, (cp, iphys, bs, 1, idx_d), generator=g, dtype=torch.int8)
    scale = (torch.rand(cp, iphys, bs, 1, 1, generator=g) + 0.5) * 0.01
    done = prefix // RATIO  # windows closed before the chunk (at 4k + 3 < prefix)
    lc, li = (torch.rand(max(done, 1), hd, generator=g) - 0.5).to(torch.bfloat16), \
        torch.randint(-127, 128, (max(done, 1), idx_d), generator=g, dtype=torch.int8)
    ls = (torch.rand(max(done, 1), generator=g) + 0.5) * 0.01
    for r in range(cp):
        for k in range(done):
            cmp[r].reshape(-1, hd)[_home(cmp_table[r], k, cpage)] = lc[k]
            idx[r].reshape(-1, idx_d)[_home(idx_table[r], k, bs)] = li[k]
            scale[r].reshape(-1)[_home(idx_table[r], k, bs)] = ls[k]
    return {**i, **plan, **weights("cmp", hd), **weights("inner", idx_d), "state_pool": state,
            "state_block_table": state_table, "inner_state_pool": inner, "inner_state_block_table": inner_table,
            "cmp_kv": cmp, "cmp_block_table": cmp_table, "idx_kv_cache": idx, "idx_kv_scale": scale,
            "idx_block_table": idx_table,
            "idx_wq_b": torch.randint(-127, 128, (lora, heads * idx_d), generator=g, dtype=torch.int8),
            "idx_wq_b_scale": torch.rand(heads * idx_d, generator=g) / 127 / lora**0.5 + 1e-4,
            "weights_proj": (torch.rand(dm, heads, generator=g) * 0.25).to(torch.bfloat16),
            "hadamard": ((torch.rand(idx_d, idx_d, generator=g) - 0.5) * idx_d**-0.5).to(torch.bfloat16)}


def _tree(seed: int, wiring: str, config) -> dict[str, torch.Tensor]:
    """CP SWA's tree (CP 2, span R, R + 6 tokens after a prefix of 5; the same inputs, kept once) with CSA: windows
    close every 4 positions, segment 1's first windows (closing at 135, 139) reach back into segment 0's rows (rank
    0's), exchanged; each row's indexer picks over the complete index cache."""
    r = config.sliding_window
    i = chunk_inputs(config, seed, cp=2, span=r, num_tokens=r + 6, prefix=5)
    del i["x_all"], i["block_table"]
    return i


_call = compressor_call(COMPRESSOR_NAMES)


RECORD = Record(
    operator="prefill_cp_csa",
    call=_call,
    outputs={"x_out": "v4_cp_x_out", "kv_cache": "v4_cp_kv_cache", "cmp_kv": "v4_cmp_pool",
             "state_pool": "v4_state_pool", "inner_state_pool": "v4_state_pool", "idx_kv_cache": "exact",
             "idx_kv_scale": "exact"},
    cases=(CaseSpec("prefill_cp_csa", "V4-Flash CP CSA prefill, CP 2: CP SWA's tiles with the ratio-4 main and "
                    "index-key compressors run per segment by its owner over the predecessor's exchanged tail, every "
                    "compressed row, index key and the final states given to every rank, each tile attending its "
                    "indexer's picks", _tree, geometries=("flash-tiny",)),),
    bad_calls=(
        BadCall("one index cache for all ranks", "prefill_cp_csa",
                replaced(idx_kv_cache=lambda i: i["idx_kv_cache"][:1]), "idx_kv_cache"),
        BadCall("an inner state of the main state's width", "prefill_cp_csa",
                replaced(inner_state_pool=lambda i: i["state_pool"]), "inner_state_pool"),
        BadCall("an unmapped compressed page", "prefill_cp_csa",
                replaced(cmp_block_table=lambda i: torch.full_like(i["cmp_block_table"], -1)), "cmp_block_table"),
    ),
    bindings=cp_only(golden="prefill_cp_csa.py::golden_prefill_cp_csa", entry="prefill_cp_csa.py::prefill_cp_csa_test"),
)

