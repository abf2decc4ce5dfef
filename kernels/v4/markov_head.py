"""V4-Flash dspark's Markov head (spec §8; upstream models/deepseek_v4_flash_dspark/markov_head.py): the drafter's
low-rank bigram bias over the whole vocabulary.

For each token t of the call: ``markov_embed[t] = markov_w1[token_ids[t]]`` (the BF16 row of the rank-R embedding,
copied) and ``logits_bias[t, v] = Σ_r markov_embed[t, r] · markov_w2[v, r]`` in FP32 (BF16 operands, an FP32 product
sum: here in FP64, rounded once to FP32). Upstream compiles the rank R = 256 and takes any token count and any
vocabulary (dynamic dims); an id outside the vocabulary is the caller's error (the kernel reads row ``id``), refused
here naming the row.
"""

from __future__ import annotations

import torch

from kernels.errors import ContractInputError
from kernels.operators import operator
from kernels.record import BadCall, CaseSpec, Record, dspark_only, replaced

SPEC = "§8"


def check_markov_head(token_ids: torch.Tensor, markov_w1: torch.Tensor, markov_w2: torch.Tensor) -> None:
    """The caller's side: [T] INT64 / INT32 ids inside the vocabulary, two BF16 [vocab, R] tables of one shape."""
    if token_ids.ndim != 1 or token_ids.dtype not in (torch.int64, torch.int32):
        raise ContractInputError("token_ids", None, "[T] INT64 (or INT32) ids", f"{token_ids.dtype}"
                                 f"{list(token_ids.shape)}", SPEC)
    for name, w in (("markov_w1", markov_w1), ("markov_w2", markov_w2)):
        if w.ndim != 2 or w.shape[0] < 1 or w.shape[1] < 1 or w.dtype != torch.bfloat16:
            raise ContractInputError(name, None, "BF16 [vocab >= 1, R >= 1]", f"{w.dtype}{list(w.shape)}", SPEC)
    if markov_w2.shape != markov_w1.shape:
        raise ContractInputError("markov_w2", None, f"markov_w1's shape {list(markov_w1.shape)}",
                                 list(markov_w2.shape), SPEC)
    bad = (token_ids < 0) | (token_ids >= markov_w1.shape[0])
    if bool(bad.any()):
        t = int(bad.nonzero()[0])
        raise ContractInputError("token_ids", (t,), f"an id in [0, {markov_w1.shape[0]})", int(token_ids[t]), SPEC)


@operator(returns="{markov_embed [T, R] BF16: each id's w1 row, logits_bias [T, vocab] FP32: embed · w2ᵀ}", spec=SPEC)
def markov_head(token_ids: torch.Tensor, markov_w1: torch.Tensor, markov_w2: torch.Tensor) -> dict[str, torch.Tensor]:
    """token_ids [T], markov_w1 / markov_w2 [vocab, R] BF16 -> the Markov embedding rows and the logits bias."""
    check_markov_head(token_ids, markov_w1, markov_w2)
    embed = markov_w1.index_select(0, token_ids.to(torch.int64))
    logits = (embed.double() @ markov_w2.double().T).to(torch.float32)
    return {"markov_embed": embed.contiguous(), "logits_bias": logits}


# --- the record ----------------------------------------------------------------------------------------------

def _markov_inputs(seed: int, wiring: str, config) -> dict[str, torch.Tensor]:
    """Upstream's fixture shape at its rank: ids 0, 1, 17 and the last id repeated, tables ~ N(0, 1/R) in BF16 over a
    vocabulary of 256 (tiny: rank 16) or 4096 (upstream's test vocabulary, rank 256), 16 tokens."""
    g = torch.Generator().manual_seed(seed)
    rank, vocab = (16, 256) if config.hidden_size < 1024 else (256, 4096)
    ids = torch.tensor([0, 1, 17, vocab - 1], dtype=torch.int64).repeat(4)
    w1 = (torch.randn(vocab, rank, generator=g) / rank**0.5).to(torch.bfloat16)
    w2 = (torch.randn(vocab, rank, generator=g) / rank**0.5).to(torch.bfloat16)
    return {"token_ids": ids, "markov_w1": w1, "markov_w2": w2}



RECORD = Record(
    operator="markov_head",
    call=lambda fn, i, config: dict(fn(i["token_ids"], i["markov_w1"], i["markov_w2"])),
    outputs={"markov_embed": "exact", "logits_bias": "logits"},
    cases=(CaseSpec("markov_head", "dspark's Markov head: 16 ids (0, 1, 17, the last id, repeated) into BF16 rank-R "
                    "tables, the embedding rows copied and the full-vocabulary FP32 logits bias",
                    _markov_inputs, geometries=("flash-tiny", "v4-flash")),),
    bad_calls=(
        BadCall("an id at the vocabulary", "markov_head", replaced(token_ids=lambda i: i["token_ids"] * 0 + 4096 * 16),
                "token_ids"),
        BadCall("an FP32 w2", "markov_head", replaced(markov_w2=lambda i: i["markov_w2"].float()), "markov_w2"),
        BadCall("tables of two ranks", "markov_head", replaced(markov_w2=lambda i: i["markov_w2"][:, :-1]),
                "markov_w2"),
    ),
    bindings=dspark_only("the Markov head", golden="markov_head.py::golden_markov_head",
                 entry="markov_head.py::markov_head_test"),
)
