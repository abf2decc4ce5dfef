"""Every contract family catches at least one seeded defect loaded through the backend registry.

Each row: the defect (``module:OBJECT`` under tests.defects, loaded with the same loader as
``--backend-module``), the contract test it must fail, and text the failure must contain (the
field, row or rank the contract names). Each contract also passes on the torch reference
(the contracts/ suite itself).
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

from backends import load_backend_module
from tests import forkserver
from tests.harness import run_contract

ROOT = Path(__file__).resolve().parents[1]

CASES = [
    # schedule (§1)
    ("schedule:FIRST_SOURCE", "test_schedule:test_schedule_sources_same_ratio_at_or_before", "kv_source"),
    ("schedule:FIRST_SOURCE", "test_schedule:test_schedule_source_resolution_table", "(2, 2, 2, 2"),
    ("schedule:NO_REINDEX", "test_schedule:test_schedule_mode_counts", "kind counts"),
    ("schedule:NO_REINDEX", "test_schedule:test_schedule_representative_layers", "layer 24"),
    # metadata invariants (§3)
    ("metadata:NEW_KV_NOT_UPDATED", "test_metadata:test_metadata_query_layout", "new_kv_seq_lens"),
    ("metadata:TOKEN_REQ_SKIPS_EMPTY", "test_metadata:test_metadata_token_requests", "token_to_req_indices"),
    ("metadata:COMPRESSED_LENS_NOT_CAUSAL", "test_metadata:test_metadata_compressed_lens", "compressed_lens"),
    ("metadata:COMPRESSOR_SOURCE_FIRST_ROW", "test_metadata:test_metadata_compressor_outputs",
     "compressor_source_token_indices"),
    ("metadata:ROPE_POSITION_IS_COMPLETING", "test_metadata:test_metadata_compressed_rope_positions",
     "compressed_rope_position_ids"),
    ("metadata:INACTIVE_TO_DUMMY_ROW", "test_metadata:test_metadata_live_slots_unique_and_owned", "compressed_slots"),
    ("metadata:LOGIT_FIRST_ROW", "test_metadata:test_metadata_logit_rows", "logit_row_indices"),
    ("metadata:WINDOW_SLOTS_INT32", "test_metadata:test_metadata_field_layout", "window_slots.dtype"),
    ("metadata:WINDOW_NEWEST_FIRST", "test_metadata:test_metadata_all_invariants_at_flash_dims", "window_indices"),
    ("metadata:WINDOW_NEWEST_FIRST", "test_metadata:test_metadata_window", "window_indices"),
    ("metadata:COMPRESSED_SLOT_OFF_BY_ONE", "test_metadata:test_metadata_compressed_slots", "compressed_slots"),
    ("metadata:INACTIVE_STATE_NOT_FORCED", "test_metadata:test_metadata_compressed_slots", "compressed_slots"),
    ("metadata:MOE_OWNERS_BY_SLAB", "test_metadata:test_metadata_moe_owners", "moe_token_owners"),
    ("metadata:STATE_BY_BATCH_ROW", "test_metadata:test_metadata_state_tables_pass_through", "state_block_tables"),
    # identity pages move window_slots and window_indices alike: the contract names whichever it checks first
    ("metadata:IDENTITY_PAGES", "test_metadata:test_metadata_window", "window_"),
    ("metadata:PADDING_ROWS_ZERO", "test_metadata:test_metadata_positions", "padding row"),
    # metamorphic (§3)
    ("metadata:IDENTITY_PAGES", "test_metadata_metamorphic:test_metadata_page_permutation_moves_slots_only_through_the_table",
     "window_slots"),
    ("metadata:STATE_BY_BATCH_ROW", "test_metadata_metamorphic:test_metadata_request_reorder_permutes_per_request_fields_only",
     "state_block_tables"),
    ("metadata:MOE_OWNERS_BY_SLAB", "test_metadata_metamorphic:test_metadata_trailing_padding_changes_no_active_field",
     "moe_token_owners"),
    # bad input (§3)
    ("metadata:NO_STATE_DEDUP", "test_metadata_errors:test_metadata_rejects_duplicate_state_block", "accepted bad input"),
    ("metadata:CLAMPS_QSL", "test_metadata_errors:test_metadata_rejects_decreasing_query_start_loc", "query_start_loc"),
    ("metadata:CLAMPS_KV", "test_metadata_errors:test_metadata_rejects_negative_kv_length", "accepted bad input"),
    ("metadata:UNCHECKED_PAGES", "test_metadata_errors:test_metadata_rejects_unmapped_window_page_in_visible_range",
     "accepted bad input"),
    ("metadata:NO_ALLOCATION_CHECK", "test_metadata_errors:test_metadata_rejects_missing_visible_compressed_page",
     "accepted bad input"),
    ("metadata:STATE_BELOW_MINUS_ONE_OK", "test_metadata_errors:test_metadata_rejects_state_block_below_minus_one",
     "accepted bad input"),
    ("metadata:ANY_TP", "test_metadata_errors:test_metadata_rejects_unsupported_tp", "accepted bad input"),
    ("metadata:LENIENT_STATE_DTYPE", "test_metadata_errors:test_metadata_rejects_structural_mistakes", "accepted bad input"),
    # slabs (§7.1)
    ("slabs:WIDTH_FROM_ACTIVE", "test_slabs:test_slab_bounds_spec_examples", "(4, 4, 8)"),
    ("slabs:WIDTH_FROM_ACTIVE", "test_slabs:test_slab_every_active_row_has_exactly_one_owner", "width"),
    ("slabs:SHARD_STALE_PADDING", "test_slabs:test_slab_padding_contract_on_every_rank", "payload not zero"),
    ("slabs:GATHER_REVERSED", "test_slabs:test_slab_gather_of_shard_is_byte_exact", "differs"),
    ("slabs:GATHER_UNCHECKED", "test_slabs:test_slab_gather_rejects_a_padding_breach", "DID NOT RAISE"),
    ("slabs:LENIENT_BOUNDS", "test_slabs:test_slab_bounds_reject_bad_arguments", "DID NOT RAISE"),
    # MX codecs (§2.2)
    ("quant:SWAPPED_NIBBLES", "test_quant:test_fp4_nibble_order_hand_vectors", "nibble order"),
    ("quant:ROUND_HALF_UP", "test_quant:test_tie_rules_differ_exactly_on_midpoints", "midpoint"),
    ("quant:ROUND_HALF_UP", "test_quant:test_fp4_nibble_order_hand_vectors", "payload[0][0]"),
    ("quant:SCALE_FLOOR", "test_quant:test_scales_are_powers_of_two_and_cover_amax", "does not cover amax"),
    ("quant:OFF_BY_ONE_GROUP", "test_quant:test_dequantized_within_half_step", "half step"),
    ("quant:E4M3_CLAMP_240", "test_quant:test_scales_are_powers_of_two_and_cover_amax", "expected E4M3"),
    ("quant:E4M3_CLAMP_240", "test_quant:test_dequantized_within_half_step", "half step"),
    ("quant:E8M0_BIAS_128", "test_quant:test_mxfp8_hand_vector", "assert"),
    ("quant:DEQUANT_HALF_SCALE", "test_quant:test_requantization_is_stable", "re-quantized value"),
    ("quant:HOST_EXACT_CEILING", "test_quant:test_each_rule_matches_its_hand_vectors", "probe 2"),
    ("quant:DEQUANT_HALF_SCALE", "test_quant:test_dequantized_within_half_step", "half step"),
    ("quant:NAN_TO_ZERO", "test_quant:test_non_finite_poisons_its_group_only", "decodes to finite values"),
    ("quant:SIGNLESS_ZERO", "test_quant:test_zero_subnormal_and_huge_groups", "lost its sign"),
    ("quant:DEQUANT_SATURATES", "test_quant:test_e8m0_fp4_decode_can_overflow_fp32", "assert"),
    ("quant:PAD_TO_GROUP", "test_quant:test_codec_rejects_bad_input", "DID NOT RAISE"),
    # quantized cache ABI (§2.3, §6)
    ("quant:READ_FP32", "test_cache:test_read_decodes_the_whole_cache_to_bf16", "assert"),
    ("quant:LENIENT_SLOTS", "test_cache:test_publish_rejects_bad_slots", "DID NOT RAISE"),
    ("quant:PUBLISH_UNMAPPED", "test_cache:test_publish_touches_only_mapped_rows", "unmapped row changed"),
    ("quant:PUBLISH_SWAPPED_NIBBLES", "test_differential:test_cache_publish_bytes_equal_the_reference",
     "cache_publish("),
    ("quant:PUBLISH_E8M0_BIAS_128", "test_differential:test_cache_publish_bytes_equal_the_reference",
     "cache_publish("),
    # compressor ring (§4.1)
    ("reference:COMPRESSOR_ALL_ROWS_WRITE", "test_compressor:test_compressor_chunked_equals_unchunked", "ring slot"),
    ("reference:COMPRESSOR_NUM_TOKENS_FROM_QSL",
     "test_compressor:test_an_explicit_num_tokens_inside_a_requests_span_cuts_the_request_there", "num_tokens="),
    ("reference:COMPRESSOR_WHOLE_REQUESTS_ONLY",
     "test_compressor:test_an_explicit_num_tokens_inside_a_requests_span_cuts_the_request_there", "num_tokens="),
    ("reference:COMPRESSOR_PARTNER_WRONG_SLOT", "test_compressor:test_compressor_chunked_equals_unchunked",
     "latent row"),
    ("reference:COMPRESSOR_PARTNER_WRONG_SLOT", "test_compressor:test_compressor_restored_odd_prefix_equals_uninterrupted",
     "restored resume differs"),
    ("reference:COMPRESSOR_BLOCK_BY_BATCH_ROW",
     "test_compressor:test_compressor_reorder_departure_admission_block_reuse", "differs from its unchunked run"),
    ("reference:COMPRESSOR_NEGATIVE_BLOCK_WRAPS", "test_compressor:test_compressor_inactive_block_means_no_state_access",
     "ring blocks other than"),
    ("reference:COMPRESSOR_WRITES_NEIGHBOR", "test_compressor:test_compressor_untouched_ring_slots_are_byte_identical",
     "unmapped row changed"),
    ("reference:COMPRESSOR_NUM_TOKENS_FROM_SHAPE", "test_compressor:test_compressor_num_tokens_zero_touches_nothing",
     "assert"),
    ("reference:COMPRESSOR_LENIENT_STATE", "test_compressor:test_compressor_rejects_bad_state_cache", "DID NOT RAISE"),
    # mHC (§1, HC-01/02/11)
    ("mhc:SINKHORN_EARLY", "test_mhc:test_the_sinkhorn_iteration_count_is_twenty", "check_ratio_allclose"),
    ("mhc:TAIL_KEPT", "test_mhc:test_rows_past_num_tokens_are_exactly_zero_and_active_rows_do_not_depend_on_them",
     "pre tail"),
    ("mhc:PRODUCTS_IN_BF16", "test_mhc:test_hc_pre_sums_in_fp32_and_casts_once", "row 0 got"),
    ("mhc:RESIDUAL_NOT_TRANSPOSED", "test_mhc:test_hc_post_applies_the_residual_mix_transposed_and_keeps_fp32",
     "stream 2"),
    ("mhc:POST_THROUGH_BF16", "test_mhc:test_hc_post_applies_the_residual_mix_transposed_and_keeps_fp32",
     "stream 2"),
    # MoE (§1, MO-01/02/09)
    ("moe:BIAS_IN_WEIGHTS", "test_moe:test_the_correction_bias_moves_the_selection_and_never_the_weights",
     "unbiased scores normalised"),
    ("moe:TIES_TO_LAST", "test_moe:test_ties_go_to_the_lower_expert_id_and_the_topk_rule_stays_selectable", "ties:"),
    ("moe:ROUTE_AFTER_DOWN", "test_moe:test_the_route_weight_multiplies_the_hidden_before_its_bf16_boundary",
     "outputs are not BF16 values"),
    ("moe:SYMMETRIC_GATE_CLAMP", "test_moe:test_the_swiglu_clamp_placement_is_separated_from_each_alternative",
     "one BF16 rounding"),
    ("moe:CLAMP_AFTER_SILU", "test_moe:test_the_swiglu_clamp_placement_is_separated_from_each_alternative",
     "one BF16 rounding"),
    ("moe:SYMMETRIC_GATE_CLAMP", "test_moe:test_the_swiglu_clamps_gate_above_and_up_on_both_sides",
     "must not be clamped from below"),
    ("moe:NEIGHBOUR_RANK", "test_moe:test_dispatch_counts_slots_and_owners", "send_counts"),
    ("moe:NEIGHBOUR_RANK", "test_moe:test_ep_results_do_not_depend_on_the_ep_size_or_on_token_order", "differs from"),
    ("moe:COMBINE_IN_BF16", "test_moe:test_the_combine_sums_in_fp32_and_casts_once", "not FP32-sum-then-cast"),
    # the model boundary (SC-23, AP-18, CQ-26)
    ("lm_head:GREEDY_TIES_TO_LAST", "test_lm_head:test_greedy_ids_are_the_first_maximum", "[7, 9, 9]"),
    ("lm_head:GREEDY_TIES_TO_LAST", "test_lm_head:test_greedy_ids_agree_with_the_logits_they_come_from",
     "first maximum"),
    ("lm_head:SHARD_OFF_BY_ONE", "test_lm_head:test_a_shard_boundary_is_exact", "holds vocab rows"),
    ("lm_head:IDS_WRAP", "test_lm_head:test_the_embedding_pack_clamps_ids_and_copies_rows_bit_exact",
     "expected vocabulary row 0"),
    # the decode Block (HC-03, HC-04)
    ("block:NEXT_MIX_FROM_ATTENTION", "test_block:test_the_block_runs_the_delayed_pre_mix_order",
     "hand on the FFN's pre mix"),
    ("block:ATTENTION_WITH_OWN_MIX", "test_block:test_the_block_runs_the_delayed_pre_mix_order",
     "collapse with the incoming mix"),
    # the CED decoder replay (MD-16)
    ("prefill_plan:REPLAY_KEEPS_129", "test_prefill_plan:test_upstreams_hand_checked_replay_vector",
     "[0, 1, 127, 128, 129]"),
    ("moe:COUNT_FIRST_SOURCE", "test_moe:test_recv_y_holds_each_local_experts_outputs_in_slot_order",
     "recv_expert_count rank 0"),
    ("block:PADDING_MIX", "test_block:test_two_sharded_blocks_hand_off_owner_slabs_and_match_dense_mhc",
     "next_pre_mix has a non-zero padding row"),
    ("block:REUSE_FIRST_SOURCE",
     "test_block:test_the_causal_encoder_chains_twenty_blocks_and_reuse_layers_read_their_source", "layer 9"),
    # V4 (§8)
    ("v4:MTP_ROWS_SEQ_MAJOR", "test_v4_metadata:test_mtp_rows_are_request_major_with_two_positions_per_request",
     "[127, 0, 300, 9"),
    ("v4:HCA_TOPK_LAST", "test_v4_metadata:test_hca_topk_takes_the_first_compressed_positions", "[5, 6, 7]"),
    ("v4:OVERLAP_BY_TWO",
     "test_v4_compressor:test_the_overlapping_window_pools_the_previous_first_half_and_the_current_second_half",
     "position 7"),
    ("v4:APE_OFF_BY_ONE",
     "test_v4_compressor:test_the_overlapping_window_pools_the_previous_first_half_and_the_current_second_half",
     "position 3"),
    ("v4:INNER_TO_MAIN", "test_v4_compressor:test_csa_keeps_the_inner_state_out_of_the_main_pool", "main pool"),
    ("v4:E_ON_STREAM_ZERO", "test_v4_mtp:test_the_mtp_projection_is_the_shared_embedding_half_plus_each_streams_half",
     "not the released MTP projection"),
    ("v4:REDUCED_ACROSS_DP",
     "test_v4_dp_attention:test_each_dp_rank_gets_its_own_attention_and_nothing_is_reduced_across_ranks",
     "rank 0: output"),
    ("v4:ROPE_AT_CLOSE", "test_v4_compressor:test_a_closed_window_is_published_rotated_at_the_windows_first_position",
     "not rotated at the window start"),
    ("v4:CSA_BOUND_INCLUSIVE", "test_v4_sparse_attention:test_csa_keeps_a_raw_slot_only_below_position_plus_one_over_four",
     "CSA must read exactly the slots below"),
    ("v4:CMP_SLOTS_PHYSICAL", "test_v4_sparse_attention:test_compressed_slots_are_paged_through_each_requests_table",
     "slots read as physical rows"),
    ("v4:PROBS_UNROUNDED", "test_v4_sparse_attention:test_each_path_matches_an_independent_evaluation", "attn_out"),
    ("v4:LATENT_ROUNDED_BF16",
     "test_v4_sparse_attention:test_the_latent_stays_fp32_and_each_token_group_has_its_own_int8_scale",
     "64 codes: BF16 latent"),
    ("v4:ACT_SCALE_PER_TOKEN",
     "test_v4_sparse_attention:test_the_latent_stays_fp32_and_each_token_group_has_its_own_int8_scale",
     "group 0 coded on its own scale"),
    ("v4:FORWARD_ROPE", "test_v4_sparse_attention:test_the_inverse_rotation_acts_on_the_last_rope_dims",
     "the inverse rotation"),
    ("v4:RELU_AFTER_SUM", "test_v4_indexer:test_the_relu_acts_per_head_before_the_head_weights",
     "ReLU per head, then weights 1 and 2"),
    ("v4:VISIBLE_FROM_POSITION", "test_v4_indexer:test_the_visible_range_is_the_cache_and_the_causal_bound",
     "expected [2, 3, 3, 4, 3, 3, 0, 1]"),
    ("v4:OFFSET_DROPPED", "test_v4_indexer:test_every_pick_carries_the_window_offset", "must shift every pick"),
    ("v4:TAIL_NAN", "test_v4_indexer:test_scores_and_topk_match_an_independent_evaluation", "finite"),
    ("v4:TOPK_BY_POSITION", "test_v4_indexer:test_scores_and_topk_match_an_independent_evaluation",
     "clear inversion"),
    ("v4:HADAMARD_BEFORE_ROPE", "test_v4_indexer:test_scores_and_topk_match_an_independent_evaluation", "score"),
    ("v4:PREFILL_ROPE_PER_REQUEST", "test_v4_prefill_indexer:test_each_row_is_rotated_with_its_own_rope_row",
     "a RoPE row per token"),
    ("v4:PREFILL_OFFSET_ADDED", "test_v4_prefill_indexer:test_picks_are_raw_compressed_positions", "no offset"),
    ("v4:PREFILL_PADDING_SCORED",
     "test_v4_prefill_indexer:test_padding_rows_are_never_scored_and_do_not_touch_real_rows",
     "padding rows were scored"),
    ("v4:PREFILL_DECODE_WIDTH",
     "test_v4_prefill_indexer:test_the_visible_range_is_the_position_bound_capped_at_two_blocks", "expected [8, 256]"),
    ("v4:PREFILL_PADDING_COMPRESSED", "test_v4_prefill_compressor:test_padding_rows_are_never_read_or_written",
     "a padding row was read or written"),
    ("v4:PREFILL_UNPERSISTED_WRITTEN",
     "test_v4_prefill_compressor:test_an_unpersisted_row_is_pooled_but_leaves_its_state_row",
     "although its mapping is -1"),
    ("v4:PREV_HALF_ZERO_SCORE", "test_v4_prefill_compressor:test_the_first_windows_have_no_previous_half",
     "worst cmp_pool"),
    ("v4:TXN_EPOCH_IGNORED", "test_v4_compressor_txn:test_a_page_of_another_epoch_is_never_read",
     "differ from the FP64 evaluation"),
    ("v4:TXN_RANGE_IGNORED", "test_v4_compressor_txn:test_positions_outside_the_valid_range_take_no_part",
     "differ from the FP64 evaluation"),
    ("v4:TXN_NO_OVERLAY", "test_v4_compressor_txn:test_this_steps_rows_overlay_the_state",
     "differ from the FP64 evaluation"),
    ("v4:TXN_COMMIT_FIRST", "test_v4_compressor_txn:test_the_commit_comes_after_the_pool",
     "differ from the FP64 evaluation"),
    ("v4:GATE_BIAS_IN_WEIGHTS", "test_v4_gate:test_the_bias_chooses_but_does_not_weigh", "weights"),
    ("v4:GATE_HASH_BY_SCORE", "test_v4_gate:test_the_first_layers_route_by_token_id", "routes by token id = False"),
    ("v4:GATE_SCALE_RECIPROCAL", "test_v4_gate:test_the_dispatch_scale_is_amax_over_127_times_the_rms",
     "not amax · (1/127) · inv_rms"),
    ("v4:GATE_NAIVE_SOFTPLUS", "test_v4_gate:test_the_softplus_keeps_its_negative_tail", "the tail experts scored 0"),
    ("v4:GATE_PADDING_ROUTED", "test_v4_gate:test_padding_rows_route_nowhere", "assert"),
    ("v4:GATE_PADDING_CODES_ZERO", "test_v4_gate:test_padding_rows_inside_the_active_tile_hold_their_codes",
     "a padding row inside the active tile"),
    ("v4:PREFILL_ROPE_WIDTH_FROM_TABLE",
     "test_v4_prefill_compressor:test_upstreams_full_width_rope_table_reads_its_first_half", "first half"),
    ("reference:COMPRESSOR_SHARED_BLOCK_UNCHECKED",
     "test_compressor:test_two_requests_on_one_state_block_are_refused_or_updated_in_place_by_name", "DID NOT RAISE"),
    ("v4:EXPERT_UP_OPEN_BELOW", "test_v4_moe:test_the_swiglu_limits_clamp_gate_above_and_up_on_both_sides", "worst"),
    ("v4:EXPERT_NO_ROUTE_WEIGHT", "test_v4_moe:test_an_expert_row_matches_an_independent_evaluation", "worst"),
    ("v4:EXPERT_H_NOT_RECODED", "test_v4_moe:test_an_expert_row_matches_an_independent_evaluation", "relative"),
    ("v4:COMBINE_IN_BF16", "test_v4_moe:test_the_combine_is_one_fp32_sum_rounded_once",
     "not the FP32 sum rounded once"),
    ("v4:MOE_STAGE_PRENORMED", "test_v4_moe:test_the_moe_stage_is_hc_pre_then_the_moe_then_hc_post",
     "x_out is not hc_post"),
    ("v4:MOE_STAGE_PADDING_ZERO", "test_v4_moe:test_padding_rows_carry_their_residual_mix", "padding row of x_out is 0"),
    ("v4:HEAD_MIX_NO_EPS", "test_v4_mtp_layer:test_the_head_mix_keeps_hc_eps", "assert"),
    ("v4:MTP_NEXT_FROM_ATTENTION", "test_v4_mtp_layer:test_the_mtp_layer_is_its_stages_in_order",
     "does not receive the MoE stage's streams"),
    ("v4:MTP_HEAD_UNNORMED", "test_v4_mtp_layer:test_the_mtp_layer_is_its_stages_in_order",
     "not the stages in order"),
    ("v4:MTP_HEAD_MIX_OVER_BATCH", "test_v4_mtp_layer:test_a_decode_row_moves_only_its_own_outputs_and_cache_row",
     "hidden_out: rows moved"),
    ("v4:EVENTS_IN_REQUEST_ORDER",
     "test_v4_compressor_txn:test_an_event_publishes_its_requests_row_with_the_events_rope_rows",
     "the event's rows did not publish"),
    ("v4:EVENT_MISSING_WRITTEN",
     "test_v4_compressor_txn:test_a_request_without_an_event_publishes_nothing_under_the_current_rule",
     "a request without an event wrote"),
    ("v4:PREFILL_WINDOW_WITHOUT_SELF", "test_v4_metadata:test_a_prefill_window_is_the_last_positions_oldest_first",
     "window of row"),
    ("v4:PREFILL_PADDING_KV_WRITTEN",
     "test_v4_attention_stage:test_the_prefill_form_is_the_decode_chain_on_the_real_rows_with_a_zero_tail",
     "a padding row wrote its slot"),
    ("v4:PREFILL_STAGE_NO_ZERO_TAIL",
     "test_v4_attention_stage:test_the_prefill_form_is_the_decode_chain_on_the_real_rows_with_a_zero_tail",
     "padding rows of x_out are not 0"),
    ("v4:PREFILL_MTP_COMPRESSED_PROFILE", "test_v4_mtp_layer:test_the_prefill_mtp_layer_is_its_stages_in_order",
     "prefill hidden_out is not the stages in order"),
    ("v4:PREFILL_MTP_ALL_ROWS_REAL", "test_v4_mtp_layer:test_prefill_padding_rows_leave_no_trace",
     "moved with the padding rows"),
    ("v4:PREFILL_KEYS_PADDING_READ",
     "test_v4_prefill_compressor:test_the_prefill_index_keys_are_the_chunks_windows_written_as_int8_keys",
     "a padding row was written"),
    ("v4:EP_LANES_TOKEN_MAJOR", "test_v4_moe:test_each_experts_lanes_are_source_major", "lanes"),
    ("v4:EP_COMBINE_ROUTE_SHIFTED", "test_v4_moe:test_expert_parallel_moe_equals_each_ranks_own_moe",
     "differs from its own one-rank MoE"),
    ("v4:PADDING_ROWS_ATTENDED",
     "test_v4_sparse_attention:test_a_prefill_chunk_is_one_request_with_zero_padding_rows",
     "padding rows are not zero"),
    ("v4:BF16_BEFORE_ROPE", "test_v4_compressor:test_the_compressed_row_is_rounded_once_after_its_rope",
     "expected one rounding after the rotation"),
    ("v4:KEY_SCALE_DIVIDED", "test_v4_index_cache:test_an_index_key_is_rotated_rounded_transformed_rounded_and_coded",
     "1 / (127 / amax)"),
    ("v4:KEY_HADAMARD_BEFORE_ROPE",
     "test_v4_index_cache:test_an_index_key_is_rotated_rounded_transformed_rounded_and_coded", "codes"),
    ("v4:KEY_UNROUNDED_BEFORE_HADAMARD",
     "test_v4_index_cache:test_an_index_key_is_rotated_rounded_transformed_rounded_and_coded", "codes"),
    ("v4:Q_FROM_FP32_QR", "test_v4_qkv_proj:test_the_query_is_built_from_the_int8_codes", "not the INT8 path"),
    ("v4:Q_NORM_ACROSS_HEADS", "test_v4_qkv_proj:test_each_query_head_is_normalised_on_its_own_without_a_weight",
     "the norm must be per head"),
    ("v4:KV_GAMMA_AFTER_ROPE", "test_v4_qkv_proj:test_the_kv_weight_applies_before_the_rotation",
     "the weight before the rotation"),
    ("v4:READ_BEFORE_WRITE", "test_v4_attention_stage:test_each_token_sees_its_own_kv_row",
     "with this chunk's rows written"),
    ("v4:ATTN_NORM_SKIPPED", "test_v4_attention_stage:test_the_stage_is_the_chain_of_its_operators",
     "not hc_post of the chained attention"),
    ("v4:SCALE_ROUNDED_DOWN", "test_v4_index_cache:test_the_scale_is_the_power_of_two_at_or_above_amax_over_448",
     "[1.0, 1.0,"),
    # the Engram block (HC-13, HC-14)
    ("engram:GATE_WITHOUT_SQRT", "test_engram:test_the_engram_output_is_the_released_formula_within_its_budget",
     "engram"),
    ("engram:VALUE_FIRST", "test_engram:test_the_engram_output_is_the_released_formula_within_its_budget",
     "engram"),
    ("engram:TP_UNMASKED", "test_engram:test_the_sharded_lookup_equals_the_single_rank_lookup_on_every_rank",
     "differs"),
    ("lm_head:NORM_WITHOUT_WEIGHT", "test_lm_head:test_the_boundary_chain_embeds_collapses_and_normalizes",
     "x_normed"),
    ("prefill_plan:NEW_BEFORE_TAIL",
     "test_prefill_plan:test_a_resumed_request_replays_its_cached_tail_before_its_new_rows", "[3, 4, 5, 6, 0, 1]"),
    ("prefill_plan:ALL_ROWS_NEW", "test_prefill_plan:test_the_encoder_replay_marks_only_new_rows_and_truncates_the_window",
     "is_new"),
    ("mhc:PER_STREAM_RMS", "test_mhc:test_the_inverse_rms_runs_over_the_flattened_streams", "per-stream norm"),
    ("mhc:SOFTMAX_ONLY", "test_mhc:test_the_residual_mix_is_doubly_stochastic_and_pre_post_are_in_range",
     "row sums"),
    ("moe:RECV_UNCHECKED", "test_moe:test_a_destination_over_its_receive_capacity_is_an_error", "DID NOT RAISE"),
    ("block:ACCEPTS_INACTIVE", "test_block:test_a_block_golden_needs_every_capacity_row_active", "DID NOT RAISE"),
    # RoPE rows (§4.2)
    ("reference:ROPE_CLAMPS_POSITIONS", "test_rope:test_rope_rows_reject_position_beyond_capacity", "DID NOT RAISE"),
    ("reference:ROPE_INTO_PADDING", "test_rope:test_rope_rows_exact_identity_and_untouched", "sentinels 17/19 lost"),
    # Top-K (§5.3)
    ("reference:TOPK_DUPLICATE", "test_topk:test_topk_selection_is_valid", "row selected twice"),
    ("reference:TOPK_HOLE", "test_topk:test_topk_selection_is_valid", "followed by a valid row"),
    ("reference:TOPK_REVERSED", "test_topk:test_topk_selection_is_valid", "strictly increase"),
    ("reference:TOPK_OUTSIDE", "test_topk:test_topk_selection_is_valid", "outside its request"),
    ("reference:TOPK_CUTOFF_SWAP", "test_topk:test_topk_selection_is_valid", "cutoff swap beyond tolerance"),
    ("reference:TOPK_LOGICAL_IDS", "test_topk:test_topk_page_permutation_changes_physical_ids_not_logical_selection",
     "selection changed"),
    ("reference:CANDIDATES_NO_FORCE", "test_topk:test_candidate_mask_keeps_the_last_visible_block", "dropped"),
    ("reference:CANDIDATES_NO_FORCE", "test_topk:test_candidate_selection_smoke_at_flash_size", "assert"),
    # sparse attention (§5.3)
    ("attention:SINK_IGNORED", "test_attention:test_sparse_attention_sink_hand_vectors", "sink 0"),
    ("attention:SINK_IGNORED", "test_attention:test_sparse_attention_within_the_row_bound_of_the_reference",
     "attention"),
    ("attention:SCALE_576", "test_attention:test_sparse_attention_sink_hand_vectors", "weight"),
    ("attention:WINDOW_ONLY", "test_attention:test_sparse_attention_within_the_row_bound_of_the_reference",
     "attention row"),
    ("attention:CAST_FIRST", "test_tp:test_all_reduce_casts_once_after_the_fp32_sum_in_rank_order", "one BF16 cast"),
    ("attention:REVERSED_RANKS", "test_tp:test_all_reduce_casts_once_after_the_fp32_sum_in_rank_order",
     "rank order"),
    ("attention:PAIRWISE_TREE", "test_tp:test_all_reduce_casts_once_after_the_fp32_sum_in_rank_order", "pairwise 0"),
    # the byte-exact property, on its cancelling partials, catches an order change by itself
    ("attention:REVERSED_RANKS", "test_tp:test_reduce_scatter_is_the_all_reduce_split_into_owner_slabs",
     "differs from the reference's bytes"),
    ("attention:PAIRWISE_TREE", "test_tp:test_reduce_scatter_is_the_all_reduce_split_into_owner_slabs",
     "differs from the reference's bytes"),
    ("attention:STALE_PADDING", "test_tp:test_reduce_scatter_is_the_all_reduce_split_into_owner_slabs",
     "not exactly zero"),
    # attention half-layer (§2.3, §6, §7.1): the judge names mode, phase, wiring, TP, rank and row
    ("half_layer:ONE_LARGE_ERROR", "test_attention_layer:test_half_layer_matches_the_reference_within_its_bound",
     "C1A_FULL prefill replicated TP1: output.rank0[active rows] row[9] error 0.0239868 > bound 0.0170874; "
     "max|a-e|"),
    ("half_layer:SPREAD_ERROR", "test_attention_layer:test_half_layer_matches_the_reference_within_its_bound",
     "output.rank"),
    ("half_layer:NAN_ROW", "test_attention_layer:test_half_layer_matches_the_reference_within_its_bound",
     "SWA prefill replicated TP1: output.rank0[active rows][9][5] = nan"),
    ("half_layer:STALE_SLAB_PADDING", "test_attention_layer:test_half_layer_matches_the_reference_within_its_bound",
     "SWA prefill sharded TP1: output.rank0 padding row[18][0] = 13, expected 0"),
    ("half_layer:SHARDED_REVERSED", "test_attention_layer:test_tp_partials_that_cancel_keep_their_remainder",
     "prefill sharded TP4: output.rank0 row[0]"),
    ("half_layer:CAST_BEFORE_SUM", "test_attention_layer:test_tp_partials_that_cancel_keep_their_remainder",
     "C1A_FULL prefill replicated TP2: output.rank0[active rows] row[4]"),
    ("half_layer:REUSE_REPUBLISHES", "test_attention_layer:test_half_layer_matches_the_reference_within_its_bound",
     "C2A_REUSE decode replicated TP1: compressed_scale (this mode writes no compressed cache) row[80]"),
    ("half_layer:REUSE_REPUBLISHES", "test_attention_layer:test_each_mode_writes_only_the_caches_it_owns",
     "written by a mode that does not own the compressed cache"),
    ("half_layer:C2A_FULL_ACCEPTS_SUFFIX", "test_attention_layer:test_the_half_layer_rejects_bad_calls",
     "C2A_FULL-decode-TP2-replicated: accepted a bad call (C2A_FULL inactive suffix)"),
    ("half_layer:TOKEN_ROPE_FOR_COMPRESSED",
     "test_attention_layer:test_half_layer_matches_the_reference_within_its_bound",
     "C2A_FULL prefill replicated TP1: output.rank0[active rows] row[1]"),
    ("half_layer:WINDOW_ONE_PAST", "test_attention_layer:test_half_layer_matches_the_reference_within_its_bound",
     "SWA prefill replicated TP1: output.rank0[active rows] row[13]"),
    ("half_layer:INACTIVE_ZEROED", "test_attention_layer:test_an_inactive_suffix_never_changes_an_active_row",
     "SWA prefill: an inactive replicated row lost the 13.0 sentinel"),
    ("half_layer:TOPK_PHYSICAL_ORDER",
     "test_attention_layer:test_request_order_and_page_layout_do_not_change_any_token",
     "C2A_FULL prefill: request order changed a token's Top-K"),
    ("half_layer:DEFAULT_CANDIDATES", "test_attention_layer:test_each_mode_demands_its_inputs",
     "C1A_REINDEX-prefill-TP2-replicated: ran without its input candidate_mask"),
    ("half_layer:STALE_SLAB_PADDING", "test_attention_layer:test_sharded_wiring_equals_the_replicated_wiring",
     "sharded-vs-replicated TP1: output.rank0 padding row[18][0] = 13, expected 0"),
    ("half_layer:WINDOW_ONE_PAST", "test_attention_layer:test_flash_head_geometry",
     "C1A_FULL decode replicated TP4: output.rank0[active rows] row[2]"),
    # precision (§6)
    ("precision:AVERAGING_ROWS", "test_precision:test_row_precision_one_bad_row_is_not_diluted", "good rows passed"),
    ("precision:NAN_BLIND", "test_precision:test_row_precision_nonfinite_fails", "passed"),
    ("precision:RMS_ONLY", "test_precision:test_row_precision_peak_bound_is_tight", "factor 1.0"),
    ("precision:SPLIT_POOLED", "test_precision:test_active_split_padding_cannot_dilute_active_error", "active"),
    ("precision:SPLIT_POOLED", "test_precision:test_active_split_inactive_rows_compared_separately", "inactive"),
    ("precision:OWNER_ROWS_IGNORE_PADDING", "test_precision:test_owner_rows_require_zero_padding", "rank"),
    ("precision:REPLICAS_ALLCLOSE", "test_precision:test_replicas_must_be_byte_identical", "replica"),
    ("precision:RMS_BOUND_2PCT", "test_precision:test_row_precision_rms_bound_is_tight", "factor 1.0"),
    ("precision:DTYPE_BLIND", "test_precision:test_row_precision_low_precision_dtypes", "dtype mismatch passed"),
    ("precision:ROW_BUDGET_3PCT", "test_precision:test_output_budget_row_bound_is_tight", "factor 1.0"),
    ("precision:GLOBAL_BUDGET_2PCT", "test_precision:test_output_budget_global_bound_is_tight", "factor 1.0"),
    ("precision:ZERO_ROWS_TOLERANT", "test_precision:test_output_budget_zero_reference_rows_must_be_exactly_zero",
     "assert"),
]


@pytest.mark.parametrize("defect, contract, mentions", CASES, ids=[f"{d}->{c.split(':')[1]}" for d, c, _ in CASES])
def test_contract_catches_seeded_defect(defect, contract, mentions):
    backend = load_backend_module(f"tests.defects.{defect}")
    module_name, test_name = contract.split(":")
    fn = getattr(importlib.import_module(f"contracts.{module_name}"), test_name)
    # a half-layer contract runs 72 calls: the first failing one is the evidence (and keeps CI fast)
    outcome = run_contract(fn, backend, stop_at_first=defect.startswith("half_layer:"))
    failures, crashes = outcome.failures, outcome.crashes
    assert failures, (f"contract {contract} did not fail cleanly on defect {defect}"
                      + (f": it crashed with {crashes[0]!r}" if crashes else ": it passed (the contract cannot fail)"))
    text = " | ".join(str(e) for e in failures)
    assert mentions in text, f"failure does not mention {mentions!r}: {text[:600]}"


def _declared_defects() -> list[tuple[str, object]]:
    """(contract module, SeededDefect) of every ``SEEDED_DEFECTS`` a contract file declares."""
    out = []
    for path in sorted((ROOT / "contracts").glob("test_*.py")):
        module = importlib.import_module(f"contracts.{path.stem}")
        out += [(path.stem, d) for d in getattr(module, "SEEDED_DEFECTS", ())]
    return out


DECLARED = _declared_defects()


@pytest.mark.parametrize("module_name, defect", DECLARED, ids=[f"{d.name}->{d.test}" for _m, d in DECLARED])
def test_contract_file_catches_its_declared_defect(module_name, defect):
    """The defects a contract file declares beside its contracts (pto_pytest.defect.SeededDefect)."""
    fn = getattr(importlib.import_module(f"contracts.{module_name}"), defect.test)
    outcome = run_contract(fn, defect.backend())
    assert outcome.failures, (f"contract {module_name}::{defect.test} did not fail cleanly on defect {defect.name}"
                              + (f": it crashed with {outcome.crashes[0]!r}" if outcome.crashes else ": it passed"))
    text = " | ".join(str(e) for e in outcome.failures)
    assert defect.mentions in text, f"failure does not mention {defect.mentions!r}: {text[:600]}"


def test_declared_defects_have_unique_names_and_name_their_operator():
    from contracts.operators import KERNEL_OPERATORS

    names = [d.name for _m, d in DECLARED]
    assert len(names) == len(set(names)), names
    assert all(d.operator in KERNEL_OPERATORS for _m, d in DECLARED)


def test_backend_module_option_runs_contracts_on_a_defect():
    """End to end: ``pytest --backend-module`` loads a defect and the contract run fails (exit 1)."""
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:randomly", "contracts/test_slabs.py",
           "--backend-module", "tests.defects.slabs:WIDTH_FROM_ACTIVE", "-k", "spec_examples"]
    proc = forkserver.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "failed" in proc.stdout

