"""Golden cases of V4's sparse attention with the fused grouped W8A8 output projection: each decode path
(HCA, CSA, SWA) and the prefill forms (the V4-Pro tiny kernel preset). Spec: §8."""

from __future__ import annotations

import torch

from goldens.cases import Case, Tensors
from goldens.cases import v4_config as _v4_config
from kernels.v4 import sparse_attention as v4sa


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
    """One request's prefill chunk (contracts.v4_inputs.prefill_attention_inputs): 128 rows at positions
    100..227, 100 real (num_tokens), the padding rows pointing at real cache rows."""
    from contracts.v4_inputs import prefill_attention_inputs

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
        from contracts.v4_inputs import prefill_attention_inputs

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




def _decode_case(path: str) -> Case:
    return Case(f"v4_attention_{path.lower()}", "v4_attention",
                f"V4-Pro (tiny, kernel preset) decode {path} attention with the fused grouped W8A8 output "
                "projection: upstream's HCA start regimes, an unmapped window page, shuffled compressed pages"
                + (", raw CSA slots at and past the causal bound" if path == "CSA" else ""),
                build_inputs=_v4_attention_build(path),
                run=lambda b, i, w: _v4_attention_call(b.get, i, path),
                comparators=lambda w: {"attn_out": "attn_out_v4"}, preset="v4-pro-tiny")


PREFILL_PICKS = {
    "HCA": "its deterministic compressed top-k at ratio 128 (slots 0 .. (pos + 1) // 128 - 1, crossing from 1 to 2 "
           "slots at position 255)",
    "SWA": "the window only (the MTP layer's path)",
}


def _prefill_path_case(path: str) -> Case:
    return Case(f"v4_attention_prefill_{path.lower()}", "v4_attention",
                f"V4-Pro (tiny, kernel preset) prefill {path} attention with the fused W8A8 output projection: "
                "one request of 128 rows at positions 200..327 (100 real, padding rows pointing at real cache "
                f"rows), {PREFILL_PICKS[path]}", build_inputs=_v4_prefill_path_build(path),
                run=lambda b, i, w: _v4_prefill_path_call(b.get, i, path),
                comparators=lambda w: {"attn_out": "attn_out_v4"}, preset="v4-pro-tiny")


CASES = [
    *(_decode_case(path) for path in v4sa.PATHS),
    Case("v4_attention_prefill", "v4_attention",
         "V4-Pro (tiny, kernel preset) prefill sparse attention with the fused W8A8 output projection, "
         "the CSA path: one request of 128 rows (100 real, padding rows pointing at real cache rows), an "
         "indexer's ratio-4 picks given as logical compressed slots (the prefill entry takes HCA's and "
         "CSA's as given)", build_inputs=_v4_prefill_attention_build,
         run=lambda b, i, w: _v4_attention_call(b.get, i, "HCA"),
         comparators=lambda w: {"attn_out": "attn_out_v4"}, preset="v4-pro-tiny"),
    _prefill_path_case("HCA"),
    _prefill_path_case("SWA"),
]
