"""The ratio-2 compressor's arithmetic evaluated here in FP64 from the spec text (§4.1, CS-02 .. CS-06), not by the
reference: a call built so that each rule decides bytes -- a foreign token (another request id, a negative position)
inside a request's span, a ring whose KV and score halves differ, pair scores far apart, rows whose mean square is
far below 1e-6 -- and every output (latent, publish, state) compared with the FP64 evaluation. Each plausible slip
(the guard dropped, the halves swapped, a plain mean, an epsilon of 1e-6) gives other bytes, computed here.
Spec: §4.1."""

from __future__ import annotations

import pytest
import torch

from contracts.separation import bf16_clear_of_midpoints, separates
from kernels.config import FLASH_TINY
from kernels.reference.compressor import CompressorWeights
from pto_pytest.defect import SeededDefect, reference_edit
from pto_pytest.plugin import op

C = FLASH_TINY
EPS = 1e-20  # the compressor's RMSNorm epsilon (§4.1), not the model's rms_norm_eps
CAPACITY = 4


def inputs(seed: int = 0, *, scale: float = 1e-4) -> dict:
    """Two requests on blocks 2 and 0 of a 3-block ring of capacity 4: request 0 holds positions 5, 6, 7 with a foreign
    row inside its span (request id 1, position -7) between 6 and 7 (position 7 pairs with it: the previous chunk
    row), request 1 positions 3 .. 4; tokens of RMS
    ``scale`` (the pooled rows' mean square far below 1e-6), weights with a score column scaled up so the pair's
    softmax is far from 1/2, ring rows whose KV and score halves differ."""
    g = torch.Generator().manual_seed(seed)
    hidden, d = C.hidden_size, C.head_dim
    wkv = torch.randn(hidden, d, generator=g) / hidden**0.5
    wgate = torch.randn(hidden, d, generator=g) / hidden**0.5 * 3e4  # scores of order 1 at tokens of 1e-4
    norm = torch.rand(d, generator=g) + 0.5
    x = (torch.randn(6, hidden, generator=g) * scale).to(torch.bfloat16)
    state = torch.randn(3, CAPACITY, 2 * d, generator=g)
    state[..., d:] *= 4  # score half: another distribution than the KV half
    return {"x": x, "query_start_loc": torch.tensor([0, 4, 6], dtype=torch.int32),
            "position_ids": torch.tensor([5, 6, -7, 7, 3, 4], dtype=torch.int32),
            "token_to_req_indices": torch.tensor([0, 0, 1, 0, 1, 1], dtype=torch.int32),
            "state_block_table": torch.tensor([[2], [0]], dtype=torch.int32), "state_cache": state,
            "weights": CompressorWeights(wkv, wgate, norm)}


def fp64_rule(i: dict, *, eps: float = EPS) -> dict:
    """§4.1 in FP64: kv = x·wkv and score = x·wgate (rounded once to FP32: the ring's dtype); a real row at an odd
    position p closes a pair with the previous row of the chunk (CS-05: whatever that row is), or at the chunk's
    first row with ring row (p - 1) % capacity = [kv | score]; pooled = Σ kv · softmax(score) per channel, rounded
    to BF16; latent = RMSNorm(pooled, eps) · w, rounded to BF16. Rows of another request or with p < 0 inside a span
    are skipped (CS-04); the real rows among the span's last ``capacity`` rows are written as [kv | score] at
    p % capacity of the request's block after its reads."""
    w = i["weights"]
    x = i["x"].double()
    kv = (x @ w.wkv.double()).float().double()
    score = (x @ w.wgate.double()).float().double()
    d = kv.shape[1]
    latent = torch.zeros(x.shape[0], d, dtype=torch.bfloat16)
    publish = torch.zeros(x.shape[0], dtype=torch.bool)
    state = i["state_cache"].clone()
    qsl = i["query_start_loc"].tolist()
    for r in range(len(qsl) - 1):
        block = int(i["state_block_table"][r, 0])
        start, end = qsl[r], qsl[r + 1]
        real = [t for t in range(start, end)
                if int(i["token_to_req_indices"][t]) == r and int(i["position_ids"][t]) >= 0]
        ring = state[block].double()
        for t in real:
            p = int(i["position_ids"][t])
            if p % 2 == 0:
                continue
            if t > start:
                prev_kv, prev_score = kv[t - 1], score[t - 1]
            else:
                prev_kv, prev_score = ring[(p - 1) % CAPACITY, :d], ring[(p - 1) % CAPACITY, d:]
            e0, e1 = torch.exp(prev_score), torch.exp(score[t])
            terms = (prev_kv * e0).abs() + (kv[t] * e1).abs()
            pooled = bf16_clear_of_midpoints((prev_kv * e0 + kv[t] * e1) / (e0 + e1), f"row {t}'s pooled pair",
                              err=2**-20 * terms / (e0 + e1)).double()
            normed = pooled / torch.sqrt(pooled.pow(2).mean() + eps) * w.norm.double()
            latent[t] = bf16_clear_of_midpoints(normed, f"row {t}'s latent")
            publish[t] = True
        for t in (t for t in real if t >= end - CAPACITY):
            p = int(i["position_ids"][t])
            state[block, p % CAPACITY, :d] = kv[t].float()
            state[block, p % CAPACITY, d:] = score[t].float()
    return {"latent": latent, "publish": publish, "state": state}


def _call(backend, i):
    latent, publish, state = op(backend, "compressor_ratio2")(**i)
    return {"latent": latent, "publish": publish, "state": state}


@pytest.mark.operators("compressor_ratio2")
@pytest.mark.parametrize("seed", [0, 2])
def test_the_compressor_is_its_fp64_rule(backend, seed):
    """latent, publish and the new ring equal the FP64 evaluation of §4.1 (``fp64_rule``): latent bit for bit (the
    rows kept clear of BF16 midpoints), publish exactly, the ring's FP32 rows bit for bit. The foreign row inside
    request 0's span is skipped (CS-04), the ring's rows are read and written KV first then score (CS-02), the pair
    is weighted by its scores' softmax (CS-05), the RMSNorm's epsilon is 1e-20 (CS-06); each slip, evaluated the
    same way, gives other bytes on these inputs (``_slips``)."""
    i = inputs(seed)
    got, want = _call(backend, i), fp64_rule(i)
    for slip, other in _slips(i).items():  # the inputs reach every rule
        separates(f"the rule against {slip}", want["latent"].view(torch.int16), other=other.view(torch.int16))
    assert torch.equal(got["publish"], want["publish"]), \
        f"publish {got['publish'].tolist()}, expected {want['publish'].tolist()} (odd real positions only)"
    bad = (got["latent"].view(torch.int16) != want["latent"].view(torch.int16)).any(1)
    assert not bool(bad.any()), f"latent row {int(bad.nonzero()[0])}: {got['latent'][bad][0][:4].tolist()} .., FP64 " \
                                f"rule {want['latent'][bad][0][:4].tolist()} .. (§4.1)"
    rows = (got["state"] != want["state"]).any(-1)
    assert not bool(rows.any()), f"state block/slot {rows.nonzero()[0].tolist()} is not the FP64 rule's " \
                                 "([kv | score] of the last real rows at p % capacity; every other row kept)"


def _slips(i: dict) -> dict:
    """The slips of the rule, evaluated the same way: the foreign row taken as request 0's, the ring's halves
    swapped, a plain mean, epsilon 1e-6 -> {slip: latent}."""
    foreign = {**i, "token_to_req_indices": torch.tensor([0, 0, 0, 0, 1, 1], dtype=torch.int32),
               "position_ids": torch.tensor([5, 6, 1, 7, 3, 4], dtype=torch.int32)}
    swapped_state = i["state_cache"].roll(C.head_dim, dims=-1)
    swapped = fp64_rule({**i, "state_cache": swapped_state})
    mean = fp64_rule({**i, "weights": CompressorWeights(i["weights"].wkv, i["weights"].wgate * 0, i["weights"].norm),
                      "state_cache": _zero_scores(i["state_cache"].reshape(-1, 2 * C.head_dim), C.head_dim)
                      .reshape(i["state_cache"].shape)})
    return {"the foreign row taken": fp64_rule(foreign)["latent"], "the ring's halves swapped": swapped["latent"],
            "a plain mean": mean["latent"], "epsilon 1e-6": fp64_rule(i, eps=1e-6)["latent"]}


# --- seeded defects: the edits #47 names, each made to the reference -------------------------------------------

_RATIO2 = "kernels.reference.compressor:compressor_ratio2"
_PAIR = "kernels.reference.compressor:_pooled_pair"


def _zero_scores(ring, d):
    ring = ring.clone()
    ring[:, d:] = 0
    return ring


def _with_pair(pair):
    """The reference compressor calling an edited ``_pooled_pair``."""
    ratio2 = reference_edit(_RATIO2, "latent[t] = _pooled_pair(", "latent[t] = _pooled_pair(")
    ratio2.__globals__["_pooled_pair"] = pair
    return ratio2


def _halves_swapped_on_write_and_read():
    """CS-02's halves swapped where the ring is written and where it is read (the edit #47 names: the latents stay
    consistent, the ring's bytes do not)."""
    read = reference_edit(_PAIR, "slot[:head_dim], slot[head_dim:]", "slot[head_dim:], slot[:head_dim]")
    write = reference_edit(_RATIO2, "state[block, p % capacity, :head_dim] = kv[t]\n"
                                    "            state[block, p % capacity, head_dim:] = score[t]",
                           "state[block, p % capacity, head_dim:] = kv[t]\n"
                           "            state[block, p % capacity, :head_dim] = score[t]")
    write.__globals__["_pooled_pair"] = read
    return write


SEEDED_DEFECTS = [
    SeededDefect("compressor-fp64:cs04-guard-dropped", "compressor_ratio2",
                 reference_edit(_RATIO2, " if int(req_of[t]) == r and int(pos_of[t]) >= 0]", "]"),
                 "test_the_compressor_is_its_fp64_rule", "publish"),
    SeededDefect("compressor-fp64:cs02-halves-swapped", "compressor_ratio2", _halves_swapped_on_write_and_read(),
                 "test_the_compressor_is_its_fp64_rule", "latent row"),
    SeededDefect("compressor-fp64:cs02-write-swapped", "compressor_ratio2",
                 reference_edit(_RATIO2, "state[block, p % capacity, :head_dim] = kv[t]",
                                "state[block, p % capacity, :head_dim] = score[t]"),
                 "test_the_compressor_is_its_fp64_rule", "state block/slot"),
    SeededDefect("compressor-fp64:cs02-read-swapped", "compressor_ratio2",
                 _with_pair(reference_edit(_PAIR, "slot[:head_dim], slot[head_dim:]",
                                           "slot[head_dim:], slot[:head_dim]")),
                 "test_the_compressor_is_its_fp64_rule", "latent row"),
    SeededDefect("compressor-fp64:cs05-plain-mean", "compressor_ratio2",
                 _with_pair(reference_edit(_PAIR, "torch.stack((prev_score, score[t])).softmax(dim=0)",
                                           "torch.full_like(pair_kv, 0.5)")),
                 "test_the_compressor_is_its_fp64_rule", "latent row"),
    SeededDefect("compressor-fp64:cs06-eps-1e-6", "compressor_ratio2",
                 reference_edit(_RATIO2, "eps: float = 1e-20,", "eps: float = 1e-6,"),
                 "test_the_compressor_is_its_fp64_rule", "latent row"),
]
