"""V4-Flash dspark's whole drafter step (spec §8; upstream models/deepseek_v4_flash_dspark/dspark_drafter.py),
composed from this project's operators:

    target_hidden [B·S_t, 3·D] BF16 (the target model's three tapped layers, S_t rows per request)
    -> ``dspark_proj`` -> main_x [B·S_t, D]; each request's last row is its context row
    -> per draft layer l: ``dspark_context_kv`` writes the context rows at ``context_slot_mapping[l]`` (positions
       ``context_position_ids``) into ``kv_caches[l]``
    -> the query block: per request W = 7 rows, ids [anchor id, noise, ..., noise] (``noise_token_id``: upstream's
       DSPARK_NOISE_TOKEN_ID), positions anchor + 1 .. anchor + W, ``lookup_embedding`` widened to the hc streams
       (FP32, every stream the row): ``initial_hidden``
    -> per draft layer l (``layers[l]``): ``hc_pre_fused`` (its attention mixes), ``final_norm`` (attn_norm_w),
       ``dspark_attention`` (its KV committed at the block's slots through ``block_tables[l]``, each request's list
       the window ``max(anchor + 1 - window, 0) .. anchor`` then its own block), ``hc_post``, ``v4_moe_stage`` (a hash
       layer routes by the block's ids; upstream's draft layers 40 .. 42 route by score): ``intermediate_hidden[l]``
    -> ``hc_head_fused`` of the last layer's streams: ``head_hidden`` [B, W, D] BF16.

Upstream's kernel pads the block to 16 requests x 8 rows (its MoE tile) and zeroes the padding rows; this
reference holds the B·W real rows only. Upstream's golden ``golden_dspark_drafter`` does not evaluate the layers:
it assumes its fixture's weights (zero hc functions and bases, identity projections, zero attention and expert
outputs) and writes the closed form of those; its adapter takes exactly that domain (docs/upstream.md).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from kernels.errors import ContractInputError, is_int
from kernels.operators import operator

SPEC = "§8"
QUERY_WIDTH = 7  # upstream's DSPARK_QUERY_WIDTH: the anchor and six noise rows per request
NOISE_TOKEN_ID = 128799  # upstream's DSPARK_NOISE_TOKEN_ID
LIST_ALIGN = 64  # each request's visible list is padded to a multiple of 64 columns (DSPARK_SWA_INDEX_WIDTH)
ATTENTION_NAMES = ("hc_fn", "hc_scale", "hc_base", "attn_norm_w", "wq_a", "wq_b", "wq_b_scale", "wkv", "gamma_cq",
                   "gamma_ckv", "attn_sink", "wo_a", "wo_b", "wo_b_scale")
MOE_NAMES = ("hc_fn", "hc_scale", "hc_base", "norm_w", "gate_w", "gate_bias", "layer_id", "tid2eid", "routed", "shared")


def check_dspark_drafter(target_hidden: torch.Tensor, anchor_token_ids: torch.Tensor,
                         anchor_positions: torch.Tensor, context_position_ids: torch.Tensor,
                         context_slot_mapping: torch.Tensor, block_tables: torch.Tensor, kv_caches: torch.Tensor,
                         freqs_cos: torch.Tensor, layers: Sequence[Mapping], *, config,
                         noise_token_id: int = NOISE_TOKEN_ID) -> tuple[int, int]:
    """The drafter's own arguments (the composed operators check theirs) -> (B requests, S_t target rows per
    request)."""
    if anchor_token_ids.ndim != 1 or anchor_token_ids.shape[0] < 1 or anchor_token_ids.is_floating_point():
        raise ContractInputError("anchor_token_ids", None, "integer [B >= 1]",
                                 f"{anchor_token_ids.dtype}{list(anchor_token_ids.shape)}", SPEC)
    batch = anchor_token_ids.shape[0]
    if target_hidden.ndim != 2 or target_hidden.shape[0] < batch or target_hidden.shape[0] % batch:
        raise ContractInputError("target_hidden", None, f"[B·S_t, 3·D] rows, a multiple of the {batch} requests",
                                 list(target_hidden.shape), SPEC)
    if not isinstance(layers, Sequence) or not layers:
        raise ContractInputError("layers", None, "a non-empty list of {'attention': ..., 'moe': ...}",
                                 type(layers).__name__, SPEC)
    depth = len(layers)
    for index, layer in enumerate(layers):
        for part, names in (("attention", ATTENTION_NAMES), ("moe", MOE_NAMES)):
            got = layer.get(part) if isinstance(layer, Mapping) else None
            missing = sorted(set(names) - set(got)) if isinstance(got, Mapping) else list(names)
            if missing:
                raise ContractInputError(f"layers[{index}].{part}", None, f"the arguments {', '.join(names)}",
                                         f"missing {', '.join(missing)}", SPEC)
    for name, ids in (("anchor_positions", anchor_positions), ("context_position_ids", context_position_ids)):
        if ids.ndim != 1 or ids.shape[0] != batch or ids.is_floating_point():
            raise ContractInputError(name, None, f"integer [{batch}]", f"{ids.dtype}{list(ids.shape)}", SPEC)
    if (context_slot_mapping.ndim != 2 or tuple(context_slot_mapping.shape) != (depth, batch)
            or context_slot_mapping.is_floating_point()):
        raise ContractInputError("context_slot_mapping", None, f"integer [{depth} layers, {batch}]",
                                 f"{context_slot_mapping.dtype}{list(context_slot_mapping.shape)}", SPEC)
    if kv_caches.ndim != 5 or kv_caches.shape[0] != depth or kv_caches.shape[3] != 1:
        raise ContractInputError("kv_caches", None, f"[{depth} layers, blocks, page, 1, head_dim]",
                                 list(kv_caches.shape), SPEC)
    if (block_tables.ndim != 3 or tuple(block_tables.shape[:2]) != (depth, batch) or block_tables.shape[2] < 1
            or block_tables.is_floating_point()):
        raise ContractInputError("block_tables", None, f"integer [{depth} layers, {batch}, pages]",
                                 f"{block_tables.dtype}{list(block_tables.shape)}", SPEC)
    if not is_int(noise_token_id) or noise_token_id < 0:
        raise ContractInputError("noise_token_id", None, "a token id", repr(noise_token_id), SPEC)
    page, blocks = kv_caches.shape[2], kv_caches.shape[1]
    last = anchor_positions.to(torch.int64) + QUERY_WIDTH  # the block's last position
    bad = (anchor_positions < 0) | (last >= freqs_cos.shape[0]) | (last // page >= block_tables.shape[2])
    if bool(bad.any()):
        b = int(bad.nonzero()[0])
        raise ContractInputError("anchor_positions", (b,), f"a position whose block (+1 .. +{QUERY_WIDTH}) lies "
                                 f"inside the RoPE table ({freqs_cos.shape[0]}) and the block table "
                                 f"({block_tables.shape[2]} pages of {page})", int(anchor_positions[b]), SPEC)
    for b in range(batch):  # every page the request's list or block reads
        first = max(int(anchor_positions[b]) + 1 - config.sliding_window, 0) // page
        for layer in range(depth):
            pages = block_tables[layer, b, first:int(last[b]) // page + 1]
            bad = (pages < 0) | (pages >= blocks)
            if bool(bad.any()):
                p = first + int(bad.nonzero()[0])
                raise ContractInputError("block_tables", (layer, b, p), f"a page in [0, {blocks}) (the request's "
                                         "window or block reads it)", int(block_tables[layer, b, p]), SPEC)
    return batch, target_hidden.shape[0] // batch


def drafter_plan(anchor_positions: torch.Tensor, block_tables: torch.Tensor, *, window: int,
                 page: int) -> dict[str, torch.Tensor]:
    """The query block's metadata (upstream's build_dspark_metadata) -> {"query_positions" [B·W] INT32,
    "query_slots" [L, B·W] INT64, "swa_indices" [L, B, K] INT32 (K = window + W up to a multiple of 64, -1 past
    the count), "swa_lens" [L, B] INT32}: request b's rows sit at anchor + 1 .. anchor + W; its list is the window
    positions max(anchor + 1 - window, 0) .. anchor then the block's W positions, each through the layer's table."""
    depth, batch = block_tables.shape[:2]
    width = -(-(window + QUERY_WIDTH) // LIST_ALIGN) * LIST_ALIGN
    anchors = anchor_positions.to(torch.int64)
    offsets = torch.arange(1, QUERY_WIDTH + 1)
    positions = (anchors[:, None] + offsets[None, :]).reshape(-1)
    requests = torch.arange(batch).repeat_interleave(QUERY_WIDTH)
    tables = block_tables.to(torch.int64)

    def slot(layer, b, pos):
        return tables[layer, b, pos // page] * page + pos % page

    query_slots = torch.stack([slot(layer, requests, positions) for layer in range(depth)])
    swa_indices = torch.full((depth, batch, width), -1, dtype=torch.int32)
    swa_lens = torch.zeros(depth, batch, dtype=torch.int32)
    for b in range(batch):
        start = max(int(anchors[b]) + 1 - window, 0)
        visible = torch.arange(start, int(anchors[b]) + 1 + QUERY_WIDTH)
        for layer in range(depth):
            swa_indices[layer, b, :visible.numel()] = slot(layer, b, visible).to(torch.int32)
            swa_lens[layer, b] = visible.numel()
    return {"query_positions": positions.to(torch.int32), "query_slots": query_slots, "swa_indices": swa_indices,
            "swa_lens": swa_lens}


def query_ids(anchor_token_ids: torch.Tensor, noise_token_id: int = NOISE_TOKEN_ID) -> torch.Tensor:
    """The block's token ids [B·W] INT64: each request's anchor id, then W - 1 noise ids."""
    ids = torch.full((anchor_token_ids.shape[0], QUERY_WIDTH), noise_token_id, dtype=torch.int64)
    ids[:, 0] = anchor_token_ids.to(torch.int64)
    return ids.reshape(-1)


@operator(returns="{head_hidden [B,7,D] BF16, initial_hidden [B·7,hc,D] FP32, intermediate_hidden [L,B·7,hc,D] "
                  "FP32, kv_caches}: the drafter step -- dspark_proj, dspark_context_kv per layer, the query block "
                  "looked up (lookup_embedding), then per layer hc_pre_fused, final_norm, dspark_attention, hc_post, "
                  "v4_moe_stage, and hc_head_fused", spec=SPEC)
def dspark_drafter(target_hidden: torch.Tensor, main_proj_w: torch.Tensor, main_norm_w: torch.Tensor,
                   anchor_token_ids: torch.Tensor, anchor_positions: torch.Tensor, embedding_weight: torch.Tensor,
                   context_position_ids: torch.Tensor, context_slot_mapping: torch.Tensor,
                   block_tables: torch.Tensor, kv_caches: torch.Tensor, freqs_cos: torch.Tensor,
                   freqs_sin: torch.Tensor, layers: Sequence[Mapping], hc_head_fn: torch.Tensor,
                   hc_head_scale: torch.Tensor, hc_head_base: torch.Tensor, *, config,
                   noise_token_id: int = NOISE_TOKEN_ID, probabilities: str = "bf16",
                   ops=None) -> dict[str, torch.Tensor]:
    """One drafter step (module docstring). ``layers[l]``: {"attention": ATTENTION_NAMES (its hc mixes, RMSNorm,
    projections, sink and output projection), "moe": MOE_NAMES (``v4_moe_stage``'s arguments without x_hc,
    num_tokens and input_ids)}; ``probabilities``: dspark_attention's named rules. No input is modified."""
    from functools import partial

    from kernels.reference.lm_head import final_norm
    from kernels.reference.mhc import hc_post, hc_pre_fused
    from kernels.v4.dspark_attention import dspark_attention
    from kernels.v4.dspark_context_kv import dspark_context_kv
    from kernels.v4.dspark_proj import dspark_proj
    from kernels.v4.lookup_embedding import lookup_embedding
    from kernels.v4.moe import v4_moe_stage
    from kernels.v4.mtp_layer import hc_head_fused

    ops = ops or {}

    def bound(name, fn):
        got = ops.get(name, fn)
        return partial(got, ops=ops) if getattr(got, "composes_operators", False) else got

    batch, rows = check_dspark_drafter(target_hidden, anchor_token_ids, anchor_positions, context_position_ids,
                                       context_slot_mapping, block_tables, kv_caches, freqs_cos, layers,
                                       config=config, noise_token_id=noise_token_id)
    main_x = bound("dspark_proj", dspark_proj)(target_hidden, main_proj_w, main_norm_w, config=config)
    context_x = main_x[rows - 1::rows].contiguous()  # each request's last row
    caches = [bound("dspark_context_kv", dspark_context_kv)(context_x, layer["attention"]["wkv"],
                                                            layer["attention"]["gamma_ckv"], freqs_cos, freqs_sin,
                                                            context_position_ids, context_slot_mapping[index],
                                                            kv_caches[index], config=config)
              for index, layer in enumerate(layers)]
    plan = drafter_plan(anchor_positions, block_tables, window=config.sliding_window, page=kv_caches.shape[2])
    ids = query_ids(anchor_token_ids, noise_token_id)
    rows_bf16 = bound("lookup_embedding", lookup_embedding)(ids, embedding_weight, config=config)
    hidden = rows_bf16.float()[:, None, :].expand(-1, config.hc_mult, -1).contiguous()
    initial, intermediate = hidden, []
    for index, layer in enumerate(layers):
        a, m = layer["attention"], layer["moe"]
        mixed = bound("hc_pre_fused", hc_pre_fused)(hidden, a["hc_fn"], a["hc_scale"], a["hc_base"], config=config)
        normed = bound("final_norm", final_norm)(mixed["x_mixed"], a["attn_norm_w"], config=config)
        att = bound("dspark_attention", dspark_attention)(
            normed, a["wq_a"], a["wq_b"], a["wq_b_scale"], a["wkv"], a["gamma_cq"], a["gamma_ckv"], freqs_cos,
            freqs_sin, plan["query_positions"], caches[index], plan["query_slots"][index], plan["swa_indices"][index],
            plan["swa_lens"][index], a["attn_sink"], a["wo_a"], a["wo_b"], a["wo_b_scale"], config=config,
            **({"probabilities": probabilities} if probabilities != "bf16" else {}))
        caches[index] = att["kv_cache"]
        tokens, hc = mixed["post"].shape
        hidden = bound("hc_post", hc_post)(att["x_out"], hidden, mixed["post"], mixed["comb"].reshape(tokens, hc, hc))
        hidden = bound("v4_moe_stage", v4_moe_stage)(hidden, **{k: v for k, v in m.items() if k != "layer_id"},
                                                      layer_id=m["layer_id"], num_tokens=tokens, input_ids=ids,
                                                      config=config)["x_out"]
        intermediate.append(hidden)
    head = bound("hc_head_fused", hc_head_fused)(hidden, hc_head_fn, hc_head_scale, hc_head_base, config=config)["y"]
    return {"head_hidden": head.reshape(batch, QUERY_WIDTH, -1), "initial_hidden": initial,
            "intermediate_hidden": torch.stack(intermediate), "kv_caches": torch.stack(caches)}


dspark_drafter.composes_operators = True
