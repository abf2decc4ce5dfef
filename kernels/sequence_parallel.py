"""Sequence-parallel owner slabs: bounds, owner mapping, and a CPU model of shard -> gather.

Row ownership follows the physical slab ``ceil(capacity / TP)``, not ``ceil(active / TP)``;
ranks past the active range own empty slabs but still publish ``width`` rows. Padding rows
carry a zero payload, token_id -1, position -1 and valid False.

Spec: §7.1.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from kernels.errors import ContractInputError, first_true, is_int
from kernels.operators import operator

SPEC = "§7.1"
# Bump when the arithmetic or a rounding rule changes on purpose: goldens recorded before go stale.
ROUNDING_VERSION = "slab-1"


@dataclass(frozen=True)
class SlabBounds:
    """Rows ``[first, first + count)`` of the active batch live in rank's slab of ``width`` rows."""

    rank: int
    first: int
    count: int
    width: int


@dataclass(frozen=True)
class Slab:
    """One rank's physical slab: ``payload`` [width, D], ``token_ids``/``positions`` [width] I32, ``valid`` [width]."""

    rank: int
    payload: torch.Tensor
    token_ids: torch.Tensor
    positions: torch.Tensor
    valid: torch.Tensor


def _nonneg_int(name: str, value: object) -> int:
    if not is_int(value) or value < 0:
        raise ContractInputError(name, None, "a non-negative int", repr(value), SPEC)
    return value


@operator(returns='tuple[SlabBounds] with .first/.count/.width per rank', spec='§7.1')
def sp_bounds(active_tokens: int, tp: int, capacity: int | None = None) -> tuple[SlabBounds, ...]:
    """Per-rank (first, count, width): ``width = ceil(capacity/TP)``, ``first = min(r*width, T)``,
    ``count = max(0, min(width, T - first))``. Spec: §7.1.
    """
    active = _nonneg_int("active_tokens", active_tokens)
    if not is_int(tp) or tp < 1:
        raise ContractInputError("tp", None, "a positive int", repr(tp), SPEC)
    cap = active if capacity is None else _nonneg_int("capacity", capacity)
    if cap < active:
        raise ContractInputError("capacity", None, f">= active_tokens={active}", cap, SPEC)
    width = -(-cap // tp) if cap else 0
    bounds = []
    for rank in range(tp):
        first = min(rank * width, active)
        bounds.append(SlabBounds(rank, first, max(0, min(width, active - first)), width))
    return tuple(bounds)


def slab_owner(row: int, width: int) -> int:
    """Rank owning active row ``row`` for slab width ``width``. Spec: §7.1."""
    if width <= 0:
        raise ContractInputError("width", None, "> 0 to own any row", width, SPEC)
    return row // width


@operator(returns='list[Slab] (payload [width,D], token_ids, positions, valid)', spec='§7.1')
def sp_shard(x: torch.Tensor, token_ids: torch.Tensor, positions: torch.Tensor, *, tp: int,
               capacity: int | None = None) -> list[Slab]:
    """Split the active rows ``x`` [T, D] into ``tp`` physical slabs with padded suffixes. Spec: §7.1."""
    if x.ndim != 2:
        raise ContractInputError("x", None, "a 2-D [tokens, D] tensor", f"shape {tuple(x.shape)}", SPEC)
    active = x.shape[0]
    for name, value in (("token_ids", token_ids), ("positions", positions)):
        if value.ndim != 1 or value.numel() != active:
            raise ContractInputError(name, None, f"one entry per token ({active})", tuple(value.shape), SPEC)
    slabs = []
    for b in sp_bounds(active, tp, capacity):
        payload = torch.zeros((b.width, x.shape[1]), dtype=x.dtype)
        tok = torch.full((b.width,), -1, dtype=torch.int32)
        pos = torch.full((b.width,), -1, dtype=torch.int32)
        valid = torch.zeros(b.width, dtype=torch.bool)
        rows = slice(b.first, b.first + b.count)
        payload[: b.count] = x[rows]
        tok[: b.count] = token_ids[rows].to(torch.int32)
        pos[: b.count] = positions[rows].to(torch.int32)
        valid[: b.count] = True
        slabs.append(Slab(b.rank, payload, tok, pos, valid))
    return slabs


def check_owner_slabs(slabs: Sequence[Slab], *, active_tokens: int, capacity: int | None = None) -> None:
    """Raise ValueError naming rank, row and field when a slab breaks the bounds or the padding contract.

    Spec: §7.1 (padding contract, checked on every layer before the gather).
    """
    tp = len(slabs)
    bounds = sp_bounds(active_tokens, tp, capacity)
    for slab, b in zip(slabs, bounds, strict=True):
        if slab.rank != b.rank:
            raise ContractInputError("slabs", (b.rank,), f"rank {b.rank} in rank order", slab.rank, SPEC)
        for name in ("payload", "token_ids", "positions", "valid"):
            rows = getattr(slab, name).shape[0]
            if rows != b.width:
                raise ContractInputError(f"rank{b.rank}.{name}", None, f"{b.width} rows (ceil(capacity/TP))",
                                         rows, SPEC)
        want = torch.arange(b.width) < b.count
        if not torch.equal(slab.valid.to(torch.bool), want):
            r = first_true(slab.valid.to(torch.bool) != want)
            raise ContractInputError(f"rank{b.rank}.valid", (r,), str(bool(want[r])), bool(slab.valid[r]), SPEC)
        pad = slice(b.count, b.width)
        for name, fill in (("token_ids", -1), ("positions", -1)):
            bad = getattr(slab, name)[pad] != fill
            if bool(bad.any()):
                r = b.count + first_true(bad)
                raise ContractInputError(f"rank{b.rank}.{name}", (r,), f"{fill} on a padding row",
                                         int(getattr(slab, name)[r]), SPEC)
        nonzero = (slab.payload[pad] != 0).flatten(1).any(dim=1) if b.width > b.count else torch.zeros(0, dtype=bool)
        if bool(nonzero.any()):
            r = b.count + first_true(nonzero)
            raise ContractInputError(f"rank{b.rank}.payload", (r,), "an all-zero padding row",
                                     "non-zero values", SPEC)


@operator(returns='(x [T,D], token_ids [T], positions [T]); raises ValueError on a padding breach',
          spec='§7.1')
def sp_gather(slabs: Sequence[Slab], *, active_tokens: int, capacity: int | None = None
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Validate every slab, then concatenate the owned rows in rank order -> (x [T, D], token_ids, positions).

    Spec: §7.1.
    """
    if not slabs:
        raise ContractInputError("slabs", None, "at least one rank", 0, SPEC)
    check_owner_slabs(slabs, active_tokens=active_tokens, capacity=capacity)
    bounds = sp_bounds(active_tokens, len(slabs), capacity)
    x = torch.cat([s.payload[: b.count] for s, b in zip(slabs, bounds, strict=True)])
    tok = torch.cat([s.token_ids[: b.count] for s, b in zip(slabs, bounds, strict=True)])
    pos = torch.cat([s.positions[: b.count] for s, b in zip(slabs, bounds, strict=True)])
    if x.shape[0] != active_tokens:
        raise ContractInputError("gathered rows", None, f"{active_tokens} active rows", x.shape[0], SPEC)
    return x, tok, pos


def dp_token_counts(dp_tokens: Sequence[int], *, tokens: int, dp: int) -> tuple[int, ...]:
    """The active rows of each DP group of a prefill call: exactly one int per DP group, each in [0, tokens]
    (an empty group is allowed). Spec: upstream_checks CH-07."""
    counts = tuple(dp_tokens)
    if len(counts) != dp:
        raise ContractInputError("dp_tokens", None, f"one count per DP group ({dp})", len(counts), "CH-07")
    for g, n in enumerate(counts):
        if not is_int(n) or not 0 <= n <= tokens:
            raise ContractInputError("dp_tokens", (g,), f"an int in [0, {tokens}]", repr(n), "CH-07")
    return counts
