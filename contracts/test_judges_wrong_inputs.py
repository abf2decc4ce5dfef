"""Every judge fed every kind of wrong input (#47 item 2). A judge is only proven by the wrong input that exposes
it, so each comparator of ``contracts.compare`` is taken on a real tree of the sample store that uses it (its
inputs, expected outputs and parameters), handed the expected output as the actual one (it must pass: the wrong
inputs below are the only change), and then each kind of wrong input, built here from that output:

* ``low row``: the judged elements of the quietest rows scaled by 1.5 (an error confined to quiet rows among loud
  ones: a bound relative to the whole tensor would miss it);
* ``nan actual`` / ``inf actual``: one judged element NaN / +Inf on the actual side only;
* ``nan expected``: one judged element NaN on the expected side only (a judge that masks NaN positions passes it);
* ``split``: values moved from one judged row to another, every column's sum over the rows kept (a judge of
  sums or of the whole tensor's mean passes it);
* ``order``: judged rows that differ swapped in pairs (an order-only difference: every output here has its order
  fixed by the ABI);

the row kinds reach a tenth of the judged elements (``COVER``), past the widest quota a judge allows (5 %);
Comparators that only judge trees at a model geometry are taken on the sample store's kept device runs, their trees
rebuilt from their cases (``goldens.recorded.rebuild_tree``).

* integer and byte outputs (codes, ids, slots): ``split`` and ``order`` as above (a unit moved), and ``off by one``
  (one element plus one).

Each (judge, kind) is one row of the table, proven to fail the judge; a kind that cannot apply to a judge's
outputs (NaN in an integer output) is not a row. The table is committed (``contracts/judges_table.json``, written
by ``python -m tests.judges_table``) so that collecting it loads no tree; ``test_the_table_is_the_sample_stores``
works it out from the store again on every run. ``test_a_replay_with_one_wrong_output_among_several_fails_it`` is
the negative replay: ``compare_all`` over a tree of several outputs, one of them wrong, fails that output and only
that one. Spec: §7.3."""

from __future__ import annotations

import pytest
import torch

from contracts.compare import COMPARATORS, READS_ACTUAL, Context, compare_all
from tests.judges_table import _judged, _rows, _tree, table

TABLE = table()  # the committed table (contracts/judges_table.json): collection reads no tree


def _examples() -> dict[str, tuple[str, str, str]]:
    return TABLE["examples"]


COVER = 0.1  # the row kinds reach a tenth of the judged elements: past every judge's quota (the widest is 5 %)


def wrong(kind: str, e: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(actual, expected) for one kind of wrong input built from the expected output ``e``."""
    a, exp = e.clone(), e.clone()
    rows, judged = _rows(a), _rows(_judged(e))
    live = judged.any(1).nonzero().flatten().tolist()
    need = COVER * int(judged.sum())
    if kind in ("nan actual", "inf actual", "nan expected", "off by one"):
        r = live[0]
        c = int(judged[r].nonzero()[0])
        if kind == "off by one":
            if a.dtype == torch.bool:
                rows[r, c] = ~rows[r, c]
            else:
                rows[r, c] = rows[r, c] + 1 if int(rows[r, c].to(torch.int64)) < 100 else rows[r, c] - 1
        elif kind == "nan expected":
            _rows(exp)[r, c] = float("nan")
        else:
            rows[r, c] = float("nan") if kind == "nan actual" else float("inf")
        return a, exp
    if kind == "low row":  # the quietest rows, as few as reach COVER of the judged elements
        f = rows.double() * judged
        rms = (f.pow(2).sum(1) / judged.sum(1).clamp_min(1)).sqrt()
        covered = 0
        for r in sorted((r for r in live if float(rms[r]) > 0), key=lambda q: float(rms[q])):
            rows[r] = torch.where(judged[r], (rows[r].double() * 1.5).to(a.dtype), rows[r])
            covered += int(judged[r].sum())
            if covered >= need:
                break
        return a, exp
    pairs, used = [], set()
    for i, p in enumerate(live):  # disjoint pairs of rows that differ on their common judged elements
        if p in used:
            continue
        for q in live[i + 1:]:
            both = judged[p] & judged[q]
            if q not in used and bool(both.any()) and not torch.equal(rows[p][both], rows[q][both]):
                pairs.append((p, q))
                used |= {p, q}
                break
    if not pairs:
        raise IndexError("no two judged rows differ")
    covered = 0
    for p, q in pairs:
        both = judged[p] & judged[q]
        if kind == "order":
            rows[p], rows[q] = rows[q].clone(), rows[p].clone()
        elif a.is_floating_point():  # split: each column's value moved from row q to row p, its sum kept
            d = torch.maximum(rows[p].double().abs(), rows[q].double().abs()).clamp_min(1.0) * 0.5
            rows[p] = torch.where(both, (rows[p].double() + d).to(a.dtype), rows[p])
            rows[q] = torch.where(both, (rows[q].double() - d).to(a.dtype), rows[q])
        else:
            rows[p] = torch.where(both, rows[p] + 1, rows[p])
            rows[q] = torch.where(both, rows[q] - 1, rows[q])
        covered += 2 * int(both.sum())
        if covered >= need:
            break
    return a, exp


def _context(tree, output, a, e) -> Context:
    actual = {**tree.expected, output: a}
    expected = {**tree.expected, output: e}
    return Context(tree.inputs, actual, expected, tree.record.params, tree.record.wiring)


# judges no tree of the sample store (nor a kept device run) uses, each with why: not in the table
NO_TREE = {
    "gate_codes": "the gate's INT8 codes at dspark's 128-row geometry (outputs_at): its kept runs stay in the user "
                  "store (the sample store's budget)",
    "q_bf16": "v4_qkv_proj_rope's q at V4-Pro's geometry only (outputs_at): no Pro qkv tree or kept run is stored",
    "v4_index_score_lowest_tail": "a named variant for a kernel that promises the whole score row: no case names "
                                  "it; its judge is check_v4_index_scores with tail='lowest', in the table through "
                                  "v4_index_score",
}


def test_the_table_is_the_sample_stores():
    """The committed table (collection reads it, so that no pytest process loads every tree to collect) is the one
    the sample store gives now: each comparator's tree and output, and each row's kinds."""
    from tests.judges_table import COMMAND, compute

    now = compute()
    now = {"examples": {k: tuple(v) for k, v in now["examples"].items()}, "rows": [tuple(r) for r in now["rows"]]}
    moved = sorted(k for k in set(now["examples"]) | set(TABLE["examples"])
                   if now["examples"].get(k) != TABLE["examples"].get(k))
    rows = sorted(set(now["rows"]) ^ set(TABLE["rows"]))
    assert not moved and not rows and now["rows"] == TABLE["rows"], \
        f"contracts/judges_table.json is not the sample store's: comparators {moved}, rows {rows}; run {COMMAND}"


def test_the_judges_without_a_tree_are_named():
    """Every comparator is in the wrong-input table or in NO_TREE with why, and NO_TREE names only those."""
    assert set(COMPARATORS) - set(_examples()) == set(NO_TREE), \
        f"without a tree: {sorted(set(COMPARATORS) - set(_examples()))}; NO_TREE names {sorted(NO_TREE)}"


@pytest.mark.parametrize("comparator", sorted(_examples()))
def test_every_judge_passes_its_trees_expected_output(comparator):
    """The baseline of every row below: each comparator used by a tree of the sample store passes that tree's
    expected output handed to it as the actual one (so each wrong-input failure below is the wrong input's)."""
    case, wiring, output = _examples()[comparator]
    tree = _tree(case, wiring)
    e = tree.expected[output]
    verdict = COMPARATORS[comparator](output, e.clone(), e, _context(tree, output, e.clone(), e))
    assert verdict.ok, f"{comparator} on {case}/{wiring}:{output}, its own expected output: {verdict}"


@pytest.mark.parametrize("comparator, kind", [pytest.param(c, k, id=f"{c}-{k.replace(' ', '-')}")
                                              for c, k in TABLE["rows"]])
def test_every_judge_fails_every_kind_of_wrong_input(comparator, kind):
    """One row of the table (module docstring): the comparator, on a real tree that uses it, fails the wrong input
    of this kind built from that tree's expected output."""
    case, wiring, output = _examples()[comparator]
    tree = _tree(case, wiring)
    a, e = wrong(kind, tree.expected[output])
    verdict = COMPARATORS[comparator](output, a, e, _context(tree, output, a, e))
    assert not verdict.ok, f"{comparator} passes a {kind!r} wrong input on {case}/{wiring}:{output}"


def test_a_replay_with_one_wrong_output_among_several_fails_it():
    """compare_all over every tree of the sample store with three or more outputs: each output in turn made wrong
    (its 'order' kind, or 'off by one' for a single row) fails that output and no other, naming it (a cache's
    scale judge decodes with its payload, and a chain judge reads another actual output (READS_ACTUAL), so those
    may fail too, and nothing else)."""
    several = {(c, w) for c, w, _o in _examples().values()}
    judged = 0
    for case, wiring in sorted(several):
        tree = _tree(case, wiring)
        if len(tree.record.comparators) < 3:
            continue
        for output in sorted(tree.record.comparators):
            e = tree.expected[output]
            rows = int(_rows(_judged(e)).any(1).sum()) if e.numel() else 0
            if rows == 0:
                continue
            kind = "order" if rows >= 2 else ("off by one" if not e.is_floating_point() else "low row")
            try:
                a, e2 = wrong(kind, e)
            except IndexError:  # every judged row the same: move one element instead
                a, e2 = wrong("off by one" if not e.is_floating_point() else "nan actual", e)
            ctx = Context(tree.inputs, {**tree.expected, output: a}, {**tree.expected, output: e2}, tree.record.params,
                          tree.record.wiring)
            verdicts = compare_all(tree.record.comparators, ctx)
            failing = sorted(k for k, v in verdicts.items() if not v.ok)
            partner = {output, output.replace("payload", "scale"), output.replace("scale", "payload")}
            chained = {k for k, comp in tree.record.comparators.items()
                       if any(read in ("*", output) or output.endswith("_" + read) for read in READS_ACTUAL.get(comp, ()))}
            assert output in failing and set(failing) <= partner | chained, \
                f"{case}/{wiring}: {output} made wrong ({kind}); compare_all failed {failing}"
            judged += 1
    assert judged >= 3, f"only {judged} outputs of trees with three or more outputs were judged"


def test_every_chain_judge_names_the_actual_outputs_it_reads():
    """READS_ACTUAL is complete: every comparator whose source reads another actual output names it there."""
    import inspect
    import re

    from contracts import compare

    for name, fn in COMPARATORS.items():
        source = inspect.getsource(getattr(fn, "__wrapped__", fn))
        read = set(re.findall(r'actual_outputs(?:\["|\.get\(")(\w+)"', source))
        assert read <= set(READS_ACTUAL.get(name, ())), f"{name} reads {sorted(read)}: add them to READS_ACTUAL"
    assert compare.READS_ACTUAL is READS_ACTUAL


# (comparator, what the context lacks, the text its failure names): a judge that reads a companion -- another
# actual output, or an input giving a reduction length -- handed a tree without it
MISSING_COMPANION = [
    ("recv_y", "actual recv_expert_count", "recv_expert_count"),
    ("greedy", "actual logits", "no logits"),
    ("rms_scale", "input x_mixed", "x_mixed"),
    ("norm_bf16", "inputs hidden and weight", "hidden"),
]


@pytest.mark.parametrize("comparator, lacks, names", MISSING_COMPANION, ids=[m[0] for m in MISSING_COMPANION])
def test_a_judge_without_its_companion_fails_naming_it(comparator, lacks, names):
    """A wrong input of another kind: the tree lacks what the judge reads besides the pair (here the expected
    output itself is handed as the actual one). The judge fails naming what is missing -- never passes, never
    crashes. Spec: §7.3."""
    e = torch.ones(2, 2, 4) if comparator == "recv_y" else torch.ones(2, 4)
    if comparator == "greedy":
        e = torch.zeros(2, dtype=torch.int32)
    expected = {"recv_expert_count": torch.zeros(2, 2, dtype=torch.int32)} if comparator == "recv_y" else {}
    verdict = COMPARATORS[comparator]("out", e.clone(), e, Context({}, {}, expected, {}))
    assert not verdict.ok and names in str(verdict), f"{comparator} without its {lacks}: {verdict}"


def test_compare_all_fails_an_output_the_backend_did_not_return():
    """compare_all over a tree whose backend returned all outputs but one: that output fails as missing, the others
    are judged. Spec: §7.3."""
    e = {"a": torch.ones(2, 3), "b": torch.zeros(2, 3)}
    verdicts = compare_all({"a": "exact", "b": "exact"}, Context({}, {"a": e["a"].clone()}, e, {}))
    assert verdicts["a"].ok and not verdicts["b"].ok and "missing" in str(verdicts["b"]), verdicts


@pytest.mark.parametrize("judge", ["v4_kv_pool", "v4_cp_kv_cache"])
def test_an_in_place_cache_judge_keeps_every_unwritten_byte(judge):
    """A wrong input of the in-place kind: a cache the call writes in place, whose written rows are exact and one
    element of a row it does not write is moved by one ULP. Within the written rows' relative budget that is
    nothing, but the row belongs to the caller: the judge fails it byte for byte (upstream's mapped-pool
    comparators compare the unmapped rows with the input exactly). Spec: §8."""
    from contracts import compare

    fn = {"v4_kv_pool": compare.v4_kv_pool, "v4_cp_kv_cache": compare.v4_cp_kv_cache}[judge]
    case, wiring, output = _examples()[judge]
    tree = _tree(case, wiring)
    e, before = tree.expected[output], tree.inputs[output]
    rows = e.reshape(-1, e.shape[-1])
    kept = (rows.view(torch.int16) == before.reshape(-1, e.shape[-1]).view(torch.int16)).all(-1) \
        if e.dtype == torch.bfloat16 else (rows == before.reshape(-1, e.shape[-1])).all(-1)
    assert bool(kept.any()) and not bool(kept.all()), f"{case}: the cache needs written and unwritten rows"
    r = int(kept.nonzero()[0])
    a = rows.clone()
    col = int(a[r].abs().argmax())
    a[r, col] = torch.nextafter(a[r, col].float(), torch.tensor(float("inf"))).to(a.dtype) \
        if a.dtype != torch.bfloat16 else (a[r, col:col + 1].view(torch.int16) + 1).view(torch.bfloat16)[0]
    a = a.reshape(e.shape)
    assert fn(output, e.clone(), e, _context(tree, output, e.clone(), e)).ok
    verdict = fn(output, a, e, _context(tree, output, a, e))
    assert not verdict.ok, f"{judge} passed a one-ULP change of an unwritten row ({case}/{wiring}:{output} row {r})"
