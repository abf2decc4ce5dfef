"""dspark's drafter attention (``dspark_attention``): the draft block projected, its KV committed at its slots
before anything is read, and every draft row of a request attending the same list -- the window then the whole
block, no causal mask -- through the SWA attention and its output projection. Judged by what the ABI promises and
no formula of its own: the committed cache is the context KV of the block's rows (``dspark_context_kv``), x_out
is the drafter's projection (``dspark_output_projection``) of the SWA attention heads over the request's list
(``v4_attention_heads``), and three metamorphic probes show what a row sees
and what it does not. Golden case and bad calls: the record in ``kernels/v4/dspark_attention.py``. Spec: §8."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from contracts.compare import COMPARATORS, Context
from contracts.separation import separates_under
from contracts.tensors import byte_rows
from kernels.config import V4_FLASH_TINY
from kernels.errors import ContractInputError
from kernels.v4.dspark_attention import block_call, visible_window
from pto_pytest.defect import SeededDefect
from pto_pytest.plugin import op

C = V4_FLASH_TINY
CONTEXT_KV = ("main_x", "wkv", "gamma_ckv", "freqs_cos", "freqs_sin", "position_ids", "slot_mapping", "kv_cache")


def _context_kv_args(i: dict) -> dict:
    return {"main_x": i["x"], **{k: i[k] for k in CONTEXT_KV if k != "main_x"}}


@pytest.mark.operators("dspark_attention", "dspark_context_kv", "v4_qkv_proj_rope", "v4_attention_heads",
                       "dspark_output_projection")
@given(starts=st.lists(st.integers(0, 300), min_size=1, max_size=3), seq=st.integers(1, 4),
       seed=st.integers(0, 2**31))
def test_the_block_is_committed_then_attended_over_its_requests_list(backend, starts, seq, seed):
    """1-3 requests at any start (windows clamped at 0 or full), 1-4 draft rows each: the returned cache is the
    context KV of the block's rows written at their slots (within upstream's mapped-pool bound, v4_kv_pool: one
    backend's golden may sum x · wkv in another order) and every other row byte for byte; x_out [B·S, D] BF16 is the drafter's
    output projection of the SWA attention heads of the block's queries over that committed cache and the
    request's list repeated for each of its rows, within the attention-output bound."""
    i = block_call(seed, C, starts=starts, seq=seq)
    got = op(backend, "dspark_attention")(**i, config=C)
    cache = op(backend, "dspark_context_kv")(**_context_kv_args(i), config=C)
    assert got["kv_cache"].shape == i["kv_cache"].shape and got["kv_cache"].dtype == torch.bfloat16, \
        f"kv_cache {got['kv_cache'].dtype}{list(got['kv_cache'].shape)}, expected the input's (§8)"
    ctx = Context(inputs=i, actual_outputs=got, expected_outputs={"kv_cache": cache}, params={})
    verdict = COMPARATORS["v4_kv_pool"]("kv_cache", got["kv_cache"], cache, ctx)
    assert verdict.ok, f"kv_cache is not the block's context KV at its slots (every other row unchanged): {verdict}"
    batch = len(starts)
    want = _kernel_rule(backend, i, seq, _parts(backend, i, cache))
    x_out = got["x_out"]
    assert x_out.dtype == torch.bfloat16 and tuple(x_out.shape) == (batch * seq, C.hidden_size), \
        f"x_out {x_out.dtype}{list(x_out.shape)}, expected bfloat16[{batch * seq}, {C.hidden_size}] (§8)"
    verdict = COMPARATORS["dspark_x_out"]("x_out", x_out, want, Context(inputs=i, actual_outputs=got,
                                                                       expected_outputs={"x_out": want}, params={}))
    assert verdict.ok, f"x_out is not the SWA attention over each request's list: {verdict}"


def _parts(backend, i: dict, cache: torch.Tensor) -> tuple:
    """The backend's own queries of the block and their RoPE rows, with the committed ``cache``."""
    pos = i["position_ids"].long()
    cos, sin = i["freqs_cos"][pos], i["freqs_sin"][pos]
    q = op(backend, "v4_qkv_proj_rope")(i["x"], i["wq_a"], i["wq_b"], i["wq_b_scale"], i["wkv"], cos, sin,
                                        i["gamma_cq"], i["gamma_ckv"], config=C)["q"]
    return cache, q, cos, sin


def _kernel_rule(backend, i: dict, seq: int, parts: tuple) -> torch.Tensor:
    """x_out under the kernel's "bf16" rule: the backend's v4_attention_heads over each request's list repeated for
    its rows (its BF16 probability tiles), then the backend's dspark_output_projection."""
    cache, q, cos, sin = parts
    heads = op(backend, "v4_attention_heads")("SWA", q, cache, visible_window(i["swa_indices"], i["swa_lens"], seq=seq),
                                              torch.zeros(1, C.block_size, 1, C.head_dim, dtype=torch.bfloat16),
                                              torch.zeros(len(i["swa_lens"]), 1, dtype=torch.int32), None,
                                              i["position_ids"], i["attn_sink"], cos, sin, config=C, seq=seq)
    return op(backend, "dspark_output_projection")(heads, i["wo_a"], i["wo_b"], i["wo_b_scale"], config=C)


def _both_rules(backend, i: dict, seq: int) -> dict[str, torch.Tensor]:
    """x_out under each probability rule on the backend's own parts: "fp32" with each row's softmax evaluated here
    in FP64 (one piece, the sink included, never rounded), "bf16" the kernel's (``_kernel_rule``)."""
    from kernels.v4.sparse_attention import output_heads

    parts = _parts(backend, i, op(backend, "dspark_context_kv")(**_context_kv_args(i), config=C))
    cache, q, cos, sin = parts
    flat, sink = cache.reshape(-1, C.head_dim).double(), i["attn_sink"].double()
    o = torch.zeros(q.shape, dtype=torch.float64)
    for t in range(q.shape[0]):
        b = t // seq
        keys = flat[i["swa_indices"][b, : int(i["swa_lens"][b])].long()]
        s = q[t].double() @ keys.T * C.head_dim**-0.5  # [H, K]
        top = s.amax(-1, keepdim=True)
        e = torch.exp(s - top)
        o[t] = (e @ keys) / (e.sum(-1, keepdim=True) + torch.exp(sink[:, None] - top))
    fp32 = op(backend, "dspark_output_projection")(output_heads(o.float(), cos, sin, config=C), i["wo_a"], i["wo_b"],
                                                   i["wo_b_scale"], config=C)
    return {"fp32": fp32, "bf16": _kernel_rule(backend, i, seq, parts)}


def _rule_judge(rule: str, want: dict, i: dict):
    """The judge of one rule's x_out: within upstream's dspark_x_out bound of the rule's pipeline, and nearer to it
    (L1) than to the other rule's."""
    other = "bf16" if rule == "fp32" else "fp32"

    def l1(a, b):
        return float((a.double() - b.double()).abs().sum())

    def judge(candidate, expected):
        ctx = Context(inputs=i, actual_outputs={"x_out": candidate}, expected_outputs={"x_out": expected}, params={})
        bound = COMPARATORS["dspark_x_out"]("x_out", candidate, expected, ctx)
        return bound.ok and l1(candidate, expected) < l1(candidate, want[other])

    return judge


@pytest.mark.operators("dspark_attention", "v4_qkv_proj_rope", "dspark_context_kv", "v4_attention_heads",
                       "dspark_output_projection")
@pytest.mark.parametrize("rule", ["fp32", "bf16"])
def test_each_probability_rule_is_its_own(backend, rule):
    """The two named rules (disagreement 21), each selected by name: "fp32" (the golden's: one softmax over the
    request's list and the sink, never rounded) and "bf16" (the kernel's: BF16 probability tiles). Each x_out is
    within upstream's dspark_x_out bound of its rule's pipeline on the backend's own parts, and nearer to it than to
    the other rule's. (At this width the rules are within that bound of each other; the checkout test at dspark's
    deployment separates them by the bound too: tests/test_upstream_backend.py.) A backend whose golden follows
    one rule refuses the other by name (a named skip)."""
    i = block_call(5, C, starts=(3, 200), seq=3)
    got = op(backend, "dspark_attention")(**i, config=C, probabilities=rule)["x_out"]
    want = _both_rules(backend, i, 3)
    other = "bf16" if rule == "fp32" else "fp32"
    judge = _rule_judge(rule, want, i)
    separates_under(f"probabilities={rule}", judge, want[rule], **{f"the_{other}_rule": want[other]})
    assert judge(got, want[rule]), f"x_out under probabilities={rule!r} is not that rule's, or nearer the {other} " \
                                   "rule: the rules are swapped (§8, disagreement 21)"


def _probe_call():
    """2 requests x 3 draft rows from positions 0 (its list is the block alone: 3 keys) and 5 (2 window keys + its
    block: 5 keys with a window of 2), and behind request 1's count one more listed cache row (an unwritten row
    of its page) that must not be read."""
    from dataclasses import replace

    c = replace(C, sliding_window=2)
    i = block_call(7, c, starts=(0, 5), seq=3, sink=-4.0)
    page = c.block_size
    stray = int(i["swa_indices"][1, 0]) // page * page + page - 1  # an unwritten row of request 1's page
    i["swa_indices"][1, int(i["swa_lens"][1])] = stray
    return c, i


def _rows(x_out: torch.Tensor, rows) -> torch.Tensor:
    return byte_rows(x_out[list(rows)])


@pytest.mark.operators("dspark_attention")
def test_a_draft_row_sees_the_whole_block_and_only_its_requests_list(backend):
    """Three probes on 2 requests x 3 rows. (1) Another x for request 0's last row moves request 0's first row (the
    block has no causal mask, and its KV is committed before the reads) and leaves request 1's rows alone. (2)
    Another value in the cache row listed past request 1's count moves nothing. (3) Another value in one of request 1's
    window rows moves request 1's rows, not request 0's."""
    c, i = _probe_call()
    attend = op(backend, "dspark_attention")
    base = attend(**i, config=c)["x_out"]
    j = dict(i, x=i["x"].clone())
    j["x"][2] = -i["x"][2] * 8
    moved = attend(**j, config=c)["x_out"]
    assert not torch.equal(_rows(moved, [0]), _rows(base, [0])), \
        "x_out row 0 did not move when request 0's last draft row changed: row 0 must see the whole block " \
        "(no causal mask), its KV committed before the reads (§8)"
    assert torch.equal(_rows(moved, [3, 4, 5]), _rows(base, [3, 4, 5])), \
        "request 1's rows moved when request 0's draft row changed: a request attends only its own list (§8)"
    past = int(i["swa_indices"][1, int(i["swa_lens"][1])])
    j = dict(i, kv_cache=i["kv_cache"].clone())
    j["kv_cache"].view(-1, c.head_dim)[past] *= -3
    assert torch.equal(_rows(attend(**j, config=c)["x_out"], range(6)), _rows(base, range(6))), \
        f"x_out moved when cache row {past}, listed past request 1's count {int(i['swa_lens'][1])}, changed: " \
        "columns past swa_lens are not read (§8)"
    window_row = int(i["swa_indices"][1, 0])
    j = dict(i, kv_cache=i["kv_cache"].clone())
    j["kv_cache"].view(-1, c.head_dim)[window_row] *= -3
    moved = attend(**j, config=c)["x_out"]
    assert not torch.equal(_rows(moved, [3, 4, 5]), _rows(base, [3, 4, 5])) and \
        torch.equal(_rows(moved, [0, 1, 2]), _rows(base, [0, 1, 2])), \
        f"changing request 1's window row {window_row} must move request 1's rows only (§8)"


@pytest.mark.operators("dspark_attention")
@pytest.mark.parametrize("case, field, index", [
    ("a -1 inside the list", "swa_indices", (1, 1)), ("a listed row past the cache", "swa_indices", (0, 2)),
    ("a count past the list", "swa_lens", (0,)), ("a negative count", "swa_lens", (1,)),
    ("rows not a multiple of the requests", "x", None), ("a slot past the cache", "slot_mapping", (4,)),
    ("a position past the tables", "position_ids", (5,)), ("a 3-D cache", "kv_cache", None),
    ("a cache of 2 heads", "kv_cache", None), ("float indices", "swa_indices", None),
    ("no request", "swa_indices", None), ("no rows", "x", None), ("positions short", "position_ids", None),
    ("float slots", "slot_mapping", None), ("a slot -2", "slot_mapping", (1,)), ("counts short", "swa_lens", None),
    ("an unknown probability rule", "probabilities", None)])
def test_a_malformed_call_is_refused_naming_its_field(backend, case, field, index):
    """A list names cache rows in its first swa_lens columns (a -1 there is refused, not read as a zero key), a count
    in [0, K], one count per request, B >= 1 requests of S >= 1 rows, slots -1 or inside the cache, one integer
    position and slot per row, positions inside the tables, a [blocks, page, 1, hd] cache. Well formed: a count of
    0 (the request reads nothing), a count of K (every column listed), a padding row (slot -1)."""
    _c, i = _probe_call()
    rows = i["kv_cache"].shape[0] * i["kv_cache"].shape[1]
    ok = dict(i, swa_lens=i["swa_lens"].clone(), swa_indices=i["swa_indices"].clone(),
              slot_mapping=i["slot_mapping"].clone())
    ok["swa_lens"][0] = 0
    ok["swa_lens"][1] = ok["swa_indices"].shape[1]
    ok["swa_indices"][1] = ok["swa_indices"][1, 0]  # every column a cache row
    ok["slot_mapping"][2] = -1
    op(backend, "dspark_attention")(**ok, config=_c)
    bad = {k: v.clone() for k, v in i.items()}
    if case == "a -1 inside the list":
        bad["swa_indices"][1, 1] = -1
    elif case == "a listed row past the cache":
        bad["swa_indices"][0, 2] = rows
    elif case == "a count past the list":
        bad["swa_lens"][0] = i["swa_indices"].shape[1] + 1
    elif case == "a negative count":
        bad["swa_lens"][1] = -1
    elif case == "rows not a multiple of the requests":
        bad.update(x=i["x"][:5], position_ids=i["position_ids"][:5], slot_mapping=i["slot_mapping"][:5])
    elif case == "a slot past the cache":
        bad["slot_mapping"][4] = rows
    elif case == "a position past the tables":
        bad["position_ids"][5] = i["freqs_cos"].shape[0]
    elif case == "a 3-D cache":
        bad["kv_cache"] = i["kv_cache"][:, :, 0]
    elif case == "a cache of 2 heads":
        bad["kv_cache"] = i["kv_cache"].expand(-1, -1, 2, -1).clone()
    elif case == "no request":
        bad.update(swa_indices=i["swa_indices"][:0], swa_lens=i["swa_lens"][:0])
    elif case == "no rows":
        bad.update(x=i["x"][:0], position_ids=i["position_ids"][:0], slot_mapping=i["slot_mapping"][:0])
    elif case == "positions short":
        bad["position_ids"] = i["position_ids"][:-1]
    elif case == "float slots":
        bad["slot_mapping"] = i["slot_mapping"].float()
    elif case == "a slot -2":
        bad["slot_mapping"][1] = -2
    elif case == "counts short":
        bad["swa_lens"] = i["swa_lens"][:1]
    elif case == "an unknown probability rule":
        with pytest.raises(ContractInputError) as exc:
            op(backend, "dspark_attention")(**i, config=_c, probabilities="fp16")
        assert exc.value.field == field, f"{case}: refused naming {exc.value.field!r}: {exc.value}"
        return
    else:
        bad["swa_indices"] = i["swa_indices"].float()
    with pytest.raises(ContractInputError) as exc:
        op(backend, "dspark_attention")(**bad, config=_c)
    assert exc.value.field == field and (index is None or exc.value.index == index), \
        f"{case}: refused naming {exc.value.field!r} at {exc.value.index}, not {field!r} at {index}: {exc.value}"


# --- seeded defects ------------------------------------------------------------------------------------------

def _with_attend(wrap):
    def impl(*args, config, ops=None, **kwargs):
        from kernels.v4.attention_heads import v4_attention_heads
        from kernels.v4.dspark_attention import dspark_attention

        return dspark_attention(*args, config=config, ops={"v4_attention_heads": wrap(v4_attention_heads)}, **kwargs)
    return impl


def _read_before_commit(**i):
    from kernels.v4.dspark_attention import dspark_attention

    config = i.pop("config")
    out = dspark_attention(**i, config=config)
    stale = dspark_attention(**dict(i, slot_mapping=torch.full_like(i["slot_mapping"], -1)), config=config)
    return {"x_out": stale["x_out"], "kv_cache": out["kv_cache"]}


def _causal(attend):
    def masked(path, q, cache, window, *args, seq, **kwargs):
        window = window.clone()
        for t in range(window.shape[0]):  # a row does not see the block rows after it (their slots are the tail)
            s = t % seq
            listed = (window[t] >= 0).nonzero().flatten()
            if len(listed) and s < seq - 1:
                window[t, listed[-(seq - 1 - s):]] = -1
        return attend(path, q, cache, window, *args, seq=seq, **kwargs)
    return masked


def _counts_ignored(**i):
    from kernels.v4.dspark_attention import dspark_attention

    config = i.pop("config")
    listed = (i["swa_indices"] >= 0).sum(1).to(torch.int32)  # every non-negative column read
    return dspark_attention(**dict(i, swa_lens=listed), config=config)


def _first_requests_list(**i):
    from kernels.v4.dspark_attention import dspark_attention

    config = i.pop("config")
    return dspark_attention(**dict(i, swa_indices=i["swa_indices"][:1].expand_as(i["swa_indices"]).clone(),
                                   swa_lens=i["swa_lens"][:1].expand_as(i["swa_lens"]).clone()), config=config)


def _rules_swapped(*args, probabilities="bf16", **kwargs):
    from kernels.v4.dspark_attention import dspark_attention

    return dspark_attention(*args, probabilities="fp32" if probabilities == "bf16" else "bf16", **kwargs)


SEEDED_DEFECTS = [
    SeededDefect("dspark-attention:rules-swapped", "dspark_attention", _rules_swapped,
                 "test_each_probability_rule_is_its_own", "the rules are swapped"),
    SeededDefect("dspark-attention:read-before-commit", "dspark_attention", _read_before_commit,
                 "test_a_draft_row_sees_the_whole_block_and_only_its_requests_list", "committed before the reads"),
    SeededDefect("dspark-attention:causal-block", "dspark_attention", _with_attend(_causal),
                 "test_a_draft_row_sees_the_whole_block_and_only_its_requests_list", "no causal mask"),
    SeededDefect("dspark-attention:counts-ignored", "dspark_attention", _counts_ignored,
                 "test_a_draft_row_sees_the_whole_block_and_only_its_requests_list", "past request 1's count"),
    SeededDefect("dspark-attention:first-requests-list", "dspark_attention", _first_requests_list,
                 "test_the_block_is_committed_then_attended_over_its_requests_list", "over each request's list"),
]
