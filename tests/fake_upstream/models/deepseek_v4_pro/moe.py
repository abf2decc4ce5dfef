"""TEST DOUBLE of upstream ``models/deepseek_v4_pro/moe.py``'s two-device entry ``l3_moe`` (the MoE stage over EP 2,
one rank a device), at the V4-Pro tiny preset's dims. It computes each rank's ``x_next`` with pto-contracts' own
reference stage (``kernels.v4.moe.v4_moe_stage``) over all the ranks' experts: it tests how the harness lays a call
out, fills the output and reads the ranks back, not anyone's arithmetic.

``PTO_FAKE_UPSTREAM_DEFECT``:
- ``moe_padding_unwritten``: the rows past ``num_tokens`` never written (they keep what the runner handed in);
- ``moe_rank1_unordered``: rank 1's rows given back in rank 0's order instead of its own."""

import os

import pypto.language as pl
from config import ACTIVE as M

D = M.hidden_size
HC_MULT = M.hc_mult
N_RANKS = 2
T = 8
N_EXPERTS = 16
N_LOCAL = N_EXPERTS // N_RANKS
MOE_INTER = 32
TOPK = 6
VOCAB = 32
MIX_HC = (2 + HC_MULT) * HC_MULT
HC_DIM = HC_MULT * D


@pl.jit
def l3_moe(
    x_hc: pl.Tensor[[N_RANKS, T, HC_MULT, D], pl.FP32],
    hc_ffn_fn: pl.Tensor[[N_RANKS, MIX_HC, HC_DIM], pl.FP32],
    hc_ffn_scale: pl.Tensor[[N_RANKS, 3], pl.FP32],
    hc_ffn_base: pl.Tensor[[N_RANKS, MIX_HC], pl.FP32],
    norm_w: pl.Tensor[[N_RANKS, D], pl.BF16],
    gate_w: pl.Tensor[[N_RANKS, N_EXPERTS, D], pl.FP32],
    gate_bias: pl.Tensor[[N_RANKS, N_EXPERTS], pl.FP32],
    tid2eid: pl.Tensor[[N_RANKS, VOCAB, TOPK], pl.INT32],
    input_ids: pl.Tensor[[N_RANKS, T], pl.INT64],
    routed_w1: pl.Tensor[[N_RANKS, N_LOCAL, MOE_INTER, D], pl.INT8],
    routed_w1_scale: pl.Tensor[[N_RANKS, N_LOCAL, MOE_INTER], pl.FP32],
    routed_w3: pl.Tensor[[N_RANKS, N_LOCAL, MOE_INTER, D], pl.INT8],
    routed_w3_scale: pl.Tensor[[N_RANKS, N_LOCAL, MOE_INTER], pl.FP32],
    routed_w2: pl.Tensor[[N_RANKS, N_LOCAL, D, MOE_INTER], pl.INT8],
    routed_w2_scale: pl.Tensor[[N_RANKS, N_LOCAL, D], pl.FP32],
    shared_w1: pl.Tensor[[N_RANKS, MOE_INTER, D], pl.INT8],
    shared_w1_scale: pl.Tensor[[N_RANKS, MOE_INTER], pl.FP32],
    shared_w3: pl.Tensor[[N_RANKS, MOE_INTER, D], pl.INT8],
    shared_w3_scale: pl.Tensor[[N_RANKS, MOE_INTER], pl.FP32],
    shared_w2: pl.Tensor[[N_RANKS, D, MOE_INTER], pl.INT8],
    shared_w2_scale: pl.Tensor[[N_RANKS, D], pl.FP32],
    x_next: pl.Out[pl.Tensor[[N_RANKS, T, HC_MULT, D], pl.FP32]],
    layer_id: pl.Scalar[pl.INT32],
    num_tokens: pl.Scalar[pl.INT32],
):
    from kernels.config import V4_PRO_TINY
    from kernels.v4.moe import V4ExpertWeights, v4_moe_stage

    config = V4_PRO_TINY.kernel_preset()
    defect = os.environ.get("PTO_FAKE_UPSTREAM_DEFECT", "")
    routed = [V4ExpertWeights(routed_w1[r, j], routed_w1_scale[r, j], routed_w3[r, j], routed_w3_scale[r, j],
                              routed_w2[r, j], routed_w2_scale[r, j]) for r in range(N_RANKS) for j in range(N_LOCAL)]
    n = int(num_tokens)
    outs = []
    for r in range(N_RANKS):
        shared = V4ExpertWeights(shared_w1[r], shared_w1_scale[r], shared_w3[r], shared_w3_scale[r], shared_w2[r],
                                 shared_w2_scale[r])
        out = v4_moe_stage(x_hc[r], hc_ffn_fn[r], hc_ffn_scale[r], hc_ffn_base[r], norm_w[r], gate_w[r],
                           gate_bias[r], int(layer_id), n, tid2eid[r], input_ids[r], routed, shared, config=config)
        outs.append(out["x_out"])
    if defect == "moe_rank1_unordered":
        outs[1] = outs[0].clone()
    for r in range(N_RANKS):
        if defect == "moe_padding_unwritten":
            x_next[r, :n] = outs[r][:n]
        else:
            x_next[r] = outs[r]
    return x_next
