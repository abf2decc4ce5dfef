"""Seeded defect of the decoder replay (upstream_checks MD-15, MD-16)."""

from __future__ import annotations

from contracts.backends import torch_backend
from kernels import prefill_plan

_base = torch_backend()


def _keeps_129(query_start_loc, position_ids, token_to_req_indices, kv_seq_lens, window_block_table, *,
               window=prefill_plan.FLASH.sliding_window, block_size=prefill_plan.FLASH.block_size):
    """Wrong: the replay keeps window + 1 rows (129 at FLASH) -- an inclusive bound."""
    return prefill_plan.select_decoder_replay(query_start_loc, position_ids, token_to_req_indices, kv_seq_lens,
                                              window_block_table, window=window + 1, block_size=block_size)


REPLAY_KEEPS_129 = _base.derive("defect:decoder-replay-keeps-129", decoder_replay=_keeps_129)
