"""The CED prefill plan and the decoder replay selection (``decoder_replay``): which layers run as the
encoder and which as the decoder (layer 20 the only global publisher), the causal encoder's layer ids, and
the rows the decoder replays -- upstream's hand-checked vector (0, 1, 127, 128, 129), window metadata equal to
independently computed paged slots, and bad encoder metadata refused naming the field.

Spec: §1, §3; upstream_checks SC-19, SC-20, SC-21, MD-15, MD-16.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import pytest
import torch

from contracts.plugin import op
from kernels.config import FLASH
from kernels.errors import ContractInputError
from kernels.metadata import paged_slots
from kernels.prefill_plan import causal_encoder_layer, prefill_layer_plan


def test_the_ced_plan_puts_layers_0_to_19_in_the_encoder_and_20_to_39_in_the_decoder():
    """Encoder: prefill SWA x2, C2A FULL x3, C2A REUSE x15; decoder: C1A seeded (FULL) x1, REINDEX x4, REUSE x15;
    layer 20 is the only global publisher. Spec: SC-19, SC-20."""
    plan = prefill_layer_plan(FLASH)
    assert [p.stage for p in plan] == ["encoder"] * 20 + ["decoder"] * 20
    assert Counter(p.entry for p in plan) == {"prefill_swa": 2, "prefill_c2a_full": 3, "prefill_c2a_reuse": 15,
                                              "prefill_c1a_seeded": 1, "prefill_c1a_reindex": 4,
                                              "prefill_c1a_reuse": 15}
    assert [p.layer_id for p in plan if p.publishes_global] == [20] and plan[20].entry == "prefill_c1a_seeded"


def test_a_schedule_the_ced_plan_cannot_run_is_refused_naming_the_layer():
    """A ratio-1 layer before layer 20 (or a ratio-2 layer after it) has no CED entry. Spec: SC-19."""
    ratios = list(FLASH.compress_ratios)
    ratios[19] = 1
    bad = replace(FLASH, compress_ratios=tuple(ratios), kv_source_layer_ids=(2, 8, 14, 19, 20),
                  index_source_layer_ids=(2, 8, 14, 19, 20, 24, 28, 32, 36))
    with pytest.raises(ContractInputError, match=r"layer_id\[19\]: expected an encoder layer"):
        prefill_layer_plan(bad)


def test_the_causal_encoder_takes_layers_0_to_19_only():
    """Spec: SC-21."""
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


def test_replay_window_metadata_equals_independent_paged_slots(backend):
    """Every replay row's window slots and visible rows are the window block table's physical rows of the
    request's positions from max(replay start, pos - window + 1) to pos, oldest first, then -1. Spec: MD-15."""
    lengths = [5, 40, 131, 17]
    window, block = 16, 8
    starts, positions, requests, kv, table = _fresh(lengths, seed=3, block=block)
    r = op(backend, "decoder_replay")(starts, positions, requests, kv, table, window=window, block_size=block)
    assert r.query_lens.tolist() == [min(n, window) for n in lengths]
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
    (lambda a: {**a, "kv": torch.tensor([0, 4], dtype=torch.int32)}, "kv_seq_lens"),
    (lambda a: {**a, "table": a["table"][:1]}, "window_block_table"),
], ids=["start-not-0", "decreasing", "short-positions", "noncontiguous", "wrong-request", "cached-prefix",
        "table-rows"])
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
