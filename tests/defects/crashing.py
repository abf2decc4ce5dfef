"""A backend whose RoPE-rows operator raises (a crashing kernel): replay must exit 3, not 1."""

from backends import torch_backend


def _raise(*args, **kwargs):
    raise RuntimeError("simulated kernel crash (aicore exception)")


CRASHING_ROPE = torch_backend().derive("defect:crashing-rope", materialize_rope_rows=_raise)


def _crash_and_wrong():
    from tests.defects.slabs import GATHER_REVERSED

    return GATHER_REVERSED.derive("defect:crash+wrong", materialize_rope_rows=_raise)


# one operator crashes (RoPE rows) and another is out of bound (the gather reversed): replay shows both
CRASH_AND_WRONG = _crash_and_wrong()
