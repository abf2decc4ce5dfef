"""TEST DOUBLE of upstream ``models/deepseek_v4_pro/lm_head.py``'s two-device entry ``l3_lm_head``, in Torch: each
owner's selected rows times the concatenated vocabulary shards (FP32), and their greedy ids. One DP owner, two TP
shards, T dynamic; run with a distributed config on two devices."""

import pypto.language as pl
import torch
from config import ACTIVE as M

D = M.hidden_size
TP_SIZE = 2
VOCAB_PER_TP = 256
T_DYN = pl.dynamic("LM_HEAD_T_DYN")


@pl.jit
def l3_lm_head(
    hidden_states: pl.Tensor[[1, T_DYN, D], pl.BF16],
    lm_head_weight: pl.Tensor[[TP_SIZE, VOCAB_PER_TP, D], pl.BF16],
    logits: pl.Out[pl.Tensor[[1, T_DYN, TP_SIZE * VOCAB_PER_TP], pl.FP32]],
    sampled_ids: pl.Out[pl.Tensor[[1, T_DYN, 8], pl.INT32]],
    logit_row_indices: pl.Tensor[[1, T_DYN], pl.INT32],
):
    weight = torch.cat([lm_head_weight[r].float() for r in range(TP_SIZE)], dim=0)
    rows = hidden_states[0, logit_row_indices[0].long()].float()
    logits[0] = rows @ weight.T
    sampled_ids[0, :, 0] = torch.argmax(logits[0], dim=-1).to(torch.int32)
    return logits
