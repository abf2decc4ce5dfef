"""Seeded defects of the decoder and encoder replays (upstream_checks MD-15, MD-16, MD-18, MD-19)."""

from __future__ import annotations

from dataclasses import replace

import torch

from backends import torch_backend
from kernels import prefill_plan

_base = torch_backend()


def _keeps_129(query_start_loc, position_ids, token_to_req_indices, kv_seq_lens, window_block_table, *,
               window=prefill_plan.FLASH.sliding_window, block_size=prefill_plan.FLASH.block_size):
    """Wrong: the replay keeps window + 1 rows (129 at FLASH) -- an inclusive bound."""
    return prefill_plan.decoder_replay(query_start_loc, position_ids, token_to_req_indices, kv_seq_lens,
                                              window_block_table, window=window + 1, block_size=block_size)


REPLAY_KEEPS_129 = _base.derive("defect:decoder-replay-keeps-129", decoder_replay=_keeps_129)


def _new_before_tail(*args, **kwargs):
    """Wrong: a resumed request's new rows are replayed before its cached tail rows."""
    r = prefill_plan.decoder_replay(*args, **kwargs)
    tail = kwargs.get("cached_tail_starts")
    cached_total = 0 if tail is None else int(tail[-1])
    rows = r.source_rows.clone()
    for b in range(r.query_lens.numel()):
        span = rows[int(r.query_start_loc[b]):int(r.query_start_loc[b + 1])]
        span.copy_(torch.cat((span[span >= cached_total], span[span < cached_total])))
    return replace(r, source_rows=rows)


def _all_rows_new(*args, **kwargs):
    """Wrong: replayed cached input rows are marked new (they would publish global caches again)."""
    r = prefill_plan.encoder_replay(*args, **kwargs)
    return replace(r, is_new=torch.ones_like(r.is_new))


NEW_BEFORE_TAIL = _base.derive("defect:decoder-replay-new-before-tail", decoder_replay=_new_before_tail)
ALL_ROWS_NEW = _base.derive("defect:encoder-replay-all-rows-new", encoder_replay=_all_rows_new)
