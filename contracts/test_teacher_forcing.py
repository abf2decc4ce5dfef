"""Teacher-forced mHC comparators (upstream_checks HC-09, HC-10): a stage judged against the reference re-run
on the device's own inputs. Each is shown to pass a device whose upstream stage drifted (where judging against
the reference chain would fail it, computed here), and each clause to fail alone just outside its bound.
Spec: contracts/checks/teacher.py."""

from __future__ import annotations

import torch

from contracts.checks.teacher import MIX_ROW_TOL, POST_REL_L2, check_hc_mixes_forced, check_hc_post_forced
from kernels.config import FLASH_TINY
from kernels.reference import mhc

C = FLASH_TINY


def _weights(seed: int = 0, tokens: int = 4):
    g = torch.Generator().manual_seed(seed)
    hc, d = C.hc_mult, C.hidden_size
    mix = (2 + hc) * hc
    x = torch.randn(tokens, hc, d, generator=g)
    function = torch.randn(mix, hc * d, generator=g) * (hc * d) ** -0.5
    scale = torch.tensor([0.5, 0.5, 0.5])
    base = torch.randn(mix, generator=g) * 0.1
    return x, function, scale, base


def test_the_mixes_are_judged_on_the_devices_own_residual_stream():
    """The device's residual stream drifted 5 % from the reference chain's (an upstream stage's error): its
    mixes, exact on that stream, pass; the same mixes judged against the reference chain's stream fail the
    5e-3 row bound (computed), which is what teacher forcing takes out of this stage's verdict."""
    x, function, scale, base = _weights()
    drifted = x * 1.05 + 0.05 * torch.randn(x.shape, generator=torch.Generator().manual_seed(9))
    device = mhc.hc_mixes(drifted, function, scale, base, config=C)
    r = check_hc_mixes_forced(drifted, [device, device], function, scale, base, config=C)
    assert r.ok, r.message()
    chain = mhc.hc_mixes(x, function, scale, base, config=C)
    plain = max(float((getattr(device, n) - getattr(chain, n)).abs().max()) for n in ("pre", "post", "residual"))
    assert plain > MIX_ROW_TOL, f"the drift moves the mixes by only {plain}: the input does not separate"


def test_each_mixes_clause_fails_alone():
    """One residual coefficient of token row 2 off by 0.9 x the bound passes, by 1.1 x fails naming row 2; a
    second replica one ULP off in one pre coefficient fails naming the replica (replica 0 is exact)."""
    x, function, scale, base = _weights(1)
    exact = mhc.hc_mixes(x, function, scale, base, config=C)
    for factor, ok in ((0.9, True), (1.1, False)):
        off = mhc.Mixes(exact.pre.clone(), exact.post.clone(), exact.residual.clone())
        off.residual[2, 1, 0] += factor * MIX_ROW_TOL
        r = check_hc_mixes_forced(x, [off], function, scale, base, config=C)
        assert r.ok is ok, r.message()
        if not ok:
            assert "residual[2]" in r.message(), r.message()
    replica = mhc.Mixes(exact.pre.clone(), exact.post, exact.residual)
    replica.pre[0, 0] = torch.nextafter(replica.pre[0, 0], torch.tensor(2.0))
    r = check_hc_mixes_forced(x, [exact, replica], function, scale, base, config=C)
    assert not r.ok and "replica 1 pre" in r.message(), r.message()


def test_hc_post_is_judged_on_the_devices_own_sublayer_output():
    """The device's attention output is 20 % off the reference chain's: its expanded stream, exact for that
    sublayer output, passes; judged against the chain's own hc_post it is far past 1 % (computed)."""
    x, function, scale, base = _weights(2)
    mixes = mhc.hc_mixes(x, function, scale, base, config=C)
    g = torch.Generator().manual_seed(4)
    sublayer = torch.randn(x.shape[0], x.shape[2], generator=g).to(torch.bfloat16)
    device_sublayer = (sublayer.float() * 1.2).to(torch.bfloat16)
    device_out = mhc.hc_post(device_sublayer, x, mixes.post, mixes.residual)
    r = check_hc_post_forced(device_out, device_sublayer, x, mixes.post, mixes.residual)
    assert r.ok, r.message()
    chain = mhc.hc_post(sublayer, x, mixes.post, mixes.residual)
    plain = float((device_out - chain).double().norm() / chain.double().norm())
    assert plain > POST_REL_L2, f"the sublayer drift moves the stream by only {plain}: the input does not separate"


def test_the_hc_post_budget_fails_just_outside_it():
    """A uniform relative error of 0.9 % of the stream passes; 1.1 % fails, naming the bound; a NaN fails."""
    x, function, scale, base = _weights(3)
    mixes = mhc.hc_mixes(x, function, scale, base, config=C)
    sublayer = torch.randn(x.shape[0], x.shape[2], generator=torch.Generator().manual_seed(5)).to(torch.bfloat16)
    exact = mhc.hc_post(sublayer, x, mixes.post, mixes.residual)
    for factor, ok in ((0.9, True), (1.1, False)):
        r = check_hc_post_forced(exact * (1 + factor * POST_REL_L2), sublayer, x, mixes.post, mixes.residual)
        assert r.ok is ok, r.message()
    assert "relative L2" in r.message()
    broken = exact.clone()
    broken[1, 0, 3] = float("nan")
    r = check_hc_post_forced(broken, sublayer, x, mixes.post, mixes.residual)
    assert not r.ok and "x_hc_out[1][0][3]" in r.message(), r.message()
