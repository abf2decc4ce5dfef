"""V4 decode sparse attention with the fused grouped output projection (``v4_attention``, composed from
``v4_sparse_attention`` and ``v4_output_projection``) on the three V4 paths, on V4-Pro and V4-Flash (tiny twins).

Each rule is checked on inputs that separate it from its plausible port: the CSA causal bound at its edge
(``raw == (pos + 1) // 4`` dropped, one below kept), logical compressed slots paged through each request's own
table (not read as physical rows), the inverse (not forward) rotation on the last rope dims, the latent kept
FP32 before the INT8 activation (a BF16 latent moves one code), one INT8 scale per (token, group) (one per token
loses a small group), plus a whole-stage comparison with an independent FP64 evaluation written here.

Spec: §8; docs/coverage.md, V4 section (V4-14).
"""

from __future__ import annotations

import pytest
import torch

from backends import torch_backend
from contracts.checks.precision import check_ratio_allclose
from contracts.separation import separates, separates_under
from contracts.tolerances import V4_ATTN_OUT_TOL
from contracts.v4_inputs import attention_inputs as _inputs
from contracts.v4_inputs import compressed_topk as _compressed
from contracts.v4_inputs import prefill_attention_inputs
from kernels.config import V4_FLASH_TINY, V4_PRO_TINY
from kernels.errors import ContractInputError
from pto_pytest.defect import SeededDefect, shared
from pto_pytest.plugin import op

MODELS = [V4_PRO_TINY, V4_FLASH_TINY]


def _call(backend, path, config, inputs, compressed):
    return op(backend, "v4_attention")(path, inputs["q"], inputs["ori_kv"], inputs["window_indices"],
                                       inputs["cmp_kv"], inputs["cmp_block_table"], compressed,
                                       inputs["position_ids"], inputs["attn_sink"], inputs["freqs_cos"],
                                       inputs["freqs_sin"], inputs["wo_a"], inputs["wo_b"], inputs["wo_b_scale"],
                                       config=config)


def _independent(path, config, inputs, compressed, *, attention_only: bool = False, seq: int | None = None,
                 key_tiles: str = "columns") -> torch.Tensor:
    """A per-token FP64 evaluation written apart from the reference, after upstream's golden: hand page walk,
    128-key tiles merged one after another with BF16 probabilities for PV, explicit pair formulas, explicit
    per-(token, group) INT8 codes. ``attention_only``: o [T, H, hd] before the projection. ``key_tiles``
    "gathered": the token's invalid keys dropped before the walk (upstream's prefill goldens)."""
    i = {k: v for k, v in inputs.items()}
    t_n, heads, dim = i["q"].shape
    bs = config.block_size
    seq = config.decode_seq if seq is None else seq
    ori = i["ori_kv"].double().reshape(-1, dim)
    cmp = i["cmp_kv"].double().reshape(-1, dim)
    o = torch.zeros(t_n, heads, dim, dtype=torch.float64)
    zero = torch.zeros(dim, dtype=torch.float64)
    for t in range(t_n):
        keys = [(ori[int(r)], True) if r >= 0 else (zero, False) for r in i["window_indices"][t].tolist()]
        if path != "SWA":
            width = config.index_topk if path == "CSA" else compressed.shape[1]
            limit = (int(i["position_ids"][t]) + 1) // 4 if path == "CSA" else 1 << 30
            for raw in compressed[t, :width].tolist():
                if 0 <= raw < limit:
                    page = int(i["cmp_block_table"][t // seq, raw // bs])
                    keys.append((cmp[page * bs + raw % bs], True))
                else:
                    keys.append((zero, False))
        if not any(ok for _, ok in keys):
            continue
        if key_tiles == "gathered":
            keys = [(k, ok) for k, ok in keys if ok]
        run_max, run_sum, acc = None, None, None
        for start in range(0, len(keys), 128):  # upstream's tile walk: 128 keys, BF16 probabilities for PV
            kv = torch.stack([k for k, _ in keys[start:start + 128]])
            ok = torch.tensor([v for _, v in keys[start:start + 128]])
            s = (i["q"][t].double() @ kv.T * dim**-0.5).masked_fill(~ok, -1e20)
            m = s.max(dim=1).values
            p = torch.exp(s - m[:, None]) * ok
            pv = p.to(torch.bfloat16).double() @ kv
            if run_max is None:
                run_max, run_sum, acc = m, p.sum(1), pv
                continue
            new = torch.maximum(run_max, m)
            a, b = torch.exp(run_max - new), torch.exp(m - new)
            run_sum, acc, run_max = a * run_sum + b * p.sum(1), a[:, None] * acc + b[:, None] * pv, new
        o[t] = acc / (run_sum + torch.exp(i["attn_sink"].double() - run_max))[:, None]
    if attention_only:
        return o
    return independent_projection(o, i, config)


def independent_projection(o: torch.Tensor, i: dict, config) -> torch.Tensor:
    """The FP64 projection written apart: inverse pairs, BF16 heads, the FP32 latent per group, explicit INT8
    codes with the 1e-4 floor, exact integer partials, the channel scale, one BF16 rounding."""
    t_n, _heads, dim = o.shape
    rope = config.qk_rope_head_dim
    half = rope // 2
    o = o.double().clone()
    cos = i["freqs_cos"][:, :half].double()[:, None, :]
    sin = i["freqs_sin"][:, :half].double()[:, None, :]
    even, odd = o[..., dim - rope::2].clone(), o[..., dim - rope + 1::2].clone()
    o[..., dim - rope::2], o[..., dim - rope + 1::2] = even * cos + odd * sin, odd * cos - even * sin
    x = o.to(torch.bfloat16).double().reshape(t_n, config.o_groups, -1)
    out = torch.zeros(t_n, config.hidden_size, dtype=torch.float64)
    for g in range(config.o_groups):
        lat = (x[:, g] @ i["wo_a"][g].double().T).float().double()
        amax = lat.abs().amax(1, keepdim=True).clamp_min(1e-4)
        codes = torch.round(lat * (127.0 / amax))
        cols = i["wo_b"][:, g * config.o_lora_rank:(g + 1) * config.o_lora_rank].double()
        out += (codes @ cols.T) * amax / 127.0
    return (out * i["wo_b_scale"].double()).to(torch.bfloat16)


@pytest.mark.parametrize("config", MODELS, ids=lambda c: c.name)
@pytest.mark.parametrize("path", ["HCA", "CSA", "SWA"])
@pytest.mark.operators("v4_attention")
def test_each_path_matches_an_independent_evaluation(backend, path, config):
    """attn_out of every path on V4-Pro and V4-Flash is within upstream's ratio_allclose(1e-4, 1/128) of an
    FP64 evaluation written here (hand page walk, the CSA bound, explicit inverse pairs, explicit INT8 codes).
    Spec: §8."""
    inputs = _inputs(config)
    compressed = _compressed(path, config, inputs)
    got = _call(backend, path, config, inputs, compressed)
    want = _independent(path, config, inputs, compressed)
    assert got.dtype == torch.bfloat16 and got.shape == (config.decode_tokens, config.hidden_size)
    assert bool(want.abs().amax(1).gt(0).all()), "every row attends something"
    r = check_ratio_allclose(got, want, atol=V4_ATTN_OUT_TOL[0], rtol=V4_ATTN_OUT_TOL[1], name="attn_out")
    assert r.ok, r.message()


@pytest.mark.operators("v4_sparse_attention")
def test_the_attention_before_the_projection_is_the_128_key_tile_rule(backend):
    """v4_sparse_attention's o (FP32 [T, H, hd]) against the FP64 tile walk written here, within 1e-5 relative
    to the row's peak: per tile the maximum over its valid keys only (two tokens whose valid scores are all
    negative, in tiles half -1), BF16 probabilities for PV, the tiles merged by their maxima, the sink in the
    denominator; a token with no valid key is exactly 0. Spec: §8."""
    config = V4_PRO_TINY
    inputs = _inputs(config, 13)
    compressed = _compressed("HCA", config, inputs, seed=14)
    ori = inputs["ori_kv"].float()
    ori[0, :64] = ori[0, :64].abs()  # rows 0..63: positive entries
    inputs["ori_kv"] = ori.to(torch.bfloat16)
    q = inputs["q"].float()
    for t in (1, 6):  # half the window tile valid (rows 0..63), every valid score negative
        inputs["window_indices"][t] = -1
        inputs["window_indices"][t, ::2] = torch.arange(64, dtype=torch.int32)
        q[t] = -q[t].abs()
    inputs["q"] = q.to(torch.bfloat16)
    inputs["window_indices"][2] = -1
    compressed[2] = -1
    compressed[3] = -1  # token 3: the window only, its compressed tile all -1 (the tile maximum is -1e20)
    o = op(backend, "v4_sparse_attention")(inputs["q"], inputs["ori_kv"], inputs["window_indices"],
                                           inputs["cmp_kv"], inputs["cmp_block_table"], compressed,
                                           inputs["attn_sink"], seq=config.decode_seq)
    want = _independent("HCA", config, inputs, compressed, attention_only=True)
    assert o.dtype == torch.float32 and o.shape == want.shape, f"o: {o.dtype}{list(o.shape)}"
    assert bool((o[2] == 0).all()), "token 2 has nothing to attend"
    peak = want.abs().amax(dim=(1, 2), keepdim=True).clamp_min(1e-30)
    err = float(((o.double() - want).abs() / peak).max())
    assert err <= 1e-5, f"o differs from the 128-key tile rule by {err:.3g} of the row peak"
    scores = inputs["q"][1].double() @ inputs["ori_kv"][0, :64, 0].double().T
    assert bool((scores < 0).all()), "token 1's valid window scores are all negative"


@pytest.mark.operators("v4_attention")
def test_csa_keeps_a_raw_slot_only_below_position_plus_one_over_four(backend):
    """Positions 3, 6, 7, 11 (bounds 1, 1, 2, 3): the slot one below the bound is read, the slot at the bound is
    not (it is written when position bound·4 + 3 closes), nor are -1 or the columns past index_topk. The CSA
    output equals HCA's with the slots masked by hand, and differs from HCA's unmasked one (the input separates
    the rule). Spec: §8."""
    config = V4_PRO_TINY
    inputs = _inputs(config, 3)
    inputs["position_ids"] = torch.tensor([3, 6, 7, 11, 3, 6, 7, 11], dtype=torch.int32)
    inputs["window_indices"][:] = -1
    inputs["window_indices"][:, 0] = 5  # one window row each, so the compressed rows decide the output
    bound = torch.tensor([1, 1, 2, 3] * 2)
    raw = torch.full((8, config.index_topk + 2), -1, dtype=torch.int32)
    raw[:, 0] = bound - 1
    raw[:, 1] = bound
    raw[:, config.index_topk] = 0  # past index_topk: never read
    from backends import torch_backend
    from contracts.separation import separates

    ref = torch_backend()

    def hca_with(keep):  # the reference's HCA on the slots ``keep`` leaves (the others -1)
        kept = raw[:, : config.index_topk].clone()
        kept[~keep(kept)] = -1
        return _call(ref, "HCA", config, inputs, kept)

    pos = inputs["position_ids"].long()[:, None]
    want = separates("CSA reads a raw slot s only when s < (position + 1) / 4", hca_with(lambda k: k < (pos + 1) // 4),
                     slot_at_the_bound_read=hca_with(lambda k: k <= (pos + 1) // 4),
                     bound_from_position_over_four=hca_with(lambda k: k < pos // 4))
    csa = _call(backend, "CSA", config, inputs, raw)
    masked = raw[:, : config.index_topk].clone()
    masked[:, 1] = -1
    assert torch.equal(csa, _call(backend, "HCA", config, inputs, masked)), "CSA must read exactly the slots below"
    assert torch.equal(csa, want), "CSA differs from the reference HCA on the slots below the bound"


@pytest.mark.operators("v4_attention")
def test_compressed_slots_are_paged_through_each_requests_table(backend):
    """Moving the compressed pages to other physical blocks and rewriting the tables to match leaves attn_out
    bit-identical (the slots are logical, per request); reading the same slots as physical rows would not.
    Spec: §8."""
    config = V4_FLASH_TINY
    inputs = _inputs(config, 5)
    compressed = _compressed("HCA", config, inputs, seed=6)
    got = _call(backend, "HCA", config, inputs, compressed)
    perm = torch.tensor([2, 0, 3, 1])  # physical block b moves to perm[b]
    moved = dict(inputs)
    moved["cmp_kv"] = torch.empty_like(inputs["cmp_kv"])
    moved["cmp_kv"][perm] = inputs["cmp_kv"]
    moved["cmp_block_table"] = perm[inputs["cmp_block_table"].long()].to(torch.int32)
    again = _call(backend, "HCA", config, moved, compressed)
    assert torch.equal(again, got), f"pages moved with their tables: {int((again != got).sum())} attn_out elements " \
                                    "changed (slots read as physical rows?)"
    identity = dict(inputs, cmp_block_table=torch.tensor([[0, 1]] * 4, dtype=torch.int32))
    ref = torch_backend()  # the rule and its alternative, on the reference
    separates("§8 compressed slots are paged per request", _call(ref, "HCA", config, inputs, compressed),
              slots_as_physical_rows=_call(ref, "HCA", config, identity, compressed))


@pytest.mark.operators("v4_output_projection")
def test_the_inverse_rotation_acts_on_the_last_rope_dims(backend):
    """With cos 0 and sin 1 the inverse rotation maps each rope pair (a, b) to (b, -a) exactly: projecting o
    with that table equals projecting the hand-rotated o with the identity table (cos 1, sin 0); the forward
    rotation (-b, a) or the first dims rotated would not. Spec: §8."""
    config = V4_PRO_TINY
    inputs = _inputs(config, 7)
    t, h, d, rope = config.decode_tokens, config.num_attention_heads, config.head_dim, config.qk_rope_head_dim
    o = (torch.rand(t, h, d, generator=torch.Generator().manual_seed(8)) - 0.5).to(torch.bfloat16).float()
    project = op(backend, "v4_output_projection")
    ones, zeros = torch.ones(t, rope, dtype=torch.bfloat16), torch.zeros(t, rope, dtype=torch.bfloat16)
    args = (inputs["wo_a"], inputs["wo_b"], inputs["wo_b_scale"])
    got = project(o, zeros, ones, *args, config=config)
    turned = o.clone()
    turned[..., d - rope::2], turned[..., d - rope + 1::2] = o[..., d - rope + 1::2], -o[..., d - rope::2]
    assert torch.equal(got, project(turned, ones, zeros, *args, config=config)), \
        "cos 0 / sin 1 must turn each rope pair (a, b) of the last dims into (b, -a) (the inverse rotation)"
    from backends import torch_backend
    from contracts.separation import separates

    plain = torch_backend().get("v4_output_projection")  # the alternatives, hand-rotated, projected plainly
    forward = o.clone()
    forward[..., d - rope::2], forward[..., d - rope + 1::2] = -o[..., d - rope + 1::2], o[..., d - rope::2]
    first = o.clone()
    first[..., 0:rope:2], first[..., 1:rope:2] = o[..., 1:rope:2], -o[..., 0:rope:2]
    half = o.clone()  # the inverse rotation on half-split pairs (i, i + rope/2) of the last dims
    lo, hi = o[..., d - rope:d - rope // 2], o[..., d - rope // 2:]
    half[..., d - rope:d - rope // 2], half[..., d - rope // 2:] = hi, -lo
    separates("the inverse rotation of interleaved pairs of the last dims", plain(turned, ones, zeros, *args,
                                                                                   config=config),
              forward_rotation=plain(forward, ones, zeros, *args, config=config),
              first_dims_rotated=plain(first, ones, zeros, *args, config=config),
              half_split_pairs=plain(half, ones, zeros, *args, config=config))


def _one_hot_projection(config):
    """wo_a reads input column 2j of a group into latent column j (weights 1) and column 1 into latent column
    0 with weight 2^-9; wo_b channel c reads latent (group c % G, column 0 or 1); scales 1."""
    groups, lora, hidden = config.o_groups, config.o_lora_rank, config.hidden_size
    group_in = config.num_attention_heads * config.head_dim // groups
    wo_a = torch.zeros(groups, lora, group_in)
    for j in range(lora):
        wo_a[:, j, 2 * j] = 1.0
    wo_a[:, 0, 1] = 2.0**-9
    wo_b = torch.zeros(hidden, groups * lora, dtype=torch.int8)
    for c in range(hidden):
        wo_b[c, (c % groups) * lora + (c // groups) % 2] = 1
    return wo_a.to(torch.bfloat16), wo_b, torch.ones(hidden)


@pytest.mark.operators("v4_output_projection")
def test_the_latent_stays_fp32_and_each_token_group_has_its_own_int8_scale(backend):
    """Hand vectors through v4_output_projection (nope dims only, so the rotation is out of play):

    * group 0: latent (1 + 2^-9, 0.5). Kept FP32, amax = 1 + 2^-9 and 0.5 codes to round(63.38) = 63; a BF16
      latent (amax 1.0) would code 63.5 -> 64. Channel 8 (group 0, column 1) is 63 · (1 + 2^-9) / 127.
    * group 1: latent (100, 0) and group 2: latent (0.01, 0): each group's own scale gives 127 codes, so
      channel 1 = 100 and channel 2 = 0.01 (within one code); one scale per token (amax 100) would code 0.01
      to 0.
    * groups 3 and 4: integer partials 127·127 + 95 = 16224 and -(127·127 + 71) = -16200 cancel in channel 63
      to 24 / 127; partials rounded to BF16 (16256, -16192) would give 64 / 127.
    * group 5: latent (1 + 2^-30, 0.5) is (1.0, 0.5) in FP32: 0.5 codes to 64 (channel 13 = 64 / 127); an FP64
      latent would code 63. Spec: §8."""
    config = V4_PRO_TINY
    t, h, d = config.decode_tokens, config.num_attention_heads, config.head_dim
    group_in = h * d // config.o_groups
    flat = torch.zeros(t, config.o_groups, group_in)
    flat[:, 0, 0], flat[:, 0, 1], flat[:, 0, 2] = 1.0, 1.0, 0.5
    flat[:, 1, 0] = 100.0
    flat[:, 2, 0] = 0.01
    flat[:, 3, 0], flat[:, 3, 2] = 1.0, 0.748  # codes (127, 95): BF16 0.748046875 · 127 = 95.0
    flat[:, 4, 0], flat[:, 4, 2] = 1.0, 0.559  # codes (127, 71)
    flat[:, 5, 0], flat[:, 5, 1], flat[:, 5, 2] = 1.0, 2.0**-21, 0.5  # latent 1 + 2^-30: 1.0 in FP32
    o = flat.reshape(t, h, d)
    assert bool((o[..., d - config.qk_rope_head_dim:] == 0).all())
    wo_a, wo_b, scale = _one_hot_projection(config)
    lora = config.o_lora_rank
    wo_b[63] = 0  # channel 63: +(127·127 + 95) from group 3, -(127·127 + 71) from group 4
    wo_b[63, 3 * lora], wo_b[63, 3 * lora + 1], wo_b[63, 4 * lora], wo_b[63, 4 * lora + 1] = 127, 1, -127, -1
    ones, zeros = torch.ones(t, 16, dtype=torch.bfloat16), torch.zeros(t, 16, dtype=torch.bfloat16)
    out = op(backend, "v4_output_projection")(o, ones, zeros, wo_a, wo_b, scale, config=config).float()
    amax0 = torch.tensor(1 + 2.0**-9, dtype=torch.float32)
    from contracts.separation import separates

    def bf(v: float) -> torch.Tensor:
        return torch.tensor(v).to(torch.bfloat16)

    # channels 8, 63, 13, 2 under the rule, and with one alternative each (the codes the prose above derives)
    rule = [63 * float(amax0) / 127, 24 / 127, 64 / 127, 0.01]
    separates("FP32 latent, FP32-exact partials, one INT8 scale per token group", torch.stack([bf(v) for v in rule]),
              latent_rounded_to_bf16=torch.stack([bf(v) for v in (64 * 1.0 / 127, *rule[1:])]),
              partials_rounded_to_bf16=torch.stack([bf(v) for v in (rule[0], (16256 - 16192) / 127, *rule[2:])]),
              latent_kept_fp64=torch.stack([bf(v) for v in (*rule[:2], 63 / 127, rule[3])]),
              one_scale_per_token=torch.stack([bf(v) for v in (*rule[:3], 0.0)]))
    ch0 = torch.tensor(127 * float(amax0) / 127).to(torch.bfloat16).item()
    assert out[0, 0].item() == ch0, f"channel 0: {out[0, 0].item()} != {ch0} (group 0 coded on its own scale)"
    ch8 = torch.tensor(63 * float(amax0) / 127).to(torch.bfloat16).item()
    assert out[0, 8].item() == ch8, f"channel 8: {out[0, 8].item()} != 63·(1 + 2^-9)/127 = {ch8} (64 codes: BF16 latent)"
    assert out[0, 1].item() == torch.tensor(100.0).to(torch.bfloat16).item(), f"channel 1: {out[0, 1].item()} != 100"
    assert abs(out[0, 2].item() - 0.01) <= 0.01 / 127 + 1e-4, f"channel 2: {out[0, 2].item()} (0: one scale per token)"
    ch63 = torch.tensor(24 / 127).to(torch.bfloat16).item()
    assert out[0, 63].item() == ch63, f"channel 63: {out[0, 63].item()} != (16224 - 16200) / 127 = {ch63} (the " \
        "integer partials 16224 and 16200 are not BF16 numbers: an FP32-exact partial, then the group scale)"
    ch13 = torch.tensor(64 / 127).to(torch.bfloat16).item()
    assert out[0, 13].item() == ch13, f"channel 13: {out[0, 13].item()} != 64 / 127 = {ch13} (the latent " \
        "1 + 2^-30 is 1.0 in FP32, so 0.5 codes to 63.5 -> 64; an FP64 latent codes 63)"
    assert torch.equal(out, out[:1].expand_as(out)), "every token row the same"


@pytest.mark.operators("v4_attention")
def test_a_token_with_nothing_to_attend_outputs_zero(backend):
    """A row with every window slot -1 and no compressed slot (SWA) attends only the sink: its attention is
    exactly zero, so its latent is zero, its INT8 codes are zero (the 1e-4 amax floor) and attn_out is 0. The
    batch is two requests (4 rows, fewer than the heads). Spec: §8."""
    config = V4_PRO_TINY
    inputs = _inputs(config, 9)
    inputs = {k: (v[:4] if k in ("q", "window_indices", "position_ids", "freqs_cos", "freqs_sin") else
                  v[:2] if k == "cmp_block_table" else v) for k, v in inputs.items()}
    inputs["window_indices"][3] = -1
    out = _call(backend, "SWA", config, inputs, None)
    assert out.shape == (4, config.hidden_size)
    assert bool((out[3] == 0).all()) and bool(out.abs().amax(1).gt(0).sum() == 3)


@pytest.mark.operators("v4_attention")
def test_bad_inputs_are_refused_naming_the_field(backend):
    """An unmapped compressed page names (request, page); a slot past the table names (token, column); an
    unknown path, a non-INT8 wo_b and a missing compressed top-k are refused. Spec: §8."""
    config = V4_PRO_TINY
    inputs = _inputs(config, 11)
    compressed = _compressed("HCA", config, inputs)
    bad_table = inputs["cmp_block_table"].clone()
    bad_table[2, 1] = -1
    compressed[:] = -1
    compressed[:, 0] = 3
    compressed[5, 0] = config.block_size + 3  # request 2, page 1: the only slot there
    with pytest.raises(ContractInputError, match=r"cmp_block_table\[2\]\[1\]: .* slot 131 of token 5"):
        _call(backend, "HCA", config, dict(inputs, cmp_block_table=bad_table), compressed)
    compressed[5, 0] = 2 * config.block_size
    with pytest.raises(ContractInputError, match=r"cmp_indices\[5\]\[0\]"):
        _call(backend, "HCA", config, inputs, compressed)
    with pytest.raises(ContractInputError, match="path"):
        _call(backend, "MLA", config, inputs, None)
    with pytest.raises(ContractInputError, match="compressed"):
        _call(backend, "CSA", config, inputs, None)
    with pytest.raises(ContractInputError, match="wo_b"):
        _call(backend, "SWA", config, dict(inputs, wo_b=inputs["wo_b"].float()), None)
    raw = _compressed("CSA", config, inputs)
    _call(backend, "CSA", config, inputs, raw[:, : config.index_topk])  # exactly index_topk columns: accepted
    for bad in (raw[:, : config.index_topk - 1], raw.float(), raw[0]):
        with pytest.raises(ContractInputError, match="idx_topk"):
            _call(backend, "CSA", config, inputs, bad)
    with pytest.raises(ContractInputError, match="cmp_block_table"):
        _call(backend, "HCA", config, dict(inputs, cmp_block_table=inputs["cmp_block_table"][:3]), compressed)
    with pytest.raises(ContractInputError, match="ori_kv"):
        _call(backend, "SWA", config, dict(inputs, ori_kv=inputs["ori_kv"].expand(-1, -1, 2, -1)), None)
    half = config.qk_rope_head_dim // 2
    _call(backend, "SWA", config, dict(inputs, freqs_cos=inputs["freqs_cos"][:, :half],
                                       freqs_sin=inputs["freqs_sin"][:, :half]), None)  # [T, rope/2]: accepted
    for name, table in (("freqs_cos", inputs["freqs_cos"][:, : half - 1]), ("freqs_sin", inputs["freqs_sin"][:7]),
                        ("freqs_cos", inputs["freqs_cos"][None])):
        with pytest.raises(ContractInputError, match=name):
            _call(backend, "SWA", config, dict(inputs, **{name: table}), None)


def test_the_attn_out_comparator_fails_just_outside_its_bound():
    """``attn_out_v4`` (the golden trees' comparator): elements at 0.99 of atol + rtol·|e| pass; three of 512
    elements at 1.01 of it fail (the 0.5 % quota allows two); a NaN, a wrong shape or dtype fails. Spec: §8."""
    from contracts.compare import attn_out_v4

    e = (torch.rand(8, 64, generator=torch.Generator().manual_seed(2)) - 0.5).to(torch.bfloat16).float()
    atol, rtol = V4_ATTN_OUT_TOL
    bound = atol + rtol * e.abs()
    assert attn_out_v4("attn_out", e + 0.99 * bound, e, None).ok
    two = e.clone()
    two.view(-1)[:2] += 1.01 * bound.view(-1)[:2]
    assert attn_out_v4("attn_out", two, e, None).ok, "two of 512 elements are within the 0.5 % quota"
    three = e.clone()
    three.view(-1)[:3] += 1.01 * bound.view(-1)[:3]
    r = attn_out_v4("attn_out", three, e, None)
    assert not r.ok and r.n_failed == 3, r.message()
    z = e.clone()
    z[0] = 0.0  # the atol clause alone: |e| = 0
    assert attn_out_v4("attn_out", z + (z == 0) * 0.99 * atol, z, None).ok
    r = attn_out_v4("attn_out", z + (z == 0) * 1.01 * atol, z, None)
    assert not r.ok and r.n_failed == 64, r.message()
    nan = e.clone()
    nan[3, 4] = float("nan")
    assert not attn_out_v4("attn_out", nan, e, None).ok
    assert not attn_out_v4("attn_out", e[:7], e, None).ok


@pytest.mark.whole_backend("a stage against its own parts, bit for bit")
@pytest.mark.operators("v4_attention", "v4_output_projection", "v4_sparse_attention")
def test_v4_attention_composes_the_backends_own_operators(backend):
    """v4_attention runs the backend's v4_sparse_attention and v4_output_projection, once each (a kernel
    backend that binds either is judged through the composition); a one-page compressed table with -1 slots
    beyond it works. Spec: §8."""
    config = V4_PRO_TINY
    inputs = _inputs(config, 15)
    calls = []
    attend, project = op(backend, "v4_sparse_attention"), op(backend, "v4_output_projection")

    def counted_attend(*a, **k):
        calls.append("v4_sparse_attention")
        return attend(*a, **k)

    def counted_project(*a, **k):
        calls.append("v4_output_projection")
        return project(*a, **k)

    derived = backend.derive("counting", v4_sparse_attention=counted_attend, v4_output_projection=counted_project)
    compressed = torch.full((config.decode_tokens, 4), -1, dtype=torch.int32)
    compressed[:, 0] = 7
    one_page = dict(inputs, cmp_block_table=inputs["cmp_block_table"][:, :1].contiguous())
    out = derived.get("v4_attention")("HCA", *(one_page[n] for n in ("q", "ori_kv", "window_indices", "cmp_kv",
                                                                     "cmp_block_table")),
                                      compressed, *(one_page[n] for n in ("position_ids", "attn_sink", "freqs_cos",
                                                                          "freqs_sin", "wo_a", "wo_b", "wo_b_scale")),
                                      config=config)
    assert calls == ["v4_sparse_attention", "v4_output_projection"], calls
    assert out.shape == (config.decode_tokens, config.hidden_size)


@pytest.mark.operators("v4_attention")
def test_a_prefill_chunk_is_one_request_with_zero_padding_rows(backend):
    """Prefill (upstream prefill_sparse_attn.py): one request of 128 rows at positions 100..227 with 100 real
    rows (num_tokens), compressed slots given as logical slots of the request's table. Rows 100.. are exactly 0
    although their indices point at real cache rows; rows ..99 equal the run of those 100
    rows alone, byte for byte, and are within upstream's ratio_allclose(1e-4, 1/128) of the FP64 evaluation.
    num_tokens 128 makes every row real, 0 gives all zeros, outside [0, 128] (or a bool) is refused; the index
    inputs are not modified. Spec: §8."""
    config = V4_PRO_TINY
    i = prefill_attention_inputs(config, 17)
    i["window_indices"][100:] = i["window_indices"][0]  # valid rows: reading them would show
    i["compressed"][100:] = i["compressed"][0]
    names = ("q", "ori_kv", "window_indices", "cmp_kv", "cmp_block_table", "compressed", "position_ids",
             "attn_sink", "freqs_cos", "freqs_sin", "wo_a", "wo_b", "wo_b_scale")
    attention = op(backend, "v4_attention")
    before = {n: i[n].clone() for n in ("window_indices", "compressed")}
    out = attention("HCA", *(i[n] for n in names), config=config, seq=128, num_tokens=100)
    assert all(torch.equal(i[n], v) for n, v in before.items()), "the call must not modify its index inputs"
    assert out.shape == (128, config.hidden_size)
    assert bool((out[100:] == 0).all()), f"{int((out[100:] != 0).any(1).sum())} padding rows are not zero"
    per_row = ("q", "window_indices", "compressed", "position_ids", "freqs_cos", "freqs_sin")
    real = {n: (v[:100] if n in per_row else v) for n, v in i.items()}
    alone = attention("HCA", *(real[n] for n in names), config=config, seq=100, num_tokens=100)
    assert torch.equal(out[:100], alone), "the real rows must not depend on the padding rows"
    want = _independent("HCA", config, real, real["compressed"], seq=100, key_tiles="gathered")
    r = check_ratio_allclose(out[:100], want, atol=V4_ATTN_OUT_TOL[0], rtol=V4_ATTN_OUT_TOL[1], name="attn_out")
    assert r.ok, r.message()
    whole = attention("HCA", *(i[n] for n in names), config=config, seq=128, num_tokens=128)
    assert torch.equal(whole[:100], out[:100]) and bool(whole[100:].ne(0).any(1).all()), \
        "num_tokens 128: every row real, the first 100 as before"
    assert bool((attention("HCA", *(i[n] for n in names), config=config, seq=128, num_tokens=0) == 0).all())
    for bad in (-1, 129, True):
        with pytest.raises(ContractInputError, match="num_tokens"):
            attention("HCA", *(i[n] for n in names), config=config, seq=128, num_tokens=bad)


@pytest.mark.operators("v4_output_projection")
def test_the_group_partials_are_summed_in_group_order(backend):
    """Through v4_output_projection (nope dims only): the latents of groups 0..3 are 1, +2^40, -2^40 and 2, the
    rest 0, and channel 0 reads latent column 0 of groups 0..3. In group order 1 is absorbed by 2^40, which -2^40
    cancels, and the channel is 2; in reversed order 2 is absorbed instead and the channel is 1; a pairwise tree
    absorbs both and gives 0. Spec: §8 (each group's exact integer partial, rounded to FP32, then summed)."""
    from contracts.separation import pairwise_sum, running_sum, separates
    from kernels.v4.mtp import int8_matmul, quantize_rows_int8

    config = V4_PRO_TINY
    t, h, d = config.decode_tokens, config.num_attention_heads, config.head_dim
    groups, lora = config.o_groups, config.o_lora_rank
    group_in = h * d // groups
    flat = torch.zeros(t, groups, group_in)
    flat[:, 0, 0], flat[:, 1, 0], flat[:, 2, 0], flat[:, 3, 0] = 1.0, 2.0**40, -(2.0**40), 2.0
    wo_a, wo_b, scale = _one_hot_projection(config)
    wo_b[0] = 0
    wo_b[0, 0], wo_b[0, lora], wo_b[0, 2 * lora], wo_b[0, 3 * lora] = 1, 1, 1, 1
    latent = torch.einsum("tgk,gnk->tgn", flat.to(torch.bfloat16).double(), wo_a.double()).float()
    codes, factor = quantize_rows_int8(latent, scale_max=config.int8_scale_max, amax_eps=config.int8_amax_eps)
    w = wo_b.reshape(config.hidden_size, groups, lora)
    parts = [int8_matmul(codes[:, g], w[:, g]) * factor[:, g] for g in range(groups)]

    want = separates("group partials summed in group order", running_sum(parts)[:, 0].bfloat16(),
                     reversed_groups=running_sum(parts[::-1])[:, 0].bfloat16(),
                     pairwise_groups=pairwise_sum(parts)[:, 0].bfloat16())
    ones, zeros = torch.ones(t, 16, dtype=torch.bfloat16), torch.zeros(t, 16, dtype=torch.bfloat16)
    out = op(backend, "v4_output_projection")(flat.reshape(t, h, d).to(torch.bfloat16), ones, zeros, wo_a, wo_b,
                                              scale, config=config)
    assert torch.equal(out[:, 0], want) and out[0, 0].item() == 2.0, f"channel 0: {out[:, 0].tolist()}"


# defects of tests/defects these contracts must catch (shared with other contract files)
_SPARSE = ("q", "ori_kv", "window_indices", "cmp_kv", "cmp_block_table", "compressed", "attn_sink")


def _early_chunk(config):
    """A prefill chunk at positions 8 .. 71: every window holds fewer than 128 valid keys (-1 columns after them),
    every row has compressed slots, so the window's tile and the gathered tile hold different keys."""
    return prefill_attention_inputs(config, 23, rows=64, start=8)


@pytest.mark.operators("v4_sparse_attention")
def test_gathered_key_tiles_walk_each_tokens_valid_keys_first(backend):
    """key_tiles="gathered" (upstream's prefill goldens, prefill_sparse_attn.py): each token's valid keys, window
    then compressed, cut into tiles of 128, against the FP64 walk written here within 1e-5 of the row peak; the
    decode goldens' column tiles (the window's columns one tile, holes kept) lie beyond that bound on this
    chunk, so the rule is pinned. An unknown key_tiles is refused. Spec: §8."""
    config = V4_PRO_TINY
    i = _early_chunk(config)
    attend = op(backend, "v4_sparse_attention")
    o = attend(*(i[n] for n in _SPARSE), seq=64, key_tiles="gathered")

    def within(candidate, expected):
        peak = expected.abs().amax(dim=(1, 2), keepdim=True).clamp_min(1e-30)
        return float(((candidate.double() - expected).abs() / peak).max()) <= 1e-5

    want = separates_under("gathered key tiles", within,
                           _independent("HCA", config, i, i["compressed"], attention_only=True, seq=64,
                                        key_tiles="gathered"),
                           column_tiles=_independent("HCA", config, i, i["compressed"], attention_only=True,
                                                     seq=64))
    assert within(o, want), "o is not the walk over the gathered keys within 1e-5 of the row peak"
    with pytest.raises(ContractInputError, match="key_tiles"):
        attend(*(i[n] for n in _SPARSE), seq=64, key_tiles="rows")


@pytest.mark.whole_backend("v4_attention against its own parts, bit for bit")
@pytest.mark.operators("v4_attention", "v4_output_projection", "v4_sparse_attention")
def test_the_prefill_form_tiles_gathered_and_the_decode_form_by_columns(backend):
    """v4_attention's prefill form (num_tokens given) is the projection of the gathered walk, its decode form of
    the column walk, unless the call names key_tiles; on this chunk the two walks differ, so the default is seen.
    Spec: §8."""
    config = V4_PRO_TINY
    i = _early_chunk(config)
    args = (i["q"], i["ori_kv"], i["window_indices"], i["cmp_kv"], i["cmp_block_table"], i["compressed"],
            i["position_ids"], i["attn_sink"], i["freqs_cos"], i["freqs_sin"], i["wo_a"], i["wo_b"], i["wo_b_scale"])
    attention, attend = op(backend, "v4_attention"), op(backend, "v4_sparse_attention")
    project = op(backend, "v4_output_projection")
    walk = {tiles: project(attend(*(i[n] for n in _SPARSE), seq=64, key_tiles=tiles), i["freqs_cos"],
                           i["freqs_sin"], i["wo_a"], i["wo_b"], i["wo_b_scale"], config=config)
            for tiles in ("gathered", "columns")}
    assert not torch.equal(walk["gathered"], walk["columns"]), "the chunk no longer separates the two walks"
    assert torch.equal(attention("HCA", *args, config=config, seq=64, num_tokens=64), walk["gathered"]), \
        "the prefill form must walk the gathered keys (upstream's prefill goldens)"
    assert torch.equal(attention("HCA", *args, config=config, seq=64), walk["columns"]), \
        "the decode form must walk the columns (upstream's decode goldens)"
    assert torch.equal(attention("HCA", *args, config=config, seq=64, num_tokens=64, key_tiles="columns"),
                       walk["columns"]), "a named key_tiles is followed"


def _prefill_by_columns(*args, **kwargs):
    from kernels.v4.sparse_attention import v4_attention

    kwargs["key_tiles"] = "columns"
    return v4_attention(*args, **kwargs)


def _key_tiles_ignored(*args, key_tiles="columns", **kwargs):
    from kernels.v4.sparse_attention import v4_sparse_attention

    if key_tiles not in ("columns", "gathered"):
        raise ContractInputError("key_tiles", None, "columns or gathered", key_tiles, "§8")
    return v4_sparse_attention(*args, **kwargs)


SEEDED_DEFECTS = [
    shared("v4:CSA_BOUND_INCLUSIVE", "test_csa_keeps_a_raw_slot_only_below_position_plus_one_over_four", "CSA must read exactly the slots below"),
    shared("v4:CMP_SLOTS_PHYSICAL", "test_compressed_slots_are_paged_through_each_requests_table", "slots read as physical rows"),
    shared("v4:PROBS_UNROUNDED", "test_each_path_matches_an_independent_evaluation", "attn_out"),
    shared("v4:LATENT_ROUNDED_BF16", "test_the_latent_stays_fp32_and_each_token_group_has_its_own_int8_scale", "64 codes: BF16 latent"),
    shared("v4:ACT_SCALE_PER_TOKEN", "test_the_latent_stays_fp32_and_each_token_group_has_its_own_int8_scale", "group 0 coded on its own scale"),
    shared("v4:FORWARD_ROPE", "test_the_inverse_rotation_acts_on_the_last_rope_dims", "the inverse rotation"),
    shared("v4:PADDING_ROWS_ATTENDED", "test_a_prefill_chunk_is_one_request_with_zero_padding_rows", "padding rows are not zero"),
    SeededDefect("v4-attention:prefill-by-columns", "v4_attention", _prefill_by_columns,
                 "test_the_prefill_form_tiles_gathered_and_the_decode_form_by_columns", "gathered keys"),
    SeededDefect("v4-sparse-attention:key-tiles-ignored", "v4_sparse_attention", _key_tiles_ignored,
                 "test_gathered_key_tiles_walk_each_tokens_valid_keys_first", "gathered keys"),
]
