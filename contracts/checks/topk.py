"""Top-K validity (§5.3) and the C2A set-overlap variant, as pure checks.

A selection is [T, K] physical rows padded with -1. The caller supplies each token's request-local
mapping (block table, request id, compressed length) and the reference scores [T, L] over logical
positions, recomputed from reference inputs; device outputs never define the scores used for the
cutoff rule (FULL layers: the device-published index cache is an input the caller chooses).

Spec: §5.3, upstream_checks IX-07..IX-12, §15 C-5.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from contracts.result import Bound, CheckResult, Tally, Violation, failed, passed
from contracts.tolerances import (
    CUTOFF_ATOL,
    CUTOFF_RTOL,
    MIN_OVERLAP,
    V4_PREFILL_HARD_ATOL,
    V4_SCORE_HARD,
    V4_SCORE_TOL,
)


@dataclass(frozen=True)
class TopKContext:
    """What a Top-K row may legally contain: per-token request rows and visible lengths."""

    block_table: torch.Tensor  # [B, pages]
    request_ids: torch.Tensor  # [T]
    compressed_lens: torch.Tensor  # [T]
    block_size: int
    rank: int = 0

    def logical_of(self, t: int) -> dict[int, int]:
        """physical row -> logical position over the token's visible range."""
        r = int(self.request_ids[t])
        table = self.block_table[r].tolist()
        out = {}
        for j in range(int(self.compressed_lens[t])):
            page = j // self.block_size
            if page < len(table) and table[page] >= 0:
                out[table[page] * self.block_size + j % self.block_size] = j
        return out


def check_topk_validity(actual: torch.Tensor, expected: torch.Tensor, ctx: TopKContext, scores: torch.Tensor, *,
                        order: bool = True, trailing: bool = True, name: str = "topk_indices") -> CheckResult:
    """Shape/dtype; no value < -1; -1 padding trailing; exact match passes; else per token: nominal count,
    no duplicates, rows inside the token's request, strictly increasing logical positions, and on set
    differences sorted missing vs extra reference scores within 5e-5 + 1.5e-2*|missing|. Messages name
    rank, token and index. ``order``/``trailing`` False gives the decode C1A variant. Spec: §5.3."""
    check, spec = "check_topk_validity", "§5.3"
    if tuple(actual.shape) != tuple(expected.shape) or actual.dtype != expected.dtype:
        return failed(check, spec, 1, 1, Violation(f"{name}.layout", (), f"{actual.dtype}{list(actual.shape)}",
                                                   f"{expected.dtype}{list(expected.shape)}"))
    t_ = Tally(check, spec)
    a = actual.to(torch.int64)
    low = a < -1
    if bool(low.any()):
        t, k = (int(v) for v in low.nonzero()[0])
        return failed(check, spec, a.numel(), int(low.sum()),
                      Violation(f"rank{ctx.rank} {name}", (t, k), int(a[t, k]), ">= -1"))
    valid = a >= 0
    if trailing and a.shape[-1] > 1:
        hole = valid[:, 1:] & ~valid[:, :-1]
        if bool(hole.any()):
            t, k = (int(v) for v in hole.nonzero()[0])
            return failed(check, spec, a.shape[0], int(hole.any(1).sum()),
                          Violation(f"rank{ctx.rank} {name}", (t, k + 1), int(a[t, k + 1]), "-1",
                                    note=f"-1 padding at [{t}][{k}] is followed by a valid row"))
    if torch.equal(actual, expected):
        return passed(check, spec, a.shape[0])
    e = expected.to(torch.int64)
    for t in range(a.shape[0]):
        t_.n_checked += 1
        got = [int(v) for v in a[t] if v >= 0]
        want = [int(v) for v in e[t] if v >= 0]
        where = f"rank{ctx.rank} {name}"
        if len(got) != len(want):
            t_.fail(Violation(where, (t,), f"{len(got)} valid rows", f"{len(want)} (nominal count)"))
            continue
        if len(set(got)) != len(got):
            dup = next(v for v in got if got.count(v) > 1)
            t_.fail(Violation(where, (t, got.index(dup, got.index(dup) + 1)), dup, "no duplicates",
                              note="row selected twice"))
            continue
        logical = ctx.logical_of(t)
        outside = [(k, v) for k, v in enumerate(got) if v not in logical]
        if outside:
            k, v = outside[0]
            t_.fail(Violation(where, (t, k), v, f"a row of request {int(ctx.request_ids[t])}'s visible range "
                                                f"(compressed_len {int(ctx.compressed_lens[t])})",
                              note="outside its request"))
            continue
        pos = [logical[v] for v in got]
        if order and any(b <= a_ for a_, b in zip(pos, pos[1:], strict=False)):
            k = next(i + 1 for i, (a_, b) in enumerate(zip(pos, pos[1:], strict=False)) if b <= a_)
            t_.fail(Violation(where, (t, k), f"logical {pos[k]}", f"> logical {pos[k - 1]}",
                              note="logical positions must strictly increase"))
            continue
        want_logical = {ctx.logical_of(t).get(v, -1) for v in want}
        missing = sorted((float(scores[t, j]) for j in want_logical - set(pos)), reverse=True)
        extra = sorted((float(scores[t, j]) for j in set(pos) - want_logical), reverse=True)
        for m, x in zip(missing, extra, strict=True):
            bound = CUTOFF_ATOL + CUTOFF_RTOL * abs(m)
            if not m - x <= bound:
                t_.fail(Violation(where, (t,), f"extra score {x:.6g}", f"missing score {m:.6g}", bound,
                                  note="cutoff swap beyond tolerance"))
                break
    return t_.result()


def check_topk_overlap(actual: torch.Tensor, expected: torch.Tensor, *, min_overlap: float = MIN_OVERLAP,
                       rank: int = 0, name: str = "topk_indices") -> CheckResult:
    """C2A variant: the layout (dtype, shape) of the expected selection; per row a set of physical rows; no
    duplicates, equal counts, worst-row overlap >= 0.98. Spec: §5.3 variants, upstream_checks IX-11."""
    if tuple(actual.shape) != tuple(expected.shape) or actual.dtype != expected.dtype:
        return failed("check_topk_overlap", "§5.3", 1, 1, Violation(
            f"rank{rank} {name}.layout", (), f"{actual.dtype}{list(actual.shape)}",
            f"{expected.dtype}{list(expected.shape)}"))
    t_ = Tally("check_topk_overlap", "§5.3")
    for t in range(actual.shape[0]):
        got = [int(v) for v in actual[t] if v >= 0]
        want = {int(v) for v in expected[t] if v >= 0}
        t_.n_checked += 1
        where = f"rank{rank} {name}"
        if len(set(got)) != len(got):
            t_.fail(Violation(where, (t,), "duplicate rows", "distinct rows"))
        elif len(got) != len(want):
            t_.fail(Violation(where, (t,), f"{len(got)} rows", f"{len(want)} rows"))
        elif want and len(set(got) & want) / len(want) < min_overlap:
            t_.fail(Violation(where, (t,), f"overlap {len(set(got) & want) / len(want):.4f}", f">= {min_overlap}"))
    return t_.result()


def selected_output_reference(selection: torch.Tensor, validity: CheckResult, reference_caches: object,
                              attention_reference: Callable[[torch.Tensor, object], torch.Tensor]) -> torch.Tensor:
    """Reference output for an accepted alternative selection, recomputed from the *reference* caches and
    original weights (bound into ``attention_reference``). An invalid selection never redefines the
    reference: it raises. Spec: §5.3 "Accepted alternative selection", IX-12."""
    if not validity.ok:
        raise ValueError(f"an invalid Top-K selection cannot define the output reference: {validity.message()}")
    return attention_reference(selection, reference_caches)


V4_LOWEST = float(torch.finfo(torch.float32).min)  # the score of a position past the visible range


def v4_hard_bound(a: torch.Tensor, e: torch.Tensor, floor: float = V4_SCORE_HARD[1]) -> torch.Tensor:
    """max(4 · (1e-4 + 1/128 · max(|a|, |e|)), floor), elementwise: how far one score may move (floor 5e-3 at
    decode, 7e-3 on a prefill chunk)."""
    atol, rtol = V4_SCORE_TOL
    mult = V4_SCORE_HARD[0]
    return torch.clamp(mult * (atol + rtol * torch.maximum(a.abs(), e.abs())), min=floor)


# What a decode score row holds past its visible range: upstream's decode kernel writes scores tile by tile (128
# keys) and the lowest FP32 number to the end of the last tile, and leaves the rest of the row unwritten; its
# comparator (score_valid_compare) judges the visible scores only and every score finite. Its prefill kernel fills
# the whole row, and prefill_score_compare holds the tail to the sentinel. Both rules are kept by name.
V4_SCORE_TAILS = ("unread", "lowest")
V4_DECODE_TAIL, V4_PREFILL_TAIL = "unread", "lowest"


def check_v4_index_scores(actual: torch.Tensor, expected: torch.Tensor, *, name: str = "score",
                          hard_floor: float = V4_SCORE_HARD[1], tail: str = V4_PREFILL_TAIL) -> CheckResult:
    """V4 index scores [T, L] FP32: every element finite; the visible scores (the expected ones that are not the
    lowest FP32 number) within ratio_allclose(1e-4, 1/128) (0.5 % quota) and each within the hard bound
    ``v4_hard_bound`` (``hard_floor``: 5e-3 at decode, ``V4_PREFILL_HARD_ATOL`` on a prefill chunk). Past the
    visible range (``tail``): ``"lowest"`` -- exactly the lowest FP32 number, as the expected ones (prefill);
    ``"unread"`` -- any finite value (decode: the kernel does not write it). Spec: §8."""
    from contracts.checks.precision import check_ratio_allclose

    check, spec = "check_v4_index_scores", "§8"
    if tail not in V4_SCORE_TAILS:
        raise ValueError(f"tail must be one of {V4_SCORE_TAILS}, got {tail!r}")
    if actual.dtype != torch.float32 or tuple(actual.shape) != tuple(expected.shape):
        return failed(check, spec, 1, 1, Violation(f"{name}.layout", (), f"{actual.dtype}{list(actual.shape)}",
                                                   f"torch.float32{list(expected.shape)}"))
    a, e = actual.double(), expected.double()
    nonfinite = ~torch.isfinite(a)
    if bool(nonfinite.any()):
        r, c = (int(v) for v in nonfinite.nonzero()[0])
        return failed(check, spec, a.numel(), int(nonfinite.sum()), Violation(name, (r, c), float(a[r, c]),
                                                                              "a finite score"))
    tail_mask = e == V4_LOWEST
    wrong_tail = tail_mask != (a == V4_LOWEST)
    if tail == "unread":
        wrong_tail &= ~tail_mask  # only the visible range is judged
    if bool(wrong_tail.any()):
        r, c = (int(v) for v in wrong_tail.nonzero()[0])
        return failed(check, spec, a.numel(), int(wrong_tail.sum()),
                      Violation(f"{name} visible mask", (r, c), float(a[r, c]), float(e[r, c]),
                                note="past the visible range the score is the lowest FP32 number, and only there"
                                if tail == "lowest" else "a visible score is the lowest FP32 number"))
    tail = tail_mask
    ratio = check_ratio_allclose(a[~tail], e[~tail], atol=V4_SCORE_TOL[0], rtol=V4_SCORE_TOL[1], name=name)
    if not ratio.ok:
        return ratio
    hard = v4_hard_bound(a, e, hard_floor)
    over = ~tail & ((a - e).abs() > hard)
    if bool(over.any()):
        r, c = (int(v) for v in over.nonzero()[0])
        return failed(check, spec, int((~tail).sum()), int(over.sum()),
                      Violation(name, (r, c), float(a[r, c]), float(e[r, c]), float(hard[r, c]),
                                note=f"past the hard bound max(4·(atol + rtol·|s|), {hard_floor:g})"))
    return passed(check, spec, int((~tail).sum()))


def check_v4_topk(actual: torch.Tensor, expected: torch.Tensor, actual_scores: torch.Tensor,
                  expected_scores: torch.Tensor, visible: torch.Tensor, *, topk: int, offset: int,
                  name: str = "topk_idxs", hard_floor: float = V4_SCORE_HARD[1]) -> CheckResult:
    """V4 top-k rows [T, L] INT32 (``visible`` [T] from the positions and kv lengths): each row holds
    k = min(topk, visible) entries in [offset, offset + visible), all distinct, then only -1. Where a row differs
    from the expected one: every displaced candidate's score error within the hard bound, no clear inversion
    (on either score row, a later pick above an earlier one by more than both bounds) and no clear boundary
    miss (an omitted candidate above a selected one by more than both bounds). ``hard_floor`` as in
    ``check_v4_index_scores``. Spec: §8."""
    check, spec = "check_v4_topk", "§8"
    if actual.dtype != torch.int32 or tuple(actual.shape) != tuple(expected.shape):
        return failed(check, spec, 1, 1, Violation(f"{name}.layout", (), f"{actual.dtype}{list(actual.shape)}",
                                                   f"torch.int32{list(expected.shape)}"))
    t_ = Tally(check, spec)
    for t in range(actual.shape[0]):
        t_.n_checked += 1
        n = int(visible[t])
        k = min(topk, n)
        row = actual[t].to(torch.int64)
        prefix, rest = row[:k], row[k:]
        if bool((rest != -1).any()):
            j = int((rest != -1).nonzero()[0]) + k
            t_.fail(Violation(name, (t, j), int(row[j]), "-1", note=f"the row holds {k} entries, then -1"))
            continue
        outside = (prefix < offset) | (prefix >= offset + n)
        if bool(outside.any()):
            j = int(outside.nonzero()[0])
            t_.fail(Violation(name, (t, j), int(row[j]), f"in [{offset}, {offset + n})",
                              note=f"visible {n} positions after offset {offset}"))
            continue
        if int(torch.unique(prefix).numel()) != k:
            dup = next(int(v) for v in prefix.tolist() if prefix.tolist().count(v) > 1)
            t_.fail(Violation(name, (t,), dup, "distinct entries", note="position selected twice"))
            continue
        want = expected[t, :k].to(torch.int64)
        if torch.equal(prefix, want):
            continue
        got_pos, want_pos = prefix - offset, want - offset
        a_row, e_row = actual_scores[t, :n].double(), expected_scores[t, :n].double()
        hard = v4_hard_bound(a_row, e_row, hard_floor)
        displaced = torch.unique(torch.cat((got_pos[got_pos != want_pos], want_pos[got_pos != want_pos])))
        err = (a_row - e_row).abs()
        bad = displaced[err[displaced] > hard[displaced]]
        if bad.numel():
            c = int(bad[0])
            t_.fail(Violation(f"{name} candidate", (t, c), float(a_row[c]), float(e_row[c]), float(hard[c]),
                              note="a displaced candidate's score moved past its hard bound"))
            continue
        problem = None
        for label, s in (("expected", e_row), ("actual", a_row)):
            upper = s[got_pos] + hard[got_pos]
            lower = s[got_pos] - hard[got_pos]
            for j in range(1, k):
                i = int(upper[:j].argmin())
                if lower[j] > upper[i]:
                    problem = Violation(f"{name} order", (t, j), f"position {int(got_pos[j])} ({float(s[got_pos[j]]):.6g})",
                                        f"after position {int(got_pos[i])} ({float(s[got_pos[i]]):.6g})",
                                        note=f"clear inversion on the {label} scores")
                    break
            if problem is None and n > k:
                missing = want_pos[~torch.isin(want_pos, got_pos)]
                added = got_pos[~torch.isin(got_pos, want_pos)]
                if missing.numel() and added.numel():
                    m = missing[int((s[missing] - hard[missing]).argmax())]
                    x = added[int((s[added] + hard[added]).argmin())]
                    if s[m] - hard[m] > s[x] + hard[x]:
                        problem = Violation(f"{name} boundary", (t,), f"selected position {int(x)} "
                                            f"({float(s[x]):.6g})", f"omitted position {int(m)} ({float(s[m]):.6g})",
                                            note=f"clear top-k boundary miss on the {label} scores")
            if problem is not None:
                break
        if problem is not None:
            t_.fail(problem)
    return t_.result()


def check_candidate_blocks(actual: torch.Tensor, scores: torch.Tensor, compressed_lens: torch.Tensor, *, block: int,
                           topk_blocks: int, width: int | None = None) -> CheckResult:
    """The level-1 candidate mask [T, width] U8, judged by the rule and not by one tie order: blocks of ``block``
    positions ranked by their max score, the block holding compressed_len - 1 forced first, the best
    min(topk_blocks, blocks) finite blocks kept whole. Where blocks tie at the cutoff any of them may be kept (upstream
    selects with torch.topk, whose tie order is implementation-defined; the reference breaks ties stably), so a
    row passes iff every kept block is kept whole, every block above the cutoff score is kept, none below it is, no
    -inf block is, and the count is the rule's (at most it where the crop hides blocks). Spec: §5.2."""
    check, spec = "check_candidate_blocks", "§5.2"
    tokens, length = scores.shape
    width = length if width is None else width
    if actual.dtype != torch.uint8 or tuple(actual.shape) != (tokens, width):
        return failed(check, spec, 1, 1, Violation("candidate_mask.layout", (), f"{actual.dtype}{list(actual.shape)}",
                                                   f"torch.uint8[{tokens}, {width}]"))
    nblocks = -(-length // block)
    padded = torch.full((tokens, nblocks * block), float("-inf"))
    padded[:, :length] = scores.float()
    best = padded.unflatten(-1, (nblocks, block)).amax(-1)
    t_ = Tally(check, spec)
    for t in range(tokens):
        t_.n_checked += 1
        n = int(compressed_lens[t])
        row_best = best[t].clone()
        if n > 0 and nblocks:
            row_best[min((n - 1) // block, nblocks - 1)] = float("inf")
        finite = row_best > float("-inf")
        want = min(topk_blocks, nblocks, int(finite.sum()))
        cutoff = row_best.sort(descending=True).values[want - 1] if want else float("inf")
        seen = 0
        for b in range(nblocks):
            lo, hi = b * block, min((b + 1) * block, width)
            if lo >= hi:  # cropped away: unseen
                continue
            seg = actual[t, lo:hi]
            if bool((seg != seg[0]).any()) or int(seg[0]) not in (0, 1):
                t_.fail(Violation("candidate_mask", (t, lo), seg.tolist(), f"all 0 or all 1 (block {b} whole)"))
                break
            kept, v = bool(seg[0]), float(row_best[b])
            seen += kept
            if kept and (v == float("-inf") or v < cutoff):
                t_.fail(Violation("candidate_mask", (t, lo), f"block {b} kept (score {v:.6g})",
                                  f"not kept (cutoff {float(cutoff):.6g})", note="below the cutoff or -inf"))
                break
            if not kept and v > cutoff and v > float("-inf"):
                t_.fail(Violation("candidate_mask", (t, lo), f"block {b} dropped (score {v:.6g})",
                                  f"kept (cutoff {float(cutoff):.6g})", note="above the cutoff (forced blocks: inf)"))
                break
        else:
            every_block_seen = (nblocks - 1) * block < width
            if (every_block_seen and seen != want) or seen > want:
                t_.fail(Violation("candidate_mask", (t,), f"{seen} blocks kept", f"{want}",
                                  note="min(topk_blocks, finite blocks); ties at the cutoff count once each"))
    return t_.result()


_V4_SCORES = {"atol": V4_SCORE_TOL[0], "rtol": V4_SCORE_TOL[1], "hard_multiplier": V4_SCORE_HARD[0],
              "hard_atol": V4_SCORE_HARD[1]}
BOUNDS = (
    Bound("topk_validity", "valid, distinct rows; a pick that differs from the reference's only where the scores "
          "cannot order them", {"cutoff_atol": CUTOFF_ATOL, "cutoff_rtol": CUTOFF_RTOL}),
    Bound("v4_index_score", "visible scores by ratio_allclose and a pointwise ceiling; the tail not judged",
          _V4_SCORES),
    Bound("v4_index_score_lowest_tail", "v4_index_score with the tail the lowest FP32 number", _V4_SCORES),
    Bound("v4_index_topk", "count, range, distinct, -1 tail; a differing row judged by both score rows",
          _V4_SCORES),
    Bound("v4_prefill_index_score", "v4_index_score with the prefill hard floor; the tail the lowest FP32 number",
          {**_V4_SCORES, "hard_atol": V4_PREFILL_HARD_ATOL}),
    Bound("v4_prefill_index_topk", "v4_index_topk with raw positions and the prefill hard floor",
          {**_V4_SCORES, "hard_atol": V4_PREFILL_HARD_ATOL}),
)
