"""The operators and the Backend type: an operator is a named callable with documented inputs/outputs; a
backend is a set of operators. Contracts take the implementation under test from the selected backend.

Built in: ``torch`` (the Torch references), ``emulated`` (the references with device-arithmetic twins in place
of the operators that have one) and ``pypto`` (the upstream A5 kernels, available only
where ``import pypto.language`` works). Out-of-tree backends load with
``--backend-module pkg.module:OBJECT`` where OBJECT is a Backend, or a zero-argument callable
returning one.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cache, partial


@dataclass(frozen=True)
class OperatorSpec:
    """The documented signature of one operator."""

    name: str
    signature: str
    returns: str
    spec: str


KERNEL_OPERATORS: dict[str, OperatorSpec] = {
    s.name: s
    for s in (
        OperatorSpec("build_forward_metadata",
                     "(query_start_loc [B+1], kv_seq_lens [B], window_block_table [B,P], "
                     "compressed_block_tables {src: [B,P]}, state_block_tables {src: I32 [B,1]}, *, config, "
                     "tp_size=1, capacity=None)",
                     "ForwardMetadata (kernels.metadata)", "§3"),
        OperatorSpec("resolve_schedule", "(config: V41Config)",
                     "tuple[LayerConfig] (mode, kind, kv_source, index_source per layer)", "§1"),
        OperatorSpec("sp_bounds", "(active_tokens, tp, capacity=None)",
                     "tuple[SlabBounds] with .first/.count/.width per rank", "§7.1"),
        OperatorSpec("sp_shard", "(x [T,D], token_ids [T], positions [T], *, tp, capacity=None)",
                     "list[Slab] (payload [width,D], token_ids, positions, valid)", "§7.1"),
        OperatorSpec("sp_gather", "(slabs, *, active_tokens, capacity=None)",
                     "(x [T,D], token_ids [T], positions [T]); raises ValueError on a padding breach", "§7.1"),
        OperatorSpec("mx_quantize", "(x [..., D] float, rule_name)", "MXTensor(payload, scale, rule)", "§2.2"),
        OperatorSpec("mx_dequantize", "(q: MXTensor, *, dtype=float32)", "[..., D] decoded values", "§2.2"),
        OperatorSpec("cache_publish", "(cache: QuantCache, values [N, logical], slots [N])",
                     "new QuantCache; only rows with slot >= 0 change", "§2.3"),
        OperatorSpec("cache_read", "(cache: QuantCache, *, dtype=bfloat16)", "[blocks, rows, 1, logical]", "§2.3"),
        OperatorSpec("compressor_ratio2",
                     "(x [T,hidden], query_start_loc, position_ids, token_to_req_indices, state_block_table [B,1], "
                     "state_cache [blocks,cap,2D] FP32, weights, *, eps, num_tokens, shared_block='refuse'|'in_place')",
                     "(latent [T,D], publish [T] bool, new state_cache)", "§4.1"),
        OperatorSpec("materialize_rope_rows",
                     "(freqs_cos [L,R], freqs_sin, position_ids [T], num_tokens, rope_cos [T,R], rope_sin) in place",
                     "None (writes rope_cos/rope_sin rows < num_tokens)", "§4.2"),
        OperatorSpec("index_scores",
                     "(q [T,H,Dk], head_weights [T,H], keys [rows,Dk], block_table, request_ids, compressed_lens, *, "
                     "block_size, width, candidates)", "scores [T, L] FP32, -inf where masked", "§5.1"),
        OperatorSpec("select_topk", "(scores [T,L], block_table, request_ids, *, topk, block_size)",
                     "[T, topk] INT32 physical rows, logical order, -1 padded", "§5.1"),
        OperatorSpec("candidate_blocks", "(scores [T,L], compressed_lens [T], *, block, topk_blocks, width)",
                     "U8 mask [T, width]", "§5.2"),
        OperatorSpec("sparse_attention",
                     "(query [T,H,D], window_kv [rows,D], window_indices [T,W], compressed_kv [rows,D], "
                     "compressed_indices [T,K], sink [H] FP32)",
                     "[T,H,D] in the query dtype: softmax over the valid rows of both sources plus the sink",
                     "§5.3"),
        OperatorSpec("o_proj", "(attended [T,H,D] BF16, rope_cos [T,R/2], rope_sin, wo_a [G,O,H*D/G] BF16, "
                     "wo_b [G*O, hidden] decoded)", "[T, hidden] FP32 partial (inverse RoPE, grouped Wo-A with one "
                     "BF16 rounding, Wo-B in FP32)", "§7.1"),
        OperatorSpec("tp_all_reduce", "(partials: list of FP32 [T, D], one per rank)",
                     "[T, D] BF16: FP32 sum in rank order, one BF16 cast", "§7.1"),
        OperatorSpec("tp_reduce_scatter", "(partials, *, active_tokens, capacity=None)",
                     "list of BF16 owner slabs [ceil(capacity/TP), D], padding rows zero", "§7.1"),
        OperatorSpec("half_layer_call", "(kind, *, phase, tokens, active=None, requests=1, tp=1, epoch=1, pages=None, dp=1, "
                     "config)",
                     "active token count; raises ValueError naming field, mode and phase (host-side caller "
                     "contract of an attention half-layer entry)", "§7.1"),
        OperatorSpec("hc_mixes", "(x_hc [T,hc,D], function [(2+hc)hc, hc*D], scale [3], base [(2+hc)hc], *, "
                     "num_tokens=None, config)", "Mixes(pre [T,hc], post [T,hc], residual [T,hc,hc]) FP32, rows >= "
                     "num_tokens zero", "§1"),
        OperatorSpec("hc_pre", "(x_hc [T,hc,D], pre_mix [T,hc])", "[T, D] in x_hc's dtype: FP32 sum, one cast",
                     "§1"),
        OperatorSpec("hc_post", "(sublayer [T,D], x_hc [T,hc,D], post_mix [T,hc], residual_mix [T,hc,hc], *, "
                     "rule='fp32')",
                     "[T, hc, D] in the sublayer's dtype: post·sublayer + residualᵀ·x_hc in FP32", "§1"),
        OperatorSpec("hc_head", "(x_hc [T,hc,D], pre_mix [T,hc])", "[T, D] BF16", "§1"),
        OperatorSpec("moe_gate", "(x [T,D], weight [E,D], bias [E], *, config, rule='stable')",
                     "(weights [T,k] FP32 summing to routed_scaling_factor, ids [T,k] INT32)", "§1"),
        OperatorSpec("moe_expert", "(x [N,D] BF16, weights: ExpertWeights, route_weight [N] | None, *, config, "
                     "rule='fp32-proj')", "[N, D] FP32 contribution (route weight before W2, BF16 hidden)", "§1"),
        OperatorSpec("moe_ep", "(xs per rank [T_r,D] BF16, gates per rank (weights, ids), experts, shared, *, ep, "
                     "num_tokens, recv_max=None, config, rule)", "EPResult(outputs per rank [T_r,D] BF16, "
                     "send_counts [ep,ep,n_local], recv_rows per rank [R,3], recv_y per rank [n_local,recv_max,D], "
                     "recv_expert_count per rank [n_local] INT32)", "§1"),
        OperatorSpec("embed_pack", "(ids [T] int, embedding [vocab,D], *, config)",
                     "x_hc [T, hc, D]: the clamped ids' rows in every stream", "§1"),
        OperatorSpec("lm_head", "(hidden [T,D] BF16, weight [vocab,D], *, tp=1)",
                     "list of tp FP32 logit shards [T, vocab/tp] in rank order", "§1"),
        OperatorSpec("engram", "(hash_ids [T,cols] int, table [rows,head_dim] BF16, wkv [cols*head_dim,(hc+1)*D], "
                     "weight [hc,D] FP32, x [T,hc,D] BF16, *, config)",
                     "[T, hc, D] BF16: x + sigmoid-sqrt gate · the shared value, per stream", "§1"),
        OperatorSpec("engram_tp", "(hash_ids [T,cols], table_shards per rank [rows/tp,head_dim], wkv, weight, x, *, "
                     "tp, config)", "list of tp [T, hc, D] BF16 outputs (each the single-rank output)", "§1"),
        OperatorSpec("final_norm", "(hidden [T,D], weight [D], *, config)",
                     "[T, D] BF16: FP32 RMSNorm times the weight, one BF16 rounding", "§1"),
        OperatorSpec("greedy_pick", "(logits [T,vocab])", "[T] INT32: first id of each row's maximum", "§1"),
        OperatorSpec("v4_decode_metadata", "(starts [B], ori_table [B,P], cmp_tables {ratio: [B,P]}, state_tables "
                     "{ratio: [B,P]}, *, config (V4), commit_tokens=None)",
                     "V4DecodeMetadata (kernels.v4.decode_metadata): request-major MTP rows, slot mappings, SWA and "
                     "history windows", "§8"),
        OperatorSpec("v4_compressor", "(x [T,hidden], position_ids [T], token_to_req [T], state_block_table [B,P], "
                     "state_pool [pages,page,2*coff*d] FP32, weights, *, ratio, overlap, eps)",
                     "(compressed [T,d] FP32 (rounded once, after its RoPE, on publication), closes [T] bool, new "
                     "state pool): V4's ratio-128 / ratio-4 compressor",
                     "§8"),
        OperatorSpec("v4_publish_compressed", "(compressed [T,d] BF16, closes [T], position_ids [T], cmp_slot_mapping "
                     "[T], cmp_pool [blocks,page,1,d] BF16, rope_cos, rope_sin (compressed profile), *, ratio)",
                     "the new cmp pool: each closed window's row, RoPE'd at the window's first position, at its slot",
                     "§8"),
        OperatorSpec("v4_compressor_txn", "(x [B*seq,hidden], position_ids [T], state_page_ids [B,P], "
                     "state_page_epochs [B,P], request_epochs [B], state_valid_ranges [B,2], state_slot_mapping [T], "
                     "state_pool FP32 [pages,page,2*coff*d], weights, *, ratio 4|128, seq)",
                     "(compressed [T,d] FP32, closes [T], new state pool): the decode compressor as a state "
                     "transaction (only current-epoch pages in the valid range are read; this step overlays; the "
                     "commit follows the pool)", "§8"),
        OperatorSpec("v4_gate", "(x_mixed [T,D] BF16, norm_w [D] BF16, gate_w [E,D] FP32, gate_bias [E], layer_id, "
                     "num_tokens, tid2eid [V,K] INT32, input_ids [T], *, config (V4), padding_codes='quantized'|'zero', "
                     "dequant_factor='product'|'reciprocal')",
                     "{x_norm_i8 [T,D] INT8, x_norm_scale [T,1] (amax/127 · inv_rms), indices [T,K] INT32, weights "
                     "[T,K]}: V4's MoE router (hash layers by token id, else biased top-k; unbiased weights)", "§8"),
        OperatorSpec("v4_expert", "(x_i8 [N,D] INT8, x_scale [N,1], route_weight [N] or None (shared), weights "
                     "(INT8 w1/w3 [inter,D], w2 [D,inter], per-channel scales), *, config (V4))",
                     "y [N, D] BF16: W8A8 SwiGLU expert with its hidden row re-coded to INT8, the routing weight on "
                     "the row factor before the BF16 rounding", "§8"),
        OperatorSpec("v4_moe", "(x_mixed, norm_w, gate_w, gate_bias, layer_id, num_tokens, tid2eid, input_ids, "
                     "routed [E experts], shared, *, config (V4))",
                     "{ffn_out [T,D] BF16, indices, weights}: one rank's MoE, composed from v4_gate and v4_expert "
                     "(combine: one FP32 sum, shared first, rounded once)", "§8"),
        OperatorSpec("v4_moe_stage", "(x_hc [T,hc,D] FP32, hc_fn, hc_scale, hc_base, norm_w, gate_w, gate_bias, "
                     "layer_id, num_tokens, tid2eid, input_ids, routed, shared, *, config (V4), padding_rows='residual'|'zero')",
                     "{x_out [T,hc,D] FP32, ffn_out, indices, weights}: hc_mixes / hc_pre -> v4_moe -> hc_post "
                     "(padding rows: their streams' residual mix, or 0 by name)",
                     "§8"),
        OperatorSpec("v4_head_mix", "(x_hc [T,hc,D] FP32, fn [hc,hc*D], scale [1], base [hc], *, config (V4))",
                     "pre [T, hc] FP32: the head's collapse weights, sigmoid(logit · scale + base) + hc_eps", "§8"),
        OperatorSpec("v4_mtp_layer", "(hidden [T,D] BF16, prev [T,hc,D] FP32, projection {...}, attention {...}, "
                     "moe {...}, head {fn, scale, base, norm_w}, *, config (V4))",
                     "{hidden_out [T,D] BF16, next_pre_hc_hidden [T,hc,D] FP32, kv_cache}: the MTP layer, composed "
                     "from mtp_projection, v4_attention_stage (SWA), v4_moe_stage, v4_head_mix, hc_head, final_norm",
                     "§8"),
        OperatorSpec("v4_prefill_mtp_layer", "(hidden [T,D] BF16, prev [T,hc,D] FP32, projection {...}, attention "
                     "{... block_table [pages], freqs_cos/freqs_sin [2,positions,rope]}, moe {...}, head {...}, "
                     "num_tokens, *, config (V4))",
                     "{hidden_out, next_pre_hc_hidden, kv_cache}: the MTP layer on one request's prefill chunk, "
                     "composed from v4_prefill_swa_indices, mtp_projection, v4_attention_stage (SWA, prefill form, "
                     "profile 0), v4_moe_stage, v4_head_mix, hc_head, final_norm", "§8"),
        OperatorSpec("v4_prefill_index_keys", "(x, position_ids, num_tokens, state_block_table [P], state_pool, inner "
                     "weights, idx_slot_mapping [T], state_slot_mapping [T], idx_kv_cache INT8, idx_kv_scale FP32, "
                     "rope_cos, rope_sin, hadamard, *, rope_head_dim)",
                     "{idx_kv_cache, idx_kv_scale, state_pool}: CSA's indexer compressor on a prefill chunk, composed "
                     "from v4_compressor and v4_publish_index_keys", "§8"),
        OperatorSpec("v4_moe_ep", "(gates: per rank v4_gate outputs, num_tokens per rank, routed [E experts], shared, "
                     "*, ep, config (V4))",
                     "{ffn_out per rank, send_counts [ep,ep,n_local], recv_counts, recv_x INT8 lanes, recv_y}: V4's "
                     "MoE across EP ranks (source-major lanes, one FP32 combine)", "§8"),
        OperatorSpec("v4_prefill_compressor", "(x [T,hidden] BF16, position_ids [T], num_tokens (int), "
                     "state_block_table [P] (one request), state_pool FP32 [pages,4|8,2*coff*d], weights, "
                     "cmp_slot_mapping [T], state_slot_mapping [T], cmp_pool BF16 [blocks,bs,1,d], rope_cos, "
                     "rope_sin (compressed profile; [L, rope/2] or upstream's [L, rope]), *, ratio 4|128, "
                     "rope_head_dim)",
                     "{cmp_pool, state_pool}: a prefill chunk's closed windows published and its mapped state rows "
                     "written, composed from v4_compressor and v4_publish_compressed", "§8"),
        OperatorSpec("csa_compressors", "(x, position_ids, token_to_req, main_table, main_pool, main weights, "
                     "inner_table, inner_pool, inner weights, *, ratio=4, eps)",
                     "{compressed, index_key, closes, main_pool, inner_pool}: CSA's main and inner compressors",
                     "§8"),
        OperatorSpec("mtp_projection", "(hidden [T,D] BF16, prev [T,hc,D] FP32, enorm, hnorm, e_proj INT8 [D,D], "
                     "e_scale, e_smooth, h_proj INT8 [D,D], h_scale, h_smooth, *, config (V4))",
                     "[T, hc, D] FP32: the embedding half shared by every stream plus each stream's own half", "§8"),
        OperatorSpec("dp_attention", "(rank_inputs [per DP rank: half-layer inputs], *, kind, config)",
                     "list of each rank's half-layer outputs (TP 1, nothing reduced across ranks), composed from "
                     "this backend's attention_half_layer", "§8"),
        OperatorSpec("v4_index_cache_quant", "(x [..., d])",
                     "(payload float8_e4m3fn [..., d], scale FP32 [..., 1]): V4's index-key cache row quantization",
                     "§8"),
        OperatorSpec("v4_sparse_attention", "(q [T,H,hd] BF16, ori_kv [blocks,bs,1,hd], window_indices [T,W], "
                     "cmp_kv [blocks,bs,1,hd], cmp_block_table [B,P], cmp_indices [T,K] logical slots, attn_sink [H], "
                     "*, seq)", "o [T, H, hd] FP32: V4's sparse attention, compressed slots paged per request", "§8"),
        OperatorSpec("v4_output_projection", "(o [T,H,hd] FP32, freqs_cos [T,rope], freqs_sin [T,rope], wo_a "
                     "[G,O_LORA,group_in] BF16, wo_b INT8 [hidden,G*O_LORA], wo_b_scale [hidden], *, config (V4))",
                     "attn_out [T, hidden] BF16: inverse RoPE, FP32 grouped latent, per-(token, group) INT8 W8A8",
                     "§8"),
        OperatorSpec("v4_attention", "(path HCA|CSA|SWA, q, ori_kv, window_indices, cmp_kv, cmp_block_table, "
                     "compressed (HCA top-k / CSA raw indexer top-k / None), position_ids [T], attn_sink, freqs_cos, "
                     "freqs_sin, wo_a, wo_b, wo_b_scale, *, config (V4))",
                     "attn_out [T, hidden] BF16, composed from v4_sparse_attention and v4_output_projection", "§8"),
        OperatorSpec("v4_indexer", "(x [T,hidden] BF16, qr [T,Q_LORA] INT8, qr_scale [T,1], wq_b INT8 [Q_LORA,H*d], "
                     "wq_b_scale [H*d], weights_proj [hidden,H] BF16, cos/sin [B,rope/2] (per request), hadamard "
                     "[d,d], idx_kv_cache INT8 [blocks,bs,1,d], idx_kv_scale [blocks,bs,1,1], idx_block_table [B,P], "
                     "position_ids [T], kv_seq_lens [B], *, offset, config (V4))",
                     "{score [T, kernel_max/4] FP32 (lowest FP32 past visible), topk_idxs [T, kernel_max/4] INT32 "
                     "(best first, + offset, -1 after)}: CSA's decode indexer", "§8"),
        OperatorSpec("v4_prefill_indexer", "(x [T,hidden] BF16, qr [T,Q_LORA] INT8, qr_scale [T,1], wq_b INT8 "
                     "[Q_LORA,H*d], wq_b_scale [H*d], weights_proj [hidden,H] BF16, cos/sin [T,rope/2] (per row), "
                     "hadamard [d,d], idx_kv_cache INT8 [blocks,bs,1,d], idx_kv_scale [blocks,bs,1,1], "
                     "idx_block_table [P] (one request), position_ids [T], num_tokens (int), *, config (V4), "
                     "padding_rows='unscored'|'scored')",
                     "{score [T, 2*bs] FP32 (lowest FP32 past visible and on padding rows), topk_idxs [T, 2*bs] "
                     "INT32 (raw positions best first, -1 after)}: CSA's indexer on a prefill chunk", "§8"),
        OperatorSpec("v4_publish_index_keys", "(index_key [T,d] FP32, closes [T], position_ids [T], idx_slot_mapping "
                     "[T], idx_kv_cache INT8 [blocks,bs,1,d], idx_kv_scale FP32 [blocks,bs,1,1], rope_cos, rope_sin "
                     "(compressed profile), hadamard [d,d], *, ratio=4)",
                     "(new idx_kv_cache, new idx_kv_scale): each closed window's key rotated, BF16, Hadamard, BF16, "
                     "one INT8 row with scale 1 / (127 / amax)", "§8"),
        OperatorSpec("v4_qkv_proj_rope", "(x [T,hidden] BF16, wq_a [hidden,Q_LORA] BF16, wq_b INT8 [Q_LORA,H*hd], "
                     "wq_b_scale [H*hd], wkv [hidden,hd] BF16, rope_cos/rope_sin [T,rope], gamma_cq [Q_LORA], "
                     "gamma_ckv [hd], *, config (V4))",
                     "{q [T,H,hd] BF16, kv [T,hd] BF16, qr [T,Q_LORA] INT8, qr_scale [T,1] FP32}: V4's Q/KV LoRA "
                     "projection with RoPE", "§8"),
        OperatorSpec("v4_attention_stage", "(path, x_hc [T,hc,D] FP32, hc_fn, hc_scale, hc_base, attn_norm_w, wq_a, "
                     "wq_b, wq_b_scale, wkv, gamma_cq, gamma_ckv, freqs_cos/freqs_sin [positions,rope], kv_cache "
                     "[blocks,bs,1,hd], swa_slot_mapping [T], window_indices [T,W], position_ids [T], attn_sink, "
                     "wo_a, wo_b, wo_b_scale, cmp_kv=None, cmp_block_table=None, compressed=None, *, config (V4))",
                     "{x_out [T,hc,D] FP32, kv_cache, qr, qr_scale}: hc_pre, RMSNorm, Q/KV projection, the kv "
                     "write, v4_attention, hc_post -- composed from this backend's operators", "§8"),
        OperatorSpec("v4_prefill_swa_indices", "(position_ids [T], block_table [pages], num_tokens, *, config (V4))",
                     "[T, sliding_window] INT32: a prefill chunk's window, the last min(window, pos + 1) positions "
                     "oldest first through the 1-D table (-1 holes), padding rows -1", "§8"),
        OperatorSpec("v4_publish_events", "(compressed [T,d] FP32, closes [T], cmp_slot_mapping [T], cmp_pool "
                     "[blocks,page,1,d], request_event_indices [B], event_cos/event_sin [E,rope/2], *, seq, "
                     "no_event='skip')",
                     "the new compressed pool: each request's closed row rotated by its event's RoPE rows, written "
                     "at its slot; no event: nothing (or, no_event='zero_rope', the RoPE dims 0)", "§8"),
        OperatorSpec("hca_topk", "(position_ids [T], kv_seq_lens [B], *, seq, limit, ratio=128)",
                     "[T, limit] INT32: HCA's deterministic compressed top-k (the first valid positions, -1 after)",
                     "§8"),
        OperatorSpec("decoder_replay", "(query_start_loc [B+1], position_ids [T], token_to_req_indices [T], "
                     "kv_seq_lens [B], window_block_table [B,P], *, window, block_size, cached_tail_starts=None)",
                     "DecoderReplay (kernels.prefill_plan): the last min(prefix + len, window) encoded rows per "
                     "request (cached tail rows first), their positions, window metadata truncated to the replay, "
                     "logit rows", "§3"),
        OperatorSpec("encoder_replay", "(query_start_loc [B+1], position_ids [T], token_to_req_indices [T], "
                     "kv_seq_lens [B], window_block_table [B,P], cached_input_starts [B+1], *, window, block_size)",
                     "EncoderReplay (kernels.prefill_plan): each resumed request's last min(prefix, window) cached "
                     "input rows then its new rows, is_new marking the rows that may publish", "§3"),
        OperatorSpec("decode_block", "(x_hc [T,hc,D] FP32, incoming_pre_mix [T,hc], attention_inputs, attention_mhc, "
                     "ffn_mhc, router, bias, experts, shared, *, kind, tp, config)",
                     "{x_hc, next_pre_mix, attention_input, ffn_input, attention_hidden, ffn_output}: one decode Block "
                     "(attention + MoE through mHC with the delayed pre-mix), composed from this backend's "
                     "operators", "§1"),
        OperatorSpec("decode_block_sharded", "(x_hc slabs [tp,W,hc,D] FP32, incoming_pre_mix slabs [tp,W,hc], "
                     "attention_inputs, attention_mhc, ffn_mhc, router, bias, experts, shared, *, kind, tp, config)",
                     "decode_block's outputs as owner slabs (padding rows zero) plus gathered [T,D]: the sharded "
                     "wiring, composed from this backend's operators", "§1"),
        OperatorSpec("causal_encoder", "(x_hc [T,hc,D] FP32, layer_inputs {kind: attention inputs}, attention_mhc, "
                     "ffn_mhc, router, bias, experts, shared, *, tp, config, layers=None)",
                     "{x_hc, next_pre_mix, layer_x_hc [L,T,hc,D], layer_pre_mix [L,T,hc], reused_from [L]}: the "
                     "decode Blocks of layers 0..19 chained, REUSE layers reading their source's published cache "
                     "and Top-K, composed from this backend's operators", "§1"),
        OperatorSpec("attention_half_layer",
                     "(inputs {name: tensor}, *, kind, phase, wiring, tp, config=FLASH_TINY)",
                     "{output, window_payload, window_scale, [compressed_/index_ payload+scale], [topk_indices], "
                     "[state_cache], [candidate_mask]}: one attention half-layer of any mode, composed from this "
                     "backend's operators unless the backend gives its own", "§2.3/§7.1"),
    )
}

# The comparators judge a backend's outputs; a backend does not supply them (spec §6). Contracts reach them
# through ``op(backend, name)`` like operators, so the comparator-variant tests and the mutation runner can put
# a variant in their place (``Backend(..., comparators=...)``); every backend judges with the library's
# comparators unless told otherwise, and none is ever "missing" one.
COMPARATORS: dict[str, OperatorSpec] = {
    s.name: s
    for s in (
        OperatorSpec("check_row_precision", "(actual, expected, *, name)", "CheckResult", "§6"),
        OperatorSpec("check_output_budget", "(actual, expected, *, budget=FP8_BUDGET, name)", "CheckResult", "§6"),
        OperatorSpec("check_active_split", "(actual, expected, num_tokens, *, leaf, name)", "CheckResult", "§6"),
        OperatorSpec("check_owner_rows", "(actual_slabs, expected, bounds, *, leaf, require_zero_padding, name)",
                     "CheckResult (a pass counts every owned and padding row)", "§6/§7.1"),
        OperatorSpec("check_replicas_identical", "(replicas, *, name)", "CheckResult", "§6"),
    )
}

# Every name a contract can take through ``op(backend, name)``.
OPERATORS: dict[str, OperatorSpec] = {**KERNEL_OPERATORS, **COMPARATORS}


class BackendError(LookupError):
    """A backend that cannot be found, loaded, or that names an unknown operator."""


class Unsupported(BackendError):
    """A bound operator cannot run this particular call (e.g. a device compiled for other constants); the
    contract that made the call is skipped with this reason, never passed."""


class MissingOperator(BackendError):
    def __init__(self, backend: Backend, op: str):
        self.backend, self.op = backend, op
        why = backend.unavailable or backend.why_missing.get(op)
        reason = f": {why}" if why else ""
        super().__init__(f"backend {backend.name!r} has no operator {op!r}{reason}")


@cache
def library_comparators() -> dict[str, Callable]:
    """The comparator library (``contracts.checks.precision``) every backend is judged with by default."""
    return {name: getattr(importlib.import_module(REFERENCE_OPERATORS[name][0]), REFERENCE_OPERATORS[name][1])
            for name in COMPARATORS}


class Backend:
    """A named set of kernel operators (``name -> callable``), optionally on a platform.

    ``unavailable`` is a one-line reason when the backend cannot run here (every operator is then missing;
    contracts that need one skip with that reason, and a session that ran nothing fails). Comparators
    (``check_*``) given among ``operators`` replace the library's for this backend (comparator variants,
    mutants); otherwise the library's judge it.
    """

    def __init__(self, name: str, operators: Mapping[str, Callable], *, platform: str = "cpu",
                 unavailable: str | None = None, description: str = "", why_missing: Mapping[str, str] = (),
                 replay: Callable | None = None, variants: Mapping[str, Mapping[str, str]] = (),
                 provenance: Mapping[str, object] = (), deviations: Mapping[str, str] = ()):
        unknown = sorted(set(operators) - set(OPERATORS))
        if unknown:
            raise BackendError(f"backend {name!r}: unknown operator(s) {unknown}; known: {sorted(KERNEL_OPERATORS)}")
        self.name = name
        self.platform = platform
        self.unavailable = unavailable
        self.description = description
        kernels = {k: v for k, v in operators.items() if k in KERNEL_OPERATORS}
        self._ops = kernels if unavailable is None else {}
        self._comparators = {k: v for k, v in operators.items() if k in COMPARATORS}
        self.why_missing = dict(why_missing)  # operator -> why this backend does not bind it
        # a device backend's own way to replay a golden tree ((tree, export) -> outputs, or None to run the
        # operators; export(directory) writes the tree in upstream's golden_data layout)
        self.replay = replay
        # operator -> {rule: named variant} where this backend follows a named variant, not the default rule (e.g.
        # upstream's goldens); the contracts pinning that rule judge the backend by the variant it names
        self.variants = {k: dict(v) for k, v in dict(variants).items()}
        # where a backend's numbers come from, for trees recorded from it (upstream: repository, commit, dirty,
        # goldens {operator: "models/<folder>/<file>.py::<function>"})
        self.provenance = dict(provenance)
        # named, documented ways a backend is known to depart from a property a contract pins (docs/upstream.md):
        # such a contract that fails on it is reported as an expected failure naming the deviation, never a pass
        self.deviations = dict(deviations)

    def has(self, op: str) -> bool:
        return op in self._ops or op in COMPARATORS

    def get(self, op: str) -> Callable:
        if op in COMPARATORS:
            return self._comparators.get(op) or library_comparators()[op]
        if op not in OPERATORS:
            raise BackendError(f"unknown operator {op!r}; known: {sorted(KERNEL_OPERATORS)}")
        if op not in self._ops:
            raise MissingOperator(self, op)
        fn = self._ops[op]
        if getattr(fn, "composes_operators", False):  # a composition runs on this backend's own operators
            return partial(fn, ops=self._ops)
        return fn

    @property
    def operators(self) -> tuple[str, ...]:
        """The kernel operators this backend binds (comparators are not operators)."""
        return tuple(sorted(self._ops))

    @property
    def missing(self) -> tuple[str, ...]:
        return tuple(sorted(set(KERNEL_OPERATORS) - set(self._ops)))

    def derive(self, name: str, *, description: str = "", **overrides: Callable) -> Backend:
        """A copy with some operators replaced (how seeded defects and partial backends are built)."""
        return Backend(name, {**self._ops, **self._comparators, **overrides}, platform=self.platform,
                       description=description,
                       variants={k: v for k, v in self.variants.items() if k not in overrides})

    def without(self, name: str, *ops: str) -> Backend:
        return Backend(name, {k: v for k, v in {**self._ops, **self._comparators}.items() if k not in ops},
                       platform=self.platform)

    def __repr__(self) -> str:
        return f"Backend({self.name!r}, platform={self.platform!r}, ops={len(self._ops)})"


# Where each operator of the Torch reference lives: (module, attribute). The torch backend, the
# differential contracts' reference and the mutation runner's mutant backends are all built from it.
REFERENCE_OPERATORS: dict[str, tuple[str, str]] = {
    "resolve_schedule": ("kernels.config", "V41Config.schedule"),
    "build_forward_metadata": ("kernels.metadata", "build_forward_metadata"),
    "sp_bounds": ("kernels.sequence_parallel", "sequence_parallel_bounds"),
    "sp_shard": ("kernels.sequence_parallel", "shard_rows"),
    "sp_gather": ("kernels.sequence_parallel", "gather_rows"),
    "mx_quantize": ("kernels.quant", "mx_quantize"),
    "mx_dequantize": ("kernels.quant", "mx_dequantize"),
    "cache_publish": ("kernels.cache", "publish"),
    "cache_read": ("kernels.cache", "read"),
    "compressor_ratio2": ("kernels.reference.compressor", "compressor_ratio2_paged"),
    "materialize_rope_rows": ("kernels.reference.rope", "materialize_rope_rows"),
    "index_scores": ("kernels.reference.indexer", "paged_index_scores"),
    "select_topk": ("kernels.reference.indexer", "select_topk"),
    "candidate_blocks": ("kernels.reference.indexer", "select_candidate_blocks"),
    "sparse_attention": ("kernels.reference.attention", "sparse_attention"),
    "half_layer_call": ("kernels.half_layer", "check_half_layer_call"),
    "o_proj": ("kernels.reference.o_proj", "output_projection"),
    "tp_all_reduce": ("kernels.reference.tp", "tp_all_reduce"),
    "tp_reduce_scatter": ("kernels.reference.tp", "tp_reduce_scatter"),
    "attention_half_layer": ("kernels.reference.attention_layer", "attention_half_layer"),
    "decode_block": ("kernels.reference.block", "decode_block"),
    "causal_encoder": ("kernels.reference.block", "causal_encoder"),
    "decode_block_sharded": ("kernels.reference.block", "decode_block_sharded"),
    "decoder_replay": ("kernels.prefill_plan", "select_decoder_replay"),
    "v4_decode_metadata": ("kernels.v4.decode_metadata", "v4_decode_metadata"),
    "hca_topk": ("kernels.v4.decode_metadata", "hca_topk"),
    "v4_prefill_swa_indices": ("kernels.v4.decode_metadata", "v4_prefill_swa_indices"),
    "v4_publish_events": ("kernels.v4.compressor_txn", "v4_publish_events"),
    "mtp_projection": ("kernels.v4.mtp", "mtp_projection"),
    "v4_index_cache_quant": ("kernels.v4.index_cache", "index_cache_quant"),
    "v4_publish_index_keys": ("kernels.v4.index_cache", "publish_index_keys"),
    "dp_attention": ("kernels.v4.dp_attention", "dp_attention"),
    "v4_sparse_attention": ("kernels.v4.sparse_attention", "v4_sparse_attention"),
    "v4_output_projection": ("kernels.v4.sparse_attention", "v4_output_projection"),
    "v4_attention": ("kernels.v4.sparse_attention", "v4_attention"),
    "v4_indexer": ("kernels.v4.indexer", "v4_indexer"),
    "v4_prefill_indexer": ("kernels.v4.prefill_indexer", "v4_prefill_indexer"),
    "v4_qkv_proj_rope": ("kernels.v4.qkv_proj", "v4_qkv_proj_rope"),
    "v4_attention_stage": ("kernels.v4.attention_stage", "v4_attention_stage"),
    "v4_compressor": ("kernels.v4.compressor", "v4_compressor"),
    "csa_compressors": ("kernels.v4.compressor", "csa_compressors"),
    "v4_publish_compressed": ("kernels.v4.compressor", "v4_publish_compressed"),
    "v4_prefill_compressor": ("kernels.v4.prefill_compressor", "v4_prefill_compressor"),
    "v4_prefill_index_keys": ("kernels.v4.prefill_compressor", "v4_prefill_index_keys"),
    "v4_compressor_txn": ("kernels.v4.compressor_txn", "v4_compressor_txn"),
    "v4_gate": ("kernels.v4.gate", "v4_gate"),
    "v4_expert": ("kernels.v4.moe", "v4_expert"),
    "v4_moe": ("kernels.v4.moe", "v4_moe"),
    "v4_moe_stage": ("kernels.v4.moe", "v4_moe_stage"),
    "v4_moe_ep": ("kernels.v4.moe", "v4_moe_ep"),
    "v4_head_mix": ("kernels.v4.mtp_layer", "v4_head_mix"),
    "v4_mtp_layer": ("kernels.v4.mtp_layer", "v4_mtp_layer"),
    "v4_prefill_mtp_layer": ("kernels.v4.mtp_layer", "v4_prefill_mtp_layer"),
    "encoder_replay": ("kernels.prefill_plan", "select_encoder_replay"),
    "hc_mixes": ("kernels.reference.mhc", "hc_mixes"),
    "hc_pre": ("kernels.reference.mhc", "hc_pre"),
    "hc_post": ("kernels.reference.mhc", "hc_post"),
    "hc_head": ("kernels.reference.mhc", "hc_head"),
    "final_norm": ("kernels.reference.lm_head", "final_norm"),
    "engram": ("kernels.reference.engram", "engram"),
    "engram_tp": ("kernels.reference.engram", "engram_tp"),
    "moe_gate": ("kernels.reference.moe", "moe_gate"),
    "moe_expert": ("kernels.reference.moe", "moe_expert"),
    "moe_ep": ("kernels.reference.moe", "moe_ep"),
    "embed_pack": ("kernels.reference.lm_head", "embed_pack"),
    "lm_head": ("kernels.reference.lm_head", "lm_head"),
    "greedy_pick": ("kernels.reference.lm_head", "greedy_pick"),
    "check_row_precision": ("contracts.checks.precision", "check_row_precision"),
    "check_output_budget": ("contracts.checks.precision", "check_output_budget"),
    "check_active_split": ("contracts.checks.precision", "check_active_split"),
    "check_owner_rows": ("contracts.checks.precision", "check_owner_rows"),
    "check_replicas_identical": ("contracts.checks.precision", "check_replicas_identical"),
}
