"""Golden cases of V4's compressors: the paged decode compressor (HCA ratio 128, CSA ratio 4 with
overlap), the prefill compressor and CSA's index-key write (the V4-Pro tiny kernel preset). Spec: §8."""

from __future__ import annotations

import torch

from goldens.cases import Case, Tensors
from goldens.cases import v4_config as _v4_config


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


def _v4_prefill_compressor_build(ratio: int, start: int):
    def build(seed: int, wiring: str) -> Tensors:
        """One request's prefill chunk for a V4 compressor (contracts.v4_inputs.prefill_compressor_inputs): 16
        rows from ``start`` (the first windows reading the earlier chunk's state), reversed state and compressed
        tables, pools of constant bytes around the owned rows; the last 2 rows padding that carry the mappings
        they would have as real rows, and the first closing row not persisted (state_slot_mapping -1)."""
        from contracts.v4_inputs import prefill_compressor_inputs

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


def _decode_case(name: str, ratio: int, overlap: bool) -> Case:
    return Case(name, "v4_compressor",
                f"V4 paged compressor, ratio {ratio}{' with overlapping windows' if overlap else ''}: two "
                "requests, pages in reverse order, a state pool of random bytes",
                build_inputs=_v4_compressor_build(ratio, overlap),
                run=lambda b, i, w: _v4_compressor_call(b.get, i, ratio, overlap),
                comparators=lambda w: {"compressed": "hc_out", "closes": "exact", "state_pool": "v4_state_pool"},
                preset="v4-pro-tiny")


def _prefill_case(name: str, ratio: int, start: int) -> Case:
    return Case(name, "v4_prefill_compressor",
                f"V4 prefill compressor, ratio {ratio}{' with overlapping windows' if ratio == 4 else ''}: one "
                f"request's chunk of 16 rows from position {start}, the first windows reading the earlier "
                "chunk's state through a reversed table"
                + (" (the window closing at 3 has no previous half)" if ratio == 4 else "")
                + ", 2 padding rows with real-looking mappings, the first closing row not persisted",
                build_inputs=_v4_prefill_compressor_build(ratio, start),
                run=lambda b, i, w: _v4_prefill_compressor_call(b.get, i, ratio),
                comparators=lambda w: {"cmp_pool": "v4_cmp_pool", "state_pool": "v4_state_pool"},
                modules=("kernels.v4.prefill_compressor", "kernels.v4.compressor"),
                inout=("cmp_pool", "state_pool"), preset="v4-pro-tiny")


CASES = [
    _decode_case("v4_compressor_hca", 128, False),
    _decode_case("v4_compressor_csa", 4, True),
    _prefill_case("v4_prefill_compressor_csa", 4, 2),
    _prefill_case("v4_prefill_compressor_hca", 128, 120),
    Case("v4_index_keys", "v4_publish_index_keys",
         "V4-Pro (tiny) CSA index-key write: closed windows rotated at their first position, BF16, "
         "Hadamard, BF16, one INT8 row each; an uncommitted boundary and a cache of random bytes",
         build_inputs=_v4_index_keys_build, run=lambda b, i, w: _v4_index_keys_call(b.get, i),
         comparators=lambda w: {"idx_kv_cache": "exact", "idx_kv_scale": "exact"},
         inout=("idx_kv_cache", "idx_kv_scale"), preset="v4-pro-tiny"),
]
