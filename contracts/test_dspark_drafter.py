"""dspark's whole drafter step (``dspark_drafter``): the target rows projected, each request's last row written as
context KV in every draft layer's cache, the query block (anchor id, then noise ids) looked up into the hc streams,
three draft layers (mixes, norm, the drafter attention over the window and the block, the MoE stage), and the head
collapse. Judged three ways: as its parts in order with the backend's own operators and the block's metadata worked
out here from its rule; at upstream's fixture weights (zero mixes, identity projections, zero attention and expert
outputs) against a closed form evaluated here in FP64, which is the domain upstream's golden takes; and by
metamorphic probes (what a request sees, that requests do not meet). Spec: §8."""

from __future__ import annotations

import pytest
import torch

from contracts.compare import COMPARATORS, Context
from contracts.separation import bf16_clear_of_midpoints
from contracts.v4_inputs import moe_inputs, v4_expert_weights
from kernels.config import V4_FLASH_TINY
from kernels.errors import ContractInputError
from kernels.v4.dspark_attention import block_call
from kernels.v4.dspark_drafter import ATTENTION_NAMES, QUERY_WIDTH, drafter_plan
from kernels.v4.moe import V4ExpertWeights
from pto_pytest.defect import SeededDefect, reference_edit
from pto_pytest.plugin import op

C = V4_FLASH_TINY
W = QUERY_WIDTH
VOCAB, NOISE = 40, 39  # a small vocabulary; the noise id is its last (upstream's 128799 at the real vocabulary)
ANCHORS = (3, 127, 200)  # a window clamped at 0; a block on the next page; a full window across two pages
LAYER_IDS = (40, 41, 42)  # upstream's draft layers: scored routing
BLOCKS = 8  # each layer's cache: 8 pages, 6 of them mapped
JUDGES = {"head_hidden": "hc_out", "initial_hidden": "exact", "intermediate_hidden": "fp32_ulps",
          "kv_caches": "v4_kv_pool"}


def drafter_inputs(seed: int = 0, *, anchors=ANCHORS, fixture: bool = False) -> dict:
    """A drafter step at the tiny Flash geometry: one request per anchor, 2 target rows each, every layer's pages a
    random permutation of 8 (two mapped per request), unit-RMS cache rows, RoPE over 512 positions. ``fixture``:
    upstream's fixture weights (zero hc functions and bases, the identity projection of the first D target
    columns, identity wkv, unit norm weights, cos 1 / sin 0, zero attention and expert weights)."""
    g = torch.Generator().manual_seed(seed)
    d, hc, hd = C.hidden_size, C.hc_mult, C.head_dim
    batch, depth, page = len(anchors), len(LAYER_IDS), C.block_size
    mix = (2 + hc) * hc
    tables = torch.stack([torch.randperm(BLOCKS, generator=g)[:2 * batch].reshape(batch, 2)
                          for _ in range(depth)]).to(torch.int32)
    pos = torch.tensor(anchors, dtype=torch.int32)
    context_slots = torch.stack([tables[layer, torch.arange(batch), pos.long() // page].long() * page + pos % page
                                 for layer in range(depth)])
    cache = torch.randn(depth, BLOCKS, page, 1, hd, generator=g)
    cache = (cache / cache.pow(2).mean(-1, keepdim=True).sqrt()).to(torch.bfloat16)
    angle = torch.arange(512, dtype=torch.float32)[:, None] * torch.rand(C.qk_rope_head_dim, generator=g) * 0.5
    i = {"target_hidden": (torch.randn(batch * C.decode_seq, 3 * d, generator=g) * 0.5).to(torch.bfloat16),
         "main_proj_w": (torch.randn(d, 3 * d, generator=g) / (3 * d) ** 0.5).to(torch.bfloat16),
         "main_norm_w": (torch.rand(d, generator=g) + 0.5).to(torch.bfloat16),
         "anchor_token_ids": torch.randint(0, NOISE, (batch,), generator=g),
         "anchor_positions": pos, "embedding_weight": (torch.randn(VOCAB, d, generator=g) * 0.1).to(torch.bfloat16),
         "context_position_ids": pos.clone(), "context_slot_mapping": context_slots, "block_tables": tables,
         "kv_caches": cache, "freqs_cos": torch.cos(angle).to(torch.bfloat16),
         "freqs_sin": torch.sin(angle).to(torch.bfloat16),
         "hc_head_fn": torch.randn(hc, hc * d, generator=g) * 0.05, "hc_head_scale": torch.tensor([0.5]),
         "hc_head_base": torch.randn(hc, generator=g)}
    layers = []
    for index, layer_id in enumerate(LAYER_IDS):
        w = block_call(seed + index, C, starts=(3,), seq=1)
        m = moe_inputs(C, seed + index, num_tokens=1)
        layers.append({
            "attention": {"hc_fn": torch.randn(mix, hc * d, generator=g) * 0.05,
                          "hc_scale": torch.tensor([2.0, 0.02, 0.25]), "hc_base": torch.randn(mix, generator=g),
                          "attn_norm_w": (torch.rand(d, generator=g) + 0.5).to(torch.bfloat16),
                          **{k: w[k] for k in ATTENTION_NAMES if k in w},
                          "attn_sink": torch.randn(C.num_attention_heads, generator=g) * 0.5},
            "moe": {"hc_fn": torch.randn(mix, hc * d, generator=g) * 0.05,
                    "hc_scale": torch.tensor([2.0, 0.02, 0.25]), "hc_base": torch.randn(mix, generator=g),
                    "norm_w": m["norm_w"], "gate_w": m["gate_w"], "gate_bias": m["gate_bias"], "layer_id": layer_id,
                    "tid2eid": torch.stack([torch.randperm(C.n_routed_experts, generator=g)[:C.num_experts_per_tok]
                                            for _ in range(VOCAB)]).to(torch.int32),
                    "routed": [v4_expert_weights(C, g) for _ in range(C.n_routed_experts)],
                    "shared": v4_expert_weights(C, g)}})
    i["layers"] = layers
    return upstream_fixture(i) if fixture else i


def upstream_fixture(i: dict) -> dict:
    """``i`` with upstream's fixture weights (golden_dspark_drafter's domain): the inputs, tables and cache kept."""
    d, hd = C.hidden_size, C.head_dim

    def zero(t):
        return torch.zeros_like(t)

    def zero_expert(e: V4ExpertWeights) -> V4ExpertWeights:
        return V4ExpertWeights(*(zero(getattr(e, f)) for f in ("w1", "w1_scale", "w3", "w3_scale", "w2", "w2_scale")))

    proj = torch.zeros(d, 3 * d, dtype=torch.bfloat16)
    proj[:, :d] = torch.eye(d)
    wkv = torch.zeros(d, hd, dtype=torch.bfloat16)
    wkv[:hd, :hd] = torch.eye(hd)
    layers = []
    for layer in i["layers"]:
        a, m = layer["attention"], layer["moe"]
        a = {**{k: zero(v) for k, v in a.items()}, "hc_scale": a["hc_scale"], "wkv": wkv.clone(),
             "attn_norm_w": torch.ones(d, dtype=torch.bfloat16), "gamma_ckv": torch.ones(hd, dtype=torch.bfloat16),
             "gamma_cq": torch.ones_like(a["gamma_cq"])}
        m = {**m, "hc_fn": zero(m["hc_fn"]), "hc_base": zero(m["hc_base"]), "norm_w": torch.ones_like(m["norm_w"]),
             "gate_w": zero(m["gate_w"]), "gate_bias": zero(m["gate_bias"]),
             "routed": [zero_expert(e) for e in m["routed"]], "shared": zero_expert(m["shared"])}
        layers.append({"attention": a, "moe": m})
    return {**i, "main_proj_w": proj, "main_norm_w": torch.ones(d, dtype=torch.bfloat16),
            "freqs_cos": torch.ones_like(i["freqs_cos"]), "freqs_sin": zero(i["freqs_sin"]), "layers": layers,
            "hc_head_fn": zero(i["hc_head_fn"]), "hc_head_base": zero(i["hc_head_base"])}


def reaching_eps(i: dict) -> dict:
    """``i`` with rows small enough that the RMSNorms' eps (1e-6 on the mean square) moves them: request 0's target
    rows at RMS ~5e-7 and request 1's at ~5e-4 (main_x and the context KV feel the eps), and request 0's anchor
    embedding row at ~1e-7 (its pre-mixed, normed and KV rows feel it); the anchor ids made distinct."""
    rows = i["target_hidden"].shape[0] // i["anchor_token_ids"].shape[0]
    target = i["target_hidden"].float().clone()
    target[:rows] *= 1e-6
    target[rows:2 * rows] *= 1e-3
    ids = torch.arange(i["anchor_token_ids"].shape[0]) * 7 + 2
    table = i["embedding_weight"].float().clone()
    table[int(ids[0])] *= 1e-6
    return {**i, "target_hidden": target.to(torch.bfloat16), "anchor_token_ids": ids,
            "embedding_weight": table.to(torch.bfloat16)}


def _call(backend, i, **kw):
    return op(backend, "dspark_drafter")(**i, config=C, noise_token_id=NOISE, **kw)


def block_rule(i: dict) -> dict:
    """The block's metadata from the rule, position by position: row (b, o) at anchor_b + 1 + o; request b's list the
    positions max(anchor_b + 1 - window, 0) .. anchor_b + W, each slot table[layer, b, p // page] · page + p % page,
    -1 past its count, 64-column aligned."""
    page, win = C.block_size, C.sliding_window
    depth, batch = i["block_tables"].shape[:2]
    width = (win + W + 63) // 64 * 64

    def slot(layer, b, p):
        return int(i["block_tables"][layer, b, p // page]) * page + p % page

    positions, slots = [], [[] for _ in range(depth)]
    lists = torch.full((depth, batch, width), -1, dtype=torch.int32)
    lens = torch.zeros(depth, batch, dtype=torch.int32)
    for b in range(batch):
        anchor = int(i["anchor_positions"][b])
        for o in range(W):
            positions.append(anchor + 1 + o)
            for layer in range(depth):
                slots[layer].append(slot(layer, b, anchor + 1 + o))
        for layer in range(depth):
            seen = [slot(layer, b, p) for p in range(max(anchor + 1 - win, 0), anchor + 1 + W)]
            lists[layer, b, :len(seen)] = torch.tensor(seen, dtype=torch.int32)
            lens[layer, b] = len(seen)
    ids = []
    for b in range(batch):
        ids += [int(i["anchor_token_ids"][b])] + [NOISE] * (W - 1)
    return {"positions": torch.tensor(positions, dtype=torch.int32), "slots": torch.tensor(slots),
            "lists": lists, "lens": lens, "ids": torch.tensor(ids)}


def _parts(backend, i: dict, probabilities: str = "bf16") -> dict:
    """The step spelled out with the backend's own operators over the metadata of ``block_rule``."""
    rule = block_rule(i)
    rows = i["target_hidden"].shape[0] // i["anchor_token_ids"].shape[0]
    main_x = op(backend, "dspark_proj")(i["target_hidden"], i["main_proj_w"], i["main_norm_w"], config=C)
    context = torch.stack([main_x[(b + 1) * rows - 1] for b in range(i["anchor_token_ids"].shape[0])])
    caches = [op(backend, "dspark_context_kv")(context, layer["attention"]["wkv"], layer["attention"]["gamma_ckv"],
                                               i["freqs_cos"], i["freqs_sin"], i["context_position_ids"],
                                               i["context_slot_mapping"][index], i["kv_caches"][index], config=C)
              for index, layer in enumerate(i["layers"])]
    looked = op(backend, "lookup_embedding")(rule["ids"], i["embedding_weight"], config=C)
    hidden = torch.stack([looked.float()] * C.hc_mult, dim=1)
    initial, intermediate = hidden, []
    for index, layer in enumerate(i["layers"]):
        a, m = layer["attention"], layer["moe"]
        mixed = op(backend, "hc_pre_fused")(hidden, a["hc_fn"], a["hc_scale"], a["hc_base"], config=C)
        normed = op(backend, "final_norm")(mixed["x_mixed"], a["attn_norm_w"], config=C)
        att = op(backend, "dspark_attention")(
            normed, *(a[k] for k in ("wq_a", "wq_b", "wq_b_scale", "wkv", "gamma_cq", "gamma_ckv")), i["freqs_cos"],
            i["freqs_sin"], rule["positions"], caches[index], rule["slots"][index], rule["lists"][index],
            rule["lens"][index], a["attn_sink"], a["wo_a"], a["wo_b"], a["wo_b_scale"], config=C,
            **({"probabilities": probabilities} if probabilities != "bf16" else {}))
        caches[index] = att["kv_cache"]
        t = hidden.shape[0]
        hidden = op(backend, "hc_post")(att["x_out"], hidden, mixed["post"], mixed["comb"].reshape(t, C.hc_mult, -1))
        hidden = op(backend, "v4_moe_stage")(hidden, **{k: v for k, v in m.items() if k != "layer_id"},
                                             layer_id=m["layer_id"], num_tokens=t, input_ids=rule["ids"],
                                             config=C)["x_out"]
        intermediate.append(hidden)
    head = op(backend, "hc_head_fused")(hidden, i["hc_head_fn"], i["hc_head_scale"], i["hc_head_base"], config=C)["y"]
    return {"head_hidden": head.reshape(-1, W, C.hidden_size), "initial_hidden": initial,
            "intermediate_hidden": torch.stack(intermediate), "kv_caches": torch.stack(caches)}


def _judge(i, got, want, what):
    assert set(got) == set(want), f"{what}: outputs {sorted(got)}, expected {sorted(want)}"
    ctx = Context(inputs=i, actual_outputs=got, expected_outputs=want, params={})
    for name in want:
        assert got[name].shape == want[name].shape and got[name].dtype == want[name].dtype, \
            f"{what}: {name} {got[name].dtype}{list(got[name].shape)}, expected " \
            f"{want[name].dtype}{list(want[name].shape)}"
        verdict = COMPARATORS[JUDGES[name]](name, got[name], want[name], ctx)
        assert verdict.ok, f"{what}: {name} ({JUDGES[name]}): {verdict}"


@pytest.mark.operators("dspark_drafter", "dspark_proj", "dspark_context_kv", "lookup_embedding", "hc_pre_fused",
                       "final_norm", "dspark_attention", "hc_post", "v4_moe_stage", "hc_head_fused")
@pytest.mark.parametrize("anchors", [ANCHORS, (130, 0)], ids=["three requests", "anchor at 0"])
def test_the_drafter_is_its_parts_in_order(backend, anchors):
    """Every output of the step equals its parts in order with the backend's own operators, the block's metadata
    worked out here from the rule (positions anchor + 1 .. anchor + 7, slots through each layer's table, the list
    = window then block): within the comparators of the parts' records (the last streams by fp32_ulps, the head by
    hc_out, the caches by the window pool's bound with every other row byte for byte). Three requests (a window
    clamped at 0, a block crossing onto the next page, a full window over two pages), and an anchor at position 0."""
    i = drafter_inputs(1, anchors=anchors)
    _judge(i, _call(backend, i), _parts(backend, i), f"anchors {anchors}")


# --- upstream's fixture: the closed form ------------------------------------------------------------------------

def _rms64(x: torch.Tensor) -> torch.Tensor:
    return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + C.rms_norm_eps)


def closed_form(i: dict) -> dict:
    """What the step gives at upstream's fixture weights, in FP64 from the spec: every mix function 0, so pre =
    sigmoid(0) + eps, post = 2·sigmoid(0) = 1 and the residual mix the Sinkhorn of softmax(0) + eps -- every entry
    one value c; attention and experts give 0, so each hc_post maps equal streams h to h·4c. Hence streams
    e·(4c)^(2l+2) after draft layer l (e the row's embedding), the head 4·(1/2 + eps)·e·(4c)^6 -> BF16, the
    context KV the RMSNorm of the RMSNorm of the request's last target row (its first D columns), the block's KV in
    layer l the RMSNorm of the RMSNorm of the pre-mixed streams, each rounded to BF16."""
    eps, hc = C.hc_eps, C.hc_mult
    x = torch.full((hc, hc), 0.25 + eps, dtype=torch.float64)
    x = x / (x.sum(0, keepdim=True) + eps)
    for _ in range(C.hc_sinkhorn_iters - 1):
        x = x / (x.sum(1, keepdim=True) + eps)
        x = x / (x.sum(0, keepdim=True) + eps)
    gain = float(x[:, 0].sum())  # 4c: every column of the residual mix sums to this
    pre = 1 / (1 + torch.exp(torch.tensor(0.0, dtype=torch.float64))) + eps
    rule = block_rule(i)
    e = i["embedding_weight"][rule["ids"]].double()
    rows = i["target_hidden"].shape[0] // i["anchor_token_ids"].shape[0]
    d, hd = C.hidden_size, C.head_dim
    main_x = bf16_clear_of_midpoints(_rms64(i["target_hidden"][rows - 1::rows, :d].double()), "main_x")
    context_kv = bf16_clear_of_midpoints(_rms64(main_x[:, :hd].double()), "the context KV")
    caches = i["kv_caches"].clone()
    streams = []
    h = e
    for layer in range(len(i["layers"])):
        mixed = bf16_clear_of_midpoints(hc * pre * h, f"layer {layer}'s pre-mixed rows")
        normed = bf16_clear_of_midpoints(_rms64(mixed.double()), f"layer {layer}'s normed rows")
        kv = bf16_clear_of_midpoints(_rms64(normed[:, :hd].double()), f"layer {layer}'s block KV")
        flat = caches[layer].view(-1, hd)
        flat[i["context_slot_mapping"][layer].long()] = context_kv
        flat[rule["slots"][layer]] = kv
        h = h * gain ** 2
        streams.append(h)
    head = bf16_clear_of_midpoints(hc * pre * h, "the head")
    return {"head_hidden": head.reshape(-1, W, d), "streams": torch.stack(streams), "embedding": e,
            "kv_caches": caches, "gain": gain}


@pytest.mark.operators("dspark_drafter")
@pytest.mark.parametrize("seed", [0, 5])
def test_at_upstreams_fixture_the_drafter_is_its_closed_form(backend, seed):
    """At upstream's fixture weights (golden_dspark_drafter's domain) every output is the closed form evaluated here
    in FP64 (``closed_form``): initial_hidden every stream the block's embedding row (anchor id first, then noise)
    bit for bit; each layer's streams e·(4c)^(2l+2) within 2^-19 relative, and each layer's own factor (4c)^2 on
    its input streams within 2^-21 (FP32 mixes and posts against FP64; a skipped post is off by 1e-6; a
    lane, row or layer out of place is off by the rows' differences); head_hidden the BF16 of 4·(1/2 + eps)·
    e·(4c)^6 bit for bit; every cache the context KV at the context slots and the block's KV at its slots, bit for
    bit, and every other row as it came in."""
    i = reaching_eps(drafter_inputs(seed, fixture=True))
    got = _call(backend, i)
    want = closed_form(i)
    n = want["embedding"].shape[0]
    initial = got["initial_hidden"]
    assert tuple(initial.shape) == (n, C.hc_mult, C.hidden_size) and initial.dtype == torch.float32, \
        f"initial_hidden {initial.dtype}{list(initial.shape)}, expected float32[{n}, {C.hc_mult}, {C.hidden_size}]"
    for lane in range(C.hc_mult):
        off = (initial[:, lane].double() != want["embedding"]).any(-1)
        assert not bool(off.any()), f"initial_hidden row {int(off.nonzero()[0])} stream {lane} is not its token's " \
                                    "embedding row (anchor id, then noise ids)"
    streams = got["intermediate_hidden"].double()
    assert streams.shape == (len(i["layers"]), n, C.hc_mult, C.hidden_size), \
        f"intermediate_hidden {list(streams.shape)}"
    before = initial.double()
    for layer in range(streams.shape[0]):
        expect = want["streams"][layer][:, None, :].expand(-1, C.hc_mult, -1)
        rel = (streams[layer] - expect).abs() / expect.abs().clamp_min(1e-30)
        step = (streams[layer] / before - want["gain"] ** 2).abs()  # the layer's own factor (4c)^2
        step = torch.where(expect != 0, step, torch.zeros_like(step))
        for what, dev, bound in (("its closed form", rel, 2**-19), ("the layer's factor (4c)^2 on its input", step,
                                                                      2**-21)):
            bad = dev > bound
            if bool(bad.any()):
                t, lane, col = (int(v) for v in bad.nonzero()[0])
                raise AssertionError(f"intermediate_hidden[{layer}][{t}, {lane}, {col}] = "
                                     f"{float(streams[layer][t, lane, col])}: off {what} by "
                                     f"{float(dev[t, lane, col]):.3g} (> {bound:.3g}; closed form "
                                     f"{float(expect[t, lane, col])})")
        before = streams[layer]
    head = got["head_hidden"]
    assert head.dtype == torch.bfloat16 and head.shape == want["head_hidden"].shape, \
        f"head_hidden {head.dtype}{list(head.shape)}, expected bfloat16{list(want['head_hidden'].shape)}"
    off = head.view(torch.int16) != want["head_hidden"].view(torch.int16)
    if bool(off.any()):
        b, o, col = (int(v) for v in off.nonzero()[0])
        raise AssertionError(f"head_hidden[{b}, {o}, {col}] = {float(head[b, o, col])}, closed form "
                             f"{float(want['head_hidden'][b, o, col])}")
    caches = got["kv_caches"]
    assert caches.shape == i["kv_caches"].shape, f"kv_caches {list(caches.shape)}"
    hd = C.head_dim
    for layer in range(caches.shape[0]):
        a, e = caches[layer].reshape(-1, hd).view(torch.int16), want["kv_caches"][layer].reshape(-1, hd).view(torch.int16)
        rows = (a != e).any(-1)
        if bool(rows.any()):
            r = int(rows.nonzero()[0])
            kind = ("a context row" if r in i["context_slot_mapping"][layer].tolist() else
                    "a block row" if r in block_rule(i)["slots"][layer].tolist() else "a row nothing writes")
            raise AssertionError(f"kv_caches[{layer}] row {r} ({kind}) is not the closed form's")


# --- metamorphic probes ---------------------------------------------------------------------------------------

@pytest.mark.operators("dspark_drafter")
def test_a_request_reads_its_window_and_nothing_before(backend):
    """The request at anchor 200 sees positions 73 .. 207: changing its cache row at 72 (just before its window) in
    every layer leaves every output as it was, bit for bit; changing its row at 73 (the window's first) changes that
    request's head rows and nothing of the other requests'."""
    i = drafter_inputs(2)
    base = _call(backend, i)
    page, b = C.block_size, ANCHORS.index(200)
    start = 200 + 1 - C.sliding_window

    def poked(position):
        caches = i["kv_caches"].clone()
        for layer in range(caches.shape[0]):
            slot = int(i["block_tables"][layer, b, position // page]) * page + position % page
            caches[layer].view(-1, C.head_dim)[slot] = -caches[layer].view(-1, C.head_dim)[slot] * 3
        return _call(backend, {**i, "kv_caches": caches})

    before = poked(start - 1)
    for name in ("head_hidden", "intermediate_hidden"):
        assert torch.equal(before[name], base[name]), \
            f"{name} moved when the row at position {start - 1}, before request {b}'s window, changed"
    inside = poked(start)
    moved = (inside["head_hidden"] != base["head_hidden"]).flatten(1).any(1)
    assert moved.tolist() == [r == b for r in range(len(ANCHORS))], \
        f"changing request {b}'s window row at {start} moved the head rows of requests {moved.nonzero().flatten().tolist()}"


@pytest.mark.operators("dspark_drafter")
def test_requests_do_not_meet(backend):
    """Reversing the requests (their ids, anchors, context rows and slots, tables and target rows) reverses every
    output row for row, bit for bit: no request reads another's rows, ids or pages."""
    i = drafter_inputs(4)
    batch, rows = len(ANCHORS), C.decode_seq
    order = torch.arange(batch).flip(0)
    target = i["target_hidden"].reshape(batch, rows, -1)[order].reshape(batch * rows, -1)
    j = {**i, "target_hidden": target, "anchor_token_ids": i["anchor_token_ids"][order],
         "anchor_positions": i["anchor_positions"][order], "context_position_ids": i["context_position_ids"][order],
         "context_slot_mapping": i["context_slot_mapping"][:, order], "block_tables": i["block_tables"][:, order]}
    a, b = _call(backend, i), _call(backend, j)
    assert torch.equal(b["kv_caches"], a["kv_caches"]), "the caches differ when the requests come in reverse order"
    assert torch.equal(b["head_hidden"], a["head_hidden"][order]), "head_hidden rows are not the requests' reversed"
    rows_of = torch.arange(batch * W).reshape(batch, W)[order].reshape(-1)
    assert torch.equal(b["intermediate_hidden"], a["intermediate_hidden"][:, rows_of]), \
        "intermediate_hidden rows are not the requests' blocks reversed"


@pytest.mark.operators("dspark_drafter")
@pytest.mark.parametrize("case, field", [
    ("target rows not a multiple of the requests", "target_hidden"),
    ("a block past the table", "anchor_positions"),
    ("an unmapped page in a window", "block_tables"),
    ("context slots of another layer count", "context_slot_mapping"),
    ("a layer without its MoE", "layers[1].moe"),
    ("caches of another layer count", "kv_caches"),
    ("float anchor ids", "anchor_token_ids"),
])
def test_a_malformed_drafter_call_is_refused_naming_its_field(backend, case, field):
    """The drafter's own arguments, each refused naming the field (the composed operators refuse theirs)."""
    i = drafter_inputs(5)
    if case == "target rows not a multiple of the requests":
        i["target_hidden"] = i["target_hidden"][:-1]
    elif case == "a block past the table":
        i["anchor_positions"] = torch.tensor([3, 127, 2 * C.block_size - 3], dtype=torch.int32)
    elif case == "an unmapped page in a window":
        i["block_tables"] = i["block_tables"].clone()
        i["block_tables"][2, 2, 0] = -1
    elif case == "context slots of another layer count":
        i["context_slot_mapping"] = i["context_slot_mapping"][:2]
    elif case == "a layer without its MoE":
        i["layers"] = [i["layers"][0], {"attention": i["layers"][1]["attention"]}, i["layers"][2]]
    elif case == "caches of another layer count":
        i["kv_caches"] = i["kv_caches"][:2]
    elif case == "float anchor ids":
        i["anchor_token_ids"] = i["anchor_token_ids"].float()
    with pytest.raises(ContractInputError) as exc:
        _call(backend, i)
    assert exc.value.field == field, f"{case}: refused naming {exc.value.field!r}, not {field!r}: {exc.value}"


def _one_request(anchor: int, pages: int, page: int = C.block_size, rows: int = 1, seed: int = 6) -> dict:
    """One request at ``anchor`` with ``rows`` target rows, each layer's table ``pages`` wide (page p -> block p) over
    a cache of ``pages`` blocks of ``page`` rows, the context slot at the anchor."""
    i = drafter_inputs(seed, anchors=(3,))
    i["anchor_positions"] = torch.tensor([anchor], dtype=torch.int32)
    i["context_position_ids"] = i["anchor_positions"].clone()
    depth, hd = len(LAYER_IDS), C.head_dim
    i["target_hidden"] = i["target_hidden"][:1].repeat(rows, 1)
    i["block_tables"] = torch.arange(pages, dtype=torch.int32).repeat(depth, 1, 1)
    i["kv_caches"] = (torch.randn(depth, pages, page, 1, hd, generator=torch.Generator().manual_seed(seed))
                      .to(torch.bfloat16))
    i["context_slot_mapping"] = torch.full((depth, 1), anchor, dtype=torch.int64)
    return i


def _refused(backend, i, field, index=None, **kw):
    with pytest.raises(ContractInputError) as exc:
        _call(backend, i, **kw)
    assert exc.value.field == field, f"refused naming {exc.value.field!r}, not {field!r}: {exc.value}"
    if index is not None:
        assert exc.value.index == index, f"{field}: refused at {exc.value.index}, not {index}: {exc.value}"
    return exc.value


@pytest.mark.operators("dspark_drafter")
def test_the_drafters_edges_are_taken_or_refused_exactly(backend):
    """Each bound of the call at its edge, taken on one side and refused on the other: one request with one target
    row; a table one page wide; the block's last position at the RoPE table's last row (taken) and one past it
    (refused); a window that opens on a page's first row (the page before it unmapped: taken) and one row earlier
    (refused at that page), and a later window page unmapped (refused naming it); a page unmapped just past the block (taken: nothing reads it); a page id at the cache's
    block count (refused); pages of one row (the window's page 0 unmapped: refused); noise id 0 (taken) and -1; no
    layers; no target rows; a table of another request count; anchor positions of another length; a negative
    anchor."""
    page, top = C.block_size, 512
    i = _one_request(3, pages=1)
    assert _call(backend, i)["head_hidden"].shape == (1, W, C.hidden_size), "one request, one target row"
    last = _one_request(top - 1 - W, pages=top // page)
    _call(backend, last)
    _refused(backend, _one_request(top - W, pages=top // page + 1), "anchor_positions", (0,))
    opens = _one_request(2 * page - 1, pages=4)  # window 128 .. 255, block 256 .. 262; page 3 unmapped
    opens["block_tables"][:, :, 0] = -1
    opens["block_tables"][:, :, 3] = -1
    _call(backend, opens)
    early = _one_request(2 * page - 2, pages=3)  # window 127 .. 254: page 0 read
    early["block_tables"][1, 0, 0] = -1
    _refused(backend, early, "block_tables", (1, 0, 0))
    later = _one_request(300, pages=3)  # window 173 .. 300, block 301 .. 307: pages 1 and 2 read
    later["block_tables"][0, 0, 2] = -1
    _refused(backend, later, "block_tables", (0, 0, 2))
    beyond = _one_request(3, pages=2)
    beyond["block_tables"][2, 0, 0] = 2  # the cache holds blocks 0 and 1
    _refused(backend, beyond, "block_tables", (2, 0, 0))
    ones = _one_request(3, pages=12, page=1)  # positions 0 .. 10, a page each
    ones["block_tables"][0, 0, 0] = -1
    _refused(backend, ones, "block_tables", (0, 0, 0))
    with pytest.raises(ContractInputError) as exc:
        op(backend, "dspark_drafter")(**i, config=C, noise_token_id=-1)
    assert exc.value.field == "noise_token_id", f"noise id -1 refused naming {exc.value.field!r}"
    taken = op(backend, "dspark_drafter")(**i, config=C, noise_token_id=0)
    assert taken["initial_hidden"].shape[0] == W, "noise id 0 (an id of the vocabulary) was not taken"
    _refused(backend, {**i, "layers": []}, "layers")
    _refused(backend, {**i, "target_hidden": i["target_hidden"][:0]}, "target_hidden")
    _refused(backend, {**i, "block_tables": i["block_tables"].repeat(1, 2, 1)}, "block_tables")
    _refused(backend, {**i, "anchor_positions": torch.tensor([3, 4], dtype=torch.int32)}, "anchor_positions")
    _refused(backend, {**i, "anchor_positions": torch.tensor([-1], dtype=torch.int32)}, "anchor_positions", (0,))
    _refused(backend, {**i, "anchor_token_ids": torch.zeros(0, dtype=torch.int64)}, "anchor_token_ids")


@pytest.mark.operators("dspark_drafter")
def test_the_noise_id_is_upstreams_by_default(backend):
    """Without ``noise_token_id`` the block's six draft rows look up id 128799 (upstream's DSPARK_NOISE_TOKEN_ID): a
    40-row vocabulary refuses the call naming the block's first draft row and that id."""
    i = drafter_inputs(7)
    with pytest.raises(ContractInputError) as exc:
        op(backend, "dspark_drafter")(**i, config=C)
    assert exc.value.field == "input_ids" and exc.value.index == (1,) and exc.value.actual == 128799, \
        f"the default noise id: refused {exc.value}, expected input_ids[1] = 128799"


@pytest.mark.operators("dspark_drafter", "dspark_attention", "dspark_proj", "dspark_context_kv", "lookup_embedding",
                       "hc_pre_fused", "final_norm", "hc_post", "v4_moe_stage", "hc_head_fused")
def test_the_drafter_hands_its_probability_rule_to_the_attention(backend):
    """Each named probability rule of the drafter attention the backend takes gives the drafter's parts under that
    rule (the attention called with it); the two rules give other head rows."""
    i = drafter_inputs(8)
    named = backend.variants.get("dspark_attention", {}).get("probabilities")
    rules = [named] if named else ["bf16", "fp32"]
    heads = {}
    for rule in rules:
        got = _call(backend, i, probabilities=rule)
        want = _parts(backend, i, probabilities=rule)
        _judge(i, got, want, f"probabilities={rule!r}")
        heads[rule] = got["head_hidden"]
    if len(heads) == 2:
        assert not torch.equal(heads["bf16"], heads["fp32"]), "the probability rule does not reach the attention"


# --- seeded defects ------------------------------------------------------------------------------------------

def _drafter(**over):
    """dspark_drafter compiled again with some of its module's helpers re-bound (pto_pytest.defect.reference_edit)."""
    fn = reference_edit("kernels.v4.dspark_drafter:dspark_drafter", "def dspark_drafter(", "def dspark_drafter(")
    fn.__globals__.update(over)
    return fn


def _noise_first(anchor_token_ids, noise_token_id=128799):
    ids = torch.full((anchor_token_ids.shape[0], W), noise_token_id, dtype=torch.int64)
    ids[:, -1] = anchor_token_ids.to(torch.int64)
    return ids.reshape(-1)


def _plan_window_one_long(anchor_positions, block_tables, *, window, page):
    return drafter_plan(anchor_positions, block_tables, window=window + 1, page=page)


def _plan_positions_at_anchor(anchor_positions, block_tables, *, window, page):
    return drafter_plan(anchor_positions - 1, block_tables, window=window, page=page)


def _context_first_row(*args, **kw):
    """The context row is each request's first target row, not its last."""
    target = args[0] if args else kw.pop("target_hidden")
    rows = target.shape[0] // (args[3] if len(args) > 3 else kw["anchor_token_ids"]).shape[0]
    swapped = target.reshape(-1, rows, target.shape[1]).flip(1).reshape(target.shape)
    return _drafter()(swapped, *args[1:], **kw)


SEEDED_DEFECTS = [
    SeededDefect("dspark-drafter:noise-first", "dspark_drafter", _drafter(query_ids=_noise_first),
                 "test_at_upstreams_fixture_the_drafter_is_its_closed_form", "initial_hidden"),
    SeededDefect("dspark-drafter:window-one-long", "dspark_drafter", _drafter(drafter_plan=_plan_window_one_long),
                 "test_a_request_reads_its_window_and_nothing_before", "before request"),
    SeededDefect("dspark-drafter:positions-at-anchor", "dspark_drafter",
                 _drafter(drafter_plan=_plan_positions_at_anchor),
                 "test_at_upstreams_fixture_the_drafter_is_its_closed_form", "kv_caches"),
    SeededDefect("dspark-drafter:context-first-row", "dspark_drafter", _context_first_row,
                 "test_at_upstreams_fixture_the_drafter_is_its_closed_form", "context row"),
]
