"""A partial backend of the suite's own (``--backend-module tests.partial_double:MIXED``): the reference's
``v4_gate`` alone, under a name of its own, standing in for a backend that binds some operators of a contract and
not others (upstream's goldens of one folder, a device binding). ``WHOLE`` is the same, judged whole or not at all.
``PICKY``: a ``v4_gate`` that takes no call at all (``Unsupported``, as a golden of a narrower domain says), so a
contract of the gate skips naming why, and a composition standing in for it runs on the reference's gate."""

from __future__ import annotations

from backends import torch_backend
from contracts.operators import Backend

_GATE = {"v4_gate": torch_backend().get("v4_gate")}
MIXED = Backend("partial", _GATE, description="v4_gate only, the reference standing in")
WHOLE = Backend("partial-whole", _GATE, reference_stand_ins=False, description="v4_gate only, no stand-ins")


def _picky_gate(*args, **kwargs):
    from contracts.operators import Unsupported

    raise Unsupported("this double's gate takes no call")


_picky_gate.may_be_unsupported = True
PICKY = Backend("partial-picky", {"v4_gate": _picky_gate}, description="a v4_gate that takes no call")


def _all_but(name: str) -> dict:
    ref = torch_backend()
    return {o: ref.get(o) for o in ref.operators if o != name}


# The reference without one operator: the window lowering (which a whole-backend chain may take from the reference,
# being its input), and the fused head (which it may not)
NO_WINDOW = Backend("partial-no-window", _all_but("v4_prefill_swa_indices"),
                    description="the reference but v4_prefill_swa_indices")
NO_HEAD = Backend("partial-no-head", _all_but("hc_head_fused"), description="the reference but hc_head_fused")
