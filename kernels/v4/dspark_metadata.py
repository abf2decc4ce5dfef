"""V4-Flash dspark's decode metadata (spec §8; upstream models/deepseek_v4_flash_dspark/decode_metadata.py): one
decode step's slot mappings and sliding window, computed on the device from the positions and six page tables.

The call holds B requests of ``seq`` consecutive tokens (token t belongs to request t // seq). Each table row is one
request's pages; ``block_counts`` [B, 6] gives, per request, how many pages of each group are live (groups in this
order: ori, cmp, idx, hca_state, csa_state, csa_inner_state). For token t at position p of request r:

* **ori / SWA slot**: ``ori[r, p // bs] * bs + p % bs`` -- the ori table is indexed by the logical page directly
  (the caller spells a ring out in the table; its count is not read). ``ori_slot_mapping`` and
  ``swa_slot_mapping`` are that slot.
* **sliding window**: ``swa_lens[t] = min(p + 1, window)``; ``swa_indices[t]`` holds the slots of positions
  p - len + 1 .. p, oldest first, as a prefix, then -1 (the prefix the SWA kernel reads; disagreement 16).
* **compressed rows**: a position closing a window (``(p + 1) % ratio == 0``) writes compressed row
  ``k = p // ratio`` at ``cmp[r, (k // bs) % count_cmp] * bs + k % bs`` -- a ring of ``count_cmp`` live pages --
  HCA at ratio 128 and CSA at ratio 4 in the same compressed table; CSA's index key at the same row of the idx table
  (ring of ``count_idx``). Any other position: -1.
* **state rows**: every token writes its state row ``table[r, (p // page) % count] * page + p % page`` of each
  compressor: HCA's at ``hca_state_page`` (8), CSA's and CSA's inner compressor's at ``csa_state_page`` (2).

Every table entry the step reads must be a page (>= 0) and every count in [1, the table's width]; a logical page
past the ori table, or a count past its table, is the caller's error, refused naming the table and the row.
"""

from __future__ import annotations

import torch

from kernels.errors import ContractInputError, is_int
from kernels.operators import operator
from kernels.record import BadCall, CaseSpec, Record, Upstream, generator, is_tiny, replaced

SPEC = "§8"
GROUPS = ("ori", "cmp", "idx", "hca_state", "csa_state", "csa_inner_state")  # block_counts' columns
TABLES = tuple(f"{g}_block_table" for g in GROUPS)
OUTPUTS = ("ori_slot_mapping", "swa_slot_mapping", "swa_indices", "swa_lens", "hca_cmp_slot_mapping",
           "hca_state_slot_mapping", "csa_cmp_slot_mapping", "csa_idx_slot_mapping", "csa_state_slot_mapping",
           "csa_inner_state_slot_mapping")


def _check(position_ids, tables, block_counts, *, seq, block_size, window, pages, groups=GROUPS):
    if not all(is_int(v) and v >= 1 for v in (seq, block_size, window, *pages)):
        raise ContractInputError("seq/block_size/window/pages", None, "ints >= 1",
                                 repr((seq, block_size, window, *pages)), SPEC)
    if position_ids.ndim != 1 or position_ids.dtype not in (torch.int32, torch.int64) or \
            position_ids.numel() % seq or not position_ids.numel():
        raise ContractInputError("position_ids", None, f"[B * {seq}] INT32 / INT64",
                                 f"{position_ids.dtype}{list(position_ids.shape)}", SPEC)
    b = position_ids.numel() // seq
    if bool((position_ids < 0).any()):
        t = int((position_ids < 0).nonzero()[0])
        raise ContractInputError("position_ids", (t,), ">= 0", int(position_ids[t]), SPEC)
    names = tuple(f"{g}_block_table" for g in groups)
    for name, table in zip(names, tables, strict=True):
        if table.ndim != 2 or table.shape[0] != b or table.dtype not in (torch.int32, torch.int64):
            raise ContractInputError(name, None, f"[{b}, pages] INT32", f"{table.dtype}{list(table.shape)}", SPEC)
    if block_counts.shape != (b, len(groups)) or block_counts.dtype not in (torch.int32, torch.int64):
        raise ContractInputError("block_counts", None, f"[{b}, {len(groups)}] INT32",
                                 f"{block_counts.dtype}{list(block_counts.shape)}", SPEC)
    for g, table in enumerate(tables):
        if g == 0:
            continue  # the ori table is read by logical page (its count is not read)
        bad = (block_counts[:, g] < 1) | (block_counts[:, g] > table.shape[1])
        if bool(bad.any()):
            r = int(bad.nonzero()[0])
            raise ContractInputError("block_counts", (r, g), f"a {groups[g]} count in [1, {table.shape[1]}]",
                                     int(block_counts[r, g]), SPEC)


def _page(table, name, r, column):
    if column >= table.shape[1]:
        raise ContractInputError(name, (r, column), f"a column < {table.shape[1]}", column, SPEC)
    page = int(table[r, column])
    if page < 0:
        raise ContractInputError(name, (r, column), "a page (>= 0) for a row the step reads", page, SPEC)
    return page


@operator(returns="{ori_slot_mapping, swa_slot_mapping, swa_indices [T, window] (oldest first, then -1), swa_lens, "
                  "hca_cmp / csa_cmp / csa_idx slot mappings (-1 but at a closing position), hca / csa / csa_inner "
                  "state slot mappings}: dspark's decode metadata, its compressed and state tables rings of "
                  "block_counts live pages", spec=SPEC)
def dspark_decode_metadata(position_ids: torch.Tensor, ori_block_table: torch.Tensor, cmp_block_table: torch.Tensor,
                           idx_block_table: torch.Tensor, hca_state_block_table: torch.Tensor,
                           csa_state_block_table: torch.Tensor, csa_inner_state_block_table: torch.Tensor,
                           block_counts: torch.Tensor, *, seq: int, block_size: int, window: int,
                           hca_state_page: int = 8, csa_state_page: int = 2) -> dict[str, torch.Tensor]:
    """position_ids [B * seq] -> the step's metadata (the module's docstring); INT64 slot mappings, INT32 windows."""
    tables = (ori_block_table, cmp_block_table, idx_block_table, hca_state_block_table, csa_state_block_table,
              csa_inner_state_block_table)
    _check(position_ids, tables, block_counts, seq=seq, block_size=block_size, window=window,
           pages=(hca_state_page, csa_state_page))
    bs = block_size  # HCA and CSA rows share the cmp table's pages of block_size rows; the index keys the idx table's
    return _lowered(position_ids, tables, block_counts, TABLES, seq=seq, block_size=bs, window=window,
                    compressed=(("hca_cmp_slot_mapping", 1, 128, bs), ("csa_cmp_slot_mapping", 1, 4, bs),
                                ("csa_idx_slot_mapping", 2, 4, bs)),
                    states=((3, hca_state_page), (4, csa_state_page), (5, csa_state_page)))


def _lowered(position_ids, tables, block_counts, names, *, seq, block_size, window, compressed, states):
    """The step's metadata over checked inputs: ``compressed`` (output, table, ratio, page) rings the rows of each
    compressor's closes, ``states`` (table, page) ring every position's state row, in the order of OUTPUTS."""
    n, bs = position_ids.numel(), block_size
    out = {name: torch.full((n,), -1, dtype=torch.int64) for name in OUTPUTS if name not in ("swa_indices", "swa_lens")}
    out["swa_indices"] = torch.full((n, window), -1, dtype=torch.int32)
    out["swa_lens"] = torch.zeros(n, dtype=torch.int32)
    count = lambda r, g: int(block_counts[r, g])  # noqa: E731

    def ori(r, q):
        return _page(tables[0], names[0], r, q // bs) * bs + q % bs

    def ring(g, r, row, page):
        return _page(tables[g], names[g], r, (row // page) % count(r, g)) * page + row % page

    state_outputs = ("hca_state_slot_mapping", "csa_state_slot_mapping", "csa_inner_state_slot_mapping")
    for t in range(n):
        r, p = t // seq, int(position_ids[t])
        out["ori_slot_mapping"][t] = out["swa_slot_mapping"][t] = ori(r, p)
        span = min(p + 1, window)
        out["swa_lens"][t] = span
        for i, q in enumerate(range(p - span + 1, p + 1)):
            out["swa_indices"][t, i] = ori(r, q)
        for name, g, ratio, page in compressed:
            if (p + 1) % ratio == 0:
                out[name][t] = ring(g, r, p // ratio, page)
        for name, (g, page) in zip(state_outputs, states, strict=True):
            out[name][t] = ring(g, r, p, page)
    return out


FLASH_MTP_GROUPS = ("ori", "hca_cmp", "csa_cmp", "idx", "hca_state", "csa_state", "csa_inner_state")
FLASH_MTP_TABLES = tuple(f"{g}_block_table" for g in FLASH_MTP_GROUPS)


@operator(returns="the outputs of dspark_decode_metadata, as Flash-MTP's decode_prepare.py lowers them: the HCA "
                  "and CSA compressed rows on tables of their own, each page the rows of one block_size-token block "
                  "(block_size / ratio), the index keys at CSA's page", spec=SPEC)
def flash_mtp_decode_metadata(position_ids: torch.Tensor, ori_block_table: torch.Tensor,
                              hca_cmp_block_table: torch.Tensor, csa_cmp_block_table: torch.Tensor,
                              idx_block_table: torch.Tensor, hca_state_block_table: torch.Tensor,
                              csa_state_block_table: torch.Tensor, csa_inner_state_block_table: torch.Tensor,
                              block_counts: torch.Tensor, *, seq: int, block_size: int, window: int,
                              hca_state_page: int = 8, csa_state_page: int = 2) -> dict[str, torch.Tensor]:
    """Flash-MTP's decode metadata (upstream models/deepseek_v4_flash_mtp/decode_prepare.py, inlined into its decode
    step; no golden): dspark's rules (the module's docstring) but for the compressed rows, which follow the Flash
    page (disagreement 17): a close at position p writes HCA row p // 128 at ``hca_cmp[r, (p // bs) % count] *
    (bs / 128) + (p % bs) // 128`` and CSA row p // 4 at ``csa_cmp[r, (p // bs) % count] * (bs / 4) + (p % bs) //
    4``, its index key at the same row of the idx table (CSA's page). ``block_counts`` [B, 7]: ori, hca_cmp,
    csa_cmp, idx, hca_state, csa_state, csa_inner_state. block_size must be a multiple of 128."""
    tables = (ori_block_table, hca_cmp_block_table, csa_cmp_block_table, idx_block_table, hca_state_block_table,
              csa_state_block_table, csa_inner_state_block_table)
    _check(position_ids, tables, block_counts, seq=seq, block_size=block_size, window=window,
           pages=(hca_state_page, csa_state_page), groups=FLASH_MTP_GROUPS)
    if block_size % 128:
        raise ContractInputError("block_size", None, "a multiple of 128 (a page holds the compressed rows of one "
                                 "block: block_size / ratio)", block_size, SPEC)
    bs = block_size
    return _lowered(position_ids, tables, block_counts, FLASH_MTP_TABLES, seq=seq, block_size=bs, window=window,
                    compressed=(("hca_cmp_slot_mapping", 1, 128, bs // 128), ("csa_cmp_slot_mapping", 2, 4, bs // 4),
                                ("csa_idx_slot_mapping", 3, 4, bs // 4)),
                    states=((4, hca_state_page), (5, csa_state_page), (6, csa_state_page)))


# --- the record ----------------------------------------------------------------------------------------------

def dspark_metadata_inputs(seed: int, wiring: str, config) -> dict[str, torch.Tensor]:
    """Upstream's fixture regimes at the preset: requests of ``decode_seq`` positions around the window closes (126,
    127 | 3, 4 | 8191, 8192 | 16382, 16383 for 2-token steps; each request's run starting at one of those), counts
    from 2 .. 10 per group (a ring that wraps), distinct shuffled pages per table (the ori table spelled out)."""
    g = generator(seed)
    seq, bs = config.decode_seq, config.block_size
    if is_tiny(config):
        b = 4
        starts = torch.tensor([126, 3, 8191, 16382])[:b]
    else:  # the entry's step (B = decode_batch requests), the same regimes with their runs inside the positions
        b = config.decode_batch
        starts = torch.tensor([127 - seq // 2, 3, 8192 - seq // 2, config.max_position_embeddings - seq])[
            torch.arange(b) % 4]
    positions = (starts[:, None] + torch.arange(seq)[None, :]).reshape(-1).to(torch.int32)
    counts = (2 + (torch.arange(b)[:, None] + torch.arange(6)[None, :]) % 9).to(torch.int32)
    widest = int(positions.max()) + 1
    if is_tiny(config):
        widths = (-(-widest // bs), 10, 10, 10, 10, 10)
    else:  # the entry's compiled table widths: ori and compressed by the positions, index twice, the state pools
        cmp = -(-(config.max_position_embeddings // 4) // bs)
        widths = (-(-config.max_position_embeddings // bs), cmp, 2 * cmp, 2048, 4096, 4096)
    out = {"position_ids": positions}
    for gi, (name, width) in enumerate(zip(TABLES, widths, strict=True)):
        out[name] = (torch.randperm(b * width, generator=g).reshape(b, width) + 1000 * gi).to(torch.int32)
    out["block_counts"] = counts
    return out


def _call(fn, i, config):
    return dict(fn(*(i[k] for k in ("position_ids", *TABLES, "block_counts")), seq=config.decode_seq,
                   block_size=config.block_size, window=config.sliding_window))


RECORD = Record(
    operator="dspark_decode_metadata",
    call=_call,
    outputs={name: "exact" for name in OUTPUTS},
    cases=(CaseSpec("dspark_decode_metadata", "dspark's decode metadata: four requests at upstream's fixture regimes "
                    "(the windows closing at 127, 4, 8191, 16383), ring counts 2 .. 10 per group, every slot mapping, "
                    "the oldest-first window and its length", dspark_metadata_inputs,
                    geometries=("flash-tiny", "dspark")),),
    bad_calls=(
        BadCall("a count of 0", "dspark_decode_metadata",
                replaced(block_counts=lambda i: i["block_counts"] * 0), "block_counts"),
        BadCall("a negative position", "dspark_decode_metadata",
                replaced(position_ids=lambda i: i["position_ids"] - 100000), "position_ids"),
        BadCall("an unmapped state page", "dspark_decode_metadata",
                replaced(csa_state_block_table=lambda i: i["csa_state_block_table"] * 0 - 1),
                "csa_state_block_table"),
    ),
    bindings=(
        Upstream("deepseek_v4_pro", none="V4-Pro's decode metadata is host lowering (v4_decode_metadata), no ring "
                                         "counts"),
        Upstream("deepseek_v4_flash_mtp", none="Flash-MTP's decode_prepare.py lowers its own layout (separate HCA "
                                               "and CSA tables at the Flash page: flash_mtp_decode_metadata) and has "
                                               "no golden"),
        Upstream("deepseek_v4_flash_dspark", golden="decode_metadata.py::golden_decode_metadata",
                 none="its entry decode_metadata.py::decode_metadata is not bound on the device backend yet"),
    ),
)
