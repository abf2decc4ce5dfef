"""dspark's main-hidden projection (``dspark_proj``): the target layers' hidden rows projected to D, staged in BF16,
then the final RMSNorm. Judged against the rule evaluated here in FP64 from the spec (the projection's exact sum
rounded to FP32 then BF16, the norm in FP64); a hand vector worked out below separates the rule from its slips.
Golden case and bad calls: the record in ``kernels/v4/dspark_proj.py``. Spec: §8."""

from __future__ import annotations

import pytest
import torch
from hypothesis import example, given
from hypothesis import strategies as st

from contracts.separation import bf16_once, separates
from kernels.config import V4_FLASH_TINY
from kernels.errors import ContractInputError
from pto_pytest.defect import SeededDefect
from pto_pytest.plugin import op

pytestmark = pytest.mark.operators("dspark_proj")
C = V4_FLASH_TINY


def _spec(hidden: torch.Tensor, w: torch.Tensor, norm_w: torch.Tensor, eps: float) -> torch.Tensor:
    """The rule in FP64 with its one staging: p = BF16(FP32(Σ h·w)), y = p · w_norm / sqrt(mean(p²) + eps)."""
    p = (hidden.double().unsqueeze(1) * w.double().unsqueeze(0)).sum(-1).float().to(torch.bfloat16).double()
    return p * norm_w.double() / torch.sqrt(p.pow(2).mean(-1, keepdim=True) + eps)


@given(rows=st.integers(1, 6), layers=st.integers(1, 3), d=st.integers(1, 12), seed=st.integers(0, 2**31),
       zero_row=st.booleans(), scale=st.sampled_from([1e-3, 1.0, 1e3]))
@example(rows=2, layers=3, d=8, seed=0, zero_row=True, scale=1.0)
def test_main_x_is_the_norm_of_the_bf16_staged_projection(backend, rows, layers, d, seed, zero_row, scale):
    """Any row count, 1 to 3 target layers, any D; rows scaled by 1e-3 .. 1e3 and a row of zeros (only eps under
    the root: zeros out, not NaN): main_x [T, D] BF16, each element within 2^-8 of its FP64 value |y| (at most half
    a BF16 step from the value the rule gives)."""
    g = torch.Generator().manual_seed(seed)
    hidden = (torch.randn(rows, layers * d, generator=g) * scale)
    if zero_row:
        hidden[0] = 0.0
    hidden = hidden.to(torch.bfloat16)
    w = (torch.randn(d, layers * d, generator=g) / (layers * d) ** 0.5).to(torch.bfloat16)
    norm_w = (torch.randn(d, generator=g) * 0.3 + 1.0).to(torch.bfloat16)
    got = op(backend, "dspark_proj")(hidden, w, norm_w, config=C)
    assert got.dtype == torch.bfloat16 and tuple(got.shape) == (rows, d), \
        f"main_x {got.dtype}{list(got.shape)}, expected bfloat16[{rows}, {d}] (§8)"
    want = _spec(hidden, w, norm_w, C.rms_norm_eps)
    err = (got.double() - want).abs()
    bound = want.abs() * 2.0**-8 * (1 + 2.0**-10)
    bad = ~(err <= bound)  # NaN fails too
    if bool(bad.any()):
        t, j = (int(v) for v in bad.nonzero()[0])
        raise AssertionError(f"main_x[{t}][{j}] = {float(got[t, j])}, expected {float(want[t, j]):.9g} within "
                             f"{float(bound[t, j]):.3g} (the norm of the BF16-staged projection, §8)")


def test_a_hand_vector_separates_the_rule_from_its_slips(backend):
    """D 2, two layers: h = (1, 1 | 1, 1 + 2^-7), W = [[1, 0, 2, 0], [0, 1/2, 0, 1/2 + 2^-6]], w_norm = (1, 2).
    p = (3, 1 + 2^-6 + 2^-8 + 2^-13): its second element lies 2^-13 above the BF16 midpoint 1 + 2^-7 + 2^-8 and
    is staged to 1 + 3·2^-7 = 1.0234375. Then rms = sqrt((9 + 1.0234375²) / 2) and main_x = (3, 2 · 1.0234375) / rms
    = (1.3359375, 0.9140625) in BF16. Separated from the norm of the unstaged FP32 projection (0.91015625), from
    the layers read in reverse order, from the norm weight dropped and from the weight applied before the norm."""
    bf = torch.bfloat16
    h = torch.tensor([[1.0, 1.0, 1.0, 1.0 + 2**-7]], dtype=bf)
    w = torch.tensor([[1.0, 0.0, 2.0, 0.0], [0.0, 0.5, 0.0, 0.5 + 2**-6]], dtype=bf)
    norm_w = torch.tensor([1.0, 2.0], dtype=bf)
    eps = C.rms_norm_eps
    p = torch.tensor([[3.0, 1 + 2**-6 + 2**-8 + 2**-13]], dtype=torch.float64)
    assert torch.equal((h.double() @ w.double().T), p), "the hand vector's projection is not the worked-out p"
    staged = torch.tensor([[3.0, 1.0234375]], dtype=torch.float64)
    assert torch.equal(p.float().to(bf).double(), staged), "p's BF16 staging is not the worked-out one"

    def norm(x, weight):
        return (x * weight.double() / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps)).float().to(bf)

    want = torch.tensor([[1.3359375, 0.9140625]], dtype=bf)
    assert torch.equal(norm(staged, norm_w), want), "the worked-out main_x is not the rule's"
    rev = (torch.cat((h[:, 2:], h[:, :2]), 1).double() @ w.double().T).float().to(bf).double()
    separates("the norm of the BF16-staged projection", want, unstaged=norm(p, norm_w), layers_reversed=norm(rev, norm_w),
              weight_dropped=norm(staged, torch.ones(2)),
              weight_before_norm=norm((staged * norm_w.double()).float().to(bf).double(), torch.ones(2)))
    got = op(backend, "dspark_proj")(h, w, norm_w, config=C)
    assert torch.equal(got, want), f"main_x {got.tolist()}, expected {want.tolist()}: the norm of the projection " \
                                   "staged in BF16 (1.0234375), not of its FP32 value (§8)"


def test_the_projection_is_rounded_to_fp32_before_bf16(backend):
    """D 3, one layer: row 0 of the projection is 1 + 2^-8 + 2^-30 exactly (h = (1, 2^-8, 2^-15), w row (1, 1,
    2^-15)). Its FP32 sum is 1 + 2^-8, a BF16 midpoint, which rounds to even: 1 (the kernel's FP32 accumulator, then
    rint). Rounded to BF16 once from the exact sum it is 1 + 2^-7. The other two elements are 1: main_x is the norm
    of (1, 1, 1), every element BF16(1 / sqrt(1 + eps)) = 1; separated from the norm of (1 + 2^-7, 1, 1)."""
    bf = torch.bfloat16
    h = torch.tensor([[1.0, 2.0**-8, 2.0**-15]], dtype=bf)
    w = torch.tensor([[1.0, 1.0, 2.0**-15], [1.0, 0.0, 0.0], [1.0, 0.0, 0.0]], dtype=bf)
    norm_w = torch.ones(3, dtype=bf)
    p = h.double() @ w.double().T
    assert float(p[0, 0]) == 1 + 2**-8 + 2**-30, "the worked-out projection"

    def norm(x):
        x = x.double()
        return (x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + C.rms_norm_eps)).float().to(bf)

    want = norm(p.float().to(bf))
    assert want.tolist() == [[1.0, 1.0, 1.0]], "the worked-out main_x"
    separates("the projection rounded to FP32, then BF16", want, rounded_once=norm(bf16_once(p)))
    got = op(backend, "dspark_proj")(h, w, norm_w, config=C)
    assert torch.equal(got, want), f"main_x {got.tolist()}, expected {want.tolist()}: the projection's FP32 sum " \
                                   "(a BF16 midpoint, rounded to even), not the exact sum rounded once (§8)"


@pytest.mark.parametrize("case, field", [("hidden of another width", "main_hidden"), ("no row", "main_hidden"),
                                         ("FP32 hidden", "main_hidden"), ("projection not L·D wide", "main_proj_w"),
                                         ("projection of another D", "main_proj_w"),
                                         ("FP32 projection", "main_proj_w"), ("2-D norm weight", "main_norm_w"),
                                         ("FP32 norm weight", "main_norm_w")])
def test_a_malformed_call_is_refused_naming_its_field(backend, case, field):
    """Hidden rows [T >= 1, L·D], a projection [D, L·D] and a norm weight [D], all BF16; one layer (L = 1) and one
    row are well formed."""
    bf = torch.bfloat16
    h, w, nw = torch.ones(2, 6, dtype=bf), torch.ones(3, 6, dtype=bf), torch.ones(3, dtype=bf)
    op(backend, "dspark_proj")(h[:1, :3], w[:, :3], nw, config=C)  # the edges are accepted
    call = {"hidden of another width": (h[:, 1:], w, nw), "no row": (h[:0], w, nw), "FP32 hidden": (h.float(), w, nw),
            "projection not L·D wide": (h[:, :5], w[:, :5], nw), "projection of another D": (h, w[:2], nw),
            "FP32 projection": (h, w.float(), nw), "2-D norm weight": (h, w, nw[None]),
            "FP32 norm weight": (h, w, nw.float())}[case]
    with pytest.raises(ContractInputError) as exc:
        op(backend, "dspark_proj")(*call, config=C)
    assert exc.value.field == field, f"{case}: refused naming {exc.value.field!r}, not {field!r}: {exc.value}"


# --- seeded defects ------------------------------------------------------------------------------------------

def _unstaged(main_hidden, main_proj_w, main_norm_w, *, config, ops=None):
    from kernels.reference.compressor import rms_norm

    return rms_norm((main_hidden.double() @ main_proj_w.double().T).float(), main_norm_w,
                    config.rms_norm_eps).to(torch.bfloat16)


def _layers_reversed(main_hidden, main_proj_w, main_norm_w, *, config, ops=None):
    from kernels.v4.dspark_proj import dspark_proj

    d = main_norm_w.shape[0]
    blocks = main_hidden.split(d, dim=1)[::-1]
    return dspark_proj(torch.cat(blocks, 1), main_proj_w, main_norm_w, config=config)


def _no_eps(main_hidden, main_proj_w, main_norm_w, *, config, ops=None):
    from kernels.v4.dspark_proj import projected_rows

    p = projected_rows(main_hidden, main_proj_w).float()
    return (p * torch.rsqrt(p.pow(2).mean(-1, keepdim=True)) * main_norm_w.float()).to(torch.bfloat16)


def _rounded_once(main_hidden, main_proj_w, main_norm_w, *, config, ops=None):
    from contracts.separation import bf16_once
    from kernels.reference.lm_head import final_norm

    p = bf16_once(main_hidden.double() @ main_proj_w.double().T).to(torch.bfloat16)
    return final_norm(p, main_norm_w, config=config)


def _norm_weight_dropped(main_hidden, main_proj_w, main_norm_w, *, config, ops=None):
    from kernels.v4.dspark_proj import dspark_proj

    return dspark_proj(main_hidden, main_proj_w, torch.ones_like(main_norm_w), config=config)


SEEDED_DEFECTS = [
    SeededDefect("dspark-proj:unstaged", "dspark_proj", _unstaged,
                 "test_a_hand_vector_separates_the_rule_from_its_slips", "staged in BF16"),
    SeededDefect("dspark-proj:layers-reversed", "dspark_proj", _layers_reversed,
                 "test_main_x_is_the_norm_of_the_bf16_staged_projection", "main_x["),
    SeededDefect("dspark-proj:no-eps", "dspark_proj", _no_eps,
                 "test_main_x_is_the_norm_of_the_bf16_staged_projection", "= nan"),
    SeededDefect("dspark-proj:rounded-once", "dspark_proj", _rounded_once,
                 "test_the_projection_is_rounded_to_fp32_before_bf16", "FP32 sum"),
    SeededDefect("dspark-proj:norm-weight-dropped", "dspark_proj", _norm_weight_dropped,
                 "test_main_x_is_the_norm_of_the_bf16_staged_projection", "main_x["),
]
