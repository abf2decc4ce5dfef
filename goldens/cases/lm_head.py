"""Golden cases of the model boundary (embedding pack, LM head, greedy pick, the collapse and final norm)
and of the Engram block. Spec: §1."""

from __future__ import annotations

import torch

from goldens.cases import Case, Tensors
from kernels.config import FLASH_TINY

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



CASES = [
    Case("lm_head", "lm_head+greedy_pick+embed_pack",
         f"LM head on TP{LM_HEAD_TP}: full logits (replicated) or the ranks' vocab shards (sharded), "
         "greedy ids with exact ties across shards and with the last id, and the embedding pack of "
         "clamped ids (-1, vocab, vocab+7)", build_inputs=_lm_head_build,
         run=lambda b, i, w: _lm_head_call(b.get, i, w),
         comparators=lambda w: {("logits" if w == "replicated" else "logit_shards"): "logits", "ids": "greedy",
         "x_hc": "exact"}, wirings=("replicated", "sharded"), params={"tp": LM_HEAD_TP}),
    Case("engram", "engram+engram_tp",
         f"the Engram block: a gated n-gram lookup added to every stream (replicated: one rank; sharded: "
         f"the table row-sharded over TP{ENGRAM_TP}, every rank's output)", build_inputs=_engram_build,
         run=lambda b, i, w: _engram_call(b.get, i, w), comparators=lambda w: {"out": "engram"},
         wirings=("replicated", "sharded"), params={"tp": ENGRAM_TP}),
    Case("boundary", "embed_pack+hc_head+final_norm",
         "the model boundary with the backbone skipped: embedding pack of ids past the vocabulary "
         "(clamped), the collapse with a non-identity delayed pre-mix, the final RMSNorm",
         build_inputs=_boundary_build, run=lambda b, i, w: _boundary_call(b.get, i, w),
         comparators=lambda w: {"x_hc": "exact", "hidden": "hc_out", "x_normed": "hc_out"},
         modules=("kernels.reference.lm_head", "kernels.reference.mhc", "kernels.reference.compressor")),
]
