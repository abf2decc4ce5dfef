"""V4 decode metadata (``v4_decode_metadata``) and HCA's deterministic compressed top-k (``hca_topk``), on the
V4-Pro and V4-Flash kernel presets (tiny twins keep the schedule, the window, the pages and the MTP shape).

Where V4 differs from V4.1: the decode batch is dense and request-major (MTP = 1: two rows per request, row
b·seq + s at start + s) instead of V4.1's packed ForwardMetadata with query_start_loc and padding rows; a
slot of -1 means "no write" (a page past the table, an unmapped page, or a compressed row that is not at a
ratio boundary); the window has holes where a page is unmapped; HCA's compressed top-k is not learned but
the first positions.

Spec: §8; docs/coverage.md, V4 section.
"""

from __future__ import annotations

import pytest
import torch

from contracts.separation import separates
from kernels.config import V4_FLASH_TINY, V4_PRO_TINY
from kernels.errors import ContractInputError
from pto_pytest.defect import shared
from pto_pytest.plugin import op

MODELS = [V4_PRO_TINY.kernel_preset(), V4_FLASH_TINY.kernel_preset()]
IDS = [m.name for m in MODELS]


def _tables(config, starts, *, seed=0, unmapped=()):
    """Request-interleaved physical pages (as upstream's fixture lays them out), permuted, with some pages
    unmapped (-1)."""
    g = torch.Generator().manual_seed(seed)
    batch, bs = len(starts), config.block_size
    pages = -(-(max(starts) + config.decode_seq) // bs) + 1

    def table(n_pages, page):
        t = torch.randperm(batch * n_pages, generator=g).reshape(batch, n_pages).to(torch.int32)
        for b, p in unmapped if page == bs else ():
            t[b, p] = -1
        return t

    cmp = {r: table(-(-pages * bs // r // bs) + 1, bs) for r in (4, 128)}
    state = {4: table(-(-(max(starts) + 2) // config.c4a_state_block_size) + 1, config.c4a_state_block_size),
             128: table(-(-(max(starts) + 2) // config.c128_state_block_size) + 1, config.c128_state_block_size)}
    return table(pages, bs), cmp, state


def _phys(table, b, pos, bs):
    page = pos // bs
    if page >= table.shape[1] or int(table[b, page]) < 0:
        return -1
    return int(table[b, page]) * bs + pos % bs


@pytest.mark.parametrize("config", MODELS, ids=IDS)
@pytest.mark.operators("v4_decode_metadata")
def test_mtp_rows_are_request_major_with_two_positions_per_request(backend, config):
    """Four requests, two MTP rows each: row b·2 + s is request b's token s at start[b] + s; kv_seq_lens is
    start + 2 (start + 1 when one token is committed). A layout interleaving the rows seq-major differs.
    Spec: §8 (DECODE_BATCH 4, DECODE_SEQ 2)."""
    starts = [127, 0, 300, 9]
    ori, cmp, state = _tables(config, starts)
    md = op(backend, "v4_decode_metadata")(torch.tensor(starts), ori, cmp, state, config=config)
    assert config.decode_seq == 2 and md.position_ids.numel() == len(starts) * 2
    assert md.position_ids.tolist() == [127, 128, 0, 1, 300, 301, 9, 10], md.position_ids.tolist()
    rows = [(b, s) for b in range(4) for s in range(2)]
    separates("§8 MTP rows request-major", torch.tensor([starts[b] + s for b, s in rows], dtype=torch.int32),
              seq_major=torch.tensor([starts[b] + s for s, b in sorted((s, b) for b, s in rows)], dtype=torch.int32),
              one_position_per_request=torch.tensor([starts[b] + 0 for b, _ in rows], dtype=torch.int32))
    assert md.kv_seq_lens.tolist() == [129, 2, 302, 11] and md.kv_seq_lens.dtype == torch.int32
    one = op(backend, "v4_decode_metadata")(torch.tensor(starts), ori, cmp, state, config=config, commit_tokens=1)
    assert one.kv_seq_lens.tolist() == [128, 1, 301, 10]
    none = op(backend, "v4_decode_metadata")(torch.tensor(starts), ori, cmp, state, config=config, commit_tokens=0)
    assert none.kv_seq_lens.tolist() == starts
    for name in ("position_ids", "swa_indices", "swa_lens", "history_indices", "history_lens"):
        assert getattr(md, name).dtype == torch.int32, name
    single = op(backend, "v4_decode_metadata")(torch.tensor([5]), ori[:1], {r: t[:1] for r, t in cmp.items()},
                                               {r: t[:1] for r, t in state.items()}, config=config)
    assert single.position_ids.tolist() == [5, 6], "a batch of one request"


@pytest.mark.parametrize("config", MODELS, ids=IDS)
@pytest.mark.operators("v4_decode_metadata")
def test_slot_mappings_are_paged_rows_and_compress_only_at_boundaries(backend, config):
    """ori rows = table[b, pos // bs]·bs + pos % bs (-1 on an unmapped page); a compressed row only when
    (pos + 1) % ratio == 0, at column pos // ratio of the ratio's table, masked to -1 for an uncommitted token;
    state rows on 4-token (ratio 4) and 8-token (ratio 128) pages. Starts 126 and 127 put ratio-128 and
    ratio-4 boundaries on both MTP rows. Spec: §8."""
    starts = [126, 2, 7, 200]
    ori, cmp, state = _tables(config, starts, seed=1, unmapped=[(3, 1)])
    md = op(backend, "v4_decode_metadata")(torch.tensor(starts), ori, cmp, state, config=config)
    bs = config.block_size
    for t, p in enumerate(md.position_ids.tolist()):
        b = t // 2
        assert int(md.ori_slot_mapping[t]) == _phys(ori, b, p, bs), f"ori_slot_mapping row {t}"
        for r in (4, 128):
            want = _phys(cmp[r], b, p // r, bs) if (p + 1) % r == 0 else -1
            assert int(md.cmp_slot_mapping[r][t]) == want, f"cmp_slot_mapping[{r}] row {t} (pos {p})"
        for r, page in ((4, config.c4a_state_block_size), (128, config.c128_state_block_size)):
            assert int(md.state_slot_mapping[r][t]) == _phys(state[r], b, p, page), f"state_slot_mapping[{r}] row {t}"
    assert int(md.cmp_slot_mapping[128][1]) >= 0 and int(md.cmp_slot_mapping[4][1]) >= 0, "pos 127 is a boundary"
    masked = op(backend, "v4_decode_metadata")(torch.tensor(starts), ori, cmp, state, config=config, commit_tokens=1)
    assert int(masked.cmp_slot_mapping[128][1]) == -1 and torch.equal(masked.cmp_slot_mapping[4][::2],
                                                                      md.cmp_slot_mapping[4][::2])
    assert md.ori_slot_mapping.dtype == torch.int64 and md.cmp_slot_mapping[4].dtype == torch.int64
    # compressed rows at boundaries only, at column pos // ratio: separated from a row written at every token,
    # from the boundary taken as pos % ratio == 0, and from the column (pos + 1) // ratio
    rows4 = [(t // 2, p) for t, p in enumerate(md.position_ids.tolist())]

    def cmp4(boundary, column):
        return torch.tensor([_phys(cmp[4], b, column(p), bs) if boundary(p) else -1 for b, p in rows4])

    separates("§8 compressed slots at boundaries", cmp4(lambda p: (p + 1) % 4 == 0, lambda p: p // 4),
              every_token=cmp4(lambda p: True, lambda p: p // 4),
              boundary_at_multiples=cmp4(lambda p: p % 4 == 0, lambda p: p // 4),
              next_column=cmp4(lambda p: (p + 1) % 4 == 0, lambda p: (p + 1) // 4))
    # a page past the table is "no write" (-1); the table's last page is still read
    short = torch.tensor([[5, 9]], dtype=torch.int32)
    edge = op(backend, "v4_decode_metadata")(torch.tensor([2 * bs - 1]), short, {}, {}, config=config)
    assert edge.ori_slot_mapping.tolist() == [9 * bs + bs - 1, -1], edge.ori_slot_mapping.tolist()


@pytest.mark.parametrize("config", MODELS, ids=IDS)
@pytest.mark.operators("v4_decode_metadata")
def test_windows_are_oldest_first_and_history_leaves_out_the_chunk(backend, config):
    """SWA row: the visible positions max(0, pos - window + 1) .. pos oldest first, len = their count, an
    unmapped page a -1 hole inside, -1 after; history row: the same positions before this decode chunk (the
    overlay attends the chunk), unmapped ones dropped, packed oldest first. Spec: §8."""
    starts = [3, 200, 130]
    ori, cmp, state = _tables(config, starts, seed=2, unmapped=[(1, 0)])
    md = op(backend, "v4_decode_metadata")(torch.tensor(starts), ori, cmp, state, config=config)
    w, bs = config.sliding_window, config.block_size
    for t, p in enumerate(md.position_ids.tolist()):
        b, s = divmod(t, 2)
        visible = list(range(max(0, p - w + 1), p + 1))
        want = [_phys(ori, b, q, bs) for q in visible]
        assert md.swa_indices[t].tolist() == want + [-1] * (w - len(want)) and int(md.swa_lens[t]) == len(want), \
            f"swa row {t}"
        hist = [x for x in (_phys(ori, b, q, bs) for q in visible if q < p - s) if x >= 0]
        assert md.history_indices[t].tolist() == hist + [-1] * (w - len(hist)), f"history row {t}"
        assert int(md.history_lens[t]) == len(hist), f"history_lens row {t}"
    assert -1 in md.swa_indices[2].tolist()[:int(md.swa_lens[2])], "the unmapped page leaves a hole"


@pytest.mark.operators("v4_decode_metadata")
def test_bad_starts_and_tables_are_refused_naming_the_field(backend):
    """A negative start, a start whose two rows pass the kernel's max sequence length (16384 at the Pro
    kernel preset: 16382 accepted, 16383 refused), float starts, a table without one row per request and a
    commit count outside [0, 2] each name the field. Spec: §8."""
    from kernels.config import V4_PRO

    pro = V4_PRO.kernel_preset()
    meta = op(backend, "v4_decode_metadata")
    ori, cmp, state = _tables(MODELS[0], [0, 0], seed=3)
    big = torch.zeros(2, 130, dtype=torch.int32)
    meta(torch.tensor([16382, 0]), big, {}, {}, config=pro)
    for starts, field in (([0, -1], r"starts\[1\]: expected >= 0"), ([16382, 16383], r"starts\[1\]: expected start"),
                          (torch.tensor([0.0, 1.0]), "starts: expected integer")):
        with pytest.raises(ContractInputError, match=field):
            meta(torch.as_tensor(starts), big, {}, {}, config=pro)
    with pytest.raises(ContractInputError, match="ori_table"):
        meta(torch.tensor([0, 0, 0]), ori, cmp, state, config=MODELS[0])
    for bad in (3, -1, True):
        with pytest.raises(ContractInputError, match="commit_tokens"):
            meta(torch.tensor([0, 0]), ori, cmp, state, config=MODELS[0], commit_tokens=bad)


@pytest.mark.parametrize("config", MODELS, ids=IDS)
@pytest.mark.operators("hca_topk")
def test_hca_topk_takes_the_first_compressed_positions(backend, config):
    """Row t: columns 0 .. valid-1 hold compressed positions 0 .. valid-1 (the oldest), the rest -1, valid =
    min(limit, (pos + 1) // 128, kv_seq_len // 128). With the limit below the visible count the first
    positions win (a top-k taking the last ones differs); a row before its first boundary has none. Spec: §8
    (HCA: ratio-128 compressor, deterministic top-k)."""
    limit = min(config.max_position_embeddings // 128, config.index_topk)
    pos = torch.tensor([127, 128, 0, 1, 511, 510, 383, 384], dtype=torch.int32)
    kv = torch.tensor([129, 2, 512, 385], dtype=torch.int32)
    got = op(backend, "hca_topk")(pos, kv, seq=2, limit=limit)
    assert got.shape == (8, limit) and got.dtype == torch.int32
    for t in range(8):
        valid = min(limit, (int(pos[t]) + 1) // 128, int(kv[t // 2]) // 128)
        assert got[t].tolist() == list(range(valid)) + [-1] * (limit - valid), f"row {t}"
    uncommitted = op(backend, "hca_topk")(torch.tensor([126, 127]), torch.tensor([127]), seq=2, limit=limit)
    assert uncommitted.tolist() == [[-1] * limit] * 2, "kv_seq_len 127 bounds the uncommitted boundary row"
    capped = op(backend, "hca_topk")(torch.tensor([1023, 1023]), torch.tensor([1024]), seq=2, limit=3)
    assert capped.tolist() == [[0, 1, 2], [0, 1, 2]], capped.tolist()
    with pytest.raises(ContractInputError, match="position_ids"):
        op(backend, "hca_topk")(pos[:-1], kv, seq=2, limit=limit)


@pytest.mark.parametrize("config", MODELS, ids=IDS)
@pytest.mark.operators("v4_prefill_swa_indices")
def test_a_prefill_window_is_the_last_positions_oldest_first(backend, config):
    """A prefill chunk's window (v4_prefill_swa_indices; upstream prefill_attention_swa.py lowers it in the
    stage): row t < num_tokens at position p lists p + 1 - min(window, p + 1) .. p oldest first from column 0,
    its own position last, through the 1-D table, an unmapped page a -1 hole; the padding rows are all -1.
    Positions 0, 1, window - 1, window and a row whose window crosses an unmapped page. Spec: §8."""
    w, bs = config.sliding_window, config.block_size
    table = torch.tensor([2, -1, 0, 3], dtype=torch.int32)
    pos = torch.tensor([0, 1, w - 1, w, w + 5, 2 * w + 3, 3 * w + 7, 2 * w + 3, 9], dtype=torch.int32)
    n = 7
    got = op(backend, "v4_prefill_swa_indices")(pos, table, n, config=config)
    assert got.dtype == torch.int32 and got.shape == (pos.numel(), w)
    for t, p in enumerate(pos.tolist()):
        if t >= n:
            assert got[t].tolist() == [-1] * w, f"padding row {t} has a window"
            continue
        visible = range(p + 1 - min(w, p + 1), p + 1)
        want = [int(table[q // bs]) * bs + q % bs if int(table[q // bs]) >= 0 else -1 for q in visible]
        assert got[t].tolist() == want + [-1] * (w - len(want)), f"window of row {t} at position {p}"
    assert -1 in got[5].tolist() and got[5].tolist()[-1] == int(table[2]) * bs + 3, \
        "the unmapped page leaves a hole and the own row is last"

    def windows(newest_first=False, physical=True, span=w, pad=True):  # the whole tensor under a rule variant
        out = torch.full_like(got, -1)
        for t, p in enumerate(pos.tolist()):
            if t >= n and pad:
                continue
            rows = [(int(table[q // bs]) * bs + q % bs if int(table[q // bs]) >= 0 else -1) if physical else q
                    for q in range(max(0, p + 1 - span), p + 1)][-w:]
            rows = rows[::-1] if newest_first else rows
            out[t, :len(rows)] = torch.tensor(rows, dtype=out.dtype)
        return out

    separates("§8 prefill window: last positions, oldest first, paged", windows(), newest_first=windows(newest_first=True),
              logical_positions=windows(physical=False), one_position_short=windows(span=w - 1),
              padding_rows_get_windows=windows(pad=False))


@pytest.mark.operators("v4_prefill_swa_indices")
def test_bad_prefill_window_inputs_are_refused_naming_the_field(backend):
    config = MODELS[0]
    pos, table = torch.arange(4, dtype=torch.int32), torch.tensor([0, 1], dtype=torch.int32)
    lower = op(backend, "v4_prefill_swa_indices")
    with pytest.raises(ContractInputError, match="block_table"):
        lower(pos, table.reshape(1, 2), 4, config=config)
    with pytest.raises(ContractInputError, match=r"position_ids\[2\]"):
        lower(torch.tensor([0, 1, 2 * config.block_size, 3], dtype=torch.int32), table, 4, config=config)
    with pytest.raises(ContractInputError, match=r"position_ids\[1\]"):
        lower(torch.tensor([0, -1, 2, 3], dtype=torch.int32), table, 4, config=config)
    with pytest.raises(ContractInputError, match="num_tokens"):
        lower(pos, table, 5, config=config)
    with pytest.raises(ContractInputError, match="position_ids"):
        lower(pos.reshape(2, 2), table, 2, config=config)
    with pytest.raises(ContractInputError, match="position_ids"):
        lower(pos.float(), table, 4, config=config)
    assert lower(pos, table, 0, config=config).eq(-1).all(), "a chunk of padding has a window"
    assert lower(pos, table, 4, config=config)[3, :4].tolist() == [0, 1, 2, 3], "every row real"
    assert torch.equal(lower(pos.long(), table.long(), 4, config=config), lower(pos, table, 4, config=config)), \
        "INT64 positions and tables are part of the ABI"
    assert lower(torch.tensor([0, 1, 999, -5], dtype=torch.int32), table, 2, config=config)[2:].eq(-1).all(), \
        "padding positions are not read"


# defects of tests/defects these contracts must catch (shared with other contract files)
SEEDED_DEFECTS = [
    shared("v4:MTP_ROWS_SEQ_MAJOR", "test_mtp_rows_are_request_major_with_two_positions_per_request", "[127, 0, 300, 9"),
    shared("v4:HCA_TOPK_LAST", "test_hca_topk_takes_the_first_compressed_positions", "[5, 6, 7]"),
    shared("v4:PREFILL_WINDOW_WITHOUT_SELF", "test_a_prefill_window_is_the_last_positions_oldest_first", "window of row"),
]
