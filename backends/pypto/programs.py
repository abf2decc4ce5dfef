"""Device programs of the ``pypto`` backend: each wraps one upstream ``@pl.jit.inline`` entry in a ``@pl.jit``
program whose parameters are this project's argument names (spec §4.2 rope rows, §5.2 candidate blocks), so a replay tree exported with ``goldens
export-pt`` is directly upstream's ``golden_data`` layout for it. Imported only inside the upstream worker
(``backends.upstream.worker``), with the pypto-lib root on the path and the real toolchain present; no ``from __future__ import annotations`` here: the
toolchain reads these annotations. Facts: spec §4.2 (materialize_rope_rows), §7.3 (run, golden_data)."""

import pypto.language as pl
from models.deepseek_v4_1_flash import config as C
from models.deepseek_v4_1_flash.hierarchical_sparse_indexer import hierarchical_sparse_indexer as _hsi
from models.deepseek_v4_1_flash.rope_tables import ROPE_ROWS_DYN
from models.deepseek_v4_1_flash.rope_tables import materialize_rope_rows as _rope_rows


@pl.jit
def materialize_rope_rows(
    freqs_cos: pl.Tensor[[ROPE_ROWS_DYN, C.ROPE_DIM // 2], pl.FP32],
    freqs_sin: pl.Tensor[[ROPE_ROWS_DYN, C.ROPE_DIM // 2], pl.FP32],
    position_ids: pl.Tensor[[C.T_DYN], pl.INT32],
    num_tokens: pl.Scalar[pl.INT32],
    rope_cos: pl.InOut[pl.Tensor[[C.T_DYN, C.ROPE_DIM // 2], pl.FP32]],
    rope_sin: pl.InOut[pl.Tensor[[C.T_DYN, C.ROPE_DIM // 2], pl.FP32]],
):
    _rope_rows(freqs_cos, freqs_sin, position_ids, num_tokens, rope_cos, rope_sin)
    return rope_cos, rope_sin


@pl.jit
def candidate_blocks(
    scores: pl.Tensor[[C.T_DYN, C.CMP_POSITIONS_DYN], pl.FP32],
    compressed_lens: pl.Tensor[[C.T_DYN], pl.INT32],
    candidate_mask: pl.Out[pl.Tensor[[C.T_DYN, C.CMP_POSITIONS_DYN], pl.UINT8]],
):
    _hsi(scores, compressed_lens, candidate_mask)
    return candidate_mask
