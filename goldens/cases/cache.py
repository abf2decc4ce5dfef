"""Golden cases of what writes the caches: publication into each quantized cache, the ratio-2 compressor
ring (one call and threaded over decode epochs) and the compressed RoPE rows. Spec: §2.3, §4.1, §4.2."""

from __future__ import annotations

import random

import torch

from goldens.cases import Case, Tensors
from kernels.cache import layouts
from kernels.config import FLASH_TINY

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

    def run(backend, inputs: Tensors, wiring: str) -> Tensors:
        return _publish(backend.get("cache_publish"), inputs)

    return Case(f"cache_{kind}", "cache_publish",
                f"publish into the {kind} cache: sentinel bytes, -1 slots, permuted rows, spare unmapped rows, "
                "zero and midpoint rows", build_inputs=build, run=run,
                comparators=lambda w: {"payload": "cache_payload", "scale": "cache_scale"},
                modules=("kernels.quant", "kernels.cache"), inout=("payload", "scale"),
                params={"rule": layouts(FLASH_TINY)[kind].rule})


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


RING = {"latent": "row_rms_peak", "publish": "exact", "state_cache": "state_ring"}

CASES = [
    _cache_case("window"),
    _cache_case("compressed_r2"),
    _cache_case("index"),
    Case("compressor_r2", "compressor_ratio2",
         "ratio-2 ring: odd resume, chunk longer than the ring, new request, inactive block, padding, "
         "sentinel ring", build_inputs=_compressor_build,
         run=lambda b, i, w: _compressor_call(b.get("compressor_ratio2"), i),
         comparators=lambda w: dict(RING), inout=("state_cache",)),
    Case("compressor_r2_epochs", "compressor_ratio2",
         f"ratio-2 ring over {EPOCHS} decode epochs: three requests (odd and even starts) one token each "
         "per epoch, the state threaded from epoch to epoch", build_inputs=_compressor_epochs_build,
         run=lambda b, i, w: _compressor_epochs_call(b.get("compressor_ratio2"), i),
         comparators=lambda w: dict(RING), inout=("state_cache",)),
    Case("rope_rows", "materialize_rope_rows",
         "compressed RoPE rows: 17/19 sentinels, negative, duplicate and edge positions, rows past "
         "num_tokens", build_inputs=_rope_build,
         run=lambda b, i, w: _rope_call(b.get("materialize_rope_rows"), i),
         comparators=lambda w: {"rope_cos": "exact", "rope_sin": "exact"}, inout=("rope_cos", "rope_sin")),
]
