"""V4-Flash dspark's CP prefill KV all-gather (``prefill_kv_allgather``): each rank's slab of a prefill chunk's rows
gathered in rank order onto every rank. Judged against the unsplit chunk: a KV sequence built whole here, cut into
the ranks' slabs, must come back whole on every rank, byte for byte. Its golden case and bad calls come from its
record (``kernels/v4/kv_allgather.py``, judged by contracts/test_records.py). Spec: §7.1, §8."""

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

pytestmark = pytest.mark.operators("prefill_kv_allgather")


def _chunk(rows: int, dim: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(-(2**15), 2**15, (rows, dim), generator=g, dtype=torch.int16).view(torch.bfloat16)


@given(tp=st.sampled_from([1, 2, 4]), local_t=st.integers(1, 9), dim=st.integers(1, 6),
       seed=st.integers(0, 2**31))
def test_every_rank_holds_the_unsplit_chunk(backend, tp, local_t, dim, seed):
    """Any TP world upstream compiles, any rows per rank, any BF16 bytes (NaN payloads and -0 included): rank r's
    output is the whole chunk, the slabs in rank order, byte for byte, [tp, tp * local_t, D] BF16."""
    whole = _chunk(tp * local_t, dim, seed)
    out = op(backend, "prefill_kv_allgather")(whole.reshape(tp, local_t, dim).clone())
    assert out.dtype == torch.bfloat16 and tuple(out.shape) == (tp, tp * local_t, dim), \
        f"group_out {out.dtype}{list(out.shape)}, expected bfloat16[{tp}, {tp * local_t}, {dim}] (§7.1)"
    for r in range(tp):
        bad = (byte_rows(out[r]) != byte_rows(whole)).any(1)
        assert not bool(bad.any()), f"rank {r}: group_out row {int(bad.nonzero()[0])} is not the unsplit chunk's " \
                                    f"row (rank {int(bad.nonzero()[0]) // local_t}'s slab, row " \
                                    f"{int(bad.nonzero()[0]) % local_t}; tp {tp}; §7.1)"


def test_a_hand_gather_separates_rank_order_from_token_order(backend):
    """TP 2, 3 rows per rank, rows numbered by their token: (0 1 2 | 3 4 5) is separated from a token-major
    interleave (0 3 1 4 2 5), from the ranks reversed (3 4 5 0 1 2) and from each rank keeping its own slab only."""
    whole = torch.arange(6, dtype=torch.bfloat16).reshape(6, 1)
    local = whole.reshape(2, 3, 1)
    want = whole.reshape(-1)
    separates("rank-major concatenation", want, token_major=local.transpose(0, 1).reshape(-1),
              ranks_reversed=local.flip(0).reshape(-1), own_slab_twice=torch.cat((local[0], local[0])).reshape(-1))
    out = op(backend, "prefill_kv_allgather")(local.clone())
    for r in range(2):
        assert torch.equal(out[r].reshape(-1), want), f"rank {r}: {out[r].reshape(-1).tolist()}, expected " \
                                                      f"{want.tolist()} (rank-major)"


@pytest.mark.parametrize("case,rows,field", [
    ("3 ranks", torch.zeros(3, 2, 4, dtype=torch.bfloat16), "hidden_local"),
    ("8 ranks", torch.zeros(8, 2, 4, dtype=torch.bfloat16), "hidden_local"),
    ("no rows", torch.zeros(2, 0, 4, dtype=torch.bfloat16), "hidden_local"),
    ("past the group window", torch.zeros(4, 2049, 1, dtype=torch.bfloat16), "hidden_local"),
    ("one rank past the group window", torch.zeros(1, 8193, 1, dtype=torch.bfloat16), "hidden_local"),
    ("FP32", torch.zeros(2, 2, 4), "hidden_local"),
    ("2-D", torch.zeros(4, 4, dtype=torch.bfloat16), "hidden_local"),
    ("zero width", torch.zeros(2, 2, 0, dtype=torch.bfloat16), "hidden_local")], ids=lambda v: v if isinstance(v, str) else "")
def test_a_malformed_gather_is_refused(backend, case, rows, field):
    """A world upstream does not compile (1, 2, 4), no rows, more than the 8192-row group window, another dtype or
    rank: refused naming the rows."""
    with pytest.raises(ContractInputError) as exc:
        op(backend, "prefill_kv_allgather")(rows)
    assert exc.value.field == field, f"{case}: refused naming {exc.value.field!r}: {exc.value}"


def test_the_full_group_window_is_accepted(backend):
    """4 ranks of 2048 rows fill the 8192-row window exactly: accepted (the bound is inclusive)."""
    try:
        out = op(backend, "prefill_kv_allgather")(torch.ones(4, 2048, 1, dtype=torch.bfloat16))
    except ContractInputError as exc:
        pytest.fail(f"refused a full group window: {exc}")
    assert tuple(out.shape) == (4, 8192, 1)


def _token_major(hidden_local):
    tp, local_t, d = hidden_local.shape
    return hidden_local.transpose(0, 1).reshape(1, tp * local_t, d).expand(tp, -1, -1).contiguous()


def _own_rank_first(hidden_local):
    """Each rank puts its own slab first (a ring gather that never rotates back)."""
    tp = hidden_local.shape[0]
    return torch.stack([torch.cat([hidden_local[(r + k) % tp] for k in range(tp)]) for r in range(tp)])


def _exclusive_cap(hidden_local):
    if hidden_local.shape[0] * hidden_local.shape[1] >= 8192:
        raise ContractInputError("hidden_local", None, "fewer rows than the window", hidden_local.shape[1], "§7.1")
    from kernels.v4.kv_allgather import prefill_kv_allgather

    return prefill_kv_allgather(hidden_local)


def _unchecked(hidden_local):
    tp, local_t, d = hidden_local.reshape(hidden_local.shape[0], -1, hidden_local.shape[-1]).shape
    return hidden_local.reshape(1, tp * local_t, d).expand(tp, -1, -1).contiguous()


SEEDED_DEFECTS = [
    SeededDefect("kv-allgather:token-major", "prefill_kv_allgather", _token_major,
                 "test_every_rank_holds_the_unsplit_chunk", "is not the unsplit chunk"),
    SeededDefect("kv-allgather:own-rank-first", "prefill_kv_allgather", _own_rank_first,
                 "test_a_hand_gather_separates_rank_order_from_token_order", "rank 1"),
    SeededDefect("kv-allgather:exclusive-cap", "prefill_kv_allgather", _exclusive_cap,
                 "test_the_full_group_window_is_accepted", "refused a full group window"),
    SeededDefect("kv-allgather:no-checks", "prefill_kv_allgather", _unchecked,
                 "test_a_malformed_gather_is_refused", "DID NOT RAISE"),
]
