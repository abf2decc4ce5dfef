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
from pto_pytest.defect import SeededDefect, shared
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


def _tie_row() -> torch.Tensor:
    """One embedding row of D = 64 whose RMSNorm is exact and whose INT8 codes land on exact halves: entries
    127, 2.5, -0.5, 126.5, 3.5 (the ties), then -127, 127, 33, 6, 1, 1, 1 and zeros, so the sum of squares is 65536
    and the mean 1024 (the 1e-6 epsilon is below its ulp): the norm multiplies by exactly 1/32, the amax is 127/32
    and the quantization factor 127 / amax is exactly 32 under every rule (a true quotient, or reciprocal · 127),
    so the codes before rounding are the entries themselves."""
    row = torch.zeros(D)
    row[:12] = torch.tensor([127.0, 2.5, -0.5, 126.5, 3.5, -127.0, 127.0, 33.0, 6.0, 1.0, 1.0, 1.0])
    assert D == 64 and float(row.pow(2).sum()) == 65536.0, "the tie row needs D = 64 and a sum of squares 4^8"
    return row


def test_an_exact_half_reaches_the_backends_codes_and_rounds_to_even(backend):
    """Through the backend's own quantization (not the helper): an embedding row whose codes before rounding are
    exactly 2.5, -0.5, 126.5 and 3.5 (``_tie_row``), unit norm weights and smoothing, the previous streams zero, and
    a projection that reads codes 1, 2, 3, 4 into outputs 1, 2, 3, 4: the outputs are the half-to-even codes (2, 0,
    126, 4) times the dequantization, within 4 FP32 ulps, separated from half away from zero (3, -1, 127, 4) and
    half up (3, 0, 127, 4). Spec: §8 (upstream's torch.round)."""
    from contracts.separation import separates

    hidden = _tie_row().to(torch.bfloat16)[None].repeat(2, 1)
    assert torch.equal(hidden[0].float(), _tie_row()), "the tie row is not BF16-exact"
    proj = torch.zeros(D, D, dtype=torch.int8)
    for k in range(1, 5):
        proj[k, k] = 1
    i = dict(hidden=hidden, prev=torch.zeros(2, HC, D), enorm=torch.ones(D), hnorm=torch.ones(D), e_proj=proj,
             e_scale=torch.ones(D), e_smooth=torch.ones(D), h_proj=torch.zeros(D, D, dtype=torch.int8),
             h_scale=torch.ones(D), h_smooth=torch.ones(D))
    pre = _tie_row()[1:5].double()  # the codes before rounding (scale exactly 32 on rows normed by exactly 1/32)
    factor = (127.0 / 32) / 127  # amax / 127: each code's dequantized value
    want = separates("INT8 codes round half to even", torch.round(pre) * factor,
                     half_away=pre.sign() * (pre.abs() + 0.5).floor() * factor,
                     half_up=(pre + 0.5).floor() * factor)
    out = _call(backend, i)
    got = out[:, :, 1:5].double()
    bound = 4 * 2.0**-23 * float(want.abs().max())
    bad = ((got - want).abs() > bound).nonzero()
    assert not bad.numel(), f"out[{bad[0].tolist()}] = {float(got[tuple(bad[0])])}, expected " \
                            f"{want.tolist()} = half-to-even codes (2, 0, 126, 4) x {factor} (bound {bound:.3g}): " \
                            "the exact halves 2.5, -0.5, 126.5, 3.5 rounded another way (§8)"


def test_mtp_inputs_are_refused_naming_the_field(backend):
    """Streams of the wrong count or width, and a projection that is not INT8 [D, D], name the field. Spec: §8."""
    i = _inputs(2)
    for bad, field in (({"prev": i["prev"][:, :2]}, "mtp_projection"), ({"hidden": i["hidden"][:, :-1]},
                       "mtp_projection"), ({"e_proj": i["e_proj"].float()}, "e_proj"),
                       ({"h_proj": i["h_proj"][:-1]}, "h_proj")):
        with pytest.raises(ContractInputError, match=field):
            _call(backend, {**i, **bad})


def _half_up_projection(hidden, prev, enorm, hnorm, e_proj, e_scale, e_smooth, h_proj, h_scale, h_smooth, *,
                        config):
    """The projection with its INT8 codes rounded half up (floor(v * quant + 0.5))."""
    from unittest import mock

    from kernels.v4 import mtp

    def half_up(v, *, scale_max, amax_eps):
        amax = v.abs().amax(dim=-1, keepdim=True).clamp_min(amax_eps)
        quant = torch.full_like(amax, scale_max) / amax
        return torch.clamp(torch.floor(v * quant + 0.5), -scale_max, scale_max).to(torch.int8), torch.reciprocal(quant)

    with mock.patch.object(mtp, "quantize_rows_int8", half_up):
        return mtp.mtp_projection(hidden, prev, enorm, hnorm, e_proj, e_scale, e_smooth, h_proj, h_scale, h_smooth,
                                  config=config)


# defects of tests/defects these contracts must catch (shared with other contract files)
SEEDED_DEFECTS = [
    shared("v4:E_ON_STREAM_ZERO", "test_the_mtp_projection_is_the_shared_embedding_half_plus_each_streams_half", "not the released MTP projection"),
    SeededDefect("mtp-projection:half-up", "mtp_projection", _half_up_projection,
                 "test_an_exact_half_reaches_the_backends_codes_and_rounds_to_even", "rounded another way"),
]
