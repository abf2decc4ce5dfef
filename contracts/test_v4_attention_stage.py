"""One V4 attention stage (``v4_attention_stage``): hc_pre -> RMSNorm -> Q/KV projection -> the kv write ->
``v4_attention`` -> hc_post, composed from the backend's operators, on V4-Pro and V4-Flash (tiny twins).

Spec: §8; docs/coverage.md, V4 section (V4-21).
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from contracts.checks.precision import rows_outside_stage_bound
from contracts.separation import separates_under
from contracts.v4_inputs import prefill_stage_inputs, stage_inputs
from kernels.config import V4_FLASH_TINY, V4_PRO_TINY
from kernels.errors import ContractInputError
from pto_pytest.defect import SeededDefect, shared
from pto_pytest.plugin import op


def _entry(backend, config, i) -> SimpleNamespace:
    """The stage's entry mix with the backend's own operator: the mixes and the pre-mixed row in one call, as
    upstream's hc_pre golden computes them (x_mixed, post, and the Sinkhorn residual as [T, hc, hc])."""
    fused = op(backend, "hc_pre_fused")(i["x_hc"], i["hc_fn"], i["hc_scale"], i["hc_base"], config=config)
    tokens, hc = fused["post"].shape
    return SimpleNamespace(x_mixed=fused["x_mixed"], post=fused["post"], residual=fused["comb"].reshape(tokens, hc, hc))


def _projected(backend, config, i):
    """The stage's first half with the backend's own operators: mixes, the normed row's projection, the RoPE
    rows, and the cache with this step's kv rows written."""
    mixes = _entry(backend, config, i)
    x = op(backend, "final_norm")(mixes.x_mixed, i["attn_norm_w"], config=config)
    pos = i["position_ids"].long()
    cos, sin = i["freqs_cos"][pos], i["freqs_sin"][pos]
    proj = op(backend, "v4_qkv_proj_rope")(x, i["wq_a"], i["wq_b"], i["wq_b_scale"], i["wkv"], cos, sin,
                                           i["gamma_cq"], i["gamma_ckv"], config=config)
    cache = i["kv_cache"].clone()
    cache.reshape(-1, cache.shape[-1])[i["swa_slot_mapping"]] = proj["kv"]
    return mixes, proj, cache, cos, sin


def _chain(backend, config, i):
    """The stage spelled out with the backend's own operators."""
    mixes, proj, cache, cos, sin = _projected(backend, config, i)
    cmp = torch.zeros(1, cache.shape[1], 1, cache.shape[-1], dtype=cache.dtype)
    table = torch.zeros(config.decode_batch, 1, dtype=torch.int32)
    out = op(backend, "v4_attention")("SWA", proj["q"], cache, i["window_indices"], cmp, table, None,
                                      i["position_ids"], i["attn_sink"], cos, sin, i["wo_a"], i["wo_b"],
                                      i["wo_b_scale"], config=config)
    return op(backend, "hc_post")(out, i["x_hc"], mixes.post, mixes.residual), cache, out


@pytest.mark.whole_backend("a stage against its own parts, bit for bit")
@pytest.mark.parametrize("config", [V4_PRO_TINY, V4_FLASH_TINY], ids=lambda c: c.name)
@pytest.mark.operators("final_norm", "hc_post", "hc_pre_fused", "v4_attention", "v4_attention_stage",
                        "v4_qkv_proj_rope")
def test_the_stage_is_the_chain_of_its_operators(backend, config):
    """x_out, the written cache and qr / qr_scale equal the chain spelled out with the same backend's
    operators, byte for byte: hc_pre, the RMSNorm, the projection at the tokens' RoPE rows, the kv write, the
    SWA attention, hc_post. The input cache is not modified. Spec: §8."""
    i = stage_inputs(config)
    before = i["kv_cache"].clone()
    got = op(backend, "v4_attention_stage")("SWA", **i, config=config)
    want, cache, _ = _chain(backend, config, i)
    assert got["x_out"].dtype == torch.float32 and got["x_out"].shape == i["x_hc"].shape
    assert torch.equal(got["x_out"], want), "x_out is not hc_post of the chained attention"
    assert torch.equal(got["kv_cache"].view(torch.int16), cache.view(torch.int16)), "the written cache differs"
    assert torch.equal(i["kv_cache"], before), "the input cache was written in place"


@pytest.mark.whole_backend("a stage against its own parts, bit for bit")
@pytest.mark.operators("final_norm", "hc_post", "hc_pre_fused", "v4_attention", "v4_attention_stage",
                        "v4_qkv_proj_rope")
def test_each_token_sees_its_own_kv_row(backend):
    """Every window lists the token's own slot: the stage writes the current kv rows before the attention
    reads the cache. Reading the cache as it came in (the rows not yet written) gives a different attention --
    the input separates the order. A slot of -1 writes nothing. Spec: §8."""
    config = V4_PRO_TINY
    i = stage_inputs(config, 1)
    got = op(backend, "v4_attention_stage")("SWA", **i, config=config)
    _, _, out = _chain(backend, config, i)
    mixes = _entry(backend, config, i)
    assert torch.equal(got["x_out"], op(backend, "hc_post")(out, i["x_hc"], mixes.post, mixes.residual)), \
        "x_out must come from the attention over the cache with this chunk's rows written"
    pos = i["position_ids"].long()
    stale = op(backend, "v4_attention")("SWA", op(backend, "v4_qkv_proj_rope")(
        op(backend, "final_norm")(mixes.x_mixed, i["attn_norm_w"], config=config),
        i["wq_a"], i["wq_b"], i["wq_b_scale"], i["wkv"], i["freqs_cos"][pos], i["freqs_sin"][pos], i["gamma_cq"],
        i["gamma_ckv"], config=config)["q"], i["kv_cache"], i["window_indices"],
        torch.zeros(1, config.block_size, 1, config.head_dim, dtype=torch.bfloat16),
        torch.zeros(config.decode_batch, 1, dtype=torch.int32), None, i["position_ids"], i["attn_sink"],
        i["freqs_cos"][pos], i["freqs_sin"][pos], i["wo_a"], i["wo_b"], i["wo_b_scale"], config=config)
    from contracts.separation import separates

    separates("the chunk's kv rows written before the attention reads the cache", out, read_before_write=stale)
    skip = i["swa_slot_mapping"].clone()
    skip[3] = -1
    again = op(backend, "v4_attention_stage")("SWA", **dict(i, swa_slot_mapping=skip), config=config)
    row = again["kv_cache"].reshape(-1, config.head_dim)[203]
    assert torch.equal(row, i["kv_cache"].reshape(-1, config.head_dim)[203]), "slot -1 must write nothing"


@pytest.mark.operators("v4_attention_stage")
def test_bad_stage_inputs_are_refused(backend):
    """A position past the RoPE table and a slot past the cache are refused naming the field. Spec: §8."""
    config = V4_PRO_TINY
    i = stage_inputs(config, 2)
    pos = i["position_ids"].clone()
    pos[5] = 512
    with pytest.raises(ContractInputError, match=r"position_ids\[5\]"):
        op(backend, "v4_attention_stage")("SWA", **dict(i, position_ids=pos), config=config)
    slots = i["swa_slot_mapping"].clone()
    slots[2] = 256
    with pytest.raises(ContractInputError, match=r"swa_slot_mapping\[2\]"):
        op(backend, "v4_attention_stage")("SWA", **dict(i, swa_slot_mapping=slots), config=config)


@pytest.mark.whole_backend("a stage against its own parts, bit for bit")
@pytest.mark.operators("final_norm", "hc_mixes", "hc_post", "hc_pre", "hc_pre_fused", "v4_attention",
                        "v4_attention_stage", "v4_qkv_proj_rope")
def test_the_stage_runs_the_backends_operators_and_any_path(backend):
    """On a backend whose operators are wrapped to count (and accept no ``ops``), the stage calls each of
    hc_mixes, hc_pre, final_norm, v4_qkv_proj_rope, v4_attention and hc_post once. An HCA stage with a
    compressed cache and slots equals the chain with HCA's attention; a token at position 0 and a write to
    slot 0 are ordinary. Spec: §8."""
    config = V4_FLASH_TINY
    i = stage_inputs(config, 3)
    calls = []

    def counted(name):
        fn = op(backend, name)

        def wrapper(*a, config=None):  # a kernel-bound operator: takes no ``ops``
            calls.append(name)
            return fn(*a) if config is None else fn(*a, config=config)

        return wrapper

    names = ("hc_mixes", "hc_pre", "final_norm", "v4_qkv_proj_rope", "v4_attention", "hc_post")
    derived = backend.derive("counting", **{n: counted(n) for n in names})
    derived.get("v4_attention_stage")("SWA", **i, config=config)
    assert sorted(calls) == sorted(names), calls

    i["position_ids"][0] = 0
    i["swa_slot_mapping"][1] = 0
    cmp_kv = (torch.rand(2, config.block_size, 1, config.head_dim, generator=torch.Generator().manual_seed(4)) - 0.5)
    cmp_kv = cmp_kv.to(torch.bfloat16)
    table = torch.tensor([[1], [0], [1], [0]], dtype=torch.int32)
    compressed = torch.full((config.decode_tokens, 4), -1, dtype=torch.int32)
    compressed[:, :3] = torch.tensor([0, 5, 9], dtype=torch.int32)
    got = op(backend, "v4_attention_stage")("HCA", **i, cmp_kv=cmp_kv, cmp_block_table=table, compressed=compressed,
                                            config=config)
    mixes, proj, cache, cos, sin = _projected(backend, config, i)
    assert torch.equal(got["kv_cache"].view(torch.int16), cache.view(torch.int16)), "slot 0 must be written"
    out = op(backend, "v4_attention")("HCA", proj["q"], cache, i["window_indices"], cmp_kv, table, compressed,
                                      i["position_ids"], i["attn_sink"], cos, sin, i["wo_a"], i["wo_b"],
                                      i["wo_b_scale"], config=config)
    want = op(backend, "hc_post")(out, i["x_hc"], mixes.post, mixes.residual)
    assert torch.equal(got["x_out"], want), "the HCA stage must attend the given compressed cache and slots"
    for index, value in ((2, -1), (6, 600)):
        bad = i["position_ids"].clone()
        bad[index] = value
        with pytest.raises(ContractInputError, match=rf"position_ids\[{index}\]"):
            op(backend, "v4_attention_stage")("SWA", **dict(i, position_ids=bad), config=config)
    for given in ({}, {"cmp_kv": cmp_kv}, {"cmp_block_table": table}):  # HCA needs both
        with pytest.raises(ContractInputError, match="cmp_kv"):
            op(backend, "v4_attention_stage")("HCA", **i, **given, compressed=compressed, config=config)


@pytest.mark.parametrize("config", [V4_PRO_TINY, V4_FLASH_TINY], ids=lambda c: c.name)
@pytest.mark.operators("v4_attention_stage", "v4_prefill_swa_indices")
def test_the_prefill_form_is_the_same_on_the_real_rows_alone_with_a_zero_tail(backend, config):
    """The prefill form (num_tokens 28 of 32 rows, the window from v4_prefill_swa_indices): the real rows' x_out,
    qr and qr_scale and the cache equal the prefill form run on the real rows alone, bit for bit; the padding rows'
    x_out, qr and qr_scale are exactly 0 and their slot (real row 0's) is not written by them. Spec: §8
    (upstream prefill_attention_swa.py: the kv write and the window stop at num_tokens, hc_post_prefill zeroes
    the tail)."""
    i = prefill_stage_inputs(config)
    n = 28
    table = i.pop("block_table")
    i["window_indices"] = op(backend, "v4_prefill_swa_indices")(i["position_ids"], table, n, config=config)
    got = op(backend, "v4_attention_stage")("SWA", **i, num_tokens=n, config=config)
    real = {k: (v[:n] if k in ("x_hc", "swa_slot_mapping", "window_indices", "position_ids") else v)
            for k, v in i.items()}
    want = op(backend, "v4_attention_stage")("SWA", **real, num_tokens=n, config=config)
    assert torch.equal(got["kv_cache"].view(torch.int16), want["kv_cache"].view(torch.int16)), \
        "the cache differs from the real rows' writes alone (a padding row wrote its slot)"
    for key in ("x_out", "qr", "qr_scale"):
        assert got[key].dtype == want[key].dtype and torch.equal(got[key][:n], want[key]), f"real rows of {key}"
        assert not bool(got[key][n:].any()), f"the padding rows of {key} are not 0"


@pytest.mark.operators("v4_attention_stage", "v4_prefill_swa_indices")
def test_the_prefill_form_at_its_edges(backend):
    """num_tokens = 0: every output 0 and the cache untouched; num_tokens = T: the stage on every row, bit for
    bit; the padding rows' positions are never read -- -1 and a position past the RoPE table are accepted there
    and change nothing. Spec: §8."""
    config = V4_PRO_TINY
    i = prefill_stage_inputs(config, 1)
    table = i.pop("block_table")
    rows = i["x_hc"].shape[0]
    stage = op(backend, "v4_attention_stage")
    i["window_indices"] = op(backend, "v4_prefill_swa_indices")(i["position_ids"], table, 0, config=config)
    none = stage("SWA", **i, num_tokens=0, config=config)
    assert torch.equal(none["kv_cache"].view(torch.int16), i["kv_cache"].view(torch.int16)), "a padding row wrote"
    assert not any(bool(none[k].any()) for k in ("x_out", "qr", "qr_scale")), "a chunk of padding has output"
    i["window_indices"] = op(backend, "v4_prefill_swa_indices")(i["position_ids"], table, rows, config=config)
    i["swa_slot_mapping"][28:] = -1  # no two rows on one slot
    every = stage("SWA", **i, num_tokens=rows, config=config)
    full = stage("SWA", **i, config=config)
    for key in ("x_out", "qr", "qr_scale", "kv_cache"):
        assert torch.equal(every[key], full[key]), f"num_tokens = T differs from the decode form in {key}"
    n = 28
    i["window_indices"] = op(backend, "v4_prefill_swa_indices")(i["position_ids"], table, n, config=config)
    want = stage("SWA", **i, num_tokens=n, config=config)
    far = i["position_ids"].clone()
    far[n], far[n + 1:] = 10**6, -1
    got = stage("SWA", **dict(i, position_ids=far), num_tokens=n, config=config)
    for key in ("x_out", "qr", "qr_scale", "kv_cache"):
        assert torch.equal(got[key], want[key]), f"a padding row's position moved {key}"


@pytest.mark.operators("v4_attention_stage", "v4_prefill_swa_indices")
def test_the_prefill_form_refuses_a_bad_num_tokens_before_any_operator_runs(backend):
    """33 of 32 rows, -1 and True are refused naming num_tokens, and 31 positions for 32 rows naming
    position_ids, by the stage itself: no operator of the backend has run. Spec: §8."""
    config = V4_PRO_TINY
    i = prefill_stage_inputs(config, 1)
    table = i.pop("block_table")
    i["window_indices"] = op(backend, "v4_prefill_swa_indices")(i["position_ids"], table, 28, config=config)

    def untouched(*a, **k):
        raise AssertionError("an operator ran before num_tokens was checked")

    names = ("hc_mixes", "hc_pre", "final_norm", "v4_qkv_proj_rope", "v4_attention", "hc_post")
    guarded = backend.derive("guarded", **{n: untouched for n in names})
    for bad in (33, -1, True):
        with pytest.raises(ContractInputError, match=r"num_tokens.*\[0, 32\]"):
            guarded.get("v4_attention_stage")("SWA", **i, num_tokens=bad, config=config)
    with pytest.raises(ContractInputError, match="position_ids"):  # one position short
        guarded.get("v4_attention_stage")("SWA", **dict(i, position_ids=i["position_ids"][:-1]), num_tokens=28,
                                          config=config)


def _attends_over_the_written_rows(backend, config, i, form: str, n: int | None = None) -> SimpleNamespace:
    """The stage (decode, or prefill with ``n`` real rows) against its parts, the backend's own where it has them
    and the reference for the rest (a mixed run where it lacks one, labelled): asserts the real rows' kv rows are
    the projection's, byte for byte, at their slots; returns the real rows' x_out, what hc_post over the attention
    of each row's window over the cache with the rows written gives (``want``), the bound (``within``, and
    ``outside`` per row), and the alternatives the caller separates: attending the cache as it came in, and each
    window one key short (its oldest listed key dropped)."""

    rows = i["x_hc"].shape[0]
    real = rows if n is None else n
    chunk = {} if n is None else {"num_tokens": n}
    got = op(backend, "v4_attention_stage")("SWA", **i, **chunk, config=config)
    mixes = _entry(backend, config, i)
    pos = i["position_ids"].long().clamp(min=0)
    cos, sin = i["freqs_cos"][pos], i["freqs_sin"][pos]
    proj = op(backend, "v4_qkv_proj_rope")(op(backend, "final_norm")(mixes.x_mixed, i["attn_norm_w"], config=config),
                                           i["wq_a"], i["wq_b"], i["wq_b_scale"], i["wkv"], cos, sin, i["gamma_cq"],
                                           i["gamma_ckv"], config=config)
    cache = i["kv_cache"].clone()
    cache.reshape(-1, cache.shape[-1])[i["swa_slot_mapping"][:real].long()] = proj["kv"][:real]
    assert torch.equal(got["kv_cache"].view(torch.int16), cache.view(torch.int16)), \
        f"the {form} form's cache is not the input with the real rows' kv rows written at their slots (§8)"
    placeholder = torch.zeros(1, cache.shape[1], 1, cache.shape[-1], dtype=cache.dtype)
    table = torch.zeros(1 if n is not None else rows // config.decode_seq, 1, dtype=torch.int32)

    def attend(kv, win):
        return op(backend, "v4_attention")("SWA", proj["q"], kv, win, placeholder, table, None, i["position_ids"],
                                           i["attn_sink"], cos, sin, i["wo_a"], i["wo_b"], i["wo_b_scale"],
                                           config=config, **({} if n is None else {"seq": rows, "num_tokens": n}))

    def x_out(kv, win):
        return op(backend, "hc_post")(attend(kv, win), i["x_hc"], mixes.post, mixes.residual)[:real]

    window = i["window_indices"]
    short = window.clone()  # each real row's oldest key dropped (its first listed slot, the window oldest first)
    for t in range(real):
        short[t, int((window[t] >= 0).nonzero()[0])] = -1
    # the stage bound relative to x_out's terms, not to their sum: post[h] · attn_out enters every stream, so an
    # attention output one BF16 step off moves an element where the residual term cancels it (upstream's prefill
    # attention golden and this project's differ so in some rows: dspark's stage against the reference's attention)
    terms = mixes.post[:real, :, None].abs() * attend(cache, window)[:real, None, :].float().abs()

    def outside(y, w):
        return rows_outside_stage_bound(y, w, terms)

    rest = {"attended_the_cache_as_it_came_in": x_out(i["kv_cache"], window),
            "each_window_one_key_short": x_out(cache, short)}
    return SimpleNamespace(x_out=got["x_out"][:real], want=x_out(cache, window), alternatives=rest,
                           within=lambda y, w: not bool(outside(y, w).any()), outside=outside)


def _assert_within(parts, i, form: str) -> None:
    from contracts.tolerances import BF16_STAGE_TOL

    bad = parts.outside(parts.x_out, parts.want).nonzero().flatten()
    assert not bad.numel(), f"x_out row {int(bad[0])} (position {int(i['position_ids'][bad[0]])}) is outside " \
                            f"{BF16_STAGE_TOL} (of x_out and of post · attn_out) of the {form} SWA attention over " \
                            "the written cache (§8)"


@pytest.mark.parametrize("config", [V4_PRO_TINY, V4_FLASH_TINY], ids=lambda c: c.name)
@pytest.mark.operators("v4_attention_stage", "final_norm", "hc_post", "hc_pre_fused", "v4_attention",
                        "v4_prefill_swa_indices", "v4_qkv_proj_rope")
def test_the_prefill_form_attends_each_window_over_the_rows_it_wrote(backend, config):
    """The prefill form (28 of 32 rows real) against its parts (``_attends_over_the_written_rows``). Positions
    250 .. 277 real: page 0 unmapped (holes at the early rows' oldest keys), from position 255 on whole windows, and
    position 256 on physical page 0 (slot 0, an ordinary slot). The input separates the order and the window.
    Spec: §8 (upstream prefill_attention_swa.py / prefill_swa.py)."""
    i = prefill_stage_inputs(config, start=250, table=[-1, 3, 0])
    assert int(i["swa_slot_mapping"][6]) == 0 and int(i["position_ids"][6]) == 256, "the vector's slot-0 row moved"
    n = 28
    i["window_indices"] = op(backend, "v4_prefill_swa_indices")(i["position_ids"], i.pop("block_table"), n,
                                                                config=config)
    parts = _attends_over_the_written_rows(backend, config, i, "prefill", n)
    separates_under("the prefill attention over the cache with the rows written, each row's whole window",
                    parts.within, parts.want, **parts.alternatives)
    _assert_within(parts, i, "prefill")


@pytest.mark.parametrize("config", [V4_PRO_TINY, V4_FLASH_TINY], ids=lambda c: c.name)
@pytest.mark.operators("v4_attention_stage", "final_norm", "hc_post", "hc_pre_fused", "v4_attention",
                        "v4_qkv_proj_rope")
def test_the_decode_form_attends_each_window_over_the_rows_it_wrote(backend, config):
    """The decode form against its parts (``_attends_over_the_written_rows``): four requests of two rows, each row's
    window its request's 8 earlier rows and its own chunk's rows up to itself; request 1's second row written at
    slot 0 (an ordinary slot, which request 0's windows read too: every write lands before the attention reads).
    The input separates the order and the window. Spec: §8 (upstream decode_attention_swa.py / decode_swa.py)."""
    i = stage_inputs(config)
    i["swa_slot_mapping"] = i["swa_slot_mapping"].clone()
    i["swa_slot_mapping"][3] = 0
    i["window_indices"] = torch.where(i["window_indices"] == 203, 0, i["window_indices"]).to(torch.int32)
    parts = _attends_over_the_written_rows(backend, config, i, "decode")
    separates_under("the decode attention over the cache with the rows written, each row's whole window",
                    parts.within, parts.want, **parts.alternatives)
    _assert_within(parts, i, "decode")


def _window_short(path, x_hc, *args, config, num_tokens=None, ops=None, **kw):
    """Wrong: the stage attends each real row's window without its oldest key (both forms)."""
    from kernels.v4.attention_stage import v4_attention_stage

    window = kw["window_indices"].clone()
    for t in range(x_hc.shape[0] if num_tokens is None else num_tokens):
        window[t, int((window[t] >= 0).nonzero()[0])] = -1
    kw["window_indices"] = window
    return v4_attention_stage(path, x_hc, *args, config=config, num_tokens=num_tokens, ops=ops, **kw)


_window_short.composes_operators = True


# defects these contracts must catch: of tests/defects (shared with other contract files), and this file's own
SEEDED_DEFECTS = [
    shared("v4:PREFILL_PADDING_KV_WRITTEN", "test_the_prefill_form_is_the_same_on_the_real_rows_alone_with_a_zero_tail", "a padding row wrote its slot"),
    shared("v4:PREFILL_STAGE_NO_ZERO_TAIL", "test_the_prefill_form_is_the_same_on_the_real_rows_alone_with_a_zero_tail", "padding rows of x_out are not 0"),
    shared("v4:READ_BEFORE_WRITE", "test_each_token_sees_its_own_kv_row", "with this chunk's rows written"),
    shared("v4:ATTN_NORM_SKIPPED", "test_the_stage_is_the_chain_of_its_operators", "not hc_post of the chained attention"),
    shared("v4:READ_BEFORE_WRITE", "test_the_prefill_form_attends_each_window_over_the_rows_it_wrote",
           "of the prefill SWA attention over the written cache"),
    shared("v4:READ_BEFORE_WRITE", "test_the_decode_form_attends_each_window_over_the_rows_it_wrote",
           "of the decode SWA attention over the written cache"),
    *(SeededDefect(f"v4-stage:{form}-window-short", "v4_attention_stage", _window_short,
                   f"test_the_{form}_form_attends_each_window_over_the_rows_it_wrote",
                   f"of the {form} SWA attention over the written cache") for form in ("prefill", "decode")),
]
