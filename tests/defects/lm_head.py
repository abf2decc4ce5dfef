"""Seeded defects of the model boundary (spec §1; upstream_checks SC-23, AP-18, CQ-26): realistic one-bug
ports, each a backend built from the reference with one operator replaced."""

from __future__ import annotations

import torch

from backends import torch_backend
from kernels.reference import lm_head

_base = torch_backend()


def _ties_to_last(logits):
    """Wrong: greedy ties go to the last maximum (an argmax over the reversed row)."""
    lm_head.greedy_pick(logits)  # same validation
    flipped = logits.flip(1)
    return (logits.shape[1] - 1 - flipped.argmax(1)).to(torch.int32)


def _shard_off_by_one(hidden, weight, *, tp=1):
    """Wrong: every shard after the first starts one vocabulary row late (the row before it is lost and the
    next shard's first row is computed twice)."""
    rows = weight.shape[0] // tp
    shards = lm_head.lm_head(hidden, weight, tp=1)[0]
    out = []
    for r in range(tp):
        start = r * rows + (1 if r else 0)
        s = shards[:, start:start + rows]
        if s.shape[1] < rows:
            s = torch.cat([s, shards[:, -1:].expand(-1, rows - s.shape[1])], dim=1)
        out.append(s.contiguous())
    return out


def _ids_wrap(ids, embedding, *, config=lm_head.FLASH):
    """Wrong: ids are not clamped; -1 wraps to the last row (Python indexing) and ids past the vocabulary are
    taken modulo its size."""
    rows = embedding[ids.to(torch.long) % embedding.shape[0]]
    return rows.unsqueeze(1).expand(-1, config.hc_mult, -1).contiguous()


GREEDY_TIES_TO_LAST = _base.derive("defect:greedy-ties-to-last", greedy_pick=_ties_to_last)
SHARD_OFF_BY_ONE = _base.derive("defect:lm-head-shard-off-by-one", lm_head=_shard_off_by_one)
IDS_WRAP = _base.derive("defect:embed-ids-wrap", embed_pack=_ids_wrap)


def _norm_without_weight(hidden, weight, *, config=lm_head.FLASH):
    """Wrong: the final RMSNorm forgets its weight."""
    return lm_head.final_norm(hidden, torch.ones_like(weight), config=config)


NORM_WITHOUT_WEIGHT = _base.derive("defect:final-norm-without-weight", final_norm=_norm_without_weight)
