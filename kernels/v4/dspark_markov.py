"""V4-Flash dspark's sequential Markov sampler (spec §8; upstream models/deepseek_v4_flash_dspark/dspark_markov.py,
``markov_sample``): the drafter's W draft tokens of each request, one after the other.

``head_hidden`` [B, W, D] BF16 holds each request's W drafter rows (the anchor-first query block's outputs),
``final_norm_weight`` [D] and ``lm_head_weight`` [V, D] the target model's final norm and LM head (shared),
``anchor_token_ids`` [B] the token each request's block starts from, ``markov_w1`` / ``markov_w2`` [V, R] the
low-rank bigram tables. For each request b:

1. base[b, s] = final_norm(head_hidden[b, s]) · lm_head_weightᵀ: the BF16 normalised row (the backend's
   ``final_norm``), times the head in FP32 (an FP64 sum rounded once here);
2. prev = anchor_token_ids[b]; for s = 0 .. W-1: scores = base[b, s] + markov_head(prev).logits_bias (an FP32
   add), draft[b, s] = the **first** id of the scores' maximum (the backend's ``greedy_pick``), prev = draft[b, s]
   -- step s reads the base row of step s and the bias of the token drafted just before it.

draft_token_ids [B, W] INT32. Composed from the backend's ``final_norm``, ``markov_head`` and ``greedy_pick``.
Upstream compiles W = 7 (the query block pads to 8) and batches of 4, 8, 12 or 16; this reference takes any.
"""

from __future__ import annotations

import torch

from kernels.errors import ContractInputError
from kernels.operators import operator
from kernels.record import BadCall, CaseSpec, Record, dspark_only, generator, replaced

SPEC = "§8"


def check_dspark_markov(head_hidden: torch.Tensor, final_norm_weight: torch.Tensor, lm_head_weight: torch.Tensor,
                        anchor_token_ids: torch.Tensor, markov_w1: torch.Tensor, markov_w2: torch.Tensor) -> None:
    """The caller's side beyond the composed operators' own: a [B >= 1, W >= 1, D] block, a head [V, D] of the
    Markov tables' vocabulary, one anchor per request inside it."""
    if head_hidden.ndim != 3 or head_hidden.shape[0] < 1 or head_hidden.shape[1] < 1:
        raise ContractInputError("head_hidden", None, "[B >= 1, W >= 1, D]", list(head_hidden.shape), SPEC)
    batch, _w, d = head_hidden.shape
    if markov_w1.ndim != 2:
        raise ContractInputError("markov_w1", None, "[vocab, R]", list(markov_w1.shape), SPEC)
    vocab = markov_w1.shape[0]
    if lm_head_weight.ndim != 2 or tuple(lm_head_weight.shape) != (vocab, d):
        raise ContractInputError("lm_head_weight", None, f"[{vocab}, {d}] (the Markov vocabulary, the rows' width)",
                                 list(lm_head_weight.shape), SPEC)
    if anchor_token_ids.ndim != 1 or anchor_token_ids.shape[0] != batch or anchor_token_ids.is_floating_point():
        raise ContractInputError("anchor_token_ids", None, f"integer [{batch}]",
                                 f"{anchor_token_ids.dtype}{list(anchor_token_ids.shape)}", SPEC)


def base_logits(normed: torch.Tensor, lm_head_weight: torch.Tensor) -> torch.Tensor:
    """[N, D] BF16 rows times the head [V, D]: FP32 logits [N, V] (an FP64 sum rounded once)."""
    return (normed.double() @ lm_head_weight.double().T).float()


@operator(returns="draft_token_ids [B, W] INT32: greedy over the base logits of each step plus the Markov bias of "
                  "the token before it -- composed from this backend's final_norm, markov_head and greedy_pick",
          spec=SPEC)
def dspark_markov_sample(head_hidden: torch.Tensor, final_norm_weight: torch.Tensor, lm_head_weight: torch.Tensor,
                         anchor_token_ids: torch.Tensor, markov_w1: torch.Tensor, markov_w2: torch.Tensor, *, config,
                         ops=None) -> torch.Tensor:
    """The sequential sampler (module docstring)."""
    from kernels.reference.lm_head import final_norm, greedy_pick
    from kernels.v4.markov_head import markov_head

    ops = ops or {}
    check_dspark_markov(head_hidden, final_norm_weight, lm_head_weight, anchor_token_ids, markov_w1, markov_w2)
    batch, width, d = head_hidden.shape
    normed = ops.get("final_norm", final_norm)(head_hidden.reshape(batch * width, d), final_norm_weight,
                                               config=config)
    base = base_logits(normed, lm_head_weight).reshape(batch, width, -1)
    bias_of, pick = ops.get("markov_head", markov_head), ops.get("greedy_pick", greedy_pick)
    prev = anchor_token_ids.to(torch.int64)
    drafts = []
    for s in range(width):
        scores = base[:, s] + bias_of(prev, markov_w1, markov_w2)["logits_bias"]
        prev = pick(scores).to(torch.int64)
        drafts.append(prev)
    return torch.stack(drafts, dim=1).to(torch.int32)


dspark_markov_sample.composes_operators = True


# --- the record ----------------------------------------------------------------------------------------------

SUPPORT = 8  # upstream's golden reads the first 8 vocabulary rows only (its fixture's nonzero support)


def _markov_inputs(seed: int, wiring: str, config) -> dict[str, torch.Tensor]:
    """4 requests x 7 draft rows at ``config``'s width; the head and the Markov tables nonzero on the first 8
    vocabulary ids only (upstream's fixture's support: the rest score exactly 0) of a vocabulary of 64, the bias
    (std ~2) as strong as the base logits' spread, so the chain follows the token before; rows and head rows with a
    positive mean, so every step's best score is positive (the golden asserts it); anchors 0 .. 3."""
    g = generator(seed)
    d, vocab, rank = config.hidden_size, 64, 16
    hidden = (torch.randn(4, 7, d, generator=g) + 1.0).to(torch.bfloat16)
    head, w1, w2 = torch.zeros(vocab, d), torch.zeros(vocab, rank), torch.zeros(vocab, rank)
    head[:SUPPORT] = (torch.randn(SUPPORT, d, generator=g) + 0.25) / d**0.5
    w1[:SUPPORT] = torch.randn(SUPPORT, rank, generator=g) * 0.7
    w2[:SUPPORT] = torch.randn(SUPPORT, rank, generator=g) * 0.7
    return {"head_hidden": hidden, "final_norm_weight": (torch.rand(d, generator=g) * 0.5 + 0.75).to(torch.bfloat16),
            "lm_head_weight": head.to(torch.bfloat16), "anchor_token_ids": torch.arange(4, dtype=torch.int64),
            "markov_w1": w1.to(torch.bfloat16), "markov_w2": w2.to(torch.bfloat16)}



RECORD = Record(
    operator="dspark_markov_sample",
    call=lambda fn, i, config: {"draft_token_ids": fn(**i, config=config)},
    outputs={"draft_token_ids": "exact"},
    cases=(CaseSpec("dspark_markov_sample", "dspark's sequential Markov sampler: 4 requests x 7 drafts over a "
                    "64-id vocabulary whose head and Markov tables live on the first 8 ids (upstream's fixture)",
                    _markov_inputs, geometries=("flash-tiny", "v4-flash")),),
    bad_calls=(
        BadCall("one anchor short", "dspark_markov_sample",
                replaced(anchor_token_ids=lambda i: i["anchor_token_ids"][:-1]), "anchor_token_ids"),
        BadCall("a head of another vocabulary", "dspark_markov_sample",
                replaced(lm_head_weight=lambda i: i["lm_head_weight"][:-1]), "lm_head_weight"),
        BadCall("an anchor past the vocabulary", "dspark_markov_sample",
                replaced(anchor_token_ids=lambda i: i["anchor_token_ids"] + 64), "token_ids"),
    ),
    bindings=dspark_only("the drafter's Markov sampler", golden="dspark_markov.py::golden_nonzero_markov",
                 entry="dspark_markov.py::markov_sample"),
)
