"""V4's input pack (``v4_embed_pack``): clamped ids, the BF16 row widened exactly, the same row in every
stream, bad calls refused by name. Spec: §8."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from contracts.separation import separates
from kernels.config import V4_FLASH_TINY, V4_PRO_TINY
from kernels.errors import ContractInputError
from pto_pytest.defect import SeededDefect
from pto_pytest.plugin import op

pytestmark = pytest.mark.operators("v4_embed_pack")  # every contract here calls it, and only it

MODELS = [V4_PRO_TINY.kernel_preset(), V4_FLASH_TINY.kernel_preset()]
VOCAB = 24


def _table(config, vocab: int = VOCAB, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(vocab, config.hidden_size, generator=g) * 3).to(torch.bfloat16)


@pytest.mark.parametrize("config", MODELS, ids=lambda c: c.name)
def test_ids_are_clamped_into_the_vocabulary_never_wrapped(backend, config):
    """Upstream's fixture ids: -1 and 0 read row 0, vocab - 1, vocab and vocab + 7 read the last row. The rule is
    separated from ids taken modulo the vocabulary and from negative ids read from the end."""
    ids = torch.tensor([-1, 0, 17, VOCAB - 1, VOCAB, VOCAB + 7, 2, 1], dtype=torch.int64)
    table = _table(config)
    got = op(backend, "v4_embed_pack")(ids, table, config=config)
    rows = ids.clamp(0, VOCAB - 1)
    want = table[rows].float().unsqueeze(1).expand(-1, config.hc_mult, -1)
    separates("clamped ids", want,
              ids_modulo_the_vocabulary=table[ids % VOCAB].float().unsqueeze(1).expand(-1, config.hc_mult, -1),
              negative_ids_from_the_end=table[torch.where(ids < 0, ids + VOCAB, ids).clamp(max=VOCAB - 1)].float()
              .unsqueeze(1).expand(-1, config.hc_mult, -1))
    assert got.dtype == torch.float32 and tuple(got.shape) == (8, config.hc_mult, config.hidden_size), \
        f"x_hc: {got.dtype}{list(got.shape)}, expected float32[8, {config.hc_mult}, {config.hidden_size}]"
    bad = (got != want).any(-1)
    if bool(bad.any()):
        t, c = (int(v) for v in bad.nonzero()[0])
        pytest.fail(f"x_hc[{t}][{c}] (id {int(ids[t])}) is not row {int(rows[t])} of the table (§8: ids clamp into "
                    f"[0, {VOCAB - 1}])")


@given(data=st.data())
def test_every_stream_holds_the_row_widened_exactly(backend, data):
    """Any ids, any table of BF16 values (subnormals, infinities and NaN included): each stream is the id's row,
    bit for bit after the exact BF16 -> FP32 widening."""
    config = data.draw(st.sampled_from(MODELS), label="config")
    vocab = data.draw(st.integers(1, 40), label="vocab")
    ids = torch.tensor(data.draw(st.lists(st.integers(-50, 90), min_size=0, max_size=12), label="ids"),
                       dtype=data.draw(st.sampled_from([torch.int32, torch.int64]), label="ids dtype"))
    g = torch.Generator().manual_seed(data.draw(st.integers(0, 2**32 - 1), label="table seed"))
    table = torch.randint(-(2**15), 2**15, (vocab, config.hidden_size), generator=g, dtype=torch.int16)
    table = table.view(torch.bfloat16)  # every BF16 bit pattern is possible: subnormals, infinities, NaN
    got = op(backend, "v4_embed_pack")(ids, table, config=config)
    want = table[ids.long().clamp(0, vocab - 1)].float()
    assert tuple(got.shape) == (ids.numel(), config.hc_mult, config.hidden_size), list(got.shape)
    for c in range(config.hc_mult):
        same = got[:, c].view(torch.int32) == want.view(torch.int32)
        if not bool(same.all()):
            t, d = (int(v) for v in (~same).nonzero()[0])
            pytest.fail(f"x_hc[{t}][{c}][{d}] = {got[t, c, d].item()!r}, expected {want[t, d].item()!r} (the id's "
                        "row widened bit for bit, §8)")


def test_an_id_past_the_int32_range_is_clamped_not_truncated(backend):
    """Upstream's ids are INT64: 2^32 + 5 is past the vocabulary and reads its last row, never row 5 (an id
    narrowed to INT32 first wraps to 5); -2^32 + 3 reads row 0, never row 3. Separated from the narrowing."""
    config = MODELS[0]
    table = _table(config)
    ids = torch.tensor([2**32 + 5, -(2**32) + 3, 2**40], dtype=torch.int64)
    got = op(backend, "v4_embed_pack")(ids, table, config=config)
    want = separates("ids clamped in INT64", table[ids.clamp(0, VOCAB - 1)].float(),
                     ids_narrowed_to_int32_first=table[ids.to(torch.int32).long().clamp(0, VOCAB - 1)].float())
    for t in range(ids.numel()):
        assert torch.equal(got[t, 0], want[t]), f"x_hc[{t}][0] (id {int(ids[t])}) is not row {int(ids[t].clamp(0, VOCAB - 1))}"


def test_every_stream_is_its_own_storage(backend):
    """x_hc is a tensor of its own, each stream a separate row (as the kernel writes hc_mult rows per token): a
    write into one stream leaves the others and the table unchanged -- an expanded view of one row would alias
    every stream."""
    config = MODELS[0]
    table = _table(config)
    before = table.clone()
    x_hc = op(backend, "v4_embed_pack")(torch.tensor([3, 4], dtype=torch.int64), table, config=config)
    kept = x_hc[:, 1:].clone()
    x_hc[:, 0] += 1.0
    assert torch.equal(x_hc[:, 1:], kept), "writing stream 0 changed the other streams: they share storage"
    assert torch.equal(table.view(torch.int16), before.view(torch.int16)), "writing x_hc changed the table"


BAD_CALLS = {
    "float ids": (lambda c: (torch.zeros(4), _table(c)), "input_ids"),
    "2-D ids": (lambda c: (torch.zeros(2, 2, dtype=torch.int64), _table(c)), "input_ids"),
    "FP32 table": (lambda c: (torch.zeros(4, dtype=torch.int64), _table(c).float()), "embed_weight: expected BF16"),
    "table of another width": (lambda c: (torch.zeros(4, dtype=torch.int64), _table(c)[:, :-1]), "embed_weight"),
    "empty vocabulary": (lambda c: (torch.zeros(4, dtype=torch.int64), _table(c)[:0]), "embed_weight"),
}


@pytest.mark.parametrize("what", sorted(BAD_CALLS))
def test_bad_calls_are_refused_naming_the_field(backend, what):
    config = MODELS[0]
    make, field = BAD_CALLS[what]
    ids, table = make(config)
    with pytest.raises(ContractInputError, match=field):
        op(backend, "v4_embed_pack")(ids, table, config=config)


def _wrapped(input_ids, embed_weight, *, config):
    rows = embed_weight[input_ids.long() % embed_weight.shape[0]].float()
    return rows.unsqueeze(1).expand(-1, config.hc_mult, -1).contiguous()


def _stream_zero_only(input_ids, embed_weight, *, config):
    rows = embed_weight[input_ids.long().clamp(0, embed_weight.shape[0] - 1)].float()
    out = torch.zeros(rows.shape[0], config.hc_mult, rows.shape[1])
    out[:, 0] = rows
    return out


def _bf16_streams(input_ids, embed_weight, *, config):
    rows = embed_weight[input_ids.long().clamp(0, embed_weight.shape[0] - 1)]
    return rows.unsqueeze(1).expand(-1, config.hc_mult, -1).contiguous()


def _narrowed(input_ids, embed_weight, *, config):
    rows = embed_weight[input_ids.to(torch.int32).long().clamp(0, embed_weight.shape[0] - 1)].float()
    return rows.unsqueeze(1).expand(-1, config.hc_mult, -1).contiguous()


def _aliased_streams(input_ids, embed_weight, *, config):
    rows = embed_weight[input_ids.long().clamp(0, embed_weight.shape[0] - 1)].float()
    return rows.unsqueeze(1).expand(-1, config.hc_mult, -1)


SEEDED_DEFECTS = [
    SeededDefect("v4-embed-pack:ids-narrowed", "v4_embed_pack", _narrowed,
                 "test_an_id_past_the_int32_range_is_clamped_not_truncated", "is not row"),
    SeededDefect("v4-embed-pack:aliased-streams", "v4_embed_pack", _aliased_streams,
                 "test_every_stream_is_its_own_storage", "share storage"),
    SeededDefect("v4-embed-pack:ids-wrap", "v4_embed_pack", _wrapped, "test_ids_are_clamped_into_the_vocabulary_never_wrapped",
                 "is not row"),
    SeededDefect("v4-embed-pack:stream-zero-only", "v4_embed_pack", _stream_zero_only,
                 "test_every_stream_holds_the_row_widened_exactly", "x_hc["),
    SeededDefect("v4-embed-pack:bf16-streams", "v4_embed_pack", _bf16_streams,
                 "test_ids_are_clamped_into_the_vocabulary_never_wrapped", "x_hc: torch.bfloat16"),
]
