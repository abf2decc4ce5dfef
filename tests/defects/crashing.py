"""A backend whose RoPE-rows operator raises (a crashing kernel): replay must exit 3, not 1."""

from contracts.backends import torch_backend


def _raise(*args, **kwargs):
    raise RuntimeError("simulated kernel crash (aicore exception)")


CRASHING_ROPE = torch_backend().derive("defect:crashing-rope", materialize_rope_rows=_raise)
