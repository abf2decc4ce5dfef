"""The V4 decode sparse-attention device arithmetic, written apart from the reference (``--backend emulated``).

Per token, as the V4 kernels run it (upstream decode_sparse_attn*.py): the key columns (the window, then the
compressed slots) in tiles of 128; each tile in FP32 -- scores biased by -1e20 on invalid keys, the tile's
row maximum, exp, the row sum, the probabilities cast to BF16 for the product with the BF16 rows; the tiles
merged one after another (running maximum, alpha / beta rescale); the sink joins the denominator at the end;
the output stays FP32. A token with no valid key outputs zero (the golden's rule).

Spec: §8.
"""

from __future__ import annotations

import torch

from kernels.v4.sparse_attention import check_sparse_attention_inputs  # validation only: same refusals

TILE = 128
NEG = -1.0e20


def _physical_rows(slots: torch.Tensor, table: torch.Tensor, *, seq: int, block_size: int) -> torch.Tensor:
    """Each token's logical compressed slots through its request's page table (token t is request t // seq),
    one slot at a time as the kernel's address arithmetic does it; -1 stays -1."""
    rows = torch.full(slots.shape, -1, dtype=torch.int64)
    for t in range(slots.shape[0]):
        for k in range(slots.shape[1]):
            slot = int(slots[t, k])
            if slot >= 0:
                rows[t, k] = int(table[t // seq, slot // block_size]) * block_size + slot % block_size
    return rows


def tiled_v4_sparse_attention(q: torch.Tensor, ori_kv: torch.Tensor, window_indices: torch.Tensor,
                              cmp_kv: torch.Tensor, cmp_block_table: torch.Tensor, cmp_indices: torch.Tensor,
                              attn_sink: torch.Tensor, *, seq: int, key_tiles: str = "columns") -> torch.Tensor:
    """Same signature and result as ``kernels.v4.sparse_attention.v4_sparse_attention`` (``key_tiles``
    "gathered": a prefill kernel's walk over the token's valid keys only, window then compressed)."""
    check_sparse_attention_inputs(q, ori_kv, window_indices, cmp_kv, cmp_block_table, cmp_indices, attn_sink,
                                  seq=seq)
    if key_tiles not in ("columns", "gathered"):
        from kernels.errors import ContractInputError

        raise ContractInputError("key_tiles", None, "one of ('columns', 'gathered')", repr(key_tiles), "§8")
    tokens, heads, dim = q.shape
    ori, cmp = ori_kv.reshape(-1, dim), cmp_kv.reshape(-1, dim)
    rows = _physical_rows(cmp_indices, cmp_block_table, seq=seq, block_size=cmp_kv.shape[1])
    sink = attn_sink.to(torch.float32)
    out = torch.zeros(tokens, heads, dim, dtype=torch.float32)
    for t in range(tokens):
        ids = torch.cat((window_indices[t].to(torch.int64), rows[t]))
        src = torch.cat((torch.zeros(window_indices.shape[1], dtype=torch.bool), torch.ones(rows.shape[1], dtype=torch.bool)))
        if key_tiles == "gathered":
            ids, src = ids[ids >= 0], src[ids >= 0]
        if not bool((ids >= 0).any()):
            continue
        qt = q[t].to(torch.float32)
        m = li = oi = None
        for start in range(0, ids.numel(), TILE):
            tid, tsrc = ids[start:start + TILE], src[start:start + TILE]
            ok = tid >= 0
            kv = torch.zeros(tid.numel(), dim, dtype=torch.bfloat16)
            kv[ok & ~tsrc] = ori[tid[ok & ~tsrc]]
            kv[ok & tsrc] = cmp[tid[ok & tsrc]]
            kv32 = kv.to(torch.float32)
            s = (qt @ kv32.T) * dim**-0.5 + (~ok).to(torch.float32) * NEG
            mi = s.max(dim=1).values
            e = torch.exp(s - mi[:, None]) * ok
            pv = e.to(torch.bfloat16).to(torch.float32) @ kv32
            if m is None:
                m, li, oi = mi, e.sum(dim=1), pv
                continue
            new = torch.maximum(m, mi)
            alpha, beta = torch.exp(m - new), torch.exp(mi - new)
            li, oi, m = alpha * li + beta * e.sum(dim=1), alpha[:, None] * oi + beta[:, None] * pv, new
        out[t] = oi / (li + torch.exp(sink - m))[:, None]
    return out
