"""V4-Flash's context-parallel HCA prefill (spec §7.1, §8; upstream models/deepseek_v4_flash_mtp/prefill_cp_hca.py):
the CP SWA prefill (``kernels.v4.cp_swa``) with HCA's ratio-128 compressor inside. A compressed window is 128
positions; a segment is one or two tiles of R = the sliding window, so a window straddles segments, and ranks,
whenever the chunk's segment starts are not multiples of 128 (any prefix that is not, any span that is not R or 2R).

**The plan** (``cp_hca_plan``): ``cp_swa_plan``'s tables and

* ``cmp_indices`` [cp, 2, 2, R, index_topk]: a query at q attends the first ``min(index_topk, (q + 1) // 128)``
  compressed positions (0, 1, ..), -1 after and on empty rows -- a window that closes at q is attended by q itself;
* ``segment_tail_positions`` [2cp, R]: each segment's last ``min(R, len)`` positions, first first, -1 after;
* ``snapshot_positions`` [cp, 2, R] / ``snapshot_valid`` [cp, 2]: the last ``min(R, end)`` positions up to each
  segment's end (what its owner's compressor state holds after it), -1 after;
* ``final_segment`` [1]: the last segment holding a token.

**The sublayer** (``prefill_cp_hca``). Steps 1-2 as CP SWA: every rank projects its tiles and keeps each tile's
normalised rows; each segment's tail is exchanged twice, its KV rows (the SWA overlays) and its normalised rows.
Then, segment by segment in logical order, the segment's owner compresses (``v4_prefill_compressor``, ratio 128)
the predecessor's normalised tail followed by its own rows, into a state pool of its own that starts empty (segment
0: the rank's input state, which holds the prefix's rows): the tail's positions only fill the state (they publish
nothing), the segment's own closing positions publish. Every window ends in one segment and starts at most 127
positions earlier, inside that segment or its predecessor's tail (R >= 128), so each compressed row is the unsplit
chunk's. Every published row goes to every rank's compressed cache, at its slot through that rank's
``cmp_block_table``; after the chunk every rank's state pool gets the final segment's snapshot rows (through its own
``state_block_table``) and keeps every other byte. Each tile then attends as CP SWA, plus its ``cmp_indices`` over
its rank's compressed cache (``v4_attention``, HCA), then ``hc_post``; every ring gets the decode window.
Composed from the backend's operators.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from kernels.errors import ContractInputError
from kernels.operators import operator
from kernels.record import BadCall, CaseSpec, Record, generator, replaced
from kernels.v4.cp_swa import (
    PARTS,
    TAIL_NAMES,
    TILES,
    WEIGHT_NAMES,
    _bound,
    active_tiles,
    attend_tiles,
    check_prefill_cp_swa,
    cp_only,
    cp_swa_plan,
    exchange_tails,
    plan_call,
    plan_case,
    project_tiles,
    publish_window,
)
from kernels.v4.cp_swa import PLAN_NAMES as SWA_PLAN_NAMES

SPEC = "§7.1"
RATIO = 128  # HCA's compress ratio
HCA_PLAN_NAMES = ("cmp_indices", "segment_tail_positions", "snapshot_positions", "snapshot_valid", "final_segment")
PLAN_NAMES = (*SWA_PLAN_NAMES, *HCA_PLAN_NAMES)
COMPRESSOR_NAMES = ("cmp_wkv", "cmp_wgate", "cmp_ape", "cmp_norm_w", "state_pool", "state_block_table", "cmp_kv",
                    "cmp_block_table")


@operator(returns="{cp_swa_plan's tables, cmp_indices, segment_tail_positions, snapshot_positions, snapshot_valid, "
                  "final_segment} INT32: the CP HCA prefill's per-rank tiles, overlays, windows and compressed picks",
          spec=SPEC)
def cp_hca_plan(num_tokens: int, cp: int, span: int, block_table: torch.Tensor, *, prefix: int = 0,
                config) -> dict[str, torch.Tensor]:
    """The metadata of one CP HCA prefill chunk (module docstring)."""
    plan = cp_swa_plan(num_tokens, cp, span, block_table, prefix=prefix, config=config)
    r_rows, topk = config.sliding_window, config.index_topk
    starts = plan["segment_starts"].tolist()
    lens = [min(max(num_tokens - s * span, 0), span) for s in range(2 * cp)]
    qpos, real = plan["query_position_ids"].long(), plan["query_token_to_request"] >= 0
    visible = torch.clamp((qpos + 1) // RATIO, max=topk)
    cols = torch.arange(topk)
    picks = torch.where(real[..., None] & (cols < visible[..., None]), cols, -1).to(torch.int32)
    tails = torch.full((2 * cp, r_rows), -1, dtype=torch.int32)
    for s in range(2 * cp):
        k = min(r_rows, lens[s])
        tails[s, :k] = torch.arange(starts[s] + lens[s] - k, starts[s] + lens[s])
    snap = torch.full((cp, PARTS, r_rows), -1, dtype=torch.int32)
    snap_valid = torch.zeros(cp, PARTS, dtype=torch.int32)
    for rank in range(cp):
        for part in range(PARTS):
            s = int(plan["owner_segments"][rank, part])
            end = starts[s] + lens[s]
            k = min(r_rows, end)
            snap[rank, part, :k] = torch.arange(end - k, end)
            snap_valid[rank, part] = k
    final = max(s for s in range(2 * cp) if lens[s])
    return {**plan, "cmp_indices": picks, "segment_tail_positions": tails, "snapshot_positions": snap,
            "snapshot_valid": snap_valid, "final_segment": torch.tensor([final], dtype=torch.int32)}


def _int_table(name: str, t: torch.Tensor, cp: int) -> None:
    if t.ndim != 2 or t.shape[0] != cp or t.is_floating_point() or t.shape[1] == 0:
        raise ContractInputError(name, None, f"[{cp}, pages] integers (one page table per rank)",
                                 f"{t.dtype}{list(t.shape)}", SPEC)


def check_prefill_cp_hca(x_hc: torch.Tensor, kv_cache: torch.Tensor, compressor: Mapping[str, torch.Tensor],
                         plan: Mapping[str, torch.Tensor], config) -> int:
    """The caller's side: CP SWA's, the compressor's per-rank pools and tables, the plan's HCA tables -> cp."""
    cp, _ = check_prefill_cp_swa(x_hc, kv_cache, plan, config)
    missing = [n for n in COMPRESSOR_NAMES if n not in compressor]
    if missing:
        raise ContractInputError("compressor", None, f"{COMPRESSOR_NAMES}", f"missing {missing}", SPEC)
    missing = [n for n in HCA_PLAN_NAMES if n not in plan]
    if missing:
        raise ContractInputError("plan", None, f"cp_hca_plan's tables {PLAN_NAMES}", f"missing {missing}", SPEC)
    hd, page, r_rows = config.head_dim, config.c128_state_block_size, config.sliding_window
    state, cmp = compressor["state_pool"], compressor["cmp_kv"]
    if state.ndim != 4 or state.shape[0] != cp or state.shape[2] != page or state.shape[3] != 2 * hd \
            or state.dtype != torch.float32:
        raise ContractInputError("state_pool", None, f"[{cp}, pages, {page}, {2 * hd}] FP32 (each rank's ratio-128 "
                                 "compressor state)", f"{state.dtype}{list(state.shape)}", SPEC)
    if cmp.ndim != 5 or cmp.shape[0] != cp or tuple(cmp.shape[3:]) != (1, hd) or cmp.dtype != torch.bfloat16:
        raise ContractInputError("cmp_kv", None, f"[{cp}, blocks, page, 1, {hd}] BF16 (each rank's compressed cache)",
                                 f"{cmp.dtype}{list(cmp.shape)}", SPEC)
    for name in ("state_block_table", "cmp_block_table"):
        _int_table(name, compressor[name], cp)
    shapes = {"cmp_indices": (cp, PARTS, TILES, r_rows, config.index_topk), "segment_tail_positions": (2 * cp, r_rows),
              "snapshot_positions": (cp, PARTS, r_rows), "snapshot_valid": (cp, PARTS), "final_segment": (1,)}
    for name, shape in shapes.items():
        t = plan[name]
        if tuple(t.shape) != shape or t.is_floating_point():
            raise ContractInputError(f"plan.{name}", None, f"{list(shape)} integers (cp {cp}, R {r_rows})",
                                     f"{t.dtype}{list(t.shape)}", SPEC)
    final = int(plan["final_segment"][0])
    if not 0 <= final < 2 * cp:
        raise ContractInputError("plan.final_segment", (0,), f"a segment in [0, {2 * cp})", final, SPEC)
    first = int(plan["segment_starts"][0])
    end = max(int(p) for p in plan["query_position_ids"][plan["query_token_to_request"] >= 0].tolist()) + 1
    windows = range(first - first % RATIO, end)  # every state row the chunk's windows read or write
    closed = range(first // RATIO, end // RATIO)  # every compressed slot the chunk closes (at 128k + 127 >= first)
    for rank in range(cp):
        windows_mapped("state_block_table", compressor["state_block_table"][rank], rank, windows, page)
        windows_mapped("cmp_block_table", compressor["cmp_block_table"][rank], rank, closed, cmp.shape[2])
    return cp


def windows_mapped(name: str, table: torch.Tensor, rank: int, rows: range, rpage: int) -> None:
    """Every page of ``rows`` (pages of ``rpage`` rows) mapped in one rank's table, else refused naming (rank,
    page)."""
    for block in range(rows.start // rpage, -(-rows.stop // rpage)) if len(rows) else ():
        if block >= table.numel() or int(table[block]) < 0:
            raise ContractInputError(name, (rank, block), f"a mapped page for rows {block * rpage} .. "
                                     f"{block * rpage + rpage - 1} (what the chunk reads or writes)",
                                     "past the table" if block >= table.numel() else int(table[block]), SPEC)


def _home(table: torch.Tensor, p: int, page: int) -> int:
    """Row of logical index ``p`` through a page table of pages of ``page`` rows (check_prefill_cp_hca has checked
    every page the chunk touches is mapped)."""
    return int(table[p // page]) * page + p % page


def compress_segments(local_norm, logical_norm, plan, compressor, freqs_cos, freqs_sin, *, config, ops):
    """Step 3 (module docstring): every segment's owner compresses its predecessor's tail and its own rows ->
    (the published rows {slot: BF16 row}, the final segment's snapshot [(position, FP32 state row)])."""
    from kernels.v4.compressor import V4CompressorWeights
    from kernels.v4.prefill_compressor import v4_prefill_compressor

    cp, hd, page = local_norm.shape[0], config.head_dim, config.c128_state_block_size
    weights = V4CompressorWeights(*(compressor[n] for n in ("cmp_wkv", "cmp_wgate", "cmp_ape", "cmp_norm_w")))
    compress = _bound(ops, "v4_prefill_compressor", v4_prefill_compressor)
    active = plan["overlay_active_lengths"][..., 1]
    qpos = plan["query_position_ids"]
    owners = {int(plan["owner_segments"][r, p]): (r, p) for r in range(cp) for p in range(PARTS)}
    final = int(plan["final_segment"][0])
    published, snapshot = {}, []
    for s in range(2 * cp):
        rank, part = owners[s]
        counts = [int(active[rank, part, t]) for t in range(TILES)]
        if not sum(counts):
            continue
        rows = [local_norm[rank, part, t, :counts[t]] for t in range(TILES)]
        pos = [qpos[rank, part, t, :counts[t]].to(torch.int64) for t in range(TILES)]
        own = sum(counts)
        if s > 0:
            tail = plan["segment_tail_positions"][s - 1]
            k = int((tail >= 0).sum())
            rows.insert(0, logical_norm[s - 1, :k])
            pos.insert(0, tail[:k].to(torch.int64))
        x, pos = torch.cat(rows), torch.cat(pos)
        table = compressor["state_block_table"][rank]
        scratch = compressor["state_pool"][rank] if s == 0 else torch.zeros_like(compressor["state_pool"][rank])
        state_slots = torch.tensor([_home(table, int(p), page) for p in pos.tolist()],
                                   dtype=torch.int64)
        n = x.shape[0]
        closing = [(t, (int(p) + 1) // RATIO - 1) for t, p in enumerate(pos.tolist())
                   if t >= n - own and (int(p) + 1) % RATIO == 0]
        pool = torch.zeros(len(closing) or 1, 1, 1, hd, dtype=torch.bfloat16)
        cmp_slots = torch.full((n,), -1, dtype=torch.int64)
        for j, (t, _) in enumerate(closing):
            cmp_slots[t] = j
        out = compress(x, pos, n, table, scratch, weights, cmp_slots, state_slots, pool, freqs_cos, freqs_sin,
                       ratio=RATIO, rope_head_dim=config.qk_rope_head_dim)
        for j, (_, slot) in enumerate(closing):
            published[slot] = out["cmp_pool"].reshape(-1, hd)[j]
        if s == final:
            flat = out["state_pool"].reshape(-1, out["state_pool"].shape[-1])
            r0, p0 = owners[s]
            for j in range(int(plan["snapshot_valid"][r0, p0])):
                p = int(plan["snapshot_positions"][r0, p0, j])
                snapshot.append((p, flat[_home(table, p, page)]))
    return published, snapshot


@operator(returns="{x_out [cp,2,2,R,hc,D] FP32, kv_cache, cmp_kv [cp,...] BF16, state_pool [cp,...] FP32}: the CP "
                  "SWA prefill with HCA's compressor: each segment compressed by its owner over its predecessor's "
                  "exchanged tail, every compressed row and the final state given to every rank, each tile attending "
                  "its window and its compressed positions -- composed from this backend's operators", spec=SPEC)
def prefill_cp_hca(x_hc: torch.Tensor, hc_fn: torch.Tensor, hc_scale: torch.Tensor, hc_base: torch.Tensor,
                   attn_norm_w: torch.Tensor, wq_a: torch.Tensor, wq_b: torch.Tensor, wq_b_scale: torch.Tensor,
                   wkv: torch.Tensor, gamma_cq: torch.Tensor, gamma_ckv: torch.Tensor, freqs_cos: torch.Tensor,
                   freqs_sin: torch.Tensor, kv_cache: torch.Tensor, attn_sink: torch.Tensor, wo_a: torch.Tensor,
                   wo_b: torch.Tensor, wo_b_scale: torch.Tensor, compressor: Mapping[str, torch.Tensor],
                   plan: Mapping[str, torch.Tensor], *, config, ops=None) -> dict[str, torch.Tensor]:
    """The CP HCA prefill sublayer (module docstring); ``compressor`` {cmp_wkv, cmp_wgate, cmp_ape, cmp_norm_w (the
    ratio-128 compressor's weights), state_pool [cp, pages, 8, 2hd] FP32, state_block_table [cp, blocks], cmp_kv
    [cp, blocks, page, 1, hd] BF16, cmp_block_table [cp, pages]}; ``plan`` is ``cp_hca_plan``'s tables. No input is
    modified."""
    ops = ops or {}
    cp = check_prefill_cp_hca(x_hc, kv_cache, compressor, plan, config)
    hd, page = config.head_dim, config.c128_state_block_size
    weights = (hc_fn, hc_scale, hc_base, attn_norm_w, wq_a, wq_b, wq_b_scale, wkv, gamma_cq, gamma_ckv)
    tiles = active_tiles(plan)
    local_kv, local_norm, projected = project_tiles(x_hc, weights, freqs_cos, freqs_sin, plan, tiles, config=config,
                                                    ops=ops)
    logical_kv, logical_norm = exchange_tails(local_kv, plan), exchange_tails(local_norm, plan)
    published, snapshot = compress_segments(local_norm, logical_norm, plan, compressor, freqs_cos, freqs_sin,
                                            config=config, ops=ops)
    cmp_kv, state = compressor["cmp_kv"].clone(), compressor["state_pool"].clone()
    cpage = cmp_kv.shape[2]
    for rank in range(cp):
        flat_cmp, flat_state = cmp_kv[rank].reshape(-1, hd), state[rank].reshape(-1, state.shape[-1])
        for slot, row in published.items():
            flat_cmp[_home(compressor["cmp_block_table"][rank], slot, cpage)] = row
        for p, row in snapshot:
            flat_state[_home(compressor["state_block_table"][rank], p, page)] = row

    def compressed(rank, part, tile):
        return cmp_kv[rank], compressor["cmp_block_table"][rank][None], plan["cmp_indices"][rank, part, tile]

    x_out = attend_tiles("HCA", x_hc, kv_cache, local_kv, logical_kv, projected, plan, tiles,
                         (attn_sink, freqs_cos, freqs_sin, wo_a, wo_b, wo_b_scale), config=config, ops=ops,
                         compressed=compressed)
    return {"x_out": x_out, "kv_cache": publish_window(kv_cache, logical_kv, plan), "cmp_kv": cmp_kv,
            "state_pool": state}


prefill_cp_hca.composes_operators = True


# --- the record ----------------------------------------------------------------------------------------------

def paged_states(g: torch.Generator, cp: int, blocks: int, page: int, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Each rank's compressor state pool of ``blocks`` + 1 pages of ``page`` rows (random rows) through a shuffled
    table of its own, the same logical row of every position on every rank -> (pool [cp, blocks + 1, page,
    width] FP32, tables [cp, blocks] INT32)."""
    table = torch.stack([torch.randperm(blocks + 1, generator=g)[:blocks] for _ in range(cp)]).to(torch.int32)
    logical = torch.randn(blocks * page, width, generator=g)
    pool = torch.randn(cp, blocks + 1, page, width, generator=g)
    for r in range(cp):
        flat = pool[r].reshape(-1, width)
        for p in range(blocks * page):
            flat[_home(table[r], p, page)] = logical[p]
    return pool, table


def compressor_call(names: tuple[str, ...]):
    """A CP compressed sublayer record's call: the sublayer's arguments, its compressor ``names``, the plan."""
    def call(fn, i: dict[str, torch.Tensor], config) -> dict[str, torch.Tensor]:
        return dict(fn(*(i[n] for n in ("x_hc", *WEIGHT_NAMES, "kv_cache", *TAIL_NAMES)),
                       {n: i[n] for n in names}, {n: i[n] for n in PLAN_NAMES}, config=config))
    return call


def chunk_inputs(config, seed: int, *, cp: int, span: int, num_tokens: int, prefix: int, pages: int = 2,
                 noisy_padding: bool = False) -> dict[str, torch.Tensor]:
    """One CP HCA chunk: CP SWA's inputs (``kernels.v4.cp_swa.chunk_inputs``, the same draws) with the plan's HCA
    tables, the ratio-128 compressor's weights, each rank's state pool (random rows: an earlier chunk's, the
    prefix's among them, the same on every rank) through a shuffled table of pages of 8 positions, and each rank's
    compressed cache (the prefix's completed windows, the same on every rank; other rows random) through a table of
    its own, pages of 2 rows (each rank's a shuffled list of distinct pages); the compressor's weights BF16 values
    (held in FP32)."""
    from kernels.v4.cp_swa import chunk_inputs as swa_inputs

    i = swa_inputs(config, seed, cp=cp, span=span, num_tokens=num_tokens, prefix=prefix, pages=pages,
                   noisy_padding=noisy_padding)
    g = generator(seed + 7)
    hd, dm, page = config.head_dim, config.hidden_size, config.c128_state_block_size
    plan = cp_hca_plan(num_tokens, cp, span, i["block_table"], prefix=prefix, config=config)
    end = prefix + num_tokens
    blocks = -(-end // page)
    state, state_table = paged_states(g, cp, blocks, page, 2 * hd)
    cpage, slots = 2, end // RATIO + 1
    cblocks = -(-slots // cpage)
    phys = cblocks + 2
    cmp_table = torch.stack([torch.randperm(phys, generator=g)[:cblocks] for _ in range(cp)]).to(torch.int32)
    logical_cmp = (torch.rand(slots, hd, generator=g) - 0.5).to(torch.bfloat16)
    cmp = (torch.rand(cp, phys, cpage, 1, hd, generator=g) - 0.5).to(torch.bfloat16)
    for r in range(cp):
        for k in range(prefix // RATIO):
            cmp[r].reshape(-1, hd)[int(cmp_table[r, k // cpage]) * cpage + k % cpage] = logical_cmp[k]
    bf16 = lambda t: t.to(torch.bfloat16).float()  # noqa: E731 (BF16 values in FP32, as upstream's weights are)
    return {**i, **plan, "cmp_wkv": bf16(torch.randn(dm, hd, generator=g) / dm**0.5),
            "cmp_wgate": bf16(torch.randn(dm, hd, generator=g) / dm**0.5),
            "cmp_ape": bf16(torch.randn(RATIO, hd, generator=g) * 0.5), "cmp_norm_w": bf16(torch.rand(hd, generator=g) + 0.5), "state_pool": state, "state_block_table": state_table,
            "cmp_kv": cmp, "cmp_block_table": cmp_table}


def _tree(seed: int, wiring: str, config) -> dict[str, torch.Tensor]:
    """CP SWA's tree (``kernels.v4.cp_swa``: CP 2, span R, R + 6 tokens after a prefix of 5; the same inputs, which
    the store keeps once) with HCA's compressor: window 0 (0 .. 127) closes in segment 0 over the prefix's state
    rows 0 .. 4 (rank 0's); segment 1 (rank 1) is the final state's, its snapshot reaching back into segment 0.
    Every other state row comes in as 0 (the sample store's budget; the contracts give the pools random bytes, and
    windows straddling ranks)."""
    r = config.sliding_window
    i = chunk_inputs(config, seed, cp=2, span=r, num_tokens=r + 6, prefix=5)
    page, hd = config.c128_state_block_size, config.head_dim
    state = torch.zeros_like(i["state_pool"])
    for p in range(5):
        row = int(i["state_block_table"][0, p // page]) * page + p % page
        state[0].reshape(-1, 2 * hd)[row] = i["state_pool"][0].reshape(-1, 2 * hd)[row]
    i["state_pool"] = state
    del i["x_all"], i["block_table"]
    return i


_call = compressor_call(COMPRESSOR_NAMES)


RECORD = Record(
    operator="prefill_cp_hca",
    call=_call,
    outputs={"x_out": "v4_cp_x_out", "kv_cache": "v4_cp_kv_cache", "cmp_kv": "v4_cmp_pool",
             "state_pool": "v4_state_pool"},
    cases=(CaseSpec("prefill_cp_hca", "V4-Flash CP HCA prefill, CP 2: CP SWA's tiles with the ratio-128 compressor "
                    "run per segment by its owner over the predecessor's exchanged tail (a window over the prefix's "
                    "state closing in segment 0), every compressed row and the final state given to every rank", _tree,
                    geometries=("flash-tiny",)),),
    bad_calls=(
        BadCall("one compressed cache for all ranks", "prefill_cp_hca",
                replaced(cmp_kv=lambda i: i["cmp_kv"][:1]), "cmp_kv"),
        BadCall("a state pool of pages of 4", "prefill_cp_hca",
                replaced(state_pool=lambda i: i["state_pool"][:, :, :4].contiguous()), "state_pool"),
        BadCall("one state table for all ranks", "prefill_cp_hca",
                replaced(state_block_table=lambda i: i["state_block_table"][0]), "state_block_table"),
        BadCall("picks wider than index_topk", "prefill_cp_hca",
                replaced(cmp_indices=lambda i: torch.cat((i["cmp_indices"], i["cmp_indices"][..., :1]), -1)),
                "plan.cmp_indices"),
    ),
    bindings=cp_only(golden="prefill_cp_hca.py::golden_prefill_cp_hca", entry="prefill_cp_hca.py::prefill_cp_hca_test"),
)

PLAN_RECORD = Record(
    operator="cp_hca_plan",
    call=plan_call,
    outputs={n: "exact" for n in PLAN_NAMES},
    cases=(CaseSpec("cp_hca_plan", "V4-Flash CP HCA prefill metadata, CP 4, span 1.5R, 700 tokens after 61 cached: "
                    "CP SWA's tables with each query's compressed picks, the segments' tails and state snapshots",
                    plan_case, geometries=("flash-tiny",)),),
    bad_calls=(
        BadCall("a span longer than two tiles", "cp_hca_plan",
                replaced(span=lambda i: torch.tensor(2 * int(i["span"]) + 1)), "span"),
    ),
    bindings=cp_only(none="built by the test fixture (prefill_cp_hca.py::build_hca_metadata, zero history, equal "
                          "segments), not a golden; the host lowers it"),
)
