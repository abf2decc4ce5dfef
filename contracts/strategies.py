"""Hypothesis strategies for engine batches and sequence-parallel shapes.

Hypothesis draws the structure (request kinds, lengths, which pages are spare or freed,
which state blocks are inactive) and a seed; bulk values (page permutations, payloads)
come from a generator seeded by it. Strategies validate their arguments when built and
shrink toward one short request.

Edges aimed at on purpose: empty requests, decode rows 1..6, odd resume positions,
kv lengths of thousands, trailing token padding, permuted (nonidentity) physical pages,
spare unmapped pages, pages freed behind the sliding window, -1 state blocks, T < TP and
padding-only ranks.

Spec: §3 (inputs), §7.1 (slabs).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

import torch
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument

from kernels.config import FLASH_TINY, V41Config
from kernels.errors import is_int


def _positive(name: str, value: object) -> None:
    if not is_int(value) or value < 1:
        raise InvalidArgument(f"{name}={value!r} must be a positive int")


def _nonneg(name: str, value: object) -> None:
    if not is_int(value) or value < 0:
        raise InvalidArgument(f"{name}={value!r} must be a non-negative int")


@dataclass(frozen=True)
class BatchCase:
    """One packed engine batch; ``materialize`` turns it into build_forward_metadata inputs."""

    config: V41Config
    query_lens: tuple[int, ...]
    kv_lens: tuple[int, ...]
    padding: int  # trailing token rows past num_tokens
    tp: int
    inactive_state: tuple[bool, ...]  # per request: state block -1
    spare_pages: int  # unmapped (-1) table columns past the needed ones
    free_behind_window: bool  # pages wholly older than the window are freed (-1)
    seed: int

    @property
    def num_tokens(self) -> int:
        return sum(self.query_lens)

    @property
    def capacity(self) -> int:
        return self.num_tokens + self.padding


def _pages(n_rows: int, block: int) -> int:
    return -(-n_rows // block)


def materialize(case: BatchCase) -> dict[str, object]:
    """Tensors for ``build_forward_metadata`` (plus ``config``, ``tp_size``, ``capacity``) from ``case``.

    Physical ids are a seeded permutation of a pool larger than needed, so tables are
    nonidentity and some physical pages stay unmapped.
    """
    c = case.config
    rng = random.Random(case.seed)
    bs, window = c.block_size, c.sliding_window
    qsl = [0]
    for q in case.query_lens:
        qsl.append(qsl[-1] + q)
    new_kv = [k + q for k, q in zip(case.kv_lens, case.query_lens, strict=True)]
    batch = len(case.query_lens)

    def table(rows_per_request: list[int], *, freeable_before: list[int] | None) -> torch.Tensor:
        need = [_pages(n, bs) for n in rows_per_request]
        width = max([*need, 0]) + case.spare_pages
        pool = list(range(sum(need) + case.spare_pages + 3))
        rng.shuffle(pool)
        it = iter(pool)
        out = torch.full((batch, max(width, 1)), -1, dtype=torch.int32)
        for r, n in enumerate(need):
            for p in range(n):
                out[r, p] = next(it)
            if freeable_before is not None and case.free_behind_window:
                # pages whose last position is older than the window of the chunk's first token
                oldest_visible = max(0, freeable_before[r] - window + 1)
                for p in range(n):
                    if (p + 1) * bs <= oldest_visible:
                        out[r, p] = -1
        return out

    window_table = table(new_kv, freeable_before=list(case.kv_lens))
    by_ratio: dict[int, torch.Tensor] = {}
    compressed = {}
    for src in c.kv_source_layer_ids:
        ratio = c.compress_ratios[src]
        if ratio not in by_ratio:
            by_ratio[ratio] = table([n // ratio for n in new_kv], freeable_before=None)
        compressed[src] = by_ratio[ratio].clone()
    blocks = list(range(batch + 2))
    rng.shuffle(blocks)
    state_col = [(-1 if case.inactive_state[r] else blocks[r]) for r in range(batch)]
    states = {src: torch.tensor(state_col, dtype=torch.int32).reshape(batch, 1)
              for src in c.kv_source_layer_ids if c.compress_ratios[src] > 1}
    return dict(query_start_loc=torch.tensor(qsl, dtype=torch.int32),
                kv_seq_lens=torch.tensor(case.kv_lens, dtype=torch.int32),
                window_block_table=window_table, compressed_block_tables=compressed,
                state_block_tables=states, config=c, tp_size=case.tp, capacity=case.capacity)


def kv_lengths(*, max_kv: int) -> st.SearchStrategy[int]:
    """0, any length up to ``max_kv``, odd resume positions, and page/window edges."""
    _nonneg("max_kv", max_kv)
    return st.one_of(
        st.just(0),
        st.integers(0, max_kv),
        st.integers(0, max(0, (max_kv - 1) // 2)).map(lambda h: 2 * h + 1),
        st.sampled_from([v for v in (1, 15, 16, 17, 127, 128, 129, 255, 256, 257) if v <= max_kv] or [0]),
    )


def request_batches(*, config: V41Config = FLASH_TINY, min_requests: int = 1, max_requests: int = 8,
                    max_kv: int = 3000, max_prefill: int = 40, max_padding: int = 5,
                    tps: tuple[int, ...] = (1, 2, 4, 8)) -> st.SearchStrategy[BatchCase]:
    """Packed batches of empty requests, decode rows (1..6) and prefill chunks (1..max_prefill).

    Shrinks toward one empty request with no history. Spec: §3.
    """
    _positive("min_requests", min_requests)
    _positive("max_requests", max_requests)
    if min_requests > max_requests:
        raise InvalidArgument(f"min_requests={min_requests} is larger than max_requests={max_requests}")
    _nonneg("max_kv", max_kv)
    _positive("max_prefill", max_prefill)
    _nonneg("max_padding", max_padding)
    if not tps or any(t not in (1, 2, 4, 8) for t in tps):
        raise InvalidArgument(f"tps={tps!r} must be a non-empty subset of (1, 2, 4, 8)")
    max_kv = min(max_kv, config.max_position_embeddings - max_prefill)
    decode_rows = config.decode_rows_per_request

    query_len = st.one_of(st.just(0), st.integers(1, decode_rows), st.integers(1, max_prefill))
    return _batch(config, min_requests, max_requests, query_len, kv_lengths(max_kv=max_kv), max_padding, tps)


# The builders are composites defined once, at module level: hypothesis reads a composite's source when it is
# defined, which a composite nested in the strategy function (drawn afresh in every example) paid ~2 ms each time.
@st.composite
def _batch(draw: st.DrawFn, config, min_requests, max_requests, query_len, kv_len, max_padding, tps) -> BatchCase:
    batch = draw(st.integers(min_requests, max_requests))
    qlens = tuple(draw(st.lists(query_len, min_size=batch, max_size=batch)))
    kvs = tuple(draw(st.lists(kv_len, min_size=batch, max_size=batch)))
    inactive = tuple(draw(st.lists(st.booleans(), min_size=batch, max_size=batch)))
    return BatchCase(config=config, query_lens=qlens, kv_lens=kvs,
                     padding=draw(st.integers(0, max_padding)), tp=draw(st.sampled_from(tps)),
                     inactive_state=inactive, spare_pages=draw(st.integers(0, 2)),
                     free_behind_window=draw(st.booleans()), seed=draw(st.integers(0, 2**32 - 1)))


@dataclass(frozen=True)
class SlabCase:
    """A sequence-parallel batch: ``active`` rows in a capacity of ``capacity`` over ``tp`` ranks."""

    active: int
    capacity: int
    tp: int
    width: int  # payload row width D
    dtype: torch.dtype
    seed: int

    def tensors(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x [active, D] (no zero rows, so a padding slip is visible), token ids, positions."""
        g = torch.Generator().manual_seed(self.seed)
        x = (torch.rand((self.active, self.width), generator=g) + 0.5).to(self.dtype)
        tokens = torch.randperm(max(self.active, 1), generator=g)[: self.active].to(torch.int32) + 17
        positions = torch.randint(0, 5000, (self.active,), generator=g, dtype=torch.int32)
        return x, tokens, positions


def slab_cases(*, max_capacity: int = 40, tps: tuple[int, ...] = (1, 2, 4, 8),
               dtypes: tuple[torch.dtype, ...] = (torch.bfloat16, torch.float32)) -> st.SearchStrategy[SlabCase]:
    """TP / capacity / active shapes including T < TP, padding-only ranks and T = 0. Spec: §7.1."""
    _positive("max_capacity", max_capacity)
    if not tps or any(not isinstance(t, int) or t < 1 for t in tps):
        raise InvalidArgument(f"tps={tps!r} must be positive ints")

    return _slab(max_capacity, tps, dtypes)


@st.composite
def _slab(draw: st.DrawFn, max_capacity, tps, dtypes) -> SlabCase:
    tp = draw(st.sampled_from(tps))
    capacity = draw(st.one_of(st.integers(0, tp), st.integers(0, max_capacity)))
    active = draw(st.one_of(st.just(capacity), st.integers(0, capacity)))
    return SlabCase(active, capacity, tp, draw(st.sampled_from((1, 8))), draw(st.sampled_from(dtypes)),
                    draw(st.integers(0, 2**32 - 1)))


GROUP_KINDS = ("normal", "boundary_peak", "midpoints", "saturating", "zero", "subnormal", "huge", "tiny")
# Groups built on the values that separate the rounding rules of §2.2 (see MXCase.tensor).
EDGE_KINDS = ("amax_floor", "scale_edge", "e4m3_scale_tie", "e4m3_payload_tie", "bf16_double_round",
              "midpoints", "saturating", "zero", "subnormal", "tiny", "boundary_peak")


@dataclass(frozen=True)
class MXCase:
    """Rows of MX groups; each group drawn from one kind of GROUP_KINDS at exponent ``exps[i]``."""

    rows: int
    width: int
    group: int
    kinds: tuple[str, ...]  # per group (row-major)
    exps: tuple[int, ...]
    seed: int

    def tensor(self) -> torch.Tensor:
        """FP32 [rows, width]; exact E2M1 midpoints, group-boundary peaks and saturating groups are built
        on purpose."""
        g = torch.Generator().manual_seed(self.seed)
        n = self.rows * self.width // self.group
        out = torch.empty((n, self.group), dtype=torch.float32)
        mids = torch.tensor((0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 0.0, 0.5, 3.0), dtype=torch.float32)
        for i, (kind, e) in enumerate(zip(self.kinds, self.exps, strict=True)):
            scale = 2.0 ** e
            if kind == "normal":
                out[i] = torch.randn(self.group, generator=g) * scale
            elif kind == "boundary_peak":  # the group's amax sits on its first or last element
                out[i] = torch.randn(self.group, generator=g) * scale
                edge = 0 if bool(torch.rand(1, generator=g) < 0.5) else self.group - 1
                out[i, edge] = (-8.0 if bool(torch.rand(1, generator=g) < 0.5) else 8.0) * scale
            elif kind == "midpoints":  # values on E2M1 midpoints of scale 2^e; 6*2^e anchors the scale
                pick = mids[torch.randint(0, len(mids), (self.group,), generator=g)]
                sign = torch.where(torch.rand(self.group, generator=g) < 0.5, -1.0, 1.0)
                out[i] = pick * sign * scale
                out[i, int(torch.randint(0, self.group, (1,), generator=g))] = 6.0 * scale
            elif kind == "saturating":  # amax between 240*6 and 448*6 (E4M3 scale clamp region) and near 448
                out[i] = (torch.rand(self.group, generator=g) * 2 - 1) * 448.0
                out[i, 0] = float(1440 + torch.rand(1, generator=g) * 1240)
            elif kind == "zero":
                out[i] = torch.where(torch.rand(self.group, generator=g) < 0.5, -0.0, 0.0)
            elif kind == "subnormal":
                out[i] = torch.randn(self.group, generator=g) * 1e-40
            elif kind == "huge":
                out[i] = torch.randn(self.group, generator=g) * 1e37
            elif kind == "tiny":  # tiny but normal: below the 1e-4 amax floor
                out[i] = torch.randn(self.group, generator=g) * 1e-6
            else:
                out[i] = _edge_group(kind, self.group, e, g)
        return out.reshape(self.rows, self.width)


def _pick(values: list[float], g: torch.Generator) -> float:
    return values[int(torch.randint(0, len(values), (1,), generator=g))]


def _around(v: float) -> list[float]:
    """``v`` as FP32 and its two FP32 neighbours."""
    t = torch.tensor(v, dtype=torch.float32)
    return [float(torch.nextafter(t, torch.tensor(0.0))), float(t), float(torch.nextafter(t, torch.tensor(math.inf)))]


def _edge_group(kind: str, group: int, e: int, g: torch.Generator) -> torch.Tensor:
    """One group whose amax (or elements) sits exactly on a rule boundary, at or next to it:

    - ``amax_floor``: amax at 1e-4 (the device / CED amax floor) and its FP32 neighbours;
    - ``scale_edge``: amax/qmax exactly 2^e (qmax 448 or 6) and its neighbours: the power-of-two ceiling;
    - ``e4m3_scale_tie``: amax/6 on an exact midpoint of two E4M3 values and its neighbours (E4M3 scales);
    - ``e4m3_payload_tie``: elements on exact E4M3 midpoints under a power-of-two scale (normal and subnormal);
    - ``bf16_double_round``: elements a hair above an E2M1/E4M3 midpoint that BF16 input rounding moves onto it.
    """
    scale = 2.0 ** e
    sign = torch.where(torch.rand(group, generator=g) < 0.5, -1.0, 1.0)
    out = torch.rand(group, generator=g) * sign
    if kind == "amax_floor":
        amax = _pick(_around(1e-4), g)
        out = out * amax * 0.99
    elif kind == "scale_edge":
        amax = _pick(_around(_pick([448.0, 6.0], g) * scale), g)
        out = out * amax * 0.99
    elif kind == "e4m3_scale_tie":
        k = int(torch.randint(0, 8, (1,), generator=g))
        amax = _pick(_around(6.0 * (1 + (2 * k + 1) / 16) * scale), g)
        out = out * amax * 0.99
    elif kind == "e4m3_payload_tie":
        amax = 448.0 * scale
        k = torch.randint(0, 8, (group,), generator=g).float()
        j = torch.randint(-6, 8, (group,), generator=g).float()
        normal = (1 + (2 * k + 1) / 16) * torch.exp2(j)
        subnormal = (2 * k + 1) * 2.0**-10
        out = torch.where(torch.rand(group, generator=g) < 0.2, subnormal, normal) * scale * sign
    else:  # bf16_double_round
        anchor = _pick([6.0, 448.0], g)
        amax = anchor * scale
        if anchor == 6.0:
            mids = torch.tensor((0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0))
        else:
            mids = (1 + (2 * torch.arange(7.0) + 1) / 16) * 2.0 ** torch.randint(-4, 7, (7,), generator=g).float()
        pick = mids[torch.randint(0, len(mids), (group,), generator=g)]
        out = pick * (1 + 2.0**-12) * scale * sign
    out[int(torch.randint(0, group, (1,), generator=g))] = amax * float(sign[0])
    return out


def mx_cases(*, group: int, max_rows: int = 4, max_groups_per_row: int = 4,
             kinds: tuple[str, ...] = GROUP_KINDS) -> st.SearchStrategy[MXCase]:
    """MX inputs aimed at the edges: exact midpoints, saturating groups, zero/subnormal/huge groups
    (``kinds=EDGE_KINDS``: the rule boundaries of §2.2). Spec: §2.2."""
    _positive("group", group)
    _positive("max_rows", max_rows)
    _positive("max_groups_per_row", max_groups_per_row)

    return _mx(group, max_rows, max_groups_per_row, kinds)


@st.composite
def _mx(draw: st.DrawFn, group, max_rows, max_groups_per_row, kinds) -> MXCase:
    """Each group's kind and exponent come from one drawn seed, group after group (so fewer groups keep the
    first groups' picks, and shrinking the shape still works): two draws per group cost hypothesis' engine as
    much as the contract itself (`pytest contracts/ --operator mx_quantize`: 22-24 -> 17-18 CPU s, interleaved runs)."""
    rows = draw(st.integers(1, max_rows))
    per_row = draw(st.integers(1, max_groups_per_row))
    n = rows * per_row
    rng = random.Random(draw(st.integers(0, 2**32 - 1), label="groups_seed"))
    pairs = [(rng.choice(kinds), rng.randint(-20, 20)) for _ in range(n)]
    return MXCase(rows, per_row * group, group, tuple(k for k, _ in pairs), tuple(e for _, e in pairs),
                  draw(st.integers(0, 2**31)))


@dataclass(frozen=True)
class IndexerCase:
    """Tokens of several requests scoring paged index keys; pages permuted, spare pages unmapped."""

    lens_per_token: tuple[tuple[int, ...], ...]  # per request: compressed_lens of its tokens
    topk: int
    heads: int
    dim: int
    block: int
    tie_rows: bool  # duplicate key rows so scores tie at the cutoff
    seed: int

    def build(self) -> dict:
        g = torch.Generator().manual_seed(self.seed)
        rng = random.Random(self.seed)
        batch = len(self.lens_per_token)
        need = [max([*lens, 1]) for lens in self.lens_per_token]
        pages = [-(-n // self.block) for n in need]
        width = max(pages) + 1  # one spare unmapped column
        pool = list(range(sum(pages) + 2))
        rng.shuffle(pool)
        it = iter(pool)
        table = torch.full((batch, width), -1, dtype=torch.int32)
        for r, n in enumerate(pages):
            for p in range(n):
                table[r, p] = next(it)
        rows = (max(pool) + 1) * self.block
        keys = torch.randn((rows, self.dim), generator=g).to(torch.bfloat16)
        if self.tie_rows:
            keys[1::2] = keys[0::2][: keys[1::2].shape[0]]
        request_ids = torch.tensor([r for r, lens in enumerate(self.lens_per_token) for _ in lens], dtype=torch.int32)
        lens = torch.tensor([n for lens in self.lens_per_token for n in lens], dtype=torch.int32)
        tokens = lens.numel()
        q = torch.randn((tokens, self.heads, self.dim), generator=g).to(torch.bfloat16)
        w = torch.rand((tokens, self.heads), generator=g).to(torch.bfloat16)
        return dict(q=q, head_weights=w, keys=keys, block_table=table, request_ids=request_ids,
                    compressed_lens=lens)


def indexer_cases(*, max_len: int = 40, topk: int = 16, heads: tuple[int, ...] = (1, 4), dim: int = 32,
                  blocks: tuple[int, ...] = (4, 16), max_tokens: int = 3) -> st.SearchStrategy[IndexerCase]:
    """Tokens with compressed lengths around the Top-K size (0, 1, topk +- 1, long), permuted pages."""
    lens = st.one_of(st.integers(0, max_len), st.sampled_from((0, 1, topk - 1, topk, topk + 1, max_len)))
    return st.builds(IndexerCase,
                     lens_per_token=st.lists(st.lists(lens, min_size=1, max_size=max_tokens).map(tuple), min_size=1,
                                             max_size=4).map(tuple),
                     topk=st.just(topk), heads=st.sampled_from(heads), dim=st.just(dim),
                     block=st.sampled_from(blocks), tie_rows=st.booleans(), seed=st.integers(0, 2**31))


PARTIAL_KINDS = ("normal", "cancelling")


def reduction_partials(kind: str, ways: int, shape: tuple[int, ...], g: torch.Generator) -> list[torch.Tensor]:
    """``ways`` FP32 partials of ``shape`` to be summed. ``normal``: independent N(0, 9) values, where every
    summation order usually rounds to the same BF16 bytes. ``cancelling``: each element is a large value
    (~2^20) that the ranks' partials cancel, plus small residuals (~1), so the FP32 rounding of the running sum
    depends on the order and on when the cast happens: the inputs where a reordered, pairwise, BF16-accumulated
    or cast-first reduction gives other bytes. Spec: §7.1 (rank order, FP32, one cast)."""
    if kind not in PARTIAL_KINDS:
        raise InvalidArgument(f"kind={kind!r}: one of {PARTIAL_KINDS}")
    _positive("ways", ways)
    if kind == "normal" or ways == 1:
        return [torch.randn(shape, generator=g) * 3 for _ in range(ways)]
    big = [torch.randn(shape, generator=g) * 2.0**20 for _ in range(ways - 1)]
    big.append(-torch.stack(big).sum(0))
    return [(b + torch.randn(shape, generator=g)).float() for b in big]
