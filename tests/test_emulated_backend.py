"""The device-arithmetic twin (``--backend emulated``) passes every contract that calls an operator it
replaces: it is judged by the same contracts, and against the same reference, as a kernel would be."""

from __future__ import annotations

from pathlib import Path

import pytest

from backends import emulated_backend, torch_backend
from tests.harness import contracts_for, run_contract

TWINNED = sorted(op for op in emulated_backend().operators
                 if emulated_backend().get(op) is not torch_backend().get(op))
CONTRACTS = contracts_for(TWINNED)


def test_the_emulated_backend_replaces_sparse_attention():
    """The twin replaces ``sparse_attention``; the attention half-layer, the decode Block (both wirings) and the
    causal encoder composed on the emulated backend run on it (a composition is bound to its backend's operators), so their contracts run here
    too."""
    assert TWINNED == ["attention_half_layer", "causal_encoder", "csa_compressors", "decode_block",
                       "decode_block_sharded", "dp_attention", "dspark_attention", "dspark_drafter", "dspark_markov_sample", "dspark_proj", "final_norm", "hc_head_fused", "hc_pre_fused",
                       "prefill_cp_csa", "prefill_cp_hca", "prefill_cp_layer", "prefill_cp_swa", "sparse_attention",
                       "v4_attention",
                       "v4_attention_heads", "v4_attention_stage", "v4_compress_and_publish", "v4_csa_stage", "v4_decode_layer",
                       "v4_hca_stage", "v4_moe", "v4_moe_ep", "v4_moe_stage",
                       "v4_mtp_layer", "v4_prefill_compressor", "v4_prefill_csa_stage", "v4_prefill_hca_stage", "v4_prefill_index_keys", "v4_prefill_layer",
                       "v4_prefill_mtp_layer",
                       "v4_q_kv_split", "v4_sparse_attention"], TWINNED
    assert CONTRACTS, "no contract calls the twinned operators"


@pytest.mark.parametrize("fn", CONTRACTS, ids=[f.__name__ for f in CONTRACTS])
def test_emulated_backend_passes(fn):
    outcome = run_contract(fn, emulated_backend())
    assert outcome.passed, f"{outcome.contract}: {outcome.text()[:600]}"


def test_the_sample_store_replays_on_the_twin():
    """Every attention tree of artifacts/store (every mode x phase, both wirings) passes its comparators on the
    emulated backend: the twin is judged against the golden exactly as a kernel would be."""
    from goldens import trees
    from goldens.store import GoldenStore

    store = GoldenStore(Path(__file__).resolve().parents[1] / "artifacts" / "store")
    reader = store.reader()
    judged = 0
    for name in sorted(n for n in trees.recorded_cases(reader) if n.startswith("attn_")):
        for wiring in ("replicated", "sharded"):
            results = trees.replay(trees.load_tree(reader, name, wiring), emulated_backend())
            bad = {k: r.message() for k, r in results.items() if not r.ok}
            assert not bad, (name, wiring, bad)
            judged += len(results)
    assert judged >= 24 * 4, f"only {judged} outputs judged"


def test_the_rms_norm_twin_is_a_second_implementation():
    """The RMSNorm twin (128-column tiles summed in order, the mean as a multiply by 1 / D) gives other bytes than
    the reference at V4-Pro's width -- one BF16 step where the FP32 value sits on a rounding midpoint -- so the
    contracts that pass it above accept the device's accumulation order rather than the reference's bytes; and it
    refuses exactly what the reference refuses."""
    import torch

    from backends.emulated.rms_norm import tiled_final_norm
    from kernels.config import V4_PRO
    from kernels.errors import ContractInputError
    from kernels.reference.lm_head import final_norm

    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(64, V4_PRO.hidden_size, generator=g).to(torch.bfloat16)
    weight = (torch.rand(V4_PRO.hidden_size, generator=g) + 0.5).to(torch.bfloat16)
    twin, ref = tiled_final_norm(hidden, weight, config=V4_PRO), final_norm(hidden, weight, config=V4_PRO)
    moved = twin.view(torch.int16) != ref.view(torch.int16)
    assert 0 < int(moved.sum()) < 64, int(moved.sum())
    steps = (twin.view(torch.int16).int() - ref.view(torch.int16).int())[moved].abs()
    assert bool((steps == 1).all()), steps
    for bad in ((hidden, weight[:-1]), (hidden[0], weight)):
        with pytest.raises(ContractInputError, match="final_norm"):
            tiled_final_norm(*bad, config=V4_PRO)
