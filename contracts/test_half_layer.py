"""The caller contract of the attention half-layer entries (host side, before launch), on the backend's
``half_layer_call``: capacities, requests, the decode ``tokens == active`` rule with C2A Reuse's inactive
suffix, the decode SWA leaf's TP8 refusal, and a C1A call's page bound and single DP group. Spec: §7.1;
upstream_checks CH-03, CH-04, CH-09, SC-22, SC-27, MD-30, SP-13.
"""

from __future__ import annotations

import pytest

from kernels.config import FLASH, LayerKind
from pto_pytest.plugin import op

pytestmark = pytest.mark.operators("half_layer_call")  # every contract here calls it, and only it

KINDS = [k.value for k in LayerKind]
ACCEPTED = [
    ("C2A_REUSE", dict(phase="decode", tokens=32, active=24, requests=4), 24),  # the validated upstream case
    ("C2A_REUSE", dict(phase="decode", tokens=192, active=1), 1),
    ("C1A_FULL", dict(phase="decode", tokens=192, requests=32), 192),  # the decode capacity, 32 requests
    ("SWA", dict(phase="decode", tokens=1, tp=4), 1),
    ("SWA", dict(phase="prefill", tokens=4096, tp=8, requests=32), 4096),  # TP8 is refused in decode only
    ("C1A_REINDEX", dict(phase="prefill", tokens=5, active=3, requests=3), 3),  # prefill has no active rule
    ("C2A_FULL", dict(phase="decode", tokens=6, requests=6, tp=2), 6),
    ("C2A_FULL", dict(phase="decode", tokens=6, epoch=1000), 6),  # the last epoch a window counts
    ("C1A_FULL", dict(phase="decode", tokens=128, pages=1), 128),  # one page holds 128 rows (CH-09)
    ("C1A_REUSE", dict(phase="decode", tokens=192, pages=2), 192),  # min(192, 2·128)
    ("C2A_FULL", dict(phase="decode", tokens=6, dp=2), 6),  # the one-DP-group rule is C1A's
    ("SWA", dict(phase="decode", tokens=4, layer=1), 4),  # a layer of the entry's own kind (SC-27)
    ("C1A_REINDEX", dict(phase="decode", tokens=4, layer=24), 4),
]
REJECTED = [  # (kind, call, field, text the message must contain)
    ("C2A_FULL", dict(phase="decode", tokens=32, active=24), "active_tokens", "C2A_FULL decode"),
    ("SWA", dict(phase="decode", tokens=32, active=24), "active_tokens", "only C2A_REUSE"),
    ("C1A_REUSE", dict(phase="decode", tokens=8, active=7), "active_tokens", "C1A_REUSE decode"),
    ("C2A_REUSE", dict(phase="decode", tokens=32, active=33), "active_tokens", "1..tokens (32)"),
    ("C2A_REUSE", dict(phase="decode", tokens=32, active=0), "active_tokens", "1..tokens"),
    ("C1A_FULL", dict(phase="decode", tokens=193), "tokens", "1..192"),
    ("C1A_FULL", dict(phase="prefill", tokens=4097), "tokens", "1..4096"),
    ("C1A_FULL", dict(phase="decode", tokens=0), "tokens", "1..192"),
    ("C2A_REUSE", dict(phase="decode", tokens=32, active=24, requests=25), "requests", "1..24"),
    ("C1A_FULL", dict(phase="prefill", tokens=4096, requests=33), "requests", "1..32"),
    ("C1A_FULL", dict(phase="decode", tokens=4, requests=0), "requests", "1..4"),
    ("SWA", dict(phase="decode", tokens=4, tp=8), "tp", "TP8"),
    ("C2A_FULL", dict(phase="decode", tokens=4, tp=3), "tp", "(1, 2, 4, 8)"),
    ("C2A_FULL", dict(phase="train", tokens=4), "phase", "decode"),
    ("C3A_FULL", dict(phase="decode", tokens=4), "kind", "C2A_REUSE"),
    ("C2A_FULL", dict(phase="decode", tokens=4.0), "tokens", "an int"),
    ("C2A_FULL", dict(phase="decode", tokens=True), "tokens", "an int"),
    ("C2A_FULL", dict(phase="decode", tokens=4, epoch=0), "attention_epoch", "1..1000"),
    ("C2A_FULL", dict(phase="decode", tokens=4, epoch=1001), "attention_epoch", "1..1000"),
    ("C2A_FULL", dict(phase="decode", tokens=4, epoch=True), "attention_epoch", "an int"),
    ("C1A_FULL", dict(phase="decode", tokens=129, pages=1), "tokens", "min(192, pages·128) = 1..128"),
    ("C1A_REINDEX", dict(phase="decode", tokens=4, pages=0), "pages", ">= 1"),
    ("C1A_FULL", dict(phase="decode", tokens=4, dp=2), "dp", "one DP group per C1A call"),
    # SC-27: the neighbouring layer of another kind, in both directions of each pair that shares a family
    ("SWA", dict(phase="decode", tokens=4, layer=2), "layer", "resolves to C2A_FULL"),
    ("C2A_REUSE", dict(phase="decode", tokens=4, layer=8), "layer", "resolves to C2A_FULL"),
    ("C2A_FULL", dict(phase="decode", tokens=4, layer=9), "layer", "resolves to C2A_REUSE"),
    ("C1A_REUSE", dict(phase="decode", tokens=4, layer=24), "layer", "resolves to C1A_REINDEX"),
    ("C1A_REINDEX", dict(phase="decode", tokens=4, layer=25), "layer", "resolves to C1A_REUSE"),
    ("C1A_FULL", dict(phase="decode", tokens=4, layer=40), "layer", "0..39"),
]


@pytest.mark.parametrize("kind, call, active", ACCEPTED, ids=[f"{k}-{c['phase']}-{c['tokens']}" for k, c, _ in ACCEPTED])
def test_half_layer_call_accepts(backend, kind, call, active):
    """Calls inside the contract pass and report their active rows. Spec: §7.1."""
    assert op(backend, "half_layer_call")(kind, **call, config=FLASH) == active


@pytest.mark.parametrize("kind, call, field, text", REJECTED, ids=[f"{k}-{f}-{t}" for k, _c, f, t in REJECTED])
def test_half_layer_call_rejects(backend, kind, call, field, text):
    """Each violation raises a ValueError naming the field, the mode and phase, and the allowed range.
    Spec: §7.1; CH-03 (capacities, requests), CH-04 (tokens == active except C2A Reuse), SC-22 (SWA TP8)."""
    with pytest.raises(ValueError) as info:
        op(backend, "half_layer_call")(kind, **call, config=FLASH)
    message = str(info.value)
    assert message.startswith(f"{field}:") and text in message, f"{message!r} (expected field {field}, {text!r})"


@pytest.mark.parametrize("kind", KINDS)
def test_every_decode_mode_but_c2a_reuse_requires_every_token_active(backend, kind):
    """tokens == active for every decode mode except C2A Reuse, which accepts 24 active of 32. Spec: §7.1."""
    check = op(backend, "half_layer_call")
    if kind == "C2A_REUSE":
        assert check(kind, phase="decode", tokens=32, active=24, config=FLASH) == 24
    else:
        with pytest.raises(ValueError, match="only C2A_REUSE.*got 24"):
            check(kind, phase="decode", tokens=32, active=24, config=FLASH)
    assert check(kind, phase="decode", tokens=32, active=32, config=FLASH) == 32
