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

from contracts.v4_inputs import decode_layer_moe, hca_stage_inputs
from kernels.config import V4_FLASH_TINY, V4_PRO_TINY
from kernels.errors import ContractInputError
from pto_pytest.defect import SeededDefect
from pto_pytest.plugin import op

MODELS = [V4_PRO_TINY.kernel_preset(), V4_FLASH_TINY.kernel_preset()]
CLOSING = (1, 3)  # the rows that close a window: request 0's position 127, request 1's position 255
FAR = (4, 5)  # with far=True: request 2's rows, positions 700 and 701, 5 compressed positions behind each


def _normed(backend, config, x_hc, a):
    mixes = op(backend, "hc_mixes")(x_hc, a["hc_fn"], a["hc_scale"], a["hc_base"], config=config)
    return op(backend, "final_norm")(op(backend, "hc_pre")(x_hc, mixes.pre), a["attn_norm_w"], config=config)


def _published(backend, config, x_hc, a, c):
    """The compressor over the stage's normalised rows, with the compressed half of the stage's RoPE table."""
    half = config.qk_rope_head_dim // 2
    return op(backend, "v4_compress_and_publish")(
        _normed(backend, config, x_hc, a), a["position_ids"].long(), torch.arange(x_hc.shape[0]) // config.decode_seq,
        c["state_block_table"], c["state_pool"], c["weights"], c["cmp_slot_mapping"], a["cmp_kv"],
        a["freqs_cos"][:, :half].float(), a["freqs_sin"][:, :half].float(), ratio=128, overlap=False)


def _topk(backend, config, a, c):
    from kernels.v4.layer import hca_limit

    return op(backend, "hca_topk")(a["position_ids"].long(), c["kv_seq_lens"], seq=config.decode_seq,
                                   limit=hca_limit(config))


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


def _bits(t):
    return t.view(torch.int16) if t.dtype == torch.bfloat16 else t


@pytest.mark.whole_backend("a stage against its own parts, bit for bit")
@pytest.mark.parametrize("config", MODELS, ids=lambda c: c.name)
@pytest.mark.operators("final_norm", "hc_mixes", "hc_pre", "hca_topk", "v4_attention_stage", "v4_compress_and_publish",
                        "v4_hca_stage")
def test_the_hca_stage_is_its_operators_in_order(backend, config):
    """x_out, the window cache, qr / qr_scale, the compressed cache and the state pool equal the chain spelled out
    with the same backend's operators, byte for byte: the normalised row -> v4_compress_and_publish (ratio 128, the
    compressed half of the stage's RoPE table) -> hca_topk -> v4_attention_stage("HCA") on the cache just
    published. No input is modified. Spec: §8."""
    x, a, c = hca_stage_inputs(config)
    before = {k: v.clone() for k, v in (*a.items(), *c.items()) if isinstance(v, torch.Tensor)}
    got = op(backend, "v4_hca_stage")(x, a, c, config=config)
    pub = _published(backend, config, x, a, c)
    want = _attend(backend, config, x, a, c, pub["cmp_pool"])
    assert torch.equal(_bits(got["cmp_kv"]), _bits(pub["cmp_pool"])), "cmp_kv is not the compressor's publication"
    assert torch.equal(got["state_pool"], pub["state_pool"]), "the state pool is not the compressor's"
    for key in ("x_out", "kv_cache", "qr", "qr_scale"):
        assert got[key].dtype == want[key].dtype and torch.equal(_bits(got[key]), _bits(want[key])), \
            f"{key} is not the HCA attention stage's over the compressed cache just published (§8)"
    for k, v in (*a.items(), *c.items()):
        if k in before:
            assert torch.equal(_bits(v), _bits(before[k])), f"the input {k} was written in place"


@pytest.mark.parametrize("config", MODELS, ids=lambda c: c.name)
@pytest.mark.operators("v4_hca_stage", "v4_compress_and_publish", "v4_attention_stage", "final_norm", "hc_mixes",
                        "hc_pre", "hca_topk")
def test_a_closing_token_attends_the_row_it_publishes(backend, config):
    """The two rows that close a 128-position window publish their pooled rows at their compressed slots -- the
    stage's cmp_kv is the compressor's publication over the stage's own normalised rows, byte for byte, every other
    row kept, the state pool within upstream's state bound -- and the attention reads the cache after that write:
    x_out is within the stage bound of the HCA attention stage over the published cache, each row attending the
    compressed positions worked out here (the first min((pos + 1) // 128, kv_len // 128, limit) of its request,
    limit = min(max_position_embeddings // 128, index_topk): 4 at the kernel presets; one request sits at position
    700, 5 compressed positions behind it, past the limit). The input separates the
    order (separated in the test): over the cache as it came in, the closing rows' x_out falls outside that
    bound. Spec: §8 (upstream
    decode_attention_hca.py: the compressor runs before the sparse attention)."""
    from contracts.separation import separates_under
    from contracts.tolerances import BF16_STAGE_TOL, V4_STATE_POOL_TOL
    from kernels.v4.layer import hca_limit

    x, a, c = hca_stage_inputs(config, far=True)
    got = op(backend, "v4_hca_stage")(x, a, c, config=config)
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

    def outside(x_out, want):
        atol, rtol = BF16_STAGE_TOL
        return ((x_out - want).abs() > atol + rtol * want.abs()).reshape(x_out.shape[0], -1).any(1)

    limit = hca_limit(config)
    behind = int(_slots(config, a, c, 64)[FAR[0]].ge(0).sum())
    assert behind > limit, f"the vector does not pass the limit ({behind} compressed positions, limit {limit})"
    slots16 = _slots(config, a, c, limit)
    after = _attend(backend, config, x, a, c, pub["cmp_pool"], slots16)["x_out"]
    rows = (*CLOSING, *FAR)
    separates_under("the attention reads the compressed cache after the publication, at most `limit` compressed "
                    "positions", lambda y, want: not any(outside(y, want)[t] for t in rows), after,
                    attended_the_cache_as_it_came_in=_attend(backend, config, x, a, c, a["cmp_kv"], slots16)["x_out"],
                    no_limit=_attend(backend, config, x, a, c, pub["cmp_pool"], _slots(config, a, c, behind))["x_out"])
    bad = outside(got["x_out"], after).nonzero().flatten().tolist()
    why = " (it attended the cache as it came in)" if bad and bad[0] in CLOSING else \
        f" (it attended more than {limit} compressed positions)" if bad and bad[0] in FAR else ""
    assert not bad, f"x_out row {bad[0]} is outside {BF16_STAGE_TOL} of the attention over the published cache" \
                    f"{why} (§8)"


@pytest.mark.parametrize("request_", [0, 3], ids=["closing-request", "plain-request"])
@pytest.mark.operators("v4_hca_stage")
def test_a_request_moves_only_its_own_rows(backend, request_):
    """Changing one request's streams (request 0, which closes window 0; request 3, which closes nothing) moves
    its own x_out and qr rows, its own window-cache slots, its own state-pool rows (the ring pages of its table)
    and, for request 0, its own compressed row -- they do move -- and no other byte of any output. Request 3's
    first row writes window slot 0, an ordinary slot. Spec: §8."""
    config = MODELS[0]
    seq = config.decode_seq
    x, a, c = hca_stage_inputs(config, 2)
    ref = op(backend, "v4_hca_stage")(x, a, c, config=config)
    y = x.clone()
    rows = list(range(request_ * seq, (request_ + 1) * seq))
    y[rows] = y[rows] * -1.5
    got = op(backend, "v4_hca_stage")(y, a, c, config=config)
    hc_d = config.hc_mult * config.hidden_size
    assert _rows_moved(got["x_out"], ref["x_out"], hc_d) == rows, \
        f"x_out rows moved {_rows_moved(got['x_out'], ref['x_out'], hc_d)}, request {request_}'s are {rows}"
    assert set(_rows_moved(got["qr"], ref["qr"], config.q_lora_rank)) <= set(rows), "another request's qr moved"
    kv = [int(a["swa_slot_mapping"][t]) for t in rows]
    assert _rows_moved(_bits(got["kv_cache"]), _bits(ref["kv_cache"]), config.head_dim) == kv, \
        f"window-cache rows moved {_rows_moved(_bits(got['kv_cache']), _bits(ref['kv_cache']), config.head_dim)}; " \
        f"request {request_}'s slots are {kv}"
    page = c["state_pool"].shape[1]
    state = [int(c["state_block_table"][request_, int(a["position_ids"][t]) // page]) * page
             + int(a["position_ids"][t]) % page for t in rows]
    assert _rows_moved(got["state_pool"], ref["state_pool"], c["state_pool"].shape[2]) == sorted(state), \
        f"state rows moved {_rows_moved(got['state_pool'], ref['state_pool'], c['state_pool'].shape[2])}; request " \
        f"{request_}'s positions are at rows {sorted(state)}"
    cmp = [int(c["cmp_slot_mapping"][t]) for t in rows if int(c["cmp_slot_mapping"][t]) >= 0]
    assert _rows_moved(_bits(got["cmp_kv"]), _bits(ref["cmp_kv"]), config.head_dim) == cmp, \
        f"compressed rows moved {_rows_moved(_bits(got['cmp_kv']), _bits(ref['cmp_kv']), config.head_dim)}; " \
        f"request {request_} publishes {cmp}"


def _swa_attention(a):
    return {k: v for k, v in a.items() if k not in ("cmp_kv", "cmp_block_table")}


@pytest.mark.parametrize("layer_id", [1, 2, 3])
@pytest.mark.parametrize("path", ["SWA", "HCA"])
@pytest.mark.parametrize("config", MODELS, ids=lambda c: c.name)
@pytest.mark.operators("v4_decode_layer", "v4_attention_stage", "v4_hca_stage", "v4_moe_stage")
def test_the_decode_layer_is_its_stages_in_order(backend, config, path, layer_id):
    """x_out is the MoE stage over the attention stage's streams (every decode row real, routed as the given
    layer; the MoE stage over the layer's input differs), the caches the attention stage's -- chained here from the
    backend's own stages, bit for bit. Layers 1, 2 and 3 (compress ratios 128, 4, 128 at V4-Pro; 0, 4, 128 at
    V4-Flash): where a layer's ratio is the path's, upstream's layer golden that dispatches by layer id is the one
    judged. Spec: §8 (upstream decode_layer.py: golden_attention_* then golden_moe with num_tokens = T)."""
    x, a, c = hca_stage_inputs(config, 1)
    moe = decode_layer_moe(config, 1, layer_id=layer_id)
    if path == "SWA":
        a, c = _swa_attention(a), None
        att = op(backend, "v4_attention_stage")("SWA", x, **a, config=config)
    else:
        att = op(backend, "v4_hca_stage")(x, a, c, config=config)
    got = op(backend, "v4_decode_layer")(path, x, a, moe, c, config=config)
    want = op(backend, "v4_moe_stage")(att["x_out"], **moe, num_tokens=x.shape[0], config=config)["x_out"]
    assert not torch.equal(want, op(backend, "v4_moe_stage")(x, **moe, num_tokens=x.shape[0], config=config)["x_out"])
    assert got["x_out"].dtype == torch.float32 and torch.equal(got["x_out"], want), \
        f"{path}: x_out is not the MoE stage over the attention stage's streams (§8)"
    for key in ("kv_cache", "cmp_kv", "state_pool"):
        if key in att:
            assert torch.equal(_bits(got[key]), _bits(att[key])), f"{path}: {key} is not the attention stage's"


@pytest.mark.operators("v4_decode_layer", "v4_hca_stage")
def test_bad_layer_calls_are_refused_naming_the_field(backend):
    config = MODELS[0]
    x, a, c = hca_stage_inputs(config)
    moe = decode_layer_moe(config)
    layer, stage = op(backend, "v4_decode_layer"), op(backend, "v4_hca_stage")
    for path, attention, compressor, field in (("CSA", a, c, "path"), ("SWA", _swa_attention(a), c, "compressor"),
                                               ("HCA", a, None, "compressor"),
                                               ("HCA", _swa_attention(a), c, "attention"),
                                               ("HCA", {k: v for k, v in a.items() if k != "cmp_block_table"}, c,
                                                "attention"),
                                               ("HCA", dict(a, compressed=a["window_indices"]), c, "attention")):
        with pytest.raises(ContractInputError, match=field):
            layer(path, x, attention, moe, compressor, config=config)
    with pytest.raises(ContractInputError, match="moe"):
        layer("HCA", x, a, dict(moe, num_tokens=8), c, config=config)
    with pytest.raises(ContractInputError, match="kv_seq_lens"):
        stage(x, a, dict(c, kv_seq_lens=c["kv_seq_lens"][:-1]), config=config)
    with pytest.raises(ContractInputError, match="compressor"):
        stage(x, a, {k: v for k, v in c.items() if k != "weights"}, config=config)


@pytest.mark.whole_backend("a stage's calls counted on the backend's own operators")
@pytest.mark.operators("v4_decode_layer", "v4_hca_stage", "final_norm", "hc_mixes", "hc_pre", "hca_topk",
                        "v4_attention_stage", "v4_compress_and_publish", "v4_moe_stage")
def test_the_layer_and_the_stage_run_the_backends_operators(backend):
    """On a backend whose operators are wrapped to count, the HCA stage calls hc_mixes, hc_pre, final_norm,
    v4_compress_and_publish, hca_topk and v4_attention_stage once each, and the layer its attention stage (SWA:
    v4_attention_stage, HCA: v4_hca_stage) and v4_moe_stage once each: each is the backend's own. Spec: §8."""
    config = MODELS[0]
    x, a, c = hca_stage_inputs(config)
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
    derived = backend.derive("counting", **{n: counted(n) for n in ("v4_attention_stage", "v4_hca_stage",
                                                                    "v4_moe_stage")})
    for path, want in (("SWA", "v4_attention_stage"), ("HCA", "v4_hca_stage")):
        calls.clear()
        derived.get("v4_decode_layer")(path, x, _swa_attention(a) if path == "SWA" else a, moe,
                                       None if path == "SWA" else c, config=config)
        assert sorted(calls) == sorted([want, "v4_moe_stage"]), f"{path}: {calls}"


def _attend_before_publish(x_hc, attention, compressor, *, config, ops=None):
    """An HCA stage whose attention reads the compressed cache as it came in (the publication after it)."""
    from kernels.v4.layer import v4_hca_stage

    out = v4_hca_stage(x_hc, attention, compressor, config=config, ops=ops)
    stale = v4_hca_stage(x_hc, attention, dict(compressor, cmp_slot_mapping=torch.full_like(
        compressor["cmp_slot_mapping"], -1)), config=config, ops=ops)
    return {**out, "x_out": stale["x_out"]}


def _one_state_table(x_hc, attention, compressor, *, config, ops=None):
    """An HCA stage whose compressor reads every request's state through request 0's table row."""
    from kernels.v4.layer import v4_hca_stage

    table = compressor["state_block_table"]
    return v4_hca_stage(x_hc, attention, dict(compressor, state_block_table=table[:1].expand_as(table)),
                        config=config, ops=ops)


def _moe_on_the_input(path, x_hc, attention, moe, compressor=None, *, config, ops=None):
    """A decode layer whose MoE stage reads the layer's input streams instead of the attention stage's."""
    from kernels.v4.layer import v4_decode_layer
    from kernels.v4.moe import v4_moe_stage

    out = v4_decode_layer(path, x_hc, attention, moe, compressor, config=config, ops=ops)
    return {**out, "x_out": v4_moe_stage(x_hc, **moe, num_tokens=x_hc.shape[0], config=config)["x_out"]}


def _compress_unnormed(x_hc, attention, compressor, *, config, ops=None):
    """An HCA stage whose compressor reads the collapsed streams before the attention RMSNorm (the stage's first
    final_norm call, the compressor's row, returns its input)."""
    from kernels.reference.lm_head import final_norm
    from kernels.v4.layer import v4_hca_stage

    calls = []

    def norm(rows, w, *, config):
        calls.append(1)
        return rows if len(calls) == 1 else final_norm(rows, w, config=config)

    return v4_hca_stage(x_hc, attention, compressor, config=config, ops={"final_norm": norm})


def _no_hca_limit(x_hc, attention, compressor, *, config, ops=None):
    """An HCA stage whose top-k has no limit: every compressed position behind the token."""
    from kernels.v4 import layer

    original = layer.hca_limit
    layer.hca_limit = lambda config: 64
    try:
        return layer.v4_hca_stage(x_hc, attention, compressor, config=config, ops=ops)
    finally:
        layer.hca_limit = original


def _stage_with_its_own_operators(x_hc, attention, compressor, *, config, ops=None):
    """An HCA stage that ignores the backend's operators (the reference's own inside)."""
    from kernels.v4.layer import v4_hca_stage

    return v4_hca_stage(x_hc, attention, compressor, config=config)


SEEDED_DEFECTS = [
    SeededDefect("v4-layer:compress-unnormed", "v4_hca_stage", _compress_unnormed,
                 "test_the_hca_stage_is_its_operators_in_order", "cmp_kv is not the compressor's publication"),
    SeededDefect("v4-layer:no-hca-limit", "v4_hca_stage", _no_hca_limit,
                 "test_a_closing_token_attends_the_row_it_publishes", "more than 4 compressed positions"),
    SeededDefect("v4-layer:own-operators", "v4_hca_stage", _stage_with_its_own_operators,
                 "test_the_layer_and_the_stage_run_the_backends_operators", "not each of"),
    SeededDefect("v4-layer:attend-before-publish", "v4_hca_stage", _attend_before_publish,
                 "test_a_closing_token_attends_the_row_it_publishes", "attended the cache as it came in"),
    SeededDefect("v4-layer:one-state-table", "v4_hca_stage", _one_state_table,
                 "test_a_request_moves_only_its_own_rows", "state rows moved"),
    SeededDefect("v4-layer:moe-on-the-input", "v4_decode_layer", _moe_on_the_input,
                 "test_the_decode_layer_is_its_stages_in_order", "x_out is not the MoE stage"),
]
