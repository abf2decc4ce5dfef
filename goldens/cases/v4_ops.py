"""Cases for one V4 operator each, at the V4-Pro tiny preset: the operators upstream pypto-lib has a Torch golden
for (``backends.upstream.adapters``), so that ``goldens record --from upstream`` can record trees whose expected
outputs are upstream's own numbers. Each case is one keyword ``Case``; inputs are seeded, with the edges that
separate the rules (padding rows inside the gate's 16-row tile, a hash layer and a scored one, an idle shared
expert row of zeros, ties broken by nothing but the rule). Spec: §8.
"""

from __future__ import annotations

import torch

from goldens.cases import Case, Tensors
from kernels.config import V4_PRO_TINY as PRO

GATE_VOCAB = 32


def _g(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _int8(shape, g) -> torch.Tensor:
    return torch.randint(-127, 128, shape, generator=g, dtype=torch.int8)



# --- v4_expert -------------------------------------------------------------------------------------------------

def _expert_build(routed: bool):
    def build(seed: int, wiring: str) -> Tensors:
        g = _g(seed)
        d, inter, n = PRO.hidden_size, PRO.moe_intermediate_size, 9
        x = _int8((n, d), g)
        x[3] = 0  # a row of zero codes: h is 0, its re-code takes the amax floor
        out = {"x_i8": x, "x_scale": torch.rand(n, 1, generator=g) * 0.02 + 1e-3,
               "w1": _int8((inter, d), g), "w1_scale": torch.rand(inter, generator=g) * 0.02 + 0.005,
               "w3": _int8((inter, d), g), "w3_scale": torch.rand(inter, generator=g) * 0.02 + 0.005,
               "w2": _int8((d, inter), g), "w2_scale": torch.rand(d, generator=g) * 0.02 + 0.005}
        if routed:
            out["route_weight"] = torch.rand(n, generator=g)
        return out
    return build


def _expert_call(get, i: Tensors) -> Tensors:
    from kernels.v4.moe import V4ExpertWeights

    w = V4ExpertWeights(i["w1"], i["w1_scale"], i["w3"], i["w3_scale"], i["w2"], i["w2_scale"])
    return {"y": get("v4_expert")(i["x_i8"], i["x_scale"], i.get("route_weight"), w, config=PRO)}


# --- v4_qkv_proj_rope ------------------------------------------------------------------------------------------

def _qkv_build(seed: int, wiring: str, config=PRO) -> Tensors:
    """8 tokens at ``config``'s widths (the V4-Pro tiny preset; goldens.cases.pro passes Pro's own)."""
    g = _g(seed)
    hidden, lora, h, d, rope = config.hidden_size, config.q_lora_rank, config.num_attention_heads, config.head_dim, \
        config.qk_rope_head_dim
    tokens = 8
    angle = torch.rand(tokens, 1, generator=g) * 300 * torch.rand(rope, generator=g)
    return {"x": torch.randn(tokens, hidden, generator=g).to(torch.bfloat16),
            "wq_a": (torch.randn(hidden, lora, generator=g) / hidden**0.5).to(torch.bfloat16),
            "wq_b": _int8((lora, h * d), g), "wq_b_scale": torch.rand(h * d, generator=g) / 127 + 1e-3,
            "wkv": (torch.randn(hidden, d, generator=g) / hidden**0.5).to(torch.bfloat16),
            "rope_cos": torch.cos(angle).to(torch.bfloat16), "rope_sin": torch.sin(angle).to(torch.bfloat16),
            "gamma_cq": (torch.rand(lora, generator=g) + 0.5).to(torch.bfloat16),
            "gamma_ckv": (torch.rand(d, generator=g) + 0.5).to(torch.bfloat16)}


def _qkv_call(get, i: Tensors) -> Tensors:
    return get("v4_qkv_proj_rope")(**i, config=PRO)


# --- mtp_projection --------------------------------------------------------------------------------------------

def _mtp_build(seed: int, wiring: str) -> Tensors:
    g = _g(seed)
    d, hc, t = PRO.hidden_size, PRO.hc_mult, 8
    return {"hidden": torch.randn(t, d, generator=g).to(torch.bfloat16), "prev": torch.randn(t, hc, d, generator=g),
            "enorm": torch.rand(d, generator=g) + 0.5, "hnorm": torch.rand(d, generator=g) + 0.5,
            "e_proj": _int8((d, d), g), "e_scale": torch.rand(d, generator=g) * 1e-3,
            "e_smooth": torch.rand(d, generator=g) + 0.5, "h_proj": _int8((d, d), g),
            "h_scale": torch.rand(d, generator=g) * 1e-3, "h_smooth": torch.rand(d, generator=g) + 0.5}


def _mtp_call(get, i: Tensors) -> Tensors:
    names = ("hidden", "prev", "enorm", "hnorm", "e_proj", "e_scale", "e_smooth", "h_proj", "h_scale", "h_smooth")
    return {"out": get("mtp_projection")(*(i[n] for n in names), config=PRO)}


# --- hc_post ---------------------------------------------------------------------------------------------------

def _hc_post_build(seed: int, wiring: str, *, d: int = PRO.hidden_size, t: int = 8) -> Tensors:
    g = _g(seed)
    hc = PRO.hc_mult
    comb = torch.rand(t, hc, hc, generator=g)
    return {"sublayer": torch.randn(t, d, generator=g).to(torch.bfloat16), "x_hc": torch.randn(t, hc, d, generator=g),
            "post_mix": 2 * torch.rand(t, hc, generator=g), "residual_mix": comb / comb.sum(1, keepdim=True)}


def _hc_post_pro_build(seed: int, wiring: str) -> Tensors:
    """At V4-Pro's own width (D 7168, the geometry upstream's hc_post_test is compiled for), 4 rows (its T_TILE): what the a5
    simulator runs through the device binding (a tiny tree is refused there as another geometry)."""
    from kernels.config import V4_PRO

    return _hc_post_build(seed, wiring, d=V4_PRO.hidden_size, t=4)


def _hc_post_call(get, i: Tensors) -> Tensors:
    return {"x_out": get("hc_post")(i["sublayer"], i["x_hc"], i["post_mix"], i["residual_mix"])}


# --- v4_embed_pack ---------------------------------------------------------------------------------------------

def _embed_build(seed: int, wiring: str) -> Tensors:
    """Upstream's fixture ids (-1, 0, 17, the last row, the vocabulary and 7 past it, 2, 1) over a 32-row table."""
    g = _g(seed)
    vocab = 32
    ids = torch.tensor([-1, 0, 17, vocab - 1, vocab, vocab + 7, 2, 1], dtype=torch.int64)
    return {"input_ids": ids, "embed_weight": torch.randn(vocab, PRO.hidden_size, generator=g).to(torch.bfloat16)}


def _embed_call(get, i: Tensors) -> Tensors:
    return {"x_hc": get("v4_embed_pack")(i["input_ids"], i["embed_weight"], config=PRO)}


# --- lm_head ---------------------------------------------------------------------------------------------------

LM_TP = 2


def _lm_build(seed: int, wiring: str) -> Tensors:
    g = _g(seed)
    vocab, d = 512, PRO.hidden_size  # the smallest vocabulary the layout accepts at TP2 (a multiple of 256)
    return {"hidden": torch.randn(6, d, generator=g).to(torch.bfloat16),
            "weight": (torch.randn(vocab, d, generator=g) / d**0.5).to(torch.bfloat16)}


def _lm_call(get, i: Tensors) -> Tensors:
    return {"logits": torch.cat(get("lm_head")(i["hidden"], i["weight"], tp=LM_TP), dim=1)}


# --- v4_attention_stage (SWA decode) ------------------------------------------------------------------------

STAGE_NAMES = ("x_hc", "hc_fn", "hc_scale", "hc_base", "attn_norm_w", "wq_a", "wq_b", "wq_b_scale", "wkv", "gamma_cq",
               "gamma_ckv", "freqs_cos", "freqs_sin", "kv_cache", "swa_slot_mapping", "window_indices",
               "position_ids", "attn_sink", "wo_a", "wo_b", "wo_b_scale")


def _stage_build(seed: int, wiring: str) -> Tensors:
    """The decode batch's requests at positions 40.. (two rows each), windows over 8 earlier cache rows of their
    own plus this chunk's rows up to the token, the current rows written at slots 200 + t (the attention reads
    them after the write), one window column short of the full width."""
    g = _g(seed)
    c = PRO
    t, hc, dm = c.decode_tokens, c.hc_mult, c.hidden_size
    h, d, lora, rope = c.num_attention_heads, c.head_dim, c.q_lora_rank, c.qk_rope_head_dim
    mix = (2 + hc) * hc
    pos = torch.tensor([40 + 20 * (r // 2) + r % 2 for r in range(t)], dtype=torch.int32)
    slots = torch.arange(200, 200 + t)
    window = torch.full((t, c.sliding_window - 1), -1, dtype=torch.int32)
    for r in range(t):
        first = r - r % c.decode_seq
        rows = torch.cat((torch.arange(8 * (r // 2), 8 * (r // 2) + 8), slots[first:r + 1])).to(torch.int32)
        window[r, : rows.numel()] = rows
    angle = torch.arange(512, dtype=torch.float32)[:, None] * torch.rand(rope, generator=g) * 0.05
    return {"x_hc": torch.randn(t, hc, dm, generator=g), "hc_fn": torch.randn(mix, hc * dm, generator=g) * 0.05,
            "hc_scale": torch.tensor([2.0, 0.02, 0.25]), "hc_base": torch.randn(mix, generator=g),
            "attn_norm_w": (torch.rand(dm, generator=g) + 0.5).to(torch.bfloat16),
            "wq_a": (torch.randn(dm, lora, generator=g) / dm**0.5).to(torch.bfloat16),
            "wq_b": _int8((lora, h * d), g), "wq_b_scale": torch.rand(h * d, generator=g) / 127 + 1e-3,
            "wkv": (torch.randn(dm, d, generator=g) / dm**0.5).to(torch.bfloat16),
            "gamma_cq": (torch.rand(lora, generator=g) + 0.5).to(torch.bfloat16),
            "gamma_ckv": (torch.rand(d, generator=g) + 0.5).to(torch.bfloat16),
            "freqs_cos": torch.cos(angle).to(torch.bfloat16), "freqs_sin": torch.sin(angle).to(torch.bfloat16),
            "kv_cache": (torch.rand(2, c.block_size, 1, d, generator=g) - 0.5).to(torch.bfloat16),
            "swa_slot_mapping": slots, "window_indices": window, "position_ids": pos,
            "attn_sink": torch.randn(h, generator=g),
            "wo_a": ((torch.rand(c.o_groups, c.o_lora_rank, h * d // c.o_groups, generator=g) - 0.5) / 4
                     ).to(torch.bfloat16),
            "wo_b": _int8((dm, c.o_groups * c.o_lora_rank), g), "wo_b_scale": torch.rand(dm, generator=g) / 500}


def _stage_call(get, i: Tensors) -> Tensors:
    return get("v4_attention_stage")("SWA", *(i[n] for n in STAGE_NAMES), config=PRO)


# --- v4_moe_stage ----------------------------------------------------------------------------------------------

MOE_WEIGHTS = ("w1", "w1_scale", "w3", "w3_scale", "w2", "w2_scale")


def _moe_stage_build(seed: int, wiring: str) -> Tensors:
    """One decode batch (8 rows, 6 real: two padding rows that route nowhere but carry their residual mix) on the
    MTP layer (scored routing); the routed experts' weights stacked [E, ...]."""
    g = _g(seed)
    c = PRO
    t, hc, d, e, k, inter = (c.decode_tokens, c.hc_mult, c.hidden_size, c.n_routed_experts, c.num_experts_per_tok,
                             c.moe_intermediate_size)
    mix = (2 + hc) * hc

    def expert(n: int | None) -> Tensors:
        lead = () if n is None else (n,)
        return {"w1": _int8((*lead, inter, d), g), "w1_scale": torch.rand(*lead, inter, generator=g) * 0.02 + 0.005,
                "w3": _int8((*lead, inter, d), g), "w3_scale": torch.rand(*lead, inter, generator=g) * 0.02 + 0.005,
                "w2": _int8((*lead, d, inter), g), "w2_scale": torch.rand(*lead, d, generator=g) * 0.02 + 0.005}

    return {"x_hc": torch.randn(t, hc, d, generator=g), "hc_fn": torch.randn(mix, hc * d, generator=g) * 0.05,
            "hc_scale": torch.tensor([2.0, 0.02, 0.25]), "hc_base": torch.randn(mix, generator=g),
            "norm_w": (1 + 0.2 * torch.randn(d, generator=g)).to(torch.bfloat16),
            "gate_w": torch.randn(e, d, generator=g) / d**0.5, "gate_bias": torch.randn(e, generator=g) * 0.1,
            "layer_id": torch.tensor(c.num_hidden_layers), "num_tokens": torch.tensor(6),
            "tid2eid": torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(GATE_VOCAB)]).to(torch.int32),
            "input_ids": torch.randint(0, GATE_VOCAB, (t,), generator=g),
            **{f"routed_{n}": v for n, v in expert(e).items()}, **{f"shared_{n}": v for n, v in expert(None).items()}}


def _moe_stage_call(get, i: Tensors) -> Tensors:
    from kernels.v4.moe import V4ExpertWeights

    routed = [V4ExpertWeights(*(i[f"routed_{n}"][j] for n in MOE_WEIGHTS)) for j in range(i["routed_w1"].shape[0])]
    shared = V4ExpertWeights(*(i[f"shared_{n}"] for n in MOE_WEIGHTS))
    out = get("v4_moe_stage")(i["x_hc"], i["hc_fn"], i["hc_scale"], i["hc_base"], i["norm_w"], i["gate_w"],
                              i["gate_bias"], int(i["layer_id"]), int(i["num_tokens"]), i["tid2eid"], i["input_ids"],
                              routed, shared, config=PRO)
    # not the routing weights: the stage's mixes are summed in another FP32 order upstream, and a BF16 rounding of
    # x_mixed that flips moves them by ~50 FP32 ulps (the v4_gate trees judge the router on a given x_mixed)
    return {name: out[name] for name in ("x_out", "ffn_out", "indices")}


# --- the cases -------------------------------------------------------------------------------------------------

def _case(*, name: str, operator: str, description: str, modules: tuple[str, ...], build_inputs, call,
          comparators: dict, params: dict | None = None) -> Case:
    from backends import reference_operators

    fn = reference_operators()[operator]  # the reference: its code is what the tree's fingerprint walks
    return Case(name=name, operator=operator, description=description, wirings=("replicated",), modules=modules,
                build_inputs=build_inputs, reference=lambda i, w: call(lambda _name: fn, i),
                run=lambda b, i, w: call(b.get, i), comparators=lambda w: dict(comparators),
                params=dict(params or {}), preset="v4-pro-tiny")


def _build() -> list[Case]:
    # exact where one rule gives one byte pattern; fp32_ulps where upstream and this project sum in another FP32
    # order (the router's RMS and weight normalisation, the QR RMS over chunks, the mHC expansion, the projections)
    return [
        _case(
            name="v4_expert_routed",
            operator="v4_expert",
            description="V4 routed expert: W8A8 SwiGLU with the routing weight on the row "
                        "factor, a row of zero codes",
            modules=("kernels.v4.moe",),
            build_inputs=_expert_build(True),
            call=_expert_call,
            comparators={"y": "exact"},
        ),
        _case(
            name="v4_expert_shared",
            operator="v4_expert",
            description="V4 shared expert (no routing weight), a row of zero codes",
            modules=("kernels.v4.moe",),
            build_inputs=_expert_build(False),
            call=_expert_call,
            comparators={"y": "exact"},
        ),
        _case(
            name="v4_qkv_proj_rope",
            operator="v4_qkv_proj_rope",
            description="V4 Q/KV LoRA projection with RoPE: INT8 qr codes and their "
                        "scale, per-head RMS of q, KV RMSNorm then rotation",
            modules=("kernels.v4.qkv_proj",),
            build_inputs=_qkv_build,
            call=_qkv_call,
            comparators={"q": "exact", "kv": "exact", "qr": "exact", "qr_scale": "fp32_ulps"},
        ),
        _case(
            name="mtp_projection",
            operator="mtp_projection",
            description="MTP projection: the embedding and previous-stream RMSNorms, "
                        "smoothed INT8 projections, summed into the FP32 streams",
            modules=("kernels.v4.mtp",),
            build_inputs=_mtp_build,
            call=_mtp_call,
            comparators={"out": "fp32_ulps"},
        ),
        _case(
            name="v4_hc_post",
            operator="hc_post",
            description="mHC expansion after a sublayer, FP32 streams end to end (rule fp32)",
            modules=("kernels.reference.mhc",),
            build_inputs=_hc_post_build,
            call=_hc_post_call,
            comparators={"x_out": "fp32_ulps"},
        ),
        _case(
            name="v4_attention_stage_swa",
            operator="v4_attention_stage",
            description="V4 SWA decode attention stage: hc_pre, RMSNorm, "
                        "Q/KV, the window-cache write read back by the attention, SWA attention with the grouped output "
                        "projection, hc_post",
            modules=("kernels.v4.attention_stage",),
            build_inputs=_stage_build,
            call=_stage_call,
            comparators={"x_out": "fp32_ulps", "kv_cache": "exact", "qr": "exact", "qr_scale": "qr_scale"},
        ),
        _case(
            name="v4_hc_post_pro",
            operator="hc_post",
            description="mHC expansion at V4-Pro's width (D 7168, 4 rows): the geometry "
                        "upstream's hc_post_test kernel is compiled for, so the a5 simulator runs it",
            modules=("kernels.reference.mhc",),
            build_inputs=_hc_post_pro_build,
            call=_hc_post_call,
            comparators={"x_out": "fp32_ulps"},
        ),
        _case(
            name="v4_moe_stage",
            operator="v4_moe_stage",
            description="V4 MoE stage at decode on the MTP layer: hc_pre, the router, routed "
                        "and shared experts, the combine, hc_post; 2 padding rows that route nowhere and carry their residual "
                        "mix",
            modules=("kernels.v4.moe", "kernels.v4.gate", "kernels.reference.mhc"),
            build_inputs=_moe_stage_build,
            call=_moe_stage_call,
            comparators={"x_out": "fp32_ulps", "ffn_out": "exact", "indices": "exact"},
        ),
        _case(
            name="v4_embed_pack",
            operator="v4_embed_pack",
            description="V4 input pack: upstream's fixture ids, clamped into a 32-row "
                        "vocabulary (-1 and 0 read row 0; 31, 32 and 39 the last row), each row widened to FP32 in every "
                        "stream",
            modules=("kernels.v4.input_pack",),
            build_inputs=_embed_build,
            call=_embed_call,
            comparators={"x_hc": "exact"},
        ),
        _case(
            name="v4_lm_head",
            operator="lm_head",
            description=f"LM head on TP{LM_TP}: the full FP32 logits of two vocabulary shards",
            modules=("kernels.reference.lm_head",),
            build_inputs=_lm_build,
            call=_lm_call,
            comparators={"logits": "fp32_ulps"},
            params={"tp": LM_TP},
        ),
    ]


CASES = _build()
