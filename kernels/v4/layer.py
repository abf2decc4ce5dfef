"""V4's decode layer and its compressed attention stages with their compressors inside (spec §8; upstream
decode_layer.py, decode_attention_{hca,csa}.py / Flash-MTP's decode_{hca,csa}.py):

    v4_hca_stage:    hc_mixes / hc_pre -> RMSNorm (attn_norm_w) -> v4_compress_and_publish (ratio 128)
                     -> hca_topk -> v4_attention_stage("HCA") on the compressed cache just written
    v4_csa_stage:    the same normalised row -> its Q/KV projection (qr) -> v4_compress_and_publish (ratio 4,
                     overlapping) -> the inner compressor's index keys -> v4_publish_index_keys -> v4_indexer
                     over the index cache just written -> v4_attention_stage("CSA") on the indexer's raw top-k
    v4_decode_layer: the attention stage (SWA, v4_hca_stage or v4_csa_stage) -> v4_moe_stage on its streams

* the compressors read the stage's normalised row (the BF16 RMSNorm of the pre-mixed streams, the same row the
  Q/KV projection reads); each request's rows are one decode step of its ring (``token_to_req`` = t // seq);
* a token that closes a window publishes the pooled row at its ``cmp_slot_mapping`` slot, rotated by the
  compressed-profile row of the window's first position (the first half of the stage's RoPE table, FP32),
  **before** the attention reads the compressed cache, so that token already attends the row it closed; CSA's
  index key is published before the indexer scores, rotated at the decode step's first position (upstream's rule;
  ``index_key_rope`` names the other);
* HCA attends its deterministic top-k: the first min((pos + 1) // 128, kv_seq_len // 128, limit) compressed
  positions of its request, limit = min(max_position_embeddings // 128, index_topk) (V4-Pro's HCA_TOPK_LIMIT) or,
  by name, max_position_embeddings // 128 (Flash-MTP's decode_hca.py: ``hca_topk_limit="all"``);
  CSA attends the indexer's top-k, its query rotated at the step's first position (one row per request);
* the decode layer's MoE stage sees every row as real (num_tokens = T: a decode batch has no padding rows) and
  routes by ``layer_id``.

Composed from the backend's operators. Spec: §8; docs/coverage.md, V4 section (V4-32).
"""

from __future__ import annotations

from functools import partial

import torch

from kernels.errors import ContractInputError
from kernels.operators import operator
from kernels.record import Record, Upstream

SPEC = "§8"
HCA_RATIO = 128
PATHS = ("SWA", "HCA", "CSA")
HCA_TOPK_LIMITS = ("index_topk", "all")
COMPRESSOR_FIELDS = ("state_block_table", "state_pool", "weights", "cmp_slot_mapping", "kv_seq_lens")
CSA_RATIO = 4
CSA_COMPRESSOR_FIELDS = (*COMPRESSOR_FIELDS, "inner_state_block_table", "inner_state_pool", "inner_weights",
                         "idx_slot_mapping")
INDEXER_FIELDS = ("wq_b", "wq_b_scale", "weights_proj", "hadamard", "idx_kv_cache", "idx_kv_scale", "idx_block_table")
INDEX_KEY_ROPE = ("step", "window_start")
LAYER_CACHES = ("kv_cache", "cmp_kv", "state_pool", "inner_state_pool", "idx_kv_cache", "idx_kv_scale")


def _binder(ops: dict):
    def bound(name, default):
        fn = ops.get(name, default)
        return partial(fn, ops=ops) if getattr(fn, "composes_operators", False) else fn
    return bound


def hca_limit(config, rule: str = "index_topk") -> int:
    """The compressed positions an HCA decode token may attend at most (upstream's HCA_TOPK_LIMIT), by the named
    rule (``HCA_TOPK_LIMITS``): ``"index_topk"`` min(max_position_embeddings // 128, index_topk) (V4-Pro's
    decode_attention_hca.py), ``"all"`` max_position_embeddings // 128, every compressed position the model holds
    (Flash-MTP's decode_hca.py). docs/upstream.md, disagreement 23."""
    if rule not in HCA_TOPK_LIMITS:
        raise ContractInputError("hca_topk_limit", None, f"one of {HCA_TOPK_LIMITS}", repr(rule), SPEC)
    every = config.max_position_embeddings // HCA_RATIO
    return min(every, config.index_topk) if rule == "index_topk" else every


def _check_parts(attention: dict, compressor: dict | None, path: str, indexer: dict | None = None) -> None:
    if path not in PATHS:
        raise ContractInputError("path", None, f"one of {PATHS}", repr(path), SPEC)
    for name in ("x_hc", "compressed"):
        if name in attention:
            raise ContractInputError("attention", None, f"the stage's arguments without {name} (the layer supplies "
                                     "it)", name, SPEC)
    if path == "SWA" and compressor is not None:
        raise ContractInputError("compressor", None, "None on the SWA path (it compresses nothing)", "given", SPEC)
    if path != "CSA" and indexer is not None:
        raise ContractInputError("indexer", None, f"None on the {path} path (only CSA has an indexer)", "given", SPEC)
    if path != "SWA":
        fields = CSA_COMPRESSOR_FIELDS if path == "CSA" else COMPRESSOR_FIELDS
        missing = set(fields) - set(compressor or {})
        if missing:
            raise ContractInputError("compressor", None, ", ".join(fields), sorted(missing), SPEC)
        if "cmp_kv" not in attention or "cmp_block_table" not in attention:
            raise ContractInputError("attention", None, "cmp_kv and cmp_block_table (the compressed cache the "
                                     "compressor writes and the attention reads)", sorted(attention), SPEC)
    if path == "CSA":
        missing = set(INDEXER_FIELDS) - set(indexer or {})
        if missing:
            raise ContractInputError("indexer", None, ", ".join(INDEXER_FIELDS), sorted(missing), SPEC)


def check_hca_stage(x_hc: torch.Tensor, attention: dict, compressor: dict, *, config) -> None:
    """The caller's side of ``v4_hca_stage`` that the stage itself checks before any operator runs: its parts, and
    one kv length per request of ``decode_seq`` rows."""
    _check_parts(attention, compressor, "HCA")
    _check_lens(x_hc, compressor, config)


def _check_lens(x_hc: torch.Tensor, compressor: dict, config) -> None:
    tokens, seq, lens = x_hc.shape[0], config.decode_seq, compressor["kv_seq_lens"]
    if tokens % seq or lens.ndim != 1 or lens.numel() * seq != tokens:
        raise ContractInputError("kv_seq_lens", None, f"one length per request of {seq} rows ({tokens // seq})",
                                 list(lens.shape), SPEC)


@operator(returns="{x_out [T,hc,D] FP32, kv_cache, cmp_kv, state_pool, qr, qr_scale}: the HCA attention stage "
                  "with its ratio-128 compressor inside, composed from hc_mixes, hc_pre, final_norm, "
                  "v4_compress_and_publish, hca_topk and v4_attention_stage",
          spec="§8")
def v4_hca_stage(x_hc: torch.Tensor, attention: dict, compressor: dict, *, config, ops=None,
                 hca_topk_limit: str = "index_topk") -> dict[str, torch.Tensor]:
    """x_hc [T, hc, D] FP32; ``attention`` v4_attention_stage's arguments by name without x_hc and ``compressed``,
    with ``cmp_kv`` (the compressed cache [pages, page, 1, d] BF16 the compressor writes) and ``cmp_block_table``;
    ``compressor`` {state_block_table, state_pool, weights (V4CompressorWeights), cmp_slot_mapping [T],
    kv_seq_lens [B]} -> {"x_out", "kv_cache", "cmp_kv" (the new compressed cache), "state_pool", "qr",
    "qr_scale"}. ``hca_topk_limit`` names the top-k's limit (``hca_limit``). No input is modified. Spec: §8."""
    from kernels.reference import lm_head, mhc
    from kernels.v4.attention_stage import stage_positions, v4_attention_stage
    from kernels.v4.compressor import v4_compress_and_publish
    from kernels.v4.decode_metadata import hca_topk

    check_hca_stage(x_hc, attention, compressor, config=config)
    limit = hca_limit(config, hca_topk_limit)
    bound = _binder(ops or {})
    a, c = dict(attention), compressor
    tokens, seq = x_hc.shape[0], config.decode_seq
    _, pos = stage_positions(a["position_ids"], a["freqs_cos"], tokens=tokens, num_tokens=None)
    mixes = bound("hc_mixes", mhc.hc_mixes)(x_hc, a["hc_fn"], a["hc_scale"], a["hc_base"], config=config)
    x_normed = bound("final_norm", lm_head.final_norm)(bound("hc_pre", mhc.hc_pre)(x_hc, mixes.pre),
                                                       a["attn_norm_w"], config=config)
    half = config.qk_rope_head_dim // 2
    published = bound("v4_compress_and_publish", v4_compress_and_publish)(
        x_normed, pos, torch.arange(tokens) // seq, c["state_block_table"], c["state_pool"], c["weights"],
        c["cmp_slot_mapping"], a.pop("cmp_kv"), a["freqs_cos"][:, :half].float(), a["freqs_sin"][:, :half].float(),
        ratio=HCA_RATIO, overlap=False)
    compressed = bound("hca_topk", hca_topk)(pos, c["kv_seq_lens"], seq=seq, limit=limit,
                                             ratio=HCA_RATIO)
    out = bound("v4_attention_stage", v4_attention_stage)("HCA", x_hc, **a, cmp_kv=published["cmp_pool"],
                                                          compressed=compressed, config=config)
    return {**out, "cmp_kv": published["cmp_pool"], "state_pool": published["state_pool"]}


v4_hca_stage.composes_operators = True




def check_csa_stage(x_hc: torch.Tensor, attention: dict, compressor: dict, indexer: dict, *, config,
                    index_key_rope: str) -> None:
    """The caller's side of ``v4_csa_stage`` that the stage itself checks before any operator runs."""
    if index_key_rope not in INDEX_KEY_ROPE:
        raise ContractInputError("index_key_rope", None, f"one of {INDEX_KEY_ROPE}", repr(index_key_rope), SPEC)
    _check_parts(attention, compressor, "CSA", indexer)
    _check_lens(x_hc, compressor, config)


@operator(returns="{x_out, kv_cache, cmp_kv, state_pool, inner_state_pool, idx_kv_cache, idx_kv_scale, qr, "
                  "qr_scale}: the CSA attention stage with its ratio-4 compressors and indexer inside, composed from "
                  "hc_mixes, hc_pre, final_norm, v4_qkv_proj_rope, v4_compress_and_publish, v4_compressor, "
                  "v4_publish_index_keys, v4_indexer and v4_attention_stage",
          spec="§8")
def v4_csa_stage(x_hc: torch.Tensor, attention: dict, compressor: dict, indexer: dict, *, config, ops=None,
                 index_key_rope: str = "step") -> dict[str, torch.Tensor]:
    """As ``v4_hca_stage`` with CSA's ratio-4 overlapping compressors and its indexer: ``compressor`` adds the
    inner (index-key) compressor's {inner_state_block_table, inner_state_pool, inner_weights} and
    ``idx_slot_mapping`` [T]; ``indexer`` {wq_b, wq_b_scale, weights_proj, hadamard, idx_kv_cache, idx_kv_scale,
    idx_block_table}. Order (upstream decode_attention_csa.py): the normalised row and its projection (qr), the
    main compressor publishes into cmp_kv, the inner compressor's keys are published into the index cache, the
    indexer scores the cache with those keys in it (its query rotated at the step's first position, one row per
    request), the attention reads the indexer's raw top-k. ``index_key_rope`` names where an index key is rotated:
    ``"step"`` (upstream V4's decode CSA kernel and golden: at the decode step's first position, the row the
    indexer's query uses) or ``"window_start"`` (the window's first position, as the compressed KV and the prefill
    index keys; the V4.1 spec's compressed profile). No input is modified. Spec: §8; docs/upstream.md
    (disagreement 22)."""
    from kernels.reference import lm_head, mhc
    from kernels.v4.attention_stage import stage_positions, v4_attention_stage
    from kernels.v4.compressor import v4_compress_and_publish, v4_compressor
    from kernels.v4.index_cache import v4_publish_index_keys
    from kernels.v4.indexer import v4_indexer
    from kernels.v4.qkv_proj import v4_qkv_proj_rope

    check_csa_stage(x_hc, attention, compressor, indexer, config=config, index_key_rope=index_key_rope)
    bound = _binder(ops or {})
    a, c, i = dict(attention), compressor, indexer
    tokens, seq = x_hc.shape[0], config.decode_seq
    _, pos = stage_positions(a["position_ids"], a["freqs_cos"], tokens=tokens, num_tokens=None)
    req = torch.arange(tokens) // seq
    first = pos.reshape(-1, seq)[:, 0]
    mixes = bound("hc_mixes", mhc.hc_mixes)(x_hc, a["hc_fn"], a["hc_scale"], a["hc_base"], config=config)
    x_normed = bound("final_norm", lm_head.final_norm)(bound("hc_pre", mhc.hc_pre)(x_hc, mixes.pre),
                                                       a["attn_norm_w"], config=config)
    proj = bound("v4_qkv_proj_rope", v4_qkv_proj_rope)(
        x_normed, a["wq_a"], a["wq_b"], a["wq_b_scale"], a["wkv"], a["freqs_cos"][pos], a["freqs_sin"][pos],
        a["gamma_cq"], a["gamma_ckv"], config=config)
    half = config.qk_rope_head_dim // 2
    cos, sin = a["freqs_cos"][:, :half].float(), a["freqs_sin"][:, :half].float()
    published = bound("v4_compress_and_publish", v4_compress_and_publish)(
        x_normed, pos, req, c["state_block_table"], c["state_pool"], c["weights"], c["cmp_slot_mapping"],
        a.pop("cmp_kv"), cos, sin, ratio=CSA_RATIO, overlap=True)
    keys, closes, inner_pool = bound("v4_compressor", v4_compressor)(
        x_normed, pos, req, c["inner_state_block_table"], c["inner_state_pool"], c["inner_weights"], ratio=CSA_RATIO,
        overlap=True)
    # v4_publish_index_keys rotates a key at position - ratio + 1: the step rule hands it first + ratio - 1
    rotated_at = first[req] + CSA_RATIO - 1 if index_key_rope == "step" else pos
    idx_cache, idx_scale = bound("v4_publish_index_keys", v4_publish_index_keys)(
        keys, closes, rotated_at, c["idx_slot_mapping"], i["idx_kv_cache"], i["idx_kv_scale"], cos, sin,
        i["hadamard"], ratio=CSA_RATIO)
    picks = bound("v4_indexer", v4_indexer)(
        x_normed, proj["qr"], proj["qr_scale"], i["wq_b"], i["wq_b_scale"], i["weights_proj"], cos[first],
        sin[first], i["hadamard"], idx_cache, idx_scale, i["idx_block_table"], pos, c["kv_seq_lens"], offset=0,
        config=config)
    out = bound("v4_attention_stage", v4_attention_stage)("CSA", x_hc, **a, cmp_kv=published["cmp_pool"],
                                                          compressed=picks["topk_idxs"], config=config)
    return {**out, "cmp_kv": published["cmp_pool"], "state_pool": published["state_pool"],
            "inner_state_pool": inner_pool, "idx_kv_cache": idx_cache, "idx_kv_scale": idx_scale}


v4_csa_stage.composes_operators = True


PREFILL_COMPRESSOR_FIELDS = ("state_block_table", "state_pool", "weights", "cmp_slot_mapping", "state_slot_mapping")


def check_prefill_hca_stage(x_hc: torch.Tensor, attention: dict, compressor: dict, num_tokens) -> None:
    """The caller's side of ``v4_prefill_hca_stage`` that the stage itself checks before any operator runs."""
    missing = set(PREFILL_COMPRESSOR_FIELDS) - set(compressor)
    if missing:
        raise ContractInputError("compressor", None, ", ".join(PREFILL_COMPRESSOR_FIELDS), sorted(missing), SPEC)
    missing = {"block_table", "cmp_kv", "cmp_block_table"} - set(attention)
    if missing or {"x_hc", "compressed", "window_indices"} & set(attention):
        raise ContractInputError("attention", None, "the stage's arguments with block_table, cmp_kv and "
                                 "cmp_block_table, without x_hc, compressed and window_indices (the stage makes them)",
                                 sorted(missing or {"x_hc", "compressed", "window_indices"} & set(attention)), SPEC)


@operator(returns="{x_out, kv_cache, cmp_kv, state_pool, qr, qr_scale}: the HCA attention stage on one request's "
                  "prefill chunk with its ratio-128 compressor inside, composed from hc_mixes, hc_pre, final_norm, "
                  "v4_prefill_compressor, v4_prefill_swa_indices, hca_topk and v4_attention_stage (prefill form)",
          spec="§8")
def v4_prefill_hca_stage(x_hc: torch.Tensor, attention: dict, compressor: dict, num_tokens: int, *, config,
                         ops=None) -> dict[str, torch.Tensor]:
    """One request's prefill chunk (upstream prefill_attention_hca.py / Flash-MTP's prefill_hca.py): x_hc [T, hc,
    D] FP32, rows from ``num_tokens`` on padding; ``attention`` the stage's arguments by name with the 1-D window
    page table ``block_table``, the compressed cache ``cmp_kv`` and its ``cmp_block_table`` [1, pages];
    ``compressor`` {state_block_table (1-D), state_pool, weights, cmp_slot_mapping [T], state_slot_mapping [T]}.
    The chunk's normalised rows go through v4_prefill_compressor (ratio 128, the stage's RoPE tables), which
    publishes each closed window before the attention reads the compressed cache; the window is lowered from the
    page table (v4_prefill_swa_indices); each real row attends its first min((pos + 1) // 128, index_topk)
    compressed positions (hca_topk over the request), padding rows none -> {"x_out", "kv_cache", "cmp_kv",
    "state_pool", "qr", "qr_scale"}. No input is modified. Spec: §8."""
    from kernels.reference import lm_head, mhc
    from kernels.v4.attention_stage import stage_positions, v4_attention_stage
    from kernels.v4.decode_metadata import hca_topk, v4_prefill_swa_indices
    from kernels.v4.prefill_compressor import v4_prefill_compressor

    check_prefill_hca_stage(x_hc, attention, compressor, num_tokens)
    bound = _binder(ops or {})
    a, c = dict(attention), compressor
    tokens = x_hc.shape[0]
    real, pos = stage_positions(a["position_ids"], a["freqs_cos"], tokens=tokens, num_tokens=num_tokens)
    mixes = bound("hc_mixes", mhc.hc_mixes)(x_hc, a["hc_fn"], a["hc_scale"], a["hc_base"], config=config)
    x_normed = bound("final_norm", lm_head.final_norm)(bound("hc_pre", mhc.hc_pre)(x_hc, mixes.pre),
                                                       a["attn_norm_w"], config=config)
    published = bound("v4_prefill_compressor", v4_prefill_compressor)(
        x_normed, pos, real, c["state_block_table"], c["state_pool"], c["weights"], c["cmp_slot_mapping"],
        c["state_slot_mapping"], a.pop("cmp_kv"), a["freqs_cos"], a["freqs_sin"], ratio=HCA_RATIO,
        rope_head_dim=config.qk_rope_head_dim)
    window = bound("v4_prefill_swa_indices", v4_prefill_swa_indices)(pos, a.pop("block_table"), real, config=config)
    last = int(pos[:real].max()) + 1 if real else 0
    slots = bound("hca_topk", hca_topk)(pos, torch.tensor([last]), seq=tokens, limit=config.index_topk,
                                        ratio=HCA_RATIO).clone()
    slots[real:] = -1  # padding rows attend nothing
    out = bound("v4_attention_stage", v4_attention_stage)("HCA", x_hc, **a, window_indices=window,
                                                          cmp_kv=published["cmp_pool"], compressed=slots,
                                                          num_tokens=real, config=config)
    return {**out, "cmp_kv": published["cmp_pool"], "state_pool": published["state_pool"]}


v4_prefill_hca_stage.composes_operators = True


PREFILL_CSA_FIELDS = (*PREFILL_COMPRESSOR_FIELDS, "inner_state_block_table", "inner_state_pool", "inner_weights",
                      "idx_slot_mapping", "inner_state_slot_mapping")


def check_prefill_csa_stage(x_hc: torch.Tensor, attention: dict, compressor: dict, indexer: dict, num_tokens) -> None:
    """The caller's side of ``v4_prefill_csa_stage`` that the stage itself checks before any operator runs."""
    check_prefill_hca_stage(x_hc, attention, {k: compressor[k] for k in PREFILL_COMPRESSOR_FIELDS if k in compressor},
                            num_tokens)
    missing = (set(PREFILL_CSA_FIELDS) - set(compressor)) | (set(INDEXER_FIELDS) - set(indexer or {}))
    if missing:
        raise ContractInputError("compressor / indexer", None, ", ".join((*PREFILL_CSA_FIELDS, *INDEXER_FIELDS)),
                                 sorted(missing), SPEC)


@operator(returns="{x_out, kv_cache, cmp_kv, state_pool, inner_state_pool, idx_kv_cache, idx_kv_scale, qr, qr_scale}: "
                  "the CSA attention stage on one request's prefill chunk with its ratio-4 compressors and indexer "
                  "inside, composed from hc_mixes, hc_pre, final_norm, v4_qkv_proj_rope, v4_prefill_compressor, "
                  "v4_prefill_index_keys, v4_prefill_indexer, v4_prefill_swa_indices and v4_attention_stage",
          spec="§8")
def v4_prefill_csa_stage(x_hc: torch.Tensor, attention: dict, compressor: dict, indexer: dict, num_tokens: int, *,
                         config, ops=None, query_staging: str = "bf16") -> dict[str, torch.Tensor]:
    """One request's prefill chunk (upstream prefill_attention_csa.py / Flash-MTP's prefill_csa.py): as
    ``v4_prefill_hca_stage`` with CSA's ratio-4 main compressor (v4_prefill_compressor), the index keys
    (v4_prefill_index_keys: ``compressor`` adds inner_state_block_table, inner_state_pool, inner_weights,
    idx_slot_mapping, inner_state_slot_mapping) published before the indexer scores (v4_prefill_indexer, its query
    rotated at each row's own position; ``indexer`` {wq_b, wq_b_scale, weights_proj, hadamard, idx_kv_cache,
    idx_kv_scale, idx_block_table (1-D)}), and the attention reading the indexer's raw top-k (kept where
    0 <= raw < (pos + 1) // 4) -> {"x_out", "kv_cache", "cmp_kv", "state_pool", "inner_state_pool",
    "idx_kv_cache", "idx_kv_scale", "qr", "qr_scale"}. ``query_staging``: the indexer's (``v4_prefill_indexer``).
    No input is modified. Spec: §8."""
    from kernels.reference import lm_head, mhc
    from kernels.v4.attention_stage import stage_positions, v4_attention_stage
    from kernels.v4.decode_metadata import v4_prefill_swa_indices
    from kernels.v4.prefill_compressor import v4_prefill_compressor, v4_prefill_index_keys
    from kernels.v4.prefill_indexer import v4_prefill_indexer
    from kernels.v4.qkv_proj import v4_qkv_proj_rope

    check_prefill_csa_stage(x_hc, attention, compressor, indexer, num_tokens)
    bound = _binder(ops or {})
    a, c, i = dict(attention), compressor, indexer
    tokens, rope = x_hc.shape[0], config.qk_rope_head_dim
    real, pos = stage_positions(a["position_ids"], a["freqs_cos"], tokens=tokens, num_tokens=num_tokens)
    mixes = bound("hc_mixes", mhc.hc_mixes)(x_hc, a["hc_fn"], a["hc_scale"], a["hc_base"], config=config)
    x_normed = bound("final_norm", lm_head.final_norm)(bound("hc_pre", mhc.hc_pre)(x_hc, mixes.pre),
                                                       a["attn_norm_w"], config=config)
    cos, sin = a["freqs_cos"][pos], a["freqs_sin"][pos]
    proj = bound("v4_qkv_proj_rope", v4_qkv_proj_rope)(x_normed, a["wq_a"], a["wq_b"], a["wq_b_scale"], a["wkv"], cos,
                                                       sin, a["gamma_cq"], a["gamma_ckv"], config=config)
    published = bound("v4_prefill_compressor", v4_prefill_compressor)(
        x_normed, pos, real, c["state_block_table"], c["state_pool"], c["weights"], c["cmp_slot_mapping"],
        c["state_slot_mapping"], a.pop("cmp_kv"), a["freqs_cos"], a["freqs_sin"], ratio=CSA_RATIO, rope_head_dim=rope)
    keys = bound("v4_prefill_index_keys", v4_prefill_index_keys)(
        x_normed, pos, real, c["inner_state_block_table"], c["inner_state_pool"], c["inner_weights"],
        c["idx_slot_mapping"], c["inner_state_slot_mapping"], i["idx_kv_cache"], i["idx_kv_scale"], a["freqs_cos"],
        a["freqs_sin"], i["hadamard"], rope_head_dim=rope)
    picks = bound("v4_prefill_indexer", v4_prefill_indexer)(
        x_normed, proj["qr"], proj["qr_scale"], i["wq_b"], i["wq_b_scale"], i["weights_proj"],
        cos[:, :rope // 2].float(), sin[:, :rope // 2].float(), i["hadamard"], keys["idx_kv_cache"],
        keys["idx_kv_scale"], i["idx_block_table"], pos, real, config=config,
        **({"query_staging": query_staging} if query_staging != "bf16" else {}))
    window = bound("v4_prefill_swa_indices", v4_prefill_swa_indices)(pos, a.pop("block_table"), real, config=config)
    out = bound("v4_attention_stage", v4_attention_stage)("CSA", x_hc, **a, window_indices=window,
                                                          cmp_kv=published["cmp_pool"], compressed=picks["topk_idxs"],
                                                          num_tokens=real, config=config)
    return {**out, "cmp_kv": published["cmp_pool"], "state_pool": published["state_pool"],
            "inner_state_pool": keys["state_pool"], "idx_kv_cache": keys["idx_kv_cache"],
            "idx_kv_scale": keys["idx_kv_scale"]}


v4_prefill_csa_stage.composes_operators = True


@operator(returns="{x_out [T,hc,D] FP32, kv_cache (+ the stage's other caches and states)}: one decode layer, the "
                  "attention stage (SWA, v4_hca_stage or v4_csa_stage) then v4_moe_stage on its streams, every row "
                  "real",
          spec="§8")
def v4_decode_layer(path: str, x_hc: torch.Tensor, attention: dict, moe: dict, compressor: dict | None = None,
                    indexer: dict | None = None, *, config, ops=None, hca_topk_limit: str = "index_topk"
                    ) -> dict[str, torch.Tensor]:
    """x_hc [T, hc, D] FP32; ``attention`` the stage's arguments by name without x_hc (HCA / CSA: with cmp_kv and
    cmp_block_table); ``moe`` v4_moe_stage's by name without x_hc and num_tokens (with layer_id);
    ``compressor`` v4_hca_stage's / v4_csa_stage's, ``indexer`` v4_csa_stage's (CSA only) -> {"x_out" (the MoE
    stage's streams), "kv_cache", and the stage's other caches and states} (upstream's layer goldens return these;
    the attention stage's streams stay inside). ``hca_topk_limit``: the HCA stage's (``hca_limit``). Spec: §8."""
    from kernels.v4.attention_stage import v4_attention_stage
    from kernels.v4.moe import v4_moe_stage

    _check_parts(attention, compressor, path, indexer)
    if "x_hc" in moe or "num_tokens" in moe:
        raise ContractInputError("moe", None, "the MoE stage's arguments without x_hc and num_tokens (every decode "
                                 "row is real)", sorted(set(moe) & {"x_hc", "num_tokens"}), SPEC)
    bound = _binder(ops or {})
    if path == "SWA":
        att = bound("v4_attention_stage", v4_attention_stage)("SWA", x_hc, **attention, config=config)
    elif path == "HCA":
        att = bound("v4_hca_stage", v4_hca_stage)(x_hc, attention, compressor, config=config,
                                                  hca_topk_limit=hca_topk_limit)
    else:
        att = bound("v4_csa_stage", v4_csa_stage)(x_hc, attention, compressor, indexer, config=config)
    out = bound("v4_moe_stage", v4_moe_stage)(att["x_out"], **moe, num_tokens=x_hc.shape[0], config=config)
    kept = {k: att[k] for k in LAYER_CACHES if k in att}
    return {"x_out": out["x_out"], **kept}


v4_decode_layer.composes_operators = True


# --- the records (no sample tree: the stage's and the layer's trees are a user store's, the sample store is at its
# budget; the contracts judge both on every backend) -------------------------------------------------------------

_DSPARK_NONE = ("dspark's decode stage goldens stop at the heads packed for its TP output projection and import "
                "decode_o_proj.py, which checks the model's tiling at import (not runnable at the contracts' width)")

def _stage_record(operator: str, call, outputs: dict, golden: str, pro: str, mtp: str, dspark_entry: str,
                  dspark_none: str = _DSPARK_NONE, dspark_golden: bool | str = False) -> Record:
    """The record of a compressed stage adapted from V4-Pro's ``pro`` and Flash-MTP's ``mtp`` module (file names
    without .py) with the golden ``golden`` and the entry ``<golden without golden_>_test``; dspark's entry, and its
    golden in the Flash-MTP module's file where ``dspark_golden`` (a name: dspark's own golden of that file; else
    ``dspark_none`` says why not)."""
    entry = golden.removeprefix("golden_") + "_test"
    golden_of_dspark = dspark_golden if isinstance(dspark_golden, str) else golden
    return Record(operator=operator, call=call, outputs=outputs, cases=(), bindings=(
        Upstream("deepseek_v4_pro", golden=f"{pro}.py::{golden}", entry=f"{pro}.py::{entry}"),
        Upstream("deepseek_v4_flash_mtp", golden=f"{mtp}.py::{golden}", entry=f"{mtp}.py::{entry}"),
        Upstream("deepseek_v4_flash_dspark", golden=f"{mtp}.py::{golden_of_dspark}" if dspark_golden else "",
                 entry=dspark_entry, none="" if dspark_golden else dspark_none)))


_DECODE_OUT = {"x_out": "fp32_ulps", "kv_cache": "exact", "cmp_kv": "exact"}

HCA_STAGE_RECORD = _stage_record(
    "v4_hca_stage", lambda fn, i, config: dict(fn(i["x_hc"], i["attention"], i["compressor"], config=config)),
    {**_DECODE_OUT, "state_pool": "fp32_ulps"}, "golden_attention_hca", "decode_attention_hca", "decode_hca",
    "decode_hca.py::decode_hca_tp1_test", dspark_golden="golden_decode_hca_tp1")

CSA_STAGE_RECORD = _stage_record(
    "v4_csa_stage",
    lambda fn, i, config: dict(fn(i["x_hc"], i["attention"], i["compressor"], i["indexer"], config=config)),
    {**_DECODE_OUT, "idx_kv_cache": "exact"}, "golden_attention_csa", "decode_attention_csa", "decode_csa",
    "decode_csa.py::decode_csa_tp1_test", dspark_golden="golden_decode_csa_tp1")

DECODE_LAYER_RECORD = Record(
    operator="v4_decode_layer",
    call=lambda fn, i, config: dict(fn(i["path"], i["x_hc"], i["attention"], i["moe"], i.get("compressor"),
                                       i.get("indexer"), config=config)),
    outputs={"x_out": "fp32_ulps", "kv_cache": "exact"},
    cases=(),
    bindings=(Upstream("deepseek_v4_pro", golden="decode_layer.py::golden_decode_layer_swa",
                       entry="decode_layer.py::decode_layer"),
              Upstream("deepseek_v4_flash_mtp", golden="decode_layer.py::golden_decode_layer",
                       entry="decode_layer.py::decode_layer"),
              Upstream("deepseek_v4_flash_dspark", none="no decode_layer.py: dspark composes its layer in its "
                       "drivers")),
)

PREFILL_HCA_STAGE_RECORD = _stage_record(
    "v4_prefill_hca_stage",
    lambda fn, i, config: dict(fn(i["x_hc"], i["attention"], i["compressor"], int(i["num_tokens"]), config=config)),
    _DECODE_OUT, "golden_prefill_attention_hca", "prefill_attention_hca", "prefill_hca",
    "prefill_hca.py::prefill_attention_hca_test", dspark_golden=True)

PREFILL_CSA_STAGE_RECORD = _stage_record(
    "v4_prefill_csa_stage",
    lambda fn, i, config: dict(fn(i["x_hc"], i["attention"], i["compressor"], i["indexer"], int(i["num_tokens"]),
                                  config=config)),
    {**_DECODE_OUT, "idx_kv_cache": "exact"}, "golden_prefill_attention_csa", "prefill_attention_csa", "prefill_csa",
    "prefill_csa.py::prefill_attention_csa_test", dspark_golden=True)
