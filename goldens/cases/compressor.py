"""The decode compressor's two cases, the decode indexer's and the decode attention's three at a model's own geometry (V4-Pro's or
V4-Flash's kernel preset): the shapes ``decode_compressor_ratio{4,128}.py::compressor_test`` and
``decode_indexer.py::indexer_test`` and ``decode_sparse_attn*.py::sparse_attn_test`` are compiled for in that model's folder, so the device binding runs them. Used
by ``goldens.cases.pro`` and ``goldens.cases.v4_flash`` (never in the sample store). Spec: §8.
"""

from __future__ import annotations

import torch

from goldens.cases import Case, Tensors
from kernels.record import generator as _g

COMPRESSOR_OUT = {"compressed": "hc_out", "closes": "exact", "state_pool": "v4_state_pool"}


def _hca_build(preset):
    def build(seed: int, wiring: str) -> Tensors:
        """Two requests of HCA's ratio-128 compressor: request 0 at 125..127 (its window closes at 127), request 1
        at 254, 255 (closes at 255); BF16-exact weights (the entry's dtype), a state pool of random values, pages
        in reverse order."""
        g = _g(seed)
        hidden, d, page, ratio = preset.hidden_size, preset.head_dim, preset.c128_state_block_size, 128
        pos = torch.tensor([125, 126, 127, 254, 255])
        req = torch.tensor([0, 0, 0, 1, 1])
        blocks = 256 // page
        table = torch.arange(2 * blocks, dtype=torch.int32).reshape(2, blocks).flip(1).contiguous()
        return {"x": torch.randn(pos.numel(), hidden, generator=g).to(torch.bfloat16), "position_ids": pos,
                "token_to_req": req, "state_block_table": table,
                "state_pool": torch.randn(2 * blocks, page, 2 * d, generator=g),
                "wkv": (torch.randn(hidden, d, generator=g) / hidden**0.5).to(torch.bfloat16).float(),
                "wgate": (torch.randn(hidden, d, generator=g) / hidden**0.5).to(torch.bfloat16).float(),
                "ape": torch.randn(ratio, d, generator=g) * 0.5,
                "norm": (torch.rand(d, generator=g) + 0.5).to(torch.bfloat16).float()}
    return build


def _csa_build(preset):
    def build(seed: int, wiring: str) -> Tensors:
        """One decode step of CSA's ratio-4 compressor (overlapping windows), as compressor_test is compiled (4
        requests x 2 tokens, the preset's state pages, a block table over the whole kernel sequence): request 0 at
        2, 3 (its first window closes at 3, the previous window before position 0), request 1 at 7, 8 (closes at
        7, the next window opens), request 2 at 100, 101 (no close), request 3 at 4094, 4095 (closes); unmapped
        pages are -1."""
        g = _g(seed)
        hidden, d, page, ratio = preset.hidden_size, preset.head_dim, preset.c4a_state_block_size, 4
        starts = (2, 7, 100, 4094)
        pos = torch.tensor([p + s for p in starts for s in range(2)])
        req = torch.tensor([r for r in range(4) for _ in range(2)])
        width = preset.kernel_max_seq_len // page
        table = torch.full((4, width), -1, dtype=torch.int32)
        phys = iter(torch.randperm(preset.csa_state_pool, generator=g).tolist())
        for r, p in enumerate(starts):
            for blk in range(max(0, (p - 2 * ratio) // page), (p + 1) // page + 1):
                table[r, blk] = next(phys)
        c = 2 * d
        return {"x": torch.randn(pos.numel(), hidden, generator=g).to(torch.bfloat16), "position_ids": pos,
                "token_to_req": req, "state_block_table": table,
                "state_pool": torch.randn(preset.csa_state_pool, page, 2 * c, generator=g),
                "wkv": (torch.randn(hidden, c, generator=g) / hidden**0.5).to(torch.bfloat16).float(),
                "wgate": (torch.randn(hidden, c, generator=g) / hidden**0.5).to(torch.bfloat16).float(),
                "ape": torch.randn(ratio, c, generator=g) * 0.5,
                "norm": (torch.rand(d, generator=g) + 0.5).to(torch.bfloat16).float()}
    return build


def _call(ratio: int, overlap: bool):
    def call(get, i: Tensors) -> Tensors:
        from kernels.v4.compressor import V4CompressorWeights

        w = V4CompressorWeights(i["wkv"], i["wgate"], i["ape"], i["norm"])
        out, closes, pool = get("v4_compressor")(i["x"], i["position_ids"], i["token_to_req"],
                                                 i["state_block_table"], i["state_pool"], w, ratio=ratio,
                                                 overlap=overlap)
        return {"compressed": out, "closes": closes, "state_pool": pool}
    return call


def _case(name: str, description: str, build, call, preset) -> Case:
    return Case(name, "v4_compressor", description, build_inputs=build, run=lambda b, i, w: call(b.get, i),
                comparators=lambda w: dict(COMPRESSOR_OUT), preset=preset.name)


def compressor_cases(preset, suffix: str, model: str) -> list[Case]:
    """The HCA (ratio 128) and CSA (ratio 4, overlapping) decode compressor cases at ``preset`` (a kernel preset),
    named ``v4_compressor_{hca,csa}<suffix>``."""
    return [
        _case(f"v4_compressor_hca{suffix}", f"V4 HCA compressor (ratio 128) at {model} geometry: two requests whose "
              "windows close (127, 255), one decode step per token", _hca_build(preset), _call(128, False), preset),
        _case(f"v4_compressor_csa{suffix}", f"V4 CSA compressor (ratio 4, overlapping windows) at {model} geometry: "
              "one decode step of 4 requests x 2 tokens, three windows closing (one before position 0, one opening "
              "the next, one at 4095)", _csa_build(preset), _call(4, True), preset),
    ]


def _indexer_build(preset):
    def build(seed: int, wiring: str) -> Tensors:
        """The CSA decode indexer as indexer_test is compiled (4 requests x 2 tokens, the preset's index heads and
        top-k, its pool of index pages): requests at 8000, 4099, 16000 and 511 see 2000, 1025, 4000 and 128 index
        keys, so three pick top-k of more; each request's visible pages shuffled into the pool, the rest -1."""
        from contracts.v4_inputs import indexer_inputs

        i = indexer_inputs(preset, seed, starts=(8000, 4099, 16000, 511))
        g = _g(seed + 1)
        bs, table = preset.block_size, i["idx_block_table"]
        need = [-(-int(n) // (4 * bs)) for n in i["kv_seq_lens"]]
        phys = torch.randperm(preset.idx_pool, generator=g)[: sum(need)].tolist()
        new_table = torch.full((table.shape[0], preset.idx_pool), -1, dtype=torch.int32)
        cache = torch.zeros_like(i["idx_kv_cache"][: preset.idx_pool])
        scale = torch.ones_like(i["idx_kv_scale"][: preset.idx_pool])
        for r, n in enumerate(need):
            for blk in range(n):
                p = phys.pop()
                new_table[r, blk] = p
                cache[p], scale[p] = i["idx_kv_cache"][table[r, blk]], i["idx_kv_scale"][table[r, blk]]
        return {**i, "idx_block_table": new_table, "idx_kv_cache": cache, "idx_kv_scale": scale}
    return build


def indexer_case(preset, suffix: str, model: str) -> Case:
    """The CSA decode indexer's case at ``preset`` (a kernel preset), named ``v4_indexer<suffix>``."""
    def call(get, i: Tensors) -> Tensors:
        return dict(get("v4_indexer")(**i, offset=preset.sliding_window, config=preset))

    return Case(f"v4_indexer{suffix}", "v4_indexer", f"V4 CSA decode indexer at {model} geometry ({preset.index_n_heads} "
                f"index heads of {preset.index_head_dim}, top-k {preset.index_topk}): 4 requests x 2 tokens seeing "
                "2000, 1025, 4000 and 128 index keys, shuffled pages", build_inputs=_indexer_build(preset),
                run=lambda b, i, w: call(b.get, i),
                comparators=lambda w: {"score": "v4_index_score", "topk_idxs": "v4_index_topk"}, preset=preset.name,
                params={"topk": preset.index_topk, "offset": preset.sliding_window, "seq": preset.decode_seq})


def attention_case(preset, path: str, suffix: str, model: str) -> Case:
    """The decode attention's case of one path (SWA, HCA, CSA) at ``preset``, named ``v4_attention_<path><suffix>``:
    the tiny case's regimes (an unmapped window page, shuffled compressed pages) in the entry's pools."""
    from goldens.cases.v4_attention import _v4_attention_build, _v4_attention_call

    def call(get, i: Tensors) -> Tensors:
        return _v4_attention_call(get, i, path, preset)

    return Case(f"v4_attention_{path.lower()}{suffix}", "v4_attention", f"V4 decode attention, {path} path, at {model} "
                f"geometry ({preset.num_attention_heads} heads of {preset.head_dim}, a window of "
                f"{preset.sliding_window}, the grouped output projection to {preset.hidden_size}; pools of "
                f"{preset.ori_pool} window pages and {preset.cmp_pool} compressed pages, as sparse_attn_test is "
                "compiled): the tiny case's regimes (an unmapped window page, shuffled compressed pages)",
                build_inputs=_v4_attention_build(path, preset, ori_pages=preset.ori_pool, cmp_pages=preset.cmp_pool),
                run=lambda b, i, w: call(b.get, i), comparators=lambda w: {"attn_out": "attn_out_v4"},
                preset=preset.name, params={"path": path, "preset": preset.name})
