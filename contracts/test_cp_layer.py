"""V4-Flash's context-parallel prefill of a whole layer (``prefill_cp_layer``): the layer's CP attention sublayer,
chosen by its compress ratio, then the MoE stage on every tile. Judged as its parts in order with the backend's own
operators (SWA at layer 0, CSA at 2, HCA at 3: the layers of upstream's fixture), and the SWA layer against the
unsplit packed prefill layer. Spec: §7.1, §8."""

from __future__ import annotations

import pytest
import torch

from contracts.compare import COMPARATORS, Context
from contracts.v4_inputs import cp_unsplit_window, mtp_layer_inputs
from kernels.config import V4_FLASH_TINY
from kernels.errors import ContractInputError
from kernels.v4 import cp_csa, cp_hca
from kernels.v4.cp_hca import PLAN_NAMES
from kernels.v4.cp_swa import TAIL_NAMES, WEIGHT_NAMES
from pto_pytest.defect import SeededDefect
from pto_pytest.plugin import op

C = V4_FLASH_TINY
R = C.sliding_window
KIND = {0: "prefill_cp_swa", 2: "prefill_cp_csa", 3: "prefill_cp_hca"}  # upstream's SWA / CSA / HCA layer ids
LAYOUTS = {"equal segments": (2, R, 4 * R, 0), "zigzag, short last": (2, R, 2 * R + 10, 5)}


def layer_inputs(layer_id: int, layout: str, seed: int = 7) -> dict:
    """The layer's inputs: the CP sublayer's chunk (``kernels.v4.cp_csa`` / ``cp_hca`` inputs for its kind; SWA's
    are CP HCA's without the compressor) and ``mtp_layer_inputs``' MoE stage, each query row's token id drawn
    from the stage's vocabulary (0 on rows without a query)."""
    cp, span, n, prefix = LAYOUTS[layout]
    build = cp_csa.chunk_inputs if KIND[layer_id] == "prefill_cp_csa" else cp_hca.chunk_inputs
    i = build(C, seed, cp=cp, span=span, num_tokens=n, prefix=prefix)
    moe = dict(mtp_layer_inputs(C, seed)["moe"])
    del moe["num_tokens"]
    g = torch.Generator().manual_seed(seed + 5)
    ids = torch.randint(0, moe["tid2eid"].shape[0], i["query_position_ids"].shape, generator=g)
    moe["input_ids"] = torch.where(i["query_token_to_request"] >= 0, ids, 0)
    names = {"prefill_cp_csa": cp_csa.COMPRESSOR_NAMES, "prefill_cp_hca": cp_hca.COMPRESSOR_NAMES}
    i["compressor"] = {k: i[k] for k in names[KIND[layer_id]]} if KIND[layer_id] in names else None
    i["moe"] = moe
    return i


def _call(backend, i, layer_id, **kw):
    return op(backend, "prefill_cp_layer")(i["x_hc"], *(i[k] for k in WEIGHT_NAMES), i["kv_cache"],
                                           *(i[k] for k in TAIL_NAMES), i["moe"], i["compressor"],
                                           {k: i[k] for k in PLAN_NAMES}, layer_id=layer_id, config=C, **kw)


def _staging(backend) -> dict:
    rule = backend.variants.get("prefill_cp_csa", {}).get("query_staging", "bf16")
    return {"query_staging": rule} if rule != "bf16" else {}


def _parts(backend, i, layer_id, staging: dict | None = None):
    """The layer spelled out with the backend's own operators: the sublayer (CSA: under ``staging``, default the
    backend's query rule), then the MoE stage tile by tile."""
    args = (i["x_hc"], *(i[k] for k in WEIGHT_NAMES), i["kv_cache"], *(i[k] for k in TAIL_NAMES))
    plan = {k: i[k] for k in PLAN_NAMES}
    kind = KIND[layer_id]
    if kind == "prefill_cp_swa":
        att = op(backend, "prefill_cp_swa")(*args, plan, config=C)
    elif kind == "prefill_cp_hca":
        att = op(backend, "prefill_cp_hca")(*args, i["compressor"], plan, config=C)
    else:
        att = op(backend, "prefill_cp_csa")(*args, i["compressor"], plan, config=C,
                                            **(_staging(backend) if staging is None else staging))
    active = i["overlay_active_lengths"][..., 1]
    x_next = torch.zeros_like(i["x_hc"])
    for rank, part, tile in (active > 0).nonzero().tolist():
        n = int(active[rank, part, tile])
        out = op(backend, "v4_moe_stage")(att["x_out"][rank, part, tile],
                                          **{**i["moe"], "input_ids": i["moe"]["input_ids"][rank, part, tile]},
                                          layer_id=layer_id, num_tokens=n, config=C)
        x_next[rank, part, tile, :n] = out["x_out"][:n]
    return {"x_next": x_next, **{k: v for k, v in att.items() if k != "x_out"}}


JUDGES = {"x_next": "v4_cp_x_out", "kv_cache": "v4_cp_kv_cache", "cmp_kv": "v4_cmp_pool", "state_pool": "v4_state_pool",
          "inner_state_pool": "v4_state_pool", "idx_kv_cache": "exact", "idx_kv_scale": "exact"}


@pytest.mark.operators("prefill_cp_layer", "prefill_cp_swa", "prefill_cp_hca", "prefill_cp_csa", "v4_moe_stage")
@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("layer_id", sorted(KIND))
def test_the_cp_layer_is_its_sublayer_then_the_moe_stage_per_tile(backend, layer_id, layout):
    """Layer 0 (SWA), 2 (CSA) and 3 (HCA): every output of the layer equals its parts in order with the backend's
    own operators -- the CP sublayer of the layer's kind, then v4_moe_stage on each tile's query rows with their
    token ids (layers 0 and 2 route by hash, 3 by score), rows without a query 0 -- within the comparators the
    sublayers' records name (x_next by the CP output's). Equal segments (upstream's fixture: every rank's wave of
    one size) and a zigzag with a short last segment."""
    i = layer_inputs(layer_id, layout)
    got = _call(backend, i, layer_id, **(_staging(backend) if layer_id == 2 else {}))
    want = _parts(backend, i, layer_id)
    assert set(got) == set(want), f"layer {layer_id}: outputs {sorted(got)}, its parts give {sorted(want)}"
    ctx = Context(inputs={**i, **i["compressor"]} if i["compressor"] else i, actual_outputs=got,
                  expected_outputs=want, params={})
    for name in want:
        verdict = COMPARATORS[JUDGES[name]](name, got[name], want[name], ctx)
        assert verdict.ok, f"layer {layer_id}, {layout}: {name} is not its parts' ({JUDGES[name]}): {verdict}"
    empty = i["query_token_to_request"] < 0
    assert not bool(got["x_next"][empty].any()), f"layer {layer_id}: x_next rows without a query are not 0"


@pytest.mark.operators("prefill_cp_csa", "prefill_cp_hca", "prefill_cp_layer", "prefill_cp_swa", "v4_moe_stage")
def test_the_csa_layer_hands_its_query_rule_to_the_sublayer(backend):
    """At the CSA layer (2) each named query rule the backend can take gives the layer's parts under that rule
    (x_next within the CP output's comparator), and the two rules give other x_next; an SWA or HCA layer, which
    has no indexer, refuses a rule named for it."""
    i = layer_inputs(2, "equal segments")
    named = backend.variants.get("prefill_cp_csa", {}).get("query_staging")
    rules = [named] if named else ["bf16", "rope-bf16"]
    got = {}
    for rule in rules:
        got[rule] = _call(backend, i, 2, query_staging=rule)["x_next"]
        want = _parts(backend, i, 2, {"query_staging": rule} if rule != "bf16" else {})["x_next"]
        verdict = COMPARATORS["v4_cp_x_out"]("x_next", got[rule], want,
                                            Context(inputs=i, actual_outputs={}, expected_outputs={}, params={}))
        assert verdict.ok, f"query_staging={rule!r}: the layer's x_next is not its parts' under that rule: {verdict}"
    if len(got) == 2:
        assert not torch.equal(got["bf16"], got["rope-bf16"]), "the query rule does not reach the CSA sublayer"
    j = layer_inputs(3, "equal segments")
    with pytest.raises(ContractInputError) as exc:
        _call(backend, j, 3, query_staging="rope-bf16")
    assert exc.value.field == "query_staging", f"an HCA layer took a query rule: refused naming {exc.value.field!r}"


@pytest.mark.operators("prefill_cp_layer", "v4_prefill_layer")
def test_the_cp_swa_layer_is_the_unsplit_packed_layer(backend):
    """The SWA layer (0) split over two ranks (equal segments: upstream's layer golden takes it) gives every query
    row the unsplit packed prefill layer's x_next at its position (one request, the whole chunk of 512, one tile of
    the chunk's length), within the CP output's comparator."""
    cp, span, n, prefix = LAYOUTS["equal segments"]
    i = layer_inputs(0, "equal segments")
    got = _call(backend, i, 0)
    cache, pos, pages = cp_unsplit_window(i, n, prefix, C)
    real = i["query_token_to_request"] >= 0
    ids = torch.zeros(n, dtype=torch.int64)
    ids[(i["query_position_ids"][real] - prefix).long()] = i["moe"]["input_ids"][real]
    attention = {**{k: i[k] for k in WEIGHT_NAMES}, **{k: i[k] for k in TAIL_NAMES}, "kv_cache": cache,
                 "swa_slot_mapping": pos.long(), "position_ids": pos,
                 "block_tables": torch.arange(pages, dtype=torch.int32)[None]}
    whole = op(backend, "v4_prefill_layer")(i["x_all"][prefix:], torch.tensor([n]), torch.tensor([0]), attention,
                                            {**i["moe"], "input_ids": ids}, layer_id=0, tile=n, config=C)
    want = torch.zeros_like(got["x_next"])
    want[real] = whole["x_next"][(i["query_position_ids"][real] - prefix).long()]
    verdict = COMPARATORS["v4_cp_x_out"]("x_next", got["x_next"], want,
                                        Context(inputs=i, actual_outputs=got, expected_outputs={}, params={}))
    chain = getattr(backend, "deviations", {}).get("fp32-layer-chain")
    if not verdict.ok and chain:  # two whole-layer goldens' FP32 orders through the MoE stage's INT8 requantization
        pytest.xfail(f"x_next {verdict}; the attention sublayer against the unsplit stage is judged by "
                     f"test_cp_swa.py on this backend; named deviation fp32-layer-chain: {chain}")
    assert verdict.ok, f"the CP SWA layer's x_next is not the unsplit packed layer's: {verdict}"


@pytest.mark.operators("prefill_cp_layer")
@pytest.mark.parametrize("case, field", [("layer 43", "layer_id"), ("layer 1.0", "layer_id"),
                                         ("ids of another shape", "moe.input_ids"), ("ids float", "moe.input_ids"),
                                         ("num_tokens given", "moe"), ("no compressor at an HCA layer", "compressor")])
def test_a_malformed_cp_layer_call_is_refused_naming_its_field(backend, case, field):
    """The layer's own arguments: a layer past the main layers (43 is the MTP layer) or not an int, token ids not
    one per query row, the MoE stage handed what the layer gives it, an HCA layer without its compressor."""
    layer = 3 if case == "no compressor at an HCA layer" else 0
    i = layer_inputs(layer, "zigzag, short last")
    moe, layer_id = dict(i["moe"]), {"layer 43": 43, "layer 1.0": 1.0}.get(case, layer)
    if case == "ids of another shape":
        moe["input_ids"] = moe["input_ids"][:, :, 0]
    elif case == "ids float":
        moe["input_ids"] = moe["input_ids"].float()
    elif case == "num_tokens given":
        moe["num_tokens"] = 4
    elif case == "no compressor at an HCA layer":
        i["compressor"] = None
    with pytest.raises(ContractInputError) as exc:
        _call(backend, {**i, "moe": moe}, layer_id)
    assert exc.value.field == field, f"{case}: refused naming {exc.value.field!r}, not {field!r}: {exc.value}"


# --- seeded defects ------------------------------------------------------------------------------------------

def _with_sublayer(args, layer_id, config, ops, kw, wrap):
    """prefill_cp_layer with its sublayer (whichever kind the layer is) replaced by ``wrap(sublayer)``."""
    from kernels.v4 import cp_csa, cp_hca, cp_layer, cp_swa

    subs = {"prefill_cp_swa": cp_swa.prefill_cp_swa, "prefill_cp_hca": cp_hca.prefill_cp_hca,
            "prefill_cp_csa": cp_csa.prefill_cp_csa}
    over = {name: wrap(fn) for name, fn in subs.items()}
    return cp_layer.prefill_cp_layer(*args, layer_id=layer_id, config=config, ops={**(ops or {}), **over}, **kw)


def _moe_on_the_input(*args, layer_id, config, ops=None, **kw):
    """The MoE stage fed the layer's input streams instead of the sublayer's output."""
    def wrap(fn):
        return lambda *a, **k: {**fn(*a, **k), "x_out": a[0]}

    return _with_sublayer(args, layer_id, config, ops, kw, wrap)


def _swa_for_every_layer(*args, layer_id, config, ops=None, **kw):
    """Every layer's attention is the SWA sublayer: a compressed layer's compressors and compressed keys never
    run (its pools come back as they came in)."""
    from kernels.v4.cp_swa import prefill_cp_swa

    def wrap(fn):
        def as_swa(*a, config, **k):
            out = dict(prefill_cp_swa(*a[:18], a[-1], config=config))
            if len(a) == 20:
                out.update({n: a[18][n] for n in ("cmp_kv", "state_pool", "inner_state_pool", "idx_kv_cache",
                                                  "idx_kv_scale") if n in a[18]})
            return out
        return as_swa

    return _with_sublayer(args, layer_id, config, ops, kw, wrap)


def _rank_zeros_ids(*args, layer_id, config, ops=None, **kw):
    """Every rank's tiles routed with rank 0's token ids (a hash layer's experts chosen for other tokens)."""
    from kernels.v4 import cp_layer

    moe = dict(args[18])
    moe["input_ids"] = moe["input_ids"][:1].expand_as(moe["input_ids"]).contiguous()
    return cp_layer.prefill_cp_layer(*args[:18], moe, *args[19:], layer_id=layer_id, config=config, ops=ops, **kw)


SEEDED_DEFECTS = [
    SeededDefect("cp-layer:moe-on-the-input", "prefill_cp_layer", _moe_on_the_input,
                 "test_the_cp_layer_is_its_sublayer_then_the_moe_stage_per_tile", "x_next"),
    SeededDefect("cp-layer:swa-for-every-layer", "prefill_cp_layer", _swa_for_every_layer,
                 "test_the_cp_layer_is_its_sublayer_then_the_moe_stage_per_tile", "is not its parts'"),
    SeededDefect("cp-layer:rank-zeros-ids", "prefill_cp_layer", _rank_zeros_ids,
                 "test_the_cp_layer_is_its_sublayer_then_the_moe_stage_per_tile", "x_next"),
]
