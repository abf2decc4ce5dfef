"""The CED prefill plan and the decoder replay selection (``decoder_replay``): which layers run as the
encoder and which as the decoder (layer 20 the only global publisher), the causal encoder's layer ids, and
the rows the decoder replays -- upstream's hand-checked vector (0, 1, 127, 128, 129), window metadata equal to
independently computed paged slots, and bad encoder metadata refused naming the field.

Resumed requests: the cached encoder tails the decoder replays before a request's new rows, and the encoder
replay of cached input tails with only the new rows publishing; the CED order (encoder on every row, the one
publication, the decoder on the replay rows) and what a CED run's attention may take.

Spec: §1, §3; upstream_checks SC-19, SC-20, SC-21, MD-15..20, MD-23, AP-16.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from functools import partial

import pytest
import torch

from contracts.separation import separates
from kernels.config import FLASH, LayerKind
from kernels.errors import ContractInputError
from kernels.metadata import paged_slots
from kernels.prefill_plan import causal_encoder_layer, prefill_layer_plan
from pto_pytest.defect import SeededDefect, reference_edit, shared
from pto_pytest.plugin import op


def test_the_ced_plan_puts_layers_0_to_19_in_the_encoder_and_20_to_39_in_the_decoder():
    """Encoder: prefill SWA x2, C2A FULL x3, C2A REUSE x15; decoder: C1A seeded (FULL) x1, REINDEX x4, REUSE x15;
    layer 20 is the only global publisher. Spec: SC-19, SC-20."""
    plan = prefill_layer_plan(FLASH)
    assert [p.stage for p in plan] == ["encoder"] * 20 + ["decoder"] * 20
    assert Counter(p.entry for p in plan) == {"prefill_swa": 2, "prefill_c2a_full": 3, "prefill_c2a_reuse": 15,
                                              "prefill_c1a_seeded": 1, "prefill_c1a_reindex": 4,
                                              "prefill_c1a_reuse": 15}
    assert [p.layer_id for p in plan if p.publishes_global] == [20] and plan[20].entry == "prefill_c1a_seeded"


def test_each_ced_layer_names_the_upstream_module_its_loader_imports():
    """What upstream's lazy loaders import for each layer: SWA layers prefill_swa.prefill_swa (host entry
    make_hc_program), C2A FULL / REUSE prefill_c2a_full / prefill_c2a_reuse, the seeded decoder layer 20
    prefill_c1a_full.prefill_c1a_seeded (l3_prefill_c1a_seeded) with the global publisher
    prefill_decoder_kv.publish_decoder_global_from_encoder_rank, REINDEX and REUSE prefill_c1a_reindex /
    prefill_c1a_reuse with their l3 test entries; no other layer loads a publisher. Spec: SC-20."""
    plan = prefill_layer_plan(FLASH)
    assert plan[0].module == ("prefill_swa", "prefill_swa", "make_hc_program")
    assert plan[2].module == ("prefill_c2a_full", "prefill_c2a_full", "make_hc_program")
    assert plan[3].module == ("prefill_c2a_reuse", "prefill_c2a_reuse", "make_hc_program")
    assert plan[20].module == ("prefill_c1a_full", "prefill_c1a_seeded", "l3_prefill_c1a_seeded")
    assert plan[24].module == ("prefill_c1a_reindex", "prefill_c1a_reindex", "l3_prefill_c1a_reindex_test")
    assert plan[21].module == ("prefill_c1a_reuse", "prefill_c1a_reuse", "l3_prefill_c1a_reuse_test")
    assert [(p.layer_id, p.publisher) for p in plan if p.publisher] == \
        [(20, ("prefill_decoder_kv", "publish_decoder_global_from_encoder_rank"))]
    assert {p.module[0] for p in plan} == {"prefill_swa", "prefill_c2a_full", "prefill_c2a_reuse", "prefill_c1a_full",
                                           "prefill_c1a_reindex", "prefill_c1a_reuse"}


def test_a_schedule_the_ced_plan_cannot_run_is_refused_naming_the_layer():
    """A ratio-1 layer before layer 20 (or a ratio-2 layer after it) has no CED entry. Spec: SC-19."""
    ratios = list(FLASH.compress_ratios)
    ratios[19] = 1
    bad = replace(FLASH, compress_ratios=tuple(ratios), kv_source_layer_ids=(2, 8, 14, 19, 20),
                  index_source_layer_ids=(2, 8, 14, 19, 20, 24, 28, 32, 36))
    with pytest.raises(ContractInputError, match=r"layer_id\[19\]: expected an encoder layer"):
        prefill_layer_plan(bad)


def test_the_causal_encoder_takes_layers_0_to_19_only():
    """Layer ids 0..19 only (-1, 20, 40 and bools refused), and their schedule is the checkpoint's tables as
    spec §1 transcribes them: ratio 0 at layers 0-1 (SWA, no sources), ratio 2 from layer 2 on with KV and index
    sources 2 (layers 2-7), 8 (8-13) and 14 (14-19); C2A FULL exactly at the sources. Spec: SC-21."""
    table = [(0, None, None)] * 2 + [(2, 2, 2)] * 6 + [(2, 8, 8)] * 6 + [(2, 14, 14)] * 6
    got = [(FLASH.schedule[causal_encoder_layer(i)].compress_ratio, FLASH.schedule[i].kv_source,
            FLASH.schedule[i].index_source) for i in range(20)]
    assert got == table, got
    assert [i for i in range(20) if FLASH.schedule[i].kind is LayerKind.C2A_FULL] == [2, 8, 14]
    assert [i for i in range(20) if FLASH.schedule[i].kind is LayerKind.SWA] == [0, 1]
    assert [causal_encoder_layer(i) for i in (0, 1, 19)] == [0, 1, 19]
    for bad in (-1, 20, 40, True):
        with pytest.raises(ContractInputError, match="causal encoder layer_id"):
            causal_encoder_layer(bad)


def _fresh(lengths, *, seed=0, window=FLASH.sliding_window, block=FLASH.block_size):
    g = torch.Generator().manual_seed(seed)
    starts = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    positions = torch.cat([torch.arange(n) for n in lengths]).to(torch.int32)
    requests = torch.cat([torch.full((n,), b) for b, n in enumerate(lengths)]).to(torch.int32)
    pages = max(1, -(-max(lengths) // block))
    table = torch.randperm(len(lengths) * pages, generator=g).reshape(len(lengths), pages).to(torch.int32)
    return starts, positions, requests, torch.zeros(len(lengths), dtype=torch.int32), table


@pytest.mark.operators("decoder_replay")
def test_upstreams_hand_checked_replay_vector(backend):
    """Prompt lengths (0, 1, 127, 128, 129) at FLASH (window 128, pages of 128): replay lengths
    [0, 1, 127, 128, 128], replay starts [0, 0, 0, 0, 1], logit rows [-1, 0, 127, 255, 383]; the 129-token
    request replays rows 1..128 of its prompt, with window lens truncated to the replay (row 1 sees only
    itself). Spec: MD-16."""
    starts, positions, requests, kv, table = _fresh([0, 1, 127, 128, 129])
    r = op(backend, "decoder_replay")(starts, positions, requests, kv, table, window=FLASH.sliding_window,
                                      block_size=FLASH.block_size)
    assert r.query_lens.tolist() == [0, 1, 127, 128, 128], r.query_lens.tolist()
    assert r.replay_starts.tolist() == [0, 0, 0, 0, 1], r.replay_starts.tolist()
    assert r.logit_row_indices.tolist() == [-1, 0, 127, 255, 383], r.logit_row_indices.tolist()
    last = slice(256, 384)
    assert r.position_ids[last].tolist() == list(range(1, 129))
    assert r.source_rows[last].tolist() == list(range(256 + 1, 256 + 129))
    assert r.window_lens[256].item() == 1 and r.window_lens[383].item() == 128
    assert r.compressed_lens.tolist() == (r.position_ids + 1).tolist()


@pytest.mark.operators("decoder_replay")
def test_replay_window_metadata_equals_independent_paged_slots(backend):
    """Every replay row's window slots and visible rows are the window block table's physical rows of the
    request's positions from max(replay start, pos - window + 1) to pos, oldest first, then -1. Spec: MD-15."""
    lengths = [5, 40, 131, 17]
    window, block = 16, 8
    starts, positions, requests, kv, table = _fresh(lengths, seed=3, block=block)
    r = op(backend, "decoder_replay")(starts, positions, requests, kv, table, window=window, block_size=block)
    assert r.query_lens.tolist() == [min(n, window) for n in lengths]

    def windows(newest_first=False, bounded=True, physical=True):  # the window rows under a rule variant
        out = torch.full_like(r.window_indices, -1)
        for i in range(r.position_ids.numel()):
            b, p = int(r.token_to_req_indices[i]), int(r.position_ids[i])
            first = max(int(r.replay_starts[b]), p - window + 1) if bounded else max(0, p - window + 1)
            rows = [int(table[b, q // block]) * block + q % block if physical else q for q in range(first, p + 1)]
            rows = rows[::-1] if newest_first else rows
            out[i, :len(rows)] = torch.tensor(rows, dtype=out.dtype)
        return out

    separates("MD-15 replay window rows", windows(), newest_first=windows(newest_first=True),
              not_bounded_by_the_replay_start=windows(bounded=False), logical_positions=windows(physical=False))
    for i in range(r.position_ids.numel()):
        b, p = int(r.token_to_req_indices[i]), int(r.position_ids[i])
        first = max(int(r.replay_starts[b]), p - window + 1)
        want = [int(table[b, q // block]) * block + q % block for q in range(first, p + 1)]
        got = r.window_indices[i].tolist()
        assert got[:len(want)] == want and all(v == -1 for v in got[len(want):]), f"replay row {i}"
        assert int(r.window_slots[i]) == int(paged_slots(torch.tensor([p]), torch.tensor([b]), table,
                                                         block_size=block)[0])


@pytest.mark.parametrize("edit, match", [
    (lambda a: {**a, "starts": torch.tensor([1, 3], dtype=torch.int32)}, "query_start_loc"),
    (lambda a: {**a, "starts": torch.tensor([0, 3, 2], dtype=torch.int32)}, r"query_start_loc\[2\]"),
    (lambda a: {**a, "positions": a["positions"][:-1]}, "position_ids"),
    (lambda a: {**a, "positions": a["positions"].flip(0)}, r"position_ids\[0\]"),
    (lambda a: {**a, "requests": torch.zeros_like(a["requests"])}, r"token_to_req_indices\[1\]"),
    (lambda a: {**a, "kv": torch.tensor([0, -1], dtype=torch.int32)}, r"kv_seq_lens\[1\]: expected >= 0"),
    (lambda a: {**a, "kv": torch.zeros(3, dtype=torch.int32)}, "kv_seq_lens: expected one cached prefix"),
    (lambda a: {**a, "kv": torch.tensor([0, 4], dtype=torch.int32)}, r"position_ids\[1\]: expected 4..5"),
    (lambda a: {**a, "table": a["table"][:1]}, "window_block_table"),
], ids=["start-not-0", "decreasing", "short-positions", "noncontiguous", "wrong-request", "negative-prefix",
        "prefix-count", "positions-ignore-prefix", "table-rows"])
@pytest.mark.operators("decoder_replay")
def test_bad_encoder_metadata_is_refused_naming_the_field(backend, edit, match):
    """Spec: MD-15."""
    starts, positions, requests, kv, table = _fresh([3, 2])
    a = edit({"starts": starts, "positions": positions, "requests": requests, "kv": kv, "table": table})
    with pytest.raises(ContractInputError, match=match):
        op(backend, "decoder_replay")(a["starts"], a["positions"], a["requests"], a["kv"], a["table"])
    with pytest.raises(ContractInputError, match="window"):
        op(backend, "decoder_replay")(starts, positions, requests, kv, table, window=0)


def test_a_prefill_context_validates_its_requests():
    """Lengths positive ints (bools refused), num_tokens <= capacity <= 4096, requests · ceil(longest / 128) <=
    32 pages plus one sentinel page per cache, precision fp32 or official. Spec: MD-21."""
    from kernels.prefill_plan import PrefillContext

    ctx = PrefillContext((5, 129, 1))
    assert ctx.num_tokens == 135 and ctx.capacity == 135 and ctx.pages_per_cache == 3 * 2 + 1
    assert PrefillContext((4096,), capacity=4096, precision="official").pages_per_cache == 33
    for kw, field in ((dict(lengths=()), "lengths"), (dict(lengths=(3, 0)), r"lengths\[1\]"),
                      (dict(lengths=(True,)), r"lengths\[0\]"), (dict(lengths=(2.0,)), r"lengths\[0\]"),
                      (dict(lengths=(10,), capacity=9), "capacity"), (dict(lengths=(10,), capacity=4097), "capacity"),
                      (dict(lengths=(10,), capacity=True), "capacity"), (dict(lengths=(129,) * 17), "pages"),
                      (dict(lengths=(10,), precision="bf16"), "precision")):
        with pytest.raises(ContractInputError, match=field):
            PrefillContext(**kw)
    assert PrefillContext((128,) * 32).pages_per_cache == 33


def test_a_prefill_state_validates_its_streams_and_mix():
    """x_hc 3-D or 4-D with last dims (4, hidden), pre_mix one rank lower with x_hc's leading shape, both FP32.
    Spec: MD-22."""
    from kernels.prefill_plan import PrefillState

    hc, d = FLASH.hc_mult, FLASH.hidden_size
    PrefillState(torch.zeros(3, hc, d), torch.zeros(3, hc))
    PrefillState(torch.zeros(2, 3, hc, d), torch.zeros(2, 3, hc))
    for x, m, field in ((torch.zeros(3, hc, d - 1), torch.zeros(3, hc), "x_hc"),
                        (torch.zeros(hc, d), torch.zeros(hc), "x_hc"),
                        (torch.zeros(3, hc, d), torch.zeros(3, hc, 1), "pre_mix"),
                        (torch.zeros(3, hc, d), torch.zeros(4, hc), "pre_mix"),
                        (torch.zeros(3, hc, d, dtype=torch.bfloat16), torch.zeros(3, hc), "x_hc"),
                        (torch.zeros(3, hc, d), torch.zeros(3, hc, dtype=torch.float64), "pre_mix")):
        with pytest.raises(ContractInputError, match=field):
            PrefillState(x, m)


@pytest.mark.operators("decoder_replay")
def test_replay_edges_and_dtypes(backend):
    """One request (window 1: only the last row replays, seeing itself), a zero-length request before a bad
    one (the error names the decreasing start, not the empty request), 1-D or short tables, 2-D positions, and
    the documented dtypes of every field. Spec: MD-15."""
    replay = op(backend, "decoder_replay")
    starts, positions, requests, kv, table = _fresh([5])
    r = replay(starts, positions, requests, kv, table, window=1, block_size=FLASH.block_size)
    assert r.query_lens.tolist() == [1] and r.position_ids.tolist() == [4] and r.window_lens.tolist() == [1]
    assert r.window_indices.shape == (1, 1) and r.logit_row_indices.tolist() == [0]
    for name in ("query_start_loc", "query_lens", "replay_starts", "position_ids", "token_to_req_indices",
                 "compressed_lens", "window_indices", "window_lens"):
        assert getattr(r, name).dtype == torch.int32, name
    assert r.source_rows.dtype == torch.int64 and r.window_slots.dtype == torch.int64
    s2, p2, q2, kv2, t2 = _fresh([0, 3, 2])
    bad = torch.tensor([0, 0, 3, 2], dtype=torch.int32)
    with pytest.raises(ContractInputError, match=r"query_start_loc\[3\]"):
        replay(bad, p2[:2], q2[:2], kv2, t2)
    with pytest.raises(ContractInputError, match="window_block_table"):
        replay(starts, positions, requests, kv, table[0])
    with pytest.raises(ContractInputError, match=r"position_ids: expected \[5\] \(the packed encoder rows\)"):
        replay(starts, positions.reshape(5, 1), requests, kv, table)


def test_engram_runs_before_layers_1_and_14_only():
    """Layers 1 and 14 need Engram hash ids for every token row; every other layer refuses them, naming the
    layer. Spec: HC-13, MD-23."""
    from kernels.prefill_plan import check_engram_inputs

    ids = torch.zeros(6, 4, dtype=torch.int64)
    assert check_engram_inputs(1, ids, 6) and check_engram_inputs(14, ids, 6)
    assert not check_engram_inputs(0, None, 6) and not check_engram_inputs(20, None, 6)
    for layer in (0, 2, 13, 15, 39):
        with pytest.raises(ContractInputError, match=rf"engram\[{layer}\]: expected no Engram inputs"):
            check_engram_inputs(layer, ids, 6)
    for bad in (None, ids[:5]):
        with pytest.raises(ContractInputError, match=r"engram\[14\]: expected hash ids for every one of the 6"):
            check_engram_inputs(14, bad, 6)


def _resumed(lengths, prefixes, *, block=4, seed=0):
    """Packed metadata of new rows after cached prefixes (positions continue each prefix)."""
    g = torch.Generator().manual_seed(seed)
    starts = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    positions = torch.cat([torch.arange(p, p + n) for n, p in zip(lengths, prefixes, strict=True)]).to(torch.int32)
    requests = torch.cat([torch.full((n,), b) for b, n in enumerate(lengths)]).to(torch.int32)
    pages = max(1, -(-max(n + p for n, p in zip(lengths, prefixes, strict=True)) // block))
    table = torch.randperm(len(lengths) * pages, generator=g).reshape(len(lengths), pages).to(torch.int32)
    return starts, positions, requests, torch.tensor(prefixes, dtype=torch.int32), table


@pytest.mark.operators("decoder_replay")
def test_a_resumed_request_replays_its_cached_tail_before_its_new_rows(backend):
    """Window 4. Request 0 fresh (2 new rows); request 1 resumes a prefix of 5 with 2 new rows: it replays
    min(5 + 2, 4) = 4 rows, the last 2 of its cached tail (cached rows 0-1) then its 2 new rows, positions
    3..6, replay start 3, window lens 1..4; request 2 resumes a prefix of 3 with no new row and replays nothing.
    Source rows index cached tails (3 rows; request 2's is not needed) then new rows: [3, 4] for request 0,
    [0, 1, 5, 6] for request 1.
    A replay that put new rows before cached ones, or counted only new rows, differs. Spec: MD-18."""
    starts, positions, requests, kv, table = _resumed([2, 2, 0], [0, 5, 3])
    tail = torch.tensor([0, 0, 2, 3], dtype=torch.int32)  # request 2's one cached row is not replayed
    r = op(backend, "decoder_replay")(starts, positions, requests, kv, table, window=4, block_size=4,
                                      cached_tail_starts=tail)
    assert r.source_rows.tolist() == [3, 4, 0, 1, 5, 6], f"source_rows {r.source_rows.tolist()}"
    new_rows, tail_rows = {0: [3, 4], 1: [5, 6]}, {1: [0, 1]}  # new rows follow the 3 cached tail rows
    as_rows = partial(torch.tensor, dtype=r.source_rows.dtype)
    separates("MD-18 a resumed request replays its cached tail first", as_rows(new_rows[0] + tail_rows[1] + new_rows[1]),
              new_rows_first=as_rows(new_rows[0] + new_rows[1] + tail_rows[1]),
              new_rows_only=as_rows(new_rows[0] + new_rows[1]))
    assert r.query_lens.tolist() == [2, 4, 0] and r.replay_starts.tolist() == [0, 3, 3]
    assert r.position_ids.tolist() == [0, 1, 3, 4, 5, 6] and r.window_lens.tolist() == [1, 2, 1, 2, 3, 4]
    assert r.logit_row_indices.tolist() == [1, 5, -1] and r.compressed_lens.tolist() == [1, 2, 4, 5, 6, 7]
    want = [int(table[1, q // 4]) * 4 + q % 4 for q in range(3, 7)]
    assert r.window_indices[5].tolist() == want and int(r.window_slots[5]) == want[-1]
    # a long new suffix needs no tail even after a prefix
    s2, p2, q2, kv2, t2 = _resumed([6], [9])
    r2 = op(backend, "decoder_replay")(s2, p2, q2, kv2, t2, window=4, block_size=4)
    assert r2.source_rows.tolist() == [2, 3, 4, 5] and r2.position_ids.tolist() == [11, 12, 13, 14]


@pytest.mark.operators("decoder_replay")
def test_a_cached_tail_longer_than_needed_gives_its_last_rows(backend):
    """A tail that reaches the rule: window 4, request 1 resumes a prefix of 5 with 1 new row, so it replays
    min(5 + 1, 4) = 4 rows of which 3 come from its cached tail -- and its tail holds 4 (at most min(prefix,
    window) is allowed). The replay takes the tail's last 3 rows (cached rows 1..3, the positions just before
    the new row), then the new row: source rows [4, 5, 1, 2, 3, 6] (request 0's 2 new rows first). Computed
    alternative: the tail's first 3 rows ([4, 5, 0, 1, 2, 6], positions one step too early). Spec: MD-17, MD-18."""
    starts, positions, requests, kv, table = _resumed([2, 1], [0, 5])
    tail = torch.tensor([0, 0, 4], dtype=torch.int32)
    r = op(backend, "decoder_replay")(starts, positions, requests, kv, table, window=4, block_size=4,
                                      cached_tail_starts=tail)
    as_rows = partial(torch.tensor, dtype=r.source_rows.dtype)
    want = separates("MD-18 a longer cached tail gives its last rows", as_rows([4, 5, 1, 2, 3, 6]),
                     first_tail_rows=as_rows([4, 5, 0, 1, 2, 6]))
    assert torch.equal(r.source_rows, want), f"source_rows {r.source_rows.tolist()}, expected {want.tolist()}"
    assert r.position_ids.tolist() == [0, 1, 2, 3, 4, 5] and r.query_lens.tolist() == [2, 4]


@pytest.mark.operators("decoder_replay")
def test_a_missing_or_oversized_cached_tail_is_refused_naming_the_request(backend):
    """Request 1 (prefix 5, 2 new rows, window 4) needs 2 tail rows: a tail of 1 row, or none at all, is
    refused ("needs encoder replay rows from its cached prefix"); a tail longer than min(prefix, window) is
    refused too ("at most"). Spec: MD-17."""
    starts, positions, requests, kv, table = _resumed([2, 2], [0, 5])
    replay = op(backend, "decoder_replay")
    for tail in (torch.tensor([0, 0, 1]), None):
        with pytest.raises(ContractInputError, match=r"cached encoder tail\[1\]: expected 2 rows: the request "
                                                     "needs encoder replay rows from its cached prefix"):
            replay(starts, positions, requests, kv, table, window=4, block_size=4, cached_tail_starts=tail)
    for tail, row in ((torch.tensor([0, 0, 5]), 1), (torch.tensor([0, 1, 3]), 0)):
        with pytest.raises(ContractInputError, match=rf"cached encoder tail\[{row}\]: expected at most"):
            replay(starts, positions, requests, kv, table, window=4, block_size=4, cached_tail_starts=tail)
    with pytest.raises(ContractInputError, match="cached tail query_start_loc"):
        replay(starts, positions, requests, kv, table, window=4, block_size=4,
               cached_tail_starts=torch.tensor([0, 2]))


@pytest.mark.operators("encoder_replay")
def test_the_encoder_replay_marks_only_new_rows_and_truncates_the_window(backend):
    """Window 4. Request 0 resumes a prefix of 6 (cached input rows 0..3 hold its last 4) with 1 new row;
    request 1 is fresh with 2 rows; request 2 resumes a prefix of 2 but has no new row (nothing replays).
    Replayed: request 0's 4 cached rows (positions 2..5, not new) then its new row (position 6); request 1's
    2 new rows. The window of the first replayed row holds only itself although older pages exist (window
    lens 1, 2, 3, 4, 4). Spec: MD-19."""
    starts, positions, requests, kv, table = _resumed([1, 2, 0], [6, 0, 2])
    cached = torch.tensor([0, 4, 4, 6], dtype=torch.int32)
    r = op(backend, "encoder_replay")(starts, positions, requests, kv, table, cached, window=4, block_size=4)
    assert r.source_rows.tolist() == [0, 1, 2, 3, 6, 7, 8], r.source_rows.tolist()
    assert r.is_new.tolist() == [False, False, False, False, True, True, True], f"is_new {r.is_new.tolist()}"
    assert r.new_rows.tolist() == [4, 5, 6] and r.cached_rows.tolist() == [0, 1, 2, 3]
    assert r.position_ids.tolist() == [2, 3, 4, 5, 6, 0, 1] and r.replay_starts.tolist() == [2, 0, 2]
    assert r.window_lens.tolist() == [1, 2, 3, 4, 4, 1, 2] and r.query_start_loc.tolist() == [0, 5, 7, 7]
    assert r.window_indices[0].tolist() == [int(table[0, 0]) * 4 + 2, -1, -1, -1]
    for name in ("query_start_loc", "position_ids", "token_to_req_indices", "replay_starts", "window_indices",
                 "window_lens"):
        assert getattr(r, name).dtype == torch.int32, name
    assert r.source_rows.dtype == torch.int64 and r.window_slots.dtype == torch.int64 and r.is_new.dtype == torch.bool
    with pytest.raises(ContractInputError, match=r"cached encoder input tail\[0\]: expected 4 rows"):
        op(backend, "encoder_replay")(starts, positions, requests, kv, table, torch.tensor([0, 3, 3, 3]),
                                      window=4, block_size=4)
    with pytest.raises(ContractInputError, match=r"cached encoder input tail\[2\]: expected at most"):
        op(backend, "encoder_replay")(starts, positions, requests, kv, table, torch.tensor([0, 4, 4, 7]),
                                      window=4, block_size=4)


def _state(rows, *, offset=0.0):
    """A PrefillState whose row r holds r + offset in every element (rows are traceable)."""
    from kernels.prefill_plan import PrefillState

    hc, d = FLASH.hc_mult, FLASH.hidden_size
    values = torch.arange(rows, dtype=torch.float32) + offset
    return PrefillState(values[:, None, None].expand(rows, hc, d).clone(), values[:, None].expand(rows, hc).clone())


def test_the_ced_runs_encoder_then_one_publication_then_the_decoder_on_the_replay_rows():
    """Recorded calls: encoder layers 0..19 in order on all 131 new rows; then exactly one publication, by
    layer 20, of the full final encoder stream; then decoder layers 20..39 in order on the replay rows only
    (min(len, 128) per request; a resumed request's cached tail rows first). The decoder's first input rows are
    the gathered cached-tail and new rows, in that order. Spec: MD-18, MD-20."""
    from kernels.prefill_plan import run_prefill_decoder, run_prefill_encoder

    calls = []

    def encoder_layer(layer, state):
        calls.append(("encoder", layer.layer_id, state.num_tokens))
        return state

    out = run_prefill_encoder(_state(131), torch.tensor([0, 131]), encoder_layer)
    assert calls == [("encoder", i, 131) for i in range(20)]
    calls.clear()
    seen = {}

    def publish(layer, state):
        calls.append(("publish", layer.layer_id, state.num_tokens))

    def decoder_layer(layer, state, replay):
        seen.setdefault("first", state.x_hc[:, 0, 0].tolist())
        calls.append(("decoder", layer.layer_id, state.num_tokens))
        return state

    starts, positions, requests, kv, table = _resumed([130, 1], [0, 200], block=128)
    tail = _state(128, offset=1000.0)
    state, replay = run_prefill_decoder(out, starts, positions, requests, kv, table, publish, decoder_layer,
                                        cached_tail=tail, cached_tail_starts=torch.tensor([0, 0, 128]))
    assert calls == [("publish", 20, 131)] + [("decoder", i, 256) for i in range(20, 40)]

    def coded(seq):  # a call list as a tensor: (kind, layer, rows)
        return torch.tensor([({"encoder": 0, "publish": 1, "decoder": 2}[k], n, t) for k, n, t in seq])

    decoder = [("decoder", i, 256) for i in range(20, 40)]
    separates("MD-20 one publication, then the decoder on the replay rows", coded([("publish", 20, 131)] + decoder),
              publication_per_decoder_layer=coded([c for i in range(20, 40) for c in (("publish", i, 131),
                                                                                      ("decoder", i, 256))]),
              publication_after_the_decoder=coded(decoder + [("publish", 20, 131)]),
              decoder_on_every_new_row=coded([("publish", 20, 131)] + [("decoder", i, 131) for i in range(20, 40)]))
    separates("MD-18 cached tail rows before the new row", torch.tensor([1000.0 + r for r in range(1, 128)] + [130.0]),
              new_row_first=torch.tensor([130.0] + [1000.0 + r for r in range(1, 128)]),
              first_tail_rows=torch.tensor([1000.0 + r for r in range(0, 127)] + [130.0]))
    assert seen["first"][:128] == list(range(2, 130)), "request 0 replays its last 128 new rows"
    assert seen["first"][128:] == [1000.0 + r for r in range(1, 128)] + [130.0], \
        "request 1 replays 127 cached tail rows then its one new row"
    assert replay.logit_row_indices.tolist() == [127, 255]


def test_the_ced_refuses_a_layer_that_changes_the_stream_and_an_empty_run():
    """A layer returning a different shape (or not a PrefillState) is refused naming the stage and layer; the
    encoder needs a row; the decoder needs a replay row; a tail state without its starts is refused; the state
    must cover query_start_loc[-1]. Spec: MD-20."""
    from kernels.prefill_plan import run_prefill_decoder, run_prefill_encoder

    def shrink(layer, state, *rest):
        return state.take_rows(torch.arange(state.num_tokens - 1)) if layer.layer_id in (7, 33) else state

    with pytest.raises(ContractInputError, match=r"encoder layer\[7\]: expected a PrefillState"):
        run_prefill_encoder(_state(3), torch.tensor([0, 3]), shrink)
    with pytest.raises(ContractInputError, match=r"encoder layer\[0\]"):
        run_prefill_encoder(_state(3), torch.tensor([0, 3]), lambda layer, state: None)
    with pytest.raises(ContractInputError, match="at least one active row for the encoder"):
        run_prefill_encoder(_state(0), torch.tensor([0, 0]), shrink)
    with pytest.raises(ContractInputError, match=r"x_hc: expected 4 rows"):
        run_prefill_encoder(_state(3), torch.tensor([0, 4]), shrink)
    starts, positions, requests, kv, table = _resumed([3], [0], block=128)
    with pytest.raises(ContractInputError, match=r"decoder layer\[33\]"):
        run_prefill_decoder(_state(3), starts, positions, requests, kv, table, lambda *a: None, shrink)
    empty = _resumed([0], [0], block=128)
    with pytest.raises(ContractInputError, match="at least one active row for the decoder"):
        run_prefill_decoder(_state(0), *empty, lambda *a: None, shrink)
    with pytest.raises(ContractInputError, match="cached_tail"):
        run_prefill_decoder(_state(3), starts, positions, requests, kv, table, lambda *a: None, shrink,
                            cached_tail=_state(1))


def test_decoder_attention_waits_for_the_publication_and_takes_fp32_rows():
    """Before layer 20 publishes (both caches), decoder attention is refused ("publish final encoder rows before
    decoder attention") while encoder attention runs; only layer 20 publishes; attention input is [T, D] FP32;
    in the fp32 path a BF16 cache is refused (AP-16) while the official path accepts it; Engram layers need hash
    ids. Spec: MD-23, AP-16."""
    from kernels.prefill_plan import CedProgress, PrefillContext

    d = FLASH.hidden_size
    x = torch.zeros(3, d)
    run = CedProgress(PrefillContext((3,)))
    run.check_attention(0, x, 3)
    with pytest.raises(ContractInputError, match="publish final encoder rows before decoder attention"):
        run.check_attention(20, x, 3)
    for layer, caches in ((19, (torch.zeros(1), torch.zeros(1))), (20, (torch.zeros(1), None)),
                          (20, (None, torch.zeros(1)))):
        with pytest.raises(ContractInputError, match="publish"):
            run.publish(layer, *caches)
    assert not run.published
    run.publish(20, torch.zeros(1), torch.zeros(1))
    run.check_attention(39, x, 3)
    for bad in (x.to(torch.bfloat16), torch.zeros(3, d - 1), torch.zeros(4, d)):
        with pytest.raises(ContractInputError, match=r"attention input\[39\]: expected normalized FP32 rows"):
            run.check_attention(39, bad, 3)
    with pytest.raises(ContractInputError, match=r"window cache\[2\]: expected float32"):
        run.check_attention(2, x, 3, caches={"window": torch.zeros(1, dtype=torch.bfloat16), "state": None})
    CedProgress(PrefillContext((3,), precision="official")).check_attention(
        2, x, 3, caches={"window": torch.zeros(1, dtype=torch.bfloat16)})
    with pytest.raises(ContractInputError, match="hash ids for every one of the 3 token rows"):
        run.check_attention(1, x, 3)
    run.check_attention(1, x, 3, hash_ids=torch.zeros(3, 2))


@pytest.mark.parametrize("name", ["multi_1k", "causal", "mixed", "long"])
def test_the_named_c1a_cases_hold_upstreams_rows(name):
    """Each named case's rows and lengths are upstream's (multi_1k: 3 requests at 1024; causal: 1..64 in one
    request; mixed: 1, 2, 3 | 127, 128 | 511, 512, 513; long: 1024, 4096, 8192), and every row's slot, window
    rows (the last min(len, 128), oldest first, then -1), compressed rows (the first min(len, 512)) and
    candidate mask equal an independent walk of the request-major block table. Spec: MD-31."""
    from kernels.prefill_plan import c1a_case

    want = {"multi_1k": ([0, 1, 2], [1024] * 3), "causal": ([0] * 64, list(range(1, 65))),
            "mixed": ([0, 0, 0, 1, 1, 2, 2, 2], [1, 2, 3, 127, 128, 511, 512, 513]),
            "long": ([0, 1, 2], [1024, 4096, 8192])}[name]
    case = c1a_case(name)
    assert (case.request_ids.tolist(), case.compressed_lens.tolist()) == want
    page, topk = FLASH.block_size, FLASH.index_topk
    pages = -(-max(want[1]) // page)
    assert case.block_table.tolist() == [[r * pages + p for p in range(pages)] for r in range(max(want[0]) + 1)]
    for t, (r, n) in enumerate(zip(*want, strict=True)):
        phys = [(r * pages + q // page) * page + q % page for q in range(n)]
        w = phys[max(0, n - page):]
        assert case.window_indices[t].tolist() == w + [-1] * (page - len(w)), f"window_indices row {t}"
        c = phys[:topk]
        assert case.compressed_indices[t].tolist() == c + [-1] * (topk - len(c)), f"compressed_indices row {t}"
        assert int(case.slots[t]) == phys[-1] and int(case.candidate_mask[t].sum()) == n == \
            int(case.candidate_mask[t, :n].sum()), f"row {t}"


def test_an_unknown_c1a_case_or_causal_length_is_refused():
    """An unknown name lists the four; causal takes 1..128 rows (bools refused). Spec: MD-31."""
    from kernels.prefill_plan import c1a_case

    assert c1a_case("causal", 1).compressed_lens.tolist() == [1]
    assert c1a_case("causal", 128).window_indices[127, -1].item() == 127
    with pytest.raises(ContractInputError, match=r"case: expected one of \('multi_1k', 'causal', 'mixed', "
                                                 r"'long'\), got 'multi_2k'"):
        c1a_case("multi_2k")
    for bad in (0, 129, True):
        with pytest.raises(ContractInputError, match=r"tokens: expected an int in \[1, 128\]"):
            c1a_case("causal", bad)


def test_only_the_last_capacity_rows_of_a_request_own_ring_slots():
    """Capacity 4, prompts of 3 and 10 rows: request 0's rows take slots 0, 1, 2; request 1's first 6 rows
    none (-1), its last 4 (positions 6..9) slots 4 + position % 4 = 6, 7, 4, 5 -- neither the first 4 rows nor
    the unwrapped position. At FLASH capacity a 129-row prompt gives its first row -1. Spec: CS-19."""
    from kernels.prefill_plan import ced_state_slots

    starts = torch.tensor([0, 3, 13])
    positions = torch.cat((torch.arange(3), torch.arange(10)))
    slots = ced_state_slots(starts, positions, state_capacity=4)
    assert slots.tolist() == [0, 1, 2] + [-1] * 6 + [6, 7, 4, 5], f"state slots {slots.tolist()}"
    assert slots.dtype == torch.int32
    cap = FLASH.state_capacity
    long = ced_state_slots(torch.tensor([0, cap + 1]), torch.arange(cap + 1))
    assert long[0].item() == -1 and long[1:].tolist() == [p % cap for p in range(1, cap + 1)]
    with pytest.raises(ContractInputError, match="position_ids"):
        ced_state_slots(starts, positions[:-1], state_capacity=4)


# defects of tests/defects these contracts must catch (shared with other contract files)
SEEDED_DEFECTS = [
    shared("prefill_plan:REPLAY_KEEPS_129", "test_upstreams_hand_checked_replay_vector", "[0, 1, 127, 128, 129]"),
    shared("prefill_plan:NEW_BEFORE_TAIL", "test_a_resumed_request_replays_its_cached_tail_before_its_new_rows", "[3, 4, 5, 6, 0, 1]"),
    SeededDefect("prefill-plan:first-tail-rows", "decoder_replay",
                 reference_edit("kernels.prefill_plan:decoder_replay",
                                "torch.arange(int(cached[b + 1]) - from_cache, int(cached[b + 1]))",
                                "torch.arange(int(cached[b]), int(cached[b]) + from_cache)"),
                 "test_a_cached_tail_longer_than_needed_gives_its_last_rows", "[4, 5, 0, 1, 2, 6]"),
    shared("prefill_plan:ALL_ROWS_NEW", "test_the_encoder_replay_marks_only_new_rows_and_truncates_the_window", "is_new"),
]
