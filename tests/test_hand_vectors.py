"""Every hand vector in the contracts is checked to separate the rule it pins from the plausible alternatives
(issue #26 item 1): a contract test that checks a kernel on hand-built values calls
``contracts.separation.separates``, which computes each alternative on the same inputs and asserts the expected
bytes differ from every one.

A hand-vector test is found from its source: not a hypothesis property, and it builds tensors from float
literals or says "hand" in its docstring. Each one either calls ``separates`` or is listed below: in
``NOT_A_RULE`` with why it pins no arithmetic rule (a refusal, a comparator's own bound, a differential test).
No vector is left without its alternatives (the 21 integer layout, ordering and boundary vectors of the last
round were the last).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

NOT_A_RULE = {
    "test_v4_embed_pack.py::test_every_stream_is_its_own_storage": ("a storage property (no aliasing between "
                                                                     "streams), not a value rule"),
    # comparator tests: their clauses are judged by tests/test_comparator_clauses.py (item 2), not a kernel rule
    "test_comparators.py::test_bounds_are_inclusive": "a comparator's own bound",
    "test_comparators.py::test_the_decode_common_pre_mix_variant_stays_selectable": "a comparator variant by name",
    "test_comparators.py::test_the_mxfp8_activation_is_judged_by_value_not_bytes": "a comparator's judging rule",
    "test_comparators.py::test_topk_cutoff_tolerance_and_overlap": "a comparator's own bound",
    "test_comparators.py::test_replay_comparators_exact_and_masked_scores": "a comparator's own bound",
    "test_comparators.py::test_ratio_allclose_counts_active_elements_and_needs_a_zero_tail": "a comparator's bound",
    "test_lm_head.py::test_the_logit_and_greedy_comparators_fail_just_outside_their_bounds": "a comparator's bound",
    "test_v4_prefill_compressor.py::test_the_pool_check_fails_just_outside_each_clause": "a comparator's clauses",
    "test_v4_prefill_indexer.py::test_the_prefill_hard_floor_is_7e_3": "a comparator's bound",
    "test_lm_head.py::test_a_single_column_of_logits_picks_id_zero": "a shape boundary (one column), no arithmetic",
    "test_topk.py::test_candidate_blocks_accept_every_tie_order_and_nothing_else":
        "a comparator: every legal tie order accepted, each alternative selection computed and refused",
    "test_comparators.py::test_state_comparator_bound_and_untouched_bytes": "a comparator's own clauses (item 2)",
    "test_mhc.py::test_the_mhc_budgets_fail_just_outside_each_clause": "a comparator's own clauses (item 2)",
    "test_moe.py::test_the_gate_comparators_fail_just_outside_their_bounds": "a comparator's own clauses (item 2)",
    "test_moe.py::test_the_moe_row_comparator_fails_just_outside_each_clause": "a comparator's own clauses (item 2)",
    "test_topk.py::test_topk_other_swaps_are_rejected": "a comparator's own clauses (item 2)",
    "test_topk.py::test_topk_overlap_variant": "a comparator's own clauses (item 2)",
    "test_topk.py::test_topk_structural_violations_are_named": "a comparator's own clauses (item 2)",
    "test_topk.py::test_topk_tied_cutoff_swap_is_accepted": "a comparator's own clauses (item 2)",
    "test_topk.py::test_topk_decode_c1a_variant_skips_order_and_padding_rules": "a comparator's own clauses (item 2)",
    "test_attention_layer.py::test_an_accepted_alternative_selection_is_judged_against_its_own_reference": "a comparator's own clauses (item 2)",
    "test_v4_compressor_txn.py::test_with_every_page_current_it_is_the_paged_ring":
        "a differential test: the transactional compressor equals the paged ring bit for bit over every step",
    # refusals of bad input: the alternative is accepting it, which the test shows fails
    "test_checkpoint_reader.py::test_the_reader_refuses_naming_what": "a refusal of bad input",
    "test_rope.py::test_rope_rows_reject_position_beyond_capacity": "a refusal of bad input",
    "test_v4_metadata.py::test_bad_starts_and_tables_are_refused_naming_the_field": "a refusal of bad input",
    "test_v4_prefill_layer.py::test_packed_layer_inputs_are_refused_naming_the_field": "a refusal of bad input",
    "test_cp_layer.py::test_the_cp_swa_layer_is_the_unsplit_packed_layer": (
        "two operators against each other (the CP layer and the unsplit packed layer on the same chunk): no value "
        "is worked out by hand"),
    "test_v4_prefill_layer.py::test_a_request_with_no_rows_this_step_changes_nothing": (
        "an edge of the packing (a request with no rows, INT64 spans) judged against the same layer called without "
        "it, not a value rule"),
    # whole-operator agreement with an independent evaluation, not a pinned vector
    "test_attention_layer.py::test_half_layer_matches_the_reference_within_its_bound": "bound agreement",
    "test_v4_sparse_attention.py::test_each_path_matches_an_independent_evaluation": "independent evaluation",
    "test_v4_mtp_layer.py::test_the_head_mix_matches_an_independent_evaluation": "independent evaluation",
    "test_engram.py::test_the_engram_output_is_the_released_formula_within_its_budget": "a bound, not bytes",
    "test_quant.py::test_rule_vectors_cover_every_rule_and_separate_each_pair":
        "the quant rules' separation itself (tests/test_rule_separation.py swaps every pair)",
    "test_quant.py::test_each_rule_matches_its_hand_vectors":
        "separated pairwise by tests/test_rule_separation.py (every rule swapped for every other fails it)",
}

def _hand_vector_tests() -> dict[str, bool]:
    """{file::test: whether it calls separates} for every hand-vector test of contracts/."""
    out = {}
    for path in sorted((ROOT / "contracts").glob("test_*.py")):
        for node in ast.parse(path.read_text()).body:
            if not isinstance(node, ast.FunctionDef) or not node.name.startswith("test"):
                continue
            if any("given" in ast.unparse(d) for d in node.decorator_list):
                continue
            body, doc = ast.unparse(node), ast.get_docstring(node) or ""
            literal = re.search(r"torch\.tensor\(\[[^\]]*\d\.\d", body) or re.search(r"2\.0 ?\*\* ?-\d", body)
            built = re.search(r"torch\.tensor\(\[", body) and "pytest.raises" not in body  # integer vectors too
            if literal or built or re.search(r"\bhand\b|hand-computed|vector|separat", doc, re.I):
                out[f"{path.name}::{node.name}"] = "separates(" in body or "separates_under(" in body
    return out


FOUND = _hand_vector_tests()


def test_the_scan_finds_the_hand_vectors():
    assert len(FOUND) >= 40 and "test_tp.py::test_all_reduce_casts_once_after_the_fp32_sum_in_rank_order" in FOUND


@pytest.mark.parametrize("name", sorted(FOUND))
def test_each_hand_vector_separates_its_rule_or_says_why_not(name):
    calls = FOUND[name]
    if name in NOT_A_RULE:
        assert not calls, f"{name} calls separates: take it off NOT_A_RULE"
        return
    assert calls, (f"{name} pins a hand vector without computing the alternatives it separates the rule from: "
                   "call contracts.separation.separates (or list it in NOT_A_RULE with why)")


def test_the_lists_name_only_tests_that_exist():
    stale = sorted(set(NOT_A_RULE) - set(FOUND))
    assert not stale, f"listed but not found as hand-vector tests: {stale}"


def test_the_one_rounding_bf16_alternative_is_one_rounding():
    """bf16_once rounds FP64 to BF16 once; torch's cast goes through FP32 and rounds twice (which is why the
    helper exists): 1 + 2^-8 + 2^-30 is 1 + 2^-7 once, 1.0 twice; an exact tie 1 + 2^-8 goes to even (1.0)."""
    import torch

    from contracts.separation import bf16_once

    x = torch.tensor([1 + 2.0**-8 + 2.0**-30, 1 + 2.0**-8, -(2.0**-7 + 2.0**-15), 0.0], dtype=torch.float64)
    assert bf16_once(x).tolist() == [1 + 2.0**-7, 1.0, -2.0**-7, 0.0]
    assert x[:1].to(torch.bfloat16).item() == 1.0  # torch's two roundings
