"""Which upstream pypto-lib entry each operator of this project binds on the ``pypto`` backend -- the one
place that says so (``docs/backends.md`` is generated from it and a test keeps the two equal).

Every kernel operator of ``contracts.operators.KERNEL_OPERATORS`` has a row (derived when not written here):

* ``bound``: the backend runs the upstream entry through upstream's ``golden.run_jit`` in the upstream worker and
  returns the outputs it captured: a V4-Pro entry of ``PRO_ENTRIES`` directly (the call laid out by
  ``backends.upstream.adapters``; its arguments are read from the entry's declaration at run time), a V4.1 entry
  through the wrapper program of ``backends/pypto/programs.py`` named by ``program``;
* ``not bound``: upstream has an entry for it, but this version does not bind it yet; ``note`` says what is
  missing;
* ``not exposed``: upstream has no entry with this operator's inputs and outputs (the work is fused inside
  another entry, or is host Python); ``note`` names where it lives, so it cannot be bound as it stands;
* ``host``: host-side Python (metadata, schedule, slab arithmetic, caller checks), not a device kernel;
* ``composition``: built from other operators (runs on whatever this backend binds);
* ``not surveyed``: derived for a declared operator without a row here (no upstream entry named yet).

Upstream paths are relative to the pypto-lib root, under ``models/deepseek_v4_1_flash/`` unless given in
full. Argument rows: (name, direction in/out/inout/scalar, dtype, shape with upstream's dynamic dims).
Facts: spec §2.3, §4.1, §4.2, §5, §7.1-§7.3 and the upstream entry files named.
"""

from __future__ import annotations

from dataclasses import dataclass

FLASH = "models/deepseek_v4_1_flash"
PRO = "models/deepseek_v4_pro"


@dataclass(frozen=True)
class Arg:
    name: str
    direction: str  # in | out | inout | scalar
    dtype: str
    shape: str


@dataclass(frozen=True)
class Binding:
    operator: str
    status: str  # bound | not bound | not exposed | host | composition | not surveyed
    upstream: str  # file::function (or files)
    kind: str = ""  # @pl.jit / @pl.jit.inline / host Python
    args: tuple[Arg, ...] = ()
    program: str | None = None  # backends.pypto.programs attribute when bound (V4.1)
    note: str = ""
    variants: tuple[tuple[str, tuple[Arg, ...]], ...] = ()  # (upstream entry, its arguments) per mode


def _args(*rows: tuple[str, str, str, str]) -> tuple[Arg, ...]:
    return tuple(Arg(*r) for r in rows)


_LEAF_PREFIX = _args(
    ("x", "in", "BF16", "[T_DYN, D]"), ("wq_a", "in", "FP8E4M3FN", "[D, Q_LORA]"),
    ("wq_a_scale", "in", "FP8E8M0 (MX_B_NN)", "[D//32, Q_LORA]"), ("q_norm_weight", "in", "BF16", "[Q_LORA]"),
    ("wq_b", "in", "FP8E4M3FN", "[Q_LORA, LOCAL_H*HEAD_DIM]"),
    ("wq_b_scale", "in", "FP8E8M0 (MX_B_NN)", "[Q_LORA//32, LOCAL_H*HEAD_DIM]"),
    ("wkv", "in", "FP8E4M3FN", "[D, HEAD_DIM]"), ("wkv_scale", "in", "FP8E8M0 (MX_B_NN)", "[D//32, HEAD_DIM]"),
    ("kv_norm_weight", "in", "BF16", "[HEAD_DIM]"), ("attn_sink", "in", "FP32", "[LOCAL_H]"),
    ("wo_a", "in", "BF16", "[LOCAL_O_GROUPS, O_LORA, O_GROUP_IN]"), ("wo_b", "in", "FP8E4M3FN", "[LOCAL_O_WIDTH, D]"),
    ("wo_b_scale", "in", "FP8E8M0 (MX_B_NN)", "[LOCAL_O_WIDTH//32, D]"),
    ("rope_cos", "in", "FP32", "[T_DYN, ROPE_DIM//2]"), ("rope_sin", "in", "FP32", "[T_DYN, ROPE_DIM//2]"),
    ("window_slots", "in", "INT64", "[T_DYN]"), ("window_indices", "in", "INT32", "[T_DYN, 128]"),
    ("window_cache", "inout", "FP8E4M3FN", "[ORI_BLOCKS_DYN, 128, 1, HEAD_DIM]"),
    ("window_cache_scale", "inout", "FP8E8M0", "[ORI_BLOCKS_DYN, 128, 1, HEAD_DIM//32]"),
)
_LEAF_TAIL = _args(
    ("output_window", "inout", "FP32 (distributed window)", "[DECODE_MAX_TOKENS, D]"),
    ("output_arrived", "inout", "INT32 (distributed window)", "[TP_SIZE, 1]"),
    ("output", "out", "BF16", "[OUTPUT_T_DYN, D] (sharded: the owner slab)"),
    ("group_base", "scalar", "INT32", ""), ("tp_rank", "scalar", "INT32", ""),
    ("num_tokens", "scalar", "INT32", ""), ("attention_epoch", "scalar", "INT32", "1-based, consecutive"),
)
_CMP_CACHE = _args(("compressed_cache", "inout", "FP4E2M1X2 (UINT8 carrier)", "[CMP_BLOCKS_DYN, 128, 1, HEAD_DIM//2]"),
                   ("compressed_cache_scale", "inout", "FP8E4M3FN", "[CMP_BLOCKS_DYN, 128, 1, HEAD_DIM//16]"))
_INDEX_CACHE = _args(("index_cache", "inout", "FP4E2M1X2 (UINT8 carrier)", "[INDEX_BLOCKS_DYN, 128, 1, INDEX_DIM//2]"),
                     ("index_cache_scale", "inout", "FP8E8M0", "[INDEX_BLOCKS_DYN, 128, 1, INDEX_DIM//32]"),
                     ("index_block_table", "in", "INT32", "[B_DYN, TABLE_DYN]"))
_INDEXER_WEIGHTS = _args(("index_wk", "in", "BF16", "[HEAD_DIM, INDEX_DIM]"), ("index_norm_weight", "in", "BF16",
                         "[INDEX_DIM]"), ("index_wq_b", "in", "FP8E4M3FN", "[Q_LORA, INDEX_H*INDEX_DIM]"),
                         ("index_wq_b_scale", "in", "FP8E8M0 (MX_B_NN)", "[Q_LORA//32, INDEX_H*INDEX_DIM]"),
                         ("index_weights_proj", "in", "BF16", "[D, INDEX_H]"))
# The index cache as a reader takes it (REINDEX leaves and the fused indexer).
_INDEX_READ = _args(("request_ids", "in", "INT32", "[T_DYN]"), ("compressed_lens", "in", "INT32", "[T_DYN]"),
                    ("index_cache", "in", "FP4E2M1X2 (UINT8 carrier)", "[INDEX_BLOCKS_DYN, 128, 1, INDEX_DIM//2]"),
                    ("index_cache_scale", "in", "FP8E8M0", "[INDEX_BLOCKS_DYN, 128, 1, INDEX_DIM//32]"),
                    ("index_block_table", "in", "INT32", "[B_DYN, TABLE_DYN]"))
LEAF_VARIANTS = (
    (f"{FLASH}/decode_attn_swa.py::decode_attn_swa (+ _sharded)", _LEAF_PREFIX + _LEAF_TAIL),
    (f"{FLASH}/decode_attn_c2a_full.py::decode_attn_c2a_full", _LEAF_PREFIX + _CMP_CACHE + _args(
        ("token_to_req_indices", "in", "INT32", "[T_DYN]"), ("compressed_lens", "in", "INT32", "[T_DYN]"))
     + _INDEX_CACHE[:2] + _INDEX_CACHE[2:] + _args(
        ("position_ids", "in", "INT32", "[T_DYN]"), ("compressed_rope_cos", "in", "FP32", "[T_DYN, ROPE_DIM//2]"),
        ("compressed_rope_sin", "in", "FP32", "[T_DYN, ROPE_DIM//2]"), ("compressor_wkv", "in", "FP32", "[D, HEAD_DIM]"),
        ("compressor_wgate", "in", "FP32", "[D, HEAD_DIM]"), ("query_start_loc", "in", "INT32", "[Q_START_DYN]"),
        ("state_block_table", "in", "INT32", "[B_DYN, 1]"),
        ("state_cache", "inout", "FP32", "[STATE_BLOCKS_DYN, STATE_CAPACITY, STATE_WIDTH]"),
        ("compressor_norm_weight", "in", "BF16", "[HEAD_DIM]"), ("compressed_slots", "in", "INT64", "[T_DYN]"))
     + _INDEXER_WEIGHTS + _args(("topk_indices", "out", "INT32", "[T_DYN, INDEX_TOPK]")) + _LEAF_TAIL),
    (f"{FLASH}/decode_attn_c2a_reuse.py::decode_attn_c2a_reuse", _LEAF_PREFIX + _args(
        ("compressed_cache", "in", "FP4E2M1X2", "[CMP_BLOCKS_DYN, 128, 1, HEAD_DIM//2]"),
        ("compressed_cache_scale", "in", "FP8E4M3FN", "[CMP_BLOCKS_DYN, 128, 1, HEAD_DIM//16]"),
        ("compressed_indices", "in", "INT32", "[T_DYN, INDEX_TOPK]")) + _LEAF_TAIL),
    (f"{FLASH}/decode_attn_c1a_full.py::decode_attn_c1a_full", _LEAF_PREFIX + _CMP_CACHE + _args(
        ("request_ids", "in", "INT32", "[T_DYN]"), ("compressed_lens", "in", "INT32", "[T_DYN]"))
     + _INDEX_CACHE + _args(
        ("compressed_rope_cos", "in", "FP32", "[T_DYN, ROPE_DIM//2]"),
        ("compressed_rope_sin", "in", "FP32", "[T_DYN, ROPE_DIM//2]"), ("compressor_wkv", "in", "BF16", "[D, HEAD_DIM]"),
        ("compressor_norm_weight", "in", "BF16", "[HEAD_DIM]"), ("compressed_slots", "in", "INT64", "[T_DYN]"))
     + _INDEXER_WEIGHTS + _args(("topk_indices", "out", "INT32", "[T_DYN, INDEX_TOPK]"),
                                ("candidate_mask", "out", "UINT8", "[T_DYN, CMP_POSITIONS_DYN]")) + _LEAF_TAIL),
    (f"{FLASH}/decode_attn_c1a_reindex.py::decode_attn_c1a_reindex", _LEAF_PREFIX + _args(
        ("compressed_cache", "in", "FP4E2M1X2 (UINT8 carrier)", "[CMP_BLOCKS_DYN, 128, 1, HEAD_DIM//2]"),
        ("compressed_cache_scale", "in", "FP8E4M3FN", "[CMP_BLOCKS_DYN, 128, 1, HEAD_DIM//16]"))
     + _INDEX_READ + _args(("candidate_mask", "in", "UINT8", "[T_DYN, CMP_POSITIONS_DYN] (from layer 20, spec §5.2)"))
     + _INDEXER_WEIGHTS[2:] + _args(("topk_indices", "out", "INT32", "[T_DYN, INDEX_TOPK]")) + _LEAF_TAIL),
    (f"{FLASH}/decode_attn_c1a_reuse.py::decode_attn_c1a_reuse", _LEAF_PREFIX + _args(
        ("compressed_cache", "in", "FP4E2M1X2", "[CMP_BLOCKS_DYN, 128, 1, HEAD_DIM//2]"),
        ("compressed_cache_scale", "in", "FP8E4M3FN", "[CMP_BLOCKS_DYN, 128, 1, HEAD_DIM//16]"),
        ("compressed_indices", "in", "INT32", "[T_DYN, INDEX_TOPK] (the source layer's Top-K)")) + _LEAF_TAIL),
    (f"{FLASH}/prefill_attn_swa.py::prefill_attn_swa", _LEAF_PREFIX + _args(
        ("output_window", "inout", "FP32 (distributed window)", "[PREFILL_MAX_TOKENS, D]")) + _LEAF_TAIL[1:]),
)
_PREFILL_WINDOW = Arg("output_window", "inout", "FP32 (distributed window)", "[PREFILL_MAX_TOKENS, D]")
_PREFILL_OUTPUT = Arg("output", "out", "BF16", "[T_DYN, D]")


def _prefill(entry: str, decode_args: tuple[Arg, ...]) -> tuple[str, tuple[Arg, ...]]:
    """A prefill leaf takes its decode twin's arguments in the same order; only the distributed output
    window is sized for PREFILL_MAX_TOKENS and the output is all T_DYN rows (upstream prefill_attn_<mode>.py
    entries call the decode partials, or the prefill_c1a_common partial, with these parameters)."""
    swap = {"output_window": _PREFILL_WINDOW, "output": _PREFILL_OUTPUT}
    return entry, tuple(swap.get(a.name, a) for a in decode_args)


_DECODE = dict(LEAF_VARIANTS[:6])
LEAF_VARIANTS += (
    _prefill(f"{FLASH}/prefill_attn_c2a_full.py::prefill_attn_c2a_full",
             _DECODE[f"{FLASH}/decode_attn_c2a_full.py::decode_attn_c2a_full"]),
    _prefill(f"{FLASH}/prefill_attn_c2a_reuse.py::prefill_attn_c2a_reuse",
             _DECODE[f"{FLASH}/decode_attn_c2a_reuse.py::decode_attn_c2a_reuse"]),
    _prefill(f"{FLASH}/prefill_attn_c1a_full.py::prefill_attn_c1a_full (make_prefill_attn_c1a_full(paged_indexer))",
             _DECODE[f"{FLASH}/decode_attn_c1a_full.py::decode_attn_c1a_full"]),
    _prefill(f"{FLASH}/prefill_attn_c1a_reindex.py::prefill_attn_c1a_reindex "
             "(make_prefill_attn_c1a_reindex(paged_indexer))",
             _DECODE[f"{FLASH}/decode_attn_c1a_reindex.py::decode_attn_c1a_reindex"]),
    _prefill(f"{FLASH}/prefill_attn_c1a_reuse.py::prefill_attn_c1a_reuse (make_prefill_attn_c1a_reuse())",
             _DECODE[f"{FLASH}/decode_attn_c1a_reuse.py::decode_attn_c1a_reuse"]),
)
# The fused indexer the C1A leaves call (prefill_c1a_indexer.py::make_paged_indexer()): scores and Top-K in
# one inline piece that starts from x and the query latent; it hands back no scores.
_PAGED_INDEXER = _args(
    ("x", "in", "BF16", "[T_DYN, D]"), ("query_latent", "in", "BF16", "[T_DYN, Q_LORA] (RMSNorm(x @ wq_a))"),
) + _INDEX_READ + _args(
    ("rope_cos", "in", "FP32", "[T_DYN, ROPE_DIM//2]"), ("rope_sin", "in", "FP32", "[T_DYN, ROPE_DIM//2]"),
    ("index_wq_b", "in", "FP8E4M3FN", "[Q_LORA, INDEX_H*INDEX_DIM]"),
    ("index_wq_b_scale", "in", "FP8E8M0 (MX_B_NN)", "[Q_LORA//32, INDEX_H*INDEX_DIM]"),
    ("index_weights_proj", "in", "BF16", "[D, INDEX_H]"),
    ("candidate_mask", "inout", "UINT8", "[T_DYN, CMP_POSITIONS_DYN] (the leaf's own, passed through)"),
    ("topk_indices", "out", "INT32", "[T_DYN, INDEX_TOPK]"), ("num_tokens", "scalar", "INT32", ""),
    ("ready", "scalar", "TASK_ID", "the index-cache publication"),
)

# Operators added with the composition around attention (mHC, MoE, LM head): their upstream argument lists are
# transcribed when that work binds them; until then the row says so (tests/test_pypto_backend.py allows exactly
# these rows to lack arguments).
PENDING: tuple[str, ...] = ("v4_compressor",)  # operators whose upstream argument list is not transcribed yet

BINDINGS: dict[str, Binding] = {b.operator: b for b in (
    Binding("materialize_rope_rows", "bound", f"{FLASH}/rope_tables.py::materialize_rope_rows", "@pl.jit.inline",
            _args(("freqs_cos", "in", "FP32", "[ROPE_ROWS_DYN, ROPE_DIM//2]"),
                  ("freqs_sin", "in", "FP32", "[ROPE_ROWS_DYN, ROPE_DIM//2]"),
                  ("position_ids", "in", "INT32", "[T_DYN]"), ("num_tokens", "scalar", "INT32", ""),
                  ("rope_cos", "inout", "FP32", "[T_DYN, ROPE_DIM//2]"),
                  ("rope_sin", "inout", "FP32", "[T_DYN, ROPE_DIM//2]")),
            program="materialize_rope_rows",
            note="wrapped in a @pl.jit program with the same parameters, as upstream's own validation wrapper "
                 "does; rows >= num_tokens keep their initial values (InOut)"),
    Binding("attention_half_layer", "not bound",
            f"{FLASH}/decode_attn_{{swa,c2a_full,c2a_reuse,c1a_full,c1a_reindex,c1a_reuse}}.py::decode_attn_<mode> "
            "(decode) and prefill_attn_<mode>.py (prefill)", "@pl.jit.inline(auto_scope=False) leaf per rank; the "
            "module's make_program builds the @pl.jit.host group entry over [world, ...] stacked tensors and its "
            "build_specs / golden_<mode> the specs and golden",
            note="the leaves are compiled at the Flash geometry (D, HEAD_DIM, Q_LORA, LOCAL_H and the O groups "
                 "are constants of upstream's config; only the _DYN dims vary), while the sample half-layer trees "
                 "are at FLASH_TINY geometry (a Flash-geometry tree holds hundreds of MB of weights, beyond the "
                 "sample store); the device also takes MX weights (FP8E4M3FN + E8M0 scales in the MX_B_NN "
                 "layout) stacked per rank, while the trees hold decoded weights. Binding needs Flash-geometry "
                 "cases, that weight packer and the per-rank stacking (until then the composition runs on the "
                 "operators this backend binds). Arguments below: the six decode leaves and the six prefill leaves (a prefill leaf takes "
                 "its decode twin's arguments in the same order, with the output window sized PREFILL_MAX_TOKENS). "
                 "Upstream runs them through its @pl.jit.host group entry (l3_<leaf>_test) with every argument "
                 "stacked [TP_SIZE, ...] per rank, golden.run(..., config={platform, distributed_config="
                 "DistributedConfig(device_ids, num_sub_workers=0)}) and exactly TP_SIZE device ids; the prefill "
                 "leaves are A5-only (not run on a5sim upstream) and prefill C1A supports TP 1, 2 and 4",
            variants=LEAF_VARIANTS),
    Binding("compressor_ratio2", "not bound",
            f"{FLASH}/decode_c2a_full.py::compressor_pair, compressor_pool, compressor_state_write",
            "@pl.jit.inline pieces",
            _args(("kv", "in", "FP32", "[T_DYN, HEAD_DIM]"), ("scores", "in", "FP32", "[T_DYN, HEAD_DIM]"),
                  ("positions", "in", "INT32", "[T_DYN]"), ("requests", "in", "INT32", "[T_DYN]"),
                  ("starts", "in", "INT32", "[Q_START_DYN]"), ("tables", "in", "INT32", "[B_DYN, 1]"),
                  ("state", "inout", "FP32", "[STATE_BLOCKS_DYN, STATE_CAPACITY_DYN, 2*HEAD_DIM]"),
                  ("previous_kv", "inout", "FP32", "[T_DYN, HEAD_DIM]"),
                  ("previous_scores", "inout", "FP32", "[T_DYN, HEAD_DIM]"), ("count", "scalar", "INT32", "")),
            note="upstream exposes the ring pieces (pair read, pool, state write) on projected kv/scores; this "
                 "operator starts from x and the compressor weights, so it maps to projection + these pieces"),
    Binding("sparse_attention", "not exposed", f"{FLASH}/decode_attn_swa.py::attend_window (and the C1A/C2A "
            "leaves' attention tiles)", "@pl.jit.inline",
            _args(("query", "in", "BF16", "[T_DYN, LOCAL_H*HEAD_DIM]"), ("selected", "in", "BF16",
                  "[T_DYN, 128, HEAD_DIM]"), ("indices", "in", "INT32", "[T_DYN, 128]"),
                  ("sink", "in", "FP32", "[LOCAL_H]"), ("output", "out", "BF16", "[T_DYN, LOCAL_H*HEAD_DIM]"),
                  ("num_tokens", "scalar", "INT32", "")),
            note="per-mode tiles over already-gathered rows; this operator takes both sources with their "
                 "indices (window + compressed), which no single upstream tile does"),
    Binding("cache_publish", "not bound", f"{FLASH}/decode_attn_swa.py::publish_window", "@pl.jit.inline",
            _args(("kv", "in", "BF16", "[T_DYN, HEAD_DIM]"), ("slots", "in", "INT64", "[T_DYN]"),
                  ("cache", "inout", "FP8E4M3FN", "[ORI_BLOCKS_DYN, 128, 1, HEAD_DIM]"),
                  ("scales", "inout", "FP8E8M0", "[ORI_BLOCKS_DYN, 128, 1, HEAD_DIM//32]"),
                  ("num_tokens", "scalar", "INT32", ""), ("cache_ready", "scalar", "TASK_ID", "")),
            note="the window cache only (MXFP8); the compressed and index caches publish inside their leaves; "
                 "needs a TASK_ID dependency the wrapper must produce"),
    Binding("cache_read", "not exposed", f"{FLASH}/decode_attn_swa.py::gather_window", "@pl.jit.inline",
            _args(("cache", "in", "FP8E4M3FN", "[ORI_BLOCKS_DYN, 128, 1, HEAD_DIM]"),
                  ("scales", "in", "FP8E8M0", "[ORI_BLOCKS_DYN, 128, 1, HEAD_DIM//32]"),
                  ("indices", "in", "INT32", "[T_DYN, 128]"), ("selected", "out", "BF16", "[T_DYN, 128, HEAD_DIM]"),
                  ("num_tokens", "scalar", "INT32", "")),
            note="upstream gathers selected rows per token; this operator decodes the whole cache"),
    Binding("mx_quantize", "not exposed", f"{FLASH}/quantization.py (host helpers) and the inline encoders of "
            "publish_window", "host Python / inline", note="no standalone device entry"),
    Binding("mx_dequantize", "not exposed", f"{FLASH}/quantization.py::decode_e8m0 (host) and gather_window",
            "host Python / inline", note="no standalone device entry"),
    Binding("o_proj", "not bound", f"{FLASH}/o_proj.py::o_proj", "@pl.jit.inline",
            _args(("attended", "in", "BF16", "[T_DYN, LOCAL_H*HEAD_DIM]"),
                  ("wo_a", "in", "BF16", "[LOCAL_O_GROUPS, O_LORA, O_GROUP_IN]"),
                  ("wo_b", "in", "FP8E4M3FN", "[LOCAL_O_WIDTH, D]"),
                  ("wo_b_scale", "in", "FP8E8M0 (MX_B_NN)", "[LOCAL_O_WIDTH//32, D]"),
                  ("rope_cos", "in", "FP32", "[T_DYN, ROPE_DIM//2]"), ("rope_sin", "in", "FP32", "[T_DYN, ROPE_DIM//2]"),
                  ("output", "out", "FP32", "[T_DYN, D]"), ("num_tokens", "scalar", "INT32", "")),
            note="the device takes Wo-B as MXFP8 + MX_B_NN scales; this operator takes it decoded"),
    Binding("tp_all_reduce", "not bound", f"{FLASH}/attention_tp.py::decode_tp_output_all_reduce",
            "@pl.jit.inline (distributed)",
            _args(("partial", "in", "FP32", "[T_DYN, D]"), ("output_window", "inout", "FP32 window",
                  "[DECODE_MAX_TOKENS, D]"), ("output_arrived", "inout", "INT32 window", "[TP_SIZE, 1]"),
                  ("output", "out", "BF16", "[OUTPUT_T_DYN, D]"), ("group_base", "scalar", "INT32", ""),
                  ("tp_rank", "scalar", "INT32", ""), ("num_tokens", "scalar", "INT32", ""),
                  ("attention_epoch", "scalar", "INT32", "")),
            note="needs a multi-device program (distributed windows, one program per rank)"),
    Binding("tp_reduce_scatter", "not bound", f"{FLASH}/attention_tp.py::decode_tp_output_reduce_scatter",
            "@pl.jit.inline (distributed)", note="as tp_all_reduce; the output is the owner slab"),
    Binding("index_scores", "not exposed", f"{FLASH}/prefill_c1a_indexer.py::make_paged_indexer() (and the decode "
            "C1A / C2A FULL and REINDEX leaves' indexer tiles)", "@pl.jit.inline(auto_scope=False), built by a factory",
            _PAGED_INDEXER,
            note="upstream fuses the index query projection, scoring and Top-K into one inline indexer that "
                 "starts from x and the query latent and hands back only topk_indices; no entry returns the "
                 "scores this operator returns (arguments of the fused indexer below)"),
    Binding("select_topk", "not exposed", f"{FLASH}/prefill_c1a_indexer.py::make_paged_indexer() (fused with the "
            "scores)", "@pl.jit.inline(auto_scope=False), built by a factory",
            note="Top-K is the tail of the fused indexer (see index_scores); it never takes scores as input"),
    Binding("candidate_blocks", "bound", f"{FLASH}/hierarchical_sparse_indexer.py::hierarchical_sparse_indexer",
            "@pl.jit.inline",
            _args(("scores", "in", "FP32", "[T_DYN, CMP_POSITIONS_DYN]"), ("compressed_lens", "in", "INT32", "[T_DYN]"),
                  ("candidate_mask", "out", "UINT8", "[T_DYN, CMP_POSITIONS_DYN]")),
            program="candidate_blocks",
            note="block size and top-k block count are compiled in (config FLASH.candidate_block_size / "
                 "candidate_topk_blocks): a call asking for others is unsupported on the device and its "
                 "contract is skipped with that reason; a mask narrower or wider than the scores is cropped / "
                 "padded with -inf scores on the host"),
    Binding("hc_mixes", "not bound", f"{FLASH}/hc_mixes.py::mhc_mixes", "@pl.jit.inline",
            _args(("x_hc", "in", "FP32", "[T_DYN, HC_MULT, D]"), ("function", "in", "FP32", "[MIX_HC, HC_DIM]"),
                  ("scale", "in", "FP32", "[3]"), ("base", "in", "FP32", "[MIX_HC]"),
                  ("pre_mix", "out", "FP32", "[T_DYN, HC_MULT]"), ("post_mix", "out", "FP32", "[T_DYN, HC_MULT]"),
                  ("residual_mix", "out", "FP32", "[T_DYN, HC_MULT, HC_MULT]")),
            note="compiled at the Flash geometry (D, HC_DIM constants) while the mHC trees are tiny; A5 only "
                 "upstream (not run on a5sim). The standalone entry has no num_tokens: the zero tail of the "
                 "next pre-mix (HC-11) is written by the layer entries"),
    Binding("hc_pre", "not bound", f"{FLASH}/mhc.py::mhc_pre", "@pl.jit.inline",
            _args(("x_hc", "in", "FP32", "[T_DYN, HC_MULT, D]"), ("pre_mix", "in", "FP32", "[T_DYN, HC_MULT]"),
                  ("output", "out", "BF16", "[T_DYN, D]")),
            note="compiled at the Flash geometry while the mHC trees are tiny"),
    Binding("hc_post", "not bound", f"{FLASH}/mhc.py::mhc_post", "@pl.jit.inline",
            _args(("sublayer", "in", "BF16", "[T_DYN, D]"), ("residual", "in", "FP32", "[T_DYN, HC_MULT, D]"),
                  ("post_mix", "in", "FP32", "[T_DYN, HC_MULT]"),
                  ("residual_mix", "in", "FP32", "[T_DYN, HC_MULT, HC_MULT]"),
                  ("output", "out", "FP32", "[T_DYN, HC_MULT, D]")),
            note="compiled at the Flash geometry while the mHC trees are tiny"),
    Binding("hc_head", "not bound", f"{FLASH}/mhc.py::mhc_head (and hc_head.py)", "@pl.jit.inline",
            _args(("x_hc", "in", "FP32", "[T_DYN, HC_MULT, D]"), ("pre_mix", "in", "FP32", "[T_DYN, HC_MULT]"),
                  ("output", "out", "BF16", "[T_DYN, D]")),
            note="compiled at the Flash geometry while the mHC trees are tiny"),
    Binding("moe_gate", "not bound", f"{FLASH}/gate.py::gate (gate_normalized after the FFN RMSNorm)",
            "@pl.jit.inline",
            _args(("x_mixed", "in", "BF16", "[T, D]"), ("norm_w", "in", "BF16", "[D]"),
                  ("gate_w", "in", "FP32", "[N_EXPERTS, D]"), ("gate_bias", "in", "FP32", "[N_EXPERTS]"),
                  ("num_tokens", "scalar", "INT32", ""),
                  ("x_norm_mx", "out", "FP8E4M3FN", "[T_PAD, D]"),
                  ("x_norm_scale", "out", "FP8E8M0 (MX_A_ZZ)", "[1, T_PAD*(D//32)]"),
                  ("indices", "out", "INT32", "[T, TOPK]"), ("weights", "out", "FP32", "[T, TOPK]")),
            note="the entry includes the FFN RMSNorm and emits the MXFP8 activation (CQ-25); rows >= num_tokens "
                 "get id 0 and weight 0; compiled at the Flash geometry (T = MOE_TOKENS) while the MoE trees are "
                 "tiny"),
    Binding("moe_expert", "not bound", f"{FLASH}/expert_routed.py::expert_routed_scatter",
            "@pl.jit.inline (distributed)",
            _args(("recv_x", "in", "FP8E4M3FN", "[N_LOCAL_EXPERTS, RECV_MAX, D]"),
                  ("recv_mx_scale", "in", "FP8E8M0 (MX_A_ZZ)", "[1, N_LOCAL_EXPERTS*RECV_MAX*(D//32)]"),
                  ("recv_weights", "in", "FP32", "[N_LOCAL_EXPERTS, RECV_MAX]"),
                  ("recv_expert_count", "in", "INT32", "[N_LOCAL_EXPERTS, 1]"),
                  ("routed_w1_packed", "in", "UINT8 (MXFP4 pairs)", "[N_LOCAL_EXPERTS, MX_W1_PACKED_ROWS, 128]"),
                  ("routed_w1_scale", "in", "FP8E8M0 (MX_B_NN)", "[N_LOCAL_EXPERTS*(D//32), MOE_INTER]"),
                  ("routed_w3_packed", "in", "UINT8 (MXFP4 pairs)", "[N_LOCAL_EXPERTS, MX_W3_PACKED_ROWS, 128]"),
                  ("routed_w3_scale", "in", "FP8E8M0 (MX_B_NN)", "[N_LOCAL_EXPERTS*(D//32), MOE_INTER]"),
                  ("routed_w2_packed", "in", "UINT8 (MXFP4 pairs)", "[N_LOCAL_EXPERTS, MX_W2_PACKED_ROWS, 128]"),
                  ("routed_w2_scale", "in", "FP8E8M0 (MX_B_NN)", "[N_LOCAL_EXPERTS*(MOE_INTER//32), D]"),
                  ("mxfp4_pair_lut", "in", "INT16", "[2, 256]"),
                  ("recv_route", "in", "INT32", "[N_LOCAL_EXPERTS, RECV_MAX]"),
                  ("recv_meta", "in", "INT32", "[EP_WORLD_SIZE, N_LOCAL_EXPERTS]"),
                  ("routed_output", "inout", "BF16 (distributed window)", "[ROUTE_T_DYN, D]"),
                  ("input_ready", "scalar", "TASK_ID", "")),
            note="routed experts only (the shared expert is expert_shared.py); the MXFP4 entry scatters each "
                 "row's result straight to its source rank; moe.py's tracked golden still runs the INT8 stand-in "
                 "(routed_w* INT8 [N_LOCAL, MOE_INTER, D] with FP32 row scales), which moe_expert's int8 weights "
                 "model"),
    Binding("moe_ep", "not bound", f"{FLASH}/moe.py::moe_test (dispatch, expert_routed, combine, hc_post)",
            "@pl.jit (one per EP rank; l3_moe stacks [N_RANKS, ...])",
            _args(("x_hc", "in", "FP32", "[T, HC_MULT, D]"), ("hc_ffn_fn", "in", "FP32", "[MIX_HC, HC_DIM]"),
                  ("hc_ffn_scale", "in", "FP32", "[3]"), ("hc_ffn_base", "in", "FP32", "[MIX_HC]"),
                  ("norm_w", "in", "BF16", "[D]"), ("gate_w", "in", "FP32", "[N_EXPERTS_GLOBAL, D]"),
                  ("gate_bias", "in", "FP32", "[N_EXPERTS_GLOBAL]"), ("tid2eid", "in", "INT32", "[VOCAB, TOPK]"),
                  ("input_ids", "in", "INT64", "[T]"),
                  ("routed_w1", "in", "INT8", "[N_LOCAL, MOE_INTER, D]"),
                  ("routed_w1_scale", "in", "FP32", "[N_LOCAL, MOE_INTER]"),
                  ("routed_w3", "in", "INT8", "[N_LOCAL, MOE_INTER, D]"),
                  ("routed_w3_scale", "in", "FP32", "[N_LOCAL, MOE_INTER]"),
                  ("routed_w2", "in", "INT8", "[N_LOCAL, D, MOE_INTER]"),
                  ("routed_w2_scale", "in", "FP32", "[N_LOCAL, D]"),
                  ("shared_w1", "in", "INT8", "[MOE_INTER, D]"), ("shared_w1_scale", "in", "FP32", "[MOE_INTER]"),
                  ("shared_w3", "in", "INT8", "[MOE_INTER, D]"), ("shared_w3_scale", "in", "FP32", "[MOE_INTER]"),
                  ("shared_w2", "in", "INT8", "[D, MOE_INTER]"), ("shared_w2_scale", "in", "FP32", "[D]"),
                  ("x_next", "out", "FP32", "[T, HC_MULT, D]"),
                  ("recv_meta", "inout", "INT32 (distributed window)", "[N_RANKS, N_LOCAL]"),
                  ("recv_x", "inout", "INT8 (distributed window)", "[N_LOCAL*RECV_MAX, D]"),
                  ("recv_aux", "inout", "FP32 (distributed window)", "[N_LOCAL*RECV_MAX, AUX_PAD]"),
                  ("recv_route", "inout", "INT32 (distributed window)", "[N_LOCAL*RECV_MAX, IDX_PAD]"),
                  ("arrived", "inout", "INT32 (distributed window)", "[N_RANKS, 1]"), ("data_arrived", "inout", "INT32 (distributed window)", "[N_RANKS, 1]"),
                  ("routed_y_buf", "inout", "BF16 (distributed window)", "[N_ROUTES, D]"),
                  ("combine_arrived", "inout", "INT32 (distributed window)", "[N_RANKS, 1]"),
                  ("layer_id", "scalar", "INT32", ""), ("num_tokens", "scalar", "INT32", ""),
                  ("my_rank", "scalar", "INT32", ""), ("moe_epoch", "scalar", "INT32", "")),
            note="the whole FFN sublayer per rank (hc_mixes, gate, dispatch, routed + shared experts, combine, "
                 "hc_post) with its distributed windows; moe_ep judges the dispatch / combine part, so a binding "
                 "would read x_next and recompute the mix; moe_epoch is 1-based, incremented per reused window"),
    Binding("embed_pack", "not bound", f"{FLASH}/input_pack.py::pack_x_hc", "@pl.jit.inline",
            _args(("input_ids", "in", "INT64", "[TOKEN_DYN]"), ("embed_weight", "in", "BF16", "[VOCAB_DYN, D]"),
                  ("x_hc", "out", "FP32", "[TOKEN_DYN, HC_MULT, D]")),
            note="x_hc is FP32 upstream (the BF16 rows widened exactly); compiled at the Flash geometry"),
    Binding("lm_head", "not bound", f"{FLASH}/lm_head.py::lm_head", "@pl.jit.inline (vocab shards per TP rank)",
            _args(("hidden_states", "in", "BF16", "[T_DYN, D]"),
                  ("lm_head_weight", "in", "BF16", "[VOCAB_PER_TP, D]"),
                  ("logit_row_indices", "in", "INT32", "[MAX_LOGIT_ROWS]"),
                  ("logits", "out", "FP32", "[MAX_LOGIT_ROWS, VOCAB]"),
                  ("hidden_window", "inout", "BF16 (distributed window)", "[GROUP_LOGIT_ROWS, D]"),
                  ("hidden_done", "inout", "INT32 (distributed window)", "[TP_SIZE, 1]"),
                  ("logits_window", "inout", "FP32 (distributed window)", "[MAX_LOGIT_ROWS, VOCAB]"),
                  ("logits_done", "inout", "INT32 (distributed window)", "[TP_SIZE, 1]"),
                  ("group_base", "scalar", "INT32", ""), ("tp_rank", "scalar", "INT32", ""),
                  ("done_epoch", "scalar", "INT32", "")),
            note="each card projects its vocab shard for the whole TP group and the combine returns every owner "
                 "its own rows over the full vocabulary (this operator returns the shards; their concatenation is "
                 "upstream's logits); a logit row index -1 gives a zero hidden row; MAX_LOGIT_ROWS 16"),
    Binding("engram", "not bound", f"{FLASH}/engram.py::engram (engram_test)", "@pl.jit.inline",
            _args(("hash_ids", "in", "INT32", "[T_DYN, N_HASH_COLS]"),
                  ("engram_table", "in", "BF16", "[NUM_EMBEDDINGS, HEAD_DIM]"),
                  ("wkv_weight", "in", "BF16", "[ENGRAM_K, KV_OUT]"), ("weight", "in", "FP32", "[HC_MULT, D]"),
                  ("x", "in", "BF16", "[T_DYN, HC_MULT, D]"), ("out", "out", "BF16", "[T_DYN, HC_MULT, D]")),
            note="the table is a BF16 stand-in for the released FP8 rows (N_HASH_COLS 24, HEAD_DIM 256, KV_OUT "
                 "5·5120); the device clamps hash ids into the table where the reference refuses them; compiled at "
                 "the Flash geometry while the Engram tree is tiny"),
    Binding("engram_tp", "not bound", f"{FLASH}/engram.py::engram_tp", "@pl.jit.inline (distributed)",
            _args(("hash_ids", "in", "INT32", "[T_DYN, N_HASH_COLS]"),
                  ("engram_table", "in", "BF16", "[ROWS_PER_RANK, HEAD_DIM]"),
                  ("wkv_weight", "in", "BF16", "[ENGRAM_K, KV_OUT]"), ("weight", "in", "FP32", "[HC_MULT, D]"),
                  ("x", "in", "BF16", "[T_DYN, HC_MULT, D]"), ("out", "out", "BF16", "[T_DYN, HC_MULT, D]"),
                  ("lookup_window", "inout", "BF16 (distributed window)", "[TP_MAX_TOKENS, ENGRAM_K]"),
                  ("signal", "inout", "INT32 (distributed window)", "[TP_SIZE, 1]"),
                  ("my_rank", "scalar", "INT32", "")),
            note="--tp sets TP_SIZE at import (1, 2, 4, 8) and the device count must equal it; TP_MAX_TOKENS 256"),
    Binding("final_norm", "not bound", f"{FLASH}/rmsnorm.py::rms_norm (boundary_fwd.py)", "@pl.jit.inline",
            _args(("hidden", "in", "BF16", "[T_DYN, D]"), ("final_norm_w", "in", "BF16", "[D]"),
                  ("x_normed", "out", "BF16", "[T_DYN, D]")),
            note="compiled at the Flash geometry while the boundary tree is tiny"),
    Binding("greedy_pick", "not bound", f"{FLASH}/lm_head.py::greedy_sample", "@pl.jit.inline",
            _args(("logits", "in", "FP32", "[MAX_LOGIT_ROWS, VOCAB]"),
                  ("sampled_ids", "out", "INT32", "[MAX_LOGIT_ROWS, SAMPLED_IDS_PAD]")),
            note="the id sits in column 0 of a row padded to SAMPLED_IDS_PAD (8); 256-wide chunk maxima merged "
                 "with the first-maximum rule"),
    Binding("decoder_replay", "host", f"{FLASH}/metadata.py::select_decoder_replay (prefill_decoder.py)",
            "host Python"),
    Binding("v4_decode_metadata", "host", f"{PRO}/decode_metadata.py (position_ids_from_starts, "
            "kv_seq_lens_from_starts, ori/paged/compressed/state slot mappings, swa and history windows)",
            "host Python"),
    Binding("hca_topk", "not exposed", f"{PRO}/decode_attention_hca.py::attention_hca (the hca_cache_topk block)",
            "@pl.jit.inline", note="computed inside the HCA attention entry and handed straight to "
            "sparse_attn_hca; no entry returns it"),
    Binding("v4_publish_events", "not exposed", f"{PRO}/decode_compressor_ratio128.py::compressor_ratio128 (the "
            "rmsnorm_rope_cache_write block of the event-list ABI; ratio 4 alike)", "@pl.jit.inline",
            note="the compressor entries pool and publish in one; no entry publishes a given row, so the operator is "
                 "reached through the entry's cmp_kv_cache output"),
    Binding("v4_prefill_swa_indices", "not exposed", f"{PRO}/prefill_attention_swa.py::prefill_attention_swa (the "
            "prefill_swa_window_indices block)", "@pl.jit.inline",
            note="computed inside the prefill SWA stage and handed straight to prefill_sparse_attn; no entry "
                 "returns it"),
    Binding("v4_attention_stage", "composition", f"{PRO}/decode_attention_swa.py::attention_swa (and "
            "decode_attention_hca.py / decode_attention_csa.py around their compressors)", "composition",
            note="composed from hc_mixes, hc_pre, final_norm, v4_qkv_proj_rope, v4_attention and hc_post on this "
                 "backend"),
    Binding("v4_sparse_attention", "not exposed", f"{PRO}/decode_sparse_attn*.py (the qk_pv and merge_norm "
            "stages inside sparse_attn)", "@pl.jit.inline",
            note="the attention and the output projection are one fused entry; no entry returns the FP32 "
                 "attention before the projection"),
    Binding("v4_output_projection", "not exposed", f"{PRO}/decode_sparse_attn*.py (the proj_a_mm, quant, "
            "proj_b_mm and proj_b_act stages inside sparse_attn)", "@pl.jit.inline",
            note="fused into the sparse attention entry (see v4_attention)"),
    Binding("dp_attention", "composition", f"{PRO}/decode_fwd.py (one rank-generic kernel per EP rank; "
            "attention has no TP)", "composition",
            note="composed from attention_half_layer at TP 1 on this backend"),
    Binding("v4_publish_compressed", "not exposed", f"{PRO}/decode_compressor_ratio128.py::compressor_ratio128 "
            "(and compressor_ratio4)", "@pl.jit.inline",
            note="the compressor entries rotate and write the compressed row into the cmp pool themselves; no "
                 "entry publishes a given row"),
    Binding("v4_publish_index_keys", "not exposed", f"{PRO}/decode_indexer_compressor.py::indexer_compressor "
            "(the @pl.jit entry compressor_test returns kv, compress_state, idx_kv_cache, idx_kv_scale)",
            "@pl.jit.inline",
            note="the entry pools, normalises, rotates, applies the Hadamard and writes the INT8 key in one; no "
                 "entry writes a given key row (the pooling is v4_compressor's, the write is this operator)"),
    Binding("v4_index_cache_quant", "not exposed", f"{PRO}/indexer_cache_quant.py::reference_indexer_cache_quant "
            "(the CANN indexer_quant_cache the indexer compressor calls)", "host reference of a CANN operator",
            note="the device side is CANN's indexer_quant_cache(quant_mode='fp8', round_scale=True) inside the "
                 "indexer compressor; no pypto entry returns it"),
    Binding("v4_compressor_txn", "not bound", f"{PRO}/decode_compressor_ratio4.py::compressor_ratio4 (the "
            "persistent-state form; the @pl.jit entry compressor_test wraps it)", "@pl.jit.inline",
            _args(("x", "in", "BF16", "[T_DYN, D]"), ("kv", "out", "FP32", "[T_DYN, HEAD_DIM]"),
                  ("compress_state", "inout", "FP32", "[STATE_BLOCK_NUM_DYN, CSA_STATE_BLOCK_SIZE, 2 * OUT_DIM]"),
                  ("state_page_ids", "in", "INT32", "[B_DYN, CSA_STATE_PAGES_PER_REQUEST]"),
                  ("state_valid_ranges", "in", "INT32", "[B_DYN, 2]"),
                  ("state_page_epochs", "in", "INT32", "[B_DYN, CSA_STATE_PAGES_PER_REQUEST]"),
                  ("request_epochs", "in", "INT32", "[B_DYN]"),
                  ("wkv", "in", "BF16", "[OUT_DIM, D]"), ("wgate", "in", "BF16", "[OUT_DIM, D]"),
                  ("ape", "in", "FP32", "[COMPRESS_RATIO, OUT_DIM]"), ("norm_w", "in", "BF16", "[HEAD_DIM]"),
                  ("request_event_indices", "in", "INT32", "[B_DYN]"), ("event_query_ids", "in", "INT32", "[EVENT_DYN]"),
                  ("cos", "in", "FP32", "[EVENT_DYN, ROPE_HEAD_DIM]"), ("sin", "in", "FP32", "[EVENT_DYN, ROPE_HEAD_DIM]"),
                  ("cmp_kv_cache", "inout", "BF16", "[CMP_BLOCK_NUM_DYN, BLOCK_SIZE, 1, HEAD_DIM]"),
                  ("event_write_slots", "in", "INT64", "[EVENT_DYN]"), ("position_ids", "in", "INT32", "[T_DYN]"),
                  ("state_slot_mapping", "in", "INT64", "[T_DYN]")),
            note="the entry also publishes each event's row (rotated, BF16) into cmp_kv_cache -- this operator "
                 "returns the FP32 rows for v4_publish_compressed; upstream names closing rows by event lists "
                 "(one per request a step), the operator by (pos + 1) % ratio"),
    Binding("v4_moe", "composition", f"{PRO}/moe.py::moe (gate, dispatch, expert_routed, expert_shared, combine, "
            "hc_post)", "composition",
            note="composed from v4_gate and v4_expert on this backend, every expert local (no EP transport, no "
                 "hc_pre / hc_post)"),
    Binding("v4_moe_stage", "composition", f"{PRO}/moe.py::moe (hc_pre, gate, dispatch, experts, combine, "
            "hc_post)", "composition",
            note="composed from hc_mixes, hc_pre, v4_moe and hc_post on this backend; the EP transport is folded "
                 "(every expert local)"),
    Binding("v4_head_mix", "not exposed", f"{PRO}/hc_head.py::hc_head (its mixes stage)", "@pl.jit.inline",
            note="hc_head computes its head mix and collapses in one; no entry returns the mix (the operator is the "
                 "mix, hc_head the collapse)"),
    Binding("v4_mtp_layer", "not bound", f"{PRO}/decode_mtp.py::mtp_decode_layer", "@pl.jit",
            note="composed here from mtp_projection, v4_attention_stage (SWA), v4_moe_stage, v4_head_mix, hc_head "
                 "and final_norm on this backend; upstream's entry also owns the EP windows and signal epochs of "
                 "its MoE, which the composition folds"),
    Binding("v4_prefill_mtp_layer", "not bound", f"{PRO}/prefill_mtp.py::mtp_prefill_fwd", "@pl.jit",
            note="composed here from v4_prefill_swa_indices, mtp_projection, v4_attention_stage (SWA, prefill "
                 "form), v4_moe_stage, v4_head_mix, hc_head and final_norm on this backend; upstream's entry also "
                 "owns the EP windows and signal epochs of its MoE, which the composition folds"),
    Binding("v4_prefill_index_keys", "not bound", f"{PRO}/prefill_indexer_compressor.py::prefill_indexer_compressor",
            "@pl.jit.inline",
            _args(("x", "in", "BF16", "[T, D]"),
                  ("inner_compress_state", "inout", "FP32", "[INNER_STATE_BLOCK_NUM_DYN, INNER_STATE_BLOCK_SIZE, "
                   "2 * INNER_OUT_DIM]"),
                  ("inner_compress_state_block_table", "in", "INT32", "[INNER_STATE_MAX_BLOCKS]"),
                  ("inner_wkv", "in", "BF16", "[INNER_OUT_DIM, D]"), ("inner_wgate", "in", "BF16", "[INNER_OUT_DIM, D]"),
                  ("inner_ape", "in", "FP32", "[COMPRESS_RATIO, INNER_OUT_DIM]"),
                  ("inner_norm_w", "in", "BF16", "[INNER_HEAD_DIM]"),
                  ("freqs_cos", "in", "BF16", "[MAX_SEQ_LEN, ROPE_HEAD_DIM]"),
                  ("freqs_sin", "in", "BF16", "[MAX_SEQ_LEN, ROPE_HEAD_DIM]"),
                  ("hadamard", "in", "BF16", "[IDX_HEAD_DIM, IDX_HEAD_DIM]"),
                  ("idx_kv_cache", "inout", "INT8", "[IDX_BLOCK_NUM_DYN, BLOCK_SIZE, 1, IDX_HEAD_DIM]"),
                  ("idx_kv_scale", "inout", "FP32", "[IDX_BLOCK_NUM_DYN, BLOCK_SIZE, 1, 1]"),
                  ("idx_block_table", "in", "INT32", "[IDX_CACHE_MAX_BLOCKS]"), ("position_ids", "in", "INT32", "[T]"),
                  ("num_tokens", "scalar", "INT32", ""), ("idx_slot_mapping", "in", "INT64", "[T]"),
                  ("inner_state_slot_mapping", "in", "INT64", "[T]")),
            note="composed here from v4_compressor and v4_publish_index_keys; the entry also takes a completion task "
                 "array and reads the index block table for its own write map"),
    Binding("v4_moe_ep", "composition", f"{PRO}/moe.py::dispatch, ::combine (with expert_routed / expert_shared "
            "per rank)", "composition",
            note="a host model of the transport (lanes, counts, the route-keyed combine) over this backend's "
                 "v4_expert; upstream moves the rows through distributed windows with per-epoch signals"),
    Binding("v4_prefill_compressor", "not bound", f"{PRO}/prefill_compressor_ratio4.py::prefill_compressor_ratio4, "
            "prefill_compressor_ratio128.py::prefill_compressor_ratio128", "@pl.jit.inline",
            _args(("x", "in", "BF16", "[T, D]"),
                  ("compress_state", "inout", "FP32", "[STATE_BLOCK_NUM_DYN, STATE_BLOCK_SIZE (4 / 8), 2 * OUT_DIM]"),
                  ("compress_state_block_table", "in", "INT32", "[STATE_MAX_BLOCKS]"),
                  ("wkv", "in", "BF16", "[OUT_DIM, D]"), ("wgate", "in", "BF16", "[OUT_DIM, D]"),
                  ("ape", "in", "FP32", "[COMPRESS_RATIO, OUT_DIM]"), ("norm_w", "in", "BF16", "[HEAD_DIM]"),
                  ("freqs_cos", "in", "BF16", "[MAX_SEQ_LEN, ROPE_HEAD_DIM]"),
                  ("freqs_sin", "in", "BF16", "[MAX_SEQ_LEN, ROPE_HEAD_DIM]"),
                  ("cmp_kv", "inout", "BF16", "[CMP_BLOCK_NUM_DYN, BLOCK_SIZE, 1, HEAD_DIM]"),
                  ("position_ids", "in", "INT32", "[T]"), ("num_tokens", "scalar", "INT32", ""),
                  ("cmp_slot_mapping", "in", "INT64", "[T]"), ("state_slot_mapping", "in", "INT64", "[T]")),
            note="the weights are stored transposed ([OUT_DIM, D]; the operator takes [D, OUT_DIM] as "
                 "v4_compressor does) and the RoPE tables are the full compressed-profile rows (the operator takes "
                 "their first ROPE_HEAD_DIM // 2 columns); the ratio-4 entry also takes a completion task array"),
    Binding("csa_compressors", "composition", f"{PRO}/decode_attention_csa.py (compressor_ratio4 and "
            "decode_indexer_compressor)", "composition",
            note="composed from v4_compressor on this backend"),
    Binding("encoder_replay", "host", f"{FLASH}/prefill_encoder.py::select_encoder_replay", "host Python"),
    Binding("decode_block_sharded", "composition", f"{FLASH}/decode_sp_integration.py (the owner-slab hand-off "
            "of two layers)", "composition",
            note="composed from hc_mixes, hc_pre, hc_post, attention_half_layer (sharded wiring) and the MoE "
                 "operators of this backend"),
    Binding("causal_encoder", "composition", f"{FLASH}/decode_causal_encoder.py (the golden chain of layers "
            "0..19)", "composition",
            note="composed from decode_block on this backend's operators; REUSE layers take their source's "
                 "published compressed cache and Top-K"),
    Binding("decode_block", "composition", f"{FLASH}/decode_layer.py (golden_decode_layer; the device entry "
            "chains the mHC, attention and MoE entries)", "composition",
            note="composed from the operators this backend binds (hc_mixes, hc_pre, hc_post, moe_gate, "
                 "moe_expert, attention_half_layer)"),
    Binding("build_forward_metadata", "host", f"{FLASH}/metadata.py (ForwardMetadata)", "host Python",
            note="host-side lowering; the contracts judge the reference's"),
    Binding("resolve_schedule", "host", f"{FLASH}/config.py", "host Python"),
    Binding("sp_bounds", "host", f"{FLASH}/decode_sp_integration.py::sequence_parallel_bounds", "host Python"),
    Binding("sp_shard", "host", f"{FLASH}/decode_sp_integration.py (shard_decode_batch)", "host Python"),
    Binding("sp_gather", "host", f"{FLASH}/decode_sp_integration.py (gather)", "host Python"),
    Binding("half_layer_call", "host", f"{FLASH}/decode_common.py (validate_args)", "host Python"),
)}


# V4-Pro kernel entries (upstream main): module of models/deepseek_v4_pro -> (the @pl.jit entry upstream's own
# __main__ hands to golden.run_jit, the number of devices it runs on). The adapters of backends.upstream.adapters
# lay each call out as that module's tensors dict; the entry's declaration says order, directions and which dims
# are compiled in.
# Dynamic dims an entry only takes in whole tiles, by the module constant that sizes the tile (the kernel spreads
# dim // tile blocks: a remainder is silently dropped, and fewer rows than one tile launch no block at all, which
# the runtime aborts on). Checked in the worker before any launch; an off-tile call is refused as unsupported.
DYN_TILES: dict[str, dict[str, str]] = {
    "hc_post": {"T_DYN": "T_TILE"},  # hc_post_test: pl.spmd((t_dim // T_TILE) * HC_MULT)
    "rmsnorm": {"T_DYN": "T_TILE"},  # rms_norm_test: row tiles of T_TILE
}

PRO_ENTRIES: dict[str, tuple[str, int]] = {
    "gate": ("gate_test", 1),
    "mtp_projection": ("mtp_projection_test", 1),
    "hc_post": ("hc_post_test", 1),
    "expert_routed": ("expert_routed_test", 1),
    "expert_shared": ("expert_shared_test", 1),
    "qkv_proj_rope": ("qkv_proj_rope_test", 1),
    "decode_compressor_ratio4": ("compressor_test", 1),
    "decode_compressor_ratio128": ("compressor_test", 1),
    "lm_head": ("l3_lm_head", 2),
    "decode_sparse_attn": ("sparse_attn_test", 1),
    "decode_sparse_attn_hca": ("sparse_attn_test", 1),
    "decode_sparse_attn_swa": ("sparse_attn_test", 1),
    "decode_indexer": ("indexer_test", 1),
    "rmsnorm": ("rms_norm_test", 1),
    "prefill_indexer": ("prefill_indexer_test", 1),
}


def _pro_bound() -> dict[str, Binding]:
    """The bound rows: one per operator an adapter lays out for a V4-Pro entry of ``PRO_ENTRIES`` (its arguments,
    directions and compiled dims are read from the entry's declaration at run time, so no row lists them). Where
    the table has a V4.1 row for the same operator (``hc_post``, ``lm_head``, ``final_norm``: a V4.1 entry not
    bound), the bound row names it in its note."""
    from backends.upstream.adapters import ADAPTERS

    out = {}
    for name, a in ADAPTERS.items():
        if a.folder != "deepseek_v4_pro" or a.module not in PRO_ENTRIES:
            continue
        entry, ranks = PRO_ENTRIES[a.module]
        also = [f"{m}.py::{PRO_ENTRIES[m][0]}" for m in a.also if m in PRO_ENTRIES]
        v41 = BINDINGS.get(name)
        out[name] = Binding(name, "bound", f"{PRO}/{a.module}.py::{entry}" + (f" (also {', '.join(also)})" if also
                                                                              else ""),
                            "@pl.jit" + (f" on {ranks} devices (distributed_config)" if ranks > 1 else ""),
                            note="laid out by backends.upstream.adapters; arguments, directions and compiled dims read "
                                 "from the entry's declaration at run time (a call off the compiled geometry is "
                                 "unsupported, naming the dim)" + (f"; V4.1's {v41.upstream} is not bound" if v41
                                                                   else ""))
    return out


def _unsurveyed() -> dict[str, Binding]:
    """A row for every declared operator the survey of upstream's entries has not reached yet: a new operator
    needs no row here until someone names upstream's entry for it (its default is honest: not bound)."""
    from contracts.operators import KERNEL_OPERATORS

    unknown = sorted(set(BINDINGS) - set(KERNEL_OPERATORS))
    if unknown:
        raise ValueError(f"backends.pypto.table: rows for operators nobody declares: {unknown}")
    return {name: Binding(name, "not surveyed", "(none named yet)",
                          note="declared after the last survey of upstream's entries; no entry is named for it yet")
            for name in KERNEL_OPERATORS if name not in BINDINGS}


BINDINGS.update(_pro_bound())
BINDINGS.update(_unsurveyed())


def bound() -> list[Binding]:
    return [b for b in BINDINGS.values() if b.status == "bound"]
