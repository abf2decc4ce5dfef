"""Every tolerance of the judges, in one place: the comparators (``contracts.compare``), the checks
(``contracts.checks``) and the contract files import their numbers from here and define none of their own
(tests/test_house.py checks that). Most are upstream's own ``compare_fn`` numbers, each named where it is used;
the source named beside each is the upstream check it follows (docs/coverage.md, by check ID).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RowBound:
    """Per-row rule ``RMS(a-e) <= rms_atol + rms_rtol*RMS(e)`` and ``max|a-e| <= peak_atol + peak_rtol*RMS(e)``."""

    rms_atol: float = 1e-6
    rms_rtol: float = 0.01
    peak_atol: float = 1e-5
    peak_rtol: float = 0.05


@dataclass(frozen=True)
class OutputBudget:
    """Decode SWA/C2A "FP8 budget": global and per-row relative L2, cosine."""

    global_rel_l2: float = 0.01
    row_rel_l2: float = 0.02
    min_cosine: float = 0.9999



# --- precision.py ----------------------------------------------------------------------------------------

# The BF16-ending stages (attention input, hc_post replay): on top of ratio_allclose(1e-4, 1/128), every token
# row's relative L2 error within 2^-8 (one BF16 step). upstream_checks AP-14.
BF16_STAGE_TOL = (1e-4, 1 / 128)
BF16_STAGE_ROW_BUDGET = 2.0**-8
# mHC budgets (ratio_allclose atol, rtol): the coefficients (pre / post / residual mixes) and the collapsed /
# expanded / head outputs. Spec: upstream_checks HC-07, HC-08.
HC_MIX_TOL = (2.5e-5, 5e-3)
# decode_common's attention_pre_mix compare uses 1e-4 / 1e-4 instead; kept selectable by name (HC-07).
HC_MIX_TOL_VARIANTS = {"hc_mixes": HC_MIX_TOL, "decode_common_attention_pre_mix": (1e-4, 1e-4)}
HC_OUT_TOL = (1e-4, 1 / 128)
# Engram output: ratio_allclose(atol, rtol) (upstream_checks HC-14).
ENGRAM_TOL = (1e-3, 1e-2)
# LM head logits: |a - e| <= atol + rtol·|e| on EVERY element, no outlier quota (upstream_checks AP-17).
LOGITS_TOL = (1e-3, 1e-3)
# The gate's MXFP8 activation: judged by dequantized value, so equivalent (payload, scale) pairs -- a payload
# twice as large under a scale one code smaller -- pass. upstream_checks CQ-25.
MXFP8_ACTIVATION_TOL = (2e-3, 2e-3)
# Bounds of the comparators built on this module's checks. The V4 ones are upstream's own compare_fn numbers.
FP32_ULPS = 4  # fp32_ulps: units in the last place of the row's largest |expected|
HC_MIXES_FP64_TOL = 2e-5  # hc_mixes in FP32 (20 Sinkhorn rounds) against HC-01 evaluated in FP64: values in [0, 2]
# upstream goldens' rank check (rank 1 gets the call's rows reordered): FP32 ulps of a row's largest value that rows
# in another order may move (the named deviation batched-host-matmul: a host matmul over the whole batch)
UPSTREAM_RANK_ULPS = 8
QR_SCALE_TOL = (2.5e-5, 5e-3)  # upstream qkv_proj_rope.py's qr_scale_compare (atol, rtol)
V4_ATTN_OUT_TOL = (1e-4, 1.0 / 128)  # upstream decode_sparse_attn*.py compare_fn for attn_out
V4_ATTN_OUT_QUOTA = 0.005  # of the elements may fall outside it
V4_CMP_POOL_TOL, V4_STATE_POOL_TOL = (1e-4, 1.0 / 128), (1e-3, 1e-3)  # upstream's prefill compressor compare_fn
# Upstream prefill_mtp.py's compare_fn: hidden_out / pre_hc_hidden_out by ratio_reldiff(0.02, 5 %) on the
# active rows; kv_cache by mapped_pool_ratio_reldiff(0.01, 5 %) on the mapped rows, every other row unchanged.
V4_PREFILL_MTP_RELDIFF = (0.02, 0.05)
V4_KV_POOL_RELDIFF = (0.01, 0.05)
# Upstream prefill_cp_swa.py's compare_fn: x_out by ratio_reldiff(3e-3, 0.5 %, max_diff 1); kv_cache by
# ratio_allclose(1e-4, 1e-2) with its default 0.5 % quota (here: on the rows the reference wrote, every other row
# unchanged).
V4_CP_X_OUT_RELDIFF = (3e-3, 0.005, 1.0)
V4_CP_KV_TOL = (1e-4, 1e-2)
V4_CP_KV_QUOTA = 0.005
# Upstream dspark_attention.py's compare_fn for the drafter's x_out: ratio_allclose(1e-2, 1e-2) with a 5 % quota
# (its INT8 row over the whole latent moves a near-zero output element by a few percent of the row's scale).
DSPARK_X_OUT_TOL = (1e-2, 1e-2)
DSPARK_X_OUT_QUOTA = 0.05
# dspark's Markov sampler: scores within this relative distance of a step's best are a near tie, which an FP32
# accumulation order may resolve either way (the exact-tie rule, the lowest id, is pinned by hand vectors).
DSPARK_MARKOV_TIE_TOL = 2.0**-16
ROW_BOUND = RowBound()  # §6, prefill C1A `_compare_attention_rows` (the current rule)
FP8_BUDGET = OutputBudget()  # §6, decode SWA / C2A `compare_output`


# --- topk.py ---------------------------------------------------------------------------------------------

CUTOFF_ATOL = 5e-5
CUTOFF_RTOL = 1.5e-2
MIN_OVERLAP = 0.98
# --- V4 (CSA's learned indexer, spec §8): logical positions + offset, best first, -1 tail ------------------------
# V4.1 selects physical rows sorted by logical position (check_topk_validity); V4's decode indexer emits logical
# compressed positions plus the window offset, best score first, and upstream judges them against the scores.
V4_SCORE_TOL = (1e-4, 1.0 / 128)  # SCORE_ATOL, SCORE_RTOL: ratio_allclose over the visible scores
V4_SCORE_HARD = (4.0, 5e-3)  # SCORE_HARD_MULTIPLIER, SCORE_HARD_ATOL: the pointwise ceiling
V4_PREFILL_HARD_ATOL = 7e-3  # PREFILL_SCORE_HARD_ATOL: the prefill indexer's floor (its longer reductions)


# --- teacher.py ------------------------------------------------------------------------------------------

MIX_ROW_TOL = 5e-3
POST_REL_L2 = 0.01


# --- quant_ties.py ---------------------------------------------------------------------------------------

BF16_MIDPOINT_ULPS = 32  # FP32 ulps around a BF16 rounding midpoint inside which either neighbour is accepted
RMS_SUM_REL_PER_TERM = 2.0**-24  # FP32 relative error per term of a sum, in its worst case


# --- moe.py ----------------------------------------------------------------------------------------------

SCORE_ATOL, SCORE_RTOL = 2e-4, 5e-5
WEIGHT_SUM_TOL = 2e-5
NORMALISATION_ATOL = 2e-4  # what the weights' normalisation adds to the propagated score tolerance
RELDIFF_THD, RELDIFF_PCT, MAX_ABS = 3e-3, 0.02, 0.25


# --- attention.py ----------------------------------------------------------------------------------------

GATHER_TOL = 2.0**-6  # decode_common.compare_attention_gather: ratio_allclose(2^-6, 2^-6)

# --- the contracts' own bounds ----------------------------------------------------------------------------------

# Sinkhorn's row sums after 20 iterations: nearly decomposable draws do not converge closer (test_mhc).
SINKHORN_ROW_SUM_TOL = 0.06
