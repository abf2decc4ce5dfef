"""V4's paged compressors (``v4_compressor``: ratio 128 for HCA, ratio 4 with overlapping windows for CSA) and
CSA's pair of them (``csa_compressors``): the state each request owns, written through its block table.

Ownership contracts: a chunked run equals the one-shot run (outputs and every state byte), for every split;
resuming at every phase of the window gives the continuous run's outputs; reordering the requests (with their
table rows) permutes the outputs and leaves the state pool identical; a block table that reuses physical pages
for later logical blocks (the ring) gives the same outputs as one with a page per block. The overlap rule is
pinned by a hand computation (the previous window's first half, the current window's second half), and CSA's
inner (indexer) state never lands in the main pool.

Spec: §8; docs/coverage.md, V4 section.
"""

from __future__ import annotations

import pytest
import torch

from contracts.separation import separates
from kernels.config import V4_PRO_TINY
from kernels.errors import ContractInputError
from kernels.v4.compressor import V4CompressorWeights
from pto_pytest.defect import SeededDefect, shared
from pto_pytest.plugin import op

HIDDEN, D = 32, 8
CASES = [(128, False, 8), (4, True, 4)]  # (ratio, overlap, state page) -- HCA and CSA
IDS = ["ratio128", "ratio4-overlap"]


def _weights(ratio, overlap, seed=0, d=D):
    g = torch.Generator().manual_seed(seed)
    c = (2 if overlap else 1) * d
    return V4CompressorWeights(torch.randn(HIDDEN, c, generator=g) / HIDDEN**0.5,
                               torch.randn(HIDDEN, c, generator=g) / HIDDEN**0.5,
                               torch.randn(ratio, c, generator=g) * 0.5, torch.rand(d, generator=g) + 0.5)


def _rows(n, seed=1):
    return torch.randn(n, HIDDEN, generator=torch.Generator().manual_seed(seed)).to(torch.bfloat16)


def _pool(pages, page, overlap, d=D):
    return torch.full((pages, page, 2 * (2 if overlap else 1) * d), 7.0)  # bytes no token wrote


def _ring_table(requests, blocks, pages, *, distinct=False):
    """Logical blocks of each request on physical pages: a ring over ``pages // requests`` pages per request
    (upstream's reuse), or one page per block."""
    if distinct:
        return torch.arange(requests * blocks).reshape(requests, blocks).to(torch.int32)
    per = pages // requests
    return torch.tensor([[r * per + (k % per) for k in range(blocks)] for r in range(requests)], dtype=torch.int32)


def _run(backend, x, pos, req, table, pool, w, ratio, overlap):
    return op(backend, "v4_compressor")(x, torch.tensor(pos), torch.tensor(req), table, pool, w, ratio=ratio,
                                        overlap=overlap)


@pytest.mark.parametrize("ratio, overlap, page", CASES, ids=IDS)
@pytest.mark.operators("v4_compressor")
def test_a_chunked_run_equals_the_one_shot_run_for_every_split(backend, ratio, overlap, page):
    """One request, 2·ratio + 3 tokens from position 0: split into two calls at every point (a decode chunk
    of one or more rows each), the outputs and the state pool equal the one-shot run byte for byte. Spec: §8."""
    n = 2 * ratio + 3
    w, x = _weights(ratio, overlap), _rows(n)
    blocks = -(-n // page)
    table = _ring_table(1, blocks, blocks, distinct=True)
    pool = _pool(blocks, page, overlap)
    full, closes, full_pool = _run(backend, x, list(range(n)), [0] * n, table, pool, w, ratio, overlap)
    assert closes.nonzero().flatten().tolist() == [ratio - 1, 2 * ratio - 1]
    assert full.dtype == torch.float32 and bool((pool == 7.0).all()), "the input pool was written in place"
    rows = full[closes]
    assert bool((rows != rows.to(torch.bfloat16).float()).any()), \
        "the compressed rows must stay FP32 (V4 rounds once, after the RoPE, on the cache write)"
    splits = range(1, n) if ratio <= 8 else (1, ratio - 1, ratio, ratio + 1, n - 1)
    for cut in splits:
        a, _, mid = _run(backend, x[:cut], list(range(cut)), [0] * cut, table, pool, w, ratio, overlap)
        b, _, end = _run(backend, x[cut:], list(range(cut, n)), [0] * (n - cut), table, mid, w, ratio, overlap)
        assert torch.equal(torch.cat((a, b)).view(torch.int32), full.view(torch.int32)), f"split at {cut}"
        assert torch.equal(end, full_pool), f"split at {cut}: state differs"


@pytest.mark.parametrize("ratio, overlap, page", CASES, ids=IDS)
@pytest.mark.operators("v4_compressor")
def test_resuming_at_every_phase_of_the_window_continues_the_run(backend, ratio, overlap, page):
    """A two-token decode step (MTP) resumed at every phase p0 of the window (p0 = 0 .. 2·ratio - 1 for ratio 4,
    the edges for ratio 128), after a prefix run up to p0, gives the continuous run's two outputs. Spec: §8."""
    n = 3 * ratio + 2
    w, x = _weights(ratio, overlap, 2), _rows(n, 3)
    blocks = -(-n // page)
    table = _ring_table(1, blocks, blocks, distinct=True)
    pool = _pool(blocks, page, overlap)
    full, _, _ = _run(backend, x, list(range(n)), [0] * n, table, pool, w, ratio, overlap)
    starts = range(2 * ratio) if ratio <= 8 else (0, 1, ratio - 2, ratio - 1, ratio, 2 * ratio - 2, 2 * ratio - 1)
    for p0 in starts:
        _, _, mid = _run(backend, x[:p0], list(range(p0)), [0] * p0, table, pool, w, ratio, overlap)
        step, _, _ = _run(backend, x[p0:p0 + 2], [p0, p0 + 1], [0, 0], table, mid, w, ratio, overlap)
        assert torch.equal(step.view(torch.int16), full[p0:p0 + 2].view(torch.int16)), f"resumed at {p0}"


@pytest.mark.parametrize("ratio, overlap, page", CASES, ids=IDS)
@pytest.mark.operators("v4_compressor")
def test_request_order_and_page_reuse_change_nothing(backend, ratio, overlap, page):
    """Three requests at different phases: swapping requests (and their table rows) swaps their output rows and
    leaves the state pool identical; a ring table reusing the request's physical pages for later logical blocks
    gives the outputs of a table with one page per block. Spec: §8."""
    w = _weights(ratio, overlap, 4)
    lens, starts = [ratio + 1, 2 * ratio + 2, 3], [0, ratio - 1, 2]
    xs = [_rows(n, 10 + i) for i, n in enumerate(lens)]
    blocks = -(-(max(s + n for s, n in zip(starts, lens, strict=True))) // page) + 1
    window_pages = -(-(2 * ratio) // page) + 1
    ring = _ring_table(3, blocks, 3 * window_pages)
    distinct = _ring_table(3, blocks, 0, distinct=True)

    def batch(order, table):
        x = torch.cat([xs[r] for r in order])
        pos = [starts[r] + i for r in order for i in range(lens[r])]
        req = [k for k, r in enumerate(order) for _ in range(lens[r])]
        rows = table[list(order)]
        pool = _pool(int(table.max()) + 1, page, overlap)
        return _run(backend, x, pos, req, rows, pool, w, ratio, overlap)

    a, _, pool_a = batch((0, 1, 2), ring)
    b, _, pool_b = batch((2, 0, 1), ring)
    split = lambda out, order: dict(zip(order, out.split([lens[r] for r in order]), strict=True))  # noqa: E731
    sa, sb = split(a, (0, 1, 2)), split(b, (2, 0, 1))
    for r in range(3):
        assert torch.equal(sa[r], sb[r]), f"request {r} changed when the batch was reordered"
    assert torch.equal(pool_a, pool_b), "the state pool depends on the request order"
    c, _, _ = batch((0, 1, 2), distinct)
    assert torch.equal(a, c), "page reuse through the ring table changed an output"


@pytest.mark.operators("v4_compressor")
def test_the_overlapping_window_pools_the_previous_first_half_and_the_current_second_half(backend):
    """Ratio 4 with overlap, positions 0..11: the output at 3 pools positions 0..3's second-half channels only
    (nothing before 0); the output at 7 pools 0..3's first-half and 4..7's second-half channels, at 11 4..7's
    first half and 8..11's second half -- 8 rows softmax-weighted, then RMS-normalised with eps 1e-6, checked
    against an independent computation at unit scale and at 1e-4 (where the eps dominates). Spec: §8."""
    w = _weights(4, True, 5)
    table = torch.arange(3, dtype=torch.int32)[None]
    for scale in (1.0, 1e-4):  # at 1e-4 the pooled rows are below the 1e-6 eps of the RMS norm
        x = (_rows(12, 6).float() * scale).to(torch.bfloat16)
        out, closes, _ = _run(backend, x, list(range(12)), [0] * 12, table, _pool(3, 4, True), w, 4, True)
        kv = (x.double() @ w.wkv.double()).float().double()
        score = (x.double() @ w.wgate.double()).float().double() + w.ape.double()[torch.arange(12) % 4]

        def pooled(rows_kv, rows_score, w=w):
            p = (rows_kv * rows_score.softmax(0)).sum(0)
            return p * torch.rsqrt(p.pow(2).mean() + 1e-6) * w.norm.double()

        def window(p, kv=kv, score=score, pooled=pooled):
            prev = slice(max(0, p - 7), p - 3)
            cur = slice(p - 3, p + 1)
            return pooled(torch.cat((kv[prev, :D], kv[cur, D:])), torch.cat((score[prev, :D], score[cur, D:])))

        second = window(7)
        assert closes.tolist() == [False, False, False, True] * 3
        for p in (3, 7, 11):
            want = window(p)
            assert (out[p].double() - want).abs().max() <= want.abs().max() * 2**-18, \
                f"position {p} (scale {scale})"
        wrong = pooled(torch.cat((kv[2:4, :D], kv[4:8, D:])), torch.cat((score[2:4, :D], score[4:8, D:])))
        assert (wrong.float() - second.float()).abs().max() > second.float().abs().max() * 2**-7, \
            "the inputs do not separate an overlap of 2 rows"


@pytest.mark.whole_backend("a stage against its own parts, bit for bit")
@pytest.mark.operators("csa_compressors", "v4_compressor")
def test_csa_keeps_the_inner_state_out_of_the_main_pool(backend):
    """CSA's main (d = 8) and inner indexer (d = 4) compressors each write only their own pool through their
    own table: the main pool equals the main compressor run alone, the inner pool the inner one alone, and both
    outputs too; a main pool byte no main token wrote keeps its initial value. Spec: §8."""
    main, inner = _weights(4, True, 7), _weights(4, True, 8, d=4)
    x, n = (_rows(9, 9).float() * 1e-4).to(torch.bfloat16), 9  # eps-sensitive: the pair must pass eps on
    pos, req = list(range(n)), [0] * n
    mt, it = torch.tensor([[0, 1, 2]], dtype=torch.int32), torch.tensor([[2, 0, 1]], dtype=torch.int32)
    mp, ip = _pool(3, 4, True), _pool(3, 4, True, d=4)
    res = op(backend, "csa_compressors")(x, torch.tensor(pos), torch.tensor(req), mt, mp, main, it, ip, inner)
    m_out, _, m_pool = _run(backend, x, pos, req, mt, mp, main, 4, True)
    i_out, _, i_pool = _run(backend, x, pos, req, it, ip, inner, 4, True)
    assert torch.equal(res["main_pool"], m_pool), "the main pool holds bytes the main compressor did not write"
    assert torch.equal(res["inner_pool"], i_pool) and torch.equal(res["compressed"], m_out)
    assert torch.equal(res["index_key"], i_out)
    assert bool((res["main_pool"][2, 1:] == 7.0).all()), "rows after position 8 are untouched"
    # each compressor through its own table: separated from each through the other's table (the tables name
    # the pages in another order)
    separates("§8 CSA pools through their own tables", torch.cat([m_pool.flatten(), i_pool.flatten()]),
              tables_swapped=torch.cat([_run(backend, x, pos, req, it, mp, main, 4, True)[2].flatten(),
                                        _run(backend, x, pos, req, mt, ip, inner, 4, True)[2].flatten()]))
    calls = []
    inner_op = backend.get("v4_compressor")

    def counted(*a, **kw):
        calls.append(kw["ratio"])
        return inner_op(*a, **kw)

    derived = backend.derive("counting", v4_compressor=counted)
    again = derived.get("csa_compressors")(x, torch.tensor(pos), torch.tensor(req), mt, mp, main, it, ip, inner)
    assert calls == [4, 4] and torch.equal(again["compressed"], res["compressed"]), "not the backend's compressor"


@pytest.mark.operators("v4_compressor")
def test_bad_compressor_inputs_are_refused_naming_the_field(backend):
    """A position past the table, a page outside the pool, weights of the wrong width and a BF16 pool name the
    field. Spec: §8."""
    w, x = _weights(4, True), _rows(2)
    table, pool = torch.tensor([[0]], dtype=torch.int32), _pool(1, 4, True)
    with pytest.raises(ContractInputError, match="state_block_table"):
        _run(backend, x, [3, 4], [0, 0], table, pool, w, 4, True)
    for bad in (1, -1):  # one page: page 1 is just outside
        with pytest.raises(ContractInputError, match=r"state_block_table\[0\]\[0\]"):
            _run(backend, x, [0, 1], [0, 0], torch.tensor([[bad]], dtype=torch.int32), pool, w, 4, True)
    with pytest.raises(ContractInputError, match="weights"):
        _run(backend, x, [0, 1], [0, 0], table, pool, w, 4, False)
    short_ape = V4CompressorWeights(w.wkv, w.wgate, w.ape[:3], w.norm)
    with pytest.raises(ContractInputError, match="weights"):
        _run(backend, x, [0, 1], [0, 0], table, pool, short_ape, 4, True)
    with pytest.raises(ContractInputError, match="state_pool"):
        _run(backend, x, [0, 1], [0, 0], table, pool.to(torch.bfloat16), w, 4, True)


@pytest.mark.parametrize("ratio, overlap, page", CASES, ids=IDS)
@pytest.mark.operators("v4_compressor", "v4_publish_compressed")
def test_a_closed_window_is_published_rotated_at_the_windows_first_position(backend, ratio, overlap, page):
    """Two requests: each closed window's row lands at its compressed slot, its last rope dims rotated by the
    compressed-profile table row of the window's first position (pos - ratio + 1), not of the closing
    position; a slot of -1 (an uncommitted boundary) writes nothing; every other byte of the pool is kept.
    Spec: §8."""
    from kernels.config import V4_PRO_TINY
    from kernels.reference.rope import precompute_rope_tables, rope_interleave

    rd = 4  # the last 4 of the 8 dims carry RoPE here (2 pairs)
    n = 2 * ratio + 1
    w, x = _weights(ratio, overlap, 12), _rows(2 * n, 13)
    pos = list(range(n)) + list(range(n))
    req = [0] * n + [1] * n
    blocks = -(-n // page)
    table = torch.arange(2 * blocks, dtype=torch.int32).reshape(2, blocks)
    out, closes, _ = _run(backend, x, pos, req, table, _pool(2 * blocks, page, overlap), w, ratio, overlap)
    cos, sin = precompute_rope_tables(n + 1, True, V4_PRO_TINY)
    cos, sin = cos[:, :rd // 2], sin[:, :rd // 2]
    slots = torch.full((2 * n,), -1, dtype=torch.int64)
    closed = closes.nonzero().flatten().tolist()
    for k, t in enumerate(closed):
        slots[t] = 9 * k  # the first one at row 0, later ones past the row width
    slots[closed[-1]] = -1  # the last boundary is uncommitted
    pool = torch.full((4, 8, 1, D), 3.0).to(torch.bfloat16)
    new = op(backend, "v4_publish_compressed")(out, closes, torch.tensor(pos), slots, pool, cos, sin, ratio=ratio)
    flat, before = new.reshape(-1, D), pool.reshape(-1, D)
    written = set()
    for t in closed[:-1]:
        start = pos[t] - ratio + 1
        want = rope_interleave(out[t:t + 1], cos[start:start + 1], sin[start:start + 1])[0].to(torch.bfloat16)
        assert torch.equal(flat[int(slots[t])], want), f"token {t}: not rotated at the window start {start}"
        wrong = rope_interleave(out[t:t + 1], cos[pos[t]:pos[t] + 1], sin[pos[t]:pos[t] + 1])[0].to(torch.bfloat16)
        assert not torch.equal(want, wrong), "the case does not separate the window start from the closing position"
        written.add(int(slots[t]))
    keep = [r for r in range(flat.shape[0]) if r not in written]
    assert torch.equal(flat[keep], before[keep]), "a byte no closed, committed window owns was written"
    assert bool((pool == 3.0).all()), "the input pool was written in place"
    with pytest.raises(ContractInputError, match="cmp_pool"):
        op(backend, "v4_publish_compressed")(out, closes, torch.tensor(pos), slots, pool[..., 0, :], cos, sin,
                                             ratio=ratio)
    past = slots.clone()
    past[closed[0]] = flat.shape[0]  # one row past the pool
    with pytest.raises(ContractInputError, match=r"cmp_slot_mapping\[\d+\]: expected a row in \[0, 32\)"):
        op(backend, "v4_publish_compressed")(out, closes, torch.tensor(pos), past, pool, cos, sin, ratio=ratio)


@pytest.mark.operators("v4_publish_compressed")
def test_the_compressed_row_is_rounded_once_after_its_rope(backend):
    """Hand vector: the FP32 pair (1.5409960746765137, -0.293428897857666) rotated by (cos, sin) =
    (-0.26953125, 0.9609375) is (-0.1337890625, 1.5625) in BF16 when rounded once after the rotation (upstream's
    decode compressors); rounded to BF16 first it would be (-0.1328125, 1.5546875). Spec: §8."""
    rd = V4_PRO_TINY.qk_rope_head_dim
    width = rd + 4  # 4 nope dims, then the rope dims
    row = torch.zeros(1, width)
    row[0, width - rd:width - rd + 2] = torch.tensor([1069891420, -1097450416], dtype=torch.int32).view(torch.float32)
    cos = torch.ones(4, rd // 2)
    sin = torch.zeros(4, rd // 2)
    cos[0, 0], sin[0, 0] = -0.26953125, 0.9609375  # the window of position 3 starts at 0
    pool = torch.zeros(1, 8, 1, width, dtype=torch.bfloat16)
    new = op(backend, "v4_publish_compressed")(row, torch.tensor([True]), torch.tensor([3]), torch.tensor([2]), pool,
                                               cos, sin, ratio=4)
    from contracts.separation import separates

    a, b = row[0, width - rd], row[0, width - rd + 1]
    c, s_ = cos[0, 0], sin[0, 0]

    def rotate(x, y):
        return torch.stack([x * c - y * s_, x * s_ + y * c])

    def bf(t):
        return t.to(torch.bfloat16)

    want = separates("one BF16 rounding after the FP32 rotation", bf(rotate(a, b)),
                     rounded_to_bf16_before_the_rotation=bf(rotate(bf(a).float(), bf(b).float())),
                     rotated_in_bf16=bf(torch.stack([bf(bf(a) * bf(c)).float() - bf(bf(b) * bf(s_)).float(),
                                                     bf(bf(a) * bf(s_)).float() + bf(bf(b) * bf(c)).float()])))
    got = new[0, 2, 0, width - rd:width - rd + 2]
    assert torch.equal(got, want) and got.float().tolist() == [-0.1337890625, 1.5625], \
        f"{got.float().tolist()}: expected one rounding after the rotation, not {[-0.1328125, 1.5546875]}"
    with pytest.raises(ContractInputError, match="compressed"):
        op(backend, "v4_publish_compressed")(row.to(torch.bfloat16), torch.tensor([True]), torch.tensor([3]),
                                             torch.tensor([2]), pool, cos, sin, ratio=4)


def _half_split(x, cos, sin):
    """Rotate (x[i], x[i + half]) instead of adjacent pairs: the other RoPE layout."""
    width = cos.shape[-1] * 2
    head, tail = x[..., :-width], x[..., -width:].float()
    a, b = tail[..., :width // 2], tail[..., width // 2:]
    return torch.cat((head.float(), a * cos - b * sin, a * sin + b * cos), dim=-1).to(x.dtype)


@pytest.mark.parametrize("ratio, overlap, page", CASES, ids=IDS)
@pytest.mark.operators("v4_compress_and_publish", "v4_compressor")
def test_the_published_row_is_the_compressed_row_rotated_at_the_window_start(backend, ratio, overlap, page):
    """The compressor run as upstream's goldens run it, pooling, rotating and publishing in one call, with RoPE rows
    of large angles (not the identity): every closed, committed window's pool row is the backend's own compressed
    row (``v4_compressor``) rotated by the rows of the window's first position in adjacent pairs, in FP32, rounded
    once to BF16, byte for byte; uncommitted boundaries and other rows keep their bytes; the state pool is the
    compressor's. The first row is separated from a rotation at the closing position, the conjugate rotation, the
    half-split pairing and no rotation. Spec: §8."""
    from kernels.reference.rope import rope_interleave

    n = 2 * ratio + 1
    w, x = _weights(ratio, overlap, 21), _rows(2 * n, 22)
    pos, req = list(range(n)) * 2, [0] * n + [1] * n
    blocks = -(-n // page)
    table = torch.arange(2 * blocks, dtype=torch.int32).reshape(2, blocks)
    angles = torch.arange(n + 1, dtype=torch.float32)[:, None] * 0.9 + torch.tensor([[0.4, 2.1]])
    cos, sin = angles.cos(), angles.sin()
    out, closes, state = _run(backend, x, pos, req, table, _pool(2 * blocks, page, overlap), w, ratio, overlap)
    closed = closes.nonzero().flatten().tolist()
    slots = torch.full((2 * n,), -1, dtype=torch.int64)
    for k, t in enumerate(closed):
        slots[t] = 5 * k + 1
    slots[closed[-1]] = -1  # the last boundary is uncommitted
    cmp_pool = torch.full((4, 8, 1, D), 3.0).to(torch.bfloat16)
    got = op(backend, "v4_compress_and_publish")(x, torch.tensor(pos), torch.tensor(req), table,
                                                 _pool(2 * blocks, page, overlap), w, slots, cmp_pool, cos, sin,
                                                 ratio=ratio, overlap=overlap)
    assert torch.equal(got["closes"], closes), f"closes {got['closes'].tolist()}, the compressor's {closes.tolist()}"
    assert torch.equal(got["state_pool"], state), "the state pool differs from the compressor's"
    want = cmp_pool.clone().reshape(-1, D)
    for t in closed[:-1]:
        start = pos[t] - ratio + 1
        want[int(slots[t])] = rope_interleave(out[t:t + 1], cos[start:start + 1], sin[start:start + 1])[0].to(
            torch.bfloat16)
    t0, start0 = closed[0], pos[closed[0]] - ratio + 1
    c0, s0 = cos[start0:start0 + 1], sin[start0:start0 + 1]
    separates("the compressed row rotated at the window start", want[int(slots[t0])],
              at_the_closing_position=rope_interleave(out[t0:t0 + 1], cos[pos[t0]:pos[t0] + 1],
                                                      sin[pos[t0]:pos[t0] + 1])[0].to(torch.bfloat16),
              conjugate=rope_interleave(out[t0:t0 + 1], c0, s0, inverse=True)[0].to(torch.bfloat16),
              half_split_pairs=_half_split(out[t0:t0 + 1], c0, s0)[0].to(torch.bfloat16),
              not_rotated=out[t0].to(torch.bfloat16))
    flat = got["cmp_pool"].reshape(-1, D)
    bad = (flat.view(torch.int16) != want.view(torch.int16)).any(1).nonzero().flatten().tolist()
    assert not bad, f"cmp_pool row {bad[0]}: {flat[bad[0]].float().tolist()}, expected " \
                    f"{want[bad[0]].float().tolist()} (rows {[int(slots[t]) for t in closed[:-1]]} are the closed " \
                    "windows' rows rotated at the window start; every other row keeps its bytes; §8)"


def _publish_conjugate(x, position_ids, token_to_req, state_block_table, state_pool, weights, cmp_slot_mapping,
                       cmp_pool, rope_cos, rope_sin, *, ratio, overlap, ops=None):
    """A compressor that publishes its row rotated the other way (sin negated)."""
    from kernels.v4.compressor import v4_compress_and_publish

    return v4_compress_and_publish(x, position_ids, token_to_req, state_block_table, state_pool, weights,
                                   cmp_slot_mapping, cmp_pool, rope_cos, -rope_sin, ratio=ratio, overlap=overlap)


# defects of tests/defects these contracts must catch (shared with other contract files)
SEEDED_DEFECTS = [
    shared("v4:OVERLAP_BY_TWO", "test_the_overlapping_window_pools_the_previous_first_half_and_the_current_second_half", "position 7"),
    shared("v4:APE_OFF_BY_ONE", "test_the_overlapping_window_pools_the_previous_first_half_and_the_current_second_half", "position 3"),
    shared("v4:INNER_TO_MAIN", "test_csa_keeps_the_inner_state_out_of_the_main_pool", "main pool"),
    shared("v4:ROPE_AT_CLOSE", "test_a_closed_window_is_published_rotated_at_the_windows_first_position", "not rotated at the window start"),
    shared("v4:BF16_BEFORE_ROPE", "test_the_compressed_row_is_rounded_once_after_its_rope", "expected one rounding after the rotation"),
    SeededDefect("v4-compress-publish:conjugate-rope", "v4_compress_and_publish", _publish_conjugate,
                 "test_the_published_row_is_the_compressed_row_rotated_at_the_window_start", "cmp_pool row"),
]
