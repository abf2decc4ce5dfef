"""TEST DOUBLE of upstream ``rope_tables.materialize_rope_rows`` (spec §4.2), in Torch: for t < num_tokens,
row p of the tables when p >= 0, else the identity rotation; rows >= num_tokens untouched.

``PTO_FAKE_UPSTREAM_DEFECT=rope_negative_zero`` seeds a wrong kernel: negative positions write zeros to the
cosine (instead of 1), as a kernel that forgot the identity rotation would."""

import os

import pypto.language as pl

from models.deepseek_v4_1_flash.config import ROPE_DIM, T_DYN

ROPE_ROWS_DYN = pl.dynamic("ROPE_ROWS")


@pl.jit.inline
def materialize_rope_rows(freqs_cos: pl.Tensor[[ROPE_ROWS_DYN, ROPE_DIM // 2], pl.FP32],
                          freqs_sin: pl.Tensor[[ROPE_ROWS_DYN, ROPE_DIM // 2], pl.FP32],
                          position_ids: pl.Tensor[[T_DYN], pl.INT32],
                          num_tokens: pl.Scalar[pl.INT32],
                          rope_cos: pl.Tensor[[T_DYN, ROPE_DIM // 2], pl.FP32],
                          rope_sin: pl.Tensor[[T_DYN, ROPE_DIM // 2], pl.FP32]):
    identity_cos = 0.0 if os.environ.get("PTO_FAKE_UPSTREAM_DEFECT") == "rope_negative_zero" else 1.0
    for t in range(int(num_tokens)):
        p = int(position_ids[t])
        if p >= 0:
            rope_cos[t] = freqs_cos[p]
            rope_sin[t] = freqs_sin[p]
        else:
            rope_cos[t] = identity_cos
            rope_sin[t] = 0.0
