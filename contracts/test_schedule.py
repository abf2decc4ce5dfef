"""Layer schedule, presets and deployment mapping. Spec: §1, §8."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kernels.config import (
    FLASH,
    FLASH_TINY,
    PRESETS,
    SUPPORTED_EP,
    SUPPORTED_TP,
    V4_FLASH,
    V4_PRO,
    ConfigError,
    Deployment,
    LayerKind,
    V41Config,
)
from pto_pytest.defect import shared
from pto_pytest.plugin import op

EXPECTED_COUNTS = {LayerKind.SWA: 2, LayerKind.C2A_FULL: 3, LayerKind.C2A_REUSE: 15, LayerKind.C1A_FULL: 1,
                   LayerKind.C1A_REINDEX: 4, LayerKind.C1A_REUSE: 15}
REPRESENTATIVE = {0: LayerKind.SWA, 2: LayerKind.C2A_FULL, 3: LayerKind.C2A_REUSE, 20: LayerKind.C1A_FULL,
                  24: LayerKind.C1A_REINDEX, 21: LayerKind.C1A_REUSE}


@pytest.mark.parametrize("config", [FLASH, FLASH_TINY], ids=lambda c: c.name)
@pytest.mark.operators("resolve_schedule")
def test_schedule_mode_counts(backend, config):
    """40 layers resolve to SWA 2, C2A_FULL 3, C2A_REUSE 15, C1A_FULL 1, C1A_REINDEX 4, C1A_REUSE 15. Spec: §1."""
    schedule = op(backend, "resolve_schedule")(config)
    assert len(schedule) == 40
    counts = {kind: sum(1 for layer in schedule if layer.kind == kind) for kind in LayerKind}
    assert counts == EXPECTED_COUNTS, f"kind counts {counts} != {EXPECTED_COUNTS} (§1)"


@pytest.mark.operators("resolve_schedule")
def test_schedule_representative_layers(backend):
    """Layers 0, 2, 3, 20, 24, 21 resolve to their own kind. Spec: §1."""
    schedule = op(backend, "resolve_schedule")(FLASH)
    for layer, kind in REPRESENTATIVE.items():
        assert schedule[layer].kind == kind, f"layer {layer}: kind {schedule[layer].kind}, expected {kind} (§1)"


@pytest.mark.operators("resolve_schedule")
def test_schedule_sources_same_ratio_at_or_before(backend):
    """Every compressed layer's KV and index source is the last same-ratio source <= the layer;
    SWA layers have none; FULL layers are their own source. Spec: §1 source rule."""
    schedule = op(backend, "resolve_schedule")(FLASH)
    for layer in schedule:
        if layer.compress_ratio == 0:
            assert layer.kv_source is None and layer.index_source is None, f"SWA layer {layer.layer_id} has sources"
            continue
        for name, sources in (("kv_source", FLASH.kv_source_layer_ids),
                              ("index_source", FLASH.index_source_layer_ids)):
            want = max(s for s in sources if s <= layer.layer_id
                       and FLASH.compress_ratios[s] == layer.compress_ratio)
            got = getattr(layer, name)
            assert got == want, f"layer {layer.layer_id}.{name} = {got}, expected {want} (§1)"
            assert FLASH.compress_ratios[got] == layer.compress_ratio


@pytest.mark.operators("resolve_schedule")
def test_schedule_source_resolution_table(backend):
    """kv(2)=2, idx(7)=2, kv(8)=8, idx(19)=14, idx(23)=20, idx(24)=24, idx(39)=36; 20 is the candidate source.
    Spec: §1 table (SC-14)."""
    s = op(backend, "resolve_schedule")(FLASH)
    got = (s[2].kv_source, s[7].index_source, s[8].kv_source, s[19].index_source, s[23].index_source,
           s[24].index_source, s[39].index_source, s[30].kv_source)
    assert got == (2, 2, 8, 14, 20, 24, 36, 20), got
    assert [layer.layer_id for layer in s if layer.is_candidate_source] == [20]


def test_flash_constants():
    """FLASH preset constants and derived dims. Spec: §1 (SC-12, SC-17, SC-18)."""
    c = FLASH
    assert c.compress_ratios == (0, 0) + (2,) * 18 + (1,) * 20
    assert (c.kv_source_layer_ids, c.index_source_layer_ids) == ((2, 8, 14, 20), (2, 8, 14, 20, 24, 28, 32, 36))
    assert (c.index_topk, c.candidate_topk_blocks, c.candidate_block_size) == (512, 2048, 8)
    assert (c.hidden_size, c.num_attention_heads, c.head_dim, c.qk_rope_head_dim, c.nope_head_dim) == (
        5120, 64, 512, 64, 448)
    assert (c.o_group_in, c.hc_dim, c.mix_hc, c.state_width, c.mx_group) == (4096, 20480, 24, 1024, 32)
    assert (c.rms_norm_eps, c.hc_eps, c.hc_sinkhorn_iters) == (1e-20, 1e-6, 20)
    assert (c.block_size, c.state_capacity, c.max_batch_per_dp, c.decode_rows_per_request,
            c.decode_max_tokens, c.prefill_max_tokens, c.moe_tokens) == (128, 4, 32, 6, 192, 4096, 16)
    assert (c.window_cache_group, c.compressed_cache_group, c.index_cache_group) == (32, 16, 32)


def test_tiny_presets_keep_structure():
    """Tiny twins keep schedule, sources, ring capacity and MX groups; only listed dims shrink."""
    for full, tiny in ((FLASH, FLASH_TINY), (V4_PRO, PRESETS["v4-pro-tiny"]), (V4_FLASH, PRESETS["v4-flash-tiny"])):
        assert tiny.compress_ratios == full.compress_ratios
        for f in dataclasses.fields(full):
            if f.name in ("name", "shrunk") or f.name in tiny.shrunk:
                continue
            assert getattr(tiny, f.name) == getattr(full, f.name), f"{tiny.name}.{f.name} changed but is not in shrunk"
    assert FLASH_TINY.kind_counts() == EXPECTED_COUNTS


def test_v4_presets():
    """V4-Pro 62 ratios: 128 at 0,1,3,5,...,59; 4 at 2,4,...,60; 0 at 61 (MTP). V4-Flash 44. Spec: §8."""
    r = V4_PRO.compress_ratios
    assert len(r) == 62
    assert [i for i, v in enumerate(r) if v == 128] == [0, 1, *range(3, 60, 2)]
    assert [i for i, v in enumerate(r) if v == 4] == list(range(2, 61, 2))
    assert [i for i, v in enumerate(r) if v == 0] == [61]
    f = V4_FLASH.compress_ratios
    assert len(f) == 44 and (f.count(4), f.count(128), f.count(0)) == (21, 20, 3) and f[:2] == (0, 0) and f[-1] == 0
    assert (V4_PRO.hidden_size, V4_PRO.num_attention_heads, V4_PRO.index_topk, V4_PRO.num_hash_layers) == (
        7168, 128, 1024, 3)
    assert V4_PRO.kernel_preset().max_position_embeddings == 16384
    assert (V4_PRO.decode_tokens, V4_PRO.moe_tokens, V4_PRO.prefill_seq) == (8, 8, 128)
    assert V4_PRO.experts_per_rank(8) == 48 and V4_PRO.vocab_shard(8, 129280) == 16160
    with pytest.raises(ConfigError, match="--ep"):
        V4_PRO.experts_per_rank(3)


@given(tp=st.sampled_from(SUPPORTED_TP), ep=st.sampled_from(SUPPORTED_EP), data=st.data())
def test_deployment_mapping(tp, ep, data):
    """tp_rank = rank % TP, group_base = rank - tp_rank, DP = EP/TP, local shards cover the whole. Spec: §1."""
    if ep % tp:
        with pytest.raises(ConfigError, match="deployment.ep"):
            Deployment(FLASH, tp=tp, ep=ep)
        return
    rank = data.draw(st.integers(0, ep - 1), label='rank')
    d = Deployment(FLASH, tp=tp, ep=ep, rank=rank)
    assert (d.tp_rank, d.group_base, d.dp, d.dp_rank) == (rank % tp, rank - rank % tp, ep // tp, rank // tp)
    assert d.local_heads * tp == FLASH.num_attention_heads
    assert d.local_o_groups * tp == FLASH.o_groups and d.local_o_width == d.local_o_groups * 1024
    assert d.n_local_experts * ep == FLASH.n_routed_experts


@pytest.mark.parametrize("kwargs, field", [
    (dict(tp=3), "deployment.tp"), (dict(tp=0), "deployment.tp"), (dict(ep=1), "deployment.ep"),
    (dict(tp=8, ep=4), "deployment.ep"), (dict(rank=8), "deployment.rank"), (dict(rank=-1), "deployment.rank"),
    (dict(tp=True, ep=2), "deployment.tp: expected a positive int"), (dict(ep=8.0), "deployment.ep"),
    (dict(tp=4, ep=8, dp=4), "deployment.dp: expected ep / tp = 2"), (dict(dp=0), "deployment.dp"),
    (dict(dp=True), "deployment.dp"),
], ids=["tp3", "tp0", "ep1", "ep<tp", "rank8", "rank-1", "tp-bool", "ep-float", "dp-mismatch", "dp0", "dp-bool"])
def test_deployment_rejects(kwargs, field):
    """Topology errors name the field: tp / ep / dp positive ints (bools refused), EP a multiple of TP, an
    explicit dp equal to ep / tp, a rank inside the cards. Spec: §1; upstream_checks CH-11."""
    with pytest.raises(ConfigError, match=field):
        Deployment(FLASH, **kwargs)
    d = Deployment(FLASH, tp=2, ep=8, dp=4)
    assert d.dp == 4 and d.world_size == d.tp * d.dp == 8


BAD_CONFIGS = [
    (dict(compress_ratios=(0, 0) + (2,) * 18 + (1,) * 19), "compress_ratios: expected 40 entries"),
    (dict(compress_ratios=(0, 0) + (2,) * 17 + (3,) + (1,) * 20), r"compress_ratios\[19\]"),
    (dict(kv_source_layer_ids=(8, 14, 20)), "layer 2 .* no KV source"),
    (dict(index_source_layer_ids=(2, 8, 14, 24)), "layer 20 .* no index source"),
    (dict(kv_source_layer_ids=(0, 2, 8, 14, 20)), "source layer 0 has compress ratio 0"),
    (dict(candidate_source_layer_id=24), "candidate_source_layer_id"),
    (dict(index_source_layer_ids=(2, 5, 8, 14, 20)), "not one of the six"),
    (dict(o_groups=7), "o_groups"),
    (dict(qk_rope_head_dim=512), "qk_rope_head_dim"),
    (dict(num_experts_per_tok=500), "n_routed_experts"),
    (dict(engram_layer_ids=(1, 40)), "engram_layer_ids"),
    (dict(hidden_size=0), "hidden_size"),
    (dict(vocab_size=0), "vocab_size"),  # SC-01: both dimensions
    (dict(head_dim=64), "qk_rope_head_dim: expected < head_dim"),  # SC-03: head_dim > qk_rope_head_dim
    (dict(index_head_dim=32), "index_head_dim: expected >= qk_rope_head_dim"),  # SC-03: index_head_dim >= rope
    (dict(kv_source_layer_ids=(2, 8, 14, 20, 45)), r"kv_source_layer_ids: expected layer ids in \[0, 40\)"),  # SC-07
    (dict(index_source_layer_ids=(2, 8, 14, 20, 45)), r"index_source_layer_ids: expected layer ids in \[0, 40\)"),
    # SC-09: a KV source that is no index source (24 above is an index source that is no KV source)
    (dict(kv_source_layer_ids=(2, 8, 14, 20, 26), candidate_source_layer_id=26), "both a KV source and an index"),
]


@pytest.mark.parametrize("changes, message", BAD_CONFIGS, ids=[m.split(":")[0][:30] for _, m in BAD_CONFIGS])
def test_config_validation_rejects(changes, message):
    """A bad ratio list, source list or dimension raises a ConfigError naming the field. Spec: §1."""
    with pytest.raises(ConfigError, match=message):
        V41Config(**changes)


@pytest.mark.parametrize("layer", [-1, 40, True, 2.0])
def test_layer_config_rejects_out_of_range(layer):
    with pytest.raises(ConfigError, match=r"layer_id must be in \[0, 39\]"):
        FLASH.layer_config(layer)


def test_the_decode_plan_table_maps_each_ratio_and_mode():
    """upstream's resolve_decode_layer_plan table: SWA mode is SWA at any ratio; FULL / REUSE at ratio 2 are
    C2A_FULL / C2A_REUSE; FULL / REINDEX / REUSE at ratio 1 are the C1A kinds; every other pair (REINDEX at
    ratio 2, anything compressed at ratio 0 or 4, a mode that is not one of the four) is refused naming the
    pair. Spec: SC-15."""
    from kernels.config import AttentionMode, ConfigError, resolve_layer_kind

    want = {(2, "full"): LayerKind.C2A_FULL, (2, "reuse"): LayerKind.C2A_REUSE, (1, "full"): LayerKind.C1A_FULL,
            (1, "reindex"): LayerKind.C1A_REINDEX, (1, "reuse"): LayerKind.C1A_REUSE}
    for ratio in (0, 1, 2, 4, 128):
        assert resolve_layer_kind(ratio, AttentionMode.SWA) == LayerKind.SWA, ratio
        for mode in ("full", "reindex", "reuse"):
            if (ratio, mode) in want:
                assert resolve_layer_kind(ratio, AttentionMode(mode)) == want[(ratio, mode)], (ratio, mode)
            else:
                with pytest.raises(ConfigError, match=rf"\(ratio={ratio}, mode={mode}\) is not one of the six"):
                    resolve_layer_kind(ratio, AttentionMode(mode))
    with pytest.raises(ConfigError, match="mode=sparse"):
        resolve_layer_kind(1, "sparse")


def test_the_configured_deployment_places_every_card(deployment):
    """The deployment chosen with --tp / --ep / --dp (default tp 4, ep 8): every card has one (DP group, TP
    rank) and every pair one card; a TP group is tp consecutive cards from its group base; the heads, output
    groups and experts split evenly; exactly ep device ids are accepted and one fewer or a repeated id is
    refused. Spec: §1; upstream_checks CH-11, CH-02, MO-13."""
    d = deployment
    cards = [Deployment(d.config, tp=d.tp, ep=d.ep, rank=r) for r in range(d.world_size)]
    assert d.world_size == d.ep == d.tp * d.dp
    assert sorted((c.dp_rank, c.tp_rank) for c in cards) == [(g, t) for g in range(d.dp) for t in range(d.tp)]
    for c in cards:
        assert c.group_base == c.dp_rank * d.tp and c.rank == c.group_base + c.tp_rank
    assert d.local_heads * d.tp == d.config.num_attention_heads and d.n_local_experts * d.ep == \
        d.config.n_routed_experts
    ids = list(range(d.world_size))
    assert d.check_devices(ids) == ids
    for bad, why in ((ids[:-1], f"exactly {d.world_size} ids"), (ids[:-1] + [0], "distinct"),
                     ([-1] + ids[1:], "non-negative"), (ids + [d.world_size], f"exactly {d.world_size} ids")):
        with pytest.raises(ConfigError, match=why):
            d.check_devices(bad)


@pytest.mark.parametrize("config, counts, hca, csa, swa", [
    (V4_PRO, {"HCA": 31, "CSA": 30, "SWA": 1}, [0, 1, *range(3, 60, 2)], list(range(2, 61, 2)), [61]),
    (V4_FLASH, {"HCA": 20, "CSA": 21, "SWA": 3}, list(range(3, 42, 2)), list(range(2, 43, 2)), [0, 1, 43]),
], ids=["v4-pro", "v4-flash"])
def test_v4_paths_hash_layers_and_the_mtp_layer(config, counts, hca, csa, swa):
    """Each V4 layer's path: HCA at ratio 128, CSA at ratio 4, SWA at ratio 0 -- Pro has no SWA layer in the
    main stack, only the MTP layer (61); Flash has SWA at 0, 1 and its MTP layer 43. The first three model layers
    route by hash; the MTP layer is the entry after the model layers; ids outside layers + MTP are refused.
    The tiny twin keeps every path. Spec: §8."""
    assert config.path_counts() == counts
    for name, ids in (("HCA", hca), ("CSA", csa), ("SWA", swa)):
        assert [i for i in range(len(config.compress_ratios)) if config.path(i) == name] == ids, name
    assert config.mtp_layer_id == config.num_hidden_layers and config.path(config.mtp_layer_id) == "SWA"
    assert [i for i in range(6) if config.hash_routed(i)] == [0, 1, 2]
    tiny = config.tiny()
    assert [tiny.path(i) for i in range(len(tiny.compress_ratios))] == \
        [config.path(i) for i in range(len(config.compress_ratios))]
    for bad in (-1, len(config.compress_ratios), True):
        with pytest.raises(ConfigError, match="layer_id"):
            config.path(bad)


def test_v4_shapes_pools_and_variant_selection(monkeypatch):
    """Decode: 4 requests x 2 MTP rows = 8 token rows from start 8192, MoE tokens = decode tokens; prefill one
    request of 128; 128-token pages, state pages of 4 (ratio 4) and 8 (ratio 128); pools ORI 128, CMP 32, IDX
    64, HCA / CSA / CSA-inner state 64 / 65 / 65; EP 2/4/8 with 384/ep experts (Pro) and LM-head TP 2/4/8 on
    the vocab only; the kernel preset's max position 16384 for both. The variant comes from --variant, then
    DEEPSEEK_V4_VARIANT, then pro; an unknown one is refused. Spec: §8."""
    from kernels.config import v4_variant

    for c in (V4_PRO, V4_FLASH):
        assert (c.decode_batch, c.decode_seq, c.decode_tokens, c.moe_tokens, c.decode_start_pos) == (4, 2, 8, 8, 8192)
        assert (c.prefill_batch, c.prefill_seq, c.block_size) == (1, 128, 128)
        assert (c.c4a_state_block_size, c.c128_state_block_size, c.sliding_window) == (4, 8, 128)
        assert (c.ori_pool, c.cmp_pool, c.idx_pool, c.hca_state_pool, c.csa_state_pool, c.csa_inner_state_pool) == (
            128, 32, 64, 64, 65, 65)
        assert c.kernel_preset().max_position_embeddings == 16384 and (c.ep_world_size, c.lm_head_tp_size) == (8, 8)
        assert [c.vocab_shard(tp, 129280) for tp in (2, 4, 8)] == [64640, 32320, 16160]
        for tp in (1, 3, 16):
            with pytest.raises(ConfigError, match="LM-head --tp"):
                c.vocab_shard(tp, 129280)
    assert [V4_PRO.experts_per_rank(ep) for ep in (2, 4, 8)] == [192, 96, 48]
    assert V4_PRO.max_position_embeddings == 1_048_576 and V4_FLASH.max_position_embeddings == 16384
    monkeypatch.delenv("DEEPSEEK_V4_VARIANT", raising=False)
    assert v4_variant().name == "v4-pro" and v4_variant().max_position_embeddings == 16384
    assert v4_variant(kernel=False).max_position_embeddings == 1_048_576
    monkeypatch.setenv("DEEPSEEK_V4_VARIANT", "flash")
    assert v4_variant().name == "v4-flash" and v4_variant("pro").name == "v4-pro"
    with pytest.raises(ConfigError, match=r"variant: expected one of \['flash', 'pro'\]"):
        v4_variant("mini")


# defects of tests/defects these contracts must catch (shared with other contract files)
SEEDED_DEFECTS = [
    shared("schedule:FIRST_SOURCE", "test_schedule_sources_same_ratio_at_or_before", "kv_source"),
    shared("schedule:FIRST_SOURCE", "test_schedule_source_resolution_table", "(2, 2, 2, 2"),
    shared("schedule:NO_REINDEX", "test_schedule_mode_counts", "kind counts"),
    shared("schedule:NO_REINDEX", "test_schedule_representative_layers", "layer 24"),
]
