"""V4's MTP input projection (``mtp_projection``): the MTP layer's streams are the embedding half (one row per
token, shared by every stream) plus each stream's own half, both through the INT8 stand-in's per-row
quantization. Checked against an independent computation on inputs that separate each rule: the shared half,
the per-stream half, the 1e-4 amax floor, round-half-to-even codes.

Spec: §8; docs/coverage.md, V4 section.
"""

from __future__ import annotations

import pytest
import torch

from kernels.config import V4_PRO_TINY
from kernels.errors import ContractInputError
from kernels.v4.mtp import quantize_rows_int8
from pto_pytest.defect import shared
from pto_pytest.plugin import op

pytestmark = pytest.mark.operators("mtp_projection")  # every contract here calls it, and only it

C = V4_PRO_TINY
D, HC = C.hidden_size, C.hc_mult


def _inputs(seed, *, e_smooth=1.0, t=8):
    g = torch.Generator().manual_seed(seed)

    def w():
        return torch.randint(-127, 128, (D, D), generator=g, dtype=torch.int8), torch.rand(D, generator=g) * 1e-3

    (ep, es), (hp, hs) = w(), w()
    return dict(hidden=torch.randn(t, D, generator=g).to(torch.bfloat16), prev=torch.randn(t, HC, D, generator=g),
                enorm=torch.rand(D, generator=g) + 0.5, hnorm=torch.rand(D, generator=g) + 0.5, e_proj=ep,
                e_scale=es, e_smooth=torch.full((D,), e_smooth), h_proj=hp, h_scale=hs,
                h_smooth=torch.rand(D, generator=g) + 0.5)


def _independent(i, *, floor=1e-4):
    def rms(x, w):
        x = x.double()
        return x / (x.pow(2).mean(-1, keepdim=True) + C.rms_norm_eps).sqrt() * w.double()

    def lin(v, wt, sc):
        amax = v.abs().amax(-1, keepdim=True).clamp_min(floor)
        q = (v * 127 / amax).round().clamp(-127, 127)
        return (q @ wt.double().T) * (amax / 127) * sc.double()

    e = lin(rms(i["hidden"], i["enorm"]) * i["e_smooth"].double(), i["e_proj"], i["e_scale"])
    h = lin(rms(i["prev"], i["hnorm"]) * i["h_smooth"].double(), i["h_proj"], i["h_scale"])
    return e[:, None, :] + h


def _call(backend, i):
    return op(backend, "mtp_projection")(i["hidden"], i["prev"], i["enorm"], i["hnorm"], i["e_proj"], i["e_scale"],
                                         i["e_smooth"], i["h_proj"], i["h_scale"], i["h_smooth"], config=C)


def _close(a, b, rel=1e-5):
    return bool(((a.double() - b).abs() <= rel * b.abs().amax() + 1e-12).all())


def test_the_mtp_projection_is_the_shared_embedding_half_plus_each_streams_half(backend):
    """Against an independent FP64 evaluation (within 1e-5 of the row scale; the INT8 products are exact): FP32
    [T, hc, D]. With h_proj zero every stream holds the same embedding half; with e_proj zero each stream its own
    half, different from the others. Spec: §8."""
    i = _inputs(0)
    out = _call(backend, i)
    assert out.dtype == torch.float32 and out.shape == (8, HC, D)
    assert _close(out, _independent(i)), "not the released MTP projection"
    only_e = _call(backend, {**i, "h_proj": torch.zeros_like(i["h_proj"])})
    assert all(torch.equal(only_e[:, c], only_e[:, 0]) for c in range(HC)), "the embedding half differs per stream"
    assert float(only_e.abs().max()) > 0
    zero = {**i, "hidden": i["hidden"].clone()}
    zero["hidden"][3] = 0  # a zero row: the eps keeps its RMS norm finite, and its embedding half is zero
    z = _call(backend, zero)
    assert bool(torch.isfinite(z).all()) and _close(z, _independent(zero))
    only_h = _call(backend, {**i, "e_proj": torch.zeros_like(i["e_proj"])})
    assert not torch.equal(only_h[:, 1], only_h[:, 0]), "the stream half is shared"
    assert _close(only_h, _independent({**i, "e_proj": torch.zeros_like(i["e_proj"])}))


def test_the_int8_rows_keep_the_amax_floor_and_round_half_to_even(backend):
    """An embedding half scaled by 1e-6 stays below the 1e-4 amax floor: its codes are small (not stretched to
    +-127), which the independent evaluation with the floor matches and one without it does not. Codes of a row
    round half to even: [127, 2.5, -0.5, 126.5] (amax 127, a scale of exactly 1) -> [127, 2, 0, 126], where
    rounding half away gives [127, 3, -1, 127]; a fifth code 3.5 -> 4 separates toward zero and floor (3). Spec: §8 (INT8_AMAX_EPS 1e-4, INT8_SCALE_MAX 127)."""
    i = _inputs(1, e_smooth=1e-6)
    out = _call(backend, {**i, "h_proj": torch.zeros_like(i["h_proj"])})
    want = _independent({**i, "h_proj": torch.zeros_like(i["h_proj"])})
    assert _close(out, want), "the amax floor"
    assert not _close(want, _independent({**i, "h_proj": torch.zeros_like(i["h_proj"])}, floor=1e-30)), \
        "the inputs do not separate the floor"
    from contracts.separation import separates

    row = torch.tensor([[127.0, 2.5, -0.5, 126.5, 3.5]])  # amax 127: a scale of exactly 1
    want = separates("INT8 codes round half to even", torch.round(row).to(torch.int8),
                     half_away=(row.sign() * (row.abs() + 0.5).floor()).to(torch.int8),
                     toward_zero=row.trunc().to(torch.int8), floor=row.floor().to(torch.int8))
    codes, factor = quantize_rows_int8(row, scale_max=C.int8_scale_max, amax_eps=C.int8_amax_eps)
    assert torch.equal(codes, want) and codes.tolist() == [[127, 2, 0, 126, 4]] and float(factor) == 1.0, \
        codes.tolist()


def test_mtp_inputs_are_refused_naming_the_field(backend):
    """Streams of the wrong count or width, and a projection that is not INT8 [D, D], name the field. Spec: §8."""
    i = _inputs(2)
    for bad, field in (({"prev": i["prev"][:, :2]}, "mtp_projection"), ({"hidden": i["hidden"][:, :-1]},
                       "mtp_projection"), ({"e_proj": i["e_proj"].float()}, "e_proj"),
                       ({"h_proj": i["h_proj"][:-1]}, "h_proj")):
        with pytest.raises(ContractInputError, match=field):
            _call(backend, {**i, **bad})


# defects of tests/defects these contracts must catch (shared with other contract files)
SEEDED_DEFECTS = [
    shared("v4:E_ON_STREAM_ZERO", "test_the_mtp_projection_is_the_shared_embedding_half_plus_each_streams_half", "not the released MTP projection"),
]
