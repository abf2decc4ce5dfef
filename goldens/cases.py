"""Recordable cases: for each operator, how inputs are made from a seed, how the reference computes the
expected outputs, how a backend runs on stored inputs, which comparator judges each output, and the
reference fingerprint.

Trees are small tiny-preset problems with edge-aimed fixtures (sentinel-filled outputs, permuted pages,
spare unmapped rows, -1 slots, padding rows, ties in Top-K). Spec: §7.2, §7.3.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import random
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from goldens.catalog import ArgSpec
from goldens.codec import dtype_name
from goldens.errors import GoldenStoreError
from kernels.config import FLASH_TINY

Tensors = dict[str, torch.Tensor]


@dataclass(frozen=True)
class Case:
    name: str
    operator: str
    description: str
    wirings: tuple[str, ...]
    modules: tuple[str, ...]  # modules whose arithmetic defines the expected outputs
    build_inputs: Callable[[int, str], Tensors]
    reference: Callable[[Tensors, str], Tensors]
    run: Callable[[object, Tensors, str], Tensors]  # (backend, inputs, wiring) -> outputs
    comparators: Callable[[str], dict[str, str]]  # wiring -> {output: comparator}
    inout: tuple[str, ...] = ()
    params: dict = field(default_factory=dict)
    preset: str = "flash-tiny"
    base: str | None = None  # a case derived from another (a recorded counterexample): its operator and call
    upstream: dict = field(default_factory=dict)  # a case whose expected outputs are upstream's (see upstream_case)

    def arg_specs(self, inputs: Tensors, outputs: Tensors) -> tuple[ArgSpec, ...]:
        specs = []
        for name, t in inputs.items():
            specs.append(ArgSpec(name, tuple(t.shape), dtype_name(t.dtype), "inout" if name in self.inout else "in",
                                 t.ndim == 0))
        for name, t in outputs.items():
            if name not in self.inout:
                specs.append(ArgSpec(name, tuple(t.shape), dtype_name(t.dtype), "out"))
        return tuple(specs)


def rounding_versions(case: Case) -> dict[str, str]:
    out = {}
    for m in case.modules:
        v = getattr(importlib.import_module(m), "ROUNDING_VERSION", None)
        if v is not None:
            out[m] = v
    return out


def fingerprint_parts(case: Case, read: set[str] | None = None) -> dict[str, str]:
    """What can move the case's expected outputs: every function, class and constant of this project its
    reference reaches, each by its normalised code or value (goldens/fingerprint.py), plus the operator. Of a
    watched rule table, only the entries in ``read`` (what the reference looked up; None: all)."""
    from goldens.fingerprint import parts

    if case.upstream:  # upstream's numbers: they move when upstream's golden does, never with this project's code
        u = case.upstream
        return {f"upstream {u.get('repository')}@{u.get('commit')}": " ".join(u.get("goldens", [])),
                f"operator {case.operator}": case.operator}
    return {**parts(case.reference, read), f"operator {case.operator}": case.operator}


def fingerprint(case: Case, read: set[str] | None = None) -> str:
    """Reference fingerprint: a hash of ``fingerprint_parts``. Renaming a local, a comment or a docstring
    moves nothing; a changed function, rounding rule, preset field or constant the reference reaches does,
    and only the trees that reach it become stale."""
    from goldens.fingerprint import combined

    return combined(fingerprint_parts(case, read))


# ---------------------------------------------------------------------------
# metadata


def _metadata_case_inputs(seed: int, wiring: str) -> Tensors:
    from contracts.strategies import BatchCase, materialize

    rng = random.Random(seed)
    qlens = (0, 1, 6, 23, rng.randint(1, 40))
    kvs = (0, 17, 129, 255, rng.randint(0, 3000) | 1)  # empty, decode, odd resume, page edge
    case = BatchCase(config=FLASH_TINY, query_lens=qlens, kv_lens=kvs, padding=3, tp=4,
                     inactive_state=(False, True, False, False, False), spare_pages=2, free_behind_window=True,
                     seed=seed)
    kw = materialize(case)
    out: Tensors = {"query_start_loc": kw["query_start_loc"], "kv_seq_lens": kw["kv_seq_lens"],
                    "window_block_table": kw["window_block_table"].to(torch.int32)}
    for src, t in kw["compressed_block_tables"].items():
        out[f"compressed_block_tables_src{src}"] = t.to(torch.int32)
    for src, t in kw["state_block_tables"].items():
        out[f"state_block_tables_src{src}"] = t
    out["tp_size"] = torch.tensor(kw["tp_size"], dtype=torch.int32)
    out["capacity"] = torch.tensor(kw["capacity"], dtype=torch.int32)
    return out


def _metadata_kwargs(inputs: Tensors) -> dict:
    return dict(
        query_start_loc=inputs["query_start_loc"], kv_seq_lens=inputs["kv_seq_lens"],
        window_block_table=inputs["window_block_table"],
        compressed_block_tables={int(k.rsplit("src", 1)[1]): v for k, v in inputs.items()
                                 if k.startswith("compressed_block_tables_src")},
        state_block_tables={int(k.rsplit("src", 1)[1]): v for k, v in inputs.items()
                            if k.startswith("state_block_tables_src")},
        config=FLASH_TINY, tp_size=int(inputs["tp_size"]), capacity=int(inputs["capacity"]))


def _flatten_metadata(meta) -> Tensors:
    out: Tensors = {}
    for name, value in meta.as_dict().items():
        if isinstance(value, dict):
            for src, t in sorted(value.items()):
                out[f"{name}_src{src}"] = t
        elif isinstance(value, torch.Tensor):
            out[name] = value
        else:
            out[name] = torch.tensor(value, dtype=torch.int64)
    return out


def _metadata_run(backend, inputs: Tensors, wiring: str) -> Tensors:
    return _flatten_metadata(backend.get("build_forward_metadata")(**_metadata_kwargs(inputs)))


def _metadata_reference(inputs: Tensors, wiring: str) -> Tensors:
    from kernels.metadata import build_forward_metadata

    return _flatten_metadata(build_forward_metadata(**_metadata_kwargs(inputs)))


# ---------------------------------------------------------------------------
# cache publication


def _cache_case(kind: str) -> Case:
    def build(seed: int, wiring: str) -> Tensors:
        from kernels.cache import empty_cache, layouts

        lay = layouts(FLASH_TINY)[kind]
        g = torch.Generator().manual_seed(seed)
        blocks = 3
        cache = empty_cache(lay, blocks, generator=g)  # random sentinel bytes everywhere
        rows = blocks * lay.rows_per_block
        n = rows - 5  # spare rows stay unmapped
        rng = random.Random(seed)
        phys = rng.sample(range(rows), n)
        slots = torch.tensor([(-1 if rng.random() < 0.25 else p) for p in phys], dtype=torch.int64)
        values = (torch.randn((n, lay.logical_width), generator=g) * torch.logspace(-3, 2, n).unsqueeze(-1))
        values[0, :] = 0.0
        values[1, ::2] = 0.25 * (2.0 ** rng.randint(-3, 3))  # exact E2M1 midpoints for the FP4 rules
        return {"payload": cache.payload, "scale": cache.scale, "values": values.to(torch.bfloat16),
                "slots": slots}

    def _publish(fn, inputs: Tensors) -> Tensors:
        from kernels.cache import QuantCache, layouts

        cache = QuantCache(layouts(FLASH_TINY)[kind], inputs["payload"].clone(), inputs["scale"].clone())
        out = fn(cache, inputs["values"].float(), inputs["slots"])
        return {"payload": out.payload, "scale": out.scale}

    def reference(inputs: Tensors, wiring: str) -> Tensors:
        from kernels.cache import publish

        return _publish(publish, inputs)

    def run(backend, inputs: Tensors, wiring: str) -> Tensors:
        return _publish(backend.get("cache_publish"), inputs)

    from kernels.cache import layouts

    return Case(f"cache_{kind}", "cache_publish", f"publish into the {kind} cache: sentinel bytes, -1 slots, "
                f"permuted rows, spare unmapped rows, zero and midpoint rows", ("replicated",),
                ("kernels.quant", "kernels.cache"), build, reference, run,
                lambda w: {"payload": "cache_payload", "scale": "cache_scale"}, inout=("payload", "scale"),
                params={"rule": layouts(FLASH_TINY)[kind].rule})


# ---------------------------------------------------------------------------
# compressor ring


def _compressor_build(seed: int, wiring: str) -> Tensors:
    c = FLASH_TINY
    g = torch.Generator().manual_seed(seed)
    hidden, d, cap, blocks = c.hidden_size, c.head_dim, c.state_capacity, 4
    # request rows: [odd resume at 7, chunk of 9 > capacity; new request of 5; inactive request]
    lens, starts, table = [3, 9, 5, 2], [7, 0, 0, 4], [2, 0, 3, -1]
    xs, pos, req = [], [], []
    for r, (n, p0) in enumerate(zip(lens, starts, strict=True)):
        xs.append(torch.randn((n, hidden), generator=g))
        pos += list(range(p0, p0 + n))
        req += [r] * n
    padding = 2
    x = torch.cat(xs + [torch.randn((padding, hidden), generator=g)]).to(torch.bfloat16)
    qsl = [0]
    for n in lens:
        qsl.append(qsl[-1] + n)
    return {"x": x, "query_start_loc": torch.tensor(qsl, dtype=torch.int32),
            "position_ids": torch.tensor(pos + [-1] * padding, dtype=torch.int32),
            "token_to_req_indices": torch.tensor(req + [-1] * padding, dtype=torch.int32),
            "state_block_table": torch.tensor(table, dtype=torch.int32).reshape(-1, 1),
            "state_cache": torch.randn((blocks, cap, 2 * d), generator=g) * 3,
            "wkv": torch.randn((hidden, d), generator=g) / hidden**0.5,
            "wgate": torch.randn((hidden, d), generator=g) / hidden**0.5,
            "norm_weight": torch.rand(d, generator=g) + 0.5}


def _compressor_call(fn, inputs: Tensors) -> Tensors:
    from kernels.reference.compressor import CompressorWeights

    latent, publish, state = fn(inputs["x"], inputs["query_start_loc"], inputs["position_ids"],
                                inputs["token_to_req_indices"], inputs["state_block_table"],
                                inputs["state_cache"].clone(),
                                CompressorWeights(inputs["wkv"], inputs["wgate"], inputs["norm_weight"]))
    return {"latent": latent, "publish": publish, "state_cache": state}


EPOCHS = 5


def _compressor_epochs_build(seed: int, wiring: str) -> Tensors:
    """Three requests decoding one token per epoch for EPOCHS epochs (odd and even starts), the ring state
    threaded from each epoch to the next."""
    c = FLASH_TINY
    g = torch.Generator().manual_seed(seed)
    hidden, d, cap = c.hidden_size, c.head_dim, c.state_capacity
    starts, table = [6, 3, 0], [0, 2, 1]
    return {"x": torch.randn((EPOCHS, 3, hidden), generator=g).to(torch.bfloat16),
            "position_ids": torch.tensor([[p + e for p in starts] for e in range(EPOCHS)], dtype=torch.int32),
            "state_block_table": torch.tensor(table, dtype=torch.int32).reshape(-1, 1),
            "state_cache": torch.randn((3, cap, 2 * d), generator=g) * 3,
            "wkv": torch.randn((hidden, d), generator=g) / hidden**0.5,
            "wgate": torch.randn((hidden, d), generator=g) / hidden**0.5,
            "norm_weight": torch.rand(d, generator=g) + 0.5}


def _compressor_epochs_call(fn, inputs: Tensors) -> Tensors:
    """Epoch e's call takes the state epoch e-1 left (C2A is not idempotent across epochs: CS-18)."""
    from kernels.reference.compressor import CompressorWeights

    weights = CompressorWeights(inputs["wkv"], inputs["wgate"], inputs["norm_weight"])
    state, latents, publish = inputs["state_cache"].clone(), [], []
    requests = torch.arange(3, dtype=torch.int32)
    for e in range(inputs["x"].shape[0]):
        latent, pub, state = fn(inputs["x"][e], torch.arange(4, dtype=torch.int32), inputs["position_ids"][e],
                                requests, inputs["state_block_table"], state, weights)
        latents.append(latent)
        publish.append(pub)
    return {"latent": torch.stack(latents), "publish": torch.stack(publish), "state_cache": state}


# ---------------------------------------------------------------------------
# RoPE rows


def _rope_build(seed: int, wiring: str) -> Tensors:
    from kernels.reference.rope import precompute_rope_tables

    rng = random.Random(seed)
    cos, sin = precompute_rope_tables(257, True, FLASH_TINY)
    positions = [256, -1, 0, 3, 3, 129, -9] + [rng.randint(-3, 256) for _ in range(6)] + [999_999] * 3
    tokens = len(positions)
    half = cos.shape[1]
    return {"freqs_cos": cos, "freqs_sin": sin, "position_ids": torch.tensor(positions, dtype=torch.int32),
            "num_tokens": torch.tensor(tokens - 3, dtype=torch.int32),
            "rope_cos": torch.full((tokens, half), 17.0), "rope_sin": torch.full((tokens, half), 19.0)}


def _rope_call(fn, inputs: Tensors) -> Tensors:
    rc, rs = inputs["rope_cos"].clone(), inputs["rope_sin"].clone()
    fn(inputs["freqs_cos"], inputs["freqs_sin"], inputs["position_ids"], int(inputs["num_tokens"]), rc, rs)
    return {"rope_cos": rc, "rope_sin": rs}


# ---------------------------------------------------------------------------
# indexer / Top-K


def _indexer_build(seed: int, wiring: str) -> Tensors:
    from contracts.strategies import IndexerCase

    case = IndexerCase(lens_per_token=((0, 5, 16), (17, 40), (33,)), topk=16, heads=4, dim=32, block=16,
                       tie_rows=True, seed=seed)
    out = case.build()
    out["topk"] = torch.tensor(case.topk, dtype=torch.int32)
    out["block_size"] = torch.tensor(case.block, dtype=torch.int32)
    return out


def _indexer_call(score_fn, select_fn, inputs: Tensors) -> Tensors:
    keys = ("q", "head_weights", "keys", "block_table", "request_ids", "compressed_lens")
    bs = int(inputs["block_size"])
    scores = score_fn(**{k: inputs[k] for k in keys}, block_size=bs, width=int(inputs["compressed_lens"].max()))
    sel = select_fn(scores, inputs["block_table"], inputs["request_ids"], topk=int(inputs["topk"]), block_size=bs)
    return {"scores": scores, "topk_indices": sel}


# ---------------------------------------------------------------------------
# sequence-parallel shard / gather (both wirings)


def _sp_build(seed: int, wiring: str) -> Tensors:
    g = torch.Generator().manual_seed(seed + (1 if wiring == "sharded" else 0))
    active, capacity, tp = 5, 8, 4
    return {"x": (torch.rand((active, 16), generator=g) + 0.5).to(torch.bfloat16),
            "token_ids": torch.randperm(64, generator=g)[:active].to(torch.int32),
            "positions": torch.randint(0, 4000, (active,), generator=g, dtype=torch.int32),
            "tp": torch.tensor(tp, dtype=torch.int32), "capacity": torch.tensor(capacity, dtype=torch.int32)}


def _sp_call(shard, gather, inputs: Tensors, wiring: str) -> Tensors:
    tp, cap = int(inputs["tp"]), int(inputs["capacity"])
    slabs = shard(inputs["x"], inputs["token_ids"], inputs["positions"], tp=tp, capacity=cap)
    if wiring == "sharded":  # the per-rank slab ABI: [TP, width, ...]
        return {"slab_payload": torch.stack([s.payload for s in slabs]),
                "slab_token_ids": torch.stack([s.token_ids for s in slabs]),
                "slab_positions": torch.stack([s.positions for s in slabs]),
                "slab_valid": torch.stack([s.valid for s in slabs])}
    x, tok, pos = gather(slabs, active_tokens=inputs["x"].shape[0], capacity=cap)
    return {"gathered": x, "gathered_token_ids": tok, "gathered_positions": pos}


# ---------------------------------------------------------------------------
# attention half-layers: every mode x phase, both wirings, at TP2 on the tiny preset

HALF_LAYER_TP = 2
HALF_LAYER_MODULES = ("kernels.reference.attention_layer", "kernels.reference.attention", "kernels.reference.o_proj",
                      "kernels.reference.tp", "kernels.reference.compressor", "kernels.reference.indexer",
                      "kernels.reference.rope", "kernels.cache", "kernels.quant", "kernels.half_layer",
                      "kernels.sequence_parallel")


HALF_LAYER_INOUT = ("window_payload", "window_scale", "compressed_payload", "compressed_scale", "index_payload",
                    "index_scale", "state_cache")  # caches the entry updates in place (a mode returns those it has)


def _half_layer_case(kind, phase: str) -> Case:
    from contracts.half_layer_cases import HalfLayerCase, build
    from kernels.reference.attention_layer import attention_half_layer

    def inputs(seed: int, wiring: str) -> Tensors:
        return build(HalfLayerCase(kind, phase, wiring, HALF_LAYER_TP, seed=seed))

    def call(fn, i: Tensors, wiring: str) -> Tensors:
        return fn(i, kind=kind, phase=phase, wiring=wiring, tp=HALF_LAYER_TP, config=FLASH_TINY)

    def comparators(wiring: str) -> dict[str, str]:
        outputs = call(attention_half_layer, inputs(0, wiring), wiring)
        return dict.fromkeys(outputs, "half_layer")

    padding = "a 2-row inactive suffix" if phase == "decode" and kind.value == "C2A_REUSE" else (
        "3 padding rows" if phase == "prefill" else "no padding")
    return Case(f"attn_{kind.value.lower()}_{phase}", "attention_half_layer",
                f"{kind.value} {phase} half-layer at TP{HALF_LAYER_TP}: 3 requests with history across permuted "
                f"pages, {padding}, 13.0 sentinel rows", ("replicated", "sharded"), HALF_LAYER_MODULES, inputs,
                lambda i, w: call(attention_half_layer, i, w), lambda b, i, w: call(b.get("attention_half_layer"), i, w),
                comparators, inout=HALF_LAYER_INOUT,
                params={"kind": kind.value, "phase": phase, "tp": HALF_LAYER_TP, "preset": "flash-tiny"})


# ---------------------------------------------------------------------------
# mHC


def _mhc_build(seed: int, wiring: str) -> Tensors:
    g = torch.Generator().manual_seed(seed)
    hc, dim = FLASH_TINY.hc_mult, FLASH_TINY.hidden_size
    mix = (2 + hc) * hc
    tokens = 7
    x = torch.randn(tokens, hc, dim, generator=g)
    x[1] *= 40.0  # a large row: the inverse RMS, not the magnitude, sets the logits
    x[2, :, ::2] = 0.0  # a sparse row
    return {"x_hc": x, "function": torch.randn(mix, hc * dim, generator=g) / (hc * dim) ** 0.5,
            "scale": torch.randn(3, generator=g), "base": torch.randn(mix, generator=g),
            "sublayer": torch.randn(tokens, dim, generator=g).to(torch.bfloat16),
            "num_tokens": torch.tensor(5, dtype=torch.int32)}


def _mhc_call(ops, inputs: Tensors) -> Tensors:
    m = ops("hc_mixes")(inputs["x_hc"], inputs["function"], inputs["scale"], inputs["base"],
                        num_tokens=int(inputs["num_tokens"]), config=FLASH_TINY)
    x = inputs["x_hc"]
    return {"pre": m.pre, "post": m.post, "residual": m.residual, "collapsed": ops("hc_pre")(x, m.pre),
            "expanded": ops("hc_post")(inputs["sublayer"], x, m.post, m.residual), "head": ops("hc_head")(x, m.pre)}


# ---------------------------------------------------------------------------
# MoE with expert parallelism


def _moe_build(ep: int):
    def build(seed: int, wiring: str) -> Tensors:
        from kernels import quant

        c = FLASH_TINY
        g = torch.Generator().manual_seed(seed)
        experts, inter, dim, rows = c.n_routed_experts, c.moe_intermediate_size, c.hidden_size, 10
        counts = ([10, 7] if ep == 2 else [10, 7, 0, 4])[:ep]

        def fp4(n_rows: int, cols: int) -> tuple[torch.Tensor, torch.Tensor]:
            codes = torch.randint(0, 16, (experts, n_rows, cols), generator=g, dtype=torch.uint8)
            scales = torch.randint(122, 126, (experts, n_rows, cols // 32), generator=g, dtype=torch.uint8)
            return quant.pack_fp4(codes), scales

        w1, s1 = fp4(inter, dim)
        w3, s3 = fp4(inter, dim)
        w2, s2 = fp4(dim, inter)
        if ep == 4:  # upstream's fixture routing bias: +4 on 6 spread experts, -1 elsewhere (MO-10)
            bias = torch.full((experts,), -1.0)
            bias[torch.linspace(0, experts - 1, c.num_experts_per_tok).round().long()] = 4.0
        else:
            bias = torch.randn(experts, generator=g) * 0.05
        return {"xs": torch.randn(ep, rows, dim, generator=g).to(torch.bfloat16),
                "router": torch.randn(experts, dim, generator=g) / dim**0.5, "bias": bias,
                "w1": w1, "w1_scale": s1, "w3": w3, "w3_scale": s3, "w2": w2, "w2_scale": s2,
                "shared_w1": (torch.randn(inter, dim, generator=g) / dim**0.5).to(torch.bfloat16),
                "shared_w3": (torch.randn(inter, dim, generator=g) / dim**0.5).to(torch.bfloat16),
                "shared_w2": (torch.randn(dim, inter, generator=g) / inter**0.5).to(torch.bfloat16),
                "num_tokens": torch.tensor(counts, dtype=torch.int32)}
    return build


def _moe_call(get, inputs: Tensors) -> Tensors:
    from kernels.reference.moe import ExpertWeights, expert_weights

    c = FLASH_TINY
    ep = inputs["xs"].shape[0]
    experts = [expert_weights("mxfp4", inputs["w1"][e], inputs["w3"][e], inputs["w2"][e],
                              (inputs["w1_scale"][e], inputs["w3_scale"][e], inputs["w2_scale"][e]))
               for e in range(inputs["w1"].shape[0])]
    shared = ExpertWeights(inputs["shared_w1"], inputs["shared_w3"], inputs["shared_w2"])
    xs = list(inputs["xs"])
    gates = [get("moe_gate")(x, inputs["router"], inputs["bias"], config=c) for x in xs]
    res = get("moe_ep")(xs, gates, experts, shared, ep=ep, num_tokens=inputs["num_tokens"].tolist(), config=c)
    return {"weights": torch.stack([w for w, _i in gates]), "ids": torch.stack([i for _w, i in gates]),
            "output": torch.stack(res.outputs), "send_counts": res.send_counts,
            "recv_y": torch.stack(res.recv_y), "recv_expert_count": torch.stack(res.recv_expert_count)}


# ---------------------------------------------------------------------------
# the model boundary: embedding pack, LM head, greedy pick

LM_HEAD_TP = 4


def _lm_head_build(seed: int, wiring: str) -> Tensors:
    c = FLASH_TINY
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(6, c.hidden_size, generator=g).to(torch.bfloat16)
    weight = (torch.randn(c.vocab_size, c.hidden_size, generator=g) / c.hidden_size**0.5).to(torch.bfloat16)
    best = (hidden.float() @ weight.float().T).argmax(1)
    rows = c.vocab_size // LM_HEAD_TP
    weight[rows + 3] = weight[best[0]]  # token 0: an exact tie across two vocab shards
    weight[c.vocab_size - 1] = weight[best[1]]  # token 1: a tie with the last id
    return {"hidden": hidden, "weight": weight, "ids_in": torch.tensor([7, -1, c.vocab_size, c.vocab_size + 7, 0, 3]),
            "embedding": torch.randn(c.vocab_size, c.hidden_size, generator=g).to(torch.bfloat16)}


def _lm_head_call(get, inputs: Tensors, wiring: str) -> Tensors:
    shards = get("lm_head")(inputs["hidden"], inputs["weight"], tp=LM_HEAD_TP)
    full = torch.cat(shards, dim=1)
    out = {"logits": full} if wiring == "replicated" else {"logit_shards": torch.stack(shards)}
    out["ids"] = get("greedy_pick")(full)
    out["x_hc"] = get("embed_pack")(inputs["ids_in"], inputs["embedding"], config=FLASH_TINY)
    return out


def _boundary_build(seed: int, wiring: str) -> Tensors:
    """Upstream's id set (0, 1, 17, V-1, V, V+3, 2, 5: two past the vocabulary), a random embedding and final
    norm weight, and a non-identity delayed pre-mix (positive, like the sigmoid gates, rows not summing to 1:
    every stream holds the same row here, so only the weights' sum tells the collapse from stream 0)."""
    c = FLASH_TINY
    g = torch.Generator().manual_seed(seed)
    v = c.vocab_size
    mix = torch.rand(8, c.hc_mult, generator=g) + 0.1
    return {"ids_in": torch.tensor([0, 1, 17, v - 1, v, v + 3, 2, 5]),
            "embedding": torch.randn(v, c.hidden_size, generator=g).to(torch.bfloat16),
            "pre_mix": mix,
            "final_norm_w": torch.randn(c.hidden_size, generator=g).to(torch.bfloat16)}


def _boundary_call(get, inputs: Tensors, wiring: str) -> Tensors:
    x_hc = get("embed_pack")(inputs["ids_in"], inputs["embedding"], config=FLASH_TINY)
    hidden = get("hc_head")(x_hc.float(), inputs["pre_mix"])
    return {"x_hc": x_hc.float(), "hidden": hidden,
            "x_normed": get("final_norm")(hidden, inputs["final_norm_w"], config=FLASH_TINY)}


# ---------------------------------------------------------------------------
# the Engram block (layers 1 and 14)

ENGRAM_TP = 2


def _engram_build(seed: int, wiring: str) -> Tensors:
    """A 96-row table (two shards of 48 on TP2), hash ids that hit both shards and repeat rows, BF16 streams,
    and a wkv scaled so the gate sees both signs of dot, some near zero."""
    c = FLASH_TINY
    from kernels.reference.engram import hash_columns

    g = torch.Generator().manual_seed(seed)
    cols, hd, hc, d = hash_columns(c), c.engram_head_dim, c.hc_mult, c.hidden_size
    ids = torch.randint(0, 96, (7, cols), generator=g, dtype=torch.int32)
    ids[0] = torch.arange(cols) % 4  # one row gathers the same few table rows again and again
    return {"hash_ids": ids, "table": torch.randn(96, hd, generator=g).to(torch.bfloat16),
            "wkv": (torch.randn(cols * hd, (hc + 1) * d, generator=g) / (cols * hd) ** 0.5).to(torch.bfloat16),
            "weight": torch.rand(hc, d, generator=g) + 0.5,
            "x": torch.randn(7, hc, d, generator=g).to(torch.bfloat16)}


def _engram_call(get, inputs: Tensors, wiring: str) -> Tensors:
    args = (inputs["wkv"], inputs["weight"], inputs["x"])
    if wiring == "replicated":
        return {"out": get("engram")(inputs["hash_ids"], inputs["table"], *args, config=FLASH_TINY)}
    shards = list(inputs["table"].chunk(ENGRAM_TP))
    return {"out": torch.stack(get("engram_tp")(inputs["hash_ids"], shards, *args, tp=ENGRAM_TP,
                                                config=FLASH_TINY))}


# ---------------------------------------------------------------------------
# the decode Block

BLOCK_KEYS = ("x_hc", "incoming_pre_mix", "attn_function", "attn_scale", "attn_base", "ffn_function", "ffn_scale",
              "ffn_base", "router", "bias", "experts_w1", "experts_w3", "experts_w2", "shared_w1", "shared_w3",
              "shared_w2")


def _block_build(kind):
    def build(seed: int, wiring: str) -> Tensors:
        from contracts.block_cases import block_inputs

        i = block_inputs(kind, seed)
        e = i["experts"]
        return {**i["attention_inputs"], "x_hc": i["x_hc"], "incoming_pre_mix": i["incoming_pre_mix"],
                "attn_function": i["attention_mhc"].function, "attn_scale": i["attention_mhc"].scale,
                "attn_base": i["attention_mhc"].base, "ffn_function": i["ffn_mhc"].function,
                "ffn_scale": i["ffn_mhc"].scale, "ffn_base": i["ffn_mhc"].base, "router": i["router"],
                "bias": i["bias"], "experts_w1": torch.stack([x.w1 for x in e]),
                "experts_w3": torch.stack([x.w3 for x in e]), "experts_w2": torch.stack([x.w2 for x in e]),
                "shared_w1": i["shared"].w1, "shared_w3": i["shared"].w3, "shared_w2": i["shared"].w2}
    return build


def _block_call(fn, inputs: Tensors, kind) -> Tensors:
    from contracts.block_cases import TP
    from kernels.reference.block import MhcWeights
    from kernels.reference.moe import ExpertWeights

    attention = {k: v for k, v in inputs.items() if k not in BLOCK_KEYS}
    experts = [ExpertWeights(inputs["experts_w1"][n], inputs["experts_w3"][n], inputs["experts_w2"][n])
               for n in range(inputs["experts_w1"].shape[0])]
    return fn(inputs["x_hc"], inputs["incoming_pre_mix"], attention,
              MhcWeights(inputs["attn_function"], inputs["attn_scale"], inputs["attn_base"]),
              MhcWeights(inputs["ffn_function"], inputs["ffn_scale"], inputs["ffn_base"]), inputs["router"],
              inputs["bias"], experts, ExpertWeights(inputs["shared_w1"], inputs["shared_w3"], inputs["shared_w2"]),
              kind=kind, tp=TP, config=FLASH_TINY)


# ---------------------------------------------------------------------------
# V4 (spec §8): the V4-Pro tiny twin's kernel preset


def _v4_config():
    from kernels.config import V4_PRO_TINY

    return V4_PRO_TINY.kernel_preset()


def _v4_metadata_build(seed: int, wiring: str) -> Tensors:
    """Upstream's HCA decode start regimes (a long start, the ratio-128 boundary, a block crossing, a state page
    edge) over request-interleaved tables with one unmapped window page."""
    g = torch.Generator().manual_seed(seed)
    starts = torch.tensor([300, 127, 255, 7])
    tables = {name: torch.randperm(4 * n, generator=g).reshape(4, n).to(torch.int32)
              for name, n in (("ori_table", 4), ("cmp4_table", 2), ("cmp128_table", 2), ("state4_table", 80),
                              ("state128_table", 40))}
    tables["ori_table"][1, 0] = -1
    return {"starts": starts, **tables}


def _v4_metadata_call(get, inputs: Tensors, wiring: str) -> Tensors:
    md = get("v4_decode_metadata")(inputs["starts"], inputs["ori_table"],
                                   {4: inputs["cmp4_table"], 128: inputs["cmp128_table"]},
                                   {4: inputs["state4_table"], 128: inputs["state128_table"]}, config=_v4_config())
    limit = min(_v4_config().max_position_embeddings // 128, _v4_config().index_topk)
    return {"position_ids": md.position_ids, "kv_seq_lens": md.kv_seq_lens, "ori_slot_mapping": md.ori_slot_mapping,
            "swa_indices": md.swa_indices, "swa_lens": md.swa_lens, "history_indices": md.history_indices,
            "history_lens": md.history_lens, "cmp4_slot_mapping": md.cmp_slot_mapping[4],
            "cmp128_slot_mapping": md.cmp_slot_mapping[128], "state4_slot_mapping": md.state_slot_mapping[4],
            "state128_slot_mapping": md.state_slot_mapping[128],
            "hca_topk": get("hca_topk")(md.position_ids, md.kv_seq_lens, seq=2, limit=limit)}


def _v4_compressor_build(ratio: int, overlap: bool):
    def build(seed: int, wiring: str) -> Tensors:
        g = torch.Generator().manual_seed(seed)
        hidden, d, page = 32, 8, (4 if overlap else 8)
        c = (2 if overlap else 1) * d
        n = 2 * ratio + 3
        blocks = -(-n // page)
        return {"x": torch.randn(2 * n, hidden, generator=g).to(torch.bfloat16),
                "position_ids": torch.cat((torch.arange(n), torch.arange(n))),
                "token_to_req": torch.cat((torch.zeros(n, dtype=torch.int64), torch.ones(n, dtype=torch.int64))),
                "state_block_table": torch.arange(2 * blocks, dtype=torch.int32).reshape(2, blocks).flip(1),
                "state_pool": torch.randn(2 * blocks, page, 2 * c, generator=g),
                "wkv": torch.randn(hidden, c, generator=g) / hidden**0.5,
                "wgate": torch.randn(hidden, c, generator=g) / hidden**0.5,
                "ape": torch.randn(ratio, c, generator=g) * 0.5, "norm": torch.rand(d, generator=g) + 0.5}
    return build


def _v4_compressor_call(get, inputs: Tensors, ratio: int, overlap: bool) -> Tensors:
    from kernels.v4.compressor import V4CompressorWeights

    w = V4CompressorWeights(inputs["wkv"], inputs["wgate"], inputs["ape"], inputs["norm"])
    out, closes, pool = get("v4_compressor")(inputs["x"], inputs["position_ids"], inputs["token_to_req"],
                                             inputs["state_block_table"], inputs["state_pool"], w, ratio=ratio,
                                             overlap=overlap)
    return {"compressed": out, "closes": closes, "state_pool": pool}


def _v4_attention_build(path: str, config=None, ori_pages: int = 12, cmp_pages: int = 8):
    def build(seed: int, wiring: str) -> Tensors:
        """V4-Pro (tiny, or ``config``) decode attention of one path at upstream's HCA start regimes: the windows
        from v4_decode_metadata (an unmapped window page), compressed pages in a shuffled order, HCA's own top-k or
        a raw CSA indexer top-k with slots past the causal bound; pools of ``ori_pages`` / ``cmp_pages`` pages
        (12 and 8 of them in use)."""
        from kernels.v4.decode_metadata import hca_topk, v4_decode_metadata

        c = config or _v4_config()
        g = torch.Generator().manual_seed(seed)
        t, h, d, bs = c.decode_tokens, c.num_attention_heads, c.head_dim, c.block_size
        ori_table = torch.randperm(ori_pages, generator=g)[:12].reshape(4, 3).to(torch.int32)
        ori_table[1, 0] = -1
        cmp_table = torch.randperm(cmp_pages, generator=g)[:8].reshape(4, 2).to(torch.int32)
        md = v4_decode_metadata(torch.tensor([300, 127, 255, 7]), ori_table, {4: cmp_table, 128: cmp_table},
                                {4: torch.zeros(4, 80, dtype=torch.int32), 128: torch.zeros(4, 40, dtype=torch.int32)},
                                config=c)
        groups, lora = c.o_groups, c.o_lora_rank
        inputs = {"q": (torch.rand(t, h, d, generator=g) - 0.5).to(torch.bfloat16),
                  "ori_kv": (torch.rand(ori_pages, bs, 1, d, generator=g) - 0.5).to(torch.bfloat16),
                  "window_indices": md.swa_indices, "position_ids": md.position_ids,
                  "cmp_kv": (torch.rand(cmp_pages if path != "SWA" else 1, bs, 1, d, generator=g) - 0.5).to(torch.bfloat16),
                  "cmp_block_table": cmp_table if path != "SWA" else torch.zeros(4, 1, dtype=torch.int32),
                  "attn_sink": torch.randn(h, generator=g),
                  "freqs_cos": torch.cos(md.position_ids[:, None] * torch.rand(c.qk_rope_head_dim, generator=g))
                  .to(torch.bfloat16),
                  "freqs_sin": torch.sin(md.position_ids[:, None] * torch.rand(c.qk_rope_head_dim, generator=g))
                  .to(torch.bfloat16),
                  "wo_a": ((torch.rand(groups, lora, h * d // groups, generator=g) - 0.5) / 4).to(torch.bfloat16),
                  "wo_b": torch.randint(-127, 128, (c.hidden_size, groups * lora), generator=g, dtype=torch.int8),
                  "wo_b_scale": torch.rand(c.hidden_size, generator=g) / 500}
        if path == "HCA":
            limit = min(c.max_position_embeddings // 128, c.index_topk)
            inputs["compressed"] = hca_topk(md.position_ids, md.kv_seq_lens, seq=c.decode_seq, limit=limit)
        elif path == "CSA":
            bound = (md.position_ids.to(torch.int64) + 1) // 4
            raw = (torch.rand(t, c.index_topk, generator=g) * (bound[:, None] + 3)).to(torch.int32) - 1
            raw[:, 0], raw[:, 1] = (bound - 1).to(torch.int32), bound.to(torch.int32)
            inputs["compressed"] = raw
        return inputs
    return build


def _v4_attention_call(get, inputs: Tensors, path: str, config=None) -> Tensors:
    i = inputs
    prefill = {} if "num_tokens" not in i else {"seq": i["q"].shape[0], "num_tokens": int(i["num_tokens"])}
    out = get("v4_attention")(path, i["q"], i["ori_kv"], i["window_indices"], i["cmp_kv"], i["cmp_block_table"],
                              i.get("compressed"), i["position_ids"], i["attn_sink"], i["freqs_cos"], i["freqs_sin"],
                              i["wo_a"], i["wo_b"], i["wo_b_scale"], config=config or _v4_config(), **prefill)
    return {"attn_out": out}


def _v4_prefill_attention_build(seed: int, wiring: str) -> Tensors:
    """One request's prefill chunk (contracts.v4_cases.prefill_attention_inputs): 128 rows at positions
    100..227, 100 real (num_tokens), the padding rows pointing at real cache rows."""
    from contracts.v4_cases import prefill_attention_inputs

    inputs = prefill_attention_inputs(_v4_config(), seed)
    inputs["window_indices"][100:] = inputs["window_indices"][0]
    inputs["compressed"][100:] = inputs["compressed"][0]
    return {**inputs, "num_tokens": torch.tensor(100, dtype=torch.int32)}


def _v4_prefill_path_build(path: str):
    """A prefill chunk of the HCA or SWA path: one request of 128 rows at positions 200..327 (100 real, the
    padding rows pointing at real cache rows). HCA: its deterministic compressed top-k at ratio 128 -- the first
    (pos + 1) // 128 slots, -1 after (one row crosses from 1 to 2 at position 255), paged so that no logical page
    is its own physical page; SWA (the MTP layer): the window only."""

    def build(seed: int, wiring: str) -> Tensors:
        from contracts.v4_cases import prefill_attention_inputs

        inputs = prefill_attention_inputs(_v4_config(), seed, start=200)
        inputs["window_indices"][100:] = inputs["window_indices"][0]
        if path == "HCA":
            k = _v4_config().index_topk
            valid = (inputs["position_ids"].to(torch.int64) + 1) // 128
            cols = torch.arange(k)
            inputs["compressed"] = torch.where(cols[None] < valid[:, None], cols[None], -1).to(torch.int32)
            inputs["compressed"][100:] = inputs["compressed"][0]
            pages = inputs["cmp_block_table"].shape[1]  # logical page i on physical page pages - i: never itself
            inputs["cmp_block_table"] = torch.arange(pages, 0, -1, dtype=torch.int32).reshape(1, -1)
        else:
            del inputs["compressed"], inputs["cmp_kv"], inputs["cmp_block_table"]
        return {**inputs, "num_tokens": torch.tensor(100, dtype=torch.int32)}

    return build


def _v4_prefill_path_call(get, inputs: Tensors, path: str) -> Tensors:
    i = dict(inputs)
    if path == "SWA":  # no compressed pool: an empty one, never read
        d = i["q"].shape[-1]
        i.update(cmp_kv=torch.zeros((1, _v4_config().block_size, 1, d), dtype=torch.bfloat16),
                 cmp_block_table=torch.zeros((1, 1), dtype=torch.int32), compressed=None)
    return _v4_attention_call(get, i, path)


def _v4_prefill_indexer_build(seed: int, wiring: str) -> Tensors:
    """CSA's indexer on one request's prefill chunk (contracts.v4_cases.prefill_indexer_inputs): 128 rows at
    positions 960 .. 1087 (visible 240 .. 256, capped from position 1023), the last 28 rows padding."""
    from contracts.v4_cases import prefill_indexer_inputs

    inputs = prefill_indexer_inputs(_v4_config(), seed, start=960)
    return {**inputs, "num_tokens": torch.tensor(100, dtype=torch.int32)}


def _v4_prefill_indexer_call(get, inputs: Tensors) -> Tensors:
    return dict(get("v4_prefill_indexer")(**{**inputs, "num_tokens": int(inputs["num_tokens"])}, config=_v4_config()))


def _v4_prefill_compressor_build(ratio: int, start: int):
    def build(seed: int, wiring: str) -> Tensors:
        """One request's prefill chunk for a V4 compressor (contracts.v4_cases.prefill_compressor_inputs): 16
        rows from ``start`` (the first windows reading the earlier chunk's state), reversed state and compressed
        tables, pools of constant bytes around the owned rows; the last 2 rows padding that carry the mappings
        they would have as real rows, and the first closing row not persisted (state_slot_mapping -1)."""
        from contracts.v4_cases import prefill_compressor_inputs

        inputs = prefill_compressor_inputs(ratio, seed, start=start, rows=16, num_tokens=14)
        real = prefill_compressor_inputs(ratio, seed, start=start, rows=16)
        for name in ("cmp_slot_mapping", "state_slot_mapping"):
            inputs[name][14:] = real[name][14:]
        inputs["state_slot_mapping"][int((inputs["cmp_slot_mapping"] >= 0).nonzero()[0])] = -1
        return inputs

    return build


def _v4_prefill_compressor_call(get, inputs: Tensors, ratio: int) -> Tensors:
    from kernels.v4.compressor import V4CompressorWeights

    i = inputs
    w = V4CompressorWeights(i["wkv"], i["wgate"], i["ape"], i["norm"])
    return dict(get("v4_prefill_compressor")(i["x"], i["position_ids"], int(i["num_tokens"]), i["state_block_table"],
                                             i["state_pool"], w, i["cmp_slot_mapping"], i["state_slot_mapping"],
                                             i["cmp_pool"], i["rope_cos"], i["rope_sin"], ratio=ratio,
                                             rope_head_dim=2 * i["rope_cos"].shape[1]))


_MTP_GROUPS = ("projection", "attention", "moe", "head")


def _v4_mtp_layer_build(seed: int, wiring: str) -> Tensors:
    """The MTP layer of V4-Pro (tiny, kernel preset) at decode (contracts.test_v4_mtp_layer's inputs), flattened:
    each group's tensors as ``<group>.<name>``, the routed experts stacked as ``moe.routed.<w>`` [E, ...]."""
    from contracts.test_v4_mtp_layer import _inputs

    return _mtp_flat(_inputs(_v4_config(), seed))


def _v4_prefill_mtp_layer_build(seed: int, wiring: str) -> Tensors:
    """The MTP layer of V4-Pro (tiny, kernel preset) on one request's prefill chunk
    (contracts.test_v4_mtp_layer's prefill inputs): 128 rows at positions 200 .. 327, 100 real, the window's
    first page unmapped. The padding rows' slots are -1, as upstream's fixture ABI requires of inactive
    entries (the contracts give them a real row's slot to show the kernel ignores it). Flattened as the
    decode tree, with the window cache at the top as ``kv_cache`` (the in-out pool its comparator reads) and
    ``num_tokens``."""
    from contracts.test_v4_mtp_layer import _prefill_inputs

    i = _prefill_inputs(_v4_config(), seed, rows=128, num_tokens=100, start=200)
    i["attention"]["swa_slot_mapping"][i["num_tokens"]:] = -1
    flat = _mtp_flat(i)
    flat["kv_cache"] = flat.pop("attention.kv_cache")
    flat["num_tokens"] = torch.tensor(i["num_tokens"], dtype=torch.int32)
    return flat


def _mtp_flat(i: dict) -> Tensors:
    flat = {"hidden": i["hidden"], "prev": i["prev"]}
    for group in _MTP_GROUPS:
        for name, value in i[group].items():
            if name == "routed":
                for w in ("w1", "w1_scale", "w3", "w3_scale", "w2", "w2_scale"):
                    flat[f"moe.routed.{w}"] = torch.stack([getattr(e, w) for e in value])
            elif name == "shared":
                for w in ("w1", "w1_scale", "w3", "w3_scale", "w2", "w2_scale"):
                    flat[f"moe.shared.{w}"] = getattr(value, w)
            elif isinstance(value, torch.Tensor):
                flat[f"{group}.{name}"] = value
            else:
                flat[f"{group}.{name}"] = torch.tensor(value, dtype=torch.int32)
    return flat


def _v4_mtp_layer_call(get, inputs: Tensors) -> Tensors:
    groups = _mtp_groups(inputs)
    out = get("v4_mtp_layer")(inputs["hidden"], inputs["prev"], groups["projection"], groups["attention"],
                              groups["moe"], groups["head"], config=_v4_config())
    return {"hidden_out": out["hidden_out"], "next_pre_hc_hidden": out["next_pre_hc_hidden"]}


def _v4_prefill_mtp_layer_call(get, inputs: Tensors) -> Tensors:
    groups = _mtp_groups({k: v for k, v in inputs.items() if k not in ("kv_cache", "num_tokens")})
    groups["attention"]["kv_cache"] = inputs["kv_cache"]
    out = get("v4_prefill_mtp_layer")(inputs["hidden"], inputs["prev"], groups["projection"], groups["attention"],
                                      groups["moe"], groups["head"], int(inputs["num_tokens"]), config=_v4_config())
    return {"hidden_out": out["hidden_out"], "next_pre_hc_hidden": out["next_pre_hc_hidden"],
            "kv_cache": out["kv_cache"]}


def _mtp_groups(inputs: Tensors) -> dict[str, dict]:
    """The flattened MTP tree's inputs back into the layer's argument groups."""
    from kernels.v4.moe import V4ExpertWeights

    groups: dict[str, dict] = {g: {} for g in _MTP_GROUPS}
    routed, shared = {}, {}
    for key, value in inputs.items():
        if key.startswith("moe.routed."):
            routed[key.split(".")[-1]] = value
        elif key.startswith("moe.shared."):
            shared[key.split(".")[-1]] = value
        elif "." in key:
            group, name = key.split(".", 1)
            groups[group][name] = int(value) if name == "num_tokens" else value
    ws = ("w1", "w1_scale", "w3", "w3_scale", "w2", "w2_scale")
    groups["moe"]["routed"] = [V4ExpertWeights(*(routed[w][e] for w in ws)) for e in range(routed["w1"].shape[0])]
    groups["moe"]["shared"] = V4ExpertWeights(*(shared[w] for w in ws))
    return groups


def _v4_indexer_build(seed: int, wiring: str) -> Tensors:
    """V4-Pro (tiny, kernel preset) decode indexer at upstream's start regimes with a shuffled INT8 index cache
    (contracts.v4_cases.indexer_inputs)."""
    from contracts.v4_cases import indexer_inputs

    return indexer_inputs(_v4_config(), seed)


def _v4_indexer_call(get, inputs: Tensors) -> Tensors:
    config = _v4_config()
    return dict(get("v4_indexer")(**inputs, offset=config.sliding_window, config=config))


def _v4_index_keys_build(seed: int, wiring: str) -> Tensors:
    """CSA's index-key write (V4-Pro tiny: d 32, rope 16): four requests at upstream's start regimes, closed
    windows at slots 5, 130 and 7, an uncommitted boundary, a cache of random bytes, a random Hadamard."""
    g = torch.Generator().manual_seed(seed)
    config = _v4_config()
    d, rope = config.index_head_dim, config.qk_rope_head_dim
    pos = torch.tensor([2, 3, 6, 7, 126, 127, 300, 301])
    angle = torch.arange(302, dtype=torch.float32)[:, None] * torch.rand(rope // 2, generator=g)
    return {"index_key": torch.randn(8, d, generator=g), "closes": (pos + 1) % 4 == 0, "position_ids": pos,
            "idx_slot_mapping": torch.tensor([-1, 5, -1, 130, -1, 7, -1, -1]),
            "idx_kv_cache": torch.randint(-127, 128, (2, 128, 1, d), generator=g, dtype=torch.int8),
            "idx_kv_scale": torch.rand(2, 128, 1, 1, generator=g), "rope_cos": torch.cos(angle),
            "rope_sin": torch.sin(angle), "hadamard": ((torch.rand(d, d, generator=g) - 0.5) * d**-0.5).to(torch.bfloat16)}


def _v4_index_keys_call(get, inputs: Tensors) -> Tensors:
    cache, scale = get("v4_publish_index_keys")(**inputs, ratio=4)
    return {"idx_kv_cache": cache, "idx_kv_scale": scale}


def _build_cases() -> dict[str, Case]:
    from kernels import sequence_parallel as sp
    from kernels.reference import compressor, indexer, rope

    cases = [
        Case("metadata", "build_forward_metadata", "ForwardMetadata of a mixed batch: empty, decode, prefill, "
             "odd resume, inactive state, permuted pages, freed window pages, padding", ("replicated",),
             ("kernels.metadata",), _metadata_case_inputs, _metadata_reference, _metadata_run,
             lambda w: {k: "exact" for k in _metadata_reference(_metadata_case_inputs(0, w), w)}),
        _cache_case("window"), _cache_case("compressed_r2"), _cache_case("index"),
        Case("compressor_r2", "compressor_ratio2", "ratio-2 ring: odd resume, chunk longer than the ring, "
             "new request, inactive block, padding, sentinel ring", ("replicated",),
             ("kernels.reference.compressor",), _compressor_build,
             lambda i, w: _compressor_call(compressor.compressor_ratio2_paged, i),
             lambda b, i, w: _compressor_call(b.get("compressor_ratio2"), i),
             lambda w: {"latent": "row_rms_peak", "publish": "exact", "state_cache": "state_ring"},
             inout=("state_cache",)),
        Case("compressor_r2_epochs", "compressor_ratio2", f"ratio-2 ring over {EPOCHS} decode epochs: three "
             "requests (odd and even starts) one token each per epoch, the state threaded from epoch to epoch",
             ("replicated",), ("kernels.reference.compressor",), _compressor_epochs_build,
             lambda i, w: _compressor_epochs_call(compressor.compressor_ratio2_paged, i),
             lambda b, i, w: _compressor_epochs_call(b.get("compressor_ratio2"), i),
             lambda w: {"latent": "row_rms_peak", "publish": "exact", "state_cache": "state_ring"},
             inout=("state_cache",)),
        Case("rope_rows", "materialize_rope_rows", "compressed RoPE rows: 17/19 sentinels, negative, duplicate "
             "and edge positions, rows past num_tokens", ("replicated",), ("kernels.reference.rope",), _rope_build,
             lambda i, w: _rope_call(rope.materialize_rope_rows, i),
             lambda b, i, w: _rope_call(b.get("materialize_rope_rows"), i),
             lambda w: {"rope_cos": "exact", "rope_sin": "exact"}, inout=("rope_cos", "rope_sin")),
        Case("indexer_topk", "index_scores+select_topk", "paged indexer scores and Top-K with tied key rows, "
             "empty and short tokens, permuted pages", ("replicated",), ("kernels.reference.indexer",),
             _indexer_build, lambda i, w: _indexer_call(indexer.paged_index_scores, indexer.select_topk, i),
             lambda b, i, w: _indexer_call(b.get("index_scores"), b.get("select_topk"), i),
             lambda w: {"scores": "masked_scores", "topk_indices": "topk_validity"}),
        Case("sp_slabs", "sp_shard+sp_gather", "sequence-parallel owner slabs (T=5, TP=4, capacity 8): the "
             "replicated wiring gathers, the sharded wiring publishes per-rank slabs", ("replicated", "sharded"),
             ("kernels.sequence_parallel",), _sp_build,
             lambda i, w: _sp_call(sp.shard_rows, sp.gather_rows, i, w),
             lambda b, i, w: _sp_call(b.get("sp_shard"), b.get("sp_gather"), i, w),
             lambda w: ({k: "exact" for k in ("slab_payload", "slab_token_ids", "slab_positions", "slab_valid")}
                        if w == "sharded" else {k: "exact" for k in ("gathered", "gathered_token_ids",
                                                                       "gathered_positions")})),
    ]
    from kernels.reference import mhc

    mhc_ops = {"hc_mixes": mhc.hc_mixes, "hc_pre": mhc.hc_pre, "hc_post": mhc.hc_post, "hc_head": mhc.hc_head}
    cases.append(Case("mhc_sublayer", "hc_mixes+hc_pre+hc_post+hc_head", "mHC around one sublayer: coefficients "
                      "with a 2-row zero tail, a large and a sparse row, the collapsed input, the expanded "
                      "streams and the head", ("replicated",), ("kernels.reference.mhc",), _mhc_build,
                      lambda i, w: _mhc_call(mhc_ops.__getitem__, i), lambda b, i, w: _mhc_call(b.get, i),
                      lambda w: {"pre": "hc_mix", "post": "hc_mix", "residual": "hc_mix", "collapsed": "bf16_stage",
                                 "expanded": "hc_out", "head": "hc_out"}))
    from kernels.reference import moe

    moe_ops = {"moe_gate": moe.moe_gate, "moe_ep": moe.moe_ep}
    for ep in (2, 4):
        cases.append(Case(f"moe_ep{ep}", "moe_gate+moe_ep", f"MoE on EP{ep}: MXFP4 routed experts (E8M0 scales), "
                          "a shared expert, uneven token counts with an idle rank"
                          + (" and upstream's fixture routing bias" if ep == 4 else ""), ("replicated",),
                          ("kernels.reference.moe",), _moe_build(ep), lambda i, w: _moe_call(moe_ops.__getitem__, i),
                          lambda b, i, w: _moe_call(b.get, i),
                          lambda w: {"weights": "gate_weights", "ids": "gate_ids", "output": "moe_out",
                                     "send_counts": "exact", "recv_y": "recv_y", "recv_expert_count": "exact"},
                          params={"ep": ep}))
    from kernels.reference import lm_head

    head_ops = {"lm_head": lm_head.lm_head, "greedy_pick": lm_head.greedy_pick, "embed_pack": lm_head.embed_pack}
    cases.append(Case("lm_head", "lm_head+greedy_pick+embed_pack", f"LM head on TP{LM_HEAD_TP}: full logits "
                      "(replicated) or the ranks' vocab shards (sharded), greedy ids with exact ties across shards "
                      "and with the last id, and the embedding pack of clamped ids (-1, vocab, vocab+7)",
                      ("replicated", "sharded"), ("kernels.reference.lm_head",), _lm_head_build,
                      lambda i, w: _lm_head_call(head_ops.__getitem__, i, w), lambda b, i, w: _lm_head_call(b.get, i, w),
                      lambda w: {("logits" if w == "replicated" else "logit_shards"): "logits", "ids": "greedy",
                                 "x_hc": "exact"}, params={"tp": LM_HEAD_TP}))
    from kernels.reference import engram

    engram_ops = {"engram": engram.engram, "engram_tp": engram.engram_tp}
    cases.append(Case("engram", "engram+engram_tp", f"the Engram block: a gated n-gram lookup added to every stream "
                      f"(replicated: one rank; sharded: the table row-sharded over TP{ENGRAM_TP}, every rank's "
                      "output)", ("replicated", "sharded"), ("kernels.reference.engram",), _engram_build,
                      lambda i, w: _engram_call(engram_ops.__getitem__, i, w),
                      lambda b, i, w: _engram_call(b.get, i, w), lambda w: {"out": "engram"},
                      params={"tp": ENGRAM_TP}))
    from kernels.v4 import compressor as v4c
    from kernels.v4 import decode_metadata as v4md

    v4_ops = {"v4_decode_metadata": v4md.v4_decode_metadata, "hca_topk": v4md.hca_topk,
              "v4_compressor": v4c.v4_compressor}
    cases.append(Case("v4_decode_metadata", "v4_decode_metadata+hca_topk", "V4-Pro (tiny, kernel preset) decode "
                      "metadata of upstream's HCA start regimes and HCA's deterministic top-k", ("replicated",),
                      ("kernels.v4.decode_metadata",), _v4_metadata_build,
                      lambda i, w: _v4_metadata_call(v4_ops.__getitem__, i, w),
                      lambda b, i, w: _v4_metadata_call(b.get, i, w),
                      lambda w: {k: "exact" for k in ("position_ids", "kv_seq_lens", "ori_slot_mapping", "swa_indices",
                                                      "swa_lens", "history_indices", "history_lens",
                                                      "cmp4_slot_mapping", "cmp128_slot_mapping",
                                                      "state4_slot_mapping", "state128_slot_mapping", "hca_topk")},
                      preset="v4-pro-tiny"))
    for name, ratio, overlap in (("v4_compressor_hca", 128, False), ("v4_compressor_csa", 4, True)):
        cases.append(Case(name, "v4_compressor", f"V4 paged compressor, ratio {ratio}"
                          f"{' with overlapping windows' if overlap else ''}: two requests, pages in reverse order, "
                          "a state pool of random bytes", ("replicated",), ("kernels.v4.compressor",),
                          _v4_compressor_build(ratio, overlap),
                          lambda i, w, r=ratio, o=overlap: _v4_compressor_call(v4_ops.__getitem__, i, r, o),
                          lambda b, i, w, r=ratio, o=overlap: _v4_compressor_call(b.get, i, r, o),
                          lambda w: {"compressed": "hc_out", "closes": "exact", "state_pool": "v4_state_pool"},
                          preset="v4-pro-tiny"))
    from kernels.v4 import mtp_layer as v4ml

    cases.append(Case("v4_mtp_layer", "v4_mtp_layer", "V4-Pro (tiny, kernel preset) MTP layer at decode: projection, "
                      "the SWA attention stage (its kv rows written before the read), the score-routed MoE stage "
                      "with INT8 experts, the head mix, hc_head and the RMSNorm", ("replicated",),
                      ("kernels.v4.mtp_layer", "kernels.v4.moe", "kernels.v4.gate", "kernels.v4.attention_stage",
                       "kernels.v4.mtp"), _v4_mtp_layer_build,
                      lambda i, w: _v4_mtp_layer_call({"v4_mtp_layer": v4ml.v4_mtp_layer}.__getitem__, i),
                      lambda b, i, w: _v4_mtp_layer_call(b.get, i),
                      lambda w: {"hidden_out": "hc_out", "next_pre_hc_hidden": "hc_out"}, preset="v4-pro-tiny"))
    cases.append(Case("v4_mtp_layer_prefill", "v4_prefill_mtp_layer", "V4-Pro (tiny, kernel preset) MTP layer on one "
                      "request's prefill chunk: 128 rows at positions 200 .. 327, 100 real; the window lowered from a "
                      "1-D page table whose first page is unmapped, profile-0 RoPE, no output for the padding rows "
                      "(slot -1), the MoE stage with the same num_tokens",
                      ("replicated",), ("kernels.v4.mtp_layer", "kernels.v4.moe", "kernels.v4.gate",
                                        "kernels.v4.attention_stage", "kernels.v4.decode_metadata", "kernels.v4.mtp"),
                      _v4_prefill_mtp_layer_build,
                      lambda i, w: _v4_prefill_mtp_layer_call(
                          {"v4_prefill_mtp_layer": v4ml.v4_prefill_mtp_layer}.__getitem__, i),
                      lambda b, i, w: _v4_prefill_mtp_layer_call(b.get, i),
                      lambda w: {"hidden_out": "v4_prefill_mtp_out", "next_pre_hc_hidden": "v4_prefill_mtp_out",
                                 "kv_cache": "v4_kv_pool"}, preset="v4-pro-tiny"))
    from kernels.v4 import prefill_compressor as v4pc

    for name, ratio, start in (("v4_prefill_compressor_csa", 4, 2), ("v4_prefill_compressor_hca", 128, 120)):
        cases.append(Case(name, "v4_prefill_compressor", f"V4 prefill compressor, ratio {ratio}"
                          f"{' with overlapping windows' if ratio == 4 else ''}: one request's chunk of 16 rows from "
                          f"position {start}, the first windows reading the earlier chunk's state through a reversed "
                          "table" + (" (the window closing at 3 has no previous half)" if ratio == 4 else "") +
                          ", 2 padding rows with real-looking mappings, the first closing row not persisted", ("replicated",),
                          ("kernels.v4.prefill_compressor", "kernels.v4.compressor"),
                          _v4_prefill_compressor_build(ratio, start),
                          lambda i, w, r=ratio: _v4_prefill_compressor_call(
                              {"v4_prefill_compressor": v4pc.v4_prefill_compressor}.__getitem__, i, r),
                          lambda b, i, w, r=ratio: _v4_prefill_compressor_call(b.get, i, r),
                          lambda w: {"cmp_pool": "v4_cmp_pool", "state_pool": "v4_state_pool"},
                          inout=("cmp_pool", "state_pool"), preset="v4-pro-tiny"))
    from kernels.v4 import index_cache as v4ic

    cases.append(Case("v4_index_keys", "v4_publish_index_keys", "V4-Pro (tiny) CSA index-key write: closed windows "
                      "rotated at their first position, BF16, Hadamard, BF16, one INT8 row each; an uncommitted "
                      "boundary and a cache of random bytes", ("replicated",), ("kernels.v4.index_cache",),
                      _v4_index_keys_build,
                      lambda i, w: _v4_index_keys_call({"v4_publish_index_keys": v4ic.publish_index_keys}.__getitem__,
                                                       i),
                      lambda b, i, w: _v4_index_keys_call(b.get, i),
                      lambda w: {"idx_kv_cache": "exact", "idx_kv_scale": "exact"},
                      inout=("idx_kv_cache", "idx_kv_scale"), preset="v4-pro-tiny"))
    from kernels.v4 import indexer as v4ix

    cases.append(Case("v4_indexer", "v4_indexer", "V4-Pro (tiny, kernel preset) CSA decode indexer: visible ranges "
                      "75 / 32 / 64 / 2 at upstream's start regimes, INT8 query and index cache, shuffled pages",
                      ("replicated",), ("kernels.v4.indexer",), _v4_indexer_build,
                      lambda i, w: _v4_indexer_call({"v4_indexer": v4ix.v4_indexer}.__getitem__, i),
                      lambda b, i, w: _v4_indexer_call(b.get, i),
                      lambda w: {"score": "v4_index_score", "topk_idxs": "v4_index_topk"},
                      params={"topk": _v4_config().index_topk, "offset": _v4_config().sliding_window,
                              "seq": _v4_config().decode_seq},
                      preset="v4-pro-tiny"))
    from kernels.v4 import prefill_indexer as v4pix

    cases.append(Case("v4_prefill_indexer", "v4_prefill_indexer", "V4-Pro (tiny, kernel preset) CSA indexer on a "
                      "prefill chunk: 128 rows at positions 960 .. 1087 (visible 240 .. 256, capped at two cache "
                      "blocks from position 1023), a RoPE row per token, 28 padding rows, shuffled pages",
                      ("replicated",), ("kernels.v4.prefill_indexer", "kernels.v4.indexer"), _v4_prefill_indexer_build,
                      lambda i, w: _v4_prefill_indexer_call({"v4_prefill_indexer": v4pix.v4_prefill_indexer}.__getitem__,
                                                            i),
                      lambda b, i, w: _v4_prefill_indexer_call(b.get, i),
                      lambda w: {"score": "v4_prefill_index_score", "topk_idxs": "v4_prefill_index_topk"},
                      params={"topk": _v4_config().index_topk}, preset="v4-pro-tiny"))
    from kernels.v4 import sparse_attention as v4sa

    for path in v4sa.PATHS:
        cases.append(Case(f"v4_attention_{path.lower()}", "v4_attention", f"V4-Pro (tiny, kernel preset) decode "
                          f"{path} attention with the fused grouped W8A8 output projection: upstream's HCA start "
                          "regimes, an unmapped window page, shuffled compressed pages" +
                          (", raw CSA slots at and past the causal bound" if path == "CSA" else ""),
                          ("replicated",), ("kernels.v4.sparse_attention",), _v4_attention_build(path),
                          lambda i, w, p=path: _v4_attention_call({"v4_attention": v4sa.v4_attention}.__getitem__, i, p),
                          lambda b, i, w, p=path: _v4_attention_call(b.get, i, p),
                          lambda w: {"attn_out": "attn_out_v4"}, preset="v4-pro-tiny"))
    cases.append(Case("v4_attention_prefill", "v4_attention", "V4-Pro (tiny, kernel preset) prefill sparse "
                      "attention with the fused W8A8 output projection, the CSA path: one request of 128 rows (100 "
                      "real, padding rows pointing at real cache rows), an indexer's ratio-4 picks given as logical "
                      "compressed slots (the prefill entry takes HCA's and CSA's as given)", ("replicated",), ("kernels.v4.sparse_attention",),
                      _v4_prefill_attention_build,
                      lambda i, w: _v4_attention_call({"v4_attention": v4sa.v4_attention}.__getitem__, i, "HCA"),
                      lambda b, i, w: _v4_attention_call(b.get, i, "HCA"), lambda w: {"attn_out": "attn_out_v4"},
                      preset="v4-pro-tiny"))
    for path in ("HCA", "SWA"):
        what = ("its deterministic compressed top-k at ratio 128 (slots 0 .. (pos + 1) // 128 - 1, crossing from 1 "
                "to 2 slots at position 255)") if path == "HCA" else "the window only (the MTP layer's path)"
        cases.append(Case(f"v4_attention_prefill_{path.lower()}", "v4_attention", f"V4-Pro (tiny, kernel preset) "
                          f"prefill {path} attention with the fused W8A8 output projection: one request of 128 rows "
                          f"at positions 200..327 (100 real, padding rows pointing at real cache rows), {what}",
                          ("replicated",), ("kernels.v4.sparse_attention",), _v4_prefill_path_build(path),
                          lambda i, w, p=path: _v4_prefill_path_call({"v4_attention": v4sa.v4_attention}.__getitem__,
                                                                     i, p),
                          lambda b, i, w, p=path: _v4_prefill_path_call(b.get, i, p),
                          lambda w: {"attn_out": "attn_out_v4"}, preset="v4-pro-tiny"))
    from kernels.reference import mhc

    boundary_ops = {**head_ops, "hc_head": mhc.hc_head, "final_norm": lm_head.final_norm}
    cases.append(Case("boundary", "embed_pack+hc_head+final_norm", "the model boundary with the backbone skipped: "
                      "embedding pack of ids past the vocabulary (clamped), the collapse with a non-identity delayed "
                      "pre-mix, the final RMSNorm", ("replicated",),
                      ("kernels.reference.lm_head", "kernels.reference.mhc", "kernels.reference.compressor"),
                      _boundary_build, lambda i, w: _boundary_call(boundary_ops.__getitem__, i, w),
                      lambda b, i, w: _boundary_call(b.get, i, w),
                      lambda w: {"x_hc": "exact", "hidden": "hc_out", "x_normed": "hc_out"}))
    from kernels.config import LayerKind
    from kernels.reference import block

    def block_case(kind) -> Case:
        return Case(f"block_{kind.value.lower()}", "decode_block", f"decode Block of the {kind.value} "
                    "representative layer: attention (TP2, replicated) and the compact MoE through mHC, a non-one-hot "
                    "incoming mix, every row active", ("replicated",),
                    HALF_LAYER_MODULES + ("kernels.reference.mhc", "kernels.reference.moe", "kernels.reference.block"),
                    _block_build(kind), lambda i, w: _block_call(block.decode_block, i, kind),
                    lambda b, i, w: _block_call(b.get("decode_block"), i, kind),
                    lambda w: {"x_hc": "fp8_budget", "attention_hidden": "attention_forced", "next_pre_mix": "hc_mix",
                               "attention_input": "bf16_stage", "ffn_input": "ffn_input", "ffn_output": "fp8_budget"},
                    params={"kind": kind.value, "phase": "decode", "tp": 2, "preset": "flash-tiny"})

    cases += [block_case(k) for k in (LayerKind.SWA, LayerKind.C2A_FULL, LayerKind.C1A_FULL)]
    cases += [_half_layer_case(kind, phase) for kind in LayerKind for phase in ("prefill", "decode")]
    from goldens import cases_v4_ops  # one V4 operator per case: the ones upstream has a golden for

    cases.extend(cases_v4_ops.build())
    return {c.name: c for c in cases}


_CASES: dict[str, Case] = {}
_BUILT = False


def register(case: Case, *, replace: bool = False) -> Case:
    """Add a case to the registry -- the one way cases exist: the built-in ones go through it too. From user
    code, a module that calls ``register`` and is named in ``PTO_GOLDEN_CASES`` (comma-separated), in
    ``goldens --cases-module`` or in pytest's ``--golden-cases``; from a pytest test or conftest, call it
    directly. A name already taken is refused unless ``replace``."""
    if not isinstance(case, Case):
        raise GoldenStoreError(f"register: expected a goldens.cases.Case, got {type(case).__name__}")
    if not case.name or "/" in case.name:
        raise GoldenStoreError(f"register: case name {case.name!r} must be non-empty without '/'")
    if case.name in _CASES and not replace and _CASES[case.name] is not case:
        raise GoldenStoreError(f"register: case {case.name!r} exists (pass replace=True to redefine it)")
    _CASES[case.name] = case
    return case


def derived(base: Case, name: str, inputs: Tensors | None = None, *, description: str = "") -> Case:
    """A case with ``base``'s operator, call, reference and comparators and fixed ``inputs`` (a recorded
    counterexample); replayed like any other."""
    fixed = {k: v.clone() for k, v in (inputs or {}).items()}

    def build(seed: int, wiring: str) -> Tensors:
        if not fixed:
            raise GoldenStoreError(f"case {name}: a derived case replays its stored inputs; it cannot build new ones")
        return {k: v.clone() for k, v in fixed.items()}

    return Case(name, base.operator, description or f"counterexample of {base.name}", base.wirings, base.modules,
                build, base.reference, base.run, base.comparators, base.inout, dict(base.params), base.preset,
                base=base.name)


UPSTREAM_PREFIX = "up-"


class WithVariants:
    """A backend whose operators are called with the named variants a tree is judged by (``{operator: {rule:
    variant}}``), e.g. upstream's gate golden's ``dequant_factor="reciprocal"``."""

    def __init__(self, backend, variants: dict):
        self.backend, self.variants = backend, variants
        self.name = getattr(backend, "name", "backend")

    def get(self, op: str):
        from functools import partial

        fn = self.backend.get(op)
        return partial(fn, **self.variants[op]) if self.variants.get(op) else fn

    def __getattr__(self, attr):
        return getattr(self.backend, attr)


def upstream_case(base: Case, inputs: Tensors | None, upstream: dict) -> Case:
    """The case of a tree recorded from upstream's goldens: ``base``'s operator, call and comparators, its fixed
    ``inputs``, expected outputs that are upstream's numbers (``upstream``: repository, commit, goldens, variants).
    Replayed on any backend with the named variants upstream's goldens follow; never regenerated from this
    project's reference (record it again from upstream instead)."""
    name = UPSTREAM_PREFIX + base.name
    fixed = {k: v.clone() for k, v in (inputs or {}).items()}
    variants = {op: dict(v) for op, v in upstream.get("variants", {}).items()}

    def build(seed: int, wiring: str) -> Tensors:
        if not fixed:
            raise GoldenStoreError(f"case {name}: a tree recorded from upstream replays its stored inputs; record "
                                   f"new ones with `goldens record --from upstream {base.name}`")
        return {k: v.clone() for k, v in fixed.items()}

    def reference(inputs: Tensors, wiring: str) -> Tensors:
        raise GoldenStoreError(f"{name} holds upstream's numbers ({upstream.get('repository')}@"
                               f"{str(upstream.get('commit'))[:12]}), not this project's reference: record it again "
                               f"with `goldens record --from upstream --pypto-lib PATH {base.name}`")

    return Case(name, base.operator, f"{base.description} -- expected outputs from upstream's goldens",
                base.wirings, base.modules, build, reference,
                lambda b, i, w: base.run(WithVariants(b, variants), i, w), base.comparators, base.inout,
                dict(base.params), base.preset, base=base.name, upstream=dict(upstream))


def _import_cases(name: str) -> None:
    """A dotted module name (found on sys.path, or from the working directory, as ``python -m`` would), or a
    path to a ``.py`` file, like --backend-module."""
    if name.endswith(".py") or os.sep in name:
        path = Path(name).expanduser().resolve()
        if not path.is_file():
            raise GoldenStoreError(f"cases module {name!r}: no file {path}")
        module_name = f"pto_cases_{path.stem}"
        if module_name in sys.modules and getattr(sys.modules[module_name], "__file__", None) == str(path):
            return  # imported once: its cases are registered
        spec = importlib.util.spec_from_file_location(module_name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module
        try:
            spec.loader.exec_module(module)
        except Exception:
            sys.modules.pop(module_name, None)
            raise
        return
    try:
        importlib.import_module(name)
    except ModuleNotFoundError as exc:
        here = os.getcwd()
        top = name.split(".")[0]
        if exc.name not in (top, name) or here in sys.path or "" in sys.path:
            raise
        sys.path.append(here)  # the `goldens` script does not put the working directory on sys.path
        importlib.import_module(name)


def load_case_modules(names=()) -> None:
    """Import user case modules (each registers its cases): ``names`` and ``PTO_GOLDEN_CASES``, each a dotted
    module name or a path to a .py file."""
    wanted = [n.strip() for n in (*names, *os.environ.get("PTO_GOLDEN_CASES", "").split(",")) if n and n.strip()]
    for name in wanted:
        try:
            _import_cases(name)
        except GoldenStoreError:
            raise
        except Exception as exc:
            raise GoldenStoreError(f"cases module {name!r} failed to import: {type(exc).__name__}: {exc}") from None


def cases() -> dict[str, Case]:
    global _BUILT
    if not _BUILT:
        _BUILT = True
        for case in _build_cases().values():
            register(case)
        load_case_modules()
    return _CASES


def get_case(name: str) -> Case:
    try:
        return cases()[name]
    except KeyError:
        raise GoldenStoreError(f"unknown case {name!r}; known: {sorted(cases())} (a user case module not loaded? "
                               "PTO_GOLDEN_CASES / --cases-module)") from None
