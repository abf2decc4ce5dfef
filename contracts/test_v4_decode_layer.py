"""V4's decode layer (``v4_decode_layer``, upstream decode_layer.py) and its HCA attention stage with the compressor
inside (``v4_hca_stage``, upstream decode_attention_hca.py / Flash-MTP's decode_hca.py), on V4-Pro and V4-Flash
(tiny twins).

The HCA stage's batch: request 0 closes compressed window 0 at position 127, request 1 window 1 at 255, requests
2 and 3 close nothing. The stage is judged against the chain of the backend's own operators (bit for bit), by the
order its golden promises (the row a token closes is published before the attention reads it: the attention over
the cache as it came in is outside the stage bound on the closing rows), and by request locality (a request's rows
move its own outputs, cache rows, state rows and compressed row, and nothing else). The layer is judged as its
two stages in order, on SWA and HCA.

Spec: §8; docs/coverage.md, V4 section (V4-32).
"""

from __future__ import annotations

import pytest
import torch

from contracts.separation import separates_under
from contracts.v4_inputs import (
    csa_stage_inputs,
    decode_layer_moe,
    hca_stage_inputs,
    prefill_csa_stage_inputs,
    prefill_hca_stage_inputs,
)
from kernels.config import V4_FLASH_TINY, V4_PRO_TINY
from kernels.errors import ContractInputError
from pto_pytest.defect import SeededDefect
from pto_pytest.plugin import op

MODELS = [V4_PRO_TINY.kernel_preset(), V4_FLASH_TINY.kernel_preset()]
CLOSING = (1, 3)  # the rows that close a window: request 0's position 127, request 1's position 255
FAR = (4, 5)  # with far=True: request 2's rows, one compressed position past HCA's limit


def _normed(backend, config, x_hc, a):
    """The stage's normalised row with the backend's own operators: the entry mix as upstream's hc_pre golden
    computes it (mixes and pre-mixed row in one call), then the RMSNorm."""
    x_mixed = op(backend, "hc_pre_fused")(x_hc, a["hc_fn"], a["hc_scale"], a["hc_base"], config=config)["x_mixed"]
    return op(backend, "final_norm")(x_mixed, a["attn_norm_w"], config=config)


def _published(backend, config, x_hc, a, c):
    """The compressor over the stage's normalised rows, with the compressed half of the stage's RoPE table."""
    half = config.qk_rope_head_dim // 2
    return op(backend, "v4_compress_and_publish")(
        _normed(backend, config, x_hc, a), a["position_ids"].long(), torch.arange(x_hc.shape[0]) // config.decode_seq,
        c["state_block_table"], c["state_pool"], c["weights"], c["cmp_slot_mapping"], a["cmp_kv"],
        a["freqs_cos"][:, :half].float(), a["freqs_sin"][:, :half].float(), ratio=128, overlap=False)


def _rule(backend) -> dict:
    """The HCA top-k limit the backend names (upstream's Flash-MTP folder: "all"), as the stages' keyword."""
    return {"hca_topk_limit": backend.variants.get("v4_hca_stage", {}).get("hca_topk_limit", "index_topk")}


def _topk(backend, config, a, c):
    from kernels.v4.layer import hca_limit

    return op(backend, "hca_topk")(a["position_ids"].long(), c["kv_seq_lens"], seq=config.decode_seq,
                                   limit=hca_limit(config, _rule(backend)["hca_topk_limit"]))


def _slots(config, a, c, limit):
    """HCA's compressed positions of each row, worked out here: the first min((pos + 1) // 128, kv_len // 128,
    limit) of its request, -1 after (``limit`` columns)."""
    pos = a["position_ids"].long()
    lens = c["kv_seq_lens"].long().repeat_interleave(config.decode_seq)
    valid = torch.minimum(torch.minimum((pos + 1) // 128, lens // 128), torch.tensor(limit))
    cols = torch.arange(limit)
    return torch.where(cols[None] < valid[:, None], cols[None], -1).to(torch.int32)


def _attend(backend, config, x_hc, a, c, cmp_kv, compressed=None):
    rest = {k: v for k, v in a.items() if k != "cmp_kv"}
    compressed = _topk(backend, config, a, c) if compressed is None else compressed
    return op(backend, "v4_attention_stage")("HCA", x_hc, **rest, cmp_kv=cmp_kv, compressed=compressed,
                                             config=config)


def _rows_moved(got, ref, width):
    return (got.reshape(-1, width) != ref.reshape(-1, width)).any(1).nonzero().flatten().tolist()


def _outside(y, want):
    """Which rows of y fall outside the stage bound (BF16_STAGE_TOL) of want."""
    from contracts.checks.precision import rows_outside_stage_bound

    return rows_outside_stage_bound(y, want)


def _picks_alternatives(attend, picks, cmp_kv, input_cmp, own, input_idx) -> dict:
    """What a CSA stage's x_out is separated from, beside the attention over ``cmp_kv`` with its indexer's picks
    ``own``: scoring the index cache as it came in (``input_idx``: cache, scale), attending the compressed cache as
    it came in (``input_cmp``), and the picks one position off."""
    return {"scored_before_the_publication": attend(cmp_kv, picks(*input_idx)),
            "attended_the_compressed_cache_as_it_came_in": attend(input_cmp, own),
            "picks_one_position_off": attend(cmp_kv, torch.where(own >= 0, own + 1, own))}


def _inputs_kept(**parts):
    """A snapshot of the call's inputs; called again with the snapshot, it asserts none was written in place."""
    snapshot = {(n, k): v.clone() for n, d in parts.items() for k, v in d.items() if isinstance(v, torch.Tensor)}

    def check():
        for (n, k), v in snapshot.items():
            assert torch.equal(_bits(parts[n][k]), _bits(v)), f"the input {n}[{k}] was written in place"
    return check


def _assert_chain(got, want, stage):
    """Each output of ``want`` (the caches and states first: the cause before its effect on x_out) equals the
    stage's, dtype and bytes."""
    first = [k for k in want if k not in ("x_out", "qr", "qr_scale")]
    for key in (*first, "x_out", "qr", "qr_scale"):
        assert got[key].dtype == want[key].dtype and torch.equal(_bits(got[key]), _bits(want[key])), \
            f"{key} is not the {stage}'s chain of operators (§8)"


def _bits(t):
    return t.view(torch.int16) if t.dtype == torch.bfloat16 else t


@pytest.mark.whole_backend("a stage against its own parts, bit for bit", inputs=("hca_topk",))
@pytest.mark.parametrize("config", MODELS, ids=lambda c: c.name)
@pytest.mark.operators("final_norm", "hc_pre_fused", "hca_topk", "v4_attention_stage", "v4_compress_and_publish",
                        "v4_hca_stage")
def test_the_hca_stage_is_its_operators_in_order(backend, config):
    """x_out, the window cache, qr / qr_scale, the compressed cache and the state pool equal the chain spelled out
    with the same backend's operators, byte for byte: the normalised row -> v4_compress_and_publish (ratio 128, the
    compressed half of the stage's RoPE table) -> hca_topk -> v4_attention_stage("HCA") on the cache just
    published. No input is modified. Spec: §8."""
    x, a, c = hca_stage_inputs(config)
    kept = _inputs_kept(attention=a, compressor=c)
    got = op(backend, "v4_hca_stage")(x, a, c, config=config, **_rule(backend))
    pub = _published(backend, config, x, a, c)
    want = {"cmp_kv": pub["cmp_pool"], "state_pool": pub["state_pool"],
            **_attend(backend, config, x, a, c, pub["cmp_pool"])}
    _assert_chain(got, want, "HCA stage")
    kept()


@pytest.mark.parametrize("config", [*MODELS, V4_FLASH_TINY], ids=["v4-pro-kernel", "v4-flash-kernel", "v4-flash-tiny"])
@pytest.mark.operators("final_norm", "hc_pre_fused", "hca_topk", "v4_attention_stage", "v4_compress_and_publish",
                        "v4_hca_stage")
def test_a_closing_token_attends_the_row_it_publishes(backend, config):
    """The two rows that close a 128-position window publish their pooled rows at their compressed slots -- the
    stage's cmp_kv is the compressor's publication over the stage's own normalised rows, byte for byte, every other
    row kept, the state pool within upstream's state bound -- and the attention reads the cache after that write:
    x_out is within the stage bound of the HCA attention stage over the published cache, each row attending the
    compressed positions worked out here (the first min((pos + 1) // 128, kv_len // 128, limit) of its request,
    the limit by the backend's named rule: "index_topk", min(max_position_embeddings // 128, index_topk) (V4-Pro's),
    or "all", max_position_embeddings // 128 (Flash-MTP's; disagreement 23). One request sits one compressed
    position past index_topk's limit: at the kernel presets (512 positions: both rules 4, the request at 700) the
    max_position_embeddings clause binds, at V4-Flash's tiny preset (16,384 positions: 16 against 128, the request
    at 2236) the rules part. The input separates the order and the rules (separated in the test): over the cache as
    it came in, or under the other rule where it differs, the closing or far rows' x_out falls outside that bound.
    Spec: §8 (upstream
    decode_attention_hca.py: the compressor runs before the sparse attention)."""
    from contracts.tolerances import BF16_STAGE_TOL, V4_STATE_POOL_TOL
    from kernels.v4.layer import HCA_TOPK_LIMITS, hca_limit

    x, a, c = hca_stage_inputs(config, far=True)
    got = op(backend, "v4_hca_stage")(x, a, c, config=config, **_rule(backend))
    pub = _published(backend, config, x, a, c)
    slots = sorted(int(c["cmp_slot_mapping"][t]) for t in CLOSING)
    d = config.head_dim
    assert _rows_moved(_bits(pub["cmp_pool"]), _bits(a["cmp_kv"]), d) == slots, "the vector closes no window"
    moved = _rows_moved(_bits(got["cmp_kv"]), _bits(a["cmp_kv"]), d)
    assert moved == slots, f"cmp_kv rows {moved} were written; the closing rows' slots are {slots} (§8)"
    assert torch.equal(_bits(got["cmp_kv"]), _bits(pub["cmp_pool"])), \
        "the published rows are not the compressor's over the stage's normalised rows (§8)"
    atol, rtol = V4_STATE_POOL_TOL
    off = ((got["state_pool"] - pub["state_pool"]).abs() > atol + rtol * pub["state_pool"].abs()).nonzero()
    assert not off.numel(), f"state_pool{off[0].tolist()} outside ({atol}, {rtol}) of the compressor's state (§8)"

    rule = _rule(backend)["hca_topk_limit"]
    limit = hca_limit(config, rule)
    behind = int(_slots(config, a, c, 256)[FAR[0]].ge(0).sum())
    assert behind > hca_limit(config, "index_topk"), f"the vector does not pass the limit ({behind} positions)"
    own = _slots(config, a, c, limit)
    after = _attend(backend, config, x, a, c, pub["cmp_pool"], own)["x_out"]
    rows = (*CLOSING, *FAR)
    others = {f"the_{other}_limit": _attend(backend, config, x, a, c, pub["cmp_pool"],
                                            _slots(config, a, c, hca_limit(config, other)))["x_out"]
              for other in HCA_TOPK_LIMITS if min(behind, hca_limit(config, other)) != min(behind, limit)}
    separates_under(f"the attention reads the compressed cache after the publication, at most {limit} compressed "
                    "positions", lambda y, want: not any(_outside(y, want)[t] for t in rows), after,
                    attended_the_cache_as_it_came_in=_attend(backend, config, x, a, c, a["cmp_kv"], own)["x_out"],
                    **others)
    bad = _outside(got["x_out"], after).nonzero().flatten().tolist()
    why = " (it attended the cache as it came in)" if bad and bad[0] in CLOSING else \
        f" (it did not attend min({behind}, {limit}) compressed positions: {rule} rule)" if bad and bad[0] in FAR \
        else ""
    assert not bad, f"x_out row {bad[0]} is outside {BF16_STAGE_TOL} of the attention over the published cache" \
                    f"{why} (§8)"


def _csa_parts(backend, config, x, a, c):
    """The CSA stage's first half with the backend's own operators: the normalised row, its projection, the
    compressed half of the RoPE table, the main compressor's publication and the inner compressor's keys."""
    pos = a["position_ids"].long()
    req = torch.arange(x.shape[0]) // config.decode_seq
    x_normed = _normed(backend, config, x, a)
    proj = op(backend, "v4_qkv_proj_rope")(x_normed, a["wq_a"], a["wq_b"], a["wq_b_scale"], a["wkv"],
                                           a["freqs_cos"][pos], a["freqs_sin"][pos], a["gamma_cq"], a["gamma_ckv"],
                                           config=config)
    half = config.qk_rope_head_dim // 2
    cos, sin = a["freqs_cos"][:, :half].float(), a["freqs_sin"][:, :half].float()
    pub = op(backend, "v4_compress_and_publish")(x_normed, pos, req, c["state_block_table"], c["state_pool"],
                                                 c["weights"], c["cmp_slot_mapping"], a["cmp_kv"], cos, sin, ratio=4,
                                                 overlap=True)
    keys, closes, inner = op(backend, "v4_compressor")(x_normed, pos, req, c["inner_state_block_table"],
                                                       c["inner_state_pool"], c["inner_weights"], ratio=4, overlap=True)
    return x_normed, proj, cos, sin, pub, (keys, closes, inner)


@pytest.mark.whole_backend("a stage against its own parts, bit for bit")
@pytest.mark.parametrize("config", MODELS, ids=lambda c: c.name)
@pytest.mark.operators("final_norm", "hc_pre_fused", "v4_attention_stage", "v4_compress_and_publish", "v4_compressor",
                        "v4_csa_stage", "v4_indexer", "v4_publish_index_keys", "v4_qkv_proj_rope")
def test_the_csa_stage_is_its_operators_in_order(backend, config):
    """Every output equals the chain spelled out with the same backend's operators, byte for byte: the normalised
    row and its projection (qr) -> the main compressor's publication (ratio 4, overlapping) -> the inner
    compressor's keys published into the index cache, rotated at the step's first position -> the indexer over that
    cache, its query rotated at the step's first position (one row per request) -> v4_attention_stage("CSA") on the
    indexer's raw top-k over the published compressed cache. No input is modified. Spec: §8 (upstream
    decode_attention_csa.py)."""
    x, a, c, i = csa_stage_inputs(config)
    kept = _inputs_kept(attention=a, compressor=c, indexer=i)
    got = op(backend, "v4_csa_stage")(x, a, c, i, config=config)
    x_normed, proj, cos, sin, pub, (keys, closes, inner) = _csa_parts(backend, config, x, a, c)
    pos = a["position_ids"].long()
    first = pos.reshape(-1, config.decode_seq)[:, 0]
    step = first.repeat_interleave(config.decode_seq) + 3  # publish rotates at position - 3: the step's first
    cache, scale = op(backend, "v4_publish_index_keys")(keys, closes, step, c["idx_slot_mapping"], i["idx_kv_cache"],
                                                        i["idx_kv_scale"], cos, sin, i["hadamard"], ratio=4)
    picks = op(backend, "v4_indexer")(x_normed, proj["qr"], proj["qr_scale"], i["wq_b"], i["wq_b_scale"],
                                      i["weights_proj"], cos[first], sin[first], i["hadamard"], cache, scale,
                                      i["idx_block_table"], pos, c["kv_seq_lens"], offset=0, config=config)
    rest = {k: v for k, v in a.items() if k != "cmp_kv"}
    want = op(backend, "v4_attention_stage")("CSA", x, **rest, cmp_kv=pub["cmp_pool"], compressed=picks["topk_idxs"],
                                             config=config)
    want.update(cmp_kv=pub["cmp_pool"], state_pool=pub["state_pool"], inner_state_pool=inner, idx_kv_cache=cache,
                idx_kv_scale=scale)
    _assert_chain(got, want, "CSA stage")
    kept()


@pytest.mark.parametrize("config", MODELS, ids=lambda c: c.name)
@pytest.mark.operators("final_norm", "hc_pre_fused", "v4_attention_stage", "v4_compress_and_publish", "v4_compressor",
                        "v4_csa_stage", "v4_indexer", "v4_qkv_proj_rope")
def test_the_csa_stage_attends_its_indexers_picks_over_the_published_caches(backend, config):
    """The CSA stage's compressed cache is the main compressor's publication over the stage's own normalised rows
    (byte for byte; its state within upstream's state bound), and its x_out is within the stage bound of the CSA
    attention stage over that cache with the picks of the indexer over the stage's own index cache (its keys
    just published, its query rotated at the step's first position, offset 0). Row 1 (position 127) closes
    window 31 and picks it, so the input separates the order and the offset: scoring the index cache as it came
    in, attending the compressed cache as it came in, and picks one position off all fall outside that bound.
    Spec: §8 (upstream decode_attention_csa.py)."""
    from contracts.tolerances import BF16_STAGE_TOL, V4_STATE_POOL_TOL

    x, a, c, i = csa_stage_inputs(config)
    got = op(backend, "v4_csa_stage")(x, a, c, i, config=config)
    x_normed, proj, cos, sin, pub, _ = _csa_parts(backend, config, x, a, c)
    assert torch.equal(_bits(got["cmp_kv"]), _bits(pub["cmp_pool"])), \
        "the CSA stage's compressed cache is not the compressor's publication over its normalised rows (§8)"
    atol, rtol = V4_STATE_POOL_TOL
    off = ((got["state_pool"] - pub["state_pool"]).abs() > atol + rtol * pub["state_pool"].abs()).nonzero()
    assert not off.numel(), f"state_pool{off[0].tolist()} outside ({atol}, {rtol}) of the compressor's state (§8)"
    pos = a["position_ids"].long()
    first = pos.reshape(-1, config.decode_seq)[:, 0]

    def picks(cache, scale):
        return op(backend, "v4_indexer")(x_normed, proj["qr"], proj["qr_scale"], i["wq_b"], i["wq_b_scale"],
                                         i["weights_proj"], cos[first], sin[first], i["hadamard"], cache, scale,
                                         i["idx_block_table"], pos, c["kv_seq_lens"], offset=0,
                                         config=config)["topk_idxs"]

    rest = {k: v for k, v in a.items() if k != "cmp_kv"}

    def attend(cmp_kv, compressed):
        return op(backend, "v4_attention_stage")("CSA", x, **rest, cmp_kv=cmp_kv, compressed=compressed,
                                                  config=config)["x_out"]

    own = picks(got["idx_kv_cache"], got["idx_kv_scale"])
    want = separates_under("the attention over the published caches with the indexer's own picks",
                           lambda y, w: not bool(_outside(y, w).any()), attend(pub["cmp_pool"], own),
                           **_picks_alternatives(attend, picks, pub["cmp_pool"], a["cmp_kv"], own,
                                                 (i["idx_kv_cache"], i["idx_kv_scale"])))
    bad = _outside(got["x_out"], want).nonzero().flatten().tolist()
    assert not bad, f"x_out row {bad[0]} is outside {BF16_STAGE_TOL} of the CSA attention over the published " \
                    "caches with the indexer's picks (§8)"


def _prefill_parts(backend, config, x, a, c, n):
    """The prefill HCA stage's parts with the backend's own operators: the compressor's publication over the
    chunk's normalised rows, and the window lowered from the page table."""
    pos = a["position_ids"].long()
    pub = op(backend, "v4_prefill_compressor")(_normed(backend, config, x, a), pos, n, c["state_block_table"],
                                               c["state_pool"], c["weights"], c["cmp_slot_mapping"],
                                               c["state_slot_mapping"], a["cmp_kv"], a["freqs_cos"], a["freqs_sin"],
                                               ratio=128, rope_head_dim=config.qk_rope_head_dim)
    window = op(backend, "v4_prefill_swa_indices")(pos, a["block_table"], n, config=config)
    return pub, window


def _prefill_slots(config, a, n, *, shift=1, limit=None):
    """Each real row's first min((pos + shift) // 128, limit) compressed positions (limit: index_topk), worked out
    here (-1 after, padding rows all -1)."""
    limit = config.index_topk if limit is None else limit
    pos = a["position_ids"].long()
    valid = torch.clamp((pos + shift) // 128, max=limit)
    valid[n:] = 0
    cols = torch.arange(limit)
    return torch.where(cols[None] < valid[:, None], cols[None], -1).to(torch.int32)


def _prefill_attend(backend, config, x, a, n, cmp_kv, window, compressed):
    rest = {k: v for k, v in a.items() if k not in ("cmp_kv", "block_table")}
    return op(backend, "v4_attention_stage")("HCA", x, **rest, window_indices=window, cmp_kv=cmp_kv,
                                             compressed=compressed, num_tokens=n, config=config)


@pytest.mark.whole_backend("a stage against its own parts, bit for bit",
                          inputs=("hca_topk", "v4_prefill_swa_indices"))
@pytest.mark.parametrize("real", [28, 16])
@pytest.mark.parametrize("config", MODELS, ids=lambda c: c.name)
@pytest.mark.operators("final_norm", "hc_pre_fused", "hca_topk", "v4_attention_stage", "v4_prefill_compressor",
                        "v4_prefill_hca_stage", "v4_prefill_swa_indices")
def test_the_prefill_hca_stage_is_its_operators_in_order(backend, config, real):
    """One request's prefill chunk (28, or 16, of 32 rows real: with 16 the last real row closes a window, so the
    request's kv length is what caps it): every output equals the chain spelled out with the same backend's
    operators, byte for byte -- the chunk's normalised rows through v4_prefill_compressor (ratio 128), the window
    lowered by v4_prefill_swa_indices, hca_topk over the request (its kv length the last real position + 1, limit
    index_topk, padding rows -1), v4_attention_stage("HCA") in its prefill form over the published cache. No input
    is modified. Spec: §8."""
    x, a, c, n = prefill_hca_stage_inputs(config, num_tokens=real)
    kept = _inputs_kept(attention=a, compressor=c)
    got = op(backend, "v4_prefill_hca_stage")(x, a, c, n, config=config)
    pub, window = _prefill_parts(backend, config, x, a, c, n)
    pos = a["position_ids"].long()
    slots = op(backend, "hca_topk")(pos, pos[:n].max().reshape(1) + 1, seq=x.shape[0], limit=config.index_topk).clone()
    slots[n:] = -1
    want = dict(_prefill_attend(backend, config, x, a, n, pub["cmp_pool"], window, slots), cmp_kv=pub["cmp_pool"],
                state_pool=pub["state_pool"])
    _assert_chain(got, want, "prefill HCA stage")
    kept()


@pytest.mark.parametrize("config, start", [(MODELS[0], 240), (MODELS[1], 240), (V4_FLASH_TINY, 2288)],
                         ids=["v4-pro-kernel", "v4-flash-kernel", "v4-flash-tiny-far"])
@pytest.mark.operators("final_norm", "hc_pre_fused", "v4_attention_stage", "v4_prefill_compressor",
                        "v4_prefill_hca_stage", "v4_prefill_swa_indices")
def test_a_prefill_chunk_attends_the_row_it_publishes(backend, config, start):
    """Row 15 of the chunk (position 255; 2303 at V4-Flash's tiny preset) closes a compressed window: the stage's
    compressed cache is the prefill compressor's publication over the chunk's own normalised rows, byte for byte
    (its state within upstream's state bound), and x_out is within the stage bound of the prefill HCA attention over
    the published cache, each real row attending the first min((pos + 1) // 128, index_topk) compressed positions
    worked out here -- row 15 already the one it closed; at 2303, 18 behind, index_topk's 16 binds. The input
    separates the order, the count and the limit (separated in the test): over the cache as it came in, with
    pos // 128 positions, or without the limit, rows from 15 on fall outside that bound. Spec: §8 (upstream
    prefill_attention_hca.py)."""
    from contracts.tolerances import BF16_STAGE_TOL, V4_STATE_POOL_TOL

    x, a, c, n = prefill_hca_stage_inputs(config, start=start)
    got = op(backend, "v4_prefill_hca_stage")(x, a, c, n, config=config)
    pub, window = _prefill_parts(backend, config, x, a, c, n)
    closed = [int(c["cmp_slot_mapping"][15])]
    assert _rows_moved(_bits(pub["cmp_pool"]), _bits(a["cmp_kv"]), config.head_dim) == closed, "no window closes"
    assert torch.equal(_bits(got["cmp_kv"]), _bits(pub["cmp_pool"])), \
        "the prefill HCA stage's compressed cache is not the compressor's publication over its normalised rows (§8)"
    atol, rtol = V4_STATE_POOL_TOL
    off = ((got["state_pool"] - pub["state_pool"]).abs() > atol + rtol * pub["state_pool"].abs()).nonzero()
    assert not off.numel(), f"state_pool{off[0].tolist()} outside ({atol}, {rtol}) of the compressor's state (§8)"

    def attend(cmp_kv, **slots):
        return _prefill_attend(backend, config, x, a, n, cmp_kv, window, _prefill_slots(config, a, n, **slots))["x_out"]

    if start < 128 * config.index_topk:  # the closing row attends the row it closes
        others = {"attended_the_cache_as_it_came_in": attend(a["cmp_kv"]),
                  "one_position_short": attend(pub["cmp_pool"], shift=0)}
    else:  # past the limit: every row attends index_topk positions, the one it closes not among them
        others = {"no_limit": attend(pub["cmp_pool"], limit=64)}
    want = separates_under("the prefill attention over the published cache, min((pos + 1) // 128, index_topk) "
                           "positions", lambda y, w: not bool(_outside(y, w).any()), attend(pub["cmp_pool"]), **others)
    bad = _outside(got["x_out"], want).nonzero().flatten().tolist()
    assert not bad, f"x_out row {bad[0]} (position {int(a['position_ids'][bad[0]])}) is outside {BF16_STAGE_TOL} " \
                    "of the prefill HCA attention over the published cache (§8)"


@pytest.mark.operators("v4_prefill_hca_stage")
def test_prefill_padding_rows_leave_no_trace_in_the_hca_stage(backend):
    """The chunk's padding rows (28 .. 31) carrying other streams, positions and real rows' slots move no byte of
    any output -- the caches, the compressor's state, the real rows' x_out and qr -- and their own x_out, qr and
    qr_scale are exactly 0. Spec: §8 (upstream prefill_attention_hca.py: the writes, the compressor and the
    attention stop at num_tokens)."""
    config = MODELS[0]
    x, a, c, n = prefill_hca_stage_inputs(config, 1)
    ref = op(backend, "v4_prefill_hca_stage")(x, a, c, n, config=config)
    y = x.clone()
    y[n:] = torch.randn(x.shape[0] - n, *x.shape[1:], generator=torch.Generator().manual_seed(9)) * 4
    b = dict(a, position_ids=a["position_ids"].clone(), swa_slot_mapping=a["swa_slot_mapping"].clone())
    b["position_ids"][n:] = b["position_ids"][n:] + 9  # one of them a window's last position (255 + 128 - 9 .. )
    b["swa_slot_mapping"][n:] = a["swa_slot_mapping"][:x.shape[0] - n]
    d = dict(c, cmp_slot_mapping=c["cmp_slot_mapping"].clone(), state_slot_mapping=c["state_slot_mapping"].clone())
    d["cmp_slot_mapping"][n:] = 258
    d["state_slot_mapping"][n:] = c["state_slot_mapping"][:x.shape[0] - n]
    got = op(backend, "v4_prefill_hca_stage")(y, b, d, n, config=config)
    for key in ("kv_cache", "cmp_kv", "state_pool", "x_out", "qr", "qr_scale"):
        assert torch.equal(_bits(got[key]), _bits(ref[key])), f"{key} moved with the padding rows' contents (§8)"
        if key in ("x_out", "qr", "qr_scale"):
            assert not bool(got[key][n:].any()), f"the padding rows of {key} are not 0 (§8)"


def _prefill_csa_parts(backend, config, x, a, c, i, n):
    """The prefill CSA stage's parts with the backend's own operators: the normalised rows and their projection,
    the main compressor's publication, the index keys published, the window."""
    pos = a["position_ids"].long()
    x_normed = _normed(backend, config, x, a)
    proj = op(backend, "v4_qkv_proj_rope")(x_normed, a["wq_a"], a["wq_b"], a["wq_b_scale"], a["wkv"],
                                           a["freqs_cos"][pos], a["freqs_sin"][pos], a["gamma_cq"], a["gamma_ckv"],
                                           config=config)
    rope = config.qk_rope_head_dim
    pub = op(backend, "v4_prefill_compressor")(x_normed, pos, n, c["state_block_table"], c["state_pool"], c["weights"],
                                               c["cmp_slot_mapping"], c["state_slot_mapping"], a["cmp_kv"],
                                               a["freqs_cos"], a["freqs_sin"], ratio=4, rope_head_dim=rope)
    keys = op(backend, "v4_prefill_index_keys")(x_normed, pos, n, c["inner_state_block_table"], c["inner_state_pool"],
                                                c["inner_weights"], c["idx_slot_mapping"], c["inner_state_slot_mapping"],
                                                i["idx_kv_cache"], i["idx_kv_scale"], a["freqs_cos"], a["freqs_sin"],
                                                i["hadamard"], rope_head_dim=rope)
    window = op(backend, "v4_prefill_swa_indices")(pos, a["block_table"], n, config=config)
    return x_normed, proj, pub, keys, window


def _prefill_picks(backend, config, a, i, n, x_normed, proj, cache, scale):
    pos = a["position_ids"].long()
    half = config.qk_rope_head_dim // 2
    return op(backend, "v4_prefill_indexer")(x_normed, proj["qr"], proj["qr_scale"], i["wq_b"], i["wq_b_scale"],
                                             i["weights_proj"], a["freqs_cos"][pos][:, :half].float(),
                                             a["freqs_sin"][pos][:, :half].float(), i["hadamard"], cache, scale,
                                             i["idx_block_table"], pos, n, config=config)["topk_idxs"]


def _prefill_csa_attend(backend, config, x, a, n, cmp_kv, window, picks):
    rest = {k: v for k, v in a.items() if k not in ("cmp_kv", "block_table")}
    return op(backend, "v4_attention_stage")("CSA", x, **rest, window_indices=window, cmp_kv=cmp_kv, compressed=picks,
                                             num_tokens=n, config=config)


@pytest.mark.whole_backend("a stage against its own parts, bit for bit", inputs=("v4_prefill_swa_indices",))
@pytest.mark.parametrize("config", MODELS, ids=lambda c: c.name)
@pytest.mark.operators("final_norm", "hc_pre_fused", "v4_attention_stage", "v4_prefill_compressor",
                        "v4_prefill_csa_stage", "v4_prefill_index_keys", "v4_prefill_indexer",
                        "v4_prefill_swa_indices", "v4_qkv_proj_rope")
def test_the_prefill_csa_stage_is_its_operators_in_order(backend, config):
    """One request's prefill chunk (28 of 32 rows real, every real row at a position 3 mod 4 closing a ratio-4
    window): every output equals the chain spelled out with the same backend's operators, byte for byte -- the
    normalised rows and their projection (qr), v4_prefill_compressor (ratio 4), v4_prefill_index_keys, the
    prefill indexer over the index cache just written (its query rotated at each row's own position),
    v4_attention_stage("CSA") in its prefill form over the published compressed cache with the raw picks. No input
    is modified. Spec: §8 (upstream prefill_attention_csa.py)."""
    x, a, c, i, n = prefill_csa_stage_inputs(config)
    kept = _inputs_kept(attention=a, compressor=c, indexer=i)
    got = op(backend, "v4_prefill_csa_stage")(x, a, c, i, n, config=config)
    x_normed, proj, pub, keys, window = _prefill_csa_parts(backend, config, x, a, c, i, n)
    picks = _prefill_picks(backend, config, a, i, n, x_normed, proj, keys["idx_kv_cache"], keys["idx_kv_scale"])
    want = dict(_prefill_csa_attend(backend, config, x, a, n, pub["cmp_pool"], window, picks), cmp_kv=pub["cmp_pool"],
                state_pool=pub["state_pool"], inner_state_pool=keys["state_pool"], idx_kv_cache=keys["idx_kv_cache"],
                idx_kv_scale=keys["idx_kv_scale"])
    _assert_chain(got, want, "prefill CSA stage")
    kept()


@pytest.mark.parametrize("start", [240, 0])
@pytest.mark.parametrize("config", MODELS, ids=lambda c: c.name)
@pytest.mark.operators("final_norm", "hc_pre_fused", "v4_attention_stage", "v4_prefill_compressor",
                        "v4_prefill_csa_stage", "v4_prefill_index_keys", "v4_prefill_indexer",
                        "v4_prefill_swa_indices", "v4_qkv_proj_rope")
def test_a_prefill_csa_chunk_attends_its_indexers_picks_over_the_published_caches(backend, config, start):
    """The stage's compressed rows are the prefill compressor's publication over the chunk's normalised rows (within
    upstream's pool bound: its batched host matmul moves a row by an ulp), every other row kept, and its index rows
    the index-key compressor's (within one INT8 step); x_out is within the
    stage bound of the prefill CSA attention over the stage's own compressed cache with the picks of the prefill
    indexer over the stage's own index cache (its keys just published): the stage's caches are the ones its
    attention and indexer read. The input separates the order and the offset (separated in the test):
    scoring the index cache as it came in (at 240 .., where the indexer chooses 16 of up to 68 positions),
    attending the compressed cache as it came in, and picks one position off fall outside that bound. A chunk at
    0 .. 31 (at most 8 visible positions, every one picked) is the domain Flash-MTP's golden checks its own picks in. Spec: §8 (upstream prefill_attention_csa.py)."""
    from contracts.tolerances import BF16_STAGE_TOL, V4_CMP_POOL_TOL

    x, a, c, i, n = prefill_csa_stage_inputs(config, start=start)
    got = op(backend, "v4_prefill_csa_stage")(x, a, c, i, n, config=config)
    pos = a["position_ids"].long()
    x_normed, proj, pub, keys, window = _prefill_csa_parts(backend, config, x, a, c, i, n)
    step = keys["idx_kv_scale"].reshape(-1, 1)  # one INT8 step of each published index row
    decoded = (got["idx_kv_cache"].reshape(step.shape[0], -1).float() * got["idx_kv_scale"].reshape(-1, 1)
               - keys["idx_kv_cache"].reshape(step.shape[0], -1).float() * step)
    off = (decoded.abs() > step * 1.001).any(1).nonzero().flatten().tolist()
    assert not off, f"index row {off[0]} is not the index-key compressor's publication over the chunk's normalised " \
                    "rows within one INT8 step (§8)"
    written = sorted(int(r) for r in c["cmp_slot_mapping"] if r >= 0)
    d = config.head_dim
    moved = _rows_moved(_bits(got["cmp_kv"]), _bits(a["cmp_kv"]), d)
    assert set(moved) <= set(written), f"compressed rows {sorted(set(moved) - set(written))} written, no slot of the chunk"
    atol, rtol = V4_CMP_POOL_TOL
    rows, want_rows = got["cmp_kv"].reshape(-1, d)[written].float(), pub["cmp_pool"].reshape(-1, d)[written].float()
    off = ((rows - want_rows).abs() > atol + rtol * want_rows.abs()).nonzero()
    assert not off.numel(), f"compressed row {written[int(off[0, 0])]} is not the prefill compressor's publication " \
                            f"over the chunk's normalised rows within ({atol}, {rtol}) (§8)"

    def picks(cache, scale):
        return _prefill_picks(backend, config, a, i, n, x_normed, proj, cache, scale)

    def attend(cmp_kv, compressed):
        return _prefill_csa_attend(backend, config, x, a, n, cmp_kv, window, compressed)["x_out"]

    own = picks(got["idx_kv_cache"], got["idx_kv_scale"])
    others = _picks_alternatives(attend, picks, got["cmp_kv"], a["cmp_kv"], own, (i["idx_kv_cache"], i["idx_kv_scale"]))
    if start < 4 * config.index_topk:  # every visible compressed position is picked: the index cache's scores
        del others["scored_before_the_publication"]  # order the picks, never choose them
    want = separates_under("the prefill attention over the stage's caches with its indexer's picks",
                           lambda y, w: not bool(_outside(y, w).any()), attend(got["cmp_kv"], own), **others)
    bad = _outside(got["x_out"], want).nonzero().flatten().tolist()
    assert not bad, f"x_out row {bad[0]} (position {int(pos[bad[0]])}) is outside {BF16_STAGE_TOL} of the prefill " \
                    "CSA attention over the stage's caches with its indexer's picks (§8)"


def _rotated_key(key, cos, sin, hadamard):
    """An index key as published, worked out here in FP64: its last 2·len(cos) dims rotated in adjacent pairs,
    rounded to BF16, times the Hadamard, rounded to BF16."""
    k = key.double().clone()
    w = cos.shape[-1] * 2
    a, b = k[-w::2].clone(), k[-w + 1::2].clone()
    k[-w::2], k[-w + 1::2] = a * cos.double() - b * sin.double(), a * sin.double() + b * cos.double()
    return (k.to(torch.bfloat16).double() @ hadamard.double()).to(torch.bfloat16).double()


@pytest.mark.parametrize("config", MODELS, ids=lambda c: c.name)
@pytest.mark.operators("final_norm", "hc_pre_fused", "v4_compressor", "v4_csa_stage")
def test_an_index_key_is_rotated_at_the_named_position(backend, config):
    """The two rows that close a ratio-4 window publish their index keys (the inner compressor's rows over the
    stage's normalised rows) at their index slots: each row's INT8 codes times its scale within one INT8 step of
    the key rotated at the backend's named position, then Hadamard, worked out here in FP64 -- for upstream's rule
    ("step") the decode step's first position (126 and 254), the row the indexer's query uses; for
    "window_start" the window's first (124 and 252). The other rule's row is outside that bound
    (separates_under), and no other index row moves. Spec: §8; docs/upstream.md (disagreement 22)."""

    rule = getattr(backend, "variants", {}).get("v4_csa_stage", {}).get("index_key_rope", "step")
    x, a, c, i = csa_stage_inputs(config)
    got = op(backend, "v4_csa_stage")(x, a, c, i, config=config)
    pos = a["position_ids"].long()
    req = torch.arange(x.shape[0]) // config.decode_seq
    keys, closes, _ = op(backend, "v4_compressor")(_normed(backend, config, x, a), pos, req,
                                                   c["inner_state_block_table"], c["inner_state_pool"],
                                                   c["inner_weights"], ratio=4, overlap=True)
    half = config.qk_rope_head_dim // 2
    cos, sin = a["freqs_cos"][:, :half].float(), a["freqs_sin"][:, :half].float()
    d = config.index_head_dim
    cache, scale = got["idx_kv_cache"].reshape(-1, d), got["idx_kv_scale"].reshape(-1)
    slots = [int(c["idx_slot_mapping"][t]) for t in CLOSING]
    assert closes.nonzero().flatten().tolist() == list(CLOSING), "the vector's closing rows moved"
    moved = _rows_moved(got["idx_kv_cache"], i["idx_kv_cache"], d)
    assert moved == sorted(slots), f"index rows {moved} were written; the closing rows' slots are {sorted(slots)}"
    for t, slot in zip(CLOSING, slots, strict=True):
        at = {"step": int(pos[t - t % config.decode_seq]), "window_start": int(pos[t]) - 3}

        def row(where, t=t, at=at):
            return _rotated_key(keys[t], cos[at[where]], sin[at[where]], i["hadamard"])

        def within(candidate, want):
            return bool(((candidate - want).abs() <= want.abs().max() / 127).all())

        want = separates_under(f"the index key rotated at the {rule} position", within, row(rule),
                               **{f"rotated_at_the_{other}": row(other) for other in at if other != rule})
        decoded = cache[slot].double() * float(scale[slot])
        off = ((decoded - want).abs() > want.abs().max() / 127).nonzero().flatten().tolist()
        assert not off, f"index row {slot} (row {t}, position {int(pos[t])}) element {off[0]}: " \
                        f"{float(decoded[off[0]]):.6g}, expected {float(want[off[0]]):.6g} within one INT8 step " \
                        f"({rule} rule: rotated at position {at[rule]}; §8)"


def _stage_call(backend, config, path, seed):
    """(x_hc, a call of the path's stage on given streams, its inputs (attention, compressor, indexer or None))."""
    if path == "HCA":
        x, a, c = hca_stage_inputs(config, seed)
        return x, (lambda y: op(backend, "v4_hca_stage")(y, a, c, config=config, **_rule(backend))), (a, c, None)
    x, a, c, i = csa_stage_inputs(config, seed)
    return x, (lambda y: op(backend, "v4_csa_stage")(y, a, c, i, config=config)), (a, c, i)


def _state_rows(table, pool, positions, request_):
    page = pool.shape[1]
    return sorted(int(table[request_, p // page]) * page + p % page for p in positions)


@pytest.mark.parametrize("request_", [0, 3], ids=["closing-request", "plain-request"])
@pytest.mark.parametrize("path", ["HCA", "CSA"])
@pytest.mark.operators("v4_hca_stage", "v4_csa_stage")
def test_a_request_moves_only_its_own_rows(backend, path, request_):
    """Changing one request's streams (request 0, which closes a window; request 3, which closes nothing) moves
    its own x_out and qr rows, its own window-cache slots, its own state-pool rows (the ring pages of its table;
    CSA: of both compressors) and, for request 0, its own compressed row (CSA: and its index key) -- they do move
    -- and no other byte of any output. Request 3's first row writes window slot 0, an ordinary slot. Spec: §8."""
    config = MODELS[0]
    seq = config.decode_seq
    x, stage, (a, c, i) = _stage_call(backend, config, path, 2)
    ref = stage(x)
    y = x.clone()
    rows = list(range(request_ * seq, (request_ + 1) * seq))
    y[rows] = y[rows] * -1.5
    got = stage(y)
    hc_d = config.hc_mult * config.hidden_size
    assert _rows_moved(got["x_out"], ref["x_out"], hc_d) == rows, \
        f"x_out rows moved {_rows_moved(got['x_out'], ref['x_out'], hc_d)}, request {request_}'s are {rows}"
    assert set(_rows_moved(got["qr"], ref["qr"], config.q_lora_rank)) <= set(rows), "another request's qr moved"
    kv = [int(a["swa_slot_mapping"][t]) for t in rows]
    assert _rows_moved(_bits(got["kv_cache"]), _bits(ref["kv_cache"]), config.head_dim) == kv, \
        f"window-cache rows moved {_rows_moved(_bits(got['kv_cache']), _bits(ref['kv_cache']), config.head_dim)}; " \
        f"request {request_}'s slots are {kv}"
    positions = [int(a["position_ids"][t]) for t in rows]
    pools = [("state_pool", "state_block_table")] + ([("inner_state_pool", "inner_state_block_table")]
                                                    if path == "CSA" else [])
    for pool, table in pools:
        want = _state_rows(c[table], c[pool], positions, request_)
        moved = _rows_moved(got[pool], ref[pool], c[pool].shape[2])
        assert moved == want, f"{pool}: state rows moved {moved}; request {request_}'s positions are at rows {want}"
    cmp = [int(c["cmp_slot_mapping"][t]) for t in rows if int(c["cmp_slot_mapping"][t]) >= 0]
    assert _rows_moved(_bits(got["cmp_kv"]), _bits(ref["cmp_kv"]), config.head_dim) == cmp, \
        f"compressed rows moved {_rows_moved(_bits(got['cmp_kv']), _bits(ref['cmp_kv']), config.head_dim)}; " \
        f"request {request_} publishes {cmp}"
    if path == "CSA":
        keys = [int(c["idx_slot_mapping"][t]) for t in rows if int(c["idx_slot_mapping"][t]) >= 0]
        moved = _rows_moved(got["idx_kv_cache"], ref["idx_kv_cache"], config.index_head_dim)
        assert moved == keys, f"index-cache rows moved {moved}; request {request_} publishes {keys}"


def _swa_attention(a):
    return {k: v for k, v in a.items() if k not in ("cmp_kv", "cmp_block_table")}


@pytest.mark.parametrize("layer_id", [1, 2, 3])
@pytest.mark.parametrize("path", ["SWA", "HCA", "CSA"])
@pytest.mark.parametrize("config", MODELS, ids=lambda c: c.name)
@pytest.mark.operators("v4_decode_layer", "v4_attention_stage", "v4_hca_stage", "v4_csa_stage", "v4_moe_stage")
def test_the_decode_layer_is_its_stages_in_order(backend, config, path, layer_id):
    """x_out is the MoE stage over the attention stage's streams (every decode row real, routed as the given
    layer; the MoE stage over the layer's input differs), the caches the attention stage's -- chained here from the
    backend's own stages, bit for bit, on each path (SWA, HCA, CSA). Layers 1, 2 and 3 (compress ratios 128, 4, 128 at V4-Pro; 0, 4, 128 at
    V4-Flash): where a layer's ratio is the path's, upstream's layer golden that dispatches by layer id is the one
    judged. Spec: §8 (upstream decode_layer.py: golden_attention_* then golden_moe with num_tokens = T)."""
    moe = decode_layer_moe(config, 1, layer_id=layer_id)
    if path == "SWA":
        x, a, _ = hca_stage_inputs(config, 1)
        a, c, i = _swa_attention(a), None, None
        att = op(backend, "v4_attention_stage")("SWA", x, **a, config=config)
    else:
        x, stage, (a, c, i) = _stage_call(backend, config, path, 1)
        att = stage(x)
    got = op(backend, "v4_decode_layer")(path, x, a, moe, c, i, config=config, **_rule(backend))
    want = op(backend, "v4_moe_stage")(att["x_out"], **moe, num_tokens=x.shape[0], config=config)["x_out"]
    assert not torch.equal(want, op(backend, "v4_moe_stage")(x, **moe, num_tokens=x.shape[0], config=config)["x_out"])
    assert got["x_out"].dtype == torch.float32 and torch.equal(got["x_out"], want), \
        f"{path}: x_out is not the MoE stage over the attention stage's streams (§8)"
    for key in ("kv_cache", "cmp_kv", "state_pool", "inner_state_pool", "idx_kv_cache", "idx_kv_scale"):
        if key in att:
            assert torch.equal(_bits(got[key]), _bits(att[key])), f"{path}: {key} is not the attention stage's"


@pytest.mark.operators("v4_decode_layer", "v4_hca_stage", "v4_csa_stage", "v4_prefill_hca_stage",
                        "v4_prefill_csa_stage")
def test_bad_layer_calls_are_refused_naming_the_field(backend):
    config = MODELS[0]
    x, a, c = hca_stage_inputs(config)
    _, _, cc, i = csa_stage_inputs(config)
    moe = decode_layer_moe(config)
    layer, stage = op(backend, "v4_decode_layer"), op(backend, "v4_hca_stage")
    for path, attention, compressor, indexer, field in (
            ("MLA", a, c, None, "path"), ("SWA", _swa_attention(a), c, None, "compressor"),
            ("HCA", a, None, None, "compressor"), ("HCA", _swa_attention(a), c, None, "attention"),
            ("HCA", {k: v for k, v in a.items() if k != "cmp_block_table"}, c, None, "attention"),
            ("HCA", dict(a, compressed=a["window_indices"]), c, None, "attention"), ("HCA", a, c, i, "indexer"),
            ("CSA", a, cc, None, "indexer"), ("CSA", a, c, i, "compressor"),
            ("CSA", a, cc, {k: v for k, v in i.items() if k != "hadamard"}, "indexer")):
        with pytest.raises(ContractInputError, match=field):
            layer(path, x, attention, moe, compressor, indexer, config=config)
    px, pa, pc, pn = prefill_hca_stage_inputs(config)
    prefill = op(backend, "v4_prefill_hca_stage")
    for attention, compressor, field in (
            ({k: v for k, v in pa.items() if k != "block_table"}, pc, "attention"),
            (dict(pa, window_indices=a["window_indices"]), pc, "attention"),
            (pa, {k: v for k, v in pc.items() if k != "state_slot_mapping"}, "compressor")):
        with pytest.raises(ContractInputError, match=field):
            prefill(px, attention, compressor, pn, config=config)
    cx, ca, cc2, ci, cn = prefill_csa_stage_inputs(config)
    with pytest.raises(ContractInputError, match="compressor / indexer"):
        op(backend, "v4_prefill_csa_stage")(cx, ca, cc2, {k: v for k, v in ci.items() if k != "hadamard"}, cn,
                                            config=config)
    with pytest.raises(ContractInputError, match="compressor / indexer"):
        op(backend, "v4_prefill_csa_stage")(cx, ca, {k: v for k, v in cc2.items() if k != "inner_weights"}, ci, cn,
                                            config=config)
    with pytest.raises(ContractInputError, match="hca_topk_limit"):
        stage(x, a, c, config=config, hca_topk_limit="none")
    with pytest.raises(ContractInputError, match="index_key_rope"):
        op(backend, "v4_csa_stage")(x, a, cc, i, config=config, index_key_rope="token")
    with pytest.raises(ContractInputError, match="moe"):
        layer("HCA", x, a, dict(moe, num_tokens=8), c, config=config)
    with pytest.raises(ContractInputError, match="kv_seq_lens"):
        stage(x, a, dict(c, kv_seq_lens=c["kv_seq_lens"][:-1]), config=config)
    with pytest.raises(ContractInputError, match="compressor"):
        stage(x, a, {k: v for k, v in c.items() if k != "weights"}, config=config)


@pytest.mark.whole_backend("a stage's calls counted on the backend's own operators")
@pytest.mark.operators("v4_decode_layer", "v4_hca_stage", "v4_csa_stage", "v4_prefill_hca_stage",
                        "v4_prefill_csa_stage", "final_norm", "hc_mixes", "hc_pre", "hca_topk", "v4_attention_stage",
                        "v4_compress_and_publish", "v4_compressor", "v4_indexer", "v4_moe_stage",
                        "v4_prefill_compressor", "v4_prefill_index_keys", "v4_prefill_indexer",
                        "v4_prefill_swa_indices", "v4_publish_index_keys", "v4_qkv_proj_rope")
def test_the_layer_and_the_stage_run_the_backends_operators(backend):
    """On a backend whose operators are wrapped to count, the HCA stage calls hc_mixes, hc_pre, final_norm,
    v4_compress_and_publish, hca_topk and v4_attention_stage once each; the CSA stage hc_mixes, hc_pre,
    final_norm, v4_qkv_proj_rope, v4_compress_and_publish, v4_compressor, v4_publish_index_keys, v4_indexer and
    v4_attention_stage once each; and the layer its attention stage (SWA: v4_attention_stage, HCA: v4_hca_stage,
    CSA: v4_csa_stage) and v4_moe_stage once each: each is the backend's own. Spec: §8."""
    config = MODELS[0]
    x, a, c = hca_stage_inputs(config)
    _, ca, cc, i = csa_stage_inputs(config)
    moe = decode_layer_moe(config)
    calls = []

    def counted(name):
        fn = op(backend, name)

        def wrapper(*args, **kwargs):
            calls.append(name)
            return fn(*args, **{k: v for k, v in kwargs.items() if k != "ops"})

        return wrapper

    leaves = ("hc_mixes", "hc_pre", "final_norm", "v4_compress_and_publish", "hca_topk", "v4_attention_stage")
    backend.derive("counting", **{n: counted(n) for n in leaves}).get("v4_hca_stage")(x, a, c, config=config)
    assert sorted(calls) == sorted(leaves), f"the HCA stage called {calls}, not each of {leaves} once"
    calls.clear()
    leaves = ("hc_mixes", "hc_pre", "final_norm", "v4_prefill_compressor", "v4_prefill_swa_indices", "hca_topk",
              "v4_attention_stage")
    px, pa, pc, pn = prefill_hca_stage_inputs(config)
    backend.derive("counting", **{n: counted(n) for n in leaves}).get("v4_prefill_hca_stage")(px, pa, pc, pn,
                                                                                              config=config)
    assert sorted(calls) == sorted(leaves), f"the prefill HCA stage called {calls}, not each of {leaves} once"
    calls.clear()
    leaves = ("hc_mixes", "hc_pre", "final_norm", "v4_qkv_proj_rope", "v4_prefill_compressor", "v4_prefill_index_keys",
              "v4_prefill_indexer", "v4_prefill_swa_indices", "v4_attention_stage")
    cx, ca2, cc2, ci, cn = prefill_csa_stage_inputs(config)
    backend.derive("counting", **{n: counted(n) for n in leaves}).get("v4_prefill_csa_stage")(cx, ca2, cc2, ci, cn,
                                                                                              config=config)
    assert sorted(calls) == sorted(leaves), f"the prefill CSA stage called {calls}, not each of {leaves} once"
    calls.clear()
    leaves = ("hc_mixes", "hc_pre", "final_norm", "v4_qkv_proj_rope", "v4_compress_and_publish", "v4_compressor",
              "v4_publish_index_keys", "v4_indexer", "v4_attention_stage")
    backend.derive("counting", **{n: counted(n) for n in leaves}).get("v4_csa_stage")(x, ca, cc, i, config=config)
    assert sorted(calls) == sorted(leaves), f"the CSA stage called {calls}, not each of {leaves} once"
    derived = backend.derive("counting", **{n: counted(n) for n in ("v4_attention_stage", "v4_hca_stage",
                                                                    "v4_csa_stage", "v4_moe_stage")})
    for path, want, parts in (("SWA", "v4_attention_stage", (_swa_attention(a), None, None)),
                              ("HCA", "v4_hca_stage", (a, c, None)), ("CSA", "v4_csa_stage", (ca, cc, i))):
        calls.clear()
        derived.get("v4_decode_layer")(path, x, *parts[:1], moe, *parts[1:], config=config)
        assert sorted(calls) == sorted([want, "v4_moe_stage"]), f"{path}: {calls}"


def _attend_before_publish(x_hc, attention, compressor, *, config, ops=None, hca_topk_limit="index_topk"):
    """An HCA stage whose attention reads the compressed cache as it came in (the publication after it)."""
    from kernels.v4.layer import v4_hca_stage

    out = v4_hca_stage(x_hc, attention, compressor, config=config, ops=ops)
    stale = v4_hca_stage(x_hc, attention, dict(compressor, cmp_slot_mapping=torch.full_like(
        compressor["cmp_slot_mapping"], -1)), config=config, ops=ops)
    return {**out, "x_out": stale["x_out"]}


def _one_state_table(x_hc, attention, compressor, *, config, ops=None, hca_topk_limit="index_topk"):
    """An HCA stage whose compressor reads every request's state through request 0's table row."""
    from kernels.v4.layer import v4_hca_stage

    table = compressor["state_block_table"]
    return v4_hca_stage(x_hc, attention, dict(compressor, state_block_table=table[:1].expand_as(table)),
                        config=config, ops=ops)


def _moe_on_the_input(path, x_hc, attention, moe, compressor=None, indexer=None, *, config, ops=None,
                      hca_topk_limit="index_topk"):
    """A decode layer whose MoE stage reads the layer's input streams instead of the attention stage's."""
    from kernels.v4.layer import v4_decode_layer
    from kernels.v4.moe import v4_moe_stage

    out = v4_decode_layer(path, x_hc, attention, moe, compressor, indexer, config=config, ops=ops,
                          hca_topk_limit=hca_topk_limit)
    return {**out, "x_out": v4_moe_stage(x_hc, **moe, num_tokens=x_hc.shape[0], config=config)["x_out"]}


def _compress_unnormed(x_hc, attention, compressor, *, config, ops=None, hca_topk_limit="index_topk"):
    """An HCA stage whose compressor reads the collapsed streams before the attention RMSNorm (the stage's first
    final_norm call, the compressor's row, returns its input)."""
    from kernels.reference.lm_head import final_norm
    from kernels.v4.layer import v4_hca_stage

    calls = []

    def norm(rows, w, *, config):
        calls.append(1)
        return rows if len(calls) == 1 else final_norm(rows, w, config=config)

    return v4_hca_stage(x_hc, attention, compressor, config=config, ops={"final_norm": norm})


def _no_hca_limit(x_hc, attention, compressor, *, config, ops=None, hca_topk_limit="index_topk"):
    """An HCA stage whose top-k has no limit: every compressed position behind the token."""
    from kernels.v4 import layer

    original = layer.hca_limit
    layer.hca_limit = lambda config, rule="index_topk": 256
    try:
        return layer.v4_hca_stage(x_hc, attention, compressor, config=config, ops=ops)
    finally:
        layer.hca_limit = original


def _stage_with_its_own_operators(x_hc, attention, compressor, *, config, ops=None, hca_topk_limit="index_topk"):
    """An HCA stage that ignores the backend's operators (the reference's own inside)."""
    from kernels.v4.layer import v4_hca_stage

    return v4_hca_stage(x_hc, attention, compressor, config=config)


def _index_key_at_window_start(x_hc, attention, compressor, indexer, *, config, ops=None, index_key_rope="step"):
    """A CSA stage that rotates each index key at its window's first position whatever the rule."""
    from kernels.v4.layer import v4_csa_stage

    return v4_csa_stage(x_hc, attention, compressor, indexer, config=config, ops=ops, index_key_rope="window_start")


def _scores_before_publish(x_hc, attention, compressor, indexer, *, config, ops=None, index_key_rope="step"):
    """A CSA stage whose indexer scores the index cache as it came in (its keys published after)."""
    from kernels.v4.indexer import v4_indexer
    from kernels.v4.layer import v4_csa_stage

    def stale(x, qr, qr_scale, wq_b, wq_b_scale, weights_proj, cos, sin, hadamard, _cache, _scale, *rest, **kw):
        return v4_indexer(x, qr, qr_scale, wq_b, wq_b_scale, weights_proj, cos, sin, hadamard,
                          indexer["idx_kv_cache"], indexer["idx_kv_scale"], *rest, **kw)

    return v4_csa_stage(x_hc, attention, compressor, indexer, config=config, ops={**(ops or {}), "v4_indexer": stale},
                        index_key_rope=index_key_rope)


def _prefill_attend_before_publish(x_hc, attention, compressor, num_tokens, *, config, ops=None):
    """A prefill HCA stage whose attention reads the compressed cache as it came in."""
    from kernels.v4.layer import v4_prefill_hca_stage

    out = v4_prefill_hca_stage(x_hc, attention, compressor, num_tokens, config=config, ops=ops)
    stale = v4_prefill_hca_stage(x_hc, attention, dict(compressor, cmp_slot_mapping=torch.full_like(
        compressor["cmp_slot_mapping"], -1)), num_tokens, config=config, ops=ops)
    return {**out, "x_out": stale["x_out"]}


def _prefill_padding_written(x_hc, attention, compressor, num_tokens, *, config, ops=None):
    """A prefill HCA stage whose kv write runs over every row: a padding row writes its slot too (the window
    cache's row there taken from the padding row's collapsed streams)."""
    from kernels.v4.layer import v4_prefill_hca_stage

    out = v4_prefill_hca_stage(x_hc, attention, compressor, num_tokens, config=config, ops=ops)
    cache = out["kv_cache"].clone()
    flat = cache.reshape(-1, cache.shape[-1])
    for t in range(num_tokens, x_hc.shape[0]):
        slot = int(attention["swa_slot_mapping"][t])
        if slot >= 0:
            flat[slot] = x_hc[t].sum(0)[:cache.shape[-1]].to(cache.dtype)
    return {**out, "kv_cache": cache}


def _prefill_scores_before_publish(x_hc, attention, compressor, indexer, num_tokens, *, config, ops=None):
    """A prefill CSA stage whose indexer scores the index cache as it came in."""
    from kernels.v4.layer import v4_prefill_csa_stage
    from kernels.v4.prefill_indexer import v4_prefill_indexer

    def stale(x, qr, qr_scale, wq_b, wq_b_scale, weights_proj, cos, sin, hadamard, _cache, _scale, *rest, **kw):
        return v4_prefill_indexer(x, qr, qr_scale, wq_b, wq_b_scale, weights_proj, cos, sin, hadamard,
                                  indexer["idx_kv_cache"], indexer["idx_kv_scale"], *rest, **kw)

    return v4_prefill_csa_stage(x_hc, attention, compressor, indexer, num_tokens, config=config,
                                ops={**(ops or {}), "v4_prefill_indexer": stale})


def _prefill_csa_picks_shifted(x_hc, attention, compressor, indexer, num_tokens, *, config, ops=None):
    """A prefill CSA stage whose attention reads its indexer's picks one compressed position late."""
    from kernels.v4.layer import v4_prefill_csa_stage
    from kernels.v4.prefill_indexer import v4_prefill_indexer

    def late(*args, **kw):
        out = v4_prefill_indexer(*args, **kw)
        picks = out["topk_idxs"]
        return {**out, "topk_idxs": torch.where(picks >= 0, picks + 1, picks)}

    return v4_prefill_csa_stage(x_hc, attention, compressor, indexer, num_tokens, config=config,
                                ops={**(ops or {}), "v4_prefill_indexer": late})


SEEDED_DEFECTS = [
    SeededDefect("v4-layer:prefill-scores-before-publish", "v4_prefill_csa_stage", _prefill_scores_before_publish,
                 "test_the_prefill_csa_stage_is_its_operators_in_order", "is not the prefill CSA stage's chain"),
    SeededDefect("v4-layer:prefill-csa-picks-shifted", "v4_prefill_csa_stage", _prefill_csa_picks_shifted,
                 "test_a_prefill_csa_chunk_attends_its_indexers_picks_over_the_published_caches",
                 "with its indexer's picks"),
    SeededDefect("v4-layer:prefill-attend-before-publish", "v4_prefill_hca_stage", _prefill_attend_before_publish,
                 "test_a_prefill_chunk_attends_the_row_it_publishes", "of the prefill HCA attention"),
    SeededDefect("v4-layer:prefill-padding-written", "v4_prefill_hca_stage", _prefill_padding_written,
                 "test_prefill_padding_rows_leave_no_trace_in_the_hca_stage", "moved with the padding rows"),
    SeededDefect("v4-layer:index-key-at-window-start", "v4_csa_stage", _index_key_at_window_start,
                 "test_an_index_key_is_rotated_at_the_named_position", "step rule: rotated at position"),
    SeededDefect("v4-layer:scores-before-publish", "v4_csa_stage", _scores_before_publish,
                 "test_the_csa_stage_is_its_operators_in_order", "is not the CSA stage's chain of operators"),
    SeededDefect("v4-layer:compress-unnormed", "v4_hca_stage", _compress_unnormed,
                 "test_the_hca_stage_is_its_operators_in_order", "cmp_kv is not the HCA stage's chain"),
    SeededDefect("v4-layer:no-hca-limit", "v4_hca_stage", _no_hca_limit,
                 "test_a_closing_token_attends_the_row_it_publishes", "rule)"),
    SeededDefect("v4-layer:own-operators", "v4_hca_stage", _stage_with_its_own_operators,
                 "test_the_layer_and_the_stage_run_the_backends_operators", "not each of"),
    SeededDefect("v4-layer:attend-before-publish", "v4_hca_stage", _attend_before_publish,
                 "test_a_closing_token_attends_the_row_it_publishes", "attended the cache as it came in"),
    SeededDefect("v4-layer:one-state-table", "v4_hca_stage", _one_state_table,
                 "test_a_request_moves_only_its_own_rows", "state rows moved"),
    SeededDefect("v4-layer:moe-on-the-input", "v4_decode_layer", _moe_on_the_input,
                 "test_the_decode_layer_is_its_stages_in_order", "x_out is not the MoE stage"),
]
