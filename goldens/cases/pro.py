"""Cases at V4-Pro's own geometry: the shapes upstream's kernel entries are compiled for, so that the device
binding (``--backend pypto --platform a5sim|a5``) runs them instead of refusing a tiny tree as another geometry.

Their inputs are 10-100 MB (the weights of one layer at hidden 7168), so they never go into the sample store:
load this module and name a store of your own::

    goldens --cases-module goldens.cases.pro --store ~/pro-store record v4_expert_shared_pro
    goldens --cases-module goldens.cases.pro --store ~/pro-store replay --backend pypto --platform a5sim \\
        --pypto-lib ~/pypto-lib --keep-actual v4_expert_shared_pro

The operators with a record (``kernels.record``: the gate, the experts, the projections, hc_post, the final norm)
bring their Pro cases from it (``cases_at("pro")``, built by the same builder as their tiny twins, at the rows the
entry is compiled for); the compressor, attention and indexer cases below are not records yet. Spec: §8.
"""

from __future__ import annotations

import torch

from goldens.cases import Case, Tensors, register
from goldens.cases.records import cases_at
from kernels.config import V4_PRO
from kernels.record import generator as _g

PRO = V4_PRO.kernel_preset()
ROWS = PRO.decode_tokens  # MOE_TOKENS / one T_TILE of 8 rows: what the Pro entries are compiled to take

















def _compressor_hca_build(seed: int, wiring: str) -> Tensors:
    """Two requests of HCA's ratio-128 compressor at Pro's width (D 7168, head_dim 512, state pages of 8): request
    0 at 125..127 (its window closes at 127), request 1 at 254, 255 (closes at 255); BF16-exact weights (the
    entry's dtype), a state pool of random values, pages in reverse order."""
    g = _g(seed)
    hidden, d, page, ratio = PRO.hidden_size, PRO.head_dim, PRO.c128_state_block_size, 128
    pos = torch.tensor([125, 126, 127, 254, 255])
    req = torch.tensor([0, 0, 0, 1, 1])
    blocks = 256 // page
    return {"x": torch.randn(pos.numel(), hidden, generator=g).to(torch.bfloat16), "position_ids": pos,
            "token_to_req": req,
            "state_block_table": torch.arange(2 * blocks, dtype=torch.int32).reshape(2, blocks).flip(1).contiguous(),
            "state_pool": torch.randn(2 * blocks, page, 2 * d, generator=g),
            "wkv": (torch.randn(hidden, d, generator=g) / hidden**0.5).to(torch.bfloat16).float(),
            "wgate": (torch.randn(hidden, d, generator=g) / hidden**0.5).to(torch.bfloat16).float(),
            "ape": torch.randn(ratio, d, generator=g) * 0.5,
            "norm": (torch.rand(d, generator=g) + 0.5).to(torch.bfloat16).float()}


def _compressor_call(ratio: int, overlap: bool):
    def call(get, i: Tensors) -> Tensors:
        from kernels.v4.compressor import V4CompressorWeights

        w = V4CompressorWeights(i["wkv"], i["wgate"], i["ape"], i["norm"])
        out, closes, pool = get("v4_compressor")(i["x"], i["position_ids"], i["token_to_req"],
                                                 i["state_block_table"], i["state_pool"], w, ratio=ratio,
                                                 overlap=overlap)
        return {"compressed": out, "closes": closes, "state_pool": pool}
    return call


def _compressor_csa_build(seed: int, wiring: str) -> Tensors:
    """One decode step of CSA's ratio-4 compressor (overlapping windows) at Pro geometry, as compressor_test is
    compiled (4 requests x 2 tokens, 65 state pages of 4, a block table of 4096 pages): request 0 at 2, 3 (its
    first window closes at 3, the previous window before position 0), request 1 at 7, 8 (closes at 7, the next
    window opens), request 2 at 100, 101 (no close), request 3 at 4094, 4095 (closes at the table's last page);
    unmapped pages are -1."""
    g = _g(seed)
    hidden, d, page, ratio = PRO.hidden_size, PRO.head_dim, PRO.c4a_state_block_size, 4
    starts = (2, 7, 100, 4094)
    pos = torch.tensor([p + s for p in starts for s in range(2)])
    req = torch.tensor([r for r in range(4) for _ in range(2)])
    width = PRO.kernel_max_seq_len // page
    table = torch.full((4, width), -1, dtype=torch.int32)
    phys = iter(torch.randperm(PRO.csa_state_pool, generator=g).tolist())
    for r, p in enumerate(starts):
        for blk in range(max(0, (p - 2 * ratio) // page), (p + 1) // page + 1):
            table[r, blk] = next(phys)
    c = 2 * d
    return {"x": torch.randn(pos.numel(), hidden, generator=g).to(torch.bfloat16), "position_ids": pos,
            "token_to_req": req, "state_block_table": table,
            "state_pool": torch.randn(PRO.csa_state_pool, page, 2 * c, generator=g),
            "wkv": (torch.randn(hidden, c, generator=g) / hidden**0.5).to(torch.bfloat16).float(),
            "wgate": (torch.randn(hidden, c, generator=g) / hidden**0.5).to(torch.bfloat16).float(),
            "ape": torch.randn(ratio, c, generator=g) * 0.5,
            "norm": (torch.rand(d, generator=g) + 0.5).to(torch.bfloat16).float()}


def _attention_case(path: str) -> Case:
    from goldens.cases.v4_attention import _v4_attention_build, _v4_attention_call

    return _case(f"v4_attention_{path.lower()}_pro", "v4_attention", f"V4 decode attention, {path} path, at Pro "
                 "geometry (128 heads of 512, a window of 128, the grouped output projection to 7168; pools of 128 "
                 "window pages and 32 compressed pages, as sparse_attn_test is compiled): the tiny case's regimes "
                 "(an unmapped window page, shuffled compressed pages)",
                 _v4_attention_build(path, PRO, ori_pages=PRO.ori_pool, cmp_pages=PRO.cmp_pool),
                 lambda get, i: _v4_attention_call(get, i, path, PRO), {"attn_out": "attn_out_v4"},
                 params={"path": path, "preset": PRO.name})  # attn_out_v4 with the BF16-head / INT8-latent slack


def _indexer_build(seed: int, wiring: str) -> Tensors:
    """The CSA decode indexer at Pro geometry (64 index heads of 128, top-k 1024 of a 4096-wide score row, as
    indexer_test is compiled: 4 requests x 2 tokens, 64 index pages of 128): requests at 8000, 4099, 16000 and
    511 see 2000, 1025, 4000 and 128 index keys, so three pick 1024 of more."""
    from contracts.v4_inputs import indexer_inputs

    i = indexer_inputs(PRO, seed, starts=(8000, 4099, 16000, 511))
    # into the entry's pool of 64 index pages: each request's visible pages, shuffled; the rest of the table -1
    g = _g(seed + 1)
    bs, table = PRO.block_size, i["idx_block_table"]
    need = [-(-int(n) // (4 * bs)) for n in i["kv_seq_lens"]]
    phys = torch.randperm(PRO.idx_pool, generator=g)[: sum(need)].tolist()
    new_table = torch.full((table.shape[0], PRO.idx_pool), -1, dtype=torch.int32)
    cache, scale = torch.zeros_like(i["idx_kv_cache"][: PRO.idx_pool]), torch.ones_like(i["idx_kv_scale"][: PRO.idx_pool])
    for r, n in enumerate(need):
        for blk in range(n):
            p = phys.pop()
            new_table[r, blk] = p
            cache[p], scale[p] = i["idx_kv_cache"][table[r, blk]], i["idx_kv_scale"][table[r, blk]]
    return {**i, "idx_block_table": new_table, "idx_kv_cache": cache, "idx_kv_scale": scale}


def _indexer_call(get, i: Tensors) -> Tensors:
    return dict(get("v4_indexer")(**i, offset=PRO.sliding_window, config=PRO))








def _prefill_indexer_build(seed: int, wiring: str) -> Tensors:
    """CSA's indexer on one request's prefill chunk at Pro geometry (the 128 rows prefill_indexer_test takes, all
    real): positions 960 .. 1087, visible 240 .. 256 (capped at two index pages from position 1023)."""
    from contracts.v4_inputs import prefill_indexer_inputs

    inputs = prefill_indexer_inputs(PRO, seed, start=960)
    return {**inputs, "num_tokens": torch.tensor(inputs["qr"].shape[0], dtype=torch.int32)}


def _prefill_indexer_call(get, i: Tensors) -> Tensors:
    return dict(get("v4_prefill_indexer")(**{**i, "num_tokens": int(i["num_tokens"])}, config=PRO))


def _case(name: str, operator: str, description: str, build, call, comparators: dict, **more) -> Case:
    """A Pro-geometry case not yet an operator record's (kernels.record): ``call(get, inputs)`` on a backend's
    operators; its reference (derived) is the same call on the reference operators."""
    return Case(name, operator, description, build_inputs=build, run=lambda b, i, w: call(b.get, i),
                comparators=lambda w: dict(comparators), preset=PRO.name, **more)


COMPRESSOR_OUT = {"compressed": "hc_out", "closes": "exact", "state_pool": "v4_state_pool"}


def build() -> list[Case]:
    return [
        _case("v4_compressor_hca_pro", "v4_compressor", "V4 HCA compressor (ratio 128) at Pro geometry: two requests "
              "whose windows close (127, 255), one decode step per token", _compressor_hca_build,
              _compressor_call(128, False), COMPRESSOR_OUT),
        _case("v4_compressor_csa_pro", "v4_compressor", "V4 CSA compressor (ratio 4, overlapping windows) at Pro "
              "geometry: one decode step of 4 requests x 2 tokens, three windows closing (one before position 0, one "
              "opening the next, one at the block table's last page)", _compressor_csa_build,
              _compressor_call(4, True), COMPRESSOR_OUT),
        *(_attention_case(path) for path in ("SWA", "HCA", "CSA")),
        _case("v4_prefill_indexer_pro", "v4_prefill_indexer", "V4 CSA indexer on a prefill chunk at Pro geometry "
              "(128 rows at 960 .. 1087, all real; visible 240 .. 256; 64 index heads of 128)", _prefill_indexer_build,
              _prefill_indexer_call, {"score": "v4_prefill_index_score", "topk_idxs": "v4_prefill_index_topk"},
              modules=("kernels.v4.prefill_indexer", "kernels.v4.indexer"), params={"topk": PRO.index_topk}),
        _case("v4_indexer_pro", "v4_indexer", "V4 CSA decode indexer at Pro geometry (64 index heads of 128, top-k "
              "1024 of 4096): 4 requests x 2 tokens seeing 2000, 1025, 4000 and 128 index keys, shuffled pages",
              _indexer_build, _indexer_call, {"score": "v4_index_score", "topk_idxs": "v4_index_topk"},
              params={"topk": PRO.index_topk, "offset": PRO.sliding_window, "seq": PRO.decode_seq}),
    ]


CASES = build() + cases_at("pro")
for _c in CASES:
    register(_c)
