"""V4's attention is data-parallel only (``dp_attention``): each DP rank's requests get exactly the output of
running that rank alone (TP 1) -- no other rank's requests, caches or partial sums reach them.

Spec: §8 ("no tensor parallelism -- attention is data-parallel"); docs/coverage.md, V4 section.
"""

from __future__ import annotations

import pytest
import torch

from contracts.half_layer_cases import HalfLayerCase, build
from contracts.plugin import op
from kernels.config import FLASH_TINY, LayerKind
from kernels.errors import ContractInputError

C = FLASH_TINY


@pytest.mark.parametrize("kind", [LayerKind.SWA, LayerKind.C2A_FULL], ids=["SWA", "C2A_FULL"])
def test_each_dp_rank_gets_its_own_attention_and_nothing_is_reduced_across_ranks(backend, kind):
    """Three DP ranks with different batches: every output (attention rows and every cache) of rank r equals
    the single-rank run of rank r's inputs, byte for byte, whatever the other ranks hold. Spec: §8."""
    batches = [((1, 2), (29, 40)), ((3,), (9,)), ((1, 1, 2), (5, 17, 60))]
    ranks = [build(HalfLayerCase(kind, "decode", "replicated", 1, seed=s, padding=0, batch=b))
             for s, b in enumerate(batches)]
    outs = op(backend, "dp_attention")(ranks, kind=kind, config=C)
    attention = op(backend, "attention_half_layer")
    assert len(outs) == 3
    for r, inputs in enumerate(ranks):
        alone = attention(dict(inputs), kind=kind, phase="decode", wiring="replicated", tp=1, config=C)
        assert set(outs[r]) == set(alone), f"rank {r}: outputs {sorted(outs[r])}"
        for name, value in alone.items():
            assert torch.equal(outs[r][name].view(torch.uint8) if value.dtype.itemsize == 1 else outs[r][name],
                               value.view(torch.uint8) if value.dtype.itemsize == 1 else value), \
                f"rank {r}: {name} is not its own single-rank attention"
    with pytest.raises(ContractInputError, match="rank_inputs"):
        op(backend, "dp_attention")([], kind=kind, config=C)
    calls = []

    def counted(inputs, **kw):
        calls.append(kw["tp"])
        return attention(inputs, **kw)

    backend.derive("counting", attention_half_layer=counted).get("dp_attention")(ranks, kind=kind, config=C)
    assert calls == [1, 1, 1], "dp_attention must run the backend's own attention, once per rank at TP 1"
