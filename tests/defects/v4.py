"""Seeded defects of the V4 rules (spec §8): realistic one-bug ports, each a backend built from the reference
with one operator replaced."""

from __future__ import annotations

import dataclasses

import torch

from contracts.backends import torch_backend
from kernels.v4 import decode_metadata as v4md

_base = torch_backend()


def _seq_major(starts, ori_table, cmp_tables, state_tables, *, config, commit_tokens=None):
    """Wrong: the MTP rows are interleaved seq-major (row s·B + b) instead of request-major (b·seq + s)."""
    md = v4md.v4_decode_metadata(starts, ori_table, cmp_tables, state_tables, config=config,
                                 commit_tokens=commit_tokens)
    batch, seq = md.kv_seq_lens.numel(), config.decode_seq
    order = torch.arange(batch * seq).reshape(batch, seq).T.reshape(-1)
    return dataclasses.replace(md, position_ids=md.position_ids[order])


def _hca_last(position_ids, kv_seq_lens, *, seq, limit, ratio=128):
    """Wrong: when more compressed positions are visible than the limit, HCA keeps the last ones."""
    out = v4md.hca_topk(position_ids, kv_seq_lens, seq=seq, limit=limit, ratio=ratio)
    pos = position_ids.to(torch.int64)
    visible = torch.minimum((pos + 1) // ratio, kv_seq_lens.to(torch.int64).repeat_interleave(seq) // ratio)
    shift = (visible - limit).clamp(min=0)
    return torch.where(out >= 0, out + shift[:, None].to(out.dtype), out)


MTP_ROWS_SEQ_MAJOR = _base.derive("defect:v4-mtp-rows-seq-major", v4_decode_metadata=_seq_major)
HCA_TOPK_LAST = _base.derive("defect:v4-hca-topk-last", hca_topk=_hca_last)
