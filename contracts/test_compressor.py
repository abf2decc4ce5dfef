"""Ratio-2 compressor ring contracts against the backend's ``compressor_ratio2``. Spec: §4.1.

Fixtures follow upstream_checks S-7: nonidentity state blocks, other blocks holding random sentinel
rows that must survive byte for byte, trailing padding rows with garbage request ids and positions.
"""

from __future__ import annotations

import functools
import random
from dataclasses import dataclass

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from contracts.checks.cache import check_bytes_outside
from contracts.tensors import byte_rows
from kernels.config import FLASH, FLASH_TINY
from kernels.reference.compressor import CompressorWeights
from pto_pytest.defect import shared
from pto_pytest.plugin import op

DIMS = [pytest.param(FLASH_TINY, id="tiny"), pytest.param(FLASH, id="flash")]
CAPACITIES = (1, 2, 4, 7)


@functools.cache
def _weights(config, variant: int) -> CompressorWeights:
    """One of four random weight sets per geometry, built once: at Flash geometry a fresh [4096, 512] pair per
    example cost more than the contract it feeds (the ring rules do not depend on the weights' values)."""
    g = torch.Generator().manual_seed(1000 + variant)
    hidden, d = config.hidden_size, config.head_dim
    return CompressorWeights(torch.randn((hidden, d), generator=g) / hidden**0.5,
                             torch.randn((hidden, d), generator=g) / hidden**0.5, torch.rand(d, generator=g) + 0.5)


@dataclass
class Ring:
    """A state cache of ``blocks`` blocks filled with sentinels, plus weights and per-request inputs."""

    config: object
    capacity: int
    blocks: int
    seed: int

    def __post_init__(self):
        g = torch.Generator().manual_seed(self.seed)
        self.weights = _weights(self.config, self.seed % 4)
        self.state = torch.randn((self.blocks, self.capacity, 2 * self.config.head_dim), generator=g) * 3
        self.gen = g

    def tokens(self, n: int) -> torch.Tensor:
        return torch.randn((n, self.config.hidden_size), generator=self.gen).to(torch.bfloat16)


def call(backend, ring: Ring, state, chunks, *, padding: int = 0):
    """One batch: ``chunks`` = [(x rows, first position, state block)] in batch-row order."""
    xs, qsl, pos, req = [], [0], [], []
    for r, (x, p0, _block) in enumerate(chunks):
        xs.append(x)
        qsl.append(qsl[-1] + x.shape[0])
        pos += list(range(p0, p0 + x.shape[0]))
        req += [r] * x.shape[0]
    x = torch.cat(xs + [torch.randn((padding, ring.config.hidden_size), generator=ring.gen).to(torch.bfloat16)])
    pos += [-999] * padding
    req += [999] * padding
    table = torch.tensor([[b] for _x, _p, b in chunks], dtype=torch.int32).reshape(-1, 1)
    return op(backend, "compressor_ratio2")(
        x, torch.tensor(qsl, dtype=torch.int32), torch.tensor(pos, dtype=torch.int32),
        torch.tensor(req, dtype=torch.int32), table, state, ring.weights)


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.equal(byte_rows(a), byte_rows(b))


def _first_diff(a: torch.Tensor, b: torch.Tensor) -> int:
    return int((byte_rows(a) != byte_rows(b)).any(1).nonzero()[0, 0])


def splits(n: int) -> st.SearchStrategy[tuple[int, ...]]:
    """Every way to cut n tokens into chunks (drawn as cut points)."""
    return st.sets(st.integers(1, max(n - 1, 1)), max_size=n).map(
        lambda cuts: tuple(b - a for a, b in zip([0, *sorted(c for c in cuts if c < n)],
                                                  [*sorted(c for c in cuts if c < n), n], strict=True)))


@pytest.mark.parametrize("config", DIMS)
@given(capacity=st.sampled_from(CAPACITIES), data=st.data(), seed=st.integers(0, 2**31),
       padding=st.integers(0, 3))
@pytest.mark.operators("compressor_ratio2")
def test_compressor_chunked_equals_unchunked(backend, config, capacity, data, seed, padding):
    """Any split of a request into chunks gives bit-identical latents, publish flags and final ring state
    (other blocks untouched) to one unchunked call, for capacity in {1, 2, 4, 7}. Spec: §4.1 (CS-10)."""
    n = data.draw(st.integers(1, 12 if config is FLASH_TINY else 5), label='n')
    cut = data.draw(splits(n), label='cut')
    ring = Ring(config, capacity, blocks=3, seed=seed)
    block = data.draw(st.integers(0, 2), label='block')
    x = ring.tokens(n)
    whole_latent, whole_pub, whole_state = call(backend, ring, ring.state, [(x, 0, block)], padding=padding)
    state, start, lat, pub = ring.state, 0, [], []
    for size in cut:
        latent, publish, state = call(backend, ring, state, [(x[start:start + size], start, block)], padding=padding)
        lat.append(latent[:size])
        pub.append(publish[:size])
        start += size
    lat, pub = torch.cat(lat), torch.cat(pub)
    assert torch.equal(pub, whole_pub[:n]), f"publish flags {pub.tolist()} != {whole_pub[:n].tolist()} (split {cut})"
    assert pub.tolist() == [p % 2 == 1 for p in range(n)], "only odd positions publish"
    assert _same(lat, whole_latent[:n]), f"latent row {_first_diff(lat, whole_latent[:n])} differs (split {cut})"
    flat_c, flat_w = state.reshape(-1, state.shape[-1]), whole_state.reshape(-1, state.shape[-1])
    assert _same(flat_c, flat_w), f"ring slot {_first_diff(flat_c, flat_w)} differs after split {cut}"
    others = [b for b in range(3) if b != block]
    assert _same(state[others], ring.state[others]), "a block the request does not own changed"


@given(capacity=st.sampled_from(CAPACITIES), seed=st.integers(0, 2**31), data=st.data())
@pytest.mark.operators("compressor_ratio2")
def test_compressor_reorder_departure_admission_block_reuse(backend, capacity, seed, data):
    """Requests scheduled in shuffled batch rows, departing and freeing blocks that admitted requests
    reuse, each match their own unchunked run bit for bit. Spec: §4.1 (CS-11)."""
    ring = Ring(FLASH_TINY, capacity, blocks=4, seed=seed)
    rng = random.Random(seed)
    n_req = data.draw(st.integers(2, 5), label='n_req')
    lengths = [data.draw(st.integers(1, 9), label='length') for _ in range(n_req)]
    xs = [ring.tokens(n) for n in lengths]
    pool = rng.sample(range(4), 2)  # fewer blocks than requests: departures free blocks for admissions
    owner: dict[int, int] = {}
    done = [0] * n_req
    out_lat = [[] for _ in range(n_req)]
    out_pub = [[] for _ in range(n_req)]
    state = ring.state
    waiting = list(range(n_req))
    for _step in range(60):
        while pool and waiting:
            owner[waiting.pop(0)] = pool.pop(0)
        active = [r for r in owner if done[r] < lengths[r]]
        if not active:
            break
        rows = data.draw(st.permutations(active), label='rows')
        chunks = []
        for r in rows:
            size = data.draw(st.integers(1, lengths[r] - done[r]), label='size')
            chunks.append((r, size))
        latent, publish, state = call(backend, ring, state,
                                      [(xs[r][done[r]:done[r] + s], done[r], owner[r]) for r, s in chunks])
        start = 0
        for r, s in chunks:
            out_lat[r].append(latent[start:start + s])
            out_pub[r].append(publish[start:start + s])
            start += s
            done[r] += s
        for r in [r for r in list(owner) if done[r] == lengths[r]]:
            pool.append(owner.pop(r))  # departure: the block may be reused by the next admission
    assert all(d == n for d, n in zip(done, lengths, strict=True)), "scheduler did not finish"
    for r in range(n_req):
        ref_lat, ref_pub, _ = call(backend, ring, torch.zeros_like(ring.state), [(xs[r], 0, 0)])
        lat = torch.cat(out_lat[r])
        assert torch.equal(torch.cat(out_pub[r]), ref_pub), f"request {r}: publish flags differ"
        assert _same(lat, ref_lat), f"request {r} (length {lengths[r]}): latent row {_first_diff(lat, ref_lat)} " \
                                    "differs from its unchunked run"


@given(capacity=st.sampled_from(CAPACITIES), seed=st.integers(0, 2**31), n=st.integers(1, 8),
       bad_block=st.sampled_from((-1, 99)))
@pytest.mark.operators("compressor_ratio2")
def test_compressor_inactive_block_means_no_state_access(backend, capacity, seed, n, bad_block):
    """A request whose state block is -1 (or out of range) publishes nothing, has zero latents and leaves
    the ring untouched; its batch neighbour is unaffected. Spec: §4.1 skip rules (CS-12)."""
    ring = Ring(FLASH_TINY, capacity, blocks=3, seed=seed)
    xa, xb = ring.tokens(n), ring.tokens(n)
    latent, publish, state = call(backend, ring, ring.state, [(xa, 0, bad_block), (xb, 0, 1)], padding=2)
    assert not bool(publish[:n].any()), "inactive request published"
    assert not bool(latent[:n].ne(0).any()), "inactive request has non-zero latent rows"
    assert not bool(publish[2 * n:].any()) and not bool(latent[2 * n:].ne(0).any()), "padding rows produced output"
    assert _same(state[[0, 2]], ring.state[[0, 2]]), "ring blocks other than the live request's changed"
    ref_lat, ref_pub, ref_state = call(backend, ring, ring.state, [(xb, 0, 1)])
    assert _same(latent[n:2 * n], ref_lat) and torch.equal(publish[n:2 * n], ref_pub)
    assert _same(state, ref_state)


@given(capacity=st.sampled_from(CAPACITIES), seed=st.integers(0, 2**31), data=st.data())
@pytest.mark.operators("compressor_ratio2")
def test_compressor_untouched_ring_slots_are_byte_identical(backend, capacity, seed, data):
    """Only slots block*cap + p%cap of each request's last min(chunk, cap) tokens may change. Spec: §4.1 (CS-15)."""
    ring = Ring(FLASH_TINY, capacity, blocks=4, seed=seed)
    n_req = data.draw(st.integers(1, 3), label='n_req')
    blocks = data.draw(st.permutations(range(4)), label='block order')[:n_req]
    chunks, touched = [], torch.zeros(4 * capacity, dtype=torch.bool)
    for b in blocks:
        size, p0 = data.draw(st.integers(0, 9), label='size'), data.draw(st.integers(0, 20), label='p0')
        if size:
            chunks.append((ring.tokens(size), p0, b))
            for p in range(max(p0, p0 + size - capacity), p0 + size):
                touched[b * capacity + p % capacity] = True
    if not chunks:
        return
    _lat, _pub, state = call(backend, ring, ring.state, chunks, padding=data.draw(st.integers(0, 3), label='padding'))
    result = check_bytes_outside("state_cache", state.reshape(4 * capacity, -1),
                                 ring.state.reshape(4 * capacity, -1), touched)
    assert result.ok, result.message()


@given(capacity=st.sampled_from(CAPACITIES), seed=st.integers(0, 2**31), data=st.data())
@pytest.mark.operators("compressor_ratio2")
def test_compressor_restored_odd_prefix_equals_uninterrupted(backend, capacity, seed, data):
    """Resuming at an odd position with the predecessor's ring restored (into another block id) equals the
    uninterrupted run; a zeroed ring does not. Spec: §4.1 ownership (CS-13)."""
    ring = Ring(FLASH_TINY, capacity, blocks=3, seed=seed)
    prefix = 2 * data.draw(st.integers(0, 4), label='prefix pairs') + 1
    rest = data.draw(st.integers(1, 6), label='rest')
    x = ring.tokens(prefix + rest)
    whole, _, _ = call(backend, ring, ring.state, [(x, 0, 0)])
    _, _, after_prefix = call(backend, ring, ring.state, [(x[:prefix], 0, 0)])
    restored = ring.state.clone()
    restored[2] = after_prefix[0]  # engine moves the request to block 2 with its ring
    resumed, _, _ = call(backend, ring, restored, [(x[prefix:], prefix, 2)])
    assert _same(resumed[:rest], whole[prefix:]), f"restored resume differs at row {_first_diff(resumed[:rest], whole[prefix:])}"
    zeroed = ring.state.clone()
    zeroed[2] = 0
    cold, _, _ = call(backend, ring, zeroed, [(x[prefix:], prefix, 2)])
    assert not _same(cold[:1], whole[prefix:prefix + 1]), "a zeroed ring reproduced the pair partner"


@given(seed=st.integers(0, 2**31), rows=st.integers(1, 5))
@pytest.mark.operators("compressor_ratio2")
def test_compressor_num_tokens_zero_touches_nothing(backend, seed, rows):
    """num_tokens = 0 with a padded extent: no publish, zero latents, state unchanged. Spec: §4.1 (CS-09)."""
    ring = Ring(FLASH_TINY, 4, blocks=2, seed=seed)
    x = ring.tokens(rows)
    latent, publish, state = op(backend, "compressor_ratio2")(
        x, torch.tensor([0, 0], dtype=torch.int32), torch.arange(rows, dtype=torch.int32),
        torch.zeros(rows, dtype=torch.int32), torch.tensor([[1]], dtype=torch.int32), ring.state, ring.weights)
    assert not bool(publish.any()) and not bool(latent.ne(0).any())
    assert _same(state, ring.state)


@given(seed=st.integers(0, 2**31), data=st.data())
@pytest.mark.operators("compressor_ratio2")
def test_an_explicit_num_tokens_inside_a_requests_span_cuts_the_request_there(backend, seed, data):
    """Through the operator, with rows past what it needs: two requests (spans 0..a and a..a+b), then an explicit
    num_tokens n that ends inside request 1's span, or inside request 0's (a + b > n > 0; qsl[-1] stays a + b).
    Rows past n are padding: zero latents, no publish, and the state is exactly what the call gets when the
    input itself ends at n (x cut to n rows, qsl clipped to n); rows before n equal that call's. A kernel that
    reads num_tokens from qsl[-1], or cuts only whole requests, fails. Spec: §4.1 (CS-09), §3."""
    ring = Ring(FLASH_TINY, 4, blocks=3, seed=seed)
    a = data.draw(st.integers(1, 5), label="request 0 rows")
    b = data.draw(st.integers(2, 6), label="request 1 rows")
    n = data.draw(st.integers(1, a + b - 1), label="num_tokens")
    extra = data.draw(st.integers(0, 3), label="padding rows past qsl[-1]")
    p0, p1 = data.draw(st.integers(0, 9), label="request 0 start"), data.draw(st.integers(0, 9), label="request 1 start")
    x = ring.tokens(a + b + extra)
    pos = torch.tensor(list(range(p0, p0 + a)) + list(range(p1, p1 + b)) + [-999] * extra, dtype=torch.int32)
    req = torch.tensor([0] * a + [1] * b + [999] * extra, dtype=torch.int32)
    table = torch.tensor([[1], [2]], dtype=torch.int32)
    run = op(backend, "compressor_ratio2")
    latent, publish, state = run(x, torch.tensor([0, a, a + b], dtype=torch.int32), pos, req, table, ring.state,
                                 ring.weights, num_tokens=n)
    qsl_cut = torch.tensor([0, min(a, n), n], dtype=torch.int32)
    from backends import torch_backend

    want_latent, want_publish, want_state = torch_backend().get("compressor_ratio2")(
        x[:n], qsl_cut, pos[:n], req[:n], table, ring.state, ring.weights)
    assert _same(state, want_state), f"state differs from the call cut at num_tokens={n} (first row {_first_diff(state, want_state)})"
    assert torch.equal(publish[:n], want_publish) and not bool(publish[n:].any()), \
        f"publish {publish.tolist()}: rows from {n} on are padding"
    assert _same(latent[:n], want_latent) and not bool(latent[n:].ne(0).any()), \
        f"latent rows from {n} on must be zero (num_tokens={n} inside the span {a}..{a + b})"


@pytest.mark.operators("compressor_ratio2")
def test_compressor_rejects_bad_state_cache(backend):
    ring = Ring(FLASH_TINY, 4, blocks=2, seed=0)
    fn = op(backend, "compressor_ratio2")
    args = (ring.tokens(2), torch.tensor([0, 2]), torch.arange(2), torch.zeros(2, dtype=torch.int32),
            torch.tensor([[0]], dtype=torch.int32))
    with pytest.raises(ValueError, match="state_cache"):
        fn(*args, ring.state.double(), ring.weights)
    with pytest.raises(ValueError, match="state_cache"):
        fn(*args, ring.state[:, :, :-1], ring.weights)


@given(seed=st.integers(0, 2**31), n=st.integers(1, 6), data=st.data())
@pytest.mark.operators("cache_read")
def test_publish_compressed_values_and_index_keys(seed, n, data):
    """Compressed value = latent with compressed RoPE on its last dims (g16 E4M3); index key =
    RMSNorm(unrotated latent @ index_wk) * w, then RoPE (g32 E8M0); only slots >= 0 are written.
    Spec: §2.3, RR-10, RR-11."""
    from kernels import cache as cache_abi
    from kernels import quant
    from kernels.reference.compressor import project, publish_compressed, rms_norm
    from kernels.reference.rope import precompute_rope_tables, rope_interleave

    c = FLASH_TINY
    g = torch.Generator().manual_seed(seed)
    latent = torch.randn((n, c.head_dim), generator=g).to(torch.bfloat16)
    wk = torch.randn((c.head_dim, c.index_head_dim), generator=g) / c.head_dim**0.5
    wn = torch.rand(c.index_head_dim, generator=g) + 0.5
    positions = torch.tensor(data.draw(st.lists(st.integers(-1, 30), min_size=n, max_size=n), label='positions'))
    cos_t, sin_t = precompute_rope_tables(32, True, c)
    cos = torch.where((positions >= 0).unsqueeze(-1), cos_t[positions.clamp_min(0)], 1.0)
    sin = torch.where((positions >= 0).unsqueeze(-1), sin_t[positions.clamp_min(0)], 0.0)
    lay = cache_abi.layouts(c)
    comp = cache_abi.empty_cache(lay["compressed_r2"], 1, generator=g)
    index = cache_abi.empty_cache(lay["index"], 1, generator=g)
    rows = c.block_size
    slots = torch.tensor([(-1 if data.draw(st.booleans(), label='slot -1') else r) for r in data.draw(st.permutations(range(rows)), label='rows')[:n]])
    new_comp, new_index = publish_compressed(latent, cos, sin, slots, comp, index, wk, wn)
    live = slots >= 0
    want_value = quant.quant_dequant(rope_interleave(latent, cos, sin).float()[live], "compressed")
    key = rope_interleave(rms_norm(project(latent, wk).to(latent.dtype), wn), cos, sin)
    want_key = quant.quant_dequant(key.float()[live], "index")
    got_value = cache_abi.cache_read(new_comp, dtype=torch.float32).reshape(rows, -1)[slots[live]]
    got_key = cache_abi.cache_read(new_index, dtype=torch.float32).reshape(rows, -1)[slots[live]]
    assert torch.equal(got_value, want_value), "compressed value is not quant(rope(latent))"
    assert torch.equal(got_key, want_key), "index key is not quant(rope(rmsnorm(unrotated latent @ wk)))"
    mapped = torch.zeros(rows, dtype=torch.bool)
    mapped[slots[live]] = True
    for name, before, after in (("compressed", comp, new_comp), ("index", index, new_index)):
        result = check_bytes_outside(f"{name}.payload", after.payload.reshape(rows, -1),
                                     before.payload.reshape(rows, -1), mapped)
        assert result.ok, result.message()


@given(seed=st.integers(0, 2**31), n=st.integers(1, 6), padding=st.integers(0, 3))
def test_compressor_ratio1_is_rmsnorm_of_the_projection(seed, n, padding):
    """Ratio 1: latent = RMSNorm(x @ wkv) * w on active rows, zero padding rows. Spec: §2.3."""
    from kernels.reference.compressor import compressor_ratio1

    ring = Ring(FLASH_TINY, 4, blocks=1, seed=seed)
    x = ring.tokens(n + padding)
    out = compressor_ratio1(x, ring.weights, num_tokens=n)
    kv = (x[:n].double() @ ring.weights.wkv.double()).float().to(torch.bfloat16).float()
    want = (kv * torch.rsqrt(kv.pow(2).mean(-1, keepdim=True) + 1e-20) * ring.weights.norm).to(torch.bfloat16)
    assert _same(out[:n], want), f"row {_first_diff(out[:n], want)}"
    assert not bool(out[n:].ne(0).any()), "padding rows written"


@pytest.mark.operators("compressor_ratio2")
def test_compressor_rounds_the_pooled_row_to_bf16_before_rmsnorm(backend):
    """Hand-computed (§4.1, CS-06): with an identity KV projection and equal gate scores, the pooled row of
    the pair at position 1 is (a + b) / 2 = [0.48046875, 0.56640625, 1.15234375, 0.76953125] (FP32), which
    rounds to BF16 [0.48046875, 0.56640625, 1.15625, 0.76953125]; RMSNorm (eps 1e-20, weight 1) of that
    row rounds to BF16 [0.609375, 0.71875, 1.46875, 0.9765625]. Normalizing the unrounded row gives
    0.98046875 in the last place instead, so a kernel that skips the rounding (or normalizes in BF16) fails."""
    d = 4
    weights = CompressorWeights(torch.eye(d), torch.zeros(d, d), torch.ones(d))
    x = torch.tensor([[0.703125, 0.359375, 1.203125, 0.4453125],
                      [0.2578125, 0.7734375, 1.1015625, 1.09375]]).to(torch.bfloat16)
    latent, publish, _state = op(backend, "compressor_ratio2")(
        x, torch.tensor([0, 2], dtype=torch.int32), torch.tensor([0, 1], dtype=torch.int32),
        torch.tensor([0, 0], dtype=torch.int32), torch.tensor([[0]], dtype=torch.int32), torch.zeros(1, 4, 2 * d),
        weights)
    from contracts.separation import separates

    pooled = (x[0].float() + x[1].float()) / 2

    def rmsnorm(v):
        return v * torch.rsqrt((v * v).mean() + 1e-20)

    bf = pooled.to(torch.bfloat16)
    separates("pooled row rounded to BF16, RMSNorm in FP32, BF16", rmsnorm(bf.float()).to(torch.bfloat16),
              pooled_row_kept_fp32=rmsnorm(pooled).to(torch.bfloat16),
              norm_in_bf16=(bf * torch.rsqrt((bf * bf).mean() + 1e-20)).to(torch.bfloat16))
    assert publish.tolist() == [False, True]
    assert latent.dtype == torch.bfloat16 and latent[1].float().tolist() == [0.609375, 0.71875, 1.46875, 0.9765625], \
        f"latent row 1 = {latent[1].float().tolist()}, hand-computed [0.609375, 0.71875, 1.46875, 0.9765625]"


@pytest.mark.operators("compressor_ratio2")
def test_epochs_thread_the_ring_and_are_not_idempotent(backend):
    """The compressor_r2_epochs golden's call: five decode epochs, each taking the state the previous one
    left, give the reference's latents, flags and final state; running an epoch again on the state it
    started from (instead of the threaded one) changes a latent, so an epoch-by-epoch golden cannot be
    replaced by independent calls. Spec: §4.1; upstream_checks CS-18."""
    from goldens.cases.cache import _compressor_epochs_build, _compressor_epochs_call
    from kernels.reference.compressor import CompressorWeights

    inputs = _compressor_epochs_build(17, "replicated")
    got = _compressor_epochs_call(op(backend, "compressor_ratio2"), inputs)
    from backends import torch_backend

    want = _compressor_epochs_call(torch_backend().get("compressor_ratio2"), inputs)
    assert torch.equal(got["publish"], want["publish"]) and _same(got["state_cache"], want["state_cache"])
    assert _same(got["latent"], want["latent"]), f"epoch latent row {_first_diff(got['latent'], want['latent'])}"
    weights = CompressorWeights(inputs["wkv"], inputs["wgate"], inputs["norm_weight"])
    fn, reqs, starts = op(backend, "compressor_ratio2"), torch.arange(3, dtype=torch.int32), torch.arange(4,
                                                                                                  dtype=torch.int32)
    _l0, _p0, after0 = fn(inputs["x"][0], starts, inputs["position_ids"][0], reqs, inputs["state_block_table"],
                          inputs["state_cache"].clone(), weights)
    threaded = fn(inputs["x"][1], starts, inputs["position_ids"][1], reqs, inputs["state_block_table"], after0,
                  weights)[0]
    fresh = fn(inputs["x"][1], starts, inputs["position_ids"][1], reqs, inputs["state_block_table"],
               inputs["state_cache"].clone(), weights)[0]
    assert not torch.equal(threaded, fresh), "epoch 2 ignored the state epoch 1 left"
    assert _same(got["latent"][1], threaded), "the epoch golden's second epoch did not take the state the first left"


@pytest.mark.operators("compressor_ratio2")
def test_two_requests_on_one_state_block_are_refused_or_updated_in_place_by_name(backend):
    """Two requests of one call on state block 1: refused by default, naming both requests (upstream's kernel
    would update the ring in place request by request; this project's reads-before-writes would read the old
    slot, so the two rules disagree on this input). The named ``shared_block="in_place"`` rule follows upstream:
    request 1's first (odd) position pairs with the slot request 0 just wrote, which the reads-before-writes
    result does not (request 1 re-runs position 5, whose partner slot 0 request 0 wrote at position 4).
    Spec: §4.1; docs/upstream.md."""
    from kernels.errors import ContractInputError
    from kernels.reference.compressor import compressor_ratio2

    ring = Ring(FLASH_TINY, 4, 3, seed=41)
    a, b = ring.tokens(2), ring.tokens(1)
    with pytest.raises(ContractInputError, match=r"state_block_table\[1\]\[0\].*request 0 has block 1"):
        call(backend, ring, ring.state, [(a, 4, 1), (b, 5, 1)])
    args = (torch.cat((a, b)), torch.tensor([0, 2, 3]), torch.tensor([4, 5, 5]), torch.tensor([0, 0, 1]),
            torch.tensor([[1], [1]]), ring.state, ring.weights)
    in_place = compressor_ratio2(*args, shared_block="in_place")
    # request 1 alone, on the ring request 0 left behind, is what in place means
    first = compressor_ratio2(args[0][:2], torch.tensor([0, 2]), args[2][:2], args[3][:2],
                                    torch.tensor([[1]]), ring.state, ring.weights)
    second = compressor_ratio2(b, torch.tensor([0, 1]), torch.tensor([5]), torch.tensor([0]),
                                     torch.tensor([[1]]), first[2], ring.weights)
    assert torch.equal(in_place[0][2], second[0][0]), "in place: request 1 did not read request 0's write"
    stale = compressor_ratio2(b, torch.tensor([0, 1]), torch.tensor([5]), torch.tensor([0]),
                                    torch.tensor([[1]]), ring.state, ring.weights)
    assert not torch.equal(in_place[0][2], stale[0][0]), "the case does not separate in place from reads-first"
    with pytest.raises(ContractInputError, match="shared_block"):
        compressor_ratio2(*args, shared_block="later")


@pytest.mark.parametrize("second, table, shared", [
    ("empty span", [[0], [0]], False),
    ("beyond num_tokens", [[1], [1]], False),
    ("block out of range", [[3], [3]], False),
    ("block 0 shared", [[0], [0]], True),
], ids=lambda v: v if isinstance(v, str) else None)
@pytest.mark.operators("compressor_ratio2")
def test_only_requests_with_tokens_on_a_real_block_count_as_sharing_it(backend, second, table, shared):
    """The shared-block refusal counts a request only when it has tokens in this call (num_tokens cuts its span)
    and a block inside the cache: a second request with an empty span, with every row past num_tokens, or with
    both on a block outside [0, blocks) (skipped, as the docstring says) is not a conflict; two real requests on
    block 0 are. Spec: §4.1."""
    from kernels.errors import ContractInputError

    ring = Ring(FLASH_TINY, 4, 3, seed=42)
    a, b = ring.tokens(2), ring.tokens(2)
    x = torch.cat((a, b))
    qsl = {"empty span": [0, 2, 2], "beyond num_tokens": [0, 2, 4]}.get(second, [0, 2, 4])
    total = 2 if second == "beyond num_tokens" else qsl[-1]
    args = (x, torch.tensor(qsl), torch.tensor([4, 5, 6, 7]), torch.tensor([0, 0, 1, 1]), torch.tensor(table),
            ring.state, ring.weights)
    run = op(backend, "compressor_ratio2")
    if shared:
        with pytest.raises(ContractInputError, match="request 0 has block 0"):
            run(*args, num_tokens=total)
    else:
        run(*args, num_tokens=total)


# defects of tests/defects these contracts must catch (shared with other contract files)
SEEDED_DEFECTS = [
    shared("reference:COMPRESSOR_ALL_ROWS_WRITE", "test_compressor_chunked_equals_unchunked", "ring slot"),
    shared("reference:COMPRESSOR_NUM_TOKENS_FROM_QSL", "test_an_explicit_num_tokens_inside_a_requests_span_cuts_the_request_there", "num_tokens="),
    shared("reference:COMPRESSOR_WHOLE_REQUESTS_ONLY", "test_an_explicit_num_tokens_inside_a_requests_span_cuts_the_request_there", "num_tokens="),
    shared("reference:COMPRESSOR_PARTNER_WRONG_SLOT", "test_compressor_chunked_equals_unchunked", "latent row"),
    shared("reference:COMPRESSOR_PARTNER_WRONG_SLOT", "test_compressor_restored_odd_prefix_equals_uninterrupted", "restored resume differs"),
    shared("reference:COMPRESSOR_BLOCK_BY_BATCH_ROW", "test_compressor_reorder_departure_admission_block_reuse", "differs from its unchunked run"),
    shared("reference:COMPRESSOR_NEGATIVE_BLOCK_WRAPS", "test_compressor_inactive_block_means_no_state_access", "ring blocks other than"),
    shared("reference:COMPRESSOR_WRITES_NEIGHBOR", "test_compressor_untouched_ring_slots_are_byte_identical", "unmapped row changed"),
    shared("reference:COMPRESSOR_NUM_TOKENS_FROM_SHAPE", "test_compressor_num_tokens_zero_touches_nothing", "assert"),
    shared("reference:COMPRESSOR_LENIENT_STATE", "test_compressor_rejects_bad_state_cache", "DID NOT RAISE"),
    shared("reference:COMPRESSOR_SHARED_BLOCK_UNCHECKED", "test_two_requests_on_one_state_block_are_refused_or_updated_in_place_by_name", "DID NOT RAISE"),
]
