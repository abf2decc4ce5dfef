"""TEST DOUBLE of upstream ``hierarchical_sparse_indexer.hierarchical_sparse_indexer`` (spec §5.2), in Torch:
blocks of ``candidate_block_size`` positions ranked by their max score, the block holding position
compressed_len-1 always kept, the best ``candidate_topk_blocks`` finite blocks written as 1 in the mask.

``PTO_FAKE_UPSTREAM_DEFECT=hsi_drop_last_block`` seeds a wrong kernel: the block holding the last position is
not forced (a kernel that forgot the rule)."""

import os

import pypto.language as pl

from models.deepseek_v4_1_flash.config import CMP_POSITIONS_DYN, FLASH, T_DYN


@pl.jit.inline
def hierarchical_sparse_indexer(index_scores: pl.Tensor[[T_DYN, CMP_POSITIONS_DYN], pl.FP32],
                                compressed_lens: pl.Tensor[[T_DYN], pl.INT32],
                                candidate_mask: pl.Tensor[[T_DYN, CMP_POSITIONS_DYN], pl.UINT8]):
    block, topk = FLASH.candidate_block_size, FLASH.candidate_topk_blocks
    force_last = os.environ.get("PTO_FAKE_UPSTREAM_DEFECT") != "hsi_drop_last_block"
    tokens, positions = index_scores.shape
    blocks = (positions + block - 1) // block
    for t in range(tokens):
        best = []
        for b in range(blocks):
            value = float(index_scores[t, b * block:(b + 1) * block].max())
            best.append(value)
        length = int(compressed_lens[t])
        if force_last and length > 0:
            best[min((length - 1) // block, blocks - 1)] = float("inf")
        order = sorted(range(blocks), key=lambda b: (-best[b], b))[:topk]
        candidate_mask[t].zero_()
        for b in order:
            if best[b] > float("-inf"):
                candidate_mask[t, b * block:(b + 1) * block] = 1
    return candidate_mask


