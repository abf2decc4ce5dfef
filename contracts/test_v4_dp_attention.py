"""V4's attention is data-parallel only (``dp_attention``): each DP rank's requests get exactly the output of
running that rank alone (TP 1) -- no other rank's requests, caches or partial sums reach them.

Spec: §8 ("no tensor parallelism -- attention is data-parallel"); docs/coverage.md, V4 section.
"""

from __future__ import annotations

import pytest
import torch

from contracts.half_layer_inputs import HalfLayerCase, build
from contracts.v4_inputs import attention_inputs, compressed_topk
from kernels.config import FLASH_TINY, V4_PRO_TINY, LayerKind
from kernels.errors import ContractInputError
from pto_pytest.defect import shared
from pto_pytest.plugin import op

C = FLASH_TINY


@pytest.mark.whole_backend("a stage against its own parts, bit for bit")
@pytest.mark.parametrize("path", ["HCA", "CSA", "SWA"])
@pytest.mark.operators("dp_attention", "v4_attention")
def test_each_dp_rank_runs_its_own_v4_attention(backend, path):
    """V4-Pro (tiny): three DP ranks with different requests, caches and tables; rank r's attn_out equals the
    backend's v4_attention of rank r's inputs alone, byte for byte (nothing reduced or mixed across ranks); a
    rank missing an input is refused naming the rank. Spec: §8."""
    config = V4_PRO_TINY
    ranks = []
    for r in range(3):
        inputs = attention_inputs(config, 20 + r)
        compressed = compressed_topk(path, config, inputs, 30 + r)
        ranks.append(inputs if compressed is None else dict(inputs, compressed=compressed))
    outs = op(backend, "dp_attention")(ranks, kind=path, config=config)
    attention = op(backend, "v4_attention")
    assert len(outs) == 3
    for r, i in enumerate(ranks):
        alone = attention(path, i["q"], i["ori_kv"], i["window_indices"], i["cmp_kv"], i["cmp_block_table"],
                          i.get("compressed"), i["position_ids"], i["attn_sink"], i["freqs_cos"], i["freqs_sin"],
                          i["wo_a"], i["wo_b"], i["wo_b_scale"], config=config)
        assert set(outs[r]) == {"attn_out"}, f"rank {r}: outputs {sorted(outs[r])}"
        assert torch.equal(outs[r]["attn_out"], alone), f"rank {r}: attn_out is not its own single-rank attention"
    with pytest.raises(ContractInputError, match=r"rank_inputs\[1\]"):
        op(backend, "dp_attention")([ranks[0], {k: v for k, v in ranks[1].items() if k != "wo_b"}], kind=path,
                                    config=config)
    for wrong in (LayerKind.SWA, "MLA"):  # a V4.1 layer kind or an unknown path with a V4 config
        with pytest.raises(ContractInputError, match="kind"):
            op(backend, "dp_attention")(ranks, kind=wrong, config=config)
    calls = []

    def counted(path_, q, *args, config):  # a kernel-bound operator: takes no ``ops``
        calls.append(path_)
        return attention(path_, q, *args, config=config)

    backend.derive("counting", v4_attention=counted).get("dp_attention")(ranks, kind=path, config=config)
    assert calls == [path] * 3, "dp_attention must run the backend's own v4_attention, once per rank"


@pytest.mark.parametrize("kind", [LayerKind.SWA, LayerKind.C2A_FULL], ids=["SWA", "C2A_FULL"])
@pytest.mark.operators("attention_half_layer", "dp_attention")
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

    def counted(inputs, *, kind, phase, wiring, tp, config):  # a kernel-bound operator: takes no ``ops``
        calls.append(tp)
        return attention(inputs, kind=kind, phase=phase, wiring=wiring, tp=tp, config=config)

    backend.derive("counting", attention_half_layer=counted).get("dp_attention")(ranks, kind=kind, config=C)
    assert calls == [1, 1, 1], "dp_attention must run the backend's own attention, once per rank at TP 1"


# defects of tests/defects these contracts must catch (shared with other contract files)
SEEDED_DEFECTS = [
    shared("v4:REDUCED_ACROSS_DP", "test_each_dp_rank_gets_its_own_attention_and_nothing_is_reduced_across_ranks", "rank 0: output"),
]
