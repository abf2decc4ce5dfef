"""The decode Block (``decode_block``): attention and the MoE FFN through mHC with the delayed pre-mix order --
the attention collapses with the incoming mix, the FFN with the attention's pre mix, and the Block hands on
the FFN's pre mix -- for the representative layer of every mode; every capacity row active; the compact
single-rank MoE; and Blocks chained the way the causal encoder chains them.

Spec: §1; upstream_checks HC-03, HC-04, HC-05, MO-14.
"""

from __future__ import annotations

import pytest
import torch

from backends import torch_backend
from contracts.block_inputs import TP, block_inputs
from contracts.checks.precision import check_output_budget, check_ratio_allclose
from contracts.half_layer_inputs import HalfLayerCase, build
from contracts.tolerances import HC_MIX_TOL, HC_OUT_TOL
from kernels.config import FLASH_TINY, LayerKind
from kernels.errors import ContractInputError
from kernels.reference.block import MhcWeights, moe_dense
from kernels.reference.mhc import identity_pre_mix
from pto_pytest.defect import shared
from pto_pytest.plugin import op

REF = torch_backend()
C = FLASH_TINY
HC, D = C.hc_mult, C.hidden_size


def run(fn, i: dict, kind: LayerKind, **kw) -> dict:
    return fn(i["x_hc"], i["incoming_pre_mix"], i["attention_inputs"], i["attention_mhc"], i["ffn_mhc"],
              i["router"], i["bias"], i["experts"], i["shared"], kind=kind, tp=TP, config=C, **kw)


@pytest.mark.whole_backend("a stage against its own parts, bit for bit")
@pytest.mark.parametrize("kind", list(LayerKind), ids=lambda k: k.value)
@pytest.mark.operators("decode_block", "hc_mixes", "hc_post", "hc_pre")
def test_the_block_runs_the_delayed_pre_mix_order(backend, kind):
    """attention_input == hc_pre(x_hc, incoming) exactly; ffn_input == hc_pre(attention_hidden, attention pre
    mix) exactly; the handed-on mix == hc_mixes(attention_hidden, FFN weights).pre exactly and differs from the
    incoming one; the output streams are finite FP32 of the input's shape. Spec: HC-03, HC-04."""
    i = block_inputs(kind)
    out = run(op(backend, "decode_block"), i, kind)
    pre, mixes = REF.get("hc_pre"), REF.get("hc_mixes")
    attn = mixes(i["x_hc"], i["attention_mhc"].function, i["attention_mhc"].scale, i["attention_mhc"].base, config=C)
    assert torch.equal(out["attention_input"], pre(i["x_hc"], i["incoming_pre_mix"])), \
        "the attention must collapse with the incoming mix"
    assert torch.equal(out["ffn_input"], pre(out["attention_hidden"], attn.pre)), \
        "the FFN must collapse with the attention's pre mix"
    ffn = mixes(out["attention_hidden"], i["ffn_mhc"].function, i["ffn_mhc"].scale, i["ffn_mhc"].base, config=C)
    assert torch.equal(out["next_pre_mix"], ffn.pre), "the Block must hand on the FFN's pre mix"
    assert out["ffn_output"].dtype == torch.bfloat16, "the MoE hands the FFN expansion BF16 rows"
    assert torch.equal(out["x_hc"], REF.get("hc_post")(out["ffn_output"], out["attention_hidden"], ffn.post,
                                                       ffn.residual)), "the FFN expansion uses the FFN's mixes"
    assert not torch.equal(attn.pre, i["incoming_pre_mix"])
    x = out["x_hc"]
    assert x.dtype == torch.float32 and x.shape == i["x_hc"].shape and bool(torch.isfinite(x).all())


@pytest.mark.operators("check_output_budget", "decode_block", "hc_mixes", "hc_pre")
def test_the_block_equals_the_reference(backend):
    """Every Block output of the C1A FULL representative layer against the reference: the two sublayer inputs
    and the handed-on mix from the backend's own intermediates exactly (HC-04), the streams and the attention
    hidden within the FP8 output budget (a backend with a device-arithmetic attention differs by rounding
    only), the handed-on mix within ratio_allclose(2.5e-5, 5e-3), and the mixed FFN input within (1e-4, 1/128)
    of the collapse of the backend's own attention hidden. Spec: HC-03, HC-04, MO-07."""
    kind = LayerKind.C1A_FULL
    i = block_inputs(kind, seed=3)
    got, want = run(op(backend, "decode_block"), i, kind), run(REF.get("decode_block"), i, kind)
    assert torch.equal(got["attention_input"], want["attention_input"])
    for name in ("x_hc", "attention_hidden"):
        r = check_output_budget(got[name], want[name], name=name)
        assert r.ok, r.message()
    r = check_ratio_allclose(got["next_pre_mix"], want["next_pre_mix"], atol=HC_MIX_TOL[0], rtol=HC_MIX_TOL[1])
    assert r.ok, r.message()
    # the MoE block's mixed input (x_mixed = the FFN input) within ratio_allclose(1e-4, 1/128) of the collapse of
    # the backend's own attention hidden (MO-07: the MoE block judged on its own input, as upstream replays it)
    attn = REF.get("hc_mixes")(i["x_hc"], i["attention_mhc"].function, i["attention_mhc"].scale,
                               i["attention_mhc"].base, config=C)
    mixed = REF.get("hc_pre")(got["attention_hidden"], attn.pre)
    r = check_ratio_allclose(got["ffn_input"].float(), mixed.float(), atol=HC_OUT_TOL[0], rtol=HC_OUT_TOL[1],
                             name="ffn_input")
    assert r.ok, r.message()


@pytest.mark.operators("decode_block")
def test_a_block_golden_needs_every_capacity_row_active(backend):
    """The C2A REUSE decode fixture with its inactive suffix is refused: a Block golden needs all capacity rows
    active. Spec: HC-05."""
    kind = LayerKind.C2A_REUSE
    i = block_inputs(kind)
    i["attention_inputs"] = build(HalfLayerCase(kind, "decode", "replicated", TP, seed=0))  # 2 inactive rows
    i["x_hc"] = torch.randn(i["attention_inputs"]["x"].shape[0], HC, D)
    i["incoming_pre_mix"] = torch.ones(i["x_hc"].shape[0], HC)
    with pytest.raises(ContractInputError, match="every capacity row active"):
        run(op(backend, "decode_block"), i, kind)


@pytest.mark.operators("decode_block", "hc_pre")
def test_blocks_chain_their_mixes_like_the_causal_encoder(backend):
    """Two Blocks (SWA then C2A FULL): the second's incoming mix is the first's next_pre_mix, and the first
    starts from the one-hot lane-0 mix; changing the first Block's FFN weights changes what the second
    collapses with. Spec: HC-03, HC-06, HC-12 (the chain rule)."""
    first, second = block_inputs(LayerKind.SWA, seed=5), block_inputs(LayerKind.C2A_FULL, seed=6)
    first["incoming_pre_mix"] = identity_pre_mix(first["x_hc"])
    block = op(backend, "decode_block")
    a = run(block, first, LayerKind.SWA)
    second["x_hc"], second["incoming_pre_mix"] = a["x_hc"], a["next_pre_mix"]
    b = run(block, second, LayerKind.C2A_FULL)
    assert torch.equal(a["attention_input"], REF.get("hc_pre")(first["x_hc"], identity_pre_mix(first["x_hc"])))
    assert torch.equal(b["attention_input"], REF.get("hc_pre")(a["x_hc"], a["next_pre_mix"]))
    first["ffn_mhc"] = MhcWeights(first["ffn_mhc"].function, first["ffn_mhc"].scale * 2, first["ffn_mhc"].base)
    a2 = run(block, first, LayerKind.SWA)
    assert not torch.equal(a2["next_pre_mix"], a["next_pre_mix"])


@pytest.mark.operators("moe_ep", "moe_gate")
def test_the_compact_moe_is_the_ep_moe_on_one_rank(backend):
    """The Block's single-rank MoE fixture equals moe_ep with every row on its ranks (EP2, 6 rows each) bit for
    bit: the fixture changes the transport, never the arithmetic. Spec: MO-14, MO-09."""
    i = block_inputs(LayerKind.SWA, seed=9)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(12, D, generator=g).to(torch.bfloat16)
    dense = moe_dense(x, i["router"], i["bias"], i["experts"], i["shared"], config=C)
    gates = [REF.get("moe_gate")(x[r * 6:(r + 1) * 6], i["router"], i["bias"], config=C) for r in range(2)]
    ep = op(backend, "moe_ep")([x[:6], x[6:]], gates, i["experts"], i["shared"], ep=2, num_tokens=6, config=C)
    assert torch.equal(torch.cat(ep.outputs), dense)


def _counting(backend, *names):
    """A backend whose ``names`` operators record each call, with the attention as a plain function (a device
    binding: no ``composes_operators``, no ``ops``)."""
    calls = []

    def counted(name):
        inner = op(backend, name)  # a backend without it: the test skips, naming it

        def fn(*a, **kw):
            calls.append(name)
            return inner(*a, **kw)
        return fn

    attention = op(backend, "attention_half_layer")

    def plain_attention(inputs, *, kind, phase, wiring, tp, config):
        return attention(inputs, kind=kind, phase=phase, wiring=wiring, tp=tp, config=config)

    return backend.derive("counting", attention_half_layer=plain_attention,
                          **{n: counted(n) for n in names}), calls


@pytest.mark.operators("attention_half_layer", "decode_block", "hc_mixes", "hc_pre", "moe_gate")
def test_the_block_composes_the_backends_own_operators_and_refuses_bf16_streams(backend):
    """A Block on a backend runs that backend's mHC operators (a counting wrapper sees the calls) and works with
    an attention that is a plain function (a device binding, not a composition); BF16 streams are refused
    (the ABI's streams are FP32). Spec: HC-02, HC-03."""
    derived, calls = _counting(backend, "hc_pre", "hc_mixes", "moe_gate")
    kind = LayerKind.SWA
    i = block_inputs(kind, seed=4)
    out = run(op(derived, "decode_block"), i, kind)
    assert calls.count("hc_pre") == 2 and calls.count("hc_mixes") == 2 and calls.count("moe_gate") == 1, calls
    assert torch.equal(out["x_hc"], run(op(backend, "decode_block"), i, kind)["x_hc"])
    i["x_hc"] = i["x_hc"].to(torch.bfloat16)
    with pytest.raises(ContractInputError, match="x_hc"):
        run(op(backend, "decode_block"), i, kind)


CHAIN_KINDS = (LayerKind.SWA, LayerKind.C2A_FULL, LayerKind.C2A_REUSE)


def _chain_case(seed: int = 0):
    base = block_inputs(LayerKind.SWA, seed)
    layer_inputs = {k: block_inputs(k, seed)["attention_inputs"] for k in CHAIN_KINDS}
    weights = (base["attention_mhc"], base["ffn_mhc"], base["router"], base["bias"], base["experts"], base["shared"])
    return base["x_hc"], layer_inputs, weights


@pytest.mark.operators("attention_half_layer", "causal_encoder", "decode_block")
def test_the_causal_encoder_chains_twenty_blocks_and_reuse_layers_read_their_source(backend):
    """Layers 0..19 of the schedule (SWA 0-1, C2A FULL 2/8/14, REUSE elsewhere) chained: layer 0 starts from
    the one-hot mix, each layer takes the previous next_pre_mix, and a REUSE layer reads the compressed cache and
    Top-K its own source published in this run (3-7 from 2, 9-13 from 8, 15-19 from 14). The chain equals an
    independent composition of decode_block calls (the sources' caches re-derived with attention_half_layer on
    each FULL layer's attention input) bit for bit; the three sources publish different caches, so reading the
    wrong one shows. Spec: HC-12, HC-05."""
    x_hc, layer_inputs, weights = _chain_case()
    chain = op(backend, "causal_encoder")(x_hc, layer_inputs, *weights, tp=TP, config=C)
    want_sources = [-1, -1, -1] + [2] * 5 + [-1] + [8] * 5 + [-1] + [14] * 5
    assert chain["reused_from"].tolist() == want_sources and chain["reused_from"].dtype == torch.int32, \
        chain["reused_from"].tolist()
    block, attention = op(backend, "decode_block"), op(backend, "attention_half_layer")
    x, mix, published = x_hc, identity_pre_mix(x_hc), {}
    for layer in range(20):
        kind = C.schedule[layer].kind
        inputs = dict(layer_inputs[kind])
        if kind is LayerKind.C2A_REUSE:
            inputs.update(published[C.schedule[layer].kv_source])
        res = block(x, mix, inputs, *weights, kind=kind, tp=TP, config=C)
        if kind is LayerKind.C2A_FULL:
            out = attention({**inputs, "x": res["attention_input"]}, kind=kind, phase="decode",
                            wiring="replicated", tp=TP, config=C)
            published[layer] = {n: out[n] for n in ("compressed_payload", "compressed_scale", "topk_indices")}
        assert torch.equal(chain["layer_x_hc"][layer], res["x_hc"]), f"layer {layer}: x_hc differs"
        assert torch.equal(chain["layer_pre_mix"][layer], res["next_pre_mix"]), f"layer {layer}: pre mix differs"
        x, mix = res["x_hc"], res["next_pre_mix"]
    assert torch.equal(chain["x_hc"], x) and torch.equal(chain["next_pre_mix"], mix)
    for a, b in ((2, 8), (8, 14)):
        assert not torch.equal(published[a]["compressed_payload"], published[b]["compressed_payload"]), \
            f"sources {a} and {b} publish the same cache: the case cannot tell them apart"


@pytest.mark.operators("causal_encoder")
def test_a_causal_encoder_prefix_is_the_chain_so_far_and_bad_calls_are_refused(backend):
    """layers=k runs the first k Blocks (the same rows as the full chain's first k); 0 or 21 layers, and a
    chain whose rows are not all active (HC-05), are refused naming the field. Spec: HC-05, HC-12."""
    x_hc, layer_inputs, weights = _chain_case(1)
    enc = op(backend, "causal_encoder")
    four = enc(x_hc, layer_inputs, *weights, tp=TP, config=C, layers=4)
    two = enc(x_hc, layer_inputs, *weights, tp=TP, config=C, layers=2)
    assert torch.equal(four["layer_x_hc"][:2], two["layer_x_hc"]) and four["reused_from"].tolist() == [-1, -1, -1, 2]
    for bad in (0, 21, True):
        with pytest.raises(ContractInputError, match="layers"):
            enc(x_hc, layer_inputs, *weights, tp=TP, config=C, layers=bad)
    inactive = {k: {**v, "num_tokens": v["num_tokens"] - 1} for k, v in layer_inputs.items()}
    with pytest.raises(ContractInputError, match="every capacity row active"):
        enc(x_hc, inactive, *weights, tp=TP, config=C, layers=1)


def _to_slabs(rows: torch.Tensor, tp: int, active: int) -> torch.Tensor:
    """The first ``active`` of ``rows`` (a capacity of rows.shape[0]) as owner slabs."""
    from kernels.sequence_parallel import sp_bounds

    bounds = sp_bounds(active, tp, rows.shape[0])
    out = torch.zeros((tp, bounds[0].width, *rows.shape[1:]), dtype=rows.dtype)
    for b in bounds:
        out[b.rank, :b.count] = rows[b.first:b.first + b.count]
    return out


def _rows(slabs: torch.Tensor, active: int) -> torch.Tensor:
    tp, width = slabs.shape[:2]
    return torch.cat([slabs[r, :max(0, min(width, active - r * width))] for r in range(tp)])


SP_CASES = [(LayerKind.SWA, (1,), (29,)), (LayerKind.SWA, (1, 2), (29, 40)), (LayerKind.C2A_FULL, (1, 2, 4), (29, 40, 9)),
            (LayerKind.C1A_FULL, (2, 3), (29, 9))]


@pytest.mark.parametrize("kind, qlens, kvs", SP_CASES, ids=[f"{k.value}-T{sum(q)}" for k, q, _ in SP_CASES])
@pytest.mark.operators("decode_block_sharded", "hc_mixes", "hc_post", "hc_pre", "sp_bounds")
def test_two_sharded_blocks_hand_off_owner_slabs_and_match_dense_mhc(backend, kind, qlens, kvs):
    """Tokens 1, 3, 7 and 5 over TP4 owner slabs (width ceil(T/4), short and empty slabs included), two Blocks
    in a row, the second consuming the first's output slabs as they are: on every layer the collapsed
    attention input holds the batch's rows in order (layer 1) and every mHC step equals dense mHC on the gathered
    rows bit for bit (the collapse, the FFN pre mix handed on, the FFN expansion); the attention's all-gathered
    input is the gathered collapse; every padding row of every output slab is exactly zero; token order is
    kept. Spec: MD-27, SP-14, SP-07."""
    tp = 4
    i = block_inputs(kind, 3, batch=(qlens, kvs), wiring="sharded", tp=tp)
    tokens = sum(qlens)
    capacity = i["x_hc"].shape[0]
    weights = (i["attention_mhc"], i["ffn_mhc"], i["router"], i["bias"], i["experts"], i["shared"])
    sharded = op(backend, "decode_block_sharded")
    hc_mixes, hc_pre, hc_post = op(backend, "hc_mixes"), op(backend, "hc_pre"), op(backend, "hc_post")
    x, mix = _to_slabs(i["x_hc"], tp, tokens), _to_slabs(i["incoming_pre_mix"], tp, tokens)
    assert x.shape[1] == -(-capacity // tp)
    for layer in (1, 2):
        out = sharded(x, mix, i["attention_inputs"], *weights, kind=kind, tp=tp, config=C)
        dense_x, dense_mix = _rows(x, tokens), _rows(mix, tokens)
        collapse = hc_pre(dense_x, dense_mix)
        assert torch.equal(_rows(out["attention_input"], tokens), collapse), f"layer {layer}: collapse"
        assert torch.equal(out["gathered"][:tokens], collapse), f"layer {layer}: the all-gathered input"
        if layer == 1:
            assert torch.equal(collapse, hc_pre(i["x_hc"][:tokens], i["incoming_pre_mix"][:tokens])), \
                "layer 1: the slabs do not hold the batch's rows in order"
        hidden = _rows(out["attention_hidden"], tokens)
        ffn = hc_mixes(hidden, i["ffn_mhc"].function, i["ffn_mhc"].scale, i["ffn_mhc"].base, config=C)
        assert torch.equal(_rows(out["next_pre_mix"], tokens), ffn.pre), f"layer {layer}: next pre mix"
        want_x = hc_post(_rows(out["ffn_output"], tokens), hidden, ffn.post, ffn.residual)
        assert torch.equal(_rows(out["x_hc"], tokens), want_x), f"layer {layer}: FFN expansion"
        dtypes = {"x_hc": torch.float32, "next_pre_mix": torch.float32, "attention_input": torch.bfloat16,
                  "ffn_input": torch.bfloat16, "attention_hidden": torch.float32, "ffn_output": torch.bfloat16}
        for name in dtypes:
            assert out[name].dtype == dtypes[name], f"{name} is {out[name].dtype}"
            pad = out[name].clone()
            for r in range(tp):
                pad[r, :max(0, min(pad.shape[1], tokens - r * pad.shape[1]))] = 0
            assert not bool(pad.flatten().ne(0).any()), f"layer {layer}: {name} has a non-zero padding row"
        x, mix = out["x_hc"], out["next_pre_mix"]


@pytest.mark.operators("decode_block_sharded", "sp_bounds")
def test_a_sharded_block_refuses_dirty_padding_and_wrong_slabs(backend):
    """A non-zero padding row of the incoming x_hc or pre-mix slabs is refused naming rank and row; slabs of
    the wrong width and BF16 streams are refused. Spec: MD-27."""
    tp = 4
    i = block_inputs(LayerKind.SWA, 4, batch=((1, 2), (29, 40)), wiring="sharded", tp=tp)
    weights = (i["attention_mhc"], i["ffn_mhc"], i["router"], i["bias"], i["experts"], i["shared"])
    x, mix = _to_slabs(i["x_hc"], tp, 3), _to_slabs(i["incoming_pre_mix"], tp, 3)
    sharded = op(backend, "decode_block_sharded")
    dirty = x.clone()
    dirty[3, 0, 1, 5] = 1e-9  # rank 3 owns no row of 3 tokens over width 1
    with pytest.raises(ContractInputError, match=r"x_hc\[3\]\[0\]: expected 0 \(a padding row"):
        sharded(dirty, mix, i["attention_inputs"], *weights, kind=LayerKind.SWA, tp=tp, config=C)
    dirty_mix = mix.clone()
    dirty_mix[3, 0, 0] = 0.5
    with pytest.raises(ContractInputError, match=r"incoming_pre_mix\[3\]\[0\]"):
        sharded(x, dirty_mix, i["attention_inputs"], *weights, kind=LayerKind.SWA, tp=tp, config=C)
    with pytest.raises(ContractInputError, match="owner slabs"):
        sharded(x[:, :0], mix[:, :0], i["attention_inputs"], *weights, kind=LayerKind.SWA, tp=tp, config=C)
    with pytest.raises(ContractInputError, match="owner slabs"):
        sharded(x.to(torch.bfloat16), mix, i["attention_inputs"], *weights, kind=LayerKind.SWA, tp=tp, config=C)


@pytest.mark.operators("attention_half_layer", "causal_encoder", "decode_block_sharded", "hc_mixes", "hc_pre",
                        "sp_bounds")
def test_the_chain_and_the_sharded_block_compose_the_backends_own_operators(backend):
    """causal_encoder and decode_block_sharded run the backend's own mHC / MoE operators (a counting wrapper
    sees every call: 2 collapses and 2 mix sets per Block, one per rank holding rows in the sharded wiring) and
    work with an attention that is a plain function. Spec: HC-03, HC-12, MD-27."""
    derived, calls = _counting(backend, "hc_pre", "hc_mixes")
    x_hc, layer_inputs, weights = _chain_case(2)
    op(derived, "causal_encoder")(x_hc, layer_inputs, *weights, tp=TP, config=C, layers=3)
    assert calls.count("hc_pre") == 6 and calls.count("hc_mixes") == 6, calls
    calls.clear()
    tp = 4
    i = block_inputs(LayerKind.SWA, 3, batch=((1, 2), (29, 40)), wiring="sharded", tp=tp)
    w = (i["attention_mhc"], i["ffn_mhc"], i["router"], i["bias"], i["experts"], i["shared"])
    out = op(derived, "decode_block_sharded")(_to_slabs(i["x_hc"], tp, 3), _to_slabs(i["incoming_pre_mix"], tp, 3),
                                             i["attention_inputs"], *w, kind=LayerKind.SWA, tp=tp, config=C)
    assert calls.count("hc_pre") == 2 * 3 and calls.count("hc_mixes") == 2 * 3, calls  # 3 ranks hold a row
    ref = op(backend, "decode_block_sharded")(_to_slabs(i["x_hc"], tp, 3), _to_slabs(i["incoming_pre_mix"], tp, 3),
                                              i["attention_inputs"], *w, kind=LayerKind.SWA, tp=tp, config=C)
    assert torch.equal(out["x_hc"], ref["x_hc"])


@pytest.mark.operators("decode_block", "moe_expert", "moe_gate")
def test_the_blocks_moe_sums_shared_then_routed_in_slot_order(backend):
    """The Block's MoE judged on its own input (the backend's ffn_input), with experts built so the summation
    order shows: a zero router (equal route weights), a bias that puts experts 0..5 in slots 0..5, shared W1/W3,
    slot 0's W2 +2^50 (ones), slot 1's -2^50, slot 2's O(1). In slot order the shared output is absorbed by slot
    0 and slot 1 cancels it exactly, leaving slot 2's output; reversed, slot 2's is absorbed and the row is 0 --
    a difference far past MO-06's budget. The expected rows are computed here from moe_gate and moe_expert, not
    from the Block's own MoE. Spec: MO-09, MO-14."""
    from contracts.checks.moe import check_moe_rows
    from contracts.separation import running_sum, separates
    from kernels.reference.moe import ExpertWeights

    kind = LayerKind.SWA
    i = block_inputs(kind, seed=5)
    g = torch.Generator().manual_seed(22)
    e, d, inter = C.n_routed_experts, C.hidden_size, C.moe_intermediate_size
    w1, w3 = torch.randn(inter, d, generator=g) / d**0.5, torch.randn(inter, d, generator=g) / d**0.5
    big = torch.ones(d, inter) * 2.0**50
    w2s = [big, -big, torch.randn(d, inter, generator=g)] + [torch.zeros(d, inter)] * (e - 3)
    experts = [ExpertWeights(w1.bfloat16().float(), w3.bfloat16().float(), w2) for w2 in w2s]
    shared = ExpertWeights(w1.bfloat16().float(), w3.bfloat16().float(), torch.randn(d, inter, generator=g))
    router, bias = torch.zeros(e, d), torch.arange(e, 0, -1, dtype=torch.float32)
    i = dict(i, router=router, bias=bias, experts=experts, shared=shared)
    got = run(op(backend, "decode_block"), i, kind)
    x = got["ffn_input"]
    weights, ids = REF.get("moe_gate")(x, router, bias, config=C)
    s = REF.get("moe_expert")(x, shared, None, config=C)
    r = [REF.get("moe_expert")(x, experts[int(ids[0, j])], weights[:, j], config=C) for j in range(ids.shape[1])]

    want = separates("the Block's MoE: shared, then routed in slot order, one BF16 cast", running_sum(r, s).bfloat16(),
                     reversed_slots=running_sum(r[::-1], s).bfloat16(),
                     routed_before_shared=running_sum([*r[1:], s], r[0]).bfloat16())
    result = check_moe_rows(got["ffn_output"].to(torch.bfloat16), want, x.shape[0], name="ffn_output")
    assert result.ok, result.message()


# defects of tests/defects these contracts must catch (shared with other contract files)
SEEDED_DEFECTS = [
    shared("block:NEXT_MIX_FROM_ATTENTION", "test_the_block_runs_the_delayed_pre_mix_order", "hand on the FFN's pre mix"),
    shared("block:ATTENTION_WITH_OWN_MIX", "test_the_block_runs_the_delayed_pre_mix_order", "collapse with the incoming mix"),
    shared("block:PADDING_MIX", "test_two_sharded_blocks_hand_off_owner_slabs_and_match_dense_mhc", "next_pre_mix has a non-zero padding row"),
    shared("block:REUSE_FIRST_SOURCE", "test_the_causal_encoder_chains_twenty_blocks_and_reuse_layers_read_their_source", "layer 9"),
    shared("block:ACCEPTS_INACTIVE", "test_a_block_golden_needs_every_capacity_row_active", "DID NOT RAISE"),
]
