"""V4-Flash's context-parallel prefill: the zigzag ownership of a chunk (``cp_zigzag_plan``) and the exchange of the
segments' KV tails (``cp_zigzag_tail_exchange``). Judged against the unsplit prefill: a KV sequence built whole in
the test, cut into the ranks' tails here, must come back as the whole sequence's segment tails and its last rows;
every token on exactly one rank; the zigzag pairing gives every rank the same causal work. The tail exchange's
golden case and bad calls come from its record (``kernels/v4/cp_zigzag.py``). Spec: §7.1, §8."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from contracts.separation import separates
from contracts.tensors import byte_rows
from kernels.errors import ContractInputError
from pto_pytest.defect import SeededDefect
from pto_pytest.plugin import op

CP = st.sampled_from([2, 4, 8])


def _plan(backend):
    return op(backend, "cp_zigzag_plan")


def _exchange(backend):
    return op(backend, "cp_zigzag_tail_exchange")


def _zigzag_owner(s: int, cp: int) -> tuple[int, int]:
    """Written from the rule: the front half of the segments in rank order, the back half in reverse rank order."""
    return (s, 0) if s < cp else (2 * cp - 1 - s, 1)


@pytest.mark.operators("cp_zigzag_plan")
@given(cp=CP, span=st.integers(1, 40), fill=st.floats(0.0, 1.0), prefix=st.integers(0, 5000))
def test_every_token_is_on_exactly_one_rank(backend, cp, span, fill, prefix):
    """Any chunk of 1 .. 2cp*span tokens after any prefix: the segments cover the chunk's positions once each, in
    order, each owned by one (rank, part), each rank owning exactly one part-0 and one part-1 segment, and the
    rank-major place of segment s is 2 * owner + part."""
    num_tokens = max(1, round(fill * 2 * cp * span))
    plan = _plan(backend)(num_tokens, cp, span, prefix=prefix)
    starts, lens = plan["segment_starts"].tolist(), plan["segment_lens"].tolist()
    covered = [p for s in range(2 * cp) for p in range(starts[s], starts[s] + lens[s])]
    assert covered == list(range(prefix, prefix + num_tokens)), \
        f"the segments cover {len(covered)} positions, not exactly {prefix} .. {prefix + num_tokens - 1} once in " \
        f"order (starts {starts}, lens {lens}; §7.1)"
    for name, t in plan.items():
        assert t.dtype == torch.int32 and tuple(t.shape) == (2 * cp,), \
            f"{name}: {t.dtype}{list(t.shape)}, expected int32[{2 * cp}] (the tables upstream's kernels read)"
    owners = list(zip(plan["owner_rank"].tolist(), plan["owner_part"].tolist(), strict=True))
    assert sorted(owners) == [(r, p) for r in range(cp) for p in (0, 1)], \
        f"each rank must own one part-0 and one part-1 segment: {owners}"
    for s in range(2 * cp):
        assert owners[s] == _zigzag_owner(s, cp), f"segment {s} owned by {owners[s]}, expected " \
                                                  f"{_zigzag_owner(s, cp)} (zigzag, cp {cp})"
        assert plan["reverse_index"][s] == 2 * owners[s][0] + owners[s][1], \
            f"reverse_index[{s}] = {int(plan['reverse_index'][s])}, expected 2 * rank + part"


def _causal_work(starts, lens, owners, cp) -> list[int]:
    """Per rank: the keys its query rows attend causally (position + 1 each), from the plan."""
    work = [0] * cp
    for s, (r, _p) in enumerate(owners):
        work[r] += sum(p + 1 for p in range(starts[s], starts[s] + lens[s]))
    return work


@pytest.mark.operators("cp_zigzag_plan")
@given(cp=CP, span=st.integers(1, 64), prefix=st.integers(0, 5000))
def test_the_zigzag_pairing_balances_causal_work(backend, cp, span, prefix):
    """A full chunk (2cp*span tokens): every rank attends the same number of causal keys (segments k and 2cp-1-k
    together), where the contiguous split (rank r: segments 2r, 2r+1) does not."""
    plan = _plan(backend)(2 * cp * span, cp, span, prefix=prefix)
    owners = list(zip(plan["owner_rank"].tolist(), plan["owner_part"].tolist(), strict=True))
    work = _causal_work(plan["segment_starts"].tolist(), plan["segment_lens"].tolist(), owners, cp)
    assert len(set(work)) == 1, f"causal keys per rank {work}: the zigzag pairing balances them (§7.1)"
    contiguous = _causal_work(plan["segment_starts"].tolist(), plan["segment_lens"].tolist(),
                              [(s // 2, s % 2) for s in range(2 * cp)], cp)
    assert len(set(contiguous)) > 1, f"the contiguous split gives {contiguous}: the check would not separate it"


@pytest.mark.operators("cp_zigzag_plan")
def test_a_hand_plan_separates_the_zigzag_from_its_neighbours(backend):
    """CP 4, 8 segments: owners (0,1,2,3,3,2,1,0) are separated from the contiguous split, from round robin, and
    from the mirror pairing that gives segment s >= cp to rank s - cp."""
    plan = _plan(backend)(8 * 4, 4, 4)
    want = torch.tensor([0, 1, 2, 3, 3, 2, 1, 0], dtype=torch.int32)
    separates("zigzag owner ranks", want, contiguous=torch.arange(8, dtype=torch.int32) // 2,
              round_robin=torch.arange(8, dtype=torch.int32) % 4,
              shifted_pairing=torch.tensor([0, 1, 2, 3, 0, 1, 2, 3], dtype=torch.int32))
    assert torch.equal(plan["owner_rank"], want), f"owner ranks {plan['owner_rank'].tolist()}, expected " \
                                                  f"{want.tolist()} (zigzag)"
    assert plan["reverse_index"].tolist() == [0, 2, 4, 6, 7, 5, 3, 1], plan["reverse_index"].tolist()
    assert plan["segment_starts"].tolist() == [0, 4, 8, 12, 16, 20, 24, 28], \
        f"segment_starts {plan['segment_starts'].tolist()}: without a prefix the chunk starts at position 0"


@pytest.mark.operators("cp_zigzag_plan")
@pytest.mark.parametrize("call,field", [
    ((10, 3, 4), "cp"), ((0, 2, 4), "num_tokens"), ((17, 2, 4), "num_tokens"), ((4, 2, 0), "span"),
    ((4, 2, 4, -1), "prefix"), ((4.0, 2, 4), "num_tokens")], ids=lambda v: str(v))
def test_a_plan_that_cannot_be_built_is_refused(backend, call, field):
    """A CP world upstream does not compile (2, 4, 8), an empty or overfull chunk, a zero span, a negative prefix,
    a non-integer count: refused naming the argument."""
    *args, = call
    kwargs = {"prefix": args.pop()} if len(args) == 4 else {}
    with pytest.raises(ContractInputError) as exc:
        _plan(backend)(*args, **kwargs)
    assert exc.value.field == field, f"refused naming {exc.value.field!r}, not {field!r}: {exc.value}"


# --- the tail exchange ---------------------------------------------------------------------------------------

def _unsplit(total: int, dim: int, seed: int) -> torch.Tensor:
    """The whole chunk's KV rows as one prefill writes them (distinct BF16 rows)."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(-(2**15), 2**15, (total, dim), generator=g, dtype=torch.int16).view(torch.bfloat16)


def _local_tails(kv: torch.Tensor, lens: list[int], cp: int, tail: int, seed: int) -> torch.Tensor:
    """Each rank's two tail blocks cut from the unsplit rows: the last ``tail`` rows of each segment it owns (a
    short segment's rows first in its block); the unused rows hold noise a read would show."""
    g = torch.Generator().manual_seed(seed + 1)
    out = torch.randint(-(2**15), 2**15, (cp, 2 * tail, kv.shape[1]), generator=g, dtype=torch.int16).view(
        torch.bfloat16).clone()
    start = 0
    for s, n in enumerate(lens):
        r, part = _zigzag_owner(s, len(lens) // 2)
        rows = kv[start + max(0, n - tail):start + n]
        out[r, part * tail:part * tail + rows.shape[0]] = rows
        start += n
    return out


@st.composite
def _chunks(draw):
    cp = draw(CP, label="cp")
    tail = draw(st.integers(1, 6), label="tail")
    nonempty = draw(st.integers(1, 2 * cp), label="non-empty segments")
    lens = [draw(st.integers(1, 3 * tail), label=f"len {s}") for s in range(nonempty)] + [0] * (2 * cp - nonempty)
    return cp, tail, lens, draw(st.integers(1, 5), label="D"), draw(st.integers(0, 2**31), label="seed")


@pytest.mark.operators("cp_zigzag_tail_exchange")
@given(chunk=_chunks())
def test_the_exchanged_tails_are_the_unsplit_prefills(backend, chunk):
    """Any segment lengths (longer or shorter than the tail, trailing empty segments), any CP world: on every rank,
    logical block s holds the unsplit chunk's last min(len, tail) rows of segment s, and the decode window holds the
    chunk's last ``tail`` rows (0 before the chunk), byte for byte, however the window straddles segments and
    ranks."""
    cp, tail, lens, dim, seed = chunk
    kv = _unsplit(sum(lens), dim, seed)
    out = _exchange(backend)(_local_tails(kv, lens, cp, tail, seed), torch.tensor(lens, dtype=torch.int32))
    logical, window = out["logical_tails"], out["decode_window"]
    assert tuple(logical.shape) == (cp, 2 * cp * tail, dim) and tuple(window.shape) == (cp, tail, dim), \
        f"logical_tails {list(logical.shape)}, decode_window {list(window.shape)} (cp {cp}, tail {tail}, D {dim})"
    start = 0
    for s, n in enumerate(lens):
        want = kv[start + max(0, n - tail):start + n]
        for r in range(cp):
            got = logical[r, s * tail:s * tail + want.shape[0]]
            bad = (byte_rows(got) != byte_rows(want)).any(1)
            assert not bool(bad.any()), \
                f"rank {r}: logical block {s} row {int(bad.nonzero()[0])} is not the unsplit chunk's position " \
                f"{start + max(0, n - tail) + int(bad.nonzero()[0])} (segment {s} of lens {lens}; §7.1)"
        start += n
    total = sum(lens)
    want = torch.cat((torch.zeros(max(0, tail - total), dim, dtype=torch.bfloat16), kv[max(0, total - tail):]))
    for r in range(cp):
        bad = (byte_rows(window[r]) != byte_rows(want)).any(1)
        assert not bool(bad.any()), \
            f"rank {r}: decode_window row {int(bad.nonzero()[0])} is not position " \
            f"{total - tail + int(bad.nonzero()[0])} of the unsplit chunk (lens {lens}, tail {tail}; §7.1)"


@pytest.mark.operators("cp_zigzag_tail_exchange")
def test_a_hand_exchange_separates_the_order_and_the_window_rows(backend):
    """CP 2, tail 2, lens (2, 2, 2, 1), one-column rows numbered by position: the logical order (0 1 | 2 3 | 4 5 |
    6 x) and the window (5, 6) are separated from reading the blocks rank-major, from the part order swapped, and
    from a window taken from the last block's first rows."""
    lens, tail = [2, 2, 2, 1], 2
    kv = torch.arange(7, dtype=torch.bfloat16).reshape(7, 1) + 1
    local = _local_tails(kv, lens, 2, tail, 0)
    local[0, 3] = -9  # segment 3's unused row
    out = _exchange(backend)(local, torch.tensor(lens, dtype=torch.int32))
    want = torch.tensor([1, 2, 3, 4, 5, 6, 7, -9], dtype=torch.bfloat16)
    rank_major = local.reshape(-1)
    part_swapped = torch.cat([local[_zigzag_owner(s, 2)[0], (1 - _zigzag_owner(s, 2)[1]) * tail:][:tail].reshape(-1)
                              for s in range(4)])
    separates("logical segment order", want, rank_major=rank_major, parts_swapped=part_swapped)
    assert torch.equal(out["logical_tails"][1].reshape(-1), want), \
        f"rank 1 logical_tails {out['logical_tails'][1].reshape(-1).tolist()}, expected {want.tolist()}"
    window = torch.tensor([6, 7], dtype=torch.bfloat16)
    separates("the chunk's last rows", window, last_block_first_rows=torch.tensor([7, -9], dtype=torch.bfloat16),
              last_two_blocks_last_rows=torch.tensor([6, -9], dtype=torch.bfloat16))
    assert torch.equal(out["decode_window"][0].reshape(-1), window), \
        f"rank 0 decode_window {out['decode_window'][0].reshape(-1).tolist()}, expected {window.tolist()}"


@pytest.mark.operators("cp_zigzag_tail_exchange")
def test_a_chunk_shorter_than_the_tail_leaves_the_windows_head_zero(backend):
    """One token in a tail of 3 (every rank's rows noise): the window is (0, 0, the token), separated from a window
    filled from the front and from one that reads a row of the block before the chunk."""
    local = torch.full((2, 6, 1), 5.0, dtype=torch.bfloat16)
    local[0, 0, 0] = 7.0  # segment 0's only token
    out = _exchange(backend)(local, torch.tensor([1, 0, 0, 0], dtype=torch.int32))
    want = torch.tensor([0.0, 0.0, 7.0], dtype=torch.bfloat16)
    separates("the token last, zeros before", want, filled_from_the_front=torch.tensor([7.0, 0, 0]).bfloat16(),
              noise_before=torch.tensor([5.0, 5.0, 7.0]).bfloat16())
    for r in range(2):
        got = out["decode_window"][r].reshape(-1)
        assert torch.equal(got, want), f"rank {r}: decode_window {got.tolist()}, expected {want.tolist()} (a row " \
                                       "before the chunk is never written; §7.1)"


@pytest.mark.operators("cp_zigzag_tail_exchange")
@pytest.mark.parametrize("case", ["3 ranks", "FP32", "odd rows", "zero rows", "zero width", "lens per rank",
                                  "negative", "gap", "empty"])
def test_a_malformed_exchange_is_refused_naming_its_field(backend, case):
    """A world upstream does not compile, tails of another dtype or an odd row count, a length per rank instead of
    per segment, a negative length, an empty segment before a non-empty one, no token at all."""
    tails = torch.zeros(2, 4, 3, dtype=torch.bfloat16)
    lens = torch.tensor([2, 2, 1, 0], dtype=torch.int32)
    call, field = {"3 ranks": ((torch.zeros(3, 4, 3, dtype=torch.bfloat16), torch.ones(6, dtype=torch.int32)), "cp"),
                   "FP32": ((tails.float(), lens), "local_kv_tail"),
                   "odd rows": ((tails[:, :3], lens), "local_kv_tail"),
                   "zero rows": ((tails[:, :0], lens), "local_kv_tail"),
                   "zero width": ((tails[:, :, :0], lens), "local_kv_tail"),
                   "lens per rank": ((tails, lens[:2]), "segment_lens"),
                   "negative": ((tails, torch.tensor([2, -1, 0, 0])), "segment_lens"),
                   "gap": ((tails, torch.tensor([2, 0, 1, 0])), "segment_lens"),
                   "empty": ((tails, torch.zeros(4, dtype=torch.int32)), "segment_lens")}[case]
    with pytest.raises(ContractInputError) as exc:
        _exchange(backend)(*call)
    assert exc.value.field == field, f"{case}: refused naming {exc.value.field!r}, not {field!r}: {exc.value}"



# --- seeded defects ------------------------------------------------------------------------------------------

def _contiguous_plan(num_tokens, cp, span, *, prefix=0):
    from kernels.v4.cp_zigzag import cp_zigzag_plan

    plan = dict(cp_zigzag_plan(num_tokens, cp, span, prefix=prefix))
    plan["owner_rank"] = torch.arange(2 * cp, dtype=torch.int32) // 2
    plan["owner_part"] = torch.arange(2 * cp, dtype=torch.int32) % 2
    plan["reverse_index"] = torch.arange(2 * cp, dtype=torch.int32)
    return plan


def _unclamped_plan(num_tokens, cp, span, *, prefix=0):
    from kernels.v4.cp_zigzag import cp_zigzag_plan

    plan = dict(cp_zigzag_plan(num_tokens, cp, span, prefix=prefix))
    plan["segment_lens"] = torch.full((2 * cp,), span, dtype=torch.int32)
    return plan


def _rank_major(local_kv_tail, segment_lens):
    from kernels.v4.cp_zigzag import cp_zigzag_tail_exchange

    out = dict(cp_zigzag_tail_exchange(local_kv_tail, segment_lens))
    cp = local_kv_tail.shape[0]
    out["logical_tails"] = local_kv_tail.reshape(1, -1, local_kv_tail.shape[2]).expand(cp, -1, -1).contiguous()
    return out


def _window_from_last_block(local_kv_tail, segment_lens):
    from kernels.v4.cp_zigzag import cp_zigzag_tail_exchange

    out = dict(cp_zigzag_tail_exchange(local_kv_tail, segment_lens))
    tail = local_kv_tail.shape[1] // 2
    last = max(s for s, n in enumerate(segment_lens.tolist()) if n)
    out["decode_window"] = out["logical_tails"][:, last * tail:(last + 1) * tail].contiguous()
    return out


SEEDED_DEFECTS = [
    SeededDefect("cp-zigzag:contiguous-owners", "cp_zigzag_plan", _contiguous_plan,
                 "test_every_token_is_on_exactly_one_rank", "zigzag"),
    SeededDefect("cp-zigzag:unclamped-lengths", "cp_zigzag_plan", _unclamped_plan,
                 "test_every_token_is_on_exactly_one_rank", "once in order"),
    SeededDefect("cp-zigzag:rank-major-tails", "cp_zigzag_tail_exchange", _rank_major,
                 "test_the_exchanged_tails_are_the_unsplit_prefills", "logical block"),
    SeededDefect("cp-zigzag:window-from-last-block", "cp_zigzag_tail_exchange", _window_from_last_block,
                 "test_the_exchanged_tails_are_the_unsplit_prefills", "decode_window"),
]


@pytest.mark.operators("cp_zigzag_tail_exchange")
@pytest.mark.parametrize("cp", [2, 4])
def test_tails_that_carry_their_positions_come_back_in_position_order(backend, cp):
    """2cp full segments of a tail of 4 rows whose rows carry their positions (column 1 pos // 4, column 2 pos % 4:
    upstream's exchange fixture, so its golden is judged on it): on every rank, logical row k carries position k and
    the decode window the chunk's last 4 positions. Separated from reading the blocks rank-major and from each
    rank's two parts swapped. Spec: §7.1."""
    from kernels.v4.cp_zigzag import position_markers

    tail, dim = 4, 4
    local = position_markers(cp, tail, dim)
    assert sorted(int(v) for v in (local[:, :, 1] * tail + local[:, :, 2]).flatten()) == list(range(2 * cp * tail)), \
        "the fixture does not hold every position once"
    out = _exchange(backend)(local, torch.full((2 * cp,), tail, dtype=torch.int32))
    pos = torch.arange(2 * cp * tail)
    want = torch.zeros(2 * cp * tail, dim, dtype=torch.bfloat16)
    want[:, 1], want[:, 2] = (pos // tail).to(torch.bfloat16), (pos % tail).to(torch.bfloat16)
    swapped = torch.cat([local[r, (1 - p) * tail:][:tail] for r, p in
                         (_zigzag_owner(s, cp) for s in range(2 * cp))])
    separates("the logical order of positions", want, rank_major=local.reshape(-1, dim), parts_swapped=swapped)
    for r in range(cp):
        bad = (byte_rows(out["logical_tails"][r]) != byte_rows(want)).any(1)
        assert not bool(bad.any()), f"rank {r}: logical row {int(bad.nonzero()[0])} does not carry position " \
                                    f"{int(bad.nonzero()[0])} (cp {cp}; §7.1)"
        bad = (byte_rows(out["decode_window"][r]) != byte_rows(want[-tail:])).any(1)
        assert not bool(bad.any()), f"rank {r}: decode_window row {int(bad.nonzero()[0])} does not carry position " \
                                    f"{2 * cp * tail - tail + int(bad.nonzero()[0])} (cp {cp}; §7.1)"
