"""TEST DOUBLE of upstream ``models/deepseek_v4_pro/hc_post.py``'s kernel entry ``hc_post_test``, in Torch: the
mHC expansion y[:, j] = x · post[:, j] + Σ_i residual[:, i] · comb[:, i, j], FP32 end to end.

``PTO_FAKE_UPSTREAM_DEFECT=hc_post_untransposed`` seeds a wrong kernel: comb read as [j, i];
``hc_post_last_row_unwritten``: the last row of y never written (it keeps what the runner handed in)."""

import os

import pypto.language as pl
import torch
from config import ACTIVE as M

D = M.hidden_size
HC_MULT = M.hc_mult
T_DYN = pl.dynamic("T_DYN")
T_TILE = 4  # upstream's kernel spreads (T // T_TILE) · HC_MULT blocks: T in whole tiles


@pl.jit
def hc_post_test(
    x: pl.Tensor[[T_DYN, D], pl.BF16],
    residual: pl.Tensor[[T_DYN, HC_MULT, D], pl.FP32],
    post: pl.Tensor[[T_DYN, HC_MULT], pl.FP32],
    comb: pl.Tensor[[T_DYN, HC_MULT * HC_MULT], pl.FP32],
    y: pl.Out[pl.Tensor[[T_DYN, HC_MULT, D], pl.FP32]],
):
    c = comb.float().reshape(-1, HC_MULT, HC_MULT)
    if os.environ.get("PTO_FAKE_UPSTREAM_DEFECT") == "hc_post_untransposed":
        c = c.transpose(1, 2)
    out = x.float().unsqueeze(1) * post.float().unsqueeze(-1) + torch.einsum("tij,tid->tjd", c, residual.float())
    if os.environ.get("PTO_FAKE_UPSTREAM_DEFECT") == "hc_post_last_row_unwritten":
        y[:-1].copy_(out[:-1])
        return y
    y.copy_(out)
    return y
