"""The model boundary: token embedding into the hyper-connection streams, and the LM head with its
vocabulary shards and greedy pick.

* ``embed_pack``: token ids (clamped into [0, vocab-1], so a padding id -1 or an id past the vocabulary reads
  a real row) look up the embedding [vocab, D]; the row is copied into every one of the ``hc`` streams, bit
  for bit: x_hc [T, hc, D] in the embedding's dtype.
* ``lm_head``: the final hidden rows (BF16, after hc_head and the final RMSNorm) times the vocabulary
  matrix [vocab, D], accumulated in FP64 and rounded once to FP32 logits. Under TP the vocabulary is cut
  into ``tp`` contiguous shards of vocab/tp rows: rank r computes logits[:, r·V/tp : (r+1)·V/tp]; the
  returned shards concatenate to the full logits, element for element.
* ``final_norm``: the final RMSNorm before the LM head: hidden [T, D] (BF16, from hc_head) normalized in FP32
  (mean of squares over D, eps ``rms_norm_eps``) times the weight [D], one BF16 rounding. The boundary chain
  embed_pack -> hc_head (with the last layer's delayed pre-mix) -> final_norm is AP-19.
* ``greedy_pick``: the argmax of each logit row, ties to the first (lowest) vocabulary id, INT32.
* ``lm_head_layout`` validates a deployment: tp and dp in (1, 2, 4, 8), dp % tp == 0, vocab % tp == 0,
  vocab % 256 == 0, group_logit_rows % 16 == 0 -- each an error naming the field.

Spec: §1 (vocab 129,280, hc_mult 4); upstream_checks SC-23, AP-17, AP-18, AP-19, CQ-26.
"""

from __future__ import annotations

import torch

from kernels.config import FLASH, V41Config
from kernels.errors import ContractInputError
from kernels.operators import operator
from kernels.record import CaseSpec, Record, Upstream, generator, in_all_folders, is_tiny
from kernels.reference.compressor import rms_norm
from kernels.reference.rowwise import rowwise_matmul

SPEC = "§1"
ROUNDING_VERSION = "lm-head-1"
SUPPORTED = (1, 2, 4, 8)


def lm_head_layout(*, vocab: int, tp: int, dp: int = 1, group_logit_rows: int = 16) -> int:
    """The rows of one vocabulary shard (vocab / tp) after the SC-23 checks."""
    for name, value in (("tp", tp), ("dp", dp)):
        if isinstance(value, bool) or value not in SUPPORTED:
            raise ContractInputError(name, None, f"one of {SUPPORTED}", value, "SC-23")
    if dp % tp:
        raise ContractInputError("dp", None, f"a multiple of tp={tp}", dp, "SC-23")
    if vocab % tp:
        raise ContractInputError("vocab", None, f"divisible by tp={tp}", vocab, "SC-23")
    if vocab % 256:
        raise ContractInputError("vocab", None, "divisible by 256", vocab, "SC-23")
    if group_logit_rows % 16:
        raise ContractInputError("group_logit_rows", None, "a multiple of 16", group_logit_rows, "SC-23")
    return vocab // tp


@operator(returns="x_hc [T, hc, D]: the clamped ids' rows in every stream", spec='§1')
def embed_pack(ids: torch.Tensor, embedding: torch.Tensor, *, config: V41Config = FLASH) -> torch.Tensor:
    """ids [T] (any integer dtype) -> x_hc [T, hc, D]: the clamped ids' embedding rows in every stream.
    Spec: CQ-26, AP-19."""
    if ids.ndim != 1 or ids.is_floating_point():
        raise ContractInputError("ids", None, "integer [T]", f"{ids.dtype}{list(ids.shape)}", SPEC)
    if embedding.ndim != 2:
        raise ContractInputError("embedding", None, "[vocab, D]", list(embedding.shape), SPEC)
    rows = embedding[ids.to(torch.long).clamp(0, embedding.shape[0] - 1)]
    return rows.unsqueeze(1).expand(-1, config.hc_mult, -1).contiguous()


@operator(returns='[T, D] BF16: FP32 RMSNorm times the weight, one BF16 rounding', spec='§1')
def final_norm(hidden: torch.Tensor, weight: torch.Tensor, *, config: V41Config = FLASH) -> torch.Tensor:
    """hidden [T, D], weight [D] -> [T, D] BF16: FP32 RMSNorm times the weight, one BF16 rounding. Spec: AP-19."""
    check_final_norm(hidden, weight)
    return rms_norm(hidden.float(), weight, config.rms_norm_eps).to(torch.bfloat16)


def check_final_norm(hidden: torch.Tensor, weight: torch.Tensor) -> None:
    """``final_norm``'s input validation alone (a second implementation refuses exactly what it refuses)."""
    if hidden.ndim != 2 or weight.shape != hidden.shape[1:]:
        raise ContractInputError("final_norm", None, "hidden [T, D] and weight [D]",
                                 [list(hidden.shape), list(weight.shape)], "AP-19")


@operator(returns='list of tp FP32 logit shards [T, vocab/tp] in rank order', spec='§1')
def lm_head(hidden: torch.Tensor, weight: torch.Tensor, *, tp: int = 1) -> list[torch.Tensor]:
    """hidden [T, D] BF16, weight [vocab, D] -> ``tp`` FP32 logit shards [T, vocab/tp] (rank order).
    Spec: AP-17, SC-23."""
    if hidden.ndim != 2 or weight.ndim != 2 or weight.shape[1] != hidden.shape[1]:
        raise ContractInputError("lm_head", None, "hidden [T, D] and weight [vocab, D]",
                                 [list(hidden.shape), list(weight.shape)], SPEC)
    rows = lm_head_layout(vocab=weight.shape[0], tp=tp, dp=tp)
    shards = []
    for r in range(tp):
        shards.append(rowwise_matmul(hidden, weight[r * rows:(r + 1) * rows]))
    return shards


@operator(returns="[T] INT32: first id of each row's maximum", spec='§1')
def greedy_pick(logits: torch.Tensor) -> torch.Tensor:
    """[T, vocab] -> [T] INT32: the first id of each row's maximum (a NaN row is an error). Spec: AP-18."""
    if logits.ndim != 2 or logits.shape[1] == 0:
        raise ContractInputError("logits", None, "[T, vocab>0]", list(logits.shape), SPEC)
    bad = torch.isnan(logits).any(1)
    if bool(bad.any()):
        row = int(bad.nonzero()[0, 0])
        raise ContractInputError("logits", (row,), "no NaN in a row to pick from", "NaN", SPEC)
    best = logits.max(dim=1, keepdim=True).values
    first = (logits == best).to(torch.int8).argmax(dim=1)  # the first True of each row
    return first.to(torch.int32)


# --- the records at V4's dims --------------------------------------------------------------------------------

LM_TP = 2  # the V4 case's tensor parallelism: the logits are each rank's vocabulary slab, concatenated


def _v4_lm_inputs(seed: int, wiring: str, config) -> dict[str, torch.Tensor]:
    """6 rows and the smallest vocabulary the layout accepts at TP2 (512, a multiple of 256)."""
    g = generator(seed)
    vocab, d = 512, config.hidden_size
    return {"hidden": torch.randn(6, d, generator=g).to(torch.bfloat16),
            "weight": (torch.randn(vocab, d, generator=g) / d**0.5).to(torch.bfloat16)}


def _norm_inputs(seed: int, wiring: str, config) -> dict[str, torch.Tensor]:
    """The 8 rows of a decode step (rms_norm_test's at Pro width): a row of zeros (only eps under the root), a 1000x
    row, BF16 weights around 1."""
    g = generator(seed)
    d = config.hidden_size
    x = torch.randn(config.decode_tokens, d, generator=g)
    x[1] = 0.0
    x[2] *= 1e3
    if is_tiny(config):
        x[3] *= 1e-3  # a row whose mean square (1e-6) is the epsilon's size: a wrong epsilon moves it
    return {"hidden": x.to(torch.bfloat16), "weight": (1 + 0.2 * torch.randn(d, generator=g)).to(torch.bfloat16)}


LM_HEAD_RECORD = Record(
    operator="lm_head",
    call=lambda fn, i, config: {"logits": torch.cat(fn(i["hidden"], i["weight"], tp=LM_TP), dim=1)},
    outputs={"logits": "fp32_ulps"},
    cases=(CaseSpec("v4_lm_head", "V4 LM head at TP2: BF16 rows times the vocabulary slab of each rank, FP32 logits",
                    _v4_lm_inputs, params={"tp": LM_TP}),),
    bindings=(*(Upstream(f, golden="lm_head.py::golden_lm_head", entry="lm_head.py::l3_lm_head")
                for f in ("deepseek_v4_pro", "deepseek_v4_flash_mtp")),
              Upstream("deepseek_v4_flash_dspark", golden="lm_head.py::golden_lm_head", entry="lm_head.py::l3_lm_head")),
)

FINAL_NORM_RECORD = Record(
    operator="final_norm",
    call=lambda fn, i, config: {"x_normed": fn(i["hidden"], i["weight"], config=config)},
    outputs={"x_normed": "norm_bf16"},
    cases=(CaseSpec("final_norm", "the final RMSNorm at Pro width (D 7168, the 8 rows rms_norm_test's decode step "
                    "takes; tiny: also a row at the epsilon's scale): a row of zeros, a 1000x row, BF16 weights "
                    "around 1", _norm_inputs, geometries=("tiny", "pro", "v4-flash")),),
    bindings=in_all_folders(golden="rmsnorm.py::golden_rms_norm_test", entry="rmsnorm.py::rms_norm_test"),
)
